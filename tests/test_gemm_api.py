"""numbatc.gemm's user-facing layer without a GPU: every validation error, layout detection,
zero-size handling, dtype resolution, alias detection, array normalisation (bare
__cuda_array_interface__, DLPack, stand-ins for torch and CuPy), and the GemmProblem that reaches
``numbatc.kernels.dispatch.launch_gemm`` (replaced here by a recorder).

Arrays here are fakes with made-up device pointers: nothing is ever dereferenced. A fake pointer
encodes its device in bits 40 and up (the stand-ins and fixtures: tests/helpers/fake_arrays.py)."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import numbatc
from numbatc import gemm_api
from numbatc.interop import DTypeView, alloc, arrays, dlpack, streams
from numbatc.interop.arrays import as_cuda_array
from numbatc.interop.dtypes import dtype_name
from tests.helpers.fake_arrays import (  # noqa: F401  (launched, no_gpu: fixtures; no_gpu autouse)
    FakeCuda, col_major, fake_cupy, fake_ptr, fake_torch, launched, no_gpu,
    real_allocate_like)

gemm = numbatc.gemm


def ab(m=64, n=48, k=32, dtype="float16"):
    return FakeCuda((m, k), dtype), FakeCuda((k, n), dtype)


# ---------------------------------------------------------------------------------------------
# import stays light
# ---------------------------------------------------------------------------------------------


def test_import_numbatc_is_light():
    code = ("import sys, numbatc; numbatc.gemm; numbatc.bfloat16; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numba', 'torch', 'cupy', 'ml_dtypes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# normalisation: __cuda_array_interface__
# ---------------------------------------------------------------------------------------------


def test_cai_row_major_and_transposed():
    x = FakeCuda((3, 5), "float16", stream=77)
    ca = as_cuda_array(x)
    assert (ca.ptr, ca.shape, ca.strides, ca.dtype, ca.itemsize) == (x.ptr, (3, 5), (5, 1), "float16", 2)
    assert (ca.device, ca.library, ca.readonly, ca.marked, ca.stream) == (0, "cai", False, False, 77)
    assert ca.obj is x
    t = as_cuda_array(x.T)
    assert (t.shape, t.strides, t.ptr) == ((5, 3), (1, 5), x.ptr)


def test_cai_device_readonly_and_empty():
    ca = as_cuda_array(FakeCuda((4,), "float32", device=3, readonly=True))
    assert (ca.device, ca.readonly, ca.strides) == (3, True, (1,))
    empty = as_cuda_array(FakeCuda((0, 4), "float16", ptr=0))
    assert (empty.device, empty.size, empty.byte_range()) == (None, 0, (0, 0))


@pytest.mark.parametrize("typestr", ["<V2", "<f1", "|V1"])
def test_cai_ambiguous_typestr_points_to_bfloat16(typestr):
    with pytest.raises(TypeError, match=r"does not say which type.*numbatc\.bfloat16"):
        as_cuda_array(FakeCuda((2, 2), "uint16", typestr=typestr), "a")


def test_cai_rejects_mask_big_endian_and_odd_strides():
    with pytest.raises(TypeError, match="masked"):
        as_cuda_array(FakeCuda((2, 2), mask=object()))
    with pytest.raises(TypeError, match="not supported"):
        as_cuda_array(FakeCuda((2, 2), typestr=">f2"))
    bad = FakeCuda((2, 2))
    bad.__cuda_array_interface__["strides"] = (4, 3)
    with pytest.raises(ValueError, match=r"byte strides \(4, 3\) are not multiples of the itemsize 2"):
        as_cuda_array(bad)


def test_host_arrays_say_move_to_gpu():
    with pytest.raises(TypeError, match=r"a is a host array \(numpy.ndarray\).*move it to the GPU first"):
        as_cuda_array(np.zeros((2, 2), np.float16), "a")


@pytest.mark.parametrize("obj", [[[1.0]], 3.0, "x", object()])
def test_unknown_objects_list_what_is_accepted(obj):
    with pytest.raises(TypeError, match=r"not a CUDA array; accepted: Numba device arrays, CuPy "
                                        r"arrays, PyTorch CUDA tensors, .*__cuda_array_interface__"
                                        r".*__dlpack__"):
        as_cuda_array(obj, "b")


# ---------------------------------------------------------------------------------------------
# normalisation: DLPack
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: np.arange(12, dtype=np.float16).reshape(3, 4),
    lambda: np.arange(12, dtype=np.float32).reshape(3, 4).T,
    lambda: np.arange(40, dtype=np.int8).reshape(5, 8)[1:, ::2],
])
def test_dlpack_capsule_parsing_matches_numpy(make):
    x = make()
    ptr, shape, strides, dname, device, isz = dlpack.parse_capsule(x.__dlpack__())
    assert ptr == x.__array_interface__["data"][0]
    assert shape == x.shape
    assert strides == tuple(s // x.itemsize for s in x.strides)
    assert (dname, isz, device) == (x.dtype.name, x.itemsize, (1, 0))


class FakeDLPack:
    """A DLPack-only CUDA exporter (its capsule borrowed from NumPy; only its addresses are used)."""

    def __init__(self, host, device=(2, 1), takes_stream=True):
        self.host, self.device, self.takes_stream, self.streams = host, device, takes_stream, []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kw):
        if kw and not self.takes_stream:
            raise TypeError("unexpected keyword argument 'stream'")
        self.streams.append(kw.get("stream"))
        return self.host.__dlpack__()


@pytest.mark.parametrize("takes_stream", [True, False])
def test_dlpack_cuda_exporter(takes_stream):
    host = np.zeros((4, 6), np.float16).T
    x = FakeDLPack(host, takes_stream=takes_stream)
    ca = as_cuda_array(x, "a")
    assert (ca.library, ca.device, ca.shape, ca.strides, ca.dtype) == ("dlpack", 1, (6, 4), (1, 6), "float16")
    assert ca.ptr == host.__array_interface__["data"][0]
    assert ca.keepalive is not None  # the capsule keeps the producer's memory alive
    assert x.streams == ([1] if takes_stream else [None])  # "I use the legacy default stream"


def test_dlpack_host_and_foreign_devices():
    with pytest.raises(TypeError, match=r"host array .*DLPack device type 1.*move it to the GPU"):
        as_cuda_array(FakeDLPack(np.zeros(3), device=(1, 0)), "a")
    with pytest.raises(TypeError, match="DLPack device type 3"):  # pinned host memory
        as_cuda_array(FakeDLPack(np.zeros(3), device=(3, 0)), "a")
    with pytest.raises(TypeError, match="device type 10, not CUDA"):
        as_cuda_array(FakeDLPack(np.zeros(3), device=(10, 0)), "a")
    assert as_cuda_array(FakeDLPack(np.zeros(3), device=(13, 0))).device == 0  # managed memory


def test_dlpack_dtype_table():
    assert dlpack.DTYPES[(4, 16)] == "bfloat16"
    assert dlpack.DTYPES[(10, 8)] == "float8_e4m3fn"
    assert dlpack.DTYPES[(12, 8)] == "float8_e5m2"
    assert dlpack.DTYPES[(2, 16)] == "float16"


# ---------------------------------------------------------------------------------------------
# stand-ins for torch and CuPy (their normalisation, allocation and current stream)
# ---------------------------------------------------------------------------------------------


def test_torch_bf16_transposed_and_stream(monkeypatch):
    torch = fake_torch(monkeypatch)
    t = torch.Tensor((8, 4), torch.bfloat16, device=("cuda", 1)).T
    ca = as_cuda_array(t, "a")
    assert (ca.library, ca.dtype, ca.itemsize, ca.shape, ca.strides, ca.device) == (
        "torch", "bfloat16", 2, (4, 8), (1, 4), 1)
    assert ca.storage_typestr == "<u2"
    assert streams.stream_handle(t) == 0xABC0


def test_torch_cpu_tensor_is_a_host_array(monkeypatch):
    torch = fake_torch(monkeypatch)
    with pytest.raises(TypeError, match=r"a is a CPU torch.Tensor.*tensor.cuda\(\)"):
        as_cuda_array(torch.Tensor((2, 2), torch.float16, device=("cpu", None)), "a")
    with pytest.raises(TypeError, match="not a CUDA device"):
        as_cuda_array(torch.Tensor((2, 2), torch.float16, device=("mps", 0)), "a")


def test_torch_result_is_a_torch_tensor(monkeypatch, launched):
    torch = fake_torch(monkeypatch, current_stream=0x5150)
    monkeypatch.setattr(alloc, "allocate_like", real_allocate_like)
    a = torch.Tensor((16, 8), torch.bfloat16)
    b = torch.Tensor((16, 8), torch.bfloat16).T  # column-major (8, 16)
    out = gemm(a, b, out_dtype=torch.float32)
    assert isinstance(out, torch.Tensor) and out.dtype is torch.float32 and out.shape == (16, 16)
    (p,) = launched.launches
    assert (p.a.layout, p.b.layout, p.b.ld, p.stream_handle) == ("row", "col", 8, 0x5150)
    assert (p.in_dtype, p.out_dtype, p.out.ptr) == ("bfloat16", "float32", out.ptr)


def test_cupy_ml_dtypes_bf16_and_allocation(monkeypatch):
    cupy = fake_cupy(monkeypatch)
    x = cupy.ndarray((4, 6), ml_dtypes.bfloat16, device=2)
    ca = as_cuda_array(x)
    assert (ca.library, ca.dtype, ca.device, ca.strides) == ("cupy", "bfloat16", 2, (6, 1))
    assert streams.stream_handle(x) == 0xC0C0 + 2  # the current stream of x's device
    allocate = real_allocate_like
    r = allocate(x, (3, 3), "bfloat16")  # ml_dtypes in -> ml_dtypes out
    assert isinstance(r, cupy.ndarray) and r.dtype == np.dtype(ml_dtypes.bfloat16) and r.device.id == 2
    r = allocate(x, (3, 3), "float32")
    assert isinstance(r, cupy.ndarray) and r.dtype == np.float32


def test_marked_bf16_results_come_back_marked(monkeypatch):
    cupy = fake_cupy(monkeypatch)
    u = cupy.ndarray((4, 6), np.uint16, device=1)
    x = numbatc.bfloat16(u)
    assert isinstance(x, DTypeView) and x.data is u and x.shape == (4, 6)
    ca = as_cuda_array(x)
    assert (ca.dtype, ca.marked, ca.library, ca.itemsize, ca.storage_typestr) == (
        "bfloat16", True, "cupy", 2, "<u2")
    allocate = real_allocate_like
    r = allocate(x, (2, 5), "bfloat16")
    assert isinstance(r, DTypeView) and r.dtype == "bfloat16"
    assert isinstance(r.data, cupy.ndarray) and r.data.dtype == np.uint16 and r.data.device.id == 1
    r32 = allocate(x, (2, 5), "float32")
    assert isinstance(r32, cupy.ndarray) and r32.dtype == np.float32
    xt = x.T
    assert isinstance(xt, DTypeView) and as_cuda_array(xt).strides == (1, 6)


# ---------------------------------------------------------------------------------------------
# numbatc.bfloat16
# ---------------------------------------------------------------------------------------------


def test_bfloat16_marks_uint16_only():
    u = FakeCuda((3, 3), "uint16")
    v = numbatc.bfloat16(u)
    assert isinstance(v, DTypeView) and numbatc.bfloat16(v) is v
    assert "numbatc.bfloat16" in repr(v)
    with pytest.raises(TypeError, match="marks a CUDA uint16 array .* got an array of dtype float16"):
        numbatc.bfloat16(FakeCuda((3, 3), "float16"))
    with pytest.raises(TypeError, match="host array"):
        numbatc.bfloat16(np.zeros((3, 3), np.uint16))
    with pytest.raises(TypeError, match="marks dtypes its library cannot name"):
        DTypeView(u, "float16")


# ---------------------------------------------------------------------------------------------
# memory overlap
# ---------------------------------------------------------------------------------------------


def test_shares_memory_is_exact():
    buf = FakeCuda((8, 16), "float16")
    left, right = buf.at(0, 0, (8, 8)), buf.at(0, 8, (8, 8))
    L, R, B = (as_cuda_array(x) for x in (left, right, buf))
    assert not L.shares_memory(R)  # interleaved rows, disjoint elements
    assert L.shares_memory(B) and R.shares_memory(B)
    assert as_cuda_array(buf.at(1, 7, (2, 2))).shares_memory(L)
    assert not as_cuda_array(FakeCuda((8, 16))).shares_memory(B)
    assert not as_cuda_array(FakeCuda((0, 16), ptr=B.ptr)).shares_memory(B)


# ---------------------------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------------------------

LAYOUTS = [
    # (shape, strides in elements, layout, ld)
    ((64, 32), (32, 1), "row", 32),
    ((64, 32), (40, 1), "row", 40),  # padded rows
    ((64, 32), (1, 64), "col", 64),  # a transposed (32, 64) buffer
    ((64, 32), (1, 72), "col", 72),  # padded, transposed
    ((1, 32), (32, 1), "row", 32),
    ((1, 32), (1, 1), "row", 32),
    ((64, 1), (1, 1), "col", 64),
    ((64, 1), (5, 99), "row", 5),  # a column of a wider matrix
    ((1, 32), (7, 3), "col", 3),  # a row of a transposed matrix
    ((1, 1), (9, 9), "row", 1),
    ((64, 32), (0, 1), "row", 0),  # broadcast rows (expand): read-only use
]


@pytest.mark.parametrize("shape,strides,layout,ld", LAYOUTS)
def test_layout_detection(shape, strides, layout, ld):
    op = gemm_api._matrix("a", as_cuda_array(FakeCuda(shape, strides=strides)), *shape)
    assert (op.layout, op.ld) == (layout, ld)


def test_alignment():
    def align(ptr_off, strides, shape=(8, 8)):
        base = fake_ptr()
        x = FakeCuda(shape, strides=strides, ptr=base + ptr_off)
        return gemm_api._matrix("a", as_cuda_array(x), *shape).alignment

    assert align(0, (8, 1)) == 16  # 16-B rows
    assert align(0, (12, 1)) == 8  # 24-B rows
    assert align(0, (9, 1)) == 2
    assert align(4, (8, 1)) == 4
    assert align(0, (1, 8)) == 16
    assert align(8, (8, 1), shape=(1, 8)) == 8  # a single row: only the pointer counts


def test_no_unit_stride_names_operand_and_strides(launched):
    a, b = ab()
    bad = FakeCuda((32, 48), strides=(96, 2))  # every other column
    with pytest.raises(ValueError, match=r"b \(shape \(32, 48\)\) has strides \(96, 2\).*no unit "
                                         r"stride in either dimension"):
        gemm(a, bad)
    with pytest.raises(ValueError, match=r"a \(shape \(64, 32\)\) has strides \(2, 128\)"):
        gemm(FakeCuda((64, 32), strides=(2, 128)), b)
    assert not launched.launches


# ---------------------------------------------------------------------------------------------
# the problem handed to launch_gemm
# ---------------------------------------------------------------------------------------------


def test_correct_call_reaches_launch_gemm(launched, no_gpu):
    a = FakeCuda((64, 32), "float16", stream=0x77)
    b = col_major(32, 48, ld=40)
    c = FakeCuda((64, 48), "float32")
    bias = FakeCuda((48,), "float16")
    out = gemm(a, b, c=c, alpha=2, beta=0.5, bias=bias, activation="gelu", out_dtype="float32")
    (p,) = launched.launches
    assert not launched.epilogues
    assert isinstance(p, gemm_api.GemmProblem)
    assert (p.m, p.n, p.k) == (64, 48, 32)
    assert (p.a.ptr, p.a.layout, p.a.ld, p.a.alignment) == (a.ptr, "row", 32, 16)
    assert (p.b.ptr, p.b.layout, p.b.ld, p.b.alignment) == (b.ptr, "col", 40, 16)
    assert (p.c.ptr, p.c.layout, p.c.ld, p.c.dtype) == (c.ptr, "row", 48, "float32")
    assert (p.bias.ptr, p.bias.layout, p.bias.dtype) == (bias.ptr, "row", "float16")
    assert (p.out.ptr, p.out.layout, p.out.ld, p.out.shape) == (out.ptr, "row", 48, (64, 48))
    assert (p.alpha, p.beta, p.activation) == (2.0, 0.5, "gelu")
    assert isinstance(p.alpha, float)
    assert (p.in_dtype, p.b_dtype, p.out_dtype, p.bias_dtype, p.acc_dtype) == (
        "float16", "float16", "float32", "float16", "float32")
    assert (p.device, p.cc, p.stream_handle) == (0, (9, 0), 0x77)
    assert [(s, d) for s, d, _ in no_gpu] == [((64, 48), "float32")]
    assert out is no_gpu[0][2]


def test_out_written_in_place_and_c_ignored_when_beta_is_zero(launched):
    a, b = ab()
    out = col_major(64, 48)
    c = FakeCuda((64, 48), "float16")
    r = gemm(a, b, c=c, out=out)
    assert r is out
    (p,) = launched.launches
    assert p.c is None and p.beta == 0.0
    assert (p.out.ptr, p.out.layout, p.out.ld) == (out.ptr, "col", 64)


def test_out_may_be_c_itself(launched):
    a, b = ab()
    c = FakeCuda((64, 48), "float16")
    assert gemm(a, b, c=c, beta=1.0, out=c) is c
    (p,) = launched.launches
    assert p.c.ptr == p.out.ptr == c.ptr


def test_bf16_marked_inputs(launched, no_gpu):
    a = numbatc.bfloat16(FakeCuda((16, 8), "uint16"))
    b = numbatc.bfloat16(FakeCuda((24, 8), "uint16").T)
    r = gemm(a, b, bias=FakeCuda((24,), "float32"))
    assert isinstance(r, DTypeView) and r.dtype == "bfloat16" and r.shape == (16, 24)
    (p,) = launched.launches
    assert (p.in_dtype, p.out_dtype, p.bias_dtype) == ("bfloat16", "bfloat16", "float32")
    assert (p.b.layout, p.b.ld) == ("col", 8)
    assert p.a.array.storage_typestr == "<u2"


# ---------------------------------------------------------------------------------------------
# dtype resolution
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("out_dtype,expect", [
    (None, "in"), ("float32", "float32"), (np.float32, "float32"), ("fp32", "float32"),
    ("in", "in"),
])
def test_out_dtype_resolution(launched, no_gpu, dtype, out_dtype, expect):
    if dtype == "bfloat16":
        a = numbatc.bfloat16(FakeCuda((4, 4), "uint16"))
        b = numbatc.bfloat16(FakeCuda((4, 4), "uint16"))
    else:
        a, b = ab(4, 4, 4)
    if out_dtype == "in":
        out_dtype = dtype
    gemm(a, b, out_dtype=out_dtype)
    want = dtype if expect == "in" else expect
    assert launched.launches[0].out_dtype == want
    assert no_gpu[0][1] == want


def test_out_decides_the_dtype(launched):
    a, b = ab()
    gemm(a, b, out=FakeCuda((64, 48), "float32"))
    assert launched.launches[0].out_dtype == "float32"


BAD_DTYPES = [
    (dict(a="float32", b="float32"), r"a has dtype float32, not supported; supported: float16, bfloat16"),
    (dict(a="float16", b="int8"), r"b has dtype int8, not supported"),
    (dict(a="float16", b="bf16"), r"mixed dtypes: a is float16 but b is bfloat16; supported \(a, b\) "
                                   r"pairs: \(float16, float16\), \(bfloat16, bfloat16\)"),
]


def _array_of(dtype, shape):
    if dtype == "bf16":
        return numbatc.bfloat16(FakeCuda(shape, "uint16"))
    return FakeCuda(shape, dtype)


@pytest.mark.parametrize("dtypes,msg", BAD_DTYPES)
def test_bad_input_dtypes(launched, dtypes, msg):
    with pytest.raises(TypeError, match=msg):
        gemm(_array_of(dtypes["a"], (8, 4)), _array_of(dtypes["b"], (4, 8)))
    assert not launched.launches


# ---------------------------------------------------------------------------------------------
# every other validation error
# ---------------------------------------------------------------------------------------------

M, N, K = 64, 48, 32


def _bad_calls():
    a, b = ab(M, N, K)
    f16 = lambda shape, **kw: FakeCuda(shape, "float16", **kw)  # noqa: E731
    buf = FakeCuda((M, K + N), "float16")
    return [
        # (kwargs for gemm, exception, message)
        (dict(a=a, b=f16((K + 1, N))), ValueError,
         r"inner dimensions differ: a is \(M, K\) = \(64, 32\) but b is \(K, N\) = \(33, 48\)"),
        (dict(a=f16((M,)), b=b), ValueError, r"a must be 2-D \(M, K\), got shape \(64,\)"),
        (dict(a=a, b=f16((2, K, N))), ValueError, r"b must be 2-D \(K, N\)"),
        (dict(a=np.zeros((M, K), np.float16), b=b), TypeError, r"a is a host array.*move it to the GPU"),
        (dict(a=a, b=np.zeros((K, N), np.float16)), TypeError, r"b is a host array"),
        (dict(a=a, b=b, c=np.zeros((M, N), np.float16), beta=1), TypeError, r"c is a host array"),
        (dict(a=a, b=b, bias=np.zeros(N, np.float16)), TypeError, r"bias is a host array"),
        (dict(a=a, b=b, out=np.zeros((M, N), np.float16)), TypeError, r"out is a host array"),
        (dict(a=[[1.0]], b=b), TypeError, r"a has type list, which is not a CUDA array; accepted"),
        (dict(a=a, b=f16((K, N), device=1)), ValueError,
         r"operands are on different devices \(a on cuda:0, b on cuda:1\)"),
        (dict(a=a, b=b, bias=f16((N,), device=2)), ValueError, r"a on cuda:0, b on cuda:0, bias on cuda:2"),
        (dict(a=a, b=b, out=f16((M, N), device=1)), ValueError, r"out on cuda:1"),
        (dict(a=a, b=b, c=f16((M, N), device=1), beta=1), ValueError, r"c on cuda:1"),
        (dict(a=a, b=b, bias=f16((N + 1,))), ValueError, r"bias must have shape \(N,\) = \(48,\), got \(49,\)"),
        (dict(a=a, b=b, bias=f16((1, N))), ValueError, r"bias must have shape \(N,\)"),
        (dict(a=a, b=b, bias=FakeCuda((N,), "float64")), TypeError,
         r"bias has dtype float64; for float16 inputs it must be float16 or float32"),
        (dict(a=a, b=b, bias=f16((N,), strides=(2,))), ValueError, r"bias .* has stride 2; bias must have unit stride"),
        (dict(a=a, b=b, c=f16((M, N + 1)), beta=1), ValueError,
         r"c must have the output's shape \(M, N\) = \(64, 48\), got \(64, 49\)"),
        (dict(a=a, b=b, c=FakeCuda((M, N), "float32"), beta=1), TypeError,
         r"c has dtype float32; it must have the output dtype float16"),
        (dict(a=a, b=b, c=f16((M, N)), beta=1, out_dtype="float32"), TypeError,
         r"c has dtype float16; it must have the output dtype float32"),
        (dict(a=a, b=b, beta=0.5), ValueError, r"beta = 0.5 but c is None"),
        (dict(a=a, b=b, out=f16((N, M))), ValueError, r"out must have shape \(M, N\) = \(64, 48\), got \(48, 64\)"),
        (dict(a=a, b=b, out=FakeCuda((M, N), "float64")), TypeError,
         r"out has dtype float64; for float16 inputs it must be float16 or float32"),
        (dict(a=a, b=b, out=f16((M, N)), out_dtype="float32"), TypeError,
         r"out has dtype float16; for float16 inputs it must be float32"),
        (dict(a=a, b=b, out=f16((M, N), readonly=True)), ValueError, r"out is read-only"),
        (dict(a=a, b=b, out=f16((M, N), strides=(0, 1))), ValueError, r"out .* has overlapping elements"),
        (dict(a=a, b=b, out=f16((M, N), strides=(2, 128))), ValueError, r"out .* no unit stride"),
        (dict(a=a, b=b, c=f16((M, N), strides=(3, 5)), beta=1), ValueError, r"c .* no unit stride"),
        (dict(a=buf.at(0, 0, (M, K)), b=b, out=buf.at(0, K - 1, (M, N))), ValueError,
         r"out overlaps a in memory"),
        (dict(a=a, b=b.T.T, out=FakeCuda((M, N), "float16", ptr=b.ptr)), ValueError, r"out overlaps b"),
        (dict(a=a, b=b, bias=FakeCuda((N,), "float16", ptr=buf.ptr), out=buf.at(0, 0, (M, N))),
         ValueError, r"out overlaps bias"),
        (dict(a=a, b=b, c=buf.at(0, 0, (M, N)), beta=1, out=buf.at(0, 1, (M, N))), ValueError,
         r"out overlaps c in memory.*out may be c itself, but not part of it"),
        (dict(a=a, b=b, out_dtype="float64"), TypeError,
         r"out_dtype float64 is not available for float16 inputs; choose one of float16, float32"),
        (dict(a=a, b=b, out_dtype=object()), TypeError, r"cannot interpret .* as a dtype"),
        (dict(a=a, b=b, activation="tanh"), ValueError,
         r"activation must be None or one of 'relu', 'gelu', 'silu' \(gelu is the tanh form\); got 'tanh'"),
        (dict(a=a, b=b, activation="ReLU"), ValueError, r"got 'ReLU'"),
        (dict(a=a, b=b, activation=lambda x: x), ValueError, r"arbitrary epilogues are not supported yet"),
        (dict(a=a, b=b, alpha="2"), TypeError, r"alpha must be a real number"),
        (dict(a=a, b=b, beta=1j, c=f16((M, N))), TypeError, r"beta must be a real number"),
        (dict(a=a, b=b, alpha=True), TypeError, r"alpha must be a real number"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_validation_errors(launched, case):
    kwargs, exc, msg = _bad_calls()[case]
    with pytest.raises(exc, match=msg):
        gemm(**kwargs)
    assert not launched.launches and not launched.epilogues


def test_out_beside_a_in_one_buffer_is_fine(launched):
    buf = FakeCuda((M, K + N), "float16")
    b = FakeCuda((K, N), "float16")
    gemm(buf.at(0, 0, (M, K)), b, out=buf.at(0, K, (M, N)))
    assert len(launched.launches) == 1


def test_partial_overlap_with_unread_c_is_fine(launched):
    a, b = ab()
    buf = FakeCuda((M, N + 1), "float16")
    gemm(a, b, c=buf.at(0, 0, (M, N)), beta=0.0, out=buf.at(0, 1, (M, N)))
    assert len(launched.launches) == 1


@pytest.mark.parametrize("cc,ok", [((7, 5), False), ((7, 0), False), ((8, 0), True), ((8, 6), True),
                                   ((9, 0), True), ((10, 0), True), ((12, 0), True)])
def test_compute_capability(monkeypatch, launched, cc, ok):
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: cc)
    a, b = ab()
    if ok:
        gemm(a, b)
        assert launched.launches[0].cc == cc
    else:
        with pytest.raises(ValueError, match=rf"compute capability 8\.0 \(sm_80, Ampere\) or newer "
                                             rf"for float16; device 0 is sm_{cc[0]}{cc[1]}"):
            gemm(a, b)
        assert not launched.launches


# ---------------------------------------------------------------------------------------------
# zero-size dimensions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,n", [(0, 48), (64, 0), (0, 0)])
def test_empty_result_without_launch(launched, no_gpu, m, n):
    r = gemm(FakeCuda((m, 32)), FakeCuda((32, n)), c=FakeCuda((m, n)), beta=1.0,
             bias=FakeCuda((n,)), activation="relu")
    assert r.shape == (m, n)
    assert no_gpu[0][:2] == ((m, n), "float16")
    assert not launched.launches and not launched.epilogues


def test_empty_out_is_returned(launched):
    out = FakeCuda((0, 48), "float32")
    assert gemm(FakeCuda((0, 32)), FakeCuda((32, 48)), out=out) is out
    assert not launched.launches


def test_empty_operands_with_odd_strides_are_not_layout_checked(launched):
    a = FakeCuda((0, 32), strides=(3, 5))
    assert gemm(a, FakeCuda((32, 8))).shape == (0, 8)


@pytest.mark.parametrize("with_c,with_bias", [(False, False), (True, False), (False, True), (True, True)])
def test_k_zero_runs_only_the_epilogue(launched, with_c, with_bias):
    c = FakeCuda((5, 7)) if with_c else None
    bias = FakeCuda((7,), "float32") if with_bias else None
    r = gemm(FakeCuda((5, 0), ptr=0), FakeCuda((0, 7), ptr=0), c=c, beta=2.0 if with_c else 0.0,
             bias=bias, activation="silu")
    assert not launched.launches
    (p,) = launched.epilogues
    assert (p.m, p.n, p.k, p.activation, p.out.ptr) == (5, 7, 0, "silu", r.ptr)
    assert (p.c is not None, p.bias is not None) == (with_c, with_bias)
    assert p.beta == (2.0 if with_c else 0.0)


# ---------------------------------------------------------------------------------------------
# host models used by the K == 0 path (and by the GPU tests as references)
# ---------------------------------------------------------------------------------------------


def test_bf16_host_conversion_matches_ml_dtypes():
    rng = np.random.default_rng()
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.3895314e38, 1e-45], np.float32)])
    got = gemm_api._from_float32(x, "bfloat16")
    with np.errstate(invalid="ignore"):  # NaN inputs
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert np.all(np.isnan(gemm_api._to_float32(got[~finite], "bfloat16")))
    back = gemm_api._to_float32(want, "bfloat16")
    np.testing.assert_array_equal(back[finite], want[finite].view(ml_dtypes.bfloat16).astype(np.float32))


def test_activation_models():
    x = np.linspace(-12, 12, 1001).astype(np.float32)
    xd = x.astype(np.float64)
    np.testing.assert_array_equal(gemm_api.ACTIVATIONS["relu"](x), np.maximum(x, 0))
    gelu = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd**3)))
    np.testing.assert_allclose(gemm_api.ACTIVATIONS["gelu"](x), gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gemm_api.ACTIVATIONS["silu"](x), xd / (1 + np.exp(-xd)), rtol=1e-5, atol=1e-6)
    assert gemm_api.ACTIVATIONS["silu"](np.array([-200.0], np.float32))[0] == 0.0
    assert gemm_api.ACTIVATIONS[None](x) is x


def test_same_device_helper():
    assert arrays.same_device(FakeCuda((2,), device=1), None, FakeCuda((2,), device=1)) == 1
    assert arrays.same_device(FakeCuda((0,), ptr=0)) is None
    with pytest.raises(ValueError, match=r"x on cuda:0, y on cuda:3"):
        arrays.same_device(FakeCuda((2,)), FakeCuda((2,), device=3), names=("x", "y"))


def test_dtype_names():
    assert dtype_name("bf16") == "bfloat16"
    assert dtype_name("torch.float16") == "float16"
    assert dtype_name(np.float32) == "float32"
    assert dtype_name(ml_dtypes.bfloat16) == "bfloat16"
    assert dtype_name(ml_dtypes.float8_e4m3fn) == "float8_e4m3fn"
