"""User epilogues in numbatc.gemm, in the CPU emulation: fn(value, row, col, *args) runs on every
output element after the built-in terms (here a residual add and a per-column scale); K == 0
still runs it; bad epilogues are refused clearly."""

import numpy as np
import pytest
from numba import config, cuda

import numbatc

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


@cuda.jit(device=True)
def residual_scale(v, r, c, residual, scale):
    return v * scale[c] + residual[r, c]


def test_user_epilogue_fuses_a_residual_and_a_column_scale():
    gen = np.random.default_rng()
    m, n, k = 20, 24, 40
    a = gen.standard_normal((m, k)).astype(np.float16)
    b = gen.standard_normal((k, n)).astype(np.float16)
    res = gen.standard_normal((m, n)).astype(np.float32)
    scale = gen.standard_normal(n).astype(np.float32)
    out = numbatc.gemm(cuda.to_device(a), cuda.to_device(b), out_dtype="float32", activation="relu",
                       epilogue=residual_scale,
                       epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0) * scale + res
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-4)


def test_full_tile_epilogue_loads_before_it_stores():
    """A whole 64 x 128 tile inside the matrix takes the two-pass epilogue (every fragment's
    values, with its loads of c and of the user's arrays, then every store); c aliases nothing
    here, out is poisoned first."""
    gen = np.random.default_rng()
    m, n, k = 64, 128, 40
    a = gen.standard_normal((m, k)).astype(np.float16)
    b = gen.standard_normal((k, n)).astype(np.float16)
    c = gen.standard_normal((m, n)).astype(np.float32)
    res = gen.standard_normal((m, n)).astype(np.float32)
    scale = gen.standard_normal(n).astype(np.float32)
    out = cuda.to_device(np.full((m, n), np.nan, np.float32))
    numbatc.gemm(cuda.to_device(a), cuda.to_device(b), c=cuda.to_device(c), beta=0.5, out=out,
                 epilogue=residual_scale, epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
    ref = (a.astype(np.float64) @ b.astype(np.float64) + 0.5 * c) * scale + res
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-4)


def test_k_zero_still_runs_the_epilogue():
    res = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = numbatc.gemm(cuda.to_device(np.zeros((3, 0), np.float16)),
                       cuda.to_device(np.zeros((0, 4), np.float16)), out_dtype="float32",
                       epilogue=residual_scale,
                       epilogue_args=(cuda.to_device(res), cuda.to_device(np.ones(4, np.float32))))
    np.testing.assert_array_equal(out.copy_to_host(), res)


def test_a_plain_python_function_is_refused():
    a = cuda.to_device(np.zeros((2, 2), np.float16))
    with pytest.raises(TypeError, match=r"epilogue must be a numba CUDA device function"):
        numbatc.gemm(a, a, epilogue=lambda v, r, c: v)
    with pytest.raises(ValueError, match="epilogue_args given without an epilogue"):
        numbatc.gemm(a, a, epilogue_args=(a,))


def test_user_epilogue_in_the_hopper_kernel(monkeypatch):
    """The same fused epilogue through sm90_gemm (forced: the emulation's default is sm80_gemm),
    with ragged M and K, bf16 output and the built-in bias and activation before it: the first
    consumer warpgroup's 64 x 128 part lies inside the matrix (the two-pass epilogue), the
    second's is ragged (store_tile's bounds checks)."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x128x64_4s_w1")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    gen = np.random.default_rng()
    m, n, k = 70, 128, 72
    a = gen.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = gen.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
    res = gen.standard_normal((m, n)).astype(np.float32)
    scale = gen.standard_normal(n).astype(np.float32)
    bf16 = numbatc.bfloat16
    out = numbatc.gemm(bf16(cuda.to_device(a.view(np.uint16))), bf16(cuda.to_device(b.view(np.uint16))),
                       bias=bf16(cuda.to_device(bias.view(np.uint16))), out_dtype="float32",
                       activation="relu", epilogue=residual_scale,
                       epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
    acc = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    ref = np.maximum(acc, 0) * scale + res
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-3)


def test_split_k_in_the_hopper_kernel(monkeypatch, capfd):
    """sm90_gemm's split-K form (forced): K slices of 64 with a short last one, the partial
    tiles through the workspace, the last block's sum (the consumer warpgroups meet on named
    barrier 1) and the user epilogue; twice, so the tile counters must have been reset."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x128x64_4s_w1")
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 70, 24, 150
    for _ in range(2):
        a = gen.standard_normal((m, k)).astype(np.float16)
        b = gen.standard_normal((k, n)).astype(np.float16)
        res = gen.standard_normal((m, n)).astype(np.float32)
        scale = gen.standard_normal(n).astype(np.float32)
        out = cuda.to_device(np.full((m, n), np.nan, np.float32))
        numbatc.gemm(cuda.to_device(a), cuda.to_device(b), out=out, epilogue=residual_scale,
                     epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
        ref = (a.astype(np.float64) @ b.astype(np.float64)) * scale + res
        np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-3)
    err = capfd.readouterr().err
    assert "sm90_gemm 128x128x64_4s_w1" in err and "split-K, 3 slices of 64" in err
