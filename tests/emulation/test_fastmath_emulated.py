"""The fast-math intrinsics in the CPU emulation: ex2_approx flushes subnormal results to zero
(2**-141 -> 0) and takes -inf to 0, fma_f32 rounds once, tanh_approx matches tanh to float32.
(Their PTX and SASS: tests/test_fastmath_compile.py.)"""

import numpy as np
import pytest
from numba import config, cuda

import intrinsics as nt

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


def test_emulation():
    @cuda.jit
    def kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.ex2_approx(nt.fma_f32(x[i], np.float32(2), np.float32(-1)))

    x = np.array([0, 1.5, -70, -np.inf, 3], np.float32)
    out = np.zeros_like(x)
    kernel[1, 5](out, x)
    want = np.exp2(2.0 * x.astype(np.float64) - 1).astype(np.float32)
    want[np.abs(want) < 2.0**-126] = 0  # 2**-141 flushes
    assert np.array_equal(out, want), (out, want)

    @cuda.jit
    def tanh_kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.tanh_approx(x[i])

    tanh_kernel[1, 5](out, x)
    assert np.array_equal(out, np.tanh(x.astype(np.float64)).astype(np.float32))
