"""What every GEMM kernel shares after its main loop, whatever computed the accumulators
(mma.sync, wgmma, tcgen05): the problem's variant, the fused epilogue's device functions, split-K,
and the common kernel arguments and launch.

- :class:`GemmVariant`: operand layouts, dtypes, the epilogue (alpha, beta * C, bias,
  activation, a user function), split-K and paired stores -- the problem a GEMM kernel is
  specialised for besides its tile; :func:`variant_for` reads it off a problem.
- :func:`make_epilogue` / :func:`epilogue_for`: the epilogue's device functions (``store_tile``,
  ``value_tile``, ``put_tile``, ``value_frags`` ...: :class:`Epilogue`), factory-made
  ``@cuda.jit`` code that stores m16n8-shaped accumulator fragments; :func:`full_tile_epilogue`
  emits a generated kernel's calls of them for a block's fragments.
- :func:`split_source`, :func:`split_epilogue_source`, :func:`put_partial`,
  :func:`add_partial`: split-K's kernel parameters, its K-slice prologue and its deterministic
  reduction of the slices.
- :func:`signature`, :func:`launch_gemm_kernel`: the arguments every GEMM kernel takes, and its
  launch (prepared where it can be; numbatc.kernels.sm80_gemm.launch_flat describes the
  contract).
- :func:`quad_max`, :func:`quad_sum`: max / sum over the quad of lanes that share a fragment
  row, for the kernels that reduce rows (softmax, attention); :data:`QUAD_REDUCTIONS` imports
  them into a generated kernel.

Kernels written as code (sm90_gemm_tma) call the functions; the generated GEMM kernels
(sm80_gemm, sm90_gemm's cp.async form, sm100_gemm, sm100_scaled_gemm) import them through the
lines :func:`epilogue_source` / :data:`SPLIT_HELPERS` give, and compile through
numbatc.kernels.build.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt

__all__ = ["GemmVariant", "variant_for", "Epilogue", "make_epilogue", "epilogue_for",
           "ACTIVATIONS", "bf16_to_f32", "f16_to_f32", "put_partial", "add_partial", "ZERO4",
           "CONVERSIONS", "QUAD_REDUCTIONS", "quad_max", "quad_sum", "SPLIT_HELPERS",
           "BLOCK_FRAGS", "epilogue_source",
           "stores_source", "eargs_source", "full_tile_epilogue", "split_source",
           "split_epilogue_source",
           "signature", "launch_gemm_kernel", "flat_epilogue_args", "with_epilogue_args",
           "to_f32_expr"]


# ---------------------------------------------------------------------------------------------
# The variant
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmVariant:
    """What a GEMM kernel is specialised for besides its tile shape: operand layouts ('row':
    the last index is contiguous; 'col': the first), the element formats and the epilogue.
    Every GEMM family takes it (sm90_gemm's fp8 form extends it; sm100_scaled_gemm maps its own
    variant onto one for the epilogue)."""

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
    # (sm80_gemm) out_pairs and out's start and rows 16-byte aligned: a tile wholly inside the
    # matrix is staged through shared memory and stored as 16-byte chunks of rows (one
    # st.global.v4 per lane; sm80_gemm.staged_epilogue).  Set by sm80_gemm.variant.
    out_staged: bool = False


def variant_for(p, cls=GemmVariant, **fields):
    """The variant of GEMM problem ``p`` (a numbatc.gemm_api.GemmProblem): its layouts, dtypes and
    epilogue; ``cls`` a kernel's own variant class (sm90_gemm's FP8 one) and ``fields`` the
    rest it takes (split_k, b_dtype)."""
    # a row-major 16-bit out whose start and rows are 4-byte aligned takes a column pair in one
    # 32-bit store (GemmVariant.out_pairs)
    out_pairs = (p.out.layout == "row" and p.out_dtype in ("bfloat16", "float16")
                 and p.out.alignment >= 4)
    return cls(a_layout=p.a.layout, b_layout=p.b.layout, in_dtype=p.in_dtype,
               out_dtype=p.out_dtype, c_dtype=p.c.dtype if p.c is not None else None,
               bias_dtype=p.bias_dtype, activation=p.activation, out_layout=p.out.layout,
               c_layout=p.c.layout if p.c is not None else "row", epilogue=p.epilogue,
               epilogue_args=len(p.epilogue_args), out_pairs=out_pairs, **fields)


# ---------------------------------------------------------------------------------------------
# The epilogue: device functions, factory-made
# ---------------------------------------------------------------------------------------------
#
# Every function below is an ordinary ``@cuda.jit(device=True, forceinline=True)`` function.
# make_epilogue's close over the variant's choices (activation, dtypes, layouts, paired stores,
# the user function) as constants: numba prunes the branches on them before typing, and LLVM
# inlines the chain into straight-line code per fragment.  Each function's last argument is a
# user epilogue's arrays, ``eargs`` (the empty tuple without one: no register, no parameter).


@cuda.jit(device=True, forceinline=True)
def bf16_to_f32(x):
    return nt.unpack_bf16x2(np.uint32(x))[0]


@cuda.jit(device=True, forceinline=True)
def f16_to_f32(x):
    return nt.unpack_f16x2(np.uint32(x))[0]


def to_f32_expr(dtype):
    """Expression turning stored bits/values ``x`` of ``dtype`` into float32 (for generated
    kernels that import bf16_to_f32 / f16_to_f32 through :data:`CONVERSIONS`)."""
    return {"bfloat16": "bf16_to_f32(x)", "float16": "f16_to_f32(x)"}.get(dtype, "x")


#: the conversions as generated kernels take them
CONVERSIONS = "\nfrom numbatc.kernels.epilogue import bf16_to_f32, f16_to_f32\n"

@cuda.jit(device=True, forceinline=True)
def _identity(v):
    return v


@cuda.jit(device=True, forceinline=True)
def _relu(v):
    return v if v > 0 else np.float32(0)


@cuda.jit(device=True, forceinline=True)
def _gelu(v):  # the tanh form
    return np.float32(0.5) * v * (np.float32(1) + math.tanh(
        np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)))


@cuda.jit(device=True, forceinline=True)
def _silu(v):
    return v / (np.float32(1) + math.exp(-v))


_ACTIVATION_FNS = {None: _identity, "relu": _relu, "gelu": _gelu, "silu": _silu}
_TO_F32 = {"bfloat16": bf16_to_f32, "float16": f16_to_f32}  # (float32: _identity)


@cuda.jit(device=True, forceinline=True)
def _row_major(r, col, ld):
    return r * ld + col


@cuda.jit(device=True, forceinline=True)
def _col_major(r, col, ld):
    return r + col * ld


_INDEX = {"row": _row_major, "col": _col_major}
#: the activations make_epilogue knows
ACTIVATIONS = tuple(_ACTIVATION_FNS)


@dataclass(frozen=True)
class Epilogue:
    """A variant's epilogue device functions (see :func:`make_epilogue`).  ``acc`` / ``vals``
    arguments are fragments in mma.sync's m16n8 layout (wgmma's and tcgen05's accumulators are
    stored in the same one): registers 0, 1 at (r, col), (r, col + 1); 2, 3 at row r + 8.

    - ``store_pair(out, c, bias, r, col, v0, v1, N, ldc, ldo, alpha, beta, eargs)``: alpha,
      beta * C, bias, activation, the user function and the stores of two adjacent columns
      (col + 1 only where < N);
    - ``value_pair(c, bias, r, col, v0, v1, ldc, alpha, beta, eargs)``: the same values of
      two in-bounds columns, no store; ``put_pair(out, r, col, v0, v1, ldo)`` stores them;
    - ``value_tile`` / ``put_tile`` / ``store_tile(out, c, bias, acc, r, col, M, N, ...)``: one
      fragment (store_tile bounds-checked);
    - ``value_frags`` / ``put_frags`` / ``store_frags``: :data:`BLOCK_FRAGS` consecutive
      fragments of a wgmma accumulator (registers 4q .. 4q + 3 hold fragment q, at columns
      col + 8q), one call per 64 columns.

    NOTE: compile time.  numba compiles each device function once per signature in a pipeline
    of its own and types every call site anew (~1-3 ms), and a function that closes over
    values costs more than a module-level one (~15 ms against ~4 on a 2-core host, with
    branches on them pruned).  So the variant's pieces that need no closure (the activation,
    the conversions, the index of a layout) are module-level functions picked by the factory,
    and the terms are branches on closure constants inside ``values`` and ``put``: a closure
    per term cost 0.1 s more per kernel (scripts/diag/compile_time.py).  A 128 x 256 tile's 32
    fragments as four block calls instead of 32 fragment calls per path took 1.3 s off numba's
    4.5 s for sm90_gemm's 128x256x64_3s_pt_tma_ts; LLVM inlines the blocks (forceinline), so
    the SASS is the same code."""

    store_pair: object
    value_pair: object
    put_pair: object
    value_tile: object
    put_tile: object
    store_tile: object
    value_frags: object
    put_frags: object
    store_frags: object


def epilogue_for(var):
    """The :class:`Epilogue` of a GEMM variant."""
    return make_epilogue(var.out_dtype, var.c_dtype, var.bias_dtype, var.activation,
                         var.out_layout, var.c_layout, var.out_pairs, var.epilogue)


@functools.cache
def make_epilogue(out_dtype, c_dtype=None, bias_dtype=None, activation=None, out_layout="row",
                  c_layout="row", out_pairs=False, user=None):
    """The epilogue device functions (:class:`Epilogue`) for an output of ``out_dtype`` in
    ``out_layout``, C of ``c_dtype`` (None: no beta * C term), a bias of ``bias_dtype`` (None:
    none), an activation (None, 'relu', 'gelu', 'silu'), 32-bit column-pair stores
    (``out_pairs``, GemmVariant.out_pairs) and a user function ``user(value, row, col, *args)``
    -> value (a ``cuda.jit(device=True)`` function, or None).  A user function's arrays are the
    functions' last argument, ``eargs`` (``()`` without one).

    NOTE: ``eargs`` is an argument of its own, not ``*args``: star arguments tripled numba's
    typing time of the block functions (store_frags 41 -> 210 ms; scripts/diag/compile_time.py)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r}: one of {ACTIVATIONS}")
    if out_pairs and not (out_layout == "row" and out_dtype in ("bfloat16", "float16")):
        raise ValueError("out_pairs needs a row-major bf16 / f16 out")
    # the choices, as closure constants (each branch on them is pruned before typing)
    has_c, has_bias, has_user = c_dtype is not None, bias_dtype is not None, user is not None
    out_16 = out_dtype in ("bfloat16", "float16")
    # and the pieces, as module-level functions (no closure: each compiles once per process)
    c_f32, bias_f32 = _TO_F32.get(c_dtype, _identity), _TO_F32.get(bias_dtype, _identity)
    out_at, c_at = _INDEX[out_layout], _INDEX[c_layout]
    pack = nt.pack_f16x2 if out_dtype == "float16" else nt.pack_bf16x2

    activation_fn = _ACTIVATION_FNS[activation]

    @cuda.jit(device=True, forceinline=True)
    def values(c, bias, r, col, v0, v1, both, ldc, alpha, beta, eargs):
        # alpha, beta * C, bias, activation, the user function; column col + 1's only if both
        v0 = alpha * v0
        v1 = alpha * v1
        if has_c:
            v0 += beta * c_f32(c[c_at(r, col, ldc)])
            if both:
                v1 += beta * c_f32(c[c_at(r, col + 1, ldc)])
        if has_bias:
            v0 += bias_f32(bias[col])
            if both:
                v1 += bias_f32(bias[col + 1])
        v0 = activation_fn(v0)
        v1 = activation_fn(v1)
        if has_user:
            v0 = np.float32(user(v0, r, col, *eargs))
            if both:
                v1 = np.float32(user(v1, r, col + 1, *eargs))
        return v0, v1

    @cuda.jit(device=True, forceinline=True)
    def put(out, r, col, v0, v1, both, ldo):
        # stores of two adjacent columns (col + 1 only if both)
        if out_16:
            p = pack(v0, v1)
            out[out_at(r, col, ldo)] = np.uint16(p & 0xFFFF)
            if both:
                out[out_at(r, col + 1, ldo)] = np.uint16(p >> 16)
        else:
            out[out_at(r, col, ldo)] = v0
            if both:
                out[out_at(r, col + 1, ldo)] = v1

    @cuda.jit(device=True, forceinline=True)
    def store_pair(out, c, bias, r, col, v0, v1, N, ldc, ldo, alpha, beta, eargs):
        both = col + 1 < N
        v0, v1 = values(c, bias, r, col, v0, v1, both, ldc, alpha, beta, eargs)
        put(out, r, col, v0, v1, both, ldo)

    @cuda.jit(device=True, forceinline=True)
    def value_pair(c, bias, r, col, v0, v1, ldc, alpha, beta, eargs):
        # (np.bool_: store_pair's boolean type, so that values compiles once)
        return values(c, bias, r, col, v0, v1, np.bool_(True), ldc, alpha, beta, eargs)

    @cuda.jit(device=True, forceinline=True)
    def put_pair(out, r, col, v0, v1, ldo):
        if out_pairs:  # one 32-bit store (GemmVariant.out_pairs)
            nt.st_global_b32(out, out_at(r, col, ldo), pack(v0, v1))  # (row-major)
        else:
            put(out, r, col, v0, v1, True, ldo)

    @cuda.jit(device=True, forceinline=True)
    def value_tile(c, bias, acc, r, col, ldc, alpha, beta, eargs):
        v0, v1 = value_pair(c, bias, r, col, acc[0], acc[1], ldc, alpha, beta, eargs)
        v2, v3 = value_pair(c, bias, r + 8, col, acc[2], acc[3], ldc, alpha, beta, eargs)
        return (v0, v1, v2, v3)

    @cuda.jit(device=True, forceinline=True)
    def put_tile(out, vals, r, col, ldo):
        put_pair(out, r, col, vals[0], vals[1], ldo)
        put_pair(out, r + 8, col, vals[2], vals[3], ldo)

    @cuda.jit(device=True, forceinline=True)
    def store_tile(out, c, bias, acc, r, col, M, N, ldc, ldo, alpha, beta, eargs):
        if col < N:
            if r < M:
                store_pair(out, c, bias, r, col, acc[0], acc[1], N, ldc, ldo, alpha, beta, eargs)
            if r + 8 < M:
                store_pair(out, c, bias, r + 8, col, acc[2], acc[3], N, ldc, ldo, alpha, beta,
                           eargs)

    # BLOCK_FRAGS (8) fragments: written out, each slice a constant
    @cuda.jit(device=True, forceinline=True)
    def value_frags(c, bias, acc, r, col, ldc, alpha, beta, eargs):
        return (value_tile(c, bias, acc[0:4], r, col, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[4:8], r, col + 8, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[8:12], r, col + 16, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[12:16], r, col + 24, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[16:20], r, col + 32, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[20:24], r, col + 40, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[24:28], r, col + 48, ldc, alpha, beta, eargs)
                + value_tile(c, bias, acc[28:32], r, col + 56, ldc, alpha, beta, eargs))

    @cuda.jit(device=True, forceinline=True)
    def put_frags(out, vals, r, col, ldo):
        put_tile(out, vals[0:4], r, col, ldo)
        put_tile(out, vals[4:8], r, col + 8, ldo)
        put_tile(out, vals[8:12], r, col + 16, ldo)
        put_tile(out, vals[12:16], r, col + 24, ldo)
        put_tile(out, vals[16:20], r, col + 32, ldo)
        put_tile(out, vals[20:24], r, col + 40, ldo)
        put_tile(out, vals[24:28], r, col + 48, ldo)
        put_tile(out, vals[28:32], r, col + 56, ldo)

    @cuda.jit(device=True, forceinline=True)
    def store_frags(out, c, bias, acc, r, col, M, N, ldc, ldo, alpha, beta, eargs):
        store_tile(out, c, bias, acc[0:4], r, col, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[4:8], r, col + 8, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[8:12], r, col + 16, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[12:16], r, col + 24, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[16:20], r, col + 32, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[20:24], r, col + 40, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[24:28], r, col + 48, M, N, ldc, ldo, alpha, beta, eargs)
        store_tile(out, c, bias, acc[28:32], r, col + 56, M, N, ldc, ldo, alpha, beta, eargs)

    return Epilogue(store_pair, value_pair, put_pair, value_tile, put_tile, store_tile,
                    value_frags, put_frags, store_frags)


#: Fragments per epilogue block of a wgmma accumulator (Epilogue.value_frags ...): 64 columns,
#: one 128B-swizzled TMA store box.
BLOCK_FRAGS = 8

_NAMES = ("store_pair", "value_pair", "put_pair", "value_tile", "put_tile",
          "store_tile", "value_frags", "put_frags", "store_frags")


def eargs_source(var: GemmVariant) -> str:
    """Source of the epilogue functions' last argument in a generated kernel: ``eargs`` (its
    parameter holding a user epilogue's arrays) or ``()``."""
    return "eargs" if var.epilogue is not None else "()"


def epilogue_source(var: GemmVariant) -> str:
    """The lines by which a generated kernel module takes ``var``'s epilogue functions
    (:func:`make_epilogue`) as module globals, with the bf16/f16 decoders.  A user epilogue is
    the module global USER_EPILOGUE, which numbatc.kernels.build.load_generated sets before the
    module runs."""
    return CONVERSIONS + stores_source(var)


def stores_source(var: GemmVariant) -> str:
    """:func:`epilogue_source` without the decoders (for modules that import them already)."""
    args = (f"{var.out_dtype!r}, {var.c_dtype!r}, {var.bias_dtype!r}, {var.activation!r}, "
            f"{var.out_layout!r}, {var.c_layout!r}, {var.out_pairs!r}, "
            f"{'USER_EPILOGUE' if var.epilogue is not None else 'None'}")
    return ("\nfrom numbatc.kernels.epilogue import make_epilogue\n\n"
            f"EPILOGUE = make_epilogue({args})\n"
            + "".join(f"{name} = EPILOGUE.{name}\n" for name in _NAMES))


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
    ea = ", " + eargs_source(var)
    x = indent
    store, value, put = "store_tile", "value_tile", "put_tile"
    if var.epilogue is None and var.c_dtype is None and not var.out_pairs:
        # per-element stores either way, and at most the bias (cached) to load: one pass
        for acc, row, col in tiles:
            w(f"{x}{store}(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta{ea})")
        return
    w(f"{x}if {inside}:")
    if var.epilogue is None and var.c_dtype is None and var.bias_dtype is None:
        # nothing to load: each fragment's values, then its pair stores
        for acc, row, col in tiles:
            w(f"{x}    {put}(out, {value}(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea}), "
              f"{row}, {col}, ldo)")
    else:
        for i, (acc, row, col) in enumerate(tiles):
            w(f"{x}    ev_{i} = {value}(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea})")
        for i, (acc, row, col) in enumerate(tiles):
            w(f"{x}    {put}(out, ev_{i}, {row}, {col}, ldo)")
    w(f"{x}else:")
    for acc, row, col in tiles:
        w(f"{x}    {store}(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta{ea})")


# ---------------------------------------------------------------------------------------------
# Row reductions over a fragment's quad of lanes
# ---------------------------------------------------------------------------------------------



# The reductions over the quad of lanes that share a row of an m16n8 fragment (lanes 4g .. 4g+3):
# generated kernels that reduce rows (softmax) paste this source.
@cuda.jit(device=True, forceinline=True)
def quad_max(x):
    """max over the four lanes of a quad (the lanes that hold one fragment row)."""
    x = max(x, nt.shfl_bfly(x, 1))
    return max(x, nt.shfl_bfly(x, 2))


@cuda.jit(device=True, forceinline=True)
def quad_sum(x):
    """The sum over the four lanes of a quad, the same in every lane."""
    x = x + nt.shfl_bfly(x, 1)
    return x + nt.shfl_bfly(x, 2)


#: the generated kernels' line for :func:`quad_max` and :func:`quad_sum`
QUAD_REDUCTIONS = """
from numbatc.kernels.epilogue import quad_max, quad_sum
"""


# ---------------------------------------------------------------------------------------------
# Split-K
# ---------------------------------------------------------------------------------------------


def split_source(var, a_kmajor, b_kmajor):
    """(extra kernel parameters, the K-slice prologue, the additions to A's and B's start
    indices) of a split-K variant (see GemmVariant.split_k), all "" otherwise: blockIdx.y is
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


#: fragments (4 floats each) whose split-K partial sums are loaded together (see below)
SPLIT_GROUP = 4


def split_epilogue_source(w, tiles, var, tile_id, sync, leader, indent="    "):
    """Emit split-K's epilogue (see GemmVariant.split_k) for fragments ``tiles`` = [(acc
    expression, row expression, column expression)] in store_tile's m16n8 layout: store the
    partial sums to this split's slice of ``ws`` (float32, splits x M x N), fence, count the
    tile's arrivals in ``counters[tile_id]``; the last block to arrive sums the slices in split
    order, runs store_tile and resets the counter for the next launch.  ``sync`` synchronises
    the threads that hold fragments, ``leader`` is the condition of the one that counts."""
    ea = ", " + eargs_source(var)
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
    # NOTE: the slices are summed with the split loop outside and a group of fragments inside:
    # one slice's loads of the group's fragments are independent, so a thread waits for one
    # round trip per slice and group.  Summing each fragment's slices in turn (its own loop)
    # waited for splits x fragments round trips: on the H200 an M = 128, N = K = 4096 split 8
    # ran at 0.19x cuBLAS.  The group bounds the registers in flight (the sm90 consumers' 32
    # fragments at once spill).  The order of the additions (0 + slice 0 + slice 1 ...) is
    # the same as before, so the result is too.
    for g in range(0, len(tiles), SPLIT_GROUP):
        group = list(enumerate(tiles))[g:g + SPLIT_GROUP]
        for i, _ in group:
            w(f"{x}    p{i} = ZERO4")
        w(f"{x}    for s in range(splits):")
        w(f"{x}        sr = s * M")
        for i, (_, row, col) in group:
            w(f"{x}        p{i} = add_partial(ws, sr, p{i}, {row}, {col}, M, N)")
        for i, (_, row, col) in group:
            w(f"{x}    store_tile(out, c, bias, p{i}, {row}, {col}, M, N, ldc, ldo, alpha, "
              f"beta{ea})")
    w(f"""{x}    if {leader}:
{x}        counters[{tile_id}] = np.int32(0)""")


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


ZERO4 = (np.float32(0), np.float32(0), np.float32(0), np.float32(0))


@cuda.jit(device=True, forceinline=True)
def add_partial(ws, sr, v, r, col, M, N):
    # v plus slice sr // M's values at the fragment (r, col), (r, col + 1), (r + 8, ...).
    # NOTE: every load is issued, from the slice's first value for one outside the matrix (read
    # and dropped; store_tile skips those values), so that no load sits behind a branch:
    # branches made the compiler wait for each load before the next, one in flight per thread.
    o = (sr + r) * N + col
    ok0 = r < M and col < N
    ok1 = r < M and col + 1 < N
    ok2 = r + 8 < M and col < N
    ok3 = r + 8 < M and col + 1 < N
    z = sr * N
    x0 = ws[o if ok0 else z]
    x1 = ws[o + 1 if ok1 else z]
    x2 = ws[o + 8 * N if ok2 else z]
    x3 = ws[o + 8 * N + 1 if ok3 else z]
    v0, v1, v2, v3 = v
    return (v0 + (x0 if ok0 else np.float32(0)), v1 + (x1 if ok1 else np.float32(0)),
            v2 + (x2 if ok2 else np.float32(0)), v3 + (x3 if ok3 else np.float32(0)))


#: split-K's helpers as generated kernels take them
SPLIT_HELPERS = "\nfrom numbatc.kernels.epilogue import ZERO4, add_partial, put_partial\n"


# ---------------------------------------------------------------------------------------------
# Arguments and launch
# ---------------------------------------------------------------------------------------------


_STORAGE = {"bfloat16": "uint16", "float16": "uint16", "float32": "float32"}


@functools.cache
def signature(var: GemmVariant):
    """A GEMM kernel's argument types on the GPU: operands as typed device pointers (flat, with
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


def launch_gemm_kernel(kernel, var, grid, threads, shared_bytes, cluster, a, b, c, bias, out, m,
                       n, k, lda, ldb, ldc, ldo, alpha, beta, stream, group_m, epilogue_args,
                       prepare, split=None, kernel_signature=None):
    """Launch a generated GEMM kernel with the arguments every GEMM kernel takes (see
    :func:`signature`): prepared (returning the relaunch function, whose contract
    numbatc.kernels.sm80_gemm.launch_flat describes) where it can be, else through
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
