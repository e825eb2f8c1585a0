"""shfl.sync without a GPU: each mode compiles for every architecture the project claims with the
exact PTX (float32 and 32-bit integer values), assembles, and bad operands are refused at typing
time with the valid types named; the CPU emulation gives each lane its source lane's value."""

import numpy as np
import pytest
from numba import cuda, types

import intrinsics.shfl as sh
from intrinsics.toolchain import ARCHS, assemble, compile_ptx


def _kernel(mode):
    op = sh.shfl_op(mode)

    def kernel(out, x, b):
        lane = cuda.threadIdx.x
        out[lane] = op(x[lane], b)
        out[32 + lane] = np.float32(op(np.uint32(lane), b))

    return kernel


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode", sorted(sh.SHFL_MODES))
def test_every_mode_assembles(mode, arch):
    ptx = compile_ptx(_kernel(mode), (types.float32[:], types.float32[:], types.int32), arch)
    c = "0x0" if mode == "up" else "0x1f"
    lines = [line.strip() for line in ptx.splitlines() if "shfl.sync" in line]
    assert len(lines) == 2 and all(f"shfl.sync.{mode}.b32" in ln and f"{c}, 0xffffffff;" in ln
                                   for ln in lines), lines
    assert len(assemble(ptx, arch)) > 0


def test_bad_value_type_is_named():
    def kernel(out, x):
        out[0] = sh.shfl_bfly(x[0], 1)

    with pytest.raises(Exception, match=r"float32, int32 or uint32"):
        compile_ptx(kernel, (types.float64[:], types.float64[:]), "sm_80")


def test_unknown_mode_is_named():
    with pytest.raises(ValueError, match="bfly"):
        sh.shfl_op("xor")


@pytest.mark.parametrize("mode, b, source", [
    ("bfly", 5, lambda l: l ^ 5), ("down", 3, lambda l: l + 3 if l + 3 < 32 else l),
    ("up", 2, lambda l: l - 2 if l >= 2 else l), ("idx", 7, lambda l: 7)])
def test_emulation_reads_the_source_lane(mode, b, source):
    from intrinsics.emulate.shfl import _source

    assert [_source(mode, lane, b) for lane in range(32)] == [source(lane) for lane in range(32)]
