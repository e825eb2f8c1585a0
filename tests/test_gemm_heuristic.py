"""The Hopper GEMM heuristic for problems too small for the persistent 128 x 256 tiles
(numbatc.kernels.dispatch._small_tile / _small_split): which tile, when split-K, and the
cp.async / sm80 fallbacks where a tensor map cannot describe an operand.  CPU only: the choice
is host code on a stand-in problem."""
from types import SimpleNamespace

import pytest

from numbatc.kernels import dispatch, sm90_gemm


def _problem(m, n, k, alignment=16):
    op = SimpleNamespace(alignment=alignment)
    return SimpleNamespace(m=m, n=n, k=k, a=op, b=SimpleNamespace(alignment=alignment),
                           cc=(9, 0), block_scaled=None)


@pytest.mark.parametrize("m, n, k, name", [
    (8, 4096, 4096, None),                       # M <= 16: sm80_gemm's 16-row tiles
    (32, 4096, 4096, "64x128x64_6s_w1_tma"),     # 64 tiles of 64 x 128: one wave
    (128, 4096, 4096, "64x128x64_6s_w1_tma"),    # 128 tiles: still one wave
    (256, 8192, 8192, "64x256x64_4s_w1_tma"),    # 64 x 128 would take two waves
    (64, 28672, 4096, "64x256x64_4s_w1_tma"),    # 112 tiles of 64 x 256: one wave
    (128, 57344, 8192, "128x256x64_4s_w1_tma"),  # 224 tiles of 128 x 256, under two waves
    (4096, 4096, 4096, None),                    # 512 tiles of 128 x 256: the persistent ones
    (512, 57344, 8192, None),
    (1000, 1000, 1000, None),                    # M > 512: past the fitted range
])
def test_small_tile_choice(m, n, k, name):
    assert dispatch._small_tile(_problem(m, n, k)) == name
    if name is not None:
        cfg = sm90_gemm.CONFIGS[name]
        assert cfg.producer == "tma"
        # the choice is the least of the fitted costs, and every candidate is a real config
        assert {c for c, *_ in dispatch._SMALL_TILES} <= set(sm90_gemm.CONFIGS)


def test_small_tiles_need_tensor_maps():
    # an operand a tensor map cannot describe: no TMA-only tile, the old choice instead
    assert dispatch._small_tile(_problem(8, 4096, 4096, alignment=8)) is None
    assert dispatch._small_tile(_problem(8, 4096, 0)) is None
    family, cfg = dispatch._kernel_family(_problem(32, 4096, 4096, alignment=8))
    assert family.__name__.endswith("sm80_gemm")
    family, cfg = dispatch._kernel_family(_problem(128, 4096, 4096, alignment=8))
    assert family.__name__.endswith("sm90_gemm") and cfg.producer == "cp.async"


def test_kernel_family_takes_the_small_tiles_on_hopper():
    family, cfg = dispatch._kernel_family(_problem(32, 4096, 4096))
    assert family.__name__.endswith("sm90_gemm") and cfg.name == "64x128x64_6s_w1_tma"
    family, cfg = dispatch._kernel_family(_problem(8, 4096, 4096))
    assert family.__name__.endswith("sm80_gemm")
    for shape, name in (((4096, 4096, 4096), "128x256x64_4s_pt_tma"),
                        # tests/gpu/test_sm90_gemm_gpu.py::test_sm90_tma_default_switch's cases
                        ((1000, 1000, 1000), "128x256x64_4s_pt_tma"),
                        ((520, 128, 136), "128x128x64_4s_w1_tma"),
                        ((64, 4096, 14336), "64x128x64_6s_w1_tma"),
                        ((4096, 4096, 512), "128x256x64_4s_pt_tma")):
        family, cfg = dispatch._kernel_family(_problem(*shape))
        assert family.__name__.endswith("sm90_gemm") and cfg.name == name, (shape, cfg.name)


def test_forced_tma_only_config_with_unaligned_operands_is_an_error(monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:64x128x64_6s_w1_tma")
    with pytest.raises(ValueError, match="TMA only"):
        dispatch._kernel_family(_problem(8, 4096, 4096, alignment=8))


@pytest.mark.parametrize("m, n, k, splits", [
    (32, 4096, 14336, 2),    # 32 tiles, 224 k tiles: two slices
    (128, 4096, 14336, 2),
    (32, 4096, 4096, 1),     # K too short
    (64, 8192, 28672, 2),    # 64 tiles: half the GPU
    (128, 8192, 28672, 1),   # 128 tiles: all of it
])
def test_small_split(m, n, k, splits):
    p = _problem(m, n, k)
    cfg = sm90_gemm.CONFIGS[dispatch._small_tile(p)]
    got, chunk = dispatch._small_split(cfg, p)
    assert got == splits
    assert chunk % cfg.bk == 0 and got * chunk >= k and (got - 1) * chunk < k
    # configurations outside the small-tile set keep the general split rule
    assert dispatch._small_split(sm90_gemm.CONFIGS["128x256x64_4s_pt_tma"], p) is None
