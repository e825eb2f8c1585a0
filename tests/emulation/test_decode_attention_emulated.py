"""numbatc.kernels.sm80_decode_attention in the CPU emulation (the same kernel source as on the
GPU), through numbatc.attention with ``NUMBATC_ATTN_KERNEL=decode:<config>`` and
``NUMBATC_DECODE_SPLITS`` forcing small splits: several key splits with a ragged last one, a
ring that wraps, one key, no keys, GQA (8 / 2) and MQA stacked into the MMA rows, two m16
tiles and two m blocks, causal (bottom-right: with seqlen_q > seqlen_k rows that see no key give
0 and lse -inf), head_dim padded (40) and not, bf16 and f16, the lse.  Each case checks against
tests/helpers/attention.py's float64 reference (outputs poisoned with NaN first, fresh random
data) and that the decode kernel ran.  Every block's threads are Python threads here: small
shapes, 64 or 128 threads a block."""

import pytest
from numba import config

from numbatc.kernels import sm80_decode_attention as decode

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

from tests.helpers.attention import check  # noqa: E402


@pytest.fixture
def decode_kernel(monkeypatch):
    """``force(config, splits)``: run the decode kernel with ``config`` and at most ``splits``
    key splits; returns the (config name, splits, keys per split) launched."""
    used = []
    real = decode.launch_flat

    def recording(cfg, var, *args, split, **kwargs):
        used.append((cfg.name, *split))
        return real(cfg, var, *args, split=split, **kwargs)

    monkeypatch.setattr(decode, "launch_flat", recording)

    def force(name, splits):
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", f"decode:{name}")
        monkeypatch.setenv("NUMBATC_DECODE_SPLITS", str(splits))
        used.clear()
        return used

    return force


CASES = [
    # b, sq, sk, hq, hkv, d, causal, dtype, config, splits -> (splits, keys per split) launched
    (1, 1, 1, 8, 2, 64, False, "bfloat16", "m16_w2_k16_s2", 1, (1, 32)),    # one key, GQA 8/2
    (1, 3, 37, 8, 2, 64, True, "float16", "m16_w2_k16_s2", 2, (2, 32)),     # 12 rows, ragged 5
    (1, 16, 300, 2, 1, 40, True, "bfloat16", "m32_w2_k16_s3", 4, (4, 96)),  # 32 rows: 2 m16 tiles
    (2, 3, 300, 4, 1, 64, False, "bfloat16", "m16_w4_k16_s2", 2, (2, 192)),  # MQA, ring wraps
    (1, 1, 300, 1, 1, 128, True, "float16", "m16_w2_k32_s2", 3, (3, 128)),  # 32 keys a warp
    (1, 16, 5, 2, 2, 64, True, "bfloat16", "m16_w2_k16_s2", 1, (1, 32)),    # 11 rows see none
    (1, 9, 70, 4, 2, 32, True, "float16", "m16_w2_k16_s2", 2, (2, 64)),     # 2 m blocks of 16
]


@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype, cfg, splits, launched", CASES)
def test_decode_attention_in_the_emulation(decode_kernel, b, sq, sk, hq, hkv, d, causal, dtype,
                                           cfg, splits, launched):
    used = decode_kernel(cfg, splits)
    check(b, sq, sk, hq, hkv, d, causal, dtype)
    assert used == [(cfg, *launched)]


def test_no_keys(decode_kernel):
    used = decode_kernel("m16_w2_k16_s2", 1)
    check(1, 2, 0, 2, 1, 32, False)
    assert used == [("m16_w2_k16_s2", 1, 32)]
