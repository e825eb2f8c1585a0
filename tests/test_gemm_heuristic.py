"""The Hopper GEMM heuristic for problems too small for the persistent 128 x 256 tiles
(numbatc.kernels.sm90_gemm.small_tile / small_split) and the dispatch table's walk
(numbatc.kernels.dispatch.choose): which tile, when split-K, and the cp.async / sm80 fallbacks
where a tensor map cannot describe an operand.  CPU only: the choice is host code on a
stand-in problem."""
import pytest

from numbatc.kernels import dispatch, sm80_gemm, sm90_gemm
from tests.helpers.problems import gemm_problem as _problem


@pytest.mark.parametrize("m, n, k, name", [
    (8, 4096, 4096, None),                       # M <= 16: sm80_gemm's 16-row tiles
    (32, 4096, 4096, "64x128x64_6s_w1_tma"),     # 64 tiles of 64 x 128: one wave
    (128, 4096, 4096, "64x128x64_6s_w1_tma"),    # 128 tiles: still one wave
    # M >= 256: sm90_gemm.MID_TILES, the TMA store forms (out bf16 row-major here)
    (256, 8192, 8192, "128x128x64_6s_w1_tma_ts"),  # 0.84 -> 0.98x in the 2026-12-02 sweep
    (64, 28672, 4096, "64x256x64_4s_w1_tma"),    # 112 tiles of 64 x 256: one wave
    (128, 57344, 8192, "128x256x64_4s_w1_tma"),  # 224 tiles of 128 x 256, under two waves
    (4096, 4096, 4096, None),                    # 512 tiles of 128 x 256: the persistent ones
    (512, 57344, 8192, None),
    (1000, 1000, 1000, "64x128x64_6s_w1_tma_ts"),  # M > 512 too, under two waves
    (1024, 1024, 2816, "64x128x64_6s_w1_tma_ts"),  # 32 tiles of 128 x 256 (0.52 -> 1.42x)
    (4096, 1024, 1024, "128x256x64_3s_pt_tma_ts"),  # 128 tiles of 128 x 256: one wave
    (4096, 2816, 1024, None),                    # 352 tiles of 128 x 256: the persistent ones
])
def test_small_tile_choice(m, n, k, name):
    assert sm90_gemm.small_tile(_problem(m, n, k)) == name
    if name is not None:
        cfg = sm90_gemm.CONFIGS[name]
        assert cfg.producer == "tma"
        # the choice is the least of the fitted costs, and every candidate is a real config
        assert {c for c, _ in sm90_gemm.SMALL_TILES + sm90_gemm.MID_TILES} <= set(
            sm90_gemm.CONFIGS)


def test_mid_tiles_need_a_tma_store_out():
    """M >= 256 takes sm90_gemm.MID_TILES (TMA store forms) only where out allows a TMA store;
    otherwise SMALL_TILES' direct-store choice, as before."""
    assert sm90_gemm.small_tile(_problem(256, 8192, 8192, out_dtype="float32")) == (
        "64x256x64_4s_w1_tma")
    assert sm90_gemm.small_tile(_problem(128, 8192, 8192)) == "64x128x64_6s_w1_tma"
    assert all(sm90_gemm.CONFIGS[c].store == "tma" for c, _ in sm90_gemm.MID_TILES)


def test_small_tiles_need_tensor_maps():
    # an operand a tensor map cannot describe: no TMA-only tile, the old choice instead
    assert sm90_gemm.small_tile(_problem(8, 4096, 4096, alignment=8)) is None
    assert sm90_gemm.small_tile(_problem(8, 4096, 0)) is None
    family, cfg = dispatch.choose(_problem(32, 4096, 4096, alignment=8))
    assert family.__name__.endswith("sm80_gemm")
    family, cfg = dispatch.choose(_problem(128, 4096, 4096, alignment=8))
    assert family.__name__.endswith("sm90_gemm") and cfg.producer == "cp.async"


def test_kernel_family_takes_the_small_tiles_on_hopper():
    family, cfg = dispatch.choose(_problem(32, 4096, 4096))
    assert family.__name__.endswith("sm90_gemm") and cfg.name == "64x128x64_6s_w1_tma"
    family, cfg = dispatch.choose(_problem(8, 4096, 4096))
    assert family.__name__.endswith("sm80_gemm")
    for shape, name in (((4096, 4096, 4096), "128x256x64_3s_pt_tma_ts"),
                        # tests/gpu/test_sm90_gemm_gpu.py::test_sm90_tma_default_switch's cases
                        ((1000, 1000, 1000), "64x128x64_6s_w1_tma_ts"),
                        ((520, 128, 136), "64x128x64_6s_w1_tma_ts"),
                        ((64, 4096, 14336), "64x128x64_6s_w1_tma"),
                        ((4096, 4096, 512), "128x256x64_3s_pt_tma_ts")):
        family, cfg = dispatch.choose(_problem(*shape))
        assert family.__name__.endswith("sm90_gemm") and cfg.name == name, (shape, cfg.name)


def test_the_tma_store_epilogue_where_out_allows_it():
    """The persistent 128 x 256 tiles take their TMA store form (sm90_gemm.TMA_STORE_FORM) for
    a bf16 / f16 row-major out with 16-byte rows; otherwise the 4-stage direct-store form, not
    the 3-stage twin a forced _ts configuration falls back to."""
    import dataclasses

    from tests.helpers.problems import operand

    p = _problem(4096, 4096, 4096)
    assert dispatch.choose(p)[1].name == "128x256x64_3s_pt_tma_ts"
    for q in (_problem(4096, 4096, 4096, out_dtype="float32"),
              dataclasses.replace(p, out=operand("out", "col", 4096)),
              dataclasses.replace(p, out=operand("out", "row", 4096, alignment=8))):
        assert dispatch.choose(q)[1].name == "128x256x64_4s_pt_tma", q.out
    fp8 = _problem(4096, 4096, 4096, dtype="float8_e4m3fn", fp8_scales=(1.0, 1.0))
    assert dispatch.choose(fp8)[1].name == "fp8_128x256x128_3s_pt_tma_ts"
    # operands a tensor map cannot describe: the cp.async form (direct stores)
    assert dispatch.choose(_problem(300, 300, 301, alignment=2))[1].name == "128x256x64_4s_pt"


def test_forced_tma_only_config_with_unaligned_operands_is_an_error(monkeypatch):
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:64x128x64_6s_w1_tma")
    with pytest.raises(ValueError, match="TMA only"):
        dispatch.choose(_problem(8, 4096, 4096, alignment=8))


@pytest.mark.parametrize("m, n, k, splits", [
    (32, 4096, 14336, 2),    # 32 tiles, 224 k tiles: two slices
    (128, 4096, 14336, 2),
    (32, 4096, 4096, 1),     # K too short
    (64, 8192, 28672, 2),    # 64 tiles: half the GPU
    (128, 8192, 28672, 1),   # 128 tiles: all of it
])
def test_small_split(m, n, k, splits):
    p = _problem(m, n, k)
    cfg = sm90_gemm.CONFIGS[sm90_gemm.small_tile(p)]
    got, chunk = sm90_gemm.small_split(p, cfg)
    assert got == splits
    assert chunk % cfg.bk == 0 and got * chunk >= k and (got - 1) * chunk < k
    assert sm90_gemm.split(p, cfg) == (got, chunk)
    # configurations outside the small-tile set keep the general split rule
    assert sm90_gemm.small_split(p, sm90_gemm.CONFIGS["128x256x64_4s_pt_tma"]) is None


@pytest.fixture
def printed(monkeypatch, capsys):
    """NUMBATC_PRINT_CONFIG's lines of one dispatch.choose."""
    for var in ("NUMBATC_GEMM_KERNEL", "NUMBATC_SM80_CONFIG", "NUMBATC_SPLIT_K"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")

    def choose(p):
        capsys.readouterr()
        module, cfg = dispatch.choose(p)
        return module, cfg, capsys.readouterr().err.splitlines()

    return choose


def test_the_walk_says_why_it_passed_a_family_over(printed, monkeypatch):
    module, cfg, lines = printed(_problem(8, 4096, 4096))
    assert module is sm80_gemm and cfg.name == "16x128x64_4w_6s_fp"
    assert lines == ["numbatc.gemm: sm80_gemm, not sm90_gemm: M <= 16: sm80_gemm's 16-row tiles"]
    module, _, lines = printed(_problem(32, 4096, 4096, alignment=8))
    assert module is sm80_gemm and lines == [
        "numbatc.gemm: sm80_gemm, not sm90_gemm: M <= 64 and a and b not 16-byte aligned (start "
        "or leading dimension): a tensor map cannot describe it (the small tiles load by TMA "
        "only): sm80_gemm's 64-row tiles"]
    # the cp.async twin of the persistent tiles, said once; kernels of other GPUs are not named
    module, cfg, lines = printed(_problem(300, 300, 301, alignment=2, a_layout="col"))
    assert module is sm90_gemm and cfg.name == "128x256x64_4s_pt" and lines == [
        "numbatc.gemm: sm90_gemm 128x256x64_4s_pt, not 128x256x64_4s_pt_tma: a and b not 16-byte "
        "aligned (start or leading dimension): a tensor map cannot describe it"]
    # Blackwell: a layout sm100_gemm does not take runs sm80_gemm (sm90_gemm is not this GPU's)
    module, _, lines = printed(_problem(20, 16, 24, cc=(10, 0), b_layout="row"))
    assert module is sm80_gemm and len(lines) == 1
    assert lines[0].startswith("numbatc.gemm: sm80_gemm, not sm100_gemm: sm100_gemm takes K-major")
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm80")
    module, _, lines = printed(_problem(4096, 4096, 4096))
    assert module is sm80_gemm
    assert lines == ["numbatc.gemm: sm80_gemm, not sm90_gemm: NUMBATC_GEMM_KERNEL=sm80"]


def test_forcing(monkeypatch):
    for var in ("NUMBATC_SM80_CONFIG", "NUMBATC_SPLIT_K", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90")
    module, cfg = dispatch.choose(_problem(8, 4096, 4096))  # no small-M rule when forced
    assert module is sm90_gemm and cfg.name == "128x256x64_3s_pt_tma_ts"
    module, cfg = dispatch.choose(_problem(8, 4096, 0))  # K == 0: the portable kernel
    assert module is sm80_gemm
    with pytest.raises(ValueError, match=r"NUMBATC_GEMM_KERNEL='sm90' needs compute capability "
                                         r"9.0, this GPU has \(8, 0\)"):
        dispatch.choose(_problem(8, 4096, 4096, cc=(8, 0)))
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:128x128x64_4s")
    assert dispatch.choose(_problem(4096, 4096, 4096))[1].name == "128x128x64_4s"
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90:nope")
    with pytest.raises(ValueError, match=r"NUMBATC_GEMM_KERNEL='sm90:nope': no sm90 config 'nope'"):
        dispatch.choose(_problem(4096, 4096, 4096))
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm70")
    with pytest.raises(ValueError, match=r"choose sm80, sm90\[:<config>\] or sm100\[:<config>\]"):
        dispatch.choose(_problem(4096, 4096, 4096))
    monkeypatch.delenv("NUMBATC_GEMM_KERNEL")
    monkeypatch.setenv("NUMBATC_SM80_CONFIG", "64x64x64_4w_3s")  # wherever sm80_gemm runs
    assert dispatch.choose(_problem(8, 4096, 4096))[1].name == "64x64x64_4w_3s"
    assert dispatch.choose(_problem(4096, 4096, 4096, cc=(8, 0)))[1].name == "64x64x64_4w_3s"
    assert dispatch.choose(_problem(4096, 4096, 4096))[0] is sm90_gemm


def test_plan_is_what_launches(monkeypatch):
    """dispatch.plan: the configuration and variant a launch compiles; a split persistent
    configuration runs as its split twin (the choice, and the first printed line, stay the
    persistent one)."""
    for var in ("NUMBATC_GEMM_KERNEL", "NUMBATC_SM80_CONFIG", "NUMBATC_SPLIT_K"):
        monkeypatch.delenv(var, raising=False)
    module, cfg, var = dispatch.plan(_problem(1, 8192, 8192, cc=(8, 0)))
    assert module is sm80_gemm and cfg.name == "16x128x64_4w_6s_fp" and var.split_k
    monkeypatch.setattr(sm90_gemm, "small_tile", lambda p: None)
    p = _problem(130, 264, 512)
    assert dispatch.choose(p)[1].name == "128x256x64_3s_pt_tma_ts"
    module, cfg, var = dispatch.plan(p)
    assert cfg.name == "128x256x64_4s_w1_tma" and var.split_k
    assert sm90_gemm.split(p, sm90_gemm.CONFIGS["128x256x64_3s_pt_tma_ts"]) == (2, 256)
    module, cfg, var = dispatch.plan(_problem(4096, 4096, 4096))
    assert cfg.name == "128x256x64_3s_pt_tma_ts" and not var.split_k


@pytest.mark.parametrize("m, n, k, name, slices", [
    (8, 4096, 14336, "fp8_64x128x128_6s_w1_tma", 2),    # 32 tiles, 112 K tiles: 2 slices
    (1, 4096, 4096, "fp8_64x128x128_6s_w1_tma", 1),     # 32 K tiles: no split
    (64, 8192, 8192, "fp8_64x128x128_6s_w1_tma", 1),    # 128 tiles: one wave
    (8, 57344, 8192, "fp8_64x256x128_4s_w1_tma", 1),    # 64 x 128 would take two waves
    (256, 8192, 8192, "fp8_128x128x128_6s_w1_tma", 1),  # M > 64: 128 x 128 under one wave
    (256, 57344, 8192, "fp8_128x256x128_3s_pt_tma_ts", 1),  # 448 tiles: persistent
    (4096, 4096, 4096, "fp8_128x256x128_3s_pt_tma_ts", 1),
])
def test_fp8_small_tiles(m, n, k, name, slices):
    p = _problem(m, n, k, dtype="float8_e4m3fn", fp8_scales=(1.0, 1.0))
    family, cfg = dispatch.choose(p)
    assert family.__name__.endswith("sm90_gemm") and cfg.name == name, cfg.name
    assert sm90_gemm.split(p, cfg)[0] == slices
    assert {c for c, _ in sm90_gemm.FP8_SMALL_TILES} | {sm90_gemm.FP8_MID_TILE} <= set(
        sm90_gemm.FP8_CONFIGS)


def test_fp8_small_tiles_need_tensor_maps():
    # a row not 16-byte aligned (packed later): the persistent / cp.async choice as before
    p = _problem(8, 4096, 4096, alignment=8, dtype="float8_e4m3fn", fp8_scales=(1.0, 1.0))
    assert sm90_gemm.fp8_small_tile(p) is None
    family, cfg = dispatch.choose(p)
    assert cfg.name == "fp8_128x256x128_4s_pt"
