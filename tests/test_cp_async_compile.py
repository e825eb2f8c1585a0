"""cp.async: bad forms and non-literal waits fail clearly (assembly: test_catalog_compile.py)."""

import pytest
from numba import types
from numba.core.errors import TypingError

import intrinsics.cp_async as ca
from intrinsics.toolchain import compile_ptx

SIG = (types.uint32[:], types.int32[:])


def test_cg_needs_16_bytes():
    with pytest.raises(ValueError, match="no .cg form of 8 bytes; valid: ca/4, ca/8, ca/16, cg/16"):
        ca.cp_async_op(8, "cg")


def test_wait_group_needs_literal_in_range():
    def kernel(out, src):
        ca.cp_async_wait_group(9)

    with pytest.raises(TypingError, match=r"N \(a literal\) must be one of \[0, 1, 2, 3, 4, 5, 6, 7\], got 9"):
        compile_ptx(kernel, SIG, "sm_90a")
