"""From a checked problem to a kernel's flat arguments, for every kernel module: operand pointers
(an aligned copy where a kernel needs 16-byte aligned rows and the caller's are not), the flat
form the CPU emulation passes instead of pointers, and a user epilogue's arguments.

Flat operands: device pointers (ints) on the GPU; in the emulation 1-d arrays over the same
memory, starting at element (0, 0) (16-bit data as uint16, as the kernels move bit patterns).
``keep`` lists hold temporaries (packed copies, views) alive until the launch has been queued.
"""

import numpy as np
from numba import config, cuda

from numbatc import _capture

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["aligned_view", "epilogue_args", "flat", "operand", "pointer"]


@cuda.jit
def _pack(src, dst):
    """dst[i, j] = src[i, j] for the (rows, cols) of src; dst may be wider (padded rows)."""
    i, j = cuda.grid(2)
    if i < src.shape[0] and j < src.shape[1]:
        dst[i, j] = src[i, j]


def operand(op, stream, keep):
    """(flat operand, leading dimension) of a GEMM operand (numbatc.gemm.Operand) for the
    kernel: its own pointer when its start and leading dimension are 16-byte aligned, else an
    aligned copy in the same layout (rows padded to a multiple of 16 bytes: 8 bf16/f16
    elements, 16 fp8).  The copy costs one pass over the operand; the GEMM kernel then needs no
    slow path (see sm80_gemm)."""
    if op.alignment == 16 and not _EMULATED:
        return op.ptr, op.ld
    view, ld = aligned_view(op, stream)
    return flat(view, keep), ld


def aligned_view(op, stream):
    """(2-D view, leading dimension): the operand itself when 16-byte aligned, else the packed
    copy described in :func:`operand`.  While ``stream`` captures a CUDA graph the copy comes
    from torch's allocator (torch inputs; numbatc.CaptureError for others)."""
    captured = False
    if op.alignment != 16 and not _EMULATED and _capture.is_capturing(stream):
        if getattr(op.array, "library", None) != "torch":
            _capture.refuse_if_capturing(
                stream, f"pack {op.name} (not 16-byte aligned) into a temporary copy",
                f"make {op.name}'s start and leading dimension 16-byte aligned (or pass "
                "torch tensors: their copy comes from torch's allocator)")
        captured = True
    view, ld = op.view, op.ld
    if op.alignment != 16:
        from numbatc.interop.views import transpose_view

        rows, cols = view.shape
        if op.layout == "col":  # work on the row-major transpose
            view, (rows, cols) = transpose_view(view), (cols, rows)
        per = 16 // view.dtype.itemsize  # elements per 16 bytes
        ld = (cols + per - 1) // per * per
        if captured:
            # While capturing: from torch's allocator on the capturing stream (the graph's
            # private pool; cuMemAlloc would invalidate the capture), as split-K's workspace
            import torch

            raw = torch.empty(rows * ld * view.dtype.itemsize, dtype=torch.uint8,
                              device=torch.device("cuda", torch.cuda.current_device()))
            padded = cuda.as_cuda_array(raw).view(view.dtype).reshape(rows, ld)
            padded._numbatc_owner = raw  # keeps the memory until the launch is queued
        else:
            padded = cuda.device_array((rows, ld), dtype=view.dtype, stream=stream)
        packed = padded[:, :cols]
        _pack[((rows + 15) // 16, (cols + 15) // 16), (16, 16), stream](view, packed)
        view = transpose_view(packed) if op.layout == "col" else packed
    return view, ld


def flat(view, keep):
    """The kernel's flat operand for a Numba array: its device pointer (int) on the GPU; in the
    emulation a 1-d array over the same memory starting at element (0, 0)."""
    keep.append(view)
    if _EMULATED:
        host = getattr(view, "_ary", view)
        if host.dtype == np.float16:  # the kernel moves 16-bit patterns (uint16 on the GPU too)
            host = host.view(np.uint16)
        itemsize = host.dtype.itemsize
        span = sum((d - 1) * st for d, st in zip(host.shape, host.strides)) // itemsize + 1
        return np.lib.stride_tricks.as_strided(host, shape=(span,), strides=(itemsize,))
    return view.device_ctypes_pointer.value


def pointer(op, keep):
    """Flat operand for c, bias and out (no alignment needed: the epilogue stores elements)."""
    return flat(op.view, keep) if _EMULATED else op.ptr


def epilogue_args(p):
    """The launch keyword for a user epilogue's arguments: {"epilogue_args": their Numba views
    (numbers as they are)}, or {} without a user epilogue."""
    if p.epilogue is None:
        return {}
    from numbatc.interop.arrays import CudaArray
    from numbatc.interop.views import kernel_view

    return {"epilogue_args": tuple(kernel_view(x) if isinstance(x, CudaArray) else x
                                   for x in p.epilogue_args)}
