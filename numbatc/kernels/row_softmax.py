"""Row softmax over the last dimension: ``out[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max))``
in float32, for bf16, f16 and f32 rows of any length (sm_80 and newer).

``WPR`` warps own one row (``RPB = max(1, 4 // WPR)`` rows per block of at least 4 warps).  Two
forms, generated per configuration (named variables, so values stay in registers; compiled and
cached by numbatc.kernels.build):

- registers (``chunks`` > 0): each thread loads ``chunks`` vectors of ``VEC`` elements of its row
  (one pass over the row: read once, write once); the row maximum and then the sum of
  exponentials are reduced over the warp with butterfly shuffles and over the row's warps through
  a small shared array (lane l of each warp reads warp l's partial and shuffles again);
- online (``chunks`` == 0, rows longer than a block holds in registers: 32768 elements, 16384 without vectors): each thread keeps a
  running (max, sum) over its strided elements (the sum rescaled by exp(old max - new max) when
  the maximum grows), the pairs are merged by the same shuffles and shared array, and a second
  pass reads the row again and writes it.

Loads: ``VEC`` = 4 for 16-bit inputs whose rows start on 8-byte boundaries and whose length is a
multiple of 4 (one 64-bit load per 4 elements; the warp reads 256 contiguous bytes), else 1.
exp is ``exp2(x * log2(e) - max * log2(e))`` (one FFMA and ex2.approx).

The face every kernel module has (``CONFIGS``, ``unsupported``, ``choose``, ``compiled``,
``launch``) takes a :class:`numbatc.softmax_api.SoftmaxProblem`; a configuration
(:class:`RowSoftmaxConfig`: vector width, warps per row, chunks) is compiled for a
:class:`RowSoftmaxVariant` (the element formats).

NOTE: the kernel carries ``launch_bounds=(threads,)``: a 1024-thread block (32 warps per row) may
use at most 64 registers a thread, and without the bound ptxas gave the 32-element form 95 (the
launch then fails with "too many resources requested").
"""

import functools
import math
from dataclasses import dataclass


__all__ = ["CONFIGS", "RowSoftmaxConfig", "RowSoftmaxVariant", "choose", "choose_config",
           "compiled", "kernel_for", "kernel_source", "launch", "launch_flat", "signature",
           "unsupported", "vectors_ok"]

# Elements a thread keeps in registers (the register form's limit), by vector width.
# NOTE: 1024 threads may use 64 registers each; 32 scalar loads (VEC 1) then spilled, 8 64-bit
# loads of 4 (VEC 4) did not.
_MAX_PER_THREAD = {1: 16, 4: 32}


@dataclass(frozen=True)
class RowSoftmaxConfig:
    """``wpr`` warps per row, ``chunks`` vectors of ``vec`` elements per thread (0: the online
    form)."""

    vec: int
    wpr: int
    chunks: int

    def __post_init__(self):
        problems = []
        if self.wpr not in (1, 2, 4, 8, 16, 32):
            problems.append(f"wpr must be a power of two in 1..32, got {self.wpr}")
        if self.vec not in (1, 4):
            problems.append(f"vec must be 1 or 4, got {self.vec}")
        if self.vec in _MAX_PER_THREAD and self.chunks * self.vec > _MAX_PER_THREAD[self.vec]:
            problems.append(f"{self.chunks} chunks of {self.vec} exceed "
                            f"{_MAX_PER_THREAD[self.vec]} elements per thread")
        if problems:
            raise ValueError("invalid row softmax config: " + "; ".join(problems))

    @property
    def rows_per_block(self):
        return max(1, 4 // self.wpr)

    @property
    def threads(self):
        return 32 * self.wpr * self.rows_per_block

    @property
    def name(self):
        form = f"{self.chunks}x{self.vec}" if self.chunks else f"online_v{self.vec}"
        return f"{self.wpr}w_{form}"


_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class RowSoftmaxVariant:
    """The element formats a configuration is compiled for: ``in_dtype`` (x), ``out_dtype``."""

    in_dtype: str
    out_dtype: str

    def __post_init__(self):
        bad = [d for d in (self.in_dtype, self.out_dtype) if d not in _DTYPES]
        if bad:
            raise ValueError("invalid row softmax variant: " + "; ".join(
                f"dtype {d} is not bfloat16, float16 or float32" for d in bad))

    @property
    def name(self):
        return f"{self.in_dtype}->{self.out_dtype}"


#: Every configuration the kernel runs: both vector widths, every warp count, each number of
#: chunks up to the register form's limit and the online form.
CONFIGS = {
    c.name: c
    for c in (RowSoftmaxConfig(vec, wpr, chunks)
              for vec in (1, 4) for wpr in (1, 2, 4, 8, 16, 32) for chunks in (1, 2, 4, 8, 16, 0)
              if chunks * vec <= _MAX_PER_THREAD[vec])
}


def choose_config(n, vec_ok):
    """The configuration for rows of ``n`` elements (``vec_ok``: 16-bit rows that may be read as
    64-bit words, :func:`vectors_ok`): the fewest warps per row that keep at most 16 elements
    per thread (at most 32 in 4-element vectors with a whole 1024-thread block), chunks rounded
    up to a power of two; the online form beyond 32768 elements (16384 without vectors)."""
    vec = 4 if vec_ok and n % 4 == 0 else 1
    wpr = 1
    while wpr < 32 and n > wpr * 32 * 16:
        wpr *= 2
    per_thread = -(-n // (wpr * 32 * vec))  # vectors per thread
    chunks = 1
    while chunks < per_thread:
        chunks *= 2
    if chunks * vec > _MAX_PER_THREAD[vec]:
        return RowSoftmaxConfig(vec, 8, 0)
    return RowSoftmaxConfig(vec, wpr, chunks)


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

_UNPACK = {"bfloat16": "nt.unpack_bf16x2", "float16": "nt.unpack_f16x2"}
_PACK = {"bfloat16": "nt.pack_bf16x2", "float16": "nt.pack_f16x2"}


def _load(cfg, var, dst, index):
    """Statements loading vector ``index`` of x into float32 variables ``dst[0..vec-1]``."""
    if cfg.vec == 4:
        un = _UNPACK[var.in_dtype]
        return [f"q = x[{index}]",
                f"{dst[0]}, {dst[1]} = {un}(np.uint32(q & np.uint64(0xFFFFFFFF)))",
                f"{dst[2]}, {dst[3]} = {un}(np.uint32(q >> np.uint64(32)))"]
    if var.in_dtype == "float32":
        return [f"{dst[0]} = x[{index}]"]
    return [f"{dst[0]} = {_UNPACK[var.in_dtype]}(np.uint32(x[{index}]))[0]"]


def _store(cfg, var, src, elem):
    """Statements storing float32 variables ``src`` at element ``elem`` of the output row."""
    if var.out_dtype == "float32":
        return [f"out[{elem} + {k}] = {v}" for k, v in enumerate(src)]
    pack = _PACK[var.out_dtype]
    if cfg.vec == 4:  # out16 is the same memory as 64-bit words when aligned (see launch)
        return [f"lo = np.uint64({pack}({src[0]}, {src[1]}))",
                f"hi = np.uint64({pack}({src[2]}, {src[3]}))",
                f"out[({elem}) // 4] = lo | (hi << np.uint64(32))"]
    return [f"out[{elem}] = np.uint16({pack}({src[0]}, {src[0]}) & 0xFFFF)"]


# A row of -inf (and a row past M) sums to 0: 1 / 0 = inf, then 0 * inf = NaN, torch's answer;
# a row with a NaN sums to NaN: 1 / NaN = NaN (a "s > 0" test would send NaN to inf).
# Spelt as a select so that the CPU emulation's NumPy scalars do not warn "divide by zero" for
# an ordinary input (the rows past M of a partial block); on the GPU, a compare and a select.
_RECIPROCAL = "inv = np.float32(1) / s if s != np.float32(0) else INF"


def kernel_source(cfg: RowSoftmaxConfig, var: RowSoftmaxVariant) -> str:
    if cfg.vec == 4 and var.in_dtype not in _UNPACK:
        raise ValueError(f"invalid row softmax config: {cfg.name} reads 4-element vectors, "
                         f"which needs 16-bit inputs, not {var.in_dtype}")
    V, WPR, RPB, C = cfg.vec, cfg.wpr, cfg.rows_per_block, cfg.chunks
    STEP = WPR * 32  # vectors of a row per pass of its threads
    lines = []
    w = lines.append
    w(f'''"""Generated by numbatc.kernels.row_softmax for {cfg.name}_{var.name}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

NEG = np.float32(-math.inf)
INF = np.float32(math.inf)
L2E = np.float32({math.log2(math.e)!r})


@cuda.jit(device=True, forceinline=True)
def warp_max(m):
    for o in (16, 8, 4, 2, 1):
        m = max(m, nt.shfl_bfly(m, o))
    return m


@cuda.jit(device=True, forceinline=True)
def warp_sum(s):
    for o in (16, 8, 4, 2, 1):
        s += nt.shfl_bfly(s, o)
    return s


@cuda.jit(device=True, forceinline=True)
def merge(m, s, m2, s2):
    """(max, sum of exp(x - max)) of the union of two parts."""
    mn = max(m, m2)
    if mn == NEG:
        return mn, np.float32(0)
    return mn, s * math.exp2((m - mn) * L2E) + s2 * math.exp2((m2 - mn) * L2E)


@cuda.jit(device=True, forceinline=True)
def warp_merge(m, s):
    for o in (16, 8, 4, 2, 1):
        m, s = merge(m, s, nt.shfl_bfly(m, o), nt.shfl_bfly(s, o))
    return m, s


@cuda.jit(cache=True, launch_bounds=({cfg.threads},))
def softmax_kernel(x, out, M, N, ldx, ldo):
    # x, out: flat; element (r, c) at x[r * ldx + c] ({'as 64-bit words of 4' if V == 4 else 'one per index'})
    red_m = cuda.shared.array(32, np.float32)
    red_s = cuda.shared.array(32, np.float32)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    sub = warp // {WPR}  # the block's row this warp works on
    tr = (warp % {WPR}) * 32 + lane  # thread index within the row
    row = cuda.blockIdx.x * {RPB} + sub
    n = N if row < M else 0  # rows past M: no loads, no stores, but every shuffle and barrier
    xrow = row * ldx
    orow = row * ldo
''')
    first_warp = f"sub * {WPR}"
    if C:  # ---- registers -------------------------------------------------------------------
        w("    # Prologue: the thread's vectors of the row into registers (-inf past the end).")
        w("    m = NEG")
        names = {}
        for c in range(C):
            names[c] = [f"v{c}_{k}" for k in range(V)]
            w(f"    e = ({c * STEP} + tr) * {V}")
            w("    if e < n:")
            for stmt in _load(cfg, var, names[c], f"(xrow + e) // {V}" if V > 1 else "xrow + e"):
                w(f"        {stmt}")
            w("    else:")
            w(f"        {', '.join(names[c])} = {', '.join(['NEG'] * V)}")
            for v in names[c]:
                w(f"    m = max(m, {v})")
        w("    # Row maximum: over the warp, then over the row's warps.")
        w("    m = warp_max(m)")
        if WPR > 1:
            w(f"""    if lane == 0:
        red_m[warp] = m
    cuda.syncthreads()
    m = warp_max(red_m[{first_warp} + lane] if lane < {WPR} else NEG)""")
        w("    mb = m * L2E if m > NEG else np.float32(0)  # a row of -inf (or past M): no inf - inf")
        w("    s = np.float32(0)")
        for c in range(C):
            for v in names[c]:
                w(f"    {v} = math.exp2({v} * L2E - mb)")
                w(f"    s += {v}")
        w("    s = warp_sum(s)")
        if WPR > 1:
            w(f"""    if lane == 0:
        red_s[warp] = s
    cuda.syncthreads()
    s = warp_sum(red_s[{first_warp} + lane] if lane < {WPR} else np.float32(0))""")
        w(f"    {_RECIPROCAL}")
        w("    # Epilogue: normalise and store.")
        for c in range(C):
            w(f"    e = ({c * STEP} + tr) * {V}")
            w("    if e < n:")
            for stmt in _store(cfg, var, [f"{v} * inv" for v in names[c]], "orow + e"):
                w(f"        {stmt}")
    else:  # ---- online ----------------------------------------------------------------------
        vs = [f"v{k}" for k in range(V)]
        w(f"""    # Pass 1: running (max, sum of exp(x - max)) over the thread's strided vectors.
    m = NEG
    s = np.float32(0)
    for e in range(tr * {V}, n, {STEP * V}):""")
        for stmt in _load(cfg, var, vs, f"(xrow + e) // {V}" if V > 1 else "xrow + e"):
            w(f"        {stmt}")
        w(f"        cm = max({', '.join(vs)})" if V > 1 else "        cm = v0")
        w("        mn = max(m, cm)")
        w("        if mn > NEG:")
        w("            s = s * math.exp2((m - mn) * L2E)" + "".join(
            f" + math.exp2(({v} - mn) * L2E)" for v in vs))
        w("            m = mn")
        w(f"""    m, s = warp_merge(m, s)
    if lane == 0:
        red_m[warp] = m
        red_s[warp] = s
    cuda.syncthreads()
    has = lane < {WPR}
    m, s = warp_merge(red_m[{first_warp} + lane] if has else NEG,
                      red_s[{first_warp} + lane] if has else np.float32(0))
    mb = m * L2E if m > NEG else np.float32(0)
    {_RECIPROCAL}
    # Pass 2: read the row again (mostly from L2), normalise and store.
    for e in range(tr * {V}, n, {STEP * V}):""")
        for stmt in _load(cfg, var, vs, f"(xrow + e) // {V}" if V > 1 else "xrow + e"):
            w(f"        {stmt}")
        for stmt in _store(cfg, var, [f"math.exp2({v} * L2E - mb) * inv" for v in vs], "orow + e"):
            w(f"        {stmt}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


@functools.cache
def kernel_for(cfg: RowSoftmaxConfig, var: RowSoftmaxVariant):
    from numbatc.kernels.build import load_generated

    return load_generated("row_softmax", kernel_source(cfg, var), entry="softmax_kernel")


_STORAGE = {"bfloat16": "uint16", "float16": "uint16", "float32": "float32"}


def _word(dtype, vec):
    return "uint64" if vec == 4 and dtype != "float32" else _STORAGE[dtype]


@functools.cache
def signature(cfg: RowSoftmaxConfig, var: RowSoftmaxVariant):
    """Typed device pointers: 64-bit words for vectorised 16-bit rows, else the elements."""
    from numba import types

    i64 = types.int64
    return (types.CPointer(getattr(types, _word(var.in_dtype, cfg.vec))),
            types.CPointer(getattr(types, _word(var.out_dtype, cfg.vec))), i64, i64, i64, i64)


def launch_flat(cfg: RowSoftmaxConfig, var: RowSoftmaxVariant, x, out, m, n, ldx, ldo, stream=0,
                prepare=False):
    """``x`` and ``out``: device pointers (ints) on the GPU, flat 1-d arrays in the emulation
    (as 64-bit words where ``cfg.vec`` is 4 and the dtype 16-bit).

    ``prepare=True``: launch through an ``intrinsics.launch.PreparedLaunch`` and return a
    relaunch function ``fn(x, out, stream)`` for the same shape and strides (numbatc.softmax's
    warm calls); None where there is none (the emulation)."""
    from numba import config

    from intrinsics import launch as launching

    grid = -(-m // cfg.rows_per_block)
    if prepare and not config.ENABLE_CUDASIM:
        prepared = launching.prepare(kernel_for(cfg, var), grid, cfg.threads, signature(cfg, var))
        if prepared is not None:
            def relaunch(x, out, stream):
                prepared(stream, x, out, m, n, ldx, ldo)

            relaunch(x, out, stream)
            return relaunch
    sig = None if config.ENABLE_CUDASIM else signature(cfg, var)
    launching.launch(kernel_for(cfg, var), grid, cfg.threads, (x, out, m, n, ldx, ldo),
                     stream=stream, signature=sig)
    return None


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (see numbatc.kernels.dispatch): from a
# numbatc.softmax_api.SoftmaxProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute softmax problem ``p``, or None: it runs rows of any length
    of bfloat16, float16 or float32 into any of those."""
    for what, dtype in (("x", p.in_dtype), ("out", p.out_dtype)):
        if dtype not in _DTYPES:
            return f"row_softmax takes bfloat16, float16 or float32 {what}, not {dtype}"
    return None


def vectors_ok(p):
    """True when problem ``p``'s rows may be moved as 64-bit words of 4 elements: x 16-bit with
    rows starting on 8-byte boundaries (its start, and its row stride where there are two rows
    or more), and out likewise unless it is float32 (stored element by element)."""
    def rows_aligned(ptr, ld):
        return ptr % 8 == 0 and (p.rows == 1 or (ld * 2) % 8 == 0)

    return (p.in_dtype in _UNPACK and rows_aligned(p.x.ptr, p.ldx)
            and (p.out_dtype == "float32" or (p.out_dtype in _PACK
                                              and rows_aligned(p.out.ptr, p.ldo))))


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced; else
    :func:`choose_config`'s for its row length and :func:`vectors_ok`)."""
    if name is None:
        return choose_config(p.n, vectors_ok(p))
    if name not in CONFIGS:
        raise ValueError(f"no row softmax config {name!r}; choose from {sorted(CONFIGS)}")
    cfg = CONFIGS[name]
    if cfg.vec == 4 and not (vectors_ok(p) and p.n % 4 == 0):
        raise ValueError(f"row softmax config {name!r} reads 4-element vectors: the rows must be "
                         "16-bit, start on 8-byte boundaries and hold a multiple of 4 elements")
    return cfg


def compiled(p, cfg: RowSoftmaxConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments)."""
    return cfg, RowSoftmaxVariant(p.in_dtype, p.out_dtype)


def launch(p, cfg: RowSoftmaxConfig):
    """Launch ``cfg`` for a :class:`numbatc.softmax_api.SoftmaxProblem` on its stream (rows,
    n >= 1).  Returns the relaunch function ``fn(x, out, stream)`` of :func:`launch_flat`
    (numbatc.softmax's warm calls) or None (the emulation, ``NUMBATC_PRINT_CONFIG`` set)."""
    import os

    from numba import config

    from numbatc.interop import devices
    from numbatc.kernels import operands

    cfg, var = compiled(p, cfg)
    keep = []
    words = cfg.vec == 4
    x = operands.flat_array(p.x, keep, words)
    out = operands.flat_array(p.out, keep, words and var.out_dtype != "float32")
    prepare = not config.ENABLE_CUDASIM and not os.environ.get("NUMBATC_PRINT_CONFIG")
    with devices.device_scope(p.device):
        return launch_flat(cfg, var, x, out, p.rows, p.n, p.ldx, p.ldo, stream=p.stream_handle,
                           prepare=prepare)
