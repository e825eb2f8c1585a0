"""Warp-level protocol mistakes in the CPU emulation (mma.sync, ldmatrix, cp.async, block
barriers): each is provoked by a small kernel and must raise an EmulationError naming the block,
warp and lane."""

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

import intrinsics as nt  # noqa: E402
from intrinsics.emulate.runtime import EmulationError  # noqa: E402

MMA = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")


@cuda.jit
def _half_warp_mma(out):
    lane = cuda.threadIdx.x
    if lane < 16:
        z = np.float32(0)
        u = np.uint32(0)
        d = MMA((u, u, u, u), (u, u), (z, z, z, z))
        out[lane] = d[0]


def test_mma_by_half_a_warp():
    with pytest.raises(EmulationError, match=r"block \(0, 0, 0\) warp 0 lane \d+: .*mma.sync.* "
                                             r"called by lanes 0-15 only; lanes 16-31 did not"):
        _half_warp_mma[1, 32](np.zeros(32, np.float32))


@cuda.jit
def _misaligned_ldmatrix(out, shift):
    tile = cuda.shared.array(512, np.uint16, alignment=16)
    lane = cuda.threadIdx.x
    r = nt.ldmatrix_x1(tile, lane * 8 + (shift if lane == 5 else 0))
    out[lane] = r


def test_ldmatrix_row_not_16_byte_aligned():
    with pytest.raises(EmulationError, match=r"warp 0 lane \d+: ldmatrix.*lane 5 gave row address "
                                             r"\d+, which is not 16-byte aligned"):
        _misaligned_ldmatrix[1, 32](np.zeros(32, np.uint32), 3)


@cuda.jit
def _different_collectives(out):
    lane = cuda.threadIdx.x
    tile = cuda.shared.array(512, np.uint16, alignment=16)
    if lane % 2 == 0:
        out[lane] = nt.ldmatrix_x1(tile, lane * 8)
    else:
        out[lane] = nt.movmatrix_trans(np.uint32(lane))


def test_lanes_of_a_warp_in_different_collectives():
    with pytest.raises(EmulationError, match="must execute the same collective"):
        _different_collectives[1, 32](np.zeros(32, np.uint32))


@cuda.jit
def _cp_async_misaligned(out, src):
    smem = cuda.shared.array(256, np.uint32, alignment=16)
    nt.cp_async_16(smem, 1, src, 0)
    nt.cp_async_wait_all()
    out[0] = smem[1]


def test_cp_async_destination_misaligned():
    with pytest.raises(EmulationError, match=r"warp 0 lane 0: cp.async.*shared address \d+ is not "
                                             r"16-byte aligned"):
        _cp_async_misaligned[1, 1](np.zeros(4, np.uint32), np.zeros(64, np.uint32))


@cuda.jit
def _read_before_wait(out, src):
    smem = cuda.shared.array(64, np.uint32, alignment=16)
    t = cuda.threadIdx.x
    smem[t] = 7
    cuda.syncthreads()
    nt.cp_async_16(smem, t * 4, src, t * 4)
    nt.cp_async_commit_group()
    out[t] = smem[t * 4]  # the copy has not been waited for: old bytes
    nt.cp_async_wait_group(0)
    out[16 + t] = smem[t * 4]


def test_cp_async_lands_only_at_the_wait():
    """Not an error but the model that lets missing waits show: before the wait the shared
    memory still holds what was there."""
    out = np.zeros(32, np.uint32)
    src = np.arange(64, dtype=np.uint32) + 100
    _read_before_wait[1, 16](out, src)
    assert (out[:16] != src[::4][:16]).all()
    np.testing.assert_array_equal(out[16:], src[::4][:16])


@cuda.jit
def _syncwarp_exchange(out, res):
    t = cuda.threadIdx.x
    out[t] = t
    cuda.syncwarp()  # every lane's store is in before any lane reads a neighbour's
    res[t] = out[(t + 1) % 32]


@cuda.jit
def _half_warp_syncwarp(out):
    if cuda.threadIdx.x < 16:
        cuda.syncwarp()


def test_syncwarp_orders_the_lanes_and_needs_all_of_them():
    out = np.zeros(32, np.int64)
    res = np.zeros(32, np.int64)
    _syncwarp_exchange[1, 32](out, res)
    assert list(res) == [(t + 1) % 32 for t in range(32)]
    with pytest.raises(EmulationError, match=r"bar.warp.sync is a warp-collective, called by "
                                             r"lanes 0-15 only"):
        _half_warp_syncwarp[1, 32](np.zeros(32, np.int64))
