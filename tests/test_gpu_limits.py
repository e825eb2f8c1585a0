"""The portable kernels' choices against the GPU's limits (issue 22, numbatc.kernels.gpus): for
every compute capability numbatc runs on, sm80_gemm, sm80_attention and sm80_gemm_softmax choose
only configurations whose shared memory fits one block and whose registers fit the SM; a forced
configuration that does not fit is a ValueError naming the limit, before any launch; and
NUMBATC_PRINT_CONFIG says why each choice was made.  CPU only: the choice is host code on
stand-in problems."""
import itertools
import re

import pytest

from numbatc.kernels import (dispatch, gpus, sm80_attention, sm80_gemm, sm80_gemm_softmax,
                             sm90_attention)
from tests.helpers.problems import attention_problem, gemm_problem, gemm_softmax_problem

CCS = [(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0)]
SHAPES = list(itertools.product((1, 7, 16, 17, 64, 65, 300, 4096, 8192), (1, 129, 4096, 28672),
                                (1, 72, 8192)))


@pytest.fixture
def env(monkeypatch):
    for var in ("NUMBATC_GEMM_KERNEL", "NUMBATC_SM80_CONFIG", "NUMBATC_SPLIT_K",
                "NUMBATC_PRINT_CONFIG", "NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_the_table():
    """The programming guide's numbers as numbatc reads them; per block, the SM's amount less
    the driver's 1 KB; a compute capability numbatc does not know gets the smallest."""
    kb = 1024
    want = {(8, 0): (163, 164), (8, 6): (99, 100), (8, 7): (163, 164), (8, 9): (99, 100),
            (9, 0): (227, 228), (10, 0): (227, 228), (12, 0): (99, 100)}
    for cc, (block, sm) in want.items():
        lim = gpus.limits(cc)
        assert (lim.shared_per_block, lim.shared_per_sm) == (block * kb, sm * kb), cc
        assert lim.shared_per_block == lim.shared_per_sm - lim.reserved_per_block
        assert lim.registers_per_sm == 65536 and lim.sms > 0
    assert gpus.limits(None) is gpus.limits((9, 0))  # the CPU emulation's GPU
    assert gpus.limits([8, 9]) is gpus.limits((8, 9))
    assert gpus.limits((13, 5)).shared_per_block == 99 * kb
    assert gpus.sm_count((8, 0)) == 108 and gpus.sm_count((9, 0), device=None) == 132


#: sm80_gemm's configurations: (name, blocks per SM on 9.0, 8.0, 8.9)
OCCUPANCY = [
    ("128x256x64_8w_3s", 1, 1, 0), ("128x256x64_8w_4s", 1, 0, 0),
    ("128x128x64_4w_4s", 1, 1, 0), ("128x128x64_4w_3s", 2, 1, 1),
    ("128x128x32_4w_4s", 2, 2, 1), ("128x128x32_4w_3s", 2, 2, 2),
    ("64x128x64_4w_4s", 2, 1, 1), ("64x64x64_4w_3s", 2, 2, 2),
    ("16x128x64_4w_6s", 2, 1, 0), ("16x128x64_4w_4s", 2, 2, 1),
    ("128x256x64_8w_3s_fp", 1, 1, 0), ("128x256x64_8w_4s_fp", 1, 0, 0),
    ("128x256x64_8w_3s_fpr", 1, 1, 0), ("128x256x64_8w_3s_fps", 1, 1, 0),
    ("128x128x32_4w_4s_fp", 2, 2, 1), ("128x128x32_4w_3s_fp", 2, 2, 2),
    ("64x128x64_4w_4s_fp", 2, 1, 1), ("16x128x64_4w_6s_fp", 2, 1, 0),
    ("16x128x64_4w_4s_fp", 2, 2, 1),
]


@pytest.mark.parametrize("name, hopper, a100, ada", OCCUPANCY)
def test_blocks_per_sm(name, hopper, a100, ada):
    """Blocks per SM of every sm80_gemm configuration on 9.0 (228 KB), 8.0 (164 KB) and 8.9
    (100 KB): by shared memory plus the 1 KB reserved per block, and by registers (64K per SM;
    ptxas gives these kernels 240-255 per thread, allocated as 256: two 128-thread blocks at
    most).  0: one block does not fit."""
    cfg = sm80_gemm.CONFIGS[name]
    assert tuple(gpus.blocks_per_sm(gpus.limits(cc), cfg.shared_bytes, cfg.threads)
                 for cc in ((9, 0), (8, 0), (8, 9))) == (hopper, a100, ada)


def test_every_gemm_config_has_its_occupancy_pinned():
    assert {n for n, *_ in OCCUPANCY} == set(sm80_gemm.CONFIGS)


@pytest.mark.parametrize("cc", CCS)
def test_gemm_choice_fits(cc, env):
    lim = gpus.limits(cc)
    for m, n, k in SHAPES:
        p = gemm_problem(m, n, k, cc=cc)
        cfg = sm80_gemm.choose(p)
        assert cfg.shared_bytes <= lim.shared_per_block, (cc, m, n, k, cfg.name)
        assert cfg.threads * 256 <= lim.registers_per_sm
        assert gpus.blocks_per_sm(lim, cfg.shared_bytes, cfg.threads) >= 1
        if m > 64:  # the 128 x 256 tile where it fits and fills the SMs, else a pair of 128s
            tiles = sm80_gemm.grid_for(sm80_gemm.CONFIGS["128x256x64_8w_3s_fp"], m, n)
            if lim.shared_per_block >= 144 * 1024 and tiles >= gpus.sm_count(cc):
                assert cfg.name == "128x256x64_8w_3s_fp", (cc, m, n, cfg.name)
            else:
                assert cfg.bn == 128 and gpus.blocks_per_sm(
                    lim, cfg.shared_bytes, cfg.threads) == 2, (cc, m, n, cfg.name)
        # the config dispatch takes where it walks to sm80_gemm (forced there)
        env.setenv("NUMBATC_GEMM_KERNEL", "sm80")
        assert dispatch.choose(p) == (sm80_gemm, cfg)
        env.delenv("NUMBATC_GEMM_KERNEL")


@pytest.mark.parametrize("cc, decode, mid, large", [
    ((9, 0), "16x128x64_4w_6s_fp", "64x128x64_4w_4s", "128x256x64_8w_3s_fp"),   # measured (H100)
    ((10, 0), "16x128x64_4w_6s_fp", "64x128x64_4w_4s", "128x256x64_8w_3s_fp"),  # 9.0's limits
    ((8, 0), "16x128x64_4w_6s_fp", "64x128x64_4w_4s", "128x256x64_8w_3s_fp"),   # reasoned
    ((8, 7), "16x128x64_4w_6s_fp", "64x128x64_4w_4s", "128x256x64_8w_3s_fp"),
    ((8, 6), "16x128x64_4w_4s_fp", "64x128x64_4w_4s", "128x128x32_4w_3s_fp"),
    ((8, 9), "16x128x64_4w_4s_fp", "64x128x64_4w_4s", "128x128x32_4w_3s_fp"),
    ((12, 0), "16x128x64_4w_4s_fp", "64x128x64_4w_4s", "128x128x32_4w_3s_fp"),
])
def test_gemm_choice_per_cc(cc, decode, mid, large):
    """The choice table (sm80_gemm.TILES' note says which is measured and which reasoned); a
    problem of fewer 128 x 256 tiles than SMs takes the 128 x 128 tiles that pair up."""
    assert [sm80_gemm.choose(gemm_problem(m, 4096, 4096, cc=cc)).name
            for m in (8, 64, 4096)] == [decode, mid, large]
    small = sm80_gemm.choose(gemm_problem(1024, 1024, 4096, cc=cc)).name  # 32 tiles of 128 x 256
    assert small == {(9, 0): "128x128x64_4w_3s", (10, 0): "128x128x64_4w_3s",
                     (8, 0): "128x128x32_4w_4s_fp", (8, 7): large}.get(  # Orin: 16 SMs
        cc, "128x128x32_4w_3s_fp")


def test_gemm_named_only_configs_are_never_chosen():
    chosen = {sm80_gemm.choose(gemm_problem(m, n, k, cc=cc)).name
              for cc in CCS for m, n, k in SHAPES}
    assert set(sm80_gemm.CONFIGS) - chosen == {
        "128x256x64_8w_3s", "128x256x64_8w_4s", "128x128x64_4w_4s", "64x64x64_4w_3s",
        "128x128x32_4w_4s", "128x128x32_4w_3s", "128x256x64_8w_4s_fp", "64x128x64_4w_4s_fp",
        "16x128x64_4w_6s", "16x128x64_4w_4s", "128x256x64_8w_3s_fpr",
        "128x256x64_8w_3s_fps"}


@pytest.mark.parametrize("cc", [(8, 6), (8, 9), (12, 0)])
def test_a_forced_gemm_config_that_does_not_fit_is_refused(cc, env):
    p = gemm_problem(4096, 4096, 4096, cc=cc)
    env.setenv("NUMBATC_SM80_CONFIG", "128x256x64_8w_3s")
    with pytest.raises(ValueError, match=re.escape(
            "NUMBATC_SM80_CONFIG='128x256x64_8w_3s': sm80 config 128x256x64_8w_3s needs 144 KB "
            f"of shared memory per block; compute capability {cc[0]}.{cc[1]} allows 99 KB: "
            "choose from [")):
        dispatch.choose(p)
    env.setenv("NUMBATC_SM80_CONFIG", "64x128x64_4w_4s")  # 96 KB fits
    assert dispatch.choose(p)[1].name == "64x128x64_4w_4s"
    env.delenv("NUMBATC_SM80_CONFIG")
    env.setenv("NUMBATC_GEMM_KERNEL", "sm80:128x128x64_4w_4s")
    with pytest.raises(ValueError, match=r"NUMBATC_GEMM_KERNEL='sm80:128x128x64_4w_4s': .*128 KB"):
        dispatch.choose(p)
    # the launch refuses it too, before anything is launched
    env.delenv("NUMBATC_GEMM_KERNEL")
    env.setattr(sm80_gemm.operands, "launch_gemm", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match="needs 144 KB of shared memory per block"):
        sm80_gemm.launch(p, sm80_gemm.CONFIGS["128x256x64_8w_3s"])
    # A100: 163 KB per block take the 144 KB tile, not the 192 KB one
    big = gemm_problem(4096, 4096, 4096, cc=(8, 0))
    assert sm80_gemm.choose(big, "128x256x64_8w_3s").name == "128x256x64_8w_3s"
    with pytest.raises(ValueError, match="needs 192 KB .* 8.0 allows 163 KB"):
        sm80_gemm.choose(big, "128x256x64_8w_4s")


def test_gemm_print_config_says_why(env, capsys):
    """NUMBATC_PRINT_CONFIG: sm80_gemm's launch says what the configuration takes, how many
    blocks share an SM of the problem's GPU, and why (the launch below stops at the packing
    step, replaced by a recorder: the stand-in problem has no arrays)."""
    env.setenv("NUMBATC_PRINT_CONFIG", "1")
    ran = []
    env.setattr(sm80_gemm.operands, "launch_gemm", lambda *a, **k: ran.append(a[2]))
    lines = {}
    for cc in ((9, 0), (8, 0), (8, 9)):
        p = gemm_problem(4096, 4096, 4096, cc=cc)
        sm80_gemm.launch(p, sm80_gemm.choose(p))
        (lines[cc],) = capsys.readouterr().err.splitlines()
    assert [c.name for c in ran] == ["128x256x64_8w_3s_fp", "128x256x64_8w_3s_fp",
                                     "128x128x32_4w_3s_fp"]
    assert lines[(9, 0)] == (
        "numbatc.gemm: sm80_gemm 128x256x64_8w_3s_fp: 144 KB, 1 block per SM on cc 9.0 (228 KB "
        "per SM); M > 64: 128 x 256 tiles of 8 warps, the k loop prefetching (measured best on "
        "an H100)")
    assert lines[(8, 0)].startswith("numbatc.gemm: sm80_gemm 128x256x64_8w_3s_fp: 144 KB, 1 "
                                    "block per SM on cc 8.0 (164 KB per SM)")
    assert lines[(8, 9)].startswith("numbatc.gemm: sm80_gemm 128x128x32_4w_3s_fp: 48 KB, 2 "
                                    "blocks per SM on cc 8.9 (100 KB per SM)")
    p = gemm_problem(1024, 1024, 4096, cc=(9, 0))
    assert sm80_gemm.explain(p, sm80_gemm.choose(p)) == (
        "128x128x64_4w_3s: 96 KB, 2 blocks per SM on cc 9.0 (228 KB per SM); M > 64 (fewer 128 "
        "x 256 tiles than the 132 SMs): the first 128 x 128 tile that keeps two blocks per SM "
        "(measured best on the H200)")
    assert all("reasoned from the limits, not measured" in lines[cc] for cc in ((8, 0), (8, 9)))
    p = gemm_problem(8, 4096, 4096, cc=(8, 9))
    assert sm80_gemm.explain(p, sm80_gemm.choose(p)) == (
        "16x128x64_4w_4s_fp: 72 KB, 1 block per SM on cc 8.9 (100 KB per SM); M <= 16: 16-row "
        "tiles, the deepest pipeline that fits")
    assert sm80_gemm.explain(p, sm80_gemm.CONFIGS["64x64x64_4w_3s"]).endswith(
        "forced (the heuristic's: 16x128x64_4w_4s_fp)")


# --- attention ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attention_choice_fits(cc, dtype, env):
    lim = gpus.limits(cc)
    for head_dim in (8, 40, 64, 96, 128, 136, 192, 200, 256):
        p = attention_problem(head_dim=head_dim, dtype=dtype, cc=cc)
        cfg = sm80_attention.choose(p)
        var = sm80_attention.compiled(p, cfg)[1]
        need = sm80_attention.shared_bytes(cfg, var)
        assert need <= lim.shared_per_block, (cc, head_dim, cfg.name, need)
        assert cfg.threads * 256 <= lim.registers_per_sm
        assert gpus.blocks_per_sm(lim, need, cfg.threads) >= 1


@pytest.mark.parametrize("cc, d64, d128, d256", [
    ((9, 0), "m128n64_w8_qreg", "m128n64_w8_qreg", "m128n32_w8_qsmem"),
    ((10, 0), "m128n64_w8_qreg", "m128n64_w8_qreg", "m128n32_w8_qsmem"),
    ((8, 0), "m128n64_w8_qreg", "m128n64_w8_qreg", "m128n32_w8_qsmem"),
    ((8, 7), "m128n64_w8_qreg", "m128n64_w8_qreg", "m128n32_w8_qsmem"),
    ((8, 6), "m128n64_w8_qreg", "m128n64_w8_qreg", "m64n32_w4_qsmem"),   # 128 KB > 99 KB
    ((8, 9), "m128n64_w8_qreg", "m128n64_w8_qreg", "m64n32_w4_qsmem"),
    ((12, 0), "m128n64_w8_qreg", "m128n64_w8_qreg", "m64n32_w4_qsmem"),
])
def test_attention_choice_per_cc(cc, d64, d128, d256, env):
    assert [sm80_attention.choose(attention_problem(head_dim=d, cc=cc)).name
            for d in (64, 128, 256)] == [d64, d128, d256]
    # the walk lands on the same configuration, except on 9.0, where sm90_attention takes the
    # head dims of its DEFAULT_HEAD_DIMS (256 among them since the H200 measured it: 0.64-1.06x
    # of cuDNN against the portable kernel's 0.33-0.39x, docs/PERFORMANCE.md)
    module, cfg = dispatch.choose_attention(attention_problem(head_dim=256, cc=cc))
    if cc == (9, 0) and 256 in sm90_attention.DEFAULT_HEAD_DIMS:
        assert (module, cfg) == (sm90_attention, sm90_attention.choose_config(256))
    else:
        assert cfg.name == d256


def test_a_forced_attention_config_that_does_not_fit_is_refused(env):
    p = attention_problem(head_dim=256, cc=(8, 9))
    env.setenv("NUMBATC_ATTN_CONFIG", "m128n32_w8_qsmem")
    with pytest.raises(ValueError, match=re.escape(
            "NUMBATC_ATTN_CONFIG='m128n32_w8_qsmem': sm80 attention config m128n32_w8_qsmem needs "
            "128 KB of shared memory per block at head_dim 256; compute capability 8.9 allows 99 "
            "KB: choose from ['m128n16_w8_qsmem', 'm64n16_w4_qsmem', 'm64n32_w4_qsmem']")):
        dispatch.choose_attention(p)
    assert sm80_attention.choose(attention_problem(head_dim=256, cc=(8, 0))).name == (
        "m128n32_w8_qsmem")  # fits 163 KB
    env.delenv("NUMBATC_ATTN_CONFIG")
    with pytest.raises(ValueError, match="needs 192 KB of shared memory per block at head_dim 256"):
        sm80_attention.choose(p, "m128n64_w8_qreg")
    with pytest.raises(ValueError, match="compute capability 8.9 allows 99 KB"):
        sm80_attention.launch(p, sm80_attention.CONFIGS["m128n32_w8_qsmem"])


def test_attention_print_config_says_why(env, capsys):
    env.setattr(sm80_attention, "kernel_arguments", lambda p, keep: ((), 0))
    env.setattr(sm80_attention, "launch_flat", lambda *a, **k: None)
    env.setenv("NUMBATC_PRINT_CONFIG", "1")
    p = attention_problem(head_dim=256, cc=(8, 9))
    sm80_attention.launch(p, sm80_attention.choose(p))
    assert capsys.readouterr().err.splitlines()[-1] == (
        "numbatc.attention: sm80_attention m64n32_w4_qsmem: 96 KB, 1 block per SM on cc 8.9 (100 "
        "KB per SM); head_dim > 128: m128n32_w8_qsmem needs 128 KB here (reasoned from the "
        "limits, not measured)")
    p = attention_problem(head_dim=128, cc=(9, 0))
    sm80_attention.launch(p, sm80_attention.choose(p))
    assert capsys.readouterr().err.splitlines()[-1] == (
        "numbatc.attention: sm80_attention m128n64_w8_qreg: 96 KB, 1 block per SM on cc 9.0 (228 "
        "KB per SM); head_dim <= 128: Q in registers")


# --- GEMM + softmax ----------------------------------------------------------------------------

@pytest.mark.parametrize("cc", CCS)
def test_gemm_softmax_choice_fits(cc):
    lim = gpus.limits(cc)
    for m, n in itertools.product((1, 100, 16384), (1, 64, 100, 128, 200, 256)):
        cfg = sm80_gemm_softmax.choose(gemm_softmax_problem(m, n, 64, cc=cc))
        assert cfg.bn >= n and sm80_gemm_softmax.shared_total(cfg) <= lim.shared_per_block
    small = lim.shared_per_block < 100 * 1024
    wide = sm80_gemm_softmax.choose(gemm_softmax_problem(16384, 256, 64, cc=cc)).name
    assert wide == ("64x256x32_8w_4s" if small else "64x256x64_8w_3s")
    if small:
        with pytest.raises(ValueError, match="needs 146 KB of shared memory per block"):
            sm80_gemm_softmax.choose(gemm_softmax_problem(1, 256, 64, cc=cc), "32x256x64_8w_4s")
