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

``tanh_approx``: libdevice's ``tanhf`` (what ``math.tanh`` becomes) is about 20 instructions
(ex2, rcp, an odd polynomial, selects); tanh.approx.f32 is one MUFU.TANH with a maximum
relative error of 2**-10.987 (PTX ISA): below bf16's rounding (2**-8), at f16's (2**-11), far
above float32's -- for epilogues whose output is bf16 or f16.
Architectures: all (tanh_approx: sm_75 and newer).
"""

from llvmlite import ir
from numba import types

from intrinsics._core import SM75, asm, intrinsic, require_arch

__all__ = ["ex2_approx", "fma_f32", "tanh_approx"]

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
