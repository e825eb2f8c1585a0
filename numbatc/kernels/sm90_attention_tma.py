"""sm90_attention's TMA producer (the ``_tma`` configurations): one thread of the producer
warpgroup loads Q once per query block and drives the K and V rings with tensor copies
(``cp.async.bulk.tensor``, 128B swizzle; 64B at head_dim 96) that complete on mbarriers; the two wgmma consumer
warpgroups, their ping-pong, the softmax and the epilogue are sm90_attention's.

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1)
      WG0  producer  setmaxnreg.dec 24   thread 0: expect_tx(q_full, Q bytes) -> Q boxes; per key
                                         tile: acquire k_empty[s] -> expect_tx(k_full[s], KB) ->
                                         K boxes; the same for V; advance.  127 threads leave.
      WG1  consumer  setmaxnreg.inc 240  wait k_full[s] / v_full[s] (no proxy fence: TMA writes
      WG2  consumer                      through the async proxy, which wgmma reads) ... release

Tensor maps (intrinsics.tensormap.TensorMap.tiled, rank 4, innermost first as the device sees
them): (d, head, seq, batch) of q, k and v as they lie in memory -- any strides, no copy -- with
boxes of (64, 1, rows, 1): 64 head-dim elements = one 128-byte swizzle row per sequence row
(at head_dim 96, 64B swizzle: boxes of 32 elements, one 64-byte swizzle row, three per tile
row; the offsets below with 64 -> 32 and 128 -> 64).
Rows past the end of the sequence (and past Sq for Q) are outside the tensor: TMA fills them
with zeros and still counts their bytes (the batch is its own dimension, so a box never reads
the next batch's rows).  A zero K row gives a score the mask replaces with -inf, a zero V row
adds 0 * 0, a zero Q row belongs to a query that is not stored.

    Q    D/64 boxes of (128 rows, 64 d) at d = 0, 64 ..     (128, D) K-major: half j at 16 KB j;
                                                            consumer c's rows at 8 KB c
    K    D/64 boxes of (BN keys, 64 d) per stage            (BN, D) K-major, as the cp.async
                                                            producer writes it
    V    D/64 boxes of (BN keys, 64 d) per stage            (D, BN) MN-major with the 8-key atoms
                                                            stacked K-first: sm90_gemm_tma's
                                                            MnKFirstLayout (LBO = BN * 128 between
                                                            the 64-d halves, SBO = 1024)

Byte counts: expect_tx(q_full) = 128 * D * 2 (QB), expect_tx(k_full[s]) = expect_tx(v_full[s])
= BN * D * 2 (KB): whole boxes, out-of-bounds fill included.  Every box starts at an innermost
coordinate of 0 or 64 elements (0 or 128 bytes): the 16-byte rule of intrinsics.tma holds;
the sequence, head and batch coordinates are outer and free.  Every box lands on a 1024-byte
boundary (QB, KB, BN * 128 are multiples of 1024), as the 128B swizzle needs (64B: 512).

Barriers: q_full = qbar[0] (one arrival, the expect_tx); the K and V rings are two
numbatc.kernels.pipeline rings (``tma_pipeline(stages)``: full[s] = kbars[s] one arrival plus
the bytes, empty[s] = kbars[S + s] one arrival per consumer warp, 8).  Both rings advance in
step: tile n uses stage n % S in round n // S, which is the consumers' bookkeeping too.

Persistent (``_pt``): one block per SM walks the work tiles blockIdx.x, + gridDim.x, ...
(``work_tile``): under a causal mask every (batch, head)'s last query blocks first -- the most
keys, the longest work first -- else one (batch, head)'s query blocks side by side (they share
K and V in L2).  q_empty = qbar[1] completes when all 256 consumer threads have arrived, after
the tile's last Q K^T retired (before its last P V and the epilogue); the producer then loads
the next tile's Q and streams its K and V through the same rings, so the next tile's loads
overlap this one's end.  The rings' (index, phase) run on across tiles: the consumers add the
key tiles of earlier work tiles (``it``) to their tile index.  The ping-pong consumers meet on
named barrier 3 after each tile, so that consumer 1's first arrival on barrier 1 for the next
tile cannot meet its last one of this tile.

Operands that a tensor map cannot describe -- a start or a batch / sequence / head stride that
is not a multiple of 16 bytes -- and seqlen_k == 0 run the cp.async twin
(sm90_attention.twin), which NUMBATC_PRINT_CONFIG=1 names with the reason.  Maps are cached per
(pointer, shape, strides, box): a warm call builds none.  Print a kernel as it is compiled::

    python -c "from numbatc.kernels import sm90_attention as a; print(a.kernel_source(
        a.CONFIGS['n128_2s_ov_pp_fx_tma'], a.AttnVariant(128, 'bfloat16', True, True)))"
"""

import os

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt

__all__ = ["PERSISTENT_TOP", "box_columns", "consumer_loop", "globals_source", "head_source",
           "launch_attention", "layouts", "make_producer", "operand_map", "producer_source",
           "signature", "unsupported"]

_TMA_DTYPE = {"bfloat16": "bf16", "float16": "f16"}

_RING = """from numbatc.kernels.pipeline import tma_pipeline
RING = tma_pipeline({stages})
RING_INIT = RING.init
ADVANCE = RING.advance
ACQUIRE = RING.producer_acquire
COMMIT = RING.producer_commit
WAIT = RING.consumer_wait
RELEASE = RING.consumer_release"""


def globals_source(cfg, causal, D, QB, KB, VB0):
    """Source of the generated module's globals for a TMA producer: the ring's device functions,
    for a persistent configuration ``work_tile``, and ``PRODUCE`` (:func:`make_producer`'s, for
    Q's ``QB`` bytes, a K or V stage's ``KB`` and the first V stage at ``VB0``)."""
    text = _RING.format(stages=cfg.stages)
    produce = (f"\n\nfrom numbatc.kernels.sm90_attention_tma import make_producer\n"
               f"PRODUCE = make_producer({cfg.stages}, {cfg.block_n}, {D}, {QB}, {KB}, {VB0}"
               f"{', work_tile' if cfg.persistent else ''})")
    if not cfg.persistent:
        return text + produce
    from numbatc.kernels.sm90_attention import div_bn

    BN, BM = cfg.block_n, 128
    if causal:
        order = """    # under the causal mask every (batch, head)'s last query blocks first: the longest work
    bh = np.uint32(w % bhn)
    mi = np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(w // bhn))"""
        clamp = f"""
    last = m0 + {BM - 1} + off  # the last key the tile's last query sees
    if last < 0:
        n_tiles = 0
    else:
        n_tiles = min(n_tiles, {div_bn("last", BN)} + 1)"""
    else:
        order = """    # one (batch, head)'s query blocks side by side: they share K and V in L2
    bh = np.uint32(w // mb)
    mi = np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(w % mb))"""
        clamp = ""
    return text + f"""


@cuda.jit(device=True, forceinline=True)
def work_tile(tile, bhn, m_blocks, Hq, group, Sk, off):
    # (m0, b, h, hk, bh, key tiles) of work tile ``tile`` of m_blocks * bhn.  NOTE: 32-bit
    # unsigned arithmetic, as in the kernel (a 64-bit division is a call: C7509)
    w = np.uint32(tile)
    mb = np.uint32(m_blocks)
{order}
    m0 = np.int64(mi) * {BM}
    b = np.int64(np.uint32(bh // np.uint32(Hq)))
    h = np.int64(np.uint32(bh % np.uint32(Hq)))
    hk = np.int64(np.uint32(np.uint32(h) // np.uint32(group)))
    n_tiles = {div_bn(f'(Sk + {BN - 1})', BN)}{clamp}
    return m0, b, h, hk, bh, n_tiles
""" + produce


#: The kernel's first lines after ``wg`` in a persistent configuration.
PERSISTENT_TOP = """    off = Sk - Sq  # causal: query i sees keys j <= i + off
    bhn = np.uint32(np.uint32(n_work) // np.uint32(m_blocks))  # (batch, head) pairs"""

_NEXT_TILE = "m0, b, h, hk, bh, n_tiles = work_tile(tile, bhn, m_blocks, Hq, group, Sk, off)"


def consumer_loop(body, pingpong):
    """Source of a persistent configuration's consumer tile loop around ``body`` (the
    consumers' per-tile code, indented for the kernel body)."""
    inner = "\n".join(("    " + line) if line.strip() else line for line in body.split("\n"))
    end = ""
    if pingpong:
        end = """
            # both consumers finish the tile before either starts the next: consumer 1's first
            # arrival of the next tile must not meet its last of this one on barrier 1
            nt.named_barrier_sync(3, 256)"""
    return f"""        it = 0  # key tiles of earlier work tiles: the ring position continues
        qph = 0  # q_full's parity
        tile = np.int64(cuda.blockIdx.x)
        while tile < n_work:
            {_NEXT_TILE}
{inner}{end}
            it += n_tiles
            qph ^= 1
            tile += cuda.gridDim.x"""


def layouts(cfg, D):
    """(Q, K stage, V stage) shared layouts as the boxes write them, and the byte offset of
    consumer 1's Q rows (row 64)."""
    from intrinsics.layout import SmemLayout
    from numbatc.kernels.sm90_attention import swizzle_for
    from numbatc.kernels.sm90_gemm_tma import MnKFirstLayout

    sw = swizzle_for(D)
    q = SmemLayout("K", sw, 128, D, 2)
    return (q, SmemLayout("K", sw, cfg.block_n, D, 2),
            MnKFirstLayout("MN", sw, D, cfg.block_n, 2), int(q.offset(64, 0)))


def box_columns(D):
    """Head-dim elements per box at head dim ``D``: one swizzle row of bf16 / f16 (64 with the
    128B swizzle, 32 with head_dim 96's 64B one)."""
    from numbatc.kernels.sm90_attention import swizzle_for

    return swizzle_for(D) // 2


def head_source(cfg, D, nbytes, tma_store=False, varlen=False):
    """Source of the kernel's first lines: its parameters (out's tensor map after v's with
    ``tma_store``; with ``varlen`` (total_q, total_k) in place of (Sq, Sk) and the prefix sums
    cu_q, cu_k last), shared memory and barriers."""
    sizes = "total_q, total_k" if varlen else "Sq, Sk"
    extra = ", cu_q, cu_k" if varlen else ""
    S, BN = cfg.stages, cfg.block_n
    q_empty = ("; q_empty = qbar[1]:\n    # one arrival per consumer thread (256) once the tile's "
               "Q K^T retired" if cfg.persistent else "")
    return f'''

@cuda.jit(cache=True, launch_bounds=({cfg.threads}, 1))
def attention_kernel(tma_q, tma_k, tma_v, {"tma_o, " if tma_store else ""}out, lse, {sizes}, Hq, group, m_blocks, n_work, o_sb,
                     o_ss, o_sh, scale_log2{extra}):
    # Q (128, {D}) | K {S} x ({BN}, {D}) | V {S} x ({BN}, {D}), {2 * box_columns(D)}B swizzle: {nbytes} bytes
    smem = cuda.shared.array(0, np.uint8, alignment=1024)
    # q_full = qbar[0]: the producer's expect_tx arrival + {128 * D * 2} bytes{q_empty}.  K and V rings:
    # full[s] = kbars[s] / vbars[s] (one expect_tx arrival + {BN * D * 2} bytes), empty[s] =
    # kbars[{S} + s] / vbars[{S} + s] (one arrival per consumer warp, 8)
    qbar = cuda.shared.array({2 if cfg.persistent else 1}, np.uint64, alignment=8)
    kbars = cuda.shared.array({2 * S}, np.uint64, alignment=8)
    vbars = cuda.shared.array({2 * S}, np.uint64, alignment=8)'''


def make_producer(stages, block_n, D, q_bytes, stage_bytes, v0, work_tile=None):
    """``produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, *tile)``: the producer thread's
    whole job.  Q's boxes (one per swizzle row of columns: :func:`box_columns`) arm q_full with
    ``q_bytes``; then for each key tile n the ring's next stage: acquire K's, arm its full
    barrier with ``stage_bytes``, issue K's boxes, the same for V (at ``v0``), advance.  Without
    ``work_tile``, ``*tile`` is the block's (m0, b, h, hk, n_tiles, k0): Q's first row m0 and
    K's and V's k0 in batch entry b (a varlen kernel passes its sequence's rows q0 + m0 and k0
    of the packed tensors, whose maps have one batch entry); with it (persistent
    configurations, the generated module's ``work_tile``) it is (n_work, bhn, m_blocks, Hq,
    group, Sk, off) and the thread walks the work tiles blockIdx.x, + gridDim.x, ..., each
    tile's Q waiting for q_empty (the previous tile's Q K^T retired; the ring's (index, phase)
    runs on across tiles).

    The arguments are closure constants, so the box loops unroll and fold at compile time
    (numba freezes a closure's values), as sm90_gemm_tma.make_producer's."""
    from numbatc.kernels.pipeline import tma_pipeline

    ring = tma_pipeline(stages)
    acquire, commit, advance = ring.producer_acquire, ring.producer_commit, ring.advance
    box_d = box_columns(D)
    sw = 2 * box_d  # bytes of a swizzle row: one box row
    boxes = D // box_d

    @cuda.jit(device=True, forceinline=True)
    def load_q(smem, tma_q, qbar, m0, b, h):
        # Q: 128 rows from m0, ``boxes`` boxes of (128, box_d)
        nt.mbarrier_arrive_expect_tx(qbar, 0, q_bytes)
        for j in range(boxes):
            nt.tma_load(smem, j * 128 * sw, tma_q, (box_d * j, h, m0, b), qbar, 0)

    @cuda.jit(device=True, forceinline=True)
    def load_kv(smem, tma_k, tma_v, kbars, vbars, b, hk, k0, n_tiles, index, phase):
        # key tile n (rows k0 + n * block_n ..): the ring's stage index; K then V, stage_bytes
        # each
        n0 = k0
        for n in range(n_tiles):
            base = index * stage_bytes
            acquire(kbars, index, phase)
            commit(kbars, index, stage_bytes)
            for j in range(boxes):
                nt.tma_load(smem, q_bytes + base + j * block_n * sw, tma_k,
                            (box_d * j, hk, n0, b), kbars, index)
            acquire(vbars, index, phase)
            commit(vbars, index, stage_bytes)
            for j in range(boxes):
                nt.tma_load(smem, v0 + base + j * block_n * sw, tma_v, (box_d * j, hk, n0, b),
                            vbars, index)
            index, phase = advance(index, phase)
            n0 += block_n
        return index, phase

    @cuda.jit(device=True, forceinline=True)
    def prefetch(tma_q, tma_k, tma_v):
        nt.tma_prefetch_descriptor(tma_q)
        nt.tma_prefetch_descriptor(tma_k)
        nt.tma_prefetch_descriptor(tma_v)

    if work_tile is None:
        @cuda.jit(device=True, forceinline=True)
        def produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, m0, b, h, hk, n_tiles, k0):
            prefetch(tma_q, tma_k, tma_v)
            load_q(smem, tma_q, qbar, m0, b, h)
            load_kv(smem, tma_k, tma_v, kbars, vbars, b, hk, k0, n_tiles, 0, 0)

        return produce

    @cuda.jit(device=True, forceinline=True)
    def produce_tiles(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, n_work, bhn, m_blocks, Hq,
                      group, Sk, off):
        prefetch(tma_q, tma_k, tma_v)
        index = 0
        phase = 0
        qphase = 0
        tile = np.int64(cuda.blockIdx.x)
        while tile < n_work:
            m0, b, h, hk, bh, n_tiles = work_tile(tile, bhn, m_blocks, Hq, group, Sk, off)
            nt.mbarrier_wait_parity(qbar, 1, qphase ^ 1)  # the previous tile's Q is free
            load_q(smem, tma_q, qbar, m0, b, h)
            index, phase = load_kv(smem, tma_k, tma_v, kbars, vbars, b, hk, 0, n_tiles, index,
                                   phase)
            qphase ^= 1
            tile += cuda.gridDim.x

    return produce_tiles


def producer_source(cfg, varlen=False):
    """Source of the barrier initialisation and the producer warpgroup (up to the consumers'
    ``else:``): thread 0 runs the module's ``PRODUCE`` (:func:`make_producer`); ``varlen``: the
    block's sequence starts at rows q0 and k0 of the packed tensors (one batch entry)."""
    pers = cfg.persistent
    tile = ("n_work, bhn, m_blocks, Hq, group, Sk, off" if pers else
            "q0 + m0, 0, h, hk, n_tiles, k0" if varlen else "m0, b, h, hk, n_tiles, 0")
    return f'''
    if t == 0:
        nt.mbarrier_init(qbar, 0, 1){"""
        nt.mbarrier_init(qbar, 1, 256)""" if pers else ""}
        RING_INIT(kbars, 1, 8)
        RING_INIT(vbars, 1, 8)
    cuda.syncthreads()

    if wg == 0:
        # ---- producer warpgroup: thread 0 issues every tensor copy ---------------------------
        nt.setmaxnreg_dec({cfg.producer_regs})
        if t == 0:
            PRODUCE(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, {tile})'''


def signature(var):
    """The kernel's argument types: the three tensor maps (four with ``var.tma_store``: out's
    last; passed by value, TensorMap.param: intrinsics.grid_constant), out and lse as typed
    pointers, int64 sizes (n_work: the work tiles, = the grid unless persistent) and O's
    strides, the float32 scale; a varlen variant's int32 prefix sums cu_q, cu_k last."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param as tmap

    maps = 4 if var.tma_store else 3
    cu = (types.CPointer(types.int32),) * 2 if var.varlen else ()  # cu_q, cu_k
    return ((tmap,) * maps + (types.CPointer(types.uint16), types.CPointer(types.float32))
            + (types.int64,) * 9 + (types.float32,) + cu)


# ---------------------------------------------------------------------------------------------
# From a numbatc.attention problem to tensor maps and a launch
# ---------------------------------------------------------------------------------------------

_MAX_STRIDE = 2**40


def unsupported(p):
    """Why a tensor map cannot describe problem ``p``'s q, k and v in place (the cp.async twin
    then runs), or None.  The maps need 16-byte aligned starts and batch / sequence / head
    strides (those of extent > 1) that are multiples of 16 bytes, below 2**40."""
    if p.seqlen_k == 0:
        return "seqlen_k is 0 (no key to load)"
    for name, ca in (("q", p.q), ("k", p.k), ("v", p.v)):
        if ca.ptr % 16:
            return f"{name} starts at {ca.ptr:#x}, not 16-byte aligned (a tensor map needs it)"
        # (batch, seq, head, dim), or varlen's (rows, head, dim)
        axes = ("batch", "sequence", "head")[-(len(ca.shape) - 1):]
        for what, n, st in zip(axes, ca.shape[:-1], ca.strides[:-1]):
            nbytes = st * 2
            if n > 1 and (nbytes % 16 or nbytes >= _MAX_STRIDE):
                return (f"{name}'s {what} stride is {st} elements ({nbytes} bytes), not a multiple "
                        f"of 16 bytes below 2**40 (a tensor map needs it)")
    return None


def out_fits(out):
    """Whether a tensor map describes ``out`` (batch, seq, head, dim) for the TMA stores of O: a
    16-byte aligned start and batch / sequence / head strides (of extent > 1) that are
    multiples of 16 bytes below 2**40."""
    if out.ptr % 16:
        return False
    return all(n == 1 or (st * 2 % 16 == 0 and st * 2 < _MAX_STRIDE)
               for n, st in zip(out.shape[:3], out.strides[:3]))


class _Host:
    """A view of an emulated flat operand as TensorMap's source (under the simulator any object
    whose ``_ary`` is the NumPy array)."""

    def __init__(self, array):
        self._ary = array


def operand_map(src, dtype, shape, strides, rows):
    """The TensorMap of q, k or v: ``src`` a device pointer (int) on the GPU, a flat array in
    the emulation; ``shape`` (batch, seq, heads, D) and ``strides`` (batch, seq, head) in
    elements (0 for an extent of 1); boxes of (1, ``rows``, 1, :func:`box_columns`), swizzled
    as the kernel's tiles (128B; 64B at head_dim 96).  On the GPU the maps are
    numbatc.kernels.tensor_maps' (one cache per (pointer, geometry) for every TMA kernel,
    encoded on the host and passed by value, so operands first seen inside a CUDA graph capture
    -- a model's activations -- need nothing more)."""
    from intrinsics.tensormap import TensorMap

    eb = 2
    byte_strides = [st * eb for st in strides]
    # a dimension of extent 1 is never stepped: give it a legal stride (the tensor's span)
    span = -(-max([n * st for n, st in zip(shape, byte_strides)] + [shape[3] * eb]) // 16) * 16
    byte_strides = tuple(st if n > 1 else span for n, st in zip(shape, byte_strides)) + (eb,)
    shape = tuple(int(n) for n in shape)
    box_d = box_columns(shape[3])
    box = (1, rows, 1, box_d)
    swizzle = 2 * box_d
    dt = _TMA_DTYPE[dtype]
    if not isinstance(src, (int, np.integer)):  # the emulation
        host = getattr(src, "_ary", src)
        view = np.lib.stride_tricks.as_strided(host, shape=shape, strides=byte_strides)
        return TensorMap.tiled(_Host(view), box, dtype=dt, swizzle=swizzle)
    from numbatc.kernels import tensor_maps

    return tensor_maps.tiled_map(int(src), dt, shape, byte_strides, box, swizzle)


def launch_attention(p, cfg, var):
    """Launch the TMA kernel ``cfg`` for an AttentionProblem whose operands a tensor map
    describes (:func:`unsupported` is None) on its stream.  Returns the warm calls' pointer
    relaunch (as sm80_attention.pointer_relaunch's) on the GPU, None in the emulation."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel
    from numbatc.kernels import sm80_attention, sm90_attention

    keep = []
    args, stream = sm80_attention.kernel_arguments(p, keep)
    q, k, v, out, lse, batch, sq, sk, hq, group, q_st, k_st, v_st, o_st, scale = args
    D = p.head_dim
    # varlen: sq, sk are the packed tensors' rows (total_q, total_k), each map has one batch
    # entry (the batch stride is 0) and the kernel finds its sequence's rows in cu_q, cu_k
    mb = 1 if var.varlen else batch
    maps = (operand_map(q, var.dtype, (mb, sq, hq, D), q_st, sm90_attention.BLOCK_M),
            operand_map(k, var.dtype, (mb, sk, p.heads_kv, D), k_st, cfg.block_n),
            operand_map(v, var.dtype, (mb, sk, p.heads_kv, D), v_st, cfg.block_n))
    if var.tma_store:  # boxes of one warpgroup's 64 rows
        maps += (operand_map(out, var.dtype, (batch, sq, hq, D), o_st, 64),)
    assert not (var.varlen and (var.tma_store or cfg.persistent)), (cfg.name, var)
    kernel = sm90_attention.kernel_for(cfg, var)
    rows = p.seqlen_q  # max_seqlen_q for varlen: the grid's query rows per sequence
    m_blocks = -(-rows // sm90_attention.BLOCK_M)
    n_work = sm90_attention.grid_for(batch, hq, rows)
    grid = min(n_work, _persistent_blocks()) if cfg.persistent else n_work
    if config.ENABLE_CUDASIM and var.tma_store:
        # numba's simulator copies a NumPy argument in, and back after the kernel: that copy of
        # out would overwrite what the TMA stores wrote into out's own memory (as in
        # sm90_gemm_tma).  A simulator array is passed as it is.
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        out = FakeCUDAArray(out) if isinstance(out, np.ndarray) else out
    args = (*(m.param for m in maps), out, lse, sq, sk, hq, group, m_blocks, n_work, *o_st,
            np.float32(scale * sm90_attention.LOG2E))
    if var.varlen:
        args += sm80_attention.varlen_arguments(p, keep)[:2]  # cu_q, cu_k
    sig = None if config.ENABLE_CUDASIM else signature(var)
    launch_kernel(kernel, grid, cfg.threads, args,
                  shared_bytes=sm90_attention.shared_bytes(cfg, D), stream=stream, signature=sig)
    keep.append(maps)
    if config.ENABLE_CUDASIM or os.environ.get("NUMBATC_PRINT_CONFIG"):
        return None  # the emulation, or no warm calls (each call prints)
    from intrinsics.launch import prepare

    prepared = prepare(kernel, grid, cfg.threads, sig,
                       shared_bytes=sm90_attention.shared_bytes(cfg, D))
    if prepared is None:
        return None
    geometry = ((var.dtype, (mb, sq, hq, D), q_st, sm90_attention.BLOCK_M),
                (var.dtype, (mb, sk, p.heads_kv, D), k_st, cfg.block_n),
                (var.dtype, (mb, sk, p.heads_kv, D), v_st, cfg.block_n))
    if var.tma_store:
        geometry += ((var.dtype, (mb, sq, hq, D), o_st, 64),)
    sizes = args[len(maps) + 2:len(maps) + 11]  # the 9 int64s from Sq (total_q) on
    from numbatc.kernels.tensor_maps import LastMaps

    def qkv_maps(*ptrs):
        return tuple(operand_map(ptr, *geo) for ptr, geo in zip(ptrs, geometry))

    last = LastMaps()
    last.params((q, k, v, out)[:len(maps)], lambda: maps)  # the maps this launch made

    out_mask = 15 if var.tma_store else 3 if var.pair_stores else 0

    def relaunch(q, k, v, out, lse, scale, stream, cu=()):
        """Launch for these device pointers (lse 0 without it; a varlen kernel's prefix sums
        ``cu`` = (cu_q, cu_k)): True, or False where a start is not 16-byte aligned (no tensor
        map: the checked path runs the cp.async twin) or out is not 4-byte aligned for a kernel
        of pair stores (the checked path compiles the other)."""
        if (q | k | v) & 15 or out & out_mask or len(cu) != (2 if var.varlen else 0):
            return False
        ptrs = (q, k, v, out) if var.tma_store else (q, k, v)
        params = last.params(ptrs, qkv_maps, *ptrs)
        prepared(stream, *params, out, lse, *sizes, scale * sm90_attention.LOG2E, *cu)
        return True

    return relaunch


_BLOCKS = []


def _persistent_blocks():
    """Blocks of a persistent grid: one per SM (one 384-thread block with ~200 KB of shared
    memory fits an SM); 2 in the emulation, so that a block walks several work tiles."""
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return 2
    if not _BLOCKS:
        _BLOCKS.append(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return _BLOCKS[0]
