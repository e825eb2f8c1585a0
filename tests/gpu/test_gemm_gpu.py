"""numbatc.gemm on the GPU against a float64 reference: hundreds of shapes (random, primes, 1,
tile edges, tall and skinny), both layouts of each operand, both dtypes, float32 output, each
activation, beta * c and bias, each array library; outputs poisoned (NaN) before every call,
fresh random data every run.

Tolerance: |out - ref| <= r_out * |ref| + (K * 2**-22 + 2**-20) * scale + s_out, where ref is
computed in float64 from the exactly representable inputs, scale = |alpha| (|A| @ |B|) + |beta c|
+ |bias|, r_out is the output format's relative rounding (2**-8 bf16, 2**-11 f16, 0 for f32) and
s_out half its subnormal spacing (2**-25 for f16): the fp32 accumulator loses at most a few ulps
per add, the final rounding half an ulp of the output.  (The reference, the tolerance and
``check``: tests/helpers/gemm.py.)
"""

import numpy as np
import pytest
from numba import cuda

import numbatc
from tests.helpers.gemm import check, reference, residual_scale, rng, to_device, to_host, values

pytestmark = pytest.mark.gpu(cc=(8, 0))

# Shapes: tile edges (64, 128, 256 and +-1), primes, 1, tall/skinny, random.
EDGE = [1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
PRIMES = [3, 5, 11, 13, 37, 61, 97, 101, 131, 257, 509]


def _shapes(count, seed_shapes):
    gen = rng()
    shapes = list(seed_shapes)
    while len(shapes) < count:
        pool = EDGE + PRIMES + list(gen.integers(1, 600, 8))
        shapes.append(tuple(int(gen.choice(pool)) for _ in range(3)))
    return shapes


FIXED = [(1, 1, 1), (1, 4096, 64), (4096, 1, 64), (2048, 8, 8), (8, 2048, 1024), (129, 257, 511),
         (256, 256, 256), (512, 768, 1024), (1000, 1000, 1000), (17, 5000, 33)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")],
                         ids=lambda l: "".join(x[0] for x in l))
def test_many_shapes(dtype, layouts):
    """40 shapes per (dtype, layout pair): 320 problems in all."""
    for m, n, k in _shapes(40, FIXED):
        check(m, n, k, dtype, *layouts)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_epilogue(activation):
    for m, n, k in [(77, 129, 65), (256, 128, 96), (5, 300, 17)]:
        check(m, n, k, "bfloat16", alpha=0.75, beta=-1.25, with_c=True, with_bias=True,
              activation=activation)
        check(m, n, k, "float16", "col", "col", out_dtype="float32", alpha=2.0, beta=0.5,
              with_c=True, with_bias=True, activation=activation)


def test_float32_output_and_allocated_result():
    for m, n, k in [(100, 200, 300), (1, 33, 7), (300, 2, 129)]:
        check(m, n, k, "bfloat16", out_dtype="float32", poisoned_out=False)
        check(m, n, k, "float16", "col", "row", out_dtype="float32")


@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_other_libraries(lib):
    pytest.importorskip(lib)
    # CuPy has no bfloat16 dtype: its arrays are checked in float16 (a bf16 case would skip the
    # whole test, as it did until 2026-12-03, leaving CuPy unchecked)
    for dtype in ("float16",) if lib == "cupy" else ("bfloat16", "float16"):
        for layouts in [("row", "row"), ("col", "row"), ("row", "col")]:
            for m, n, k in [(129, 65, 97), (1, 512, 256), (256, 256, 64)]:
                check(m, n, k, dtype, *layouts, lib=lib, with_bias=True, activation="relu")


def test_torch_result_type_and_stream():
    torch = pytest.importorskip("torch")
    a = torch.randn(200, 300, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(300, 100, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = numbatc.gemm(a, b)
        ref = (a.double() @ b.double())
    s.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (200, 100)
    err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < 2e-2, err


def test_misaligned_leading_dimensions():
    """Rows that are not 16-byte aligned (odd K, N) take the narrow copy paths."""
    for m, n, k in [(33, 35, 37), (64, 130, 66), (5, 7, 9), (128, 129, 131)]:
        for layouts in [("row", "row"), ("col", "col")]:
            check(m, n, k, "bfloat16", *layouts)


@pytest.mark.parametrize("lib", ["numba", "torch"])
def test_user_epilogue(lib):
    """A user epilogue (residual add and per-column scale) on top of bias + GELU."""
    if lib == "torch":
        pytest.importorskip("torch")
    gen = rng()
    for m, n, k in [(129, 257, 96), (64, 64, 64), (3, 500, 17), (2, 300, 1500)]:  # last: split-K
        a, b = values((m, k), "bfloat16"), values((k, n), "bfloat16")
        bias = values((n,), "bfloat16")
        res = gen.standard_normal((m, n)).astype(np.float32)
        scale = gen.standard_normal(n).astype(np.float32)
        out = numbatc.gemm(to_device(a, "bfloat16", "row", lib), to_device(b, "bfloat16", "col", lib),
                           bias=to_device(bias[None, :], "bfloat16", "row", lib)[0],
                           activation="gelu", out_dtype="float32", epilogue=residual_scale,
                           epilogue_args=(cuda.to_device(res), cuda.to_device(scale)))
        cuda.synchronize()
        got = to_host(out, "float32")
        ref, scale_ref = reference(a, b, 1.0, 0.0, None, bias, "gelu")
        ref = ref * scale + res
        tol = (k * 2.0**-22 + 2.0**-20) * scale_ref * np.abs(scale) + 1e-5
        assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref))


@pytest.mark.parametrize("splits", [None, "2", "7", "16"])
def test_split_k_decode_shapes(splits, monkeypatch):
    """Small M (split-K in sm80_gemm, and in sm90_gemm for 64 < M <= 256 on compute capability
    9.0: each K slice's partial tile to a workspace, the last block of a tile
    sums them and runs the epilogue): the heuristic's choice and forced slice counts (7 and 16
    leave a short last slice), every layout pair, c + bias + activation, f16; six calls per
    shape on one workspace (the tile counters must be back at zero after each launch)."""
    if splits:
        monkeypatch.setenv("NUMBATC_SPLIT_K", splits)
    # the last two: M > 64, sm90_gemm's split-K form on an H100/H200
    for m, n, k in [(1, 4096, 4096), (16, 1000, 3000), (5, 136, 1100), (64, 520, 2047),
                    (33, 8, 4096), (128, 2048, 2048), (200, 520, 3000)]:
        for layouts in [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]:
            check(m, n, k, "bfloat16", *layouts)
        check(m, n, k, "float16", "row", "col", out_dtype="float32", beta=0.5, with_c=True,
              with_bias=True, activation="gelu")
        check(m, n, k, "bfloat16", "row", "row", alpha=2.0, with_bias=True, activation="relu")


def test_split_k_beyond_decode_sizes(monkeypatch):
    """Split-K forced on the portable kernel for M > 64 (128-row tiles, several tile rows): the
    form the heuristic may pick for M = 128 / 256 on shapes that cannot fill the GPU."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm80")
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    for m, n, k in [(130, 300, 2000), (256, 1000, 4096)]:
        check(m, n, k, "bfloat16", "row", "row")
        check(m, n, k, "float16", "col", "col", out_dtype="float32", beta=0.5, with_c=True,
              with_bias=True, activation="silu")


def _sm80_names():
    from numbatc.kernels import sm80_gemm

    return sorted(sm80_gemm.CONFIGS)


@pytest.mark.parametrize("name", _sm80_names())
def test_every_sm80_config(name, monkeypatch):
    """Each portable configuration forced by name (the prefetching k loop's twins included):
    K of one partial k tile, exactly one, two and many (the prefetch's first and last steps),
    edges of M and N around the 16 / 64 / 128 / 256 tiles, every layout pair, both dtypes, and
    the full epilogue.  A configuration this GPU cannot fit is refused by name (ValueError)."""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", f"sm80:{name}")
    layouts = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
    try:
        check(1, 8, 8, "bfloat16")
    except ValueError as e:
        pytest.skip(f"{name} does not fit this GPU: {e}")
    for i, (m, n, k) in enumerate([(17, 129, 17), (129, 257, 64), (64, 256, 65), (255, 300, 129),
                                   (300, 520, 1000), (16, 1000, 2047), (1, 136, 4096)]):
        check(m, n, k, ("bfloat16", "float16")[i % 2], *layouts[i % 4])
    check(129, 257, 511, "float16", "col", "row", out_dtype="float32", alpha=0.5, beta=-2.0,
          with_c=True, with_bias=True, activation="gelu")
