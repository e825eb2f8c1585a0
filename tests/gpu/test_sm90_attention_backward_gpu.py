"""numbatc.kernels.sm90_attention_backward (the Hopper wgmma backward) on an sm_90 GPU, forced
with ``NUMBATC_ATTN_BWD_KERNEL=sm90``, against the float64 reference gradient of
tests/helpers/attention_backward.py: FlashAttention's awkward seqlen pairs, batch 1 to 4, MHA,
GQA and MQA, causal and not (seqlen_q above and below seqlen_k), bf16 and f16, head_dim 64 and
128, dq / dk / dv poisoned (NaN) before every call, fresh random data every run; the fixed
order of dQ's adds (two runs bitwise equal), also with more blocks than the GPU holds at once
(a key block waits only for lower ones, launched before it); deterministic=False; torch
tensors, strided views (operands and results) and numbatc's own forward.  That the sm90 kernel ran: NUMBATC_PRINT_CONFIG's line."""

import numpy as np
import pytest

import numbatc
from tests.helpers.attention import to_host
from tests.helpers.attention_backward import check_backward

pytestmark = pytest.mark.gpu(cc=(9, 0))


@pytest.fixture(autouse=True)
def sm90(monkeypatch, capfd):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    yield
    err = capfd.readouterr().err
    assert "sm90_attention_backward" in err, err


@pytest.mark.parametrize("d, deterministic", [(128, True), (64, False)])
def test_the_default_at_head_dims_where_it_measured_faster(monkeypatch, d, deterministic):
    """Nothing forced: head_dim 128, and 64 with deterministic=False, run the Hopper kernel
    (numbatc.attention_backward_api.sm90_by_default; the fixture checks the printed line)."""
    monkeypatch.delenv("NUMBATC_ATTN_BWD_KERNEL")
    call = numbatc.attention_backward
    monkeypatch.setattr(numbatc, "attention_backward",
                        lambda *a, **k: call(*a, deterministic=deterministic, **k))
    check_backward(2, 300, 500, 4, 2, d, True, "bfloat16")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("b, sq, sk, hq, hkv, causal, dtype", [
    (1, 113, 203, 2, 1, True, "bfloat16"),
    (1, 1, 239, 1, 1, False, "float16"),
    (1, 239, 1, 1, 1, True, "bfloat16"),      # 238 queries see no key
    (2, 128, 128, 4, 2, True, "float16"),
    (1, 1023, 1024, 2, 2, False, "bfloat16"),
    (3, 513, 257, 4, 1, True, "bfloat16"),    # MQA, seqlen_q > seqlen_k
    (1, 300, 2049, 2, 1, True, "float16"),    # 17 key blocks, the last one key
])
def test_sm90_backward(b, sq, sk, hq, hkv, d, causal, dtype):
    check_backward(b, sq, sk, hq, hkv, d, causal, dtype)


@pytest.mark.parametrize("d", [64, 128])
def test_sm90_backward_with_numbatc_forward_and_dlse(d):
    check_backward(2, 257, 300, 4, 2, d, True, "bfloat16", forward="numbatc", with_dlse=True)


@pytest.mark.parametrize("d", [64, 128])
def test_sm90_backward_deterministic_beyond_one_wave(d):
    """2 x 8 x 32 = 512 blocks (more than 132 SMs hold at once), each adding its part of dQ in
    key-block order: two calls give the same bits."""
    inputs, _ = check_backward(2, 1100, 4096, 16, 8, d, False, "bfloat16")
    q, k, v, out, lse, do = inputs
    runs = [[to_host(x, "bfloat16") for x in numbatc.attention_backward(q, k, v, out, lse, do)]
            for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64))


def test_sm90_backward_any_order(monkeypatch):
    call = numbatc.attention_backward
    monkeypatch.setattr(numbatc, "attention_backward",
                        lambda *a, **k: call(*a, deterministic=False, **k))
    check_backward(2, 1023, 1024, 8, 2, 128, True, "bfloat16")
    check_backward(1, 333, 777, 4, 4, 64, False, "float16")


def test_sm90_backward_torch_and_strided_views():
    torch = pytest.importorskip("torch")
    check_backward(3, 113, 203, 8, 2, 128, True, "bfloat16", lib="torch")

    def packed(x, dtype):  # a (b, s, h, d) slice of a (b, s, 2h, d) buffer: tensor maps with
        from tests.helpers.attention import NP_DTYPE  # strides of their own, strided results

        b, s, h, d = x.shape
        buf = np.concatenate([x, np.zeros_like(x)], axis=2).astype(NP_DTYPE[dtype])
        t = torch.from_numpy(buf.view(np.uint16) if dtype == "bfloat16" else buf).cuda()
        t = t.view(torch.bfloat16) if dtype == "bfloat16" else t
        return t[:, :, :h]

    check_backward(1, 200, 300, 4, 2, 64, False, "float16", lib="torch", views=packed,
                   view_results=True)
    check_backward(2, 77, 130, 2, 1, 128, True, "bfloat16", lib="torch", views=packed)
