"""The flash-decoding kernel without a GPU (numbatc.kernels.sm80_decode_attention): the default
configurations compile and assemble for sm_80 and sm_90a (mma.sync / HMMA and cp.async
present, no local memory, no spills), the split rule, where numbatc.attention's walk sends
decode-shaped problems and what NUMBATC_PRINT_CONFIG says, and the configurations' checks.
The kernel's results: tests/emulation/test_decode_attention_emulated.py (CPU emulation) and
tests/gpu/test_decode_attention_gpu.py."""

import re

import pytest

from intrinsics.toolchain import compile_ptx
from numbatc.kernels import gpus, dispatch, sm80_decode_attention as decode, split_k
from tests.helpers.assemblers import disassemble, nvjitlink_info_log, whole_program_ptxas
from tests.helpers.problems import attention_problem


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG",
                "NUMBATC_DECODE_SPLITS"):
        monkeypatch.delenv(var, raising=False)


def _problem(**kw):
    shape = dict(batch=1, seqlen_q=1, seqlen_k=32768, heads_q=32, heads_kv=8, head_dim=128)
    return attention_problem(**{**shape, **kw})


# --- compiled code -----------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, dtype, causal, arch, rows", [
    (128, "bfloat16", True, "sm_80", 4),
    (64, "float16", False, "sm_90a", 32),     # two m16 tiles
    (128, "float16", False, "sm_90a", 8),
])
def test_default_config_assembles_without_local_memory(head_dim, dtype, causal, arch, rows,
                                                       tmp_path):
    p = _problem(head_dim=head_dim, dtype=dtype, causal=causal, heads_q=rows, heads_kv=1)
    cfg = decode.choose(p)
    var = decode.DecodeVariant(head_dim, dtype, causal, True)
    split_kernel, combine_kernel = decode.kernel_for(cfg, var)
    sig_split, sig_combine = decode.signature(var)
    ptx = compile_ptx(split_kernel, sig_split, arch)
    t = "bf16" if dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "cp.async.cg.shared.global" in ptx and "shfl.sync.bfly.b32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx, "a fragment array left in memory"
    log = nvjitlink_info_log(ptx, arch, ("-O3", "-Xptxas=-v"))
    assert int(re.search(r"(\d+) bytes spill stores", log).group(1)) == 0, log
    combine = compile_ptx(combine_kernel, sig_combine, arch)
    assert "ld.local" not in combine and "st.local" not in combine
    # the SASS (whole-program ptxas and nvdisasm, where installed)
    whole_program_ptxas(ptx, tmp_path, arch)
    sass = disassemble(tmp_path / "kernel.cubin")
    assert "HMMA.16816.F32" in sass and "LDGSTS" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_every_config_generates_its_entry_points():
    import ast

    for cfg in list(decode.CONFIGS.values())[::5]:
        source = decode.kernel_source(cfg, decode.DecodeVariant(40, "float16", True, False))
        names = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        assert names == {"split_kernel", "combine_kernel"}


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="keys_per_warp must be 16 or 32"):
        decode.DecodeConfig("bad", 1, 4, 24, 3)
    with pytest.raises(ValueError, match="stages must be in 2..8"):
        decode.DecodeConfig("bad", 1, 4, 16, 1)


# --- the split rule ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch, seqlen_k, heads_kv", [
    (1, 32768, 8), (1, 131072, 8), (8, 4096, 8), (8, 8192, 8), (32, 131072, 8), (1, 1024, 1),
    (3, 4097, 2), (1, 1, 8), (1, 0, 8), (1, 127, 1), (5, 70000, 3),
])
def test_splits_fill_the_gpu_with_whole_tiles(batch, seqlen_k, heads_kv):
    """Whole tiles, two or more a split, and of 1 .. one wave's worth of splits the one of
    least waves x tiles a block (the fewest among equals)."""
    p = _problem(batch=batch, seqlen_k=seqlen_k, heads_kv=heads_kv)
    cfg = decode.choose(p)
    var = decode.compiled(p, cfg)[1]
    splits, chunk = decode.splits_for(cfg, var, p)
    tiles = -(-seqlen_k // cfg.block_n)
    assert chunk % cfg.block_n == 0 and splits >= 1
    assert (splits - 1) * chunk < max(seqlen_k, 1) <= splits * chunk or seqlen_k == 0
    bh = batch * heads_kv
    slots = gpus.sm_count(p.cc) * decode.blocks_per_sm(cfg, var, p.cc)
    want = min(-(-slots // bh), tiles // 2)
    if splits > 1:
        assert chunk >= 2 * cfg.block_n  # at least two tiles a split
        cost = decode.split_cost(tiles, splits, bh, slots)
        assert all(decode.split_cost(tiles, n, bh, slots) > cost
                   or decode.split_cost(tiles, n, bh, slots) == cost and n >= splits
                   for n in range(1, want + 1))
    else:
        assert want < 2 or all(decode.split_cost(tiles, n, bh, slots) >= tiles
                               for n in range(1, want + 1))


def test_one_sequence_of_32k_keys_fills_one_wave():
    """The profiled case (H200: 35 splits made 280 blocks for 264 slots, 1.06 waves): 32 splits
    of 16 tiles, 256 blocks."""
    p = _problem(batch=1, seqlen_k=32768, heads_kv=8, heads_q=32)
    cfg = decode.choose(p)
    var = decode.compiled(p, cfg)[1]
    assert decode.blocks_per_sm(cfg, var, p.cc) == 2 and cfg.block_n == 64
    assert decode.splits_for(cfg, var, p) == (32, 16 * 64)


def test_shared_memory_fits_the_gpu():
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (12, 0)):
        for d in (64, 128, 256):
            p = _problem(head_dim=d, cc=cc)
            cfg = decode.choose(p)
            _, per_block = decode._sm_shared(cc)
            assert decode.shared_bytes(cfg, decode.compiled(p, cfg)[1]) <= per_block, (cc, d)


# --- numbatc.attention's walk --------------------------------------------------------------------


def _walk(monkeypatch, env=None, **kw):
    if env is not None:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", env)
    module, cfg = dispatch.choose_attention(_problem(**kw))
    return module.__name__.rsplit(".", 1)[1], cfg.name


def test_decode_shapes_take_the_decode_kernel(monkeypatch):
    for cc in ((9, 0), (8, 0), (8, 9)):
        for sq, sk in ((1, 1024), (16, 4096), (4, 131072)):
            assert _walk(monkeypatch, seqlen_q=sq, seqlen_k=sk, cc=cc)[0] == "sm80_decode_attention"
    assert _walk(monkeypatch, seqlen_q=17)[0] == "sm90_attention"
    assert _walk(monkeypatch, seqlen_k=1023)[0] == "sm90_attention"
    assert _walk(monkeypatch, seqlen_k=1023, cc=(8, 0))[0] == "sm80_attention"
    assert _walk(monkeypatch, head_dim=32, seqlen_q=20)[0] == "sm80_attention"


def test_forcing(monkeypatch):
    assert _walk(monkeypatch, "decode", seqlen_k=5, seqlen_q=40) == (
        "sm80_decode_attention", "m16_w4_k16_s3")
    assert _walk(monkeypatch, "decode:m32_w2_k32_s3") == ("sm80_decode_attention",
                                                          "m32_w2_k32_s3")
    assert _walk(monkeypatch, "sm80")[0] == "sm80_attention"
    assert _walk(monkeypatch, "sm90")[0] == "sm90_attention"
    with pytest.raises(ValueError, match="no decode config 'nope'"):
        _walk(monkeypatch, "decode:nope")


def test_print_config_says_why(monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    monkeypatch.setattr(decode, "launch_flat", lambda *a, **k: None)
    monkeypatch.setattr(decode, "kernel_arguments", lambda p, keep: ((None,) * 15, 0))
    for env, sk, why in ((None, 32768, "decode-shaped"),
                         ("decode", 100, "forced by NUMBATC_ATTN_KERNEL (seqlen_k 100 < 1024 "
                                         "(too few keys to split))")):
        if env:
            monkeypatch.setenv("NUMBATC_ATTN_KERNEL", env)
        dispatch.launch_attention(_problem(seqlen_k=sk, causal=True))
        err = capsys.readouterr().err
        assert err.startswith(f"numbatc.attention B=1 Sq=1 Sk={sk} Hq=32 Hkv=8 D=128 causal: "
                              f"sm80_decode_attention m16_w4_k16_s3 bfloat16, {why}: rows "
                              "seqlen_q x group = 4 in 1 m block(s), "), err
    monkeypatch.delenv("NUMBATC_ATTN_KERNEL")
    dispatch.choose_attention(_problem(seqlen_k=512))
    assert capsys.readouterr().err == ("numbatc.attention: sm90_attention, not "
                                       "sm80_decode_attention: seqlen_k 512 < 1024 (too few keys "
                                       "to split)\n")


def test_forced_splits(monkeypatch):
    seen = []
    monkeypatch.setattr(decode, "launch_flat", lambda *a, split, **k: seen.append(split))
    monkeypatch.setattr(decode, "kernel_arguments", lambda p, keep: ((None,) * 15, 0))
    monkeypatch.setattr(decode, "pointer_relaunch", lambda *a: None)
    p = _problem(seqlen_k=1000)
    cfg = decode.choose(p)
    monkeypatch.setenv("NUMBATC_DECODE_SPLITS", "4")
    decode.launch(p, cfg)
    assert seen == [(4, 256)]
    monkeypatch.setenv("NUMBATC_DECODE_SPLITS", "0")
    with pytest.raises(ValueError, match="a positive number of splits"):
        decode.launch(p, cfg)


def test_first_launch_compiles_both_kernels_together(monkeypatch):
    """launch_flat on a GPU hands both kernels to compile_kernels (the split kernel first: its
    link overlaps the combine kernel's typing) before either launch, with the signatures the
    launches use; the emulation compiles nothing."""
    from numba import config

    import intrinsics.launch as launching

    events = []
    monkeypatch.setattr(launching, "compile_kernels",
                        lambda jobs: events.append(("compile", [sig for _, sig in jobs])))
    monkeypatch.setattr(launching, "launch",
                        lambda kernel, grid, threads, args, signature=None, **k:
                        events.append(("launch", signature)))
    monkeypatch.setattr(split_k, "split_workspace",
                        lambda device, floats, n, library: lambda stream: (1 << 20, None))
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    p = _problem(seqlen_k=4096)
    cfg = decode.choose(p)
    var = decode.DecodeVariant(128, "bfloat16", False, False)
    strides = (4096 * 8 * 128, 8 * 128, 128)
    decode.launch_flat(cfg, var, 1, 2, 3, 4, 0, 1, 1, 4096, 32, 4, strides, strides, strides,
                       strides, 0.1, device=None, split=(8, 512))
    sigs = decode.signature(var)
    assert events == [("compile", list(sigs)), ("launch", sigs[0]), ("launch", sigs[1])]
    events.clear()
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 1)
    monkeypatch.setattr(split_k, "split_workspace",
                        lambda device, floats, n, library: lambda stream: ([0.0] * floats, None))
    decode.launch_flat(cfg, var, *([None] * 5), 1, 1, 4096, 32, 4, strides, strides, strides,
                       strides, 0.1, device=None, split=(8, 512))
    assert [e[0] for e in events] == ["launch", "launch"]
