"""FP8 with per-tensor scales on the Hopper kernel (sm90_gemm's fp8 form) in the CPU emulation:
e4m3 x e4m3, e5m2 x e4m3 and e4m3 x e5m2, ragged M, N and K (K not a multiple of 16: the last
copy of each row reads fewer bytes), a pipeline that wraps around its stages (with and without a
wgmma group in flight), the fused epilogue, and numbatc.gemm end to end (scales folded into
alpha, packing of rows that are not 16-byte aligned, the K-major refusal).

The reference is float64 NumPy of the inputs decoded by ml_dtypes (independent of the
emulation's own fp8 tables), times the scales.  Padding past each row's end holds NaN codes
(0x7F, NaN in both formats): a copy that read it, or a store past N, would show."""

import math

import numpy as np
import pytest
from numba import config, cuda

import numbatc
from numbatc.interop import transpose_view
from numbatc.kernels import sm90_gemm

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
ml_dtypes = pytest.importorskip("ml_dtypes")

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
DTYPE = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
NAN8 = 0x7F
# Two stages: 3+ k tiles (K > 256) wrap the pipeline; the _w1 form releases a stage one tile
# late, with a group in flight.
WRAP = sm90_gemm.Sm90Config("fp8_128x128x128_2s", 128, 2, bk=128, elem_bytes=1)
WRAP_W1 = sm90_gemm.Sm90Config("fp8_128x128x128_3s_w1", 128, 3, bk=128, inflight=1,
                               elem_bytes=1)
# persistent: the emulation's 2 blocks walk 9 tiles
WRAP_PT = sm90_gemm.Sm90Config("fp8_128x128x128_2s_pt", 128, 2, bk=128, elem_bytes=1,
                               persistent=True)


def operand(gen, rows, k, t):
    """(codes uint8 (rows, k), values float64) of random finite fp8 values."""
    x = (gen.standard_normal((rows, k)) * 2).astype(FP8[t])
    return x.view(np.uint8), x.astype(np.float64)


def flat(codes):
    """(flat uint8 device array, ld) of (rows, k) codes, each row padded with NaN codes to a
    multiple of 16 bytes."""
    rows, k = codes.shape
    ld = (k + 15) // 16 * 16
    store = np.full((rows, ld), NAN8, dtype=np.uint8)
    store[:, :k] = codes
    return cuda.to_device(store.ravel()), ld


def activate(ref, activation):
    if activation == "gelu":
        return 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
    if activation == "silu":
        return ref / (1 + np.exp(-ref))
    if activation == "relu":
        return np.maximum(ref, 0)
    return ref


def check(got, ref, mag, out_dtype):
    rounding = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-20}[out_dtype]
    err = np.abs(got - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * mag + 1e-6), np.nanmax(err)


CASES = [
    # m,   n,   k,  config, a, b, epilogue
    (130, 136, 150, "fp8_128x256x128_3s", "e4m3", "e4m3", None),     # ragged M, N, K
    (72, 40, 300, WRAP, "e5m2", "e4m3", "gelu"),                     # wraps 2 stages, fused
    (65, 136, 520, WRAP_W1, "e4m3", "e5m2", "silu"),                 # in flight, wraps 3 stages
    (1, 8, 7, "fp8_128x128x128_4s_w1", "e4m3", "e4m3", None),        # 1 row, K < 16
    (260, 264, 300, WRAP_PT, "e4m3", "e5m2", "gelu"),                # persistent, 9 tiles
]


@pytest.mark.parametrize("m, n, k, cfg, a_t, b_t, epilogue", CASES)
def test_the_kernel_in_the_emulation(m, n, k, cfg, a_t, b_t, epilogue):
    cfg = sm90_gemm.FP8_CONFIGS[cfg] if isinstance(cfg, str) else cfg
    gen = np.random.default_rng()
    a, av = operand(gen, m, k, a_t)
    w, wv = operand(gen, n, k, b_t)  # b = w.T: (K, N) column-major
    sa, sb = 0.75, 1.25
    ref = sa * sb * (av @ wv.T)
    mag = sa * sb * (np.abs(av) @ np.abs(wv.T)) + 1
    out_dtype = "bfloat16" if epilogue else "float32"
    var = sm90_gemm.Sm90Fp8Variant("row", "col", DTYPE[a_t], out_dtype,
                                   out_dtype if epilogue else None,
                                   "float32" if epilogue else None, epilogue, b_dtype=DTYPE[b_t])
    da, lda = flat(a)
    db, ldb = flat(w)
    ldo = (n + 7) // 8 * 8
    if out_dtype == "float32":
        dout = cuda.to_device(np.full(m * ldo, np.nan, dtype=np.float32))
    else:
        dout = cuda.to_device(np.full(m * ldo, 0x7FC0, dtype=np.uint16))
    alpha, beta, dc, ldc, dbias = 1.0, 0.0, dout, 0, dout
    if epilogue:
        alpha, beta = 1.5, 0.5
        cmat = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
        bias = gen.standard_normal(n).astype(np.float32)
        dc, ldc = cuda.to_device(np.ascontiguousarray(cmat).view(np.uint16).ravel()), n
        dbias = cuda.to_device(bias)
        ref = activate(alpha * ref + beta * cmat.astype(np.float64) + bias, epilogue)
        mag = alpha * mag
    host = [getattr(x, "_ary", x) for x in (da, db, dc, dbias, dout)]
    sm90_gemm.launch_flat(cfg, var, *host, m, n, k, lda, ldb, ldc, ldo, alpha * sa * sb, beta)

    stored = dout.copy_to_host().reshape(m, ldo)
    if out_dtype == "bfloat16":
        stored = stored.view(ml_dtypes.bfloat16)
    stored = stored.astype(np.float64)
    assert np.all(np.isnan(stored[:, n:])), "the kernel stored past N"
    check(stored[:, :n], ref, mag, out_dtype)


def _marked(codes, t, transpose=False):
    d = cuda.to_device(np.ascontiguousarray(codes))
    if transpose:
        d = transpose_view(d)
    return numbatc.float8_e4m3(d) if t == "e4m3" else numbatc.float8_e5m2(d)


def test_numbatc_gemm_with_scales_and_the_fused_epilogue(monkeypatch, capsys):
    """numbatc.gemm end to end: e5m2 x e4m3, K = 40 (rows of 40 bytes: packed to 48), float16
    out with c, a float16 bias and relu; the scales reach the kernel folded into alpha."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 70, 24, 40
    a, av = operand(gen, m, k, "e5m2")
    w, wv = operand(gen, n, k, "e4m3")
    c = gen.standard_normal((m, n)).astype(np.float16)
    bias = gen.standard_normal(n).astype(np.float16)
    sa, sb, alpha, beta = np.float32(0.5), 3.0, 1.25, -0.5
    out = numbatc.gemm(_marked(a, "e5m2"), _marked(w, "e4m3", transpose=True),
                       c=cuda.to_device(c), alpha=alpha, beta=beta, bias=cuda.to_device(bias),
                       activation="relu", out_dtype="float16", scale_a=sa, scale_b=sb)
    assert "fp8_128x128x128_4s_w1" in capsys.readouterr().err
    got = out.copy_to_host().astype(np.float64)
    ref = activate(alpha * float(sa) * sb * (av @ wv.T) + beta * c.astype(np.float64)
                   + bias.astype(np.float64), "relu")
    check(got, ref, alpha * float(sa) * sb * (np.abs(av) @ np.abs(wv.T)) + 1, "float16")


def test_numbatc_gemm_fp8_split_k(monkeypatch, capsys):
    """FP8 with NUMBATC_SPLIT_K (opt-in for FP8 until it has run on a GPU): three K slices of
    128 values (the last one short), c + bias through the last block's epilogue, twice (the tile
    counters must have been reset)."""
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 5, 24, 300
    for _ in range(2):
        a, av = operand(gen, m, k, "e4m3")
        w, wv = operand(gen, n, k, "e5m2")
        c = gen.standard_normal((m, n)).astype(np.float16)
        bias = gen.standard_normal(n).astype(np.float16)
        out = numbatc.gemm(_marked(a, "e4m3"), _marked(w, "e5m2", transpose=True),
                           c=cuda.to_device(c), beta=0.5, bias=cuda.to_device(bias),
                           out_dtype="float16", scale_a=0.5, scale_b=2.0)
        got = out.copy_to_host().astype(np.float64)
        ref = av @ wv.T + 0.5 * c.astype(np.float64) + bias.astype(np.float64)
        check(got, ref, np.abs(av) @ np.abs(wv.T) + 1, "float16")
    assert "split-K, 3 slices of 128" in capsys.readouterr().err


def test_numbatc_gemm_ml_dtypes_default_output():
    """ml_dtypes float8 device arrays (no markers), bfloat16 output by default, without forcing
    the kernel (the emulation stands in for an sm_90a GPU); a row-major b is refused."""
    gen = np.random.default_rng()
    m, n, k = 33, 16, 64
    a = (gen.standard_normal((m, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
    w = (gen.standard_normal((n, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
    out = numbatc.gemm(cuda.to_device(a), transpose_view(cuda.to_device(w)),
                       scale_a=2.0, scale_b=0.125)
    assert out.dtype == "bfloat16"
    got = out.copy_to_host().astype(np.float64)
    ref = 0.25 * (a.astype(np.float64) @ w.astype(np.float64).T)
    check(got, ref, 0.25 * np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64).T) + 1,
          "bfloat16")
    with pytest.raises(ValueError, match=r"FP8 GEMM reads b K-major: \(K, N\) column-major"):
        numbatc.gemm(cuda.to_device(a), cuda.to_device(np.ascontiguousarray(w.T)),
                     scale_a=2.0, scale_b=0.125)
