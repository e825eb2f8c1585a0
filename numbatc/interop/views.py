"""Other views of a CUDA array's memory, never copies: the one a Numba kernel takes
(:func:`kernel_view`: same shape and strides, bf16/fp8 as uint16/uint8), the transpose
(:func:`transpose_view`) and the dtype marks ``numbatc.bfloat16(x)``, ``numbatc.float8_e4m3(x)``,
``numbatc.float8_e5m2(x)``, ``numbatc.float4_e2m1(x)`` (a :class:`~numbatc.interop.arrays.DTypeView`
around a uint16/uint8 array of any library).

bfloat16 (and fp8) for libraries without such a dtype
----------------------------------------------------
PyTorch names bfloat16 and the fp8 types itself. NumPy, Numba and CuPy do not; for them numbatc
accepts two spellings:

1. arrays whose NumPy dtype is ``ml_dtypes.bfloat16`` (``ml_dtypes.float8_e4m3fn`` ...), where the
   library can carry such a dtype (CuPy and Numba device arrays can: they only store the dtype);
   results for such inputs come back with the same ml_dtypes dtype;
2. ``numbatc.bfloat16(x)``: ``x`` is a CUDA uint16 array of any library holding bf16 bit patterns;
   the returned DTypeView marks it as bf16 data (no copy). Results for such inputs come back as a
   DTypeView around a uint16 array of the caller's library (``result.data``;
   ``result.copy_to_host()`` gives ml_dtypes.bfloat16 when ml_dtypes is installed).

A bare ``__cuda_array_interface__`` cannot say "bfloat16": ml_dtypes exports it as ``<V2`` (and
float8_e5m2 as ``<f1``), so such typestrs are refused with a message pointing to
``numbatc.bfloat16``. DLPack does name bfloat16 and fp8 (type codes 4, 10, 12) and is accepted.
"""

from __future__ import annotations

import numpy as np

from numbatc.interop import devices
from numbatc.interop.arrays import CudaArray, DTypeView, as_cuda_array, library_of
from numbatc.interop.dtypes import EXOTIC_STORAGE

__all__ = ["kernel_view", "as_kernel_array", "transpose_view", "copy_to_host", "bfloat16",
           "float8_e4m3", "float8_e5m2", "float4_e2m1"]


# ---------------------------------------------------------------------------------------------
# the kernel's view
# ---------------------------------------------------------------------------------------------


def kernel_view(ca: CudaArray):
    """A Numba device array over ``ca``'s memory: same shape and strides, storage dtype
    (bf16 -> uint16, fp8 -> uint8), no copy; the owner stays alive while the view lives."""
    if ca.library == "numba" and not ca.marked and ca.dtype not in EXOTIC_STORAGE:
        return ca.obj
    from numba import cuda

    if type(ca.obj).__name__ == "FakeCUDAArray" or (
            ca.marked and type(getattr(ca.obj, "data", None)).__name__ == "FakeCUDAArray"):
        # the simulator: a view of the same NumPy memory in the storage dtype
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        host = ca.keepalive if ca.keepalive is not None else ca.obj.data._ary
        return FakeCUDAArray(host.view(np.dtype(ca.storage_typestr)))

    desc = {
        "shape": ca.shape,
        "strides": tuple(s * ca.itemsize for s in ca.strides),
        "data": (ca.ptr, ca.readonly),
        "typestr": ca.storage_typestr,
        "version": 3,
    }
    owner = ca.keepalive if ca.keepalive is not None else ca.obj
    with devices.device_scope(ca.device):
        # sync=False: numbatc launches on the caller's current stream (streams.stream_for), so
        # there is nothing to wait for; no "stream" key is passed anyway.
        return cuda.from_cuda_array_interface(desc, owner=owner, sync=False)


def as_kernel_array(t):
    """A Numba device array viewing ``t``'s memory (no copy; ``t`` is kept alive). bfloat16 and
    fp8 data are viewed as uint16 and uint8."""
    return kernel_view(as_cuda_array(t))


def transpose_view(x):
    """The transpose of a 2-D CUDA array as a view (no copy), for any library.

    NOTE: Numba's ``DeviceNDArray.T`` is not a view: it launches a transpose kernel and returns a
    copy. For Numba arrays this builds the view directly (same memory, swapped shape and
    strides); ``cuda.to_device(host.T)`` also gives a column-major Numba array."""
    if isinstance(x, DTypeView):
        return DTypeView(transpose_view(x.data), x.dtype)
    if library_of(x) == "numba":
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        if x.ndim != 2:
            raise ValueError(f"transpose_view needs a 2-D array, got shape {x.shape}")
        return DeviceNDArray(shape=x.shape[::-1], strides=x.strides[::-1], dtype=x.dtype,
                             stream=x.stream, gpu_data=x.gpu_data)
    return x.T


def copy_to_host(data) -> np.ndarray:
    """A NumPy copy of a CUDA array of any library (bf16/fp8 as their raw storage)."""
    lib = library_of(data)
    if lib == "torch":
        return data.detach().cpu().numpy()
    if lib == "cupy":
        return data.get()
    if lib == "numba":
        return data.copy_to_host()
    return as_kernel_array(data).copy_to_host()


# ---------------------------------------------------------------------------------------------
# dtype marks: bf16 / fp8 / fp4 data in a library that cannot name it
# ---------------------------------------------------------------------------------------------


def bfloat16(x):
    """Mark a CUDA uint16 array (any library) as holding bfloat16 bit patterns, without a copy.

    ``numbatc.gemm(numbatc.bfloat16(a_u16), numbatc.bfloat16(b_u16))`` returns a
    ``numbatc.bfloat16`` view around a uint16 array of the caller's library. An array that already
    has dtype bfloat16 (a torch.bfloat16 tensor, an ml_dtypes.bfloat16 CuPy/Numba array) is returned
    unchanged."""
    return _mark(x, "bfloat16", "bfloat16")


def _mark(x, dtype, pyname):
    if isinstance(x, DTypeView):
        if x.dtype == dtype:
            return x
        raise TypeError(f"numbatc.{pyname} got an array already marked as {x.dtype}")
    if as_cuda_array(x, name=f"the array given to numbatc.{pyname}").dtype == dtype:
        return x
    return DTypeView(x, dtype)


def float8_e4m3(x):
    """Mark a CUDA uint8 array (any library) as holding float8_e4m3fn bit patterns (OCP e4m3:
    bias 7, no infinities, 0x7F/0xFF NaN), without a copy: MXFP8 operands of numbatc.gemm.
    An array that already has that dtype (torch.float8_e4m3fn ...) is returned unchanged."""
    return _mark(x, "float8_e4m3fn", "float8_e4m3")


def float8_e5m2(x):
    """Mark a CUDA uint8 array as holding float8_e5m2 bit patterns (bias 15, IEEE-like), without
    a copy: MXFP8 operands of numbatc.gemm."""
    return _mark(x, "float8_e5m2", "float8_e5m2")


def float4_e2m1(x):
    """Mark a CUDA uint8 array as holding packed e2m1 values, two per byte (element 2i in the
    low nibble, 2i + 1 in the high one; torch.float4_e2m1fn_x2's layout), without a copy: NVFP4
    operands of numbatc.gemm, whose K is then twice the array's last dimension."""
    return _mark(x, "float4_e2m1fn_x2", "float4_e2m1")
