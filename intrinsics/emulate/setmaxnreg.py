"""Emulation of intrinsics.setmaxnreg: registers are not modelled, so ``setmaxnreg`` has no
effect on results; what the emulation checks is the instruction's contract (PTX ISA 9.7.19.5):

- ``.sync.aligned`` at warpgroup scope: all 128 threads of the warpgroup execute it, and every
  warp with the same action and register count (a warpgroup rendezvous; a mismatch, or lanes that
  exit without it, is an EmulationError naming the warps);
- the count is in 24..256 and a multiple of 8;
- ``.inc`` never lowers and ``.dec`` never raises the warp's maximum set by an earlier
  setmaxnreg of this warp.

``cuda.jit(launch_bounds=...)``, which setmaxnreg kernels need on the GPU, is accepted and
ignored under the emulation (runtime.install).
"""

from intrinsics.emulate.runtime import EmulationError, collective, current
from intrinsics.setmaxnreg import REGISTER_COUNTS

_STATE = "setmaxnreg"


def _setmaxnreg(action):
    op = f"setmaxnreg.{action}.sync.aligned.u32"

    def compute(values):
        counts = {}
        for lane, n in values.items():
            counts.setdefault(n, []).append(lane // 32)
        if len(counts) > 1:
            detail = "; ".join(f"warp(s) {sorted(set(w))} of the warpgroup with {n}"
                               for n, w in sorted(counts.items()))
            raise EmulationError(
                f"{current().where()}: {op}: the warps of one warpgroup must execute it with "
                f"the same register count, got {detail}"
            )
        return [None] * 128

    def setmaxnreg(n):
        thread = current()
        n = int(n)
        if n not in REGISTER_COUNTS:
            raise EmulationError(f"{thread.where()}: {op}: the register count must be a multiple "
                                 f"of 8 in 24..256, got {n}")
        before = thread.state.get(_STATE)
        if before is not None and ((action == "inc" and n < before)
                                   or (action == "dec" and n > before)):
            raise EmulationError(
                f"{thread.where()}: {op} {n}: the warp's register maximum is {before}; .{action} "
                f"must not {'lower' if action == 'inc' else 'raise'} it"
            )
        collective("warpgroup", op, n, compute)
        thread.state[_STATE] = n

    setmaxnreg.__name__ = f"setmaxnreg_{action}"
    return setmaxnreg


EMULATIONS = {
    "setmaxnreg_dec": _setmaxnreg("dec"),
    "setmaxnreg_inc": _setmaxnreg("inc"),
}
