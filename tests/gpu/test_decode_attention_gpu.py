"""The flash-decoding kernel (numbatc.kernels.sm80_decode_attention) on the GPU, through
numbatc.attention, against tests/helpers/attention.py's float64 reference: seqlen_q 1..16,
seqlen_k 1, 127, 4097 and 32768 + 5 (ragged last tiles and splits), head_dim 64 and 128 (and 40,
256), batch 1 and 3, GQA ratios 1, 4 and 8 and MQA, causal (bottom-right) and not, bf16 and f16,
the lse; fresh random data and outputs poisoned (NaN) before every call (``check``).  Problems
below the default's seqlen_k bound are forced onto the kernel (NUMBATC_ATTN_KERNEL=decode); the
default choice, the splits the GPU gets, a warm call and CUDA graph capture (the workspace from
torch's allocator) are checked too.

Run on a GPU:  python -m pytest -q tests/gpu/test_decode_attention_gpu.py"""

import numpy as np
import pytest

import numbatc
from numbatc.kernels import sm80_decode_attention as decode
from tests.helpers.attention import check

pytestmark = pytest.mark.gpu(cc=(8, 0))


@pytest.fixture
def ran(monkeypatch):
    """The (config, splits, keys per split) of each decode launch."""
    used = []
    real = decode.launch_flat

    def recording(cfg, var, *args, split, **kwargs):
        used.append((cfg.name, *split))
        return real(cfg, var, *args, split=split, **kwargs)

    monkeypatch.setattr(decode, "launch_flat", recording)
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "decode")
    return used


HEADS = [(8, 8), (8, 2), (32, 8), (8, 1)]  # GQA ratios 1, 4, 4, 8 (MQA)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("sk", [1, 127, 4097, 32768 + 5])
def test_sweep(ran, d, causal, dtype, sk):
    gen = np.random.default_rng()
    for sq in (1, 3, 16):
        hq, hkv = HEADS[int(gen.integers(len(HEADS)))]
        b = int(gen.choice([1, 3]))
        check(b, sq, sk, hq, hkv, d, causal, dtype)
    assert len(ran) == 3 and all(name.startswith("m") for name, _, _ in ran)


@pytest.mark.parametrize("d", [40, 256, 8])
def test_other_head_dims(ran, d):
    check(1, 4, 5000, 8, 2, d, True, "bfloat16")
    check(3, 1, 777, 4, 1, d, False, "float16")


def test_many_rows_and_seqlen_q_above_seqlen_k(ran):
    check(1, 16, 2000, 8, 1, 64, True)    # 128 stacked rows: 4 m blocks of 32
    check(2, 16, 9, 4, 2, 128, True)      # 7 queries see no key: 0 and lse -inf
    check(1, 5, 0, 4, 2, 64, False)       # no key at all


def test_default_choice_and_splits(monkeypatch):
    used = []
    real = decode.launch_flat

    def recording(cfg, var, *args, split, **kwargs):
        used.append(split)
        return real(cfg, var, *args, split=split, **kwargs)

    monkeypatch.setattr(decode, "launch_flat", recording)
    monkeypatch.delenv("NUMBATC_ATTN_KERNEL", raising=False)
    check(1, 1, 65536, 32, 8, 128, False)
    check(2, 4, 4096, 32, 8, 128, True, "float16")
    assert len(used) == 2 and used[0][0] > 8, used  # one KV head per block would idle the GPU
    check(1, 1, 1000, 32, 8, 128, False)  # below the bound: a prefill kernel
    assert len(used) == 2


def test_torch_warm_call_and_cuda_graph():
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)

    def ref(q, k, v):
        kk, vv = (x.repeat_interleave(4, dim=2).transpose(1, 2).float() for x in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), kk, vv).transpose(1, 2)

    out = numbatc.attention(q, k, v)
    assert (out.float() - ref(q, k, v)).abs().max().item() < 2e-2
    out2 = numbatc.attention(q, k, v)  # the warm call
    assert torch.equal(out, out2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        numbatc.attention(q, k, v)  # warm before capturing
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = numbatc.attention(q, k, v)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        graph.replay()
        torch.cuda.synchronize()
        assert (captured.float() - ref(q, k, v)).abs().max().item() < 2e-2
