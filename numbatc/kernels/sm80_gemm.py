"""The portable tensor-core GEMM (sm_80 and newer): cp.async multistage pipeline into swizzled
shared memory, ldmatrix into fragments, mma.sync m16n8k16 with fp32 accumulation, and an epilogue
that applies alpha, beta * C, bias and the activation while storing.

The kernel is written as Python source generated per (configuration, variant) and compiled by
numba-cuda: the warp tile's accumulators are named variables (``acc_i_j``, one 4-tuple per
16x8 mma tile) so that they stay in registers -- a loop over a tuple of tuples cannot be unrolled
by numba, and a local array indexed at run time would live in local memory.  The generated
module is written to the kernel cache directory and imported from there, so numba's on-disk
cache (``cache=True``) keeps the compiled kernel between processes; the file name hashes the
source of numbatc and intrinsics, which invalidates the cache when either changes.

Shared-memory tiles (one per operand per stage), each row of ``ROW`` bytes swizzled so that the
eight row addresses of an ldmatrix land in eight different 16-byte bank groups:

    A row-major ('row', K contiguous):  [BM][BK]  -> ldmatrix      (A fragment directly)
    A col-major ('col', M contiguous):  [BK][BM]  -> ldmatrix.trans
    B row-major ('row', N contiguous):  [BK][BN]  -> ldmatrix.trans (B fragment: k pairs per n)
    B col-major ('col', K contiguous):  [BN][BK]  -> ldmatrix

Edges: every global load is a cp.async with a source byte count (0 outside the matrix, the
remaining bytes at a ragged edge), so tiles past M, N or K read zeros and any M, N, K >= 1 works.
The operands' start and leading dimension must be 16-byte aligned; the dispatcher packs an
operand that is not into an aligned copy first.  (NOTE: a plain-load path inside the kernel for
such operands made ptxas hoist its unrolled addresses and spill: 255 registers and 170 bytes of
spills, against 254 and none without it.)
"""

import contextlib
import functools
import hashlib
import importlib.util
import os
import pathlib
import threading
import uuid
from dataclasses import dataclass

import numpy as np

__all__ = ["Sm80Config", "Sm80Variant", "CONFIGS", "kernel_for", "kernel_source", "launch"]


@dataclass(frozen=True)
class Sm80Config:
    """Tile shape (BM x BN x BK), the warp grid (WARPS_M x WARPS_N warps, each computing
    (BM / WARPS_M) x (BN / WARPS_N)) and the cp.async pipeline depth."""

    name: str
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    def __post_init__(self):
        wm, wn = self.bm // self.warps_m, self.bn // self.warps_n
        problems = []
        if self.bk not in (32, 64):
            problems.append(f"bk must be 32 or 64, got {self.bk}")
        if self.bm % self.warps_m or wm % 16:
            problems.append(f"bm / warps_m must be a multiple of 16, got {self.bm}/{self.warps_m}")
        if self.bn % self.warps_n or wn % 16:
            problems.append(f"bn / warps_n must be a multiple of 16, got {self.bn}/{self.warps_n}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if self.threads > 1024:
            problems.append(f"{self.threads} threads exceed 1024")
        for rows, cols in ((self.bm, self.bk), (self.bk, self.bm), (self.bn, self.bk), (self.bk, self.bn)):
            per_row = cols // 8
            if self.threads % per_row or (rows * per_row) % self.threads:
                problems.append(f"a {rows}x{cols} tile does not split into 16-byte copies evenly "
                                f"over {self.threads} threads")
        if self.shared_bytes > 227 * 1024:
            problems.append(f"{self.shared_bytes} bytes of shared memory exceed 227 KB")
        if problems:
            raise ValueError(f"invalid sm80 GEMM config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_m(self):
        return self.bm // self.warps_m

    @property
    def warp_n(self):
        return self.bn // self.warps_n

    @property
    def stage_elems(self):
        return (self.bm + self.bn) * self.bk

    @property
    def shared_bytes(self):
        return self.stages * self.stage_elems * 2


CONFIGS = {
    c.name: c
    for c in (
        Sm80Config("128x256x64_8w_3s", 128, 256, 64, 2, 4, 3),
        Sm80Config("128x128x64_4w_4s", 128, 128, 64, 2, 2, 4),
        Sm80Config("64x128x64_4w_4s", 64, 128, 64, 1, 4, 4),
        Sm80Config("64x64x64_4w_3s", 64, 64, 64, 2, 2, 3),
        # decode (M <= 16): 16-row tiles waste no mma.sync on rows that do not exist; 6 stages
        # keep 80 KB of B in flight per block (the problem is bound by reading B once)
        Sm80Config("16x128x64_4w_6s", 16, 128, 64, 1, 4, 6),
    )
}


@dataclass(frozen=True)
class Sm80Variant:
    """What a kernel is specialised for besides its tile shape: operand layouts ('row': the
    last index is contiguous; 'col': the first), the element formats and the epilogue."""

    a_layout: str
    b_layout: str
    in_dtype: str  # 'bfloat16' | 'float16'
    out_dtype: str  # 'bfloat16' | 'float16' | 'float32'
    c_dtype: str | None  # dtype of C when beta * C is added, else None
    bias_dtype: str | None
    activation: str | None  # None | 'relu' | 'gelu' | 'silu'
    out_layout: str = "row"
    c_layout: str = "row"
    # A user epilogue: a cuda.jit(device=True) function fn(value, row, col, *args) -> value,
    # applied to every output element after the built-in terms; ``epilogue_args`` extra arrays.
    epilogue: object = None
    epilogue_args: int = 0
    # Split-K (small M): blockIdx.y picks a K slice of k_chunk values; each block writes its
    # float32 partial tile to its slice of a workspace, and the last block of a tile to arrive
    # (a per-tile counter) sums the slices in order (deterministic) and runs the epilogue.
    split_k: bool = False
    # out is row-major bf16/f16 with 4-byte aligned rows (start and ldo): in tiles wholly inside
    # the matrix a fragment's column pair (even column) is one 32-bit store (intrinsics.gmem)
    # instead of two 16-bit ones.  Set by the dispatcher from out's alignment.
    out_pairs: bool = False


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def _swizzle_expr(row_bytes):
    """Expression swizzling byte offset ``o`` inside a tile whose rows are ``row_bytes`` long:
    the 16-byte chunk index is XORed with the row index (mod 8), so that eight consecutive rows'
    same chunk fall in eight different bank groups (64-byte rows: pairs of rows share 128 bytes,
    so the chunk takes (row // 2) % 4)."""
    if row_bytes == 64:
        return "(o ^ ((o >> 3) & 0x30))"
    shift = row_bytes.bit_length() - 1 - 4  # log2(row_bytes) - 4
    return f"(o ^ ((o >> {shift}) & 0x70))"


def _load_from(dtype):
    """Expression turning stored bits/values ``x`` of ``dtype`` into float32."""
    if dtype == "bfloat16":
        return "bf16_to_f32(x)"
    if dtype == "float16":
        return "f16_to_f32(x)"
    return "x"


def _flat(layout, row, col, ld):
    """Flat element index of (row, col) in a matrix of the given layout and leading dimension."""
    return f"({row}) * {ld} + ({col})" if layout == "row" else f"({row}) + ({col}) * {ld}"


def tile_row_bytes(cfg, var):
    """(A's, B's) shared-memory tile row length in bytes: BK two-byte elements along K for a
    K-major operand ('row' A, 'col' B), the tile's M (N) extent for an MN-major one."""
    a_rowb = (cfg.bk if var.a_layout == "row" else cfg.bm) * 2
    b_rowb = (cfg.bk if var.b_layout == "col" else cfg.bn) * 2
    return a_rowb, b_rowb


def _fragment_offsets(w, cfg, var, a_rowb, b_rowb, a_elems):
    """Emit, per k step, each lane's ldmatrix row offset (elements, swizzled, stage-relative):
    for A tile i and for each pair of B tiles (j, j + 1), as int32 variables."""
    WM, WN, MI, NJ = cfg.warp_m, cfg.warp_n, cfg.warp_m // 16, cfg.warp_n // 8
    for ks in range(cfg.bk // 16):
        for i in range(MI):
            mrow = f"wm * {WM} + {i * 16}"
            if var.a_layout == "row":
                # [m][k]: lanes 0-15 rows m, lanes 16-31 the same rows at k + 8
                o = f"({mrow} + lane % 16) * {a_rowb} + ({ks * 16} + (lane // 16) * 8) * 2"
            else:
                # [k][m], .trans: matrix q = lane // 8 covers k + (q // 2) * 8, m + (q % 2) * 8
                o = (f"({ks * 16} + ((lane // 8) // 2) * 8 + lane % 8) * {a_rowb} + "
                     f"({mrow} + ((lane // 8) % 2) * 8) * 2")
            w(f"    o = {o}")
            w(f"    a_off_{ks}_{i} = np.int32(swz_a(o) // 2)")
        for j in range(0, NJ, 2):
            ncol = f"wn * {WN} + {j * 8}"
            if var.b_layout == "col":
                # [n][k]: matrix q covers n + (q // 2) * 8, k + (q % 2) * 8
                o = (f"({ncol} + ((lane // 8) // 2) * 8 + lane % 8) * {b_rowb} + "
                     f"({ks * 16} + ((lane // 8) % 2) * 8) * 2")
            else:
                # [k][n], .trans: matrix q covers k + (q % 2) * 8, n + (q // 2) * 8
                o = (f"({ks * 16} + ((lane // 8) % 2) * 8 + lane % 8) * {b_rowb} + "
                     f"({ncol} + ((lane // 8) // 2) * 8) * 2")
            w(f"    o = {o}")
            w(f"    b_off_{ks}_{j} = np.int32({a_elems} + swz_b(o) // 2)")


def _loader(w, cfg, op, layout, rowb, base_elems):
    """Emit ``load_<op>``: the thread's 16-byte cp.async copies of one tile.

    Tile rows run along the operand's non-contiguous dimension, 8 elements per copy.  Thread t
    copies column chunk t % CPR of rows t // CPR + i * RSTEP: the global index of copy i is the
    thread's start index plus i * RSTEP * ld plus the k tile's offset, one add each.  Copies
    outside the matrix read 0 bytes (zero fill), the ragged edge reads only the bytes inside."""
    k_major = (op == "a" and layout == "row") or (op == "b" and layout == "col")
    mn = cfg.bm if op == "a" else cfg.bn
    rows, cols = (mn, cfg.bk) if k_major else (cfg.bk, mn)
    per_row = cols // 8
    step = cfg.threads // per_row
    count = rows * per_row // cfg.threads
    # k_major: rows are m (or n), columns k; the k tile moves along the columns (offset k0).
    # otherwise: rows are k, columns m (or n); the k tile moves along the rows (offset k0 * ld).
    row_lim, col_lim = ("mn_lim", "k_lim") if k_major else ("k_lim", "mn_lim")
    koff = "k0" if k_major else "k0 * ld"
    w(f"""
@cuda.jit(device=True, forceinline=True)
def load_{op}(smem, stage, src, start, ld, r0, c0, mn_lim, k0, k_lim):
    # {op.upper()}: {rows} x {cols} tile, {count} copies of 16 bytes per thread
    base = stage * {cfg.stage_elems} + {base_elems}
    g = start + {koff}
    cc = {col_lim} - c0""")
    for i in range(count):
        w(f"""    r = r0 + {i * step}
    o = r * {rowb} + c0 * 2
    if r < {row_lim} and cc > 0:
        CP(smem, base + swz_{op}(o) // 2, src, g + {i * step} * ld, min(cc, 8) * 2)
    else:
        CP(smem, base + swz_{op}(o) // 2, src, 0, 0)""")
    return per_row


_CONVERSIONS = '''

@cuda.jit(device=True, forceinline=True)
def bf16_to_f32(x):
    return nt.unpack_bf16x2(np.uint32(x))[0]


@cuda.jit(device=True, forceinline=True)
def f16_to_f32(x):
    return nt.unpack_f16x2(np.uint32(x))[0]
'''


def _epilogue_source(var: Sm80Variant) -> str:
    """The epilogue's device functions for ``var``: ``activation``, ``store_pair`` (alpha,
    beta * C, bias, activation, conversion and bounds-checked stores of two adjacent columns)
    and ``store_tile`` (one m16n8 accumulator fragment: rows r and r + 8, columns col and
    col + 1)."""
    act = {
        None: "    return v",
        "relu": "    return v if v > 0 else np.float32(0)",
        "gelu": "    return np.float32(0.5) * v * (np.float32(1) + math.tanh(np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))",
        "silu": "    return v / (np.float32(1) + math.exp(-v))",
    }[var.activation]
    o0 = _flat(var.out_layout, "r", "col", "ldo")
    o1 = _flat(var.out_layout, "r", "col + 1", "ldo")
    put2 = None  # put_pair's store, where it differs from store_pair's
    if var.out_dtype in ("bfloat16", "float16"):
        pack = "nt.pack_bf16x2" if var.out_dtype == "bfloat16" else "nt.pack_f16x2"
        store2 = (f"    p = {pack}(v0, v1)\n"
                  f"    out[{o0}] = np.uint16(p & 0xFFFF)\n"
                  "    if both:\n"
                  f"        out[{o1}] = np.uint16(p >> 16)")
        if var.out_pairs:
            assert var.out_layout == "row", "out_pairs needs a row-major out"
            put2 = f"    nt.st_global_b32(out, {o0}, {pack}(v0, v1))"
    else:
        store2 = (f"    out[{o0}] = v0\n"
                  "    if both:\n"
                  f"        out[{o1}] = v1")
    c_term = ""
    if var.c_dtype is not None:
        c0 = _flat(var.c_layout, "r", "col", "ldc")
        c1 = _flat(var.c_layout, "r", "col + 1", "ldc")
        c_term = f"""
    x = c[{c0}]
    v0 += beta * {_load_from(var.c_dtype)}
    if both:
        x = c[{c1}]
        v1 += beta * {_load_from(var.c_dtype)}"""
    ea, user = "", ""
    if var.epilogue is not None:
        # USER_EPILOGUE is set on the generated module before its first compilation.
        ea = ", eargs"
        user = """
    v0 = np.float32(USER_EPILOGUE(v0, r, col, *eargs))
    if both:
        v1 = np.float32(USER_EPILOGUE(v1, r, col + 1, *eargs))"""
    bias_term = ""
    if var.bias_dtype is not None:
        bias_term = f"""
    x = bias[col]
    v0 += {_load_from(var.bias_dtype)}
    if both:
        x = bias[col + 1]
        v1 += {_load_from(var.bias_dtype)}"""
    return f'''

@cuda.jit(device=True, forceinline=True)
def activation(v):
{act}


@cuda.jit(device=True, forceinline=True)
def store_pair(out, c, bias, r, col, v0, v1, N, ldc, ldo, alpha, beta{ea}):
    both = col + 1 < N
    v0 = alpha * v0
    v1 = alpha * v1{c_term}{bias_term}
    v0 = activation(v0)
    v1 = activation(v1){user}
{store2}


@cuda.jit(device=True, forceinline=True)
def value_pair(c, bias, r, col, v0, v1, ldc, alpha, beta{ea}):
    # store_pair's arithmetic for two in-bounds columns, no store (the full-tile epilogue)
    both = True
    v0 = alpha * v0
    v1 = alpha * v1{c_term}{bias_term}
    v0 = activation(v0)
    v1 = activation(v1){user}
    return v0, v1


@cuda.jit(device=True, forceinline=True)
def value_tile(c, bias, acc, r, col, ldc, alpha, beta{ea}):
    v0, v1 = value_pair(c, bias, r, col, acc[0], acc[1], ldc, alpha, beta{ea})
    v2, v3 = value_pair(c, bias, r + 8, col, acc[2], acc[3], ldc, alpha, beta{ea})
    return (v0, v1, v2, v3)


@cuda.jit(device=True, forceinline=True)
def put_pair(out, r, col, v0, v1, ldo):
    both = True
{store2 if put2 is None else put2}


@cuda.jit(device=True, forceinline=True)
def put_tile(out, vals, r, col, ldo):
    put_pair(out, r, col, vals[0], vals[1], ldo)
    put_pair(out, r + 8, col, vals[2], vals[3], ldo)


@cuda.jit(device=True, forceinline=True)
def store_tile(out, c, bias, acc, r, col, M, N, ldc, ldo, alpha, beta{ea}):
    if col < N:
        if r < M:
            store_pair(out, c, bias, r, col, acc[0], acc[1], N, ldc, ldo, alpha, beta{ea})
        if r + 8 < M:
            store_pair(out, c, bias, r + 8, col, acc[2], acc[3], N, ldc, ldo, alpha, beta{ea})
'''


# The reductions over the quad of lanes that share a row of an m16n8 fragment (lanes 4g .. 4g+3):
# generated kernels that reduce rows (softmax) paste this source.
QUAD_REDUCTIONS = '''

@cuda.jit(device=True, forceinline=True)
def quad_max(x):
    x = max(x, nt.shfl_bfly(x, 1))
    return max(x, nt.shfl_bfly(x, 2))


@cuda.jit(device=True, forceinline=True)
def quad_sum(x):
    x = x + nt.shfl_bfly(x, 1)
    return x + nt.shfl_bfly(x, 2)
'''


def epilogue_source(var: Sm80Variant) -> str:
    """Source of the epilogue helpers (with the bf16/f16 decoders they use), for kernels that
    store m16n8-shaped fragments the way sm80_gemm does (sm90_gemm's wgmma accumulator too)."""
    return _CONVERSIONS + _epilogue_source(var)


def mainloop_source(w, cfg: Sm80Config, var: Sm80Variant):
    """Emit (through ``w``) the main loop that sm80 kernels share, inside a kernel whose
    ``smem``, ``t``, ``wm``/``wn``, ``m0``/``n0`` limits, ``k_tiles``, the copy starts
    (``a_start``, ``b_start``, ``a_r0`` ...) and ``load_a``/``load_b`` are defined: zeroed
    accumulators ``acc_i_j``, the ldmatrix offsets, the cp.async prologue (STAGES-1 tiles in
    flight) and the k loop (wait, refill, ldmatrix + mma.sync on every k step)."""
    BK, S = cfg.bk, cfg.stages
    MI, NJ = cfg.warp_m // 16, cfg.warp_n // 8
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    a_elems = cfg.bm * BK
    for i in range(MI):
        for j in range(NJ):
            w(f"    acc_{i}_{j} = (np.float32(0), np.float32(0), np.float32(0), np.float32(0))")
    _fragment_offsets(w, cfg, var, a_rowb, b_rowb, a_elems)
    w(f'''
    # Prologue: the first STAGES-1 tiles in flight.
    for s in range({S - 1}):
        if s < k_tiles:
            load_a(smem, s, a, a_start, lda, a_r0, a_c0, m_lim, s * {BK}, K - s * {BK})
            load_b(smem, s, b, b_start, ldb, b_r0, b_c0, n_lim, s * {BK}, K - s * {BK})
        nt.cp_async_commit_group()

    # Main loop: wait for tile kt, refill the stage tile kt-1 used, compute on tile kt.
    for kt in range(k_tiles):
        nt.cp_async_wait_group({S - 2})
        cuda.syncthreads()
        nxt = kt + {S - 1}
        if nxt < k_tiles:
            st_next = nxt % {S}
            load_a(smem, st_next, a, a_start, lda, a_r0, a_c0, m_lim, nxt * {BK}, K - nxt * {BK})
            load_b(smem, st_next, b, b_start, ldb, b_r0, b_c0, n_lim, nxt * {BK}, K - nxt * {BK})
        nt.cp_async_commit_group()
        st = np.int32((kt % {S}) * {cfg.stage_elems})''')
    for ks in range(BK // 16):
        w(f"        # k step {ks}")
        for i in range(MI):
            op = "ldmatrix_x4" if a_kmajor else "ldmatrix_x4_trans"
            w(f"        fa_{i} = nt.{op}(smem, st + a_off_{ks}_{i})")
        for j in range(0, NJ, 2):
            op = "ldmatrix_x4" if b_kmajor else "ldmatrix_x4_trans"
            w(f"        fb = nt.{op}(smem, st + b_off_{ks}_{j})")
            w(f"        fb_{j} = (fb[0], fb[1])")
            w(f"        fb_{j + 1} = (fb[2], fb[3])")
        for i in range(MI):
            for j in range(NJ):
                w(f"        acc_{i}_{j} = MMA(fa_{i}, fb_{j}, acc_{i}_{j})")


def full_tile_epilogue(w, tiles, var, inside, indent="    "):
    """Emit the epilogue of fragments ``tiles`` = [(acc, row, column expressions)]: when
    ``inside`` (the block's whole tile lies in the matrix) every fragment's values first
    (value_tile: its loads of c and of a user epilogue's arrays), then every store (put_tile);
    otherwise store_tile per fragment with its bounds checks.  With nothing to load (no c, no
    user epilogue) the inside path exists only for out_pairs' 32-bit stores.

    NOTE: store_tile per fragment interleaves each fragment's loads with the previous one's
    stores to ``out``, which may alias c or a user epilogue's arrays, so neither compiler may
    move a load above a store: every fragment waited a full memory latency in turn (measured:
    a bias + GELU + residual user epilogue cost +32 % over the plain GEMM at 4096^3 on the
    H200).  Values first lets all the loads be in flight together."""
    ea = ", eargs" if var.epilogue is not None else ""
    x = indent
    if var.epilogue is None and var.c_dtype is None and not var.out_pairs:
        # per-element stores either way, and at most the bias (cached) to load: one pass
        for acc, row, col in tiles:
            w(f"{x}store_tile(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta)")
        return
    w(f"{x}if {inside}:")
    if var.epilogue is None and var.c_dtype is None and var.bias_dtype is None:
        # nothing to load: each fragment's values, then its pair stores
        for acc, row, col in tiles:
            w(f"{x}    put_tile(out, value_tile(c, bias, {acc}, {row}, {col}, ldc, alpha, beta), "
              f"{row}, {col}, ldo)")
    else:
        for i, (acc, row, col) in enumerate(tiles):
            w(f"{x}    ev_{i} = value_tile(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea})")
        for i, (acc, row, col) in enumerate(tiles):
            w(f"{x}    put_tile(out, ev_{i}, {row}, {col}, ldo)")
    w(f"{x}else:")
    for acc, row, col in tiles:
        w(f"{x}    store_tile(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta{ea})")


def module_header(w, generator, cfg, var, constants=""):
    """Emit the head of a generated mma.sync GEMM module: its docstring, imports, the MMA and
    cp.async operations, ``constants`` (lines of module constants), and the swizzles of the A
    and B tiles (swz_a, swz_b) for ``var``'s layouts.  sm80_gemm and sm80_gemm_softmax."""
    ptx_in = _PTX_TYPE[var.in_dtype]
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    w(f'''"""Generated by numbatc.kernels.{generator} for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

MMA = nt.mma_sync("m16n8k16", "{ptx_in}", "{ptx_in}", "f32")
CP = nt.cp_async_op(16, zfill=True)
{constants}

@cuda.jit(device=True, forceinline=True)
def swz_a(o):
    return {_swizzle_expr(a_rowb)}


@cuda.jit(device=True, forceinline=True)
def swz_b(o):
    return {_swizzle_expr(b_rowb)}

''')


def split_source(var, a_kmajor, b_kmajor):
    """(extra kernel parameters, the K-slice prologue, the additions to A's and B's start
    indices) of a split-K variant (see Sm80Variant.split_k), all "" otherwise: blockIdx.y is
    the slice, K becomes the slice's length and the operands' start indices move to its first
    k.  Shared by sm80_gemm and sm90_gemm (whose producer takes the start indices)."""
    if not var.split_k:
        return "", "", "", ""
    return (", ws, counters, k_chunk, splits",
            "    split = cuda.blockIdx.y\n"
            "    kbeg = split * k_chunk\n"
            "    K = min(K - kbeg, k_chunk)\n",
            " + kbeg" if a_kmajor else " + kbeg * lda",
            " + kbeg" if b_kmajor else " + kbeg * ldb")


def split_epilogue_source(w, tiles, var, tile_id, sync, leader, indent="    "):
    """Emit split-K's epilogue (see Sm80Variant.split_k) for fragments ``tiles`` = [(acc
    expression, row expression, column expression)] in store_tile's m16n8 layout: store the
    partial sums to this split's slice of ``ws`` (float32, splits x M x N), fence, count the
    tile's arrivals in ``counters[tile_id]``; the last block to arrive sums the slices in split
    order, runs store_tile and resets the counter for the next launch.  ``sync`` synchronises
    the threads that hold fragments, ``leader`` is the condition of the one that counts."""
    ea = ", eargs" if var.epilogue is not None else ""
    x = indent
    w(f"{x}# split-K: this block's partial tile to its slice of the workspace")
    w(f"{x}sl = split * M")
    for acc, row, col in tiles:
        w(f"{x}put_partial(ws, sl, {acc}, {row}, {col}, M, N)")
    w(f"""{x}cuda.threadfence()
{x}{sync}
{x}last = cuda.shared.array(1, np.int32)
{x}if {leader}:
{x}    last[0] = np.int32(nt.atomic_add_global(counters, {tile_id}, np.int32(1)) == splits - 1)
{x}{sync}
{x}if last[0] != 0:
{x}    cuda.threadfence()""")
    for acc, row, col in tiles:
        w(f"{x}    store_tile(out, c, bias, sum_partials(ws, splits, {row}, {col}, M, N), {row}, "
          f"{col}, M, N, ldc, ldo, alpha, beta{ea})")
    w(f"""{x}    if {leader}:
{x}        counters[{tile_id}] = np.int32(0)""")


SPLIT_HELPERS = '''

@cuda.jit(device=True, forceinline=True)
def put_partial(ws, sl, acc, r, col, M, N):
    both = col + 1 < N
    if r < M and col < N:
        ws[(sl + r) * N + col] = acc[0]
        if both:
            ws[(sl + r) * N + col + 1] = acc[1]
    if r + 8 < M and col < N:
        ws[(sl + r + 8) * N + col] = acc[2]
        if both:
            ws[(sl + r + 8) * N + col + 1] = acc[3]


@cuda.jit(device=True, forceinline=True)
def sum_partials(ws, splits, r, col, M, N):
    # rows and columns outside the matrix read nothing (store_tile skips them too)
    v0 = v1 = v2 = v3 = np.float32(0)
    ok0 = r < M and col < N
    ok1 = r < M and col + 1 < N
    ok2 = r + 8 < M and col < N
    ok3 = r + 8 < M and col + 1 < N
    for s in range(splits):
        o = (s * M + r) * N + col
        if ok0:
            v0 += ws[o]
        if ok1:
            v1 += ws[o + 1]
        if ok2:
            v2 += ws[o + 8 * N]
        if ok3:
            v3 += ws[o + 8 * N + 1]
    return (v0, v1, v2, v3)
'''


def kernel_source(cfg: Sm80Config, var: Sm80Variant) -> str:
    """Python source of the kernel for one configuration and variant."""
    BM, BN, BK = cfg.bm, cfg.bn, cfg.bk
    WM, WN = cfg.warp_m, cfg.warp_n
    MI, NJ = WM // 16, WN // 8  # mma tiles per warp
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    a_elems = BM * BK
    lines = []
    w = lines.append

    module_header(w, "sm80_gemm", cfg, var)
    w(_CONVERSIONS)
    a_per_row = _loader(w, cfg, "a", var.a_layout, a_rowb, 0)
    b_per_row = _loader(w, cfg, "b", var.b_layout, b_rowb, a_elems)

    # --- the kernel ---------------------------------------------------------------------------
    # Operands are flat: element (i, j) of a 'row' matrix is x[i * ld + j], of a 'col' one
    # x[i + j * ld] (device pointers on the GPU, 1-d arrays in the emulation).
    a_start = "m0 * lda + a_c0 + a_r0 * lda" if a_kmajor else "a_r0 * lda + m0 + a_c0"
    b_start = "n0 * ldb + b_c0 + b_r0 * ldb" if b_kmajor else "b_r0 * ldb + n0 + b_c0"
    split_args, split_range, split_a, split_b = split_source(var, a_kmajor, b_kmajor)
    w(f'''

@cuda.jit(cache={var.epilogue is None})
def gemm_kernel(a, b, c, bias, out, M, N, K, lda, ldb, ldc, ldo, alpha, beta, group_m{split_args}{", eargs" if var.epilogue is not None else ""}):
    smem = cuda.shared.array(0, np.uint16, alignment=1024)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    wm = warp // {cfg.warps_n}
    wn = warp % {cfg.warps_n}

    # Rasterisation: blocks walk GROUP_M tile-rows at a time so that neighbours share B in L2.
    pid = cuda.blockIdx.x
    tiles_m = (M + {BM - 1}) // {BM}
    tiles_n = (N + {BN - 1}) // {BN}
    in_group = group_m * tiles_n
    first_m = (pid // in_group) * group_m
    size_m = min(tiles_m - first_m, group_m)
    tm = first_m + (pid % in_group) % size_m
    tn = (pid % in_group) // size_m
    m0 = tm * {BM}
    n0 = tn * {BN}
{split_range}    k_tiles = (K + {BK - 1}) // {BK}
    m_lim = M - m0
    n_lim = N - n0

    # This thread's copies: one column chunk, rows r0 + i * step (see _loader).
    a_r0 = t // {a_per_row}
    a_c0 = (t % {a_per_row}) * 8
    b_r0 = t // {b_per_row}
    b_c0 = (t % {b_per_row}) * 8
    a_start = {a_start}{split_a}
    b_start = {b_start}{split_b}
''')
    mainloop_source(w, cfg, var)
    w(f'''
    nt.cp_async_wait_all()

    # Epilogue: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1 of each tile.
    g = lane // 4
    tq = (lane % 4) * 2
    row_base = m0 + wm * {WM} + g
    col_base = n0 + wn * {WN} + tq''')
    tiles = [(f"acc_{i}_{j}", f"row_base + {i * 16}", f"col_base + {j * 8}")
             for i in range(MI) for j in range(NJ)]
    if var.split_k:
        split_epilogue_source(w, tiles, var, "cuda.blockIdx.x", "cuda.syncthreads()", "t == 0")
    else:
        full_tile_epilogue(w, tiles, var, f"m0 + {BM} <= M and n0 + {BN} <= N")

    w(_epilogue_source(var))
    if var.split_k:
        w(SPLIT_HELPERS)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Compilation and caching
# ---------------------------------------------------------------------------------------------


@functools.cache
def _source_fingerprint():
    """Hash of numbatc's and intrinsics' sources: part of every generated kernel's file name, so
    the on-disk cache is invalidated whenever either package changes."""
    digest = hashlib.sha256()
    for package in ("numbatc", "intrinsics"):
        root = pathlib.Path(importlib.util.find_spec(package).origin).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir():
    """Where generated kernels (and numba's cache of them) live: $NUMBATC_CACHE_DIR, else
    ~/.cache/numbatc."""
    root = os.environ.get("NUMBATC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "numbatc")
    path = pathlib.Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: (file path, ids of module_globals) -> (the module imported from it, the globals' values).
_MODULES: dict = {}
_MODULES_LOCK = threading.Lock()


def load_generated(prefix, source, **module_globals):
    """Write generated kernel source to the cache directory (once, atomically) and import it;
    the file name hashes the source with numbatc's and intrinsics' own, so numba's on-disk cache
    next to it is never stale.  ``module_globals`` are set on the module before anything is
    compiled (a user epilogue function).  Returns the module's ``gemm_kernel``.

    Safe from many threads and processes at once: each writer writes its own temporary file
    (in the same directory, named by process, thread and a random part) and renames it over the
    final name (atomic on POSIX and Windows), so a reader sees no file or a whole one; a file
    whose text is not the source (a torn write from an older numbatc, a disk error) is
    rewritten.  In one process one module is imported per (file, module_globals) (under a
    lock), so threads asking for the same kernel at once get the same dispatcher and numba
    compiles it once."""
    digest = hashlib.sha256((_source_fingerprint() + source).encode()).hexdigest()[:20]
    path = cache_dir() / f"{prefix}_{digest}.py"
    key = (str(path), tuple(sorted((name, id(value)) for name, value in module_globals.items())))
    with _MODULES_LOCK:
        found = _MODULES.get(key)
        if found is not None:
            return found[0].gemm_kernel
        _write_once(path, source)
        spec = importlib.util.spec_from_file_location(f"numbatc_generated.{prefix}_{digest}",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, value in module_globals.items():
            setattr(module, name, value)
        # the values are kept with the module: their ids in the key stay theirs
        _MODULES[key] = (module, tuple(module_globals.values()))
    return module.gemm_kernel


def _write_once(path, source):
    """Make ``path`` hold ``source``: left alone when it already does, else written to a
    temporary file of this call's own and renamed over ``path``."""
    try:
        if path.read_text() == source:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    # a name no other thread or process uses; "x" creates it (with the umask's permissions,
    # which tempfile.mkstemp's 0600 would not keep for a cache shared between users)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}."
                         f"{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@functools.cache
def kernel_for(cfg: Sm80Config, var: Sm80Variant):
    """The compiled-on-demand kernel for (cfg, var) (see load_generated).  A variant with a user
    epilogue is compiled in this process only (its function is not in the generated file)."""
    extra = {} if var.epilogue is None else {"USER_EPILOGUE": var.epilogue}
    return load_generated("sm80_gemm", kernel_source(cfg, var), **extra)


def grid_for(cfg: Sm80Config, m: int, n: int):
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


_STORAGE = {"bfloat16": "uint16", "float16": "uint16", "float32": "float32"}


@functools.cache
def signature(var: Sm80Variant):
    """The kernel's argument types on the GPU: operands as typed device pointers (flat, with
    their leading dimensions as separate arguments), so a launch builds no array objects."""
    from numba import types

    def ptr(dtype):
        return types.CPointer(getattr(types, _STORAGE[dtype]))

    i64, f32 = types.int64, types.float32
    split = ((types.CPointer(f32), types.CPointer(types.int32), i64, i64)
             if getattr(var, "split_k", False) else ())
    return (ptr(var.in_dtype), ptr(var.in_dtype), ptr(var.c_dtype or var.out_dtype),
            ptr(var.bias_dtype or var.out_dtype), ptr(var.out_dtype),
            i64, i64, i64, i64, i64, i64, i64, f32, f32, i64) + split


def launch(cfg: Sm80Config, var: Sm80Variant, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo,
           alpha, beta, stream=0, group_m=8, epilogue_args=(), prepare=False, split=None):
    """Launch the kernel.  Operands are flat: device pointers (ints) on the GPU, 1-d arrays in
    the emulation; their start and leading dimension must be 16-byte aligned (the dispatcher
    packs operands that are not).

    ``prepare=True``: launch through an ``intrinsics.launch.PreparedLaunch`` and return a
    relaunch function ``fn(a, b, c, bias, out, alpha, beta, stream, eflat=())`` for the same
    shape and leading dimensions (the host cost of a warm ``numbatc.gemm``; ``eflat``: a user
    epilogue's arguments as :func:`flat_epilogue_args` gives them); None, after launching the
    ordinary way, where there is none (the emulation, an argument type a prepared launch cannot
    pass).

    ``split`` (variants with split_k): ``split(stream) -> (workspace, counters, k_chunk,
    splits)`` -- a float32 workspace of splits * m * n values and grid_for(cfg, m, n) int32
    counters, zero before the first launch (each launch leaves them zero), used by one stream
    (so one launch at a time); asked on every launch, relaunches too.  See
    numbatc.kernels.dispatch.split_workspace."""
    grid = grid_for(cfg, m, n)
    if split is not None:
        grid = (grid, split(stream)[3])
    return launch_gemm_kernel(kernel_for(cfg, var), var, grid, cfg.threads,
                              cfg.shared_bytes, None, a, b, c, bias, out, m, n, k, lda, ldb, ldc,
                              ldo, alpha, beta, stream, group_m, epilogue_args, prepare,
                              split=split)


def launch_gemm_kernel(kernel, var, grid, threads, shared_bytes, cluster, a, b, c, bias, out, m,
                       n, k, lda, ldb, ldc, ldo, alpha, beta, stream, group_m, epilogue_args,
                       prepare, split=None, kernel_signature=None):
    """Launch a generated GEMM kernel with sm80_gemm's arguments (sm90_gemm's too): prepared
    (returning the relaunch function, see :func:`launch`) where it can be, else through
    ``intrinsics.launch.launch`` with a user epilogue's arrays as a final tuple argument.
    ``kernel_signature``: the argument types where they are not :func:`signature`'s (sm90_gemm's
    fp8 form takes uint8 operand pointers)."""
    from numba import config

    from intrinsics import launch as launching

    if prepare and not config.ENABLE_CUDASIM:
        sig = kernel_signature or signature(var)
        eflat = ()
        if var.epilogue is not None:
            _, sig = with_epilogue_args(kernel, var, (), sig, epilogue_args)
            eflat = flat_epilogue_args(epilogue_args)
        prepared = launching.prepare(kernel, grid, threads, sig, shared_bytes=shared_bytes,
                                     cluster=cluster)
        if prepared is not None:
            if split is None:
                def relaunch(a, b, c, bias, out, alpha, beta, stream, eflat=()):
                    prepared(stream, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha,
                             beta, group_m, *eflat)
            else:
                def relaunch(a, b, c, bias, out, alpha, beta, stream, eflat=()):
                    prepared(stream, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha,
                             beta, group_m, *split(stream), *eflat)

            relaunch(a, b, c, bias, out, alpha, beta, stream, eflat)
            return relaunch
    args = (a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, np.float32(alpha), np.float32(beta),
            group_m)
    if split is not None:
        ws, counters, k_chunk, splits = split(stream)
        args += (ws, counters, np.int64(k_chunk), np.int64(splits))
    args, sig = with_epilogue_args(kernel, var, args, kernel_signature or signature(var),
                                   epilogue_args)
    launching.launch(kernel, grid, threads, args, shared_bytes=shared_bytes, cluster=cluster,
                     stream=stream, signature=sig)
    return None


def flat_epilogue_args(epilogue_args):
    """A user epilogue's arguments (Numba device arrays and numbers) as the kernel parameters
    numba passes for them (intrinsics.launch.array_params for an array), for a prepared launch."""
    from intrinsics.launch import array_params

    flat = ()
    for x in epilogue_args:
        if hasattr(x, "device_ctypes_pointer"):
            flat += array_params(x.device_ctypes_pointer.value, x.shape, x.strides,
                                 x.dtype.itemsize)
        else:
            flat += (x,)
    return flat


def with_epilogue_args(kernel, var, args, sig, epilogue_args):
    """(args, signature) of a generated kernel's launch: a user epilogue's arrays go last, as one
    tuple argument (typed from the values); the signature is None in the emulation."""
    from numba import config

    sig = None if config.ENABLE_CUDASIM else tuple(sig)
    if var.epilogue is not None:
        args += (tuple(epilogue_args),)
        if sig is not None:
            from numba import types

            sig += (types.Tuple([kernel.typeof_pyval(x) for x in epilogue_args]),)
    return args, sig
