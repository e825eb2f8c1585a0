"""Emulation of intrinsics.mbarrier: the mbarrier object of PTX ISA 9.7.13.15 per (block, shared
address), kept beside the block's shared memory.

Each object holds what the ISA's "Contents of the mbarrier object" (9.7.13.15.2) lists: the
expected arrival count (from ``mbarrier.init``), the pending arrival count, the transaction count
(tx-count) and the current phase.  A phase completes when the pending count is 0 and the tx-count
is 0 (9.7.13.15.5); the phase then advances, pending returns to the expected count and tx-count to
0.  tx-count may go negative while arrivals are pending (bytes of a multicast copy can reach a
CTA before that CTA's ``arrive.expect_tx``).

The state an arrive returns (``uint64``) encodes the barrier's address and the phase it was taken
in: ``0xB0 << 56 | address << 32 | phase & 0xFFFFFFFF``.  ``test_wait(state)`` is true once that
phase has completed.

Protocol mistakes raise EmulationError naming block, warp, lane and the barrier's address:

- any operation on an address without a valid barrier (before ``mbarrier.init``, after
  ``mbarrier.inval``), ``init`` on a valid barrier, a misaligned object, counts out of range;
- an arrive-on with more arrivals than are pending in the phase (pending would underflow);
- all arrivals of a phase in while more bytes have completed than were expected (tx-count
  negative with nothing pending: ``expect_tx`` promised fewer bytes than arrived);
- ``test_wait`` with a state from another barrier or from an older phase than the preceding one;
- a wait that can never complete (bytes that never come, arrivals that never happen): the
  runtime's deadlock detection names the barrier with its pending arrivals and tx-count.  Polling
  loops (``while not test_wait_parity(...)``) are watched too: a thread that keeps polling a
  barrier while every other thread of the cluster waits and nothing changes is a deadlock.

``try_wait.parity`` suspends the thread for up to 1 ms (or until another thread changes some
state), as the hardware suspends it for a system-dependent time.  The parity operand's low bit
is its parity.

Blocked threads (``wait_parity`` here, the cluster barrier in cluster.py) wait in
:func:`quiet_wait`; every report of a blocked thread shows the barrier's state at the time of the
report (``Barrier.describe``).  The simulator's kernel API gets ``cuda.nanosleep`` (polling loops
back off with it).
"""

import threading
import time

import numpy as np

from intrinsics.emulate import memory, runtime
from intrinsics.emulate.runtime import EmulationError, current

__all__ = ["Barrier", "Live", "barrier_address", "barrier_at", "complete_tx", "quiet_wait"]

COUNT_LIMIT = 2**20 - 1  # arrival counts and tx-counts are 20-bit (PTX ISA 9.7.13.15.1)
STATE_TAG = 0xB0
TRY_WAIT_SECONDS = 0.001  # how long one try_wait suspends the thread at most


class Barrier:
    """One mbarrier object (PTX ISA 9.7.13.15.2)."""

    __slots__ = ("block", "address", "count", "pending", "tx", "phase", "valid")

    def __init__(self, block, address, count):
        self.block = block
        self.address = address
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0
        self.valid = True

    def describe(self):
        return (
            f"mbarrier at shared address {self.address:#x} of block {tuple(self.block.index)} "
            f"(phase {self.phase}, parity {self.phase & 1}: {self.pending} of {self.count} "
            f"arrivals pending, tx-count {self.tx})"
        )

    def complete_if_done(self, thread, op):
        """Advance the phase when pending and tx-count are both 0 (caller holds the lock)."""
        if self.pending:
            return
        if self.tx < 0:
            raise EmulationError(
                f"{thread.where()}: {op}: {self.describe()}: every arrival of the phase is in "
                f"but {-self.tx} more transaction bytes completed than were expected -- the "
                "expect_tx byte count does not match the bytes the copies delivered"
            )
        if self.tx == 0:
            self.phase += 1
            self.pending = self.count


class Live:
    """A description evaluated when printed (deadlock reports show the state at that time)."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text()


def _progress(launch, wake=True):
    """Count a state change; wake the waiting threads when it may be what they wait for (a
    completed phase), not at every arrival: every wake costs each waiter a check."""
    launch.progress += 1
    if wake:
        launch.cond.notify_all()


def barrier_address(op, bars, index):
    """Shared address of the mbarrier ``bars[index]`` (uint64 array, 8-byte aligned)."""
    thread = current()
    array = memory.host_array(bars)
    if array.dtype != np.uint64:
        raise EmulationError(
            f"{thread.where()}: {op}: the mbarrier array must hold uint64, got {array.dtype}"
        )
    address = memory.shared_address(bars, index)
    if address % 8:
        raise EmulationError(
            f"{thread.where()}: {op}: the mbarrier object at shared address {address:#x} is not "
            "8-byte aligned"
        )
    return address


def barrier_at(thread, block, address, op):
    """The valid barrier at ``address`` of ``block`` (caller holds the lock), or EmulationError."""
    barrier = block.state.get("mbarrier", {}).get(address)
    if barrier is None or not barrier.valid:
        why = ("was invalidated (mbarrier.inval) and not initialised again" if barrier is not None
               else "was never initialised (mbarrier.init)")
        raise EmulationError(
            f"{thread.where()}: {op}: no mbarrier at shared address {address:#x} of block "
            f"{tuple(block.index)}: the object {why}"
        )
    return barrier


def _check_count(thread, op, what, value, low):
    value = int(value)
    if not low <= value <= COUNT_LIMIT:
        raise EmulationError(f"{thread.where()}: {op}: {what} must be in {low}..{COUNT_LIMIT}, "
                             f"got {value}")
    return value


def _add_tx(thread, barrier, nbytes, op):
    tx = barrier.tx + nbytes
    if abs(tx) > COUNT_LIMIT:
        raise EmulationError(
            f"{thread.where()}: {op}: {barrier.describe()}: the tx-count would reach {tx}, "
            f"outside -{COUNT_LIMIT}..{COUNT_LIMIT}"
        )
    barrier.tx = tx


def _state(barrier):
    return np.uint64(STATE_TAG << 56 | barrier.address << 32 | barrier.phase & 0xFFFFFFFF)


def _arrive(thread, barrier, count, op, expect=0):
    """expect-tx of ``expect`` bytes, then ``count`` arrive-on operations (lock held)."""
    if expect:
        _add_tx(thread, barrier, expect, op)
    if count > barrier.pending:
        raise EmulationError(
            f"{thread.where()}: {op}: {count} arrival(s) on {barrier.describe()}: more arrivals "
            "than are pending in this phase (the pending count would underflow)"
        )
    state = _state(barrier)
    barrier.pending -= count
    barrier.complete_if_done(thread, op)
    return state


def complete_tx(thread, block, address, nbytes, op):
    """complete-tx of ``nbytes`` on the barrier at ``address`` of ``block`` (copies use this)."""
    launch = thread.launch
    with launch.cond:
        barrier = barrier_at(thread, block, address, op)
        phase = barrier.phase
        _add_tx(thread, barrier, -int(nbytes), op)
        barrier.complete_if_done(thread, op)
        _progress(launch, wake=barrier.phase != phase)


# ---------------------------------------------------------------------------------------------
# Blocking waits
# ---------------------------------------------------------------------------------------------

QUIET_POLL = 0.25  # seconds between a blocked thread's own checks for deadlocks and failures


def quiet_wait(thread, ready, what):
    """Block ``thread`` until ``ready()`` (evaluated under the launch lock), like
    ``runtime.wait_until`` but woken only by notifications and every QUIET_POLL seconds.

    NOTE: runtime.wait_until polls every 20 ms and scans the whole cluster at every wake; with a
    few hundred threads blocked (a 4-CTA cluster barrier) that starves the threads still being
    started, and a launch of 512 threads took 5 s instead of 0.1 s.  The deadlock rule is the
    runtime's: every live thread of the cluster waits and nothing changed for DEADLOCK_SECONDS.
    """
    launch = thread.launch
    with launch.cond:
        thread.waiting = what
        try:
            mark = launch.progress
            since = checked = time.monotonic()
            while not ready():
                if launch.failed is not None:
                    raise EmulationError(f"{thread.where()}: stopped, another thread failed")
                launch.cond.wait(QUIET_POLL)
                now = time.monotonic()
                if ready() or now - checked < QUIET_POLL:
                    continue
                checked = now
                members = thread.block.cluster_threads()
                if launch.progress != mark or any(t.waiting is None and not t.finished
                                                  for t in members):
                    mark, since = launch.progress, now
                elif now - since > runtime.DEADLOCK_SECONDS:
                    raise EmulationError(_deadlock_report(thread, members))
        finally:
            thread.waiting = None


def _deadlock_report(thread, members, polling=None):
    waiting = [t for t in members if not t.finished]
    lines = []
    for t in waiting[:32]:
        if t is thread and polling is not None:
            lines.append(f"  {t.where()}: polls {polling}")
        elif t.waiting is not None:
            lines.append(f"  {t.where()}: waits on {t.waiting}")
        else:
            lines.append(f"  {t.where()}: polls {t.state.get(_SPIN, {}).get('what')}")
    more = f"\n  ... and {len(waiting) - 32} more" if len(waiting) > 32 else ""
    return "deadlock: no thread can make progress\n" + "\n".join(lines) + more


# ---------------------------------------------------------------------------------------------
# Polling: deadlock detection for loops around test_wait / try_wait
# ---------------------------------------------------------------------------------------------

_SPIN = "mbarrier.spin"
_SPIN_GAP = 0.5  # polls further apart than this are not a spin loop


def _spinning(thread, now):
    spin = thread.state.get(_SPIN)
    return spin is not None and now - spin["last"] < _SPIN_GAP


def _poll_failed(thread, barrier, what):
    """A test/try wait found the phase incomplete: yield to the other threads, and report a
    deadlock when this thread has polled without any progress while all others wait."""
    launch = thread.launch
    if launch.failed is not None:
        raise EmulationError(f"{thread.where()}: stopped, another thread failed")
    now = time.monotonic()
    spin = thread.state.get(_SPIN)
    if (spin is None or spin["progress"] != launch.progress or spin["barrier"] is not barrier
            or now - spin["last"] > _SPIN_GAP):
        spin = thread.state[_SPIN] = {"progress": launch.progress, "since": now,
                                      "barrier": barrier, "what": what}
    spin["last"] = now
    if now - spin["since"] > runtime.DEADLOCK_SECONDS:
        members = thread.block.cluster_threads()
        if all(t is thread or t.finished or t.waiting is not None or _spinning(t, now)
               for t in members):
            raise EmulationError(_deadlock_report(thread, members, polling=what))
    # Let the others run: wake on any progress, or after a short while.
    thread.waiting = what
    try:
        launch.cond.wait(TRY_WAIT_SECONDS)
    finally:
        thread.waiting = None


def _parity_done(barrier, parity):
    return barrier.valid and (barrier.phase & 1) != (int(parity) & 1)


def _waiting(barrier, text):
    return Live(lambda: f"{text} of {barrier.describe()}")


# ---------------------------------------------------------------------------------------------
# The intrinsics
# ---------------------------------------------------------------------------------------------


def mbarrier_init(bars, index, count):
    op = "mbarrier.init"
    thread = current()
    address = barrier_address(op, bars, index)
    count = _check_count(thread, op, "the arrival count", count, 1)
    launch = thread.launch
    with launch.cond:
        table = thread.block.once("mbarrier", dict)
        old = table.get(address)
        if old is not None and old.valid:
            raise EmulationError(
                f"{thread.where()}: {op}: {old.describe()} is still valid; invalidate it "
                "(mbarrier.inval) before initialising it again"
            )
        table[address] = Barrier(thread.block, address, count)
        _progress(launch)


def mbarrier_inval(bars, index):
    op = "mbarrier.inval"
    thread = current()
    address = barrier_address(op, bars, index)
    launch = thread.launch
    with launch.cond:
        barrier_at(thread, thread.block, address, op).valid = False
        _progress(launch)


def mbarrier_expect_tx(bars, index, nbytes):
    op = "mbarrier.expect_tx"
    thread = current()
    address = barrier_address(op, bars, index)
    nbytes = _check_count(thread, op, "the transaction byte count", nbytes, 0)
    launch = thread.launch
    with launch.cond:
        _add_tx(thread, barrier_at(thread, thread.block, address, op), nbytes, op)
        _progress(launch, wake=False)


def mbarrier_complete_tx(bars, index, nbytes):
    op = "mbarrier.complete_tx"
    thread = current()
    address = barrier_address(op, bars, index)
    nbytes = _check_count(thread, op, "the transaction byte count", nbytes, 0)
    complete_tx(thread, thread.block, address, nbytes, op)


def _arrive_op(op, bars, index, count=1, expect=0, block=None):
    thread = current()
    address = barrier_address(op, bars, index)
    launch = thread.launch
    with launch.cond:
        barrier = barrier_at(thread, block or thread.block, address, op)
        phase = barrier.phase
        state = _arrive(thread, barrier, count, op, expect)
        _progress(launch, wake=barrier.phase != phase)
    return state


def mbarrier_arrive(bars, index):
    return _arrive_op("mbarrier.arrive", bars, index)


def mbarrier_arrive_count(bars, index, count):
    op = "mbarrier.arrive (count)"
    count = _check_count(current(), op, "the arrival count", count, 1)
    return _arrive_op(op, bars, index, count=count)


def mbarrier_arrive_expect_tx(bars, index, nbytes):
    op = "mbarrier.arrive.expect_tx"
    nbytes = _check_count(current(), op, "the transaction byte count", nbytes, 0)
    return _arrive_op(op, bars, index, expect=nbytes)


def mbarrier_arrive_cluster(bars, index, cta_rank):
    from intrinsics.emulate.cluster import peer_block

    op = "mbarrier.arrive.release.cluster.shared::cluster"
    _arrive_op(op, bars, index, block=peer_block(current(), cta_rank, op))


def mbarrier_test_wait(bars, index, state):
    op = "mbarrier.test_wait"
    thread = current()
    address = barrier_address(op, bars, index)
    state = int(state)
    launch = thread.launch
    with launch.cond:
        barrier = barrier_at(thread, thread.block, address, op)
        if state >> 56 != STATE_TAG or (state >> 32) & 0xFFFFFF != address:
            raise EmulationError(
                f"{thread.where()}: {op}: state {state:#x} was not returned by an arrive on "
                f"{barrier.describe()}"
            )
        taken = state & 0xFFFFFFFF
        current_phase = barrier.phase & 0xFFFFFFFF
        if taken == current_phase:
            _poll_failed(thread, barrier, _waiting(barrier, f"test_wait for phase {taken}"))
            return False
        if taken == (current_phase - 1) & 0xFFFFFFFF:
            return True
        raise EmulationError(
            f"{thread.where()}: {op}: the state is from phase {taken} of {barrier.describe()}; "
            "test_wait takes a state from the current or the immediately preceding phase"
        )


def _test_parity(op, bars, index, parity, suspend):
    thread = current()
    address = barrier_address(op, bars, index)
    launch = thread.launch
    with launch.cond:
        barrier = barrier_at(thread, thread.block, address, op)
        if _parity_done(barrier, parity):
            return True
        if suspend:  # try_wait: suspended until the phase completes or the time limit
            deadline = time.monotonic() + TRY_WAIT_SECONDS
            thread.waiting = _waiting(barrier, f"{op} {int(parity) & 1}")
            try:
                while not _parity_done(barrier, parity) and time.monotonic() < deadline:
                    launch.cond.wait(deadline - time.monotonic())
            finally:
                thread.waiting = None
            if _parity_done(barrier, parity):
                return True
        _poll_failed(thread, barrier, _waiting(barrier, f"{op} {int(parity) & 1}"))
        return False


def mbarrier_test_wait_parity(bars, index, parity):
    return _test_parity("mbarrier.test_wait.parity", bars, index, parity, suspend=False)


def mbarrier_try_wait_parity(bars, index, parity):
    return _test_parity("mbarrier.try_wait.parity", bars, index, parity, suspend=True)


def mbarrier_wait_parity(bars, index, parity):
    op = "mbarrier.try_wait.parity (loop)"
    thread = current()
    address = barrier_address(op, bars, index)
    with thread.launch.cond:
        barrier = barrier_at(thread, thread.block, address, op)
    quiet_wait(thread, lambda: _parity_done(barrier, parity),
               _waiting(barrier, f"wait_parity {int(parity) & 1}"))
    if not barrier.valid:
        raise EmulationError(f"{thread.where()}: {op}: {barrier.describe()} was invalidated "
                             "while the thread waited on it")


def fence_mbarrier_init():
    """fence.mbarrier_init: the emulation's barriers are visible to every thread at once."""
    current()


# ---------------------------------------------------------------------------------------------
# cuda.nanosleep for the simulator
# ---------------------------------------------------------------------------------------------


def _install_nanosleep():
    """numba-cuda's simulator has no ``cuda.nanosleep``; kernels that back off in polling loops
    use it.  NOTE: this belongs in runtime.install (the simulator's kernel API); it is added here
    because mbarrier polling loops are where kernels need it."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    if hasattr(FakeCUDAModule, "nanosleep"):
        return

    def nanosleep(self, ns):
        thread = threading.current_thread()
        if isinstance(thread, runtime.EmuThread):
            time.sleep(min(int(ns), 10**6) * 1e-9)  # at most 1 ms, as the hardware's limit

    FakeCUDAModule.nanosleep = nanosleep


_install_nanosleep()

EMULATIONS = {
    "fence_mbarrier_init": fence_mbarrier_init,
    "mbarrier_arrive": mbarrier_arrive,
    "mbarrier_arrive_cluster": mbarrier_arrive_cluster,
    "mbarrier_arrive_count": mbarrier_arrive_count,
    "mbarrier_arrive_expect_tx": mbarrier_arrive_expect_tx,
    "mbarrier_complete_tx": mbarrier_complete_tx,
    "mbarrier_expect_tx": mbarrier_expect_tx,
    "mbarrier_init": mbarrier_init,
    "mbarrier_inval": mbarrier_inval,
    "mbarrier_test_wait": mbarrier_test_wait,
    "mbarrier_test_wait_parity": mbarrier_test_wait_parity,
    "mbarrier_try_wait_parity": mbarrier_try_wait_parity,
    "mbarrier_wait_parity": mbarrier_wait_parity,
}
