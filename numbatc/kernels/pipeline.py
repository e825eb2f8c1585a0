"""The producer/consumer stage ring of the warp-specialised Hopper kernels, as device code: a
full and an empty mbarrier per stage, and a state of (stage index, phase) that both sides
advance in step (CuTe DSL's ``cutlass/pipeline/sm90.py``: ``PipelineTmaAsync`` and
``PipelineState.advance``).

    ring = tma_pipeline(stages)     # host, once per stage count (cached): device functions
    # bars: a shared uint64 array of 2 * stages: full[s] = bars[s], empty[s] = bars[stages + s]

    one thread:       ring.init(bars, 1, consumer_arrivals); cuda.syncthreads()
    producer thread:  index, phase = 0, 0
                      loop: ring.producer_acquire(bars, index, phase)     # stage free?
                            ring.producer_commit(bars, index, nbytes)     # arm full[s] ...
                            tma_load(..., bars, index) ...                # ... the bytes land
                            index, phase = ring.advance(index, phase)
    consumers:        index, phase = 0, 0
                      loop: ring.consumer_wait(bars, index, phase)        # bytes landed
                            wgmma on stage index ...
                            ring.consumer_release(bars, index)            # one arrival per warp
                            index, phase = ring.advance(index, phase)

The barrier states (a fresh mbarrier is in phase 0; a wait with parity p returns once the phase
with that parity has completed, and at once for parity 1 on a fresh barrier, whose "previous"
phase counts as complete):

    round r of stage s   full[s] completes phase r when   empty[s] completes phase r when
    (phase = r & 1)      the producer's arrival (expect_tx) every consumer warp released the
                         and the nbytes have landed         stage after reading fill r
    producer waits       empty[s] with parity phase ^ 1 (round 0: parity 1, passes at once)
    consumers wait       full[s] with parity phase

Neither side can run more than one round ahead of the other on a stage, so one parity bit
names the phase unambiguously.  ``advance`` wraps the index at ``stages`` and flips the phase.

The functions are ``@cuda.jit(device=True, forceinline=True)`` closures over the stage count
(numba freezes it: ``index + 1 == stages`` is a compare with an immediate); the kernels that
call them are cached on disk by numbatc.kernels.build.load_generated, whose file names hash
this module's source with the rest of numbatc.
"""

import functools
from collections import namedtuple

from numba import cuda

import intrinsics as nt

__all__ = ["Ring", "cp_async_pipeline", "named_barrier_of", "tma_pipeline"]

#: The device functions of one stage count (see the module docstring).
Ring = namedtuple("Ring", "stages init advance producer_acquire producer_commit consumer_wait "
                          "consumer_release")


@functools.cache
def tma_pipeline(stages):
    """The :class:`Ring` of device functions for a ring of ``stages`` (>= 2) stages whose full
    barriers complete on one arrival with a transaction count (a TMA producer)."""
    if not isinstance(stages, int) or stages < 2:
        raise ValueError(f"a pipeline needs an integer number of stages >= 2, got {stages!r}")
    S = stages

    @cuda.jit(device=True, forceinline=True)
    def init(bars, producer_arrivals, consumer_arrivals):
        """One thread: full[s] expects ``producer_arrivals`` arrivals (plus its transaction
        bytes), empty[s] ``consumer_arrivals``; then the fence that makes the initialisation
        visible to the async proxy (TMA's complete_tx).  The caller synchronises the block."""
        for s in range(S):
            nt.mbarrier_init(bars, s, producer_arrivals)
            nt.mbarrier_init(bars, S + s, consumer_arrivals)
        nt.fence_mbarrier_init()

    @cuda.jit(device=True, forceinline=True)
    def advance(index, phase):
        """The next (stage index, phase): the index wraps at the stage count, flipping the
        phase."""
        nxt = index + 1
        if nxt == S:
            return nxt - S, phase ^ 1
        return nxt, phase

    @cuda.jit(device=True, forceinline=True)
    def producer_acquire(bars, index, phase):
        """Wait until stage ``index`` is free: empty[index] completed the previous round."""
        nt.mbarrier_wait_parity(bars, S + index, phase ^ 1)

    @cuda.jit(device=True, forceinline=True)
    def producer_commit(bars, index, nbytes):
        """Arrive on full[index] and add ``nbytes`` to its transaction count: the phase
        completes once the TMA copies signalling it have delivered them."""
        nt.mbarrier_arrive_expect_tx(bars, index, nbytes)

    @cuda.jit(device=True, forceinline=True)
    def consumer_wait(bars, index, phase):
        """Wait until stage ``index``'s fill of this round has landed."""
        nt.mbarrier_wait_parity(bars, index, phase)

    @cuda.jit(device=True, forceinline=True)
    def consumer_release(bars, index):
        """One arrival on empty[index] (the caller's reads of the stage are complete)."""
        nt.mbarrier_arrive(bars, S + index)

    return Ring(S, init, advance, producer_acquire, producer_commit, consumer_wait,
                consumer_release)


@functools.cache
def cp_async_pipeline(stages):
    """The :class:`Ring` of a ring filled by cp.async: full[s] completes on the producer
    threads' ``cp.async.mbarrier.arrive.noinc`` (each thread's arrival fires once its earlier
    copies have landed; ``producer_commit`` is that arrival, its byte count unused), and a
    consumer's wait is followed by ``fence.proxy.async.shared::cta``: cp.async writes through
    the generic proxy, which wgmma (the async proxy) does not see without it.  The rest --
    the empty barriers, the phases -- is :func:`tma_pipeline`'s."""
    tma = tma_pipeline(stages)

    @cuda.jit(device=True, forceinline=True)
    def producer_commit(bars, index, nbytes):
        nt.cp_async_mbarrier_arrive_noinc(bars, index)

    @cuda.jit(device=True, forceinline=True)
    def consumer_wait(bars, index, phase):
        nt.mbarrier_wait_parity(bars, index, phase)
        nt.fence_proxy_async_shared()  # cp.async (generic proxy) -> wgmma (async proxy)

    return tma._replace(producer_commit=producer_commit, consumer_wait=consumer_wait)


@functools.cache
def named_barrier_of(ids, nthreads, arrive=False):
    """``bar(i)``: named barrier ``ids[i]`` (``ids`` a pair or a triple) over ``nthreads``
    threads -- a sync, or with ``arrive`` an arrival -- for a warpgroup index ``i`` known only
    at run time: the barrier id is an immediate of the instruction, so the function branches on
    ``i`` (a warp-uniform branch) to one of the literal ids."""
    if len(ids) not in (2, 3):
        raise ValueError(f"named_barrier_of: a pair or a triple of ids, got {ids!r}")
    first, second = ids[:2]
    third = ids[2] if len(ids) == 3 else None
    op = nt.named_barrier_arrive if arrive else nt.named_barrier_sync

    @cuda.jit(device=True, forceinline=True)
    def bar(i):
        if i == 0:
            op(first, nthreads)
        elif third is not None and i == 2:
            op(third, nthreads)
        else:
            op(second, nthreads)
    return bar

