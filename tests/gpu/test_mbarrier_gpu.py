"""mbarrier on the GPU, against a model of the object written from PTX ISA 9.7.13.15.1-6:

- a phase completes when the pending arrival count and the transaction count are both zero;
  then the phase number advances, pending returns to the init count and tx-count to zero;
- ``test_wait.parity(P)`` is true when the current phase's parity is not ``P``;
- ``test_wait(state)`` is true when the phase ``state`` was taken in (by an arrive) completed;
- arrive-on decrements pending by its count; expect-tx adds to tx-count; complete-tx subtracts;
  ``arrive.expect_tx`` is expect-tx followed by arrive-on.

One thread replays a random script of operations and records the three flags after each; other
tests check arrival counting by hand, 128 threads cycling through phases with
``mbarrier_wait_parity``, transaction bytes completed by many threads, and one-shot try_wait.
"""

import numpy as np
import pytest
from numba import cuda

from intrinsics.mbarrier import (
    mbarrier_arrive,
    mbarrier_arrive_count,
    mbarrier_arrive_expect_tx,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait_parity,
)

# Every test also runs in the CPU emulation (each carries its own gpu(cc=...) marker).
pytestmark = pytest.mark.emulation

ARRIVE, ARRIVE_COUNT, ARRIVE_EXPECT_TX, EXPECT_TX, COMPLETE_TX = range(5)
NO_STATE = 2  # the third flag before any arrive has produced a state
POISON = -1


class MbarrierModel:
    """One mbarrier object (PTX ISA 9.7.13.15.2, "Contents of the mbarrier object")."""

    def __init__(self, count):
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0

    def _complete_if_done(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n=1):
        assert 0 < n <= self.pending, "the script would underflow the pending count"
        state = self.phase
        self.pending -= n
        self._complete_if_done()
        return state

    def expect_tx(self, nbytes):
        self.tx += nbytes

    def complete_tx(self, nbytes):
        assert nbytes <= self.tx
        self.tx -= nbytes
        self._complete_if_done()

    def arrive_expect_tx(self, nbytes):
        self.expect_tx(nbytes)
        return self.arrive()

    def test_wait_parity(self, parity):
        return (self.phase & 1) != parity

    def test_wait(self, state):
        return self.phase > state


def run_model(count, ops, args):
    """The flags the kernel records after each operation: (parity 0, parity 1, state)."""
    model = MbarrierModel(count)
    state = None
    flags = []
    for op, arg in zip(ops, args):
        if op == ARRIVE:
            state = model.arrive()
        elif op == ARRIVE_COUNT:
            state = model.arrive(arg)
        elif op == ARRIVE_EXPECT_TX:
            state = model.arrive_expect_tx(arg)
        elif op == EXPECT_TX:
            model.expect_tx(arg)
        else:
            model.complete_tx(arg)
        flags.append(
            (
                model.test_wait_parity(0),
                model.test_wait_parity(1),
                NO_STATE if state is None else model.test_wait(state),
            )
        )
    return np.array(flags, dtype=np.int32), model


def random_script(rng, count, length, max_bytes=4096):
    """A script that never underflows the pending count or the tx-count (undefined behaviour)
    and keeps tx-count below 2**20."""
    model = MbarrierModel(count)
    ops, args = [], []
    for _ in range(length):
        choices = [EXPECT_TX]
        if model.pending > 0:
            choices += [ARRIVE, ARRIVE, ARRIVE_COUNT, ARRIVE_EXPECT_TX]
        if model.tx > 0:
            choices += [COMPLETE_TX, COMPLETE_TX, COMPLETE_TX]
        op = choices[rng.integers(len(choices))]
        if op == ARRIVE:
            arg = 1
            model.arrive()
        elif op == ARRIVE_COUNT:
            arg = int(rng.integers(1, model.pending + 1))
            model.arrive(arg)
        elif op == ARRIVE_EXPECT_TX:
            arg = int(rng.integers(0, max_bytes + 1))
            model.arrive_expect_tx(arg)
        elif op == EXPECT_TX:
            arg = int(rng.integers(1, max_bytes + 1))
            model.expect_tx(arg)
        else:
            arg = int(rng.integers(1, model.tx + 1))
            model.complete_tx(arg)
        ops.append(op)
        args.append(arg)
    return np.array(ops, dtype=np.int32), np.array(args, dtype=np.int32), model.phase


# ---------------------------------------------------------------------------------------------
# Kernels (compiled once, on first launch)
# ---------------------------------------------------------------------------------------------


@cuda.jit
def arrive_only_kernel(count, narrive, flags, tail):
    """sm_80 forms only: init, narrive arrivals with the flags after each, inval, re-init."""
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, count)
        for k in range(narrive):
            state = mbarrier_arrive(bars, 0)
            flags[k, 0] = mbarrier_test_wait_parity(bars, 0, 0)
            flags[k, 1] = mbarrier_test_wait_parity(bars, 0, 1)
            flags[k, 2] = mbarrier_test_wait(bars, 0, state)
        # Invalidate and reuse the object with a count of 1: one arrival completes phase 0.
        mbarrier_inval(bars, 0)
        mbarrier_init(bars, 0, 1)
        tail[0] = mbarrier_test_wait_parity(bars, 0, 0)
        mbarrier_arrive(bars, 0)
        tail[1] = mbarrier_test_wait_parity(bars, 0, 0)
        tail[2] = mbarrier_test_wait_parity(bars, 0, 1)
        mbarrier_inval(bars, 0)


@cuda.jit
def script_kernel(count, ops, args, flags):
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, count)
        state = np.uint64(0)
        has_state = False
        for k in range(ops.size):
            op = ops[k]
            arg = args[k]
            if op == ARRIVE:
                state = mbarrier_arrive(bars, 0)
                has_state = True
            elif op == ARRIVE_COUNT:
                state = mbarrier_arrive_count(bars, 0, arg)
                has_state = True
            elif op == ARRIVE_EXPECT_TX:
                state = mbarrier_arrive_expect_tx(bars, 0, arg)
                has_state = True
            elif op == EXPECT_TX:
                mbarrier_expect_tx(bars, 0, arg)
            else:
                mbarrier_complete_tx(bars, 0, arg)
            flags[k, 0] = mbarrier_test_wait_parity(bars, 0, 0)
            flags[k, 1] = mbarrier_test_wait_parity(bars, 0, 1)
            if has_state:
                flags[k, 2] = mbarrier_test_wait(bars, 0, state)
            else:
                flags[k, 2] = NO_STATE
        mbarrier_inval(bars, 0)


THREADS = 128


@cuda.jit
def phases_kernel(vals, late_warp, out):
    """128 threads run vals.shape[0] phases: write a value, arrive, wait for the phase's parity,
    read a value another warp wrote.  One warp arrives late in each phase."""
    bars = cuda.shared.array(1, np.uint64)
    buf = cuda.shared.array((2, THREADS), np.float32)  # double-buffered by phase parity
    t = cuda.threadIdx.x
    if t == 0:
        mbarrier_init(bars, 0, THREADS)
    cuda.syncthreads()
    for p in range(vals.shape[0]):
        if t // 32 == late_warp[p]:
            cuda.nanosleep(20000)
        buf[p & 1, t] = vals[p, t]
        mbarrier_arrive(bars, 0)
        mbarrier_wait_parity(bars, 0, p & 1)
        out[p, t] = buf[p & 1, (t + 32 * (1 + p % 3) + p) % THREADS]
    cuda.syncthreads()
    if t == 0:
        mbarrier_inval(bars, 0)


@cuda.jit
def tx_threads_kernel(chunks, missing, out):
    """Thread 0 arms the barrier with the sum of all chunks; every thread completes its chunk,
    the thread ``missing`` only after thread 0 has looked."""
    bars = cuda.shared.array(1, np.uint64)
    t = cuda.threadIdx.x
    if t == 0:
        mbarrier_init(bars, 0, 1)
        total = 0
        for i in range(chunks.size):
            total += chunks[i]
        mbarrier_arrive_expect_tx(bars, 0, total)
    cuda.syncthreads()
    if t != missing:
        mbarrier_complete_tx(bars, 0, chunks[t])
    cuda.syncthreads()
    if t == 0:
        out[0] = mbarrier_test_wait_parity(bars, 0, 0)
    cuda.syncthreads()
    if t == missing:
        mbarrier_complete_tx(bars, 0, chunks[t])
    mbarrier_wait_parity(bars, 0, 0)
    out[1 + t] = mbarrier_test_wait_parity(bars, 0, 0)
    out[1 + THREADS + t] = mbarrier_test_wait_parity(bars, 0, 1)


@cuda.jit
def try_wait_kernel(out):
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 2)
        out[0] = mbarrier_try_wait_parity(bars, 0, 0)
        out[1] = mbarrier_try_wait_parity(bars, 0, 1)
        mbarrier_arrive(bars, 0)
        out[2] = mbarrier_try_wait_parity(bars, 0, 0)
        mbarrier_arrive(bars, 0)
        out[3] = mbarrier_try_wait_parity(bars, 0, 0)
        out[4] = mbarrier_try_wait_parity(bars, 0, 1)


def run_script(count, ops, args):
    flags = cuda.to_device(np.full((ops.size, 3), POISON, dtype=np.int32))
    script_kernel[1, 32](np.uint32(count), cuda.to_device(ops), cuda.to_device(args), flags)
    return flags.copy_to_host()


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu(cc=(8, 0))
def test_arrival_counting_and_phase_flips():
    """init N: N-1 arrivals leave the phase open, the Nth flips it; three phases in a row."""
    rng = np.random.default_rng()
    n = int(rng.integers(2, 48))
    phases = 3
    narrive = n * phases
    flags = cuda.to_device(np.full((narrive, 3), POISON, dtype=np.int32))
    tail = cuda.to_device(np.full(3, POISON, dtype=np.int32))
    arrive_only_kernel[1, 32](np.uint32(n), narrive, flags, tail)
    flags = flags.copy_to_host()
    for k in range(narrive):
        done = (k + 1) // n  # phases completed after arrival k
        closes = (k + 1) % n == 0
        expected = [done % 2 == 1, done % 2 == 0, closes]
        assert flags[k].tolist() == [int(e) for e in expected], (n, k, flags[k])
    # The model agrees with the hand-written expectation.
    model_flags, _ = run_model(n, [ARRIVE] * narrive, [1] * narrive)
    np.testing.assert_array_equal(flags, model_flags)
    assert tail.copy_to_host().tolist() == [0, 1, 0]


@pytest.mark.gpu(cc=(9, 0))
def test_arrive_count():
    rng = np.random.default_rng()
    n = int(rng.integers(2, 1000))
    ops = np.array([ARRIVE_COUNT, ARRIVE, ARRIVE_COUNT], dtype=np.int32)
    args = np.array([n - 1, 1, n], dtype=np.int32)
    flags = run_script(n, ops, args)
    assert flags.tolist() == [[0, 1, 0], [1, 0, 1], [0, 1, 1]]


@pytest.mark.gpu(cc=(9, 0))
def test_expect_tx_holds_the_phase_until_bytes_complete():
    rng = np.random.default_rng()
    nbytes = int(rng.integers(2, 1 << 16))
    part = int(rng.integers(1, nbytes))
    ops = np.array([EXPECT_TX, ARRIVE, COMPLETE_TX, COMPLETE_TX], dtype=np.int32)
    args = np.array([nbytes, 1, part, nbytes - part], dtype=np.int32)
    flags = run_script(1, ops, args)
    assert flags.tolist() == [[0, 1, NO_STATE], [0, 1, 0], [0, 1, 0], [1, 0, 1]]
    # arrive.expect_tx: the arrival alone does not complete the phase either.
    ops = np.array([ARRIVE_EXPECT_TX, COMPLETE_TX], dtype=np.int32)
    args = np.array([nbytes, nbytes], dtype=np.int32)
    assert run_script(1, ops, args).tolist() == [[0, 1, 0], [1, 0, 1]]


@pytest.mark.gpu(cc=(9, 0))
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_random_scripts_follow_the_model(count):
    rng = np.random.default_rng()
    for _ in range(50):  # a script that completes several phases
        ops, args, phases = random_script(rng, count, 128)
        if phases >= 4:
            break
    assert phases >= 4
    expected, _ = run_model(count, ops, args)
    flags = run_script(count, ops, args)
    bad = np.nonzero((flags != expected).any(axis=1))[0]
    assert bad.size == 0, (
        f"first mismatch at step {bad[0]}: op {ops[bad[0]]} arg {args[bad[0]]}, "
        f"got {flags[bad[0]]}, expected {expected[bad[0]]}"
    )


@pytest.mark.gpu(cc=(9, 0))
def test_wait_parity_across_phases():
    rng = np.random.default_rng()
    phases = 12
    vals = rng.standard_normal((phases, THREADS)).astype(np.float32)
    late_warp = rng.integers(0, THREADS // 32, phases).astype(np.int32)
    out = cuda.to_device(np.full((phases, THREADS), np.nan, dtype=np.float32))
    phases_kernel[1, THREADS](cuda.to_device(vals), cuda.to_device(late_warp), out)
    t = np.arange(THREADS)
    expected = np.stack(
        [vals[p, (t + 32 * (1 + p % 3) + p) % THREADS] for p in range(phases)]
    )
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@pytest.mark.gpu(cc=(9, 0))
def test_complete_tx_from_many_threads():
    rng = np.random.default_rng()
    chunks = rng.integers(1, 4096, THREADS).astype(np.int32)
    missing = int(rng.integers(0, THREADS))
    out = cuda.to_device(np.full(1 + 2 * THREADS, POISON, dtype=np.int32))
    tx_threads_kernel[1, THREADS](cuda.to_device(chunks), missing, out)
    out = out.copy_to_host()
    assert out[0] == 0, "the phase completed with one thread's bytes outstanding"
    assert (out[1 : 1 + THREADS] == 1).all()
    assert (out[1 + THREADS :] == 0).all()


@pytest.mark.gpu(cc=(9, 0))
def test_try_wait_parity_one_try():
    out = cuda.to_device(np.full(5, POISON, dtype=np.int32))
    try_wait_kernel[1, 32](out)
    assert out.copy_to_host().tolist() == [0, 1, 0, 1, 0]
