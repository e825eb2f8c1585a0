"""numbatc.attention on the GPU against a float64 reference: sequence lengths 1, primes, tile
edges and 1023, seqlen_q != seqlen_k both ways, causal and not, head dims 8..256, MHA, GQA and
MQA, bf16 and f16, Numba and torch arrays, strided and misaligned views; outputs poisoned (NaN)
before every call, fresh random data every run; the log-sum-exp checked too.

Tolerance: P is rounded to the input format before P @ V and O once more when stored, so
|out - ref| <= 2 r (|ref| + (p @ |v|) / l) + 1e-6 with r the format's relative rounding
(2**-8 bf16, 2**-11 f16) and (p @ |v|) / l the row's softmax-weighted |v|; the scores are exact
products summed in float32, so lse is within 1e-5 (1 + scale * |q| @ |k|) of the reference.
Rows that see no key must give exactly 0 and lse -inf.

Tests marked ``emulation`` also run in the CPU emulation (tiny shapes: every thread of every
block is a Python thread there).  The reference, the tolerance and ``check``:
tests/helpers/attention.py."""

import numpy as np
import pytest

import numbatc
from numbatc.interop import DTypeView
from tests.helpers.attention import HEADS, NP_DTYPE, SEQLENS, check, to_device, values

pytestmark = pytest.mark.gpu(cc=(8, 0))


# --- the emulated subset (tiny: runs in the CPU emulation too) ------------------------------


@pytest.mark.emulation
@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype", [
    (1, 19, 37, 2, 1, 40, True, "bfloat16"),    # padded head_dim, GQA, ragged key tile
    (1, 70, 30, 1, 1, 64, True, "float16"),     # seqlen_q > seqlen_k: the first 40 rows see no key
    (2, 3, 1, 1, 1, 8, False, "bfloat16"),      # one key, head_dim 8
])
def test_emulated_subset(b, sq, sk, hq, hkv, d, causal, dtype):
    check(b, sq, sk, hq, hkv, d, causal, dtype)


@pytest.mark.emulation
def test_no_keys_gives_zeros_and_minus_inf():
    check(1, 5, 0, 2, 2, 16, False)


# --- the GPU-sized sweep (its seqlen pairs and head counts: tests/helpers/attention.py) -------


# (on a 9.0 GPU the default walk sends the head dims in sm90_attention.DEFAULT_HEAD_DIMS -- 64,
# 128, 192, 256 -- to the Hopper kernel, the others to the portable one)
@pytest.mark.parametrize("d", [8, 40, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sweep(d, causal, dtype):
    gen = np.random.default_rng()
    for sq, sk in SEQLENS:
        hq, hkv = HEADS[int(gen.integers(len(HEADS)))]
        b = int(gen.integers(1, 3))
        check(b, sq, sk, hq, hkv, d, causal, dtype)


@pytest.mark.parametrize("d", [16, 24, 32, 48, 72, 80, 112, 136, 160, 192, 200, 248])
def test_every_head_dim_class(d):
    check(2, 77, 150, 4, 2, d, True, "bfloat16")
    check(1, 150, 77, 2, 1, d, False, "float16")


def test_scale_and_large_scores():
    check(1, 200, 300, 2, 1, 64, False, scale=1.0)
    check(1, 200, 300, 2, 1, 128, True, scale=0.5)


def test_torch_arrays_stream_and_result_type():
    torch = pytest.importorskip("torch")
    for d, causal in [(64, True), (128, False), (256, True), (40, False)]:
        check(2, 300, 500, 8, 2, d, causal, "bfloat16", lib="torch")
        check(1, 129, 129, 4, 1, d, causal, "float16", lib="torch")
    q = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 384, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 384, 2, 128, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # on the caller's stream: no synchronisation in between
        out = numbatc.attention(q, k, v)
        kk, vv = k.repeat_interleave(4, dim=2), v.repeat_interleave(4, dim=2)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), kk.transpose(1, 2).float(), vv.transpose(1, 2).float()
        ).transpose(1, 2)
    s.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_packed_qkv_views_and_misaligned_inputs():
    """q, k, v as slices of one (b, s, 3, h, d) tensor (read in place), and a k whose start is
    one element off 16 bytes (packed into an aligned copy first)."""
    torch = pytest.importorskip("torch")

    def packed(q, k, v, dtype):
        b, s, h, d = q.shape
        x = np.stack([q, k, v], axis=2).astype(NP_DTYPE[dtype])
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).cuda()
        return t[:, :, 0], t[:, :, 1], t[:, :, 2]

    check(2, 129, 129, 4, 4, 64, True, views=packed)

    def misaligned(q, k, v, dtype):
        dev = [torch.from_numpy(x.astype(NP_DTYPE[dtype]).view(np.uint16)).view(torch.bfloat16).cuda()
               for x in (q, k, v)]
        buf = torch.empty(k.size + 1, dtype=torch.bfloat16, device="cuda")
        km = buf[1:].view(k.shape)
        km.copy_(dev[1])
        return dev[0], km, dev[2]

    check(1, 100, 77, 2, 1, 64, False, views=misaligned)


def test_numba_bf16_result_is_marked():
    q = values((1, 33, 2, 64), "bfloat16")
    out = numbatc.attention(to_device(q, "bfloat16"), to_device(q, "bfloat16"), to_device(q, "bfloat16"))
    assert isinstance(out, DTypeView) and out.dtype == "bfloat16"
