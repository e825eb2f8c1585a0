"""sm90_gemm's kernel as code (:func:`make_kernel`), for both producers.  The TMA producer (the
``_tma`` configurations, described here): one thread of the producer warpgroup arms each
stage's full mbarrier with the stage's byte count and issues the A and B tensor copies
(``cp.async.bulk.tensor``, 128B swizzle) into it.  The cp.async producer (sm90_gemm's
docstring; :func:`make_cp_producer`): the warpgroup's 128 threads copy 16 bytes each.  The two
wgmma consumer warpgroups, the epilogue, split-K, FP8 and persistent tiles are the same code.

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

Ping-pong (``pingpong``, the ``_pp`` names: CUTLASS's KernelTmaWarpSpecializedPingpong; opt-in
until measured).  Each consumer warpgroup holds a whole 128 x BN tile (BN <= 128: two m64 row
halves, 2 x BN / 2 accumulator registers, eight wgmma per k tile), and the block's persistent
tiles alternate between the two: warpgroup cw takes the block's tiles 2i + cw.  The producer
is unchanged -- it fills the one ring tile after tile -- so a warpgroup's k tiles start at ring
position (2i + cw) * k_tiles (index and phase from that count), and each stage is read and
released by one warpgroup (4 arrivals).  The warpgroups take turns at the main loop on named
barriers 4 and 5 (256 threads: one warpgroup's sync, the other's arrival): a turn is the sync
on its own barrier before the tile's first wait, and the arrival on the other's once its last
k tile is issued, so that the tensor core runs one warpgroup's main loop while the other runs
its epilogue.  Warpgroup 1 hands warpgroup 0 the first turn; the warpgroup that did not take
the block's last turn takes the last hand-over at the end (no named barrier is left part-full).
A warpgroup's tile is two passes of the tile loop: the main loop and the epilogue of the first
64-row half, then the epilogue of the second (TMA store: a staging tile per half and
warpgroup, 4 x 64 x BN x 2 bytes).  Split-K runs its SPLIT_TWIN; blockwise FP8 is not
implemented.

The kernel is Python code: :func:`make_kernel` is a factory whose ``gemm_kernel`` and device
functions (the main loop, the blockwise FP8 main loop, the TMA store and direct epilogues, the
split-K reduction) close over the configuration's and variant's constants, with the ring
(numbatc.kernels.pipeline), the producer thread (:func:`make_producer`), the rasterisation
(numbatc.kernels.tiles) and the epilogue's device functions (numbatc.kernels.epilogue.
make_epilogue) made the same way.  No source text is generated.  The accumulator (a tuple of
BN / 2 float32) is only ever sliced with literal bounds -- a run-time index into a tuple goes
through a stack copy (local memory) -- so the k tile's four wgmma are written out and the
epilogue's calls over the tile's 64-column blocks are spelled out under pruned branches on
their count (see the section's comment).  Against the generated kernel it replaced (the
regression baseline), the PTX of eight configurations x variants has the same wgmma, TMA,
barrier, stmatrix, load and store instructions, 15-34 more scalar integer ones (the tile's
coordinates, computed in the consumer branch), and ptxas reports the same registers and no
spills (docs/PERFORMANCE.md, ninth session).

See a kernel as it is compiled: its constants, and with ``ptx=True`` the PTX::

    python -c "from numbatc.kernels import sm90_gemm as g, sm90_gemm_tma as t; print(t.describe(
        g.CONFIGS['128x256x64_4s_pt_tma'], g.Sm90Variant('row', 'col', 'bfloat16', 'bfloat16',
        None, None, None)))"

Compile time (issue 18, ``python scripts/diag/compile_time.py <config>``: a configuration's
first compile as ``numbatc precompile --cc 9.0a`` makes it, in fresh processes): numba types
each call site and each statement of the kernel again in every propagation round, and each
device function's body once per signature, so the kernel keeps its statements few -- the
epilogue as block calls, the ring's state int64 from the start, the descriptors without
numba-level inlining (see the NOTEs where each bites).
"""

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt
from intrinsics.layout import SmemLayout, swizzle_offset_host
from intrinsics.layout.smem import encode_wgmma_smem_desc
from numbatc.kernels import build, operands
from numbatc.kernels import tensor_maps as tensor_maps_cache
from numbatc.kernels.epilogue import ZERO4, add_partial, epilogue_for, put_partial
from numbatc.kernels.pipeline import cp_async_pipeline, named_barrier_of, tma_pipeline
from numbatc.kernels.tiles import make_tile_coords

__all__ = ["MnKFirstLayout", "describe", "make_kernel", "launch", "make_producer", "out_map",
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
    """The shared-memory layout of operand ``op`` ('a' or 'b')'s tile as the producer writes it:
    K-major, wgmma's canonical 128B layout; MN-major, :class:`MnKFirstLayout` as the TMA boxes
    write it, or the canonical one (atoms MN-first) as the cp.async producer's copies do."""
    mn = cfg.bn if op == "b" else cfg.bm
    if k_major or cfg.producer != "tma":
        return SmemLayout("K" if k_major else "MN", _SWIZZLE, mn, cfg.bk, cfg.elem_bytes)
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
        index = np.int64(0)  # (not the literal 0: see the consumers' note in make_kernel)
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


# ---------------------------------------------------------------------------------------------
# Device code: the cp.async producer warpgroup, factory-made
# ---------------------------------------------------------------------------------------------

#: ``swizzle(byte offset, mode)``: intrinsics.layout's swizzle of an offset from a tile base
#: aligned to the swizzle's repeat (forceinline, as smem_desc: the mode folds in LLVM).
swizzle = cuda.jit(device=True, forceinline=True)(swizzle_offset_host)


def _pad16(values):
    """``values`` padded with zeros to 16 (the written-out steps below index up to 15)."""
    values = tuple(values)
    return values + (0,) * (16 - len(values))


@functools.cache
def make_cp_loaders(mn, bk, elem_bytes, k_major):
    """``(load, load_inside, chunks)`` for one operand's tile (A: mn = BM, B: mn = BN) of the
    cp.async producer warpgroup, 128 threads of 16-byte copies (8 bf16 / f16, 16 fp8 values)
    into sm90_gemm's 128B-swizzled layout (K-major: mn rows of 128 bytes; MN-major, bf16 / f16
    only: BK k rows of mn values, stored as 8-k atoms of 8 x 128 B, MN-first); ``chunks`` is
    the 16-byte chunks of a tile row.  Offsets and leading dimensions are in bytes.

    ``load(smem, base, src, start, ld, r0, c0, mn_lim, k0, k_lim)``, the checked copies: thread
    p copies chunk c0 (p % chunks) of rows r0 + i * STEP (r0 = p // chunks < STEP = 128 /
    chunks), from ``start`` (its first copy's byte offset at k = 0) plus k0; rows at or past
    the operand's end are zero-filled, a ragged last chunk copies the bytes left.  The shared
    offset of copy i is one of at most two per-thread swizzled bases (the swizzle depends on
    the row mod 8 only, which STEP moves by 0 or 4) plus a constant; the source address
    advances by STEP rows per copy.

    ``load_inside(smem, base, src, org, ld, p, k0)``: the same tile wholly inside the operand
    (the producer checks that once per k tile), plain copies with a mapping that keeps
    addresses cheap: thread p copies the 16 bytes at byte column 16 (p % 8) + 128 j of rows
    p // 8 + 16 i -- a warp covers 4 rows x 128 contiguous bytes per copy, the swizzle is
    constant for the thread, and the 128-byte steps j are immediate offsets on both sides
    (MN-major: one 1024-byte atom further in shared memory); rows step by 16 ld.

    NOTE: the producer runs in 40 registers (56 persistent; setmaxnreg), and LLVM's LICM hoists
    every loop-invariant value out of the k loop: per-copy offsets, 64-bit source offsets and
    row predicates spilled hundreds of bytes.  So STEP * ld and the rows left pass through
    ``wgmma_fence_operand`` (an empty volatile asm, opaque to LLVM) inside the loop, and
    everything derived from them is computed per k tile in a few short-lived registers.  The
    copies are written out (4, 8 or 16 of them) under pruned branches on their count."""
    eb = elem_bytes
    epc = 16 // eb  # values per copy
    assert k_major or eb == 2, "MN-major tiles are bf16 / f16 only"
    rows, cols = (mn, bk) if k_major else (bk, mn)
    chunks = cols // epc
    step = 128 // chunks
    count = rows * chunks // 128
    assert (step % 8 == 0 or 8 % step == 0) and count in (4, 8, 16), (mn, bk, k_major)
    atom = mn * 16  # MN-major: bytes between 8-k atoms' rows of atoms (mn / 64 atoms)

    def delta(r):
        # offset(r0 + r) - offset(r0 + r % 8): r - r % 8 rows further
        d = r - r % 8
        return d * 128 if k_major else (d // 8) * atom

    at = _pad16(delta(i * step) for i in range(count))
    upper = _pad16((i * step) % 8 != 0 for i in range(count))  # from the base 4 rows down
    lim = _pad16(i * step for i in range(count))
    # the inside copies: (pass i, 128-byte column j) -> shared offset, source row, source column
    per_thread = chunks // 8
    passes = rows // 16
    assert chunks % 8 == 0 and rows % 16 == 0 and passes * per_thread in (4, 8, 16)
    n_in = passes * per_thread
    in_at = _pad16((i * 16 * 128) if k_major else (i * 2 * atom + j * 1024)
                   for i in range(passes) for j in range(per_thread))
    in_row = _pad16(i for i in range(passes) for j in range(per_thread))
    in_col = _pad16(128 * j for i in range(passes) for j in range(per_thread))
    copy = nt.cp_async_op(16, zfill=True)
    copy_in = nt.cp_async_op(16)

    @cuda.jit(device=True, forceinline=True)
    def offset(r, c):
        # the unswizzled byte offset of (row r, column c) in the tile
        if k_major:
            return r * 128 + c * eb
        return (r // 8) * atom + (c // 64) * 1024 + (r % 8) * 128 + (c % 64) * 2

    @cuda.jit(device=True, forceinline=True)
    def put(smem, dst, src, g, nbytes, keep):
        if keep:
            copy(smem, dst, src, g, nbytes)
        else:
            copy(smem, dst, src, 0, 0)

    @cuda.jit(device=True, forceinline=True)
    def load(smem, base, src, start, ld, r0, c0, mn_lim, k0, k_lim):
        if k_major:
            g = start + k0 * eb
            cc = k_lim - c0
            left = mn_lim - r0
        else:
            g = start + k0 * ld
            cc = mn_lim - c0
            left = k_lim - r0
        nbytes = min(cc, epc) * eb
        row_ld = np.int64(nt.wgmma_fence_operand(np.int32(step * ld)))
        left = np.int64(nt.wgmma_fence_operand(np.int32(left)))
        ok = cc > 0
        d0 = base + swizzle(offset(r0, c0), _SWIZZLE)
        d4 = base + swizzle(offset(r0 + 4, c0), _SWIZZLE)  # (used where STEP is 4)
        put(smem, (d4 if upper[0] else d0) + at[0], src, g, nbytes, (lim[0] < left) & ok)
        g += row_ld
        put(smem, (d4 if upper[1] else d0) + at[1], src, g, nbytes, (lim[1] < left) & ok)
        g += row_ld
        put(smem, (d4 if upper[2] else d0) + at[2], src, g, nbytes, (lim[2] < left) & ok)
        g += row_ld
        put(smem, (d4 if upper[3] else d0) + at[3], src, g, nbytes, (lim[3] < left) & ok)
        if count > 4:
            g += row_ld
            put(smem, (d4 if upper[4] else d0) + at[4], src, g, nbytes, (lim[4] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[5] else d0) + at[5], src, g, nbytes, (lim[5] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[6] else d0) + at[6], src, g, nbytes, (lim[6] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[7] else d0) + at[7], src, g, nbytes, (lim[7] < left) & ok)
        if count > 8:
            g += row_ld
            put(smem, (d4 if upper[8] else d0) + at[8], src, g, nbytes, (lim[8] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[9] else d0) + at[9], src, g, nbytes, (lim[9] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[10] else d0) + at[10], src, g, nbytes,
                (lim[10] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[11] else d0) + at[11], src, g, nbytes,
                (lim[11] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[12] else d0) + at[12], src, g, nbytes,
                (lim[12] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[13] else d0) + at[13], src, g, nbytes,
                (lim[13] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[14] else d0) + at[14], src, g, nbytes,
                (lim[14] < left) & ok)
            g += row_ld
            put(smem, (d4 if upper[15] else d0) + at[15], src, g, nbytes,
                (lim[15] < left) & ok)

    @cuda.jit(device=True, forceinline=True)
    def load_inside(smem, base, src, org, ld, p, k0):
        if k_major:
            g = org + (p // 8) * ld + (p % 8) * 16 + k0 * eb
            d = base + swizzle((p // 8) * 128 + (p % 8) * 16, _SWIZZLE)
        else:
            g = org + (p // 8) * ld + (p % 8) * 16 + k0 * ld
            d = base + swizzle(((p // 8) // 8) * atom + ((p // 8) % 8) * 128 + (p % 8) * 16,
                               _SWIZZLE)
        row16 = np.int64(nt.wgmma_fence_operand(np.int32(16 * ld)))
        copy_in(smem, d + in_at[0], src, g + in_row[0] * row16 + in_col[0])
        copy_in(smem, d + in_at[1], src, g + in_row[1] * row16 + in_col[1])
        copy_in(smem, d + in_at[2], src, g + in_row[2] * row16 + in_col[2])
        copy_in(smem, d + in_at[3], src, g + in_row[3] * row16 + in_col[3])
        if n_in > 4:
            copy_in(smem, d + in_at[4], src, g + in_row[4] * row16 + in_col[4])
            copy_in(smem, d + in_at[5], src, g + in_row[5] * row16 + in_col[5])
            copy_in(smem, d + in_at[6], src, g + in_row[6] * row16 + in_col[6])
            copy_in(smem, d + in_at[7], src, g + in_row[7] * row16 + in_col[7])
        if n_in > 8:
            copy_in(smem, d + in_at[8], src, g + in_row[8] * row16 + in_col[8])
            copy_in(smem, d + in_at[9], src, g + in_row[9] * row16 + in_col[9])
            copy_in(smem, d + in_at[10], src, g + in_row[10] * row16 + in_col[10])
            copy_in(smem, d + in_at[11], src, g + in_row[11] * row16 + in_col[11])
            copy_in(smem, d + in_at[12], src, g + in_row[12] * row16 + in_col[12])
            copy_in(smem, d + in_at[13], src, g + in_row[13] * row16 + in_col[13])
            copy_in(smem, d + in_at[14], src, g + in_row[14] * row16 + in_col[14])
            copy_in(smem, d + in_at[15], src, g + in_row[15] * row16 + in_col[15])

    return load, load_inside, chunks


@functools.cache
def make_cp_producer(bm, bn, bk, stages, a_kmajor, b_kmajor, persistent, elem_bytes=2):
    """``produce(smem, bars, a, b, M, N, K, lda, ldb, group_m, kbeg, p)``: producer thread p's
    whole job (all 128 threads of the warpgroup run it; ``a``, ``b`` byte pointers, ``lda``,
    ``ldb`` in elements) -- for each of the block's tiles (as :func:`make_producer`) and each k
    tile from ``kbeg`` on: acquire the next stage of numbatc.kernels.pipeline's
    cp_async_pipeline ring, issue the thread's copies of A's and B's tiles into it (plain
    copies where the tile lies inside the operands, else checked ones: :func:`make_cp_loaders`)
    and arrive on its full barrier with ``cp.async.mbarrier.arrive.noinc`` (the arrival fires
    once the thread's copies so far have landed; the full barrier counts 128)."""
    from numbatc.kernels.pipeline import cp_async_pipeline

    eb = elem_bytes
    epc = 16 // eb
    load_a, load_a_inside, a_chunks = make_cp_loaders(bm, bk, eb, a_kmajor)
    load_b, load_b_inside, b_chunks = make_cp_loaders(bn, bk, eb, b_kmajor)
    ring = cp_async_pipeline(stages)
    acquire, commit, advance = ring.producer_acquire, ring.producer_commit, ring.advance
    tile_coords = make_tile_coords(bm, bn)
    a_bytes = bm * bk * eb
    stage_bytes = (bm + bn) * bk * eb

    @cuda.jit(device=True, forceinline=True)
    def load_tile(smem, bars, a, b, M, N, K, lda, ldb, kbeg, m0, n0, p, index, phase):
        # the tile's origin in bytes at its first k, this thread's first copy's (row r0,
        # column c0) of each tile and byte offset; the tile's M and N extents inside the
        # operands: then every k tile but a ragged last one is copied without bounds checks
        ar0 = p // a_chunks
        ac0 = (p % a_chunks) * epc
        br0 = p // b_chunks
        bc0 = (p % b_chunks) * epc
        lda_b = lda * eb
        ldb_b = ldb * eb
        a_org = ((m0 * lda + kbeg) if a_kmajor else (m0 + kbeg * lda)) * eb
        b_org = ((n0 * ldb + kbeg) if b_kmajor else (n0 + kbeg * ldb)) * eb
        a_start = a_org + ar0 * lda_b + ac0 * eb
        b_start = b_org + br0 * ldb_b + bc0 * eb
        m_lim = M - m0
        n_lim = N - n0
        inside = m_lim >= bm and n_lim >= bn
        for kt in range((K + (bk - 1)) // bk):
            acquire(bars, index, phase)
            base = index * stage_bytes
            k0 = kt * bk
            if inside and k0 + bk <= K:
                load_a_inside(smem, base, a, a_org, lda_b, p, k0)
                load_b_inside(smem, base + a_bytes, b, b_org, ldb_b, p, k0)
            else:
                load_a(smem, base, a, a_start, lda_b, ar0, ac0, m_lim, k0, K - k0)
                load_b(smem, base + a_bytes, b, b_start, ldb_b, br0, bc0, n_lim, k0, K - k0)
            commit(bars, index, 0)  # fires once this thread's copies so far have landed
            index, phase = advance(index, phase)
        return index, phase

    @cuda.jit(device=True, forceinline=True)
    def produce(smem, bars, a, b, M, N, K, lda, ldb, group_m, kbeg, p):
        index = np.int64(0)  # (not the literal 0: see the consumers' note in make_kernel)
        phase = np.int64(0)
        if persistent:
            n_tiles = np.int64((M + (bm - 1)) // bm) * np.int64((N + (bn - 1)) // bn)
            tile = np.int64(cuda.blockIdx.x)
            while tile < n_tiles:
                tm, tn = tile_coords(np.uint32(tile), M, N, group_m)
                index, phase = load_tile(smem, bars, a, b, M, N, K, lda, ldb, kbeg,
                                         np.int64(tm) * bm, np.int64(tn) * bn, p, index, phase)
                tile += cuda.gridDim.x
        else:
            tm, tn = tile_coords(np.uint32(cuda.blockIdx.x), M, N, group_m)
            load_tile(smem, bars, a, b, M, N, K, lda, ldb, kbeg, np.int64(tm) * bm,
                      np.int64(tn) * bn, p, index, phase)
        nt.cp_async_wait_all()

    return produce


@functools.cache
def signature(var, tma_store=False, cp_async=False):
    """The kernel's argument types (see :func:`make_kernel`): the tensor maps of a and b (passed
    by value, ``TensorMap.param``: intrinsics.grid_constant), out's with ``tma_store`` (the TMA
    store epilogue; else an empty tuple), the pointers and sizes sm90_gemm.signature gives
    c, bias, out and the rest, then the blockwise scales, split-K's arguments and -- without a
    user epilogue -- the empty ``eargs`` as tuples (epilogue.with_epilogue_args appends a user
    epilogue's).  Flattened, the parameters are sm90_gemm.signature's order with the maps in
    place of the operand pointers.  ``cp_async``: the cp.async producer's kernel, a's and b's
    byte pointers in place of the maps (sm90_gemm.signature's order exactly)."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param as tmap
    from numbatc.kernels import sm90_gemm

    base = sm90_gemm.signature(var)  # a, b, c, bias, out, 7 sizes, alpha, beta, group_m, ...
    head, tail = base[2:15], base[15:]
    blockwise = getattr(var, "blockwise", False)
    scales = types.Tuple(tail[:6]) if blockwise else types.Tuple(())
    split = types.Tuple(tail[6:] if blockwise else tail) if var.split_k else types.Tuple(())
    eargs = (types.Tuple(()),) if var.epilogue is None else ()
    ops = base[:2] if cp_async else (tmap, tmap)
    return ops + (tmap if tma_store else types.Tuple(()),) + head + (scales, split) + eargs


# ---------------------------------------------------------------------------------------------
# The kernel, factory-made
# ---------------------------------------------------------------------------------------------
#
# The consumers hold a tile's accumulator as one flat tuple of BN / 2 float32 (wgmma's
# registers), and the epilogue works on it in 64-column blocks of BLOCK_FRAGS fragments
# (epilogue.Epilogue's ``*_frags``).  A tuple is only sliced with literal bounds (numba turns a
# literal slice into a static one; a bound held in a variable does not type, and a run-time
# index into a tuple goes through a stack copy: local memory), so the kernel spells each count
# of blocks out under a branch on the count, which numba prunes before typing.


@functools.cache
def _stage_frags(out_dtype):
    """``stage_frags(smem, box, sx, v)``: one block's 32 values (value_frags: 8 fragments, 64
    columns) into its staging box through 4 stmatrix.x4 (see :func:`make_kernel`'s TMA store):
    call jj writes fragments 2jj and 2jj + 1 -- the jj-th group of four packed pairs that
    intrinsics.convert's frag_pack gives (v[8jj] .. v[8jj + 7]); lane l gives the row address
    of matrix l // 8, and register q holds the pair (v[4j + 2h], v[4j + 2h + 1]) of fragment
    j = 2jj + q // 2, half h = q % 2 (rows + 8)."""
    frag_pack = nt.frag_pack_bf16x2 if out_dtype == "bfloat16" else nt.frag_pack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def stage_frags(smem, box, sx, v):
        # this lane's row address in the box: box + row * 128; sx = (sq // 2) ^ row % 8
        q0, q1, q2, q3 = frag_pack(v)
        nt.stmatrix_x4(smem, box + ((0 ^ sx) << 4), q0)
        nt.stmatrix_x4(smem, box + ((2 ^ sx) << 4), q1)
        nt.stmatrix_x4(smem, box + ((4 ^ sx) << 4), q2)
        nt.stmatrix_x4(smem, box + ((6 ^ sx) << 4), q3)
    return stage_frags


@cuda.jit(device=True, forceinline=True)
def _put_partial_frags(ws, sl, acc, r, col, M, N):
    # split-K: a block's 8 fragments to this K slice's part of the workspace
    put_partial(ws, sl, acc[0:4], r, col, M, N)
    put_partial(ws, sl, acc[4:8], r, col + 8, M, N)
    put_partial(ws, sl, acc[8:12], r, col + 16, M, N)
    put_partial(ws, sl, acc[12:16], r, col + 24, M, N)
    put_partial(ws, sl, acc[16:20], r, col + 32, M, N)
    put_partial(ws, sl, acc[20:24], r, col + 40, M, N)
    put_partial(ws, sl, acc[24:28], r, col + 48, M, N)
    put_partial(ws, sl, acc[28:32], r, col + 56, M, N)


@functools.cache
def _sum_frags(store_tile):
    """``sum_frags(out, c, bias, ws, splits, r, col, ...)``: split-K's last block sums a block's
    8 fragments over the K slices, in slice order (deterministic), and stores them; 4 fragments
    at a time (epilogue.SPLIT_GROUP: one slice's loads of the group are in flight together, and
    the group bounds the registers; see epilogue.split_epilogue_source)."""

    @cuda.jit(device=True, forceinline=True)
    def sum_frags(out, c, bias, ws, splits, r, col, M, N, ldc, ldo, alpha, beta, eargs):
        for g in range(2):
            cg = col + 32 * g
            p0 = ZERO4
            p1 = ZERO4
            p2 = ZERO4
            p3 = ZERO4
            for s in range(splits):
                sr = s * M
                p0 = add_partial(ws, sr, p0, r, cg, M, N)
                p1 = add_partial(ws, sr, p1, r, cg + 8, M, N)
                p2 = add_partial(ws, sr, p2, r, cg + 16, M, N)
                p3 = add_partial(ws, sr, p3, r, cg + 24, M, N)
            store_tile(out, c, bias, p0, r, cg, M, N, ldc, ldo, alpha, beta, eargs)
            store_tile(out, c, bias, p1, r, cg + 8, M, N, ldc, ldo, alpha, beta, eargs)
            store_tile(out, c, bias, p2, r, cg + 16, M, N, ldc, ldo, alpha, beta, eargs)
            store_tile(out, c, bias, p3, r, cg + 24, M, N, ldc, ldo, alpha, beta, eargs)
    return sum_frags


@cuda.jit(device=True, forceinline=True)
def _promote4(acc, pa, f0, f1):
    # one fragment of a blockwise k tile's product, scaled (rows r: f0, r + 8: f1) into acc
    return (nt.fma_f32(pa[0], f0, acc[0]), nt.fma_f32(pa[1], f0, acc[1]),
            nt.fma_f32(pa[2], f1, acc[2]), nt.fma_f32(pa[3], f1, acc[3]))


@cuda.jit(device=True, forceinline=True)
def _promote32(acc, pa, f0, f1):
    return (_promote4(acc[0:4], pa[0:4], f0, f1) + _promote4(acc[4:8], pa[4:8], f0, f1)
            + _promote4(acc[8:12], pa[8:12], f0, f1) + _promote4(acc[12:16], pa[12:16], f0, f1)
            + _promote4(acc[16:20], pa[16:20], f0, f1) + _promote4(acc[20:24], pa[20:24], f0, f1)
            + _promote4(acc[24:28], pa[24:28], f0, f1)
            + _promote4(acc[28:32], pa[28:32], f0, f1))


@cuda.jit(device=True, forceinline=True)
def _promote64(acc, pa, f0, f1):
    return (_promote32(acc[0:32], pa[0:32], f0, f1)
            + _promote32(acc[32:64], pa[32:64], f0, f1))


@functools.cache
def make_kernel(cfg, var):
    """The TMA-producer kernel for one configuration and variant: an ordinary ``@cuda.jit``
    function whose every constant -- the tile, the stages, the layouts, the variant's epilogue,
    split-K, the TMA store -- is a closure value, so each branch on them is pruned before
    typing (numba's dead-branch pruning resolves closure constants) and LLVM folds the rest.

    ``gemm_kernel(tma_a, tma_b, tma_out, c, bias, out, M, N, K, lda, ldb, ldc, ldo, alpha, beta,
    group_m, scales, split, eargs)``: ``tma_out`` is out's tensor map under the TMA store
    epilogue, else ``()``; ``scales`` the blockwise FP8 scales and their strides ``(sa, sb,
    sa_rs, sa_cs, sb_rs, sb_cs)`` or ``()``; ``split`` split-K's ``(ws, counters, k_chunk,
    splits)`` or ``()``; ``eargs`` a user epilogue's arrays (``()`` without one).  An empty
    tuple is no kernel parameter at all, and a tuple's members are parameters in order, so the
    parameter list is the flat one sm90_gemm.launch_flat packs (see :func:`signature`).

    The main loop and the epilogue are written in the kernel's body, as the generated kernel it
    replaced had them: numba compiles each device function in a pipeline of its own (~25 ms on
    a 2-core host), which a helper per step would add to the first call (issue 18)."""
    from numbatc.kernels import sm90_gemm

    cp_async = cfg.producer == "cp.async"
    tma_store = cfg.store == "tma"
    assert not (tma_store and var.split_k), "a K slice's partial sums are not stored by TMA"
    assert not tma_store or (var.out_dtype in _TMA_DTYPE and var.out_layout == "row"), var
    blockwise = getattr(var, "blockwise", False)
    # blockwise scaling: one scale of b per 128 columns covers the tile, one k tile is one
    # 128-value scale block, and each k tile's product is read back before the next one
    assert not blockwise or (cfg.bk == 128 and cfg.bn in (64, 128) and cfg.inflight == 0), cfg
    split_k, has_user = var.split_k, var.epilogue is not None
    BM, BN, BK, S = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    kinst = 32 // cfg.elem_bytes  # K of one wgmma: 16 (bf16/f16), 32 (fp8)
    assert BK // kinst == 4, cfg  # a k tile's four wgmma are written out
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_lay, b_lay = operand_layout(cfg, "a", a_kmajor), operand_layout(cfg, "b", b_kmajor)
    a_part = int(a_lay.offset(64, 0))  # consumer warpgroup 1's rows 64.. of A
    a_lbo, a_sbo, b_lbo, b_sbo = a_lay.lbo, a_lay.sbo, b_lay.lbo, b_lay.sbo
    # the k steps' start addresses within a stage, in 16-byte units (the descriptor's)
    ak0, ak1, ak2, ak3 = (a_lay.k_offset(ks * kinst) // 16 for ks in range(4))
    bk0, bk1, bk2, bk3 = (b_lay.k_offset(ks * kinst) // 16 for ks in range(4))
    pers = cfg.persistent and not split_k
    inflight = cfg.inflight != 0
    a_bytes, stage16 = cfg.a_bytes, cfg.stage_bytes // 16
    n_bars = 2 * S  # full[s], empty[s]
    consumer_arrivals = 4 * cfg.consumers  # one per consumer warp
    consumer_threads = 128 * cfg.consumers
    producer_regs, consumer_regs = cfg.producer_regs, cfg.consumer_regs
    nb = BN // 64  # 64-column blocks of the tile
    wg_bytes = 64 * BN * 2  # a consumer warpgroup's staging tile (TMA store)
    stage0 = S * cfg.stage_bytes  # the staging tiles, behind the stages
    # the direct epilogue: with nothing to load (no c, no user epilogue) and per-element stores
    # (no out_pairs) one pass of bounds-checked stores; else, on a tile inside the matrix,
    # every value first (all loads in flight together), then every store (see
    # epilogue.full_tile_epilogue's NOTE)
    one_pass = not has_user and var.c_dtype is None and not var.out_pairs

    mma = sm90_gemm.mma_for(BN, var, a_kmajor, b_kmajor)
    zeros = (np.float32(0),) * (BN // 2)
    # the cp.async producer: 128 arrivals (.noinc) complete a full barrier, and a consumer's
    # wait is followed by a proxy fence (pipeline.cp_async_pipeline)
    ring = cp_async_pipeline(S) if cp_async else tma_pipeline(S)
    ring_init, advance = ring.init, ring.advance
    wait, release = ring.consumer_wait, ring.consumer_release
    producer_arrivals = 128 if cp_async else 1
    tile_coords = make_tile_coords(BM, BN)
    maker = make_cp_producer if cp_async else make_producer
    produce = maker(BM, BN, BK, S, a_kmajor, b_kmajor, pers, cfg.elem_bytes)
    ep = epilogue_for(var)
    value_frags, put_frags, store_frags = ep.value_frags, ep.put_frags, ep.store_frags
    stage_frags = _stage_frags(var.out_dtype) if tma_store else None
    sum_frags = _sum_frags(ep.store_tile) if split_k else None
    promote = _promote64 if BN == 128 else _promote32
    first_scale_d = 0 if blockwise else 1  # 0: the k tile's first wgmma overwrites d
    # ping-pong (cfg.pingpong): each consumer warpgroup holds a whole tile (its two 64-row
    # halves: d and d1), the block's tiles alternating between the warpgroups, and each stage
    # is read by one warpgroup (4 warps release it)
    pingpong = cfg.pingpong
    assert not pingpong or not (split_k or blockwise), (cfg, var)
    if pingpong:
        consumer_arrivals = 4

    every_pass = not pingpong  # each pass of the tile loop is a tile's first (see the loop)
    # one tile a block (neither persistent nor ping-pong): the loop ends after its first pass.
    # NOTE: without the break LLVM keeps the loop's state (tile, step, the ring's position)
    # live across the epilogue; a user epilogue's at 232 consumer registers spilled 24 bytes
    one_tile = not pers and not pingpong
    wg_sync = named_barrier_of((2, 3), 128)  # consumer warpgroup cw's 128 threads
    turn_sync = named_barrier_of((4, 5), 256)  # ping-pong: warpgroup cw's turn at the main loop
    turn_pass = named_barrier_of((5, 4), 256, arrive=True)  # ... handed to the other

    @cuda.jit(cache=False, launch_bounds=(cfg.threads, 1))
    def gemm_kernel(tma_a, tma_b, tma_out, c, bias, out, M, N, K, lda, ldb, ldc, ldo, alpha,
                    beta, group_m, scales, split, eargs):
        # S stages of [A BM x BK | B BN x BK], stage_bytes each
        smem = cuda.shared.array(0, np.uint8, alignment=1024)
        # full[s] = bars[s]: the producer's expect_tx arrival + the stage's bytes;
        # empty[s] = bars[S + s]: one arrival per consumer warp
        bars = cuda.shared.array(n_bars, np.uint64, alignment=8)
        t = cuda.threadIdx.x
        wg = t // 128
        kbeg = np.int64(0)
        if split_k:  # blockIdx.y is the K slice: K becomes its length
            ws, counters, k_chunk, splits = split
            kbeg = cuda.blockIdx.y * k_chunk
            K = min(K - kbeg, k_chunk)
        k_tiles = (K + (BK - 1)) // BK

        if t == 0:
            ring_init(bars, producer_arrivals, consumer_arrivals)
        cuda.syncthreads()

        if wg == 0:
            # ---- producer warpgroup: thread 0 issues every copy (cp.async: every thread
            # copies; tma_a and tma_b are then a's and b's byte pointers) ---------------------
            nt.setmaxnreg_dec(producer_regs)
            if cp_async:
                produce(smem, bars, tma_a, tma_b, M, N, K, lda, ldb, group_m, kbeg, t)
            elif t == 0:
                produce(smem, bars, tma_a, tma_b, M, N, K, group_m, kbeg)
            return

        # ---- consumer warpgroups ---------------------------------------------------------------
        nt.setmaxnreg_inc(consumer_regs)
        cw = wg - 1
        # (64, BK) part of A for this warpgroup, (BN, BK) of B; the stage and the k step move the
        # descriptors' start address (bits 0-13 hold address >> 4; no carry leaves the field)
        # (ping-pong: both 64-row parts of A, da0 and da1, for the warpgroup's whole tile)
        da0 = smem_desc(nt.shared_address(smem, 0 if pingpong else cw * a_part), a_lbo, a_sbo,
                        _SWIZZLE)
        da1 = da0 + np.uint64(a_part // 16)
        db0 = smem_desc(nt.shared_address(smem, a_bytes), b_lbo, b_sbo, _SWIZZLE)
        # NOTE: int64, not the literal 0: numba would type the ring's functions for
        # Literal[int](0) first and again for int64 once the loop unifies them, and propagate
        # the kernel once more (0.45 s of compile: scripts/diag/compile_time.py)
        index = np.int64(0)
        phase = np.int64(0)
        # thread (warp w, lane l) of the warpgroup holds rows 16w + l/4 (+8) and columns
        # 8j + 2(l%4) (+1) in registers 4j..4j+3 (intrinsics.wgmma.accumulator_coords)
        lane = t % 32
        lt = t % 128
        tile = np.int64(cuda.blockIdx.x)
        step = np.int64(cuda.gridDim.x)
        n_tiles = tile + 1  # this block's tile; persistent: every gridDim.x-th from it
        if pers:
            n_tiles = np.int64((M + (BM - 1)) // BM) * np.int64((N + (BN - 1)) // BN)
        if pingpong:
            # the block's tiles alternate: warpgroup cw takes its (2i + cw)-th; the producer
            # fills the ring in tile order, so a warpgroup's k tiles start k_tiles further on
            # for each of the other's tiles before them (the ring position ``pos``)
            n_block = (n_tiles - tile + step - 1) // step  # the block's tiles
            tile += cw * step
            step *= 2
            pos = cw * k_tiles
            # turns: warpgroup 1 hands warpgroup 0 the first one
            if cw == 1:
                turn_pass(1)
        # ping-pong: a warpgroup's tile is two passes of this loop, the main loop in the first
        # and the epilogue in each (of d, then of d1: the second 64-row half).  NOTE: not a
        # loop over the halves around the epilogue, which cost the other configurations 0.13 s
        # of first compile (numba types a loop body to a fixed point); every ping-pong-only
        # assignment sits under a branch on pingpong, which numba prunes
        # (``every_pass``, a closure constant: without ping-pong numba prunes the test of
        # ``first`` and the main loop is not conditional code, which cost 0.06 s of the default
        # configuration's first compile, 1.34 -> 1.28 s on a 2-core host)
        second = False
        first = True
        if pingpong:
            m0 = n0 = row = col = wrow = np.int64(0)
            d1 = acc = zeros
        while tile < n_tiles:
            if pingpong:
                first = not second
                if second:
                    acc = d1
                    row += 64
                    wrow += 64
            if every_pass or first:
                tm, tn = tile_coords(np.uint32(tile), M, N, group_m)
                m0 = np.int64(tm) * BM
                n0 = np.int64(tn) * BN
                wrow = 0 if pingpong else cw * 64  # the warpgroup's first row of the tile
                row = m0 + wrow + (lt // 32) * 16 + lane // 4
                col = n0 + (lane % 4) * 2
                if pingpong:
                    index = pos % S
                    phase = (pos // S) % 2
                    pos += 2 * k_tiles
                    turn_sync(cw)  # this warpgroup's turn at the tensor core
                # ---- main loop: TMA wrote each stage through the async proxy, which wgmma reads,
                # so no proxy fence follows the wait.
                # Blockwise FP8 (DeepGEMM's recipe): each k tile's product d goes into a wgmma
                # accumulator of its own (the first wgmma with scale-d 0), which, once retired, is
                # added into acc (plain registers) scaled by a's scale of each row and b's of the
                # tile's 128 columns for that 128-value K block; the scales are loaded before the
                # tile's stage wait (which hides their latency), rows past M read row M - 1's (never
                # stored).  Otherwise d is the tile's accumulator.
                # NOTE: one product buffer, waited for before its promotion, so the promotion does
                # not overlap this warpgroup's next wgmma (the other consumer warpgroup's may run).
                # Two buffers (tile kt's wgmma under tile kt - 1's promotion, 64 + 2 x 64 registers
                # at BN = 128) were tried: ptxas serialised the wgmma (C7514 / C7518) and the
                # 128-row form spilled.
                d = nt.wgmma_fence_operand(zeros)  # written by ordinary code: pin before wgmma
                if pingpong:
                    d1 = nt.wgmma_fence_operand(zeros)
                acc = zeros
                prev = index
                if blockwise:
                    sa, sb, sa_rs, sa_cs, sb_rs, sb_cs = scales
                    sr0 = min(row, M - 1) * sa_rs
                    sr1 = min(row + 8, M - 1) * sa_rs
                    sbn = (n0 // 128) * sb_rs
                for kt in range(k_tiles):
                    if blockwise:
                        kb = (kbeg + kt * 128) // 128
                        p0 = sa[sr0 + kb * sa_cs]
                        p1 = sa[sr1 + kb * sa_cs]
                        pq = sb[sbn + kb * sb_cs]
                    wait(bars, index, phase)
                    # the k tile's four wgmma (the k steps move the descriptors' start address)
                    st = np.uint64(index * stage16)
                    nt.wgmma_fence()
                    d = mma(d, da0 + st + np.uint64(ak0), db0 + st + np.uint64(bk0), first_scale_d)
                    d = mma(d, da0 + st + np.uint64(ak1), db0 + st + np.uint64(bk1), 1)
                    d = mma(d, da0 + st + np.uint64(ak2), db0 + st + np.uint64(bk2), 1)
                    d = mma(d, da0 + st + np.uint64(ak3), db0 + st + np.uint64(bk3), 1)
                    if pingpong:  # the tile's second 64 rows
                        d1 = mma(d1, da1 + st + np.uint64(ak0), db0 + st + np.uint64(bk0), 1)
                        d1 = mma(d1, da1 + st + np.uint64(ak1), db0 + st + np.uint64(bk1), 1)
                        d1 = mma(d1, da1 + st + np.uint64(ak2), db0 + st + np.uint64(bk2), 1)
                        d1 = mma(d1, da1 + st + np.uint64(ak3), db0 + st + np.uint64(bk3), 1)
                    nt.wgmma_commit_group()
                    if pingpong and kt == k_tiles - 1:
                        turn_pass(cw)  # the last k tile is issued: the other warpgroup's turn
                    if inflight:
                        # keep this tile's group in flight over the next wait; the previous
                        # tile's group has retired, so its stage goes back to the producer
                        nt.wgmma_wait_group(1)
                        d = nt.wgmma_fence_operand(d)
                        if pingpong:
                            d1 = nt.wgmma_fence_operand(d1)
                        if kt > 0 and t % 32 == 0:
                            release(bars, prev)
                        prev = index
                    else:
                        # this tile's group retired: its stage goes back to the producer
                        nt.wgmma_wait_group(0)
                        d = nt.wgmma_fence_operand(d)
                        if pingpong:
                            d1 = nt.wgmma_fence_operand(d1)
                        if t % 32 == 0:
                            release(bars, index)
                    index, phase = advance(index, phase)
                    if blockwise:
                        acc = promote(acc, d, p0 * pq, p1 * pq)
                if pingpong and k_tiles == 0:
                    turn_pass(cw)  # (no k tile: the turn passes at once)
                if inflight:
                    nt.wgmma_wait_group(0)
                    d = nt.wgmma_fence_operand(d)
                    if pingpong:
                        d1 = nt.wgmma_fence_operand(d1)
                    # the next tile's fills wait for this tile's last stage (without persistent
                    # tiles it is never released: nobody waits for it)
                    if pers and k_tiles > 0 and t % 32 == 0:
                        release(bars, prev)
                if not blockwise:
                    acc = d
            # ---- epilogue, by 64-column blocks: b[i] is block i's 32 values (sliced
            # here, and each block's call written out under a branch on the count, pruned
            # before typing: a 128-value tuple passed to a device function, or a function
            # per step over the blocks, costs numba 0.05-0.1 s of compile each;
            # scripts/diag/compile_time.py)
            if nb == 1:
                b = (acc,)
            elif nb == 2:
                b = (acc[0:32], acc[32:64])
            else:
                b = (acc[0:32], acc[32:64], acc[64:96], acc[96:128])
            inside = m0 + wrow + 64 <= M and n0 + BN <= N
            if split_k:
                # this block's partial tile to its slice of the workspace; the last block of
                # the tile to arrive (thread 128, consumer warpgroup 0's first, counts) sums
                # the slices in order and stores the tile
                sl = cuda.blockIdx.y * M
                _put_partial_frags(ws, sl, b[0], row, col, M, N)
                if nb >= 2:
                    _put_partial_frags(ws, sl, b[1], row, col + 64, M, N)
                if nb == 4:
                    _put_partial_frags(ws, sl, b[2], row, col + 128, M, N)
                    _put_partial_frags(ws, sl, b[3], row, col + 192, M, N)
                cuda.threadfence()
                nt.named_barrier_sync(1, consumer_threads)  # (the producer has left)
                last = cuda.shared.array(1, np.int32)
                if t == 128:
                    last[0] = np.int32(nt.atomic_add_global(counters, cuda.blockIdx.x,
                                                            np.int32(1)) == splits - 1)
                nt.named_barrier_sync(1, consumer_threads)
                if last[0] != 0:
                    cuda.threadfence()
                    for j in range(nb):
                        sum_frags(out, c, bias, ws, splits, row, col + 64 * j, M, N, ldc, ldo,
                                  alpha, beta, eargs)
                    if t == 128:
                        counters[cuda.blockIdx.x] = np.int32(0)
            elif inside and (tma_store or not one_pass):
                # every value first (all loads in flight together), then the stores.
                # NOTE: ping-pong holds the tile's other half (64 registers) meanwhile: its
                # second block's values come after the first block's stores (c + bias +
                # gelu spilled 188-304 bytes with both blocks' values live; ptxas -v)
                ev0 = value_frags(c, bias, b[0], row, col, ldc, alpha, beta, eargs)
                if nb >= 2 and not pingpong:
                    ev1 = value_frags(c, bias, b[1], row, col + 64, ldc, alpha, beta, eargs)
                if nb == 4:
                    ev2 = value_frags(c, bias, b[2], row, col + 128, ldc, alpha, beta,
                                      eargs)
                    ev3 = value_frags(c, bias, b[3], row, col + 192, ldc, alpha, beta,
                                      eargs)
                if tma_store:
                    # The TMA store: the warpgroup's staging tile -- free once its thread
                    # 0's previous stores have read it -- gets the values through stmatrix,
                    # and thread 0 issues one tensor store per 64 columns.  Staging:
                    # warpgroup cw's (64, BN) tile at stage0 + cw * wg_bytes (ping-pong:
                    # one per 64-row half, (2 cw + second) * wg_bytes), as BN / 64 boxes of
                    # (64 rows, 64 columns) = 64 rows of 128 bytes, 128B-swizzled as out's
                    # tensor map reads them: row r's 16-byte chunk q lies at r * 128 + (q ^
                    # (r % 8)) * 16.
                    if lt == 0 and not second:
                        # the previous tile's stores have read it
                        nt.bulk_wait_group_read(0)
                    wg_sync(cw)
                    sq = lane // 8
                    sr = lane % 8
                    base = stage0 + (2 * cw + second if pingpong else cw) * wg_bytes
                    # this lane's row
                    box = base + ((lt // 32) * 16 + (sq % 2) * 8 + sr) * 128
                    sx = (sq // 2) ^ sr
                    stage_frags(smem, box, sx, ev0)  # block i into box i (8 KB each)
                    if nb >= 2:
                        if pingpong:
                            ev1 = value_frags(c, bias, b[1], row, col + 64, ldc, alpha, beta,
                                              eargs)
                        stage_frags(smem, box + 8192, sx, ev1)
                    if nb == 4:
                        stage_frags(smem, box + 16384, sx, ev2)
                        stage_frags(smem, box + 24576, sx, ev3)
                    # generic-proxy writes, read by the TMA store
                    nt.fence_proxy_async_shared()
                    wg_sync(cw)
                    if lt == 0:
                        for box_i in range(nb):
                            nt.tma_store(tma_out, (n0 + 64 * box_i, m0 + wrow), smem,
                                         base + box_i * 8192)
                        nt.bulk_commit_group()
                else:
                    put_frags(out, ev0, row, col, ldo)
                    if nb >= 2:
                        if pingpong:
                            ev1 = value_frags(c, bias, b[1], row, col + 64, ldc, alpha, beta,
                                              eargs)
                        put_frags(out, ev1, row, col + 64, ldo)
                    if nb == 4:
                        put_frags(out, ev2, row, col + 128, ldo)
                        put_frags(out, ev3, row, col + 192, ldo)
            else:
                # edge tiles (c and bias must not be read past the matrix), or nothing to
                # load and per-element stores (one pass): bounds-checked stores
                store_frags(out, c, bias, b[0], row, col, M, N, ldc, ldo, alpha, beta,
                            eargs)
                if nb >= 2:
                    store_frags(out, c, bias, b[1], row, col + 64, M, N, ldc, ldo, alpha,
                                beta, eargs)
                if nb == 4:
                    store_frags(out, c, bias, b[2], row, col + 128, M, N, ldc, ldo, alpha,
                                beta, eargs)
                    store_frags(out, c, bias, b[3], row, col + 192, M, N, ldc, ldo, alpha,
                                beta, eargs)
            if pingpong:
                if second:
                    second = False
                    tile += step
                else:
                    second = True
            elif one_tile:
                break
            else:
                tile += step
        if pingpong:
            # the warpgroup that did not take the block's last turn takes the last hand-over,
            # so that no named barrier is left part-full (no tiles: warpgroup 1's first one)
            if cw != (n_block - 1) % 2:
                turn_sync(cw)
        if tma_store and lt == 0:
            nt.bulk_wait_group(0)  # the last stores have read the staging tile

    if not has_user:  # a user epilogue's kernel is compiled in this process only
        build.cache_kernel(gemm_kernel, "sm90_gemm_tma", f"{cfg!r}|{var!r}")
    return gemm_kernel


def describe(cfg, var, ptx=False):
    """Text that shows (cfg, var)'s kernel as it is compiled: where its code is, the constants
    its functions close over (one line per function of the kernel's closure, depth first), and
    with ``ptx`` its PTX for sm_90a (intrinsics.toolchain.compile_ptx: no GPU needed)."""
    import inspect

    kernel = make_kernel(cfg, var)
    lines = [f"# {cfg.name}, {var}",
             f"# code: numbatc/kernels/sm90_gemm_tma.py, make_kernel (line "
             f"{inspect.getsourcelines(make_kernel)[1]})"]
    seen = set()

    def walk(fn, depth):
        py = getattr(fn, "py_func", fn)
        if id(py) in seen or not callable(py) or getattr(py, "__closure__", None) is None:
            return
        seen.add(id(py))
        names = py.__code__.co_freevars
        values = [cell.cell_contents for cell in py.__closure__]
        shown = [f"{n}={v!r}" for n, v in zip(names, values)
                 if isinstance(v, (bool, int, str, float, np.integer)) or v is None]
        shown += [f"{n}={v.py_func.__name__}" for n, v in zip(names, values)
                  if hasattr(v, "py_func")]  # which function each name is
        lines.append("  " * depth + f"{py.__qualname__}: " + ", ".join(shown))
        for v in values:
            if hasattr(v, "py_func"):
                walk(v, depth + 1)

    walk(kernel, 0)
    if ptx:
        from intrinsics.toolchain import compile_ptx
        from numbatc.kernels import sm90_gemm

        lines.append(compile_ptx(kernel, sm90_gemm.kernel_signature(cfg, var), "sm_90a",
                                 launch_bounds=(cfg.threads, 1)))
    return "\n".join(lines)


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
    """sm90_gemm.launch_flat (``a``, ``b`` flat as there: device pointers or emulated arrays):
    the tensor maps of a and b (and of out for the TMA store epilogue) lead the kernel's
    arguments; a cp.async configuration's kernel takes a and b themselves (byte pointers).
    With ``prepare`` (GPU only) returns the relaunch function of sm80_gemm.launch_flat's
    contract (epilogue.launch_gemm_kernel's), which looks up (or builds) the maps of its
    pointers.  ``block_scales``: a blockwise variant's scale arguments (after
    group_m; such a launch is never prepared, see sm90_gemm.launch_flat)."""
    from numba import config

    from intrinsics import launch as launching
    from numbatc.kernels import epilogue

    tma_store = cfg.store == "tma"
    cp_async = cfg.producer == "cp.async"
    assert not (tma_store and split), "a K slice's partial sums are not stored by TMA"
    sig = signature(var, tma_store=tma_store, cp_async=cp_async)
    sizes = (m, n, k, lda, ldb, ldc, ldo)
    if cp_async:  # the kernel reads a and b through byte pointers
        a, b = operands.byte_view(a), operands.byte_view(b)

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
                if cp_async:
                    params = (a, b)
                else:
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
    # the kernel's tuple arguments (see make_kernel): out's map or (), the scales, split-K's
    tmaps = (a, b) if cp_async else tuple(tm.param for tm in maps(a, b, out))
    if not tma_store:
        tmaps += ((),)
    splits = ()
    if split is not None:
        ws, counters, k_chunk, n_splits = split(stream)
        splits = (ws, counters, np.int64(k_chunk), np.int64(n_splits))
    args = (*tmaps, c, bias, out, *sizes, np.float32(alpha), np.float32(beta), group_m,
            _scale_args(block_scales), splits)
    if var.epilogue is None:
        args += ((),)  # eargs
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
