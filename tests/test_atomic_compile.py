"""atomic_add_global without a GPU: on typed pointers and arrays of int32 / uint32 / float32 it
compiles to atom.global.add (relaxed) for every architecture the project claims and assembles;
other element types are refused at typing time; in the CPU emulation
(tests/emulation/test_stores_emulated.py) concurrent adds from every
thread of several blocks all count and each thread sees a distinct old value."""

import numpy as np
import pytest
from numba import config, cuda, types

import intrinsics as nt
from intrinsics.toolchain import ARCHS, assemble, compile_ptx


def _kernel(counters, sums, x):
    t = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    old = nt.atomic_add_global(counters, 0, np.int32(1))
    nt.atomic_add_global(sums, old % 4, x[t])


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_assembles_on_pointers_and_arrays(arch):
    sig = (types.CPointer(types.int32), types.float32[:], types.float32[:])
    ptx = compile_ptx(_kernel, sig, arch)
    assert "atom.global.add.u32" in ptx or "atom.global.add.s32" in ptx, ptx
    assert "atom.global.add.f32" in ptx
    assert len(assemble(ptx, arch)) > 0
    sig = (types.CPointer(types.uint32), types.CPointer(types.float32), types.float32[:])
    assemble(compile_ptx(_kernel, sig, arch), arch)


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_other_element_types_are_refused():
    with pytest.raises(Exception, match="int32, uint32 or float32"):
        compile_ptx(_kernel, (types.CPointer(types.int64), types.float32[:], types.float32[:]),
                    "sm_80")
