"""sm90_attention_tma.make_producer's calls, recorded: the producer thread of every TMA
configuration at each of its head dims, run as Python (the emulation's device functions are
Python functions) with the intrinsics replaced by a recorder.  Every expect_tx arms its barrier
with exactly the bytes of the boxes that signal it (one swizzle row of head-dim elements -- 64,
or 32 at head_dim 96 -- x rows x 2 bytes each, out-of-bounds fill included); every box starts
at an innermost coordinate that is a multiple of the box's columns (the 16-byte rule) and on a
boundary of shared memory that the swizzle's repeat divides (1024 bytes for 128B, 512 for 64B);
the key tiles walk the ring's stages in order (stage n % S at k0 + n * BN keys: k0 a varlen
sequence's first key row), K's boxes behind Q, V's behind the K stages."""

import pytest
from numba import config

from numbatc.kernels import pipeline, sm90_attention as attn, sm90_attention_tma

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


class _Recorder:
    """Stands in for ``intrinsics``: every call appends (name, *args)."""

    def __init__(self, calls):
        self.calls = calls

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


CASES = sorted((n, d) for n, c in attn.CONFIGS.items() if c.tma and not c.persistent
               for d in c.head_dims)


@pytest.mark.parametrize("name, d", CASES, ids=[f"{n}-d{d}" for n, d in CASES])
def test_the_producer_arms_each_barrier_with_its_boxes(monkeypatch, name, d):
    cfg = attn.CONFIGS[name]
    cols = attn.swizzle_for(d) // 2
    assert cols == (32 if d == 96 else 64)
    QB, KB = cfg.block_m * d * 2, cfg.block_n * d * 2
    VB0 = QB + cfg.stages * KB
    calls = []
    monkeypatch.setattr(sm90_attention_tma, "nt", _Recorder(calls))
    monkeypatch.setattr(pipeline, "nt", _Recorder(calls))
    produce = sm90_attention_tma.make_producer(cfg.stages, cfg.block_n, d, QB, KB, VB0)
    n_tiles = cfg.stages + 1  # the ring wraps once
    m0, b, h, hk, k0 = 256, 1, 5, 2, 77  # k0: a varlen sequence's first key row
    produce("smem", "qbar", "kbars", "vbars", "tq", "tk", "tv", m0, b, h, hk, n_tiles, k0)
    assert [c[0] for c in calls[:3]] == ["tma_prefetch_descriptor"] * 3
    armed, boxes, order = {}, {}, []
    tile = {"kbars": -1, "vbars": -1}  # the key tile each ring's boxes are for
    rows = {"tq": cfg.block_m, "tk": cfg.block_n, "tv": cfg.block_n}
    for call in calls[3:]:
        if call[0] == "mbarrier_arrive_expect_tx":
            _, bar, index, nbytes = call
            armed[bar, index] = armed.get((bar, index), 0) + nbytes
            order.append((bar, index))
            if bar in tile:
                tile[bar] += 1
        elif call[0] == "tma_load":
            _, smem, offset, tensor, (inner, head, row, batch), bar, index = call
            boxes[bar, index] = boxes.get((bar, index), 0) + rows[tensor] * cols * 2
            assert inner % cols == 0 and inner * 2 % 16 == 0, call
            assert offset % (8 * 2 * cols) == 0, call
            assert batch == b and head == (h if tensor == "tq" else hk), call
            if tensor == "tq":
                assert (bar, row) == ("qbar", m0) and offset < QB, call
            else:
                base = (QB if tensor == "tk" else VB0) + index * KB
                assert base <= offset < base + KB, call
                assert row == k0 + tile[bar] * cfg.block_n, call
        else:
            assert call[0] == "mbarrier_wait_parity", call  # the ring's acquire
    # one arming per (barrier, stage) use: Q once, then K and V per key tile, stage n % S
    tiles = [(ring, n % cfg.stages) for n in range(n_tiles) for ring in ("kbars", "vbars")]
    assert order == [("qbar", 0)] + tiles, order
    assert armed == boxes, (armed, boxes)
    assert armed["qbar", 0] == QB and all(armed[key] == 2 * KB for key in armed
                                          if key[0] != "qbar" and key[1] == 0)
