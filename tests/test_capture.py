"""CUDA graph capture on the CPU: numbatc's capture check (numbatc._capture) with the driver
query replaced by a fake, and what each call refuses or does differently while its stream
captures -- split-K workspaces from torch's allocator, the errors that name what cannot be
recorded.  The captures themselves run on the GPU: tests/gpu/test_graphs_gpu.py."""

import itertools
import sys
import types

import numpy as np
import pytest

import numbatc
from numbatc import _capture, gemm_api
from numbatc.interop import devices
from numbatc.kernels import operands, split_k

_serial = itertools.count(1)


@pytest.fixture
def capturing(monkeypatch):
    """Make every stream report ``status`` ('active' by default) to numbatc's capture check."""
    state = {"status": "active", "asked": []}

    def query(handle):
        state["asked"].append(handle)
        return state["status"]

    monkeypatch.setattr(_capture, "_query", query)
    return state


class FakeCai:
    """A CUDA array seen only through __cuda_array_interface__ (never dereferenced)."""

    def __init__(self, shape, dtype="float16", stream=None):
        dt = np.dtype(dtype)
        self.shape = tuple(shape)
        cai = {"shape": self.shape, "typestr": dt.str, "version": 3, "strides": None,
               "data": ((1 << 40) + next(_serial) * (1 << 24), False)}
        if stream is not None:
            cai["stream"] = stream
        self.__cuda_array_interface__ = cai


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr(devices, "pointer_device", lambda ptr, name="array": 0)
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: (9, 0))


@pytest.mark.parametrize("status, words", [
    ("active", "the stream is capturing a CUDA graph"),
    ("invalidated", "already been invalidated"),
    ("implicit", "legacy default stream"),
])
def test_refusal_names_what_and_why(capturing, status, words):
    capturing["status"] = status
    with pytest.raises(_capture.CaptureError) as info:
        _capture.refuse_if_capturing(7, "do the thing", "do it before capturing")
    msg = str(info.value)
    assert msg.startswith("numbatc cannot do the thing while ") and words in msg
    assert msg.endswith(": do it before capturing")
    assert capturing["asked"] == [7]


def test_no_refusal_outside_capture(capturing):
    capturing["status"] = "none"
    _capture.refuse_if_capturing(7, "do the thing")
    assert not _capture.is_capturing(7)


def test_numba_stream_objects_give_their_handle(capturing):
    stream = types.SimpleNamespace(handle=0x1234)
    assert _capture.is_capturing(stream)
    assert capturing["asked"] == [0x1234]


def test_capture_error_is_a_runtime_error():
    assert issubclass(numbatc.CaptureError, RuntimeError)
    assert numbatc.CaptureError is _capture.CaptureError


class _FakeTensor:
    def __init__(self, n, dtype, fill):
        self.n, self.dtype, self.fill = n, dtype, fill
        self.ptr = (2 << 40) + next(_serial) * (1 << 24)

    def data_ptr(self):
        return self.ptr


@pytest.fixture
def fake_torch(monkeypatch):
    """A torch module with only what split-K's captured buffers use (records the calls)."""
    made = []

    def empty(n, dtype, device):
        made.append(("empty", n, dtype, device))
        return _FakeTensor(n, dtype, None)

    def zeros(n, dtype, device):
        made.append(("zeros", n, dtype, device))
        return _FakeTensor(n, dtype, 0)

    torch = types.SimpleNamespace(empty=empty, zeros=zeros, float32="float32", int32="int32",
                                  device=lambda kind, index: f"{kind}:{index}")
    monkeypatch.setitem(sys.modules, "torch", torch)
    return made


def test_split_workspace_while_capturing_comes_from_torch(capturing, fake_torch, monkeypatch):
    """A captured split-K launch of torch inputs takes new buffers from torch's allocator (the
    counters zeroed) every launch, never numbatc's per-stream cache, and keeps them referenced
    until the thread's next captured launch."""
    monkeypatch.setattr(split_k, "_WORKSPACES", {})
    get = split_k.split_workspace(3, floats=4 * 16 * 256, counters=8, library="torch")
    ws, cnt = get(0x77)
    assert fake_torch == [("empty", 4 * 16 * 256, "float32", "cuda:3"),
                          ("zeros", 8, "int32", "cuda:3")]
    kept = split_k._CAPTURED.keep
    assert (kept[0].data_ptr(), kept[1].data_ptr()) == (ws, cnt)
    ws2, cnt2 = get(0x77)
    assert (ws2, cnt2) != (ws, cnt) and len(fake_torch) == 4
    assert split_k._WORKSPACES == {}


def test_split_workspace_while_capturing_refuses_other_libraries(capturing, monkeypatch):
    monkeypatch.setattr(split_k, "_WORKSPACES", {})
    get = split_k.split_workspace(0, floats=1024, counters=4, library="cupy")
    with pytest.raises(_capture.CaptureError, match="split-K workspace.*NUMBATC_SPLIT_K=1"):
        get(0x77)
    assert split_k._WORKSPACES == {}


def test_packing_an_unaligned_operand_is_refused(capturing):
    """The packed copy of an operand that is not 16-byte aligned is allocated: refused, named,
    before anything touches the device."""
    from numbatc.gemm_api import Operand

    op = Operand("a", array=None, layout="row", ld=9, alignment=2)
    with pytest.raises(_capture.CaptureError, match="pack a .not 16-byte aligned."):
        operands.aligned_view(op, 0x55)


def test_result_allocation_for_other_libraries_is_refused(capturing, fake_device):
    """numbatc allocates results for non-torch arrays with cuMemAlloc or CuPy's pool: refused
    while capturing, with out= as the way out."""
    a, b = FakeCai((16, 32), stream=0x99), FakeCai((32, 8), stream=0x99)
    with pytest.raises(_capture.CaptureError, match="allocate a result for cai arrays.*out="):
        numbatc.gemm(a, b)
    assert capturing["asked"] == [0x99]


def test_k_zero_is_refused(capturing, fake_device):
    """K == 0 runs on the host (copies and a wait): refused while capturing."""
    a, b = FakeCai((16, 0), stream=0x99), FakeCai((0, 8), stream=0x99)
    out = FakeCai((16, 8), stream=0x99)
    with pytest.raises(_capture.CaptureError, match="K == 0"):
        numbatc.gemm(a, b, out=out)


def test_softmax_result_allocation_is_refused(capturing, fake_device):
    with pytest.raises(_capture.CaptureError, match="allocate a result"):
        numbatc.softmax(FakeCai((5, 70), stream=0x99))


def test_the_driver_query_maps_every_status(monkeypatch):
    """_query's reading of cuStreamIsCapturing (bound once: the query function, CUstream and the
    result codes), with a fake driver: each (result, status) pair to numbatc's status, one
    CUstream made per handle, and a driver library that cannot load taken as 'no capture
    ever' (a CPU host)."""
    ok, implicit, other, active, invalidated, idle = "ok", "implicit", "other", "A", "I", "N"
    answers, made = {}, []

    def custream(handle):
        made.append(handle)
        return ("stream", handle)

    def query(stream):
        return answers[stream[1]]

    monkeypatch.setattr(_capture, "_DRIVER", (query, custream, ok, implicit, active,
                                              invalidated, {}))
    cases = {1: ((ok, active), "active"), 2: ((ok, invalidated), "invalidated"),
             3: ((ok, idle), "none"), 4: ((implicit, idle), "implicit"),
             5: ((other, active), "none")}
    for handle, (answer, _) in cases.items():
        answers[handle] = answer
    for _ in range(2):
        for handle, (_, want) in cases.items():
            assert _capture._query(handle) == want, handle
    assert made == [1, 2, 3, 4, 5]  # each handle's CUstream made once

    def unloadable(stream):
        raise RuntimeError("libcuda.so not found")

    monkeypatch.setattr(_capture, "_DRIVER", (unloadable, custream, ok, implicit, active,
                                              invalidated, {}))
    assert _capture._query(1) == "none"
    assert _capture._DRIVER is False and _capture._query(1) == "none"
