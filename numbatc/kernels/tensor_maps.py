"""The TMA kernels' tensor maps on the GPU: one cache per (pointer, geometry) shared by every
kernel module that loads or stores through TMA (sm90_gemm_tma, sm90_attention_tma), the maps of
operands first seen while a stream captures a CUDA graph, and a map's kernel parameters.

- :func:`tiled_map`: the 128B-swizzled tiled TensorMap of a device pointer, cached.  A map
  describes memory, not an allocation, so a recycled pointer reuses it correctly.
- While a stream captures, a new map cannot be copied to the device (cuMemAlloc and a
  synchronous copy would invalidate the capture): it is encoded on the host and written into a
  slot of a per-device pool (:class:`MapSlots`) by a one-block kernel on the capturing stream,
  recorded into the graph, so every replay writes the map before the kernels read it.  Such a
  map (:class:`CapturedMap`) holds its words only once the graph has replayed, so it is never
  cached for later calls (an eager call at the same address after the capture builds its own).
- :func:`map_params`: the 7 kernel parameters of a map's ``uint64[:]`` device array, computed
  once per map (a prepared launch passes them as they are).
- :class:`LastMaps`: a relaunch's memo of the last pointers' map parameters.
- A map from the cache that a call uses while its stream captures is kept for the life of the
  process (:data:`_RETAINED`): the graph's kernels read the map's device memory at every
  replay, long after the cache may have dropped it (it holds :data:`_MAPS_LIMIT` maps, then
  starts again), and freed memory would be reused by other allocations.
"""

import functools
import threading

import numpy as np
from numba import cuda

__all__ = ["CapturedMap", "LastMaps", "MapSlots", "map_params", "retain_if_capturing",
           "tiled_map"]

SWIZZLE = 128

_MAPS: dict = {}
_MAPS_LIMIT = 1024
_MAPS_LOCK = threading.Lock()
#: id -> map, never dropped: the cached maps that calls used while capturing a CUDA graph
_RETAINED: dict = {}


def retain_if_capturing(maps, stream):
    """Keep ``maps`` (from the cache) for the life of the process if ``stream`` is capturing a
    CUDA graph, which will read their device memory at every replay."""
    from numbatc import _capture

    if _capture.is_capturing(stream):
        for tm in maps:
            if not isinstance(tm, CapturedMap):  # a slot of MapSlots lives as long anyway
                _RETAINED[id(tm)] = tm


class CapturedMap:
    """A tensor map written into a slot of :class:`MapSlots` by a kernel recorded in a CUDA
    graph (its ``device`` has what :func:`map_params` reads)."""

    def __init__(self, tm, device):
        self.tm, self.device = tm, device


class MapSlots:
    """Device memory for tensor maps made while a stream captures a CUDA graph, one pool per
    device, allocated by the first TMA map made outside capture (see the module's note)."""

    #: 4 MB per device.  Captured maps are not cached (see tiled_map), so a capture takes a
    #: slot per map a kernel launch in it needs: about 600 for 32 layers of 7 GEMMs.
    SLOTS = 32768

    def __init__(self):
        self.words = cuda.device_array((self.SLOTS, 16), np.uint64)  # rows 128 B, 64-aligned
        self.next = 0
        self.writer = _map_writer()
        self.writer[1, 16](self.words[0], (np.uint64(0),) * 16)  # compiled before any capture
        cuda.synchronize()

    def write(self, tm, stream):
        if self.next == self.SLOTS:
            from numbatc._capture import CaptureError

            raise CaptureError(f"numbatc: {self.SLOTS} tensor maps were made while capturing "
                               "on this device; no slot is left for another")
        slot = self.words[self.next]
        self.next += 1
        words = tuple(np.uint64(w) for w in tm.words)
        self.writer[1, 16, cuda.external_stream(stream)](slot, words)
        return CapturedMap(tm, slot)


_SLOTS: dict = {}


@functools.cache
def _map_writer():
    @cuda.jit
    def write_map(dst, words):
        i = cuda.threadIdx.x
        if i < 16:
            dst[i] = words[i]

    return write_map


def tiled_map(src: int, dtype, shape, strides, box, stream=0):
    """The 128B-swizzled tiled TensorMap of device pointer ``src`` (natural order ``shape``,
    byte ``strides``, ``box``; ``dtype`` intrinsics.tensormap's name), cached per (pointer,
    geometry); a new one while ``stream`` captures a CUDA graph is a :class:`CapturedMap`."""
    from intrinsics.tensormap import TensorMap
    from numbatc import _capture

    key = (int(src), dtype, shape, strides, box)
    tm = _MAPS.get(key)
    if tm is not None:
        retain_if_capturing((tm,), stream)
        return tm
    with _MAPS_LOCK:
        tm = _MAPS.get(key)
        if tm is not None:
            retain_if_capturing((tm,), stream)
            return tm
        device = cuda.current_context().device.id
        tm = TensorMap.tiled(int(src), box, dtype=dtype, shape=shape, strides=strides,
                             swizzle=SWIZZLE)
        if _capture.is_capturing(stream):
            slots = _SLOTS.get(device)
            if slots is None:
                _capture.refuse_if_capturing(
                    stream, "allocate the device memory for TMA tensor maps",
                    "make one numbatc call that uses TMA (a GEMM, or attention at head_dim 64 "
                    "or 128) on this device before capturing")
            # NOTE: not cached: its slot holds the map only once the graph replays
            return slots.write(tm, _capture.stream_handle(stream))
        if device not in _SLOTS:
            _SLOTS[device] = MapSlots()
        tm.device  # noqa: B018 -- copy it to the device now, once
        if len(_MAPS) >= _MAPS_LIMIT:
            _MAPS.clear()
        _MAPS[key] = tm
    return tm


def map_params(tm):
    """The 7 kernel parameters of a tensor map's uint64[:] device array (intrinsics.launch's
    array_params), computed once per map."""
    params = getattr(tm, "_kernel_params", None)
    if params is None:
        from intrinsics.launch import array_params

        params = array_params(tm.device.__cuda_array_interface__["data"][0], (16,), (8,), 8)
        tm._kernel_params = params
    return params


class LastMaps:
    """A prepared relaunch's memo: the kernel parameters of the maps of the last pointers it
    was given, so that a warm call on the same operands (a benchmark, a decode loop's cache, a
    layer's weight) skips the map lookups.  One tuple, swapped whole, so threads sharing the
    relaunch never see a torn entry; it holds the maps themselves, whose device memory the
    parameters point at (the cache may drop them).  Maps written while capturing are not
    remembered: their slots hold them only once the graph replays, and an eager call after the
    capture must look its pointers up again."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = (None, None, None)

    def params(self, ptrs, make, *args, stream=None):
        """The flat parameters of ``make(*args)``'s maps (a tuple, in order) for ``ptrs`` (the
        tuple of pointers they describe).  ``stream``: the launch's; remembered maps that a
        launch uses while it captures a CUDA graph are kept for good (retain_if_capturing;
        ``make`` goes through tiled_map, which does the same)."""
        last_ptrs, params, maps = self._last
        if last_ptrs == ptrs:
            if stream is not None:
                retain_if_capturing(maps, stream)
            return params
        maps = make(*args)
        params = tuple(x for tm in maps for x in map_params(tm))
        if not any(isinstance(tm, CapturedMap) for tm in maps):
            self._last = (ptrs, params, maps)
        return params
