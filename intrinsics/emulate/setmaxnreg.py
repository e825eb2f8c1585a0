"""Emulation of intrinsics.setmaxnreg: registers are not modelled, so ``setmaxnreg`` has no
effect on results; what the emulation checks is the instruction's contract (PTX ISA 9.7.19.5):

- ``.sync.aligned`` at warpgroup scope: all 128 threads of the warpgroup execute it, and every
  warp with the same action and register count (a warpgroup rendezvous; a mismatch, or lanes that
  exit without it, is an EmulationError naming the warps);
- the count is in 24..256 and a multiple of 8;
- ``.inc`` never lowers and ``.dec`` never raises the warp's maximum set by an earlier
  setmaxnreg of this warp;
- the registers move through the block's pool: a block of whole warpgroups (384 threads or
  more) starts with ``register_pool(threads) / threads`` a thread (168 for 384), a ``.dec``
  gives its thread's difference to the pool and an ``.inc`` waits until the pool holds its
  thread's -- so a split that asks for more than the ``.dec`` warps give back (32 / 240 for
  128 + 256 threads: 1024 registers short) ends in the emulation's deadlock report, as it
  would hang on the GPU.  Smaller or ragged blocks are not pooled (the check is skipped: at 256
  threads a warp's starting count is ptxas's choice, see register_pool).

``cuda.jit(launch_bounds=...)``, which setmaxnreg kernels need on the GPU, is accepted and
ignored under the emulation (runtime.install).
"""

from intrinsics.emulate.runtime import EmulationError, collective, current, wait_until
from intrinsics.setmaxnreg import REGISTER_COUNTS, register_pool

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
        pool = _pool(thread)
        before = thread.state.get(_STATE, pool["start"] if pool else None)
        if before is not None and ((action == "inc" and n < before)
                                   or (action == "dec" and n > before)):
            raise EmulationError(
                f"{thread.where()}: {op} {n}: the warp's register maximum is {before}; .{action} "
                f"must not {'lower' if action == 'inc' else 'raise'} it"
            )
        collective("warpgroup", op, n, compute)
        if pool is not None:
            _move(thread, pool, before - n, f"{op} {n}")
        thread.state[_STATE] = n

    setmaxnreg.__name__ = f"setmaxnreg_{action}"
    return setmaxnreg


def _pool(thread):
    """The block's register pool ({"start": registers a thread at launch, "free": in the pool}),
    or None where the block is not whole warpgroups of 384 threads or more."""
    bx, by, bz = thread.launch.block_dim
    threads = bx * by * bz
    if threads < 384 or threads % 128:
        return None
    return thread.block.once("setmaxnreg pool", lambda: {"start": register_pool(threads) // threads,
                                                          "free": 0})


def _move(thread, pool, delta, what):
    """Give ``delta`` registers to the pool (a .dec) or take ``-delta`` from it (an .inc, which
    waits until the pool has them: the GPU's .inc blocks the same way)."""
    launch = thread.launch
    if delta >= 0:
        with launch.cond:
            pool["free"] += delta
            launch.progress += 1
            launch.cond.notify_all()
        return

    def take():  # evaluated under the launch's lock: check and take in one step
        if pool["free"] >= -delta:
            pool["free"] += delta
            return True
        return False

    wait_until(take, f"{what}: {-delta} registers a thread from the block's pool, which "
               "holds only what the .dec warps gave back (intrinsics.setmaxnreg.register_pool)")


EMULATIONS = {
    "setmaxnreg_dec": _setmaxnreg("dec"),
    "setmaxnreg_inc": _setmaxnreg("inc"),
}
