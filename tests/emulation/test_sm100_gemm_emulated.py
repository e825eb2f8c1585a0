"""numbatc.kernels.sm100_gemm (TMA -> tcgen05.mma -> tensor memory -> tcgen05.ld) in the CPU
emulation -- there is no Blackwell GPU here, so this and the sm_100a assembly test are all the
verification this kernel has: ragged M, N and K through TMA's zero fill, pipelines that wrap
their stages, bf16 and f16, the fused epilogue (alpha, beta * C, bias, activation) and a user
epilogue, and numbatc.gemm routed to it with NUMBATC_GEMM_KERNEL=sm100 (including an operand
that must be packed first, and a layout the kernel does not take, which runs sm80_gemm)."""

import math

import numpy as np
import pytest
from numba import config, cuda

import numbatc
from numbatc.kernels import sm100_gemm
from numbatc.kernels.epilogue import GemmVariant

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
ml_dtypes = pytest.importorskip("ml_dtypes")

# Two stages, so that K = 330 (6 k tiles) wraps: the producer waits on completed phases of the
# empty barriers (tcgen05.commit arrivals) and the MMA thread on the second phase of full.
WRAP = sm100_gemm.Sm100Config("128x64x64_2s", 64, 2)


def _np(dtype):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16


def _padded(x):
    """A device view of x (rows, cols) whose rows start 16 bytes apart (padded to 8 elements)."""
    rows, cols = x.shape
    store = np.zeros((rows, (cols + 7) // 8 * 8), np.uint16)
    store[:, :cols] = np.ascontiguousarray(x).view(np.uint16)
    return cuda.to_device(store)[:, :cols]


@pytest.mark.parametrize("m, n, k, cfg, dtype, fused", [
    (130, 72, 100, "128x64x64_6s", "bfloat16", False),   # ragged everything, 2x2 tiles
    (1, 8, 8, "128x256x64_4s", "float16", False),         # one row, one k tile
    (257, 300, 330, WRAP, "bfloat16", True),              # wraps 2 stages, fused epilogue
    (70, 130, 200, "128x128x64_4s", "float16", True),
])
def test_sm100_gemm_in_the_emulation(m, n, k, cfg, dtype, fused):
    cfg = sm100_gemm.CONFIGS[cfg] if isinstance(cfg, str) else cfg
    gen = np.random.default_rng()
    a = gen.standard_normal((m, k)).astype(_np(dtype))
    b = gen.standard_normal((k, n)).astype(_np(dtype))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out_dtype = "bfloat16" if fused else "float32"
    var = GemmVariant("row", "col", dtype, out_dtype, "bfloat16" if fused else None,
                      dtype if fused else None, "gelu" if fused else None)
    da = _padded(a)
    db = _padded(b.T).T  # (K, N), column-major
    ta, tb = sm100_gemm.tensor_maps(cfg, var, da, db)
    if fused:
        out = cuda.to_device(np.full(m * n, 0x7FC0, np.uint16))
        cmat = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
        bias = gen.standard_normal(n).astype(_np(dtype))
        c = cuda.to_device(cmat.view(np.uint16).ravel())
        dbias = cuda.to_device(bias.view(np.uint16))
        alpha, beta = 1.5, 0.5
        ref = alpha * ref + beta * cmat.astype(np.float64) + bias.astype(np.float64)
        ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        sm100_gemm.launch_flat(cfg, var, ta.device, tb.device, c, dbias, out, m, n, k, n, n,
                               alpha, beta)
        got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64).reshape(m, n)
        rounding = 2.0**-8
    else:
        out = cuda.to_device(np.full(m * n, np.nan, np.float32))
        sm100_gemm.launch_flat(cfg, var, ta.device, tb.device, out, out, out, m, n, k, 0, n, 1.0,
                               0.0)
        got = out.copy_to_host().astype(np.float64).reshape(m, n)
        rounding = 2.0**-20
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    err = np.abs(got - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * scale), np.nanmax(err)


@cuda.jit(device=True)
def residual(v, r, c, res):
    return v + res[r, c]


def test_numbatc_gemm_runs_sm100_with_packing_and_a_user_epilogue(monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm100:128x64x64_6s")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 90, 40, 77  # K * 2 bytes is not a multiple of 16: both operands are packed
    a = gen.standard_normal((m, k)).astype(np.float16)
    w = gen.standard_normal((n, k)).astype(np.float16)  # a linear layer's weight, (N, K)
    res = gen.standard_normal((m, n)).astype(np.float32)
    out = numbatc.gemm(cuda.to_device(a), cuda.to_device(w).T, out_dtype="float32",
                       epilogue=residual, epilogue_args=(cuda.to_device(res),))
    assert "sm100_gemm 128x64x64_6s" in capsys.readouterr().err
    ref = a.astype(np.float64) @ w.T.astype(np.float64) + res
    np.testing.assert_allclose(out.copy_to_host(), ref, rtol=1e-5, atol=1e-3)


def test_a_layout_sm100_does_not_take_runs_sm80(monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm100")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    a = np.random.default_rng().standard_normal((20, 24)).astype(np.float16)
    b = np.random.default_rng().standard_normal((24, 16)).astype(np.float16)
    out = numbatc.gemm(cuda.to_device(a), cuda.to_device(b), out_dtype="float32")  # b row-major
    assert "not sm100_gemm: sm100_gemm takes K-major operands only" in capsys.readouterr().err
    np.testing.assert_allclose(out.copy_to_host(), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-3)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="bn must be 32, 64, 128 or 256"):
        sm100_gemm.Sm100Config("bad", 96, 3)
    with pytest.raises(ValueError, match="exceed 227 KB"):
        sm100_gemm.Sm100Config("big", 256, 5)
