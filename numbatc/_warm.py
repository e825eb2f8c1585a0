"""Warm calls: what a checked call decided, reused by later calls that differ from it only in
their arrays' pointers.  One cache for numbatc.gemm, numbatc.softmax, numbatc.gemm_softmax and
numbatc.attention.

A checked call validates its arguments, picks a configuration and launches; the launch hands
back a relaunch function (``intrinsics.launch.PreparedLaunch``: the parameter buffer made once,
one ``cuLaunchKernel`` per call; numbatc.attention's takes pointers the same way where the
kernel module made one -- sm90_attention's configurations -- and is otherwise the module's own
launch of the chosen configuration, for a problem built without the checks).  The front end stores it in
:data:`CACHE` as an
:class:`Entry` under a key holding everything its checks read besides pointer values:

- the front end's name ('gemm', 'softmax', 'gemm_softmax', 'attention');
- each array's probe key (``numbatc.interop.probes``: library, shape, strides, dtype, device
  ...; :data:`ABSENT`'s None for an array the call does not pass);
- the pointer bits the checks read (alignment: the pointer modulo 16);
- the other arguments that steer the decision (gemm: beta == 0, activation, out_dtype, the
  dispatch environment ...);
- the thread: a relaunch function's parameter buffer is used by one thread, and a NULL-stream
  launch runs in the thread's current context, which the checked call made current.

A later call with an equal key skips the checks and the dispatch: it costs its probes, one dict
lookup, the entry's pointer-dependent checks (out against each input's byte range: where the
ranges meet, the checked path decides, exactly), the current-stream lookup and the relaunch.
An entry returns :data:`MISS` where it cannot serve a call; the front end then takes the checked
path, which names any error.  The front ends inline their probes and lookups (no helper call on
the hit path): this module holds the cache, the sentinels and what every entry is made of.

Threads: the dict is only read, set and cleared whole -- single operations that need no lock; a
lookup that misses (another thread cleared it) takes the checked path.

CUDA graphs: a warm call does what its checked call's launch did, less the checks: the
relaunch (whose split-K workspace follows numbatc._capture's rules), the stream lookup, and for
a call without ``out=`` the allocator (``torch.empty`` for torch tensors, capture-safe;
``allocate_like`` for CuPy and Numba inputs, which refuses while the stream captures).
"""

from __future__ import annotations

from numbatc.interop import alloc, streams
from numbatc.interop.arrays import CudaArray

__all__ = ["CACHE", "LIMIT", "MISS", "ABSENT", "Entry", "remember", "span"]

#: key -> Entry, for every front end (see the module docstring for what a key holds).
CACHE: dict = {}
#: entries kept before the whole cache is dropped (a workload of more distinct calls than this
#: re-validates them, it never grows without bound).
LIMIT = 1024
#: what an entry returns when it cannot serve a call.
MISS = object()
#: the probe (pointer, key) of an array a call does not pass.
ABSENT = (0, None)


def span(ca: CudaArray | None) -> int:
    """Bytes from an array's lowest to its highest element's end (strides are >= 0); 0 for
    None."""
    if ca is None:
        return 0
    lo, hi = ca.byte_range()
    return hi - lo


class Entry:
    """One cached decision, as every front end's entry holds it: ``relaunch`` (the launch's
    relaunch function), ``stream`` (a function returning the caller library's current stream,
    ``streams.stream_getter``), ``alloc`` (a function allocating the result of a call without
    ``out=``, ``alloc.allocator``; None for calls with one) and ``out_span`` (the result's bytes).

    A front end's subclass adds its inputs' spans and ``__call__(pointers, ...)``, which
    allocates the result or checks ``out`` against the inputs, relaunches on the current stream
    and returns the result, or :data:`MISS`."""

    __slots__ = ("relaunch", "stream", "alloc", "out_span")

    def __init__(self, relaunch, like: CudaArray, out: CudaArray, allocate: bool):
        """``like``: the array whose library and device the stream and a result follow (gemm's
        a, softmax's x); ``out``: the checked call's result; ``allocate``: the call had no out=."""
        self.relaunch = relaunch
        self.stream = streams.stream_getter(like)
        self.alloc = alloc.allocator(like, out.shape, out.dtype) if allocate else None
        self.out_span = span(out)


def remember(key, entry: Entry) -> None:
    """Store ``entry`` under ``key``; a full cache (:data:`LIMIT` entries) is dropped whole
    first."""
    if len(CACHE) >= LIMIT:
        CACHE.clear()
    CACHE[key] = entry
