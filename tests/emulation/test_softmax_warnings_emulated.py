"""numbatc.softmax in the CPU emulation raises no NumPy RuntimeWarning for ordinary inputs (it
printed "divide by zero encountered in scalar divide", pointing into the generated kernel, for
a 5x70 float16 input: the rows past M of a partial block sum to 0), and still gives NaN for a
row of -inf (as torch)."""

import warnings

import numpy as np
import pytest
from numba import config, cuda

import numbatc

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


@pytest.mark.parametrize("shape, dtype", [((5, 70), np.float16), ((1, 1), np.float16),
                                          ((7, 33), np.float32), ((3, 129), np.float16)])
def test_ordinary_input_warns_nothing(shape, dtype):
    x = np.random.default_rng().standard_normal(shape).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y = numbatc.softmax(cuda.to_device(x)).copy_to_host()
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert np.abs(y.astype(np.float64) - ref).max() < (2e-3 if dtype == np.float16 else 1e-6)


def test_row_of_minus_inf_is_nan():
    x = np.random.default_rng().standard_normal((3, 70)).astype(np.float16)
    x[1] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 0 * inf, the NaN asked for
        y = numbatc.softmax(cuda.to_device(x)).copy_to_host()
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
