"""numbatc.kernels.sm90_attention in the CPU emulation (the same kernel source as on the GPU),
through numbatc.attention with ``NUMBATC_ATTN_KERNEL=sm90:<config>``: the warp-specialised
cp.async -> mbarrier -> wgmma pipeline (SS for Q K^T, RS for P V), the online softmax in the
accumulator's registers, masks for ragged key tiles and the causal diagonal, rows that see no
key, GQA, head_dim 64, 96, 128, 192 and 256, bf16 and f16, lse; both schedules (in order, and the
overlapped one with a wgmma group in flight during the softmax, and that one with the two
consumers' ping-pong on named barriers), rings of 2 and 3 stages that wrap.  The TMA producers (_tma):
tensor copies of Q, K and V through rank-4 maps (out-of-bounds rows zero-filled, the
emulation's 16-byte start rule and byte counts enforced), on FlashAttention's awkward seqlen
pairs, GQA / MQA, causal with seqlen_q > seqlen_k, strided (packed, heads-major) views, and
the fallback to the cp.async twin for a misaligned operand or no keys.

Each case checks against tests/helpers/attention.py's float64 reference (outputs poisoned
with NaN first, fresh random data) and that the sm90 kernel, not the fallback, ran.  384 threads
per block (512 with three consumers) are Python threads here: one or two blocks per case."""

import numpy as np
import pytest
from numba import config

from numbatc.kernels import sm90_attention

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

from tests.helpers.attention import check, sm90  # noqa: E402,F401 (sm90: the fixture)
from tests.helpers.barriers import record_named_barriers  # noqa: E402


CASES = [
    # b, sq,  sk, hq, hkv, d, causal, dtype,   config
    (1, 1, 1, 1, 1, 64, False, "bfloat16", "n128_2s_ov"),      # one query, one key
    (1, 70, 70, 2, 1, 64, True, "float16", "n128_2s_ov"),      # GQA, ragged tile, diagonal
    (1, 130, 70, 1, 1, 128, True, "bfloat16", "n128_2s"),      # 2 blocks; 60 rows see no key
    (1, 40, 300, 1, 1, 128, False, "float16", "n128_2s_ov"),   # 3 key tiles wrap 2 stages
    (1, 33, 200, 3, 1, 64, True, "bfloat16", "n64_2s_ov"),     # 4 tiles of 64, causal, MQA
    (1, 64, 129, 1, 1, 128, True, "float16", "n64_2s"),        # in order, 3 tiles, 1 ragged key
    (1, 20, 400, 2, 2, 64, False, "bfloat16", "n128_3s_ov"),   # 3 stages, 4 tiles
    # ping-pong (named barriers): GQA, causal, ragged; block 0's consumers see 1 and 2 key tiles
    (1, 150, 150, 2, 1, 64, True, "bfloat16", "n64_2s_ov_pp"),
    (1, 40, 300, 1, 1, 128, False, "float16", "n128_2s_ov_pp"),  # 3 tiles wrap 2 stages
    (1, 130, 30, 1, 1, 64, True, "bfloat16", "n128_2s_ov_pp"),   # block 0: consumer 0 sees none
    # the two-instruction exponential (ex2.approx.ftz of an fma): masked rows, -inf maxima
    (1, 70, 200, 2, 1, 128, True, "bfloat16", "n128_2s_ov_fx"),
    (1, 150, 150, 1, 1, 64, True, "float16", "n128_2s_ov_pp_fx"),
    # the TMA producer: one query, 2 key tiles (the second ragged); Q rows 1..127 past the end
    (1, 1, 239, 1, 1, 64, False, "bfloat16", "n128_2s_fx_tma"),
    # head_dim 128 (two boxes per tile, V's K-first atoms), GQA, causal, ragged both ways
    (1, 113, 203, 2, 1, 128, True, "bfloat16", "n128_2s_ov_pp_fx_tma"),
    # causal with seqlen_q > seqlen_k: block 0's consumer 0 sees no key; 2 blocks
    (1, 130, 30, 1, 1, 64, True, "float16", "n128_2s_ov_pp_fx_tma"),
    # MQA, 5 key tiles wrap a 3-stage ring
    (1, 40, 520, 3, 1, 128, False, "bfloat16", "n128_3s_ov_pp_fx_tma"),
    # 3 batches (the batch coordinate), overlapped without ping-pong
    (3, 20, 70, 1, 1, 64, True, "float16", "n128_2s_ov_fx_tma"),
    # persistent (2 blocks in the emulation): 12 work tiles, longest first, 6 of them see no
    # key (causal, seqlen_q > seqlen_k); the ring and q_full's phase run on across tiles
    (1, 400, 30, 3, 1, 128, True, "float16", "n128_2s_ov_pp_fx_tma_pt"),
    (2, 150, 239, 2, 1, 64, False, "bfloat16", "n128_2s_ov_pp_fx_tma_pt"),
    # head_dim 256 (4 boxes per tile, BN 80: a 32-bit key-tile count; b, h computed again in
    # the epilogue): GQA, causal, 3 ragged key tiles wrap the 2-stage ring
    (1, 113, 203, 2, 1, 256, True, "bfloat16", "n80_2s_ov_pp_fx_tma"),
    # causal with seqlen_q > seqlen_k: 2 blocks, block 0's consumer 0 sees no key
    (1, 130, 30, 1, 1, 256, True, "float16", "n80_2s_ov_pp_fx_tma"),
    # the cp.async twin at head_dim 256 (each row step copies the 4 halves), MQA, 3 tiles
    (1, 40, 170, 3, 1, 256, False, "float16", "n80_2s_ov_pp_fx"),
    (1, 1, 239, 1, 1, 256, True, "bfloat16", "n64_2s_ov_pp_fx"),  # one query, 4 tiles of 64
    (2, 20, 90, 1, 1, 256, True, "bfloat16", "n64_2s_ov_pp_fx_tma"),
    # head_dim 192 (3 boxes, BN 112): GQA, causal, ragged; then the cp.async twin
    (1, 70, 239, 2, 1, 192, True, "float16", "n112_2s_ov_pp_fx_tma"),
    (1, 113, 203, 1, 1, 192, False, "bfloat16", "n112_2s_ov_pp_fx"),
    # head_dim 96 (64B swizzle: three boxes of 32 columns per tile row, V's atoms of 32 d):
    # GQA, causal, ragged both ways; the cp.async twin (three parts per row step); 3 stages
    # wrapping over 5 key tiles; persistent with rows that see no key
    (1, 113, 203, 2, 1, 96, True, "bfloat16", "n128_2s_ov_pp_fx_tma"),
    (1, 70, 239, 1, 1, 96, True, "float16", "n128_2s_ov_pp_fx"),
    (1, 40, 520, 2, 2, 96, False, "bfloat16", "n128_3s_ov_pp_fx_tma"),
    (1, 260, 100, 2, 1, 96, True, "float16", "n128_2s_ov_pp_fx_tma_pt"),
    # head_dim 64 with 176-key tiles (LONG_KEY_TILES): ragged, causal diagonal, 3 tiles wrap
    # the ring; and without the mask
    (1, 130, 400, 2, 1, 64, True, "bfloat16", "n176_2s_ov_pp_fx_tma"),
    (1, 70, 500, 1, 1, 128, False, "float16", "n176_2s_ov_pp_fx_tma"),
    (1, 40, 300, 2, 1, 96, False, "bfloat16", "n176_2s_ov_pp_fx_tma"),
    # head_dim 64 on three consumers (192 x 128 tiles, 512 threads, the turn passed 1 -> 2 ->
    # 3 -> 1): causal diagonal with the three warpgroups seeing 2, 3 and 3 key tiles that wrap
    # the 2-stage ring; causal with seqlen_q > seqlen_k (block 0's consumers 0 and 1 see no
    # key, 2 blocks); MQA over 5 tiles wrapping 3 stages; ragged, f16, one block
    (1, 150, 300, 1, 1, 64, True, "bfloat16", "m192_n128_2s_ov_pp_fx_tma"),
    (1, 250, 70, 1, 1, 64, True, "float16", "m192_n128_3s_ov_pp_fx_tma"),
    (1, 40, 520, 2, 1, 64, False, "bfloat16", "m192_n128_3s_ov_pp_fx_tma"),
    (1, 191, 129, 1, 1, 64, False, "float16", "m192_n128_2s_ov_pp_fx_tma"),
    # O rescaled under the next Q K^T (rescale_before_pv): FA3's head_dim 256 schedule (no
    # ping-pong), GQA, causal, 3 ragged tiles wrap the ring; 192 with and without the
    # ping-pong (rows that see no key: causal, seqlen_q > seqlen_k); 128 and 64 with it
    (1, 113, 203, 2, 1, 256, True, "bfloat16", "n80_2s_ov_rb_fx_tma"),
    (1, 130, 30, 1, 1, 192, True, "float16", "n112_2s_ov_pp_rb_fx_tma"),
    (1, 40, 300, 1, 1, 192, False, "bfloat16", "n112_2s_ov_rb_fx_tma"),
    (1, 70, 400, 2, 1, 128, True, "bfloat16", "n128_2s_ov_pp_rb_fx_tma"),
    (1, 150, 150, 1, 1, 64, False, "float16", "n128_2s_ov_pp_rb_fx_tma"),
    # persistent in L2 sections (one section here: the budget holds these keys many times)
    (2, 150, 239, 2, 1, 64, True, "bfloat16", "n128_2s_ov_pp_fx_tma_pt_l2"),
]


@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype, cfg", CASES)
def test_sm90_attention_in_the_emulation(sm90, monkeypatch, b, sq, sk, hq, hkv, d, causal,
                                         dtype, cfg):
    # every named barrier the kernel touched must end with no pending arrival
    left = record_named_barriers(monkeypatch)
    used = sm90(cfg)
    check(b, sq, sk, hq, hkv, d, causal, dtype)
    assert used == [cfg]
    # named barriers: the ping-pong's, and each warpgroup's before the TMA stores of O (TMA
    # configurations, TMA_STORE_HEAD_DIMS; check's out is aligned)
    c = sm90_attention.CONFIGS[cfg]
    assert bool(left.touched) == (c.pingpong
                                  or (c.tma and d in sm90_attention.TMA_STORE_HEAD_DIMS))
    assert not left(), "a named barrier left part-full"


def test_persistent_l2_sections(sm90, monkeypatch):
    """The persistent causal order in L2 sections (sm90_attention_tma._coords), walked by the
    emulation's 2 blocks, rows that see no key (seqlen_q > seqlen_k): a budget of two kv heads'
    K and V over 3 heads (sections of 2 and 1: the short last one), then of one kv head with
    GQA (2 batches x 4 query heads over 2 kv heads: 4 sections of 2 query heads)."""
    import dataclasses

    base = sm90_attention.CONFIGS["n128_2s_ov_pp_fx_tma_pt_l2"]
    for heads, hq, hkv, b in ((2, 3, 3, 1), (1, 4, 2, 2)):
        cfg = dataclasses.replace(base, name=f"{base.name}_{heads}", l2_budget=heads * 60 * 64 * 4)
        monkeypatch.setitem(sm90_attention.CONFIGS, cfg.name, cfg)
        used = sm90(cfg.name)
        check(b, 400, 60, hq, hkv, 64, True, "float16")
        assert used == [cfg.name]


@pytest.mark.parametrize("name", ["n128_2s_ov_pp_fx_tma", "n128_2s_ov_pp_fx"])
def test_pair_stores_only_where_out_is_aligned(sm90, monkeypatch, name):
    """O's column pairs are one 32-bit store each where out starts 4-byte aligned (the
    default); an out 2 bytes past that takes two 16-bit stores a pair; both exact."""
    from tests.helpers.attention import offset_out

    seen = []
    real = sm90_attention.kernel_for
    monkeypatch.setattr(sm90_attention, "kernel_for",
                        lambda cfg, var: seen.append(var.pair_stores) or real(cfg, var))
    used = sm90(name)
    check(1, 70, 90, 2, 1, 64, True, "bfloat16")
    check(1, 70, 90, 2, 1, 64, True, "float16", out_view=offset_out)
    assert used == [name, name]
    assert seen[0] is True and seen[-1] is False, seen


def test_tma_store_of_o_only_where_a_map_describes_out(sm90, monkeypatch):
    """The TMA configuration stores O through shared memory and TMA where out starts 16-byte
    aligned; 4 bytes past that it keeps the pair stores; at head_dim 256 always the pair
    stores (TMA_STORE_HEAD_DIMS); all exact."""
    import functools

    from tests.helpers.attention import offset_out

    seen = []
    real = sm90_attention.kernel_for
    monkeypatch.setattr(sm90_attention, "kernel_for", lambda cfg, var: seen.append(
        (var.pair_stores, var.tma_store)) or real(cfg, var))
    sm90("n128_2s_ov_pp_fx_tma")
    check(2, 70, 90, 2, 1, 64, True, "bfloat16")
    check(2, 70, 90, 2, 1, 64, True, "float16", out_view=functools.partial(offset_out, elements=2))
    assert seen == [(True, True), (True, False)], seen
    seen.clear()
    sm90("n80_2s_ov_pp_fx_tma")
    check(1, 20, 90, 1, 1, 256, False, "bfloat16")
    assert seen == [(True, False)], seen


def test_no_keys(sm90):
    used = sm90("n128_2s_ov")
    check(1, 5, 0, 2, 2, 64, False)
    assert used == ["n128_2s_ov"]


def test_other_head_dims_stay_on_sm80(sm90, capsys, monkeypatch):
    used = sm90("n128_2s_ov")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check(1, 3, 5, 1, 1, 32, False)
    assert used == []
    assert "sm80_attention, not sm90_attention: head_dim 32" in capsys.readouterr().err


def _packed(q, k, v, dtype):
    """Slices of one (B, S, 3, H, D) array: sequence stride 3 H D."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    d = cuda.to_device(np.stack([q, k, v], axis=2).astype(NP_DTYPE[dtype]))
    return d[:, :, 0], d[:, :, 1], d[:, :, 2]


def _heads_major(q, k, v, dtype):
    """(B, H, S, D) arrays seen as (B, S, H, D): the strides are not in order."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    return [cuda.to_device(np.ascontiguousarray(x.transpose(0, 2, 1, 3)).astype(NP_DTYPE[dtype]))
            .transpose((0, 2, 1, 3)) for x in (q, k, v)]


@pytest.mark.parametrize("views, args", [
    (_packed, (2, 70, 70, 2, 2, 64, True, "float16")),
    (_heads_major, (1, 70, 90, 2, 1, 128, False, "float16")),
    (_packed, (1, 70, 70, 2, 2, 256, True, "bfloat16")),
], ids=["packed", "heads_major", "packed_d256"])
def test_tma_reads_strided_views_in_place(sm90, views, args):
    name = "n128_2s_fx_tma" if args[5] <= 128 else sm90_attention.DEFAULT_TMA[args[5]]
    used = sm90(name)
    check(*args, views=views)
    assert used == [name]


def test_tma_falls_back_to_cp_async(sm90, capsys, monkeypatch):
    """A k that starts 2 bytes past a 16-byte boundary, and seqlen_k == 0: the cp.async twin
    runs, and NUMBATC_PRINT_CONFIG=1 says why."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    def misaligned(q, k, v, dtype):
        dev = [cuda.to_device(x.astype(NP_DTYPE[dtype])) for x in (q, k, v)]
        km = cuda.to_device(np.zeros(k.size + 1, NP_DTYPE[dtype]))[1:].reshape(k.shape)
        km.copy_to_device(dev[1])
        return dev[0], km, dev[2]

    used = sm90("n128_2s_ov_pp_fx_tma")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check(1, 20, 30, 1, 1, 64, False, "float16", views=misaligned)
    check(1, 5, 0, 2, 2, 64, False)
    assert used == ["n128_2s_ov_pp_fx", "n128_2s_ov_pp_fx"]
    err = capsys.readouterr().err
    assert "(not n128_2s_ov_pp_fx_tma: k starts at" in err, err
    assert "(not n128_2s_ov_pp_fx_tma: seqlen_k is 0" in err, err


def test_tma_falls_back_to_cp_async_at_head_dim_256(sm90, capsys, monkeypatch):
    """head_dim 256's default (NUMBATC_ATTN_KERNEL=sm90 with no config) on a k that starts 2
    bytes past a 16-byte boundary: its cp.async twin (BLOCK_N 80, 40 / 232 registers) runs."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    def misaligned(q, k, v, dtype):
        dev = [cuda.to_device(x.astype(NP_DTYPE[dtype])) for x in (q, k, v)]
        km = cuda.to_device(np.zeros(k.size + 1, NP_DTYPE[dtype]))[1:].reshape(k.shape)
        km.copy_to_device(dev[1])
        return dev[0], km, dev[2]

    used = sm90()
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check(1, 20, 100, 1, 1, 256, True, "float16", views=misaligned)
    assert used == ["n80_2s_ov_pp_fx"]
    err = capsys.readouterr().err
    assert "(not n80_2s_ov_pp_fx_tma: k starts at" in err, err
    assert "[DEFAULT_TMA[256]: 128 x 80 tiles, 2 stages]" in err, err


# numbatc.attention_varlen (packed sequences; each block finds its sequence's rows in the prefix
# sums, and the TMA maps span the packed rows, so a tile's boxes run into the next sequence's
# keys, which the mask removes, and its queries, which are not stored)
VARLEN = [
    # name,                  lens_q,       lens_k,       hq, hkv, d, causal, dtype
    ("n128_2s_ov_pp_fx_tma", [17, 0, 40], [30, 7, 130], 2, 1, 64, True, "bfloat16"),
    ("n128_2s_ov_pp_fx", [40, 3], [0, 150], 1, 1, 128, False, "float16"),
    ("n80_2s_ov_pp_fx_tma", [20, 33], [50, 100], 1, 1, 256, True, "bfloat16"),
    ("m192_n128_2s_ov_pp_fx_tma", [17, 0, 200], [30, 7, 140], 1, 1, 64, True, "float16"),
]


@pytest.mark.parametrize("name, lens_q, lens_k, hq, hkv, d, causal, dtype", VARLEN,
                         ids=[f"{c[0]}-d{c[5]}" for c in VARLEN])
def test_varlen(sm90, name, lens_q, lens_k, hq, hkv, d, causal, dtype):
    """Per-sequence float64 reference and lse (check_varlen): a sequence with no queries, one
    with no keys, ragged tiles, GQA, causal (bottom-right per sequence); head_dim 256's
    epilogue reads the sequence's rows again; max_seqlen_q above the longest for one case
    (blocks past every sequence return)."""
    from tests.helpers.attention import check_varlen

    used = sm90(name)
    longest = (max(lens_q) + (130 if d == 128 else 0), max(lens_k))
    check_varlen(lens_q, lens_k, hq, hkv, d, causal, dtype, max_seqlen=longest)
    assert used == [name]


def test_varlen_garbage_prefix_sums_stay_inside_the_arrays(sm90, monkeypatch):
    """As test_attention_varlen_gpu's, on the TMA configuration: with the value checks off,
    prefix sums that decrease, run past the rows or are negative read and write nothing
    outside q, k, v, out and lse (out a view into a NaN-filled buffer whose guard rows stay
    NaN; the emulation bounds-checks every flat access and every box)."""
    from numba import cuda

    from numbatc import attention_api
    from tests.helpers.attention import to_device, values

    import numbatc

    monkeypatch.setattr(attention_api, "_check_prefix_sums", lambda *a: None)
    used = sm90("n128_2s_ov_pp_fx_tma")
    hq, d, tq, tk = 1, 64, 12, 10
    q, k = values((tq, hq, d), "bfloat16"), values((tk, hq, d), "bfloat16")
    buf = cuda.to_device(np.full((tq + 8, hq, d), 0x7FC0, np.uint16))  # bf16 NaN
    out = numbatc.bfloat16(buf[4:4 + tq])
    cq = cuda.to_device(np.array([0, 9, 3, 1000, -5, 12], np.int32))
    ck = cuda.to_device(np.array([-7, 4, 2000, 6, 6, 3], np.int32))
    dq, dk = to_device(q, "bfloat16"), to_device(k, "bfloat16")
    numbatc.attention_varlen(dq, dk, dk, cq, ck, 16, 16, causal=True, out=out)
    host = buf.copy_to_host()
    assert (host[:4] == 0x7FC0).all() and (host[4 + tq:] == 0x7FC0).all(), "a write outside out"
    assert used == ["n128_2s_ov_pp_fx_tma"]
