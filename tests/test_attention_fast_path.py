"""numbatc.attention's warm call without a GPU: the cache of validated calls (numbatc._warm.CACHE)
and its key.  ``dispatch.launch_attention`` is replaced by a recorder that returns a recording
relaunch function, so a call either goes through the checks and the walk (the recorder sees the
AttentionProblem) or is warm (only the relaunch function sees one).  Arrays are the stand-ins of
tests/helpers/fake_arrays.py (a fake torch; fake pointers).  The emulated answer of warm calls:
tests/emulation/test_attention_warm_emulated.py."""

import dataclasses
import math

import numpy as np
import pytest

import numbatc
from numbatc import _warm, attention_api
from numbatc.kernels import dispatch
from tests.helpers.fake_arrays import T, fake_torch, no_gpu, value_devices  # noqa: F401

attention = numbatc.attention


class Recorder:
    def __init__(self):
        self.checked = []  # AttentionProblems that went through the checks and the walk
        self.relaunched = []  # AttentionProblems of the warm calls

    def launch_attention(self, p):
        self.checked.append(p)
        return self.relaunched.append


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(dispatch, "launch_attention", r.launch_attention)
    for var in dispatch._ATTN_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    _warm.CACHE.clear()
    yield r
    _warm.CACHE.clear()


@pytest.fixture
def torch(monkeypatch):
    return value_devices(fake_torch(monkeypatch, current_stream=0x5150))


def qkv(torch, b=2, sq=5, sk=7, hq=4, hkv=2, d=64, dtype="float16", device=0):
    return (T(torch, (b, sq, hq, d), dtype, device=device),
            T(torch, (b, sk, hkv, d), dtype, device=device),
            T(torch, (b, sk, hkv, d), dtype, device=device))


def _same_but_arrays(warm, checked):
    """The warm problem equals the checked one in every field but the arrays (and scale)."""
    skip = {"q", "k", "v", "out", "lse", "scale"}
    return all(getattr(warm, f.name) == getattr(checked, f.name)
               for f in dataclasses.fields(checked) if f.name not in skip)


def test_second_call_is_warm_and_launches_the_same(rec, torch):
    q, k, v = qkv(torch)
    out = T(torch, q.shape)
    assert attention(q, k, v, causal=True, out=out) is out
    assert len(rec.checked) == 1 and len(_warm.CACHE) == 1
    q2, k2, v2 = qkv(torch)
    out2 = T(torch, q.shape)
    assert attention(q2, k2, v2, causal=True, out=out2) is out2
    assert len(rec.checked) == 1  # no checks, no walk
    (p,) = rec.relaunched
    assert (p.q.ptr, p.k.ptr, p.v.ptr, p.out.ptr) == (q2.ptr, k2.ptr, v2.ptr, out2.ptr)
    assert p.q.obj is q2 and p.lse is None and p.stream_handle == 0x5150
    assert p.scale == rec.checked[0].scale == 1 / math.sqrt(64)
    assert _same_but_arrays(p, rec.checked[0])


def test_warm_call_allocates_out_and_lse(rec, torch):
    attention(*qkv(torch), return_lse=True, scale=0.5)
    out, lse = attention(*qkv(torch), return_lse=True, scale=0.25)
    assert len(rec.checked) == 1
    (p,) = rec.relaunched
    assert out.shape == (2, 5, 4, 64) and out.dtype is torch.float16
    assert lse.shape == (2, 4, 5) and lse.dtype is torch.float32
    assert (p.out.ptr, p.lse.ptr, p.scale) == (out.ptr, lse.ptr, 0.25)
    assert _same_but_arrays(p, rec.checked[0])


def _variants(torch):
    """(name, kwargs) pairs: each differs from the base in one thing the checks or the walk
    read."""
    def base(**over):
        q, k, v = qkv(torch)
        kw = dict(q=q, k=k, v=v, out=T(torch, q.shape))
        kw.update(over)
        return kw

    q, k, v = qkv(torch)
    return [
        ("base", base()),
        ("seqlen_q", base(q=T(torch, (2, 6, 4, 64)), out=T(torch, (2, 6, 4, 64)))),
        ("seqlen_k", base(k=T(torch, (2, 9, 2, 64)), v=T(torch, (2, 9, 2, 64)))),
        ("heads_kv", base(k=T(torch, (2, 7, 4, 64)), v=T(torch, (2, 7, 4, 64)))),
        ("head_dim", dict(zip("qkv", qkv(torch, d=32)))),
        ("q strides", base(q=T(torch, q.shape, strides=(5 * 12 * 64, 12 * 64, 64, 1)))),
        ("out strides", base(out=T(torch, q.shape, strides=(5 * 4 * 72, 4 * 72, 72, 1)))),
        ("dtype", dict(zip("qkv", qkv(torch, dtype="bfloat16")))),
        ("device", dict(zip("qkv", qkv(torch, device=1)))),
        ("no out", base(out=None)),
        ("causal", base(causal=True)),
        ("return_lse", base(return_lse=True)),
        ("scale given", base(scale=0.5)),
    ]


def test_key_changes_with_everything_the_checks_read(rec, torch, monkeypatch):
    attention_api._env_key = dispatch.attention_env_key
    keys = {}
    for name, kw in _variants(torch):
        kw = dict(kw)
        key, _ = attention_api._warm_key(kw.pop("q"), kw.pop("k"), kw.pop("v"),
                                         kw.pop("out", None), kw.pop("causal", False),
                                         kw.pop("scale", None), kw.pop("return_lse", False))
        assert not kw and key is not None
        assert key not in keys.values(), f"{name} has the key of {keys}"
        keys[name] = key
    for var, value in (("NUMBATC_ATTN_KERNEL", "sm80"), ("NUMBATC_ATTN_CONFIG", "m64n64_w4_qreg"),
                       ("NUMBATC_PRINT_CONFIG", "1")):
        monkeypatch.setenv(var, value)
        key, _ = attention_api._warm_key(*qkv(torch), None, False, None, False)
        assert key not in keys.values(), var
        keys[var] = key


def test_every_variant_warms(rec, torch):
    for name, kw in _variants(torch):
        _warm.CACHE.clear()
        n = len(rec.checked)
        attention(**kw)
        attention(**{k: v for k, v in _variants(torch)}[name])
        assert len(rec.checked) == n + 1, f"{name}: second call was not warm"
        assert _same_but_arrays(rec.relaunched[-1], rec.checked[-1]), name


def test_no_warm_path_for_odd_arguments(rec, torch):
    """causal / return_lse not bools, scale neither None nor an int or float: the checks run on
    every call (and accept what they accept)."""
    for kw in (dict(causal=1), dict(causal=np.True_), dict(return_lse=np.False_),
               dict(scale=np.float32(0.5)), dict(scale=True)):
        _warm.CACHE.clear()
        n = len(rec.checked)
        for _ in range(2):
            try:
                attention(*qkv(torch), **kw)
            except TypeError:
                pass  # causal=1, scale=True: the checks name them
        assert not rec.relaunched, kw
        assert len(_warm.CACHE) == 0 and len(rec.checked) - n in (0, 2), kw


def test_warm_cache_still_rejects_bad_calls(rec, torch):
    q, k, v = qkv(torch)
    out = T(torch, q.shape)
    attention(q, k, v, out=out, scale=0.5)
    attention(q, k, v, out=T(torch, q.shape), scale=0.5)
    assert len(rec.checked) == 1 and len(rec.relaunched) == 1
    bad = [
        (dict(scale=-1.0), ValueError, "scale must be a positive finite number"),
        (dict(scale=math.nan), ValueError, "scale must be a positive finite number"),
        (dict(scale=math.inf), ValueError, "scale must be a positive finite number"),
        (dict(scale=10**400), OverflowError, "int too large"),
        (dict(causal=1), TypeError, "causal must be True or False"),
        (dict(k=T(torch, (2, 7, 3, 64))), ValueError, "k and v must have the same shape"),
        (dict(v=T(torch, (2, 7, 2, 64), "bfloat16")), TypeError, "q, k and v must have one dtype"),
        (dict(out=T(torch, q.shape, "bfloat16")), TypeError, "out has dtype bfloat16"),
        (dict(out=T(torch, (2, 5, 4, 64), strides=(0, 256, 64, 1))), ValueError, "overlapping"),
        # out over q, k or v: same key as the warm call, caught by the byte-range test
        (dict(out=T(torch, q.shape, ptr=q.ptr)), ValueError, "out overlaps q"),
        (dict(out=T(torch, q.shape, ptr=v.ptr + 128)), ValueError, "out overlaps v"),
    ]
    for over, exc, msg in bad:
        kw = dict(q=q, k=k, v=v, out=out, scale=0.5)
        kw.update(over)
        with pytest.raises(exc, match=msg):
            attention(**kw)
    assert len(rec.checked) == 1 and len(rec.relaunched) == 1


def test_env_change_goes_back_through_the_walk(rec, torch, monkeypatch):
    q, k, v = qkv(torch)
    attention(q, k, v)
    attention(q, k, v)
    assert len(rec.checked) == 1
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "sm80")
    attention(q, k, v)
    assert len(rec.checked) == 2


def test_the_walk_hands_back_its_choice_unless_printing(monkeypatch, capsys):
    """dispatch.launch_attention's relaunch function is the chosen module's launch of the chosen
    configuration; with NUMBATC_PRINT_CONFIG set there is none (each call prints)."""
    from numbatc.kernels import sm80_attention, sm90_attention
    from tests.helpers.problems import attention_problem

    ran = []
    for module in (sm80_attention, sm90_attention):
        monkeypatch.setattr(module, "launch", lambda p, cfg, m=module: ran.append((m, p, cfg)))
    for var in dispatch._ATTN_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    p, p2 = attention_problem(head_dim=128), attention_problem(head_dim=128)
    relaunch = dispatch.launch_attention(p)
    relaunch(p2)
    (m, _, cfg), again = ran
    assert m is sm90_attention and again == (sm90_attention, p2, cfg)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    assert dispatch.launch_attention(attention_problem(head_dim=32)) is None
    assert "sm80_attention, not sm90_attention" in capsys.readouterr().err


def test_warm_call_takes_the_pointer_relaunch(rec, torch, monkeypatch):
    """Where the kernel module handed back a pointer relaunch (dispatch.AttentionRelaunch.fast),
    a warm call passes it the pointers (lse's allocated, the default scale, the stream) and
    builds no problem; where it declines (False: a start not 16-byte aligned), the problem
    path runs."""
    calls, answer = [], [True]

    def fast(*args):
        calls.append(args)
        return answer[0]

    def launch_attention(p):
        rec.checked.append(p)
        return dispatch.AttentionRelaunch(None, None, fast)

    monkeypatch.setattr(dispatch, "launch_attention", launch_attention)
    monkeypatch.setattr(dispatch.AttentionRelaunch, "__call__",
                        lambda self, p: rec.relaunched.append(p))
    attention(*qkv(torch), return_lse=True)
    q, k, v = qkv(torch)
    out, lse = attention(q, k, v, return_lse=True)
    assert len(rec.checked) == 1 and rec.relaunched == []
    assert calls == [(q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, 1 / math.sqrt(64), 0x5150)]
    answer[0] = False
    q, k, v = qkv(torch)
    out = attention(q, k, v, scale=0.5)  # another key (scale given): checked, then warm
    out = attention(q, k, v, scale=0.5)
    (p,) = rec.relaunched
    assert calls[-1][:3] == (q.ptr, k.ptr, v.ptr) and calls[-1][4:6] == (0, 0.5)
    assert (p.q.ptr, p.out.ptr, p.scale) == (q.ptr, out.ptr, 0.5)
    # declined with lse: the problem path gets the lse the warm call allocated for the pointers
    attention(q, k, v, return_lse=True)
    out, lse = attention(q, k, v, return_lse=True)
    p = rec.relaunched[-1]
    assert calls[-1][4] == lse.ptr == p.lse.ptr and p.out.ptr == out.ptr


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_warm_call_passes_the_value_pointers(rec, torch, monkeypatch, paged):
    """attention_with_kvcache: the second call of a signature (device cache_seqlens and block
    table) is warm: the pointer relaunch gets kv=(cache_seqlens, block_table) -- cache_seqlens
    twice for a contiguous cache -- and the values are still read back and checked (a
    ValueError for a page outside k_cache); host cache_seqlens never warm."""
    calls, values = [], {}

    def fast(*args, **kw):
        calls.append((args, kw))
        return True

    monkeypatch.setattr(dispatch, "launch_attention",
                        lambda p: rec.checked.append(p) or dispatch.AttentionRelaunch(None, None,
                                                                                      fast))
    monkeypatch.setattr(attention_api, "_read_back_later",
                        lambda cas, stream: lambda: [values[ca.ptr] for ca in cas])
    monkeypatch.setattr(attention_api, "_host_to_device", lambda ca, host, stream: None)

    def inputs(table_values=(0, 1, 2, 3)):
        q = T(torch, (2, 1, 8, 64))
        kv = (6, 16, 2, 64) if paged else (2, 64, 2, 64)
        seqlens = T(torch, (2,), "int32")
        values[seqlens.ptr] = np.array([20, 33], np.int32)
        table = None
        if paged:
            table = T(torch, (2, 4), "int32")
            values[table.ptr] = np.array(table_values, np.int32).reshape(2, 2).repeat(2, 1)
        return q, T(torch, kv), T(torch, kv), seqlens, table

    run = numbatc.attention_with_kvcache
    q, k, v, seqlens, table = inputs()
    run(q, k, v, seqlens, block_table=table)
    q, k, v, seqlens, table = inputs()
    out = run(q, k, v, seqlens, block_table=table)
    assert len(rec.checked) == 1 and len(calls) == 1
    args, kw = calls[0]
    assert args == (q.ptr, k.ptr, v.ptr, out.ptr, 0, 1 / math.sqrt(64), 0x5150)
    assert kw == {"kv": (seqlens.ptr, table.ptr if paged else seqlens.ptr)}
    if paged:
        q, k, v, seqlens, table = inputs((0, 1, 2, 6))  # page 6 of 6 pages
        with pytest.raises(ValueError, match=r"block_table\[1, 2\] = 6 is not a page"):
            run(q, k, v, seqlens, block_table=table)
        assert len(rec.checked) == 1 and len(calls) == 2  # launched warm, then checked
    for _ in range(2):
        run(q, k, v, np.array([3, 4]), block_table=table if not paged else inputs()[4])
    assert len(rec.checked) == 3
