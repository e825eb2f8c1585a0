"""mma.sync: the table rejects combinations it lacks and the intrinsic checks fragment types (the
assembly of every form is in test_catalog_compile.py)."""

import pytest
from numba import types
from numba.core.errors import TypingError

import intrinsics
from intrinsics.toolchain import compile_ptx


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
    mma = intrinsics.mma_sync("m16n8k16", "bf16")

    def kernel(out, a):
        d = mma((a[0], a[1]), (a[4], a[5]), (out[0], out[0], out[0], out[0]))
        out[0] = d[0]

    with pytest.raises(TypingError, match="the A fragment must be UniTuple\\(uint32 x 4\\)"):
        compile_ptx(kernel, (types.float32[:], types.uint32[:]), "sm_90a")
