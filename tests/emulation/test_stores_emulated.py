"""Global-memory writes of the intrinsics in the CPU emulation: atomic_add_global's concurrent adds
from every thread of several blocks all count, each thread seeing a distinct old value;
st_global_b32's four bytes land at the element's address (two uint16 elements); a tile staged
through shared memory (st_shared_b32, ld_shared_v4_b32, st_global_v4_b32) lands where the
addresses say; a misaligned address is an error, as on the GPU.  (Their PTX:
tests/test_atomic_compile.py, tests/test_gmem_compile.py, tests/test_catalog_compile.py; the
staging on the GPU: tests/gpu/test_staging_gpu.py.)"""

import numpy as np
import pytest
from numba import config, cuda

import intrinsics as nt

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


def test_concurrent_adds_in_the_emulation():
    @cuda.jit
    def kernel(counters, olds):
        t = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
        olds[t] = nt.atomic_add_global(counters, 0, np.int32(1))

    counters = cuda.to_device(np.zeros(1, np.int32))
    olds = cuda.to_device(np.full(96, -1, np.int32))
    kernel[3, 32](counters, olds)
    assert counters.copy_to_host()[0] == 96
    assert sorted(olds.copy_to_host()) == list(range(96))


def _pairs(out, x):
    t = cuda.threadIdx.x
    nt.st_global_b32(out, 2 * t, nt.pack_bf16x2(x[2 * t], x[2 * t + 1]))


def test_pairs_land_in_the_emulation():
    import ml_dtypes

    x = np.random.default_rng().standard_normal(64).astype(np.float32)
    out = cuda.to_device(np.full(64, 0xFFFF, np.uint16))
    cuda.jit(_pairs)[1, 32](out, cuda.to_device(x))
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float32))

    @cuda.jit
    def odd(out):
        nt.st_global_b32(out, 1, np.uint32(7))

    with pytest.raises(Exception, match="not 4-byte aligned"):
        odd[1, 1](cuda.to_device(np.zeros(4, np.uint16)))


def test_staged_rows_land_in_the_emulation():
    from tests.helpers.staging import expected_staged, staged_kernel

    x = np.random.default_rng().integers(0, 2**32, 128, dtype=np.uint32)
    out = cuda.to_device(np.zeros(128, np.uint32))
    cuda.jit(staged_kernel)[1, 64](out, cuda.to_device(x))
    assert np.array_equal(out.copy_to_host(), expected_staged(x))


@pytest.mark.parametrize("which", ["st_shared_b32", "ld_shared_v4_b32", "st_global_v4_b32"])
def test_staging_misaligned_is_an_error(which):
    @cuda.jit
    def kernel(out):
        words = cuda.shared.array(16, np.uint32)
        b = cuda.shared.array(0, np.uint8)
        if which == "st_shared_b32":
            nt.st_shared_b32(b, 2, np.uint32(1))
        elif which == "ld_shared_v4_b32":
            v = nt.ld_shared_v4_b32(words, 1)
            out[0] = v[0]
        else:
            nt.st_global_v4_b32(out, 2, (np.uint32(1), np.uint32(2), np.uint32(3), np.uint32(4)))

    with pytest.raises(Exception, match="aligned"):
        kernel[1, 1, 0, 64](cuda.to_device(np.zeros(8, np.uint32)))
