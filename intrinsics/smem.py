"""Shared-memory addresses and swizzles, device side.

``shared_address(array, index)`` gives the 32-bit address in the ``.shared`` state space that
ldmatrix, cp.async, mbarrier, TMA and wgmma descriptors take.  ``swizzle(offset, B, M, S)`` (CuTe
``Swizzle<B, M, S>``) and ``swizzle_offset(byte_offset, mode)`` map a byte offset inside a tile to
the offset where the data really lives (PTX ISA 9.7.9.27.5, "Tensor Swizzling Modes"; 9.7.15.5.1,
"Shared Memory Matrix Layout").  They are the host functions of :mod:`intrinsics.layout.swizzle`
(where the modes are tabulated) compiled as device functions, so kernels and host models share one
source.
"""

from numba import cuda, types

from intrinsics._core import check_array, check_index, intrinsic, shared_address as _shared_address
from intrinsics.layout.swizzle import swizzle_host, swizzle_offset_host

__all__ = ["shared_address", "swizzle", "swizzle_offset"]


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


swizzle = cuda.jit(device=True, inline="always")(swizzle_host)
swizzle.__doc__ = """Device function: CuTe ``Swizzle<b, m, s>`` of an integer offset
(:func:`intrinsics.layout.swizzle_host`)."""
swizzle_offset = cuda.jit(device=True, inline="always")(swizzle_offset_host)
swizzle_offset.__doc__ = """Device function: the swizzled byte offset of ``byte_offset`` in mode
``mode`` (0, 32, 64 or 128 bytes; :func:`intrinsics.layout.swizzle_offset_host`)."""
