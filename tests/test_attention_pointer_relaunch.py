"""The warm calls' pointer relaunches of the attention kernels (sm80_attention.pointer_relaunch,
used by sm80_attention and sm90_attention's cp.async kernel; sm80_decode_attention's) against
the checked launch, without a GPU: intrinsics.launch's ``launch`` and ``prepare`` are recorders,
so that for one problem the launch a kernel module makes and the prepared launch its relaunch
makes can be compared -- kernel, grid, block, shared memory, signature, stream and every
argument.  (The TMA kernel's relaunch builds tensor maps through the driver: GPU tests only.)"""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import intrinsics.launch
from numbatc.kernels import sm80_attention, sm80_decode_attention, sm90_attention, split_k
from tests.helpers.problems import attention_operand, attention_problem


class Launches:
    """Recorders for intrinsics.launch.launch and .prepare: each launch as (kernel, grid, block,
    shared bytes, signature, stream, arguments), floats as float32 (the parameter buffer's
    type), tuples flattened."""

    def __init__(self):
        self.launched, self.prepared = [], []

    @staticmethod
    def _args(args):
        # a tuple argument is its members, in order (intrinsics.launch.flat_params)
        flat = [x for a in args for x in (a if isinstance(a, tuple) else (a,))]
        return tuple(np.float32(a) if isinstance(a, (float, np.floating)) else int(a)
                     for a in flat)

    def launch(self, kernel, grid, block, args, shared_bytes=0, stream=0, signature=None, **kw):
        self.launched.append((kernel, grid, block, shared_bytes, signature, stream,
                              self._args(args)))

    def prepare(self, kernel, grid, block, signature, shared_bytes=0, **kw):
        def prepared(stream, *args):
            self.prepared.append((kernel, grid, block, shared_bytes, signature, stream,
                                  self._args(args)))
        return prepared


@pytest.fixture
def rec(monkeypatch):
    r = Launches()
    monkeypatch.setattr(intrinsics.launch, "launch", r.launch)
    monkeypatch.setattr(intrinsics.launch, "prepare", r.prepare)
    # flash-decoding's first launch compiles both kernels together (compile_first): nothing to
    # compile where launches are recorded
    monkeypatch.setattr(intrinsics.launch, "compile_kernels", lambda jobs: None)
    monkeypatch.delenv("NUMBATC_PRINT_CONFIG", raising=False)
    monkeypatch.delenv("NUMBATC_DECODE_SPLITS", raising=False)
    # no driver here: the problems' numba stream (used only to pack copies) is a stand-in
    from numbatc.interop import streams
    monkeypatch.setattr(streams, "numba_stream", lambda handle, device: ("stream", handle))
    # the decode kernel's workspace: a fixed pointer (the per-stream one allocates device memory)
    monkeypatch.setattr(split_k, "split_workspace",
                        lambda device, floats, counters, library=None: lambda stream: (1 << 30, 0))
    return r


def moved(p, stream, **pointers):
    """``p`` with its arrays at new pointers (same shapes and strides) on ``stream``."""
    arrays = {n: attention_operand(getattr(p, n).shape, ptr, getattr(p, n).strides)
              for n, ptr in pointers.items()}
    return dataclasses.replace(p, stream_handle=stream, **arrays)


CASES = [
    ("sm80", sm80_attention, "m64n64_w4_qreg", dict(head_dim=64)),
    ("sm80 causal gqa", sm80_attention, None, dict(head_dim=128, heads_q=8, heads_kv=2,
                                                    causal=True, seqlen_q=77, seqlen_k=300)),
    ("sm90 cp.async", sm90_attention, "n128_2s_ov_pp_fx", dict(head_dim=128, seqlen_q=333)),
    ("decode", sm80_decode_attention, None, dict(head_dim=128, seqlen_q=1, seqlen_k=4097,
                                                  heads_q=32, heads_kv=8, batch=3)),
    ("decode causal", sm80_decode_attention, None, dict(head_dim=64, seqlen_q=5, seqlen_k=2000,
                                                         heads_q=4, heads_kv=1, causal=True)),
]


@pytest.mark.parametrize("with_lse", [False, True], ids=["", "lse"])
@pytest.mark.parametrize("name, module, cfg_name, shape", CASES, ids=[c[0] for c in CASES])
def test_relaunch_launches_what_the_checked_launch_does(rec, name, module, cfg_name, shape,
                                                        with_lse):
    p = attention_problem(**shape)
    lse_shape = (p.batch, p.heads_q, p.seqlen_q)
    lse_strides = (p.heads_q * p.seqlen_q, p.seqlen_q, 1)
    if with_lse:
        p = dataclasses.replace(p, lse=attention_operand(lse_shape, 8 << 24, lse_strides))
    cfg = module.choose(p, cfg_name)
    fast = module.launch(p, cfg)
    assert callable(fast)
    # a later problem like p: new pointers (out and lse too), scale and stream
    p2 = dataclasses.replace(moved(p, 0x77, q=1 << 24, k=2 << 24, v=3 << 24, out=4 << 24),
                             scale=0.3)
    if with_lse:
        p2 = dataclasses.replace(p2, lse=attention_operand(lse_shape, 9 << 24, lse_strides))
    rec.launched.clear()
    module.launch(p2, cfg)
    expected = list(rec.launched)
    assert len(expected) == (2 if module is sm80_decode_attention else 1)
    assert fast(1 << 24, 2 << 24, 3 << 24, 4 << 24, (9 << 24) if with_lse else 0, 0.3,
                0x77) is True
    assert rec.prepared == expected


def int32_operand(shape, ptr):
    strides = (shape[1], 1) if len(shape) == 2 else (1,)
    return SimpleNamespace(ptr=ptr, shape=shape, strides=strides)


def varlen_problem(batch=3, max_q=200, max_k=300, heads_q=4, heads_kv=2, head_dim=64,
                   causal=False):
    """A varlen problem: packed q (900 rows), k and v (1200 rows), prefix sums at 5 << 20 / 6 << 20."""
    p = attention_problem(heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, causal=causal)
    packed = lambda rows, h, ptr: SimpleNamespace(  # noqa: E731
        ptr=ptr, shape=(rows, h, head_dim), strides=(h * head_dim, head_dim, 1))
    return dataclasses.replace(
        p, q=packed(900, heads_q, 4096), out=packed(900, heads_q, 1 << 20),
        k=packed(1200, heads_kv, 2 << 20), v=packed(1200, heads_kv, 3 << 20), batch=batch,
        seqlen_q=max_q, seqlen_k=max_k, cu_seqlens_q=int32_operand((batch + 1,), 5 << 20),
        cu_seqlens_k=int32_operand((batch + 1,), 6 << 20))


def kvcache_problem(seqlen_q, paged, batch=3, heads_q=8, heads_kv=2, head_dim=128):
    """A KV-cache problem of capacity 4096 (paged: 64 pages of 64 rows, 64 a sequence); the
    lengths at 5 << 20, the block table at 6 << 20."""
    p = attention_problem(batch=batch, seqlen_q=seqlen_q, seqlen_k=4096, heads_q=heads_q,
                          heads_kv=heads_kv, head_dim=head_dim)
    seqlens = int32_operand((batch,), 5 << 20)
    if not paged:
        return dataclasses.replace(p, cache_seqlens=seqlens)
    pages = SimpleNamespace(ptr=2 << 20, shape=(200, 64, heads_kv, head_dim),
                            strides=(64 * heads_kv * head_dim, heads_kv * head_dim, head_dim, 1))
    return dataclasses.replace(p, cache_seqlens=seqlens, k=pages,
                               v=SimpleNamespace(**{**vars(pages), "ptr": 3 << 20}),
                               block_table=int32_operand((batch, 64), 6 << 20), page_size=64)


VALUE_CASES = [
    ("sm80 varlen", sm80_attention, None, lambda: varlen_problem(causal=True), "cu"),
    ("sm90 cp.async varlen", sm90_attention, "n128_2s_ov_pp_fx",
     lambda: varlen_problem(head_dim=128), "cu"),
    ("decode kvcache", sm80_decode_attention, None, lambda: kvcache_problem(1, False), "kv"),
    ("decode paged", sm80_decode_attention, None, lambda: kvcache_problem(4, True), "kv"),
    ("sm80 prefill paged", sm80_attention, None, lambda: kvcache_problem(100, True), "kv"),
]


@pytest.mark.parametrize("name, module, cfg_name, make, kw", VALUE_CASES,
                         ids=[c[0] for c in VALUE_CASES])
def test_relaunch_takes_the_value_arrays_pointers(rec, name, module, cfg_name, make, kw):
    """Varlen and KV-cache problems: the relaunch takes the prefix sums' / lengths' and block
    table's pointers and launches what the checked launch of a problem at those pointers does;
    without them (or with the other kind's) it refuses."""
    p = make()
    cfg = module.choose(p, cfg_name)
    fast = module.launch(p, cfg)
    assert callable(fast)
    names = (("cu_seqlens_q", "cu_seqlens_k") if kw == "cu"
             else ("cache_seqlens", "block_table"))
    new = {n: getattr(p, n) and SimpleNamespace(**{**vars(getattr(p, n)), "ptr": ptr})
           for n, ptr in zip(names, (7 << 20, 8 << 20))}
    p2 = dataclasses.replace(moved(p, 0x77, q=1 << 24, k=2 << 24, v=3 << 24, out=4 << 24),
                             scale=0.3, **new)
    rec.launched.clear()
    module.launch(p2, cfg)
    expected = list(rec.launched)
    pointers = (7 << 20, (8 << 20) if p.block_table is not None or kw == "cu" else 7 << 20)
    assert fast(1 << 24, 2 << 24, 3 << 24, 4 << 24, 0, 0.3, 0x77) is False  # no values
    if module is not sm80_decode_attention:  # the decode kernel takes no prefix sums
        other = "kv" if kw == "cu" else "cu"
        assert fast(1 << 24, 2 << 24, 3 << 24, 4 << 24, 0, 0.3, 0x77,
                    **{kw: pointers, other: pointers}) is False
    assert rec.prepared == []
    assert fast(1 << 24, 2 << 24, 3 << 24, 4 << 24, 0, 0.3, 0x77, **{kw: pointers}) is True
    assert rec.prepared == expected


def test_unaligned_starts_go_back_to_the_checked_path(rec):
    p = attention_problem(head_dim=64)
    fast = sm80_attention.launch(p, sm80_attention.choose(p))
    assert fast(4096 + 8, 4096, 4096, 4096, 0, 0.125, 0) is False
    assert fast(4096, 4096 + 2, 4096, 4096, 0, 0.125, 0) is False
    assert rec.prepared == []


def test_no_relaunch_when_packed_or_printing(rec, monkeypatch):
    # q's start not 16-byte aligned: the checked launch packs a copy, so no pointer relaunch
    p = attention_problem(head_dim=64)
    p = dataclasses.replace(p, q=attention_operand(p.q.shape, 4096 + 2, p.q.strides))
    monkeypatch.setattr(sm80_attention, "_operand",
                        lambda ca, stream, keep: (keep.append(ca) or ca.ptr,
                                                  sm80_attention._strides3(ca)))
    assert sm80_attention.launch(p, sm80_attention.choose(p)) is None
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    p = attention_problem(head_dim=64)
    assert sm80_attention.launch(p, sm80_attention.choose(p)) is None
    assert sm80_decode_attention.launch(
        attention_problem(seqlen_q=1, seqlen_k=2048),
        sm80_decode_attention.choose(attention_problem(seqlen_q=1, seqlen_k=2048))) is None
