"""numbatc.attention_backward on the GPU against a float64 reference gradient: FlashAttention's
awkward seqlen pairs (113 x 203, 1023 x 1024, 1 x 239, 128 x 128 ...), batch 1 and 3, MHA and
GQA, causal and not, bf16 and f16, head dims 40, 64, 128 and 256; dq, dk, dv poisoned (NaN)
before every call, fresh random data every run; two runs bitwise equal (no atomics); torch
autograd through torch.ops.numbatc.attention / attention_lse against torch's float64 autograd.

Tests marked ``emulation`` also run in the CPU emulation (tiny shapes, most on the two-warp
configuration ``small``).  The reference, the tolerance and ``check_backward``:
tests/helpers/attention_backward.py."""

import math

import numpy as np
import pytest

import numbatc
from tests.helpers.attention import to_device, to_host, values
from tests.helpers.attention_backward import check_backward

pytestmark = pytest.mark.gpu(cc=(8, 0))


@pytest.fixture(autouse=True)
def portable(monkeypatch):
    """The portable kernel forced: on sm_90a head_dim 128 runs the Hopper one by default
    (numbatc.attention_backward_api.sm90_by_default), whose suite is
    tests/gpu/test_sm90_attention_backward_gpu.py."""
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm80")


@pytest.fixture
def config(monkeypatch):
    """``config(name)``: force an sm80_attention_backward configuration (None: the heuristic)."""
    def force(name):
        if name is None:
            monkeypatch.delenv("NUMBATC_ATTN_BWD_CONFIG", raising=False)
        else:
            monkeypatch.setenv("NUMBATC_ATTN_BWD_CONFIG", name)
    return force


# --- the emulated subset (tiny: runs in the CPU emulation too) ------------------------------


@pytest.mark.emulation
@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype", [
    (1, 17, 23, 2, 1, 40, False, "float16"),    # ragged tiles, padded head_dim, GQA
    (1, 37, 13, 2, 1, 16, True, "bfloat16"),    # seqlen_q > seqlen_k: 24 rows see no key
    (1, 13, 37, 2, 2, 16, True, "float16"),     # seqlen_q < seqlen_k: key blocks past the diagonal
    (2, 9, 40, 4, 2, 24, True, "bfloat16"),     # batch 2, two groups of two query heads
])
def test_emulated_subset(config, b, sq, sk, hq, hkv, d, causal, dtype):
    config("small")
    check_backward(b, sq, sk, hq, hkv, d, causal, dtype)


@pytest.mark.emulation
def test_emulated_default_config(config):
    config(None)  # d64: 8 warps, K/V re-read, Q and dO in registers in the dQ kernel
    check_backward(1, 20, 30, 2, 1, 16, True, "bfloat16")


@pytest.mark.emulation
def test_emulated_split_dk_dv(config):
    config("d256")  # dK and dV as two launches (head_dim > 128's path) on a small head_dim
    check_backward(1, 9, 21, 2, 1, 16, True, "float16")


@pytest.mark.emulation
@pytest.mark.parametrize("name", ["d64_kvreg", "d128_split"])
def test_emulated_alternative_configs(config, name):
    config(name)  # the benchmark's alternatives: K/V in registers; split dK/dV with Q in regs
    check_backward(1, 20, 30, 2, 1, 16, True, "float16")


@pytest.mark.emulation
def test_emulated_gradient_through_lse(config):
    config("small")
    check_backward(1, 11, 19, 2, 1, 16, False, "bfloat16", with_dlse=True)


@pytest.mark.emulation
def test_emulated_with_numbatc_forward(config):
    config("small")
    check_backward(1, 19, 13, 2, 1, 16, True, "bfloat16", forward="numbatc")


def _numba_strided(x, dtype):
    """A (b, s, h, d) view of the second half of the heads of a (b, s, 2h, d) device buffer."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    b, s, h, d = x.shape
    buf = np.zeros((b, s, 2 * h, d))
    buf[:, :, h:] = x
    host = buf.astype(NP_DTYPE[dtype])
    dev = cuda.to_device(host.view(np.uint16) if dtype == "bfloat16" else host)[:, :, h:]
    return numbatc.bfloat16(dev) if dtype == "bfloat16" else dev


def _numba_misaligned(x, dtype):
    """A contiguous (b, s, h, d) array starting one element (2 bytes) past a 16-byte boundary."""
    from numba import cuda

    from tests.helpers.attention import NP_DTYPE

    host = np.concatenate([[0], x.ravel()]).astype(NP_DTYPE[dtype])
    dev = cuda.to_device(host.view(np.uint16) if dtype == "bfloat16" else host)[1:].reshape(x.shape)
    return numbatc.bfloat16(dev) if dtype == "bfloat16" else dev


@pytest.mark.emulation
@pytest.mark.parametrize("views", [_numba_strided, _numba_misaligned], ids=["strided", "misaligned"])
def test_emulated_views(config, views):
    """Inputs and results as strided views (rows 2h * d apart) and as misaligned arrays (q, k,
    v, dO packed into aligned copies; the results written in place)."""
    config("small")
    check_backward(1, 13, 21, 2, 1, 24, True, "float16", views=views, view_results=True)


@pytest.mark.emulation
@pytest.mark.parametrize("sq, sk", [(0, 9), (7, 0)])
def test_empty_side_gives_zeros(config, sq, sk):
    """No query: dk = dv = 0; no key: dq = 0 (written over NaN)."""
    config("small")
    d, dtype = 16, "bfloat16"
    q, k, v = values((1, sq, 2, d), dtype), values((1, sk, 1, d), dtype), values((1, sk, 1, d), dtype)
    dev = [to_device(x, dtype) for x in (q, k, v, np.zeros(q.shape), q)]
    from numba import cuda

    lse = cuda.to_device(np.full((1, 2, sq), -np.inf, np.float32))
    poison = [to_device(np.full(x.shape, np.nan), dtype) for x in (q, k, v)]
    got = numbatc.attention_backward(dev[0], dev[1], dev[2], dev[3], lse, dev[4], dq=poison[0],
                                     dk=poison[1], dv=poison[2])
    cuda.synchronize()
    for x in got:
        host = to_host(x, dtype)
        assert (host == 0).all()


# --- the GPU-sized sweep ---------------------------------------------------------------------

#: FlashAttention's test-suite pairs (tests/test_flash_attn.py's seqlen_q, seqlen_k) and more
SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256),
           (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048), (1, 239), (239, 1),
           (128, 128), (3, 1024), (1023, 7)]


@pytest.mark.parametrize("d", [40, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sweep(d, causal, dtype):
    gen = np.random.default_rng()
    for sq, sk in SEQLENS:
        if sq * sk > 1024 * 1024 and d > 64:
            continue  # the float64 reference's time
        b = int(gen.choice([1, 3]))
        hq, hkv = [(2, 2), (4, 1), (8, 2)][int(gen.integers(3))]
        if sq * sk >= 1024 * 1023:
            b, hq, hkv = 1, 4, 1  # GQA 4 at the large sizes, one batch entry (reference time)
        check_backward(b, sq, sk, hq, hkv, d, causal, dtype)


@pytest.mark.parametrize("name", ["d64", "d128", "d256", "small", "d64_kvreg", "d128_split"])
def test_every_config(config, name):
    """Each configuration (the bench's --configs times them all) on ragged GQA shapes."""
    from numbatc.kernels.sm80_attention_backward import CONFIGS

    assert name in CONFIGS
    config(name)
    check_backward(2, 257, 191, 4, 2, 64, True, "bfloat16")
    check_backward(1, 191, 257, 2, 2, 128, False, "float16")
    check_backward(1, 100, 100, 2, 1, 40, True, "bfloat16")


@pytest.mark.parametrize("d", [64, 128])
def test_with_numbatc_forward_and_scale(d):
    check_backward(3, 113, 203, 4, 1, d, True, "bfloat16", forward="numbatc")
    check_backward(1, 203, 113, 4, 4, d, False, "float16", forward="numbatc", scale=0.3)


def test_gradient_through_lse():
    check_backward(2, 129, 257, 4, 2, 64, True, "bfloat16", with_dlse=True)


def test_deterministic():
    """Two calls on the same inputs give the same bits (no atomics; GQA sums in a fixed order)."""
    inputs, _ = check_backward(2, 1023, 1024, 8, 2, 128, True, "bfloat16")
    q, k, v, out, lse, do = inputs
    first = [to_host(x, "bfloat16") for x in numbatc.attention_backward(q, k, v, out, lse, do,
                                                                        causal=True)]
    second = [to_host(x, "bfloat16") for x in numbatc.attention_backward(q, k, v, out, lse, do,
                                                                         causal=True)]
    for a, b in zip(first, second):
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64))


def test_torch_arrays_views_and_stream():
    torch = pytest.importorskip("torch")
    check_backward(3, 113, 203, 8, 2, 128, True, "bfloat16", lib="torch")

    def packed(x, dtype):  # a (b, s, h, d) slice of a (b, s, 2h, d) buffer: strided rows
        from tests.helpers.attention import NP_DTYPE

        b, s, h, d = x.shape
        buf = np.concatenate([x, np.zeros_like(x)], axis=2).astype(NP_DTYPE[dtype])
        t = torch.from_numpy(buf.view(np.uint16) if dtype == "bfloat16" else buf).cuda()
        t = t.view(torch.bfloat16) if dtype == "bfloat16" else t
        return t[:, :, :h]

    check_backward(1, 200, 300, 4, 2, 64, False, "float16", lib="torch", views=packed)
    q = torch.randn(2, 256, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 384, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 384, 2, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out, lse = numbatc.attention(q, k, v, return_lse=True)
        do = torch.randn_like(out)
        dq, dk, dv = numbatc.attention_backward(q, k, v, out, lse, do)
    s.synchronize()
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 for x in (dq, dk, dv))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def _torch_reference(q, k, v, causal, scale):
    import torch

    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv), lse


@pytest.mark.parametrize("op", ["attention", "attention_lse"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_autograd(op, causal):
    """loss.backward() through torch.ops.numbatc.attention(_lse) against torch's float64
    autograd of the same loss (through lse too for attention_lse)."""
    torch = pytest.importorskip("torch")
    import numbatc.torch  # noqa: F401  (registers the ops)

    b, sq, sk, hq, hkv, d = 2, 300, 500, 8, 2, 64
    scale = 1 / math.sqrt(d)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(b, sq, hq, d, device="cuda")
    wl = torch.randn(b, hq, sq, device="cuda")
    if op == "attention":
        out = torch.ops.numbatc.attention(q, k, v, causal, None)
        loss = (out.float() * w).sum()
    else:
        out, lse = torch.ops.numbatc.attention_lse(q, k, v, causal, None)
        loss = (out.float() * w).sum() + (lse * wl).sum()
    loss.backward()
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64, lse64 = _torch_reference(q64, k64, v64, causal, scale)
    loss64 = (o64 * w.double()).sum()
    if op == "attention_lse":
        loss64 = loss64 + (lse64 * wl.double()).sum()
    loss64.backward()
    for name, got, ref in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad),
                           ("dv", v.grad, v64.grad)):
        err = (got.double() - ref).abs().max().item()
        assert err <= 2e-2 * ref.abs().max().item() + 1e-3, (name, err)
    # sum() hands backward an expanded gradient (stride 0): made dense for the kernel
    q.grad = None
    torch.ops.numbatc.attention(q, k, v, causal, None).sum().backward()
    assert torch.isfinite(q.grad).all()
