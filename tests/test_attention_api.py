"""numbatc.attention's user-facing layer without a GPU: every validation error, empty problems,
the output and lse allocation, the AttentionProblem that reaches the kernel modules' ``launch``
(replaced here by a recorder), and numbatc.kernels.dispatch's walk over the attention table
(defaults, NUMBATC_ATTN_KERNEL's forcing and errors, NUMBATC_PRINT_CONFIG's lines).

Arrays are the fakes of tests/helpers/fake_arrays.py (made-up device pointers, never
dereferenced; the pointer encodes the device); its autouse fixture ``no_gpu`` answers the device
queries."""

import importlib
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

import numbatc
from numbatc import gemm_api
from numbatc.interop import DTypeView
from numbatc.kernels import dispatch, sm80_attention, sm80_decode_attention, sm90_attention
from tests.helpers.fake_arrays import FakeCuda, no_gpu  # noqa: F401  (no_gpu: autouse)
from tests.helpers.problems import attention_problem


@pytest.fixture
def launched(monkeypatch):
    """The problems handed to either kernel family (the fake device is compute capability 9.0,
    so head_dim 64 and 128 go to sm90_attention, the rest to sm80_attention)."""
    calls = []
    for name in ("sm80_attention", "sm90_attention"):
        kernels = importlib.import_module(f"numbatc.kernels.{name}")
        monkeypatch.setattr(kernels, "launch", lambda p, cfg: calls.append(p))
    return calls


def qkv(b=2, sq=5, sk=7, hq=4, hkv=2, d=64, dtype="float16", device=0):
    return (FakeCuda((b, sq, hq, d), dtype, device=device),
            FakeCuda((b, sk, hkv, d), dtype, device=device),
            FakeCuda((b, sk, hkv, d), dtype, device=device))


def bf16(shape, **kw):
    return DTypeView(FakeCuda(shape, "uint16", **kw), "bfloat16")


# --- a call that reaches the kernel layer ----------------------------------------------------


def test_problem_reaches_the_kernel_layer(launched):
    q, k, v = qkv()
    out = numbatc.attention(q, k, v, causal=True)
    (p,) = launched
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim) == (2, 5, 7, 4, 2, 64)
    assert p.group == 2 and p.causal and p.dtype == "float16" and p.lse is None
    assert p.scale == pytest.approx(1 / math.sqrt(64))
    assert p.out.shape == (2, 5, 4, 64) and out.shape == (2, 5, 4, 64)
    assert p.cc == (9, 0) and p.device == 0


def test_lse_scale_and_bf16(launched):
    shape_q, shape_kv = (1, 9, 8, 40), (1, 3, 1, 40)
    out, lse = numbatc.attention(bf16(shape_q), bf16(shape_kv), bf16(shape_kv), scale=0.25,
                                 return_lse=True)
    (p,) = launched
    assert isinstance(out, DTypeView) and out.dtype == "bfloat16" and out.shape == shape_q
    assert lse.shape == (1, 8, 9) and lse.dtype == np.float32
    assert p.lse is not None and p.lse.shape == (1, 8, 9) and p.scale == 0.25 and p.group == 8


def test_strided_views_are_read_in_place(launched):
    """A slice of a packed (b, s, 3, h, d) QKV buffer: strides (s*3*h*d, 3*h*d, d, 1)."""
    b, s, h, d = 2, 11, 4, 64
    base = FakeCuda((b, s, 3 * h, d), "float16")
    st = (s * 3 * h * d, 3 * h * d, d, 1)
    q = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr)
    k = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr + h * d * 2)
    v = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr + 2 * h * d * 2)
    numbatc.attention(q, k, v)
    (p,) = launched
    assert p.q.ptr == q.ptr and p.q.strides == st and p.v.ptr == v.ptr


def test_out_written_in_place(launched):
    q, k, v = qkv()
    out = FakeCuda(q.shape, "float16")
    assert numbatc.attention(q, k, v, out=out) is out
    assert launched[0].out.ptr == out.ptr


# --- empty problems --------------------------------------------------------------------------


@pytest.mark.parametrize("b, sq, hq, hkv", [(0, 5, 4, 2), (2, 0, 4, 2), (2, 5, 0, 0)])
def test_empty_results_launch_nothing(launched, b, sq, hq, hkv):
    q, k, v = qkv(b=b, sq=sq, hq=hq, hkv=hkv)
    out, lse = numbatc.attention(q, k, v, return_lse=True)
    assert out.shape == (b, sq, hq, 64) and lse.shape == (b, hq, sq)
    assert not launched


def test_no_keys_still_launches(launched):
    """seqlen_k == 0: the kernel stores zeros and lse = -inf."""
    q, k, v = qkv(sk=0)
    numbatc.attention(q, k, v)
    assert launched[0].seqlen_k == 0


# --- validation errors -----------------------------------------------------------------------


def test_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must be 4-D \(batch, seqlen_q, heads_q, head_dim\)"):
        numbatc.attention(FakeCuda((5, 4, 64), "float16"), k, v)
    with pytest.raises(ValueError, match=r"v must be 4-D"):
        numbatc.attention(q, k, FakeCuda((2, 7, 128), "float16"))


def test_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k has dtype float32, not supported; supported: float16, bfloat16"):
        numbatc.attention(q, FakeCuda(k.shape, "float32"), v)
    with pytest.raises(TypeError, match="one dtype; got q float16, k bfloat16, v float16"):
        numbatc.attention(q, bf16(k.shape), v)


def test_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        numbatc.attention(q, k, FakeCuda((2, 8, 2, 64), "float16"))
    with pytest.raises(ValueError, match="q has batch 3 but k and v have batch 2"):
        numbatc.attention(FakeCuda((3, 5, 4, 64), "float16"), k, v)
    with pytest.raises(ValueError, match="q has head_dim 32 but k and v have head_dim 64"):
        numbatc.attention(FakeCuda((2, 5, 4, 32), "float16"), k, v)


@pytest.mark.parametrize("d", [0, 4, 12, 100, 264, 512])
def test_head_dim(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=f"head_dim must be a multiple of 8 from 8 to 256, got {d}"):
        numbatc.attention(q, k, v)


@pytest.mark.parametrize("hq, hkv", [(3, 2), (4, 3), (1, 2), (4, 0)])
def test_heads_must_divide(hq, hkv):
    q, k, v = qkv(hq=hq, hkv=hkv)
    with pytest.raises(ValueError, match=rf"heads_q \({hq}\) must be a multiple of heads_kv \({hkv}\)"):
        numbatc.attention(q, k, v)


def test_head_dim_must_be_contiguous():
    q, k, v = qkv()
    strided = FakeCuda(k.shape, "float16", strides=(7 * 2 * 128, 2 * 128, 128, 2))
    with pytest.raises(ValueError, match=r"k \(shape \(2, 7, 2, 64\)\) has strides .* last dimension"):
        numbatc.attention(q, strided, v)


def test_negative_strides():
    q, k, v = qkv()
    rev = FakeCuda(k.shape, "float16", strides=(7 * 2 * 64, -2 * 64, 64, 1))
    with pytest.raises(ValueError, match="negative stride"):
        numbatc.attention(q, k, rev)


@pytest.mark.parametrize("scale, exc, msg", [
    (0.0, ValueError, "positive finite"), (-1, ValueError, "positive finite"),
    (float("nan"), ValueError, "positive finite"), (float("inf"), ValueError, "positive finite"),
    ("0.1", TypeError, "real number"), (True, TypeError, "real number"),
])
def test_bad_scale(scale, exc, msg):
    with pytest.raises(exc, match=msg):
        numbatc.attention(*qkv(), scale=scale)


def test_flags_must_be_bools():
    with pytest.raises(TypeError, match="causal must be True or False"):
        numbatc.attention(*qkv(), causal="yes")
    with pytest.raises(TypeError, match="return_lse must be True or False"):
        numbatc.attention(*qkv(), return_lse=1)


def test_host_arrays_are_refused():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="move it to the GPU first"):
        numbatc.attention(np.zeros(q.shape, np.float16), k, v)


def test_devices_must_match():
    q, k, _ = qkv()
    v = FakeCuda(k.shape, "float16", device=1)
    with pytest.raises(ValueError, match=r"different devices \(q on cuda:0, k on cuda:0, v on cuda:1\)"):
        numbatc.attention(q, k, v)


def test_old_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: (7, 5))
    with pytest.raises(ValueError, match="compute capability 8.0 .* device 0 is sm_75"):
        numbatc.attention(*qkv())


def test_bad_out():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"out must have q's shape \(2, 5, 4, 64\), got \(2, 5, 4, 32\)"):
        numbatc.attention(q, k, v, out=FakeCuda((2, 5, 4, 32), "float16"))
    with pytest.raises(TypeError, match="out has dtype float32; it must have the inputs' dtype float16"):
        numbatc.attention(q, k, v, out=FakeCuda(q.shape, "float32"))
    with pytest.raises(ValueError, match="out is read-only"):
        numbatc.attention(q, k, v, out=FakeCuda(q.shape, "float16", readonly=True))
    with pytest.raises(ValueError, match="overlapping elements"):
        numbatc.attention(q, k, v, out=FakeCuda(q.shape, "float16", strides=(0, 256, 64, 1)))
    with pytest.raises(ValueError, match="out overlaps q in memory"):
        numbatc.attention(q, k, v, out=q)
    with pytest.raises(ValueError, match="out must be 4-D"):
        numbatc.attention(q, k, v, out=FakeCuda((10, 256), "float16"))
    with pytest.raises(TypeError, match="move it to the GPU first"):
        numbatc.attention(q, k, v, out=np.zeros(q.shape, np.float16))


# --- which kernel: numbatc.kernels.dispatch's attention table ----------------------------------


@pytest.fixture
def walk(monkeypatch):
    """``walk(env=None, **problem)``: (module, configuration) names the walk picks for a
    stand-in problem (tests/helpers/problems.py) with NUMBATC_ATTN_KERNEL=env."""
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)

    def choose(env=None, **problem):
        if env is None:
            monkeypatch.delenv("NUMBATC_ATTN_KERNEL", raising=False)
        else:
            monkeypatch.setenv("NUMBATC_ATTN_KERNEL", env)
        module, cfg = dispatch.choose_attention(attention_problem(**problem))
        return module.__name__.rsplit(".", 1)[1], cfg.name

    return choose


def test_the_table_tries_hopper_then_the_portable_kernel():
    # decode-shaped problems first (tests/test_decode_attention.py), then Hopper, then portable
    assert [(f.name, f.module, f.cc) for f in dispatch.FAMILIES["attention"]] == [
        ("decode", sm80_decode_attention, ()), ("sm90", sm90_attention, (9, 0)),
        ("sm80", sm80_attention, ())]


def test_default_choice(walk):
    assert walk(head_dim=64) == ("sm90_attention", sm90_attention.choose_config(64).name)
    assert walk(head_dim=128) == ("sm90_attention", sm90_attention.choose_config(128).name)
    assert walk(head_dim=32) == ("sm80_attention", "m128n64_w8_qreg")
    assert walk(head_dim=192) == ("sm90_attention", sm90_attention.choose_config(192).name)
    assert walk(head_dim=256) == ("sm90_attention", sm90_attention.choose_config(256).name)
    assert walk(head_dim=96) == ("sm90_attention", sm90_attention.choose_config(96).name)
    assert walk(head_dim=80)[0] == "sm80_attention"
    assert walk(head_dim=64, cc=(8, 0))[0] == "sm80_attention"
    assert walk(head_dim=64, cc=(10, 0))[0] == "sm80_attention"


def test_long_key_tiles_without_the_mask(walk):
    # sm90_attention.LONG_KEY_TILES: head_dim 64 and 128, not causal, seqlen_k from 2048 (measured
    # on the H200); causal, shorter keys and head_dim 96 keep the default
    long_cfg, least = sm90_attention.LONG_KEY_TILES[64]
    assert long_cfg == "n176_2s_ov_pp_fx_tma" and least == 2048
    assert walk(head_dim=64, seqlen_q=256, seqlen_k=2048) == ("sm90_attention", long_cfg)
    assert walk(head_dim=64, seqlen_q=4096, seqlen_k=4096) == ("sm90_attention", long_cfg)
    default = sm90_attention.choose_config(64).name
    assert default != long_cfg
    assert walk(head_dim=64, seqlen_q=4096, seqlen_k=4096, causal=True) == ("sm90_attention",
                                                                            default)
    assert walk(head_dim=64, seqlen_q=2047, seqlen_k=2047) == ("sm90_attention", default)
    assert walk(head_dim=128, seqlen_q=256, seqlen_k=4096) == ("sm90_attention", long_cfg)
    assert walk(head_dim=96, seqlen_q=256, seqlen_k=4096) == (
        "sm90_attention", sm90_attention.choose_config(96).name)
    # forced configurations still win
    assert walk("sm90:n128_2s_ov_pp_fx_tma", head_dim=64, seqlen_k=4096) == (
        "sm90_attention", "n128_2s_ov_pp_fx_tma")


def test_three_consumers_where_the_grid_fills_the_gpu(walk):
    # sm90_attention.THREE_CONSUMERS: head_dim 64's 192-row tiles where seqlen reaches 512 (2048
    # causal) and the grid holds 2.5 (8 causal) tiles an SM (132 for the stand-in's cc 9.0)
    rule = sm90_attention.THREE_CONSUMERS[64]
    three, default = rule.config, sm90_attention.choose_config(64).name
    long_cfg = sm90_attention.LONG_KEY_TILES[64][0]
    sms = 132

    def shape(tiles_per_sm, seqlen, causal=False):  # heads for that many tiles an SM
        rows = -(-seqlen // 192)
        heads = -(-int(tiles_per_sm * sms) // rows)
        return dict(batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads, heads_kv=1,
                    head_dim=64, causal=causal)

    assert walk(**shape(2.5, 512)) == ("sm90_attention", three)
    assert walk(**shape(2.4, 512)) == ("sm90_attention", default)
    assert walk(**shape(2.0, 4096)) == ("sm90_attention", long_cfg)  # n176 from 2048 keys
    assert walk(**shape(20, 4096)) == ("sm90_attention", three)
    assert walk(**shape(20, 511)) == ("sm90_attention", default)
    assert walk(**dict(shape(20, 4096), seqlen_k=511)) == ("sm90_attention", default)
    assert walk(**shape(8, 2048, causal=True)) == ("sm90_attention", three)
    assert walk(**shape(7.0, 2048, causal=True)) == ("sm90_attention", default)
    assert walk(**shape(20, 2047, causal=True)) == ("sm90_attention", default)
    # the rule counts 192-row tiles of seqlen_q: 2 x 1024 x 32 heads = 384 tiles, 2.9 an SM
    assert walk(batch=2, seqlen_q=1024, seqlen_k=1024, heads_q=32, heads_kv=8,
                head_dim=64) == ("sm90_attention", three)
    assert walk(batch=1, seqlen_q=1024, seqlen_k=1024, heads_q=32, heads_kv=8,
                head_dim=64) == ("sm90_attention", default)
    # other head dims, the portable GPUs and forcing are untouched
    assert walk(**dict(shape(20, 4096), head_dim=128)) == ("sm90_attention", long_cfg)
    assert walk(**dict(shape(20, 4096), cc=(8, 0)))[0] == "sm80_attention"
    assert walk("sm90:n128_2s_ov_pp_fx_tma", **shape(20, 4096)) == (
        "sm90_attention", "n128_2s_ov_pp_fx_tma")


def test_three_consumers_not_for_varlen_or_the_kv_cache():
    s = sm90_attention
    base = dict(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=32, head_dim=64)
    p = attention_problem(**base)
    assert s.three_consumers(p) == s.THREE_CONSUMERS[64].config
    for attr in ("varlen", "kv_cache"):
        stand_in = SimpleNamespace(**{**base, "causal": False, "cc": (9, 0), "device": None,
                                      "varlen": False, "kv_cache": False, attr: True})
        assert s.three_consumers(stand_in) is None, attr


def test_forcing(walk, monkeypatch):
    assert walk("sm80", head_dim=64)[0] == "sm80_attention"
    assert walk("sm90", head_dim=64)[0] == "sm90_attention"
    assert walk("sm90:n64_2s", head_dim=64) == ("sm90_attention", "n64_2s")
    # a forced TMA configuration is chosen as asked; its launch runs the cp.async twin where no
    # tensor map fits (seqlen_k == 0 here), see test_print_config_names_the_tma_fallback
    assert walk("sm90:n128_2s_fx_tma", head_dim=64, seqlen_k=0) == ("sm90_attention",
                                                                    "n128_2s_fx_tma")
    # forcing sm90 where it cannot run falls back to the portable kernel, without an error
    assert walk("sm90", head_dim=32)[0] == "sm80_attention"
    assert walk("sm90:n64_2s", head_dim=64, cc=(8, 0))[0] == "sm80_attention"
    monkeypatch.setenv("NUMBATC_ATTN_CONFIG", "m64n64_w4_qreg")  # the portable kernel's own
    assert walk("sm80", head_dim=64) == ("sm80_attention", "m64n64_w4_qreg")


def test_the_emulation_runs_the_portable_kernel_unless_told(walk, monkeypatch):
    monkeypatch.setattr(dispatch, "_EMULATED", True)
    assert walk(head_dim=64)[0] == "sm80_attention"
    assert walk("sm90", head_dim=64)[0] == "sm90_attention"


@pytest.mark.parametrize("env", ["sm100", "sm80:m64n64_w4_qreg", ":x", "sm90x"])
def test_forcing_errors(walk, env):
    with pytest.raises(ValueError, match=re.escape(
            f"NUMBATC_ATTN_KERNEL={env!r}: choose decode[:<config>] or sm80 or sm90[:<config>]")):
        walk(env)


def test_unknown_config_is_an_error_on_any_gpu(walk):
    with pytest.raises(ValueError, match=re.escape(
            "NUMBATC_ATTN_KERNEL='sm90:nope': no sm90 config 'nope'; choose from "
            f"{sorted(sm90_attention.CONFIGS)}")):
        walk("sm90:nope", cc=(8, 0))


def test_print_config_says_why_sm90_was_passed_over(walk, monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    decode = "numbatc.attention: {}, not sm80_decode_attention: {}\n"
    walk(head_dim=32)
    assert capsys.readouterr().err == (
        decode.format("sm80_attention", "seqlen_q 100 > 16 (not decode-shaped)")
        + "numbatc.attention: sm80_attention, not sm90_attention: head_dim 32 is not one of "
        "(64, 96, 128, 192, 256)\n")
    walk("sm80")
    assert capsys.readouterr().err == (
        decode.format("sm80_attention", "NUMBATC_ATTN_KERNEL=sm80")
        + "numbatc.attention: sm80_attention, not sm90_attention: NUMBATC_ATTN_KERNEL=sm80\n")
    walk(head_dim=64, cc=(8, 0))  # a kernel for another GPU: not worth a word
    assert capsys.readouterr().err == decode.format("sm80_attention",
                                                    "seqlen_q 100 > 16 (not decode-shaped)")
    walk(head_dim=64)  # sm90 taken: its launch prints the choice
    assert capsys.readouterr().err == decode.format("sm90_attention",
                                                    "seqlen_q 100 > 16 (not decode-shaped)")


def test_default_head_dims_switch(walk, monkeypatch, capsys):
    """sm90_attention.DEFAULT_HEAD_DIMS: the head dims the default walk sends to the Hopper
    kernel; the others it computes run the portable kernel unless NUMBATC_ATTN_KERNEL=sm90[:cfg]
    forces them, and NUMBATC_PRINT_CONFIG says so."""
    monkeypatch.setattr(sm90_attention, "DEFAULT_HEAD_DIMS", (64, 128))
    assert walk(head_dim=256) == ("sm80_attention", "m128n32_w8_qsmem")
    assert walk(head_dim=192)[0] == "sm80_attention"
    assert walk(head_dim=128)[0] == "sm90_attention"
    assert walk("sm90", head_dim=256) == ("sm90_attention", sm90_attention.DEFAULT_TMA[256])
    assert walk("sm90:n80_2s_ov_pp_fx", head_dim=256) == ("sm90_attention", "n80_2s_ov_pp_fx")
    with pytest.raises(ValueError, match=r"'n128_2s_ov_pp_fx_tma' is for head_dim \(64, 96, 128\), "
                                         "not 256; choose from"):
        walk("sm90:n128_2s_ov_pp_fx_tma", head_dim=256)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    capsys.readouterr()
    walk(head_dim=256)
    assert ("numbatc.attention: sm80_attention, not sm90_attention: head_dim 256 is not in "
            "sm90_attention.DEFAULT_HEAD_DIMS (64, 128) (NUMBATC_ATTN_KERNEL=sm90 forces it)\n"
            ) in capsys.readouterr().err
    monkeypatch.setattr(sm90_attention, "DEFAULT_HEAD_DIMS", (64, 128, 192, 256))
    assert walk(head_dim=256) == ("sm90_attention", sm90_attention.DEFAULT_TMA[256])
    assert walk("sm80", head_dim=256)[0] == "sm80_attention"


def test_print_config_names_the_tma_fallback(monkeypatch, capsys):
    """numbatc.attention forced onto a TMA configuration with seqlen_k == 0: the cp.async twin
    is launched, and its line says why (the launches themselves replaced by recorders)."""
    from numbatc.kernels import sm90_attention_tma

    ran = []
    monkeypatch.setattr(sm90_attention, "launch_flat", lambda cfg, var, *a, **k: ran.append(cfg))
    monkeypatch.setattr(sm90_attention_tma, "launch_attention", lambda p, cfg, var: ran.append(cfg))
    monkeypatch.setattr(sm80_attention, "kernel_arguments", lambda p, keep: ((), 0))
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "sm90:n128_2s_ov_pp_fx_tma")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    numbatc.attention(*qkv(sk=0))
    assert [c.name for c in ran] == ["n128_2s_ov_pp_fx"]
    assert capsys.readouterr().err == (
        "numbatc.attention: sm90_attention, not sm80_decode_attention: "
        "NUMBATC_ATTN_KERNEL=sm90:n128_2s_ov_pp_fx_tma\n"
        "numbatc.attention B=2 Sq=5 Sk=0 Hq=4 Hkv=2 D=64: sm90_attention n128_2s_ov_pp_fx "
        "float16 (not n128_2s_ov_pp_fx_tma: seqlen_k is 0 (no key to load)) "
        "[named by NUMBATC_ATTN_KERNEL]\n")


# --- numbatc.attention_varlen ------------------------------------------------------------------


@pytest.fixture
def cu_values(monkeypatch):
    """Device prefix sums as fakes whose values the check reads from this dict (ptr -> values);
    ``cu(values)`` makes one."""
    from numbatc import attention_api

    held = {}
    monkeypatch.setattr(attention_api, "_read_back_later",
                        lambda cas, stream: lambda: [held[ca.ptr] for ca in cas])
    monkeypatch.setattr(attention_api, "_host_to_device", lambda ca, host, stream: None)

    def cu(vals, dtype="int32", **kw):
        f = FakeCuda((len(vals),), dtype, **kw)
        held[f.ptr] = np.array(vals)
        return f
    return cu


def varlen_qkv(tq=12, tk=20, hq=4, hkv=2, d=64, dtype="float16"):
    return (FakeCuda((tq, hq, d), dtype), FakeCuda((tk, hkv, d), dtype),
            FakeCuda((tk, hkv, d), dtype))


def test_varlen_problem_reaches_the_hopper_kernel(launched, cu_values):
    q, k, v = varlen_qkv()
    out, lse = numbatc.attention_varlen(q, k, v, cu_values([0, 5, 5, 12]),
                                        cu_values([0, 0, 9, 20]), 7, 11, causal=True,
                                        return_lse=True)
    (p,) = launched
    assert p.varlen and (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.group) == (3, 7, 11, 4, 2)
    assert p.q.shape == p.out.shape == out.shape == (12, 4, 64) and p.lse.shape == lse.shape == (4, 12)
    assert p.cu_seqlens_q.dtype == "int32" and p.causal
    # head_dim 64 on the fake 9.0 GPU: sm90_attention's default TMA configuration (not
    # persistent: its work tiles assume one sequence length), the portable kernel when forced,
    # and a clear error for a persistent configuration named
    module, cfg = dispatch.choose_attention(p)
    assert module is sm90_attention and cfg.name == "n128_2s_ov_pp_fx_tma" and not cfg.persistent
    with pytest.raises(ValueError, match="persistent, which has no varlen variant"):
        sm90_attention.choose(p, "n128_2s_ov_pp_fx_tma_pt")
    numbatc.attention_varlen(*varlen_qkv(d=40), cu_values([0, 5, 5, 12]), cu_values([0, 0, 9, 20]),
                             7, 11)
    assert dispatch.choose_attention(launched[1])[0] is sm80_attention  # head_dim 40: portable


def test_varlen_host_cu_seqlens_are_copied(launched, cu_values):
    q, k, v = varlen_qkv()
    numbatc.attention_varlen(q, k, v, [0, 5, 12], np.array([0, 9, 20], np.int64), 7, 11)
    (p,) = launched
    assert p.cu_seqlens_q.dtype == p.cu_seqlens_k.dtype == "int32"
    assert p.cu_seqlens_q.shape == (3,)


def test_varlen_empty_launches_nothing(launched, cu_values):
    q, k, v = varlen_qkv(tq=0)
    out = numbatc.attention_varlen(q, k, v, cu_values([0, 0]), cu_values([0, 20]), 0, 20)
    assert out.shape == (0, 4, 64) and not launched
    q, k, v = varlen_qkv(tq=0, tk=0)
    numbatc.attention_varlen(q, k, v, cu_values([0]), cu_values([0]), 0, 0)  # no sequence
    assert not launched


@pytest.mark.parametrize("cq, ck, mq, mk, msg", [
    ([1, 5, 12], [0, 9, 20], 7, 11, "cu_seqlens_q must start at 0"),
    ([0, 7, 5, 12], [0, 9, 9, 20], 7, 11, r"must not decrease: cu_seqlens_q\[2\] = 5"),
    ([0, 5, 11], [0, 9, 20], 7, 11, "cu_seqlens_q's last entry 11 must be the number of rows"),
    ([0, 5, 12], [0, 9, 21], 7, 11, "cu_seqlens_k's last entry 21"),
    ([0, 5, 12], [0, 9, 20], 6, 11, r"max_seqlen_q \(6\) is smaller than sequence 1's length 7"),
    ([0, 5, 12], [0, 9, 20], 7, 10, r"max_seqlen_k \(10\) is smaller than sequence 1's length 11"),
    ([0, 5, 12], [0, 20], 7, 20, "must have one shape"),
])
def test_varlen_bad_prefix_sums(launched, cu_values, cq, ck, mq, mk, msg):
    """Device prefix sums are read back while the kernel runs (it clamps any value): their
    error comes after the launch; host ones are checked before anything runs."""
    q, k, v = varlen_qkv()
    with pytest.raises(ValueError, match=msg):
        numbatc.attention_varlen(q, k, v, cu_values(cq), cu_values(ck), mq, mk)
    assert len(launched) == (0 if "one shape" in msg else 1)
    launched.clear()
    with pytest.raises(ValueError, match=msg):  # host arrays: the same checks
        numbatc.attention_varlen(q, k, v, np.array(cq), ck, mq, mk)
    assert not launched


def test_varlen_bad_cu_seqlens_arrays(cu_values):
    q, k, v = varlen_qkv()
    good = cu_values([0, 5, 12])
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        numbatc.attention_varlen(q, k, v, cu_values([0, 5, 12], "int64"), good, 7, 11)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be 1-D \(batch \+ 1,\)"):
        numbatc.attention_varlen(q, k, v, good, FakeCuda((3, 1), "int32"), 7, 11)
    with pytest.raises(ValueError, match="cu_seqlens_q must be 1-D"):
        numbatc.attention_varlen(q, k, v, [], [], 7, 11)
    with pytest.raises(ValueError, match="cu_seqlens_q must be contiguous"):
        numbatc.attention_varlen(q, k, v, FakeCuda((3,), "int32", strides=(2,)), good, 7, 11)
    with pytest.raises(ValueError, match="device"):
        numbatc.attention_varlen(q, k, v, cu_values([0, 5, 12], device=1), good, 7, 11)
    with pytest.raises(TypeError, match="must hold integers"):
        numbatc.attention_varlen(q, k, v, [0.0, 5.0, 12.0], good, 7, 11)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
        numbatc.attention_varlen(q, k, v, good, good, 7.0, 11)
    with pytest.raises(ValueError, match="max_seqlen_k must be in 0"):
        numbatc.attention_varlen(q, k, v, good, good, 7, -1)


def test_varlen_bad_operands(cu_values):
    cq, ck = cu_values([0, 5, 12]), cu_values([0, 9, 20])
    q, k, v = varlen_qkv()
    with pytest.raises(ValueError, match=r"q must be 3-D \(total_q, heads_q, head_dim\)"):
        numbatc.attention_varlen(FakeCuda((1, 12, 4, 64)), k, v, cq, ck, 7, 11)
    with pytest.raises(TypeError, match="one dtype"):
        numbatc.attention_varlen(bf16((12, 4, 64)), k, v, cq, ck, 7, 11)
    with pytest.raises(ValueError, match="head_dim 64 but k and v have head_dim 32"):
        numbatc.attention_varlen(q, *varlen_qkv(d=32)[1:], cq, ck, 7, 11)
    with pytest.raises(ValueError, match=r"heads_q \(4\) must be a multiple of heads_kv \(3\)"):
        numbatc.attention_varlen(q, *varlen_qkv(hkv=3)[1:], cq, ck, 7, 11)
    with pytest.raises(ValueError, match="out must have q's shape"):
        numbatc.attention_varlen(q, k, v, cq, ck, 7, 11, out=FakeCuda((12, 4, 32)))


def test_print_config_names_the_rule_that_chose():
    # NUMBATC_PRINT_CONFIG's reason (sm90_attention.why_chosen) names the table that picked
    s = sm90_attention
    for kw, table in ((dict(seqlen_q=256, seqlen_k=4096), "LONG_KEY_TILES[64]"),
                      (dict(batch=16, seqlen_q=1024, seqlen_k=1024, heads_q=32, heads_kv=32),
                       "THREE_CONSUMERS[64]"),
                      (dict(seqlen_q=256, seqlen_k=256), "DEFAULT_TMA[64]")):
        p = attention_problem(**kw)
        assert s.why_chosen(p, s.choose(p)).startswith(table), kw
