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
"""

import threading
import time

import numpy as np

from intrinsics.emulate import memory, runtime
from intrinsics.emulate.runtime import EmulationError, current

__all__ = ["Barrier", "barrier_address", "barrier_at", "complete_tx", "describe_barrier"]

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


class _Live:
    """A description evaluated when printed (deadlock reports show the state at that time)."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text()


def _lock():
    return current().launch.cond


def _progress(launch):
    launch.progress += 1
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


def describe_barrier(block, address):
    """What the barrier at ``address`` of ``block`` looks like now (for messages)."""
    barrier = block.state.get("mbarrier", {}).get(address)
    return barrier.describe() if barrier is not None else f"no mbarrier at {address:#x}"


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
        _add_tx(thread, barrier, -int(nbytes), op)
        barrier.complete_if_done(thread, op)
        _progress(launch)


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
    now = time.monotonic()
    spin = thread.state.get(_SPIN)
    if (spin is None or spin["progress"] != launch.progress or spin["barrier"] is not barrier
            or now - spin["last"] > _SPIN_GAP):
        spin = thread.state[_SPIN] = {"progress": launch.progress, "since": now,
                                      "barrier": barrier, "what": what}
    spin["last"] = now
    if now - spin["since"] > runtime.DEADLOCK_SECONDS:
        others = [t for t in thread.block.cluster_threads() if t is not thread and not t.finished]
        if all(t.waiting is not None or _spinning(t, now) for t in others):
            lines = [f"  {thread.where()}: polls {what}"]
            for t in others[:31]:
                waits = t.waiting if t.waiting is not None else f"polls {t.state[_SPIN]['what']}"
                lines.append(f"  {t.where()}: waits on {waits}")
            more = f"\n  ... and {len(others) - 31} more" if len(others) > 31 else ""
            raise EmulationError("deadlock: no thread can make progress\n" + "\n".join(lines)
                                 + more)
    # Let the others run: wake on any progress, or after a short while.
    thread.waiting = what
    try:
        launch.cond.wait(TRY_WAIT_SECONDS)
    finally:
        thread.waiting = None


def _parity_done(barrier, parity):
    return barrier.valid and (barrier.phase & 1) != (int(parity) & 1)


def _waiting(barrier, text):
    return _Live(lambda: f"{text} of {barrier.describe()}")


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
        table = thread.block.state.setdefault("mbarrier", {})
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
        _progress(launch)


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
        state = _arrive(thread, barrier, count, op, expect)
        _progress(launch)
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
    runtime.wait_until(lambda: _parity_done(barrier, parity),
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
