"""Stand-ins for CUDA arrays without a GPU, shared by the host-layer tests (test_gemm_api,
test_gemm_fast_path, test_gemm_fp8_api, test_gemm_block_scaled_api, test_softmax_api,
test_attention_api): arrays seen only through ``__cuda_array_interface__`` (``FakeCuda``), fake
torch and CuPy modules, and the fixtures ``no_gpu`` (autouse where imported: device queries
answered from the fake pointers, results allocated as fakes) and ``launched`` (launch_gemm
replaced by a recorder).

Arrays here have made-up device pointers: nothing is ever dereferenced.  A fake pointer encodes
its device in bits 40 and up (see ``no_gpu``).  Import the fixtures into a test module to use
them there (``from tests.helpers.fake_arrays import no_gpu  # noqa: F401``)."""

import importlib
import itertools
import sys
import types

import numpy as np
import pytest

from numbatc import gemm_api
from numbatc.interop import alloc, devices
from numbatc.interop.arrays import DTypeView, as_cuda_array
from numbatc.interop.dtypes import dtype_name

real_allocate_like = alloc.allocate_like  # the fixture no_gpu replaces it by fakes

_serial = itertools.count(1)


def fake_ptr(device=0):
    return ((device + 1) << 40) + next(_serial) * (1 << 24)  # 16 MiB apart, 256-B aligned


class FakeCuda:
    """A CUDA array seen only through __cuda_array_interface__ v3 (strides given in elements)."""

    def __init__(self, shape, dtype="float16", strides=None, ptr=None, device=0, readonly=False,
                 stream=None, typestr=None, mask=None):
        dt = np.dtype(dtype)
        self.shape = tuple(shape)
        self.dtype = dt
        self.ptr = fake_ptr(device) if ptr is None else ptr
        self.device = device
        self.elem_strides = strides
        cai = {
            "shape": self.shape,
            "typestr": typestr or dt.str,
            "data": (self.ptr, readonly),
            "strides": None if strides is None else tuple(s * dt.itemsize for s in strides),
            "version": 3,
        }
        if stream is not None:
            cai["stream"] = stream
        if mask is not None:
            cai["mask"] = mask
        self.__cuda_array_interface__ = cai

    def _strides(self):
        if self.elem_strides is not None:
            return self.elem_strides
        st, acc = [], 1
        for s in reversed(self.shape):
            st.append(acc)
            acc *= s
        return tuple(reversed(st))

    @property
    def T(self):
        return FakeCuda(self.shape[::-1], self.dtype, self._strides()[::-1], ptr=self.ptr,
                        device=self.device)

    def at(self, i, j, shape):
        """The sub-block starting at element (i, j), of ``shape``, same strides."""
        s = self._strides()
        return FakeCuda(shape, self.dtype, s, ptr=self.ptr + (i * s[0] + j * s[1]) * self.dtype.itemsize,
                        device=self.device)


def col_major(rows, cols, dtype="float16", ld=None, device=0):
    """A (rows, cols) column-major array: the transpose of a row-major (cols, ld) buffer."""
    ld = rows if ld is None else ld
    return FakeCuda((rows, cols), dtype, strides=(1, ld), device=device)


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """Device queries answered from the fake pointers; an H200 (sm_90) unless a test says so;
    results allocated as fakes on the operand's device."""
    monkeypatch.setattr(devices, "pointer_device", lambda ptr, name="array": (ptr >> 40) - 1)
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: (9, 0))
    allocated = []

    def allocate_like(t, shape, dtype):
        ca = as_cuda_array(t)
        dtype = dtype_name(dtype)
        if dtype == "bfloat16":
            r = DTypeView(FakeCuda(shape, "uint16", device=ca.device or 0), "bfloat16")
        else:
            r = FakeCuda(shape, dtype, device=ca.device or 0)
        allocated.append((shape, dtype, r))
        return r

    monkeypatch.setattr(alloc, "allocate_like", allocate_like)
    return allocated


@pytest.fixture
def launched(monkeypatch):
    """Replaces launch_gemm (and the K == 0 host epilogue) by recorders."""
    calls = []
    try:
        dispatch = importlib.import_module("numbatc.kernels.dispatch")
        monkeypatch.setattr(dispatch, "launch_gemm", calls.append)
    except ImportError:  # the kernel layer is not written yet
        kernels = types.ModuleType("numbatc.kernels")
        kernels.__path__ = []
        dispatch = types.ModuleType("numbatc.kernels.dispatch")
        dispatch.launch_gemm = calls.append
        monkeypatch.setitem(sys.modules, "numbatc.kernels", kernels)
        monkeypatch.setitem(sys.modules, "numbatc.kernels.dispatch", dispatch)
    epilogues = []
    monkeypatch.setattr(gemm_api, "_epilogue_without_product", epilogues.append)
    return types.SimpleNamespace(launches=calls, epilogues=epilogues)


def fake_torch(monkeypatch, current_stream=0xABC0):
    """A stand-in ``torch`` module in sys.modules (dtypes, CUDA tensors on fake pointers that refuse
    __cuda_array_interface__ for bfloat16 as torch does, empty, the current stream)."""
    torch = types.ModuleType("torch")

    class DType:
        def __init__(self, name, size):
            self.name, self.size = name, size

        def __str__(self):
            return f"torch.{self.name}"

    DType.__module__ = "torch"
    for name, size in [("float16", 2), ("bfloat16", 2), ("float32", 4), ("uint16", 2), ("int32", 4)]:
        setattr(torch, name, DType(name, size))

    class Device:
        def __init__(self, type_, index):
            self.type, self.index = type_, index

    class Tensor:
        def __init__(self, shape, dtype, strides=None, device=("cuda", 0), ptr=None):
            self.shape, self.dtype = tuple(shape), dtype
            self._strides = strides or FakeCuda(shape)._strides()
            self.device = Device(*device)
            self.layout = "torch.strided"
            self.ptr = fake_ptr(device[1] or 0) if ptr is None else ptr

        def data_ptr(self):
            return self.ptr

        def stride(self):
            return self._strides

        def element_size(self):
            return self.dtype.size

        @property
        def T(self):
            return Tensor(self.shape[::-1], self.dtype, self._strides[::-1],
                          (self.device.type, self.device.index), self.ptr)

        @property
        def __cuda_array_interface__(self):  # as torch: refuses bfloat16
            raise TypeError("Got unsupported ScalarType BFloat16")

    torch.Tensor = Tensor
    torch.empty = lambda shape, dtype, device: Tensor(shape, dtype, device=(device.type, device.index))
    torch.cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=current_stream))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def fake_cupy(monkeypatch, current_stream=0xC0C0):
    """A stand-in ``cupy`` module in sys.modules (ndarrays on fake pointers, devices as context
    managers, the current stream of the current device)."""
    cupy = types.ModuleType("cupy")

    class ndarray:
        def __init__(self, shape, dtype, strides=None, device=0, ptr=None):
            self.shape, self.dtype = tuple(shape), np.dtype(dtype)
            st = strides or FakeCuda(shape)._strides()
            self.strides = tuple(s * self.dtype.itemsize for s in st)
            self.device = types.SimpleNamespace(id=device)
            self.data = types.SimpleNamespace(ptr=fake_ptr(device) if ptr is None else ptr)

        @property
        def T(self):
            return ndarray(self.shape[::-1], self.dtype,
                           tuple(s // self.dtype.itemsize for s in self.strides[::-1]),
                           self.device.id, self.data.ptr)

    class Device:
        current = 0

        def __init__(self, i):
            self.i = i

        def __enter__(self):
            self.prev, Device.current = Device.current, self.i

        def __exit__(self, *exc):
            Device.current = self.prev

    cupy.ndarray = ndarray
    cupy.empty = lambda shape, dtype: ndarray(shape, dtype, device=Device.current)
    cupy.cuda = types.SimpleNamespace(
        Device=Device,
        get_current_stream=lambda: types.SimpleNamespace(ptr=current_stream + Device.current))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


def value_devices(torch):
    """torch.device compares and hashes by value; so must the stand-in's."""
    device = type(torch.Tensor((1,), torch.float16).device)
    device.__eq__ = lambda self, other: (self.type, self.index) == (other.type, other.index)
    device.__hash__ = lambda self: hash((self.type, self.index))
    return torch


def T(torch, shape, dtype="float16", strides=None, device=0, ptr=None):
    """A fake torch CUDA tensor of ``dtype`` (a name) on ``device``."""
    return torch.Tensor(shape, getattr(torch, dtype), strides=strides, device=("cuda", device),
                        ptr=ptr)
