"""Lane-exact CPU emulation of the intrinsics, used when numba-cuda's simulator is on
(``NUMBA_ENABLE_CUDASIM=1``).  ``runtime`` holds the launch loop, shared address space,
warp/warpgroup rendezvous and deadlock detection; one module per instruction family holds its
semantics."""

from numba import config

ACTIVE = bool(config.ENABLE_CUDASIM)
