"""The DLPack C ABI (dlpack.h) as far as numbatc reads it: device types, dtype codes, the
legacy "dltensor" capsule's DLTensor, and the ``stream`` numbatc promises a producer.

The adapter that turns a DLPack exporter into a CudaArray is :func:`numbatc.interop.arrays.
as_cuda_array`'s; this module only knows the format.
"""

from __future__ import annotations

import ctypes

__all__ = ["CPU", "CUDA", "CUDA_HOST", "CUDA_MANAGED", "DTYPES", "parse_capsule",
           "stream_argument"]

#: DLDeviceType values.
CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13

#: (DLDataTypeCode, bits) -> dtype name (lanes 1 only).
DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
    (4, 16): "bfloat16", (5, 64): "complex64", (5, 128): "complex128", (6, 8): "bool",
    (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2",
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def parse_capsule(capsule):
    """(ptr, shape, strides in elements, dtype name or None, (device_type, device_id), itemsize)
    from an unconsumed legacy "dltensor" capsule. The capsule is not consumed: keeping it alive
    keeps the producer's memory alive, and its destructor calls the producer's deleter."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    addr = get(capsule, b"dltensor")  # DLManagedTensor*: its DLTensor comes first
    t = _DLTensor.from_address(addr)
    ndim = t.ndim
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:  # legacy producers may leave strides NULL: compact row-major
        acc, rev = 1, []
        for s in reversed(shape):
            rev.append(acc)
            acc *= s
        strides = tuple(reversed(rev))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dname = DTYPES.get((code, bits)) if lanes == 1 else None
    ptr = (t.data or 0) + t.byte_offset
    return ptr, shape, strides, dname, (t.device.device_type, t.device.device_id), bits // 8


def stream_argument() -> int:
    """The ``stream`` numbatc tells a DLPack producer it will use: 1 (legacy default stream) or
    2 (per-thread default stream), matching what Numba's default stream means."""
    try:
        from numba.cuda.core import config

        return 2 if config.CUDA_PER_THREAD_DEFAULT_STREAM else 1
    except Exception:
        return 1
