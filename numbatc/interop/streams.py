"""Which stream a kernel on the caller's arrays runs on: the caller library's *current* stream
(torch's, CuPy's, the one a __cuda_array_interface__ v3 exporter named, or Numba's default), so
that numbatc's launches compose with the caller's other work without extra synchronisation.

:func:`stream_handle` gives the raw CUstream, :func:`numba_stream` a Numba stream object for
one, :func:`stream_for` both in one, and :func:`stream_getter` the cheapest per-call lookup for
arrays like a given one (the warm call's).
"""

from __future__ import annotations

import functools

from numbatc.interop import devices, dlpack
from numbatc.interop.arrays import CudaArray, as_cuda_array, library_array

__all__ = ["stream_handle", "numba_stream", "stream_for", "stream_getter"]


def stream_handle(t) -> int:
    """The raw CUstream handle of the stream a kernel on ``t`` should run on: torch's or CuPy's
    current stream on ``t``'s device, the stream a __cuda_array_interface__ v3 exporter named, or
    0 (Numba's default stream) for Numba arrays and DLPack exporters. 1 and 2 are CUDA's legacy
    and per-thread default streams."""
    ca = as_cuda_array(t)
    if ca.library == "torch":
        import torch

        return int(torch.cuda.current_stream(library_array(ca).device).cuda_stream)
    if ca.library == "cupy":
        import cupy

        with cupy.cuda.Device(ca.device):
            return int(cupy.cuda.get_current_stream().ptr)
    if ca.library == "cai" and ca.stream:
        return int(ca.stream)
    if ca.library == "dlpack" and dlpack.stream_argument() == 2:
        return 2  # the per-thread default stream, as promised to the producer
    return 0


def numba_stream(handle: int, device: int | None = None):
    """A Numba stream object for a raw CUstream handle (0: Numba's default stream)."""
    from numba import cuda

    with devices.device_scope(device):
        if handle == 0:
            return cuda.default_stream()
        if handle == 1:
            return cuda.legacy_default_stream()
        if handle == 2:
            return cuda.per_thread_default_stream()
        return cuda.external_stream(handle)


def stream_for(t):
    """A Numba stream wrapping the caller library's current stream for ``t`` (see
    :func:`stream_handle`)."""
    return numba_stream(stream_handle(t), as_cuda_array(t).device)


def stream_getter(ca: CudaArray):
    """A function of no arguments returning :func:`stream_handle` of arrays like ``ca`` (same
    library and device), as cheaply as the library allows: for torch its current raw stream
    (``torch._C._cuda_getCurrentRawStream(index)``, ~0.1 us against ~5 us for
    ``torch.cuda.current_stream(device).cuda_stream``), for CuPy the current stream of the
    current device when that is ``ca``'s, for Numba arrays 0."""
    if ca.library == "torch":
        import torch

        index = library_array(ca).device.index
        index = 0 if index is None else index
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return functools.partial(raw, index)
        return lambda: int(torch.cuda.current_stream(index).cuda_stream)
    if ca.library == "cupy":
        import cupy

        device = ca.device
        get_device = getattr(getattr(cupy.cuda, "runtime", None), "getDevice", None)

        def cupy_stream():
            if get_device is not None and get_device() == device:
                return cupy.cuda.get_current_stream().ptr
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr)

        return cupy_stream
    if ca.library == "numba":
        return lambda: 0
    handle = stream_handle(ca)  # 'cai' and 'dlpack': fixed by the exporter or numbatc's promise
    return lambda: handle
