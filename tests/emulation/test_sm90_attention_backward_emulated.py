"""numbatc.kernels.sm90_attention_backward in the CPU emulation, through
numbatc.attention_backward with ``NUMBATC_ATTN_BWD_KERNEL=sm90``: the producer's tensor copies
(K and V once, Q and dO per query block through the ring, lse2 and D by bulk copies), the
consumers' wgmma (S^T and dP^T SS, dV and dK RS from the packed P^T and dS^T, dQ from dS^T in
shared memory, MN-major operands), the column-wise fragment intrinsics and masks, the dQ
writer's bulk reductions in key-block order, the last kernel's dq, and heads-major operands
read in place.  Each case: fresh
random data, dq / dk / dv poisoned with NaN, checked against the float64 reference gradient of
tests/helpers/attention_backward.py; that the sm90 kernel ran (NUMBATC_PRINT_CONFIG).  384
threads per block are 384 Python threads here: one to four blocks per case."""

import pytest
from numba import config

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

from tests.helpers.attention_backward import check_backward  # noqa: E402


@pytest.fixture
def sm90(monkeypatch, capfd):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")

    def ran():
        err = capfd.readouterr().err
        assert "sm90_attention_backward" in err, err
        return err
    return ran


@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype", [
    (1, 70, 100, 1, 1, 64, False, "bfloat16"),   # 2 query blocks, a ragged key block
    (1, 100, 70, 2, 1, 64, True, "float16"),     # causal, seqlen_q > seqlen_k, GQA: 2 heads
    (1, 45, 130, 1, 1, 128, True, "bfloat16"),   # 2 key blocks (the second ragged), the order
    (1, 130, 40, 1, 1, 128, True, "float16"),    # 90 queries see no key (lse -inf), 3 blocks
    # batch 2, 2 kv heads (the block's (b, hk, j)), 3 key blocks whose dQ adds wait their turn,
    # key block 0 starting at query block 0, the others further down the diagonal
    (2, 70, 300, 2, 2, 64, True, "float16"),
])
def test_sm90_backward_emulated(sm90, b, sq, sk, hq, hkv, d, causal, dtype):
    check_backward(b, sq, sk, hq, hkv, d, causal, dtype)
    sm90()


def test_sm90_backward_any_order_and_dlse(sm90, monkeypatch):
    """deterministic=False (the dQ writers skip the counters) and a gradient through lse."""
    import numbatc

    call = numbatc.attention_backward
    monkeypatch.setattr(numbatc, "attention_backward",
                        lambda *a, **k: call(*a, deterministic=False, **k))
    check_backward(1, 40, 200, 2, 1, 128, False, "bfloat16", with_dlse=True)
    assert "any order" in sm90()


def test_sm90_backward_refuses_what_it_does_not_do(sm90):
    """A head_dim outside (64, 128) forced onto the kernel is an error naming the reason."""
    with pytest.raises(ValueError, match="head_dim"):
        check_backward(1, 10, 10, 1, 1, 96, False, "bfloat16")


def _heads_major(x, dtype):
    """A (B, H, S, D) float16 array seen as (B, S, H, D): strides out of order, read in place by
    the tensor maps."""
    import numpy as np
    from numba import cuda

    assert dtype == "float16"
    return cuda.to_device(np.ascontiguousarray(x.transpose(0, 2, 1, 3)).astype(np.float16)) \
        .transpose((0, 2, 1, 3))


def test_sm90_backward_reads_strided_views(sm90):
    check_backward(1, 70, 130, 2, 1, 64, True, "float16", views=_heads_major)
    sm90()
