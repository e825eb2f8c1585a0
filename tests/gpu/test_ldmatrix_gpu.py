"""ldmatrix / stmatrix / movmatrix on the GPU, every lane, exactly, against the PTX ISA's fragment
table (intrinsics.layout.fragments.ldmatrix_fragment).  Each lane supplies a random row address,
so the test also proves the addressing rule (lanes 8m..8m+7 name the rows of matrix m)."""

import functools

import numpy as np
import pytest
from numba import cuda

import intrinsics.ldmatrix as lm
from intrinsics.layout import ldmatrix_fragment
from tests.helpers import lanes

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]

ROWS = 64  # the shared tile: 64 rows of 8 uint16 (16 bytes each)
TILE = 512  # ROWS * 8 elements; a literal, as cuda.shared.array needs


@functools.cache
def _load_kernel(num, trans):
    fn = lm.ldmatrix_op(num, trans)
    store = lanes.STORERS[num]

    @cuda.jit
    def kernel(tile, rows, out):
        smem = cuda.shared.array(TILE, np.uint16)
        lane = cuda.threadIdx.x
        for i in range(lane, ROWS * 8, 32):
            smem[i] = tile[i]
        cuda.syncthreads()
        store(out, lane, fn(smem, rows[lane] * 8))

    return kernel


@functools.cache
def _store_kernel(num, trans):
    fn = lm.stmatrix_op(num, trans)
    load = lanes.LOADERS[num]

    @cuda.jit
    def kernel(regs, rows, out):
        smem = cuda.shared.array(TILE, np.uint16)
        lane = cuda.threadIdx.x
        for i in range(lane, ROWS * 8, 32):
            smem[i] = 0xDEAD
        cuda.syncthreads()
        fn(smem, rows[lane] * 8, load(regs, lane))
        cuda.syncthreads()
        for i in range(lane, ROWS * 8, 32):
            out[i] = smem[i]

    return kernel


def _rows(gen):
    return gen.permutation(ROWS)[:32].astype(np.int32)


def _expected_registers(tile, rows, num, trans):
    fmap = ldmatrix_fragment(trans)
    tile = tile.reshape(ROWS, 8)
    regs = np.zeros((32, num), dtype=np.uint32)
    for m in range(num):
        matrix = tile[rows[8 * m: 8 * m + 8]]  # (8, 8): row r from lane 8m+r
        lo = matrix[fmap[:, 0, 0], fmap[:, 0, 1]].astype(np.uint32)
        hi = matrix[fmap[:, 1, 0], fmap[:, 1, 1]].astype(np.uint32)
        regs[:, m] = lo | (hi << 16)
    return regs


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_every_lane(num, trans):
    gen = lanes.rng()
    tile = gen.integers(0, 2**16, ROWS * 8, dtype=np.uint16)
    rows = _rows(gen)
    out = cuda.to_device(np.full((32, num), 0xFFFFFFFF, dtype=np.uint32))
    _load_kernel(num, trans)[1, 32](cuda.to_device(tile), cuda.to_device(rows), out)
    np.testing.assert_array_equal(out.copy_to_host(), _expected_registers(tile, rows, num, trans))


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_stmatrix_every_lane(num, trans):
    gen = lanes.rng()
    regs = gen.integers(0, 2**32, (32, num), dtype=np.uint32)
    rows = _rows(gen)
    out = cuda.to_device(np.zeros(ROWS * 8, dtype=np.uint16))
    _store_kernel(num, trans)[1, 32](cuda.to_device(regs), cuda.to_device(rows), out)
    expected = np.full((ROWS, 8), 0xDEAD, dtype=np.uint16)
    fmap = ldmatrix_fragment(trans)
    for m in range(num):
        matrix = np.zeros((8, 8), dtype=np.uint16)
        matrix[fmap[:, 0, 0], fmap[:, 0, 1]] = regs[:, m] & 0xFFFF
        matrix[fmap[:, 1, 0], fmap[:, 1, 1]] = regs[:, m] >> 16
        expected[rows[8 * m: 8 * m + 8]] = matrix
    np.testing.assert_array_equal(out.copy_to_host().reshape(ROWS, 8), expected)


@cuda.jit
def _movmatrix_kernel(regs, out):
    lane = cuda.threadIdx.x
    out[lane] = lm.movmatrix_trans(regs[lane])


def test_movmatrix_every_lane():
    gen = lanes.rng()
    matrix = gen.integers(0, 2**16, (8, 8), dtype=np.uint16)
    fmap = ldmatrix_fragment(False)

    def registers(mat):
        lo = mat[fmap[:, 0, 0], fmap[:, 0, 1]].astype(np.uint32)
        hi = mat[fmap[:, 1, 0], fmap[:, 1, 1]].astype(np.uint32)
        return lo | (hi << 16)

    out = cuda.to_device(np.full(32, 0xFFFFFFFF, dtype=np.uint32))
    _movmatrix_kernel[1, 32](cuda.to_device(registers(matrix)), out)
    np.testing.assert_array_equal(out.copy_to_host(), registers(matrix.T.copy()))


@cuda.jit
def _ldmatrix_into_mma(a_tile, b_tile, out):
    """Level-2 style: A (16x16) and B^T (8x16) bf16 tiles in shared memory, fragments by ldmatrix,
    one m16n8k16 mma; D stored by the accumulator layout."""
    sa = cuda.shared.array(256, np.uint16)
    sb = cuda.shared.array(128, np.uint16)
    lane = cuda.threadIdx.x
    for i in range(lane, 256, 32):
        sa[i] = a_tile[i]
    for i in range(lane, 128, 32):
        sb[i] = b_tile[i]
    cuda.syncthreads()
    # A x4: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    a = lm.ldmatrix_x4(sa, (lane % 16) * 16 + (lane // 16) * 8)
    # B x2 from B^T stored n-major (8 rows of 16 k): matrices (k 0-7), (k 8-15)
    b = lm.ldmatrix_x2(sb, (lane % 8) * 16 + ((lane // 8) % 2) * 8)
    z = np.float32(0)
    d = _MMA(a, b, (z, z, z, z))
    g = lane // 4
    t = lane % 4
    out[g, 2 * t] = d[0]
    out[g, 2 * t + 1] = d[1]
    out[g + 8, 2 * t] = d[2]
    out[g + 8, 2 * t + 1] = d[3]


import intrinsics  # noqa: E402

_MMA = intrinsics.mma_sync("m16n8k16", "bf16", "bf16", "f32")


def test_ldmatrix_feeds_mma():
    if lanes.ml_dtypes is None:
        pytest.skip("ml_dtypes missing")
    gen = lanes.rng()
    a = lanes.random_values(gen, (16, 16), "bf16")
    b = lanes.random_values(gen, (16, 8), "bf16")
    out = cuda.to_device(np.full((16, 8), np.nan, dtype=np.float32))
    _ldmatrix_into_mma[1, 32](
        cuda.to_device(lanes.encode(a, "bf16").ravel()),
        cuda.to_device(lanes.encode(b.T.copy(), "bf16").ravel()),
        out,
    )
    np.testing.assert_allclose(out.copy_to_host(), a @ b, rtol=1e-5, atol=1e-5)
