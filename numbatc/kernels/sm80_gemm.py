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

import functools
import hashlib
import importlib.util
import os
import pathlib
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
        return self.stages * self.stage_elems * 2 + 1024  # + alignment slack


CONFIGS = {
    c.name: c
    for c in (
        Sm80Config("128x256x32_8w_3s", 128, 256, 32, 2, 4, 3),
        Sm80Config("128x128x32_4w_4s", 128, 128, 32, 2, 2, 4),
        Sm80Config("64x128x32_4w_4s", 64, 128, 32, 1, 4, 4),
        Sm80Config("64x64x64_4w_3s", 64, 64, 64, 2, 2, 3),
    )
}


@dataclass(frozen=True)
class Sm80Variant:
    """What a kernel is specialised for besides its tile shape: operand layouts, the element
    formats and the epilogue.  (Whether an operand's rows allow 16-byte copies is a run-time
    argument, so misaligned shapes cost no extra compilation.)"""

    a_layout: str  # 'row' | 'col'
    b_layout: str
    in_dtype: str  # 'bfloat16' | 'float16'
    out_dtype: str  # 'bfloat16' | 'float16' | 'float32'
    c_dtype: str | None  # dtype of C when beta * C is added, else None
    bias_dtype: str | None
    activation: str | None  # None | 'relu' | 'gelu' | 'silu'


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


def kernel_source(cfg: Sm80Config, var: Sm80Variant) -> str:
    """Python source of the kernel for one configuration and variant."""
    BM, BN, BK, S = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    WM, WN = cfg.warp_m, cfg.warp_n
    MI, NJ = WM // 16, WN // 8  # mma tiles per warp
    T = cfg.threads
    ptx_in = _PTX_TYPE[var.in_dtype]
    a_rowb = (BK if var.a_layout == "row" else BM) * 2
    b_rowb = (BK if var.b_layout == "col" else BN) * 2
    a_elems = BM * BK
    lines = []
    w = lines.append

    w(f'''"""Generated by numbatc.kernels.sm80_gemm for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

MMA = nt.mma_sync("m16n8k16", "{ptx_in}", "{ptx_in}", "f32")
CP = nt.cp_async_op(16, zfill=True)


@cuda.jit(device=True, forceinline=True)
def swz_a(o):
    return {_swizzle_expr(a_rowb)}


@cuda.jit(device=True, forceinline=True)
def swz_b(o):
    return {_swizzle_expr(b_rowb)}


@cuda.jit(device=True, forceinline=True)
def bf16_to_f32(x):
    return nt.unpack_bf16x2(np.uint32(x))[0]


@cuda.jit(device=True, forceinline=True)
def f16_to_f32(x):
    return nt.unpack_f16x2(np.uint32(x))[0]
''')

    # --- operand tile loaders ----------------------------------------------------------------
    for op, layout, rowb in (("a", var.a_layout, a_rowb), ("b", var.b_layout, b_rowb)):
        # Tile rows are along the operand's non-contiguous dimension.
        if op == "a":
            rows, cols = (BM, BK) if layout == "row" else (BK, BM)
            base = "0"
            lim_r, lim_c = ("m_lim", "k_lim") if layout == "row" else ("k_lim", "m_lim")
            index = "(mk0 + r, kk0 + c)" if layout == "row" else "(mk0 + c, kk0 + r)"
        else:
            rows, cols = (BN, BK) if layout == "col" else (BK, BN)
            base = str(a_elems)
            lim_r, lim_c = ("k_lim", "n_lim") if layout == "row" else ("n_lim", "k_lim")
            index = "(kk0 + r, mk0 + c)" if layout == "row" else "(kk0 + c, mk0 + r)"
        w(f'''
@cuda.jit(device=True, forceinline=True)
def load_{op}(smem, stage, src, mk0, kk0, m_lim, n_lim, k_lim, t):
    # {op.upper()} tile: {rows} rows x {cols} elements by 16-byte cp.async copies with a source
    # byte count: zero fill outside the matrix and past a ragged edge.
    base = stage * {cfg.stage_elems} + {base}
    for q in range(t, {rows * cols // 8}, {T}):
        r = q // {cols // 8}
        c = (q % {cols // 8}) * 8
        rr = {lim_r} - r
        cc = {lim_c} - c
        o = r * {rowb} + c * 2
        if rr > 0 and cc > 0:
            CP(smem, base + swz_{op}(o) // 2, src, {index}, min(cc, 8) * 2)
        else:
            CP(smem, base + swz_{op}(o) // 2, src, (0, 0), 0)
''')

    # --- the kernel ---------------------------------------------------------------------------
    w(f'''
@cuda.jit(cache=True)
def gemm_kernel(a, b, c, bias, out, M, N, K, alpha, beta, group_m):
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
    k_tiles = (K + {BK - 1}) // {BK}
''')
    for i in range(MI):
        for j in range(NJ):
            w(f"    acc_{i}_{j} = (np.float32(0), np.float32(0), np.float32(0), np.float32(0))")
    # Limits: how many rows/cols of the tile exist.  The loaders take (mk0, kk0) = the tile's
    # origin in (m or n, k) and compare tile-relative indices with the limits.
    _fragment_offsets(w, cfg, var, a_rowb, b_rowb, a_elems)
    w(f'''
    m_lim = M - m0
    n_lim = N - n0

    # Prologue: the first STAGES-1 tiles in flight.
    for s in range({S - 1}):
        if s < k_tiles:
            k_lim = K - s * {BK}
            load_a(smem, s, a, m0, s * {BK}, m_lim, n_lim, k_lim, t)
            load_b(smem, s, b, n0, s * {BK}, m_lim, n_lim, k_lim, t)
        nt.cp_async_commit_group()

    # Main loop.
    for kt in range(k_tiles):
        nt.cp_async_wait_group({S - 2})
        cuda.syncthreads()
        nxt = kt + {S - 1}
        if nxt < k_tiles:
            k_lim = K - nxt * {BK}
            load_a(smem, nxt % {S}, a, m0, nxt * {BK}, m_lim, n_lim, k_lim, t)
            load_b(smem, nxt % {S}, b, n0, nxt * {BK}, m_lim, n_lim, k_lim, t)
        nt.cp_async_commit_group()
        st = np.int32((kt % {S}) * {cfg.stage_elems})''')
    # Fragment addresses for each k step: the lane-dependent part (and its swizzle) is the same
    # in every stage, so it is computed once, before the main loop (see _fragment_offsets).
    for ks in range(BK // 16):
        w(f"        # k step {ks}")
        for i in range(MI):
            op = "ldmatrix_x4" if var.a_layout == "row" else "ldmatrix_x4_trans"
            w(f"        fa_{i} = nt.{op}(smem, st + a_off_{ks}_{i})")
        for j in range(0, NJ, 2):
            op = "ldmatrix_x4" if var.b_layout == "col" else "ldmatrix_x4_trans"
            w(f"        fb = nt.{op}(smem, st + b_off_{ks}_{j})")
            w(f"        fb_{j} = (fb[0], fb[1])")
            w(f"        fb_{j + 1} = (fb[2], fb[3])")
        for i in range(MI):
            for j in range(NJ):
                w(f"        acc_{i}_{j} = MMA(fa_{i}, fb_{j}, acc_{i}_{j})")
    w(f'''
    nt.cp_async_wait_all()

    # Epilogue: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1 of each tile.
    g = lane // 4
    tq = (lane % 4) * 2
    row_base = m0 + wm * {WM} + g
    col_base = n0 + wn * {WN} + tq''')
    for i in range(MI):
        for j in range(NJ):
            w(f"    store_tile(out, c, bias, acc_{i}_{j}, row_base + {i * 16}, col_base + {j * 8}, M, N, alpha, beta)")

    # --- epilogue helpers ---------------------------------------------------------------------
    act = {
        None: "    return v",
        "relu": "    return v if v > 0 else np.float32(0)",
        "gelu": "    return np.float32(0.5) * v * (np.float32(1) + math.tanh(np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))",
        "silu": "    return v / (np.float32(1) + math.exp(-v))",
    }[var.activation]
    if var.out_dtype == "bfloat16":
        store2 = ("    p = nt.pack_bf16x2(v0, v1)\n"
                  "    out[r, col] = np.uint16(p & 0xFFFF)\n"
                  "    if both:\n"
                  "        out[r, col + 1] = np.uint16(p >> 16)")
    elif var.out_dtype == "float16":
        store2 = ("    p = nt.pack_f16x2(v0, v1)\n"
                  "    out[r, col] = np.uint16(p & 0xFFFF)\n"
                  "    if both:\n"
                  "        out[r, col + 1] = np.uint16(p >> 16)")
    else:
        store2 = ("    out[r, col] = v0\n"
                  "    if both:\n"
                  "        out[r, col + 1] = v1")
    c_term = ""
    if var.c_dtype is not None:
        c_term = f"""
    x = c[r, col]
    v0 += beta * {_load_from(var.c_dtype)}
    if both:
        x = c[r, col + 1]
        v1 += beta * {_load_from(var.c_dtype)}"""
    bias_term = ""
    if var.bias_dtype is not None:
        bias_term = f"""
    x = bias[col]
    v0 += {_load_from(var.bias_dtype)}
    if both:
        x = bias[col + 1]
        v1 += {_load_from(var.bias_dtype)}"""
    w(f'''

@cuda.jit(device=True, forceinline=True)
def activation(v):
{act}


@cuda.jit(device=True, forceinline=True)
def store_pair(out, c, bias, r, col, v0, v1, N, alpha, beta):
    both = col + 1 < N
    v0 = alpha * v0
    v1 = alpha * v1{c_term}{bias_term}
    v0 = activation(v0)
    v1 = activation(v1)
{store2}


@cuda.jit(device=True, forceinline=True)
def store_tile(out, c, bias, acc, r, col, M, N, alpha, beta):
    if col < N:
        if r < M:
            store_pair(out, c, bias, r, col, acc[0], acc[1], N, alpha, beta)
        if r + 8 < M:
            store_pair(out, c, bias, r + 8, col, acc[2], acc[3], N, alpha, beta)
''')
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


_KERNELS = {}


def kernel_for(cfg: Sm80Config, var: Sm80Variant):
    """The compiled-on-demand kernel for (cfg, var): generated source written to the cache
    directory, imported as a module (numba caches its compilation next to it)."""
    key = (cfg, var)
    if key in _KERNELS:
        return _KERNELS[key]
    source = kernel_source(cfg, var)
    digest = hashlib.sha256((_source_fingerprint() + source).encode()).hexdigest()[:20]
    path = cache_dir() / f"sm80_gemm_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"numbatc_generated.sm80_gemm_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _KERNELS[key] = module.gemm_kernel
    return module.gemm_kernel


def grid_for(cfg: Sm80Config, m: int, n: int):
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


def launch(cfg: Sm80Config, var: Sm80Variant, a, b, c, bias, out, m, n, k, alpha, beta,
           stream=0, group_m=8):
    """Launch the kernel on Numba arrays (bf16/f16 as uint16 views) whose start and leading
    dimension are 16-byte aligned (see numbatc.kernels.dispatch, which packs others first)."""
    from intrinsics.launch import launch as launch_kernel

    kernel = kernel_for(cfg, var)
    launch_kernel(kernel, grid_for(cfg, m, n), cfg.threads,
                  (a, b, c, bias, out, m, n, k, np.float32(alpha), np.float32(beta), group_m),
                  shared_bytes=cfg.shared_bytes, stream=stream)
