"""numbatc.attention_with_kvcache in the CPU emulation (the same kernel source as on the GPU): the
flash-decoding kernel's KV-cache variants (seqlen_q 1 and 4) and the portable kernel's (prefill,
seqlen_q 20), paged (page_size 16, 32 and 64, block tables shuffled over a pool with spare NaN
pages) and contiguous (rows past each length NaN), batches of 2-3 sequences of different lengths
including 0 and 1, GQA / MQA, causal (bottom-right per sequence: queries of a sequence shorter
than seqlen_q see no key and give 0, lse -inf), head_dim padded (40) and not, bf16 and f16,
head_dim 32 to 128 (a thread's rows sharing one page lookup: 1, 2 or 4), two m16 tiles and a
ring that wraps, the lse.  Each case checks against tests/helpers/attention.py's float64
reference over the gathered pages (outputs poisoned with NaN first, fresh random data) and that
the kernel named ran.  Then garbage cache_seqlens and block tables with the host checks off (as
under CUDA graph capture): nothing is read or written outside the arrays (the emulation
bounds-checks every flat access; out's guard rows stay NaN).  Small shapes: every block's
threads are Python threads here."""

import numpy as np
import pytest
from numba import config, cuda

from numbatc.kernels import sm80_attention, sm80_decode_attention as decode

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

import numbatc  # noqa: E402
from numbatc import attention_api  # noqa: E402
from tests.helpers.attention import check_kvcache, to_device, values  # noqa: E402


@pytest.fixture
def ran(monkeypatch):
    """The (module, variant) of each kernel launch."""
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


def _decode(monkeypatch, splits=2, cfg="m16_w2_k16_s2"):
    monkeypatch.setenv("NUMBATC_ATTN_KERNEL", f"decode:{cfg}")  # 64 threads a block
    monkeypatch.setenv("NUMBATC_DECODE_SPLITS", str(splits))


DECODE = [
    # b, sq, lens, hq, hkv, d, causal, dtype, page_size
    (3, 1, [0, 1, 37], 4, 2, 32, False, "bfloat16", 16),   # GQA 2, empty and one-key sequences
    (3, 4, [3, 1, 50], 2, 1, 32, True, "float16", 16),     # causal: short ones see few / none
    (2, 1, [70, 16], 2, 2, 40, True, "bfloat16", 16),      # padded head_dim, a full last page
    (2, 1, [90, 7], 2, 1, 128, False, "bfloat16", 16),     # 4 rows of a thread per lookup
    (2, 3, [33, 64], 2, 2, 64, True, "float16", 16),       # 2 rows of a thread per lookup
    (2, 1, [40, 17], 2, 1, 144, False, "float16", 16),     # above 128: no lookahead
    (3, 1, [0, 17, 40], 4, 2, 40, False, "float16", None),  # contiguous cache
    (2, 4, [2, 33], 4, 1, 32, True, "bfloat16", None),     # MQA, causal, contiguous
]


@pytest.mark.parametrize("b, sq, lens, hq, hkv, d, causal, dtype, page_size", DECODE)
def test_decode_kernel(monkeypatch, ran, b, sq, lens, hq, hkv, d, causal, dtype, page_size):
    _decode(monkeypatch)
    check_kvcache(b, sq, lens, hq, hkv, d, causal, dtype, page_size=page_size)
    ((module, var),) = ran
    assert module == "sm80_decode_attention" and var.kv_cache and var.paged == bool(page_size)


def test_decode_kernel_with_more_splits_than_tiles(monkeypatch, ran):
    """Splits of a short sequence's own length: most splits of the short one see no key."""
    _decode(monkeypatch, splits=5, cfg="m16_w2_k32_s2")
    check_kvcache(2, 1, [130, 5], 2, 1, 32, False, page_size=32)


def test_decode_kernel_two_m_tiles_and_a_ring_that_wraps(monkeypatch, ran):
    """32 stacked rows (two m16 tiles), three stages over 5 tiles a split, page_size 64."""
    _decode(monkeypatch, splits=2, cfg="m32_w2_k16_s3")
    check_kvcache(2, 8, [300, 45], 4, 1, 32, True, page_size=64)


@pytest.mark.parametrize("page_size, causal, d", [(16, True, 32), (None, True, 32),
                                                 (32, False, 32), (16, True, 128)],
                         ids=["paged16-causal", "contiguous-causal", "paged32", "paged16-d128"])
def test_prefill_kernel(monkeypatch, ran, page_size, causal, d):
    monkeypatch.setenv("NUMBATC_ATTN_CONFIG", "m64n64_w4_qreg")  # 128 threads
    check_kvcache(2, 20, [45, 5], 2, 1, d, causal, page_size=page_size)
    ((module, var),) = ran
    assert module == "sm80_attention" and var.kv_cache and var.paged == bool(page_size)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_garbage_values_stay_inside_the_arrays(monkeypatch, ran, kernel):
    """cache_seqlens past the capacity and negative, block-table entries past the pool and
    negative, with the checks off: no access outside k_cache, v_cache or out."""
    monkeypatch.setattr(attention_api, "_check_cache", lambda *a: None)
    sq = 1 if kernel == "decode" else 20
    if kernel == "decode":
        _decode(monkeypatch)
    else:
        monkeypatch.setenv("NUMBATC_ATTN_CONFIG", "m64n16_w4_qsmem")
    b, hq, d, pages = 3, 2, 16, 3
    q = to_device(values((b, sq, hq, d), "bfloat16"), "bfloat16")
    kc = to_device(values((pages, 16, 1, d), "bfloat16"), "bfloat16")
    buf = to_device(np.full((b + 2, sq, hq, d), np.nan), "bfloat16")
    out = numbatc.bfloat16(buf.data[1:1 + b])
    table = cuda.to_device(np.array([[2, 9999, -7], [-1, 0, 2**31 - 1], [1, 1, 1]], np.int32))
    seqlens = cuda.to_device(np.array([10**6, -5, 40], np.int32))
    numbatc.attention_with_kvcache(q, kc, kc, seqlens, block_table=table, out=out,
                                   causal=True)
    cuda.synchronize()
    host = buf.data.copy_to_host()
    nan = np.uint16(0x7FC0)  # bf16 NaN, as to_device wrote it
    assert (host[0] == nan).all() and (host[1 + b:] == nan).all(), "a write outside out"
    assert ran and ran[0][1].paged
