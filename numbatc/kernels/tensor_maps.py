"""The TMA kernels' tensor maps: one cache per (pointer, geometry) shared by every kernel module
that loads or stores through TMA (sm90_gemm_tma, sm90_attention_tma), and a relaunch's memo of
the last maps it used.

The kernels take their maps by value (``TensorMap.param``, a ``__grid_constant__`` parameter,
see intrinsics.grid_constant): a map is encoded on the host and its 128 bytes travel with the
launch.  Nothing is copied to the device, so:

- a new pointer costs one host encode (``cuTensorMapEncodeTiled``), no copy and no sync;
- while a stream captures a CUDA graph, a new map needs nothing more: the graph records the
  launch's parameters, maps included, and each replay passes the same bytes (no kernel is
  recorded to write a map, none has to have run before the capture);
- the cache holds host objects only: dropping one never frees memory a graph still reads.

- :func:`tiled_map`: the swizzled (128B unless asked) tiled TensorMap of a device pointer, cached.  A map
  describes memory, not an allocation, so a recycled pointer reuses it correctly.
- :func:`map_params`: a map's kernel parameters (one: its 128 bytes).
- :class:`LastMaps`: a relaunch's memo of the last pointers' map parameters.
"""

import threading

__all__ = ["LastMaps", "map_params", "tiled_map"]

SWIZZLE = 128

_MAPS: dict = {}
_MAPS_LIMIT = 4096
_MAPS_LOCK = threading.Lock()


def tiled_map(src: int, dtype, shape, strides, box, swizzle=SWIZZLE):
    """The ``swizzle``-byte swizzled tiled TensorMap of device pointer ``src`` (natural order
    ``shape``, byte ``strides``, ``box``; ``dtype`` intrinsics.tensormap's name), cached per
    (pointer, geometry).  Made on the host the same way whether or not a stream is capturing."""
    from intrinsics.tensormap import TensorMap

    key = (int(src), dtype, shape, strides, box, swizzle)
    tm = _MAPS.get(key)
    if tm is not None:
        return tm
    tm = TensorMap.tiled(int(src), box, dtype=dtype, shape=shape, strides=strides,
                         swizzle=swizzle)
    tm.param  # noqa: B018 -- its 128 bytes, once
    with _MAPS_LOCK:
        if len(_MAPS) >= _MAPS_LIMIT:
            _MAPS.clear()  # host objects only: a graph that used one holds its bytes
        _MAPS[key] = tm
    return tm


def map_params(tm):
    """The kernel parameters of a tensor map passed by value: ``(its 128 bytes,)``."""
    return (tm.param.blob,)


class LastMaps:
    """A prepared relaunch's memo: the kernel parameters of the maps of the last pointers it
    was given, so that a warm call on the same operands (a benchmark, a decode loop's cache, a
    layer's weight) skips the map lookups.  One tuple, swapped whole, so threads sharing the
    relaunch never see a torn entry."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = (None, None)

    def params(self, ptrs, make, *args):
        """The flat parameters of ``make(*args)``'s maps (a tuple, in order) for ``ptrs`` (the
        tuple of pointers they describe)."""
        last_ptrs, params = self._last
        if last_ptrs == ptrs:
            return params
        params = tuple(x for tm in make(*args) for x in map_params(tm))
        self._last = (ptrs, params)
        return params
