"""Shared-memory addresses and swizzles, device side.

``shared_address(array, index)`` gives the 32-bit address in the ``.shared`` state space that
ldmatrix, cp.async, mbarrier, TMA and wgmma descriptors take.  ``swizzle(offset, B, M, S)`` (CuTe
``Swizzle<B, M, S>``) and ``swizzle_offset(byte_offset, mode)`` map a byte offset inside a tile to
the offset where the data really lives (PTX ISA 9.7.9.27.5, "Tensor Swizzling Modes"; 9.7.15.5.1,
"Shared Memory Matrix Layout").  They are the host functions of :mod:`intrinsics.layout.swizzle`
(where the modes are tabulated) compiled as device functions, so kernels and host models share one
source.

``st_shared_b32(array, index, value)`` and ``ld_shared_v4_b32(array, index)`` move 4 and 16 bytes
at ``&array[index]`` of a shared array (any element type; the address a multiple of 4 / 16):
one ``st.shared.b32`` / ``ld.shared.v4.b32``, for staging a tile through shared memory where
ldmatrix / stmatrix do not fit (sm_75 and later).
"""

from numba import cuda, types

from intrinsics._core import (
    I32,
    asm,
    check_array,
    check_index,
    intrinsic,
    pack,
    shared_address as _shared_address,
)
from intrinsics.layout.swizzle import swizzle_host, swizzle_offset_host

__all__ = ["ld_shared_v4_b32", "shared_address", "st_shared_b32", "swizzle", "swizzle_offset"]


@intrinsic
def shared_address(typingctx, array, index):
    """32-bit ``.shared`` address of ``array[index]`` (``array`` must be a shared array).

    Emits no instruction of its own: the generic pointer numba keeps is cast back to the shared
    state space (``cvta.to.shared.u32`` where NVVM cannot fold the cast away).
    """
    check_array("shared_address", array, "a shared-memory array")
    check_index("shared_address", array, index)
    sig = types.uint32(array, index)

    def codegen(context, builder, sig, args):
        return _shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])

    return sig, codegen


@intrinsic
def st_shared_b32(typingctx, array, index, value):
    """Store the 32 bits of ``value`` (uint32 / int32) at the (4-byte aligned) shared address of
    ``array[index]``."""
    from numba.cuda.core.errors import NumbaTypeError

    check_array("st_shared_b32", array, "a shared-memory array")
    check_index("st_shared_b32", array, index)
    if not isinstance(value, types.Integer) or value.bitwidth != 32:
        raise NumbaTypeError(f"st_shared_b32 stores a 32-bit integer (uint32 / int32), got {value}")
    sig = types.void(array, index, value)

    def codegen(context, builder, sig, args):
        addr = _shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        asm(builder, "st.shared.b32 [$0], $1;", ["r", "r"], [], [addr, args[2]], memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def ld_shared_v4_b32(typingctx, array, index):
    """The 16 bytes at the (16-byte aligned) shared address of ``array[index]`` as four uint32
    (the first from the lowest address)."""
    check_array("ld_shared_v4_b32", array, "a shared-memory array")
    check_index("ld_shared_v4_b32", array, index)
    sig = types.UniTuple(types.uint32, 4)(array, index)

    def codegen(context, builder, sig, args):
        addr = _shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        outs = asm(builder, "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", ["=r"] * 4 + ["r"],
                   [I32] * 4, [addr], memory=True)
        return pack(context, builder, sig.return_type, outs)

    return sig, codegen


swizzle = cuda.jit(device=True, inline="always")(swizzle_host)
swizzle.__doc__ = """Device function: CuTe ``Swizzle<b, m, s>`` of an integer offset
(:func:`intrinsics.layout.swizzle_host`)."""
swizzle_offset = cuda.jit(device=True, inline="always")(swizzle_offset_host)
swizzle_offset.__doc__ = """Device function: the swizzled byte offset of ``byte_offset`` in mode
``mode`` (0, 32, 64 or 128 bytes; :func:`intrinsics.layout.swizzle_offset_host`)."""
