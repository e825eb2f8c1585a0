"""The Hopper GEMM (numbatc/kernels/sm90_gemm.py) on the GPU, each configuration forced through
NUMBATC_GEMM_KERNEL=sm90:<config>, through numbatc.gemm, with the same float64 checks as
tests/gpu/test_gemm_gpu.py (which runs whatever the heuristic picks: sm90_gemm on an H100/H200 for
M > 64)."""

import numpy as np
import pytest

from tests.helpers.gemm import check

pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.hardware_only]


@pytest.fixture(params=["sm90:128x128x64_4s", "sm90:128x128x64_4s_w1", "sm90:128x256x64_4s_w1",
                        "sm90:128x256x64_4s", "sm90:128x256x64_4s_pt",
                        "sm90:128x256x64_4s_w1_pt"])
def sm90(request, monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", request.param)
    return request.param


@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")],
                         ids=lambda l: "".join(x[0] for x in l))
def test_sm90_shapes(sm90, layouts):
    for m, n, k in [(128, 256, 64), (130, 136, 72), (1, 8, 8), (1000, 1000, 1000), (257, 511, 129),
                    (385, 264, 1031)]:
        check(m, n, k, "bfloat16", *layouts)
        check(m, n, k, "float16", *layouts, out_dtype="float32")


def test_sm90_epilogue(sm90):
    for activation in (None, "relu", "gelu", "silu"):
        check(77, 300, 200, "bfloat16", alpha=0.5, beta=1.5, with_c=True, with_bias=True,
              activation=activation)


@pytest.mark.parametrize("config", ["sm90:128x256x64_4s_pt", "sm90:128x256x64_4s_w1_pt"])
def test_sm90_persistent_walks_tiles(config, monkeypatch):
    """More tiles (17 x 18 = 306, ragged on every side) than the H200 has SMs (132): every block
    of a persistent configuration walks two or three tiles, its stage counter running on."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    check(2056, 4360, 136, "bfloat16", "row", "row")
    check(2056, 4360, 136, "float16", "col", "col", out_dtype="float32", with_bias=True,
          activation="gelu")


# ---------------------------------------------------------------------------------------------
# The TMA producer (numbatc.kernels.sm90_gemm_tma), each configuration forced.  A tensor map
# needs 16-byte leading dimensions, so the shapes are ragged in every dimension that is not an
# operand's leading one (the others are multiples of 8 elements); NUMBATC_PRINT_CONFIG proves
# that the TMA kernel ran, not its cp.async fallback.
# ---------------------------------------------------------------------------------------------

TMA = ["sm90:128x256x64_4s_tma", "sm90:128x128x64_4s_w1_tma", "sm90:128x256x64_4s_w1_tma",
       "sm90:128x256x64_4s_pt_tma", "sm90:128x256x64_4s_w1_pt_tma",
       # the ping-pong schedule (each consumer warpgroup on whole tiles of its own, taking turns;
       # its TMA store form is in TMA_STORE: float32 outs here take the direct-store twin)
       "sm90:128x128x64_5s_pp_tma", "sm90:128x128x64_5s_w1_pp_tma"]
BASE = [(1, 8, 8), (130, 136, 72), (257, 511, 129), (385, 264, 1031), (1000, 1000, 1000),
        (64, 8, 4096)]


def _up8(x):
    return -(-x // 8) * 8


def tma_shapes(a_layout, b_layout):
    """BASE with each operand's leading dimension rounded up to a multiple of 8: a 'row' (M, K)
    has K, a 'col' one M; b 'row' (K, N) has N, b 'col' K."""
    out = []
    for m, n, k in BASE:
        if a_layout == "col":
            m = _up8(m)
        if a_layout == "row" or b_layout == "col":
            k = _up8(k)
        if b_layout == "row":
            n = _up8(n)
        out.append((m, n, k))
    return out


@pytest.fixture(params=TMA)
def sm90_tma(request, monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", request.param)
    return request.param


def _ran_tma(capsys, config):
    err = capsys.readouterr().err
    name = config.partition(":")[2]
    assert f"sm90_gemm {name} " in err and f"not {name}" not in err, err


LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda l: "".join(x[0] for x in l))
def test_sm90_tma_shapes(sm90_tma, layouts, monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for m, n, k in tma_shapes(*layouts):
        check(m, n, k, "bfloat16", *layouts)
        check(m, n, k, "float16", *layouts, out_dtype="float32")
    _ran_tma(capsys, sm90_tma)


@pytest.mark.parametrize("config", ["sm90:128x256x64_4s_pt_tma", "sm90:128x128x64_4s_w1_tma",
                                    "sm90:128x128x64_5s_w1_pp_tma"])
def test_sm90_tma_epilogue(config, monkeypatch, capsys):
    """alpha, beta * c, bias and each activation, K-major and MN-major b (a persistent and a
    one-tile-per-block configuration: the epilogue is the cp.async kernels')."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for activation in (None, "relu", "gelu", "silu"):
        check(77, 304, 200, "bfloat16", alpha=0.5, beta=1.5, with_c=True, with_bias=True,
              activation=activation)
        check(77, 301, 200, "float16", "row", "col", out_dtype="float32", with_c=True,
              with_bias=True, activation=activation)
    _ran_tma(capsys, config)


def test_sm90_tma_warm_calls(sm90_tma):
    """The warm path (no NUMBATC_PRINT_CONFIG): the relaunch function builds (or finds) the
    tensor maps of each call's new operands -- fresh inputs every call, three calls a shape."""
    for shape, layouts in (((1000, 1000, 1000), ("row", "row")), ((136, 264, 200), ("col", "col")),
                           ((257, 520, 136), ("row", "col"))):
        for _ in range(3):
            check(*shape, "bfloat16", *layouts)


def test_sm90_tma_falls_back_for_unaligned_operands(monkeypatch, capsys):
    """K = 129 bf16: a's rows are 258 bytes, which a tensor map cannot describe: the cp.async
    twin runs (on packed copies) and NUMBATC_PRINT_CONFIG names it and why."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x256x64_4s_pt_tma")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check(130, 136, 129, "bfloat16", "row", "row")
    err = capsys.readouterr().err
    assert "sm90_gemm 128x256x64_4s_pt, not 128x256x64_4s_pt_tma: a not 16-byte aligned" in err


@pytest.mark.parametrize("splits", ["2", "5"])
@pytest.mark.parametrize("config", ["sm90:128x256x64_4s_w1_tma", "sm90:128x128x64_4s_w1_tma",
                                    "sm90:128x256x64_4s_pt_tma"])
def test_sm90_tma_split_k(config, splits, monkeypatch, capsys):
    """Split-K forced: each slice's boxes start at its first k (whole k tiles), the last slice's
    zero fill ends the sum; c + bias + gelu through the last block; twice per shape on one
    workspace (the counters reset)."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    monkeypatch.setenv("NUMBATC_SPLIT_K", splits)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for m, n, k, layouts in ((1, 4096, 4096, ("row", "row")), (16, 1000, 3000, ("row", "col")),
                             (200, 520, 1096, ("col", "row")), (64, 8, 1000, ("col", "col"))):
        for _ in range(2):
            check(m, n, k, "bfloat16", *layouts, beta=0.5, with_c=True, with_bias=True,
                  activation="gelu")
    err = capsys.readouterr().err
    assert "split-K" in err and "_tma" in err and "not " not in err, err


@pytest.mark.parametrize("config", ["sm90:128x256x64_4s_pt_tma", "sm90:128x256x64_4s_w1_pt_tma",
                                    "sm90:128x128x64_5s_pp_tma",
                                    "sm90:128x128x64_4s_w1_pp_tma_ts"])
def test_sm90_tma_persistent_walks_tiles(config, monkeypatch):
    """306 tiles, ragged on every side a tensor map allows, over 132 blocks."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    check(2053, 4360, 136, "bfloat16", "row", "row")
    check(2056, 4353, 136, "float16", "col", "col", out_dtype="float32", with_bias=True,
          activation="gelu")


# The TMA store epilogue (store="tma", the _ts names): bf16 / f16 row-major outs through the
# staging tile and TMA stores on inside tiles, direct stores on edge tiles.
TMA_STORE = ["sm90:128x256x64_3s_pt_tma_ts", "sm90:128x256x64_3s_w1_pt_tma_ts",
             "sm90:128x128x64_4s_w1_pt_tma_ts", "sm90:128x128x64_4s_w1_pp_tma_ts"]


@pytest.mark.parametrize("config", TMA_STORE)
def test_sm90_tma_store(config, monkeypatch, capsys):
    """Every layout pair and both 16-bit dtypes (out = the input dtype), the fused epilogue
    (c read before the tile's stores), 306 persistent tiles ragged on every side (inside tiles
    reuse the staging tile, edge tiles store directly); then outs the TMA store cannot write
    (float32, a row pitch not a multiple of 16 bytes) run the direct-store twin and say so."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for layouts in LAYOUTS:
        for m, n, k in tma_shapes(*layouts):
            n = _up8(n)  # out's rows: 16-byte multiples
            check(m, n, k, "bfloat16", *layouts)
            check(m, n, k, "float16", *layouts)
    for activation in (None, "gelu"):
        check(300, 520, 200, "bfloat16", alpha=0.5, beta=1.5, with_c=True, with_bias=True,
              activation=activation)
    check(2053, 4360, 136, "bfloat16", "row", "col")
    check(2056, 4352, 264, "float16", "col", "row", with_bias=True, activation="silu")
    _ran_tma(capsys, config)
    name = config.partition(":")[2]
    check(257, 520, 136, "bfloat16", "row", "col", out_dtype="float32")
    check(257, 517, 136, "bfloat16", "row", "col")
    err = capsys.readouterr().err
    assert f"not {name}: out is float32" in err and f"not {name}: out not 16-byte" in err, err


def test_sm90_tma_store_user_epilogue_and_fp8(monkeypatch):
    """A user epilogue (residual add and per-column scale after bias + GELU) into a bf16 out
    through the TMA store epilogue, and FP8 e4m3 (per-tensor scales) on its _ts config."""
    from numba import cuda

    import numbatc
    from tests.helpers.gemm import reference, residual_scale, rng, to_device, to_host, values
    from tests.helpers.gemm_fp8 import FP8, torch
    from tests.helpers.gemm_fp8 import check as fp8_check

    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x256x64_3s_pt_tma_ts")
    gen = rng()
    for m, n, k in [(256, 512, 96), (129, 264, 64)]:
        a, b = values((m, k), "bfloat16"), values((k, n), "bfloat16")
        bias = values((n,), "bfloat16")
        res = gen.standard_normal((m, n)).astype(np.float32)
        scale = gen.standard_normal(n).astype(np.float32)
        out = to_device(np.full((m, n), np.nan), "bfloat16", "row", "numba")
        numbatc.gemm(to_device(a, "bfloat16", "row", "numba"),
                     to_device(b, "bfloat16", "col", "numba"),
                     bias=to_device(bias[None, :], "bfloat16", "row", "numba")[0], out=out,
                     activation="gelu", epilogue=residual_scale,
                     epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
        cuda.synchronize()
        got = to_host(out, "bfloat16")
        ref, scale_ref = reference(a, b, 1.0, 0.0, None, bias, "gelu")
        ref = ref * scale + res
        tol = 2.0**-8 * np.abs(ref) + (k * 2.0**-22 + 2.0**-20) * scale_ref * np.abs(scale) + 1e-5
        assert np.all(np.abs(got - ref) <= tol), np.nanmax(np.abs(got - ref))
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:fp8_128x256x128_3s_pt_tma_ts")
    g = torch.Generator(device="cuda")
    g.seed()
    for m, n, k in [(1000, 520, 1040), (2056, 4360, 272)]:
        a = (torch.randn(m, k, generator=g, device="cuda") * 2).to(FP8["e4m3"])
        w = (torch.randn(n, k, generator=g, device="cuda") * 2).to(FP8["e4m3"])
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        numbatc.gemm(a, w.T, out=out, scale_a=0.5, scale_b=0.25)
        torch.cuda.synchronize()
        av, wv = a.double(), w.double()
        fp8_check(out, av @ wv.T * 0.125, av.abs() @ wv.abs().T * 0.125, "bfloat16")


FP8_TMA = ["sm90:fp8_128x256x128_4s_w1_tma", "sm90:fp8_128x128x128_4s_w1_tma",
           "sm90:fp8_128x256x128_4s_pt_tma"]


@pytest.mark.parametrize("config", FP8_TMA)
def test_sm90_tma_fp8(config, monkeypatch, capsys):
    """FP8 per-tensor scales on the TMA producer (K-major boxes of 128 one-byte values): ragged
    M and N, K a multiple of 16 (a tensor map's rows), M = 1, e4m3 x e5m2, the fused epilogue,
    every output dtype; split-K twice per shape."""
    from tests.helpers.gemm_fp8 import FP8, OUT, activate, torch
    from tests.helpers.gemm_fp8 import check as fp8_check

    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = torch.Generator(device="cuda")
    gen.seed()

    def operand(rows, k, t):
        x = (torch.randn(rows, k, generator=gen, device="cuda") * 2).to(FP8[t])
        return x, x.double()

    import numbatc

    cases = [(1000, 520, 1040, "e4m3", "e4m3", "bfloat16", None),
             (257, 129, 112, "e5m2", "e4m3", "float16", "gelu"),
             (1, 200, 4096, "e4m3", "e5m2", "float32", None),
             (2056, 4360, 272, "e4m3", "e5m2", "bfloat16", "relu"),
             (130, 136, 80, "e5m2", "e5m2", "float32", None)]
    for m, n, k, a_t, b_t, out_dtype, epilogue in cases:
        a, av = operand(m, k, a_t)
        w, wv = operand(n, k, b_t)
        out = torch.full((m, n), float("nan"), dtype=OUT[out_dtype], device="cuda")
        kw = {}
        ref = av @ wv.T * (0.5 * 0.25)
        if epilogue:
            c = torch.randn(m, n, generator=gen, device="cuda").to(OUT[out_dtype])
            bias = torch.randn(n, generator=gen, device="cuda").to(torch.float32)
            kw = dict(c=c, beta=0.5, bias=bias, activation=epilogue)
            ref = activate(ref + 0.5 * c.double() + bias.double(), epilogue)
        numbatc.gemm(a, w.T, out=out, scale_a=0.5, scale_b=0.25, **kw)
        torch.cuda.synchronize()
        fp8_check(out, ref, av.abs() @ wv.abs().T * (0.5 * 0.25), out_dtype)
    _ran_tma(capsys, config)
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    for m, n, k in [(1, 4096, 4096), (16, 1000, 3008), (200, 520, 1104)]:
        for _ in range(2):
            a, av = operand(m, k, "e4m3")
            w, wv = operand(n, k, "e4m3")
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            numbatc.gemm(a, w.T, out=out, scale_a=0.5, scale_b=2.0)
            torch.cuda.synchronize()
            fp8_check(out, av @ wv.T, av.abs() @ wv.abs().T, "bfloat16")
    err = capsys.readouterr().err
    assert "split-K, 3 slices" in err and "not fp8" not in err, err


def test_sm90_tma_user_epilogue(monkeypatch):
    """A user epilogue (residual add and per-column scale) after bias + GELU on the TMA
    producer, persistent and split-K (the last shape: M = 2)."""
    from numba import cuda

    import numbatc
    from tests.helpers.gemm import reference, residual_scale, rng, to_device, to_host, values

    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x256x64_4s_pt_tma")
    gen = rng()
    for m, n, k in [(129, 257, 96), (64, 64, 64), (2, 300, 1504)]:
        a, b = values((m, k), "bfloat16"), values((k, n), "bfloat16")
        bias = values((n,), "bfloat16")
        res = gen.standard_normal((m, n)).astype(np.float32)
        scale = gen.standard_normal(n).astype(np.float32)
        out = cuda.to_device(np.full((m, n), np.nan, np.float32))
        numbatc.gemm(to_device(a, "bfloat16", "row", "numba"), to_device(b, "bfloat16", "col", "numba"),
                     bias=to_device(bias[None, :], "bfloat16", "row", "numba")[0], out=out,
                     activation="gelu", epilogue=residual_scale,
                     epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
        cuda.synchronize()
        got = to_host(out, "float32")
        ref, scale_ref = reference(a, b, 1.0, 0.0, None, bias, "gelu")
        ref = ref * scale + res
        tol = (k * 2.0**-22 + 2.0**-20) * scale_ref * np.abs(scale) + 1e-5
        assert np.all(np.abs(got - ref) <= tol), np.nanmax(np.abs(got - ref))


def test_sm90_tma_default_switch(monkeypatch, capsys):
    """sm90_gemm.DEFAULT_PRODUCER = "tma": the heuristic's choices run as their _tma twins (small
    problems on the TMA-only small tiles, split-K among them), unaligned operands as the
    cp.async ones."""
    from numbatc.kernels import sm90_gemm

    monkeypatch.setattr(sm90_gemm, "DEFAULT_PRODUCER", "tma")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for m, n, k, layouts, want in [
            # M > 16 under two waves of 128 x 256 tiles: sm90_gemm.small_tile's tiles
            # M >= 256: their TMA store forms (sm90_gemm.MID_TILES)
            (1000, 1000, 1000, ("row", "row"), "sm90_gemm 64x128x64_6s_w1_tma_ts a="),
            (520, 128, 136, ("col", "col"), "sm90_gemm 64x128x64_6s_w1_tma_ts a="),
            (64, 4096, 14336, ("row", "col"), "slices of 7168 (64x128x64_6s_w1_tma)"),
            (4096, 4096, 512, ("row", "col"), "sm90_gemm 128x256x64_3s_pt_tma_ts a="),
            (300, 300, 301, ("row", "row"), "sm90_gemm 128x256x64_4s_pt, not 128x256x64_4s_pt_tma")]:
        check(m, n, k, "bfloat16", *layouts)
        err = capsys.readouterr().err
        assert want in err, err


def _blockwise_reference(a, w, sa, sb):
    """(a @ w.T with DeepGEMM's blockwise scales, the same over |a| and |w|) in float64."""
    import torch

    m, k = a.shape
    n = w.shape[0]
    av, wv = a.double(), w.double()
    ref = torch.zeros(m, n, dtype=torch.float64, device=a.device)
    mag = torch.zeros_like(ref)
    for j in range(-(-k // 128)):
        ks = slice(128 * j, 128 * j + 128)
        f = sa.double()[:, j, None] * sb.double()[:, j].repeat_interleave(128)[None, :n]
        ref += f * (av[:, ks] @ wv[:, ks].T)
        mag += f * (av[:, ks].abs() @ wv[:, ks].abs().T)
    return ref, mag


@pytest.mark.parametrize("config", ["", "sm90:fp8_128x128x128_6s_pt_tma_ts",
                                    "sm90:fp8_128x128x128_6s_pt_tma"])
def test_sm90_fp8_blockwise(config, monkeypatch, capsys):
    """FP8 with DeepGEMM's blockwise scales (float32 scale_a per row and 128 K values, M-major
    as DeepGEMM keeps it, and row-major; scale_b per 128 x 128 block of b), against a float64
    reference that applies each K block's scales: ragged M, N and K blocks, e4m3 x e5m2, every
    output dtype, a fused epilogue, persistent tiles walked over 132 SMs, and split K."""
    import numbatc
    from tests.helpers.gemm_fp8 import FP8, OUT, activate, torch
    from tests.helpers.gemm_fp8 import check as fp8_check

    if config:
        monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    g = torch.Generator(device="cuda")
    g.seed()

    def operands(m, n, k, a_t="e4m3", b_t="e4m3"):
        a = (torch.randn(m, k, generator=g, device="cuda") * 2).to(FP8[a_t])
        w = (torch.randn(n, k, generator=g, device="cuda") * 2).to(FP8[b_t])
        sa = torch.rand(m, -(-k // 128), generator=g, device="cuda") * 1.5 + 0.5
        sb = torch.rand(-(-n // 128), -(-k // 128), generator=g, device="cuda") * 1.5 + 0.5
        return a, w, sa, sb

    cases = [(1000, 520, 1040, "e4m3", "e4m3", "bfloat16", None, "col"),
             (257, 136, 112, "e5m2", "e4m3", "float16", "gelu", "row"),
             (1, 4096, 7168, "e4m3", "e4m3", "bfloat16", None, "col"),
             (2056, 4352, 528, "e4m3", "e5m2", "float32", "relu", "col"),
             (4096, 7168, 2048, "e4m3", "e4m3", "bfloat16", None, "col")]
    for m, n, k, a_t, b_t, out_dtype, epilogue, sa_layout in cases:
        a, w, sa, sb = operands(m, n, k, a_t, b_t)
        dsa = sa if sa_layout == "row" else sa.T.contiguous().T
        out = torch.full((m, n), float("nan"), dtype=OUT[out_dtype], device="cuda")
        ref, mag = _blockwise_reference(a, w, sa, sb)
        kw = {}
        if epilogue:
            c = torch.randn(m, n, generator=g, device="cuda").to(OUT[out_dtype])
            bias = torch.randn(n, generator=g, device="cuda").to(torch.float32)
            kw = dict(c=c, beta=0.5, bias=bias, activation=epilogue)
            ref = activate(ref + 0.5 * c.double() + bias.double(), epilogue)
        numbatc.gemm(a, w.T, out=out, scale_a=dsa, scale_b=sb, **kw)
        torch.cuda.synchronize()
        fp8_check(out, ref, mag, out_dtype)
    err = capsys.readouterr().err
    assert "fp8_" in err and "_pt_tma" in err, err
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    for m, n, k in [(16, 1024, 3072), (200, 520, 1104)]:
        a, w, sa, sb = operands(m, n, k)
        out = numbatc.gemm(a, w.T, scale_a=sa, scale_b=sb)
        torch.cuda.synchronize()
        fp8_check(out, *_blockwise_reference(a, w, sa, sb), "bfloat16")
    assert "split-K, 3 slices" in capsys.readouterr().err
