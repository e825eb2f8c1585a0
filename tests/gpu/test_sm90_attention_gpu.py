"""numbatc.attention forced onto the Hopper kernel (``NUMBATC_ATTN_KERNEL=sm90[:<config>]``) on an
sm_90a GPU, against tests/helpers/attention.py's float64 reference and tolerances: sequence
lengths 1, primes, tile edges and 1023, seqlen_q != seqlen_k both ways, causal and not, head_dim
64, 128, 192 and 256 (each configuration at its own), MHA, GQA and MQA, bf16 and f16, Numba and
torch arrays, strided and misaligned views; outputs poisoned (NaN) before every call, fresh random data every run; lse checked.
Every call also checks that sm90_attention (not the sm80 fallback) ran, with the config asked
for.  The TMA configurations (_tma) also on FlashAttention's hard seqlen pairs (113 x 203,
1023 x 1024, 1 x 239 ...), odd batch and head counts, heads-major (transposed) and packed QKV
views, and their fallback to the cp.async twin for operands no tensor map describes
(misaligned k, seqlen_k 0), which NUMBATC_PRINT_CONFIG=1 names.  The emulated subset lives in
tests/emulation/test_sm90_attention_emulated.py.

Run on the H200:  python3 -m pytest -q tests/gpu/test_sm90_attention_gpu.py
(``-k sweep`` for the sweep only; ``-k tma`` the TMA configurations; ``-k large`` head_dim 192
and 256; ``-s -k timing`` prints sm90 against sm80 timings).  scripts/gpu_attention_tma.sh runs
them in shards, then the benchmark."""

import math

import numpy as np
import pytest

from numbatc.kernels import sm90_attention

pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.hardware_only]
pytest.importorskip("ml_dtypes")

from tests.helpers import attention as base  # noqa: E402
from tests.helpers.attention import sm90  # noqa: E402,F401 (the fixture)

check = base.check
#: the TMA configurations of head_dim 64 and 128 (each falls back to sm90_attention.twin where
#: no tensor map fits)
TMA_CONFIGS = sorted(n for n, c in sm90_attention.CONFIGS.items() if c.tma and 128 in c.head_dims)
#: (configuration, head dim) of head_dim 192 and 256 (their tiles fit those head dims only) and
#: 96 (the 64B swizzle: three boxes or parts per row)
LARGE = sorted((n, d) for n, c in sm90_attention.CONFIGS.items() for d in c.head_dims
               if d > 128 or d == 96)
#: every (configuration, head dim) the kernel is built for
PAIRS = sorted((n, d) for n, c in sm90_attention.CONFIGS.items() for d in c.head_dims)
#: the sweep's seqlen pairs: the portable kernel's and FlashAttention's test suite's hard ones
SEQLENS = base.SEQLENS + [(113, 203), (1023, 1024), (1, 239), (239, 1), (1024, 1023), (3, 1024)]


def test_small_cases_first(sm90):
    """The emulated cases (tests/emulation/test_sm90_attention_emulated.py), on the hardware."""
    for name, args in [
        ("n128_2s", (1, 1, 1, 1, 1, 64, False, "bfloat16")),
        ("n128_2s", (1, 70, 70, 2, 1, 64, True, "float16")),
        ("n128_2s", (1, 130, 70, 1, 1, 128, True, "bfloat16")),
        ("n128_2s_ov", (1, 40, 300, 1, 1, 128, False, "float16")),
        ("n64_2s_ov", (1, 33, 200, 3, 1, 64, True, "bfloat16")),
        ("n64_2s", (1, 64, 129, 1, 1, 128, True, "float16")),
        ("n128_3s_ov", (1, 20, 400, 2, 2, 64, False, "bfloat16")),
        ("n128_2s_ov", (1, 5, 0, 2, 2, 64, False, "bfloat16")),
    ]:
        used = sm90(name)
        check(*args)
        assert used == [name]


TMA_SMALL = [
    ("n128_2s_fx_tma", (1, 1, 239, 1, 1, 64, False, "bfloat16")),
    ("n128_2s_ov_pp_fx_tma", (1, 113, 203, 2, 1, 128, True, "bfloat16")),
    ("n128_2s_ov_pp_fx_tma", (1, 130, 30, 1, 1, 64, True, "float16")),
    ("n128_3s_ov_pp_fx_tma", (1, 40, 520, 3, 1, 128, False, "bfloat16")),
    ("n128_2s_ov_fx_tma", (3, 20, 70, 1, 1, 64, True, "float16")),
    ("n128_2s_ov_pp_fx_tma_pt", (1, 400, 30, 3, 1, 128, True, "float16")),
    ("n128_2s_ov_pp_fx_tma_pt", (2, 150, 239, 2, 1, 64, False, "bfloat16")),
    ("n176_2s_ov_pp_fx_tma", (1, 130, 400, 2, 1, 64, True, "bfloat16")),
    ("n176_2s_ov_pp_fx_tma", (1, 70, 500, 1, 1, 128, False, "float16")),
    ("n176_2s_ov_pp_fx_tma", (1, 40, 300, 2, 1, 96, False, "bfloat16")),
    ("m192_n128_2s_ov_pp_fx_tma", (1, 150, 300, 1, 1, 64, True, "bfloat16")),
    ("m192_n128_3s_ov_pp_fx_tma", (1, 250, 70, 1, 1, 64, True, "float16")),
    ("m192_n128_3s_ov_pp_fx_tma", (1, 40, 520, 2, 1, 64, False, "bfloat16")),
    ("m192_n128_2s_ov_pp_fx_tma", (1, 191, 129, 1, 1, 64, False, "float16")),
]


@pytest.mark.parametrize("name, args", TMA_SMALL, ids=[f"{n}-{a[1]}x{a[2]}" for n, a in TMA_SMALL])
def test_tma_small_cases_first(sm90, name, args):
    """The emulated TMA cases (tests/emulation/test_sm90_attention_emulated.py), on the
    hardware."""
    used = sm90(name)
    check(*args)
    assert used == [name]


@pytest.mark.parametrize("name, d", PAIRS, ids=[f"{n}-{d}" for n, d in PAIRS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sweep(sm90, name, d, causal, dtype):
    gen = np.random.default_rng()
    used = sm90(name)
    for sq, sk in SEQLENS:
        hq, hkv = base.HEADS[int(gen.integers(len(base.HEADS)))]
        b = int(gen.integers(1, 4))
        check(b, sq, sk, hq, hkv, d, causal, dtype)
    assert used == [name] * len(SEQLENS)


@pytest.mark.parametrize("name", TMA_CONFIGS)
def test_tma_many_blocks(sm90, name):
    """More work tiles than SMs (several waves; a persistent grid walks several tiles per
    block), long key loops, causal and not."""
    used = sm90(name)
    check(2, 2048, 2048, 8, 2, 128, True, "bfloat16")
    check(3, 1000, 3000, 6, 1, 64, True, "float16")
    check(1, 4096, 1024, 4, 4, 64, False, "bfloat16")
    assert used == [name] * 3


def test_persistent_l2_sections(sm90, monkeypatch):
    """The persistent causal order in L2 sections (n128_2s_ov_pp_fx_tma_pt_l2): its 32 MB
    budget over 24 heads of 8192 keys (sections of 8 heads), then budgets of 1 and 2 kv heads'
    K and V forced on GQA grids of several waves (short last sections; 3 query heads a kv
    head), each against the float64 reference."""
    import dataclasses

    name = "n128_2s_ov_pp_fx_tma_pt_l2"
    used = sm90(name)
    check(1, 256, 8192, 24, 24, 128, True, "bfloat16")
    assert used == [name]
    base = sm90_attention.CONFIGS[name]
    for kv_heads, args in ((1, (2, 1500, 700, 12, 4, 64, True, "float16")),
                           (2, (3, 1000, 1100, 15, 5, 128, True, "bfloat16"))):
        D, sk = args[5], args[2]
        cfg = dataclasses.replace(base, name=f"{name}_{kv_heads}", l2_budget=kv_heads * sk * D * 4)
        monkeypatch.setitem(sm90_attention.CONFIGS, cfg.name, cfg)
        used = sm90(cfg.name)
        check(*args)
        assert used == [cfg.name]


THREE = sorted(n for n, c in sm90_attention.CONFIGS.items() if c.consumers == 3)


@pytest.mark.parametrize("name", THREE)
def test_three_consumers_many_blocks(sm90, name):
    """Three consumer warpgroups (192-row blocks, the turn passed 1 -> 2 -> 3 -> 1): several
    waves, long key loops, causal with seqlen_q > seqlen_k, GQA, rows past a 192 multiple."""
    used = sm90(name)
    check(3, 1000, 3000, 6, 1, 64, True, "float16")
    check(1, 4096, 1024, 4, 4, 64, False, "bfloat16")
    check(2, 2048, 2048, 8, 2, 64, True, "bfloat16")
    check(2, 1500, 700, 3, 1, 64, True, "float16")
    check(1, 577, 4099, 16, 8, 64, False, "float16")
    assert used == [name] * 5


def test_default_walk_takes_three_consumers_on_full_grids(sm90):
    """sm90_attention.THREE_CONSUMERS: head_dim 64's default is the 192-row configuration where
    the grid holds enough 192-row tiles (2.5 an SM, 8 causal, at 132 SMs), causal or not, GQA,
    seqlen_q != seqlen_k, rows past a 192 multiple; a grid below the mark keeps the default."""
    rule = sm90_attention.THREE_CONSUMERS[64]
    used = sm90()
    check(2, 1024, 1024, 32, 8, 64, False, "bfloat16")  # 384 tiles
    check(2, 1000, 3000, 40, 8, 64, False, "float16")  # 480
    check(4, 2048, 2048, 24, 24, 64, True, "bfloat16")  # 1056
    check(3, 2100, 2500, 32, 4, 64, True, "float16")  # 1056, the mask off the diagonal
    check(1, 1024, 1024, 32, 32, 64, False, "bfloat16")  # 192: below 2.5 an SM
    assert used == [rule.config] * 4 + [sm90_attention.choose_config(64).name]


def test_many_blocks_and_long_sequences(sm90):
    """Grids of many blocks (all 132 SMs busy, several waves) and long key loops."""
    used = sm90()
    check(2, 2048, 2048, 8, 2, 128, True, "bfloat16")
    check(1, 4096, 4096, 4, 4, 64, False, "float16")
    check(3, 1000, 3000, 6, 1, 64, True, "bfloat16")
    # not causal with 4096 keys: head_dim 64's long key tiles (LONG_KEY_TILES)
    long64, reach = sm90_attention.LONG_KEY_TILES[64]
    assert reach <= 4096
    assert used == [sm90_attention.choose_config(128).name, long64,
                    sm90_attention.choose_config(64).name]


def test_scale_and_large_scores(sm90):
    sm90()
    check(1, 200, 300, 2, 1, 64, False, scale=1.0)
    check(1, 200, 300, 2, 1, 128, True, scale=0.5)


def test_torch_arrays_views_and_misaligned_inputs(sm90):
    torch = pytest.importorskip("torch")
    used = sm90()
    for d, causal in [(64, True), (128, False)]:
        check(2, 300, 500, 8, 2, d, causal, "bfloat16", lib="torch")
        check(1, 129, 129, 4, 1, d, causal, "float16", lib="torch")

    def packed(q, k, v, dtype):
        x = np.stack([q, k, v], axis=2).astype(base.NP_DTYPE[dtype])
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).cuda()
        return t[:, :, 0], t[:, :, 1], t[:, :, 2]

    check(2, 129, 129, 4, 4, 64, True, views=packed)

    def misaligned(q, k, v, dtype):
        dev = [torch.from_numpy(x.astype(base.NP_DTYPE[dtype]).view(np.uint16)).view(torch.bfloat16).cuda()
               for x in (q, k, v)]
        buf = torch.empty(k.size + 1, dtype=torch.bfloat16, device="cuda")
        km = buf[1:].view(k.shape)
        km.copy_(dev[1])
        return dev[0], km, dev[2]

    check(1, 100, 77, 2, 1, 128, False, views=misaligned)
    # 2 x 2 torch calls, the packed views, the misaligned k: every one on the Hopper kernel (the
    # misaligned k on the default's cp.async twin if the default is a TMA configuration)
    want = [sm90_attention.choose_config(d).name for d in (64, 64, 128, 128, 64)]
    last = sm90_attention.choose_config(128)
    want.append(sm90_attention.twin(last, 128).name if last.tma else last.name)
    assert used == want


def _torch(x, dtype):
    import torch

    t = torch.from_numpy(x.astype(base.NP_DTYPE[dtype]).view(np.uint16)).cuda()
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t.view(torch.float16)


def heads_major(q, k, v, dtype):
    """(B, H, S, D) tensors (torch SDPA's layout) seen as (B, S, H, D): head stride S * D,
    sequence stride D -- the strides are not in order."""
    return [_torch(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), dtype).transpose(1, 2)
            for x in (q, k, v)]


def packed_qkv(q, k, v, dtype):
    """Slices of one (B, S, 3, H, D) tensor (needs seqlen_q == seqlen_k, heads_q == heads_kv)."""
    t = _torch(np.stack([q, k, v], axis=2), dtype)
    return t[:, :, 0], t[:, :, 1], t[:, :, 2]


@pytest.mark.parametrize("name", TMA_CONFIGS)
def test_tma_views_and_odd_shapes(sm90, name):
    """Strided views read in place through the tensor maps (no fallback), odd batch and head
    counts, GQA / MQA, causal with seqlen_q > seqlen_k."""
    pytest.importorskip("torch")
    used = sm90(name)
    check(3, 113, 203, 6, 2, 128, True, "bfloat16", views=heads_major)
    check(1, 517, 113, 5, 1, 64, True, "float16", views=heads_major)
    check(2, 239, 239, 3, 3, 64, False, "bfloat16", views=packed_qkv)
    check(3, 1023, 1024, 4, 1, 128, True, "float16", lib="torch")
    check(1, 1024, 1023, 2, 2, 128, False, "bfloat16", lib="torch")
    assert used == [name] * 5


@pytest.mark.parametrize("name", TMA_CONFIGS)
def test_tma_falls_back_to_cp_async_where_no_map_fits(sm90, name, capsys, monkeypatch):
    """A misaligned k (start 2 bytes past 16) and seqlen_k == 0 run the cp.async twin, which
    NUMBATC_PRINT_CONFIG=1 names with the reason."""
    torch = pytest.importorskip("torch")
    cfg = sm90_attention.CONFIGS[name]
    fallback = sm90_attention.twin(cfg, 64).name
    used = sm90(name)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")

    def misaligned(q, k, v, dtype):
        dev = [_torch(x, dtype) for x in (q, k, v)]
        buf = torch.empty(k.size + 1, dtype=dev[1].dtype, device="cuda")
        km = buf[1:].view(k.shape)
        km.copy_(dev[1])
        return dev[0], km, dev[2]

    check(1, 100, 77, 2, 1, 64, False, views=misaligned)
    check(1, 5, 0, 2, 2, 64, False)
    assert used == [fallback, fallback]
    err = capsys.readouterr().err
    assert f"not {name}: k starts at" in err and f"not {name}: seqlen_k is 0" in err, err


LARGE_SMALL = [
    # the emulated cases (tests/emulation/test_sm90_attention_emulated.py), on the hardware
    ("n80_2s_ov_pp_fx_tma", (1, 113, 203, 2, 1, 256, True, "bfloat16")),
    ("n80_2s_ov_pp_fx_tma", (1, 130, 30, 1, 1, 256, True, "float16")),
    ("n80_2s_ov_pp_fx", (1, 40, 170, 3, 1, 256, False, "float16")),
    ("n64_2s_ov_pp_fx", (1, 1, 239, 1, 1, 256, True, "bfloat16")),
    ("n64_2s_ov_pp_fx_tma", (2, 20, 90, 1, 1, 256, True, "bfloat16")),
    ("n112_2s_ov_pp_fx_tma", (1, 70, 239, 2, 1, 192, True, "float16")),
    ("n112_2s_ov_pp_fx", (1, 113, 203, 1, 1, 192, False, "bfloat16")),
    ("n128_2s_ov_pp_fx_tma", (1, 113, 203, 2, 1, 96, True, "bfloat16")),
    ("n128_2s_ov_pp_fx", (1, 70, 239, 1, 1, 96, True, "float16")),
    ("n128_3s_ov_pp_fx_tma", (1, 40, 520, 2, 2, 96, False, "bfloat16")),
    ("n128_2s_ov_pp_fx_tma_pt", (1, 260, 100, 2, 1, 96, True, "float16")),
]


@pytest.mark.parametrize("name, args", LARGE_SMALL,
                         ids=[f"{n}-d{a[5]}-{a[1]}x{a[2]}" for n, a in LARGE_SMALL])
def test_large_head_dims_small_cases_first(sm90, name, args):
    used = sm90(name)
    check(*args)
    assert used == [name]


@pytest.mark.parametrize("name, d", LARGE, ids=[f"{n}-{d}" for n, d in LARGE])
def test_large_head_dims_hard_cases(sm90, name, d):
    """head_dim 96, 192 and 256: FlashAttention's awkward seqlen pairs, causal with seqlen_q >
    seqlen_k, odd batch and head counts, GQA / MQA, bf16 and f16, several waves of blocks; the
    TMA configurations also on heads-major and packed views (read in place) and a misaligned k
    (their cp.async twin, named by NUMBATC_PRINT_CONFIG)."""
    torch = pytest.importorskip("torch")
    cfg = sm90_attention.CONFIGS[name]
    used = sm90(name)
    cases = [(3, 113, 203, 6, 2, d, True, "bfloat16"), (1, 1023, 1024, 4, 1, d, True, "float16"),
             (2, 1, 239, 3, 3, d, False, "bfloat16"), (1, 239, 1, 2, 1, d, True, "float16"),
             (2, 517, 113, 5, 1, d, True, "bfloat16"), (1, 1024, 1023, 2, 2, d, False, "float16"),
             (2, 2048, 2048, 8, 2, d, True, "bfloat16"), (1, 3, 1024, 4, 4, d, False, "bfloat16")]
    for args in cases:
        check(*args)
    check(2, 300, 500, 8, 2, d, True, "bfloat16", lib="torch")
    want = [name] * (len(cases) + 1)
    if cfg.tma:
        check(3, 113, 203, 6, 2, d, True, "bfloat16", views=heads_major)
        check(2, 239, 239, 3, 3, d, False, "float16", views=packed_qkv)
        want += [name] * 2
        assert used == want
        fallback = sm90_attention.twin(cfg, d).name

        def misaligned(q, k, v, dtype):
            dev = [_torch(x, dtype) for x in (q, k, v)]
            km = torch.empty(k.size + 1, dtype=dev[1].dtype, device="cuda")[1:].view(k.shape)
            km.copy_(dev[1])
            return dev[0], km, dev[2]

        check(1, 100, 77, 2, 1, d, True, "bfloat16", views=misaligned)
        check(1, 5, 0, 2, 2, d, False)
        want += [fallback] * 2
    assert used == want


@pytest.mark.parametrize("name", ["n128_2s_ov_pp_fx_tma", "n128_2s_ov_pp_fx",
                                  "n80_2s_ov_pp_fx_tma"])
def test_pair_stores_only_where_out_is_aligned(sm90, monkeypatch, name):
    """O's column pairs are one 32-bit store each where out starts 4-byte aligned (the
    default); an out 2 bytes past that takes two 16-bit stores a pair; then the warm call
    with an aligned out again (its relaunch refuses the offset one): all exact."""
    seen = []
    real = sm90_attention.kernel_for
    monkeypatch.setattr(sm90_attention, "kernel_for",
                        lambda cfg, var: seen.append(var.pair_stores) or real(cfg, var))
    d = max(sm90_attention.CONFIGS[name].head_dims)
    used = sm90(name)
    for out_view in (None, base.offset_out, None, base.offset_out):
        check(2, 300, 333, 4, 2, d, True, "bfloat16", out_view=out_view)
    # calls 3 and 4 may take the warm relaunch (made by call 1: pair stores), which must
    # refuse call 4's offset out; a pair store there would fault (misaligned address)
    # (the cp.async launch compiles twice per checked call: the launch and its relaunch)
    first_u16 = seen.index(False)
    assert set(used) == {name} and seen[0] and not any(seen[first_u16:]), (used, seen)


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_tma_store_of_o_only_where_a_map_describes_out(sm90, monkeypatch, d):
    """The default TMA configuration stores O through shared memory and TMA where out starts
    16-byte aligned (TMA_STORE_HEAD_DIMS), keeps the pair stores 4 bytes past that, the 16-bit
    stores 2 bytes past; warm calls alternate between them; all exact, FlashAttention's awkward
    seqlen pairs and a causal seqlen_q > seqlen_k among them."""
    import functools

    seen = []
    real = sm90_attention.kernel_for
    monkeypatch.setattr(sm90_attention, "kernel_for", lambda cfg, var: seen.append(
        (var.pair_stores, var.tma_store)) or real(cfg, var))
    name = sm90_attention.DEFAULT_TMA[d]
    used = sm90(name)
    four = functools.partial(base.offset_out, elements=2)
    for args in [(2, 113, 203, 4, 2), (1, 1023, 1024, 2, 1), (2, 239, 1, 3, 3)]:
        for out_view in (None, four, base.offset_out, None):
            check(*args, d, True, "bfloat16", out_view=out_view)
    assert set(used) == {name}
    tma = d in sm90_attention.TMA_STORE_HEAD_DIMS
    assert seen[0] == (True, tma) and (True, False) in seen and (False, False) in seen, seen


@pytest.mark.parametrize("d", [96, 192, 256])
def test_large_head_dims_default_walk(d, monkeypatch, capsys):
    """The default walk (no NUMBATC_ATTN_KERNEL) on the GPU: DEFAULT_HEAD_DIMS decides between
    the Hopper kernel and the portable one, and NUMBATC_PRINT_CONFIG says which and why."""
    monkeypatch.delenv("NUMBATC_ATTN_KERNEL", raising=False)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    for heads in [(64, 96, 128, 192, 256), (64, 128)]:
        monkeypatch.setattr(sm90_attention, "DEFAULT_HEAD_DIMS", heads)
        check(2, 300, 500, 4, 2, d, True, "bfloat16")
        err = capsys.readouterr().err
        if d in heads:
            assert f"sm90_attention {sm90_attention.choose_config(d).name} bfloat16 +lse [" in err
        else:
            assert "sm80_attention, not sm90_attention: head_dim" in err, err


def test_timing(sm90, monkeypatch):
    """Prints sm90 (each config) against sm80 (forward, causal and not); asserts nothing about
    speed.  FLOPs: 4 * b * h * sq * sk * d (halved when causal)."""
    from numba import cuda

    import numbatc

    b, h, s = 4, 16, 4096
    for d in (64, 96, 128, 192, 256):
        q, k, v = (base.to_device(base.values((b, s, h, d), "bfloat16"), "bfloat16") for _ in range(3))
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            for name in [None, *sorted(n for n, d2 in PAIRS if d2 == d)]:
                if name is None:
                    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "sm80")
                else:
                    sm90(name)
                numbatc.attention(q, k, v, causal=causal)
                cuda.synchronize()
                start, stop = cuda.event(), cuda.event()
                start.record()
                for _ in range(10):
                    numbatc.attention(q, k, v, causal=causal)
                stop.record()
                stop.synchronize()
                ms = cuda.event_elapsed_time(start, stop) / 10
                print(f"attention b={b} h={h} s={s} d={d} causal={causal} "
                      f"{name or 'sm80_attention'}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
    assert math.isfinite(ms)
