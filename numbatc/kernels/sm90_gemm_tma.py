"""sm90_gemm's TMA producer (the ``_tma`` configurations): one thread of the producer
warpgroup arms each stage's full mbarrier with the stage's byte count and issues the A and B
tensor copies (``cp.async.bulk.tensor``, 128B swizzle) into it; the two wgmma consumer
warpgroups, the epilogue, split-K, FP8 and persistent tiles are sm90_gemm's.

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1)
      WG0  producer   setmaxnreg.dec 24    thread 0: acquire empty[s] -> expect_tx(full[s],
                                           stage bytes) -> TMA A box(es), B box(es) -> advance
      WG1  consumer   setmaxnreg.inc 240   wait full[s] -> 4 x wgmma m64nBNk16 -> release empty[s]
      WG2  consumer                        (WG1 rows 0..63 of the tile, WG2 rows 64..127)

The ring is numbatc.kernels.pipeline's (full[s]: one arrival, the producer's expect_tx, plus
the stage's bytes; empty[s]: one arrival per consumer warp, 8).  The producer warpgroup keeps
all 128 threads because setmaxnreg works per warpgroup (and wgmma's warpgroups must start at a
multiple of 4 warps); 127 of them leave at once.

Shared memory, per stage (1024-byte aligned; every box starts on a 1024-byte boundary):

    A K-major  ('row' A):  one box (BM, BK) of (M, K):   BM rows of 128 B, 128B swizzle     16 KB
    B K-major  ('col' B):  one box (BN, BK) of (N, K):   BN rows of 128 B                 BN/8 KB
    A MN-major ('col' A):  BM / 64 boxes (BK, 64) of (K, M): each 64 k rows of 128 B (64 m)
    B MN-major ('row' B):  BN / 64 boxes (BK, 64) of (K, N), the same per 64 n

K-major boxes are exactly wgmma's canonical K-major 128B layout (sm90_gemm's, SmemLayout "K").
An MN-major box of (BK, 64) writes one column of 64 mn values for all BK k: eight 8-k swizzle
atoms stacked along K, 1024 bytes apart, and the next 64 mn BK * 128 bytes further.  That is
the canonical MN-major 128B layout with the atoms ordered K-first (:class:`MnKFirstLayout`:
LBO = BK * 128 between MN atoms, SBO = 1024 between 8-k groups), where the cp.async producer's
layout orders them MN-first (LBO = 1024, SBO = mn * 16); the wgmma descriptors take either.
Ordered MN-first, a stage would need one box per 8 k rows (48 for 128x256), K-first needs
BM / 64 + BN / 64 (6).

Byte counts: every box delivers its whole size, the out-of-bounds part zero-filled (TMA counts
filled bytes too), so expect_tx is always the stage's (BM + BN) * BK * elem_bytes; ragged M, N
and K need no edge path.  Coordinates: a k tile starts at k = kbeg + kt * BK (a multiple of 64
elements = 128 bytes; split-K's slices are whole k tiles), MN-major boxes at m0 / n0 + 64 j
(128-byte multiples): every innermost start is a multiple of 16 bytes, as the hardware requires
(see intrinsics.tma).  TMA writes through the async proxy, which wgmma reads through, so the
consumers need no proxy fence (the cp.async producer's consumers fence after each wait).

Tensor maps describe a and b as 2-D tensors with the K-contiguous or MN-contiguous dimension
innermost; they need a 16-byte aligned start and a leading dimension that is a multiple of 16
bytes.  sm90_gemm.choose runs the cp.async twin for operands that are not (and says so
under NUMBATC_PRINT_CONFIG=1).  The maps are cached per (pointer, shape, strides, box): a
warm numbatc.gemm call on operands seen before builds none (new pointers cost one driver encode
and one 128-byte copy to the device each).

The TMA store epilogue (``store="tma"``, the ``_ts`` configurations; sm90_gemm.choose takes it
for the persistent 128 x 256 tiles where out is bf16 / f16, row-major and 16-byte aligned).
Behind the stages lies a staging tile of BM x BN two-byte values, one (64, BN) part per
consumer warpgroup, as BN / 64 boxes of (64 rows, 64 columns) 128B-swizzled (8 KB each,
1024-byte aligned).  On a tile inside the matrix each consumer warpgroup:

    values      value_tile per 8-column fragment (alpha, beta * c, bias, activation, the user
                epilogue), every load in flight together, as the direct epilogue does
    free?       its thread 0: bulk_wait_group_read(0) -- the previous tile's stores have read
                the staging part -- then the warpgroup's named barrier (2 + cw, 128 threads)
    write       BN / 16 stmatrix.x4, each two fragments' bf16 / f16 pairs into the swizzled rows
    publish     fence.proxy.async.shared::cta (generic-proxy writes, read by the async proxy),
                the named barrier again
    store       its thread 0: BN / 64 tensor stores (cp.async.bulk.tensor shared -> global,
                rows and columns outside out dropped by the hardware) and one commit_group

and goes on to the next tile's main loop while the stores drain (the direct epilogue's
register stores had stalled the consumers on the LSU queue, "LG throttle", before it).  Edge
tiles store directly (c and bias must not be read past the matrix); thread 0 waits for its
last stores before the block exits.  The 64 KB staging tile leaves room for three 48 KB stages
(209 KB of 227).  Out's tensor map is the kernel's third argument, cached like a and b's.

Print a kernel as it is compiled::

    python -c "from numbatc.kernels import sm90_gemm as g; print(g.kernel_source(
        g.CONFIGS['128x256x64_4s_pt_tma'], g.Sm90Variant('row', 'col', 'bfloat16', 'bfloat16',
        None, None, None)))"

What is code and what is text: the ring (numbatc.kernels.pipeline), the producer thread
(:func:`make_producer`) and the rasterisation (numbatc.kernels.tiles) are factory-made
``@cuda.jit(device=True)`` functions specialised through closure constants; the generated module
instantiates them with its constants and holds the kernel itself: the consumers and the
epilogue.  Those stay text (not tried as code in this change): the consumers' 128-float
accumulator tuple is indexed with constants in 4 unrolled wgmma calls and BN / 64 epilogue
blocks of 8 fragments (static slices ``acc[0:32]`` ...), where a loop over the tuple risks a
run-time tuple index (numba lowers one through a stack copy: local memory), and the shared
epilogue (numbatc.kernels.epilogue: epilogue_source, block_source, full_tile_epilogue,
split-K) is itself text.

Compile time (issue 18, ``python scripts/diag/compile_time.py <config>``: a configuration's
first compile as ``numbatc precompile --cc 9.0a`` makes it, in fresh processes): numba types
each call site and each statement of the kernel again in every propagation round, and each
device function's body once per signature, so the generated kernel keeps its statements few
-- the epilogue as block calls, the zeros as one module constant, the ring's state int64 from
the start, the descriptors without numba-level inlining (see the NOTEs where each bites).
"""

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt
from intrinsics.layout import SmemLayout
from intrinsics.layout.smem import encode_wgmma_smem_desc
from numbatc.kernels import tensor_maps as tensor_maps_cache
from numbatc.kernels.pipeline import tma_pipeline
from numbatc.kernels.tiles import make_tile_coords

__all__ = ["MnKFirstLayout", "kernel_source", "launch", "make_producer", "out_map",
           "operand_layout", "operand_map", "signature", "smem_desc", "tensor_maps"]

_SWIZZLE = 128
_TMA_DTYPE = {"bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "u8", "float8_e5m2": "u8"}


@dataclass(frozen=True)
class MnKFirstLayout(SmemLayout):
    """An MN-major swizzled tile whose 8-k atoms stack along K first: the column of one swizzle
    row of mn values (128 bytes: 64 bf16) for all k is one block of k * swizzle bytes, the next
    column follows.  This is what a TMA box of (k rows, one swizzle row of mn) writes, once per
    column (the GEMM's 128B swizzle; attention's V at head_dim 96 takes 64B)."""

    def __post_init__(self):
        super().__post_init__()
        if self.major != "MN" or not self.swizzle:
            raise ValueError("MnKFirstLayout is an MN-major swizzled layout")

    @property
    def lbo(self):
        return self.k * self.swizzle  # between 128-byte MN atoms

    @property
    def sbo(self):
        return 8 * self.swizzle  # between 8-k groups

    def offset(self, mn, k):
        from intrinsics.layout import swizzle_offset_host

        mb = np.asarray(mn, dtype=np.int64) * self.elem_bytes
        k = np.asarray(k, dtype=np.int64)
        s = self.swizzle
        return swizzle_offset_host((mb // s) * self.lbo + k * s + mb % s, s)


def operand_layout(cfg, op, k_major):
    """The shared-memory layout of operand ``op`` ('a' or 'b')'s tile as the TMA boxes write it."""
    mn = cfg.bn if op == "b" else cfg.bm
    if k_major:
        return SmemLayout("K", _SWIZZLE, mn, cfg.bk, cfg.elem_bytes)
    return MnKFirstLayout("MN", _SWIZZLE, mn, cfg.bk, cfg.elem_bytes)


# ---------------------------------------------------------------------------------------------
# Device code: the producer thread, factory-made
# ---------------------------------------------------------------------------------------------

#: ``smem_desc(shared address, lbo_bytes, sbo_bytes, swizzle_bytes)``: intrinsics.wgmma's
#: descriptor encoder (make_smem_desc) inlined by LLVM.
#: NOTE: nt.smem_desc / nt.make_smem_desc are inline="always": numba inlines them into its own
#: IR and types the copy again at each call site (0.3 s of compile for the consumers' two
#: descriptors: scripts/diag/compile_time.py); forceinline leaves the inlining to LLVM, the
#: same SASS.
smem_desc = cuda.jit(device=True, forceinline=True)(encode_wgmma_smem_desc)


@functools.cache
def make_producer(bm, bn, bk, stages, a_kmajor, b_kmajor, persistent, elem_bytes=2):
    """``produce(smem, bars, tma_a, tma_b, M, N, K, group_m, kbeg)``: the producer thread's
    whole job -- for each of its tiles (blockIdx.x, + gridDim.x, ... when ``persistent``; else
    blockIdx.x's) and each k tile from ``kbeg`` (split-K's slice start, else 0) on: acquire the
    next stage of the ring, arm its full barrier with the stage's bytes, issue the boxes.

    The arguments are closure constants, so every branch on them and every box loop folds at
    compile time (numba freezes a closure's values)."""
    ring = tma_pipeline(stages)
    acquire, commit, advance = ring.producer_acquire, ring.producer_commit, ring.advance
    tile_coords = make_tile_coords(bm, bn)
    a_bytes = bm * bk * elem_bytes
    stage_bytes = (bm + bn) * bk * elem_bytes
    box_bytes = bk * _SWIZZLE  # one MN-major (BK, 64) box
    a_boxes, b_boxes = bm // 64, bn // 64

    @cuda.jit(device=True, forceinline=True)
    def load_stage(smem, base, tma_a, tma_b, k, m0, n0, bars, index):
        # A: one (BM, BK) box of (M, K), or BM / 64 (BK, 64) boxes of (K, M); B likewise
        if a_kmajor:
            nt.tma_load(smem, base, tma_a, (k, m0), bars, index)
        else:
            for j in range(a_boxes):
                nt.tma_load(smem, base + j * box_bytes, tma_a, (m0 + 64 * j, k), bars, index)
        if b_kmajor:
            nt.tma_load(smem, base + a_bytes, tma_b, (k, n0), bars, index)
        else:
            for j in range(b_boxes):
                nt.tma_load(smem, base + a_bytes + j * box_bytes, tma_b, (n0 + 64 * j, k), bars,
                            index)

    @cuda.jit(device=True, forceinline=True)
    def load_tile(smem, bars, tma_a, tma_b, K, kbeg, m0, n0, index, phase):
        for kt in range((K + (bk - 1)) // bk):
            acquire(bars, index, phase)
            commit(bars, index, stage_bytes)  # the whole stage: the zero fill counts
            load_stage(smem, index * stage_bytes, tma_a, tma_b, kbeg + kt * bk, m0, n0, bars,
                       index)
            index, phase = advance(index, phase)
        return index, phase

    @cuda.jit(device=True, forceinline=True)
    def produce(smem, bars, tma_a, tma_b, M, N, K, group_m, kbeg):
        nt.tma_prefetch_descriptor(tma_a)
        nt.tma_prefetch_descriptor(tma_b)
        index = np.int64(0)  # (not the literal 0: see the consumers' note in kernel_source)
        phase = np.int64(0)
        if persistent:
            n_tiles = np.int64((M + (bm - 1)) // bm) * np.int64((N + (bn - 1)) // bn)
            tile = np.int64(cuda.blockIdx.x)
            while tile < n_tiles:
                tm, tn = tile_coords(np.uint32(tile), M, N, group_m)
                index, phase = load_tile(smem, bars, tma_a, tma_b, K, kbeg, np.int64(tm) * bm,
                                         np.int64(tn) * bn, index, phase)
                tile += cuda.gridDim.x
        else:
            tm, tn = tile_coords(np.uint32(cuda.blockIdx.x), M, N, group_m)
            load_tile(smem, bars, tma_a, tma_b, K, kbeg, np.int64(tm) * bm, np.int64(tn) * bn,
                      index, phase)

    return produce


@functools.cache
def signature(var, tma_store=False):
    """The kernel's argument types: sm90_gemm.signature's with the tensor maps of a and b
    (passed by value, ``TensorMap.param``: intrinsics.grid_constant) in place of the operand
    pointers, and with ``tma_store`` (the TMA store epilogue) out's tensor map after them."""
    from intrinsics.grid_constant import tensormap_param as tmap
    from numbatc.kernels import sm90_gemm

    return (tmap,) * (3 if tma_store else 2) + tuple(sm90_gemm.signature(var)[2:])


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

def kernel_source(cfg, var) -> str:
    """Python source of the TMA-producer kernel for one configuration and variant (sm90_gemm's
    kernel_source calls this for configurations with ``producer == 'tma'``)."""
    from numbatc.kernels import epilogue, sm90_gemm

    assert cfg.producer == "tma" and cfg.cluster_m == 1, cfg
    tma_store = cfg.store == "tma"
    assert not (tma_store and var.split_k), "a K slice's partial sums are not stored by TMA"
    assert not tma_store or (var.out_dtype in _TMA_DTYPE and var.out_layout == "row"), var
    blockwise = getattr(var, "blockwise", False)
    # blockwise scaling: one scale of b per 128 columns covers the tile, one k tile is one
    # 128-value scale block, and each k tile's product is read back before the next one
    assert not blockwise or (cfg.bk == 128 and cfg.bn in (64, 128) and cfg.inflight == 0), cfg
    bw_args = ", sa, sb, sa_rs, sa_cs, sb_rs, sb_cs" if blockwise else ""
    BM, BN, BK, S = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    kinst = 32 // cfg.elem_bytes  # K of one wgmma: 16 (bf16/f16), 32 (fp8)
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_lay, b_lay = operand_layout(cfg, "a", a_kmajor), operand_layout(cfg, "b", b_kmajor)
    a_part = int(a_lay.offset(64, 0))  # consumer warpgroup 1's rows 64.. of A
    pers = cfg.persistent and not var.split_k
    ea = ", eargs" if var.epilogue is not None else ""
    split_args, split_range, _, _ = epilogue.split_source(var, a_kmajor, b_kmajor)
    # the accumulator's zeros: a module global, which numba freezes as one constant UniTuple
    # (the sum of 16-value literal tuples it replaces cost 0.07 s of typing)
    zeros = "ZEROS"
    lines = []
    w = lines.append
    w(f'''"""Generated by numbatc.kernels.sm90_gemm_tma for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt
from numbatc.kernels.pipeline import tma_pipeline
from numbatc.kernels.sm90_gemm_tma import make_producer, smem_desc
from numbatc.kernels.tiles import make_tile_coords

{sm90_gemm.mma_line(BN, var, a_kmajor, b_kmajor)}
ZEROS = (np.float32(0),) * {BN // 2}
RING = tma_pipeline({S})
RING_INIT = RING.init
ADVANCE = RING.advance
WAIT = RING.consumer_wait
RELEASE = RING.consumer_release
tile_coords = make_tile_coords({BM}, {BN})
# the producer thread (numbatc.kernels.sm90_gemm_tma.make_producer): BM, BN, BK, stages,
# K-major A, K-major B, persistent, element bytes
PRODUCE = make_producer({BM}, {BN}, {BK}, {S}, {a_kmajor}, {b_kmajor}, {pers}, {cfg.elem_bytes})
''')
    if tma_store:
        w('''

@cuda.jit(device=True, forceinline=True)
def wg_sync(cw):
    # consumer warpgroup cw's 128 threads (named barriers 2 and 3: the id is an immediate)
    if cw == 0:
        nt.named_barrier_sync(2, 128)
    else:
        nt.named_barrier_sync(3, 128)
''' + _stage_frags_source(var))
    w(epilogue.epilogue_source(var, frags=epilogue.BLOCK_FRAGS))
    if pers:
        head = f"    n_tiles = np.int64((M + {BM - 1}) // {BM}) * np.int64((N + {BN - 1}) // {BN})\n"
        tile_loop = ["tile = np.int64(cuda.blockIdx.x)",
                     "while tile < n_tiles:",
                     "    tm, tn = tile_coords(np.uint32(tile), M, N, group_m)",
                     f"    m0 = np.int64(tm) * {BM}",
                     f"    n0 = np.int64(tn) * {BN}"]
    else:
        head = ("    tm, tn = tile_coords(np.uint32(cuda.blockIdx.x), M, N, group_m)\n"
                f"    m0 = np.int64(tm) * {BM}\n    n0 = np.int64(tn) * {BN}\n")
        tile_loop = []
    w(f'''

@cuda.jit(cache={var.epilogue is None}, launch_bounds=({cfg.threads}, 1))
def gemm_kernel(tma_a, tma_b, {"tma_out, " if tma_store else ""}c, bias, out, M, N, K, lda, ldb, ldc, ldo, alpha, beta, group_m{bw_args}{split_args}{ea}):
    # {S} stages of [A {BM} x {BK} | B {BN} x {BK}] ({"K" if a_kmajor else "MN"}-major A, {"K" if b_kmajor else "MN"}-major B), {cfg.stage_bytes} bytes each
    smem = cuda.shared.array(0, np.uint8, alignment=1024)
    # full[s] = bars[s]: the producer's expect_tx arrival + {cfg.stage_bytes} bytes;
    # empty[s] = bars[{S} + s]: one arrival per consumer warp ({4 * cfg.consumers})
    bars = cuda.shared.array({2 * S}, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    wg = t // 128
{head}{split_range}    k_tiles = (K + {BK - 1}) // {BK}

    if t == 0:
        RING_INIT(bars, 1, {4 * cfg.consumers})
    cuda.syncthreads()

    if wg == 0:
        # ---- producer warpgroup: thread 0 issues every copy ----------------------------------
        nt.setmaxnreg_dec({cfg.producer_regs})
        if t == 0:
            PRODUCE(smem, bars, tma_a, tma_b, M, N, K, group_m, {"kbeg" if var.split_k else "0"})''')
    w(f'''    else:
        # ---- consumer warpgroups -------------------------------------------------------------
        nt.setmaxnreg_inc({cfg.consumer_regs})
        cw = wg - 1
        # (64, BK) part of A for this warpgroup, (BN, BK) of B; the stage and the K slice move
        # the descriptors' start address (bits 0-13 hold address >> 4; no carry leaves the field)
        da0 = smem_desc(nt.shared_address(smem, cw * {a_part}), {a_lay.lbo}, {a_lay.sbo}, {_SWIZZLE})
        db0 = smem_desc(nt.shared_address(smem, {cfg.a_bytes}), {b_lay.lbo}, {b_lay.sbo}, {_SWIZZLE})
        # NOTE: int64, not the literal 0: numba would type the ring's functions for
        # Literal[int](0) first and again for int64 once the loop unifies them, and propagate
        # the kernel once more (0.45 s of compile: scripts/diag/compile_time.py)
        index = np.int64(0)
        phase = np.int64(0)''')
    x = " " * 8 + ("    " if pers else "")
    cons = [f"acc = nt.wgmma_fence_operand({zeros})  # written by ordinary code: pin before wgmma",
            "prev = index",
            "for kt in range(k_tiles):"] + _issue(cfg, a_lay, b_lay, kinst, "acc", False)
    if blockwise:
        cons = _blockwise_mainloop(cfg, var, a_lay, b_lay, kinst, zeros)
    elif cfg.inflight == 0:
        cons += ["    # this tile's group retired: its stage goes back to the producer",
                 "    nt.wgmma_wait_group(0)",
                 "    acc = nt.wgmma_fence_operand(acc)",
                 "    if t % 32 == 0:",
                 "        RELEASE(bars, index)",
                 "    index, phase = ADVANCE(index, phase)"]
    else:
        cons += ["    # keep this tile's group in flight over the next wait; the previous tile's",
                 "    # group has retired, so its stage goes back to the producer",
                 "    nt.wgmma_wait_group(1)",
                 "    acc = nt.wgmma_fence_operand(acc)",
                 "    if kt > 0 and t % 32 == 0:",
                 "        RELEASE(bars, prev)",
                 "    prev = index",
                 "    index, phase = ADVANCE(index, phase)",
                 "nt.wgmma_wait_group(0)",
                 "acc = nt.wgmma_fence_operand(acc)"]
        if pers:  # the next tile's fills wait for this tile's last stage
            cons += ["if k_tiles > 0 and t % 32 == 0:", "    RELEASE(bars, prev)"]
        else:
            cons += ["# the last k tile's stage is never released: nobody waits for it"]
    cons += ["# ---- epilogue: thread (warp w, lane l) of the warpgroup holds rows 16w + l/4 (+8) and",
             "# columns 8j + 2(l%4) (+1) in registers 4j..4j+3 (intrinsics.wgmma.accumulator_coords)",
             "lane = t % 32",
             "row_base = m0 + cw * 64 + ((t % 128) // 32) * 16 + lane // 4",
             "col_base = n0 + (lane % 4) * 2"]
    if pers:
        w("\n".join(" " * 8 + y for y in tile_loop))
    w("\n".join(x + y for y in cons))
    tiles = [(f"(acc[{4 * j}], acc[{4 * j + 1}], acc[{4 * j + 2}], acc[{4 * j + 3}])", "row_base",
              f"col_base + {8 * j}") for j in range(BN // 8)]
    # the same as blocks of BLOCK_FRAGS fragments (epilogue.block_source): 64 columns each
    fb = epilogue.BLOCK_FRAGS
    assert BN % (8 * fb) == 0, BN
    blocks = [(f"acc[{4 * fb * j}:{4 * fb * (j + 1)}]", "row_base", f"col_base + {8 * fb * j}")
              for j in range(BN // (8 * fb))]
    if var.split_k:
        # the 256 consumer threads synchronise on named barrier 1 (the producer has left);
        # thread 128 (consumer warpgroup 0's first) counts the tile's arrivals
        epilogue.split_epilogue_source(w, tiles, var, "cuda.blockIdx.x",
                                       f"nt.named_barrier_sync(1, {128 * cfg.consumers})",
                                       "t == 128", indent=x)
        w(epilogue.SPLIT_HELPERS)
    elif tma_store:
        _tma_store_epilogue(w, blocks, cfg, var, f"m0 + cw * 64 + 64 <= M and n0 + {BN} <= N",
                            indent=x)
        if pers:
            w(x + "tile += cuda.gridDim.x")
        w(" " * 8 + "if t % 128 == 0:")
        w(" " * 8 + "    nt.bulk_wait_group(0)  # the last stores have read the staging tile")
    else:
        epilogue.full_tile_epilogue(w, blocks, var, f"m0 + cw * 64 + 64 <= M and n0 + {BN} <= N",
                                    indent=x, unit="frags")
        if pers:
            w(x + "tile += cuda.gridDim.x")
    return "\n".join(lines) + "\n"


def _issue(cfg, a_lay, b_lay, kinst, target, overwrite, indent="    "):
    """Lines of one k tile's issue: wait for its stage, then BK / kinst wgmma into ``target``
    (the first with scale-d 0 where ``overwrite``: the tile's own product) and the commit."""
    lines = ["WAIT(bars, index, phase)",
             "# TMA wrote the stage through the async proxy, which wgmma reads: no proxy fence",
             f"st = np.uint64(index * {cfg.stage_bytes // 16})",
             "nt.wgmma_fence()"]
    for ks in range(cfg.bk // kinst):
        a_k = a_lay.k_offset(ks * kinst) // 16
        b_k = b_lay.k_offset(ks * kinst) // 16
        scale_d = 0 if overwrite and ks == 0 else 1
        lines.append(f"{target} = MMA({target}, da0 + st + np.uint64({a_k}), "
                     f"db0 + st + np.uint64({b_k}), {scale_d})")
    lines.append("nt.wgmma_commit_group()")
    return [indent + x for x in lines]


def _blockwise_mainloop(cfg, var, a_lay, b_lay, kinst, zeros):
    """The consumers' main loop for FP8 with blockwise scales (DeepGEMM's recipe): each k tile's
    product goes into its own wgmma accumulator (the first wgmma with scale-d 0), which, once
    retired, is added into ``acc`` (plain registers) scaled by a's scale of each row and b's of
    the tile's 128 columns for that 128-value K block.  The scales are loaded before the tile's
    stage wait (the wait hides their latency); rows past M read row M - 1's (never stored).

    NOTE: one product buffer, waited for before its promotion, so the promotion does not
    overlap this warpgroup's next wgmma (the other consumer warpgroup's may run).  Two buffers
    (tile kt's wgmma under tile kt - 1's promotion, 64 + 2 x 64 registers at BN = 128) were
    tried: ptxas serialised the wgmma (C7514 / C7518) and the 128-row form spilled."""
    kb = "(kbeg + kt * 128) // 128" if var.split_k else "kt"
    head = [f"acc = {zeros}",
            "prev = index",
            "srow = m0 + cw * 64 + ((t % 128) // 32) * 16 + (t % 32) // 4",
            "sr0 = min(srow, M - 1) * sa_rs",
            "sr1 = min(srow + 8, M - 1) * sa_rs",
            "sbn = (n0 // 128) * sb_rs"]

    terms = [f"nt.fma_f32(pa[{i}], {'f0' if i % 4 < 2 else 'f1'}, acc[{i}])"
             for i in range(cfg.bn // 2)]  # registers 4j, 4j+1: row r; 4j+2, 4j+3: row r + 8
    # NOTE: a literal tuple of more than 30 values compiles (CPython 3.11) to BUILD_LIST +
    # LIST_TO_TUPLE, which numba's IR peephole rejects: the new accumulator is a sum of
    # 16-value tuples (one UniTuple once typed)
    chunks = [", ".join(terms[j:j + 16]) + "," for j in range(0, len(terms), 16)]
    return (head + [f"pa = nt.wgmma_fence_operand({zeros})", "for kt in range(k_tiles):",
                    f"    kb = {kb}",
                    "    p0 = sa[sr0 + kb * sa_cs]",
                    "    p1 = sa[sr1 + kb * sa_cs]",
                    "    pq = sb[sbn + kb * sb_cs]"]
            + _issue(cfg, a_lay, b_lay, kinst, "pa", True)
            + ["    # this tile's group retired: its stage goes back to the producer",
               "    nt.wgmma_wait_group(0)",
               "    pa = nt.wgmma_fence_operand(pa)",
               "    if t % 32 == 0:",
               "        RELEASE(bars, index)",
               "    index, phase = ADVANCE(index, phase)",
               "    f0 = p0 * pq",
               "    f1 = p1 * pq",
               "    acc = " + " + ".join(f"({c})" for c in chunks)])


def _stage_frags_source(var):
    """``stage_frags(smem, box, sx, v)``: one block's 32 values (value_frags; 8 fragments, 64
    columns) into its staging box through 4 stmatrix.x4 (see _tma_store_epilogue)."""
    from numbatc.kernels import epilogue

    assert epilogue.BLOCK_FRAGS == 8, "a block is one 64-column box"
    pack = "nt.pack_bf16x2" if var.out_dtype == "bfloat16" else "nt.pack_f16x2"
    packs = [f"{pack}(v[{4 * j + 2 * h}], v[{4 * j + 2 * h + 1}])" for j in range(8) for h in (0, 1)]
    lines = ["", "", "@cuda.jit(device=True, forceinline=True)",
             "def stage_frags(smem, box, sx, v):",
             "    # this lane's row address in the box: box + row * 128; sx = (sq // 2) ^ row % 8"]
    lines += [f"    nt.stmatrix_x4(smem, box + (({2 * jj} ^ sx) << 4), "
              f"({', '.join(packs[4 * jj:4 * jj + 4])}))" for jj in range(4)]
    return "\n".join(lines) + "\n"


def _tma_store_epilogue(w, blocks, cfg, var, inside, indent):
    """Emit the TMA store epilogue (``cfg.store == 'tma'``) of the fragment blocks ``blocks``
    (as full_tile_epilogue takes them with unit="frags": one per 64 columns).  Inside the
    matrix: every fragment's values (value_frags: alpha, beta * c, bias, activation, the user
    epilogue), then the warpgroup's staging tile -- free once its thread 0's previous stores
    have read it (bulk_wait_group_read) -- gets them through stmatrix (stage_frags), and thread
    0 issues one TMA store per 64 columns.  Edge tiles store directly (store_frags,
    bounds-checked: c and bias must not be read past the matrix).

    Staging: warpgroup cw's (64, BN) tile at STAGE0 + cw * 64 * BN * 2, as BN / 64 boxes of
    (64 rows, 64 columns) = 64 rows of 128 bytes, 8 KB each, 128B-swizzled as out's tensor map
    reads them: row r's 16-byte chunk c lies at r * 128 + (c ^ (r % 8)) * 16.  Within a box,
    stmatrix.x4 call jj writes fragments 2jj and 2jj + 1 (columns 16jj .. 16jj + 15): lane l
    gives the row address of matrix q = l // 8 (q % 2: rows 0-7 or 8-15 of the warp's 16;
    q // 2: which fragment), and register q holds its (row l // 4, columns 2 (l % 4), + 1)
    pair, which is acc[4j], acc[4j + 1] (rows + 8: acc[4j + 2], acc[4j + 3]) of the wgmma
    accumulator."""
    ea = ", eargs" if var.epilogue is not None else ""
    BN = cfg.bn
    wg_bytes = 64 * BN * 2
    stage0 = cfg.stages * cfg.stage_bytes
    x = indent
    w(f"{x}if {inside}:")
    for i, (acc, row, col) in enumerate(blocks):
        w(f"{x}    ev_{i} = value_frags(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea})")
    w(f"{x}    lt = t % 128")
    w(f"{x}    if lt == 0:")
    w(f"{x}        nt.bulk_wait_group_read(0)  # the previous tile's stores have read the staging")
    w(f"{x}    wg_sync(cw)")
    w(f"{x}    sq = lane // 8")
    w(f"{x}    sr = lane % 8")
    w(f"{x}    sx = (sq // 2) ^ sr")
    w(f"{x}    sbase = {stage0} + cw * {wg_bytes} + ((lt // 32) * 16 + (sq % 2) * 8 + sr) * 128")
    for i in range(len(blocks)):
        w(f"{x}    stage_frags(smem, sbase + {i * 8192}, sx, ev_{i})")
    w(f"{x}    nt.fence_proxy_async_shared()  # generic-proxy writes, read by the TMA store")
    w(f"{x}    wg_sync(cw)")
    w(f"{x}    if lt == 0:")
    for box in range(BN // 64):
        w(f"{x}        nt.tma_store(tma_out, (n0 + {64 * box}, m0 + cw * 64), smem, "
          f"{stage0} + cw * {wg_bytes} + {box * 8192})")
    w(f"{x}        nt.bulk_commit_group()")
    w(f"{x}else:")
    for acc, row, col in blocks:
        w(f"{x}    store_frags(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta{ea})")


# ---------------------------------------------------------------------------------------------
# Tensor maps and the launch
# ---------------------------------------------------------------------------------------------

def _map_geometry(cfg, var, op, m, n, k, ld):
    """(shape, strides in bytes, box), natural order, of operand ``op``'s tensor map."""
    eb = cfg.elem_bytes
    if op == "a":
        mn, k_major, tile = m, var.a_layout == "row", cfg.bm
    else:
        mn, k_major, tile = n, var.b_layout == "col", cfg.bn
    # A leading dimension only matters when the outer extent is > 1 (numbatc.gemm's alignment
    # check ignores it then): give the map a legal one (a multiple of 16 bytes) for one row.
    outer = k if not k_major else mn
    stride = ld * eb if outer > 1 else -(-max(ld * eb, 16) // 16) * 16
    if k_major:  # (MN, K), K contiguous: a box of whole 128-byte rows
        return (mn, k), (stride, eb), (tile, cfg.bk)
    return (k, mn), (stride, eb), (cfg.bk, _SWIZZLE // eb)  # (K, MN), MN contiguous


class _Host:
    """A flat emulated operand seen as a 2-D array by TensorMap (under the simulator a tensor
    map's source is any object whose ``_ary`` is the NumPy array)."""

    def __init__(self, array):
        self._ary = array


def operand_map(cfg, var, op, src, m, n, k, ld):
    """The TensorMap of operand ``op`` ('a' or 'b'): ``src`` a device pointer (int) on the GPU,
    a flat array in the emulation (see :func:`_tensor_map`)."""
    shape, strides, box = _map_geometry(cfg, var, op, m, n, k, ld)
    dtype = _TMA_DTYPE[var.in_dtype if op == "a" else getattr(var, "b_dtype", var.in_dtype)]
    return _tensor_map(src, dtype, shape, strides, box)


def out_map(var, src, m, n, ldo):
    """The TensorMap the TMA store epilogue writes out (bf16 / f16, row-major, (m, n) with row
    pitch ``ldo``) through: boxes of (64 rows, 64 columns), 128B swizzle, as the staging tile
    lies (see _tma_store_epilogue)."""
    eb = 2
    stride = ldo * eb if m > 1 else -(-max(ldo * eb, 16) // 16) * 16
    return _tensor_map(src, _TMA_DTYPE[var.out_dtype], (m, n), (stride, eb), (64, 64))


def _tensor_map(src, dtype, shape, strides, box):
    """A 128B-swizzled tiled TensorMap of ``src`` (natural order shape, byte strides, box): on
    the GPU numbatc.kernels.tensor_maps' (cached per pointer and geometry, encoded on the host
    and passed by value), in the emulation a view of the flat array."""
    from intrinsics.tensormap import TensorMap

    if not isinstance(src, (int, np.integer)):  # the emulation: a view of the flat array
        host = getattr(src, "_ary", src)
        view = np.lib.stride_tricks.as_strided(host, shape=shape, strides=strides)
        return TensorMap.tiled(_Host(view), box, dtype=dtype, swizzle=_SWIZZLE)
    return tensor_maps_cache.tiled_map(int(src), dtype, shape, strides, box)


def tensor_maps(cfg, var, a, b, m, n, k, lda, ldb):
    """(TensorMap of a, of b) for flat operands as sm90_gemm.launch_flat takes them."""
    return (operand_map(cfg, var, "a", a, m, n, k, lda),
            operand_map(cfg, var, "b", b, m, n, k, ldb))


def launch(cfg, var, kernel, grid, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha, beta,
           stream, group_m, epilogue_args, prepare, split, block_scales=()):
    """sm90_gemm.launch_flat for a TMA configuration (``a``, ``b`` flat as there: device pointers
    or emulated arrays): the tensor maps of a and b (and of out for the TMA store epilogue) lead
    the kernel's arguments.  With ``prepare`` (GPU only) returns the relaunch function of
    sm80_gemm.launch_flat's contract (epilogue.launch_gemm_kernel's), which looks up (or builds)
    the maps of its pointers.  ``block_scales``: a blockwise variant's scale arguments (after
    group_m; such a launch is never prepared, see sm90_gemm.launch_flat)."""
    from numba import config

    from intrinsics import launch as launching
    from numbatc.kernels import epilogue

    tma_store = cfg.store == "tma"
    assert not (tma_store and split), "a K slice's partial sums are not stored by TMA"
    sig = signature(var, tma_store=tma_store)
    sizes = (m, n, k, lda, ldb, ldc, ldo)

    def maps(a, b, out):
        ta, tb = tensor_maps(cfg, var, a, b, m, n, k, lda, ldb)
        return (ta, tb, out_map(var, out, m, n, ldo)) if tma_store else (ta, tb)

    if prepare and not config.ENABLE_CUDASIM:
        eflat = ()
        if var.epilogue is not None:
            _, sig = epilogue.with_epilogue_args(kernel, var, (), sig, epilogue_args)
            eflat = epilogue.flat_epilogue_args(epilogue_args)
        prepared = launching.prepare(kernel, grid, cfg.threads, sig,
                                     shared_bytes=cfg.shared_bytes)
        if prepared is not None:
            last = tensor_maps_cache.LastMaps()

            def relaunch(a, b, c, bias, out, alpha, beta, stream, eflat=()):
                params = last.params((a, b, out) if tma_store else (a, b), maps, a, b, out)
                extra = () if split is None else split(stream)
                prepared(stream, *params, c, bias, out, *sizes, alpha, beta, group_m, *extra,
                         *eflat)

            relaunch(a, b, c, bias, out, alpha, beta, stream, eflat)
            return relaunch
    if config.ENABLE_CUDASIM and tma_store:
        # numba's simulator copies a NumPy argument in, and back after the kernel: the copies
        # of out (and of c or bias, which may be out itself) would overwrite what the TMA
        # stores wrote into out's own memory.  Simulator arrays are passed as they are.
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        c, bias, out = (FakeCUDAArray(x) if isinstance(x, np.ndarray) else x
                        for x in (c, bias, out))
    args = (*(tm.param for tm in maps(a, b, out)), c, bias, out, *sizes,
            np.float32(alpha), np.float32(beta), group_m, *_scale_args(block_scales))
    if split is not None:
        ws, counters, k_chunk, splits = split(stream)
        args += (ws, counters, np.int64(k_chunk), np.int64(splits))
    args, sig = epilogue.with_epilogue_args(kernel, var, args, sig, epilogue_args)
    launching.launch(kernel, grid, cfg.threads, args, shared_bytes=cfg.shared_bytes,
                     stream=stream, signature=sig)
    return None


def _scale_args(block_scales):
    """A blockwise launch's scale arguments as the kernel takes them (the strides as int64)."""
    if not block_scales:
        return ()
    sa, sb, *strides = block_scales
    return (sa, sb, *(np.int64(x) for x in strides))
