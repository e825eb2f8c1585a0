"""Emulation of intrinsics.fastmath: 2**x in float32 with subnormal results flushed to zero
(ex2.approx.ftz; the hardware's approximation is within 2 ulp of this), a fused multiply-add
with one rounding (the float32 product is exact in float64), and tanh rounded to float32 (the
hardware's tanh.approx is within 2**-10.987 relative of it)."""

import numpy as np

_TINY = np.float32(2.0**-126)


def ex2_approx(x):
    x = np.float32(x)
    if abs(x) < _TINY:  # ftz: a subnormal input is 0
        x = np.float32(0)
    with np.errstate(over="ignore", under="ignore"):
        y = np.float32(np.exp2(np.float64(x)))
    return np.float32(0) if abs(y) < _TINY else y


def fma_f32(a, b, c):
    return np.float32(np.float64(np.float32(a)) * np.float64(np.float32(b)) + np.float64(np.float32(c)))


def tanh_approx(x):
    return np.float32(np.tanh(np.float64(np.float32(x))))


EMULATIONS = {"ex2_approx": ex2_approx, "fma_f32": fma_f32, "tanh_approx": tanh_approx}
