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
32- or 64-bit integer or a float32 (``r``, ``l`` or ``f`` register), or a UniTuple of one of them.
Any architecture.  Under the simulator it returns ``value``.
"""

from numba import types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import asm, intrinsic, pack, unpack

__all__ = ["opaque"]

_CONSTRAINT = {types.float32: "f", types.int32: "r", types.uint32: "r", types.int64: "l",
               types.uint64: "l"}


@intrinsic
def opaque(typingctx, value):
    """``value``, through an empty volatile inline asm (module docstring): the optimiser neither
    hoists what is computed from it out of a loop nor counts a loop's trips through it."""
    dtype = value.dtype if isinstance(value, types.UniTuple) else value
    if dtype not in _CONSTRAINT:
        raise NumbaTypeError("opaque takes a float32 or a 32- or 64-bit integer, or a UniTuple of "
                             f"one of them, got {value}")
    sig = value(value)
    count = value.count if isinstance(value, types.UniTuple) else 1
    constraints = ["=" + _CONSTRAINT[dtype]] * count + [str(i) for i in range(count)]

    def codegen(context, builder, sig, args):
        values = unpack(builder, sig.args[0], args[0])
        outs = asm(builder, "", constraints, [v.type for v in values], values)
        return pack(context, builder, sig.return_type, outs)

    return sig, codegen
