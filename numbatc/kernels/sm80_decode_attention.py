"""Flash-decoding attention (sm_80 and newer): few queries (seqlen_q <= 16) against many keys,
split along the keys across blocks, then merged by a second small kernel.

Rows.  The queries of the ``group = heads_q / heads_kv`` query heads that read one key/value
head are stacked into the MMA's M dimension: row ``r = i * group + j`` is query ``i`` of query
head ``hk * group + j`` (M = seqlen_q * group rows, padded to 16 per m16 tile), so K and V are
read once for all of them (GQA / MQA at no extra traffic).

Split kernel, one block per (m block, key split, batch * heads_kv); ``warps`` warps:

    Q       the block's BLOCK_M rows (16 or 32) x head_dim, cp.async once, then A fragments in
            registers (ldmatrix) for the whole key loop
    K, V    a ring of ``stages`` tiles of BLOCK_N = warps * keys_per_warp keys, 16-byte
            cp.async copies (zero-filled past seqlen_k and in the head_dim padding); one
            ``__syncthreads`` per tile: wait for tile n, then refill the stage tile n - 1 used
    warp w  keys w * keys_per_warp .. + keys_per_warp - 1 of every tile, with all BLOCK_M rows:
            S = Q K^T (mma.sync m16n8k16, K from ldmatrix), masks (past seqlen_k; causal:
            key > query + seqlen_k - seqlen_q) only on tiles that reach them, an online
            softmax in float32 registers (log2 domain), O += P V (P repacked from the S
            fragments as the A operand, V from ldmatrix.trans), as numbatc.kernels.sm80_attention
    partial each warp writes its O / l (float32) and lse2 = m + log2(l) (-inf: no key) to the
            workspace as partial ``split * warps + w``: no reduction between warps

Combine kernel, one thread per two columns of a row: lse2 = log2(sum_p 2^lse2_p) over the
row's ``splits * warps`` partials, O = sum_p 2^(lse2_p - lse2) O_p, stored in the input dtype
(0 for a row that sees no key), and lse = lse2 * ln 2 where asked.

Workspace (float32, numbatc.kernels.split_k.split_workspace: per stream, grown and kept; from
torch's allocator while a CUDA graph is captured):

    O partials    (batch * heads_kv, partials, M, head_dim)
    lse partials  (batch * heads_kv, partials, M)

Splits (:func:`splits_for`): up to one full wave of blocks on the GPU (its SMs times the blocks
an SM holds by shared memory), at least two key tiles per split, the split length a whole
number of tiles, the count that streams the fewest tiles per block times waves.

Shared memory tiles are numbatc.kernels.sm80_attention's: rows of head_dim rounded up to 16,
128B-swizzled where that is a multiple of 64 elements, else padded to an odd chunk count.

What is code and what is text: the kernels' bodies are factory-made ``@cuda.jit(device=True)``
functions (:func:`make_split_body`, :func:`make_combine_body`) specialised by closure constants
(every loop over fragments runs a constant count, so LLVM unrolls it and the local arrays that
hold the fragments become registers: the compile tests check that no local memory is left).
The generated module (:func:`kernel_source`, cached on disk by numbatc.kernels.build) is the
two ``@cuda.jit`` entry points calling them.  Print it::

    python -c "from numbatc.kernels import sm80_decode_attention as d; print(d.kernel_source(
        d.CONFIGS['m16_w4_k16_s3'], d.DecodeVariant(128, 'bfloat16', True, True)))"
"""

import functools
import math
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt
from numbatc.kernels import gpus, split_k
from numbatc.kernels.epilogue import quad_max, quad_sum
from numbatc.kernels.build import load_generated
from numbatc.kernels.sm80_attention import kernel_arguments, kv_arguments, kv_sizes, shared_layout
from numbatc.kernels.tiles import make_paged_kv_lookahead, make_paged_kv_loader

__all__ = ["CONFIGS", "DecodeConfig", "DecodeVariant", "MAX_SEQLEN_Q", "MIN_SEQLEN_K",
           "choose", "choose_config", "compile_first", "compiled", "declines", "kernel_for",
           "kernel_source", "launch", "launch_flat", "make_combine_body", "make_split_body",
           "precompile_kernels", "shared_bytes", "split_cost", "splits_for", "unsupported"]

LOG2E = 1.4426950408889634

#: the default walk sends attention here for seqlen_q <= MAX_SEQLEN_Q and seqlen_k >= MIN_SEQLEN_K
#: NOTE: the bound on seqlen_k is a guess, not measured: below it the prefill kernels' blocks
#: (one per 128 query rows) already cover few keys each
MAX_SEQLEN_Q = 16
MIN_SEQLEN_K = 1024

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


@dataclass(frozen=True)
class DecodeConfig:
    """``m_tiles`` m16 tiles of rows per block (BLOCK_M = 16 m_tiles), ``warps`` warps each
    taking ``keys_per_warp`` keys of every tile (BLOCK_N = warps * keys_per_warp), a ring of
    ``stages`` K/V tiles."""

    name: str
    m_tiles: int
    warps: int
    keys_per_warp: int
    stages: int

    def __post_init__(self):
        problems = []
        if self.m_tiles not in (1, 2):
            problems.append(f"m_tiles must be 1 or 2, got {self.m_tiles}")
        if self.warps not in (1, 2, 4, 8):
            problems.append(f"warps must be 1, 2, 4 or 8, got {self.warps}")
        if self.keys_per_warp not in (16, 32):
            problems.append(f"keys_per_warp must be 16 or 32, got {self.keys_per_warp}")
        if not 2 <= self.stages <= 8:
            problems.append(f"stages must be in 2..8, got {self.stages}")
        if problems:
            raise ValueError(f"invalid decode attention config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return 32 * self.warps

    @property
    def block_m(self):
        return 16 * self.m_tiles

    @property
    def block_n(self):
        return self.warps * self.keys_per_warp


@dataclass(frozen=True)
class DecodeVariant:
    """head_dim (a multiple of 8, <= 256), the input/output dtype, causal masking, whether
    the combine kernel stores the log-sum-exp, and the KV-cache forms
    (numbatc.attention_with_kvcache): ``kv_cache``, each sequence's key count read from
    cache_seqlens (clamped to the cache) and its keys split into the grid's splits by that
    count; ``paged`` (with kv_cache), the keys read through a block table (one page lookup per
    16-row group of a tile, a tile ahead of its copies: numbatc.kernels.tiles'
    make_paged_kv_lookahead)."""

    head_dim: int
    dtype: str  # 'bfloat16' | 'float16'
    causal: bool
    with_lse: bool
    kv_cache: bool = False
    paged: bool = False

    @property
    def padded_dim(self):
        return -(-self.head_dim // 16) * 16


def _config(m_tiles, warps, keys_per_warp, stages):
    return DecodeConfig(f"m{16 * m_tiles}_w{warps}_k{keys_per_warp}_s{stages}", m_tiles, warps,
                        keys_per_warp, stages)


CONFIGS = {
    c.name: c
    for c in (_config(m, w, k, s) for m in (1, 2) for w in (2, 4, 8) for k in (16, 32)
              for s in (2, 3, 4, 6))
}


def shared_bytes(cfg: DecodeConfig, var: DecodeVariant) -> int:
    pitch, _ = shared_layout(var.padded_dim)
    return (cfg.block_m + 2 * cfg.stages * cfg.block_n) * pitch * 2  # Q, then (K, V) per stage


def _sm_shared(cc):
    """Shared memory of one SM and the most one block may take, in bytes, for a compute
    capability (the CUDA programming guide's table)."""
    cc = tuple(cc or (9, 0))[:2]
    if cc in ((9, 0), (10, 0), (10, 3)):
        return 228 * 1024, 227 * 1024
    if cc in ((8, 0), (8, 7)):
        return 164 * 1024, 163 * 1024
    return 100 * 1024, 99 * 1024


def blocks_per_sm(cfg, var, cc):
    """Blocks of ``cfg`` one SM holds by shared memory (1 KB reserved per block), at most 4."""
    sm, _ = _sm_shared(cc)
    return max(1, min(4, sm // (shared_bytes(cfg, var) + 1024)))


def choose_config(p) -> DecodeConfig:
    """Four warps of 16 keys each (64-key tiles); two m16 tiles per block where the stacked rows
    (seqlen_q * group) exceed 16 and head_dim <= 64; the most stages (2..4) whose shared memory
    fits half an SM (two blocks per SM overlap one's prologue and partial stores with the
    other's copies) and the per-block limit, else two warps (32-key tiles: head_dim 256 on
    GPUs of 100 KB per SM).

    NOTE: not tuned on a GPU yet.  Registers (ptxas -v via nvJitLink, sm_80, bf16, causal,
    launch_bounds (128, 2)): m16_w4_k16_s3 at head_dim 128 199, 0 spills; at 64 (m32) 209, 0
    spills; m32 at head_dim 128 spills 156 bytes (O alone is 128 registers), hence m16 there;
    head_dim 256 (m16) spills 124 bytes, kept as the portable prefill kernel keeps its own."""
    rows = p.seqlen_q * p.group
    dp = -(-p.head_dim // 16) * 16
    m_tiles = 2 if rows > 16 and dp <= 64 else 1
    var = DecodeVariant(p.head_dim, p.dtype, p.causal, p.lse is not None)
    sm, per_block = _sm_shared(p.cc)
    for warps, stages in ((4, 4), (4, 3), (4, 2), (2, 3), (2, 2)):
        cfg = CONFIGS[_config(m_tiles, warps, 16, stages).name]
        if shared_bytes(cfg, var) <= min(sm // 2 - 1024, per_block):
            return cfg
    return cfg  # two warps, two stages: fits every GPU's per-block limit at head_dim 256


def splits_for(cfg, var, p):
    """(splits, keys per split) of problem ``p``: of 1 .. ``want`` splits (``want`` enough
    blocks for one wave: the GPU's SMs times :func:`blocks_per_sm`, over batch * heads_kv * m
    blocks; at most half the key tiles, so that a split holds two or more), the one of least
    :func:`split_cost` (waves times tiles a block), the fewest splits among equals (less to
    combine); each split a whole number of tiles.  (1, seqlen_k rounded up to a tile) where
    that leaves one.

    Why the waves: rounding the tiles a split down to fill a wave overshot it -- 35 splits of
    15 tiles for one sequence of 32768 keys and 8 KV heads made 280 blocks for 264 slots, a
    second wave of 16 blocks streaming alone (H200 profile: 1.06 waves); 32 splits of 16 tiles
    make 256 blocks, one wave."""
    bn = cfg.block_n
    tiles = -(-p.seqlen_k // bn)
    m_blocks = -(-(p.seqlen_q * p.group) // cfg.block_m)
    blocks = p.batch * p.heads_kv * m_blocks
    slots = gpus.sm_count(p.cc, p.device) * blocks_per_sm(cfg, var, p.cc)
    want = min(-(-slots // blocks), tiles // 2)
    if want < 2:
        return 1, max(1, tiles) * bn
    best = min(range(1, want + 1), key=lambda n: (split_cost(tiles, n, blocks, slots), n))
    per = -(-tiles // best)
    return -(-tiles // per), per * bn


def split_cost(tiles, splits, blocks, slots):
    """What :func:`splits_for` minimises for ``tiles`` key tiles in ``splits`` splits over
    ``blocks`` (batch, head, m block) triples on a GPU of ``slots`` resident blocks: the waves
    of blocks times the tiles each block streams (the splits' length rounded up to whole
    tiles)."""
    per = -(-tiles // splits)
    n = -(-tiles // per)
    return -(-(blocks * n) // slots) * per


# ---------------------------------------------------------------------------------------------
# Device code: the split kernel's body, factory-made
# ---------------------------------------------------------------------------------------------

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
LN2 = np.float32(math.log(2.0))


@functools.cache
def make_split_body(cfg: DecodeConfig, var: DecodeVariant):
    """``split_body(smem, q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk,
    q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2)``: one block's keys
    [split * chunk, min(seqlen_k, (split + 1) * chunk)) for its rows, each warp's partial to the
    workspace (see the module docstring).  q, k, v: flat, element (b, s, h, d) at b * sb + s * ss
    + h * sh + d.

    KV-cache variants take five more arguments, ``seqlens, bt, bt_sb, page_size, pages``: Sk is
    then the cache's capacity (seqlen_cache, or the block table's pages times page_size) and
    sequence b has ``min(max(seqlens[b], 0), Sk)`` keys, split into chunks of ceil(its tiles /
    n_splits) tiles (chunk_keys unused); paged ones read key j of sequence b at page
    ``bt[b * bt_sb + j // page_size]`` (clamped to 0 .. pages - 1), row j % page_size, with k's
    and v's batch strides stepping pages."""
    D, DP = var.head_dim, var.padded_dim
    PE, SWIZZLED = shared_layout(DP)
    MI, W, KPW, STAGES = cfg.m_tiles, cfg.warps, cfg.keys_per_warp, cfg.stages
    BM, BN, T = cfg.block_m, cfg.block_n, cfg.threads
    CH = DP // 8  # 16-byte chunks per row (tile)
    REAL = D // 8  # chunks holding head_dim columns (the rest zero-filled)
    KS = DP // 16  # k16 steps of Q K^T
    NJ = KPW // 8  # n8 tiles of S per m16 tile
    KK = KPW // 16  # k16 steps of P V
    ND = DP // 8  # n8 tiles of O per m16 tile
    QE = BM * PE  # elements of the Q tile
    KE = BN * PE  # elements of one K (or V) tile
    WAIT = STAGES - 2  # cp.async groups left in flight when a tile is waited for
    WAIT_Q = STAGES - 1  # ... when Q is (the tiles' groups after it)
    # local array sizes (numba wants constants, not expressions)
    N_ROWS, N_O, N_S, N_Q, N_P = 2 * MI, MI * ND * 4, MI * NJ * 4, MI * KS * 4, MI * KK * 4
    CAUSAL = var.causal
    # Q's fragments stay in registers where they and O fit (16 rows up to head_dim 128);
    # otherwise each tile reloads them from shared memory (ldmatrix: MI * KS per warp and tile)
    Q_IN_REGS = MI * DP <= 128
    KV_TOTAL, Q_TOTAL = BN * CH, BM * CH
    KV_COPIES, Q_COPIES = -(-KV_TOTAL // T), -(-Q_TOTAL // T)
    ROWS_BY_THREADS = T % CH == 0 and BN % (T // CH) == 0  # each thread: one chunk column
    ROW_STEP = T // CH if ROWS_BY_THREADS else 0
    ptx = _PTX_TYPE[var.dtype]
    MMA = nt.mma_sync("m16n8k16", ptx, ptx, "f32")
    CP = nt.cp_async_op(16, zfill=True)
    pack = nt.pack_bf16x2 if var.dtype == "bfloat16" else nt.pack_f16x2
    KV, PAGED = var.kv_cache, var.paged
    load_kv_paged = make_paged_kv_loader(BN, PE, SWIZZLED, CH, REAL, T)
    SLOTS, lookup_pages, issue_paged = make_paged_kv_lookahead(BN, PE, SWIZZLED, CH, REAL, T)
    N_PG = 2 * SLOTS
    # NOTE: the lookahead's registers (ptxas -v, sm_80, d256 bf16 m16_w2_k16_s3) took the paged
    # kernel's spills from 124 to 296 bytes: head dims above 128 look up in front of the copies
    LOOKAHEAD = PAGED and DP <= 128

    @cuda.jit(device=True, forceinline=True)
    def soff(r, c):
        """Element offset of 16-byte chunk c of tile row r (128B swizzle, or odd-chunk rows)."""
        if SWIZZLED:
            return np.int32(r * PE + ((c ^ (r & 7)) << 3))
        return np.int32(r * PE + (c << 3))

    @cuda.jit(device=True, forceinline=True)
    def chunk(cc, sw):
        """A lane's element offset of chunk ``cc + g`` (cc even, a constant; g the lane's chunk
        step) in a row whose index is the lane's row modulo 8: the swizzle is (cc & ~7) +
        ((cc & 7) ^ g ^ lane % 8), sw[e] holding the last part for cc & 7 = 2e."""
        if SWIZZLED:
            return (cc & ~7) * 8 + sw[(cc & 7) // 2]
        return cc * 8

    @cuda.jit(device=True, forceinline=True)
    def load_kv(smem, sbase, src, gbase, stride, rlim, t):
        """This thread's cp.async copies of a (BLOCK_N x head_dim) tile from src[gbase + r *
        stride + c * 8]; rows at or past ``rlim`` and the padding chunks zero-filled.  Where
        the threads cover whole rows (ROW_STEP rows a pass) each thread copies one chunk c of
        rows r0, r0 + ROW_STEP ...: one shared and one global base, a constant step each."""
        if ROWS_BY_THREADS:
            r0 = t // CH
            c = t % CH
            g0 = gbase + r0 * stride + c * 8
            step = ROW_STEP * stride
            if rlim >= BN and REAL == CH:  # a whole tile: no checks
                for j in range(KV_COPIES):
                    CP(smem, sbase + soff(r0 + j * ROW_STEP, c), src, g0 + j * step, 16)
            else:
                for j in range(KV_COPIES):
                    r = r0 + j * ROW_STEP
                    if r < rlim and c < REAL:
                        CP(smem, sbase + soff(r, c), src, g0 + j * step, 16)
                    else:
                        CP(smem, sbase + soff(r, c), src, 0, 0)
        else:
            for j in range(KV_COPIES):
                i = t + j * T
                if KV_TOTAL % T == 0 or i < KV_TOTAL:
                    r = i // CH
                    c = i % CH
                    if r < rlim and c < REAL:
                        CP(smem, sbase + soff(r, c), src, gbase + r * stride + c * 8, 16)
                    else:
                        CP(smem, sbase + soff(r, c), src, 0, 0)

    @cuda.jit(device=True, forceinline=True)
    def load_q(smem, q, qbase, q_ss, q_sh, m0, M, G, t):
        """This thread's cp.async copies of the block's Q rows m0 .. m0 + BLOCK_M - 1 (row r:
        query r // G of query head hk * G + r % G; qbase is q's (b, 0, hk * G) element); rows
        at or past M zero-filled."""
        for j in range(Q_COPIES):
            i = t + j * T
            if Q_TOTAL % T == 0 or i < Q_TOTAL:
                r = i // CH
                c = i % CH
                row = m0 + r
                if row < M and c < REAL:
                    qi = row // G
                    src = qbase + qi * q_ss + (row - qi * G) * q_sh + c * 8
                    CP(smem, soff(r, c), q, src, 16)
                else:
                    CP(smem, soff(r, c), q, 0, 0)

    @cuda.jit(device=True, forceinline=True)
    def mma_into(acc, at, a, b0, b1):
        """acc[at .. at + 3] += a @ (b0, b1): one m16n8k16 on a fragment held in a local array."""
        d = MMA(a, (b0, b1), (acc[at], acc[at + 1], acc[at + 2], acc[at + 3]))
        acc[at] = d[0]
        acc[at + 1] = d[1]
        acc[at + 2] = d[2]
        acc[at + 3] = d[3]

    @cuda.jit(device=True, forceinline=True)
    def body(smem, q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk_keys,
             q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2, seqlens, bt,
             bt_sb, page_size, pages):
        t = cuda.threadIdx.x
        lane = t % 32
        warp = t // 32
        g = lane // 4
        tq = (lane % 4) * 2

        # ---- which block: m blocks of one key split are neighbours (they read the same keys)
        pid = cuda.blockIdx.x
        mb = pid % m_blocks
        rest = pid // m_blocks
        split = rest % n_splits
        bh = rest // n_splits
        b = bh // Hkv
        hk = bh % Hkv
        m0 = mb * BM
        if KV:
            # this sequence's keys (clamped to the cache: no read past it whatever cache_seqlens
            # holds), split by their own count: every split of a short sequence works too
            Sk = min(max(np.int64(seqlens[b]), 0), Sk)
            tiles = np.uint32((Sk + (BN - 1)) // BN)
            chunk_keys = np.int64(np.uint32(np.uint32(tiles + np.uint32(n_splits - 1))
                                            // np.uint32(n_splits))) * BN
        kstart = split * chunk_keys
        kend = min(Sk, kstart + chunk_keys)
        n_tiles = (kend - kstart + (BN - 1)) // BN
        off = Sk - Sq  # causal: query i sees keys j <= i + off
        mask_from = kend  # keys from here on need the mask (past seqlen_k; causal: see below)
        if CAUSAL:
            mask_from = min(mask_from, m0 // G + off + 1)  # the block's first query sees fewest
            last = (min(m0 + BM, M) - 1) // G + off  # the last key its last query sees
            if last < kstart:
                n_tiles = 0
            else:
                n_tiles = min(n_tiles, (last - kstart) // BN + 1)
        k_start = b * k_sb + hk * k_sh + kstart * k_ss
        v_start = b * v_sb + hk * v_sh + kstart * v_ss

        # ---- prologue: Q (its own group), then the first STAGES - 1 tiles (one group each)
        load_q(smem, q, b * q_sb + hk * G * q_sh, q_ss, q_sh, m0, M, G, t)
        nt.cp_async_commit_group()
        for s in range(STAGES - 1):
            if s < n_tiles:
                n0 = s * BN
                if PAGED:  # K and V through the block table, one lookup for both
                    load_kv_paged(smem, QE + s * 2 * KE, QE + s * 2 * KE + KE, k, v, hk * k_sh,
                                  hk * v_sh, kstart + n0, Sk - kstart - n0, t, bt, b * bt_sb,
                                  page_size, pages, k_sb, k_ss, v_sb, v_ss)
                else:
                    load_kv(smem, QE + s * 2 * KE, k, k_start + n0 * k_ss, k_ss,
                            Sk - kstart - n0, t)
                    load_kv(smem, QE + s * 2 * KE + KE, v, v_start + n0 * v_ss, v_ss,
                            Sk - kstart - n0, t)
            nt.cp_async_commit_group()

        if LOOKAHEAD:
            # the pages of the next tile the main loop loads, looked up a tile ahead: their
            # loads wait in registers while a tile is computed, not in front of its copies
            pg = cuda.local.array(N_PG, np.int32)
            for x in range(N_PG):
                pg[x] = 0
            if STAGES - 1 < n_tiles:
                n0 = (STAGES - 1) * BN
                lookup_pages(pg, kstart + n0, Sk - kstart - n0, t, bt, b * bt_sb, page_size,
                             pages)

        # ---- per-lane ldmatrix rows and swizzle parts (see chunk):
        #   Q (A, [m][k]):         row lane % 16,                      g = lane // 16
        #   K (B, [n][k]):         row (lane // 16) * 8 + lane % 8,    g = (lane // 8) % 2
        #   V (B, [k][n], .trans): row ((lane // 8) % 2) * 8 + lane % 8, g = lane // 16
        qa_g = lane // 16
        kb_g = (lane // 8) % 2
        vb_g = lane // 16
        qa_row = (lane % 16) * PE
        kb_row = ((lane // 16) * 8 + lane % 8 + warp * KPW) * PE
        vb_row = (((lane // 8) % 2) * 8 + lane % 8 + warp * KPW) * PE
        if not SWIZZLED:
            qa_row += qa_g * 8
            kb_row += kb_g * 8
            vb_row += vb_g * 8
        qa_sw = cuda.local.array(4, np.int32)
        kb_sw = cuda.local.array(4, np.int32)
        vb_sw = cuda.local.array(4, np.int32)
        for e in range(4):
            qa_sw[e] = ((2 * e) ^ qa_g ^ (lane % 8)) << 3
            kb_sw[e] = ((2 * e) ^ kb_g ^ (lane % 8)) << 3
            vb_sw[e] = ((2 * e) ^ vb_g ^ (lane % 8)) << 3

        # ---- the state: per m16 tile i, rows g (h = 0) and g + 8 (h = 1) of this lane
        m_run = cuda.local.array(N_ROWS, np.float32)  # running max (log2 domain, scaled)
        l_run = cuda.local.array(N_ROWS, np.float32)  # this lane's part of the running sum
        lim = cuda.local.array(N_ROWS, np.int64)  # the last key the row sees
        o_acc = cuda.local.array(N_O, np.float32)  # O: m16 x n8 fragments
        s_acc = cuda.local.array(N_S, np.float32)  # S, then P
        qf = cuda.local.array(N_Q, np.uint32)  # Q's A fragments (or one k16 step's, reloaded)
        pa = cuda.local.array(N_P, np.uint32)  # P's A fragments
        for x in range(N_ROWS):
            m_run[x] = NEG_INF
            l_run[x] = ZERO
            row = m0 + 16 * (x // 2) + 8 * (x % 2) + g
            lim[x] = Sk - 1
            if CAUSAL:
                lim[x] = min(Sk - 1, row // G + off)
        for x in range(N_O):
            o_acc[x] = ZERO

        if Q_IN_REGS:
            # Q landed (the tiles' groups may still be in flight): its fragments to registers
            nt.cp_async_wait_group(WAIT_Q)
            cuda.syncthreads()
            for i in range(MI):
                for ks in range(KS):
                    f = nt.ldmatrix_x4(smem, qa_row + 16 * i * PE + chunk(2 * ks, qa_sw))
                    for e in range(4):
                        qf[(i * KS + ks) * 4 + e] = f[e]

        # ---- main loop: wait for tile n, refill the stage tile n - 1 used, compute tile n
        st = 0  # the stage of tile n
        fill = STAGES - 1  # the stage tile n + STAGES - 1 goes to
        for n in range(n_tiles):
            nt.cp_async_wait_group(WAIT)
            cuda.syncthreads()  # tile n landed for every thread; all are done with tile n - 1
            nxt = n + STAGES - 1
            if nxt < n_tiles:
                n0 = nxt * BN
                if LOOKAHEAD:
                    issue_paged(smem, QE + fill * 2 * KE, QE + fill * 2 * KE + KE, k, v,
                                hk * k_sh, hk * v_sh, pg, Sk - kstart - n0, t, k_sb, k_ss, v_sb,
                                v_ss)
                    if nxt + 1 < n_tiles:  # the tile after: its pages looked up now
                        lookup_pages(pg, kstart + n0 + BN, Sk - kstart - n0 - BN, t, bt,
                                     b * bt_sb, page_size, pages)
                elif PAGED:
                    load_kv_paged(smem, QE + fill * 2 * KE, QE + fill * 2 * KE + KE, k, v,
                                  hk * k_sh, hk * v_sh, kstart + n0, Sk - kstart - n0, t, bt,
                                  b * bt_sb, page_size, pages, k_sb, k_ss, v_sb, v_ss)
                else:
                    load_kv(smem, QE + fill * 2 * KE, k, k_start + n0 * k_ss, k_ss,
                            Sk - kstart - n0, t)
                    load_kv(smem, QE + fill * 2 * KE + KE, v, v_start + n0 * v_ss, v_ss,
                            Sk - kstart - n0, t)
            nt.cp_async_commit_group()
            kst = QE + st * 2 * KE
            vst = kst + KE
            key0 = kstart + n * BN + warp * KPW  # this warp's first key

            # S = Q K^T: (16 x keys_per_warp) per m16 tile, float32
            for x in range(N_S):
                s_acc[x] = ZERO
            for ks in range(KS):
                if not Q_IN_REGS:
                    for i in range(MI):
                        f = nt.ldmatrix_x4(smem, qa_row + 16 * i * PE + chunk(2 * ks, qa_sw))
                        for e in range(4):
                            qf[(i * KS + ks) * 4 + e] = f[e]
                for j in range(0, NJ, 2):
                    fb = nt.ldmatrix_x4(smem, kst + kb_row + 8 * j * PE + chunk(2 * ks, kb_sw))
                    for i in range(MI):
                        qx = (i * KS + ks) * 4
                        a = (qf[qx], qf[qx + 1], qf[qx + 2], qf[qx + 3])
                        sx = (i * NJ + j) * 4
                        mma_into(s_acc, sx, a, fb[0], fb[1])
                        mma_into(s_acc, sx + 4, a, fb[2], fb[3])

            # masks: keys past seqlen_k (the ragged last tile) and past the causal diagonal
            if key0 + KPW > mask_from:
                for i in range(MI):
                    for j in range(NJ):
                        col = key0 + 8 * j + tq
                        sx = (i * NJ + j) * 4
                        for e in range(4):
                            if col + (e % 2) > lim[2 * i + e // 2]:
                                s_acc[sx + e] = NEG_INF

            # online softmax (log2 domain), rows g and g + 8 of each m16 tile
            for i in range(MI):
                for h in range(2):
                    mx = NEG_INF
                    for j in range(NJ):
                        sx = (i * NJ + j) * 4 + 2 * h
                        mx = max(mx, max(s_acc[sx], s_acc[sx + 1]))
                    mx = quad_max(mx) * scale_log2
                    m_old = m_run[2 * i + h]
                    m_new = max(m_old, mx)
                    base = m_new if m_new != NEG_INF else ZERO  # a row with no key yet
                    alpha = math.exp2(m_old - base)
                    m_run[2 * i + h] = m_new
                    total = ZERO
                    for j in range(NJ):
                        sx = (i * NJ + j) * 4 + 2 * h
                        p = math.exp2(s_acc[sx] * scale_log2 - base)
                        s_acc[sx] = p
                        total += p
                        p = math.exp2(s_acc[sx + 1] * scale_log2 - base)
                        s_acc[sx + 1] = p
                        total += p
                    l_run[2 * i + h] = l_run[2 * i + h] * alpha + total
                    for d in range(ND):
                        ox = (i * ND + d) * 4 + 2 * h
                        o_acc[ox] *= alpha
                        o_acc[ox + 1] *= alpha
                # P as A fragments: S tiles 2c and 2c + 1 make the k16 step c
                for c in range(KK):
                    for half in range(2):
                        sj = (i * NJ + 2 * c + half) * 4
                        px = (i * KK + c) * 4 + 2 * half
                        pa[px] = pack(s_acc[sj], s_acc[sj + 1])
                        pa[px + 1] = pack(s_acc[sj + 2], s_acc[sj + 3])

            # O += P V
            for c in range(KK):
                for d in range(0, ND, 2):
                    fb = nt.ldmatrix_x4_trans(smem, vst + vb_row + 16 * c * PE + chunk(d, vb_sw))
                    for i in range(MI):
                        px = (i * KK + c) * 4
                        a = (pa[px], pa[px + 1], pa[px + 2], pa[px + 3])
                        ox = (i * ND + d) * 4
                        mma_into(o_acc, ox, a, fb[0], fb[1])
                        mma_into(o_acc, ox + 4, a, fb[2], fb[3])

            st = st + 1 if st + 1 < STAGES else 0
            fill = fill + 1 if fill + 1 < STAGES else 0
        nt.cp_async_wait_all()

        # ---- this warp's partial: O / l and lse2 = m + log2(l) per row (-inf: no key seen)
        parts = n_splits * W
        part = bh * parts + split * W + warp
        for i in range(MI):
            for h in range(2):
                l_row = quad_sum(l_run[2 * i + h])
                inv = np.float32(1) / l_row if l_row > ZERO else ZERO
                row = m0 + 16 * i + 8 * h + g
                if row < M:
                    at = part * M + row
                    if tq == 0:
                        ws_lse[at] = (m_run[2 * i + h] + math.log2(l_row) if l_row > ZERO
                                      else NEG_INF)
                    w = at * D + tq
                    for d in range(D // 8):
                        x = (i * ND + d) * 4 + 2 * h
                        ws_o[w + 8 * d] = o_acc[x] * inv
                        ws_o[w + 8 * d + 1] = o_acc[x + 1] * inv

    if KV:
        return body

    @cuda.jit(device=True, forceinline=True)
    def split_body(smem, q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk_keys,
                   q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2):
        # the fixed-length form: KV-cache arguments unused (compile-time branches)
        body(smem, q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk_keys,
             q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2, q, q, 0, 0, 0)

    return split_body


# ---------------------------------------------------------------------------------------------
# Device code: the combine kernel's body
# ---------------------------------------------------------------------------------------------


def combine_shape(var):
    """(rows per block, threads per block) of the combine kernel: one row per block, a thread
    per two columns of the row in each of :func:`combine_groups` groups of partials."""
    return 1, combine_groups(var) * (var.head_dim // 2)


def combine_groups(var):
    """Groups of partials the combine kernel's block merges side by side (group g takes
    partials g, g + groups, ...): up to 256 threads, at most 8 groups."""
    return max(1, min(8, 256 // (var.head_dim // 2)))


@functools.cache
def make_combine_body(var: DecodeVariant):
    """``combine_body(ws_o, ws_lse, out, lse, Sq, Hq, Hkv, G, M, parts, rows, o_sb, o_ss,
    o_sh)``: each row's ``parts`` partials merged by their lse (see the module docstring) and
    stored in out (flat, element (b, i, h, d) at b * o_sb + i * o_ss + h * o_sh + d) and, for
    variants with_lse, lse ((batch, heads_q, seqlen_q) float32).

    A block per row: its thread groups (combine_groups) each merge every groups-th partial in
    one pass with a running maximum (as online softmax: the sum and O rescaled when a larger
    lse arrives), two partials per iteration, then group 0 merges the groups' results from
    shared memory.  NOTE: measured on the H200 (ncu, batch 1, 32/8 heads, seqlen_k 16384: 148
    partials a row) the first combine -- a thread per two columns walking every partial twice,
    16 blocks -- took 49.8 us against the split kernel's 25.9 us: one memory latency per
    partial and step."""
    D = var.head_dim
    HALF = D // 2
    PG = combine_groups(var)
    SA = PG * D  # (a constant: shared.array's shape must be one)
    WITH_LSE = var.with_lse
    pack = nt.pack_bf16x2 if var.dtype == "bfloat16" else nt.pack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def merge(mx, total, a0, a1, lv, x, y):
        """(mx, total, a0, a1) with one more partial (its lse2 lv and O columns x, y)."""
        if lv == NEG_INF:
            return mx, total, a0, a1
        if lv > mx:
            sc = math.exp2(mx - lv)  # 0 while mx is -inf
            return lv, total * sc + np.float32(1), a0 * sc + x, a1 * sc + y
        w = math.exp2(lv - mx)
        return mx, total + w, a0 + w * x, a1 + w * y

    @cuda.jit(device=True, forceinline=True)
    def combine_body(ws_o, ws_lse, out, lse, Sq, Hq, Hkv, G, M, parts, rows, o_sb, o_ss, o_sh):
        s_a = cuda.shared.array(SA, np.float32)
        s_m = cuda.shared.array(PG, np.float32)
        s_t = cuda.shared.array(PG, np.float32)
        t = cuda.threadIdx.x
        grow = cuda.blockIdx.x  # over (batch * heads_kv, M)
        if grow >= rows:
            return
        g = t // HALF
        col = (t % HALF) * 2
        bh = grow // M
        r = grow - bh * M
        first = bh * parts * M + r  # partial p's lse at first + p * M
        mx = NEG_INF
        total = ZERO
        a0 = ZERO
        a1 = ZERO
        p = g
        while p + PG < parts:  # two partials per step: both loads in flight together
            at = first + p * M
            at2 = at + PG * M
            l1 = ws_lse[at]
            l2 = ws_lse[at2]
            x1 = ws_o[at * D + col]
            y1 = ws_o[at * D + col + 1]
            x2 = ws_o[at2 * D + col]
            y2 = ws_o[at2 * D + col + 1]
            mx, total, a0, a1 = merge(mx, total, a0, a1, l1, x1, y1)
            mx, total, a0, a1 = merge(mx, total, a0, a1, l2, x2, y2)
            p += 2 * PG
        if p < parts:
            at = first + p * M
            mx, total, a0, a1 = merge(mx, total, a0, a1, ws_lse[at], ws_o[at * D + col],
                                      ws_o[at * D + col + 1])
        s_a[g * D + col] = a0
        s_a[g * D + col + 1] = a1
        if col == 0:
            s_m[g] = mx
            s_t[g] = total
        cuda.syncthreads()
        if g != 0:
            return
        mx = NEG_INF
        for q in range(PG):
            mx = max(mx, s_m[q])
        total = ZERO
        a0 = ZERO
        a1 = ZERO
        if mx != NEG_INF:
            for q in range(PG):
                mq = s_m[q]
                if mq != NEG_INF:
                    sc = math.exp2(mq - mx)
                    total += s_t[q] * sc
                    a0 += s_a[q * D + col] * sc
                    a1 += s_a[q * D + col + 1] * sc
            a0 /= total
            a1 /= total
        b = bh // Hkv
        qi = r // G
        h = (bh - b * Hkv) * G + (r - qi * G)
        o = b * o_sb + qi * o_ss + h * o_sh + col
        v = pack(a0, a1)
        out[o] = np.uint16(v & 0xFFFF)
        out[o + 1] = np.uint16(v >> 16)
        if WITH_LSE and col == 0:
            lse[(b * Hq + h) * Sq + qi] = (mx + math.log2(total)) * LN2 if total > ZERO else NEG_INF

    return combine_body


# ---------------------------------------------------------------------------------------------
# The generated entry points, compilation and launch
# ---------------------------------------------------------------------------------------------


#: the split kernel's launch bounds ask ptxas for registers that let this many blocks share an SM
MIN_BLOCKS = 2


def kernel_source(cfg: DecodeConfig, var: DecodeVariant) -> str:
    """Python source of the module that holds the two kernels: entry points calling the bodies
    (the one place numba's disk cache can key them on numbatc's whole source, through
    numbatc.kernels.build).  A KV-cache variant's split kernel takes the five KV-cache
    arguments after the scale (see make_split_body)."""
    kv = ", seqlens, bt, bt_sb, page_size, pages" if var.kv_cache else ""
    return f'''"""Generated by numbatc.kernels.sm80_decode_attention for {cfg.name}, {var}. Do not edit."""
import numpy as np
from numba import cuda

from numbatc.kernels.sm80_decode_attention import (DecodeConfig, DecodeVariant,
                                                   make_combine_body, make_split_body)

split_body = make_split_body({cfg!r}, {var!r})
combine_body = make_combine_body({var!r})


@cuda.jit(cache=True, launch_bounds=({cfg.threads}, {MIN_BLOCKS}))
def split_kernel(q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk_keys, q_sb,
                 q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2{kv}):
    smem = cuda.shared.array(0, np.uint16, alignment=1024)
    split_body(smem, q, k, v, ws_o, ws_lse, Sq, Sk, Hkv, G, M, m_blocks, n_splits, chunk_keys,
               q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, scale_log2{kv})


@cuda.jit(cache=True)
def combine_kernel(ws_o, ws_lse, out, lse, Sq, Hq, Hkv, G, M, parts, rows, o_sb, o_ss, o_sh):
    combine_body(ws_o, ws_lse, out, lse, Sq, Hq, Hkv, G, M, parts, rows, o_sb, o_ss, o_sh)
'''


@functools.cache
def kernel_for(cfg: DecodeConfig, var: DecodeVariant):
    """(split kernel, combine kernel) for (cfg, var), cached on disk (build.load_generated)."""
    source = kernel_source(cfg, var)
    return (load_generated("sm80_decode_attention", source, entry="split_kernel"),
            load_generated("sm80_decode_attention", source, entry="combine_kernel"))


@functools.cache
def signature(var: DecodeVariant):
    """(split kernel's, combine kernel's) argument types on the GPU: typed device pointers,
    int64 sizes and strides, the float32 scale."""
    from numba import types

    u16, f32 = types.CPointer(types.uint16), types.CPointer(types.float32)
    i32 = types.CPointer(types.int32)
    kv = (i32, i32) + (types.int64,) * 3 if var.kv_cache else ()
    return ((u16, u16, u16, f32, f32) + (types.int64,) * 17 + (types.float32,) + kv,
            (f32, f32, u16, f32) + (types.int64,) * 10)


def precompile_kernels(cfg: DecodeConfig, var: DecodeVariant):
    """[(kernel, argument types)] a launch of (cfg, var) compiles, in the order
    :func:`compile_first` compiles them: the split kernel, then the combine kernel."""
    return list(zip(kernel_for(cfg, var), signature(var)))


def compile_first(cfg: DecodeConfig, var: DecodeVariant):
    """Compile (or load from the disk cache) both kernels of (cfg, var) together:
    intrinsics.launch.compile_kernels, the split kernel first, its link (nvJitLink) in a thread
    while numba types the combine kernel.  First compile of both, sm_90a, head_dim 128 on a
    2-core host (scripts/diag/compile_time.py decode:128, medians of 3): 1.72-1.78 s one after
    the other, 1.53-1.55 s so.  A warm call finds both compiled (a dictionary lookup each)."""
    from intrinsics.launch import compile_kernels

    compile_kernels(precompile_kernels(cfg, var))


def launch_flat(cfg, var, q, k, v, out, lse, batch, seqlen_q, seqlen_k, heads_q, group,
                q_strides, k_strides, v_strides, o_strides, scale, *, device, library=None,
                stream=0, split=None, kv=None):
    """Launch the split kernel then the combine kernel on ``stream``.  q, k, v, out, lse are
    flat (device pointers on the GPU, 1-d arrays in the emulation; lse 0 / a dummy without
    with_lse), strides (batch, seq, head) in elements, q's, k's and v's 16-byte multiples.
    ``split``: (splits, keys per split), else :func:`splits_for`'s.  The workspace is
    numbatc.kernels.split_k's per-stream one (``library`` 'torch': torch's allocator while the
    stream captures a graph).  A KV-cache variant takes ``kv``: sm80_attention.kv_arguments'
    (seqlens, block table, its row stride, page_size, pages); ``seqlen_k`` is then the cache's
    capacity."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel

    if var.kv_cache != (kv is not None):
        raise ValueError(f"launch_flat: a {'KV-cache' if var.kv_cache else 'fixed-length'} "
                         f"variant takes kv={'(...)' if var.kv_cache else 'None'}")
    plan = _plan(cfg, var, batch, seqlen_q, seqlen_k, heads_q, group, q_strides, k_strides,
                 v_strides, o_strides, split)
    ws, _ = split_k.split_workspace(device, plan.ws_floats, 1, library)(stream)
    emulated = bool(config.ENABLE_CUDASIM)
    if emulated:
        ws_o, ws_lse = ws[:plan.o_floats], ws[plan.o_floats:]
    else:
        ws_o, ws_lse = ws, ws + 4 * plan.o_floats
    split_kernel, combine_kernel = kernel_for(cfg, var)
    sig_split, sig_combine = (None, None) if emulated else signature(var)
    if not emulated:
        compile_first(cfg, var)
    launch_kernel(split_kernel, plan.split_grid, cfg.threads,
                  (q, k, v, ws_o, ws_lse, *plan.split_sizes, np.float32(scale * LOG2E),
                   *(kv or ())),
                  shared_bytes=shared_bytes(cfg, var), stream=stream, signature=sig_split)
    launch_kernel(combine_kernel, plan.combine_grid, plan.combine_threads,
                  (ws_o, ws_lse, out, lse, *plan.combine_sizes), stream=stream,
                  signature=sig_combine)


class _Plan(NamedTuple):
    """The two launches of one problem: grids, the size arguments after the pointers, the
    workspace (O partials, then lse partials; float32)."""
    split_grid: int
    split_sizes: tuple
    combine_grid: int
    combine_threads: int
    combine_sizes: tuple
    o_floats: int
    ws_floats: int


def _plan(cfg, var, batch, seqlen_q, seqlen_k, heads_q, group, q_strides, k_strides, v_strides,
          o_strides, split):
    heads_kv = heads_q // group
    rows = seqlen_q * group
    m_blocks = -(-rows // cfg.block_m)
    n_splits, chunk_keys = split
    parts = n_splits * cfg.warps
    o_floats = batch * heads_kv * parts * rows * var.head_dim
    total_rows = batch * heads_kv * rows
    rpb, threads = combine_shape(var)
    return _Plan(m_blocks * n_splits * batch * heads_kv,
                 (seqlen_q, seqlen_k, heads_kv, group, rows, m_blocks, n_splits, chunk_keys,
                  *q_strides, *k_strides, *v_strides),
                 -(-total_rows // rpb), threads,
                 (seqlen_q, heads_q, heads_kv, group, rows, parts, total_rows, *o_strides),
                 o_floats, o_floats + batch * heads_kv * parts * rows)


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (see numbatc.kernels.dispatch)
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute attention problem ``p``, or None: it computes every
    problem numbatc.attention accepts (bf16 / f16, head_dim a multiple of 8 up to 256), at any
    seqlen_q (rows past 32 take more m blocks, each reading the keys again), but not packed
    variable-length sequences (numbatc.attention_varlen)."""
    if p.varlen:
        return ("variable-length sequences (numbatc.attention_varlen) run on sm90_attention or "
                "sm80_attention")
    if p.dtype not in _PTX_TYPE:
        return f"sm80_decode_attention takes bfloat16 or float16, not {p.dtype}"
    if p.head_dim % 8 or not 8 <= p.head_dim <= 256:
        return f"head_dim {p.head_dim} is not a multiple of 8 in 8..256"
    return None


def declines(p):
    """Why the default walk (no NUMBATC_ATTN_KERNEL) gives a problem this kernel computes to
    the prefill kernels, or None: it takes decode shapes, seqlen_q <= MAX_SEQLEN_Q and seqlen_k
    >= MIN_SEQLEN_K; KV-cache problems (numbatc.attention_with_kvcache) at any seqlen_k (the
    cache's capacity: the sequences' own lengths are on the device)."""
    if p.seqlen_q > MAX_SEQLEN_Q:
        return f"seqlen_q {p.seqlen_q} > {MAX_SEQLEN_Q} (not decode-shaped)"
    if p.seqlen_k < MIN_SEQLEN_K and not p.kv_cache:
        return f"seqlen_k {p.seqlen_k} < {MIN_SEQLEN_K} (too few keys to split)"
    return None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced; else
    :func:`choose_config`'s)."""
    if name is None:
        return choose_config(p)
    if name not in CONFIGS:
        raise ValueError(f"no decode attention config {name!r}; choose from {sorted(CONFIGS)}")
    return CONFIGS[name]


def compiled(p, cfg: DecodeConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles."""
    return cfg, DecodeVariant(p.head_dim, p.dtype, p.causal, p.lse is not None, p.kv_cache,
                              p.paged)


def launch(p, cfg: DecodeConfig):
    """Launch ``cfg`` for a :class:`numbatc.attention_api.AttentionProblem` on its stream (the
    split kernel, then the combine kernel); q, k and v packed where not 16-byte aligned.
    ``NUMBATC_DECODE_SPLITS=<n>`` forces the number of key splits (benchmarks, tests).  Returns
    the warm calls' pointer relaunch (:func:`pointer_relaunch`) or None."""
    _, var = compiled(p, cfg)
    split = splits_for(cfg, var, p)
    forced = os.environ.get("NUMBATC_DECODE_SPLITS")
    if forced:
        if not forced.strip().isdigit() or int(forced) < 1:
            raise ValueError(f"NUMBATC_DECODE_SPLITS={forced!r}: a positive number of splits")
        tiles = max(1, -(-p.seqlen_k // cfg.block_n))
        per = -(-tiles // int(forced))
        split = (-(-tiles // per), per * cfg.block_n)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        why = declines(p)
        rows = p.seqlen_q * p.group
        print(f"numbatc.attention B={p.batch} Sq={p.seqlen_q} Sk={p.seqlen_k} Hq={p.heads_q} "
              f"Hkv={p.heads_kv} D={p.head_dim}{' causal' if p.causal else ''}: "
              f"sm80_decode_attention {cfg.name} {p.dtype}{' +lse' if var.with_lse else ''}, "
              f"{'forced by NUMBATC_ATTN_KERNEL (' + why + ')' if why else 'decode-shaped'}"
              f"{_kv_words(p)}: "
              f"rows seqlen_q x group = {rows} in {-(-rows // cfg.block_m)} m block(s), "
              f"{split[0]} split(s) of {split[1]} keys, {split[0] * cfg.warps} partials a row",
              file=sys.stderr)
    keep = []
    args, stream = kernel_arguments(p, keep)
    library = getattr(p.q, "library", None)
    launch_flat(cfg, var, *args, device=p.device, library=library, stream=stream, split=split,
                kv=kv_arguments(p, keep))
    split_k.release_captured()  # a captured workspace: both launches are queued
    if keep or os.environ.get("NUMBATC_PRINT_CONFIG"):
        return None  # q, k or v packed (a later call decides again), or no warm calls
    return pointer_relaunch(cfg, var, args, split, p.device, library, kv_sizes(p))


def _kv_words(p):
    """NUMBATC_PRINT_CONFIG's words for a KV-cache problem ('' for none)."""
    if not p.kv_cache:
        return ""
    if p.paged:
        return (f", paged KV cache (page_size {p.page_size}, {p.block_table.shape[1]} pages a "
                f"sequence: lengths from cache_seqlens, split by each one's own)")
    return ", KV cache (lengths from cache_seqlens, split by each one's own)"


def pointer_relaunch(cfg, var, args, split, device, library, kv_fixed=()):
    """The warm calls' launch of ``cfg`` (both kernels, as launch_flat's) for problems like the
    one whose launch ``args`` (kernel_arguments', on the GPU, nothing packed) and ``split`` are
    given: ``fn(q, k, v, out, lse, scale, stream_handle, kv=())`` with device pointers (lse 0
    without it), two cuLaunchKernel through parameter buffers made here, the workspace the
    stream's (or torch's allocator's while it captures, as launch_flat's); True when launched,
    False where a start of q, k or v is not 16-byte aligned (the checked path packs a copy).  A
    KV-cache variant's relaunch takes ``kv=(cache_seqlens, block_table)`` pointers
    (cache_seqlens twice for a contiguous cache) and ``kv_fixed``, sm80_attention.kv_sizes'
    (the block table's row stride, page_size, pages), from the checked launch.  None where no prepared launch can be made (the emulation)."""
    from numba import config

    from intrinsics.launch import prepare

    if config.ENABLE_CUDASIM:
        return None
    _q, _k, _v, _out, _lse, batch, sq, sk, hq, group, q_st, k_st, v_st, o_st, _scale = args
    plan = _plan(cfg, var, batch, sq, sk, hq, group, q_st, k_st, v_st, o_st, split)
    workspace = split_k.split_workspace(device, plan.ws_floats, 1, library)
    split_kernel, combine_kernel = kernel_for(cfg, var)
    sig_split, sig_combine = signature(var)
    first = prepare(split_kernel, plan.split_grid, cfg.threads, sig_split,
                    shared_bytes=shared_bytes(cfg, var))
    second = prepare(combine_kernel, plan.combine_grid, plan.combine_threads, sig_combine)
    if first is None or second is None:
        return None
    split_sizes, combine_sizes, o_floats = plan.split_sizes, plan.combine_sizes, plan.o_floats
    n_kv = 2 if var.kv_cache else 0

    def relaunch(q, k, v, out, lse, scale, stream, kv=()):
        if (q | k | v) & 15 or len(kv) != n_kv:
            return False
        ws, _ = workspace(stream)
        ws_lse = ws + 4 * o_floats
        first(stream, q, k, v, ws, ws_lse, *split_sizes, scale * LOG2E, *kv, *kv_fixed)
        second(stream, ws, ws_lse, out, lse, *combine_sizes)
        split_k.release_captured()
        return True

    return relaunch
