"""Lane-exact CPU emulation of the intrinsics, used when numba-cuda's simulator is on
(``NUMBA_ENABLE_CUDASIM=1``).

``runtime`` holds the launch loop, the shared address space, warp and warpgroup rendezvous and
deadlock detection; one module per instruction family (``emulate/<family>.py``) holds that
family's semantics and declares what it replaces:

- ``EMULATIONS``: public name -> Python function taking the same arguments as the intrinsic;
- ``FACTORIES``: factory name (``mma_sync``, ``ldmatrix_op`` ...) -> Python factory.

``install()`` swaps them into the family modules before ``intrinsics/__init__`` re-exports the
names, so ``import intrinsics as nt; nt.mma_sync(...)`` and ``from intrinsics.mma import
mma_sync`` both give the emulation, and kernels run unchanged.
"""

import importlib

from numba import config

ACTIVE = bool(config.ENABLE_CUDASIM)

# family module -> its emulation module
FAMILIES = {
    "intrinsics.smem": "intrinsics.emulate.smem",
    "intrinsics.barrier": "intrinsics.emulate.barrier",
    "intrinsics.atomic": "intrinsics.emulate.atomic",
    "intrinsics.gmem": "intrinsics.emulate.gmem",
    "intrinsics.fastmath": "intrinsics.emulate.fastmath",
    "intrinsics.hints": "intrinsics.emulate.hints",
    "intrinsics.convert": "intrinsics.emulate.convert",
    "intrinsics.mma": "intrinsics.emulate.mma",
    "intrinsics.ldmatrix": "intrinsics.emulate.ldmatrix",
    "intrinsics.cp_async": "intrinsics.emulate.cp_async",
    "intrinsics.mbarrier": "intrinsics.emulate.mbarrier",
    "intrinsics.cluster": "intrinsics.emulate.cluster",
    "intrinsics.setmaxnreg": "intrinsics.emulate.setmaxnreg",
    "intrinsics.shfl": "intrinsics.emulate.shfl",
    "intrinsics.tma": "intrinsics.emulate.tma",
    "intrinsics.wgmma": "intrinsics.emulate.wgmma",
    "intrinsics.tcgen05": "intrinsics.emulate.tcgen05",
}


def install():
    """Replace every emulated intrinsic in its family module (once; under the simulator only)."""
    if not ACTIVE or getattr(install, "done", False):
        return
    from intrinsics.emulate import runtime

    runtime.install()
    for family, emulation in FAMILIES.items():
        target = importlib.import_module(family)
        source = importlib.import_module(emulation)
        for name, fn in {**getattr(source, "EMULATIONS", {}), **getattr(source, "FACTORIES", {})}.items():
            if not hasattr(target, name):
                raise AttributeError(f"{emulation} emulates {family}.{name}, which does not exist")
            original = getattr(target, name)
            fn.__doc__ = fn.__doc__ or getattr(original, "__doc__", None)
            setattr(target, name, fn)
    install.done = True
