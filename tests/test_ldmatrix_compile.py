"""ldmatrix / stmatrix / movmatrix: each form compiles, holds its instruction and assembles on every
architecture that has it; refused with a clear error elsewhere; bad arguments fail typing."""

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

import intrinsics.ldmatrix as lm
from intrinsics._core import SM75
from intrinsics.toolchain import compile_ptx
from tests.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.uint32[:],)


def _ld_kernel(num, trans):
    fn = lm.ldmatrix_op(num, trans)

    def kernel(out):
        tile = cuda.shared.array(256, np.uint16)
        lane = cuda.threadIdx.x
        r = fn(tile, (lane % 16) * 8)
        if num == 1:
            out[lane] = r
        else:
            for i in range(num):
                out[lane * num + i] = r[i]

    return kernel


def _st_kernel(num, trans):
    fn = lm.stmatrix_op(num, trans)

    def kernel(out):
        tile = cuda.shared.array(256, np.uint16)
        lane = cuda.threadIdx.x
        if num == 1:
            fn(tile, lane * 8, out[lane])
        elif num == 2:
            fn(tile, lane * 8, (out[lane], out[lane + 1]))
        else:
            fn(tile, lane * 8, (out[lane], out[lane + 1], out[lane + 2], out[lane + 3]))
        cuda.syncthreads()
        out[lane] = tile[lane]

    return kernel


FORMS = sorted(lm.LDMATRIX_FORMS)


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f[0]}-x{f[1]}{'-trans' if f[2] else ''}")
def test_form_assembles(form, arch):
    op, num, trans = form
    kernel = (_ld_kernel if op == "ldmatrix" else _st_kernel)(num, trans)
    expected = f"{op}.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    check_on_arch(kernel, SIG, arch, lm.LDMATRIX_FORMS[form], [expected])


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_movmatrix_assembles(arch):
    def kernel(out):
        out[0] = lm.movmatrix_trans(out[1])

    check_on_arch(kernel, SIG, arch, SM75, ["movmatrix.sync.aligned.m8n8.trans.b16"])


def test_bad_count_names_valid():
    with pytest.raises(ValueError, match=r"\.x1, \.x2 or \.x4, got \.x3"):
        lm.ldmatrix_op(3)


def test_fragment_type_checked():
    def kernel(out):
        tile = cuda.shared.array(256, np.uint16)
        lm.stmatrix_x2(tile, 0, (out[0], out[1], out[2]))

    with pytest.raises(TypingError, match=r"the fragment must be UniTuple\(uint32 x 2\)"):
        compile_ptx(kernel, SIG, "sm_90a")


def test_address_must_come_from_an_array():
    def kernel(out):
        lm.ldmatrix_x1(out[0], 0)

    with pytest.raises(TypingError, match="takes a shared-memory array and an element index"):
        compile_ptx(kernel, SIG, "sm_90a")
