"""Hints to the optimiser.  ``opaque(value)``: one value the optimiser cannot see through -- an
empty volatile inline asm that takes the value's register(s) in and hands them back, so no
instruction is emitted.

What it is for: keeping register pressure where the code puts it.  LLVM hoists any computation
on a loop-invariant value out of the loop, and unrolls a loop whose trip count it can compute.
In a warp-specialised kernel both can cost more registers than a ``setmaxnreg`` share holds:

- the k-step descriptors of a wgmma chain (``desc + 2``, ``desc + 4`` ...), 64 bits each, are
  invariant when the tile is (a block's own K or V); hoisted, 8 steps x 3 operands are 48
  registers live across the loop, which ptxas spills.  ``desc = opaque(desc)`` at the top of
  the loop body makes every sum depend on a value defined inside the loop, so they are
  recomputed next to their wgmma (one add each, from 2 live registers);
- a producer thread's ``for i in range(first, last)`` of TMA copies is unrolled four times,
  with each copy's coordinates precomputed, past a 24-register share.  ``i = opaque(i + 1)``
  hides the trip count, and the loop stays one body.

A volatile asm is neither moved nor merged, and its result is a new value; nothing else about
the code changes (no memory clobber: loads and stores still move across it).  ``value``: a
32- or 64-bit integer or a float32 (``r``, ``l`` or ``f`` register), a UniTuple of one of them
or a UniTuple of such UniTuples.
Any architecture.  Under the simulator it returns ``value``.
"""

from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import REGISTER_CONSTRAINTS, intrinsic, passthrough

__all__ = ["opaque"]


@intrinsic
def opaque(typingctx, value):
    """``value``, through an empty volatile inline asm (module docstring): the optimiser neither
    hoists what is computed from it out of a loop nor counts a loop's trips through it."""
    typed = passthrough(value, REGISTER_CONSTRAINTS, memory=False)
    if typed is None:
        raise NumbaTypeError("opaque takes a float32 or a 32- or 64-bit integer, or a UniTuple of "
                             f"one of them, got {value}")
    return typed
