"""Results: a new array of the caller's library on the caller's device (:func:`allocate_like`),
and the warm call's ready-made allocator for arrays like a checked call's (:func:`allocator`).

torch results come from ``torch.empty`` (capture-safe: torch's allocator serves a capturing
stream from the graph's pool); CuPy and Numba results from ``cupy.empty`` / ``cuMemAlloc``,
which a CUDA graph capture cannot record, so they are refused while the stream captures.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from numbatc.interop import devices, streams
from numbatc.interop.arrays import CudaArray, DTypeView, as_cuda_array, library_array
from numbatc.interop.dtypes import EXOTIC_STORAGE, dtype_name, ml_dtype

__all__ = ["allocate_like", "allocator"]


def allocate_like(t, shape, dtype):
    """A new, uninitialised, row-major array of ``t``'s library on ``t``'s device.

    torch -> ``torch.empty``; CuPy -> ``cupy.empty``; Numba and other exporters -> a Numba device
    array. bfloat16/fp8 results: torch's own dtype; for other libraries the ml_dtypes dtype if
    ``t`` itself carries an ml_dtypes dtype, else a :class:`DTypeView` around uint16/uint8."""
    ca = as_cuda_array(t)
    dtype = dtype_name(dtype)
    shape = tuple(int(s) for s in shape)
    if ca.library == "torch" and not ca.marked:
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=ca.obj.device)
    if ca.library != "torch":  # torch.empty is capture-safe; cupy.empty, cuMemAlloc are not
        from numbatc._capture import refuse_if_capturing

        refuse_if_capturing(streams.stream_handle(t), f"allocate a result for {ca.library} arrays",
                            "pass out= (torch tensors' results come from torch's allocator)")
    wrap = False
    if dtype in EXOTIC_STORAGE:
        if ca.marked or ca.dtype not in EXOTIC_STORAGE or ca.library not in ("cupy", "numba"):
            np_dtype, wrap = np.dtype(EXOTIC_STORAGE[dtype]), True
        else:
            np_dtype = ml_dtype(dtype)
    else:
        np_dtype = np.dtype(dtype)
    if ca.library == "torch":  # a DTypeView around a torch uint16 tensor
        import torch

        data = torch.empty(shape, dtype=getattr(torch, np_dtype.name),
                           device=library_array(ca).device)
    elif ca.library == "cupy":
        import cupy

        with cupy.cuda.Device(ca.device):
            data = cupy.empty(shape, dtype=np_dtype)
    else:
        from numba import cuda

        with devices.device_scope(ca.device):
            data = cuda.device_array(shape, dtype=np_dtype)
    return DTypeView(data, dtype) if wrap else data


def allocator(ca: CudaArray, shape, dtype):
    """A function ``fn(t)`` returning :func:`allocate_like` ``(t, shape, dtype)`` for arrays
    ``t`` like ``ca``; for unmarked torch tensors a direct ``torch.empty`` (holding no tensor)."""
    dtype = dtype_name(dtype)
    shape = tuple(int(s) for s in shape)
    if ca.library == "torch" and not ca.marked:
        import torch

        return functools.partial(_torch_empty, torch.empty, shape, getattr(torch, dtype),
                                 ca.obj.device)
    return lambda t: sys.modules[__name__].allocate_like(t, shape, dtype)


def _torch_empty(empty, shape, dtype, device, t):
    return empty(shape, dtype=dtype, device=device)
