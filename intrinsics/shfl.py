"""Warp shuffles: ``shfl.sync`` (PTX ISA 9.7.9.6, "Data Movement and Conversion Instructions:
shfl.sync").

Each lane of a fully active warp reads a 32-bit register of another lane of the same warp::

    v = shfl_bfly(x, 16)   # lane l gets x of lane l ^ 16 (butterfly: reductions)
    v = shfl_down(x, 1)    # lane l gets x of lane l + 1 (its own x where l + 1 > 31)
    v = shfl_up(x, 1)      # lane l gets x of lane l - 1 (its own x where l - 1 < 0)
    v = shfl_idx(x, 0)     # lane l gets x of lane 0 (a broadcast)

The value is a float32 or a 32-bit integer (the result has its type); the lane argument an
integer.  The member mask is the whole warp (``0xffffffff``): all 32 lanes must execute the
shuffle together, as in the reductions of a row softmax::

    for offset in (16, 8, 4, 2, 1):
        m = max(m, shfl_bfly(m, offset))   # every lane ends with the warp's maximum

NOTE: numba-cuda's own ``cuda.shfl_xor_sync`` emits the same instruction on the GPU, but numba's
simulator has no shuffles, so kernels that must also run in the CPU emulation use these.
"""

from numba import types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import SM80, I32, asm, intrinsic, require_arch

__all__ = ["SHFL_MODES", "shfl_bfly", "shfl_down", "shfl_idx", "shfl_up", "shfl_op"]

# mode -> (the ``c`` operand: clamp lane 31 for bfly/down/idx, 0 for up; which lane l reads).
SHFL_MODES = {
    "bfly": (0x1F, "l ^ b"),
    "down": (0x1F, "l + b (its own value past lane 31)"),
    "up": (0x00, "l - b (its own value before lane 0)"),
    "idx": (0x1F, "b & 31"),
}

_TEMPLATE = "shfl.sync.{mode}.b32 $0, $1, $2, {c:#x}, 0xffffffff;"


def _build(mode):
    if mode not in SHFL_MODES:
        raise ValueError(f"shfl mode must be one of {sorted(SHFL_MODES)}, got {mode!r}")
    c, reads = SHFL_MODES[mode]
    ptx = _TEMPLATE.format(mode=mode, c=c)
    name = f"shfl_{mode}"

    def typer(typingctx, value, lane):
        if value not in (types.float32, types.int32, types.uint32):
            raise NumbaTypeError(f"{name}: the value must be float32, int32 or uint32 (one 32-bit "
                                 f"register), got {value}")
        if not isinstance(lane, types.Integer):
            raise NumbaTypeError(f"{name}: the lane argument must be an integer, got {lane}")
        sig = value(value, lane)

        def codegen(context, builder, sig, args):
            require_arch(f"shfl.sync.{mode}", SM80)
            v, b = args
            b = context.cast(builder, b, sig.args[1], types.int32)
            constraint = "f" if sig.args[0] == types.float32 else "r"
            (out,) = asm(builder, ptx, [f"={constraint}", constraint, "r"], [v.type], [v, b])
            return out

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = (
        f"Lane l of the (fully active) warp gets ``value`` of lane {reads}; all 32 lanes must call "
        "it.  ``value``: float32, int32 or uint32 (the result has its type); ``lane``: an "
        f"integer.\n\nEmits (PTX ISA 9.7.9.6; the project claims {SM80.text})::\n\n    {ptx}"
    )
    return intrinsic(typer)


_BUILT = {}


def shfl_op(mode):
    """The shuffle intrinsic of one mode ('bfly', 'down', 'up' or 'idx'), built once."""
    if mode not in _BUILT:
        _BUILT[mode] = _build(mode)
    return _BUILT[mode]


shfl_bfly = shfl_op("bfly")
shfl_down = shfl_op("down")
shfl_up = shfl_op("up")
shfl_idx = shfl_op("idx")
