"""numbatc.kernels.sm90_attention in the CPU emulation (the same kernel source as on the GPU),
through numbatc.attention with ``NUMBATC_ATTN_KERNEL=sm90:<config>``: the warp-specialised
cp.async -> mbarrier -> wgmma pipeline (SS for Q K^T, RS for P V), the online softmax in the
accumulator's registers, masks for ragged key tiles and the causal diagonal, rows that see no
key, GQA, head_dim 64 and 128, bf16 and f16, lse; both schedules (in order, and the overlapped
one with a wgmma group in flight during the softmax, and that one with the two consumers'
ping-pong on named barriers), rings of 2 and 3 stages that wrap.

Each case checks against tests/gpu/test_attention_gpu.py's float64 reference (outputs poisoned
with NaN first, fresh random data) and that the sm90 kernel, not the fallback, ran.  384 threads
per block are 384 Python threads here: one or two blocks per case."""

import pytest
from numba import config

from numbatc.kernels import sm90_attention

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

from tests.gpu.test_attention_gpu import check  # noqa: E402
from tests.gpu.test_sm90_attention_gpu import sm90  # noqa: E402,F401 (the fixture)


CASES = [
    # b, sq,  sk, hq, hkv, d, causal, dtype,   config
    (1, 1, 1, 1, 1, 64, False, "bfloat16", "n128_2s_ov"),      # one query, one key
    (1, 70, 70, 2, 1, 64, True, "float16", "n128_2s_ov"),      # GQA, ragged tile, diagonal
    (1, 130, 70, 1, 1, 128, True, "bfloat16", "n128_2s"),      # 2 blocks; 60 rows see no key
    (1, 40, 300, 1, 1, 128, False, "float16", "n128_2s_ov"),   # 3 key tiles wrap 2 stages
    (1, 33, 200, 3, 1, 64, True, "bfloat16", "n64_2s_ov"),     # 4 tiles of 64, causal, MQA
    (1, 64, 129, 1, 1, 128, True, "float16", "n64_2s"),        # in order, 3 tiles, 1 ragged key
    (1, 20, 400, 2, 2, 64, False, "bfloat16", "n128_3s_ov"),   # 3 stages, 4 tiles
    # ping-pong (named barriers): GQA, causal, ragged; block 0's consumers see 1 and 2 key tiles
    (1, 150, 150, 2, 1, 64, True, "bfloat16", "n64_2s_ov_pp"),
    (1, 40, 300, 1, 1, 128, False, "float16", "n128_2s_ov_pp"),  # 3 tiles wrap 2 stages
    (1, 130, 30, 1, 1, 64, True, "bfloat16", "n128_2s_ov_pp"),   # block 0: consumer 0 sees none
    # the two-instruction exponential (ex2.approx.ftz of an fma): masked rows, -inf maxima
    (1, 70, 200, 2, 1, 128, True, "bfloat16", "n128_2s_ov_fx"),
    (1, 150, 150, 1, 1, 64, True, "float16", "n128_2s_ov_pp_fx"),
]


@pytest.mark.parametrize("b, sq, sk, hq, hkv, d, causal, dtype, cfg", CASES)
def test_sm90_attention_in_the_emulation(sm90, monkeypatch, b, sq, sk, hq, hkv, d, causal,
                                         dtype, cfg):
    from intrinsics.emulate import barrier as emulated_barrier

    # every named barrier the kernel touched (the emulation reports a barrier left part-full at
    # exit only if someone waits on it): each must end with no pending arrival
    touched = []
    real_arrive = emulated_barrier._arrive

    def arrive(thread, op, barrier_id, nthreads):
        result = real_arrive(thread, op, barrier_id, nthreads)
        touched.append(result[1])
        return result

    monkeypatch.setattr(emulated_barrier, "_arrive", arrive)
    used = sm90(cfg)
    check(b, sq, sk, hq, hkv, d, causal, dtype)
    assert used == [cfg]
    assert bool(touched) == sm90_attention.CONFIGS[cfg].pingpong
    assert all(bar["arrived"] == 0 for bar in touched), "a named barrier left part-full"


def test_no_keys(sm90):
    used = sm90("n128_2s_ov")
    check(1, 5, 0, 2, 2, 64, False)
    assert used == ["n128_2s_ov"]


def test_other_head_dims_stay_on_sm80(sm90, capsys, monkeypatch):
    used = sm90("n128_2s_ov")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    check(1, 3, 5, 1, 1, 32, False)
    assert used == []
    assert "sm80_attention, not sm90_attention: head_dim 32" in capsys.readouterr().err
