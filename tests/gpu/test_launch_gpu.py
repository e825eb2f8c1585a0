"""intrinsics.launch on the GPU: > 48 KB dynamic shared memory and cluster launches run the grid
the caller asked for."""

import numpy as np
import pytest
from numba import cuda

from intrinsics.launch import LaunchError, launch

pytestmark = pytest.mark.gpu


@cuda.jit
def _fill_shared(out, n):
    smem = cuda.shared.array(0, np.float32)
    t = cuda.threadIdx.x
    for i in range(t, n, cuda.blockDim.x):
        smem[i] = i * 2.0
    cuda.syncthreads()
    for i in range(t, n, cuda.blockDim.x):
        out[cuda.blockIdx.x, i] = smem[n - 1 - i]


def test_large_dynamic_shared_memory():
    n = 200 * 1024 // 4
    out = cuda.to_device(np.full((3, n), np.nan, dtype=np.float32))
    launch(_fill_shared, 3, 256, (out, n), shared_bytes=n * 4)
    expected = (np.arange(n)[::-1] * 2.0).astype(np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), np.broadcast_to(expected, (3, n)))


@cuda.jit
def _fill_shared_with_static(out, n):
    smem = cuda.shared.array(0, np.float32)
    flag = cuda.shared.array(64, np.int32)  # 256 B of static shared memory
    t = cuda.threadIdx.x
    if t < 64:
        flag[t] = t
    for i in range(t, n, cuda.blockDim.x):
        smem[i] = i * 2.0
    cuda.syncthreads()
    for i in range(t, n, cuda.blockDim.x):
        out[cuda.blockIdx.x, i] = smem[n - 1 - i] + flag[i % 64] - i % 64


def test_exactly_48kb_dynamic_plus_static_shared_memory():
    """48 KB of dynamic shared memory is over the default limit once the kernel has any static
    shared memory: the launch must opt in (CUDA_ERROR_INVALID_VALUE otherwise)."""
    n = 48 * 1024 // 4
    out = cuda.to_device(np.full((2, n), np.nan, dtype=np.float32))
    launch(_fill_shared_with_static, 2, 256, (out, n), shared_bytes=n * 4)
    expected = (np.arange(n)[::-1] * 2.0).astype(np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), np.broadcast_to(expected, (2, n)))


def test_too_much_shared_memory_is_named():
    out = cuda.to_device(np.zeros((1, 1), dtype=np.float32))
    with pytest.raises(LaunchError, match="exceeds the device's per-block limit"):
        launch(_fill_shared, 1, 32, (out, 1), shared_bytes=400 * 1024)


@cuda.jit
def _where(out):
    b = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y
    if cuda.threadIdx.x == 0:
        out[b, 0] = cuda.blockIdx.x
        out[b, 1] = cuda.gridDim.x
        out[b, 2] = cuda.gridDim.y


@pytest.mark.parametrize("grid, cluster", [((4, 1), (2, 1, 1)), ((8, 2), (4, 1, 1)), ((6, 2), (2, 2, 1))])
def test_cluster_launch_runs_the_requested_grid(grid, cluster):
    blocks = grid[0] * grid[1]
    out = cuda.to_device(np.full((blocks, 3), -1, dtype=np.int32))
    launch(_where, grid, 64, (out,), cluster=cluster)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:, 0], np.tile(np.arange(grid[0]), grid[1]))
    assert (got[:, 1] == grid[0]).all() and (got[:, 2] == grid[1]).all()


def test_cluster_must_divide_grid():
    out = cuda.to_device(np.zeros((4, 3), dtype=np.int32))
    with pytest.raises(LaunchError, match="must divide the grid"):
        launch(_where, 3, 32, (out,), cluster=(2, 1, 1))
