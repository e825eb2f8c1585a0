"""Global-memory stores wider than the pointer's element (PTX ISA 9.7.9.10, ``st``): numbatc's
kernels take 16-bit outputs as uint16 pointers, and numba stores one element per instruction;
a pair of bf16/f16 values is one 32-bit store when the address is 4-byte aligned::

    st_global_b32(out, index, pack_bf16x2(v0, v1))   # st.global.b32 [&out[index]], bits

``st_global_b32(p, i, v)`` stores the 32 bits of ``v`` (a uint32 / int32) at the address of
``p[i]`` (a typed pointer or 1-d array in global memory, of any element type); that address must
be a multiple of 4 -- the caller's guarantee (a misaligned store faults: CUDA_ERROR_MISALIGNED_ADDRESS).
``st_global_v4_b32(p, i, (v0, v1, v2, v3))`` stores 16 bytes (four uint32, ``v0`` at the lowest
address) at ``&p[i]``, which must be a multiple of 16: one ``st.global.v4.b32``, a whole 16-byte
chunk of a row per lane (eight bf16 values).
Architectures: all.
"""

from numba import types

from intrinsics._core import asm, check_global, check_index, global_address, intrinsic

__all__ = ["st_global_b32", "st_global_v4_b32"]


@intrinsic
def st_global_b32(typingctx, array, index, value):
    """Store the 32 bits of ``value`` at the (4-byte aligned) address of ``array[index]``."""
    from numba.cuda.core.errors import NumbaTypeError

    check_global("st_global_b32", array)
    check_index("st_global_b32", array, index)
    if not isinstance(value, types.Integer) or value.bitwidth != 32:
        raise NumbaTypeError(f"st_global_b32 stores a 32-bit integer (uint32 / int32), got {value}")
    sig = types.void(array, index, value)

    def codegen(context, builder, sig, args):
        arr, idx, val = args
        addr = global_address(context, builder, sig.args[0], arr, sig.args[1], idx)
        asm(builder, "st.global.b32 [$0], $1;", ["l", "r"], [], [addr, val], memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def st_global_v4_b32(typingctx, array, index, value):
    """Store four uint32 (``value``, a 4-tuple; the first at the lowest address) at the (16-byte
    aligned) address of ``array[index]``."""
    from numba.cuda.core.errors import NumbaTypeError

    check_global("st_global_v4_b32", array)
    check_index("st_global_v4_b32", array, index)
    if not (isinstance(value, types.UniTuple) and value.count == 4
            and value.dtype in (types.uint32, types.int32)):
        raise NumbaTypeError(f"st_global_v4_b32 stores four 32-bit integers (a UniTuple of 4 "
                             f"uint32 / int32), got {value}")
    sig = types.void(array, index, value)

    def codegen(context, builder, sig, args):
        arr, idx, val = args
        addr = global_address(context, builder, sig.args[0], arr, sig.args[1], idx)
        regs = [builder.extract_value(val, i) for i in range(4)]
        asm(builder, "st.global.v4.b32 [$0], {$1, $2, $3, $4};", ["l", "r", "r", "r", "r"], [],
            [addr] + regs, memory=True)
        return context.get_dummy_value()

    return sig, codegen
