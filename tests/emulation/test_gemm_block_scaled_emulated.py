"""numbatc.kernels.sm100_scaled_gemm -- the block-scaled (MXFP8, NVFP4) Blackwell GEMM -- in the
CPU emulation.  There is no Blackwell GPU here, so this and the sm_100a assembly test
(tests/test_gemm_block_scaled_compile.py) are all the verification the kernel has: MXFP8 with
e4m3 and e5m2 operands (mixed too), NVFP4, ragged M and N, K spanning more k tiles than there are
stages (the pipeline wraps), 128- and 256-column tiles (one and two 128-row scale chunks of B),
the fused epilogue, numbatc.gemm routed to it with NUMBATC_GEMM_KERNEL=sm100, and the device
rearrangement of the scales against the host one.

The reference is float64 NumPy of the dequantised inputs, decoded by ml_dtypes (independent of
the emulation's own tables): sum_k a[m,k] sa[m,k/blk] b[k,n] sb[n,k/blk]."""

import math

import numpy as np
import pytest
from numba import config, cuda

import numbatc
from numbatc.interop import transpose_view
from numbatc.kernels import sm100_scaled_gemm as sg

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
ml_dtypes = pytest.importorskip("ml_dtypes")

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
# Two stages, so that 3+ k tiles wrap the pipeline.
WRAP8 = sg.ScaledConfig("mxfp8_128x128_2s", "mxfp8", 128, 2)
WRAP4 = sg.ScaledConfig("nvfp4_128x256_2s", "nvfp4", 256, 2)


def fp8_operand(gen, rows, k, t):
    """(codes uint8 (rows, k), values float64) of random finite fp8 values."""
    x = (gen.standard_normal((rows, k)) * 2).astype(FP8[t])
    return x.view(np.uint8), x.astype(np.float64)


def fp4_operand(gen, rows, k):
    """(packed uint8 (rows, k/2): element 2i in the low nibble, values float64 (rows, k))."""
    x = (gen.standard_normal((rows, k)) * 2).astype(ml_dtypes.float4_e2m1fn)
    codes = x.view(np.uint8) & 0xF
    return (codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint8), x.astype(np.float64)


def scales(gen, rows, blocks, fmt):
    """(codes uint8 (rows, blocks), values float64): ue8m0 exponents 2**-4..2**4, or ue4m3
    (positive e4m3) in [1/4, 4]."""
    if fmt == "mxfp8":
        codes = gen.integers(123, 132, (rows, blocks)).astype(np.uint8)
        return codes, 2.0 ** (codes.astype(np.float64) - 127)
    x = np.exp2(gen.uniform(-2, 2, (rows, blocks))).astype(ml_dtypes.float8_e4m3fn)
    return x.view(np.uint8), x.astype(np.float64)


def problem(gen, fmt, m, n, k, a_t="e4m3", b_t="e4m3"):
    """Raw a (M, K bytes), w (N, K bytes), scale codes, and the float64 reference a @ w.T."""
    block = sg.FORMATS[fmt].block
    if fmt == "mxfp8":
        a, av = fp8_operand(gen, m, k, a_t)
        w, wv = fp8_operand(gen, n, k, b_t)
    else:
        a, av = fp4_operand(gen, m, k)
        w, wv = fp4_operand(gen, n, k)
    sa, sav = scales(gen, m, k // block, fmt)
    sb, sbv = scales(gen, n, k // block, fmt)
    a_deq = av * np.repeat(sav, block, axis=1)
    w_deq = wv * np.repeat(sbv, block, axis=1)
    return a, w, sa, sb, a_deq @ w_deq.T, np.abs(a_deq) @ np.abs(w_deq).T


def check(got, ref, mag, out_dtype):
    rounding = {"float32": 2.0**-20, "bfloat16": 2.0**-8, "float16": 2.0**-11}[out_dtype]
    err = np.abs(got - ref)
    # the f32 accumulator rounds after every instruction: relative 2**-22 of the magnitudes
    assert np.all(err <= rounding * np.abs(ref) + 2.0**-20 * mag + 1e-6), np.nanmax(err)


def _to_float(out, out_dtype, m, n):
    host = out.copy_to_host()
    if out_dtype == "bfloat16":
        return host.view(ml_dtypes.bfloat16).astype(np.float64).reshape(m, n)
    return host.astype(np.float64).reshape(m, n)


@pytest.mark.parametrize("fmt, m, n, k, cfg, a_t, b_t", [
    ("mxfp8", 130, 72, 320, WRAP8, "e4m3", "e4m3"),     # 3 k tiles wrap 2 stages, ragged M, N
    ("mxfp8", 40, 136, 128, "mxfp8_128x256_4s", "e5m2", "e5m2"),  # two B chunks, one k tile
    ("nvfp4", 33, 260, 800, WRAP4, "e2m1", "e2m1"),     # 4 k tiles (one partial), 2 tiles of N
])
def test_the_kernel_in_the_emulation(fmt, m, n, k, cfg, a_t, b_t):
    cfg = sg.CONFIGS[cfg] if isinstance(cfg, str) else cfg
    gen = np.random.default_rng()
    a, w, sa, sb, ref, mag = problem(gen, fmt, m, n, k, a_t, b_t)
    var = sg.ScaledVariant(fmt, a_t, b_t, "float32")
    ta, tb = sg.tensor_maps(cfg, cuda.to_device(a), transpose_view(cuda.to_device(w)))
    groups_a, groups_b = sg.chunk_groups(cfg, m, n)
    k_tiles = -(-k // cfg.bk)
    sfa = sg.scale_chunks(cuda.to_device(sa), groups_a, k_tiles, cfg.chunks)
    sfb = sg.scale_chunks(cuda.to_device(sb), groups_b, k_tiles, cfg.chunks)
    out = cuda.to_device(np.full(m * n, np.nan, np.float32))
    sg.launch_flat(cfg, var, ta.device, tb.device, sfa, sfb, out, out, out, m, n, k, 0, n, 1.0,
                   0.0)
    check(_to_float(out, "float32", m, n), ref, mag, "float32")


def test_numbatc_gemm_mxfp8_mixed_with_the_fused_epilogue(monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm100")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 150, 40, 256
    a, w, sa, sb, ref, mag = problem(gen, "mxfp8", m, n, k, "e5m2", "e4m3")
    cmat = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    bias = gen.standard_normal(n).astype(np.float32)
    out = numbatc.gemm(numbatc.float8_e5m2(cuda.to_device(a)),
                       numbatc.float8_e4m3(cuda.to_device(w)).T,
                       scale_a=cuda.to_device(sa), scale_b=cuda.to_device(sb),
                       c=numbatc.bfloat16(cuda.to_device(cmat.view(np.uint16))), beta=0.5,
                       alpha=1.5, bias=cuda.to_device(bias), activation="gelu")
    assert "sm100_scaled_gemm mxfp8_128x128_6s float8_e5m2 x float8_e4m3fn" in \
        capsys.readouterr().err
    ref = 1.5 * ref + 0.5 * cmat.astype(np.float64) + bias
    ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
    got = out.copy_to_host().astype(np.float64)
    check(got, ref, 1.5 * mag + 1, "bfloat16")


@cuda.jit(device=True)
def residual(v, r, c, res):
    return v + res[r, c]


def test_numbatc_gemm_nvfp4_float16_out_with_a_user_epilogue(monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm100")
    gen = np.random.default_rng()
    m, n, k = 1, 24, 96  # one row; K = 96: a partial k tile of 256
    a, w, sa, sb, ref, mag = problem(gen, "nvfp4", m, n, k)
    res = gen.standard_normal((m, n)).astype(np.float32)
    out = numbatc.gemm(numbatc.float4_e2m1(cuda.to_device(a)),
                       numbatc.float4_e2m1(transpose_view(cuda.to_device(w))),
                       scale_a=numbatc.float8_e4m3(cuda.to_device(sa)),
                       scale_b=numbatc.float8_e4m3(cuda.to_device(sb)), out_dtype="float16",
                       epilogue=residual, epilogue_args=(cuda.to_device(res),))
    check(out.copy_to_host().astype(np.float64), ref + res, mag + 1, "float16")


def test_ml_dtypes_arrays_and_e8m0_scales(monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm100:mxfp8_128x128_6s")
    gen = np.random.default_rng()
    m, n, k = 20, 16, 64
    a, w, sa, sb, ref, mag = problem(gen, "mxfp8", m, n, k)
    out = numbatc.gemm(cuda.to_device(a.view(ml_dtypes.float8_e4m3fn)),
                       transpose_view(cuda.to_device(w.view(ml_dtypes.float8_e4m3fn))),
                       scale_a=cuda.to_device(sa.view(ml_dtypes.float8_e8m0fnu)),
                       scale_b=cuda.to_device(sb), out_dtype="float32")
    check(out.copy_to_host().astype(np.float64), ref, mag, "float32")


def test_without_the_forced_kernel_the_emulated_hopper_refuses():
    gen = np.random.default_rng()
    a, w, sa, sb, _, _ = problem(gen, "mxfp8", 8, 8, 32)
    with pytest.raises(ValueError, match=r"block-scaled GEMM \(MXFP8\) needs sm_100 \(Blackwell"
                                         r".*this GPU is sm_90"):
        numbatc.gemm(numbatc.float8_e4m3(cuda.to_device(a)),
                     numbatc.float8_e4m3(transpose_view(cuda.to_device(w))),
                     scale_a=cuda.to_device(sa), scale_b=cuda.to_device(sb))


@pytest.mark.parametrize("rows, blocks, groups, k_tiles, cpk", [(130, 12, 2, 3, 1),
                                                                (40, 16, 1, 1, 4)])
def test_the_device_rearrangement_matches_the_host_one(rows, blocks, groups, k_tiles, cpk):
    codes = np.random.default_rng().integers(0, 256, (rows, 2 * blocks)).astype(np.uint8)
    view = cuda.to_device(codes)[:, ::2]  # strided, as a user's scales may be
    host = sg.scale_chunks_host(codes[:, ::2], groups, k_tiles, cpk)
    dev = sg.scale_chunks(view, groups, k_tiles, cpk, device=True).copy_to_host()
    np.testing.assert_array_equal(dev, host)
    # and the layout itself: row r, block j of chunk (kt, g, c) at 16*(r%32) + 4*(r%128//32) + j
    r, blk = rows - 1, blocks - 1
    kt, c, j = blk // (4 * cpk), (blk // 4) % cpk, blk % 4
    chunk = (kt * groups + r // 128) * cpk + c
    assert host[512 * chunk + 16 * (r % 32) + 4 * (r % 128 // 32) + j] == codes[r, 2 * blk]
