"""Packing and unpacking tensor-core register operands (PTX ISA 9.7.9.21, cvt; 9.7.9.9, mov).

mma.sync and wgmma take their A/B operands as 32-bit registers holding two f16/bf16 values (the
element with the lower column index in the low half), four 8-bit values, or one tf32 value.  These
intrinsics build and split such registers from float32 values::

    r = pack_bf16x2(lo, hi)          # cvt.rn.bf16x2.f32 $0, hi, lo
    lo, hi = unpack_bf16x2(r)
    r = pack_e4m3x4(x0, x1, x2, x3)  # x0 in the lowest byte
    t = cvt_tf32(x)                  # cvt.rna.tf32.f32
    pa = frag_pack_bf16x2(p)         # a float32 fragment's pairs packed: k A fragments of 4
    x = f32_from_bits(r)             # the same 32 bits seen as float32 (tcgen05.ld results)
"""

from llvmlite import ir
from numba import types

from intrinsics._core import SM80, SM89, asm, check_type, intrinsic, require_arch, I32

__all__ = [
    "bits_from_f32",
    "cvt_tf32",
    "f32_from_bits",
    "frag_pack_bf16x2",
    "frag_pack_f16x2",
    "pack_bf16x2",
    "pack_e4m3x4",
    "pack_e5m2x4",
    "pack_f16x2",
    "unpack_bf16x2",
    "unpack_f16x2",
]

F32 = ir.FloatType()


def _check_floats(name, args):
    for ty in args:
        if not isinstance(ty, types.Float):
            from numba.cuda.core.errors import NumbaTypeError

            raise NumbaTypeError(f"{name} takes float32 values, got {ty}")


def _as_f32(context, builder, sig, args):
    return [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]


def _pair_packer(ptx_type):
    name = f"cvt.rn.{ptx_type}x2.f32"

    def typer(typingctx, lo, hi):
        _check_floats(name, (lo, hi))
        sig = types.uint32(lo, hi)

        def codegen(context, builder, sig, args):
            require_arch(name, SM80)
            lo, hi = _as_f32(context, builder, sig, args)
            # The first source operand lands in the upper half.
            (out,) = asm(builder, f"{name} $0, $1, $2;", ["=r", "f", "f"], [I32], [hi, lo], volatile=False)
            return out

        return sig, codegen

    typer.__name__ = f"pack_{ptx_type}x2"
    typer.__doc__ = (
        f"Emits ``{name} $0, hi, lo;`` (PTX ISA 9.7.9.21): rounds two float32 values to nearest "
        f"{ptx_type} and packs them, ``lo`` in bits 0-15. Returns uint32. Needs sm_80 or newer."
    )
    return intrinsic(typer)


pack_bf16x2 = _pair_packer("bf16")
pack_f16x2 = _pair_packer("f16")


def _fragment_packer(ptx_type):
    name = f"cvt.rn.{ptx_type}x2.f32"

    def typer(typingctx, p):
        if not (isinstance(p, types.UniTuple) and p.dtype == types.float32 and p.count % 8 == 0):
            from numba.cuda.core.errors import NumbaTypeError

            raise NumbaTypeError(f"frag_pack_{ptx_type}x2 takes a UniTuple(float32, 8k) "
                                 f"fragment, got {p}")
        a_frag = types.UniTuple(types.uint32, 4)
        sig = types.UniTuple(a_frag, p.count // 8)(p)

        def codegen(context, builder, sig, args):
            require_arch(name, SM80)
            frags = []
            for c in range(sig.args[0].count // 8):
                regs = []
                for q in range(4):
                    lo = builder.extract_value(args[0], 8 * c + 2 * q)
                    hi = builder.extract_value(args[0], 8 * c + 2 * q + 1)
                    # The first source operand lands in the upper half (as pack_*x2).
                    regs.append(asm(builder, f"{name} $0, $1, $2;", ["=r", "f", "f"], [I32],
                                    [hi, lo], volatile=False)[0])
                frags.append(context.make_tuple(builder, a_frag, regs))
            return context.make_tuple(builder, sig.return_type, frags)

        return sig, codegen

    typer.__name__ = f"frag_pack_{ptx_type}x2"
    typer.__doc__ = (
        f"A float32 fragment ``p`` (8k registers) as k tensor-core A fragments of {ptx_type}: "
        f"registers 2i, 2i + 1 packed as pack_{ptx_type}x2 does (``{name}``), four registers "
        "per fragment -- a softmax's P (an m16n8 accumulator's k16 columns) as the A operand of "
        "the next mma / register-sourced wgmma.  Returns UniTuple(UniTuple(uint32, 4), k).  "
        "Needs sm_80 or newer."
    )
    return intrinsic(typer)


frag_pack_bf16x2 = _fragment_packer("bf16")
frag_pack_f16x2 = _fragment_packer("f16")


@intrinsic
def unpack_bf16x2(typingctx, packed):
    """Splits a register of two bf16 values into float32 ``(lo, hi)``, exactly. A bf16 value is
    the upper half of a float32, so this is two bit operations: ``lo = r << 16``,
    ``hi = r & 0xffff0000``; no PTX instruction of its own."""
    check_type("unpack_bf16x2", packed, types.uint32, "the packed register")
    sig = types.UniTuple(types.float32, 2)(packed)

    def codegen(context, builder, sig, args):
        (r,) = args
        lo = builder.bitcast(builder.shl(r, ir.Constant(I32, 16)), F32)
        hi = builder.bitcast(builder.and_(r, ir.Constant(I32, 0xFFFF0000)), F32)
        return context.make_tuple(builder, sig.return_type, [lo, hi])

    return sig, codegen


@intrinsic
def unpack_f16x2(typingctx, packed):
    """Emits ``{ .reg .f16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }``
    (PTX ISA 9.7.9.9, 9.7.9.21): splits two packed f16 values into float32 ``(lo, hi)``, exactly."""
    check_type("unpack_f16x2", packed, types.uint32, "the packed register")
    sig = types.UniTuple(types.float32, 2)(packed)
    template = "{ .reg .f16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }"

    def codegen(context, builder, sig, args):
        outs = asm(builder, template, ["=f", "=f", "r"], [F32, F32], [args[0]], volatile=False)
        return context.make_tuple(builder, sig.return_type, outs)

    return sig, codegen


def _quad_packer(ptx_type):
    name = f"cvt.rn.satfinite.{ptx_type}x2.f32"
    # Two cvt's of pairs, then the halves joined: x0 | x1 << 8 | x2 << 16 | x3 << 24.
    template = (
        "{ .reg .b16 lo, hi; "
        f"{name} lo, $2, $1; {name} hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }"
    )

    def typer(typingctx, x0, x1, x2, x3):
        _check_floats(name, (x0, x1, x2, x3))
        sig = types.uint32(x0, x1, x2, x3)

        def codegen(context, builder, sig, args):
            require_arch(name, SM89)
            values = _as_f32(context, builder, sig, args)
            (out,) = asm(builder, template, ["=r", "f", "f", "f", "f"], [I32], values, volatile=False)
            return out

        return sig, codegen

    typer.__name__ = f"pack_{ptx_type}x4"
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.9.21): rounds four float32 values to {ptx_type} "
        "(saturating to the largest finite value) and packs them, ``x0`` in the lowest byte. "
        "Returns uint32. Needs sm_89 or newer."
    )
    return intrinsic(typer)


pack_e4m3x4 = _quad_packer("e4m3")
pack_e5m2x4 = _quad_packer("e5m2")


@intrinsic
def cvt_tf32(typingctx, x):
    """Emits ``cvt.rna.tf32.f32 $0, $1;`` (PTX ISA 9.7.9.21): rounds float32 to tf32 (nearest,
    ties away from zero), returned as the uint32 register mma.sync's tf32 forms take. Needs sm_80."""
    _check_floats("cvt.rna.tf32.f32", (x,))
    sig = types.uint32(x)

    def codegen(context, builder, sig, args):
        require_arch("cvt.rna.tf32.f32", SM80)
        (value,) = _as_f32(context, builder, sig, args)
        (out,) = asm(builder, "cvt.rna.tf32.f32 $0, $1;", ["=r", "f"], [I32], [value], volatile=False)
        return out

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx, bits):
    """The 32 bits of ``bits`` (a 32-bit integer) reinterpreted as float32: a register move,
    no conversion (LLVM ``bitcast``; PTX ``mov.b32``).  tcgen05.ld returns accumulator cells as
    uint32 registers; this reads an f32 accumulator from them.  All architectures."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 32:
        from numba.cuda.core.errors import NumbaTypeError

        raise NumbaTypeError(f"f32_from_bits takes a 32-bit integer, got {bits}")
    sig = types.float32(bits)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], F32)

    return sig, codegen


@intrinsic
def bits_from_f32(typingctx, x):
    """The 32 bits of float32 ``x`` as a uint32 (the inverse of :func:`f32_from_bits`).  All
    architectures."""
    _check_floats("bits_from_f32", (x,))
    sig = types.uint32(x)

    def codegen(context, builder, sig, args):
        (value,) = _as_f32(context, builder, sig, args)
        return builder.bitcast(value, I32)

    return sig, codegen
