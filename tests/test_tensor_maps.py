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
