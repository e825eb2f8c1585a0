"""What every GEMM kernel shares after its main loop, whatever computed the accumulators
(mma.sync, wgmma, tcgen05): the problem's variant, the fused epilogue's device functions, split-K,
and the common kernel arguments and launch.

- :class:`GemmVariant`: operand layouts, dtypes, the epilogue (alpha, beta * C, bias,
  activation, a user function), split-K and paired stores -- the problem a GEMM kernel is
  specialised for besides its tile; :func:`variant_for` reads it off a problem.
- :func:`epilogue_source` / :func:`full_tile_epilogue`: the device functions (``store_tile``,
  ``value_tile``, ``put_tile`` ...) that store m16n8-shaped accumulator fragments, and the code
  that calls them for a block's fragments; :func:`block_source` the same over blocks of
  fragments (``store_frags`` ..., fewer calls for numba to type).
- :func:`split_source`, :func:`split_epilogue_source`, :data:`SPLIT_HELPERS`: split-K's kernel
  parameters, its K-slice prologue and its deterministic reduction of the slices.
- :func:`signature`, :func:`launch_gemm_kernel`: the arguments every GEMM kernel takes, and its
  launch (prepared where it can be; numbatc.kernels.sm80_gemm.launch_flat describes the
  contract).
- :data:`QUAD_REDUCTIONS`: max / sum over the quad of lanes that share a fragment row, for the
  kernels that reduce rows (softmax, attention).

The GEMM kernels (sm80_gemm, sm90_gemm, sm100_gemm, sm100_scaled_gemm) paste these sources into
their generated modules and compile them through numbatc.kernels.build.
"""

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["GemmVariant", "variant_for", "CONVERSIONS", "QUAD_REDUCTIONS", "SPLIT_HELPERS",
           "BLOCK_FRAGS", "epilogue_source", "stores_source", "block_source", "full_tile_epilogue",
           "split_source", "split_epilogue_source",
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
# The epilogue
# ---------------------------------------------------------------------------------------------


def to_f32_expr(dtype):
    """Expression turning stored bits/values ``x`` of ``dtype`` into float32."""
    if dtype == "bfloat16":
        return "bf16_to_f32(x)"
    if dtype == "float16":
        return "f16_to_f32(x)"
    return "x"


def _flat(layout, row, col, ld):
    """Flat element index of (row, col) in a matrix of the given layout and leading dimension."""
    return f"({row}) * {ld} + ({col})" if layout == "row" else f"({row}) + ({col}) * {ld}"


CONVERSIONS = '''

@cuda.jit(device=True, forceinline=True)
def bf16_to_f32(x):
    return nt.unpack_bf16x2(np.uint32(x))[0]


@cuda.jit(device=True, forceinline=True)
def f16_to_f32(x):
    return nt.unpack_f16x2(np.uint32(x))[0]
'''


def stores_source(var: GemmVariant) -> str:
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
    v0 += beta * {to_f32_expr(var.c_dtype)}
    if both:
        x = c[{c1}]
        v1 += beta * {to_f32_expr(var.c_dtype)}"""
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
    v0 += {to_f32_expr(var.bias_dtype)}
    if both:
        x = bias[col + 1]
        v1 += {to_f32_expr(var.bias_dtype)}"""
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


def epilogue_source(var: GemmVariant, frags=None) -> str:
    """Source of the epilogue helpers (with the bf16/f16 decoders they use), for kernels that
    store m16n8-shaped fragments (mma.sync's accumulator; wgmma's and tcgen05's are stored in
    the same layout); with ``frags``, also :func:`block_source`'s functions over that many."""
    return CONVERSIONS + stores_source(var) + (block_source(var, frags) if frags else "")


#: Fragments per epilogue block of a wgmma accumulator (see block_source): 64 columns, one
#: 128B-swizzled TMA store box.
BLOCK_FRAGS = 8


def block_source(var: GemmVariant, frags=BLOCK_FRAGS) -> str:
    """``value_frags``, ``put_frags`` and ``store_frags``: value_tile, put_tile and store_tile
    over ``frags`` consecutive fragments of one accumulator (registers 4q .. 4q + 3 of ``acc``,
    a UniTuple of 4 * frags, hold fragment q, at columns col + 8q; wgmma's layout).

    NOTE: compile time.  numba types every call site of a device function anew, and a kernel's
    own statements several times over (a call costs ~1-3 ms on a 2-core host); its body it
    types once per signature.  A 128 x 256 tile's 32 fragments as four block calls instead of
    32 fragment calls per path took 1.3 s off numba's 4.5 s for sm90_gemm's
    128x256x64_3s_pt_tma_ts (scripts/diag/compile_time.py); LLVM inlines the blocks
    (forceinline), so the SASS is the same code."""
    ea = ", eargs" if var.epilogue is not None else ""
    lines = [f"""

@cuda.jit(device=True, forceinline=True)
def value_frags(c, bias, acc, r, col, ldc, alpha, beta{ea}):
    return ("""]
    lines += [f"        value_tile(c, bias, acc[{4 * q}:{4 * q + 4}], r, col + {8 * q}, ldc, alpha, "
              f"beta{ea}) +" for q in range(frags)]
    lines[-1] = lines[-1][:-2] + ")"
    lines.append("""

@cuda.jit(device=True, forceinline=True)
def put_frags(out, vals, r, col, ldo):""")
    lines += [f"    put_tile(out, vals[{4 * q}:{4 * q + 4}], r, col + {8 * q}, ldo)"
              for q in range(frags)]
    lines.append(f"""

@cuda.jit(device=True, forceinline=True)
def store_frags(out, c, bias, acc, r, col, M, N, ldc, ldo, alpha, beta{ea}):""")
    lines += [f"    store_tile(out, c, bias, acc[{4 * q}:{4 * q + 4}], r, col + {8 * q}, M, N, ldc, "
              f"ldo, alpha, beta{ea})" for q in range(frags)]
    return "\n".join(lines) + "\n"


def full_tile_epilogue(w, tiles, var, inside, indent="    ", unit="tile"):
    """Emit the epilogue of fragments ``tiles`` = [(acc, row, column expressions)]: when
    ``inside`` (the block's whole tile lies in the matrix) every fragment's values first
    (value_tile: its loads of c and of a user epilogue's arrays), then every store (put_tile);
    otherwise store_tile per fragment with its bounds checks.  With nothing to load (no c, no
    user epilogue) the inside path exists only for out_pairs' 32-bit stores.  ``unit="frags"``:
    each entry of ``tiles`` is a block of fragments instead, stored by block_source's functions.

    NOTE: store_tile per fragment interleaves each fragment's loads with the previous one's
    stores to ``out``, which may alias c or a user epilogue's arrays, so neither compiler may
    move a load above a store: every fragment waited a full memory latency in turn (measured:
    a bias + GELU + residual user epilogue cost +32 % over the plain GEMM at 4096^3 on the
    H200).  Values first lets all the loads be in flight together."""
    ea = ", eargs" if var.epilogue is not None else ""
    x = indent
    store, value, put = f"store_{unit}", f"value_{unit}", f"put_{unit}"
    if var.epilogue is None and var.c_dtype is None and not var.out_pairs:
        # per-element stores either way, and at most the bias (cached) to load: one pass
        for acc, row, col in tiles:
            w(f"{x}{store}(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta)")
        return
    w(f"{x}if {inside}:")
    if var.epilogue is None and var.c_dtype is None and var.bias_dtype is None:
        # nothing to load: each fragment's values, then its pair stores
        for acc, row, col in tiles:
            w(f"{x}    {put}(out, {value}(c, bias, {acc}, {row}, {col}, ldc, alpha, beta), "
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
'''


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
