"""FP8 GEMM results on an H100/H200 against a float64 reference, shared by
tests/gpu/test_gemm_fp8_gpu.py and test_sm90_gemm_gpu.py: the torch dtypes (``FP8``, ``OUT``),
the fused epilogue's activation in float64 (``activate``) and ``check``, whose bound is the
output's rounding plus 2**-10 of sum(|a * b|) * scales (the tensor core's fp8 adder keeps about
14 bits).  Skips (where imported) without torch or its float8 dtypes."""

import math

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8 dtypes", allow_module_level=True)

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ROUNDING = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-20}


def activate(ref, activation):
    if activation == "gelu":
        return 0.5 * ref * (1 + torch.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
    if activation == "relu":
        return ref.clamp_min(0)
    return ref


def check(got, ref, mag, out_dtype):
    got = got.double()
    assert not torch.isnan(got).any(), "an output element was not written"
    err = (got - ref).abs()
    bound = ROUNDING[out_dtype] * ref.abs() + 2.0**-10 * mag + 1e-6
    assert bool((err <= bound).all()), float((err - bound).max())
