"""From a checked problem to a kernel's flat arguments, for every kernel module: operand pointers
(an aligned copy where a kernel needs 16-byte aligned rows and the caller's are not), the flat
form the CPU emulation passes instead of pointers, a user epilogue's arguments, and the launch
of a GEMM kernel module whose ``launch_flat`` takes every GEMM kernel's arguments (sm80_gemm,
sm90_gemm).

Flat operands: device pointers (ints) on the GPU; in the emulation 1-d arrays over the same
memory, starting at element (0, 0) (16-bit data as uint16, as the kernels move bit patterns).
``keep`` lists hold temporaries (packed copies, views) alive until the launch has been queued.
"""

import os
import sys

import numpy as np
from numba import config, cuda

from numbatc import _capture
from numbatc.kernels import split_k

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["aligned_view", "byte_view", "epilogue_args", "flat", "flat_array", "launch_gemm",
           "launch_stream", "operand", "pointer"]


@cuda.jit
def _pack(src, dst):
    """dst[i, j] = src[i, j] for the (rows, cols) of src; dst may be wider (padded rows)."""
    i, j = cuda.grid(2)
    if i < src.shape[0] and j < src.shape[1]:
        dst[i, j] = src[i, j]


def operand(op, stream, keep):
    """(flat operand, leading dimension) of a GEMM operand (numbatc.gemm_api.Operand) for the
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


def byte_view(x):
    """A flat operand (see :func:`flat`) as a kernel that addresses it in bytes takes it: a
    device pointer as it is, an emulated 1-d array (NumPy, or numba's simulated device array)
    viewed as uint8."""
    if isinstance(x, (int, np.integer)):
        return x
    return getattr(x, "_ary", x).view(np.uint8)


def flat_array(ca, keep, words=False):
    """The kernel's flat operand for a CudaArray that a kernel reads or writes element by element
    (the softmax kernels' x, out and bias): its device pointer on the GPU; in the emulation
    :func:`flat` of its Numba view, as 64-bit words where ``words`` (rows that start on 8-byte
    boundaries and hold multiples of 4 16-bit elements: exact words)."""
    if not _EMULATED:
        return ca.ptr
    from numbatc.interop.views import kernel_view

    view = flat(kernel_view(ca), keep)  # 16-bit data as uint16
    if words:
        view = view[: view.shape[0] // 4 * 4].view(np.uint64)
    return view


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


def launch_stream(p):
    """The stream a launch for problem ``p`` takes: its raw handle on the GPU (intrinsics.launch
    caches its stream object, so a warm call builds no Numba stream), Numba's stream object in
    the emulation."""
    return p.stream if _EMULATED else p.stream_handle


def launch_gemm(launch_flat, p, cfg, var, split, tiles, alpha):
    """Launch ``launch_flat(cfg, var, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha,
    beta, ...)`` (sm80_gemm's and sm90_gemm's) for GEMM problem ``p`` on its stream: a and b
    packed where not 16-byte aligned, never read when K == 0; ``split`` = (slices, k_chunk) of
    split-K (1: none) with ``tiles`` output tiles (its counters); ``alpha`` the kernel's (FP8
    folds the scales into it).

    Returns the relaunch function launch_flat returns (see sm80_gemm.launch_flat's ``prepare``)
    or None: the emulation, K == 0, a packed operand, ``NUMBATC_PRINT_CONFIG`` set (each call
    prints)."""
    printing = bool(os.environ.get("NUMBATC_PRINT_CONFIG"))
    keep = []
    out = pointer(p.out, keep)
    if p.k == 0:  # a and b are never read
        a, lda, b, ldb = out, 1, out, 1
    else:
        a, lda = operand(p.a, p.stream if p.a.alignment != 16 else 0, keep)
        b, ldb = operand(p.b, p.stream if p.b.alignment != 16 else 0, keep)
    c = pointer(p.c, keep) if p.c is not None else out
    bias = pointer(p.bias, keep) if p.bias is not None else out
    ldc = p.c.ld if p.c is not None else 0
    extra = epilogue_args(p)
    if (not _EMULATED and not printing and p.k >= 1 and p.a.alignment == 16
            and p.b.alignment == 16):
        extra["prepare"] = True
    if getattr(p, "blockwise", False):
        # FP8 blockwise scales: (scale_a, scale_b, each's row and column element strides)
        strides = [(op.ld, 1) if op.layout == "row" else (1, op.ld)
                   for op in (p.scale_a, p.scale_b)]
        extra["block_scales"] = (pointer(p.scale_a, keep), pointer(p.scale_b, keep),
                                 *strides[0], *strides[1])
        extra.pop("prepare", None)  # the relaunch contract has no place for the scales
    splits, k_chunk = split
    if splits > 1:
        buffers = split_k.split_workspace(p.device, splits * p.m * p.n, tiles,
                                          p.a.array.library)

        def slices(stream):
            ws, cnt = buffers(stream)
            return ws, cnt, k_chunk, splits

        extra["split"] = slices
        if printing:
            print(f"numbatc.gemm: split-K, {splits} slices of {k_chunk} ({cfg.name})",
                  file=sys.stderr)
    return launch_flat(cfg, var, a, b, c, bias, out, p.m, p.n, p.k, lda, ldb, ldc, p.out.ld,
                       alpha, p.beta, stream=launch_stream(p), **extra)
