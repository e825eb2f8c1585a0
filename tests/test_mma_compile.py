"""mma.sync: every table row compiles, holds its instruction and assembles on each architecture
that has it, and is refused with a clear error elsewhere."""

import numpy as np
import pytest
from numba import types
from numba.np import numpy_support

import intrinsics
from intrinsics.mma import mma_specs
from tests.compilecheck import ARCH_NAMES, check_on_arch

SPECS = mma_specs()


def _kernel_for(spec):
    mma = intrinsics.mma_sync(spec.shape, spec.a, spec.b, spec.acc)
    a_n, b_n, c_n = spec.a_regs, spec.b_regs, spec.c_regs
    c_t = {"f32": np.float32, "f16": np.uint32, "s32": np.int32, "f64": np.float64}[spec.acc]

    zero = c_t(0)
    # Registers come from memory so that nothing folds.
    if spec.a == "f64":
        def kernel(out, a):
            d = mma(a[0], a[1], (a[2], a[3]))
            out[0] = d[0]
            out[1] = d[1]
        return kernel, (types.float64[:], types.float64[:])

    if a_n == 4 and b_n == 2 and c_n == 4:
        def kernel(out, a):
            d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (zero, zero, zero, zero))
            for i in range(4):
                out[i] = d[i]
    elif a_n == 4 and b_n == 2 and c_n == 2:
        def kernel(out, a):
            d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (zero, zero))
            for i in range(2):
                out[i] = d[i]
    elif a_n == 2 and b_n == 1 and c_n == 4:
        def kernel(out, a):
            d = mma((a[0], a[1]), a[4], (zero, zero, zero, zero))
            for i in range(4):
                out[i] = d[i]
    elif a_n == 2 and b_n == 1 and c_n == 2:
        def kernel(out, a):
            d = mma((a[0], a[1]), a[4], (zero, zero))
            for i in range(2):
                out[i] = d[i]
    else:
        raise AssertionError(spec)
    out_t = numpy_support.from_dtype(np.dtype(c_t))[:]
    return kernel, (out_t, types.uint32[:])


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.shape}-{s.a}-{s.b}-{s.acc}")
def test_mma_assembles(spec, arch):
    kernel, sig = _kernel_for(spec)
    check_on_arch(kernel, sig, arch, spec.arch, [spec.ptx])


def test_satfinite_integer_form():
    spec = intrinsics.mma_sync("m16n8k32", "s8", "u8", "s32", satfinite=True).spec
    assert spec.ptx == "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.u8.s32"


@pytest.mark.parametrize(
    "args, message",
    [
        (("m16n8k16", "tf32"), "no m16n8k16 with A=tf32"),
        (("m16n8k32", "e4m3", "s8"), "no m16n8k32 with A=e4m3, B=s8"),
        (("m16n8k16", "bf16", "bf16", "f16"), "accumulator=f16"),
    ],
)
def test_bad_combination_names_valid_ones(args, message):
    with pytest.raises(ValueError, match=message) as info:
        intrinsics.mma_sync(*args)
    assert "m16n8k16/bf16/bf16/f32" in str(info.value)


def test_wrong_fragment_type_is_a_typing_error():
    from numba.core.errors import TypingError

    mma = intrinsics.mma_sync("m16n8k16", "bf16")

    def kernel(out, a):
        d = mma((a[0], a[1]), (a[4], a[5]), (out[0], out[0], out[0], out[0]))
        out[0] = d[0]

    with pytest.raises(TypingError, match="the A fragment must be UniTuple\\(uint32 x 4\\)"):
        from intrinsics.toolchain import compile_ptx

        compile_ptx(kernel, (types.float32[:], types.uint32[:]), "sm_90a")
