"""numbatc's array layer on the GPU, without any GEMM kernel.

1. Round trips of each library (Numba, CuPy, PyTorch, a bare __cuda_array_interface__, a
   DLPack-only exporter, numbatc.bfloat16) through as_cuda_array / as_kernel_array /
   allocate_like / stream_for: pointers, strides and values agree, writes through a kernel view
   land in the caller's array, and the view keeps the caller's array alive.
2. ``numbatc.gemm`` end to end with ``launch_gemm`` replaced by a NumPy reference that reads and
   writes memory only through what GemmProblem says (pointer, layout 'row'/'col', leading
   dimension, storage dtype, stream): this proves the contract a kernel relies on, for every
   library, dtype and layout, with fresh random data and poisoned outputs.
3. The paths that need no kernel at all, for real: K == 0 (activation(beta * c + bias)) and
   M or N == 0.

Inputs are small random integers so that every sum is exact and results compare exactly."""

import gc
import importlib
import sys
import types
import weakref

import numpy as np
import pytest
from numba import cuda

import numbatc
from numbatc import gemm_api
from numbatc.interop import (DTypeView, allocate_like, as_cuda_array, as_kernel_array, stream_for,
                             transpose_view)
from numbatc.interop.views import copy_to_host


pytestmark = pytest.mark.gpu


def rng():
    return np.random.default_rng()


def ints(shape, lo=-4, hi=4):
    return rng().integers(lo, hi + 1, size=shape).astype(np.float32)


def ptr_of(d):
    return d.device_ctypes_pointer.value or 0


def bf16_bits(x):
    return gemm_api._from_float32(x, "bfloat16")


@cuda.jit
def _store_index(x):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        x[i, j] = i * 64 + j


def _index_values(shape):
    i, j = np.indices(shape)
    return (i * 64 + j).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# 1. round trips
# ---------------------------------------------------------------------------------------------


def test_numba_round_trip():
    h = ints((37, 53)).astype(np.float16)
    d = cuda.to_device(h)
    ca = as_cuda_array(d)
    assert (ca.library, ca.ptr, ca.shape, ca.strides, ca.dtype, ca.device) == (
        "numba", ptr_of(d), (37, 53), (53, 1), "float16", 0)
    assert as_kernel_array(d) is d  # a Numba array is its own kernel view
    t = transpose_view(d)  # NOTE: numba's d.T is a copy made by a kernel
    ct = as_cuda_array(t)
    assert (ct.shape, ct.strides, ct.ptr) == ((53, 37), (1, 53), ptr_of(d))
    np.testing.assert_array_equal(as_kernel_array(t).copy_to_host(), h.T)
    r = allocate_like(d, (5, 7), "float32")
    assert isinstance(r, cuda.cudadrv.devicearray.DeviceNDArray)
    assert (r.dtype, r.shape) == (np.float32, (5, 7))
    assert int(stream_for(d).handle) == 0  # Numba's default stream


def test_numba_ml_dtypes_bf16():
    ml = pytest.importorskip("ml_dtypes")
    bits = bf16_bits(ints((8, 16)))
    d = cuda.to_device(bits).view(ml.bfloat16)  # NOTE: numba cannot copy 'E' buffers; view instead
    ca = as_cuda_array(d)
    assert (ca.library, ca.dtype, ca.itemsize, ca.marked) == ("numba", "bfloat16", 2, False)
    kv = as_kernel_array(d)
    assert kv.dtype == np.uint16 and ptr_of(kv) == ptr_of(d)
    np.testing.assert_array_equal(kv.copy_to_host(), bits)
    r = allocate_like(d, (3, 4), "bfloat16")
    assert r.dtype == np.dtype(ml.bfloat16) and r.shape == (3, 4)


def test_numbatc_bfloat16_marks_numba_uint16():
    bits = bf16_bits(ints((6, 10)))
    u = cuda.to_device(bits)
    x = numbatc.bfloat16(u)
    assert isinstance(x, DTypeView) and x.data is u and x.shape == (6, 10)
    assert as_kernel_array(x.T).copy_to_host().tolist() == bits.T.tolist()
    r = allocate_like(x, (2, 3), "bfloat16")
    assert isinstance(r, DTypeView) and r.data.dtype == np.uint16 and r.shape == (2, 3)
    host = x.copy_to_host()
    np.testing.assert_array_equal(host.view(np.uint16), bits)


def test_bare_cuda_array_interface_device_query():
    h = ints((9, 5))
    d = cuda.to_device(h)

    class CAIOnly:
        def __init__(self, x):
            self.__cuda_array_interface__ = x.__cuda_array_interface__

    ca = as_cuda_array(CAIOnly(d))
    assert (ca.library, ca.ptr, ca.device, ca.dtype) == ("cai", ptr_of(d), 0, "float32")
    np.testing.assert_array_equal(as_kernel_array(CAIOnly(d)).copy_to_host(), h)
    assert isinstance(allocate_like(CAIOnly(d), (2, 2), "float16"), cuda.cudadrv.devicearray.DeviceNDArray)


def test_device_capability_is_read():
    cc = gemm_api._device_capability(0)
    assert len(cc) == 2 and cc == tuple(cuda.get_current_device().compute_capability)


def test_torch_bf16_transposed_round_trip():
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(ints((24, 40))).to("cuda", torch.bfloat16)
    tt = t.T  # (40, 24), column-major
    ca = as_cuda_array(tt)
    assert (ca.library, ca.dtype, ca.shape, ca.strides, ca.ptr, ca.device) == (
        "torch", "bfloat16", (40, 24), (1, 40), t.data_ptr(), t.device.index)
    kv = as_kernel_array(tt)
    assert kv.dtype == np.uint16 and kv.shape == (40, 24) and kv.strides == (2, 80)
    assert ptr_of(kv) == t.data_ptr()
    want = tt.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    np.testing.assert_array_equal(kv.copy_to_host(), want)


def test_torch_writes_through_a_kernel_view_land_in_the_tensor():
    torch = pytest.importorskip("torch")
    buf = torch.full((12, 20), float("nan"), device="cuda", dtype=torch.float32)
    sub = buf[2:9, 3:17].T  # (14, 7), column-major, padded, offset
    v = as_kernel_array(sub)
    assert ptr_of(v) == sub.data_ptr()
    _store_index[(1, 1), (16, 16)](v)
    cuda.synchronize()
    np.testing.assert_array_equal(sub.cpu().numpy(), _index_values((14, 7)))
    rest = buf.cpu().numpy().copy()
    rest[2:9, 3:17] = 0
    assert np.isnan(rest).sum() == 12 * 20 - 7 * 14  # nothing outside the view was touched


def test_torch_view_keeps_tensor_alive_allocation_and_stream():
    torch = pytest.importorskip("torch")
    t = torch.full((4, 4), 3.0, device="cuda")
    ref = weakref.ref(t)
    v = as_kernel_array(t)
    del t
    gc.collect()
    assert ref() is not None and v.copy_to_host().tolist() == [[3.0] * 4] * 4
    src = ref()
    r = allocate_like(src, (3, 5), "bfloat16")
    assert isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16 and r.device == src.device
    assert r.shape == (3, 5)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert int(stream_for(src).handle) == s.cuda_stream
    assert int(stream_for(src).handle) == torch.cuda.current_stream().cuda_stream


def test_torch_uint16_marked():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "uint16"):
        pytest.skip("torch without uint16")
    bits = bf16_bits(ints((5, 6)))
    u = torch.from_numpy(bits.view(np.int16)).to("cuda").view(torch.uint16)
    x = numbatc.bfloat16(u)
    assert as_cuda_array(x).dtype == "bfloat16"
    r = allocate_like(x, (2, 2), "bfloat16")
    assert isinstance(r, DTypeView) and r.data.dtype == torch.uint16


def test_dlpack_only_exporter():
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(ints((16, 12))).to("cuda", torch.bfloat16).T

    class DLOnly:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, stream=None):
            return self.x.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    ca = as_cuda_array(DLOnly(t))
    assert (ca.library, ca.dtype, ca.ptr, ca.shape, ca.strides, ca.device) == (
        "dlpack", "bfloat16", t.data_ptr(), (12, 16), (1, 12), t.device.index)
    want = t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
    np.testing.assert_array_equal(as_kernel_array(DLOnly(t)).copy_to_host(), want)


def test_cupy_round_trip_and_stream():
    cupy = pytest.importorskip("cupy")
    h = ints((20, 30)).astype(np.float16)
    x = cupy.asarray(np.ascontiguousarray(h.T)).T  # (20, 30) column-major
    ca = as_cuda_array(x)
    assert (ca.library, ca.ptr, ca.strides, ca.dtype) == ("cupy", x.data.ptr, (1, 20), "float16")
    np.testing.assert_array_equal(as_kernel_array(x).copy_to_host(), h)
    r = allocate_like(x, (4, 6), "float32")
    assert isinstance(r, cupy.ndarray) and r.dtype == np.float32 and r.shape == (4, 6)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        assert int(stream_for(x).handle) == s.ptr
    assert int(stream_for(x).handle) == cupy.cuda.get_current_stream().ptr


def test_cupy_ml_dtypes_bf16():
    cupy = pytest.importorskip("cupy")
    ml = pytest.importorskip("ml_dtypes")
    bits = bf16_bits(ints((8, 8)))
    try:
        x = cupy.asarray(bits).view(ml.bfloat16)
    except (TypeError, ValueError) as e:
        pytest.skip(f"this CuPy cannot carry ml_dtypes.bfloat16: {e}")
    assert as_cuda_array(x).dtype == "bfloat16"
    np.testing.assert_array_equal(as_kernel_array(x).copy_to_host(), bits)


# ---------------------------------------------------------------------------------------------
# 2. gemm end to end with a reference launch_gemm that reads only the GemmProblem
# ---------------------------------------------------------------------------------------------


def _raw_matrix(op, rows, cols):
    """A Numba view built only from (ptr, layout, ld, storage dtype): what a kernel would use."""
    s = op.itemsize
    strides = (op.ld * s, s) if op.layout == "row" else (s, op.ld * s)
    desc = {"shape": (rows, cols), "strides": strides, "data": (op.ptr, False),
            "typestr": op.array.storage_typestr, "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=op.array.obj, sync=False)


def _raw_vector(op):
    desc = {"shape": op.shape, "strides": (op.itemsize,), "data": (op.ptr, False),
            "typestr": op.array.storage_typestr, "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=op.array.obj, sync=False)


def _reference(a, b, alpha, beta, c, bias, activation):
    """float32 values before the output rounding (float64 sums of small integers are exact)."""
    acc = alpha * (np.ascontiguousarray(a, np.float64) @ np.ascontiguousarray(b, np.float64))
    if c is not None:
        acc = acc + beta * c.astype(np.float64)
    if bias is not None:
        acc = acc + bias.astype(np.float64)[None, :]
    return gemm_api.ACTIVATIONS[activation](acc.astype(np.float32))


def _round(x, dtype):
    return gemm_api._to_float32(gemm_api._from_float32(x, dtype), dtype)


@pytest.fixture
def reference_launch(monkeypatch):
    seen = []

    def launch_gemm(p):
        seen.append(p)
        assert p.m >= 1 and p.n >= 1 and p.k >= 1
        st = p.stream
        host = lambda op, r, c: gemm_api._to_float32(  # noqa: E731
            _raw_matrix(op, r, c).copy_to_host(stream=st), op.dtype)
        a, b = host(p.a, p.m, p.k), host(p.b, p.k, p.n)
        c = host(p.c, p.m, p.n) if p.c is not None else None
        bias = (gemm_api._to_float32(_raw_vector(p.bias).copy_to_host(stream=st), p.bias.dtype)
                if p.bias is not None else None)
        st.synchronize()
        res = gemm_api._from_float32(_reference(a, b, p.alpha, p.beta, c, bias, p.activation), p.out_dtype)
        out = _raw_matrix(p.out, p.m, p.n)
        if out.is_c_contiguous() or out.is_f_contiguous():
            out.copy_to_device(res, stream=st)
        else:
            out.setitem(slice(None), res, stream=st)
        st.synchronize()

    try:
        dispatch = importlib.import_module("numbatc.kernels.dispatch")
        monkeypatch.setattr(dispatch, "launch_gemm", launch_gemm)
    except ImportError:
        kernels = types.ModuleType("numbatc.kernels")
        kernels.__path__ = []
        dispatch = types.ModuleType("numbatc.kernels.dispatch")
        dispatch.launch_gemm = launch_gemm
        monkeypatch.setitem(sys.modules, "numbatc.kernels", kernels)
        monkeypatch.setitem(sys.modules, "numbatc.kernels.dispatch", dispatch)
    return seen


class Lib:
    """Makes arrays of one library from host float32 values (already representable)."""

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype
        if name == "torch":
            self.torch = pytest.importorskip("torch")
        if name == "cupy":
            self.cupy = pytest.importorskip("cupy")

    def array(self, h, layout="row", dtype=None):
        dtype = dtype or self.dtype
        col = layout == "col" and h.ndim == 2
        src = np.ascontiguousarray(h.T if col else h)
        if self.name == "torch":
            x = self.torch.from_numpy(src).to("cuda", getattr(self.torch, dtype))
        elif self.name == "cupy":
            x = self.cupy.asarray(src.astype(dtype))
        elif dtype == "bfloat16":  # numba: numbatc.bfloat16 around uint16 bits
            x = cuda.to_device(bf16_bits(src))
        else:
            x = cuda.to_device(src.astype(dtype))
        if col:
            x = transpose_view(x)
        if dtype == "bfloat16" and self.name in ("numba", "cupy"):
            x = numbatc.bfloat16(x)
        return x

    def poisoned(self, shape, dtype, layout="row", pad=0):
        """A NaN-filled output of ``shape`` in ``layout``, with ``pad`` extra elements per ld."""
        m, n = shape
        store = (n, m + pad) if layout == "col" else (m, n + pad)
        base = self.array(np.full(store, np.nan, np.float32), "row", dtype)
        marked = isinstance(base, DTypeView)
        if marked:
            base = base.data
        view = transpose_view(base[:, :m]) if layout == "col" else base[:, :n]
        return numbatc.bfloat16(view) if marked else view

    def to_host(self, r):
        if isinstance(r, DTypeView):
            return gemm_api._to_float32(copy_to_host(r.data), r.dtype)
        if self.name == "torch":
            assert isinstance(r, self.torch.Tensor)
            return r.float().cpu().numpy()
        if self.name == "cupy":
            assert isinstance(r, self.cupy.ndarray)
            return self.cupy.asnumpy(r).astype(np.float32)
        assert isinstance(r, cuda.cudadrv.devicearray.DeviceNDArray)
        return r.copy_to_host().astype(np.float32)


LIBS = [("numba", "float16"), ("numba", "bfloat16"), ("torch", "float16"), ("torch", "bfloat16"),
        ("cupy", "float16")]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.mark.parametrize("lib,dtype", LIBS)
@pytest.mark.parametrize("la,lb", LAYOUTS)
def test_gemm_contract_plain(reference_launch, lib, dtype, la, lb):
    L = Lib(lib, dtype)
    m, n, k = 37, 29, 23
    a, b = ints((m, k)), ints((k, n))
    r = numbatc.gemm(L.array(a, la), L.array(b, lb))
    (p,) = reference_launch
    assert (p.a.layout, p.b.layout, p.out.layout) == (la, lb, "row")
    assert (p.a.ld, p.b.ld) == ((k if la == "row" else m), (n if lb == "row" else k))
    assert (p.in_dtype, p.out_dtype, p.device) == (dtype, dtype, 0)
    assert r.shape == (m, n)
    if dtype == "bfloat16" and lib != "torch":
        assert isinstance(r, DTypeView)
    np.testing.assert_array_equal(L.to_host(r), _round(_reference(a, b, 1.0, 0.0, None, None, None), dtype))


@pytest.mark.parametrize("lib,dtype", LIBS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_gemm_contract_epilogue_and_out(reference_launch, lib, dtype, activation):
    L = Lib(lib, dtype)
    m, n, k = 19, 33, 40
    a, b, c, bias = ints((m, k)), ints((k, n)), ints((m, n)), ints((n,))
    out = L.poisoned((m, n), "float32", layout="col", pad=3)
    r = numbatc.gemm(L.array(a, "col"), L.array(b, "row"), c=L.array(c, "row", "float32"),
                     alpha=0.5, beta=2.0, bias=L.array(bias, dtype=dtype), activation=activation,
                     out=out)
    assert r is out
    (p,) = reference_launch
    assert (p.out.layout, p.out.ld, p.out_dtype, p.bias_dtype) == ("col", m + 3, "float32", dtype)
    want = _reference(a, b, 0.5, 2.0, c, bias, activation)
    np.testing.assert_array_equal(L.to_host(r), want)


def test_gemm_runs_on_torchs_current_stream(reference_launch):
    torch = pytest.importorskip("torch")
    a = torch.from_numpy(ints((8, 8))).to("cuda", torch.float16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        r = numbatc.gemm(a, a)
    s.synchronize()
    (p,) = reference_launch
    assert p.stream_handle == s.cuda_stream and int(p.stream.handle) == s.cuda_stream
    x = a.float().cpu().numpy()
    np.testing.assert_array_equal(r.float().cpu().numpy(), _round(x @ x, "float16"))


# ---------------------------------------------------------------------------------------------
# 3. no kernel needed: K == 0 and M or N == 0
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lib,dtype", LIBS)
@pytest.mark.parametrize("with_c,with_bias,activation", [
    (False, False, None), (True, False, "relu"), (False, True, "silu"), (True, True, "gelu")])
def test_k_zero(reference_launch, lib, dtype, with_c, with_bias, activation):
    L = Lib(lib, dtype)
    m, n = 13, 21
    c = ints((m, n)) if with_c else None
    bias = ints((n,)) if with_bias else None
    a = L.array(np.zeros((m, 0), np.float32))
    b = L.array(np.zeros((0, n), np.float32))
    for out_layout, out_dtype in (("row", dtype), ("col", "float32")):
        out = L.poisoned((m, n), out_dtype, layout=out_layout, pad=2)
        r = numbatc.gemm(a, b, c=None if c is None else L.array(c, "row", out_dtype),
                         beta=1.5 if with_c else 0.0,
                         bias=None if bias is None else L.array(bias, dtype=dtype),
                         activation=activation, out=out)
        assert r is out
        want = _reference(np.zeros((m, 0)), np.zeros((0, n)), 1.0, 1.5, c, bias, activation)
        np.testing.assert_array_equal(L.to_host(r), _round(want, out_dtype))
    assert not reference_launch  # no kernel launched


@pytest.mark.parametrize("lib,dtype", LIBS)
@pytest.mark.parametrize("m,n", [(0, 5), (5, 0), (0, 0)])
def test_empty_results(reference_launch, lib, dtype, m, n):
    L = Lib(lib, dtype)
    r = numbatc.gemm(L.array(np.zeros((m, 3), np.float32)), L.array(np.zeros((3, n), np.float32)),
                     out_dtype="float32")
    assert tuple(r.shape) == (m, n) and L.to_host(r).shape == (m, n)
    assert not reference_launch
