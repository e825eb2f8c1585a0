"""Warpgroup register reallocation: ``setmaxnreg`` (PTX ISA 9.7.19.5, "Miscellaneous
Instructions: setmaxnreg").

A warp-specialised kernel gives its producer warpgroup few registers and its math warpgroups
many: every warp of a warpgroup executes the same ``setmaxnreg_dec(n)`` or ``setmaxnreg_inc(n)``
(``n`` a literal in 24..256, a multiple of 8), and the registers move through a per-CTA pool
(``.inc`` blocks until the pool has them).  CUTLASS's split for 384 threads::

    @cuda.jit(launch_bounds=(384, 1))       # the register cap setmaxnreg needs: 65536/384 -> 168
    def kernel(...):
        if cuda.threadIdx.x // 128 == 0:
            setmaxnreg_dec(40)              # producer: 128 x (168 - 40) registers to the pool
        else:
            setmaxnreg_inc(232)             # consumers: 256 x (232 - 168) from it

NOTE: the instruction is only a hint, and ptxas drops it (and says so) in two cases:

- the kernel has no register cap ("C7508 ... 'setmaxnreg' ignored; unable to determine register
  count at entry"): give ``cuda.jit`` ``launch_bounds=(threads, 1)``, which numba-cuda turns into
  ``.maxntid threads, 1, 1`` and ``.minnctapersm 1``;
- the PTX is compiled as relocatable code for a later link ("C7504 ... ignored to maintain
  compatibility across compilation units").  nvJitLink always compiles PTX that way, and
  numba-cuda's launch path links every kernel through it, so a kernel launched with
  ``kernel[grid, block]`` runs without the reallocation.  Whole-program compilation of the PTX
  (ptxas without ``-c``, the driver's ``cuModuleLoadData``) keeps it; the kernel then reports
  the capped register count (168 above) as its register usage.
"""

from numba import types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import Arch, asm, intrinsic, require_arch

__all__ = ["REGISTER_COUNTS", "SETMAXNREG_ARCH", "register_pool", "setmaxnreg_dec", "setmaxnreg_inc"]

# The architecture-specific (and family-specific) targets that have setmaxnreg; sm_101a was
# renamed sm_110a in PTX ISA 9.0.
SETMAXNREG_ARCH = Arch(
    "sm_90a, sm_100a/sm_101a/sm_103a, sm_110a or sm_120a/sm_121a (architecture-specific targets)",
    specific=[(9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)],
)

# Valid per-thread register counts.
REGISTER_COUNTS = range(24, 257, 8)


def register_pool(threads, registers_per_sm=65536):
    """Registers a block of ``threads`` launched with ``launch_bounds=(threads, 1)`` holds, all
    that its warps' ``setmaxnreg`` can move: the per-thread share rounded down to a multiple of
    8, times ``threads`` -- 64512 for 384 threads (168 each), not 65536.  A split whose
    ``.inc`` asks for more than the ``.dec`` warps gave back waits forever (so 24 / 240 is the
    largest consumer share of a 128 + 256 split, FlashAttention-3's).  Blocks of whole
    warpgroups, at least 256 threads; at 256 the share (256) is one more than a thread can
    address, so the bound holds but what a warp starts with there is ptxas's choice."""
    if threads < 256 or threads % 128:
        raise ValueError(f"register_pool: whole warpgroups, at least 256 threads, got {threads}")
    return registers_per_sm // threads // 8 * 8 * threads

# action -> asm template (the count is formatted in: it is an immediate).
_ACTIONS = {
    "inc": "setmaxnreg.inc.sync.aligned.u32 {n};",
    "dec": "setmaxnreg.dec.sync.aligned.u32 {n};",
}

_MEANING = {
    "inc": "Raise this warp's per-thread register maximum to ``n`` (blocks until the CTA's pool "
           "has the registers; their contents are undefined).",
    "dec": "Lower this warp's per-thread register maximum to ``n``, returning the rest to the "
           "CTA's pool.",
}


def _build(action):
    name = f"setmaxnreg_{action}"
    template = _ACTIONS[action]

    def typer(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            # numba tries a plain type first and then the literal one; this message is what
            # remains when the argument is not a compile-time constant at all.
            raise NumbaTypeError(
                f"{name}: the register count must be a literal (a compile-time constant) in "
                f"24..256 and a multiple of 8, not a runtime {n}"
            )
        count = n.literal_value
        if count not in REGISTER_COUNTS:
            raise NumbaTypeError(
                f"{name}: the register count must be a multiple of 8 in 24..256, got {count}"
            )
        ptx = template.format(n=count)
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            require_arch(f"setmaxnreg.{action}", SETMAXNREG_ARCH)
            asm(builder, ptx, [])
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = (
        f"{_MEANING[action]}  Every warp of the warpgroup must execute the same call "
        "(``.sync.aligned``), and the kernel needs a register cap (``launch_bounds``).\n\n"
        f"Emits, for ``{name}(232)`` (PTX ISA 9.7.19.5; needs {SETMAXNREG_ARCH.text})::\n\n"
        f"    {template.format(n=232)}"
    )
    return intrinsic(typer)


setmaxnreg_inc = _build("inc")
setmaxnreg_dec = _build("dec")
