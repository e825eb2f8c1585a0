"""cp.async: every form and the group operations compile, hold their instruction and assemble on
each architecture that has them (sm_80+)."""

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

import intrinsics.cp_async as ca
from intrinsics._core import SM80
from intrinsics.toolchain import compile_ptx
from tests.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.uint32[:], types.int32[:])


def _kernel(cache, size, zfill):
    fn = ca.cp_async_op(size, cache, zfill)
    words = size // 4

    if zfill:
        def kernel(out, src):
            smem = cuda.shared.array(256, np.uint32)
            lane = cuda.threadIdx.x
            fn(smem, lane * words, src, lane * words, src[0])
            ca.cp_async_commit_group()
            ca.cp_async_wait_group(0)
            out[lane] = smem[lane]
    else:
        def kernel(out, src):
            smem = cuda.shared.array(256, np.uint32)
            lane = cuda.threadIdx.x
            fn(smem, lane * words, src, lane * words)
            ca.cp_async_commit_group()
            ca.cp_async_wait_all()
            out[lane] = smem[lane]
    return kernel


FORMS = [(c, s, z) for c, s in ca.CP_ASYNC_FORMS for z in (False, True)]


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f[0]}{f[1]}{'-zfill' if f[2] else ''}")
def test_form_assembles(form, arch):
    cache, size, zfill = form
    tail = f", {size}, %r" if zfill else f", {size};"
    expected = [f"cp.async.{cache}.shared.global", tail, "cp.async.commit_group;"]
    expected.append("cp.async.wait_group 0;" if zfill else "cp.async.wait_all;")
    check_on_arch(_kernel(cache, size, zfill), SIG, arch, SM80, expected)


def test_cg_needs_16_bytes():
    with pytest.raises(ValueError, match="no .cg form of 8 bytes; valid: ca/4, ca/8, ca/16, cg/16"):
        ca.cp_async_op(8, "cg")


def test_wait_group_needs_literal_in_range():
    def kernel(out, src):
        ca.cp_async_wait_group(9)

    with pytest.raises(TypingError, match=r"N \(a literal\) must be one of \[0, 1, 2, 3, 4, 5, 6, 7\], got 9"):
        compile_ptx(kernel, SIG, "sm_90a")
