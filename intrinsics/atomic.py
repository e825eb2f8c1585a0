"""Global-memory atomics on typed device pointers (PTX ISA 9.7.13.5, ``atom``): numba's
``cuda.atomic.add`` takes arrays only, and numbatc's kernels take raw pointers (``types.CPointer``
arguments: no array objects to build at launch)::

    old = atomic_add_global(counters, tile, np.int32(1))   # atom.global.add.u32 (relaxed, gpu)

``atomic_add_global(p, i, v)`` adds ``v`` to ``p[i]`` (an int32, uint32 or float32 pointer or
1-d array) atomically and returns the value before the add.  The order is relaxed (``atom``
without a .sem qualifier): pair it with ``cuda.threadfence()`` before (publish) and after (acquire), as
split-K's arrival counter does.  Architectures: all.
"""

from llvmlite import ir
from numba import types

from intrinsics._core import I32, asm, check_global, check_index, global_address, intrinsic

__all__ = ["atomic_add_global"]

_TYPES = (types.int32, types.uint32, types.float32)


@intrinsic
def atomic_add_global(typingctx, array, index, value):
    """``old = p[index]; p[index] += value`` in one atomic step on global memory; returns old."""
    from numba.cuda.core.errors import NumbaTypeError

    check_global("atomic_add_global", array)
    check_index("atomic_add_global", array, index)
    elem = array.dtype
    if elem not in _TYPES:
        raise NumbaTypeError(f"atomic_add_global works on int32, uint32 or float32 memory, got {elem}")
    if not isinstance(value, (types.Integer, types.Float)):
        raise NumbaTypeError(f"atomic_add_global adds a number, got {value}")
    sig = elem(array, index, value)

    ptx_type, reg, llty = ("f32", "f", ir.FloatType()) if elem == types.float32 else ("u32", "r", I32)

    def codegen(context, builder, sig, args):
        arr, idx, val = args
        addr = global_address(context, builder, sig.args[0], arr, sig.args[1], idx)
        v = context.cast(builder, val, sig.args[2], elem)
        return asm(builder, f"atom.global.add.{ptx_type} $0, [$1], $2;", [f"={reg}", "l", reg],
                   [llty], [addr, v], memory=True)[0]

    return sig, codegen
