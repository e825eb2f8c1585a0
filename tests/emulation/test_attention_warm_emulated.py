"""numbatc.attention's warm call in the CPU emulation: the second call of a signature skips the
checks and the walk over the kernels (numbatc.attention_api._attention_checked, counted here,
runs once) and still gives the float64 reference's answer -- for new values in the same
arrays, for fresh arrays, with ``out=`` and the lse, on the portable kernel (the emulation's
default) and on sm90_attention (forced); attention_varlen's and attention_with_kvcache's warm
calls, whose device values are still read back and checked.  The key and the refusals:
tests/test_attention_fast_path.py."""

import math

import numpy as np
import pytest
from numba import config

import numbatc
from numbatc import _warm, attention_api
from numbatc.interop import DTypeView
from tests.helpers.attention import NP_DTYPE, ROUNDING, reference, to_device, to_host, values

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


@pytest.fixture
def checked(monkeypatch):
    """The calls that went through the checks (a list of their arguments)."""
    calls = []
    real = attention_api._attention_checked

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(attention_api, "_attention_checked", counting)
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    _warm.CACHE.clear()
    yield calls
    _warm.CACHE.clear()


def _check(got, q, k, v, causal, scale, dtype, lse=None):
    ref, ref_lse, wabs, sbound = reference(q, k, v, causal, scale)
    got = to_host(got, dtype)
    tol = 2 * ROUNDING[dtype] * (np.abs(ref) + wabs) + 1e-6
    assert (np.abs(got - ref) <= tol).all(), np.abs(got - ref).max()  # NaN counts as bad
    if lse is not None:
        lse = lse.copy_to_host().astype(np.float64)
        assert np.array_equal(np.isneginf(lse), np.isinf(ref_lse))
        fin = np.isfinite(ref_lse)
        assert (np.abs(lse[fin] - ref_lse[fin]) <= 1e-5 * (1 + sbound[fin])).all()


def _fill(dev, x64, dtype):
    """New values into a device array made by to_device (numbatc.bfloat16 views included)."""
    host = np.ascontiguousarray(x64).astype(NP_DTYPE[dtype])
    if isinstance(dev, DTypeView):
        dev.data.copy_to_device(host.view(np.uint16))
    else:
        dev.copy_to_device(host)


def test_second_call_is_warm_and_right(checked):
    b, sq, sk, hq, hkv, d, dtype = 1, 9, 13, 2, 1, 16, "float16"
    shapes = ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d))
    dq, dk, dv = (to_device(np.zeros(s), dtype) for s in shapes)
    for _ in range(2):  # the same arrays, new values: the second call is warm
        q, k, v = (values(s, dtype) for s in shapes)
        for dev, x in zip((dq, dk, dv), (q, k, v)):
            _fill(dev, x, dtype)
        out = numbatc.attention(dq, dk, dv, causal=True)
        _check(out, q, k, v, True, 1 / math.sqrt(d), dtype)
    # fresh arrays (other pointers), scale given: still the one checked call
    q, k, v = (values(s, dtype) for s in shapes)
    out = numbatc.attention(*(to_device(x, dtype) for x in (q, k, v)), causal=True, scale=0.3)
    _check(out, q, k, v, True, 0.3, dtype)
    assert len(checked) == 2  # scale=None and scale=0.3 are two signatures
    out = numbatc.attention(*(to_device(x, dtype) for x in (q, k, v)), causal=True, scale=0.7)
    _check(out, q, k, v, True, 0.7, dtype)
    assert len(checked) == 2


def test_warm_sm90_with_out_and_lse(checked, monkeypatch):
    """sm90_attention (forced, as the emulation runs the portable kernel unless told), bf16,
    out= and the lse: the second call is warm, runs sm90_attention again and is right."""
    from numbatc.kernels import sm90_attention

    ran = []
    real = sm90_attention.launch
    monkeypatch.setattr(sm90_attention, "launch", lambda p, cfg: ran.append(cfg) or real(p, cfg))
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "sm90")
    b, sq, sk, hq, hkv, d, dtype = 1, 5, 7, 2, 1, 64, "bfloat16"
    for _ in range(2):
        q, k, v = values((b, sq, hq, d), dtype), values((b, sk, hkv, d), dtype), values(
            (b, sk, hkv, d), dtype)
        out = to_device(np.full(q.shape, np.nan), dtype)
        got, lse = numbatc.attention(*(to_device(x, dtype) for x in (q, k, v)), out=out,
                                     scale=0.2, return_lse=True)
        assert got is out
        _check(got, q, k, v, False, 0.2, dtype, lse)
    assert len(checked) == 1 and len(ran) == 2 and ran[0] == ran[1]


@pytest.mark.parametrize("kernel", [None, "sm90:n128_2s_ov_pp_fx_tma"], ids=["portable", "sm90"])
def test_varlen_warm_calls(kernel, monkeypatch):
    """numbatc.attention_varlen: the second call of a signature (new values, new prefix sums in
    new arrays, new q / k / v) skips the checked call and gives the per-sequence reference's
    answer; its prefix sums are still read back and checked (a ValueError for bad ones, after
    the launch); other max_seqlen values take the checked path."""
    from numba import cuda

    from tests.helpers.attention import prefix_sums, reference_varlen

    calls = []
    real = attention_api._attention_varlen_checked
    monkeypatch.setattr(attention_api, "_attention_varlen_checked",
                        lambda *a: calls.append(a) or real(*a))
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    if kernel:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", kernel)
    d, hkv, dtype = 64, 1, "bfloat16"
    hq = 1 if kernel else 2  # GQA on the portable kernel; 384 Python threads a block on sm90
    _warm.CACHE.clear()
    try:
        for lens in ([17, 0, 40], [40, 10, 7]):  # the same totals (57), other sequences
            q = values((57, hq, d), dtype)
            k, v = values((57, hkv, d), dtype), values((57, hkv, d), dtype)
            cu = cuda.to_device(prefix_sums(lens))
            got, lse = numbatc.attention_varlen(*(to_device(x, dtype) for x in (q, k, v)), cu,
                                                cu, 40, 40, causal=True, return_lse=True)
            ref, ref_lse, wabs, _ = reference_varlen(q, k, v, lens, lens, True, 1 / math.sqrt(d))
            got = to_host(got, dtype)
            tol = 2 * ROUNDING[dtype] * (np.abs(ref) + wabs) + 1e-6
            assert (np.abs(got - ref) <= tol).all(), np.abs(got - ref).max()
        assert len(calls) == 1, "the second call was not warm"
        bad = cuda.to_device(np.array([0, 30, 20, 57], np.int32))
        with pytest.raises(ValueError, match="must not decrease"):
            numbatc.attention_varlen(*(to_device(x, dtype) for x in (q, k, v)), bad, bad, 40, 40,
                                     causal=True, return_lse=True)
        assert len(calls) == 1, "the bad values were checked on the warm path"
        numbatc.attention_varlen(*(to_device(x, dtype) for x in (q, k, v)), cu, cu, 41, 40,
                                 causal=True, return_lse=True)
        assert len(calls) == 2, "another max_seqlen_q must take the checked path"
    finally:
        _warm.CACHE.clear()


@pytest.mark.parametrize("seqlen_q, page_size", [(1, None), (4, 16), (20, 16)],
                         ids=["decode", "decode-paged", "prefill-paged"])
def test_kvcache_warm_calls(seqlen_q, page_size, monkeypatch):
    """numbatc.attention_with_kvcache: the second call of a signature (new lengths, new block
    table, new q and caches in new arrays) skips the checked call and gives the reference's
    answer on the decode kernel and on the portable kernel (prefill over a cached prefix); its
    cache_seqlens and block table are still read back and checked (a ValueError for a length
    past the capacity, after the launch)."""
    from numba import cuda

    from tests.helpers.attention import check_kvcache

    calls = []
    real = attention_api._kvcache_checked
    monkeypatch.setattr(attention_api, "_kvcache_checked", lambda *a: calls.append(a) or real(*a))
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG",
                "NUMBATC_DECODE_SPLITS"):
        monkeypatch.delenv(var, raising=False)
    if seqlen_q > 16:
        monkeypatch.setenv("NUMBATC_ATTN_CONFIG", "m64n64_w4_qreg")  # 128 threads
    else:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "decode:m16_w2_k16_s2")  # 64 threads
        monkeypatch.setenv("NUMBATC_DECODE_SPLITS", "2")
    _warm.CACHE.clear()
    try:
        # the same capacity (contiguous: max + 3) and pool / table (paged 16: 5 pages used)
        for lens in ([17, 40], [40, 20]):
            check_kvcache(2, seqlen_q, lens, 2, 1, 32, True, page_size=page_size)
        assert len(calls) == 1, "the second call was not warm"
        q = cuda.to_device(np.zeros((2, seqlen_q, 2, 32), np.float16))
        cap = 43 if page_size is None else 4 * 16  # seqlen_cache, or table width x page_size
        kc = cuda.to_device(np.zeros((2, 43, 1, 32) if page_size is None
                                     else (7, 16, 1, 32), np.float16))
        table = None if page_size is None else cuda.to_device(np.zeros((2, 4), np.int32))
        for _ in range(2):  # checked, then warm
            numbatc.attention_with_kvcache(q, kc, kc, cuda.to_device(np.array([3, 3], np.int32)),
                                           block_table=table, causal=True)
        assert len(calls) == 2
        with pytest.raises(ValueError, match="is more keys than"):
            numbatc.attention_with_kvcache(q, kc, kc, cuda.to_device(np.array([3, cap + 1],
                                                                              np.int32)),
                                           block_table=table, causal=True)
        assert len(calls) == 2, "the bad length was checked on the warm path"
    finally:
        _warm.CACHE.clear()
