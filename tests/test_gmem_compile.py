"""st_global_b32 without a GPU: it compiles to one st.global.b32 for every architecture the
project claims and assembles; a value that is not a 32-bit integer is refused at typing time; in
the CPU emulation the four bytes land at the element's address (two uint16 elements), and a
misaligned address is an error as on the GPU (tests/emulation/test_stores_emulated.py)."""

import pytest
from numba import config, cuda, types

import intrinsics as nt
from intrinsics.toolchain import ARCHS, assemble, compile_ptx


def _kernel(out, x):
    t = cuda.threadIdx.x
    nt.st_global_b32(out, 2 * t, nt.pack_bf16x2(x[2 * t], x[2 * t + 1]))


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_assembles_on_pointers_and_arrays(arch):
    for out in (types.CPointer(types.uint16), types.uint16[:]):
        ptx = compile_ptx(_kernel, (out, types.float32[:]), arch)
        assert ptx.count("st.global.b32") == 1, ptx
        assert "st.global.u16" not in ptx and "st.global.b16" not in ptx
        assert len(assemble(ptx, arch)) > 0


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_other_values_are_refused():
    def bad(out, x):
        nt.st_global_b32(out, 0, x[0])

    with pytest.raises(Exception, match="32-bit integer"):
        compile_ptx(bad, (types.CPointer(types.uint16), types.float32[:]), "sm_80")
