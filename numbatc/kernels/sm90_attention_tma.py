"""sm90_attention's kernel, written as code (:func:`make_kernel`: an ordinary ``@cuda.jit``
function of closure constants), and its TMA configurations (the ``_tma`` names): one thread of
the producer warpgroup loads Q once per query block and drives the K and V rings with tensor
copies (``cp.async.bulk.tensor``, 128B swizzle; 64B at head_dim 96) that complete on
mbarriers; the two wgmma consumer warpgroups run sm90_attention's schedules (in order, FA3's
overlap, the ping-pong: that module's docstring).  The other configurations' producer is 128
threads of cp.async copies (:func:`_cp_loader`; sm90_attention's docstring), with the same
consumers.

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1)
      WG0  producer  setmaxnreg.dec 24   thread 0: expect_tx(q_full, Q bytes) -> Q boxes; per key
                                         tile: acquire k_empty[s] -> expect_tx(k_full[s], KB) ->
                                         K boxes; the same for V; advance.  127 threads leave.
      WG1  consumer  setmaxnreg.inc 240  wait k_full[s] / v_full[s] (no proxy fence: TMA writes
      WG2  consumer                      through the async proxy, which wgmma reads) ... release

With ``consumers=3`` (FA3's head_dim 64 tiling) the block is 512 threads, 192 query rows (BM)
and a third consumer warpgroup; setmaxnreg 32 / 160 hands out all 65536 registers.  Below,
128 query rows and 256 consumer threads read BM and 128 x consumers.

Tensor maps (intrinsics.tensormap.TensorMap.tiled, rank 4, innermost first as the device sees
them): (d, head, seq, batch) of q, k and v as they lie in memory -- any strides, no copy -- with
boxes of (64, 1, rows, 1): 64 head-dim elements = one 128-byte swizzle row per sequence row
(at head_dim 96, 64B swizzle: boxes of 32 elements, one 64-byte swizzle row, three per tile
row; the offsets below with 64 -> 32 and 128 -> 64).
Rows past the end of the sequence (and past Sq for Q) are outside the tensor: TMA fills them
with zeros and still counts their bytes (the batch is its own dimension, so a box never reads
the next batch's rows).  A zero K row gives a score the mask replaces with -inf, a zero V row
adds 0 * 0, a zero Q row belongs to a query that is not stored.

    Q    D/64 boxes of (BM rows, 64 d) at d = 0, 64 ..      (BM, D) K-major: half j at 128 BM j;
                                                            consumer c's rows at 8 KB c
    K    D/64 boxes of (BN keys, 64 d) per stage            (BN, D) K-major, as the cp.async
                                                            producer writes it
    V    D/64 boxes of (BN keys, 64 d) per stage            (D, BN) MN-major with the 8-key atoms
                                                            stacked K-first: sm90_gemm_tma's
                                                            MnKFirstLayout (LBO = BN * 128 between
                                                            the 64-d halves, SBO = 1024)

Byte counts: expect_tx(q_full) = BM * D * 2 (QB), expect_tx(k_full[s]) = expect_tx(v_full[s])
= BN * D * 2 (KB): whole boxes, out-of-bounds fill included.  Every box starts at an innermost
coordinate of 0 or 64 elements (0 or 128 bytes): the 16-byte rule of intrinsics.tma holds;
the sequence, head and batch coordinates are outer and free.  Every box lands on a 1024-byte
boundary (QB, KB, BN * 128 are multiples of 1024), as the 128B swizzle needs (64B: 512).

Barriers: q_full = qbar[0] (one arrival, the expect_tx); the K and V rings are two
numbatc.kernels.pipeline rings (``tma_pipeline(stages)``: full[s] = kbars[s] one arrival plus
the bytes, empty[s] = kbars[S + s] one arrival per consumer warp, 4 x consumers).  Both rings
advance in step: tile n uses stage n % S in round n // S, which is the consumers' bookkeeping too.

Persistent (``_pt``): one block per SM walks the work tiles blockIdx.x, + gridDim.x, ...
(``work_tile``): under a causal mask every (batch, head)'s last query blocks first -- the most
keys, the longest work first -- else one (batch, head)'s query blocks side by side (they share
K and V in L2).  q_empty = qbar[1] completes when all consumer threads have arrived, after
the tile's last Q K^T retired (before its last P V and the epilogue); the producer then loads
the next tile's Q and streams its K and V through the same rings, so the next tile's loads
overlap this one's end.  The rings' (index, phase) run on across tiles: the consumers add the
key tiles of earlier work tiles (``it``) to their tile index.  The ping-pong consumers meet on
named barrier 7 after each tile, so that the last consumer's first arrival on barrier 1 for the
next tile cannot meet its last one of this tile.

Operands that a tensor map cannot describe -- a start or a batch / sequence / head stride that
is not a multiple of 16 bytes -- and seqlen_k == 0 run the cp.async twin
(sm90_attention.twin), which NUMBATC_PRINT_CONFIG=1 names with the reason.  Maps are cached per
(pointer, shape, strides, box): a warm call builds none.

The kernel is this module's code: :func:`make_kernel`'s closure constants are the whole of what
a configuration and variant change, and ``scripts/diag/sass_counts.py`` prints the SASS
instruction counts of any of them (the moves from generated text were checked so: the TMA
kernels' instruction histograms equal within a few moves and NOPs, the cp.async kernels' within
1 % (their barrier arrays are three, the loaders' compares turned around), except the
per-register key mask, now one 32-bit compare per register: 72-576 fewer instructions at
head_dim 192 and 256; docs/PERFORMANCE.md).
"""

import functools
import math
import os

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt
from numbatc.kernels.epilogue import quad_max, quad_sum

__all__ = ["box_columns", "chunks_per_row", "cp_async_signature", "launch_attention", "layouts",
           "make_kernel", "make_producer", "operand_map", "out_fits", "signature", "unsupported"]

_TMA_DTYPE = {"bfloat16": "bf16", "float16": "f16"}


def layouts(cfg, D):
    """(Q, K stage, V stage) shared layouts, and the byte offset of consumer 1's Q rows (row
    64): as the TMA boxes write them, or (a cp.async configuration) as its copies do -- Q as two
    parts of 64 rows, V's MN-major atoms ordered MN-first."""
    from intrinsics.layout import SmemLayout
    from numbatc.kernels.sm90_attention import swizzle_for
    from numbatc.kernels.sm90_gemm_tma import MnKFirstLayout

    sw = swizzle_for(D)
    if not cfg.tma:
        return (SmemLayout("K", sw, 64, D, 2),             # Q part of one consumer
                SmemLayout("K", sw, cfg.block_n, D, 2),    # K stage
                SmemLayout("MN", sw, D, cfg.block_n, 2),   # V stage (mn = D, k = keys)
                64 * D * 2)                                # consumer 1's Q part
    q = SmemLayout("K", sw, cfg.block_m, D, 2)
    return (q, SmemLayout("K", sw, cfg.block_n, D, 2),
            MnKFirstLayout("MN", sw, D, cfg.block_n, 2), int(q.offset(64, 0)))


def box_columns(D):
    """Head-dim elements per box at head dim ``D``: one swizzle row of bf16 / f16 (64 with the
    128B swizzle, 32 with head_dim 96's 64B one)."""
    from numbatc.kernels.sm90_attention import swizzle_for

    return swizzle_for(D) // 2


def make_producer(stages, block_n, D, q_bytes, stage_bytes, v0, work_tile=None):
    """``produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, *tile)``: the producer thread's
    whole job.  Q's boxes (one per swizzle row of columns: :func:`box_columns`) arm q_full with
    ``q_bytes``; then for each key tile n the ring's next stage: acquire K's, arm its full
    barrier with ``stage_bytes``, issue K's boxes, the same for V (at ``v0``), advance.  Without
    ``work_tile``, ``*tile`` is the block's (m0, b, h, hk, n_tiles, k0): Q's first row m0 and
    K's and V's k0 in batch entry b (a varlen kernel passes its sequence's rows q0 + m0 and k0
    of the packed tensors, whose maps have one batch entry); with it (persistent
    configurations, :func:`make_kernel`'s ``work_tile``) it is (n_work, bhn, m_blocks, Hq,
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
    q_rows = q_bytes // (2 * D)  # the block's query rows: 64 per consumer warpgroup

    @cuda.jit(device=True, forceinline=True)
    def load_q(smem, tma_q, qbar, m0, b, h):
        # Q: q_rows rows from m0, ``boxes`` boxes of (q_rows, box_d)
        nt.mbarrier_arrive_expect_tx(qbar, 0, q_bytes)
        for j in range(boxes):
            nt.tma_load(smem, j * q_rows * sw, tma_q, (box_d * j, h, m0, b), qbar, 0)

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


# ---------------------------------------------------------------------------------------------
# The kernel, factory-made
# ---------------------------------------------------------------------------------------------
#
# Every count that varies with the configuration -- the k16 steps of Q K^T (D / 16) and of P V
# (BN / 16), O's 32-column store groups, the TMA store's 16-column stmatrix groups -- is
# spelled out to its largest value under branches on the count, which numba prunes before
# typing (a closure tuple indexed in a loop goes through memory, and a tuple is only sliced
# with literal bounds); the rest is closure constants that LLVM folds.

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
LN2 = np.float32(math.log(2.0))
_U = np.uint64


def _div(n):
    """``div(x)``: x // n for a non-negative int64 x below 2**32 (key counts).  NOTE: for an n
    that is not a power of two (80, 112, 176) a 64-bit division by a constant is a 64-bit magic
    multiply whose temporaries, computed before the role branch, must fit the producer's
    setmaxnreg count with everything else live there: at head_dim 256 ptxas spilled n_tiles and
    Sk - Sq (28-44 bytes) until it was done in 32 bits."""
    pow2 = n & (n - 1) == 0

    @cuda.jit(device=True, forceinline=True)
    def div(x):
        if pow2:
            return x // n
        return np.int64(np.uint32(x) // np.uint32(n))
    return div


def _qk_chain(mma, a_steps, b_steps):
    """``chain(acc, da, db)``: the SS wgmma ``mma`` over the k16 steps of Q K^T (4 to 16;
    ``a_steps`` / ``b_steps``: each step's descriptor offset in 16-byte units), the first
    overwriting the accumulator (scale-d 0)."""
    n = len(a_steps)
    assert n in (4, 6, 8, 12, 16) and len(b_steps) == n, n
    a, b = a_steps + (0,) * (16 - n), b_steps + (0,) * (16 - n)

    @cuda.jit(device=True, forceinline=True)
    def chain(acc, da, db):
        acc = mma(acc, da + _U(a[0]), db + _U(b[0]), 0)
        acc = mma(acc, da + _U(a[1]), db + _U(b[1]), 1)
        acc = mma(acc, da + _U(a[2]), db + _U(b[2]), 1)
        acc = mma(acc, da + _U(a[3]), db + _U(b[3]), 1)
        if n > 4:
            acc = mma(acc, da + _U(a[4]), db + _U(b[4]), 1)
            acc = mma(acc, da + _U(a[5]), db + _U(b[5]), 1)
        if n > 6:
            acc = mma(acc, da + _U(a[6]), db + _U(b[6]), 1)
            acc = mma(acc, da + _U(a[7]), db + _U(b[7]), 1)
        if n > 8:
            acc = mma(acc, da + _U(a[8]), db + _U(b[8]), 1)
            acc = mma(acc, da + _U(a[9]), db + _U(b[9]), 1)
            acc = mma(acc, da + _U(a[10]), db + _U(b[10]), 1)
            acc = mma(acc, da + _U(a[11]), db + _U(b[11]), 1)
        if n > 12:
            acc = mma(acc, da + _U(a[12]), db + _U(b[12]), 1)
            acc = mma(acc, da + _U(a[13]), db + _U(b[13]), 1)
            acc = mma(acc, da + _U(a[14]), db + _U(b[14]), 1)
            acc = mma(acc, da + _U(a[15]), db + _U(b[15]), 1)
        return acc
    return chain


def _pv_chain(mma, b_steps):
    """``chain(acc, pa, db)``: O += P V, the RS wgmma ``mma`` over the k16 steps of the key tile
    (4 to 12), A fragment c of ``pa`` (frag_pack_*x2's tuple) with V's step c."""
    n = len(b_steps)
    assert 4 <= n <= 12, n
    b = b_steps + (0,) * (12 - n)

    @cuda.jit(device=True, forceinline=True)
    def chain(acc, pa, db):
        acc = mma(acc, pa[0], db + _U(b[0]), 1)
        acc = mma(acc, pa[1], db + _U(b[1]), 1)
        acc = mma(acc, pa[2], db + _U(b[2]), 1)
        acc = mma(acc, pa[3], db + _U(b[3]), 1)
        if n > 4:
            acc = mma(acc, pa[4], db + _U(b[4]), 1)
        if n > 5:
            acc = mma(acc, pa[5], db + _U(b[5]), 1)
        if n > 6:
            acc = mma(acc, pa[6], db + _U(b[6]), 1)
        if n > 7:
            acc = mma(acc, pa[7], db + _U(b[7]), 1)
        if n > 8:
            acc = mma(acc, pa[8], db + _U(b[8]), 1)
        if n > 9:
            acc = mma(acc, pa[9], db + _U(b[9]), 1)
        if n > 10:
            acc = mma(acc, pa[10], db + _U(b[10]), 1)
        if n > 11:
            acc = mma(acc, pa[11], db + _U(b[11]), 1)
        return acc
    return chain


def _softmax(block_n, causal, column_limit, fast_exp, pin_ends=False, narrow=False):
    """``softmax_tile(sacc, n0, tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2)``: mask
    S where the tile crosses the last key (or, causal, the diagonal), update the running max and
    sum of the thread's rows row0, row0 + 8 (log2 domain, FA3's two instructions per score:
    ex2.approx(fma(s, scale_log2, -max))); returns (S as masked, P, m_0, m_1, l_0, l_1, alpha_0,
    alpha_1), alpha_h O's rescale factor of row half h.  ``column_limit``: the mask is FA3's
    per-row column limit (two int32 limits, a compare per register; sm90_attention.
    column_limit_mask), else a compare of each register's key.  Without ``fast_exp`` the
    exponentials are numba's ``math.exp2`` of ``s * scale_log2 - max`` (libdevice's exp2f:
    denormal-scaled ex2.approx after a separate multiply and subtraction).  ``pin_ends``: the
    key mask's bounds pass through ``opaque`` (varlen kernels; see the NOTE below).
    ``narrow``: the causal test of whether a tile needs the mask in 32-bit arithmetic (one
    register fewer across the key loop than the 64-bit diagonal wrow0 + off; three consumers).

    NOTE: one device function, called twice by the overlapped schedule (its first tile is
    peeled): half of what numba types and lowers for two pasted copies (the first compile)."""
    BN = block_n

    @cuda.jit(device=True, forceinline=True)
    def softmax_tile(sacc, n0, tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2):
        if causal and narrow:
            # 32-bit: every key and query index fits (a K of 2^31 rows at head_dim 64 is 256 GiB)
            masked = n0 + BN > Sk or (np.int32(n0) + np.int32(BN - 1)
                                      > np.int32(wrow0) + np.int32(off))
        elif causal:
            masked = n0 + BN > Sk or n0 + (BN - 1) > wrow0 + off
        else:
            masked = n0 + BN > Sk
        if masked:
            if column_limit:
                # the thread's register v is key n0 + tq + c(v), c a constant: the keys each row
                # sees are those with c below its limit (sm80_attention.column_limit)
                if causal:
                    lim_0 = np.int32(min(max(min(Sk, row0 + 1 + off) - n0 - tq, 0), BN))
                    lim_1 = np.int32(min(max(min(Sk, (row0 + 8) + 1 + off) - n0 - tq, 0), BN))
                else:
                    lim_0 = np.int32(min(max(Sk - n0 - tq, 0), BN))
                    lim_1 = lim_0
                sacc = nt.frag_mask_cols(sacc, lim_0, lim_1)
            elif pin_ends:
                # NOTE: a varlen kernel's Sk and off are loaded values, not parameters: LLVM
                # hoisted the ends out of the key loop and ptxas spilled them (36-60 bytes at
                # head_dim 256, cp.async); through opaque they are computed where they are used
                # (the same pins cost a parameter's Sk 172 bytes of spill: they are varlen's)
                if causal:
                    sacc = nt.frag_mask_keys_causal(sacc, n0 + tq, nt.opaque(Sk), row0,
                                                    nt.opaque(off))
                else:
                    sacc = nt.frag_mask_keys(sacc, n0 + tq, nt.opaque(Sk))
            elif causal:
                sacc = nt.frag_mask_keys_causal(sacc, n0 + tq, Sk, row0, off)
            else:
                sacc = nt.frag_mask_keys(sacc, n0 + tq, Sk)
        rm_0, rm_1 = nt.frag_row_maxes(sacc)
        mx = quad_max(rm_0) * scale_log2
        m_new = max(m_0, mx)
        base_0 = m_new if m_new != NEG_INF else ZERO  # a row with no key yet
        if fast_exp:
            alpha_0 = nt.ex2_approx(m_0 - base_0)
            nbase_0 = -base_0
        else:
            alpha_0 = math.exp2(m_0 - base_0)
        m_0 = m_new
        mx = quad_max(rm_1) * scale_log2
        m_new = max(m_1, mx)
        base_1 = m_new if m_new != NEG_INF else ZERO
        if fast_exp:
            alpha_1 = nt.ex2_approx(m_1 - base_1)
            nbase_1 = -base_1
        else:
            alpha_1 = math.exp2(m_1 - base_1)
        m_1 = m_new
        if fast_exp:
            p = nt.frag_exp2_fma(sacc, scale_log2, nbase_0, nbase_1)
        else:
            p = nt.frag_exp2(sacc, scale_log2, base_0, base_1)
        rs_0, rs_1 = nt.frag_row_sums(p)
        l_0 = l_0 * alpha_0 + rs_0
        l_1 = l_1 * alpha_1 + rs_1
        return sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1
    return softmax_tile


def _row_stores(dtype, pair_stores, head_dim):
    """``(store_row0, store_row1)``: ``store_row<h>(out, ob, o)`` stores O's registers of the
    thread's row half h as column pairs at out[ob ..]: per 8-column fragment f the pair (o[4f +
    2h], o[4f + 2h + 1]) at column 8f (+ tq, in ob).  A pair is one st.global.b32 with
    ``pair_stores`` (out 4-byte aligned, its strides even: sm80_attention.pair_stores_fit), else
    two 16-bit stores."""
    pack = nt.pack_bf16x2 if dtype == "bfloat16" else nt.pack_f16x2
    D = head_dim

    @cuda.jit(device=True, forceinline=True)
    def store_pair(out, base, v0, v1):
        if pair_stores:
            nt.st_global_b32(out, base, pack(v0, v1))
        else:
            p = pack(v0, v1)
            out[base] = np.uint16(p & 0xFFFF)
            out[base + 1] = np.uint16(p >> 16)

    def row_store(h):
        # the registers of row half h in 4 fragments (a closure constant index is a static one)
        i0, i1, i2, i3, i4, i5, i6, i7 = (4 * f + 2 * h + c for f in range(4) for c in range(2))

        @cuda.jit(device=True, forceinline=True)
        def cols32(out, ob, f):
            store_pair(out, ob, f[i0], f[i1])
            store_pair(out, ob + 8, f[i2], f[i3])
            store_pair(out, ob + 16, f[i4], f[i5])
            store_pair(out, ob + 24, f[i6], f[i7])

        @cuda.jit(device=True, forceinline=True)
        def store_row(out, ob, o):
            cols32(out, ob, o[0:16])
            cols32(out, ob + 32, o[16:32])
            if D > 64:
                cols32(out, ob + 64, o[32:48])
            if D > 96:
                cols32(out, ob + 96, o[48:64])
            if D > 128:
                cols32(out, ob + 128, o[64:80])
                cols32(out, ob + 160, o[80:96])
            if D > 192:
                cols32(out, ob + 192, o[96:112])
                cols32(out, ob + 224, o[112:128])
        return store_row

    return row_store(0), row_store(1)


_G0, _G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9, _G10, _G11 = (np.int64(g) for g in range(12))


def _staging(dtype, head_dim, swizzle, block_m):
    """``stage_o(smem, srow, sx, o)``: O's registers (scaled) into a warpgroup's (64, D) staging
    rows through stmatrix.x4, for the TMA store of O (``var.tma_store``).

    The staging rows are laid out as Q's buffer -- 128B-swizzled (64B at head_dim 96), which is
    what a TMA box of (64 rows, one swizzle row of columns) of out reads: box j (columns j * SW
    / 2 ..) of warpgroup cw at j * block_m * SW + cw * 64 * SW, row r at r * SW, its 16-byte chunk c
    at (c ^ s(r)) * 16 with s(r) = r % 8 (128B) or (r // 2) % 4 (64B).  They are the
    warpgroup's own rows of Q's buffer (free: only its Q K^T read them, and the last one
    retired), or in a persistent kernel a staging tile of their own behind the V ring (the
    producer loads the next tile's Q meanwhile).  16-column group g of box j = g // C (C = SW /
    32 groups a box) is one stmatrix.x4 at ``srow + j * block_m * SW + ((2 (g % C)) ^ sx) * 16``:
    lane l gives the address of matrix q = l // 8 (q % 2: rows 0-7 or 8-15, q // 2: which
    fragment) at row 16 warp + 8 (q % 2) + l % 8 (``srow``; ``sx`` = (q // 2) ^ s(row)), and
    register q holds its (row l // 4, columns 2 (l % 4), + 1) pair: o[8g .. 8g + 7] packed
    pairwise (fragments 2g and 2g + 1, row halves 0 and 1)."""
    pack = nt.pack_bf16x2 if dtype == "bfloat16" else nt.pack_f16x2
    D, SW = head_dim, swizzle
    C = SW // 32
    part = block_m * SW  # one box column's rows (Q's layout)
    assert D % 16 == 0 and D // 16 <= 12, D

    # NOTE: the group numbers are int64 values, not literals: numba compiles a device function
    # once per literal argument (12 pipelines of ~20 ms in the first compile)
    @cuda.jit(device=True, forceinline=True)
    def group(smem, srow, sx, g, f):
        at = srow + (g // C) * part + (((2 * (g % C)) ^ sx) << 4)
        nt.stmatrix_x4(smem, at, (pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]),
                                  pack(f[6], f[7])))

    @cuda.jit(device=True, forceinline=True)
    def stage_o(smem, srow, sx, o):
        group(smem, srow, sx, _G0, o[0:8])
        group(smem, srow, sx, _G1, o[8:16])
        group(smem, srow, sx, _G2, o[16:24])
        group(smem, srow, sx, _G3, o[24:32])
        if D > 64:
            group(smem, srow, sx, _G4, o[32:40])
            group(smem, srow, sx, _G5, o[40:48])
        if D > 96:
            group(smem, srow, sx, _G6, o[48:56])
            group(smem, srow, sx, _G7, o[56:64])
        if D > 128:
            group(smem, srow, sx, _G8, o[64:72])
            group(smem, srow, sx, _G9, o[72:80])
            group(smem, srow, sx, _G10, o[80:88])
            group(smem, srow, sx, _G11, o[88:96])
    return stage_o


def _coords(block_n, causal, longest_first, block_m, l2_budget=0, head_dim=128):
    """``block_coords(tile, bhn, m_blocks, Hq, group, Sk)`` -> (m0, b, h, hk, bh) of work tile
    ``tile`` (a block's, or a persistent block's of m_blocks * bhn), and ``key_tiles(m0, Sk,
    off)``: the key tiles the tile's rows see.  ``longest_first`` (persistent, causal): the
    last query blocks first, the most keys -- over every (batch, head) pair, or with
    ``l2_budget`` over sections of pairs whose K and V fit that many bytes (the last section
    takes the rest), section after section (FA3's LPT scheduler: the blocks at work then share
    K and V in L2); else one (batch, head)'s query blocks side by side, last first (they share
    K and V in L2).  NOTE: 32-bit unsigned arithmetic: a 64-bit division by a run-time value
    is a subroutine call in SASS, and a call anywhere in the kernel makes ptxas serialise every
    wgmma (C7509)."""
    div = _div(block_n)
    BN = block_n
    # K and V of one kv head take Sk * head_dim * 4 bytes: Sk * UNIT units of 128 bytes (head
    # dims are multiples of 32); Sk clamped so that the product stays 32-bit
    UNIT = head_dim // 32
    BUDGET = l2_budget // 128
    sectioned = longest_first and l2_budget > 0

    @cuda.jit(device=True, forceinline=True)
    def block_coords(tile, bhn, m_blocks, Hq, group, Sk):
        w = np.uint32(tile)
        mb = np.uint32(m_blocks)
        if sectioned:
            # pairs of a section: the query heads of as many kv heads as fit (at least one)
            kv = np.uint32(min(max(Sk, 1), 1 << 24)) * np.uint32(UNIT)
            per = max(np.uint32(np.uint32(BUDGET) // kv), np.uint32(1)) * np.uint32(group)
            per = min(per, np.uint32(bhn))
            sec = np.uint32(w // np.uint32(per * mb))
            first = np.uint32(sec * per)
            pairs = min(per, np.uint32(np.uint32(bhn) - first))  # the last section: the rest
            r = np.uint32(w - np.uint32(first * mb))
            bh = np.uint32(first + np.uint32(r % pairs))
            mi = np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(r // pairs))
        elif longest_first:
            bh = np.uint32(w % bhn)
            mi = np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(w // bhn))
        else:
            bh = np.uint32(w // mb)
            mi = np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(w % mb))
        m0 = np.int64(mi) * block_m
        b = np.int64(np.uint32(bh // np.uint32(Hq)))
        h = np.int64(np.uint32(bh % np.uint32(Hq)))
        hk = np.int64(np.uint32(np.uint32(h) // np.uint32(group)))
        return m0, b, h, hk, bh

    @cuda.jit(device=True, forceinline=True)
    def key_tiles(m0, Sk, off):
        n_tiles = div(Sk + (BN - 1))
        if causal:
            last = m0 + (block_m - 1) + off  # the last key the tile's last query sees
            if last < 0:
                n_tiles = 0
            else:
                n_tiles = min(n_tiles, div(last) + 1)
        return n_tiles
    return block_coords, key_tiles


@cuda.jit(device=True, forceinline=True)
def _sequence(cu_q, cu_k, b, total_q, total_k):
    # varlen: sequence b's rows q0 .. q0 + Sq - 1 of q and out and k0 .. k0 + Sk - 1 of k and v,
    # the prefix sums clamped to the tensors' rows (whatever cu_seqlens holds)
    q0 = min(max(np.int64(cu_q[b]), 0), total_q)
    Sq = min(max(np.int64(cu_q[b + 1]), q0), total_q) - q0
    k0 = min(max(np.int64(cu_k[b]), 0), total_k)
    Sk = min(max(np.int64(cu_k[b + 1]), k0), total_k) - k0
    return q0, Sq, k0, Sk


def chunks_per_row(D, swizzle):
    """Producer threads that share one row of a tile in the cp.async loaders: D / 8 (one 16-byte
    chunk each) up to head_dim 128 with the 128B swizzle; otherwise the chunks of one swizzle
    row (8 of 128 B above head_dim 128, 4 of 64 B at 96), each thread copying its chunk of
    every part of the row in turn, so that the rows a thread steps stay a multiple of 8."""
    return D // 8 if D <= 128 and swizzle == 128 else swizzle // 16


def _cp_loader(rows, D, swizzle, delta, part_bytes):
    """``load(smem, d, src, g, ld, rows_left)``: one producer thread's 16-byte cp.async copies of
    a (rows, D) tile (the cp.async configurations).

    Thread p copies chunk j = p % C of rows r0 + i * STEP (C = :func:`chunks_per_row`, r0 = p //
    C < STEP = 128 / C, a multiple of 8): in every layout here the shared offset of copy i is
    the thread's swizzled base ``d`` plus a constant ``delta(i * STEP)`` (a swizzle depends on
    the row mod 8 only), and the global index ``g`` advances by STEP rows (``ld`` each) per
    copy.  Where a thread's chunks cover one swizzle row only (above head_dim 128: C = 8 of 128
    B; head_dim 96: C = 4 of 64 B) each row step copies chunk j of every part of the row (64 or
    32 columns): ``part_bytes`` further in shared memory, a part's columns further in global
    memory.  Rows at or past ``rows_left`` (counted from r0) are zero-filled (0 source bytes).

    NOTE: the producer runs in few registers and LLVM's LICM would hoist per-copy invariants
    out of the key loop (and spill them): STEP * ld and the rows left pass through
    ``wgmma_fence_operand`` (an empty volatile asm) so that everything derived from them is
    computed per tile.  The copies are written out (up to 16 row steps, 4 parts) under pruned
    branches on their counts."""
    C = chunks_per_row(D, swizzle)
    step = 128 // C
    count = rows // step
    parts = D // 8 // C
    cols = swizzle // 2  # columns of one swizzle row: a part
    assert step % 8 == 0 and rows % step == 0 and parts * C * 8 == D, (rows, D)
    assert count in (1, 2, 4, 5, 6, 7, 8, 16), count  # the written-out row steps below
    lim = tuple(i * step for i in range(count)) + (0,) * (16 - count)
    at = tuple(delta(i * step) for i in range(count)) + (0,) * (16 - count)
    copy = nt.cp_async_op(16, zfill=True)

    @cuda.jit(device=True, forceinline=True)
    def row_copy(smem, d, src, g, keep):
        # chunk j of each part of one row (zero-filled past the tile's rows)
        if keep:
            copy(smem, d, src, g, 16)
            if parts > 1:
                copy(smem, d + part_bytes, src, g + cols, 16)
            if parts > 2:
                copy(smem, d + 2 * part_bytes, src, g + 2 * cols, 16)
            if parts > 3:
                copy(smem, d + 3 * part_bytes, src, g + 3 * cols, 16)
        else:
            copy(smem, d, src, 0, 0)
            if parts > 1:
                copy(smem, d + part_bytes, src, 0, 0)
            if parts > 2:
                copy(smem, d + 2 * part_bytes, src, 0, 0)
            if parts > 3:
                copy(smem, d + 3 * part_bytes, src, 0, 0)

    @cuda.jit(device=True, forceinline=True)
    def load(smem, d, src, g, ld, rows_left):
        row_ld = np.int64(nt.wgmma_fence_operand(np.int32(step * ld)))
        left = np.int64(nt.wgmma_fence_operand(np.int32(max(min(rows_left, rows), -1))))
        row_copy(smem, d + at[0], src, g, lim[0] < left)
        if count > 1:
            g += row_ld
            row_copy(smem, d + at[1], src, g, lim[1] < left)
        if count > 2:
            g += row_ld
            row_copy(smem, d + at[2], src, g, lim[2] < left)
            g += row_ld
            row_copy(smem, d + at[3], src, g, lim[3] < left)
        if count > 4:
            g += row_ld
            row_copy(smem, d + at[4], src, g, lim[4] < left)
        if count > 5:
            g += row_ld
            row_copy(smem, d + at[5], src, g, lim[5] < left)
        if count > 6:
            g += row_ld
            row_copy(smem, d + at[6], src, g, lim[6] < left)
        if count > 7:
            g += row_ld
            row_copy(smem, d + at[7], src, g, lim[7] < left)
        if count > 8:
            g += row_ld
            row_copy(smem, d + at[8], src, g, lim[8] < left)
            g += row_ld
            row_copy(smem, d + at[9], src, g, lim[9] < left)
            g += row_ld
            row_copy(smem, d + at[10], src, g, lim[10] < left)
            g += row_ld
            row_copy(smem, d + at[11], src, g, lim[11] < left)
            g += row_ld
            row_copy(smem, d + at[12], src, g, lim[12] < left)
            g += row_ld
            row_copy(smem, d + at[13], src, g, lim[13] < left)
            g += row_ld
            row_copy(smem, d + at[14], src, g, lim[14] < left)
            g += row_ld
            row_copy(smem, d + at[15], src, g, lim[15] < left)
    return load


@functools.cache
def make_kernel(cfg, var):
    """Configuration ``cfg``'s kernel for variant ``var`` (sm90_attention's module docstring:
    roles, schedules, causal and GQA; this module's: the TMA producer and the maps): an
    ordinary ``@cuda.jit`` function whose constants -- tiles, stages, layouts, the producer,
    the schedule, the variant -- are closure values, so every branch on them is pruned before
    typing and LLVM folds the rest.

    ``attention_kernel(tma_q, tma_k, tma_v, tma_o, out, lse, Sq, Sk, Hq, group, m_blocks,
    n_work, o_sb, o_ss, o_sh, scale_log2, cu)``: ``tma_o`` is out's tensor map with
    ``var.tma_store``, else ``()``; ``cu`` a varlen variant's prefix sums ``(cu_q, cu_k)`` (Sq,
    Sk then the packed tensors' rows), else ``()``.  An empty tuple is no kernel parameter, a
    tuple's members are parameters in order (:func:`signature`).

    A cp.async configuration's kernel is ``attention_kernel_cp(q, k, v, out, lse, Sq, Sk, Hq,
    group, m_blocks, q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh,
    scale_log2, cu)`` (:func:`cp_async_signature`): flat operands and their strides.

    The consumers' work on one tile (``consume``) is a device function: the persistent kernel
    calls it in its tile loop, the others once; both kernels share it."""
    from numbatc.kernels import sm90_attention as attn
    from numbatc.kernels.pipeline import cp_async_pipeline, named_barrier_of, tma_pipeline

    D, BN, S = var.head_dim, cfg.block_n, cfg.stages
    if D not in attn.HEAD_DIMS:
        raise ValueError(f"sm90_attention implements head_dim {attn.HEAD_DIMS}, got {D}")
    if var.dtype not in _TMA_DTYPE:
        raise ValueError(f"sm90_attention takes bfloat16 or float16, got {var.dtype!r}")
    if var.kv_cache:
        raise ValueError("sm90_attention has no KV-cache variant (sm80_attention's)")
    attn.check_fits(cfg, D)
    pers, causal, varlen = cfg.persistent, var.causal, var.varlen
    if varlen and pers:
        raise ValueError(f"{cfg.name}: a persistent configuration has no varlen variant (its "
                         "work tiles assume one sequence length)")
    cp = not cfg.tma  # the cp.async producer (sm90_attention's docstring)
    with_lse, tma_store = var.with_lse, var.tma_store
    assert not (tma_store and varlen), "a box of O would write the next sequence's rows"
    overlap, pingpong, rescale_first = cfg.overlap, cfg.pingpong, cfg.rescale_before_pv
    SW = attn.swizzle_for(D)
    q_lay, k_lay, v_lay, QPB = layouts(cfg, D)  # QPB: consumer 1's Q rows start here
    BM, NC = cfg.block_m, cfg.consumers  # query rows; consumer warpgroups (64 rows each)
    QB = BM * D * 2
    KB = k_lay.nbytes  # one K (or V) stage
    VB0 = QB + S * KB  # the first V stage
    KB16 = KB // 16  # a stage in descriptor units
    NS, NO, KK = BN // 2, D // 2, BN // 16  # S registers, O registers, k16 steps of P V
    q_lbo, q_sbo, k_lbo, k_sbo, v_lbo, v_sbo = (q_lay.lbo, q_lay.sbo, k_lay.lbo, k_lay.sbo,
                                                v_lay.lbo, v_lay.sbo)
    # NOTE: above head_dim 128 (O: 96 or 128 registers a thread) ptxas spilled b and h (20-44
    # bytes), live from the kernel's start to the epilogue across the key loop: the epilogue
    # computes them again from blockIdx.x, which the opaque operand fence keeps LLVM from reusing
    recompute = D > 128 and not pers
    staging = VB0 + S * KB if pers else 0  # O's staging rows: Q's buffer, or a tile of its own
    box_d = box_columns(D)
    boxes = D // box_d
    ptx = _TMA_DTYPE[var.dtype]
    frag_pack = nt.frag_pack_bf16x2 if var.dtype == "bfloat16" else nt.frag_pack_f16x2
    qk = _qk_chain(nt.wgmma_mma_async(BN, ptx, acc="f32", trans_a=0, trans_b=0),
                   tuple(q_lay.k_offset(16 * i) // 16 for i in range(D // 16)),
                   tuple(k_lay.k_offset(16 * i) // 16 for i in range(D // 16)))
    pv = _pv_chain(nt.wgmma_mma_async(D, ptx, acc="f32", a_from="reg", trans_b=1),
                   tuple(v_lay.k_offset(16 * c) // 16 for c in range(KK)))
    # NOTE: three consumers (160 registers): causal with lse, ptxas spilled 52 / 68 bytes with
    # the column limit and 16 / 16 with the per-register compare alone (the 64-bit diagonal of
    # the masked-tile test live across the loop, and stored and loaded in it); the per-register
    # compare and a 32-bit test: none
    three = cfg.consumers == 3
    softmax_tile = _softmax(BN, causal, attn.column_limit_mask(D, BN) and not three,
                            cfg.fast_exp, varlen, narrow=three)
    store_row0, store_row1 = (None, None) if tma_store else _row_stores(var.dtype,
                                                                        var.pair_stores, D)
    stage_o = _staging(var.dtype, D, SW, BM) if tma_store else None
    block_coords, key_tiles = _coords(BN, causal, pers and causal, BM, cfg.l2_budget, D)
    div = _div(BN)

    def work_tile(tile, bhn, m_blocks, Hq, group, Sk, off):
        m0, b, h, hk, bh = block_coords(tile, bhn, m_blocks, Hq, group, Sk)
        return m0, b, h, hk, bh, key_tiles(m0, Sk, off)

    work_tile = cuda.jit(device=True, forceinline=True)(work_tile)
    ring = cp_async_pipeline(S) if cp else tma_pipeline(S)
    ring_init, wait, release = ring.init, ring.consumer_wait, ring.consumer_release
    if cp:
        # the loaders: Q part p = row // 64 of the block, row % 64 within it; K rows SW bytes
        # apart inside each part of SW / 2 columns; V: 8-key atoms of D * 16 bytes.  The parts
        # (above head_dim 128: 64-column halves; at 96 three of 32 columns): Q's and K's
        # K-major ones 64 * SW and BN * SW bytes apart, V's 8 * SW (MN-major: its atoms stack
        # along D)
        load_q = _cp_loader(128, D, SW, lambda r: (r // 64) * QPB + (r % 64) * SW, 64 * SW)
        load_k = _cp_loader(BN, D, SW, lambda r: r * SW, BN * SW)
        load_v = _cp_loader(BN, D, SW, lambda r: (r // 8) * D * 16, 8 * SW)
        C = chunks_per_row(D, SW)
        A = SW // 16  # 16-byte chunks of one swizzle row
        produce = None
    else:
        produce = make_producer(S, BN, D, QB, KB, VB0, work_tile if pers else None)
        load_q = load_k = load_v = None
        C = A = 0
    # ping-pong: consumer cw's turn on barrier 1 + cw (its 128 threads' sync and the previous
    # consumer's 128 arrivals), handed on to the next, cyclically (FA3's scheduler barriers);
    # barrier 7: all consumers at a persistent tile's end; 4 + cw: consumer cw's own threads
    turns = (1, 2, 3)[:NC]
    turn_sync = named_barrier_of(turns, 256)
    turn_pass = named_barrier_of(turns[1:] + turns[:1], 256, arrive=True)
    wg_sync = named_barrier_of((4, 5, 6)[:NC], 128)  # consumer cw's 128 threads (the TMA store)
    n_consumer_threads = 128 * NC
    n_consumer_warps = 4 * NC
    zeros_s = (ZERO,) * NS
    zeros_o = (ZERO,) * NO
    zeros_p = ((np.uint32(0),) * 4,) * KK
    producer_regs, consumer_regs = cfg.producer_regs, cfg.consumer_regs
    n_qbars = 2 if pers else 1
    n_ring = 2 * S  # a ring's full[s], empty[s]

    @cuda.jit(device=True, forceinline=True)
    def consume(smem, qbar, kbars, vbars, tma_o, out, lse, Sq, Sk, Hq, m_blocks, o_sb, o_ss,
                o_sh, scale_log2, cu, total_q, m0, b, h, bh, q0, n_tiles, off, it, qph, t, cw,
                lane, tq):
        # one consumer warpgroup's work on a tile: rows m0 + 64 cw .. of (b, h), key tiles
        # 0 .. n_tiles - 1 at ring positions it, it + 1, ...; Q's parity qph.  Varlen: the
        # sequence's rows q0 .. q0 + Sq - 1 of the packed total_q
        wrow0 = m0 + cw * 64  # the warpgroup's first query row
        row0 = wrow0 + ((t % 128) // 32) * 16 + lane // 4  # this thread's rows: row0, row0 + 8
        # the key tiles this warpgroup's rows see (the block loads those of its last row)
        n_wg = n_tiles
        if causal:
            wlast = wrow0 + 63 + off
            if wlast < 0:
                n_wg = 0
            else:
                n_wg = min(n_tiles, div(wlast) + 1)
        # descriptors: this warpgroup's Q part; K and V stage 0 (stage s: + s * KB bytes)
        dq = nt.smem_desc(smem, cw * QPB, q_lbo, q_sbo, SW)
        dk = nt.smem_desc(smem, QB, k_lbo, k_sbo, SW)
        dv = nt.smem_desc(smem, VB0, v_lbo, v_sbo, SW)
        m_0 = NEG_INF
        m_1 = NEG_INF
        l_0 = ZERO
        l_1 = ZERO
        if rescale_first:
            alpha_0 = ZERO  # (defined on every path: the loop's first rescale scales zeros)
            alpha_1 = ZERO
        sacc = nt.wgmma_fence_operand(zeros_s)
        o = nt.wgmma_fence_operand(zeros_o)
        pa = zeros_p
        nt.mbarrier_wait_parity(qbar, 0, qph)  # Q landed
        if pingpong:
            # consumer 0 takes the first turn (the last consumer arrives on its barrier once;
            # consumer 0's last bar.sync, after the key loop, consumes this extra arrival)
            if cw == NC - 1:
                nt.named_barrier_arrive(1, 256)
        if not overlap:
            # ---- S = Q K^T, softmax, O += P V, in order ----
            for n in range(n_wg):
                s = (it + n) % S
                ph = ((it + n) // S) & 1
                n0 = n * BN
                wait(kbars, s, ph)
                sacc = nt.wgmma_fence_operand(sacc)
                nt.wgmma_fence()
                sacc = qk(sacc, dq, dk + _U(s * KB16))
                nt.wgmma_commit_group()
                nt.wgmma_wait_group(0)
                sacc = nt.wgmma_fence_operand(sacc)
                if lane == 0:
                    release(kbars, s)
                sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1 = softmax_tile(
                    sacc, np.int64(n0), tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2)
                pa = frag_pack(p)
                o = nt.frag_scale_rows(o, alpha_0, alpha_1)
                wait(vbars, s, ph)
                o = nt.wgmma_fence_operand(o)
                pa = nt.wgmma_fence_operand(pa)
                nt.wgmma_fence()
                o = pv(o, pa, dv + _U(s * KB16))
                nt.wgmma_commit_group()
                nt.wgmma_wait_group(0)
                o = nt.wgmma_fence_operand(o)
                if lane == 0:
                    release(vbars, s)
        else:
            # ---- FA3's intra-warpgroup overlap: S(n) and P(n-1) V(n-1) issued back to back;
            # softmax(S(n)) runs while P(n-1) V(n-1) is on the tensor core ----
            if n_wg > 0:
                s = it % S
                ph = (it // S) & 1
                wait(kbars, s, ph)
                if pingpong:
                    turn_sync(cw)
                sacc = nt.wgmma_fence_operand(sacc)
                nt.wgmma_fence()
                sacc = qk(sacc, dq, dk + _U(s * KB16))
                nt.wgmma_commit_group()
                if pingpong:
                    turn_pass(cw)
                nt.wgmma_wait_group(0)
                sacc = nt.wgmma_fence_operand(sacc)
                if lane == 0:
                    release(kbars, s)
                sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1 = softmax_tile(
                    sacc, np.int64(0), tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2)
                pa = frag_pack(p)
            for n in range(1, n_wg):
                s = (it + n) % S
                ph = ((it + n) // S) & 1
                sp = (it + n - 1) % S  # the previous tile's stage and parity
                pph = ((it + n - 1) // S) & 1
                n0 = n * BN
                # NOTE: both waits before the first wgmma: a wait (a branch loop) between the
                # two groups made ptxas serialise every wgmma of the kernel (C7513).  V(n-1)
                # has been in flight a whole tile longer than K(n): waiting early costs nothing.
                wait(kbars, s, ph)
                wait(vbars, sp, pph)
                if pingpong:
                    turn_sync(cw)
                sacc = nt.wgmma_fence_operand(sacc)
                o = nt.wgmma_fence_operand(o)
                pa = nt.wgmma_fence_operand(pa)
                nt.wgmma_fence()
                sacc = qk(sacc, dq, dk + _U(s * KB16))
                nt.wgmma_commit_group()
                if rescale_first:
                    # O *= tile n-1's factor while S(n) runs (P(n-2) V(n-2) retired last tile);
                    # a register write before a wgmma that reads it: a fence of its own
                    o = nt.wgmma_fence_operand(nt.frag_scale_rows(o, alpha_0, alpha_1))
                    nt.wgmma_fence()
                o = pv(o, pa, dv + _U(sp * KB16))
                nt.wgmma_commit_group()
                if pingpong:
                    turn_pass(cw)
                nt.wgmma_wait_group(1)  # S(n) done; P(n-1) V(n-1) may still run
                sacc = nt.wgmma_fence_operand(sacc)
                if lane == 0:
                    release(kbars, s)
                sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1 = softmax_tile(
                    sacc, np.int64(n0), tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2)
                nt.wgmma_wait_group(0)
                o = nt.wgmma_fence_operand(o)
                pa = nt.wgmma_fence_operand(pa)  # P(n-1) stays put until its wgmma retired
                if lane == 0:
                    release(vbars, sp)
                if not rescale_first:
                    o = nt.frag_scale_rows(o, alpha_0, alpha_1)
                # NOTE: P(n) goes into the A registers only now that P(n-1) V(n-1) retired (as
                # FA3 does): converting during that wgmma made ptxas serialise every wgmma of
                # the kernel (C7513, "non wgmma instructions defining input registers of a
                # wgmma between start and end of the pipeline stage").
                pa = frag_pack(p)
            if n_wg > 0:
                sp = (it + n_wg - 1) % S
                wait(vbars, sp, ((it + n_wg - 1) // S) & 1)
                if rescale_first:
                    o = nt.frag_scale_rows(o, alpha_0, alpha_1)  # the last tile's factor
                o = nt.wgmma_fence_operand(o)
                pa = nt.wgmma_fence_operand(pa)
                nt.wgmma_fence()
                o = pv(o, pa, dv + _U(sp * KB16))
                nt.wgmma_commit_group()
                nt.wgmma_wait_group(0)
                o = nt.wgmma_fence_operand(o)
                if lane == 0:
                    release(vbars, sp)
        if pers:
            # every Q K^T of this tile has retired: Q's buffer goes back to the producer.
            # NOTE: every consumer thread arrives, not lane 0 per warp: in a tile whose rows
            # see no key nothing converges a warp between its wait for Q and this release, and
            # a lane still before its wait would see q_full two phases on
            nt.mbarrier_arrive(qbar, 1)
        # tiles the block loaded that this warpgroup's rows do not see (causal): wait, release
        for n in range(n_wg, n_tiles):
            s = (it + n) % S
            ph = ((it + n) // S) & 1
            nt.mbarrier_wait_parity(kbars, s, ph)  # (no wgmma reads them: no proxy fence)
            nt.mbarrier_wait_parity(vbars, s, ph)
            if lane == 0:
                release(kbars, s)
                release(vbars, s)
            if pingpong:
                turn_sync(cw)
                turn_pass(cw)
        if pingpong:
            # consume the last consumer's last arrival (one more than consumer 0's turns)
            if cw == 0:
                nt.named_barrier_sync(1, 256)

        # ---- epilogue: O / l per row (0 for a row that saw no key) ----
        if recompute:
            pid = np.uint32(nt.wgmma_fence_operand(np.int32(cuda.blockIdx.x)))
            bh = np.uint32(pid // np.uint32(m_blocks))
            b = np.int64(np.uint32(bh // np.uint32(Hq)))
            h = np.int64(np.uint32(bh % np.uint32(Hq)))
            if varlen:  # q0 and Sq too (the sequence's rows), read again
                cu_q, cu_k = cu
                q0 = min(max(np.int64(cu_q[b]), 0), total_q)
                Sq = min(max(np.int64(cu_q[b + 1]), q0), total_q) - q0
        l = quad_sum(l_0)
        inv_0 = np.float32(1) / l if l > ZERO else ZERO
        if with_lse:
            row = row0
            if tq == 0 and row < Sq:
                at = h * total_q + q0 + row if varlen else np.int64(bh) * Sq + row
                lse[at] = (m_0 + math.log2(l)) * LN2 if l > ZERO else NEG_INF
        l = quad_sum(l_1)
        inv_1 = np.float32(1) / l if l > ZERO else ZERO
        if with_lse:
            row = row0 + 8
            if tq == 0 and row < Sq:
                at = h * total_q + q0 + row if varlen else np.int64(bh) * Sq + row
                lse[at] = (m_1 + math.log2(l)) * LN2 if l > ZERO else NEG_INF
        # NOTE (sm80_attention): scaled in place before any store, so that LLVM cannot hoist the
        # scaled values above the row checks and double O's registers
        o = nt.frag_scale_rows(o, inv_0, inv_1)
        if tma_store:
            # O through this warpgroup's staging rows (SW-byte swizzle) and TMA stores
            lt = t % 128
            sq = lane // 8
            sr = lane % 8
            sx = (sq // 2) ^ (sr if SW == 128 else sr // 2)
            srow = staging + cw * (64 * SW) + ((lt // 32) * 16 + (sq % 2) * 8 + sr) * SW
            if pers:
                if lt == 0:
                    nt.bulk_wait_group_read(0)  # the previous tile's boxes left the rows
                wg_sync(cw)
            stage_o(smem, srow, sx, o)
            nt.fence_proxy_async_shared()  # generic-proxy writes, read by the TMA stores
            wg_sync(cw)
            if lt == 0:
                for j in range(boxes):
                    nt.tma_store(tma_o, (box_d * j, h, wrow0, b), smem,
                                 staging + j * (BM * SW) + cw * (64 * SW))
                nt.bulk_commit_group()
                if not pers:
                    nt.bulk_wait_group_read(0)  # the boxes left shared memory before the exit
        else:
            o_start = (q0 * o_ss if varlen else b * o_sb) + h * o_sh
            row = row0
            if row < Sq:
                store_row0(out, o_start + row * o_ss + tq, o)
            row = row0 + 8
            if row < Sq:
                store_row1(out, o_start + row * o_ss + tq, o)

    @cuda.jit(device=True, forceinline=True)
    def block_top(Sq, Sk, Hq, group, m_blocks, cu):
        # a block per tile: one (batch, head)'s query blocks are neighbours (they share K and V
        # in L2), the last ones, which see the most keys under a causal mask, first.  Varlen:
        # the sequence's rows q0 .. of q and k0 .. of k and v, its Sq and Sk
        m0, b, h, hk, bh = block_coords(cuda.blockIdx.x, 0, m_blocks, Hq, group, Sk)
        q0 = np.int64(0)
        k0 = np.int64(0)
        if varlen:
            cu_q, cu_k = cu
            q0, Sq, k0, Sk = _sequence(cu_q, cu_k, b, Sq, Sk)
        return m0, b, h, hk, bh, q0, k0, Sq, Sk

    @cuda.jit(cache=False, launch_bounds=(cfg.threads, 1))
    def attention_kernel(tma_q, tma_k, tma_v, tma_o, out, lse, Sq, Sk, Hq, group, m_blocks,
                         n_work, o_sb, o_ss, o_sh, scale_log2, cu):
        # Q (BM, D) | K S x (BN, D) | V S x (BN, D) [| O's staging (BM, D)], SW-byte swizzle
        smem = cuda.shared.array(0, np.uint8, alignment=1024)
        # q_full = qbar[0]: the producer's expect_tx arrival + Q's bytes; persistent: q_empty
        # = qbar[1], one arrival per consumer thread (128 NC) once the tile's Q K^T retired.  K
        # and V rings: full[s] = kbars[s] / vbars[s] (one expect_tx arrival + a stage's bytes),
        # empty[s] = kbars[S + s] / vbars[S + s] (one arrival per consumer warp, 4 NC)
        qbar = cuda.shared.array(n_qbars, np.uint64, alignment=8)
        kbars = cuda.shared.array(n_ring, np.uint64, alignment=8)
        vbars = cuda.shared.array(n_ring, np.uint64, alignment=8)
        t = cuda.threadIdx.x
        wg = t // 128
        total_q = Sq  # varlen: the packed tensors' rows (Sq becomes the sequence's)
        if pers:  # each role finds its tiles' coordinates in its tile loop
            q0 = np.int64(0)
            off = Sk - Sq  # causal: query i sees keys j <= i + off
            bhn = np.uint32(np.uint32(n_work) // np.uint32(m_blocks))  # (batch, head) pairs
        else:
            m0, b, h, hk, bh, q0, k0, Sq, Sk = block_top(Sq, Sk, Hq, group, m_blocks, cu)
            if varlen:
                if m0 >= Sq:
                    return  # a block past its sequence's end (before any barrier)
            off = Sk - Sq  # causal: query i sees keys j <= i + off
            n_tiles = key_tiles(m0, Sk, off)

        if t == 0:
            nt.mbarrier_init(qbar, 0, 1)
            if pers:
                nt.mbarrier_init(qbar, 1, n_consumer_threads)
            ring_init(kbars, 1, n_consumer_warps)
            ring_init(vbars, 1, n_consumer_warps)
        cuda.syncthreads()

        if wg == 0:
            # ---- producer warpgroup: thread 0 issues every tensor copy -----------------------
            nt.setmaxnreg_dec(producer_regs)
            if t == 0:
                if pers:
                    produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, n_work, bhn, m_blocks,
                            Hq, group, Sk, off)
                elif varlen:  # the packed tensors' maps have one batch entry
                    produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, q0 + m0, 0, h, hk,
                            n_tiles, k0)
                else:
                    produce(smem, qbar, kbars, vbars, tma_q, tma_k, tma_v, m0, b, h, hk,
                            n_tiles, 0)
        else:
            # ---- consumer warpgroups ---------------------------------------------------------
            nt.setmaxnreg_inc(consumer_regs)
            cw = wg - 1
            lane = t % 32
            tq = (lane % 4) * 2
            if pers:
                it = np.int64(0)  # key tiles of earlier work tiles: the ring position goes on
                qph = np.int64(0)  # q_full's parity
                tile = np.int64(cuda.blockIdx.x)
                while tile < n_work:
                    m0, b, h, hk, bh, n_tiles = work_tile(tile, bhn, m_blocks, Hq, group, Sk,
                                                          off)
                    consume(smem, qbar, kbars, vbars, tma_o, out, lse, Sq, Sk, Hq, m_blocks,
                            o_sb, o_ss, o_sh, scale_log2, cu, total_q, m0, b, h, bh, q0,
                            n_tiles, off, it, qph, t, cw, lane, tq)
                    if pingpong:
                        # every consumer finishes the tile before any starts the next: the last
                        # consumer's first arrival of the next tile must not meet its last of
                        # this one
                        nt.named_barrier_sync(7, n_consumer_threads)
                    it += n_tiles
                    qph ^= 1
                    tile += cuda.gridDim.x
                if tma_store:
                    if t % 128 == 0:
                        nt.bulk_wait_group_read(0)  # the last tile's boxes left shared memory
            else:
                consume(smem, qbar, kbars, vbars, tma_o, out, lse, Sq, Sk, Hq, m_blocks, o_sb,
                        o_ss, o_sh, scale_log2, cu, total_q, m0, b, h, bh, q0, n_tiles, off,
                        np.int64(0), np.int64(0), t, cw, lane, tq)

    @cuda.jit(cache=False, launch_bounds=(cfg.threads, 1))
    def attention_kernel_cp(q, k, v, out, lse, Sq, Sk, Hq, group, m_blocks, q_sb, q_ss, q_sh,
                            k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh, scale_log2,
                            cu):
        # the cp.async producer: Q (128, D) as 2 parts of 64 rows | K S x (BN, D) | V S x
        # (BN, D), SW-byte swizzle
        smem = cuda.shared.array(0, np.uint8, alignment=1024)
        # q_full = qbar[0], full[s] = kbars[s] / vbars[s]: the producer's 128 cp.async arrivals
        # (.noinc); empty[s] = kbars[S + s] / vbars[S + s]: one arrival per consumer warp (8)
        qbar = cuda.shared.array(1, np.uint64, alignment=8)
        kbars = cuda.shared.array(n_ring, np.uint64, alignment=8)
        vbars = cuda.shared.array(n_ring, np.uint64, alignment=8)
        t = cuda.threadIdx.x
        wg = t // 128
        total_q = Sq  # varlen: the packed tensors' rows (Sq becomes the sequence's)
        m0, b, h, hk, bh, q0, k0, Sq, Sk = block_top(Sq, Sk, Hq, group, m_blocks, cu)
        if varlen:
            if m0 >= Sq:
                return  # a block past its sequence's end (before any barrier)
        off = Sk - Sq  # causal: query i sees keys j <= i + off
        n_tiles = key_tiles(m0, Sk, off)
        if t == 0:
            nt.mbarrier_init(qbar, 0, 128)
            ring_init(kbars, 128, 8)
            ring_init(vbars, 128, 8)
        cuda.syncthreads()

        # tile n uses stage s = n % S in round r = n // S: consumers wait for a full barrier
        # with parity r & 1, the producer for an empty one with parity (r + 1) & 1 (on a
        # fresh barrier parity 1 reads as complete)
        if wg == 0:
            # ---- producer warpgroup: every thread copies 16-byte chunks -------------------
            nt.setmaxnreg_dec(producer_regs)
            j = t % C
            r0 = t // C
            if SW == 128:
                swz = ((j % A) ^ (r0 % 8)) * 16
            else:
                swz = ((j % A) ^ ((r0 % 8) // 2)) * 16
            q_d = (j // A) * (64 * SW) + r0 * SW + swz
            k_d = QB + (j // A) * (BN * SW) + r0 * SW + swz
            v_d = VB0 + (r0 // 8) * (D * 16) + (j // A) * (8 * SW) + (r0 % 8) * SW + swz
            # row 0 of the block's sequence in q, k and v (computed here: at head_dim 256 the
            # producer's 40 registers spilled them when the kernel's top computed them)
            if varlen:
                rq, rk, rv = q0 * q_ss, k0 * k_ss, k0 * v_ss
            else:
                rq, rk, rv = b * q_sb, b * k_sb, b * v_sb
            load_q(smem, q_d, q, rq + h * q_sh + (m0 + r0) * q_ss + j * 8, q_ss, Sq - m0 - r0)
            nt.cp_async_mbarrier_arrive_noinc(qbar, 0)
            # this thread's first copy of key tile n: k_g, v_g; rows of the tile left: left
            k_g = rk + hk * k_sh + r0 * k_ss + j * 8
            v_g = rv + hk * v_sh + r0 * v_ss + j * 8
            left = Sk - r0
            for n in range(n_tiles):
                s = n % S
                ph = ((n // S) + 1) & 1
                nt.mbarrier_wait_parity(kbars, S + s, ph)
                load_k(smem, k_d + s * KB, k, k_g, k_ss, left)
                nt.cp_async_mbarrier_arrive_noinc(kbars, s)
                nt.mbarrier_wait_parity(vbars, S + s, ph)
                load_v(smem, v_d + s * KB, v, v_g, v_ss, left)
                nt.cp_async_mbarrier_arrive_noinc(vbars, s)
                k_g += BN * k_ss
                v_g += BN * v_ss
                left -= BN
            nt.cp_async_wait_all()
        else:
            # ---- consumer warpgroups ---------------------------------------------------------
            nt.setmaxnreg_inc(consumer_regs)
            cw = wg - 1
            lane = t % 32
            tq = (lane % 4) * 2
            consume(smem, qbar, kbars, vbars, (), out, lse, Sq, Sk, Hq, m_blocks, o_sb, o_ss,
                    o_sh, scale_log2, cu, total_q, m0, b, h, bh, q0, n_tiles, off, np.int64(0),
                    np.int64(0), t, cw, lane, tq)

    from numbatc.kernels import build

    if cp:
        return build.cache_kernel(attention_kernel_cp, "sm90_attention_cp",
                                  f"{cfg!r}|{var!r}")
    return build.cache_kernel(attention_kernel, "sm90_attention_tma", f"{cfg!r}|{var!r}")


def cp_async_signature(var):
    """A cp.async configuration's kernel's argument types (see :func:`make_kernel`):
    sm80_attention's -- typed device pointers, int64 sizes and strides, the float32 scale --
    with a varlen variant's prefix sums cu_q, cu_k as a tuple (else an empty one)."""
    from numba import types

    from numbatc.kernels import sm80_attention

    plain = sm80_attention.AttnVariant(var.head_dim, var.dtype, var.causal, var.with_lse)
    cu = types.UniTuple(types.CPointer(types.int32), 2) if var.varlen else types.Tuple(())
    return sm80_attention.signature(plain) + (cu,)


def signature(var):
    """The kernel's argument types (see :func:`make_kernel`): the three tensor maps (passed by
    value, TensorMap.param: intrinsics.grid_constant), out's with ``var.tma_store`` (else an
    empty tuple), out and lse as typed pointers, int64 sizes (n_work: the work tiles, = the grid
    unless persistent) and O's strides, the float32 scale, and a varlen variant's int32 prefix
    sums cu_q, cu_k as a tuple (else an empty one).  Flattened, the parameters the launch
    passes."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param as tmap

    none = types.Tuple(())
    cu = types.UniTuple(types.CPointer(types.int32), 2) if var.varlen else none
    return ((tmap,) * 3 + (tmap if var.tma_store else none,)
            + (types.CPointer(types.uint16), types.CPointer(types.float32))
            + (types.int64,) * 9 + (types.float32, cu))


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
    maps = (operand_map(q, var.dtype, (mb, sq, hq, D), q_st, cfg.block_m),
            operand_map(k, var.dtype, (mb, sk, p.heads_kv, D), k_st, cfg.block_n),
            operand_map(v, var.dtype, (mb, sk, p.heads_kv, D), v_st, cfg.block_n))
    if var.tma_store:  # boxes of one warpgroup's 64 rows
        maps += (operand_map(out, var.dtype, (batch, sq, hq, D), o_st, 64),)
    assert not (var.varlen and (var.tma_store or cfg.persistent)), (cfg.name, var)
    kernel = sm90_attention.kernel_for(cfg, var)
    rows = p.seqlen_q  # max_seqlen_q for varlen: the grid's query rows per sequence
    m_blocks = -(-rows // cfg.block_m)
    n_work = sm90_attention.grid_for(batch, hq, rows, cfg.block_m)
    grid = min(n_work, _persistent_blocks()) if cfg.persistent else n_work
    if config.ENABLE_CUDASIM and var.tma_store:
        # numba's simulator copies a NumPy argument in, and back after the kernel: that copy of
        # out would overwrite what the TMA stores wrote into out's own memory (as in
        # sm90_gemm_tma).  A simulator array is passed as it is.
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        out = FakeCUDAArray(out) if isinstance(out, np.ndarray) else out
    params = tuple(m.param for m in maps)
    cu = sm80_attention.varlen_arguments(p, keep)[:2] if var.varlen else ()  # cu_q, cu_k
    # the kernel's tuple arguments (make_kernel): out's map or (), the prefix sums or ()
    args = (*params[:3], params[3] if var.tma_store else (), out, lse, sq, sk, hq, group,
            m_blocks, n_work, *o_st, np.float32(scale * sm90_attention.LOG2E), tuple(cu))
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
    geometry = ((var.dtype, (mb, sq, hq, D), q_st, cfg.block_m),
                (var.dtype, (mb, sk, p.heads_kv, D), k_st, cfg.block_n),
                (var.dtype, (mb, sk, p.heads_kv, D), v_st, cfg.block_n))
    if var.tma_store:
        geometry += ((var.dtype, (mb, sq, hq, D), o_st, 64),)
    sizes = args[6:15]  # the 9 int64s from Sq (total_q) on
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
