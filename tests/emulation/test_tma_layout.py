"""The emulated TMA box model against the wgmma shared-memory layouts.

TMA tensor copies could not be checked on the H200 (they fault there even for Triton and CUDA
C++), so the emulation is their only check.  Here two models written independently from the PTX
ISA must agree: a tile loaded by emulated ``tma_load`` (one box per swizzle atom column, boxes
``box_bytes`` apart) must be byte for byte the canonical wgmma layout that
:class:`intrinsics.layout.SmemLayout` builds for the same tile -- what CUTLASS's SM90 GEMMs rely on
when TMA fills the operands wgmma reads.

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation``."""

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from intrinsics.launch import launch  # noqa: E402
from intrinsics.mbarrier import (  # noqa: E402
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)
from intrinsics.smem import shared_address  # noqa: E402
from intrinsics.tensormap import TensorMap  # noqa: E402
from intrinsics.tma import tma_load  # noqa: E402
from intrinsics.layout import SmemLayout  # noqa: E402

ALIGN = 1024


@cuda.jit
def _load_boxes(tmap, coords, box_bytes, out):
    """Box i (coords[i] = (inner, outer)) lands box_bytes * i after a 1024-aligned base."""
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    base = shared_address(dyn, 0)
    pad = (ALIGN - (base & (ALIGN - 1))) & (ALIGN - 1)
    n = coords.shape[0]
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1)
        mbarrier_arrive_expect_tx(bars, 0, n * box_bytes)
        for i in range(n):
            tma_load(dyn, pad + i * box_bytes, tmap, (coords[i, 0], coords[i, 1]), bars, 0)
    cuda.syncthreads()
    mbarrier_wait_parity(bars, 0, 0)
    for i in range(cuda.threadIdx.x, out.size, cuda.blockDim.x):
        out[i] = dyn[pad + i]


def _load(tmap, coords, nbytes):
    out = np.full(nbytes, 0xA5, dtype=np.uint8)
    launch(_load_boxes, 1, 64, (tmap.device, np.array(coords, dtype=np.int32), tmap.box_bytes,
                                out), shared_bytes=nbytes + ALIGN)
    return out


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("elem_bytes", [1, 2, 4])
def test_k_major_tile_is_the_wgmma_layout(swizzle, elem_bytes):
    """A (mn, k) tile of a row-major (M, K) matrix, K contiguous: boxes of (mn rows, one
    swizzle span of K); SmemLayout's next span of K starts mn * span bytes further."""
    rng = np.random.default_rng()
    span = swizzle or 16
    per_box = span // elem_bytes  # k values per box
    mn, k = 64, 2 * per_box
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem_bytes]
    matrix = rng.integers(0, np.iinfo(dtype).max, (96, 3 * k), dtype=dtype, endpoint=True)
    tmap = TensorMap.tiled(cuda.to_device(matrix), (mn, per_box), swizzle=swizzle)
    m0, k0 = 17, per_box  # a tile not at the origin
    coords = [(k0 + j * per_box, m0) for j in range(k // per_box)]
    got = _load(tmap, coords, mn * k * elem_bytes)
    layout = SmemLayout("K", swizzle, mn, k, elem_bytes)
    expected = layout.place(matrix[m0: m0 + mn, k0: k0 + k])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("swizzle", [32, 64, 128])
@pytest.mark.parametrize("elem_bytes", [2, 4])
def test_mn_major_tile_is_the_wgmma_layout(swizzle, elem_bytes):
    """A (mn, k) tile of a (K, N) matrix, MN contiguous: one box of (k rows, one swizzle span
    of MN); SmemLayout puts 8 k-rows of the span per atom and the next 8 k 8 * span further."""
    rng = np.random.default_rng()
    mn, k = swizzle // elem_bytes, 32
    dtype = {2: np.uint16, 4: np.uint32}[elem_bytes]
    matrix = rng.integers(0, np.iinfo(dtype).max, (48, 4 * mn), dtype=dtype, endpoint=True)
    tmap = TensorMap.tiled(cuda.to_device(matrix), (k, mn), swizzle=swizzle)
    k0, n0 = 9, mn
    got = _load(tmap, [(n0, k0)], mn * k * elem_bytes)
    layout = SmemLayout("MN", swizzle, mn, k, elem_bytes)
    expected = layout.place(matrix[k0: k0 + k, n0: n0 + mn].T)
    np.testing.assert_array_equal(got, expected)


def test_swizzle_128_by_hand():
    """The 128B pattern spelled out: row r's 16-byte chunk c lands at chunk c ^ (r % 8)."""
    rows, cols = 16, 32  # float32: 128-byte rows
    matrix = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    tmap = TensorMap.tiled(cuda.to_device(matrix), (rows, cols), swizzle=128)
    got = _load(tmap, [(0, 0)], rows * cols * 4).view(np.float32).reshape(rows, 8, 4)
    for r in range(rows):
        for c in range(8):
            np.testing.assert_array_equal(got[r, c ^ (r % 8)], matrix[r, 4 * c: 4 * c + 4])
