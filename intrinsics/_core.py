"""Machinery shared by every intrinsic family: inline-asm emission, operand access, literal
arguments and architecture checks.

Nothing here emits an instruction of its own; each family module (``mma.py``, ``ldmatrix.py`` ...)
builds its PTX strings from a table and hands them to :func:`asm`.
"""

from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.api_util import normalize_indices
from numba.cuda.core import targetconfig
from numba.cuda.core.errors import NumbaTypeError
from numba.cuda.extending import intrinsic

__all__ = [
    "Arch",
    "ArchitectureError",
    "SM75",
    "SM80",
    "SM89",
    "SM90",
    "SM90A",
    "SM100A",
    "SM120A",
    "asm",
    "compile_cc",
    "literal_value",
    "require_arch",
]


# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------


class ArchitectureError(NumbaTypeError):
    """An intrinsic was compiled for a GPU architecture that lacks its instruction."""


class Arch:
    """Which compute capabilities accept an instruction.

    ``minimum`` is the oldest plain architecture (``(8, 0)`` means sm_80 and newer).  ``specific``
    lists the architecture-specific targets (``sm_90a`` ...) that accept it when the instruction is
    not part of the portable feature set; numba-cuda spells those as ``(9, 0, "a")``.
    """

    def __init__(self, text, minimum=None, specific=()):
        self.text = text
        self.minimum = minimum
        self.specific = frozenset(specific)

    def accepts(self, cc):
        major_minor = tuple(cc[:2])
        suffix = cc[2] if len(cc) > 2 else ""
        if self.minimum is not None and major_minor >= self.minimum:
            return True
        # 'a' (architecture-specific) and 'f' (family-specific) targets both unlock the
        # non-portable instructions of their own architecture.
        return suffix in ("a", "f") and major_minor in self.specific

    def __repr__(self):
        return f"Arch({self.text})"


SM75 = Arch("sm_75 or newer", minimum=(7, 5))
SM80 = Arch("sm_80 or newer", minimum=(8, 0))
SM89 = Arch("sm_89 or newer", minimum=(8, 9))
SM90 = Arch("sm_90 or newer", minimum=(9, 0))
SM90A = Arch("sm_90a (Hopper's architecture-specific target)", specific=[(9, 0)])
SM100A = Arch(
    "sm_100a/sm_101a/sm_103a (Blackwell datacenter targets)", specific=[(10, 0), (10, 1), (10, 3)]
)
SM120A = Arch("sm_120a/sm_121a (Blackwell consumer targets)", specific=[(12, 0), (12, 1)])


def format_cc(cc):
    return "sm_%d%d%s" % (cc[0], cc[1], cc[2] if len(cc) > 2 else "")


def compile_cc():
    """The compute capability the kernel being compiled targets, or None outside a compilation.

    numba-cuda keeps it in the compiler flags (``compile_ptx(cc=...)``, or the current device's
    capability when a kernel is launched); the flags sit on a config stack during lowering.
    """
    flags = targetconfig.ConfigStack.top_or_none()
    cc = getattr(flags, "compute_capability", None) if flags is not None else None
    if cc is not None and len(cc) == 2 and tuple(cc) >= (9, 0):
        # numba lowers a launched kernel with the device's plain capability (9, 0) and then
        # writes its PTX for sm_90a (CUDACodeLibrary._ensure_cc adds the 'a' for cc >= 9.0), so
        # a two-part capability from 9.0 on means the architecture-specific target.  (An explicit
        # compile_ptx(cc=(9, 0)) is read the same way; ptxas then refuses an sm_90a-only
        # instruction for the plain sm_90 target with its own error.)
        cc = (cc[0], cc[1], "a")
    return cc


def require_arch(name, arch):
    """Raise ArchitectureError when the current compilation targets an architecture outside ``arch``.

    Call it from a ``codegen`` function: typing is cached across targets, lowering is not.
    """
    cc = compile_cc()
    if cc is not None and not arch.accepts(cc):
        raise ArchitectureError(
            f"{name} needs {arch.text}, but this kernel is compiled for {format_cc(cc)}"
        )


# ---------------------------------------------------------------------------------------------
# Typing helpers
# ---------------------------------------------------------------------------------------------


def literal_value(name, ty, what, valid=None):
    """The Python value of a literal argument, or a NumbaTypeError naming what is accepted.

    numba types a call first with plain types and then with literal ones; return ``None`` from the
    typer for a non-literal argument and it retries with the literal.
    """
    if not isinstance(ty, types.Literal):
        return None
    value = ty.literal_value
    if valid is not None and value not in valid:
        raise NumbaTypeError(f"{name}: {what} must be one of {sorted(valid)}, got {value!r}")
    return value


def check_array(name, ty, what="an array"):
    if not isinstance(ty, types.Array):
        raise NumbaTypeError(f"{name} takes {what} and an element index, got {ty}")


def check_global(name, ty, what="a global array or typed pointer"):
    """A global-memory operand: an array, or a ``types.CPointer`` (a raw device pointer passed to
    a kernel typed as such) indexed by one integer."""
    if not isinstance(ty, (types.Array, types.CPointer)):
        raise NumbaTypeError(f"{name} takes {what} and an element index, got {ty}")


def check_index(name, arrty, idxty):
    if isinstance(arrty, types.CPointer):
        if not isinstance(idxty, types.Integer):
            raise NumbaTypeError(f"{name}: a pointer takes one integer element index, got {idxty}")
        return
    ok = isinstance(idxty, types.Integer) or (
        isinstance(idxty, types.UniTuple)
        and isinstance(idxty.dtype, types.Integer)
        and idxty.count == arrty.ndim
    )
    if not ok:
        raise NumbaTypeError(
            f"{name}: the element index must be an integer (or a tuple of {arrty.ndim} integers "
            f"for a {arrty.ndim}-d array), got {idxty}"
        )


def check_integer(name, ty, what):
    if not isinstance(ty, (types.Integer, types.Boolean)):
        raise NumbaTypeError(f"{name}: {what} must be an integer, got {ty}")


def check_type(name, ty, expected, what):
    """Exact type check for a register or fragment (a UniTuple of registers) argument."""
    if ty != expected:
        raise NumbaTypeError(f"{name}: {what} must be {expected}, got {ty}")


# ---------------------------------------------------------------------------------------------
# Lowering helpers
# ---------------------------------------------------------------------------------------------

I32 = ir.IntType(32)
I64 = ir.IntType(64)


def asm(builder, template, constraints, out_types=(), operands=(), volatile=True, memory=False):
    """Emit one inline-asm statement and return its outputs as a list of LLVM values.

    ``constraints`` lists output constraints first, then input constraints (NVVM spells operands
    ``$0, $1 ...`` in the template).  ``memory`` adds a memory clobber so that the compiler keeps
    ordinary loads and stores on their side of the statement.
    """
    constraints = list(constraints)
    if memory:
        constraints.append("~{memory}")
    out_types = list(out_types)
    if not out_types:
        ret = ir.VoidType()
    elif len(out_types) == 1:
        ret = out_types[0]
    else:
        ret = ir.LiteralStructType(out_types)
    fnty = ir.FunctionType(ret, [op.type for op in operands])
    inline = ir.InlineAsm(fnty, template, ",".join(constraints), side_effect=volatile)
    result = builder.call(inline, list(operands))
    if not out_types:
        return []
    if len(out_types) == 1:
        return [result]
    return [builder.extract_value(result, i) for i in range(len(out_types))]


#: a register's inline-asm constraint letter by its numba type
REGISTER_CONSTRAINTS = {types.float32: "f", types.int32: "r", types.uint32: "r",
                        types.int64: "l", types.uint64: "l"}


def passthrough(value, dtypes, memory):
    """``(signature, codegen)`` of an intrinsic that hands ``value`` back through one empty
    volatile inline asm (no instruction; every register an output tied to its input), or None
    where ``value`` is not a scalar of ``dtypes``, a UniTuple of them, or a UniTuple of such
    UniTuples.  ``memory``: with a memory clobber.  intrinsics.hints.opaque and
    intrinsics.wgmma.wgmma_fence_operand are two."""
    inner = value.dtype if isinstance(value, types.UniTuple) else None
    nested = isinstance(inner, types.UniTuple)
    dtype = inner.dtype if nested else inner if inner is not None else value
    if dtype not in dtypes:
        return None
    count = value.count * inner.count if nested else value.count if inner is not None else 1
    constraints = ["=" + REGISTER_CONSTRAINTS[dtype]] * count + [str(i) for i in range(count)]

    def codegen(context, builder, sig, args):
        ty = sig.args[0]
        parts = unpack(builder, ty, args[0]) if nested else [args[0]]
        values = [v for part in parts for v in unpack(builder, ty.dtype if nested else ty, part)]
        outs = asm(builder, "", constraints, [v.type for v in values], values, memory=memory)
        if not nested:
            return pack(context, builder, ty, outs)
        n = ty.dtype.count
        return pack(context, builder, ty, [pack(context, builder, ty.dtype, outs[i:i + n])
                                           for i in range(0, count, n)])

    return value(value), codegen


def statement_intrinsic(pyname, ptx, arch, doc, arch_name=None):
    """An intrinsic with no operands and no result that emits ``ptx`` (a fence, a wait, a commit)
    with a memory clobber; refused with ArchitectureError (naming ``arch_name``, default the
    Python name) where ``arch`` lacks it."""

    def typer(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            require_arch(arch_name or pyname, arch)
            asm(builder, ptx, [], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = pyname
    typer.__doc__ = doc
    return intrinsic(typer)


def element_pointer(context, builder, arrty, arr, idxty, idx):
    """Generic pointer to ``arr[idx]`` (no wraparound of negative indices); ``arr`` may also be a
    typed pointer (``types.CPointer``) with an integer element index."""
    if isinstance(arrty, types.CPointer):
        index = context.cast(builder, idx, idxty, types.intp)
        return builder.gep(arr, [index])
    idxty, indices = normalize_indices(context, builder, idxty, idx, arrty, arrty.dtype)
    ary = context.make_array(arrty)(context, builder, value=arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, indices, wraparound=False)


def shared_address(context, builder, arrty, arr, idxty, idx):
    """32-bit shared-state-space address of ``arr[idx]`` (``arr`` must live in shared memory).

    numba keeps shared arrays behind a generic pointer; an addrspacecast back to space 3 folds
    away in NVVM, so this costs nothing in the common case.
    """
    ptr = element_pointer(context, builder, arrty, arr, idxty, idx)
    ptr3 = builder.addrspacecast(ptr, ptr.type.pointee.as_pointer(3))
    return builder.ptrtoint(ptr3, I32)


def global_address(context, builder, arrty, arr, idxty, idx):
    """64-bit global-state-space address of ``arr[idx]``."""
    ptr = element_pointer(context, builder, arrty, arr, idxty, idx)
    ptr1 = builder.addrspacecast(ptr, ptr.type.pointee.as_pointer(1))
    return builder.ptrtoint(ptr1, I64)


def generic_address(context, builder, arrty, arr, idxty, idx):
    """64-bit generic address of ``arr[idx]``."""
    ptr = element_pointer(context, builder, arrty, arr, idxty, idx)
    return builder.ptrtoint(ptr, I64)


def unpack(builder, ty, value):
    """The LLVM values of a fragment argument (a UniTuple, or one scalar)."""
    if isinstance(ty, types.BaseTuple):
        return cgutils.unpack_tuple(builder, value, len(ty))
    return [value]


def pack(context, builder, ty, values):
    """A fragment return value from LLVM values."""
    if isinstance(ty, types.BaseTuple):
        return context.make_tuple(builder, ty, values)
    (value,) = values
    return value


def as_i32(context, builder, ty, value):
    """Cast an integer or boolean argument to i32."""
    return context.cast(builder, value, ty, types.int32)


def as_u64(context, builder, ty, value):
    return context.cast(builder, value, ty, types.uint64)


def register_list(start, count):
    """'{$start, $start+1, ...}' for an asm template."""
    return "{" + ", ".join(f"${i}" for i in range(start, start + count)) + "}"
