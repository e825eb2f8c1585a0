"""intrinsics.hints without a GPU: it emits no instruction and assembles everywhere; what it is
for -- a loop-invariant wgmma descriptor's k-step sums stay inside the loop, and a loop counted
through it is not unrolled -- shown on the PTX NVVM writes; other types are refused at typing
time; the emulation hands the value back."""

import re

import numpy as np
import pytest
from numba import config, cuda, types

import intrinsics as nt
from intrinsics.toolchain import ARCHS, assemble, compile_ptx

pytestmark = pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")


def _copy(out, x):
    t = cuda.threadIdx.x
    out[t] = nt.opaque(x[t])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_no_instruction_on_every_arch(arch):
    for ty in (types.float32, types.int32, types.uint32, types.int64, types.uint64):
        ptx = compile_ptx(_copy, (ty[:], ty[:]), arch)
        body = re.search(r"// begin inline asm(.*?)// end inline asm", ptx, re.S).group(1)
        assert body.strip() == "", body
        assert len(assemble(ptx, arch)) > 0


def _hoisting_kernel(pin):
    @cuda.jit(device=True, inline="always")
    def keep(d):
        return nt.opaque(d) if pin else d

    def kernel(out, base, n):
        d = base[0] + np.uint64(1 << 40)  # loop-invariant, 64 bits
        acc = np.uint64(0)
        for i in range(n):
            e = keep(d)
            # four "k steps" of it per trip, xor'd into a value that changes per trip
            acc = (acc ^ (e + np.uint64(2)) ^ (e + np.uint64(4)) ^ (e + np.uint64(6))
                   ^ (e + np.uint64(1024))) + np.uint64(i)
        out[0] = acc
    return kernel


def _loop_body(ptx):
    """The PTX between the loop's label and its backward branch."""
    label = re.findall(r"^(\$L__BB\d+_\d+):", ptx, re.M)
    for name in label:
        back = re.search(r"bra(?:\.uni)?\s+" + re.escape(name) + ";", ptx)
        if back and back.start() > ptx.index(name + ":"):
            return ptx[ptx.index(name + ":"):back.start()]
    raise AssertionError("no loop in the PTX")


def test_invariant_sums_stay_in_the_loop():
    sig = (types.uint64[:], types.uint64[:], types.int64)
    plain = _loop_body(compile_ptx(_hoisting_kernel(False), sig, "sm_90a"))
    pinned = _loop_body(compile_ptx(_hoisting_kernel(True), sig, "sm_90a"))
    adds = lambda body: len(re.findall(r"\badd\.s64\b", body))
    # hoisted: the four sums are computed before the loop; pinned: each trip computes them
    assert adds(pinned) >= adds(plain) + 4, (plain, pinned)


def test_a_loop_counted_through_it_is_not_unrolled():
    def stores(pin):
        @cuda.jit(device=True, inline="always")
        def step(i):
            return nt.opaque(i + 1) if pin else i + 1

        def kernel(out, first, last):
            i = first
            while i < last:
                out[i] = np.float32(i) * out[i]
                i = step(i)
        ptx = compile_ptx(kernel, (types.float32[:], types.int64, types.int64), "sm_90a")
        return len(re.findall(r"\bst\.f32\b", ptx))

    assert stores(True) == 1
    assert stores(False) > 1  # LLVM's runtime unrolling (4 bodies and a remainder)


def test_other_types_are_refused():
    def bad(out, x):
        out[0] = nt.opaque(x[0])

    with pytest.raises(Exception, match="opaque takes"):
        compile_ptx(bad, (types.float64[:], types.float64[:]), "sm_80")
