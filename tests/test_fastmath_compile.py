"""ex2_approx / fma_f32 / tanh_approx without a GPU: each compiles to its one PTX instruction for
every architecture the project claims and assembles (tanh_approx in place of libdevice's
tanhf); ptxas makes ex2_approx one MUFU.EX2 where
math.exp2 needs denormal handling around it; in the CPU emulation
(tests/emulation/test_fastmath_emulated.py) 2**x flushes subnormal results and the FMA rounds once."""

import math

import pytest
from numba import config, cuda, types

import intrinsics as nt
from intrinsics.toolchain import ARCHS, assemble, compile_ptx


def _kernel(out, x, s, b):
    i = cuda.threadIdx.x
    out[i] = nt.ex2_approx(nt.fma_f32(x[i], s, b))


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_one_instruction_each(arch):
    ptx = compile_ptx(_kernel, (types.float32[:], types.float32[:], types.float32, types.float32),
                      arch)
    assert ptx.count("ex2.approx.ftz.f32") == 1 and ptx.count("fma.rn.f32") == 1, ptx
    assert len(assemble(ptx, arch)) > 0


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_tanh_is_one_instruction(arch):
    def kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.tanh_approx(x[i])

    def plain(out, x):
        i = cuda.threadIdx.x
        out[i] = math.tanh(x[i])

    sig = (types.float32[:], types.float32[:])
    ptx = compile_ptx(kernel, sig, arch)
    assert ptx.count("tanh.approx.f32") == 1 and "ex2" not in ptx
    assert len(assemble(ptx, arch)) > 0
    assert "ex2.approx" in compile_ptx(plain, sig, arch)  # libdevice's tanhf: ex2, rcp, ...


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_fewer_instructions_than_math_exp2():
    """The SASS of ex2_approx(fma_f32(...)) against math.exp2(x * s + b): the point of both."""
    import shutil
    import subprocess
    import tempfile

    disasm = shutil.which("nvdisasm")
    if disasm is None:
        pytest.skip("no nvdisasm")

    def plain(out, x, s, b):
        i = cuda.threadIdx.x
        out[i] = math.exp2(x[i] * s + b)

    counts = []
    for fn in (_kernel, plain):
        ptx = compile_ptx(fn, (types.float32[:], types.float32[:], types.float32, types.float32),
                          "sm_90a")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(assemble(ptx, "sm_90a"))
            f.flush()
            sass = subprocess.run([disasm, f.name], capture_output=True, text=True).stdout
        counts.append(sum(1 for line in sass.splitlines() if "/*" in line and ";" in line))
        assert "MUFU.EX2" in sass
    assert counts[0] < counts[1], counts
