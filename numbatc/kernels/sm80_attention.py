"""The portable attention forward kernel (sm_80 and newer), FlashAttention-2 style: one block
computes BLOCK_M query rows of one (batch, head); each warp owns 16 * ROWS_PER_WARP / 16 of them
and walks the keys in tiles of BLOCK_N, keeping the softmax online in float32 registers.

Per key tile (K and V double-buffered in shared memory by cp.async):

    S = Q K^T          mma.sync m16n8k16; Q from ldmatrix (A), K from ldmatrix (B: K's rows are
                       the n index, its columns the k index, so no transpose)
    mask               ragged last tile (key >= seqlen_k) and causal (key > query + seqlen_k -
                       seqlen_q); only tiles that need it run the masking code
    online softmax     row max over the four lanes of a quad (two shfl.bfly), rescale O and the
                       running sum by exp2(m_old - m_new), P = exp2(S * scale * log2(e) - m)
    O += P V           P stays in registers: the m16n8 C fragments of key columns 8c..8c+7 and
                       8c+8..8c+15 are, packed to bf16/f16 pairs, exactly the m16k16 A fragment of
                       keys 16c'..16c'+15 (lane l holds rows l/4, l/4 + 8 and columns 2(l%4),
                       2(l%4) + 1 in both); V from ldmatrix.trans (B: keys are the k index)

Epilogue: the row sums are reduced over the quad, O is divided by them and stored (rows that see
no key store 0), and the log-sum-exp ``(m + log2(l)) * ln 2`` goes to ``lse`` when asked.

Shared memory, per tile of R rows x DP columns (DP: head_dim rounded up to 16; the extra
columns are zero-filled by cp.async, never copied from the inputs):

    DP * 2 bytes a multiple of 128:  rows of DP*2 bytes, 16-byte chunk c of row r stored at chunk
                                     c ^ (r % 8) (the 128B swizzle on each 128-byte group)
    otherwise:                       rows padded by one 16-byte chunk to an odd chunk count

Either way the eight row addresses of an ldmatrix (eight consecutive rows, one chunk) fall in
eight different 16-byte bank groups.

The kernel is generated Python source per (configuration, variant), cached on disk and compiled
by numba-cuda (``numbatc.kernels.build.load_generated``).  Accumulators are named
variables (``s_<i>_<j>``, ``o_<i>_<d>``) so that they live in registers.
"""

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from numbatc.kernels import gpus, operands
from numbatc.kernels.build import load_generated
from numbatc.kernels.epilogue import QUAD_REDUCTIONS

__all__ = ["AttnConfig", "AttnVariant", "CONFIGS", "TILES", "unsupported", "choose", "compiled",
           "launch", "choose_config", "explain", "kernel_for", "kernel_source", "launch_flat",
           "signature"]

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttnConfig:
    """BLOCK_M query rows per block split over ``warps`` warps (``block_m / warps`` rows each, 16
    or 32), BLOCK_N keys per tile, and whether each warp keeps its Q fragments in registers for
    the whole key loop (else it reloads them from shared memory per tile: large head dims)."""

    name: str
    block_m: int
    block_n: int
    warps: int
    q_in_regs: bool

    def __post_init__(self):
        problems = []
        if self.block_m % self.warps or self.block_m // self.warps not in (16, 32):
            problems.append(f"block_m / warps must be 16 or 32, got {self.block_m}/{self.warps}")
        if self.block_n % 16 or not 16 <= self.block_n <= 128:
            problems.append(f"block_n must be a multiple of 16 in 16..128, got {self.block_n}")
        if problems:
            raise ValueError(f"invalid sm80 attention config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return 32 * self.warps

    @property
    def rows_per_warp(self):
        return self.block_m // self.warps


@dataclass(frozen=True)
class AttnVariant:
    """What a kernel is specialised for besides its tiles: head_dim (a multiple of 8, <= 256),
    the input/output dtype, causal masking, whether the log-sum-exp is stored, ``varlen``:
    packed variable-length sequences (numbatc.attention_varlen), each block reading its
    sequence's rows from the cu_seqlens prefix sums, and the KV-cache forms
    (numbatc.attention_with_kvcache): ``kv_cache``, each sequence's key count from
    cache_seqlens, ``paged`` (with kv_cache), keys read through a block table (see
    :func:`kernel_source`); ``pair_stores``: O's column pairs stored as one 32-bit store each
    (where out starts 4-byte aligned and its strides are even: :func:`pair_stores_fit`);
    ``tma_store``: sm90_attention's TMA configurations (not persistent) write O through shared
    memory and TMA stores where a tensor map describes out (sm90_attention_tma.out_fits)."""

    head_dim: int
    dtype: str  # 'bfloat16' | 'float16'
    causal: bool
    with_lse: bool
    varlen: bool = False
    kv_cache: bool = False
    paged: bool = False
    pair_stores: bool = False
    tma_store: bool = False

    @property
    def padded_dim(self):
        return -(-self.head_dim // 16) * 16


def shared_layout(padded_dim):
    """(row pitch in elements, swizzled?) of a shared tile with ``padded_dim`` columns."""
    chunks = padded_dim // 8
    if chunks % 8 == 0:
        return padded_dim, True
    return (chunks + 1) * 8, False  # chunks is even: one more makes it odd


def shared_bytes(cfg: AttnConfig, var: AttnVariant) -> int:
    pitch, _ = shared_layout(var.padded_dim)
    return (cfg.block_m + 4 * cfg.block_n) * pitch * 2  # Q, then K x 2 stages, V x 2 stages


CONFIGS = {
    c.name: c
    for c in (
        AttnConfig("m128n64_w4_qreg", 128, 64, 4, True),
        AttnConfig("m128n64_w8_qreg", 128, 64, 8, True),
        AttnConfig("m64n64_w4_qreg", 64, 64, 4, True),
        AttnConfig("m64n32_w4_qsmem", 64, 32, 4, False),
        AttnConfig("m64n64_w4_qsmem", 64, 64, 4, False),
        AttnConfig("m128n32_w8_qsmem", 128, 32, 8, False),
        AttnConfig("m128n16_w8_qsmem", 128, 16, 8, False),
        AttnConfig("m64n16_w4_qsmem", 64, 16, 4, False),
    )
}


#: The heuristic's configurations, by head dim, in order of preference: the first whose shared
#: memory (:func:`shared_bytes`, which grows with head_dim) fits one block of the GPU
#: (numbatc.kernels.gpus).  The first of each is the one :func:`choose_config`'s registers
#: note is about, and fits every block of 8.0 / 8.7, 9.0 and 10.x.
#:
#: NOTE: reasoned from the limits, not measured (no GPU with 99 KB per block was at hand):
#: where a block gets 99 KB (8.6, 8.9, 12.x) m128n32_w8_qsmem fits up to head_dim 192 (96 KB)
#: and needs 108-128 KB above it; there m64n32_w4_qsmem takes over (96 KB at 256; the same 16
#: query rows and 32 keys per warp, so the same registers per thread), as FlashAttention-2
#: runs 64 x 64 tiles with 4 warps at head_dim 256 where a block gets less than 128 KB
#: (Dao-AILab/flash-attention, csrc/flash_attn/src/flash_fwd_launch_template.h,
#: run_mha_fwd_hdim256).  head_dim <= 128 fits everywhere (96 KB at 128).
TILES = {
    "head_dim <= 128": ("m128n64_w8_qreg", "m64n64_w4_qreg", "m64n32_w4_qsmem"),
    "head_dim > 128": ("m128n32_w8_qsmem", "m64n32_w4_qsmem", "m128n16_w8_qsmem",
                       "m64n16_w4_qsmem"),
}


def _bytes(cfg: AttnConfig, head_dim):
    """:func:`shared_bytes` of ``cfg`` at ``head_dim`` (the dtype is two bytes either way)."""
    return shared_bytes(cfg, AttnVariant(head_dim, "bfloat16", False, False))


def _occupancy(cfg: AttnConfig, head_dim, lim):
    """Blocks of ``cfg`` per SM at ``head_dim`` on a GPU of limits ``lim`` (0: none fits)."""
    return gpus.blocks_per_sm(lim, _bytes(cfg, head_dim), cfg.threads)


def _check_fits(cfg: AttnConfig, head_dim, cc):
    """A ValueError naming the limit where ``cfg`` cannot launch at ``head_dim`` on a GPU of
    compute capability ``cc``."""
    lim = gpus.limits(cc)
    need = _bytes(cfg, head_dim)
    if not gpus.fits(lim, need, cfg.threads):
        fitting = sorted(n for n, c in CONFIGS.items() if _occupancy(c, head_dim, lim))
        raise ValueError(
            f"sm80 attention config {cfg.name} needs {gpus.kb(need)} of shared memory per block "
            f"at head_dim {head_dim}; compute capability {lim.name} allows "
            f"{gpus.kb(lim.shared_per_block)}: choose from {fitting}")


def _pick(head_dim, cc):
    """(configuration, the reason) that the heuristic takes for ``head_dim`` on a GPU of
    compute capability ``cc``."""
    lim = gpus.limits(cc)
    role = "head_dim <= 128" if head_dim <= 128 else "head_dim > 128"
    fitting = [CONFIGS[n] for n in TILES[role] if _occupancy(CONFIGS[n], head_dim, lim)]
    if not fitting:  # no GPU of numbatc.kernels.gpus' table gets here
        raise ValueError(f"no sm80 attention configuration fits head_dim {head_dim} in the "
                         f"{gpus.kb(lim.shared_per_block)} of shared memory per block of "
                         f"compute capability {lim.name}")
    cfg = fitting[0]
    first = CONFIGS[TILES[role][0]]
    if cfg is first:
        return cfg, role + (": Q in registers" if first.q_in_regs else
                            ": Q read from shared memory")
    return cfg, (f"{role}: {first.name} needs {gpus.kb(_bytes(first, head_dim))} here (reasoned "
                 "from the limits, not measured)")


def choose_config(head_dim: int, cc=None) -> AttnConfig:
    """The configuration for a head dim on a GPU of compute capability ``cc`` (None: the CPU
    emulation's 9.0), the first of :data:`TILES` that fits its shared memory
    (``NUMBATC_ATTN_CONFIG=<name>`` forces one of CONFIGS; a ValueError where it does not fit).

    Registers per thread are the limit: O takes head_dim / 2 per 16 query rows, S block_n / 2,
    Q in registers head_dim / 4.  ptxas -v (sm_80, bf16, causal, with lse): head_dim 64 on
    m128n64_w8_qreg 171 registers, 128 on it 245, no spills; 32 rows per warp (m128n64_w4_qreg)
    spills at 64 already.  head_dim 256 on m128n32_w8_qsmem: 255 registers and about 170 bytes
    of spills (every configuration spills there; NOTE: not the epilogue, the S and P steps or
    the loads: removing each in turn leaves the count at 255)."""
    import os

    forced = os.environ.get("NUMBATC_ATTN_CONFIG")
    if forced:
        if forced not in CONFIGS:
            raise ValueError(f"NUMBATC_ATTN_CONFIG={forced!r} is not one of {sorted(CONFIGS)}")
        try:
            _check_fits(CONFIGS[forced], head_dim, cc)
        except ValueError as exc:
            raise ValueError(f"NUMBATC_ATTN_CONFIG={forced!r}: {exc}") from None
        return CONFIGS[forced]
    return _pick(head_dim, cc)[0]


def explain(p, cfg: AttnConfig):
    """Why ``cfg`` runs attention problem ``p`` (NUMBATC_PRINT_CONFIG's line): its shared
    memory at the problem's head dim, the blocks one SM of its GPU holds, and the heuristic's
    reason (or that it was forced)."""
    lim = gpus.limits(p.cc)
    n = _occupancy(cfg, p.head_dim, lim)
    pick, why = _pick(p.head_dim, p.cc)
    return (f"{cfg.name}: {gpus.kb(_bytes(cfg, p.head_dim))}, {n} block{'' if n == 1 else 's'} "
            f"per SM on cc {lim.name} ({gpus.kb(lim.shared_per_sm)} per SM); "
            + (why if cfg is pick else f"forced (the heuristic's: {pick.name})"))


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def _loader(w, name, rows, chunks, real_chunks, threads):
    """Emit ``load_<name>``: this thread's 16-byte cp.async copies of a (rows x chunks) tile.
    Chunk (r, c) comes from ``src[gbase + r * stride + c * 8]``; rows at or past ``rlim`` and the
    padding chunks (c >= real_chunks) are zero-filled (0 source bytes)."""
    total = rows * chunks
    count = -(-total // threads)
    w(f"""
@cuda.jit(device=True, forceinline=True)
def load_{name}(smem, sbase, src, gbase, stride, rlim, t):
    # {rows} x {chunks} chunks of 16 bytes, {count} per thread""")
    if threads % chunks == 0:
        w(f"    r0 = t // {chunks}\n    c = t % {chunks}")
    for j in range(count):
        ind = "    "
        if threads % chunks == 0:
            w(f"    r = r0 + {j * threads // chunks}")
        else:
            w(f"    i = t + {j * threads}")
            if (j + 1) * threads > total:
                w(f"    if i < {total}:")
                ind = "        "
            w(f"{ind}r = i // {chunks}\n{ind}c = i % {chunks}")
        if threads % chunks == 0 and (j + 1) * threads > total:
            w(f"    if r < {rows}:")
            ind = "        "
        real = "" if real_chunks == chunks else f" and c < {real_chunks}"
        w(f"""{ind}if r < rlim{real}:
{ind}    CP(smem, sbase + soff(r, c), src, gbase + r * stride + c * 8, 16)
{ind}else:
{ind}    CP(smem, sbase + soff(r, c), src, 0, 0)""")


def row_helpers(var) -> str:
    """Source of the softmax row helpers the attention kernels paste: the quad reductions
    (numbatc.kernels.epilogue), ``keep`` (-inf outside the keys a query sees: past Sk, and past
    the bottom-right-aligned diagonal when causal; the backward's) and ``keep_below`` (-inf
    from a column limit on: the forward kernels', see :func:`column_limit`)."""
    return QUAD_REDUCTIONS.lstrip("\n") + f'''

@cuda.jit(device=True, forceinline=True)
def keep(x, col, row, Sk, off):
    # -inf outside the keys this query sees: col < Sk{" and col <= row + off (causal)" if var.causal else ""}
    if col >= Sk{" or col > row + off" if var.causal else ""}:
        return NEG_INF
    return x


@cuda.jit(device=True, forceinline=True)
def keep_below(x, c, lim):
    # -inf from column limit lim on (c, lim: int32)
    if c < lim:
        return x
    return NEG_INF
'''


def column_limit(var, row, n0, tq, limit):
    """Source of FA3's column limit of one row: the thread's columns n0 + tq + c (c a constant
    in [0, ``limit``)) that the row sees are those with c < the result, an int32 (min(Sk, row
    + off + 1) - n0 - tq when causal, Sk - n0 - tq otherwise, clamped to [0, limit] once per
    row; exact, since c lies in [0, limit)).  NOTE: a column compared as a 64-bit value twice per
    S register was about a fifth of the Hopper kernel's instructions at head_dim 64, causal
    (H200 profile, docs/PERFORMANCE.md); with the limit each register costs one 32-bit compare
    and a select."""
    seen = f"min(Sk, {row} + 1 + off)" if var.causal else "Sk"
    return f"np.int32(min(max({seen} - {n0} - {tq}, 0), {limit}))"


def sequence_bounds_source(ind, keys=True):
    """Source (varlen variants of both attention kernels): sequence b's rows q0 .. q0 + Sq - 1
    of q and out and (with ``keys``) k0 .. k0 + Sk - 1 of k and v, the prefix sums clamped to
    the tensors' rows (whatever cu_seqlens holds, no row outside them); with ``keys``, a block
    past its sequence's queries returns (the grid covers max_seqlen_q) -- before any barrier,
    so the whole block leaves together."""
    text = f"""{ind}q0 = min(max(np.int64(cu_q[b]), 0), total_q)
{ind}Sq = min(max(np.int64(cu_q[b + 1]), q0), total_q) - q0"""
    if keys:
        text += f"""
{ind}k0 = min(max(np.int64(cu_k[b]), 0), total_k)
{ind}Sk = min(max(np.int64(cu_k[b + 1]), k0), total_k) - k0
{ind}if m0 >= Sq:
{ind}    return  # a block past its sequence's end"""
    return text


def row_bases(var):
    """Source of the element offset of row 0 of the block's sequence in q, k, v and out (both
    attention kernels): batch entry b's, or a varlen sequence's rows q0 / k0."""
    if var.varlen:
        return {x: f"{r} * {x}_ss" for x, r in (("q", "q0"), ("k", "k0"), ("v", "k0"), ("o", "q0"))}
    return {x: f"b * {x}_sb" for x in "qkvo"}


def varlen_launch(var, varlen, seqlen_q):
    """(the grid's query rows per sequence, the kernel's trailing cu_q / cu_k arguments) for
    both kernels' launch_flat: ``varlen`` is (cu_q, cu_k, max_seqlen_q) for a varlen variant,
    None for the others (a ValueError where the two disagree)."""
    if var.varlen != (varlen is not None):
        raise ValueError(f"launch_flat: a {'varlen' if var.varlen else 'fixed-length'} variant "
                         f"takes varlen={'(cu_q, cu_k, max_seqlen_q)' if var.varlen else 'None'}")
    return (seqlen_q, ()) if varlen is None else (varlen[2], tuple(varlen[:2]))


def store_pair_source(var, pack):
    """Source of both attention kernels' ``store_pair(out, base, v0, v1)``: (v0, v1) packed by
    ``pack`` into out[base], out[base + 1] -- one st.global.b32 with ``var.pair_stores`` (out
    4-byte aligned, its strides even: :func:`pair_stores_fit`), else two 16-bit stores."""
    if var.pair_stores:
        body = f"    nt.st_global_b32(out, base, {pack}(v0, v1))"
    else:
        body = (f"    p = {pack}(v0, v1)\n    out[base] = np.uint16(p & 0xFFFF)\n"
                "    out[base + 1] = np.uint16(p >> 16)")
    return f"@cuda.jit(device=True, forceinline=True)\ndef store_pair(out, base, v0, v1):\n{body}\n"


def store_o_rows(w, ind, D, row, reg):
    """Emit the stores of a 16-row O fragment block's rows row(0) and row(1) (each thread: the
    pairs of columns tq, tq + 1 of every 8-column group; ``reg(h, d, c)`` names the register
    of row h, column group d, column c), skipping rows past Sq.  Both attention kernels."""
    for h in range(2):
        w(f"{ind}row = {row(h)}")
        w(f"{ind}if row < Sq:")
        w(f"{ind}    ob = o_start + row * o_ss + tq")
        for d in range(D // 8):
            w(f"{ind}    store_pair(out, ob + {8 * d}, {reg(h, d, 0)}, {reg(h, d, 1)})")


def kernel_source(cfg: AttnConfig, var: AttnVariant) -> str:
    """Python source of the kernel for one configuration and variant.

    A varlen variant takes (total_q, total_k) where the others take (Sq, Sk), and two more
    arguments, cu_q and cu_k (int32, batch + 1 prefix sums): "batch" b is sequence b, rows
    cu_q[b] .. cu_q[b + 1] - 1 of q and out (the seq stride steps rows; the batch strides are
    not used), rows cu_k[b] .. cu_k[b + 1] - 1 of k and v, and lse is (heads_q, total_q).  The
    grid covers m_blocks (max_seqlen_q's) query blocks per (sequence, head); a block that
    starts past its sequence's end returns at once.  The prefix sums are clamped to
    [0, total] and made non-decreasing in the kernel, so that whatever they hold no block reads
    or writes a row outside q, k, v, out or lse (numbatc.attention_varlen checks the values,
    except under CUDA graph capture).

    A KV-cache variant takes Sk_cap (the cache's capacity: seqlen_cache, or the block table's
    pages times page_size) where the others take Sk, and five more arguments, ``seqlens, bt,
    bt_sb, page_size, pages``: batch entry b has ``min(max(seqlens[b], 0), Sk_cap)`` keys (no
    read past the cache whatever seqlens holds), causal aligned to its bottom right.  A paged
    one reads key j of sequence b at page ``bt[b * bt_sb + j // page_size]`` (clamped to 0 ..
    pages - 1), row j % page_size, k's and v's batch strides stepping pages
    (numbatc.kernels.tiles.make_paged_kv_loader: one lookup per 16-row group of a tile, K and
    V together)."""
    D, DP = var.head_dim, var.padded_dim
    PE, swizzled = shared_layout(DP)
    BM, BN, T = cfg.block_m, cfg.block_n, cfg.threads
    MI = cfg.rows_per_warp // 16  # m16 tiles per warp
    NJ = BN // 8  # n8 tiles of S per m16 tile
    KS = DP // 16  # k16 steps of Q K^T
    ND = DP // 8  # n8 tiles of O per m16 tile
    KK = BN // 16  # k16 steps of P V
    QE, KE = BM * PE, BN * PE  # elements of the Q tile and of one K (or V) stage
    ptx = _PTX_TYPE[var.dtype]
    pack = "nt.pack_bf16x2" if var.dtype == "bfloat16" else "nt.pack_f16x2"
    frag_pack = "nt.frag_pack_bf16x2" if var.dtype == "bfloat16" else "nt.frag_pack_f16x2"
    lines = []
    w = lines.append

    row_helpers_src = row_helpers(var)
    if swizzled:
        soff = "r * %d + ((c ^ (r & 7)) << 3)" % PE
    else:
        soff = "r * %d + (c << 3)" % PE
    w(f'''"""Generated by numbatc.kernels.sm80_attention for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

from numbatc.kernels.tiles import make_mma_pairs
mma_pair, ldsm_pair, ldsm_pair_t = make_mma_pairs("{ptx}")
CP = nt.cp_async_op(16, zfill=True)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
LN2 = np.float32({math.log(2.0)!r})


@cuda.jit(device=True, forceinline=True)
def soff(r, c):
    # element offset of 16-byte chunk c of row r: {"128B swizzle" if swizzled else "rows padded to an odd chunk count"}
    return {soff}


{row_helpers_src}

@cuda.jit(device=True, forceinline=True)
def mask_tile(s, c, lim_a, lim_b):
    # an m16n8 fragment, columns c and c + 1 of the thread's (int32) of rows with limits lim_a
    # (row g) and lim_b (row g + 8): column_limit
    return (keep_below(s[0], c, lim_a), keep_below(s[1], c + np.int32(1), lim_a),
            keep_below(s[2], c, lim_b), keep_below(s[3], c + np.int32(1), lim_b))


{store_pair_source(var, pack)}''')
    _loader(w, "kv", BN, DP // 8, D // 8, T)
    _loader(w, "q", BM, DP // 8, D // 8, T)
    if var.paged:
        w(f"""
from numbatc.kernels.tiles import make_paged_kv_loader  # noqa: E402
load_kv_paged = make_paged_kv_loader({BN}, {PE}, {swizzled}, {DP // 8}, {D // 8}, {T})""")

    # --- per-lane ldmatrix offsets ---------------------------------------------------------------
    # Lane l names row lr(l) and chunk cc + g(l) of its matrix (cc even, a compile-time constant):
    #   Q (A, [m][k]):        lr = l % 16,                      g = l // 16
    #   K (B, [n][k]):        lr = (l // 16) * 8 + l % 8,       g = (l // 8) % 2
    #   V (B, [k][n], .trans): lr = ((l // 8) % 2) * 8 + l % 8,  g = l // 16
    # Every lr is l % 8 modulo 8, so with the swizzle the stored chunk is (cc + g) ^ (l % 8) =
    # (cc & ~7) + ((cc & 7) ^ g ^ (l % 8)): four per-lane values (cc & 7 in 0, 2, 4, 6) per
    # operand, the rest compile-time constants.
    def lane_vars(op, lr, g):
        if swizzled:
            w(f"    {op}_row = np.int32(({lr}) * {PE})")
            for e in range(4):
                w(f"    {op}_sw{e} = np.int32(((({2 * e}) ^ ({g}) ^ (lane % 8))) << 3)")
        else:
            w(f"    {op}_row = np.int32(({lr}) * {PE} + ({g}) * 8)")

    def off(op, row_const, cc):
        if swizzled:
            return f"{op}_row + {row_const * PE + (cc & ~7) * 8} + {op}_sw{(cc & 7) // 2}"
        return f"{op}_row + {row_const * PE + cc * 8}"

    # --- the kernel ------------------------------------------------------------------------------
    # q, k, v, out: flat (element (b, s, h, d) at b * sb + s * ss + h * sh + d); lse: (B, Hq, Sq).
    # varlen: element (row, h, d) at row * ss + h * sh + d; lse: (Hq, total_q).
    sizes = "total_q, total_k" if var.varlen else "Sq, Sk_cap" if var.kv_cache else "Sq, Sk"
    extra = (", cu_q, cu_k" if var.varlen else
             ", seqlens, bt, bt_sb, page_size, pages" if var.kv_cache else "")
    w(f'''

@cuda.jit(cache=True)
def attention_kernel(q, k, v, out, lse, {sizes}, Hq, group, m_blocks, q_sb, q_ss, q_sh, k_sb,
                     k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh, scale_log2{extra}):
    smem = cuda.shared.array(0, np.uint16, alignment=1024)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    g = lane // 4
    tq = (lane % 4) * 2

    # Blocks of one (batch, head) are neighbours (they share K and V in L2); the last query
    # blocks, which see the most keys under a causal mask, start first.
    pid = cuda.blockIdx.x
    bh = pid // m_blocks
    m0 = (m_blocks - 1 - pid % m_blocks) * {BM}
    b = bh // Hq
    h = bh % Hq
    hk = h // group''')
    if var.varlen:
        w(sequence_bounds_source("    "))
    if var.kv_cache:
        w("    Sk = min(max(np.int64(seqlens[b]), 0), Sk_cap)  # this sequence's keys, clamped")
    row0 = row_bases(var)  # the element offsets of row 0 of this block's sequence
    w(f'''    off = Sk - Sq  # causal: query i sees keys j <= i + off
    n_tiles = (Sk + {BN - 1}) // {BN}''')
    if var.causal:
        w(f'''    last = m0 + {BM - 1} + off  # the last key the block's last query sees
    if last < 0:
        n_tiles = 0
    else:
        n_tiles = min(n_tiles, last // {BN} + 1)''')

    def load_tile(ks, vs, key0, kg, vg, ind="        "):
        """Source of one K and V tile's loads: keys key0 .. (kg, vg: their first rows)."""
        if var.paged:
            return (f"load_kv_paged(smem, {ks}, {vs}, k, v, hk * k_sh, hk * v_sh, {key0}, "
                    f"Sk - {key0}, t, bt, b * bt_sb, page_size, pages, k_sb, k_ss, v_sb, v_ss)")
        rlim = "Sk" if key0 == "0" else f"Sk - {key0}"
        return (f"load_kv(smem, {ks}, k, {kg}, k_ss, {rlim}, t)\n"
                f"{ind}load_kv(smem, {vs}, v, {vg}, v_ss, {rlim}, t)")

    w(f'''    k_start = {row0["k"]} + hk * k_sh
    v_start = {row0["v"]} + hk * v_sh
    wrow = warp * {16 * MI}
    row_base = m0 + wrow + g  # this lane's first query row (then + 8, + 16, + 24)

    # Prologue: Q and the first K/V tile in flight together.
    load_q(smem, 0, q, {row0["q"]} + h * q_sh + m0 * q_ss, q_ss, Sq - m0, t)
    if n_tiles > 0:
        {load_tile(QE, QE + 2 * KE, "0", "k_start", "v_start")}
    nt.cp_async_commit_group()
''')
    lane_vars("qa", "wrow + lane % 16", "lane // 16")
    lane_vars("kb", "(lane // 16) * 8 + lane % 8", "(lane // 8) % 2")
    lane_vars("vb", "((lane // 8) % 2) * 8 + lane % 8", "lane // 16")
    for i in range(MI):
        for h in range(2):
            w(f"    m_{i}_{h} = NEG_INF\n    l_{i}_{h} = ZERO")
        for d in range(ND):
            w(f"    o_{i}_{d} = (ZERO, ZERO, ZERO, ZERO)")
    w("    nt.cp_async_wait_group(0)\n    cuda.syncthreads()")
    if cfg.q_in_regs:
        w("    # Q stays in registers: A fragments of each m16 tile and k16 step.")
        for i in range(MI):
            for ks in range(KS):
                w(f"    qf_{i}_{ks} = nt.ldmatrix_x4(smem, {off('qa', 16 * i, 2 * ks)})")

    w(f'''
    # Main loop: wait for tile n, start loading tile n + 1 into the other stage, compute tile n.
    for n in range(n_tiles):
        nt.cp_async_wait_group(0)
        cuda.syncthreads()  # tile n landed; every warp is done with tile n - 1's stage
        if n + 1 < n_tiles:
            nxt = (n + 1) * {BN}
            st = (n + 1) % 2
            {load_tile(f"{QE} + st * {KE}", f"{QE + 2 * KE} + st * {KE}", "nxt",
                       "k_start + nxt * k_ss", "v_start + nxt * v_ss", "            ")}
        nt.cp_async_commit_group()
        n0 = n * {BN}
        kst = np.int32({QE} + (n % 2) * {KE})
        vst = np.int32({QE + 2 * KE} + (n % 2) * {KE})

        # S = Q K^T: (16 x BLOCK_N) per m16 tile, fp32''')
    for i in range(MI):
        for j in range(NJ):
            w(f"        s_{i}_{j} = (ZERO, ZERO, ZERO, ZERO)")
    for ks in range(KS):
        if not cfg.q_in_regs:
            for i in range(MI):
                w(f"        qf_{i}_{ks} = nt.ldmatrix_x4(smem, {off('qa', 16 * i, 2 * ks)})")
        for j in range(0, NJ, 2):
            # (one ldmatrix for the MI row tiles' products; pairs: tiles.make_mma_pairs)
            addr = f"kst + {off('kb', 8 * j, 2 * ks)}"
            if MI > 1:
                w(f"        fb = nt.ldmatrix_x4(smem, {addr})")
            for i in range(MI):
                c = f"s_{i}_{j}, s_{i}_{j + 1}"
                src = f"fb, {c}" if MI > 1 else f"smem, {addr}, {c}"
                w(f"        {c} = {'mma_pair' if MI > 1 else 'ldsm_pair'}(qf_{i}_{ks}, {src})")

    mask_cond = f"n0 + {BN} > Sk"
    if var.causal:
        mask_cond += f" or n0 + {BN - 1} > m0 + off + wrow"
    w(f"\n        # Masks: the ragged last tile{' and the causal diagonal' if var.causal else ''}.")
    w(f"        if {mask_cond}:")
    for i in range(MI):
        for h in range(2):
            w(f"            lim_{i}_{h} = "
              + column_limit(var, f"(row_base + {16 * i + 8 * h})", "n0", "tq", BN))
    for i in range(MI):
        for j in range(NJ):
            w(f"            s_{i}_{j} = mask_tile(s_{i}_{j}, np.int32({8 * j}), lim_{i}_0, lim_{i}_1)")

    w("\n        # Online softmax (log2 domain): rows g and g + 8 of each m16 tile.")
    for i in range(MI):
        for h in range(2):
            e0, e1 = 2 * h, 2 * h + 1
            terms = [f"s_{i}_{j}[{e}]" for j in range(NJ) for e in (e0, e1)]
            expr = terms[0]
            for term in terms[1:]:
                expr = f"max({expr}, {term})"
            w(f"        mx = quad_max({expr}) * scale_log2")
            w(f"        m_new = max(m_{i}_{h}, mx)")
            w(f"        base_{h} = m_new if m_new != NEG_INF else ZERO  # a row with no key yet")
            w(f"        alpha_{h} = math.exp2(m_{i}_{h} - base_{h})")
            w(f"        m_{i}_{h} = m_new")
        for j in range(NJ):  # math.exp2(s * scale_log2 - base_h) per register
            w(f"        p_{j} = nt.frag_exp2(s_{i}_{j}, scale_log2, base_0, base_1)")
        for h in range(2):
            e0, e1 = 2 * h, 2 * h + 1
            total = " + ".join(f"p_{j}[{e0}] + p_{j}[{e1}]" for j in range(NJ))
            w(f"        l_{i}_{h} = l_{i}_{h} * alpha_{h} + ({total})")
        for d in range(ND):
            w(f"        o_{i}_{d} = nt.frag_scale_rows(o_{i}_{d}, alpha_0, alpha_1)")
        w("        # P as A fragments: key tiles 2c and 2c + 1 make the k16 step c.")
        for c in range(KK):  # each register pair as {pack} does
            w(f"        pa_{i}_{c} = {frag_pack}(p_{2 * c} + p_{2 * c + 1})[0]")

    w("\n        # O += P V")
    for c in range(KK):
        for d in range(0, ND, 2):
            addr = f"vst + {off('vb', 16 * c, d)}"
            if MI > 1:
                w(f"        fb = nt.ldmatrix_x4_trans(smem, {addr})")
            for i in range(MI):
                o = f"o_{i}_{d}, o_{i}_{d + 1}"
                src = f"fb, {o}" if MI > 1 else f"smem, {addr}, {o}"
                w(f"        {o} = {'mma_pair' if MI > 1 else 'ldsm_pair_t'}(pa_{i}_{c}, {src})")

    w(f'''
    nt.cp_async_wait_all()

    # Epilogue: O / l per row (0 for a row that saw no key), stored as {var.dtype}.
    o_start = {row0["o"]} + h * o_sh''')
    for i in range(MI):
        for h in range(2):
            w(f"    l = quad_sum(l_{i}_{h})")
            w(f"    inv_{h} = np.float32(1) / l if l > ZERO else ZERO")
            if var.with_lse:
                w(f"    row = row_base + {16 * i + 8 * h}")
                w("    if tq == 0 and row < Sq:")
                at = "h * total_q + q0 + row" if var.varlen else "bh * Sq + row"
                w(f"        lse[{at}] = (m_{i}_{h} + math.log2(l)) * LN2 if l > ZERO else NEG_INF")
        # NOTE: scaled in place before any store: computing the scaled values as store
        # arguments let LLVM hoist them all above the row checks, doubling O's registers
        # (spills at head_dim 256).
        for d in range(D // 8):
            w(f"    o_{i}_{d} = (o_{i}_{d}[0] * inv_0, o_{i}_{d}[1] * inv_0, "
              f"o_{i}_{d}[2] * inv_1, o_{i}_{d}[3] * inv_1)")
        store_o_rows(w, "    ", D, lambda h: f"row_base + {16 * i + 8 * h}",
                     lambda h, d, c: f"o_{i}_{d}[{2 * h + c}]")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


@functools.cache
def kernel_for(cfg: AttnConfig, var: AttnVariant):
    """The compiled-on-demand kernel for (cfg, var), cached on disk (build.load_generated)."""
    return load_generated("sm80_attention", kernel_source(cfg, var), entry="attention_kernel")


@functools.cache
def signature(var: AttnVariant):
    """The kernel's argument types on the GPU: typed device pointers, int64 sizes and strides."""
    from numba import types

    u16 = types.CPointer(types.uint16)
    cu = (types.CPointer(types.int32),) * 2 if var.varlen else ()  # cu_q, cu_k
    if var.kv_cache:  # seqlens, bt, bt_sb, page_size, pages
        cu = (types.CPointer(types.int32),) * 2 + (types.int64,) * 3
    return ((u16, u16, u16, u16, types.CPointer(types.float32)) + (types.int64,) * 17
            + (types.float32,) + cu)


def grid_for(cfg: AttnConfig, batch, heads_q, seqlen_q):
    return (-(-seqlen_q // cfg.block_m)) * heads_q * batch


def launch_flat(cfg: AttnConfig, var: AttnVariant, q, k, v, out, lse, batch, seqlen_q, seqlen_k,
                heads_q, group, q_strides, k_strides, v_strides, o_strides, scale, stream=0,
                varlen=None, kv=None):
    """Launch the kernel.  q, k, v, out, lse are flat: device pointers (ints) on the GPU, 1-d
    arrays in the emulation; strides are (batch, seq, head) in elements, 16-byte multiples for
    q, k, v (and their starts 16-byte aligned).  ``lse`` is (batch, heads_q, seqlen_q) float32,
    written only for variants with_lse.

    A varlen variant takes ``varlen=(cu_q, cu_k, max_seqlen_q)`` (flat int32 operands, the grid's
    query rows per sequence); ``batch`` is then the number of sequences, ``seqlen_q`` and
    ``seqlen_k`` the rows of q and k (total_q, total_k), the batch strides are unused and lse
    is (heads_q, total_q).

    A KV-cache variant takes ``kv``, :func:`kv_arguments`' (seqlens, block table, its row
    stride, page_size, pages); ``seqlen_k`` is then the cache's capacity."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel

    if var.kv_cache != (kv is not None):
        raise ValueError(f"launch_flat: a {'KV-cache' if var.kv_cache else 'fixed-length'} "
                         f"variant takes kv={'(...)' if var.kv_cache else 'None'}")
    rows, cu = varlen_launch(var, varlen, seqlen_q)
    kernel = kernel_for(cfg, var)
    m_blocks = -(-rows // cfg.block_m)
    args = (q, k, v, out, lse, seqlen_q, seqlen_k, heads_q, group, m_blocks, *q_strides,
            *k_strides, *v_strides, *o_strides, np.float32(scale * LOG2E), *cu)
    if kv is not None:
        args += tuple(kv)
    sig = None if config.ENABLE_CUDASIM else signature(var)
    launch_kernel(kernel, grid_for(cfg, batch, heads_q, rows), cfg.threads, args,
                  shared_bytes=shared_bytes(cfg, var), stream=stream, signature=sig)


# ---------------------------------------------------------------------------------------------
# From a numbatc.attention problem to a launch
# ---------------------------------------------------------------------------------------------


def _stepped(shape, strides):
    """(batch, seq, head) strides of a (batch, seq, head, dim) or varlen (rows, head, dim)
    array (batch stride 0); 0 for a dimension of extent 1 (never stepped)."""
    pairs = list(zip(shape, strides))[:-1]
    if len(pairs) == 2:
        pairs.insert(0, (1, 0))
    return tuple(s if n > 1 else 0 for n, s in pairs)


def _strides3(ca):
    """(batch, seq, head) strides in elements (:func:`_stepped`)."""
    return _stepped(ca.shape, ca.strides)


def pair_stores_fit(ca):
    """True when every (even, odd) column pair of the 16-bit array ``ca`` (batch, seq, head,
    dim) starts 4-byte aligned: the start and every stepped stride even (head_dim is a multiple
    of 8), so that one st.global.b32 stores a pair."""
    return ca.ptr % 4 == 0 and all(s % 2 == 0 for s in _strides3(ca))


def _aligned(ca):
    """True when every 16-byte chunk of a row (8 elements from a multiple of 8) is 16-byte
    aligned: the start and every stepped stride."""
    return ca.ptr % 16 == 0 and all(s % 8 == 0 for s in _strides3(ca))


def _copy_kernel():
    from numba import cuda

    @cuda.jit
    def copy4(src, dst):
        """dst[b, s, h, d] = src[b, s, h, d], one thread per element (grid-stride)."""
        B, S, H, D = src.shape
        i = cuda.grid(1)
        while i < B * S * H * D:
            d = i % D
            h = (i // D) % H
            s = (i // (D * H)) % S
            b = i // (D * H * S)
            dst[b, s, h, d] = src[b, s, h, d]
            i += cuda.gridsize(1)

    return copy4


_COPY = []


def _operand(ca, stream, keep):
    """(flat operand, (batch, seq, head) strides) of q, k or v: its own memory when 16-byte
    aligned, else a packed contiguous copy (one pass over it; the kernel then needs no narrow
    copy path, as in sm80_gemm)."""
    from numba import config, cuda

    from numbatc.interop.views import kernel_view

    emulated = bool(config.ENABLE_CUDASIM)
    if _aligned(ca) and not emulated:
        return ca.ptr, _strides3(ca)
    if ca.ndim == 3 and not emulated:  # varlen (rows, head, dim): copy4 takes 4-d views
        ca = dataclasses.replace(ca, shape=(1, *ca.shape), strides=(0, *ca.strides))
    view = kernel_view(ca)
    if not _aligned(ca):
        if emulated:
            view = cuda.to_device(np.ascontiguousarray(view._ary))
        else:
            from numbatc._capture import refuse_if_capturing

            refuse_if_capturing(stream, "pack q, k or v (not 16-byte aligned) into a temporary "
                                "copy", "make their starts and strides 16-byte aligned")
            if not _COPY:
                _COPY.append(_copy_kernel())
            packed = cuda.device_array(view.shape, dtype=view.dtype, stream=stream)
            _COPY[0][min(-(-view.size // 256), 65535), 256, stream](view, packed)
            view = packed
    strides = _stepped(view.shape, [s // view.dtype.itemsize for s in view.strides])
    return operands.flat(view, keep), strides


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (see numbatc.kernels.dispatch): from a
# numbatc.attention_api.AttentionProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute attention problem ``p``, or None: it runs every problem
    numbatc.attention accepts (bf16 / f16, head_dim a multiple of 8 up to 256, any strides with
    a contiguous head_dim)."""
    if p.dtype not in _PTX_TYPE:
        return f"sm80_attention takes bfloat16 or float16, not {p.dtype}"
    if p.head_dim % 8 or not 8 <= p.head_dim <= 256:
        return f"head_dim {p.head_dim} is not a multiple of 8 in 8..256"
    return None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced, a ValueError
    where it does not fit the problem's GPU; else :func:`choose_config`'s for its head dim and
    GPU)."""
    if name is None:
        return choose_config(p.head_dim, p.cc)
    if name not in CONFIGS:
        raise ValueError(f"no sm80 attention config {name!r}; choose from {sorted(CONFIGS)}")
    _check_fits(CONFIGS[name], p.head_dim, p.cc)
    return CONFIGS[name]


def compiled(p, cfg: AttnConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments)."""
    return cfg, AttnVariant(p.head_dim, p.dtype, p.causal, p.lse is not None, p.varlen,
                            p.kv_cache, p.paged, pair_stores=pair_stores_fit(p.out))


def launch(p, cfg: AttnConfig):
    """Launch ``cfg`` for a :class:`numbatc.attention_api.AttentionProblem` on its stream (batch,
    seqlen_q, heads_q >= 1; seqlen_k may be 0: every row then stores 0); q, k and v packed
    where not 16-byte aligned.  A ValueError, before any launch, where ``cfg`` does not fit the
    problem's GPU; NUMBATC_PRINT_CONFIG prints the choice and :func:`explain`'s line.  Returns
    the warm calls' pointer relaunch (:func:`pointer_relaunch`) or None."""
    import os
    import sys

    _, var = compiled(p, cfg)
    _check_fits(cfg, p.head_dim, p.cc)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        packed = [n for n, ca in (("q", p.q), ("k", p.k), ("v", p.v)) if not _aligned(ca)]
        shape = (f"varlen sequences={p.batch} max_seqlen_q={p.seqlen_q} max_seqlen_k="
                 f"{p.seqlen_k}" if p.varlen else f"B={p.batch} Sq={p.seqlen_q} Sk={p.seqlen_k}")
        if p.kv_cache:
            shape += (f" (KV cache{', paged: page_size ' + str(p.page_size) if p.paged else ''}"
                      f"; Sk the capacity, lengths from cache_seqlens)")
        print(f"numbatc.attention {shape} Hq={p.heads_q} "
              f"Hkv={p.heads_kv} D={p.head_dim}{' causal' if p.causal else ''}: sm80_attention "
              f"{cfg.name} {p.dtype}{' +lse' if var.with_lse else ''}"
              f"{' (packed, not 16-byte aligned: ' + ', '.join(packed) + ')' if packed else ''}",
              file=sys.stderr)
        print(f"numbatc.attention: sm80_attention {explain(p, cfg)}", file=sys.stderr)
    keep = []
    args, stream = kernel_arguments(p, keep)
    launch_flat(cfg, var, *args, stream=stream, varlen=varlen_arguments(p, keep),
                kv=kv_arguments(p, keep))
    if keep or os.environ.get("NUMBATC_PRINT_CONFIG"):
        return None  # q, k or v packed (a later call decides again), or no warm calls
    return pointer_relaunch(kernel_for(cfg, var), grid_for(cfg, p.batch, p.heads_q, p.seqlen_q),
                            cfg.threads, signature(var), shared_bytes(cfg, var), args,
                            cfg.block_m, out_align=4 if var.pair_stores else 1, problem=p)


def pointer_relaunch(kernel, grid, threads, sig, shared, args, block_m, out_align=1,
                     problem=None):
    """The warm calls' launch of ``kernel`` (sm80_attention's or sm90_attention's cp.async
    kernel: both take launch_flat's arguments) for problems like the one whose launch ``args``
    (:func:`kernel_arguments`', on the GPU, nothing packed) are given: ``fn(q, k, v, out, lse,
    scale, stream_handle, cu=(), kv=())`` with device pointers (lse 0 without it), one
    cuLaunchKernel through a parameter buffer made here (intrinsics.launch.prepare); True when
    launched, False where these pointers need the checked path (a start of q, k or v that is
    not 16-byte aligned: it packs a copy; an out not ``out_align``-byte aligned, which a kernel
    of pair stores needs).  ``problem``: the AttentionProblem of ``args``; a varlen one's
    relaunch takes its prefix sums' pointers ``cu=(cu_q, cu_k)``, a KV-cache one's
    ``kv=(cache_seqlens, block_table)`` (cache_seqlens twice for a contiguous cache; the block
    table's row stride, page_size and pages stay the problem's).  None where no prepared launch
    can be made (the emulation)."""
    from numba import config

    from intrinsics.launch import prepare

    if config.ENABLE_CUDASIM:
        return None
    _q, _k, _v, _out, _lse, _batch, sq, sk, hq, group, q_st, k_st, v_st, o_st, _scale = args
    prepared = prepare(kernel, grid, threads, sig, shared_bytes=shared)
    if prepared is None:
        return None
    varlen = problem is not None and problem.varlen
    kv_cache = problem is not None and problem.kv_cache
    rows = problem.seqlen_q if varlen else sq  # a varlen grid covers max_seqlen_q rows
    sizes = (sq, sk, hq, group, -(-rows // block_m), *q_st, *k_st, *v_st, *o_st)
    kv_fixed = kv_sizes(problem) if problem is not None else ()
    n_cu, n_kv = 2 * varlen, 2 * kv_cache

    out_mask = out_align - 1

    def relaunch(q, k, v, out, lse, scale, stream, cu=(), kv=()):
        if (q | k | v) & 15 or out & out_mask or len(cu) != n_cu or len(kv) != n_kv:
            return False
        prepared(stream, q, k, v, out, lse, *sizes, scale * LOG2E, *cu, *kv, *kv_fixed)
        return True

    return relaunch


def kernel_arguments(p, keep):
    """(the launch arguments after cfg and var, the stream to launch on) for an
    AttentionProblem, as both attention kernels take them: q, k, v (packed copies where not
    16-byte aligned, see _operand), out, lse (0 / a dummy without it), the sizes, the strides
    and the scale; device pointers on the GPU, flat arrays in the emulation.  ``keep`` holds
    temporaries alive until the launch is queued."""
    from numba import config

    from numbatc.interop.views import kernel_view

    emulated = bool(config.ENABLE_CUDASIM)
    stream = p.stream
    q, q_st = _operand(p.q, stream, keep)
    k, k_st = _operand(p.k, stream, keep)
    v, v_st = _operand(p.v, stream, keep)
    if emulated:
        out = operands.flat(kernel_view(p.out), keep)
        lse = (operands.flat(kernel_view(p.lse), keep) if p.lse is not None
               else np.zeros(1, np.float32))
    else:
        out = p.out.ptr
        lse = p.lse.ptr if p.lse is not None else 0
    sizes = ((p.q.shape[0], p.k.shape[0]) if p.varlen  # total_q, total_k (launch_flat)
             else (p.seqlen_q, p.seqlen_k))
    args = (q, k, v, out, lse, p.batch, *sizes, p.heads_q, p.group,
            q_st, k_st, v_st, _strides3(p.out), p.scale)
    return args, stream if emulated else p.stream_handle


def varlen_arguments(p, keep):
    """launch_flat's ``varlen`` for an AttentionProblem: (cu_q, cu_k, max_seqlen_q) with the
    prefix sums flat (device pointers on the GPU, 1-d arrays in the emulation), or None for a
    fixed-length problem."""
    if not p.varlen:
        return None
    return (operands.flat_array(p.cu_seqlens_q, keep), operands.flat_array(p.cu_seqlens_k, keep),
            p.seqlen_q)


def kv_arguments(p, keep):
    """launch_flat's ``kv`` for an AttentionProblem of numbatc.attention_with_kvcache: (seqlens,
    block table, its row stride in elements, page_size, pages) with the int32 arrays flat
    (device pointers on the GPU, 1-d arrays in the emulation; cache_seqlens stands in for the
    block table of an unpaged cache, page_size and pages 0 there), or None for other problems."""
    if not p.kv_cache:
        return None
    seqlens = operands.flat_array(p.cache_seqlens, keep)
    table = operands.flat_array(p.block_table, keep) if p.paged else seqlens
    return (seqlens, table, *kv_sizes(p))


def kv_sizes(p):
    """The sizes that end :func:`kv_arguments`' tuple -- the block table's row stride in
    elements, page_size, pages (zeros for an unpaged cache) -- or () for other problems; the
    warm calls' pointer relaunches keep them from the checked launch."""
    if not p.kv_cache:
        return ()
    if not p.paged:
        return (0, 0, 0)
    bt = p.block_table
    return (bt.strides[0] if bt.shape[0] > 1 else 0, p.page_size, p.k.shape[0])


# ---------------------------------------------------------------------------------------------
# The pieces numbatc.kernels.sm80_attention_backward builds on (public names for them)
# ---------------------------------------------------------------------------------------------

emit_loader = _loader
operand = _operand
strides3 = _strides3
aligned = _aligned
