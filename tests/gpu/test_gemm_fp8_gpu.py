"""FP8 with per-tensor scales on an H100/H200 (sm_90a): numbatc.gemm(a, b, scale_a=, scale_b=)
with torch float8 tensors (a row-major, b = w.T of a row-major weight) against a float64
reference of the dequantised inputs times the scales; ragged shapes, K not a multiple of 16
(packed rows), M = 1, the fused epilogue, the three output dtypes, and the warm call with new
scales.  Outputs are poisoned (NaN) before each call.

NOTE on tolerance: for fp8 inputs the tensor core's adder keeps fewer bits than float32 (about
14, as DeepGEMM reports), so the error bound is 2**-10 of sum(|a * b|) * scales on top of the
output's rounding -- loose against the hardware's arithmetic, tight against a wrong scale,
layout or k slice (errors of order one)."""

import numpy as np
import pytest

import numbatc

pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.hardware_only]
torch = pytest.importorskip("torch")
from tests.helpers.gemm_fp8 import FP8, OUT, activate, check  # noqa: E402  (skips without float8)


@pytest.fixture(autouse=True)
def hopper(device_cc):
    if tuple(device_cc)[:2] != (9, 0):
        pytest.skip(f"FP8 with per-tensor scales runs on compute capability 9.0; have {device_cc}")


def operand(rows, k, t, gen):
    x = (torch.randn(rows, k, generator=gen, device="cuda") * 2).to(FP8[t])
    return x, x.double()


CASES = [
    # m,    n,    k,   a,      b,      out,        epilogue
    (1000, 520, 1040, "e4m3", "e4m3", "bfloat16", None),
    (257, 129, 100, "e5m2", "e4m3", "float16", "gelu"),   # K % 16 != 0: packed rows
    (1, 200, 4096, "e4m3", "e5m2", "float32", None),      # M = 1
    (2048, 2048, 2048, "e4m3", "e4m3", "bfloat16", "relu"),
    (130, 136, 72, "e5m2", "e5m2", "float32", None),
]


@pytest.mark.parametrize("m, n, k, a_t, b_t, out_dtype, epilogue", CASES)
def test_fp8_per_tensor_scales(m, n, k, a_t, b_t, out_dtype, epilogue):
    gen = torch.Generator(device="cuda")
    gen.seed()
    a, av = operand(m, k, a_t, gen)
    w, wv = operand(n, k, b_t, gen)
    sa, sb = 0.375, 1.75
    ref = sa * sb * (av @ wv.T)
    mag = sa * sb * (av.abs() @ wv.abs().T)
    out = torch.full((m, n), float("nan"), dtype=OUT[out_dtype], device="cuda")
    kw = {}
    if epilogue:
        c = torch.randn(m, n, generator=gen, device="cuda").to(OUT[out_dtype])
        bias = torch.randn(n, generator=gen, device="cuda").to(torch.float32)
        kw = dict(c=c, alpha=1.5, beta=0.5, bias=bias, activation=epilogue)
        ref = activate(1.5 * ref + 0.5 * c.double() + bias.double(), epilogue)
        mag = 1.5 * mag
    got = numbatc.gemm(a, w.T, out=out, scale_a=sa, scale_b=sb, **kw)
    torch.cuda.synchronize()
    assert got is out
    check(out, ref, mag, out_dtype)


def test_default_output_and_warm_call_with_new_scales():
    gen = torch.Generator(device="cuda")
    gen.seed()
    a, av = operand(384, 128 * 5, "e4m3", gen)
    w, wv = operand(256, 128 * 5, "e4m3", gen)
    first = numbatc.gemm(a, w.T, scale_a=1.0, scale_b=0.5)
    assert first.dtype == torch.bfloat16
    mag = av.abs() @ wv.abs().T
    check(first, 0.5 * (av @ wv.T), 0.5 * mag, "bfloat16")
    out = torch.full((384, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    for sa, sb in ((2.0, 0.25), (np.float32(0.125), 3)):
        out.fill_(float("nan"))
        numbatc.gemm(a, w.T, out=out, scale_a=sa, scale_b=sb)  # the second is warm
        torch.cuda.synchronize()
        s = float(sa) * float(sb)
        check(out, s * (av @ wv.T), s * mag, "bfloat16")


def test_row_major_b_is_refused():
    a = torch.zeros(64, 128, device="cuda").to(torch.float8_e4m3fn)
    b = torch.zeros(128, 64, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="FP8 GEMM reads b K-major"):
        numbatc.gemm(a, b, scale_a=1.0, scale_b=1.0)


@pytest.mark.parametrize("splits", ["2", "5"])
def test_fp8_split_k(splits, monkeypatch):
    """FP8 with split-K forced (NUMBATC_SPLIT_K: opt-in for FP8 until this passes on a GPU):
    decode shapes, a short last slice, c + bias + gelu through the last block's epilogue, each
    shape twice on one workspace."""
    monkeypatch.setenv("NUMBATC_SPLIT_K", splits)
    gen = torch.Generator(device="cuda")
    gen.seed()
    for m, n, k in [(1, 4096, 4096), (16, 1000, 3000), (200, 520, 1100)]:
        for _ in range(2):
            a, av = operand(m, k, "e4m3", gen)
            w, wv = operand(n, k, "e4m3", gen)
            c = torch.randn(m, n, generator=gen, device="cuda").to(torch.bfloat16)
            bias = torch.randn(n, generator=gen, device="cuda").to(torch.float32)
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            numbatc.gemm(a, w.T, out=out, c=c, beta=0.5, bias=bias, activation="gelu",
                         scale_a=0.5, scale_b=2.0)
            torch.cuda.synchronize()
            ref = activate(av @ wv.T + 0.5 * c.double() + bias.double(), "gelu")
            check(out, ref, av.abs() @ wv.abs().T, "bfloat16")


@pytest.mark.parametrize("m, n, k, a_t, b_t, out_dtype, epilogue",
                         [(2056, 4360, 264, "e4m3", "e5m2", "bfloat16", "gelu"), CASES[1]])
def test_fp8_persistent(m, n, k, a_t, b_t, out_dtype, epilogue, monkeypatch):
    """The persistent FP8 configuration, forced: 306 tiles (every block walks two or three) and a
    small ragged problem."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x256x128_4s_pt")
    test_fp8_per_tensor_scales(m, n, k, a_t, b_t, out_dtype, epilogue)
