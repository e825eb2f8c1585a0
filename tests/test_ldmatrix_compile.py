"""ldmatrix / stmatrix: bad forms and argument types fail clearly (assembly: test_catalog_compile.py)."""

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

import intrinsics.ldmatrix as lm
from intrinsics.toolchain import compile_ptx

SIG = (types.uint32[:],)


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
