"""Accept any CUDA array: Numba device arrays, CuPy arrays, PyTorch tensors, anything with
``__cuda_array_interface__`` (v2/v3) or ``__dlpack__``/``__dlpack_device__``.

Every array that enters numbatc is first normalised to a :class:`CudaArray` (pointer, shape,
strides in elements, dtype name, device ordinal, library, the original object). From there:

- :func:`as_kernel_array` gives a Numba device array viewing the same memory (no copy; the
  original object is kept alive), with bfloat16/fp8 data viewed as uint16/uint8 because Numba
  kernels cannot name those types;
- :func:`allocate_like` allocates a result of the caller's library on the same device;
- :func:`stream_for` gives a Numba stream wrapping the caller library's *current* stream, so a
  kernel launched on it composes with the caller's other work without extra synchronisation;
- :func:`same_device` checks that operands live on one GPU.

One module per subject:

    dtypes.py    dtype names and spellings, the raw storage of bf16/fp8/fp4, ml_dtypes
    arrays.py    CudaArray, DTypeView and as_cuda_array's adapter for each library; same_device
    dlpack.py    the DLPack C ABI (device types, dtype codes, the capsule's DLTensor)
    views.py     views of the same memory: the kernel's, the transpose, numbatc.bfloat16 & co.
    devices.py   Numba's device list, a device's context for a block, a pointer's device
    streams.py   the caller library's current stream, as a raw handle or a Numba stream
    alloc.py     results of the caller's library (and the warm call's allocator)
    probes.py    the warm call's (pointer, key) of an array, without a CudaArray

Nothing here imports torch, cupy or ml_dtypes at module import time: a library's arrays can only
exist once the library is imported, so ``sys.modules`` tells whether to look for them. Numba is
imported lazily too, so ``import numbatc`` stays light and touches no GPU.
"""

from numbatc.interop.alloc import allocate_like
from numbatc.interop.arrays import ACCEPTED, CudaArray, DTypeView, as_cuda_array, same_device
from numbatc.interop.dtypes import dtype_name
from numbatc.interop.streams import stream_for, stream_handle
from numbatc.interop.views import (as_kernel_array, bfloat16, float4_e2m1, float8_e4m3,
                                   float8_e5m2, transpose_view)

__all__ = [
    "CudaArray",
    "DTypeView",
    "as_cuda_array",
    "as_kernel_array",
    "allocate_like",
    "stream_for",
    "stream_handle",
    "same_device",
    "transpose_view",
    "dtype_name",
    "bfloat16",
    "float8_e4m3",
    "float8_e5m2",
    "float4_e2m1",
    "ACCEPTED",
]
