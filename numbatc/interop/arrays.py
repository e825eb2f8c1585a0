"""Every CUDA array that enters numbatc, normalised: :class:`CudaArray` (pointer, shape, strides
in elements, dtype name, device ordinal, library, the original object), made by
:func:`as_cuda_array` from

- PyTorch CUDA tensors, CuPy arrays and Numba device arrays (each read directly: torch's
  ``__cuda_array_interface__`` refuses bfloat16);
- Numba's simulator arrays (``NUMBA_ENABLE_CUDASIM``: their NumPy memory stands in for device 0);
- anything else with ``__cuda_array_interface__`` (v2/v3) or ``__dlpack__``/``__dlpack_device__``;
- :class:`DTypeView`: a uint16/uint8 array of any of those marked as bf16/fp8 data
  (``numbatc.bfloat16(x)``, views.py), for libraries that cannot name such a dtype.

:func:`same_device` checks that operands live on one GPU.  Nothing here imports torch or cupy:
a library's arrays can only exist once the library is imported, so ``sys.modules`` tells
whether to look for them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from numbatc.interop import devices, dlpack
from numbatc.interop.dtypes import (EXOTIC_STORAGE, dtype_name, ml_dtype, numpy_dtype_name,
                                    storage_typestr)

__all__ = ["CudaArray", "DTypeView", "as_cuda_array", "same_device", "library_of",
           "library_array", "ACCEPTED", "MOVE_TO_GPU"]

ACCEPTED = (
    "Numba device arrays, CuPy arrays, PyTorch CUDA tensors, objects with "
    "__cuda_array_interface__ (v2/v3) or __dlpack__/__dlpack_device__, and "
    "numbatc.bfloat16(<CUDA uint16 array>)"
)

MOVE_TO_GPU = (
    "move it to the GPU first (numba.cuda.to_device(x), cupy.asarray(x) or tensor.cuda())"
)


# ---------------------------------------------------------------------------------------------
# the normalised array
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaArray:
    """A CUDA array as numbatc sees it, whatever library it came from.

    ``strides`` are in elements (not bytes); ``ptr`` is the address of element (0, ..., 0);
    ``device`` is the CUDA device ordinal, or None when it cannot be known (an empty array with a
    NULL pointer from a bare __cuda_array_interface__); ``library`` is 'torch', 'cupy', 'numba',
    'cai' (another __cuda_array_interface__ exporter) or 'dlpack' (another DLPack exporter);
    ``marked`` is True when the dtype came from :class:`DTypeView` (``numbatc.bfloat16``);
    ``stream`` is the stream a __cuda_array_interface__ v3 exporter named (None if none).
    """

    ptr: int
    shape: tuple
    strides: tuple
    dtype: str
    itemsize: int
    device: int | None
    library: str
    obj: Any = field(compare=False, repr=False)
    readonly: bool = False
    marked: bool = False
    stream: int | None = field(default=None, compare=False)
    keepalive: Any = field(default=None, compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def storage_typestr(self) -> str:
        return storage_typestr(self.dtype, self.itemsize)

    def byte_range(self) -> tuple[int, int]:
        """The half-open byte range [lo, hi) that the array's elements span (empty if size 0)."""
        if self.size == 0:
            return (self.ptr, self.ptr)
        lo = hi = self.ptr
        for n, s in zip(self.shape, self.strides):
            step = (n - 1) * s * self.itemsize
            if step < 0:
                lo += step
            else:
                hi += step
        return (lo, hi + self.itemsize)

    def shares_memory(self, other: "CudaArray") -> bool:
        """True when some element of ``self`` and some element of ``other`` overlap in memory.

        Exact: when the bounding byte ranges overlap, NumPy's ``shares_memory`` solves the
        strided-overlap problem on stand-in arrays carrying the same addresses (it never reads
        them), so interleaved views of one buffer (``buf[:, :n]`` and ``buf[:, n:]``) do not
        count as overlapping. A problem NumPy deems too hard counts as overlapping."""
        if self.size == 0 or other.size == 0:
            return False
        if self.device is not None and other.device is not None and self.device != other.device:
            return False
        lo1, hi1 = self.byte_range()
        lo2, hi2 = other.byte_range()
        if hi1 <= lo2 or hi2 <= lo1:
            return False
        try:
            return bool(np.shares_memory(_address_stand_in(self), _address_stand_in(other),
                                         max_work=100_000))
        except np.exceptions.TooHardError:
            return True


class _AddressOnly:
    def __init__(self, arr: CudaArray):
        self.__array_interface__ = {
            "data": (arr.ptr, True),
            "shape": arr.shape,
            "strides": tuple(s * arr.itemsize for s in arr.strides),
            "typestr": f"|V{arr.itemsize}",
            "version": 3,
        }


def _address_stand_in(arr: CudaArray) -> np.ndarray:
    # NOTE: a NumPy array over a device address: only its pointer and strides are ever used
    # (by np.shares_memory); it must never be read.
    return np.asarray(_AddressOnly(arr))


# ---------------------------------------------------------------------------------------------
# DTypeView: bf16 / fp8 data in a library that cannot name it
# ---------------------------------------------------------------------------------------------


class DTypeView:
    """A CUDA array of raw unsigned storage marked as holding ``dtype`` data (no copy).

    ``numbatc.bfloat16(x)`` builds one from a uint16 array, ``numbatc.float8_e4m3(x)`` ... from
    uint8 arrays (views.py). It carries ``.data`` (the array of the caller's library), ``.dtype``
    (the logical dtype name), ``.shape``, ``.ndim``, ``.T`` and slicing (both give views of the
    same kind, never copies)."""

    __slots__ = ("data", "dtype")

    def __init__(self, data, dtype: str):
        dtype = dtype_name(dtype)
        if dtype not in EXOTIC_STORAGE:
            raise TypeError(
                f"DTypeView marks dtypes its library cannot name: one of {sorted(EXOTIC_STORAGE)}; "
                f"got {dtype!r}"
            )
        if isinstance(data, DTypeView):
            data = data.data
        inner = as_cuda_array(data, name="the array given to numbatc." + dtype)
        need = EXOTIC_STORAGE[dtype]
        if inner.dtype != need:
            raise TypeError(
                f"numbatc.{dtype} marks a CUDA {need} array holding {dtype} bit patterns; got an "
                f"array of dtype {inner.dtype}"
            )
        self.data = data
        self.dtype = dtype

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def T(self) -> "DTypeView":
        from numbatc.interop.views import transpose_view

        return DTypeView(transpose_view(self.data), self.dtype)

    def __getitem__(self, key) -> "DTypeView":
        return DTypeView(self.data[key], self.dtype)

    def __len__(self) -> int:
        return len(self.data)

    def copy_to_host(self) -> np.ndarray:
        """A NumPy copy: of dtype ml_dtypes.<dtype> when ml_dtypes is installed, else the raw
        unsigned storage."""
        from numbatc.interop.views import copy_to_host

        host = copy_to_host(self.data)
        try:
            return host.view(ml_dtype(self.dtype))
        except (ImportError, AttributeError):  # no ml_dtypes, or no such type (packed fp4)
            return host

    def __repr__(self) -> str:
        return f"numbatc.{self.dtype}({self.data!r})"


def library_array(ca: CudaArray):
    """The array of the caller's library behind ``ca`` (a DTypeView's ``.data``)."""
    return ca.obj.data if isinstance(ca.obj, DTypeView) else ca.obj


# ---------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------


def library_of(t) -> str | None:
    """'torch', 'cupy' or 'numba' for those libraries' own array types, else None. Checks only
    libraries already imported (their arrays cannot exist otherwise)."""
    mods = sys.modules
    torch = mods.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        return "torch"
    cupy = mods.get("cupy")
    if cupy is not None and isinstance(t, cupy.ndarray):
        return "cupy"
    numba_da = mods.get("numba.cuda.cudadrv.devicearray")
    base = getattr(numba_da, "DeviceNDArrayBase", None)  # absent under NUMBA_ENABLE_CUDASIM
    if base is not None and isinstance(t, base):
        return "numba"
    return None


def as_cuda_array(t, name: str = "array") -> CudaArray:
    """Normalise any accepted CUDA array to a :class:`CudaArray`.

    Raises TypeError for host arrays (NumPy arrays, CPU tensors: "move it to the GPU first"), for
    arrays whose dtype cannot be told apart (a bare '<V2' typestr), and for unknown objects (the
    message lists what is accepted). ``name`` ('a', 'b', 'bias' ...) prefixes the messages."""
    if isinstance(t, CudaArray):
        return t
    if isinstance(t, DTypeView):
        inner = as_cuda_array(t.data, name)
        return CudaArray(
            ptr=inner.ptr, shape=inner.shape, strides=inner.strides, dtype=t.dtype,
            itemsize=inner.itemsize, device=inner.device, library=inner.library, obj=t,
            readonly=inner.readonly, marked=True, stream=inner.stream, keepalive=inner.keepalive,
        )
    if type(t).__name__ == "FakeCUDAArray":
        return _from_simulator(t, name)
    lib = library_of(t)
    if lib == "torch":
        return _from_torch(t, name)
    if lib == "cupy":
        return _from_numpy_like(t, name, "cupy", int(t.data.ptr), int(t.device.id))
    if lib == "numba":
        return _from_numba(t, name)
    cai = getattr(t, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(t, cai, name)
    if not isinstance(t, np.ndarray) and hasattr(t, "__dlpack_device__") and hasattr(t, "__dlpack__"):
        return _from_dlpack(t, name)
    if isinstance(t, np.ndarray) or hasattr(t, "__array_interface__") or hasattr(t, "__array__"):
        raise TypeError(
            f"{name} is a host array ({_typename(t)}); numbatc needs CUDA device arrays: "
            f"{MOVE_TO_GPU}"
        )
    raise TypeError(f"{name} has type {_typename(t)}, which is not a CUDA array; accepted: {ACCEPTED}")


def _typename(t) -> str:
    ty = type(t)
    mod = ty.__module__
    return ty.__qualname__ if mod == "builtins" else f"{mod}.{ty.__qualname__}"


_TORCH_DTYPES: dict = {}


def _from_torch(t, name) -> CudaArray:
    dev = t.device
    if dev.type != "cuda":
        if dev.type == "cpu":
            raise TypeError(f"{name} is a CPU torch.Tensor; numbatc needs CUDA tensors: {MOVE_TO_GPU}")
        raise TypeError(f"{name} is a torch.Tensor on device {dev}, not a CUDA device; accepted: {ACCEPTED}")
    if str(t.layout) != "torch.strided":
        raise TypeError(f"{name} is a {t.layout} torch.Tensor; numbatc needs strided (dense) tensors")
    dt = t.dtype
    dname = _TORCH_DTYPES.get(dt)
    if dname is None:
        dname = _TORCH_DTYPES[dt] = str(dt).removeprefix("torch.")
    # NOTE: torch's __cuda_array_interface__ refuses bfloat16, so read the tensor directly;
    # data_ptr() already includes the storage offset.
    return CudaArray(
        ptr=int(t.data_ptr()), shape=tuple(t.shape), strides=tuple(t.stride()), dtype=dname,
        itemsize=int(t.element_size()), device=int(dev.index if dev.index is not None else 0),
        library="torch", obj=t,
    )


def _from_numpy_like(t, name, library, ptr, device) -> CudaArray:
    dt = np.dtype(t.dtype)
    isz = dt.itemsize
    strides = t.strides
    if any(s % isz for s in strides):
        raise ValueError(
            f"{name}: {library} array has byte strides {tuple(strides)} that are not multiples of "
            f"its itemsize {isz}"
        )
    return CudaArray(
        ptr=ptr, shape=tuple(t.shape), strides=tuple(s // isz for s in strides),
        dtype=numpy_dtype_name(dt, name, library), itemsize=isz, device=device,
        library=library, obj=t,
    )


def _from_numba(t, name) -> CudaArray:
    ptr = t.device_ctypes_pointer.value or 0
    device = None
    gpu_data = getattr(t, "gpu_data", None)
    ctx = getattr(gpu_data, "context", None)
    if ctx is not None:
        device = int(ctx.device.id)
    elif ptr:
        device = devices.pointer_device(ptr, name)
    return _from_numpy_like(t, name, "numba", int(ptr), device)


def _from_simulator(t, name) -> CudaArray:
    """A Numba simulator array (NUMBA_ENABLE_CUDASIM): its NumPy memory stands in for device 0,
    so that numbatc's kernels run in the CPU emulation."""
    host = t._ary
    ca = _from_numpy_like(host, name, "numba", int(host.__array_interface__["data"][0]), 0)
    return CudaArray(ptr=ca.ptr, shape=ca.shape, strides=ca.strides, dtype=ca.dtype,
                     itemsize=ca.itemsize, device=0, library="numba", obj=t, keepalive=host)


def _from_cai(t, cai: dict, name) -> CudaArray:
    if cai.get("mask") is not None:
        raise TypeError(f"{name}: masked __cuda_array_interface__ arrays are not supported")
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    kind, size = typestr[1:2], typestr[2:]
    if kind == "V" or (kind == "f" and size == "1"):
        raise TypeError(
            f"{name}: __cuda_array_interface__ typestr {typestr!r} does not say which type it is "
            "(ml_dtypes exports bfloat16 as '<V2' and float8_e5m2 as '<f1'); pass bf16 data as "
            "numbatc.bfloat16(<uint16 array>), a torch.bfloat16 tensor or an ml_dtypes CuPy array"
        )
    try:
        dt = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"{name}: __cuda_array_interface__ typestr {typestr!r} is not supported") from None
    dname = numpy_dtype_name(dt, name, "__cuda_array_interface__")
    isz = dt.itemsize
    strides = cai.get("strides")
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        if any(int(s) % isz for s in strides):
            raise ValueError(f"{name}: byte strides {tuple(strides)} are not multiples of the itemsize {isz}")
        strides = tuple(int(s) // isz for s in strides)
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    size = 1
    for s in shape:
        size *= s
    device = devices.pointer_device(ptr, name) if ptr and size else None
    return CudaArray(
        ptr=ptr, shape=shape, strides=strides, dtype=dname, itemsize=isz, device=device,
        library="cai", obj=t, readonly=bool(readonly), stream=cai.get("stream"),
    )


def _from_dlpack(t, name) -> CudaArray:
    dev_type, dev_id = t.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type in (dlpack.CPU, dlpack.CUDA_HOST):
        raise TypeError(
            f"{name} is a host array ({_typename(t)}, DLPack device type {dev_type}); numbatc "
            f"needs CUDA device arrays: {MOVE_TO_GPU}"
        )
    if dev_type not in (dlpack.CUDA, dlpack.CUDA_MANAGED):
        raise TypeError(
            f"{name} ({_typename(t)}) lives on DLPack device type {dev_type}, not CUDA; "
            f"accepted: {ACCEPTED}"
        )
    try:
        capsule = t.__dlpack__(stream=dlpack.stream_argument())
    except TypeError:  # producers predating the stream argument
        capsule = t.__dlpack__()
    ptr, shape, strides, dname, _, isz = dlpack.parse_capsule(capsule)
    if dname is None:
        raise TypeError(f"{name}: DLPack dtype of {_typename(t)} is not supported by numbatc")
    return CudaArray(
        ptr=ptr, shape=shape, strides=strides, dtype=dname, itemsize=isz, device=int(dev_id),
        library="dlpack", obj=t, keepalive=capsule,
    )


# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------


def same_device(*arrays, names=None) -> int | None:
    """The one device ordinal that all ``arrays`` (objects or CudaArrays; None entries skipped)
    live on, or None if none of them knows its device. ValueError names each operand's device
    when they differ."""
    if names is None:
        names = [f"array {i}" for i in range(len(arrays))]
    found = []
    for nm, arr in zip(names, arrays):
        if arr is None:
            continue
        ca = as_cuda_array(arr, nm)
        if ca.device is not None:
            found.append((nm, ca.device))
    found_devices = {d for _, d in found}
    if len(found_devices) > 1:
        where = ", ".join(f"{nm} on cuda:{d}" for nm, d in found)
        raise ValueError(f"operands are on different devices ({where}); put them all on one GPU")
    return found_devices.pop() if found_devices else None
