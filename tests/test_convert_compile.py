"""Register packing helpers compile for every architecture that has their cvt forms."""

import pytest
from numba import types

from intrinsics import convert as cv
from intrinsics._core import SM80, SM89
from tests.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.uint32[:], types.float32[:])


def k_pairs(out, f):
    out[0] = cv.pack_bf16x2(f[0], f[1])
    out[1] = cv.pack_f16x2(f[0], f[1])
    out[2] = cv.cvt_tf32(f[2])
    a, b = cv.unpack_bf16x2(out[3])
    c, d = cv.unpack_f16x2(out[4])
    f[0] = a + b + c + d


def k_fp8(out, f):
    out[0] = cv.pack_e4m3x4(f[0], f[1], f[2], f[3])
    out[1] = cv.pack_e5m2x4(f[0], f[1], f[2], f[3])


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_pairs(arch):
    check_on_arch(k_pairs, SIG, arch, SM80,
                  ["cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "cvt.rna.tf32.f32", "cvt.f32.f16"])


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_fp8(arch):
    check_on_arch(k_fp8, SIG, arch, SM89,
                  ["cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"])
