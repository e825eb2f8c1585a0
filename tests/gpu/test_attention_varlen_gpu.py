"""numbatc.attention_varlen on the GPU against a per-sequence float64 reference: the
FlashAttention suite's awkward length pairs (113/203, 1/239, 1023/1024), empty sequences (no
queries, no keys), causal and not, GQA, bf16 and f16, device and host cu_seqlens, packed qkv
views, the portable kernel forced, the default walk and sm90_attention's TMA and cp.async
configurations at every head dim it takes; outputs poisoned (NaN) before every
call, fresh random data every run, lse checked.  Reference and tolerance:
tests/helpers/attention.py (check_varlen).  Tests marked ``emulation`` also run in the CPU
emulation (tiny)."""

import numpy as np
import pytest
from numba import cuda

import numbatc
from numbatc import attention_api
from tests.helpers.attention import NP_DTYPE, check_varlen, prefix_sums, to_device, values

pytestmark = pytest.mark.gpu(cc=(8, 0))

# (lens_q, lens_k): the awkward pairs, a sequence with no queries and one with no keys
AWKWARD = ([113, 1, 1023, 0, 17], [203, 239, 1024, 5, 0])


@pytest.mark.emulation
@pytest.mark.parametrize("causal, hq", [(True, 2), (False, 1)], ids=["causal-gqa", "full"])
def test_emulated_three_sequences(causal, hq, monkeypatch):
    monkeypatch.setenv("NUMBATC_ATTN_CONFIG", "m64n64_w4_qreg")  # 128 threads: half the time
    check_varlen([1, 17, 40], [1, 17, 40] if causal else [40, 1, 17], hq, 1, 40, causal)


@pytest.mark.emulation
def test_garbage_cu_seqlens_stay_inside_the_arrays(monkeypatch):
    """With the value checks off (as under graph capture), prefix sums that decrease, run past
    the rows or are negative touch nothing outside q, k, v, out and lse: out and lse are views
    into NaN-filled buffers whose guard rows must stay NaN (the emulation also bounds-checks
    every flat access)."""
    monkeypatch.setattr(attention_api, "_check_prefix_sums", lambda *a: None)
    hq, d, tq, tk = 1, 16, 12, 10
    q, k = values((tq, hq, d), "bfloat16"), values((tk, hq, d), "bfloat16")
    buf = to_device(np.full((tq + 8, hq, d), np.nan), "bfloat16")
    out = buf[4:4 + tq] if not hasattr(buf, "data") else numbatc.bfloat16(buf.data[4:4 + tq])
    cq = cuda.to_device(np.array([0, 9, 3, 1000, -5, 12], np.int32))
    ck = cuda.to_device(np.array([-7, 4, 2000, 6, 6, 3], np.int32))
    dq, dk = to_device(q, "bfloat16"), to_device(k, "bfloat16")
    numbatc.attention_varlen(dq, dk, dk, cq, ck, 16, 16, causal=True, out=out)
    cuda.synchronize()
    host = buf.data.copy_to_host() if hasattr(buf, "data") else buf.copy_to_host()
    nan = np.uint16(0x7FC0)  # bf16 NaN, as to_device wrote it
    assert (host[:4] == nan).all() and (host[4 + tq:] == nan).all(), "a write outside out"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_awkward_lengths(d, causal):
    check_varlen(*AWKWARD, 4, 2, d, causal, "bfloat16")


@pytest.mark.parametrize("d", [40, 256])
def test_other_head_dims_and_f16(d):
    check_varlen(*AWKWARD, 6, 1, d, True, "float16")


def test_every_sequence_alike_and_max_seqlen_above_the_longest():
    check_varlen([257] * 3, [129] * 3, 2, 2, 64, True, max_seqlen=(400, 300))


def test_host_cu_seqlens():
    check_varlen([5, 300, 1], [77, 1, 600], 4, 1, 64, True, host_cu=True)


def test_torch_packed_qkv_views():
    """q, k and v as slices of one (total, 3, heads, head_dim) tensor (read in place) and torch
    cu_seqlens; then a k whose start is one element off 16 bytes (packed first)."""
    torch = pytest.importorskip("torch")

    def packed(q, k, v, dtype):
        x = np.stack([q, k, v], axis=1).astype(NP_DTYPE[dtype])
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).cuda()
        return t[:, 0], t[:, 1], t[:, 2]

    lens = [113, 1, 1023, 0, 17]
    check_varlen(lens, lens, 4, 4, 64, True, lib="torch", views=packed)

    def misaligned(q, k, v, dtype):
        dev = [torch.from_numpy(x.astype(NP_DTYPE[dtype]).view(np.uint16)).view(torch.bfloat16).cuda()
               for x in (q, k, v)]
        buf = torch.empty(k.size + 1, dtype=torch.bfloat16, device="cuda")
        km = buf[1:].view(k.shape)
        km.copy_(dev[1])
        return dev[0], km, dev[2]

    check_varlen([100, 3], [77, 200], 2, 1, 64, False, lib="torch", views=misaligned)


@pytest.mark.parametrize("kernel", ["sm80", "sm90", None], ids=["sm80", "sm90-asked", "default"])
def test_forced_and_default_walk(kernel, monkeypatch, capsys):
    """sm80 forced, sm90 asked for and the default: NUMBATC_PRINT_CONFIG names the kernel that
    ran -- the portable one where forced or off compute capability 9.0, else sm90_attention's
    TMA configuration (its maps span the packed rows)."""
    if kernel:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", kernel)
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check_varlen([113, 1], [203, 239], 4, 2, 128, True)
    err = capsys.readouterr().err
    hopper = tuple(cuda.get_current_device().compute_capability) == (9, 0)
    want = "sm90_attention n128_2s_ov_pp_fx_tma" if hopper and kernel != "sm80" else "sm80_attention"
    assert want in err and "varlen" in err, err


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("name", ["tma", "cp.async"])
def test_sm90_configurations(d, name, monkeypatch):
    """sm90_attention's default TMA configuration and its cp.async twin at every head dim it
    takes (skipped off compute capability 9.0), on the awkward lengths, GQA, causal."""
    from numbatc.kernels import sm90_attention

    if tuple(cuda.get_current_device().compute_capability) != (9, 0):
        pytest.skip("sm90_attention needs compute capability 9.0")
    cfg = sm90_attention.DEFAULT_TMA[d] if name == "tma" else sm90_attention.DEFAULT[d]
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", f"sm90:{cfg}")
    check_varlen(*AWKWARD, 4, 2, d, True, "bfloat16")
    check_varlen(*AWKWARD, 2, 2, d, False, "float16")


@pytest.mark.parametrize("kernel", [None, "sm80"], ids=["default", "sm80"])
def test_warm_calls(kernel, monkeypatch):
    """Calls like a checked one (new arrays, new values, the same shapes and max_seqlen) take
    the warm path -- on compute capability 9.0 by default sm90_attention's pointer relaunch with
    the prefix sums' pointers -- and stay exact; bad prefix sums still raise there."""
    from numbatc import _warm

    if kernel:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", kernel)
    calls = []
    real = attention_api._attention_varlen_checked
    monkeypatch.setattr(attention_api, "_attention_varlen_checked",
                        lambda *a: calls.append(a) or real(*a))
    _warm.CACHE.clear()
    try:
        for _ in range(3):
            check_varlen(*AWKWARD, 4, 2, 128, True, "bfloat16", max_seqlen=(1100, 1100))
        assert len(calls) == 1, "the later calls were not warm"
        assert any(key[0] == "attention_varlen" for key in _warm.CACHE)
        q = to_device(values((1154, 4, 128), "bfloat16"), "bfloat16")
        k = to_device(values((1471, 2, 128), "bfloat16"), "bfloat16")
        bad_q = cuda.to_device(np.array([0, 113, 114, 1200, 1137, 1154], np.int32))
        cu_k = cuda.to_device(prefix_sums(AWKWARD[1]))
        with pytest.raises(ValueError, match="must not decrease"):
            numbatc.attention_varlen(q, k, k, bad_q, cu_k, 1100, 1100, causal=True,
                                     out=to_device(np.zeros((1154, 4, 128)), "bfloat16"),
                                     return_lse=True)
        assert len(calls) == 1, "the bad values were not checked on the warm path"
    finally:
        _warm.CACHE.clear()


def test_device_cu_seqlens_values_are_checked():
    q = to_device(values((10, 2, 64), "bfloat16"), "bfloat16")
    good = cuda.to_device(prefix_sums([4, 6]))
    with pytest.raises(ValueError, match="must not decrease"):
        numbatc.attention_varlen(q, q, q, cuda.to_device(np.array([0, 7, 5, 10], np.int32)),
                                 cuda.to_device(prefix_sums([4, 6, 0])), 10, 10)
    with pytest.raises(ValueError, match="last entry"):
        numbatc.attention_varlen(q, q, q, good, cuda.to_device(prefix_sums([4, 5])), 6, 6)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        numbatc.attention_varlen(q, q, q, good, good, 5, 6)
