"""Emulation of intrinsics.shfl: ``shfl.sync`` is a warp collective (all 32 lanes meet, each
deposits its value and lane argument, each takes the value of its source lane, PTX ISA 9.7.9.6).
With the whole warp as members and c = 0x1f (0 for up): bfly reads lane l ^ b, down l + b, up
l - b, idx b & 31; a source lane outside 0..31 gives the lane its own value.  Types are kept:
float32 in, float32 out."""

from intrinsics.emulate.runtime import collective


def _source(mode, lane, b):
    if mode == "bfly":
        j = lane ^ (b & 31)
    elif mode == "down":
        j = lane + b
    elif mode == "up":
        j = lane - b
    else:
        j = b & 31
    return j if 0 <= j <= 31 else lane


def _shfl(mode):
    op = f"shfl.sync.{mode}.b32"

    def compute(values):
        return [values[_source(mode, lane, int(values[lane][1]))][0] for lane in range(32)]

    def shfl(value, lane):
        return collective("warp", op, (value, lane), compute)

    shfl.__name__ = f"shfl_{mode}"
    return shfl


_EMULATED = {mode: _shfl(mode) for mode in ("bfly", "down", "up", "idx")}


def shfl_op(mode):
    from intrinsics.shfl import SHFL_MODES

    if mode not in SHFL_MODES:
        raise ValueError(f"shfl mode must be one of {sorted(SHFL_MODES)}, got {mode!r}")
    return _EMULATED[mode]


EMULATIONS = {f"shfl_{mode}": fn for mode, fn in _EMULATED.items()}
FACTORIES = {"shfl_op": shfl_op}
