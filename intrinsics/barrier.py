"""Named CTA barriers (PTX ISA 9.7.13.1, "bar, barrier"): ``barrier.sync`` and
``barrier.arrive`` on one of the 16 hardware barriers with a thread count, so that a subset of
the block's warps synchronise -- the warpgroup ping-pong of FlashAttention-3 and CUTLASS's
"ordered" consumers (warpgroup 1 waits for warpgroup 2's signal before its softmax, and the other
way round)::

    named_barrier_sync(1, 256)      # barrier.sync.aligned 1, 256;  (waits for 256 threads)
    named_barrier_arrive(2, 256)    # barrier.arrive.aligned 2, 256; (counts, does not wait)

Rules (the PTX ISA's): the thread count is a multiple of 32 (the barrier counts whole warps: a
warp's arrival adds 32), every thread of an arriving warp executes the instruction (``.aligned``),
and all users of one barrier id agree on the count.  Barrier 0 is the one ``cuda.syncthreads()``
uses (``barrier.sync 0`` for the whole block): these intrinsics take ids 1..15.  The barrier
completes when ``count`` threads have arrived (arrive or sync); the syncing threads then go on.

Architectures: every one numba-cuda targets (PTX ISA: sm_30 and newer for counts; the
``.aligned`` ``barrier`` spelling since PTX 6.0).
"""

from numba import types

from intrinsics._core import SM75, asm, check_integer, intrinsic, literal_value, require_arch

__all__ = ["NAMED_BARRIER_IDS", "named_barrier_arrive", "named_barrier_sync"]

#: ids usable by numbatc kernels (0 belongs to cuda.syncthreads)
NAMED_BARRIER_IDS = range(1, 16)

_FORMS = {
    "named_barrier_sync": "barrier.sync.aligned",
    "named_barrier_arrive": "barrier.arrive.aligned",
}


def _build(pyname):
    ptx = _FORMS[pyname]

    def typer(typingctx, barrier_id, nthreads):
        bid = literal_value(pyname, barrier_id, "the barrier id (a literal 1..15)",
                            valid=NAMED_BARRIER_IDS)
        if bid is None:
            # numba retries with the literal when the argument has one; a run-time value has
            # none, and this names the rule instead of numba's "No match"
            from numba.cuda.core.errors import RequireLiteralValue

            raise RequireLiteralValue(f"{pyname}: the barrier id must be a compile-time "
                                      f"constant 1..15 (it is encoded in the instruction), "
                                      f"got a run-time {barrier_id}")
        check_integer(pyname, nthreads, "the thread count (a multiple of 32)")
        count = literal_value(pyname, nthreads, "the thread count") if isinstance(
            nthreads, types.IntegerLiteral) else None
        if count is not None and (count <= 0 or count % 32 or count > 1024):
            from numba.cuda.core.errors import NumbaTypeError

            raise NumbaTypeError(f"{pyname}: the thread count must be a multiple of 32 in "
                                 f"32..1024, got {count}")
        sig = types.void(barrier_id, nthreads)

        def codegen(context, builder, sig, args):
            require_arch(ptx, SM75)
            n = context.cast(builder, args[1], sig.args[1], types.uint32)
            asm(builder, f"{ptx} {bid}, $0;", ["r"], [], [n], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = pyname
    typer.__doc__ = (
        f"Emits ``{ptx} id, $0;`` (PTX ISA 9.7.13.1) on named barrier ``id`` (a literal 1..15; 0 "
        f"is cuda.syncthreads') with ``nthreads`` (a multiple of 32) expected arrivals"
        + (": waits until they have all arrived." if pyname.endswith("sync") else
           ": counts this warp's arrival and goes on.")
        + " Every thread of the warp executes it."
    )
    return intrinsic(typer)


named_barrier_sync = _build("named_barrier_sync")
named_barrier_arrive = _build("named_barrier_arrive")
