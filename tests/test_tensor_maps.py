"""numbatc.kernels.tensor_maps.LastMaps without a GPU: the relaunch memo of the TMA kernels (GEMM
and attention) answers a repeat of the last pointers without building maps, builds for new
ones, keeps the maps it answers for alive, and never remembers maps written while capturing
(their slots hold them only after the graph replays)."""

import gc
import weakref

from numbatc.kernels.tensor_maps import CapturedMap, LastMaps


class Map:
    """A stand-in tensor map whose kernel parameters are known (map_params reads them)."""

    def __init__(self, tag):
        self._kernel_params = (tag,) * 7


def test_repeat_pointers_reuse_the_parameters():
    built = []

    def make(a, b):
        built.append((a, b))
        return Map(a), Map(b)

    last = LastMaps()
    assert last.params((1, 2), make, 1, 2) == (1,) * 7 + (2,) * 7
    assert last.params((1, 2), make, 1, 2) == (1,) * 7 + (2,) * 7
    assert built == [(1, 2)]
    assert last.params((1, 3), make, 1, 3) == (1,) * 7 + (3,) * 7
    assert built == [(1, 2), (1, 3)]


def test_remembered_maps_stay_alive():
    last = LastMaps()
    m = Map(5)
    ref = weakref.ref(m)
    last.params((5,), lambda: (m,))
    del m
    gc.collect()
    assert ref() is not None  # the parameters point at its device memory


def test_captured_maps_are_not_remembered():
    built = []

    def make(ptr):
        built.append(ptr)
        tm = CapturedMap(None, None)
        tm._kernel_params = (ptr,) * 7
        return (tm,)

    last = LastMaps()
    assert last.params((7,), make, 7) == (7,) * 7
    assert last.params((7,), make, 7) == (7,) * 7
    assert built == [7, 7]  # looked up again each time


def test_maps_used_while_capturing_outlive_the_memo_and_the_cache(monkeypatch):
    """A graph's kernels read the device memory of the maps its captured calls used at every
    replay: a memo hit or a cache hit on a capturing stream keeps those maps for good, while
    the same hits outside capture keep nothing (the memo moves on, the cache starts again at its
    limit, and the maps can go)."""
    from numbatc import _capture
    from numbatc.kernels import tensor_maps

    capturing = {7}
    monkeypatch.setattr(_capture, "is_capturing", lambda stream: stream in capturing)
    monkeypatch.setattr(tensor_maps, "_RETAINED", {})
    last = LastMaps()
    eager, captured = Map(1), Map(2)
    refs = weakref.ref(eager), weakref.ref(captured)
    last.params((1,), lambda: (eager,), stream=0)
    last.params((1,), lambda: (eager,), stream=0)  # a hit outside capture: nothing kept
    last.params((2,), lambda: (captured,), stream=0)
    last.params((2,), lambda: (captured,), stream=7)  # a hit while stream 7 captures
    last.params((3,), lambda: (Map(3),), stream=0)  # the memo moves on
    del eager, captured
    gc.collect()
    assert refs[0]() is None and refs[1]() is not None
    assert list(tensor_maps._RETAINED.values()) == [refs[1]()]
    # the cache's hit while capturing
    key = (4096, "bfloat16", (64, 64), (128,), (64, 64))
    cached = Map(4)
    monkeypatch.setitem(tensor_maps._MAPS, key, cached)
    assert tensor_maps.tiled_map(4096, "bfloat16", (64, 64), (128,), (64, 64), stream=7) is cached
    assert tensor_maps._RETAINED[id(cached)] is cached
    written = CapturedMap(None, None)  # a slot of the pool: nothing to keep
    tensor_maps.retain_if_capturing((written,), 7)
    assert id(written) not in tensor_maps._RETAINED
