"""The Hopper GEMM (numbatc/kernels/sm90_gemm.py) on the GPU, each configuration forced through
NUMBATC_GEMM_KERNEL=sm90:<config>, through numbatc.gemm, with the same float64 checks as
tests/gpu/test_gemm_gpu.py (which runs whatever the heuristic picks: sm90_gemm on an H100/H200 for
M > 64)."""

import pytest

from tests.gpu.test_gemm_gpu import check

pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.hardware_only]


@pytest.fixture(params=["sm90:128x256x64_4s_c2", "sm90:128x256x64_4s_w1_pf", "sm90:128x128x64_4s",
                        "sm90:128x256x64_4s_w1", "sm90:128x256x64_4s", "sm90:128x256x64_4s_pt",
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
