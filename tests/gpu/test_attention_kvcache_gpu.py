"""numbatc.attention_with_kvcache on the GPU against a float64 reference over the keys gathered
from the cache (tests/helpers/attention.py: check_kvcache): page sizes 16, 64 and 256 with block
tables shuffled over a pool with spare NaN pages, and contiguous caches with NaN rows past each
length (a key read that should not be shows); cache lengths 1, 127, 4097 and 32773 in one batch
(batch 3) or alone (batch 1); GQA ratios 1, 4 and 8 (MQA); causal (bottom-right per sequence)
and not; bf16 and f16; head_dim 64 and 128, and 40, 256 and 8; seqlen_q 1, 3 and 16 (the
flash-decoding kernel) and 20 / 300 (prefill over a cached prefix: the portable kernel); the
lse; fresh random data and outputs poisoned (NaN) before every call.  Also: the default walk and
NUMBATC_PRINT_CONFIG, host and int cache_seqlens, torch tensors in a CUDA graph replayed as the
cache grows (values not read under capture), and garbage lengths / block tables with the checks
off touching nothing outside the arrays.

Run on a GPU:  python -m pytest -q tests/gpu/test_attention_kvcache_gpu.py"""

import numpy as np
import pytest
from numba import cuda

import numbatc
from numbatc import attention_api
from numbatc.kernels import sm80_attention, sm80_decode_attention as decode
from tests.helpers.attention import check_kvcache, reference, to_device, to_host, values

pytestmark = pytest.mark.gpu(cc=(8, 0))

HEADS = [(8, 8), (8, 2), (32, 8), (8, 1)]  # GQA ratios 1, 4, 4, 8 (MQA)
PAGES = [16, 64, 256, None]  # None: a contiguous cache


@pytest.fixture
def ran(monkeypatch):
    """The (kernel module, variant) of each launch."""
    from numbatc import _warm

    _warm.CACHE.clear()  # a call like an earlier test's would be warm: no launch_flat to record
    used = []
    for module in (decode, sm80_attention):
        real = module.launch_flat

        def recording(cfg, var, *args, real=real, module=module, **kwargs):
            used.append((module.__name__.rsplit(".", 1)[1], var))
            return real(cfg, var, *args, **kwargs)

        monkeypatch.setattr(module, "launch_flat", recording)
    return used


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size", PAGES, ids=lambda p: f"page{p}" if p else "contiguous")
def test_decode_sweep(ran, d, causal, dtype, page_size):
    gen = np.random.default_rng()
    for sq, lens in ((1, [1, 127, 32773]), (3, [4097]), (16, [4097, 1, 127])):
        hq, hkv = HEADS[int(gen.integers(len(HEADS)))]
        lens = list(gen.permutation(lens))
        check_kvcache(len(lens), sq, lens, hq, hkv, d, causal, dtype, page_size=page_size)
    assert [m for m, _ in ran] == ["sm80_decode_attention"] * 3
    assert all(v.kv_cache and v.paged == bool(page_size) for _, v in ran)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", PAGES, ids=lambda p: f"page{p}" if p else "contiguous")
def test_prefill_with_cached_prefix(ran, d, causal, page_size):
    check_kvcache(3, 20, [20, 127, 4097], 8, 2, d, causal, "bfloat16", page_size=page_size)
    check_kvcache(1, 300, [4097], 8, 1, d, causal, "float16", page_size=page_size)
    check_kvcache(2, 300, [1, 299], 4, 4, d, causal, "bfloat16", page_size=page_size)
    assert [m for m, _ in ran] == ["sm80_attention"] * 3


@pytest.mark.parametrize("d", [40, 256, 8, 96])
@pytest.mark.parametrize("page_size", [16, None], ids=["page16", "contiguous"])
def test_other_head_dims(d, page_size):
    check_kvcache(3, 4, [5000, 1, 127], 8, 2, d, True, "bfloat16", page_size=page_size)
    check_kvcache(1, 1, [777], 4, 1, d, False, "float16", page_size=page_size)
    check_kvcache(2, 20, [300, 7], 4, 2, d, True, "bfloat16", page_size=page_size)


def test_empty_and_tiny_caches():
    check_kvcache(3, 1, [0, 1, 0], 8, 2, 128, False, page_size=16)  # 0 keys: 0 and lse -inf
    check_kvcache(3, 16, [0, 5, 16], 8, 1, 64, True, page_size=None)
    check_kvcache(1, 1, [0], 4, 4, 64, False, page_size=256)


def test_host_and_int_cache_seqlens_and_torch(monkeypatch, capsys):
    check_kvcache(3, 1, [1, 4097, 127], 32, 8, 128, True, page_size=64, host_seqlens=True)
    pytest.importorskip("torch")
    check_kvcache(2, 1, [300, 5], 8, 2, 128, True, "float16", page_size=16, lib="torch")
    check_kvcache(2, 20, [300, 5], 8, 2, 64, True, page_size=None, lib="torch")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    q, kc = values((2, 1, 8, 64), "bfloat16"), values((2, 300, 2, 64), "bfloat16")
    out = numbatc.attention_with_kvcache(*(to_device(x, "bfloat16") for x in (q, kc, kc)), 300)
    cuda.synchronize()
    ref, _, wabs, _ = reference(q, kc, kc, False, 1 / 8)  # every key of each sequence
    assert (np.abs(to_host(out, "bfloat16") - ref) <= 2 * 2.0**-8 * (np.abs(ref) + wabs)
            + 1e-6).all()
    err = capsys.readouterr().err
    assert "sm80_decode_attention" in err and "KV cache" in err, err


def test_default_walk_names_the_kernels(monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check_kvcache(1, 1, [5000], 32, 8, 128, False, page_size=16)
    check_kvcache(1, 32, [5000], 32, 8, 128, True, page_size=16)
    err = capsys.readouterr().err
    assert "sm80_decode_attention" in err and "paged KV cache (page_size 16" in err, err
    assert "sm80_attention" in err and "seqlen_q 32 > 16" in err, err
    ran = [line for line in err.splitlines() if line.startswith("numbatc.attention B=")]
    assert len(ran) == 2 and not any("sm90_attention" in line for line in ran), err


@pytest.mark.parametrize("sq, page_size", [(1, None), (4, 16), (1, 256), (20, 64)])
def test_warm_calls(monkeypatch, sq, page_size):
    """Calls like a checked one (new arrays, new lengths and block tables, the same shapes) take
    the warm path -- the kernel module's pointer relaunch with the lengths' and block table's
    pointers -- and stay exact; a length past the capacity still raises there."""
    from numbatc import _warm

    calls = []
    real = attention_api._kvcache_checked
    monkeypatch.setattr(attention_api, "_kvcache_checked", lambda *a: calls.append(a) or real(*a))
    _warm.CACHE.clear()
    try:
        for lens in ([1, 4097, 300], [300, 1, 4097], [4097, 300, 1]):
            check_kvcache(3, sq, lens, 8, 2, 128, True, page_size=page_size)
        assert len(calls) == 1, "the later calls were not warm"
        (key,) = [key for key in _warm.CACHE if key[0] == "attention_with_kvcache"]
        q = to_device(values((3, sq, 8, 128), "bfloat16"), "bfloat16")
        if page_size is None:
            kc, table, cap = to_device(values((3, 4100, 2, 128), "bfloat16"), "bfloat16"), None, 4100
        else:
            used = [-(-n // page_size) for n in (1, 4097, 300)]
            kc = to_device(values((sum(used) + 2, page_size, 2, 128), "bfloat16"), "bfloat16")
            table = cuda.to_device(np.zeros((3, max(used) + 1), np.int32))
            cap = (max(used) + 1) * page_size
        out = to_device(np.zeros((3, sq, 8, 128)), "bfloat16")
        bad = cuda.to_device(np.array([1, cap + 1, 3], np.int32))
        with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = .* is more keys than"):
            numbatc.attention_with_kvcache(q, kc, kc, bad, block_table=table, causal=True,
                                           out=out, return_lse=True)
        assert len(calls) == 1, "the bad length was not checked on the warm path"
    finally:
        _warm.CACHE.clear()


def test_torch_cuda_graph_as_the_cache_grows():
    """A decode step captured once, replayed after the lengths grow and the pages change:
    cache_seqlens and block_table are read on the device at each replay."""
    torch = pytest.importorskip("torch")
    b, hq, hkv, d, ps, blocks = 2, 32, 8, 128, 16, 40
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kp = torch.randn(b * blocks, ps, hkv, d, device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    table = torch.randperm(b * blocks, device="cuda").to(torch.int32).view(b, blocks)
    seqlens = torch.tensor([100, 1], device="cuda", dtype=torch.int32)

    def ref():
        out = []
        for i in range(b):
            n = int(seqlens[i])
            kk, vv = (x[table[i].long()].reshape(-1, hkv, d)[:n].float() for x in (kp, vp))
            kk, vv = (x.repeat_interleave(hq // hkv, dim=1).transpose(0, 1) for x in (kk, vv))
            out.append(torch.nn.functional.scaled_dot_product_attention(
                q[i].float().transpose(0, 1), kk, vv).transpose(0, 1))
        return torch.stack(out)

    def call():
        return numbatc.attention_with_kvcache(q, kp, vp, seqlens, block_table=table)

    assert (call().float() - ref()).abs().max().item() < 2e-2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm before capturing
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for step in range(3):
        seqlens += torch.tensor([97, 211], device="cuda", dtype=torch.int32)
        table.copy_(torch.randperm(b * blocks, device="cuda").to(torch.int32).view(b, blocks))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        assert (captured.float() - ref()).abs().max().item() < 2e-2, step


@pytest.mark.parametrize("sq", [1, 20])
def test_garbage_values_stay_inside_the_arrays(monkeypatch, sq):
    """cache_seqlens past the capacity and negative, block-table entries past the pool and
    negative, checks off (as under graph capture): out's guard rows stay NaN and the context
    survives (an access outside k_cache would fault)."""
    monkeypatch.setattr(attention_api, "_check_cache", lambda *a: None)
    b, hq, d, pages = 3, 8, 128, 5
    q = to_device(values((b, sq, hq, d), "bfloat16"), "bfloat16")
    kc = to_device(values((pages, 16, 2, d), "bfloat16"), "bfloat16")
    buf = to_device(np.full((b + 2, sq, hq, d), np.nan), "bfloat16")
    out = numbatc.bfloat16(buf.data[1:1 + b])
    table = cuda.to_device(np.array([[4, 10**9, -7, 2], [-1, 0, 2**31 - 1, 3], [1, 1, 1, 1]],
                                    np.int32))
    seqlens = cuda.to_device(np.array([10**9, -5, 64], np.int32))
    numbatc.attention_with_kvcache(q, kc, kc, seqlens, block_table=table, out=out, causal=True)
    cuda.synchronize()
    host = buf.data.copy_to_host()
    nan = np.uint16(0x7FC0)
    assert (host[0] == nan).all() and (host[1 + b:] == nan).all(), "a write outside out"
    check_kvcache(1, 1, [33], 8, 2, 64, False, page_size=16)  # the context still works
