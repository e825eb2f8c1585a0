"""numbatc.softmax and numbatc.gemm_softmax on the GPU against float64 references: row lengths
from 1 to 10^5 (primes, warp and block edges, the register/online boundary), 1..1000 rows, each
dtype in and out, N-D and strided inputs, in place, numba and torch arrays; the fused GEMM with
N across its tiles and past its limit (the unfused path), both layouts, bias, scale.  Outputs are
poisoned (NaN) before each call; data is fresh each run.  A small subset (``emulation``) also
runs in the CPU emulation, the online form included.

Tolerance, relative to each probability p: the output format's rounding, 1e-5 for exp2.approx and
the float32 arithmetic, N * 2**-24 for the sum; for the fused GEMM also twice the bound on the
logits' error (as test_gemm_gpu: (K * 2**-22 + 2**-20) * |scale| * (|a| @ |b|), its row maximum).
"""

import math

import numpy as np
import pytest
from numba import config, cuda

import numbatc
from numbatc.interop import DTypeView
from tests.helpers.gemm import NP_DTYPE, ROUNDING, to_device, values
from tests.helpers.gemm import to_host as _to_host

pytestmark = pytest.mark.gpu(cc=(8, 0))
EMULATED = bool(config.ENABLE_CUDASIM)
SUBNORMAL = {"bfloat16": 2.0**-134, "float16": 2.0**-25, "float32": 2.0**-150}


def to_host(x, dtype):
    if hasattr(x, "copy_to_host") and not isinstance(x, DTypeView):  # Numba (and the simulator's)
        return x.copy_to_host().astype(np.float64)
    return _to_host(x, dtype)


def softmax64(x):
    m = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum(axis=-1, keepdims=True)


def assert_close(got, ref, odt, n, extra_rel=0.0, what=""):
    tol = (ROUNDING[odt] + 1e-5 + n * 2.0**-24 + extra_rel) * np.abs(ref) + SUBNORMAL[odt] + 2.0**-40
    bad = ~(np.abs(got - ref) <= tol)
    bad &= ~(np.isnan(ref) & np.isnan(got))  # NaN where the reference has NaN is right
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad elements, first at {idx}: got {got[idx]!r}, "
                             f"want {ref[idx]!r} +- {np.broadcast_to(tol, ref.shape)[idx]:.3g}")


def run_softmax(rows, n, dtype="bfloat16", out_dtype=None, lib="numba", spread=3.0, inplace=False):
    odt = out_dtype or dtype
    x = values((rows, n), dtype) * spread
    x = x.astype(NP_DTYPE[dtype]).astype(np.float64)
    dx = to_device(x, dtype, "row", lib)
    if inplace:
        got = numbatc.softmax(dx, out=dx)
    else:
        got = numbatc.softmax(dx, out=to_device(np.full((rows, n), np.nan), odt, "row", lib))
    cuda.synchronize()
    assert_close(to_host(got, odt), softmax64(x), odt, n, what=f"softmax {rows}x{n} {dtype}->{odt} {lib}")


ROW_LENGTHS = [1, 2, 3, 7, 31, 32, 33, 127, 128, 129, 1000, 1024, 1031, 4096, 8191, 16384, 16385,
               32768, 32771, 40000, 100003]


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_softmax_row_lengths(n, dtype):
    run_softmax(37 if n < 20000 else 5, n, dtype)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 1000])
def test_softmax_row_counts(rows):
    run_softmax(rows, 257, "float16")


@pytest.mark.parametrize("dtype, out_dtype", [("bfloat16", "float32"), ("float32", "bfloat16"),
                                              ("float16", "bfloat16"), ("float32", "float16")])
@pytest.mark.parametrize("n", [5, 1024, 20000, 50000])
def test_softmax_output_dtypes(dtype, out_dtype, n):
    run_softmax(9, n, dtype, out_dtype)


@pytest.mark.parametrize("n", [100, 4096, 60000])
def test_softmax_torch_in_place_and_large_values(n):
    pytest.importorskip("torch")
    run_softmax(7, n, "bfloat16", lib="torch", spread=60.0)
    run_softmax(7, n, "float32", lib="torch", inplace=True)


def test_softmax_nd_and_strided_rows():
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 5, 24, 200, device="cuda", dtype=torch.float16)
    view = x[:, :, 2:, 1:]  # rows of 199 at a stride of 200, 3-byte offsets: scalar loads
    got = numbatc.softmax(view)
    ref = softmax64(view.double().cpu().numpy())
    assert_close(got.double().cpu().numpy(), ref, "float16", 199, what="strided 4-D view")
    got = numbatc.softmax(x)  # 4-D, vectorised
    assert_close(got.double().cpu().numpy(), softmax64(x.double().cpu().numpy()), "float16", 200)


def test_softmax_minus_inf_and_nan_rows():
    x = np.array([[0.0, -np.inf, 1.0, -np.inf], [-np.inf] * 4, [1.0, np.nan, 2.0, 3.0]], np.float32)
    got = numbatc.softmax(cuda.to_device(x)).copy_to_host().astype(np.float64)
    assert_close(got[:1], softmax64(x[:1].astype(np.float64)), "float32", 4)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()


# --- the fused GEMM + softmax ------------------------------------------------------------------


def run_gemm_softmax(m, n, k, dtype="bfloat16", out_dtype=None, a_layout="row", b_layout="row",
                     with_bias=False, bias_dtype=None, scale=1.0, lib="numba"):
    odt = out_dtype or dtype
    a = values((m, k), dtype)
    b = values((k, n), dtype)
    kw = dict(scale=scale, out=to_device(np.full((m, n), np.nan), odt, "row", lib))
    logits = scale * (a @ b)
    if with_bias:
        bdt = bias_dtype or dtype
        bias = values((n,), bdt)
        kw["bias"] = to_device(bias[None, :], bdt, "row", lib)[0]
        logits = logits + bias
    got = numbatc.gemm_softmax(to_device(a, dtype, a_layout, lib), to_device(b, dtype, b_layout, lib), **kw)
    cuda.synchronize()
    err = (k * 2.0**-22 + 2.0**-20) * abs(scale) * (np.abs(a) @ np.abs(b))
    extra = 2 * err.max(axis=1, keepdims=True) if k else 0.0
    assert_close(to_host(got, odt), softmax64(logits), odt, n, extra,
                 what=f"gemm_softmax {m}x{n}x{k} {dtype}->{odt} a={a_layout} b={b_layout} bias={with_bias}")


GS_SHAPES = [(1, 1, 1), (1, 7, 16), (31, 64, 64), (33, 65, 100), (64, 128, 17), (100, 129, 1000),
             (129, 200, 64), (4096, 256, 256), (300, 256, 1), (77, 255, 333), (5, 3, 0)]


@pytest.mark.parametrize("m, n, k", GS_SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemm_softmax_shapes(m, n, k, dtype):
    run_gemm_softmax(m, n, k, dtype, with_bias=True, scale=1 / math.sqrt(max(k, 1)))


@pytest.mark.parametrize("layouts", [("row", "col"), ("col", "row"), ("col", "col")])
@pytest.mark.parametrize("n", [24, 100, 256])
def test_gemm_softmax_layouts_and_float32_out(layouts, n):
    run_gemm_softmax(70, n, 96, "float16", "float32", *layouts, with_bias=True, bias_dtype="float32",
                     scale=0.25)


@pytest.mark.parametrize("n", [257, 1000])
def test_gemm_softmax_wide_rows_run_unfused(n):
    run_gemm_softmax(40, n, 64, "bfloat16", with_bias=True, scale=0.1)


def test_gemm_softmax_torch():
    pytest.importorskip("torch")
    run_gemm_softmax(1000, 128, 512, "bfloat16", lib="torch", scale=0.05)


# --- the emulation's subset ----------------------------------------------------------------------


@pytest.mark.emulation
@pytest.mark.parametrize("rows, n, dtype, out_dtype", [
    (3, 1, "float32", None), (5, 12, "bfloat16", None), (2, 37, "float16", "float32"),
    (2, 300, "float32", "bfloat16")])
def test_softmax_emulated(rows, n, dtype, out_dtype):
    run_softmax(rows, n, dtype, out_dtype)


@pytest.mark.emulation
@pytest.mark.parametrize("dtype, vec", [("bfloat16", True), ("float32", False)])
def test_online_form_emulated(monkeypatch, dtype, vec):
    """The online (two-pass) form, forced on a short row so that the emulation can run it."""
    from numbatc.kernels import row_softmax

    monkeypatch.setattr(row_softmax, "choose_config",
                        lambda n, ok: row_softmax.RowSoftmaxConfig(4 if vec else 1, 1, 0))
    run_softmax(3, 200, dtype)


@pytest.mark.emulation
@pytest.mark.parametrize("m, n, k, layouts", [(5, 7, 20, ("row", "row")), (33, 70, 16, ("col", "col")),
                                              (3, 130, 9, ("row", "col"))])
def test_gemm_softmax_emulated(m, n, k, layouts):
    run_gemm_softmax(m, n, k, "float16", "float32", *layouts, with_bias=True, scale=0.3)
