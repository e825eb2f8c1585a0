"""Exact-instruction float32 math for softmax-heavy kernels (PTX ISA 9.7.3, floating-point
instructions)::

    y = ex2_approx(x)        # ex2.approx.ftz.f32: 2**x, one MUFU.EX2 (subnormals flush to 0)
    y = fma_f32(a, b, c)     # fma.rn.f32: a * b + c with one rounding (one FFMA)
    y = tanh_approx(x)       # tanh.approx.f32: one MUFU.TANH (sm_75+)

numba lowers ``math.exp2`` to libdevice's ``exp2f`` -- the non-flush-to-zero ``ex2.approx.f32``,
which ptxas wraps in denormal scaling -- and never contracts ``a * b - c`` into an FMA without
fast-math, which numba turns on for the whole kernel with LLVM's no-infinities assumption (fatal
to a softmax that masks with -inf).  These two give FlashAttention's two instructions per score,
``ex2_approx(fma_f32(s, scale_log2, -row_max))``, and nothing else changes.  ex2.approx's error
is the same as exp2f's (both are ex2.approx: at most 2 ulp, PTX ISA); ex2_approx(-inf) = +0.

Whole accumulator fragments (a ``UniTuple(float32, n)`` in the m16n8 register layout of
mma.sync's and wgmma's accumulators: register v holds row g + 8 * ((v // 2) % 2) and column
8 * (v // 4) + v % 2 of the thread's slice, "row half" h = (v // 2) % 2)::

    p = frag_exp2_fma(s, scale, b0, b1)  # p[v] = ex2_approx(fma_f32(s[v], scale, b_h))
    p = frag_exp2(s, scale, b0, b1)      # p[v] = math.exp2(s[v] * scale - b_h) (libdevice)
    o = frag_scale_rows(o, a0, a1)       # o[v] * a_h
    s = frag_mask_cols(s, lim0, lim1)    # s[v] where column(v) < lim_h (int32), else -inf
    s = frag_mask_keys(s, col0, end)     # s[v] where col0 + column(v) < end, else -inf
    s = frag_mask_keys_causal(s, col0, end, row0, off)  # ... and <= row0 + 8 h + off
    l0, l1 = frag_row_sums(p)            # each half's registers added in a balanced tree
    m0, m1 = frag_row_maxes(s)           # ... and their max, as max(a, b), in the same tree

and the column-wise forms, for a transposed score tile (attention's backward holds S^T: keys
are the rows, queries the columns, and the per-query values vary along the columns).  ``c`` is
a ``UniTuple(float32, n / 2)``: entry 2 * (v // 4) + v % 2 belongs to register v's column::

    p = frag_exp2_fma_cols(s, scale, c)  # p[v] = ex2_approx(fma_f32(s[v], scale, c[col(v)]))
    p = frag_exp2_cols(s, scale, c)      # p[v] = math.exp2(s[v] * scale - c[col(v)])
    d = frag_mul_diff_cols(p, x, c)      # p[v] * (x[v] - c[col(v)])

and, by rows, ``d = frag_mul_diff_rows(p, x, c0, c1)`` (p[v] * (x[v] - c_h): dS = P (dP - D) of
a row fragment)
    s = frag_mask_cols_from(s, lo0, lo1) # s[v] where column(v) >= lo_h (int32), else -inf

are the same instructions as the expressions written register by register (the same asm, the
same fmul / fadd order, a select), in one call: a softmax over a 128-key tile was ~1000 numba
statements each typed and lowered on its own (0.6 s of sm90 attention's 2.3 s compile on a
2-core host).

``tanh_approx``: libdevice's ``tanhf`` (what ``math.tanh`` becomes) is about 20 instructions
(ex2, rcp, an odd polynomial, selects); tanh.approx.f32 is one MUFU.TANH with a maximum
relative error of 2**-10.987 (PTX ISA): below bf16's rounding (2**-8), at f16's (2**-11), far
above float32's -- for epilogues whose output is bf16 or f16.
Architectures: all (tanh_approx: sm_75 and newer).
"""

from llvmlite import ir
from numba import types

from intrinsics._core import SM75, asm, intrinsic, require_arch

__all__ = ["ex2_approx", "fma_f32", "frag_exp2", "frag_exp2_cols", "frag_exp2_fma",
           "frag_exp2_fma_cols", "frag_mask_cols", "frag_mask_cols_from", "frag_mask_keys",
           "frag_mask_keys_causal", "frag_mul_diff_cols", "frag_mul_diff_rows", "frag_row_maxes",
           "frag_row_sums", "frag_scale_rows", "frag_tree_order", "tanh_approx"]

F32 = ir.FloatType()


def _check(name, args):
    for ty in args:
        if not isinstance(ty, (types.Float, types.Integer)):
            from numba.cuda.core.errors import NumbaTypeError

            raise NumbaTypeError(f"{name} takes float32 values, got {ty}")


@intrinsic
def ex2_approx(typingctx, x):
    """2**x by ``ex2.approx.ftz.f32`` (float32 in and out)."""
    _check("ex2_approx", (x,))
    sig = types.float32(x)

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return asm(builder, "ex2.approx.ftz.f32 $0, $1;", ["=f", "f"], [F32], [v],
                   volatile=False)[0]

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c by ``fma.rn.f32`` (one rounding; float32 in and out)."""
    _check("fma_f32", (a, b, c))
    sig = types.float32(a, b, c)

    def codegen(context, builder, sig, args):
        vals = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
        return asm(builder, "fma.rn.f32 $0, $1, $2, $3;", ["=f", "f", "f", "f"], [F32], vals,
                   volatile=False)[0]

    return sig, codegen


@intrinsic
def tanh_approx(typingctx, x):
    """tanh(x) by ``tanh.approx.f32`` (float32 in and out; sm_75 and newer)."""
    _check("tanh_approx", (x,))
    sig = types.float32(x)

    def codegen(context, builder, sig, args):
        require_arch("tanh.approx.f32", SM75)
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return asm(builder, "tanh.approx.f32 $0, $1;", ["=f", "f"], [F32], [v],
                   volatile=False)[0]

    return sig, codegen


# ---------------------------------------------------------------------------------------------
# Whole fragments
# ---------------------------------------------------------------------------------------------


def _frag_type(name, ty):
    if not (isinstance(ty, types.UniTuple) and ty.dtype == types.float32):
        from numba.cuda.core.errors import NumbaTypeError

        raise NumbaTypeError(f"{name} takes a UniTuple(float32, n) fragment, got {ty}")


def _half(v):
    """The row half of fragment register v (0: row g, 1: row g + 8)."""
    return (v // 2) % 2


def _f32_args(context, builder, sig, args, first=1):
    return [context.cast(builder, v, t, types.float32)
            for v, t in zip(args[first:], sig.args[first:])]


def _exp2_fma(builder, x, scale, bias):
    """ex2.approx.ftz(fma.rn(x, scale, bias)) of three float32 IR values: the two instructions
    the fragment forms emit per register."""
    f = asm(builder, "fma.rn.f32 $0, $1, $2, $3;", ["=f", "f", "f", "f"], [F32],
            [x, scale, bias], volatile=False)[0]
    return asm(builder, "ex2.approx.ftz.f32 $0, $1;", ["=f", "f"], [F32], [f], volatile=False)[0]


@intrinsic
def frag_exp2_fma(typingctx, s, scale, b0, b1):
    """``p[v] = ex2.approx.ftz(fma.rn(s[v], scale, b_h))`` for every register v of fragment
    ``s`` (h its row half): FlashAttention's two instructions per score."""
    _frag_type("frag_exp2_fma", s)
    _check("frag_exp2_fma", (scale, b0, b1))
    sig = s(s, scale, b0, b1)

    def codegen(context, builder, sig, args):
        scale_v, *bases = _f32_args(context, builder, sig, args)
        out = ir.Constant(args[0].type, ir.Undefined)
        for v in range(sig.args[0].count):
            e = _exp2_fma(builder, builder.extract_value(args[0], v), scale_v, bases[_half(v)])
            out = builder.insert_value(out, e, v)
        return out

    return sig, codegen


@intrinsic
def frag_exp2(typingctx, s, scale, b0, b1):
    """``p[v] = exp2f(s[v] * scale - b_h)`` for every register v of fragment ``s`` (h its row
    half): what numba compiles ``math.exp2(s[v] * scale - b)`` of float32 values to -- a
    multiply, a subtraction and libdevice's ``__nv_exp2f`` (ex2.approx with denormal scaling),
    not :func:`frag_exp2_fma`'s two instructions."""
    _frag_type("frag_exp2", s)
    _check("frag_exp2", (scale, b0, b1))
    sig = s(s, scale, b0, b1)

    def codegen(context, builder, sig, args):
        scale_v, *bases = _f32_args(context, builder, sig, args)
        return _exp2f_frag(builder, args[0], sig.args[0].count, scale_v,
                           lambda v: bases[_half(v)])

    return sig, codegen


def _exp2f_frag(builder, s, n, scale, bias):
    """exp2f(s[v] * scale - bias(v)) of the n registers of fragment ``s`` (an IR aggregate):
    fmul, fsub and libdevice's __nv_exp2f each, as numba compiles ``math.exp2``."""
    from numba.cuda import cgutils

    exp2f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(F32, (F32,)),
                                           "__nv_exp2f")
    out = ir.Constant(s.type, ir.Undefined)
    for v in range(n):
        x = builder.fsub(builder.fmul(builder.extract_value(s, v), scale), bias(v))
        out = builder.insert_value(out, builder.call(exp2f, [x]), v)
    return out


@intrinsic
def frag_scale_rows(typingctx, o, a0, a1):
    """``o[v] * a_h`` for every register v of fragment ``o`` (h its row half): a running output
    rescaled by its rows' factors."""
    _frag_type("frag_scale_rows", o)
    _check("frag_scale_rows", (a0, a1))
    sig = o(o, a0, a1)

    def codegen(context, builder, sig, args):
        factors = _f32_args(context, builder, sig, args)
        out = ir.Constant(args[0].type, ir.Undefined)
        for v in range(sig.args[0].count):
            out = builder.insert_value(
                out, builder.fmul(builder.extract_value(args[0], v), factors[_half(v)]), v)
        return out

    return sig, codegen


def _column_mask(name, keep_op, doc):
    """The intrinsic ``name(s, lim0, lim1)``: ``s[v]`` where ``column(v) keep_op lim_h`` (int32
    limits, h the register's row half), else -inf."""

    def typer(typingctx, s, lim0, lim1):
        _frag_type(name, s)
        for ty in (lim0, lim1):
            if not isinstance(ty, types.Integer):
                from numba.cuda.core.errors import NumbaTypeError

                raise NumbaTypeError(f"{name} takes int32 limits, got {ty}")
        sig = s(s, types.int32, types.int32)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            lims = [context.cast(builder, v, t, types.int32)
                    for v, t in zip(args[1:], sig.args[1:])]
            neg_inf = ir.Constant(F32, float("-inf"))
            out = ir.Constant(args[0].type, ir.Undefined)
            for v in range(sig.args[0].count):
                keep = builder.icmp_signed(keep_op, ir.Constant(i32, 8 * (v // 4) + v % 2),
                                           lims[_half(v)])
                out = builder.insert_value(
                    out, builder.select(keep, builder.extract_value(args[0], v), neg_inf), v)
            return out

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


frag_mask_cols = _column_mask(
    "frag_mask_cols", "<",
    """``s[v]`` where the register's column 8 * (v // 4) + v % 2 is below ``lim_h`` (int32; h
    its row half), else -inf: a score tile masked from a per-row column limit on.""")

frag_mask_cols_from = _column_mask(
    "frag_mask_cols_from", ">=",
    """``s[v]`` where the register's column 8 * (v // 4) + v % 2 is at least ``lo_h`` (int32; h
    its row half), else -inf: the lower-bound twin of :func:`frag_mask_cols` (a causal mask on a
    transposed score tile keeps the queries from the key's diagonal on; a limit above every
    column masks the whole row).""")


def _key_mask(name, causal, doc):
    """The intrinsic ``name(s, col0, end[, row0, off])``: ``s[v]`` where the register's key
    ``col0 + column(v)`` is below ``end`` (and, ``causal``, at most ``row0 + 8 h + off``, h its
    row half), else -inf.  The arguments are 64-bit integers; the keys must lie in [0, 2**32)
    and ``end`` below 2**32 (attention's key counts are below 2**31): each register is then one
    32-bit unsigned compare with its row half's end (the causal one min(end, row0 + 8 h + off +
    1), clamped at 0), not two 64-bit compares."""

    def typer(typingctx, s, col0, end, rows):
        _frag_type(name, s)
        for ty in (col0, end, *rows):
            if not isinstance(ty, types.Integer):
                from numba.cuda.core.errors import NumbaTypeError

                raise NumbaTypeError(f"{name} takes integer keys and bounds, got {ty}")
        sig = s(s, *(types.int64,) * (2 + len(rows)))

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            col0, end, *rows = [context.cast(builder, v, t, types.int64)
                                for v, t in zip(args[1:], sig.args[1:])]
            i32 = ir.IntType(32)
            zero = ir.Constant(i64, 0)
            ends = [end, end]
            if causal:  # the keys row g and row g + 8 see end at min(end, row + off + 1)
                for h in (0, 1):
                    seen = builder.add(builder.add(rows[0], ir.Constant(i64, 8 * h + 1)),
                                       rows[1])
                    ends[h] = builder.select(builder.icmp_signed("<", seen, end), seen, end)
            # keys and ends lie in [0, 2**32): one 32-bit unsigned compare a register
            ends = [builder.trunc(builder.select(builder.icmp_signed("<", e, zero), zero, e), i32)
                    for e in ends]
            base = builder.trunc(col0, i32)
            neg_inf = ir.Constant(F32, float("-inf"))
            out = ir.Constant(args[0].type, ir.Undefined)
            for v in range(sig.args[0].count):
                col = builder.add(base, ir.Constant(i32, 8 * (v // 4) + v % 2))
                keep = builder.icmp_unsigned("<", col, ends[_half(v)])
                out = builder.insert_value(
                    out, builder.select(keep, builder.extract_value(args[0], v), neg_inf), v)
            return out

        return sig, codegen

    # (numba's intrinsic lowering needs a fixed parameter list: one typer per form)
    if causal:
        def typed(typingctx, s, col0, end, row0, off):
            return typer(typingctx, s, col0, end, (row0, off))
    else:
        def typed(typingctx, s, col0, end):
            return typer(typingctx, s, col0, end, ())
    typed.__name__ = name
    typed.__doc__ = doc
    return intrinsic(typed)


frag_mask_keys = _key_mask(
    "frag_mask_keys", False,
    """``s[v]`` where the register's key ``col0 + column(v)`` (int64) is below ``end``, else
    -inf: a score tile masked past the last key (where a kernel has no registers for
    :func:`frag_mask_cols`' per-row limits).  Keys in [0, 2**32), ``end`` below 2**32.""")

frag_mask_keys_causal = _key_mask(
    "frag_mask_keys_causal", True,
    """``s[v]`` where the register's key ``col = col0 + column(v)`` (int64) is below ``end`` and
    at most ``row0 + 8 h + off`` (h its row half: bottom-right-aligned causal, ``off`` = keys -
    queries), else -inf: one 32-bit compare per register, against min(end, row0 + 8 h + off +
    1).  Keys in [0, 2**32), ``end`` below 2**32.""")


def _col_type(name, frag, cols):
    """``cols`` must be a UniTuple(float32, frag.count // 2): one value per column of ``frag``."""
    if not (isinstance(cols, types.UniTuple) and cols.dtype == types.float32
            and 2 * cols.count == frag.count):
        from numba.cuda.core.errors import NumbaTypeError

        raise NumbaTypeError(f"{name} takes one float32 per column of the fragment: a "
                             f"UniTuple(float32, {frag.count // 2}), got {cols}")


def _col(v):
    """The entry of a column tuple that belongs to fragment register v."""
    return 2 * (v // 4) + v % 2


@intrinsic
def frag_exp2_fma_cols(typingctx, s, scale, c):
    """``p[v] = ex2.approx.ftz(fma.rn(s[v], scale, c[2 * (v // 4) + v % 2]))`` for every register
    v of fragment ``s``: :func:`frag_exp2_fma` with one bias per column (``c``: a
    UniTuple(float32, n / 2)) -- P^T of a transposed score tile, whose queries are columns."""
    _frag_type("frag_exp2_fma_cols", s)
    _check("frag_exp2_fma_cols", (scale,))
    _col_type("frag_exp2_fma_cols", s, c)
    sig = s(s, scale, c)

    def codegen(context, builder, sig, args):
        scale_v = context.cast(builder, args[1], sig.args[1], types.float32)
        out = ir.Constant(args[0].type, ir.Undefined)
        for v in range(sig.args[0].count):
            e = _exp2_fma(builder, builder.extract_value(args[0], v), scale_v,
                          builder.extract_value(args[2], _col(v)))
            out = builder.insert_value(out, e, v)
        return out

    return sig, codegen


@intrinsic
def frag_exp2_cols(typingctx, s, scale, c):
    """``p[v] = exp2f(s[v] * scale - c[2 * (v // 4) + v % 2])`` for every register v of fragment
    ``s``: :func:`frag_exp2` (a multiply, a subtraction, libdevice's ``__nv_exp2f``) with one
    bias per column (``c``: a UniTuple(float32, n / 2)) -- P^T of a transposed score tile with
    the exponential ``math.exp2`` compiles to."""
    _frag_type("frag_exp2_cols", s)
    _check("frag_exp2_cols", (scale,))
    _col_type("frag_exp2_cols", s, c)
    sig = s(s, scale, c)

    def codegen(context, builder, sig, args):
        scale_v = context.cast(builder, args[1], sig.args[1], types.float32)
        return _exp2f_frag(builder, args[0], sig.args[0].count, scale_v,
                           lambda v: builder.extract_value(args[2], _col(v)))

    return sig, codegen


def _same_fragments(name, p, x):
    """``p`` and ``x`` are float32 fragments of one register count."""
    _frag_type(name, p)
    _frag_type(name, x)
    if x.count != p.count:
        from numba.cuda.core.errors import NumbaTypeError

        raise NumbaTypeError(f"{name}: fragments of {p.count} and {x.count} registers")


def _mul_diff(builder, p, x, n, sub):
    """p[v] * (x[v] - sub(v)) of the n registers of fragments ``p`` and ``x`` (IR aggregates):
    fsub then fmul, each rounded."""
    out = ir.Constant(p.type, ir.Undefined)
    for v in range(n):
        d = builder.fsub(builder.extract_value(x, v), sub(v))
        out = builder.insert_value(out, builder.fmul(builder.extract_value(p, v), d), v)
    return out


@intrinsic
def frag_mul_diff_rows(typingctx, p, x, c0, c1):
    """``p[v] * (x[v] - c_h)`` for every register v (h its row half; ``fsub`` then ``fmul``,
    each rounded): attention's dS = P * (dP - D) on a row fragment, D one value per row."""
    _same_fragments("frag_mul_diff_rows", p, x)
    _check("frag_mul_diff_rows", (c0, c1))
    sig = p(p, x, c0, c1)

    def codegen(context, builder, sig, args):
        rows = _f32_args(context, builder, sig, args, first=2)
        return _mul_diff(builder, args[0], args[1], sig.args[0].count, lambda v: rows[_half(v)])

    return sig, codegen


@intrinsic
def frag_mul_diff_cols(typingctx, p, x, c):
    """``p[v] * (x[v] - c[2 * (v // 4) + v % 2])`` for every register v (``fsub`` then ``fmul``,
    each rounded): attention's dS = P * (dP - D) on a transposed tile, D one value per query
    column (``c``: a UniTuple(float32, n / 2))."""
    _same_fragments("frag_mul_diff_cols", p, x)
    _col_type("frag_mul_diff_cols", p, c)
    sig = p(p, x, c)

    def codegen(context, builder, sig, args):
        return _mul_diff(builder, args[0], args[1], sig.args[0].count,
                         lambda v: builder.extract_value(args[2], _col(v)))

    return sig, codegen


def frag_tree_order(regs):
    """The balanced reduction order of :func:`frag_row_sums` (and of generated kernels that add
    registers the same way): pairs of neighbours, an odd last one carried, until one is left.
    Returns nested pairs of register indices."""
    terms = list(regs)
    while len(terms) > 1:
        nxt = [(terms[i], terms[i + 1]) for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms[0]


@intrinsic
def frag_row_sums(typingctx, p):
    """``(sum of row half 0's registers, sum of row half 1's)`` of fragment ``p``, each added in
    a balanced tree of neighbours (:func:`frag_tree_order`: shorter dependency chains than a
    left fold; the order fixes the float32 result)."""
    _frag_type("frag_row_sums", p)
    sig = types.UniTuple(types.float32, 2)(p)

    def codegen(context, builder, sig, args):
        def add(node):
            if isinstance(node, tuple):
                return builder.fadd(add(node[0]), add(node[1]))
            return builder.extract_value(args[0], node)

        n = sig.args[0].count
        sums = [add(frag_tree_order([v for v in range(n) if _half(v) == h])) for h in (0, 1)]
        return context.make_tuple(builder, sig.return_type, sums)

    return sig, codegen


@intrinsic
def frag_row_maxes(typingctx, s):
    """``(max of row half 0's registers, max of row half 1's)`` of fragment ``s``, in
    :func:`frag_tree_order`'s pairs, each pair as numba-cuda compiles ``max(a, b)`` of two
    float32 (libdevice's ``__nv_fmaxf``: max.f32, the other value where one is NaN)."""
    _frag_type("frag_row_maxes", s)
    sig = types.UniTuple(types.float32, 2)(s)

    def codegen(context, builder, sig, args):
        from numba.cuda import cgutils

        fmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(F32, (F32, F32)),
                                              "__nv_fmaxf")

        def mx(node):
            if isinstance(node, tuple):
                return builder.call(fmax, [mx(node[0]), mx(node[1])])
            return builder.extract_value(args[0], node)

        n = sig.args[0].count
        maxes = [mx(frag_tree_order([v for v in range(n) if _half(v) == h])) for h in (0, 1)]
        return context.make_tuple(builder, sig.return_type, maxes)

    return sig, codegen
