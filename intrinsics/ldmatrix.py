"""Warp-collective fragment movement: ``ldmatrix``, ``stmatrix`` and ``movmatrix`` on 8x8 matrices
of 16-bit elements (PTX ISA 9.7.14.5.15 ldmatrix, 9.7.14.5.16 stmatrix, 9.7.14.5.17 movmatrix).

Addressing (ldmatrix and stmatrix): every lane passes the address of one matrix *row* of 16 bytes;
for ``.xN`` lanes ``8*m .. 8*m+7`` give the eight rows of matrix ``m``, and the addresses of lanes
``8*N ..`` are ignored (pass anything valid).  Each row address must be 16-byte aligned.  Lane ``l``
then holds, in register ``m``, elements ``(l // 4, 2*(l % 4))`` and ``(l // 4, 2*(l % 4) + 1)`` of
matrix ``m`` (low half first) -- the mma.sync A/B fragment layout.  With ``.trans`` it holds
``(2*(l % 4), l // 4)`` and ``(2*(l % 4) + 1, l // 4)`` instead.

Calls, with ``array`` a shared array and ``index`` this lane's row start in elements::

    r = ldmatrix_x1(array, index)                 # uint32
    r0, r1, r2, r3 = ldmatrix_x4(array, index)    # 4 x uint32
    stmatrix_x4(array, index, (r0, r1, r2, r3))
    t = movmatrix_trans(r)                        # 8x8 transpose across the warp, registers only
"""

from numba import types

from intrinsics._core import (
    SM75,
    SM90,
    asm,
    check_array,
    check_index,
    check_type,
    intrinsic,
    pack,
    register_list,
    require_arch,
    shared_address,
    unpack,
    I32,
)

__all__ = [
    "LDMATRIX_FORMS",
    "ldmatrix_op",
    "ldmatrix_x1",
    "ldmatrix_x1_trans",
    "ldmatrix_x2",
    "ldmatrix_x2_trans",
    "ldmatrix_x4",
    "ldmatrix_x4_trans",
    "movmatrix_trans",
    "stmatrix_op",
    "stmatrix_x1",
    "stmatrix_x1_trans",
    "stmatrix_x2",
    "stmatrix_x2_trans",
    "stmatrix_x4",
    "stmatrix_x4_trans",
]

# (instruction, number of matrices, transposed) -> architecture.
LDMATRIX_FORMS = {
    (op, num, trans): arch
    for op, arch in (("ldmatrix", SM75), ("stmatrix", SM90))
    for num in (1, 2, 4)
    for trans in (False, True)
}


def _fragment_type(num):
    return types.uint32 if num == 1 else types.UniTuple(types.uint32, num)


def _ptx(op, num, trans):
    return f"{op}.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"


def _build_ldmatrix(num, trans, arch):
    name = _ptx("ldmatrix", num, trans)
    template = f"{name} {register_list(0, num)}, [${num}];"
    constraints = ["=r"] * num + ["r"]

    def typer(typingctx, array, index):
        check_array(name, array, "a shared-memory array")
        check_index(name, array, index)
        sig = _fragment_type(num)(array, index)

        def codegen(context, builder, sig, args):
            require_arch(name, arch)
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            outs = asm(builder, template, constraints, [I32] * num, [addr], memory=True)
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = name.replace(".", "_")
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.14.5.15). Arguments: a shared array and this lane's "
        f"row index (16-byte aligned); returns {_fragment_type(num)}. Needs {arch.text}."
    )
    return intrinsic(typer)


def _build_stmatrix(num, trans, arch):
    name = _ptx("stmatrix", num, trans)
    template = f"{name} [$0], {register_list(1, num)};"
    constraints = ["r"] * (num + 1)

    def typer(typingctx, array, index, fragment):
        check_array(name, array, "a shared-memory array")
        check_index(name, array, index)
        check_type(name, fragment, _fragment_type(num), "the fragment")
        sig = types.void(array, index, fragment)

        def codegen(context, builder, sig, args):
            require_arch(name, arch)
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            regs = unpack(builder, sig.args[2], args[2])
            asm(builder, template, constraints, [], [addr] + regs, memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = name.replace(".", "_")
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.14.5.16). Arguments: a shared array, this lane's row "
        f"index (16-byte aligned) and the fragment {_fragment_type(num)}. Needs {arch.text}."
    )
    return intrinsic(typer)


_BUILDERS = {"ldmatrix": _build_ldmatrix, "stmatrix": _build_stmatrix}
_FORMS = {key: _BUILDERS[key[0]](key[1], key[2], arch) for key, arch in LDMATRIX_FORMS.items()}


def ldmatrix_op(num, trans=False):
    """The ldmatrix intrinsic for ``.x{num}`` (1, 2 or 4), optionally ``.trans``."""
    return _form("ldmatrix", num, trans)


def stmatrix_op(num, trans=False):
    """The stmatrix intrinsic for ``.x{num}`` (1, 2 or 4), optionally ``.trans``."""
    return _form("stmatrix", num, trans)


def _form(op, num, trans):
    key = (op, num, bool(trans))
    if key not in _FORMS:
        raise ValueError(f"{op} takes .x1, .x2 or .x4, got .x{num}")
    return _FORMS[key]


ldmatrix_x1 = ldmatrix_op(1)
ldmatrix_x2 = ldmatrix_op(2)
ldmatrix_x4 = ldmatrix_op(4)
ldmatrix_x1_trans = ldmatrix_op(1, True)
ldmatrix_x2_trans = ldmatrix_op(2, True)
ldmatrix_x4_trans = ldmatrix_op(4, True)
stmatrix_x1 = stmatrix_op(1)
stmatrix_x2 = stmatrix_op(2)
stmatrix_x4 = stmatrix_op(4)
stmatrix_x1_trans = stmatrix_op(1, True)
stmatrix_x2_trans = stmatrix_op(2, True)
stmatrix_x4_trans = stmatrix_op(4, True)

_MOVMATRIX = "movmatrix.sync.aligned.m8n8.trans.b16"


@intrinsic
def movmatrix_trans(typingctx, fragment):
    """Emits ``movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;`` (PTX ISA 9.7.14.5.17): the 8x8
    matrix of 16-bit elements held by the warp in the mma fragment layout is transposed across the
    lanes, register to register. Argument and result: uint32. Needs sm_75 or newer."""
    check_type(_MOVMATRIX, fragment, types.uint32, "the fragment")
    sig = types.uint32(fragment)

    def codegen(context, builder, sig, args):
        require_arch(_MOVMATRIX, SM75)
        (out,) = asm(builder, f"{_MOVMATRIX} $0, $1;", ["=r", "r"], [I32], [args[0]])
        return out

    return sig, codegen
