"""Named barriers without a GPU: the PTX they emit, and the refusals at typing time (barrier 0
is cuda.syncthreads', ids stop at 15, counts are whole warps)."""

import pytest
from numba import types
from numba.core.errors import TypingError

from intrinsics.barrier import named_barrier_arrive, named_barrier_sync
from intrinsics.toolchain import assemble, compile_ptx


def test_sync_and_arrive_emit_the_named_forms():
    def kernel(out):
        named_barrier_sync(3, 128)
        named_barrier_arrive(4, 64)
        out[0] = 1

    ptx = compile_ptx(kernel, (types.int32[:],), "sm_90a")
    assert "barrier.sync.aligned 3, %r" in ptx and "barrier.arrive.aligned 4, %r" in ptx
    assemble(ptx, "sm_90a")


@pytest.mark.parametrize("bid, count, message", [
    (0, 128, "barrier id"), (16, 128, "barrier id"), (1, 48, "multiple of 32"),
    (1, 2048, "multiple of 32")])
def test_bad_ids_and_counts_are_named(bid, count, message):
    def kernel(out):
        named_barrier_sync(bid, count)
        out[0] = 1

    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, (types.int32[:],), "sm_90a")


def test_run_time_barrier_id_is_named():
    """The id is encoded in the instruction: a run-time value gets the rule, not numba's
    generic "No match"."""
    def kernel(x, i):
        named_barrier_sync(i, 64)

    with pytest.raises(Exception, match="compile-time constant 1..15"):
        compile_ptx(kernel, (types.int32[:], types.int32), "sm_80")
