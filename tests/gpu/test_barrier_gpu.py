"""Named barriers (intrinsics.barrier) on the GPU and in the emulation: two warpgroups take turns
(the FlashAttention-3 ping-pong handshake: each syncs on its own barrier, then arrives on the
other's), so the order of their writes is fixed; and a barrier over a subset of warps does not
wait for the others."""

import numpy as np
import pytest
from numba import cuda

from intrinsics.barrier import named_barrier_arrive, named_barrier_sync

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]


@cuda.jit
def pingpong(out, rounds):
    log = cuda.shared.array(64, np.int32)
    pos = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    wg = t // 128
    if t == 0:
        pos[0] = 0
    cuda.syncthreads()
    for r in range(rounds):
        if wg == 0:
            if r > 0:
                named_barrier_sync(2, 256)  # warpgroup 1's turn is over
            if t == 0:
                log[pos[0]] = r * 10
                pos[0] += 1
            named_barrier_arrive(1, 256)  # warpgroup 1's turn
        else:
            named_barrier_sync(1, 256)
            if t == 128:
                log[pos[0]] = r * 10 + 1
                pos[0] += 1
            named_barrier_arrive(2, 256)
    if wg == 0:
        named_barrier_sync(2, 256)  # the last arrival is consumed: no barrier left half-full
    cuda.syncthreads()
    if t == 0:
        for i in range(2 * rounds):
            out[i] = log[i]
        out[2 * rounds] = pos[0]


def test_two_warpgroups_take_turns():
    rounds = 12
    out = cuda.to_device(np.full(2 * rounds + 1, -1, np.int32))
    pingpong[1, 256](out, rounds)
    expected = [r * 10 + w for r in range(rounds) for w in (0, 1)] + [2 * rounds]
    np.testing.assert_array_equal(out.copy_to_host(), expected)


@cuda.jit
def subset(out):
    """Warps 0-1 meet on barrier 3 (64 threads) while warps 2-3 are parked on barrier 4 until
    warp 0 releases them: a barrier over a subset must not wait for the others."""
    flag = cuda.shared.array(1, np.int32)
    t = cuda.threadIdx.x
    if t == 0:
        flag[0] = 0
    cuda.syncthreads()
    if t < 64:
        if t == 32:
            flag[0] = 7
        named_barrier_sync(3, 64)  # only warps 0 and 1
        out[t] = flag[0]
        if t < 32:
            named_barrier_arrive(4, 96)  # warp 0 releases warps 2-3
    else:
        named_barrier_sync(4, 96)
        out[t] = flag[0] + 1


def test_a_barrier_over_some_warps():
    out = cuda.to_device(np.full(128, -1, np.int32))
    subset[1, 128](out)
    np.testing.assert_array_equal(out.copy_to_host(), [7] * 64 + [8] * 64)
