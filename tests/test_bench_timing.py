"""numbatc.bench's two timings on a fake torch (no GPU): back-to-back calls, and --timing graph
(the calls captured once into a CUDA graph, replays timed), with its fallback for a call that
cannot be captured."""

import contextlib
import types

import pytest

from numbatc import bench


class FakeTorch:
    """Just what _time_gpu touches: events whose elapsed time is the work enqueued between
    them (each call of fn costs 0.01 ms; a graph replay costs its captured calls' time)."""

    def __init__(self, capture_fails=False):
        self.clock = 0.0
        self.captured = []          # counts of calls captured, per graph
        self.capturing = None
        fake = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = fake.clock

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        class CUDAGraph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                fake.clock += 0.01 * self.calls

        @contextlib.contextmanager
        def graph(g):
            if capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None
                fake.captured.append(g.calls)

        self.cuda = types.SimpleNamespace(Event=Event, CUDAGraph=CUDAGraph, graph=graph,
                                          synchronize=lambda: None)

    def call(self):
        if self.capturing is not None:
            self.capturing.calls += 1   # recorded, not run
        else:
            self.clock += 0.01


@pytest.fixture
def timing(monkeypatch):
    monkeypatch.setattr(bench, "_time_gpu", bench._time_gpu)
    monkeypatch.setattr(bench._time_gpu, "fallbacks", [])

    def use(mode):
        monkeypatch.setattr(bench, "TIMING", mode)
    return use


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_per_call_time(timing, mode):
    timing(mode)
    torch = FakeTorch()
    ms = bench._time_gpu(torch.call, torch, reps=5)
    assert ms == pytest.approx(0.01)
    if mode == "graph":
        # one call to size the group, then a group of about 1 ms / 0.01 ms = 100 calls
        assert torch.captured[0] == 1 and 95 <= torch.captured[1] <= 100
        assert len(torch.captured) == 2
    else:
        assert torch.captured == []
    assert bench._time_gpu.fallbacks == []


def test_graph_falls_back_and_says_so(timing):
    timing("graph")
    torch = FakeTorch(capture_fails=True)
    ms = bench._time_gpu(torch.call, torch, reps=3)
    assert ms == pytest.approx(0.01)
    assert len(bench._time_gpu.fallbacks) == 1
    assert "stream is capturing" in bench._time_gpu.fallbacks[0]


def test_timing_option_parses():
    args = bench._parser().parse_args(["gemm", "--timing", "graph", "--shapes", "quick"])
    assert args.timing == "graph"
    assert bench._parser().parse_args(["attention"]).timing == "stream"
