"""numbatc.gemm's FP8 inputs with per-tensor scales, without a GPU: the contract's checks (dtype
pairs, numbers as scales, K-major layouts, compute capability 9.0), the GemmProblem that reaches
``numbatc.kernels.dispatch.launch_gemm``, the dispatcher's choice of sm90_gemm's fp8 form with
the scales folded into alpha, and the warm call (the scales fold into the relaunch's alpha).
Arrays are tests/helpers/fake_arrays.py's fakes: nothing is dereferenced."""

import importlib

import numpy as np
import pytest

import numbatc
from numbatc import gemm_api
from numbatc import _warm
from numbatc.interop import alloc
from numbatc.kernels import sm90_gemm
from tests.helpers.fake_arrays import (  # noqa: F401  (launched, no_gpu: fixtures)
    FakeCuda, col_major, fake_torch, launched, no_gpu)

dispatch = importlib.import_module("numbatc.kernels.dispatch")
gemm = numbatc.gemm


def f8(shape, kind="e4m3", col=False):
    raw = col_major(*shape, dtype="uint8") if col else FakeCuda(shape, "uint8")
    return numbatc.float8_e4m3(raw) if kind == "e4m3" else numbatc.float8_e5m2(raw)


def fp8(m=64, n=48, k=128, kinds=("e4m3", "e4m3")):
    return f8((m, k), kinds[0]), f8((k, n), kinds[1], col=True)


@pytest.mark.parametrize("kinds", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2"),
                                   ("e5m2", "e5m2")])
def test_fp8_reaches_launch_gemm(launched, kinds):
    a, b = fp8(k=40, kinds=kinds)  # K = 40: rows of 40 bytes, packed by the dispatcher
    bias = FakeCuda((48,), "float32")
    out = gemm(a, b, scale_a=0.5, scale_b=np.float32(4), bias=bias, activation="gelu", alpha=2.0)
    (p,) = launched.launches
    assert (p.m, p.n, p.k) == (64, 48, 40)
    assert p.tensor_scales == (0.5, 4.0) and p.alpha == 2.0  # folded by the dispatcher
    assert p.block_scaled is None and p.scale_a is None and p.scale_b is None
    names = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
    assert (p.in_dtype, p.b_dtype, p.out_dtype, p.bias_dtype, p.acc_dtype) == (
        names[kinds[0]], names[kinds[1]], "bfloat16", "float32", "float32")
    assert (p.a.layout, p.b.layout, p.a.ld, p.b.ld) == ("row", "col", 40, 40)
    assert out.dtype == "bfloat16" and out.shape == (64, 48)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
def test_fp8_output_dtypes_and_c(launched, out_dtype):
    a, b = fp8()
    c = alloc.allocate_like(FakeCuda((1,), "float32"), (64, 48), out_dtype)
    gemm(a, b, c=c, beta=0.5, scale_a=1, scale_b=2, out_dtype=out_dtype)
    (p,) = launched.launches
    assert p.out_dtype == out_dtype and p.c is not None and p.tensor_scales == (1.0, 2.0)


def _refusals():
    a, b = fp8()
    h, hb = FakeCuda((64, 128), "float16"), col_major(128, 48, "float16")
    return [
        (dict(a=a, b=f8((128, 48))), ValueError,
         r"FP8 GEMM reads b K-major: \(K, N\) column-major, e.g. w.T of a row-major \(N, K\) "
         r"weight; b is row-major"),
        (dict(a=f8((64, 128), col=True), b=b), ValueError,
         r"FP8 GEMM reads a K-major: a \(M, K\) row-major; a is column-major"),
        (dict(a=h, b=hb), TypeError,
         r"per-tensor scales \(scale_a, scale_b numbers\) are for FP8 inputs.*a is float16 and b "
         r"is float16"),
        (dict(a=a, b=b, scale_b=FakeCuda((48, 4), "uint8")), TypeError,
         r"scale_b = .*both scale_a and scale_b are real numbers"),
        (dict(a=a, b=b, scale_a=True), TypeError, r"scale_a = True: .*real numbers"),
        (dict(a=a, b=b, scale_a=float("nan")), ValueError,
         r"scale_a = nan: a per-tensor scale must be finite"),
        (dict(a=a, b=b, out_dtype="float8_e4m3fn"), TypeError,
         r"out_dtype float8_e4m3fn is not available for float8_e4m3fn inputs; choose one of "
         r"bfloat16, float16, float32"),
        (dict(a=a, b=b, bias=FakeCuda((48,), "uint8")), TypeError, r"bias has dtype uint8"),
        (dict(a=a, b=b, scale_a=FakeCuda((1,), "float32"), scale_b=FakeCuda((1,), "float32")),
         ValueError, r"scale_a must have shape .* \(per-tensor scales are Python or NumPy "
                     r"numbers, e.g. scale_a=float\(s.item\(\)\), not device arrays\)"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_refusals(launched, case):
    kwargs, exc, msg = _refusals()[case]
    a, b = kwargs.pop("a"), kwargs.pop("b")
    kwargs.setdefault("scale_a", 1.0)
    kwargs.setdefault("scale_b", 1.0)
    with pytest.raises(exc, match=msg):
        gemm(a, b, **kwargs)
    assert not launched.launches


@pytest.mark.parametrize("cc", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_other_gpus_are_refused(launched, monkeypatch, cc):
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: cc)
    a, b = fp8()
    with pytest.raises(ValueError, match=rf"FP8 with per-tensor scales needs compute capability "
                                         rf"9.0 \(sm_90a\); this GPU is sm_{cc[0]}{cc[1]}$"):
        gemm(a, b, scale_a=1.0, scale_b=1.0)
    assert not launched.launches


def test_without_scales_fp8_still_asks_for_them(launched):
    a, b = fp8()
    with pytest.raises(TypeError, match=r"need block scales: .*\(sm_100\); or per-tensor scales: "
                                        r"scale_a and scale_b Python numbers \(sm_90\)"):
        gemm(a, b)


# ---------------------------------------------------------------------------------------------
# the dispatcher: sm90_gemm's fp8 form, the scales folded into alpha
# ---------------------------------------------------------------------------------------------


class KernelRecorder:
    def __init__(self):
        self.calls = []

    def launch(self, cfg, var, a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha, beta,
               **kw):
        self.calls.append((cfg, var, a, b, out, m, n, k, lda, ldb, alpha, beta, kw))
        return lambda *args: self.calls.append(("relaunch",) + args)


@pytest.fixture
def kernel(monkeypatch):
    r = KernelRecorder()
    monkeypatch.setattr(sm90_gemm, "launch_flat", r.launch)
    monkeypatch.delenv("NUMBATC_GEMM_KERNEL", raising=False)
    monkeypatch.delenv("NUMBATC_PRINT_CONFIG", raising=False)
    _warm.CACHE.clear()
    yield r
    _warm.CACHE.clear()


@pytest.mark.parametrize("m, n, name", [(8, 48, "fp8_64x128x128_6s_w1_tma"),
                                        (300, 129, "fp8_128x128x128_6s_w1_tma"),
                                        (2048, 4096, "fp8_128x256x128_3s_pt_tma_ts")])
def test_dispatch_runs_the_fp8_form_with_scales_in_alpha(kernel, m, n, name):
    a, b = fp8(m=m, n=n, kinds=("e5m2", "e4m3"))  # small, middle and persistent tiles
    gemm(a, b, alpha=3.0, scale_a=0.25, scale_b=2.0)
    ((cfg, var, pa, pb, out, *dims, alpha, beta, kw),) = kernel.calls
    assert cfg is sm90_gemm.FP8_CONFIGS[name]
    assert isinstance(var, sm90_gemm.Sm90Fp8Variant)
    assert (var.in_dtype, var.b_dtype, var.a_layout, var.b_layout, var.out_dtype) == (
        "float8_e5m2", "float8_e4m3fn", "row", "col", "bfloat16")
    assert (pa, pb) == (a.data.ptr, b.data.ptr) and dims == [m, n, 128, 128, 128]
    assert alpha == 1.5 and beta == 0.0 and kw["prepare"] is True


def test_dispatch_forcing(kernel, monkeypatch):
    a, b = fp8()
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x256x128_3s")
    gemm(a, b, scale_a=1.0, scale_b=1.0)
    assert kernel.calls[-1][0] is sm90_gemm.FP8_CONFIGS["fp8_128x256x128_3s"]
    for choice, msg in (("sm80", "FP8 with per-tensor scales runs on sm90 only"),
                        ("sm100", "FP8 with per-tensor scales runs on sm90 only"),
                        ("sm90:128x256x64_4s_w1", r"no sm90 FP8 config '128x256x64_4s_w1'; "
                                                  r"choose from \['fp8_128x128x128_4s_w1'")):
        monkeypatch.setenv("NUMBATC_GEMM_KERNEL", choice)
        with pytest.raises(ValueError, match=msg):
            gemm(a, b, scale_a=1.0, scale_b=1.0)


def test_packing_pads_fp8_rows_to_16_bytes():
    """aligned_view's row padding is 16 bytes: 16 fp8 values (8 bf16/f16)."""
    import inspect

    from numbatc.kernels import operands

    src = inspect.getsource(operands.aligned_view)
    assert "16 // view.dtype.itemsize" in src


# ---------------------------------------------------------------------------------------------
# the warm call
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def torch(monkeypatch):
    torch = fake_torch(monkeypatch, current_stream=0x5150)
    dtype = type(torch.float16)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        setattr(torch, name, dtype(name, 1))
    device = type(torch.Tensor((1,), torch.float16).device)
    device.__eq__ = lambda self, other: (self.type, self.index) == (other.type, other.index)
    device.__hash__ = lambda self: hash((self.type, self.index))
    return torch


def test_warm_calls_fold_the_scales_into_alpha(kernel, torch):
    def operands():
        a = torch.Tensor((64, 128), torch.float8_e4m3fn)
        w = torch.Tensor((48, 128), torch.float8_e5m2)
        return a, w.T, torch.Tensor((64, 48), torch.float32)

    a, b, out = operands()
    gemm(a, b, out=out, alpha=2.0, scale_a=0.5, scale_b=3.0)
    assert len(kernel.calls) == 1 and kernel.calls[0][10] == 3.0
    a2, b2, out2 = operands()
    assert gemm(a2, b2, out=out2, alpha=1.0, scale_a=np.float32(0.25), scale_b=2) is out2
    assert len(kernel.calls) == 2  # warm: only the relaunch
    assert kernel.calls[-1] == ("relaunch", a2.ptr, b2.ptr, out2.ptr, out2.ptr, out2.ptr, 0.5,
                                0.0, 0x5150)
    # without scales the same arrays are not warm: the checks ask for scales
    with pytest.raises(TypeError, match="need block scales"):
        gemm(a2, b2, out=out2)
    with pytest.raises(ValueError, match="must be finite"):
        gemm(a2, b2, out=out2, scale_a=float("inf"), scale_b=1.0)
    assert len(kernel.calls) == 2


# ---------------------------------------------------------------------------------------------
# FP8 with blockwise scales (DeepGEMM's recipe): float32 scale_a (M, ceil(K/128)) and scale_b
# (ceil(N/128), ceil(K/128))
# ---------------------------------------------------------------------------------------------

def _block_scales(m, n, k, a_col=False):
    kb, nb = -(-k // 128), -(-n // 128)
    sa = col_major(m, kb, "float32") if a_col else FakeCuda((m, kb), "float32")
    return sa, FakeCuda((nb, kb), "float32")


def test_blockwise_reaches_launch_gemm(launched):
    a, b = fp8(m=64, n=300, k=272)
    sa, sb = _block_scales(64, 300, 272, a_col=True)  # DeepGEMM keeps scale_a M-major
    gemm(a, b, scale_a=sa, scale_b=sb, alpha=2.0)
    (p,) = launched.launches
    assert p.blockwise and p.tensor_scales == (1.0, 1.0) and p.block_scaled is None
    assert (p.scale_a.layout, p.scale_a.ld, p.scale_b.layout, p.scale_b.ld) == (
        "col", 64, "row", 3)
    assert p.alpha == 2.0 and p.out_dtype == "bfloat16"


def test_blockwise_refusals(launched):
    a, b = fp8(m=64, n=300, k=272)
    sa, sb = _block_scales(64, 300, 272)
    for kwargs, exc, msg in (
            (dict(scale_a=FakeCuda((64, 2), "float32"), scale_b=sb), ValueError,
             r"scale_a must have shape \(M, ceil\(K/128\)\) = \(64, 3\) for FP8 with blockwise "
             r"scales \(one float32 scale per row and 128 values of K\), got \(64, 2\)$"),
            (dict(scale_a=sa, scale_b=FakeCuda((2, 3), "float32")), ValueError,
             r"scale_b must have shape \(ceil\(N/128\), ceil\(K/128\)\) = \(3, 3\)"),
            (dict(scale_a=sa, scale_b=FakeCuda((3, 3), "uint8")), TypeError,
             r"scale_a and scale_b must both be float32 device arrays"),
            (dict(scale_a=sa, scale_b=1.0), TypeError, r"scale_a = .*real numbers")):
        with pytest.raises(exc, match=msg):
            gemm(a, b, **kwargs)
    a40, b40 = fp8(m=64, n=300, k=40)
    sa40, sb40 = _block_scales(64, 300, 40)
    with pytest.raises(ValueError, match=r"K to be a multiple of 16 .*K = 40"):
        gemm(a40, b40, scale_a=sa40, scale_b=sb40)
    assert not launched.launches


@pytest.mark.parametrize("m, n, name", [(64, 300, "fp8_64x128x128_8s_pt_tma"),
                                        (4096, 4096, "fp8_128x128x128_6s_pt_tma_ts")])
def test_dispatch_runs_the_blockwise_form(kernel, monkeypatch, m, n, name):
    """sm90_gemm.blockwise_config: 64-row tiles where 128-row ones leave half the SMs idle; the
    scales and their element strides reach the launch, which is never prepared (no warm path:
    the relaunch function has no place for the scales); forcing takes only the blockwise
    configurations."""
    a, b = fp8(m=m, n=n, k=272)
    sa, sb = _block_scales(m, n, 272, a_col=True)
    for _ in range(2):
        gemm(a, b, scale_a=sa, scale_b=sb)
    assert len(kernel.calls) == 2 and not any(c[0] == "relaunch" for c in kernel.calls)
    ((cfg, var, pa, pb, out, *dims, alpha, beta, kw), _) = kernel.calls
    assert cfg is sm90_gemm.FP8_CONFIGS[name] and var.blockwise and alpha == 1.0
    assert "prepare" not in kw
    assert kw["block_scales"] == (sa.ptr, sb.ptr, 1, m, 3, 1)
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x256x128_3s_pt_tma_ts")
    with pytest.raises(ValueError, match=r"does not take blockwise FP8 scales; choose from "
                                         r"\['fp8_128x128x128_6s_pt_tma_ts'"):
        gemm(a, b, scale_a=sa, scale_b=sb)
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x128x128_6s_pt_tma")
    gemm(a, b, scale_a=sa, scale_b=sb)
    assert kernel.calls[-1][0] is sm90_gemm.FP8_CONFIGS["fp8_128x128x128_6s_pt_tma"]
