"""The Hopper attention backward kernel (sm_90a), FlashAttention-3's algorithm on wgmma: one
block per (batch, kv head, 128 keys) computes that key block's dK and dV in registers over every
query block of the kv head's query heads, and adds its share of dQ into a float32 workspace with
bulk reductions (``cp.reduce.async.bulk .add.f32``), in a fixed order by default.

With S = scale * Q K^T, P = exp(S - lse) (recomputed, never stored), D = rowsum(dO * O):

    dV = P^T dO        dP = dO V^T        dS = P * (dP - D)
    dK = scale * dS^T Q                   dQ = scale * dS K

The block holds the transposed tiles (keys are the wgmma rows), so P^T and dS^T come out of
their products in the accumulator layout that is also the register A operand of the next
products (no shuffle, no shared memory), and the per-query values lse and D run along the
columns (intrinsics.fastmath's ``*_cols`` fragment intrinsics)::

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1); BN = 128 keys, BM = 64 queries
      WG0  warp 0, thread 0: the producer.  K and V once (TMA, kv_full); then per query block:
                             acquire the ring's stage -> Q, dO (TMA boxes of 64 rows) and the
                             block's 64 lse2 and D values (bulk copies) -> full[s]
           warp 1: the dQ writer.  Per query block and dQ piece: wait for the piece (named
                             barrier), [wait for its turn], bulk-reduce it into the workspace,
                             free the staging buffer, [pass the turn on]
           (warps 2, 3 leave; setmaxnreg.dec to the configuration's producer_regs)
      WG1  consumers, setmaxnreg.inc consumer_regs: WG1 keys 0..63 of the block, WG2 64..127
      WG2      S^T  = K Q^T     SS  m64n64k16 x D/16      (K, Q K-major)
               dP^T = V dO^T    SS  m64n64k16 x D/16      (V, dO K-major; at head_dim 64
                                                          under P's exponentials, at 128 after)
               P^T  = exp2(S^T * scale * log2 e - lse2[query])   (masked where needed)
               dS^T = P^T * (dP^T - D[query])
               dS^T -> shared memory (stmatrix; bf16 / f16), for dQ
               dV  += P^T dO    RS  m64nDk16 x 4          (dO MN-major: D contiguous)
               dK  += dS^T Q    RS  m64nDk16 x 4          (Q MN-major)
               -- the dS^T rows its dQ piece reads are stored (named barrier 1 over both
                  consumers at head_dim 128, 6 + cw over its own at 64); dV, dK retire;
                  the stage goes back to the producer --
               dQ piece = dS K  SS  m64n64k16 x D/16      (dS^T and K read MN-major)
               the piece (float32) -> its staging tile -> the writer

dQ pieces: every consumer computes one 64 x 64 piece per query block -- at head_dim 128 dQ's
columns 64 cw .. for all 128 keys, at 64 all columns for its own 64 keys (a partial sum; the
last kernel adds the two in order).  Either way no wgmma sits in a branch (ptxas serialises
wgmma behind a divergent path: C7520).  The workspace holds, per (batch, query head, 64-query
block, piece), a 64 x 64 float32 tile in rows of 68 floats (the padding spreads the consumers'
stores to the staging tile over the banks, and a bulk reduction copies the staging tile as it
is).  A last kernel scales it by ``scale`` into dq.

Deterministic (the default): the workspace tile of (query block i, piece) takes its blocks'
reductions in key-block order.  An int32 counter per tile says how many have landed; the
writer of key block j waits for it to read j, reduces, waits for the reduction to complete,
then adds 1.  A key block only waits for lower key blocks (lower block indices, launched first),
which never wait for it: no deadlock.  ``deterministic=False`` skips the counters (the adds of
different key blocks then land in any order).

Causal (bottom-right aligned, query i sees keys j <= i + Sk - Sq): key block j starts at the
first query block with a query that sees its first key; the tiles that cross the diagonal, and
the last key block where it is ragged, mask with frag_mask_cols_from.  Queries past Sq have
lse2 = +inf (the preprocess's padding) and give P = 0; their Q and dO rows are the zero fill
of the tensor maps (the batch is a dimension of its own).  GQA: the block walks the query
heads of its kv head (dK and dV sum over them).

Shared memory (dynamic, 1024-byte aligned), D = head_dim (64 or 128):

    K, V        (128 keys, D) K-major, 128B swizzle: D / 64 TMA boxes of (128 rows, 64 d)
    Q, dO       ``stages`` x (64 queries, D), the same form: read K-major (S^T, dP^T) and
                MN-major (dV, dK: sm90_gemm_tma.MnKFirstLayout, LBO = 64 * 128)
    dS^T        2 x (128 keys, 64 queries) bf16 / f16, rows of 128 B swizzled (MN-major A of
                dQ), by the parity of the query-block count
    dQ staging  2 x 64 x 68 float32 (one per consumer)
    lse2, D     ``stages`` x 2 x 64 float32

The preprocess (D, lse2 with its padding) is sm80_attention_backward's.  The kernels are
Python code (factories closing over the head dim, dtype, causal and determinism).
"""

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt
from intrinsics.layout import SmemLayout
from intrinsics.layout.smem import encode_wgmma_smem_desc
from intrinsics.setmaxnreg import register_pool
from numbatc.kernels import build, sm80_attention, sm80_attention_backward
from numbatc.kernels.pipeline import named_barrier_of, tma_pipeline
from numbatc.kernels.sm90_gemm_tma import MnKFirstLayout

__all__ = ["Sm90BwdConfig", "Sm90BwdVariant", "CONFIGS", "HEAD_DIMS", "TILES", "unsupported",
           "applies", "choose", "compiled", "launch", "kernel_signature", "make_kernel",
           "make_postprocess", "make_clear", "shared_bytes", "workspace_floats",
           "precompile_kernels", "compile_first", "clear_signature", "postprocess_signature"]

LOG2E = sm80_attention.LOG2E
#: head dims this kernel implements (others run sm80_attention_backward)
HEAD_DIMS = (64, 128)
#: the registers setmaxnreg moves between the warpgroups (168 a thread: 64512, not 65536)
_POOL = register_pool(384)
BLOCK_N = 128  # keys per block, 64 per consumer warpgroup
BLOCK_M = 64  # queries per step
_SWIZZLE = 128
#: a workspace tile: 64 queries x 64 columns of float32 in rows of _ROW floats (4 of padding:
#: a consumer's stores to its staging tile, row r at r * _ROW, meet few bank conflicts, and
#: every store address is one base plus a constant)
_ROW = 68
_TILE = 64 * _ROW
_SHARED_MAX = 227 * 1024


@dataclass(frozen=True)
class Sm90BwdConfig:
    """The depth of the Q / dO ring and the setmaxnreg register counts."""

    name: str
    stages: int = 2
    producer_regs: int = 56
    consumer_regs: int = 224

    def __post_init__(self):
        if self.stages < 2 or 128 * self.producer_regs + 256 * self.consumer_regs > _POOL:
            raise ValueError(f"invalid sm90 attention backward config {self.name}: stages >= 2 "
                             f"and 128 * producer_regs + 256 * consumer_regs <= {_POOL}")

    @property
    def threads(self):
        return 384


@dataclass(frozen=True)
class Sm90BwdVariant:
    """head_dim (64 or 128), the dtype, causal masking, and whether dQ's adds keep a fixed
    order."""

    head_dim: int
    dtype: str  # 'bfloat16' | 'float16'
    causal: bool
    deterministic: bool = True


CONFIGS = {
    c.name: c
    for c in (
        # head_dim 64: 56 / 224 registers (the consumers need ~200); head_dim 128: 24 / 240,
        # FlashAttention-3's split and the most the consumers can get (128 * 24 + 256 * 240 =
        # 64512, the whole pool; 32 / 240 asked for 1024 more, and .inc would wait forever).
        # ptxas -v (whole program): no spills at head_dim 64, 0 / 8 bytes at 128 (not causal /
        # causal; outside the main loop) -- with nt.opaque keeping K's and V's k-step
        # descriptors in the loop and the producer's loop rolled (140-220 bytes without)
        Sm90BwdConfig("d64", 2, 56, 224),
        Sm90BwdConfig("d128", 2, 24, 240),
        Sm90BwdConfig("d64_3s", 3, 56, 224),  # an alternative (not measured yet)
    )
}
#: the configuration by head_dim
TILES = {64: "d64", 128: "d128"}


def _layout(D):
    """Byte offsets of the shared-memory regions (module docstring) and the total."""
    kv = BLOCK_N * D * 2
    qs = BLOCK_M * D * 2

    def at(stages):
        k = 0
        v = k + kv
        q = v + kv
        do = q + stages * qs
        ds = do + stages * qs
        dq = ds + 2 * BLOCK_N * BLOCK_M * 2
        ld = dq + 2 * _TILE * 4
        return dict(k=k, v=v, q=q, do=do, ds=ds, dq=dq, ld=ld, total=ld + stages * 512, qs=qs)
    return at


def shared_bytes(cfg: Sm90BwdConfig, var: Sm90BwdVariant) -> int:
    """Dynamic shared memory of the main kernel."""
    return _layout(var.head_dim)(cfg.stages)["total"]


def workspace_floats(batch, heads_q, seqlen_q, head_dim):
    """(dQ workspace floats, counters) for a problem: two 64 x 64 tiles per (batch, query head,
    64-query block of the padded rows) -- at head_dim 128 its two column halves, at 64 the two
    consumers' partial sums; one int32 counter per tile."""
    pad_q = -(-seqlen_q // sm80_attention_backward.PAD_Q) * sm80_attention_backward.PAD_Q
    tiles = batch * heads_q * (pad_q // BLOCK_M) * 2
    return tiles * _TILE, tiles


smem_desc = cuda.jit(device=True, forceinline=True)(encode_wgmma_smem_desc)


# ---------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------


_U = np.uint64  # shared-memory float indices are unsigned: numba wraps a signed index that is
# negative (a compare and a select per access, which ptxas hoisted out of the main loop and
# spilled); every constant added to one is a _U too (uint64 + int64 is float64 in numba)
_R8 = _U(8 * _ROW)


@cuda.jit(device=True, forceinline=True)
def _stage4(f, at, acc4):
    # one accumulator fragment (rows r, r + 8; columns c, c + 1) at f[at] = row r, column c of
    # a staging tile of _ROW-float rows
    f[at] = acc4[0]
    f[at + _U(1)] = acc4[1]
    f[at + _R8] = acc4[2]
    f[at + _R8 + _U(1)] = acc4[3]


@cuda.jit(device=True, forceinline=True)
def _stage32(f, at, acc):
    # every address is ``at`` plus a constant (an XOR-swizzled tile's 32 addresses were
    # hoisted out of the main loop by ptxas and spilled)
    _stage4(f, at, acc[0:4])
    _stage4(f, at + _U(8), acc[4:8])
    _stage4(f, at + _U(16), acc[8:12])
    _stage4(f, at + _U(24), acc[12:16])
    _stage4(f, at + _U(32), acc[16:20])
    _stage4(f, at + _U(40), acc[20:24])
    _stage4(f, at + _U(48), acc[24:28])
    _stage4(f, at + _U(56), acc[28:32])


@functools.cache
def _stores(dtype):
    """``store32(out, o0, o1, c, acc, scale, ok0, ok1)``: 8 fragments (64 columns from c) of an
    accumulator, times ``scale``, as bf16 / f16 pairs at out[o0 + c ..] (row half 0, where ok0)
    and out[o1 + c ..] (half 1)."""
    pack = nt.pack_bf16x2 if dtype == "bfloat16" else nt.pack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def store4(out, o0, o1, c, acc4, scale, ok0, ok1):
        if ok0:
            nt.st_global_b32(out, o0 + c, pack(acc4[0] * scale, acc4[1] * scale))
        if ok1:
            nt.st_global_b32(out, o1 + c, pack(acc4[2] * scale, acc4[3] * scale))

    @cuda.jit(device=True, forceinline=True)
    def store32(out, o0, o1, c, acc, scale, ok0, ok1):
        store4(out, o0, o1, c, acc[0:4], scale, ok0, ok1)
        store4(out, o0, o1, c + 8, acc[4:8], scale, ok0, ok1)
        store4(out, o0, o1, c + 16, acc[8:12], scale, ok0, ok1)
        store4(out, o0, o1, c + 24, acc[12:16], scale, ok0, ok1)
        store4(out, o0, o1, c + 32, acc[16:20], scale, ok0, ok1)
        store4(out, o0, o1, c + 40, acc[20:24], scale, ok0, ok1)
        store4(out, o0, o1, c + 48, acc[24:28], scale, ok0, ok1)
        store4(out, o0, o1, c + 56, acc[28:32], scale, ok0, ok1)
    return store32


@cuda.jit(device=True, forceinline=True)
def _col4(f, b):
    return (f[b], f[b + _U(1)], f[b + _U(8)], f[b + _U(9)])


@cuda.jit(device=True, forceinline=True)
def _neg_col4(f, b):
    return (-f[b], -f[b + _U(1)], -f[b + _U(8)], -f[b + _U(9)])


@cuda.jit(device=True, forceinline=True)
def _cols(f, b):
    # the 16 per-query values of this thread's columns 8j + 2(l % 4) (+1), j = 0..7, from
    # shared float32 f[b + column] (b: the column 2(l % 4)); frag_*_cols's order
    return _col4(f, b) + _col4(f, b + _U(16)) + _col4(f, b + _U(32)) + _col4(f, b + _U(48))


@cuda.jit(device=True, forceinline=True)
def _neg_cols(f, b):
    return (_neg_col4(f, b) + _neg_col4(f, b + _U(16)) + _neg_col4(f, b + _U(32))
            + _neg_col4(f, b + _U(48)))


@cuda.jit(device=True, forceinline=True)
def _first_block(n0, off):
    # the first 64-query block with a query that sees key n0 under the causal mask
    q = n0 - off
    if q <= 0:
        return np.int64(0)
    return q // BLOCK_M


def _mma_chain(mma, a_steps, b_steps, zeros):
    """``chain(a0, b0)``: the SS wgmma ``mma`` over 4 or 8 k16 steps (``a_steps`` /
    ``b_steps``: each step's descriptor offset in 16-byte units), the first overwriting the
    accumulator (scale-d 0).  The steps are written out (a closure tuple indexed in a loop
    goes through memory); the branch on their count is pruned before typing."""
    n = len(a_steps)
    assert n in (4, 8) and len(b_steps) == n

    @cuda.jit(device=True, forceinline=True)
    def chain(a0, b0):
        acc = mma(zeros, a0 + np.uint64(a_steps[0]), b0 + np.uint64(b_steps[0]), 0)
        acc = mma(acc, a0 + np.uint64(a_steps[1]), b0 + np.uint64(b_steps[1]), 1)
        acc = mma(acc, a0 + np.uint64(a_steps[2]), b0 + np.uint64(b_steps[2]), 1)
        acc = mma(acc, a0 + np.uint64(a_steps[3]), b0 + np.uint64(b_steps[3]), 1)
        if n == 8:
            acc = mma(acc, a0 + np.uint64(a_steps[4]), b0 + np.uint64(b_steps[4]), 1)
            acc = mma(acc, a0 + np.uint64(a_steps[5]), b0 + np.uint64(b_steps[5]), 1)
            acc = mma(acc, a0 + np.uint64(a_steps[6]), b0 + np.uint64(b_steps[6]), 1)
            acc = mma(acc, a0 + np.uint64(a_steps[7]), b0 + np.uint64(b_steps[7]), 1)
        return acc
    return chain


# ---------------------------------------------------------------------------------------------
# The kernel, factory-made
# ---------------------------------------------------------------------------------------------


@functools.cache
def make_kernel(cfg: Sm90BwdConfig, var: Sm90BwdVariant):
    """``bwd_kernel(tma_q, tma_k, tma_v, tma_do, dk, dv, lse2, dd, dq_ws, counters, Sq, Sk, Hq,
    group, n_blocks, pad_q, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, scale_log2, scale)``: one
    block per (batch, kv head, key block), ``blockIdx.x = (b * Hkv + hk) * n_blocks + j``."""
    D, S = var.head_dim, cfg.stages
    assert D in HEAD_DIMS, var
    causal, det = var.causal, var.deterministic
    lay = _layout(D)(S)
    K_OFF, V_OFF, Q_OFF, DO_OFF = lay["k"], lay["v"], lay["q"], lay["do"]
    DS_OFF, DQ_OFF, LD_OFF, QS = lay["ds"], lay["dq"], lay["ld"], lay["qs"]
    kv_bytes = 2 * BLOCK_N * D * 2
    stage_bytes = 2 * QS + 512
    boxes = D // 64
    dq_steps = D // 16  # k16 steps of a dQ piece: 128 keys at head_dim 128, 64 at 64
    ksteps = D // 16
    dtype = "bf16" if var.dtype == "bfloat16" else "f16"
    frag_pack = nt.frag_pack_bf16x2 if var.dtype == "bfloat16" else nt.frag_pack_f16x2
    mma_s = nt.wgmma_mma_async(64, dtype)  # S^T, dP^T: K-major A and B
    mma_kv = nt.wgmma_mma_async(D, dtype, a_from="reg", trans_b=1)  # dV, dK
    mma_q = nt.wgmma_mma_async(64, dtype, trans_a=1, trans_b=1)  # dQ
    store32 = _stores(var.dtype)
    # layouts (and their descriptors' LBO / SBO, k steps in 16-byte units)
    k_a = SmemLayout("K", _SWIZZLE, BLOCK_N, D, 2)  # K, V as A of S^T / dP^T
    q_b = SmemLayout("K", _SWIZZLE, BLOCK_M, D, 2)  # Q, dO as B of S^T / dP^T
    q_mn = MnKFirstLayout("MN", _SWIZZLE, D, BLOCK_M, 2)  # Q, dO as B of dK / dV
    ds_mn = MnKFirstLayout("MN", _SWIZZLE, 64, BLOCK_N, 2)  # dS^T as A, K as B of dQ
    ka = tuple(k_a.k_offset(16 * s) // 16 for s in range(ksteps))
    qb = tuple(q_b.k_offset(16 * s) // 16 for s in range(ksteps))
    qm = tuple(q_mn.k_offset(16 * s) // 16 for s in range(4))
    dm = tuple(ds_mn.k_offset(16 * s) // 16 for s in range(dq_steps))
    k_part = int(k_a.offset(64, 0))  # consumer 1's keys
    ka_lbo, ka_sbo, qb_lbo, qb_sbo = k_a.lbo, k_a.sbo, q_b.lbo, q_b.sbo
    qm_lbo, qm_sbo, dm_lbo, dm_sbo = q_mn.lbo, q_mn.sbo, ds_mn.lbo, ds_mn.sbo
    zeros32 = (np.float32(0),) * 32
    zerosd = (np.float32(0),) * (D // 2)
    ring = tma_pipeline(S)
    ring_init, advance = ring.init, ring.advance
    acquire, commit = ring.producer_acquire, ring.producer_commit
    wait, release = ring.consumer_wait, ring.consumer_release
    BIG = 1 << 30
    producer_regs, consumer_regs = cfg.producer_regs, cfg.consumer_regs
    n_bars = 2 * S  # full[s], empty[s]
    # NOTE: at head_dim 128 dP^T's wgmma wait for P: S^T and dP^T (64 registers) in flight
    # together with dK and dV (128) and the exponentials' operands spilled under setmaxnreg 240
    # (ptxas); the other consumer's wgmma fill the tensor core meanwhile
    overlap_sdp = D == 64

    mma_s_all = _mma_chain(mma_s, ka, qb, zeros32)  # S^T (or dP^T) over head_dim
    @cuda.jit(device=True, forceinline=True)
    def mma_rs_all(acc, a, b0):
        # acc += A B over the block's 64 queries: four k16 steps, A from registers
        acc = mma_kv(acc, a[0], b0 + np.uint64(qm[0]), 1)
        acc = mma_kv(acc, a[1], b0 + np.uint64(qm[1]), 1)
        acc = mma_kv(acc, a[2], b0 + np.uint64(qm[2]), 1)
        acc = mma_kv(acc, a[3], b0 + np.uint64(qm[3]), 1)
        return acc

    # a dQ piece: dS (64 queries x its keys, read MN-major from dS^T) times K's rows of those
    # keys and 64 columns
    mma_dq = _mma_chain(mma_q, dm, dm, zeros32)

    @cuda.jit(device=True, forceinline=True)
    def ds_stored(cw):
        # the dS^T rows the dQ piece reads are in shared memory: both consumers' (named barrier
        # 1, 256 threads) at head_dim 128, this consumer's own (6 + cw, 128) at 64
        if dq_steps == 8:
            nt.named_barrier_sync(1, 256)
        else:
            own_ds_stored(cw)

    @cuda.jit(device=True, forceinline=True)
    def stage_ds(smem, row_addr, sx, qd):
        # dS^T's 4 packed A fragments (keys x 64 queries) into its rows of 128 B: call c
        # writes columns 16c .. 16c + 15 (chunks 2c, 2c + 1, swizzled by the row)
        nt.stmatrix_x4(smem, row_addr + ((0 ^ sx) << 4), qd[0])
        nt.stmatrix_x4(smem, row_addr + ((2 ^ sx) << 4), qd[1])
        nt.stmatrix_x4(smem, row_addr + ((4 ^ sx) << 4), qd[2])
        nt.stmatrix_x4(smem, row_addr + ((6 ^ sx) << 4), qd[3])

    # the dQ handshake, per consumer cw: the writer waits for its piece (named barriers 2, 3:
    # its 128 threads arrive, the writer warp's 32 sync), the consumer waits for its staging
    # tile to be free (4, 5: the writer arrives)
    piece_sync = named_barrier_of((2, 3), 160)
    piece_ready = named_barrier_of((2, 3), 160, arrive=True)
    staging_sync = named_barrier_of((4, 5), 160)
    staging_free = named_barrier_of((4, 5), 160, arrive=True)
    own_ds_stored = named_barrier_of((6, 7), 128)  # a consumer's own 128 threads

    @cuda.jit(device=True, forceinline=True)
    def write_piece(smem, dq_ws, counters, cw, tile, j, lane):
        # the writer warp: consumer cw's staging tile into workspace tile ``tile``
        piece_sync(cw)
        if lane == 0:
            if det:  # wait for key blocks 0 .. j - 1 to have added theirs
                while nt.atomic_add_global(counters, tile, np.int32(0)) != j:
                    pass
                cuda.threadfence()
                nt.fence_proxy_async_global()
            nt.bulk_reduce_add_f32(dq_ws, tile * _TILE, smem, DQ_OFF + cw * (_TILE * 4),
                                   _TILE * 4)
            nt.bulk_commit_group()
            nt.bulk_wait_group_read(0)
        # (the warp's aligned arrival follows lane 0's wait: the staging tile has been read;
        # the consumers take the last arrival before they exit)
        staging_free(cw)
        if det and lane == 0:
            nt.bulk_wait_group(0)  # the adds have landed: pass the turn on
            nt.fence_proxy_async_global()
            cuda.threadfence()
            nt.atomic_add_global(counters, tile, np.int32(1))

    @cuda.jit(device=True, forceinline=True)
    def block_coords(n_blocks, Hq, group, Sq, Sk):
        # (key block j, batch b, kv head hk, query blocks, the first one with a query that
        # sees key block j) of this block, blockIdx.x = (b * Hkv + hk) * n_blocks + j.
        # NOTE: each role computes them after its setmaxnreg: values computed before the roles
        # branch and live into the consumers are held under the producer's register count too
        # (ptxas spilled ~100 bytes at 32 registers); 32-bit unsigned divisions (a 64-bit one
        # is a call, C7509)
        blk = np.uint32(cuda.blockIdx.x)
        nb32 = np.uint32(n_blocks)
        j = np.int64(blk % nb32)
        bhk = np.uint32(blk // nb32)
        Hk = np.uint32(np.uint32(Hq) // np.uint32(group))
        m_blocks = (Sq + (BLOCK_M - 1)) // BLOCK_M
        m_first = np.int64(0)
        if causal:
            m_first = _first_block(j * BLOCK_N, Sk - Sq)
        return j, np.int64(bhk // Hk), np.int64(bhk % Hk), m_blocks, m_first

    @cuda.jit(cache=False, launch_bounds=(384, 1))
    def bwd_kernel(tma_q, tma_k, tma_v, tma_do, dk, dv, lse2, dd, dq_ws, counters, Sq, Sk, Hq,
                   group, n_blocks, pad_q, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh,
                   scale_log2, scale):
        smem = cuda.shared.array(0, np.uint8, alignment=1024)
        smem_f = cuda.shared.array(0, np.float32, alignment=1024)
        bars = cuda.shared.array(n_bars, np.uint64, alignment=8)  # the Q / dO ring
        kv_bar = cuda.shared.array(1, np.uint64, alignment=8)
        t = cuda.threadIdx.x
        wg = t // 128

        if t == 0:
            ring_init(bars, 1, 256)  # every consumer thread releases (see the release below)
            nt.mbarrier_init(kv_bar, 0, 1)
            nt.fence_mbarrier_init()
        cuda.syncthreads()

        if wg == 0:
            nt.setmaxnreg_dec(producer_regs)
            j, b, hk, m_blocks, m_first = block_coords(n_blocks, Hq, group, Sq, Sk)
            if t == 0:
                # ---- the producer thread -------------------------------------------------------
                nt.tma_prefetch_descriptor(tma_q)
                nt.tma_prefetch_descriptor(tma_do)
                nt.mbarrier_arrive_expect_tx(kv_bar, 0, kv_bytes)
                for jj in range(boxes):
                    nt.tma_load(smem, K_OFF + jj * BLOCK_N * 128, tma_k,
                                (64 * jj, hk, j * BLOCK_N, b), kv_bar, 0)
                    nt.tma_load(smem, V_OFF + jj * BLOCK_N * 128, tma_v,
                                (64 * jj, hk, j * BLOCK_N, b), kv_bar, 0)
                index = np.int64(0)
                phase = np.int64(0)
                for g in range(group):
                    h = hk * group + g
                    row = (b * Hq + h) * pad_q
                    # a while loop counted through nt.opaque: LLVM unrolled the for loop 4x, each
                    # copy's coordinates precomputed, past the producer's 24 registers
                    i = m_first
                    while i < m_blocks:
                        m0 = i * BLOCK_M
                        i = nt.opaque(i + 1)
                        acquire(bars, index, phase)
                        commit(bars, index, stage_bytes)
                        for jj in range(boxes):
                            nt.tma_load(smem, Q_OFF + index * QS + jj * BLOCK_M * 128, tma_q,
                                        (64 * jj, h, m0, b), bars, index)
                            nt.tma_load(smem, DO_OFF + index * QS + jj * BLOCK_M * 128, tma_do,
                                        (64 * jj, h, m0, b), bars, index)
                        nt.bulk_copy_g2s(smem, LD_OFF + index * 512, lse2, row + m0, 256, bars,
                                         index)
                        nt.bulk_copy_g2s(smem, LD_OFF + index * 512 + 256, dd, row + m0, 256,
                                         bars, index)
                        index, phase = advance(index, phase)
            elif t // 32 == 1:
                # ---- the dQ writer warp --------------------------------------------------------
                lane = t % 32
                staging_free(0)  # both staging tiles start free
                staging_free(1)
                # workspace tiles (bh * mq + i) * 2 + piece, walked incrementally (the warpgroup
                # has 24 registers)
                mq = pad_q // BLOCK_M
                tile = ((b * Hq + hk * group) * mq + m_first) * 2
                skip = (mq - m_blocks + m_first) * 2  # from a head's last block to the next's
                for g in range(group):
                    for i in range(m_first, m_blocks):
                        write_piece(smem, dq_ws, counters, 0, tile, j, lane)
                        write_piece(smem, dq_ws, counters, 1, tile + 1, j, lane)
                        tile += 2
                    tile += skip
                if lane == 0:
                    nt.bulk_wait_group(0)
            return

        # ---- consumer warpgroups ---------------------------------------------------------------
        nt.setmaxnreg_inc(consumer_regs)
        j, b, hk, m_blocks, m_first = block_coords(n_blocks, Hq, group, Sq, Sk)
        n0 = j * BLOCK_N
        off = Sk - Sq  # causal: query i sees keys <= i + off
        cw = wg - 1
        lt = t % 128
        lane = t % 32
        w = lt // 32
        da_k = smem_desc(nt.shared_address(smem, K_OFF + cw * k_part), ka_lbo, ka_sbo, _SWIZZLE)
        da_v = smem_desc(nt.shared_address(smem, V_OFF + cw * k_part), ka_lbo, ka_sbo, _SWIZZLE)
        db_q = smem_desc(nt.shared_address(smem, Q_OFF), qb_lbo, qb_sbo, _SWIZZLE)
        db_do = smem_desc(nt.shared_address(smem, DO_OFF), qb_lbo, qb_sbo, _SWIZZLE)
        dm_q = smem_desc(nt.shared_address(smem, Q_OFF), qm_lbo, qm_sbo, _SWIZZLE)
        dm_do = smem_desc(nt.shared_address(smem, DO_OFF), qm_lbo, qm_sbo, _SWIZZLE)
        # dQ's A: dS^T's rows of all 128 keys (head_dim 128) or of this consumer's 64 (64); B:
        # K's 64 columns of this consumer's piece for all keys (128), or K's rows of its keys
        da_ds = smem_desc(nt.shared_address(smem, DS_OFF + (0 if dq_steps == 8 else cw * 8192)),
                          dm_lbo, dm_sbo, _SWIZZLE)
        db_k = smem_desc(nt.shared_address(smem, K_OFF + cw * (BLOCK_N * 128 if dq_steps == 8
                                                               else 8192)),
                         dm_lbo, dm_sbo, _SWIZZLE)
        # this thread's first place in its staging tile (row r, column cb)
        stage_at = _U(DQ_OFF // 4 + cw * _TILE + (w * 16 + lane // 4) * _ROW + (lane % 4) * 2)
        # this thread's rows (keys) and columns (queries) of the 64 x 64 S^T tile
        key0 = n0 + cw * 64 + w * 16 + lane // 4
        key1 = key0 + 8
        cb = (lane % 4) * 2
        # stmatrix: lane l gives the row address of matrix l // 8 (fragment 2c + q // 2, row
        # half q % 2): key row cw * 64 + 16w + 8 (q % 2) + l % 8
        sq = lane // 8
        srow = cw * 64 + w * 16 + (sq % 2) * 8 + lane % 8
        sx = (sq // 2) ^ (srow % 8)
        ragged = n0 + BLOCK_N > Sk
        dkacc = zerosd
        dvacc = zerosd
        index = np.int64(0)
        phase = np.int64(0)
        it = np.int64(0)
        nt.mbarrier_wait_parity(kv_bar, 0, 0)
        for g in range(group):
            for i in range(m_first, m_blocks):
                m0 = i * BLOCK_M
                wait(bars, index, phase)
                # the block's own K / V tiles: their k-step sums stay next to their wgmma
                # instead of 48 hoisted registers (ptxas spilled 140-220 bytes; intrinsics.hints)
                da_k = nt.opaque(da_k)
                da_v = nt.opaque(da_v)
                db_k = nt.opaque(db_k)
                st = np.uint64(index * (QS // 16))
                nt.wgmma_fence()
                s = mma_s_all(da_k, db_q + st)
                nt.wgmma_commit_group()
                if overlap_sdp:  # dP^T's wgmma run under P's exponentials
                    dp = mma_s_all(da_v, db_do + st)
                    nt.wgmma_commit_group()
                    nt.wgmma_wait_group(1)
                else:
                    nt.wgmma_wait_group(0)
                s = nt.wgmma_fence_operand(s)
                lb = _U(LD_OFF // 4 + index * 128 + cb)
                # (the per-query values are read once S^T has retired, not under the wgmma)
                nl = _neg_cols(smem_f, lb)  # -lse2 of this thread's 16 query columns
                if ragged or (causal and n0 + BLOCK_N - 1 > m0 + off):
                    lo0 = -BIG
                    lo1 = -BIG
                    if causal:  # keep query q >= key - off
                        lo0 = key0 - off - m0 - cb
                        lo1 = key1 - off - m0 - cb
                    if key0 >= Sk:
                        lo0 = BIG
                    if key1 >= Sk:
                        lo1 = BIG
                    s = nt.frag_mask_cols_from(s, np.int32(max(min(lo0, BIG), -BIG)),
                                               np.int32(max(min(lo1, BIG), -BIG)))
                p = nt.frag_exp2_fma_cols(s, scale_log2, nl)
                if not overlap_sdp:
                    nt.wgmma_fence()
                    dp = mma_s_all(da_v, db_do + st)
                    nt.wgmma_commit_group()
                nt.wgmma_wait_group(0)
                dp = nt.wgmma_fence_operand(dp)
                ds = nt.frag_mul_diff_cols(p, dp, _cols(smem_f, lb + _U(64)))  # D of the columns
                pa = frag_pack(p)
                qd = frag_pack(ds)
                buf = it % 2
                stage_ds(smem, DS_OFF + buf * (BLOCK_N * 128) + srow * 128, sx, qd)
                nt.fence_proxy_async_shared()  # dS^T's stores, read by wgmma (async proxy)
                nt.wgmma_fence()
                dvacc = mma_rs_all(dvacc, pa, dm_do + st)
                dkacc = mma_rs_all(dkacc, qd, dm_q + st)
                nt.wgmma_commit_group()
                ds_stored(cw)
                # NOTE: dV and dK retire before dQ is issued: P^T's and dS^T's packed registers
                # (read by the RS wgmma until then) and dQ's accumulator are never live together
                # (32 registers that spill at head_dim 128); the other consumer's wgmma keep the
                # tensor core busy meanwhile
                nt.wgmma_wait_group(0)
                dvacc = nt.wgmma_fence_operand(dvacc)
                dkacc = nt.wgmma_fence_operand(dkacc)
                # NOTE: lse2 and D were read by every thread with ld.shared (the generic
                # proxy), and the producer's next bulk copy writes them through the async
                # proxy: each thread fences its reads before that write (a write-after-read
                # across proxies) and arrives itself, 256 arrivals a stage.  With lane 0 alone
                # arriving after a warp barrier (which orders the lanes' reads before it in the
                # PTX memory model), compute-sanitizer racecheck reported 6 hazards on an H100:
                # the bulk copies (UBLKCP at +0x92e0 / +0x9380) against these reads (8 LDS.64
                # each at +0x20e0 / +0x2c70), with and without the proxy fence.
                nt.fence_proxy_async_shared()
                release(bars, index)  # Q, dO, lse2 and D of this stage are read
                nt.wgmma_fence()
                dq = mma_dq(da_ds + np.uint64(buf * (BLOCK_N * 128 // 16)), db_k)
                nt.wgmma_commit_group()
                nt.wgmma_wait_group(0)
                dq = nt.wgmma_fence_operand(dq)
                staging_sync(cw)
                _stage32(smem_f, stage_at, dq)
                nt.fence_proxy_async_shared()  # read by the bulk reduction (async proxy)
                piece_ready(cw)
                index, phase = advance(index, phase)
                it += 1

        staging_sync(cw)  # the writer's last arrival: no named barrier is left part-full

        # ---- epilogue: dK = scale * dK, dV, rows of keys < Sk ----------------------------------
        c0 = cb
        ok0 = key0 < Sk
        ok1 = key1 < Sk
        kb0 = b * dk_sb + key0 * dk_ss + hk * dk_sh
        kb1 = kb0 + 8 * dk_ss
        vb0 = b * dv_sb + key0 * dv_ss + hk * dv_sh
        vb1 = vb0 + 8 * dv_ss
        one = np.float32(1)
        if D == 64:
            store32(dk, kb0, kb1, c0, dkacc, scale, ok0, ok1)
            store32(dv, vb0, vb1, c0, dvacc, one, ok0, ok1)
        else:
            store32(dk, kb0, kb1, c0, dkacc[0:32], scale, ok0, ok1)
            store32(dk, kb0, kb1, c0 + 64, dkacc[32:64], scale, ok0, ok1)
            store32(dv, vb0, vb1, c0, dvacc[0:32], one, ok0, ok1)
            store32(dv, vb0, vb1, c0 + 64, dvacc[32:64], one, ok0, ok1)

    return build.cache_kernel(bwd_kernel, "sm90_attention_bwd", f"{cfg!r}|{var!r}")


@functools.cache
def make_clear():
    """``clear_kernel(ws, n, counters, m)``: ws[0:n] = 0 and counters[0:m] = 0."""

    @cuda.jit(cache=False)
    def clear_kernel(ws, n, counters, m):
        i = np.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        step = np.int64(cuda.gridDim.x) * cuda.blockDim.x
        k = i
        while k < n:
            ws[k] = np.float32(0)
            k += step
        k = i
        while k < m:
            counters[k] = np.int32(0)
            k += step
    return build.cache_kernel(clear_kernel, "sm90_attention_bwd_clear", "")


@functools.cache
def make_postprocess(dtype, head_dim):
    """``dq_kernel(ws, dq, Sq, Hq, pad_q, sb, ss, sh, scale, n_pairs)``: dq = scale * the
    workspace, one thread per column pair of a (batch, query, head) row."""
    pack = nt.pack_bf16x2 if dtype == "bfloat16" else nt.pack_f16x2
    D = head_dim
    half = D // 2

    @cuda.jit(cache=False)
    def dq_kernel(ws, dq, Sq, Hq, pad_q, sb, ss, sh, scale, n_pairs):
        x = np.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        if x >= n_pairs:
            return
        c = (x % half) * 2
        rest = x // half
        q = rest % Sq
        bh = rest // Sq
        b = bh // Hq
        h = bh % Hq
        tiles = (bh * (pad_q // BLOCK_M) + q // BLOCK_M) * 2  # the query block's two tiles
        at = (q % BLOCK_M) * _ROW + c % 64
        if D == 128:  # tile c // 64 holds columns 64 (c // 64) ..
            at += (tiles + c // 64) * _TILE
            v0 = ws[at]
            v1 = ws[at + 1]
        else:  # the two consumers' partial sums, added in order
            at += tiles * _TILE
            v0 = ws[at] + ws[at + _TILE]
            v1 = ws[at + 1] + ws[at + 1 + _TILE]
        nt.st_global_b32(dq, b * sb + q * ss + h * sh + c, pack(v0 * scale, v1 * scale))
    return build.cache_kernel(dq_kernel, "sm90_attention_bwd_dq", f"{dtype}|{head_dim}")


# ---------------------------------------------------------------------------------------------
# The face every kernel module has: from an AttentionBackwardProblem to a configuration and a
# launch
# ---------------------------------------------------------------------------------------------


def _pairs_fit(ca):
    return sm80_attention.pair_stores_fit(ca)


def unsupported(p):
    """Why this kernel cannot compute backward problem ``p``, or None: an sm_90 GPU, head_dim
    64 or 128, bf16 / f16, q / k / v / dout that a tensor map describes (16-byte aligned starts
    and strides), keys and queries present, and dq / dk / dv whose column pairs are 4-byte
    aligned."""
    from numba import config

    if not config.ENABLE_CUDASIM and (p.cc is None or tuple(p.cc[:2]) != (9, 0)):
        gpu = "unknown" if p.cc is None else f"sm_{p.cc[0]}{p.cc[1]}"
        return f"sm90_attention_backward needs sm_90 (this GPU: {gpu})"
    if p.dtype not in ("bfloat16", "float16"):
        return f"sm90_attention_backward takes bfloat16 or float16, not {p.dtype}"
    if p.head_dim not in HEAD_DIMS:
        return f"sm90_attention_backward implements head_dim {HEAD_DIMS}, not {p.head_dim}"
    if p.seqlen_q == 0 or p.seqlen_k == 0:
        return "no queries or no keys"
    for name in ("q", "k", "v", "do"):
        ca = getattr(p, name)
        if not sm80_attention.aligned(ca):
            return f"{name} is not 16-byte aligned (start and strides), as a tensor map needs"
    for name in ("dq", "dk", "dv"):
        if not _pairs_fit(getattr(p, name)):
            return f"{name}'s column pairs are not 4-byte aligned"
    return None


def applies(p):
    """True when this kernel computes ``p`` (numbatc.attention_backward then allocates its
    workspace, :func:`workspace_floats`)."""
    return unsupported(p) is None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced)."""
    if name is None:
        return CONFIGS[TILES[p.head_dim]]
    if name not in CONFIGS:
        raise ValueError(f"no sm90 attention backward config {name!r}; choose from "
                         f"{sorted(CONFIGS)}")
    cfg = CONFIGS[name]
    need = shared_bytes(cfg, compiled(p, cfg)[1]) + 1024  # (+ the static mbarriers' window)
    if need > _SHARED_MAX:
        raise ValueError(f"sm90 attention backward config {name} needs {need} bytes of shared "
                         f"memory at head_dim {p.head_dim}; a block may have {_SHARED_MAX}")
    return cfg


def compiled(p, cfg: Sm90BwdConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles."""
    return cfg, Sm90BwdVariant(p.head_dim, p.dtype, p.causal,
                               getattr(p, "deterministic", True))


def kernel_signature(var):
    """The main kernel's argument types on the GPU."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param as tmap

    u16, f32p, i32p = types.CPointer(types.uint16), types.CPointer(types.float32), \
        types.CPointer(types.int32)
    i64, f32 = types.int64, types.float32
    return (tmap,) * 4 + (u16, u16, f32p, f32p, f32p, i32p) + (i64,) * 12 + (f32, f32)


def clear_signature():
    from numba import types

    return (types.CPointer(types.float32), types.int64, types.CPointer(types.int32), types.int64)


def postprocess_signature():
    from numba import types

    return (types.CPointer(types.float32), types.CPointer(types.uint16), *(types.int64,) * 6,
            types.float32, types.int64)


def precompile_kernels(cfg: Sm90BwdConfig, var: Sm90BwdVariant):
    """[(kernel, argument types)] a launch of (cfg, var) compiles (numbatc.precompile): the
    main kernel, the workspace's clear and dq kernels, and sm80_attention_backward's
    preprocess."""
    pre = sm80_attention_backward.BwdVariant(var.head_dim, var.dtype, var.causal)
    return [(make_kernel(cfg, var), kernel_signature(var)), (make_clear(), clear_signature()),
            (make_postprocess(var.dtype, var.head_dim), postprocess_signature()),
            (sm80_attention_backward.preprocess_kernel(pre),
             sm80_attention_backward.signatures()["pre"])]


@functools.cache
def compile_first(cfg: Sm90BwdConfig, var: Sm90BwdVariant):
    """Compile (or load) the four kernels of (cfg, var) at once on their first launch in this
    process (intrinsics.launch.compile_kernels: the small kernels link while numba types the
    next; the main kernel, a setmaxnreg one, is not linked but loaded from its PTX)."""
    from intrinsics.launch import compile_kernels

    compile_kernels(precompile_kernels(cfg, var))


def launch(p, cfg: Sm90BwdConfig):
    """Launch the four kernels for an AttentionBackwardProblem on its stream: the workspace
    cleared, sm80_attention_backward's preprocess (D, lse2), the main kernel, dq from the
    workspace.  NUMBATC_PRINT_CONFIG prints the choice."""
    import os
    import sys

    from numba import config

    from intrinsics.launch import launch as launch_kernel
    from numbatc.interop.views import kernel_view
    from numbatc.kernels import operands
    from numbatc.kernels.sm90_attention_tma import operand_map

    _, var = compiled(p, cfg)
    if p.ws is None or p.counters is None:
        raise ValueError("sm90_attention_backward.launch: the problem has no dQ workspace "
                         "(numbatc.attention_backward allocates it: workspace_floats)")
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.attention_backward B={p.batch} Sq={p.seqlen_q} Sk={p.seqlen_k} "
              f"Hq={p.heads_q} Hkv={p.heads_kv} D={p.head_dim}{' causal' if p.causal else ''}: "
              f"sm90_attention_backward {cfg.name} {p.dtype}"
              f"{'' if var.deterministic else ' (dQ adds in any order)'}", file=sys.stderr)
    emulated = bool(config.ENABLE_CUDASIM)
    if not emulated:
        compile_first(cfg, var)
    stream = p.stream if emulated else p.stream_handle
    keep = []
    flat, strides, dlse = sm80_attention_backward.flat_operands(p, keep)
    B, Sq, Sk, Hq, D = p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.head_dim
    group = p.group
    # the preprocess: D (less dlse) and lse2 with their padding rows (sm80_attention_backward's)
    s = strides
    pad_q = sm80_attention_backward.launch_preprocess(
        sm80_attention_backward.BwdVariant(D, p.dtype, p.causal), flat["out"], flat["do"],
        flat["lse"], dlse, flat["dd"], flat["lse2"], B, Sq, Hq, strides, stream)
    # the workspace (dQ tiles) and the counters, cleared
    if emulated:
        ws = operands.flat(kernel_view(p.ws), keep)
        counters = operands.flat(kernel_view(p.counters), keep)
    else:
        ws, counters = p.ws.ptr, p.counters.ptr
    n_ws, n_count = p.ws.shape[0], p.counters.shape[0]
    launch_kernel(make_clear(), min(-(-n_ws // 1024), 4096), 256, (ws, n_ws, counters, n_count),
                  stream=stream,
                  signature=None if emulated else clear_signature())
    # the main kernel
    maps = []
    for name, rows_box in (("q", BLOCK_M), ("k", BLOCK_N), ("v", BLOCK_N), ("do", BLOCK_M)):
        ca = getattr(p, name)
        shape = (ca.shape[0], ca.shape[1], ca.shape[2], D)
        maps.append(operand_map(flat[name], p.dtype, shape, strides[name], rows_box))
    n_blocks = -(-Sk // BLOCK_N)
    params = [m.param for m in maps]
    launch_kernel(make_kernel(cfg, var), n_blocks * B * p.heads_kv, cfg.threads,
                  (*params, flat["dk"], flat["dv"], flat["lse2"], flat["dd"], ws, counters, Sq,
                   Sk, Hq, group, n_blocks, pad_q, *s["dk"], *s["dv"],
                   np.float32(p.scale * LOG2E), np.float32(p.scale)),
                  shared_bytes=shared_bytes(cfg, var), stream=stream,
                  signature=None if emulated else kernel_signature(var))
    # dq = scale * the workspace
    n_pairs = B * Hq * Sq * D // 2
    launch_kernel(make_postprocess(p.dtype, D), -(-n_pairs // 256), 256,
                  (ws, flat["dq"], Sq, Hq, pad_q, *s["dq"], np.float32(p.scale), n_pairs),
                  stream=stream,
                  signature=None if emulated else postprocess_signature())
