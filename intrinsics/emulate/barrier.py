"""Emulation of intrinsics.barrier: named barriers 1..15 per block, counting arriving threads
(arrive or sync) until the count is reached, when the barrier's generation advances and the
syncing threads go on.  Mistakes are EmulationErrors naming block, warp and lane: an id outside
1..15, a count that is not a multiple of 32 or disagrees with the count other users gave, more
arrivals than the count; a sync that can never complete is reported as a deadlock."""

from intrinsics.emulate import runtime
from intrinsics.emulate.runtime import EmulationError, current


def _state(thread, op, barrier_id, nthreads):
    from intrinsics.barrier import NAMED_BARRIER_IDS

    bid, count = int(barrier_id), int(nthreads)
    if bid not in NAMED_BARRIER_IDS:
        raise EmulationError(f"{thread.where()}: {op}: barrier id {bid} is not in 1..15 (0 is "
                             "cuda.syncthreads')")
    if count <= 0 or count % 32 or count > len(thread.block.threads):
        raise EmulationError(f"{thread.where()}: {op}: the thread count must be a multiple of "
                             f"32 and at most the block's {len(thread.block.threads)} threads, "
                             f"got {count}")
    barriers = thread.block.once("named_barriers", dict)  # the caller holds launch.cond
    bar = barriers.setdefault(bid, {"count": count, "arrived": 0, "generation": 0})
    if bar["arrived"] and bar["count"] != count:
        raise EmulationError(f"{thread.where()}: {op}: barrier {bid} is in use with a count of "
                             f"{bar['count']}, this thread gave {count}")
    bar["count"] = count
    return bid, bar


def _arrive(thread, op, barrier_id, nthreads):
    """Count the calling thread; returns (barrier, the generation it arrived in)."""
    launch = thread.launch
    with launch.cond:
        bid, bar = _state(thread, op, barrier_id, nthreads)
        generation = bar["generation"]
        bar["arrived"] += 1
        if bar["arrived"] == bar["count"]:
            bar["arrived"] = 0
            bar["generation"] += 1
            launch.progress += 1
            launch.cond.notify_all()
    return bid, bar, generation


def named_barrier_sync(barrier_id, nthreads):
    thread = current()
    op = "barrier.sync.aligned"
    bid, bar, generation = _arrive(thread, op, barrier_id, nthreads)
    runtime.wait_until(lambda: bar["generation"] > generation,
                       f"{op} {bid}, {int(nthreads)} ({bar['arrived']} arrived so far)")


def named_barrier_arrive(barrier_id, nthreads):
    _arrive(current(), "barrier.arrive.aligned", barrier_id, nthreads)


EMULATIONS = {
    "named_barrier_sync": named_barrier_sync,
    "named_barrier_arrive": named_barrier_arrive,
}
