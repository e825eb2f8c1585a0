"""A tile staged through shared memory on the GPU (st_shared_b32 at swizzled addresses, syncwarp,
ld_shared_v4_b32 and st_global_v4_b32 of 16-byte chunks; tests/helpers/staging.py), word for
word against the host's expectation, two warps, fresh random words, the output poisoned."""

import numpy as np
import pytest
from numba import cuda

from tests.helpers.staging import expected_staged, staged_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]


def test_staged_rows_land():
    x = np.random.default_rng().integers(0, 2**32, 128, dtype=np.uint32)
    out = cuda.to_device(np.full(128, 0xDEADBEEF, np.uint32))
    cuda.jit(staged_kernel)[1, 64](out, cuda.to_device(x))
    assert np.array_equal(out.copy_to_host(), expected_staged(x))
