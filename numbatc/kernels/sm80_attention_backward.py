"""The portable attention backward kernels (sm_80 and newer), FlashAttention-2's algorithm, with
no atomics: every output element is written by one block, so results are bitwise reproducible.

Given q, k, v, the forward's out and lse (natural log, -inf for a query that sees no key) and
dO, with S = scale * Q K^T and P = exp(S - lse) (P is recomputed, never stored):

    dV = P^T dO        dP = dO V^T        dS = P * (dP - D),  D = rowsum(dO * O)
    dK = scale * dS^T Q                   dQ = scale * dS K

Three launches:

    preprocess   one warp per query row: D (float32) and lse2 = lse * log2(e) (+inf where lse
                 is -inf, so that P = exp2(S * scale * log2(e) - lse2) is 0 for such a row),
                 both (batch * heads_q, pad_q) with pad_q = seqlen_q rounded up to PAD_Q and
                 the padding rows D = 0, lse2 = +inf: the kernels below read any query of
                 their tiles without a bounds check, and padding queries give P = 0.
    dK / dV      one block per (batch, kv head, BLOCK_N keys); each warp owns 16 keys and
                 walks the query heads of its group and their query tiles (skipping the tiles
                 a causal mask empties; Q and dO double-buffered by cp.async).  Keys are the
                 MMA rows:
                     S^T = K Q^T          K as A (ldmatrix), Q as B (ldmatrix: its rows are n)
                     P^T = exp2(S^T * scale * log2(e) - lse2[query])
                     dV += P^T dO         P^T stays in registers as the A operand (the m16n8 C
                                          fragments of query columns 8c..8c+15, packed, are the
                                          m16k16 A fragment, as the forward's P); dO as B by
                                          ldmatrix.trans
                     dP^T = V dO^T        V as A, dO as B (no transpose)
                     dS^T = P^T * (dP^T - D[query])
                     dK += dS^T Q         dS^T in registers as A, Q as B by ldmatrix.trans
                 dK is scaled once in the epilogue; rows past seqlen_k are not stored.  Where
                 head_dim > 128 the accumulators of both do not fit the registers: dK and dV are
                 two launches of the kernel (``part``), each recomputing P^T.
    dQ           one block per (batch, head, BLOCK_M queries); each warp owns 16 queries and
                 walks the key tiles (K and V double-buffered):
                     S = Q K^T, masked (past seqlen_k; causal), P = exp2(S * ... - lse2[row])
                     dP = dO V^T          dO as A, V as B (no transpose)
                     dS = P * (dP - D[row])
                     dQ += dS K           dS in registers as A, K as B by ldmatrix.trans

Shared tiles use the forward's layouts (sm80_attention.shared_layout: the 128B swizzle where a
row is a multiple of 128 bytes, else rows padded to an odd chunk count) and its cp.async loader.
The sources are generated per (configuration, variant) and cached on disk
(numbatc.kernels.build.load_generated); ``python -c "from numbatc.kernels import
sm80_attention_backward as b; print(b.dkdv_source(b.CONFIGS['d64'], b.BwdVariant(64,
'bfloat16', True)))"`` prints one.
"""

import functools
from dataclasses import dataclass

import numpy as np

from numbatc.kernels import gpus, operands, sm80_attention
from numbatc.kernels.build import load_generated

__all__ = ["BwdConfig", "BwdVariant", "CONFIGS", "PAD_Q", "unsupported", "choose", "compiled",
           "launch", "choose_config", "shared_bytes", "dkdv_source", "dq_source",
           "preprocess_source", "preprocess_kernel", "kernels_for", "signatures", "launch_flat",
           "launch_preprocess", "flat_operands", "precompile_kernels", "compile_first"]

LOG2E = sm80_attention.LOG2E
#: the scratch rows (D, lse2) per (batch, head) are seqlen_q rounded up to this (a multiple of
#: every configuration's query tile)
PAD_Q = 128
_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


@dataclass(frozen=True)
class BwdConfig:
    """The tiles of both kernels.  dK/dV: ``kv_block_n`` keys per block (16 per warp),
    ``kv_tile_m`` queries per step, K and V fragments kept in registers (``kv_in_regs``) or
    re-read from shared memory; ``split`` runs dK and dV as two launches (large head dims).
    dQ: ``dq_block_m`` queries per block (16 per warp), ``dq_tile_n`` keys per step, Q and dO
    fragments in registers (``q_in_regs``) or re-read."""

    name: str
    kv_block_n: int
    kv_tile_m: int
    kv_in_regs: bool
    split: bool
    dq_block_m: int
    dq_tile_n: int
    q_in_regs: bool

    def __post_init__(self):
        problems = []
        for what, n in (("kv_block_n", self.kv_block_n), ("dq_block_m", self.dq_block_m)):
            if n % 16 or not 16 <= n <= 256:
                problems.append(f"{what} must be a multiple of 16 in 16..256, got {n}")
        for what, n in (("kv_tile_m", self.kv_tile_m), ("dq_tile_n", self.dq_tile_n),
                        ("dq_block_m", self.dq_block_m)):
            if n % 16 or not 16 <= n <= PAD_Q or PAD_Q % n:
                problems.append(f"{what} must be a multiple of 16 dividing {PAD_Q}, got {n}")
        if problems:
            raise ValueError(f"invalid attention backward config {self.name}: "
                             + "; ".join(problems))

    @property
    def kv_threads(self):
        return 2 * self.kv_block_n  # 32 lanes per 16 keys

    @property
    def dq_threads(self):
        return 2 * self.dq_block_m


@dataclass(frozen=True)
class BwdVariant:
    """head_dim (a multiple of 8, <= 256), the dtype and causal masking."""

    head_dim: int
    dtype: str  # 'bfloat16' | 'float16'
    causal: bool

    @property
    def padded_dim(self):
        return -(-self.head_dim // 16) * 16


CONFIGS = {
    c.name: c
    for c in (
        BwdConfig("d64", 128, 64, False, False, 128, 64, True),
        BwdConfig("d128", 128, 16, False, False, 128, 32, False),
        BwdConfig("d256", 64, 16, False, True, 64, 16, False),
        BwdConfig("small", 32, 32, False, False, 32, 32, False),  # the emulation's (2 warps)
        # alternatives for python -m numbatc.bench attention-backward --configs (not measured
        # yet): K/V fragments in registers at head_dim <= 64; dK and dV as two launches at 128
        # with 32-query steps (one more S^T product, twice the queries per barrier)
        BwdConfig("d64_kvreg", 128, 32, True, False, 128, 64, True),
        BwdConfig("d128_split", 128, 32, False, True, 128, 32, True),
    )
}

#: the heuristic's configuration by head_dim (the first whose bound it is under)
TILES = ((64, "d64"), (128, "d128"), (256, "d256"))


def shared_bytes(cfg: BwdConfig, var: BwdVariant, kernel: str) -> int:
    """Dynamic shared memory of ``kernel`` ('dkdv' or 'dq'): the block's own two tiles (K and V,
    or Q and dO) and two stages of the two it walks."""
    pitch, _ = sm80_attention.shared_layout(var.padded_dim)
    if kernel == "dkdv":
        return (2 * cfg.kv_block_n + 4 * cfg.kv_tile_m) * pitch * 2
    return (2 * cfg.dq_block_m + 4 * cfg.dq_tile_n) * pitch * 2


def _check_fits(cfg, var, cc):
    lim = gpus.limits(cc)
    for kernel, threads in (("dkdv", cfg.kv_threads), ("dq", cfg.dq_threads)):
        need = shared_bytes(cfg, var, kernel)
        if not gpus.fits(lim, need, threads):
            raise ValueError(
                f"attention backward config {cfg.name} needs {gpus.kb(need)} of shared memory "
                f"per block for its {kernel} kernel at head_dim {var.head_dim}; compute "
                f"capability {lim.name} allows {gpus.kb(lim.shared_per_block)}")


def choose_config(head_dim: int, cc=None) -> BwdConfig:
    """The configuration for ``head_dim`` (``NUMBATC_ATTN_BWD_CONFIG=<name>`` forces one of
    CONFIGS).

    Registers per thread are the limit: dK and dV take head_dim / 2 each per 16 keys, S^T and
    dP^T kv_tile_m / 2 each.  NOTE: ptxas (nvJitLink -Xptxas=-v, sm_80, bf16, causal):
    d64 (head_dim 64): dK/dV 254 registers, dQ 207, no spills (K/V fragments in registers
    instead: 232 at 32-query steps, but 255 + 48 bytes of spills at 64); d128 (head_dim 128):
    dK/dV 251 at 16-query steps (255 + 32 bytes of spills at 32, and 112 non-causal), dQ 197;
    d256: dK 255 + 108 bytes of spills, dV 255 + 28 (sm_90a f16 non-causal: 0 and 8), dQ 255,
    0 spills -- both halves in one launch would need 256 accumulator registers."""
    import os

    forced = os.environ.get("NUMBATC_ATTN_BWD_CONFIG")
    if forced:
        if forced not in CONFIGS:
            raise ValueError(f"NUMBATC_ATTN_BWD_CONFIG={forced!r} is not one of {sorted(CONFIGS)}")
        return CONFIGS[forced]
    for bound, name in TILES:
        if head_dim <= bound:
            return CONFIGS[name]
    raise ValueError(f"attention backward: head_dim {head_dim} is above 256")


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------


def _header(var, what):
    ptx = _PTX_TYPE[var.dtype]
    pack = "nt.pack_bf16x2" if var.dtype == "bfloat16" else "nt.pack_f16x2"
    frag_pack = "nt.frag_pack_bf16x2" if var.dtype == "bfloat16" else "nt.frag_pack_f16x2"
    pitch, swizzled = sm80_attention.shared_layout(var.padded_dim)
    if swizzled:
        soff = "r * %d + ((c ^ (r & 7)) << 3)" % pitch
    else:
        soff = "r * %d + (c << 3)" % pitch
    return f'''"""Generated by numbatc.kernels.sm80_attention_backward: {what}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

from numbatc.kernels.tiles import make_mma_pairs
mma_pair, ldsm_pair, ldsm_pair_t = make_mma_pairs("{ptx}")
frag_pack = {frag_pack}
CP = nt.cp_async_op(16, zfill=True)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
I64 = np.int64  # a constant argument as int64, not a literal: one compile of the loaders


@cuda.jit(device=True, forceinline=True)
def soff(r, c):
    # element offset of 16-byte chunk c of row r: {"128B swizzle" if swizzled else "rows padded to an odd chunk count"}
    return {soff}


@cuda.jit(device=True, forceinline=True)
def pack(lo, hi):
    return {pack}(lo, hi)


@cuda.jit(device=True, forceinline=True)
def store_pair(out, base, v0, v1):
    p = pack(v0, v1)
    out[base] = np.uint16(p & 0xFFFF)
    out[base + 1] = np.uint16(p >> 16)
'''


class _Frags:
    """The per-lane ldmatrix offsets, as the forward's (sm80_attention.kernel_source):

        a   (A, [m][k], the warp's 16 rows):   row wrow + l % 16,            chunk cc + l // 16
        b   (B, [n][k], no transpose):         row (l // 16) * 8 + l % 8,    chunk cc + (l // 8) % 2
        t   (B, [k][n], .trans):               row ((l // 8) % 2) * 8 + l % 8, chunk cc + l // 16

    Every row is l % 8 modulo 8, so with the swizzle the stored chunk of an even cc is
    (cc & ~7) + ((cc & 7) ^ g ^ (l % 8)): four per-lane values per operand."""

    ROWS = {"a": ("wrow + lane % 16", "lane // 16"),
            "b": ("(lane // 16) * 8 + lane % 8", "(lane // 8) % 2"),
            "t": ("((lane // 8) % 2) * 8 + lane % 8", "lane // 16")}

    def __init__(self, var):
        self.pitch, self.swizzled = sm80_attention.shared_layout(var.padded_dim)

    def declare(self, w):
        for op, (lr, g) in self.ROWS.items():
            if self.swizzled:
                w(f"    {op}_row = np.int32(({lr}) * {self.pitch})")
                for e in range(4):
                    w(f"    {op}_sw{e} = np.int32((({2 * e}) ^ ({g}) ^ (lane % 8)) << 3)")
            else:
                w(f"    {op}_row = np.int32(({lr}) * {self.pitch} + ({g}) * 8)")

    def off(self, op, row_const, cc):
        if self.swizzled:
            return (f"{op}_row + {row_const * self.pitch + (cc & ~7) * 8} + "
                    f"{op}_sw{(cc & 7) // 2}")
        return f"{op}_row + {row_const * self.pitch + cc * 8}"


def _pack_a(w, ind, dst, src, c):
    """A fragment ``dst`` of k16 step c from the C fragments src_2c, src_2c+1 (frag_pack: each
    register pair as pack does)."""
    w(f"{ind}{dst}_{c} = frag_pack({src}_{2 * c} + {src}_{2 * c + 1})[0]")


def _mma_rows(w, ind, fr, acc, n8_tiles, ks_steps, a_name, a_base, b_base, a_in_regs):
    """acc_j (j < n8_tiles) = A (16 x 16 ks_steps) B^T: A from registers ``a_name_<ks>`` (or
    ldmatrix at ``a_base``), B from ldmatrix (no transpose) at ``b_base`` (n index = rows)."""
    for j in range(n8_tiles):
        w(f"{ind}{acc}_{j} = (ZERO, ZERO, ZERO, ZERO)")
    for ks in range(ks_steps):
        a = f"{a_name}_{ks}"
        if not a_in_regs:
            w(f"{ind}{a} = nt.ldmatrix_x4(smem, {a_base} + {fr.off('a', 0, 2 * ks)})")
        for j in range(0, n8_tiles, 2):
            c = f"{acc}_{j}, {acc}_{j + 1}"
            w(f"{ind}{c} = ldsm_pair({a}, smem, {b_base} + {fr.off('b', 8 * j, 2 * ks)}, {c})")


def _mma_acc_trans(w, ind, fr, acc, nd, kk, a_name, b_base):
    """acc_d (d < nd n8 tiles of head_dim) += A_c B_c over the k16 steps c < kk: A from
    registers, B by ldmatrix.trans at ``b_base`` (k index = rows)."""
    for c in range(kk):
        for d in range(0, nd, 2):
            o = f"{acc}_{d}, {acc}_{d + 1}"
            w(f"{ind}{o} = ldsm_pair_t({a_name}_{c}, smem, "
              f"{b_base} + {fr.off('t', 16 * c, d)}, {o})")


def _store_rows(w, ind, acc, D, row, lim, base, stride, scale):
    """Store the 16 x D fragment rows ``row`` and ``row`` + 8 (those below ``lim``) at
    ``base + row * stride``, each value times ``scale`` (or as they are)."""
    for d in range(D // 8):
        if scale:
            w(f"{ind}{acc}_{d} = nt.frag_scale_rows({acc}_{d}, {scale}, {scale})")
    for h in range(2):
        w(f"{ind}r = {row} + {8 * h}")
        w(f"{ind}if r < {lim}:")
        w(f"{ind}    ob = {base} + r * {stride} + tq")
        for d in range(D // 8):
            w(f"{ind}    store_pair(out_{acc}, ob + {8 * d}, {acc}_{d}[{2 * h}], "
              f"{acc}_{d}[{2 * h + 1}])")


def preprocess_source(var: BwdVariant) -> str:
    """``preprocess_kernel``: one warp per (batch, head, padded query row) -> D and lse2.  With
    ``has_dlse`` the gradient of the loss through lse (float32 (batch, heads_q, seqlen_q)) is
    taken in: d lse_i / d S_ij = P_ij, so dS = P (dP - D + dlse) and D - dlse is stored."""
    D = var.head_dim
    if var.dtype == "bfloat16":
        to_f32 = "nt.f32_from_bits(np.uint32(np.uint32(x) << 16))"
    else:
        to_f32 = "nt.unpack_f16x2(np.uint32(x))[0]"
    return _header(var, "preprocess") + f'''

@cuda.jit(device=True, forceinline=True)
def f32(x):
    return {to_f32}


@cuda.jit(cache=True)
def preprocess_kernel(out, do, lse, dlse, dd, lse2, Sq, Hq, pad_q, rows, o_sb, o_ss, o_sh,
                      do_sb, do_ss, do_sh, l_sb, l_sh, l_ss, g_sb, g_sh, g_ss, has_dlse):
    # rows = batch * Hq * pad_q; row r is (bh, i) = (r // pad_q, r % pad_q)
    lane = cuda.threadIdx.x % 32
    r = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    if r >= rows:
        return
    bh = r // pad_q
    i = r % pad_q
    b = bh // Hq
    h = bh % Hq
    acc = ZERO
    if i < Sq:
        ob = b * o_sb + i * o_ss + h * o_sh
        db = b * do_sb + i * do_ss + h * do_sh
        for c in range(lane, {D}, 32):
            acc += f32(out[ob + c]) * f32(do[db + c])
    acc += nt.shfl_bfly(acc, 16)
    acc += nt.shfl_bfly(acc, 8)
    acc += nt.shfl_bfly(acc, 4)
    acc += nt.shfl_bfly(acc, 2)
    acc += nt.shfl_bfly(acc, 1)
    if lane == 0:
        if has_dlse != 0 and i < Sq:  # the gradient through lse: dS = P (dP - (D - dlse))
            acc -= dlse[b * g_sb + h * g_sh + i * g_ss]
        dd[r] = acc
        x = np.float32(np.inf)
        if i < Sq:
            m = lse[b * l_sb + h * l_sh + i * l_ss]
            if m != NEG_INF:
                x = m * np.float32({LOG2E!r})
        lse2[r] = x
'''


def dkdv_source(cfg: BwdConfig, var: BwdVariant, part: str = "both") -> str:
    """``dkdv_kernel`` for one configuration and variant; ``part`` 'both', 'dk' or 'dv' (the
    other's accumulators, and for 'dv' dP^T and dS^T, left out)."""
    D, DP = var.head_dim, var.padded_dim
    PE, _ = sm80_attention.shared_layout(DP)
    BN, BM, T = cfg.kv_block_n, cfg.kv_tile_m, cfg.kv_threads
    NJ, KS, ND, KK = BM // 8, DP // 16, DP // 8, BM // 16
    KE, QE = BN * PE, BM * PE  # elements of the K (or V) tile and of one Q (or dO) stage
    Q0, DO0 = 2 * KE, 2 * KE + 2 * QE  # stage 0 of Q and of dO
    want_dk, want_dv = part in ("both", "dk"), part in ("both", "dv")
    fr = _Frags(var)
    lines = [_header(var, f"dK/dV ({part}) {cfg.name}")]
    w = lines.append
    sm80_attention.emit_loader(w, "kv", BN, DP // 8, D // 8, T)
    sm80_attention.emit_loader(w, "qo", BM, DP // 8, D // 8, T)
    w('''

@cuda.jit(device=True, forceinline=True)
def keep_t(x, key, query, off):
    # causal, keys as rows: -inf where key > query + off
    if key > query + off:
        return NEG_INF
    return x


@cuda.jit(device=True, forceinline=True)
def mask_t(s, key, query, off):
    # an m16n8 fragment of S^T: (key, query), (key, query + 1), (key + 8, query), (key + 8, query + 1)
    return (keep_t(s[0], key, query, off), keep_t(s[1], key, query + 1, off),
            keep_t(s[2], key + 8, query, off), keep_t(s[3], key + 8, query + 1, off))
''')
    w(f'''

@cuda.jit(cache=True)
def dkdv_kernel(q, k, v, do, out_dk, out_dv, lse2, dd, Sq, Sk, Hq, group, n_blocks, pad_q,
                q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh,
                dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, scale_log2, scale):
    smem = cuda.shared.array(0, np.uint16, alignment=1024)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    g = lane // 4
    tq = (lane % 4) * 2

    pid = cuda.blockIdx.x
    bh = pid // n_blocks  # (batch, kv head)
    n0 = (pid % n_blocks) * {BN}
    Hk = Hq // group
    b = bh // Hk
    hk = bh % Hk
    off = Sk - Sq  # causal: query i sees keys j <= i + off
    m_tiles = (Sq + {BM - 1}) // {BM}
    m_first = 0''')
    if var.causal:
        w(f'''    lo = n0 - off  # the first query that sees key n0
    if lo > 0:
        m_first = lo // {BM}''')
    w(f'''    cnt = max(m_tiles - m_first, 0)
    iters = group * cnt  # (query head, query tile) steps
    h0 = hk * group
    wrow = warp * 16
    key_base = n0 + wrow + g  # this lane's first key (then + 8)

    # Prologue: this block's K and V, and the first Q / dO tile.
    load_kv(smem, I64(0), k, b * k_sb + hk * k_sh + n0 * k_ss, k_ss, Sk - n0, t)
    load_kv(smem, I64({KE}), v, b * v_sb + hk * v_sh + n0 * v_ss, v_ss, Sk - n0, t)
    if iters > 0:
        m0 = m_first * {BM}
        load_qo(smem, I64({Q0}), q, b * q_sb + h0 * q_sh + m0 * q_ss, q_ss, Sq - m0, t)
        load_qo(smem, I64({DO0}), do, b * do_sb + h0 * do_sh + m0 * do_ss, do_ss, Sq - m0, t)
    nt.cp_async_commit_group()
''')
    fr.declare(w)
    for d in range(ND):
        if want_dk:
            w(f"    dk_{d} = (ZERO, ZERO, ZERO, ZERO)")
        if want_dv:
            w(f"    dv_{d} = (ZERO, ZERO, ZERO, ZERO)")
    w("    nt.cp_async_wait_group(0)\n    cuda.syncthreads()")
    if cfg.kv_in_regs:
        w("    # K (and V) stay in registers: A fragments of the warp's 16 keys.")
        for ks in range(KS):
            w(f"    kf_{ks} = nt.ldmatrix_x4(smem, {fr.off('a', 0, 2 * ks)})")
            if want_dk:
                w(f"    vf_{ks} = nt.ldmatrix_x4(smem, {KE} + {fr.off('a', 0, 2 * ks)})")
    w(f'''
    # Main loop: wait for step it, start loading step it + 1 into the other stage, compute it.
    for it in range(iters):
        nt.cp_async_wait_group(0)
        cuda.syncthreads()  # step it landed; every warp is done with step it - 1's stage
        if it + 1 < iters:
            nh = h0 + (it + 1) // cnt
            nm = (m_first + (it + 1) % cnt) * {BM}
            st = (it + 1) % 2
            load_qo(smem, {Q0} + st * {QE}, q, b * q_sb + nh * q_sh + nm * q_ss, q_ss, Sq - nm, t)
            load_qo(smem, {DO0} + st * {QE}, do, b * do_sb + nh * do_sh + nm * do_ss, do_ss,
                    Sq - nm, t)
        nt.cp_async_commit_group()
        h = h0 + it // cnt
        m0 = (m_first + it % cnt) * {BM}
        qst = np.int32({Q0} + (it % 2) * {QE})
        dost = np.int32({DO0} + (it % 2) * {QE})
        lb = (b * Hq + h) * pad_q + m0 + tq  # lse2 / D of this lane's query columns

        # S^T = K Q^T: (16 keys x {BM} queries) per warp, fp32''')
    _mma_rows(w, "        ", fr, "s", NJ, KS, "kf", "0", "qst", cfg.kv_in_regs)
    if var.causal:
        w("\n        # The causal diagonal (keys past query + off).")
        w("        if m0 + off < n0 + wrow + 15:")
        for j in range(NJ):
            w(f"            s_{j} = mask_t(s_{j}, key_base, m0 + {8 * j} + tq, off)")
    w("\n        # P^T = exp2(S^T * scale * log2(e) - lse2[query]); padding queries: 0")
    for j in range(NJ):
        w(f"        l0 = lse2[lb + {8 * j}]\n        l1 = lse2[lb + {8 * j + 1}]")
        w(f"        p_{j} = nt.frag_exp2_cols(s_{j}, scale_log2, (l0, l1))")
    if want_dv:
        w("        # P^T as A fragments: query tiles 2c and 2c + 1 make the k16 step c.")
        for c in range(KK):
            _pack_a(w, "        ", "pa", "p", c)
        w("\n        # dV += P^T dO")
        _mma_acc_trans(w, "        ", fr, "dv", ND, KK, "pa", "dost")
    if want_dk:
        w("\n        # dP^T = V dO^T")
        _mma_rows(w, "        ", fr, "dp", NJ, KS, "vf", str(KE), "dost", cfg.kv_in_regs)
        w("\n        # dS^T = P^T (dP^T - D[query])")
        for j in range(NJ):
            w(f"        d0 = dd[lb + {8 * j}]\n        d1 = dd[lb + {8 * j + 1}]")
            w(f"        p_{j} = nt.frag_mul_diff_cols(p_{j}, dp_{j}, (d0, d1))")
        for c in range(KK):
            _pack_a(w, "        ", "da", "p", c)
        w("\n        # dK += dS^T Q")
        _mma_acc_trans(w, "        ", fr, "dk", ND, KK, "da", "qst")
    w("\n    nt.cp_async_wait_all()\n\n    # Epilogue: the warp's 16 keys (those below Sk).")
    if want_dk:
        _store_rows(w, "    ", "dk", D, "key_base", "Sk", "b * dk_sb + hk * dk_sh", "dk_ss",
                    "scale")
    if want_dv:
        _store_rows(w, "    ", "dv", D, "key_base", "Sk", "b * dv_sb + hk * dv_sh", "dv_ss", None)
    return "\n".join(lines) + "\n"


def dq_source(cfg: BwdConfig, var: BwdVariant) -> str:
    """``dq_kernel`` for one configuration and variant."""
    D, DP = var.head_dim, var.padded_dim
    PE, _ = sm80_attention.shared_layout(DP)
    BM, BN, T = cfg.dq_block_m, cfg.dq_tile_n, cfg.dq_threads
    NJ, KS, ND, KK = BN // 8, DP // 16, DP // 8, BN // 16
    QE, KE = BM * PE, BN * PE  # elements of the Q (or dO) tile and of one K (or V) stage
    K0, V0 = 2 * QE, 2 * QE + 2 * KE
    fr = _Frags(var)
    lines = [_header(var, f"dQ {cfg.name}"), sm80_attention.row_helpers(
        sm80_attention.AttnVariant(D, var.dtype, var.causal, False))]
    w = lines.append
    sm80_attention.emit_loader(w, "kv", BN, DP // 8, D // 8, T)
    sm80_attention.emit_loader(w, "qo", BM, DP // 8, D // 8, T)
    w('''

@cuda.jit(device=True, forceinline=True)
def mask_tile(s, col, row, Sk, off):
    # an m16n8 fragment: (row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1)
    return (keep(s[0], col, row, Sk, off), keep(s[1], col + 1, row, Sk, off),
            keep(s[2], col, row + 8, Sk, off), keep(s[3], col + 1, row + 8, Sk, off))
''')
    w(f'''

@cuda.jit(cache=True)
def dq_kernel(q, k, v, do, out_dq, lse2, dd, Sq, Sk, Hq, group, m_blocks, pad_q,
              q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh,
              dq_sb, dq_ss, dq_sh, scale_log2, scale):
    smem = cuda.shared.array(0, np.uint16, alignment=1024)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    g = lane // 4
    tq = (lane % 4) * 2

    # Blocks of one (batch, head) are neighbours; the last query blocks (the most keys under a
    # causal mask) start first.
    pid = cuda.blockIdx.x
    bh = pid // m_blocks
    m0 = (m_blocks - 1 - pid % m_blocks) * {BM}
    b = bh // Hq
    h = bh % Hq
    hk = h // group
    off = Sk - Sq
    n_tiles = (Sk + {BN - 1}) // {BN}''')
    if var.causal:
        w(f'''    last = m0 + {BM - 1} + off  # the last key the block's last query sees
    if last < 0:
        n_tiles = 0
    else:
        n_tiles = min(n_tiles, last // {BN} + 1)''')
    w(f'''    k_start = b * k_sb + hk * k_sh
    v_start = b * v_sb + hk * v_sh
    wrow = warp * 16
    row_base = m0 + wrow + g  # this lane's first query row (then + 8)

    # Prologue: Q, dO and the first K/V tile in flight together.
    load_qo(smem, I64(0), q, b * q_sb + h * q_sh + m0 * q_ss, q_ss, Sq - m0, t)
    load_qo(smem, I64({QE}), do, b * do_sb + h * do_sh + m0 * do_ss, do_ss, Sq - m0, t)
    if n_tiles > 0:
        load_kv(smem, I64({K0}), k, k_start, k_ss, Sk, t)
        load_kv(smem, I64({V0}), v, v_start, v_ss, Sk, t)
    nt.cp_async_commit_group()
    lb = bh * pad_q + row_base
    lse_0 = lse2[lb]
    lse_1 = lse2[lb + 8]
    d_0 = dd[lb]
    d_1 = dd[lb + 8]
''')
    fr.declare(w)
    for d in range(ND):
        w(f"    dq_{d} = (ZERO, ZERO, ZERO, ZERO)")
    w("    nt.cp_async_wait_group(0)\n    cuda.syncthreads()")
    if cfg.q_in_regs:
        w("    # Q and dO stay in registers: A fragments of the warp's 16 queries.")
        for ks in range(KS):
            w(f"    qf_{ks} = nt.ldmatrix_x4(smem, {fr.off('a', 0, 2 * ks)})")
            w(f"    of_{ks} = nt.ldmatrix_x4(smem, {QE} + {fr.off('a', 0, 2 * ks)})")
    w(f'''
    # Main loop: wait for tile n, start loading tile n + 1 into the other stage, compute tile n.
    for n in range(n_tiles):
        nt.cp_async_wait_group(0)
        cuda.syncthreads()  # tile n landed; every warp is done with tile n - 1's stage
        if n + 1 < n_tiles:
            nxt = (n + 1) * {BN}
            st = (n + 1) % 2
            load_kv(smem, {K0} + st * {KE}, k, k_start + nxt * k_ss, k_ss, Sk - nxt, t)
            load_kv(smem, {V0} + st * {KE}, v, v_start + nxt * v_ss, v_ss, Sk - nxt, t)
        nt.cp_async_commit_group()
        n0 = n * {BN}
        kst = np.int32({K0} + (n % 2) * {KE})
        vst = np.int32({V0} + (n % 2) * {KE})

        # S = Q K^T: (16 x {BN}) per warp, fp32''')
    _mma_rows(w, "        ", fr, "s", NJ, KS, "qf", "0", "kst", cfg.q_in_regs)
    mask_cond = f"n0 + {BN} > Sk"
    if var.causal:
        mask_cond += f" or n0 + {BN - 1} > m0 + off + wrow"
    w(f"\n        # Masks: the ragged last tile{' and the causal diagonal' if var.causal else ''}.")
    w(f"        if {mask_cond}:")
    for j in range(NJ):
        w(f"            s_{j} = mask_tile(s_{j}, n0 + {8 * j} + tq, row_base, Sk, off)")
    w("\n        # P = exp2(S * scale * log2(e) - lse2[row])")
    for j in range(NJ):  # math.exp2(s * scale_log2 - lse_h) per register
        w(f"        p_{j} = nt.frag_exp2(s_{j}, scale_log2, lse_0, lse_1)")
    w("\n        # dP = dO V^T")
    _mma_rows(w, "        ", fr, "dp", NJ, KS, "of", str(QE), "vst", cfg.q_in_regs)
    w("\n        # dS = P (dP - D[row]), as A fragments")
    for j in range(NJ):
        w(f"        p_{j} = nt.frag_mul_diff_rows(p_{j}, dp_{j}, d_0, d_1)")
    for c in range(KK):
        _pack_a(w, "        ", "da", "p", c)
    w("\n        # dQ += dS K")
    _mma_acc_trans(w, "        ", fr, "dq", ND, KK, "da", "kst")
    w("\n    nt.cp_async_wait_all()\n\n    # Epilogue: scale, store the warp's rows below Sq.")
    _store_rows(w, "    ", "dq", D, "row_base", "Sq", "b * dq_sb + h * dq_sh", "dq_ss", "scale")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


def _parts(cfg):
    return ("dk", "dv") if cfg.split else ("both",)


@functools.cache
def preprocess_kernel(var: BwdVariant):
    """The preprocess (D, lse2; :func:`preprocess_source`), compiled on demand, cached on disk;
    sm90_attention_backward runs it too."""
    return load_generated("sm80_attention_bwd", preprocess_source(var), entry="preprocess_kernel")


@functools.cache
def kernels_for(cfg: BwdConfig, var: BwdVariant):
    """{'pre': preprocess, 'dq': dQ, 'both' | 'dk', 'dv': dK/dV} compiled on demand, cached on
    disk (build.load_generated)."""
    out = {"pre": preprocess_kernel(var),
           "dq": load_generated("sm80_attention_bwd", dq_source(cfg, var), entry="dq_kernel")}
    for part in _parts(cfg):
        out[part] = load_generated("sm80_attention_bwd", dkdv_source(cfg, var, part),
                                   entry="dkdv_kernel")
    return out


@functools.cache
def signatures():
    """The kernels' argument types on the GPU: {'pre', 'dq', 'dkdv'}."""
    from numba import types

    u16, f32p = types.CPointer(types.uint16), types.CPointer(types.float32)
    i64, f32 = types.int64, types.float32
    return {"pre": (u16, u16, f32p, f32p, f32p, f32p) + (i64,) * 17,
            "dq": (u16,) * 5 + (f32p, f32p) + (i64,) * 21 + (f32, f32),
            "dkdv": (u16,) * 6 + (f32p, f32p) + (i64,) * 24 + (f32, f32)}


def precompile_kernels(cfg: BwdConfig, var: BwdVariant):
    """[(kernel, argument types)] a launch of (cfg, var) compiles (numbatc.precompile), the
    longest compile first: dK / dV, dQ, the preprocess (see :func:`compile_first`)."""
    sigs = signatures()
    kernels = kernels_for(cfg, var)
    order = [*_parts(cfg), "dq", "pre"]
    return [(kernels[part], sigs["dkdv" if part in ("both", "dk", "dv") else part])
            for part in order]


@functools.cache
def compile_first(cfg: BwdConfig, var: BwdVariant):
    """Compile (or load from the disk cache) every kernel of (cfg, var) at once, on its first
    launch in this process: intrinsics.launch.compile_kernels, which links each while numba
    types the next (the three kernels' first compile on a 2-core host: 3.2-3.3 s one after
    another, 2.1-2.3 s so)."""
    from intrinsics.launch import compile_kernels

    compile_kernels(precompile_kernels(cfg, var))


def launch_preprocess(var: BwdVariant, out, do, lse, dlse, dd, lse2, batch, seqlen_q, heads_q,
                      strides, stream=0):
    """Launch the preprocess (dd = D - dlse, lse2; padding rows 0 and +inf) over batch * heads_q
    * pad_q rows; arguments as :func:`launch_flat`'s.  Returns pad_q."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel

    pad_q = -(-seqlen_q // PAD_Q) * PAD_Q
    rows = batch * heads_q * pad_q
    if rows:
        s = strides
        has_dlse = dlse is not None
        if not has_dlse:
            dlse = lse  # never read
        launch_kernel(preprocess_kernel(var), -(-rows // 4), 128,
                      (out, do, lse, dlse, dd, lse2, seqlen_q, heads_q, pad_q, rows, *s["out"],
                       *s["do"], *s["lse"], *s.get("dlse", (0, 0, 0)), int(has_dlse)),
                      stream=stream,
                      signature=None if config.ENABLE_CUDASIM else signatures()["pre"])
    return pad_q


def flat_operands(p, keep):
    """(flat, strides, dlse) of AttentionBackwardProblem ``p`` as the kernels take them: q, k,
    v, do (sm80_attention.operand: packed copies where not 16-byte aligned) and out, dq, dk, dv,
    lse, dd, lse2 (device pointers on the GPU, flat arrays in the emulation; ``keep`` holds what
    must live until the launch), their strides ((batch, seq, head); lse / dlse (batch, head,
    seq)), dlse's pointer or None."""
    from numba import config

    from numbatc.interop.views import kernel_view

    emulated = bool(config.ENABLE_CUDASIM)
    flat, strides = {}, {}
    for name in ("q", "k", "v", "do"):
        flat[name], strides[name] = sm80_attention.operand(getattr(p, name), p.stream, keep)
    for name in ("out", "dq", "dk", "dv", "lse", "dd", "lse2"):
        ca = getattr(p, name)
        flat[name] = operands.flat(kernel_view(ca), keep) if emulated else ca.ptr
        if name in ("out", "dq", "dk", "dv"):
            strides[name] = sm80_attention.strides3(ca)
    for name in ("lse", "dlse"):
        ca = getattr(p, name)
        if ca is not None:
            strides[name] = tuple(st if n > 1 else 0 for n, st in zip(ca.shape, ca.strides))
    dlse = None
    if p.dlse is not None:
        dlse = operands.flat(kernel_view(p.dlse), keep) if emulated else p.dlse.ptr
    return flat, strides, dlse


def launch_flat(cfg: BwdConfig, var: BwdVariant, q, k, v, out, do, lse, dlse, dq, dk, dv, dd,
                lse2, batch, seqlen_q, seqlen_k, heads_q, group, strides, scale, stream=0):
    """Launch the three kernels.  q, k, v, out, do (inputs), dq, dk, dv (outputs), lse (float32
    (batch, heads_q, seqlen_q)), dd and lse2 (float32 scratch of batch * heads_q * pad_q
    elements): device pointers on the GPU, 1-d arrays in the emulation; ``dlse`` None or like
    lse (the gradient through lse).  ``strides``: a dict of (batch, seq, head) element strides
    for q, k, v, out, do, dq, dk, dv, and (batch, head, seq) for lse and dlse; q, k, v, do
    16-byte aligned (their starts and strides)."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel

    kernels = kernels_for(cfg, var)
    sigs = None if config.ENABLE_CUDASIM else signatures()
    sig = (lambda name: None) if sigs is None else sigs.__getitem__
    pad_q = launch_preprocess(var, out, do, lse, dlse, dd, lse2, batch, seqlen_q, heads_q,
                              strides, stream)
    s = strides
    scale_log2 = np.float32(scale * LOG2E)
    common = (seqlen_q, seqlen_k, heads_q, group)
    in_strides = (*s["q"], *s["k"], *s["v"], *s["do"])
    heads_kv = heads_q // group
    n_blocks = -(-seqlen_k // cfg.kv_block_n)
    if n_blocks:
        for part in _parts(cfg):
            launch_kernel(kernels[part], n_blocks * batch * heads_kv, cfg.kv_threads,
                          (q, k, v, do, dk, dv, lse2, dd, *common, n_blocks, pad_q, *in_strides,
                           *s["dk"], *s["dv"], scale_log2, np.float32(scale)),
                          shared_bytes=shared_bytes(cfg, var, "dkdv"), stream=stream,
                          signature=sig("dkdv"))
    m_blocks = -(-seqlen_q // cfg.dq_block_m)
    if not m_blocks:
        return  # no query: dK and dV are 0 (stored above), dQ is empty
    launch_kernel(kernels["dq"], m_blocks * batch * heads_q, cfg.dq_threads,
                  (q, k, v, do, dq, lse2, dd, *common, m_blocks, pad_q, *in_strides, *s["dq"],
                   scale_log2, np.float32(scale)),
                  shared_bytes=shared_bytes(cfg, var, "dq"), stream=stream, signature=sig("dq"))


# ---------------------------------------------------------------------------------------------
# The face every kernel module has: from a numbatc.attention_api.AttentionBackwardProblem to a
# configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why these kernels cannot compute backward problem ``p``, or None: they run every problem
    numbatc.attention_backward accepts (bf16 / f16, head_dim a multiple of 8 up to 256)."""
    if p.dtype not in _PTX_TYPE:
        return f"sm80_attention_backward takes bfloat16 or float16, not {p.dtype}"
    if p.head_dim % 8 or not 8 <= p.head_dim <= 256:
        return f"head_dim {p.head_dim} is not a multiple of 8 in 8..256"
    return None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced)."""
    if name is None:
        cfg = choose_config(p.head_dim, p.cc)
    elif name not in CONFIGS:
        raise ValueError(f"no attention backward config {name!r}; choose from {sorted(CONFIGS)}")
    else:
        cfg = CONFIGS[name]
    _check_fits(cfg, compiled(p, cfg)[1], p.cc)
    return cfg


def compiled(p, cfg: BwdConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernels_for's
    arguments)."""
    return cfg, BwdVariant(p.head_dim, p.dtype, p.causal)


def launch(p, cfg: BwdConfig):
    """Launch ``cfg`` for an AttentionBackwardProblem on its stream (q, k, v, dO packed into
    aligned copies where not 16-byte aligned).  NUMBATC_PRINT_CONFIG prints the choice."""
    import os
    import sys

    from numba import config

    _, var = compiled(p, cfg)
    _check_fits(cfg, var, p.cc)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.attention_backward B={p.batch} Sq={p.seqlen_q} Sk={p.seqlen_k} "
              f"Hq={p.heads_q} Hkv={p.heads_kv} D={p.head_dim}{' causal' if p.causal else ''}: "
              f"sm80_attention_backward {cfg.name} {p.dtype}", file=sys.stderr)
    emulated = bool(config.ENABLE_CUDASIM)
    if not emulated:
        compile_first(cfg, var)
    stream = p.stream
    keep = []
    flat, strides, dlse = flat_operands(p, keep)
    launch_flat(cfg, var, flat["q"], flat["k"], flat["v"], flat["out"], flat["do"], flat["lse"],
                dlse, flat["dq"], flat["dk"], flat["dv"], flat["dd"], flat["lse2"], p.batch,
                p.seqlen_q, p.seqlen_k, p.heads_q, p.group, strides, p.scale,
                stream=stream if emulated else p.stream_handle)
