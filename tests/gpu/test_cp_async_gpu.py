"""cp.async on the GPU: every form copies its bytes, the zero-fill forms copy only the first
``src_bytes`` and zero the rest; commit/wait groups order the copies before the reads."""

import functools

import numpy as np
import pytest
from numba import cuda

import intrinsics as nt
import intrinsics.cp_async as ca
from tests.helpers import lanes

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]

THREADS = 64
WORDS = 256  # THREADS * 4; a literal, as cuda.shared.array needs


@functools.cache
def _kernel(cache, size, zfill):
    fn = ca.cp_async_op(size, cache, zfill)
    words = size // 4

    if zfill:
        @cuda.jit
        def kernel(src, nbytes, out):
            smem = cuda.shared.array(WORDS, np.uint32)
            t = cuda.threadIdx.x
            for i in range(t, THREADS * 4, THREADS):
                smem[i] = 0xDEADBEEF
            cuda.syncthreads()
            # Two groups: the second half of the copies in a later group, waited for separately.
            fn(smem, t * words, src, t * words, nbytes[t])
            ca.cp_async_commit_group()
            ca.cp_async_wait_group(0)
            cuda.syncthreads()
            for i in range(t, THREADS * 4, THREADS):
                out[i] = smem[i]
    else:
        @cuda.jit
        def kernel(src, nbytes, out):
            smem = cuda.shared.array(WORDS, np.uint32)
            t = cuda.threadIdx.x
            for i in range(t, THREADS * 4, THREADS):
                smem[i] = 0xDEADBEEF
            cuda.syncthreads()
            if t % 2 == 0:
                fn(smem, t * words, src, t * words)
            ca.cp_async_commit_group()
            if t % 2 == 1:
                fn(smem, t * words, src, t * words)
            ca.cp_async_commit_group()
            ca.cp_async_wait_group(1)
            ca.cp_async_wait_all()
            cuda.syncthreads()
            for i in range(t, THREADS * 4, THREADS):
                out[i] = smem[i]
    return kernel


FORMS = [(c, s, z) for c, s in ca.CP_ASYNC_FORMS for z in (False, True)]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f"{f[0]}{f[1]}{'-zfill' if f[2] else ''}")
def test_cp_async_bytes(form):
    cache, size, zfill = form
    gen = lanes.rng()
    src = gen.integers(0, 2**32, THREADS * 4, dtype=np.uint32)
    nbytes = gen.integers(0, size + 1, THREADS).astype(np.int32)
    if zfill:
        nbytes[:3] = [0, size, size - 1]
    out = cuda.to_device(np.zeros(THREADS * 4, dtype=np.uint32))
    _kernel(cache, size, zfill)[1, THREADS](cuda.to_device(src), cuda.to_device(nbytes), out)
    expected = np.full(THREADS * 4, 0xDEADBEEF, dtype=np.uint32).view(np.uint8)
    src_bytes = src.view(np.uint8)
    for t in range(THREADS):
        lo = t * size
        expected[lo: lo + size] = src_bytes[lo: lo + size]
        if zfill:
            expected[lo + nbytes[t]: lo + size] = 0
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint8), expected)


@cuda.jit
def _mbarrier_pipeline(src, out):
    """Each thread's cp.async copies signal an mbarrier (noinc: 64 expected arrivals), everyone
    waits on the phase, then reads a neighbour's chunk -- the handshake a cp.async producer uses
    to feed a wgmma consumer without TMA."""
    smem = cuda.shared.array(WORDS, np.uint32, alignment=16)
    bars = cuda.shared.array(1, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    if t == 0:
        nt.mbarrier_init(bars, 0, THREADS)
    cuda.syncthreads()
    ca.cp_async_16(smem, t * 4, src, t * 4)
    ca.cp_async_mbarrier_arrive_noinc(bars, 0)
    nt.mbarrier_wait_parity(bars, 0, 0)
    for i in range(4):
        out[t * 4 + i] = smem[((t + 1) % THREADS) * 4 + i]


def test_cp_async_mbarrier_arrive_noinc():
    src = lanes.rng().integers(0, 2**32, WORDS, dtype=np.uint32)
    out = cuda.to_device(np.zeros(WORDS, dtype=np.uint32))
    _mbarrier_pipeline[1, THREADS](cuda.to_device(src), out)
    np.testing.assert_array_equal(out.copy_to_host(), np.roll(src.reshape(THREADS, 4), -1, 0).ravel())
