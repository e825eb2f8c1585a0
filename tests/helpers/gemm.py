"""numbatc.gemm on a device (or the CPU emulation) against a float64 reference, shared by
tests/gpu/test_gemm_gpu.py, test_sm90_gemm_gpu.py and test_softmax_gpu.py: random inputs exactly
representable in the dtype (``values``), device arrays of each library in either layout
(``to_device``, ``to_host``), the reference with its error scale (``reference``), ``check`` (one
call with a poisoned output, checked element by element) and a user epilogue
(``residual_scale``).

Tolerance: |out - ref| <= r_out * |ref| + (K * 2**-22 + 2**-20) * scale + s_out, where ref is
computed in float64 from the exactly representable inputs, scale = |alpha| (|A| @ |B|) + |beta c|
+ |bias|, r_out is the output format's relative rounding (2**-8 bf16, 2**-11 f16, 0 for f32) and
s_out half its subnormal spacing (2**-25 for f16)."""

import math

import numpy as np
import pytest
from numba import cuda

import numbatc

ml_dtypes = pytest.importorskip("ml_dtypes")

ROUNDING = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 0.0}
# Half the spacing of the output format's subnormals: the absolute floor of its rounding error
# (f16 subnormals are 2**-24 apart; bf16's and f32's are far below any result here).
SUBNORMAL = {"bfloat16": 2.0**-134, "float16": 2.0**-25, "float32": 2.0**-150}
NP_DTYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def rng():
    return np.random.default_rng()


def values(shape, dtype):
    """Random values exactly representable in ``dtype``, in float64."""
    x = rng().standard_normal(shape)
    return x.astype(NP_DTYPE[dtype]).astype(np.float64)


def to_device(x64, dtype, layout, lib="numba"):
    """A device array of ``lib`` holding x64 in ``dtype``; layout 'col' is a transposed view."""
    host = np.ascontiguousarray(x64 if layout == "row" else x64.T).astype(NP_DTYPE[dtype])
    if lib == "torch":
        import torch

        t = torch.from_numpy(host.view(np.uint16) if dtype == "bfloat16" else host)
        t = (t.view(torch.bfloat16) if dtype == "bfloat16" else t).to("cuda")
        return t if layout == "row" else t.T
    if lib == "cupy":
        import cupy

        if dtype == "bfloat16":
            pytest.skip("CuPy holds no bf16")
        d = cupy.asarray(host)
        return d if layout == "row" else d.T
    storage = host.view(np.uint16) if dtype == "bfloat16" else host
    d = cuda.to_device(storage)
    if layout == "col":
        from numbatc.interop import transpose_view

        d = transpose_view(d)
    return numbatc.bfloat16(d) if dtype == "bfloat16" else d


def to_host(x, dtype):
    if hasattr(x, "cpu"):  # torch
        import torch

        x = x.float() if x.dtype == torch.bfloat16 else x
        return x.cpu().numpy().astype(np.float64)
    if hasattr(x, "get"):  # cupy
        return x.get().astype(np.float64)
    data = getattr(x, "data", x)  # numbatc.bfloat16 view
    host = data.copy_to_host()
    if dtype == "bfloat16":
        host = host.view(ml_dtypes.bfloat16)
    return host.astype(np.float64)


def reference(a, b, alpha, beta, c, bias, activation):
    ref = alpha * (a @ b)
    scale = abs(alpha) * (np.abs(a) @ np.abs(b))
    if c is not None:
        ref = ref + beta * c
        scale = scale + np.abs(beta * c)
    if bias is not None:
        ref = ref + bias[None, :]
        scale = scale + np.abs(bias)[None, :]
    if activation == "relu":
        ref = np.maximum(ref, 0)
    elif activation == "gelu":
        ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        scale = scale * 1.2
    elif activation == "silu":
        ref = ref / (1 + np.exp(-ref))
        scale = scale * 1.2
    return ref, scale


def check(m, n, k, dtype="bfloat16", a_layout="row", b_layout="row", out_dtype=None,
          alpha=1.0, beta=0.0, with_c=False, with_bias=False, activation=None, lib="numba",
          poisoned_out=True):
    odt = out_dtype or dtype
    a = values((m, k), dtype)
    b = values((k, n), dtype)
    c = values((m, n), odt) if with_c else None
    bias = values((n,), dtype) if with_bias else None
    kw = dict(alpha=alpha, beta=beta, activation=activation, out_dtype=out_dtype)
    if c is not None:
        kw["c"] = to_device(c, odt, "row", lib)
    if bias is not None:
        kw["bias"] = to_device(bias[None, :], dtype, "row", lib)[0]
    if poisoned_out:
        kw["out"] = to_device(np.full((m, n), np.nan), odt, "row", lib)
    got = numbatc.gemm(to_device(a, dtype, a_layout, lib), to_device(b, dtype, b_layout, lib), **kw)
    cuda.synchronize()
    got = to_host(got, odt)
    ref, scale = reference(a, b, alpha, beta, c, bias, activation)
    tol = ROUNDING[odt] * np.abs(ref) + (k * 2.0**-22 + 2.0**-20) * scale + SUBNORMAL[odt]
    bad = ~(np.abs(got - ref) <= tol)  # NaN (an unwritten element) counts as bad
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise AssertionError(
            f"gemm {m}x{n}x{k} {dtype}->{odt} a={a_layout} b={b_layout} c={with_c} "
            f"bias={with_bias} act={activation} lib={lib}: {bad.sum()} bad elements, first at "
            f"({i}, {j}): got {got[i, j]!r}, want {ref[i, j]!r} +- {tol[i, j]:.3g}"
        )


@cuda.jit(device=True)
def residual_scale(v, r, c, residual, scale):
    """A user epilogue: a per-column scale, then a residual add."""
    return v * scale[c] + residual[r, c]
