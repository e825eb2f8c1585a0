"""numbatc.kernels.sm90_gemm in the CPU emulation (the same kernel source as on the GPU): the
warp-specialised cp.async -> mbarrier -> wgmma pipeline, ragged edges in M, N and K, both B
layouts, bf16 and f16, the fused epilogue, and a pipeline that wraps around its stages.

The kernel is called directly with flat operands (launch_flat), as sm90_gemm.launch does under
the simulator.  Padding past each row's end holds NaN bit patterns: a copy that read it, or a
store past N, would show.  384 threads per block are 384 Python threads here, so the grids are tiny.
"""

import math

import numpy as np
import pytest
from numba import config, cuda

from numbatc.kernels import sm90_gemm
from tests.helpers.barriers import record_named_barriers

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
ml_dtypes = pytest.importorskip("ml_dtypes")

NAN16 = {"bfloat16": 0x7FC0, "float16": 0x7E00}
# Two stages, so that K = 200 (4 k tiles) wraps the pipeline: the producer waits on an empty
# barrier's completed phase and the consumers on the second phase of the full barriers.
WRAP = sm90_gemm.Sm90Config("128x128x64_2s", 128, 2)
# The same with one wgmma group left in flight: a stage released before its group retired, or
# refilled while the tensor core may still read it, is an EmulationError.
WRAP_W1 = sm90_gemm.Sm90Config("128x128x64_2s_w1", 128, 2, inflight=1)
# persistent: the emulation launches 2 blocks (sm90_gemm.persistent_blocks), each walking tiles
WRAP_PT = sm90_gemm.Sm90Config("128x128x64_2s_pt", 128, 2, persistent=True)
WRAP_PT_W1 = sm90_gemm.Sm90Config("128x128x64_3s_w1_pt", 128, 3, inflight=1, persistent=True)

# The TMA producer (numbatc.kernels.sm90_gemm_tma): one thread's tensor copies with out-of-bounds
# zero fill instead of 128 threads' cp.async, the same ring wrapped: two stages; three with a
# group in flight and persistent tiles.
_TMA = dict(producer="tma", producer_regs=24, consumer_regs=240)
WRAP_TMA = sm90_gemm.Sm90Config("128x128x64_2s_tma", 128, 2, **_TMA)
WRAP_TMA_W1_PT = sm90_gemm.Sm90Config("128x128x64_3s_w1_pt_tma", 128, 3, inflight=1,
                                      persistent=True, **_TMA)
# Ping-pong (cfg.pingpong): each consumer warpgroup takes whole tiles, the block's tiles
# alternating between them through one ring (two stages: it wraps inside each tile), turns at
# the main loop on named barriers 4 / 5.  A ring position or a turn miscounted is a deadlock
# report or a wrong tile; a barrier left part-full at exit an EmulationError.
WRAP_PP = sm90_gemm.Sm90Config("128x128x64_2s_pp_tma", 128, 2, persistent=True, pingpong=True,
                               **_TMA)
WRAP_PP_W1 = sm90_gemm.Sm90Config("128x128x64_2s_w1_pp_tma", 128, 2, inflight=1,
                                  persistent=True, pingpong=True, **_TMA)


@pytest.fixture
def barriers_left(monkeypatch):
    """The named barriers left part-full (tests.helpers.barriers)."""
    return record_named_barriers(monkeypatch)


def _np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.float16


def _flat(x, layout, nan):
    """(flat uint16 device array, ld) of matrix x stored 'row' or 'col' with each stored row
    padded to a multiple of 8 elements with NaN patterns."""
    host = x if layout == "row" else x.T
    rows, cols = host.shape
    ld = (cols + 7) // 8 * 8
    store = np.full((rows, ld), nan, dtype=np.uint16)
    store[:, :cols] = np.ascontiguousarray(host).view(np.uint16)
    return cuda.to_device(store.ravel()), ld


def _host(d):
    return getattr(d, "_ary", d)


CASES = [
    # m,   n,   k,  config name / config, A, B, dtype, epilogue
    (130, 136, 72, "128x256x64_3s", "row", "row", "bfloat16", None),      # ragged M, N, K
    (64, 128, 64, "128x128x64_4s", "row", "col", "float16", None),        # exact tile, K-major B
    (1, 8, 8, "128x256x64_3s", "row", "col", "bfloat16", "gelu"),         # 1 row, +c +bias
    (72, 40, 200, WRAP, "row", "row", "float16", "silu"),                 # wraps 2 stages
    (40, 24, 33, "128x128x64_4s", "col", "row", "bfloat16", None),        # MN-major A
    (65, 136, 200, WRAP_W1, "row", "col", "bfloat16", "gelu"),            # in flight, wraps
    (130, 72, 136, "128x256x64_4s_w1", "col", "col", "float16", None),    # in flight, 3 tiles
    (72, 40, 200, WRAP, "col", "row", "bfloat16", "gelu"),                # MN-major, wraps
    (65, 136, 264, WRAP_W1, "row", "row", "float16", None),               # MN-major B in flight
    # tiles wholly inside the operands take the producer's unchecked copies (load_*_inside),
    # their ragged last k tile and the edge tiles the checked ones
    (160, 136, 200, WRAP_W1, "row", "col", "bfloat16", None),             # K-major A and B
    (136, 130, 128, WRAP, "col", "row", "float16", "gelu"),               # MN-major A and B
    (260, 264, 200, WRAP_PT_W1, "col", "row", "bfloat16", None),          # MN-major, persistent
    # persistent: 9 and 4 tiles over 2 blocks, the stage counter running on across tiles
    (260, 264, 200, WRAP_PT, "row", "row", "bfloat16", None),
    (200, 136, 136, WRAP_PT_W1, "col", "col", "float16", "gelu"),
    # the TMA producer: ragged M, N, K from the boxes' zero fill; K-major boxes and MN-major
    # ones (BM / 64 + BN / 64 boxes of (BK, 64) per stage, atoms K-first); persistent: 6 tiles
    # over 2 blocks
    (260, 136, 200, WRAP_TMA, "row", "col", "bfloat16", None),
    (72, 40, 200, WRAP_TMA, "col", "row", "float16", "gelu"),
    (200, 264, 136, WRAP_TMA_W1_PT, "row", "row", "bfloat16", None),
    (130, 136, 72, "128x256x64_4s_pt_tma", "col", "col", "bfloat16", "silu"),
    # one consumer warpgroup on 64-row tiles: 2 x 2 tiles, ragged M and N
    (72, 136, 200, "64x128x64_6s_w1_tma", "row", "col", "bfloat16", "gelu"),
    (100, 40, 136, "64x256x64_4s_w1_tma", "col", "row", "float16", None),
    # ping-pong: 9 tiles over 2 blocks (5 and 4: each warpgroup ends the block once), 4 tiles
    # with a group in flight, and 1 tile (block 1 has none: only the first hand-over)
    (260, 264, 264, WRAP_PP, "row", "col", "bfloat16", None),  # 5 k tiles: offsets not 2 S
    (200, 136, 136, WRAP_PP_W1, "col", "row", "float16", "gelu"),
    (100, 40, 72, "128x128x64_5s_pp_tma", "row", "row", "bfloat16", "silu"),
]


# bf16 outputs whose column pairs inside the matrix are 32-bit stores (GemmVariant.out_pairs)
PAIR_CASES = [
    (160, 136, 200, WRAP_W1, "row", "col", "bfloat16", "gelu"),
    (136, 130, 128, WRAP, "col", "row", "float16", "silu"),
    (260, 136, 200, WRAP_W1, "row", "row", "bfloat16", "gelu"),
    (260, 264, 136, WRAP_PT_W1, "row", "col", "bfloat16", "silu"),
    (260, 264, 136, WRAP_PP_W1, "row", "col", "bfloat16", "silu"),
]


@pytest.mark.parametrize("m, n, k, cfg, a_layout, b_layout, dtype, epilogue, pairs",
                         [c + (False,) for c in CASES] + [c + (True,) for c in PAIR_CASES])
def test_sm90_gemm_in_the_emulation(barriers_left, m, n, k, cfg, a_layout, b_layout, dtype,
                                    epilogue, pairs):
    cfg = sm90_gemm.CONFIGS[cfg] if isinstance(cfg, str) else cfg
    gen = np.random.default_rng()
    a = gen.standard_normal((m, k)).astype(_np_dtype(dtype))
    b = gen.standard_normal((k, n)).astype(_np_dtype(dtype))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out_dtype = "bfloat16" if epilogue else "float32"
    var = sm90_gemm.Sm90Variant(a_layout, b_layout, dtype, out_dtype,
                                out_dtype if epilogue else None, dtype if epilogue else None,
                                epilogue, out_pairs=pairs)
    da, lda = _flat(a, a_layout, NAN16[dtype])
    db, ldb = _flat(b, b_layout, NAN16[dtype])
    ldo = (n + 7) // 8 * 8
    if out_dtype == "float32":
        dout = cuda.to_device(np.full(m * ldo, np.nan, dtype=np.float32))
    else:
        dout = cuda.to_device(np.full(m * ldo, NAN16["bfloat16"], dtype=np.uint16))
    alpha, beta = 1.0, 0.0
    dc, ldc, dbias = dout, 0, dout
    if epilogue:
        alpha, beta = 1.5, 0.5
        cmat = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
        bias = gen.standard_normal(n).astype(_np_dtype(dtype))
        dc, ldc = _flat(cmat, "row", NAN16["bfloat16"])
        dbias = cuda.to_device(bias.view(np.uint16))
        ref = alpha * ref + beta * cmat.astype(np.float64) + bias.astype(np.float64)
        if epilogue == "gelu":
            ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        else:
            ref = ref / (1 + np.exp(-ref))

    sm90_gemm.launch_flat(cfg, var, _host(da), _host(db), _host(dc), _host(dbias), _host(dout),
                          m, n, k, lda, ldb, ldc, ldo, alpha, beta)

    stored = dout.copy_to_host().reshape(m, ldo)
    if out_dtype == "bfloat16":
        stored = stored.view(ml_dtypes.bfloat16)
    stored = stored.astype(np.float64)
    assert np.all(np.isnan(stored[:, n:])), "the kernel stored past N"
    assert not barriers_left(), "a named barrier left part-full"
    got = stored[:, :n]
    rounding = {"bfloat16": 2.0**-8, "float32": 2.0**-20}[out_dtype]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    err = np.abs(got - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * scale), np.nanmax(err)


# The TMA store epilogue (store="tma", the _ts names): tiles inside the matrix go through each
# consumer warpgroup's staging tile (stmatrix, 128B swizzle) and TMA stores; edge tiles store
# directly.  Persistent with two stages: each block reuses its staging tile for several tiles,
# so a staging write before the previous tile's stores have read it is an EmulationError.
WRAP_TMA_TS = sm90_gemm.Sm90Config("128x128x64_2s_pt_tma_ts", 128, 2, persistent=True,
                                   store="tma", **_TMA)
WRAP_TMA_W1_TS = sm90_gemm.Sm90Config("128x128x64_3s_w1_pt_tma_ts", 128, 3, inflight=1,
                                      persistent=True, store="tma", **_TMA)

TS_CASES = [
    # m,   n,   k,  config, A, B, dtype (in and out), epilogue
    (260, 264, 200, WRAP_TMA_TS, "row", "col", "bfloat16", None),   # 4 inside tiles, 5 edge
    (256, 256, 136, WRAP_TMA_TS, "col", "row", "float16", "gelu"),  # every tile inside
    (200, 136, 72, WRAP_TMA_W1_TS, "row", "row", "bfloat16", "silu"),
    (256, 512, 72, "128x256x64_3s_pt_tma_ts", "row", "col", "bfloat16", None),
    (136, 264, 200, "64x128x64_6s_w1_tma_ts", "col", "col", "float16", "gelu"),  # one consumer
    # ping-pong: each warpgroup's two 64-row halves through two staging tiles of its own
    (260, 264, 200, sm90_gemm.Sm90Config("128x128x64_2s_w1_pp_tma_ts", 128, 2, inflight=1,
                                         persistent=True, store="tma", pingpong=True, **_TMA),
     "row", "col", "bfloat16", None),
    (384, 256, 136, "128x128x64_4s_w1_pp_tma_ts", "col", "row", "float16", "gelu"),
]


@pytest.mark.parametrize("m, n, k, cfg, a_layout, b_layout, dtype, epilogue", TS_CASES)
def test_sm90_gemm_tma_store_in_the_emulation(barriers_left, m, n, k, cfg, a_layout, b_layout,
                                              dtype, epilogue):
    cfg = sm90_gemm.CONFIGS[cfg] if isinstance(cfg, str) else cfg
    gen = np.random.default_rng()
    a = gen.standard_normal((m, k)).astype(_np_dtype(dtype))
    b = gen.standard_normal((k, n)).astype(_np_dtype(dtype))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    var = sm90_gemm.Sm90Variant(a_layout, b_layout, dtype, dtype, dtype if epilogue else None,
                                dtype if epilogue else None, epilogue, out_pairs=True)
    da, lda = _flat(a, a_layout, NAN16[dtype])
    db, ldb = _flat(b, b_layout, NAN16[dtype])
    ldo = (n + 7) // 8 * 8 + 8  # a pitch past N: a box stored past the matrix would show
    dout = cuda.to_device(np.full(m * ldo, NAN16[dtype], dtype=np.uint16))
    alpha, beta, dc, ldc, dbias = 1.0, 0.0, dout, 0, dout
    if epilogue:
        alpha, beta = 1.5, 0.5
        cmat = gen.standard_normal((m, n)).astype(_np_dtype(dtype))
        bias = gen.standard_normal(n).astype(_np_dtype(dtype))
        dc, ldc = _flat(cmat, "row", NAN16[dtype])
        dbias = cuda.to_device(bias.view(np.uint16))
        ref = alpha * ref + beta * cmat.astype(np.float64) + bias.astype(np.float64)
        if epilogue == "gelu":
            ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        else:
            ref = ref / (1 + np.exp(-ref))

    sm90_gemm.launch_flat(cfg, var, _host(da), _host(db), _host(dc), _host(dbias), _host(dout),
                          m, n, k, lda, ldb, ldc, ldo, alpha, beta)

    stored = dout.copy_to_host().reshape(m, ldo).view(_np_dtype(dtype)).astype(np.float64)
    assert np.all(np.isnan(stored[:, n:])), "the kernel stored past N"
    assert not barriers_left(), "a named barrier left part-full"
    got = stored[:, :n]
    rounding = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    err = np.abs(got - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * scale), np.nanmax(err)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="bn must be"):
        sm90_gemm.Sm90Config("bad", 100, 3)
    with pytest.raises(ValueError, match="stages must be >= 2"):
        sm90_gemm.Sm90Config("one", 128, 1)
    with pytest.raises(ValueError, match="more than the 64512 a block of 384 threads"):
        sm90_gemm.Sm90Config("regs", 128, 4, producer_regs=64, consumer_regs=224)
    with pytest.raises(ValueError, match="exceed 227 KB"):
        sm90_gemm.Sm90Config("big", 256, 5)
    with pytest.raises(ValueError, match="TMA store epilogue is implemented with the TMA"):
        sm90_gemm.Sm90Config("ts", 128, 3, store="tma")


# ---------------------------------------------------------------------------------------------
# The TMA producer through numbatc.gemm: the default switch, split-K, FP8, the cp.async fallback
# ---------------------------------------------------------------------------------------------

def _device(x, layout):
    """A numbatc.gemm operand in the emulation: x (bf16 / f16 / fp8 host values) stored
    ``layout``."""
    import numbatc
    from numbatc.interop import transpose_view

    host = np.ascontiguousarray(x if layout == "row" else x.T)
    bits = {2: np.uint16, 1: np.uint8}[host.dtype.itemsize]
    d = cuda.to_device(host if host.dtype == np.float16 else host.view(bits))
    d = transpose_view(d) if layout == "col" else d
    if x.dtype == ml_dtypes.bfloat16:
        return numbatc.bfloat16(d)
    if x.dtype == ml_dtypes.float8_e4m3fn:
        return numbatc.float8_e4m3(d)
    return d


def _close(got, ref, mag, rounding):
    err = np.abs(got - ref)
    assert np.all(err <= rounding * np.abs(ref) + 1e-5 * mag), np.nanmax(err)


def test_the_tma_default_switch_with_split_k(monkeypatch, capsys):
    """sm90_gemm.DEFAULT_PRODUCER = "tma": the heuristic's 128x128x64_4s_w1 runs as its _tma
    twin; NUMBATC_SPLIT_K=2 splits K = 296 (5 k tiles) into slices of 192 and 104 (each slice's
    boxes start at its first k; the last one's zero fill ends the sum), c + bias through the last
    block, twice (the tile counters were reset).  A row-major b: MN-major boxes."""
    import numbatc

    monkeypatch.setattr(sm90_gemm, "DEFAULT_PRODUCER", "tma")
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90")
    monkeypatch.setenv("NUMBATC_SPLIT_K", "2")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 5, 24, 296
    for _ in range(2):
        a = gen.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = gen.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        c = gen.standard_normal((m, n)).astype(np.float32)
        bias = gen.standard_normal(n).astype(np.float32)
        out = numbatc.gemm(_device(a, "row"), _device(b, "row"), c=cuda.to_device(c), beta=0.5,
                           bias=cuda.to_device(bias), out_dtype="float32")
        ref = a.astype(np.float64) @ b.astype(np.float64) + 0.5 * c + bias
        mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
        _close(out.copy_to_host().astype(np.float64), ref, mag, 2.0**-20)
    err = capsys.readouterr().err
    assert "sm90_gemm 128x128x64_4s_w1_tma" in err and "split-K, 2 slices of 192" in err, err


def test_fp8_tma_and_the_cp_async_fallback(monkeypatch, capsys):
    """FP8 (K-major boxes of 128 one-byte values) forced to fp8_128x128x128_4s_w1_tma: K = 256
    runs it; K = 40 (rows of 40 bytes: a tensor map cannot describe them) runs the cp.async
    twin on packed copies, and NUMBATC_PRINT_CONFIG says so."""
    import numbatc

    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x128x128_4s_w1_tma")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    for m, n, k, tma in ((70, 24, 256, True), (33, 16, 40, False)):
        a = (gen.standard_normal((m, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
        w = (gen.standard_normal((n, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
        out = numbatc.gemm(_device(a, "row"), _device(w.T, "col"), scale_a=0.5, scale_b=2.0,
                           out_dtype="float16")
        av, wv = a.astype(np.float64), w.astype(np.float64)
        _close(out.copy_to_host().astype(np.float64), av @ wv.T, np.abs(av) @ np.abs(wv.T) + 1,
               2.0**-10)
        err = capsys.readouterr().err
        if tma:
            assert "sm90_gemm fp8_128x128x128_4s_w1_tma" in err and "not fp8" not in err, err
        else:
            assert ("sm90_gemm fp8_128x128x128_4s_w1, not fp8_128x128x128_4s_w1_tma: a and b not "
                    "16-byte aligned") in err, err


def test_tma_store_through_numbatc_gemm_and_its_fallbacks(monkeypatch, capsys):
    """numbatc.gemm forced to the TMA store epilogue (128x128x64_4s_w1_pt_tma_ts): a bf16 out
    with c and bias goes through the staging tile (c read before the tile's stores); a float32
    out, a column-major out and an out whose rows are not 16-byte multiples run the
    direct-store twin 128x128x64_4s_w1_pt_tma, and NUMBATC_PRINT_CONFIG names the reason;
    K split runs the split twin (direct stores of partial sums)."""
    import numbatc
    from numbatc.interop import transpose_view

    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x128x64_4s_w1_pt_tma_ts")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    m, n, k = 136, 264, 72
    a = gen.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = gen.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    av, bv = a.astype(np.float64), b.astype(np.float64)
    mag = np.abs(av) @ np.abs(bv) + 1
    cmat = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
    out = numbatc.gemm(_device(a, "row"), _device(b, "col"), c=_device(cmat, "row"), beta=0.5,
                       bias=_device(bias, "row"))
    ref = av @ bv + 0.5 * cmat.astype(np.float64) + bias.astype(np.float64)
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    _close(got, ref, mag, 2.0**-8)
    err = capsys.readouterr().err
    assert "sm90_gemm 128x128x64_4s_w1_pt_tma_ts" in err and ", not" not in err, err

    twin = "sm90_gemm 128x128x64_4s_w1_pt_tma, not 128x128x64_4s_w1_pt_tma_ts"
    out = numbatc.gemm(_device(a, "row"), _device(b, "col"), out_dtype="float32")
    _close(out.copy_to_host().astype(np.float64), av @ bv, mag, 2.0**-20)
    assert f"{twin}: out is float32" in capsys.readouterr().err

    col = transpose_view(cuda.to_device(np.full((n, m), 0x7FC0, dtype=np.uint16)))
    out = numbatc.gemm(_device(a, "row"), _device(b, "col"), out=numbatc.bfloat16(col))
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    _close(got, av @ bv, mag, 2.0**-8)
    assert f"{twin}: out is column-major" in capsys.readouterr().err

    ragged = cuda.to_device(np.full((m, n + 4), 0x7FC0, dtype=np.uint16))[:, :n]
    out = numbatc.gemm(_device(a, "row"), _device(b, "col"), out=numbatc.bfloat16(ragged))
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    _close(got, av @ bv, mag, 2.0**-8)
    assert f"{twin}: out not 16-byte aligned" in capsys.readouterr().err

    monkeypatch.setenv("NUMBATC_SPLIT_K", "2")
    k2 = 200
    a2 = gen.standard_normal((m, k2)).astype(ml_dtypes.bfloat16)
    b2 = gen.standard_normal((k2, n)).astype(ml_dtypes.bfloat16)
    out = numbatc.gemm(_device(a2, "row"), _device(b2, "col"))
    a2v, b2v = a2.astype(np.float64), b2.astype(np.float64)
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    _close(got, a2v @ b2v, np.abs(a2v) @ np.abs(b2v) + 1, 2.0**-8)
    err = capsys.readouterr().err
    assert "split-K, 2 slices of 128 (128x128x64_4s_w1_tma)" in err, err


def _blockwise_reference(a, w, sa, sb):
    """a @ w.T with DeepGEMM's blockwise scales, in float64: (value, magnitude)."""
    av, wv = a.astype(np.float64), w.astype(np.float64)
    m, n = av.shape[0], wv.shape[0]
    ref, mag = np.zeros((m, n)), np.zeros((m, n))
    for kb in range(sa.shape[1]):
        ks = slice(128 * kb, 128 * kb + 128)
        f = sa[:, kb, None] * np.repeat(sb[:, kb], 128)[None, :n]
        ref += f * (av[:, ks] @ wv[:, ks].T)
        mag += f * (np.abs(av[:, ks]) @ np.abs(wv[:, ks].T))
    return ref, mag


@pytest.mark.parametrize("m, n, k, forced, split, out_dtype, sa_layout", [
    (70, 136, 528, None, None, "bfloat16", "row"),           # the 64-row tiles, 5 K blocks
    (70, 136, 528, None, "2", "bfloat16", "col"),            # split K: each slice's blocks
    (260, 264, 400, "fp8_128x128x128_6s_pt_tma_ts", None, "bfloat16", "col"),  # ragged K block
    (260, 264, 400, "fp8_128x128x128_6s_pt_tma_ts", None, "float32", "row"),   # direct twin
])
def test_fp8_blockwise_scales(m, n, k, forced, split, out_dtype, sa_layout, monkeypatch,
                              capsys):
    """FP8 with blockwise scales (numbatc.gemm_api.FP8_BLOCK): each k tile's product scaled by
    a's row scale and b's 128 x 128 block scale of its K block, through numbatc.gemm; scales
    drawn from [0.5, 2] per block, so a scale applied to the wrong block or row shows."""
    import numbatc

    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    if forced:
        monkeypatch.setenv("NUMBATC_GEMM_KERNEL", f"sm90:{forced}")
    if split:
        monkeypatch.setenv("NUMBATC_SPLIT_K", split)
    gen = np.random.default_rng()
    a = (gen.standard_normal((m, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
    w = (gen.standard_normal((n, k)) * 2).astype(ml_dtypes.float8_e4m3fn)
    kb, nb = -(-k // 128), -(-n // 128)
    sa = gen.uniform(0.5, 2, (m, kb)).astype(np.float32)
    sb = gen.uniform(0.5, 2, (nb, kb)).astype(np.float32)
    dsa = cuda.to_device(sa) if sa_layout == "row" else cuda.to_device(
        np.ascontiguousarray(sa.T)).T  # M-major, as DeepGEMM keeps it
    out = numbatc.gemm(_device(a, "row"), _device(w.T, "col"), scale_a=dsa,
                       scale_b=cuda.to_device(sb), out_dtype=out_dtype)
    got = out.copy_to_host()
    got = (got.view(ml_dtypes.bfloat16) if out_dtype == "bfloat16" else got).astype(np.float64)
    ref, mag = _blockwise_reference(a, w, sa, sb)
    _close(got, ref, mag, 2.0**-8 if out_dtype == "bfloat16" else 2.0**-20)
    err = capsys.readouterr().err
    want = forced.removesuffix("_ts") if out_dtype == "float32" else (
        forced or "fp8_64x128x128_8s_pt_tma")
    assert f"sm90_gemm {want} a=" in err, err
    if split:
        assert "split-K, 2 slices of 384" in err, err
