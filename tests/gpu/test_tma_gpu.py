"""TMA on the GPU (sm_90+): tile loads land in shared memory in the swizzle pattern of
intrinsics.smem.swizzle_offset_host, boxes hanging over the tensor's edges are filled with zeros
(or NaN) on loads and clipped on stores, 3-d boxes, the mbarrier byte accounting
(``TensorMap.box_bytes`` is what arrive.expect_tx must promise), plain bulk copies with the
``.read`` wait, and multicast into both CTAs of a 2-CTA cluster.

Every kernel dumps the shared-memory bytes it received (from a 1024-byte-aligned base, poisoned
before the copy) back to global memory; the host compares them byte for byte with a NumPy model.
Waits on mbarriers are bounded (test_wait + nanosleep), so a byte count that never arrives fails
the test instead of hanging the GPU run.
"""

import numpy as np
import pytest
from numba import cuda

from intrinsics.cluster import cluster_ctarank, cluster_sync, fence_proxy_async_shared
from intrinsics.launch import launch
from intrinsics.mbarrier import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_test_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics.smem import shared_address, swizzle_offset_host
from intrinsics.tensormap import TensorMap
from intrinsics.tma import (
    bulk_commit_group,
    bulk_copy_g2s,
    bulk_copy_s2g,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_load_multicast,
    tma_prefetch_descriptor,
    tensormap_fence_acquire,
    tma_store,
)

# Every test also runs in the CPU emulation, except the ones that ask the real driver to encode
# tensor maps (hardware_only).
pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.emulation]


@pytest.fixture
def tensor_tma():
    """Skip a test that needs cp.async.bulk.tensor when an independent implementation
    (Triton's TMA load) faults on this machine too -- see tests/gpu/tma_probe.py.  Under the
    simulator the emulation runs the copies: nothing to probe."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return
    from tests.gpu.tma_probe import tensor_tma_status

    works, why = tensor_tma_status()
    if works is False:
        pytest.skip(why)

THREADS = 128
ALIGN = 1024  # the 128B swizzle pattern repeats every 1024 bytes
POISON = 0xA5  # 0xA5A5A5A5 is a finite float32 (-2.9e-16), distinct from 0 and NaN
SPINS = 1_000_000  # x >= 100 ns: a missing byte fails the test in well under a minute


def rng():
    return np.random.default_rng()


# ---------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------


@cuda.jit(device=True, inline="always")
def _aligned(dyn):
    """Element offset of the first 1024-byte-aligned byte of ``dyn`` (numba gives .align 1)."""
    base = shared_address(dyn, 0)
    return (ALIGN - (base & (ALIGN - 1))) & (ALIGN - 1)


@cuda.jit(device=True, inline="always")
def _poison(dyn, pad, nbytes):
    for i in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
        dyn[pad + i] = POISON
    # The TMA (async proxy) writes after these generic writes: order them.
    fence_proxy_async_shared()


@cuda.jit(device=True, inline="always")
def _init_barrier(bars):
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()


@cuda.jit(device=True, inline="always")
def _wait(bars, status, slot):
    """Wait for phase 0 of ``bars[0]``; on a timeout set ``status[slot]`` and give up."""
    spins = 0
    while not mbarrier_test_wait_parity(bars, 0, 0):
        cuda.nanosleep(100)
        spins += 1
        if spins == SPINS:
            status[slot] = 1
            return
    mbarrier_wait_parity(bars, 0, 0)  # the blocking form; the phase is complete already


@cuda.jit(device=True, inline="always")
def _dump(dyn, pad, nbytes, out):
    for i in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
        out[i] = dyn[pad + i]


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@cuda.jit
def _load_2d(tmap, c0, c1, nbytes, out, status):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    _poison(dyn, pad, nbytes)
    _init_barrier(bars)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 0, nbytes)
        tensormap_fence_acquire(tmap)
        tma_load(dyn, pad, tmap, (c0, c1), bars, 0)  # innermost (column) first
    _wait(bars, status, 0)
    _dump(dyn, pad, nbytes, out)


@cuda.jit
def _load_3d(tmap, c0, c1, c2, nbytes, out, status):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    _poison(dyn, pad, nbytes)
    _init_barrier(bars)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 0, nbytes)
        tensormap_fence_acquire(tmap)
        tma_load(dyn, pad, tmap, (c0, c1, c2), bars, 0)
    _wait(bars, status, 0)
    _dump(dyn, pad, nbytes, out)


@cuda.jit
def _load_two_boxes(tmap, a0, a1, b0, b1, nbytes, out, status):
    # Two loads complete on one barrier: it flips only when both boxes' bytes have arrived.
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    _poison(dyn, pad, 2 * nbytes)
    _init_barrier(bars)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 0, 2 * nbytes)
        tensormap_fence_acquire(tmap)
        tma_load(dyn, pad, tmap, (a0, a1), bars, 0)
        tensormap_fence_acquire(tmap)
        tma_load(dyn, pad + nbytes, tmap, (b0, b1), bars, 0)
    _wait(bars, status, 0)
    _dump(dyn, pad, 2 * nbytes, out)


@cuda.jit
def _store_2d(tmap, c0, c1, image, nbytes):
    dyn = cuda.shared.array(0, np.uint8)
    pad = _aligned(dyn)
    for i in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
        dyn[pad + i] = image[i]
    fence_proxy_async_shared()  # the TMA store (async proxy) reads what the threads wrote
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tensormap_fence_acquire(tmap)
        tma_store(tmap, (c0, c1), dyn, pad)
        bulk_commit_group()
        bulk_wait_group(0)


@cuda.jit
def _bulk_round_trip(src, src_at, out, out_at, nbytes, status):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    _poison(dyn, pad, nbytes)
    _init_barrier(bars)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 0, nbytes)
        bulk_copy_g2s(dyn, pad, src, src_at, nbytes, bars, 0)
    _wait(bars, status, 0)
    if cuda.threadIdx.x == 0:
        bulk_copy_s2g(out, out_at, dyn, pad, nbytes)
        bulk_commit_group()
        bulk_wait_group_read(0)
        # The copy has read its source: overwriting it now must not change what lands.
        for i in range(nbytes):
            dyn[pad + i] = 0
        bulk_wait_group(0)


@cuda.jit
def _multicast(tmap, rows_per_cta, half_bytes, out, status):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    rank = cluster_ctarank()
    pad = _aligned(dyn)  # the same offset in both CTAs
    _poison(dyn, pad, 2 * half_bytes)
    _init_barrier(bars)
    cuda.syncthreads()
    cluster_sync()  # both barriers initialised (and poison written) before either CTA loads
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 0, 2 * half_bytes)  # own half + the peer's
        tensormap_fence_acquire(tmap)
        tma_load_multicast(dyn, pad + rank * half_bytes, tmap, (0, rank * rows_per_cta),
                           bars, 0, 0b11)
    _wait(bars, status, rank)
    for i in range(cuda.threadIdx.x, 2 * half_bytes, cuda.blockDim.x):
        out[rank, i] = dyn[pad + i]
    cluster_sync()  # no CTA exits while its peer's multicast may still write into it


# ---------------------------------------------------------------------------------------------
# NumPy models
# ---------------------------------------------------------------------------------------------


def box_model(tensor, start, box, fill):
    """The box of ``tensor`` starting at ``start`` (natural order, may be negative or run past
    the end); elements outside the tensor are ``fill``."""
    out = np.full(box, fill, dtype=tensor.dtype)
    src, dst = [], []
    for s, b, n in zip(start, box, tensor.shape):
        lo, hi = max(s, 0), min(s + b, n)
        if lo >= hi:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    out[tuple(dst)] = tensor[tuple(src)]
    return out


def inside_mask(shape, start, box):
    """True where the box element lies inside the tensor."""
    mask = np.ones(box, dtype=bool)
    for axis, (s, b, n) in enumerate(zip(start, box, shape)):
        idx = s + np.arange(b)
        keep = (idx >= 0) & (idx < n)
        view = [np.newaxis] * len(box)
        view[axis] = slice(None)
        mask &= keep[tuple(view)]
    return mask


def swizzle_bytes(tile, mode):
    """Shared-memory image of a row-major tile under TMA swizzle ``mode``: every 16-byte chunk
    at logical byte offset L lands at swizzle_offset_host(L, mode) (tile base 1024-aligned)."""
    flat = np.ascontiguousarray(tile).view(np.uint8).reshape(-1)
    out = np.empty_like(flat)
    for chunk in range(flat.size // 16):
        phys = swizzle_offset_host(chunk * 16, mode)
        out[phys: phys + 16] = flat[chunk * 16: chunk * 16 + 16]
    return out


def random_tensor(gen, shape, dtype):
    if dtype == np.float32:
        return gen.standard_normal(shape).astype(np.float32)
    if dtype == np.float16:
        return gen.standard_normal(shape).astype(np.float16)
    if dtype == "bf16":  # finite bfloat16 bits: the top half of finite float32 values
        return (gen.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(
            np.uint16
        )
    return gen.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


def _device_bytes(n):
    return cuda.to_device(np.full(n, POISON, dtype=np.uint8))


def _status(n=1):
    return cuda.to_device(np.zeros(n, dtype=np.int32))


def _check_status(status):
    got = status.copy_to_host()
    assert not got.any(), (
        f"mbarrier phase 0 never completed in CTA(s) {np.flatnonzero(got).tolist()}: the bytes "
        f"delivered differ from the arrive.expect_tx count, or the copy faulted"
    )


# ---------------------------------------------------------------------------------------------
# Loads
@pytest.mark.parametrize("src_at, out_at, nbytes", [(0, 0, 16), (48, 32, 1040), (4096, 16, 4096)])
def test_bulk_round_trip(src_at, out_at, nbytes):
    src = rng().integers(0, 256, 8192, dtype=np.uint8)
    out = _device_bytes(8192)
    status = _status()
    launch(_bulk_round_trip, 1, THREADS,
           (cuda.to_device(src), src_at, out, out_at, nbytes, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    expected = np.full(8192, POISON, dtype=np.uint8)
    expected[out_at: out_at + nbytes] = src[src_at: src_at + nbytes]
    np.testing.assert_array_equal(out.copy_to_host(), expected)


# ---------------------------------------------------------------------------------------------
# Multicast
# ---------------------------------------------------------------------------------------------


DRIVER_CASES = [
    # (element type, shape, TensorMap.tiled keyword arguments)
    (np.float32, (64, 128), dict(box=(32, 32), swizzle=128)),
    (np.float32, (64, 128), dict(box=(256, 4))),
    (np.float32, (64, 128), dict(box=(8, 8), swizzle=32, element_strides=(8, 1))),
    (np.float16, (3, 64, 128), dict(box=(2, 8, 64), swizzle=128, oob_fill="nan",
                                    l2_promotion=256)),
    (np.uint8, (2, 4, 8, 16, 32), dict(box=(1, 2, 4, 8, 16), swizzle=0, l2_promotion=0)),
    (np.uint16, (2, 4, 64, 8), dict(box=(1, 1, 64, 8), interleave=16)),  # NC/8HWC8
]


@pytest.mark.hardware_only
@pytest.mark.parametrize("dtype, shape, kwargs", DRIVER_CASES,
                         ids=[f"{np.dtype(d).name}-{s}" for d, s, _ in DRIVER_CASES])
def test_driver_accepts_valid_tiled_maps(dtype, shape, kwargs):
    tensor = cuda.to_device(np.zeros(shape, dtype=dtype))
    tmap = TensorMap.tiled(tensor, **kwargs)
    assert tmap.words.any(), "the driver returned an all-zero tensor map"
    assert tmap.device.shape == (16,)


@pytest.mark.hardware_only
def test_driver_accepts_a_valid_im2col_map():
    tensor = cuda.to_device(np.zeros((2, 16, 16, 64), dtype=np.float16))  # NHWC
    # a 3x3 convolution with padding 1: lower = -pad, upper = pad - (filter - 1)
    tmap = TensorMap.im2col(tensor, channels_per_pixel=64, pixels_per_column=128,
                            lower_corner=(-1, -1), upper_corner=(-1, -1), swizzle=128)
    assert tmap.words.any() and tmap.box_bytes == 128 * 64 * 2


# ---------------------------------------------------------------------------------------------

SWIZZLE_CASES = [
    # swizzle, element type, tensor shape, box (rows, cols), start (row, col)
    (0, np.float32, (48, 96), (16, 16), (5, 3)),
    (32, np.float32, (48, 96), (16, 8), (5, 8)),
    (64, np.float32, (48, 96), (16, 16), (7, 40)),
    (128, np.float32, (48, 96), (16, 32), (9, 60)),
    (128, "bf16", (40, 136), (24, 64), (3, 70)),
    (64, np.float16, (40, 136), (8, 32), (30, 1)),
    (128, np.uint8, (32, 160), (8, 128), (11, 17)),
]


def _case_id(case):
    swizzle, dtype, *_ = case
    return f"sw{swizzle}-{dtype if isinstance(dtype, str) else np.dtype(dtype).name}"


@pytest.mark.parametrize("case", SWIZZLE_CASES, ids=_case_id)
def test_tile_load_swizzle(case, tensor_tma):
    swizzle, dtype, shape, box, start = case
    tensor = random_tensor(rng(), shape, dtype)
    tmap = TensorMap.tiled(cuda.to_device(tensor), box, swizzle=swizzle,
                           dtype="bf16" if dtype == "bf16" else None)
    nbytes = tmap.box_bytes
    assert nbytes == box[0] * box[1] * tensor.itemsize
    out, status = _device_bytes(nbytes), _status()
    launch(_load_2d, 1, THREADS, (tmap.device, start[1], start[0], nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    expected = swizzle_bytes(box_model(tensor, start, box, 0), swizzle)
    np.testing.assert_array_equal(out.copy_to_host(), expected)


OOB_STARTS = [(30, 20), (-3, -5), (-7, 18), (36, 0)]


@pytest.mark.parametrize("start", OOB_STARTS, ids=str)
@pytest.mark.parametrize("fill", ["zero", "nan"])
def test_box_over_the_edge_is_filled(start, fill, tensor_tma):
    shape, box = (40, 24), (16, 8)
    tensor = random_tensor(rng(), shape, np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), box, oob_fill=fill)
    nbytes = tmap.box_bytes
    out, status = _device_bytes(nbytes), _status()
    launch(_load_2d, 1, THREADS, (tmap.device, start[1], start[0], nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    got = out.copy_to_host().view(np.float32).reshape(box)
    inside = inside_mask(shape, start, box)
    assert (~inside).any()
    np.testing.assert_array_equal(got[inside], box_model(tensor, start, box, 0)[inside])
    if fill == "zero":
        assert (got[~inside].view(np.uint32) == 0).all(), "out-of-bounds elements must be +0.0"
    else:
        assert np.isnan(got[~inside]).all(), "out-of-bounds elements must be NaN"


@pytest.mark.parametrize("start", [(1, 4, 8), (4, 20, 30), (-1, -2, -3)], ids=str)
def test_3d_load(start, tensor_tma):
    shape, box = (5, 24, 40), (2, 8, 16)
    tensor = random_tensor(rng(), shape, np.uint16)
    tmap = TensorMap.tiled(cuda.to_device(tensor), box)
    nbytes = tmap.box_bytes
    out, status = _device_bytes(nbytes), _status()
    launch(_load_3d, 1, THREADS,
           (tmap.device, start[2], start[1], start[0], nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    got = out.copy_to_host().view(np.uint16).reshape(box)
    np.testing.assert_array_equal(got, box_model(tensor, start, box, 0))


def test_two_loads_complete_one_barrier(tensor_tma):
    shape, box = (64, 64), (8, 32)
    tensor = random_tensor(rng(), shape, np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), box, swizzle=128)
    nbytes = tmap.box_bytes  # 1024: the second box stays 1024-byte aligned
    a, b = (3, 5), (40, 30)
    out, status = _device_bytes(2 * nbytes), _status()
    launch(_load_two_boxes, 1, THREADS,
           (tmap.device, a[1], a[0], b[1], b[0], nbytes, out, status),
           shared_bytes=2 * nbytes + ALIGN)
    _check_status(status)
    expected = np.concatenate([swizzle_bytes(box_model(tensor, s, box, 0), 128) for s in (a, b)])
    np.testing.assert_array_equal(out.copy_to_host(), expected)


# ---------------------------------------------------------------------------------------------
# Stores
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [(3, 4), (30, 20), (-5, -3)], ids=str)
@pytest.mark.parametrize("swizzle, box", [(0, (16, 8)), (128, (16, 32))])
def test_store_clips_to_the_tensor(swizzle, box, start, tensor_tma):
    shape = (40, 48)
    gen = rng()
    poison = np.full(shape, -7.25, dtype=np.float32)
    target = cuda.to_device(poison)
    tile = random_tensor(gen, box, np.float32)
    tmap = TensorMap.tiled(target, box, swizzle=swizzle)
    image = swizzle_bytes(tile, swizzle)
    launch(_store_2d, 1, THREADS, (tmap.device, start[1], start[0], cuda.to_device(image),
                                   image.size), shared_bytes=image.size + ALIGN)
    got = target.copy_to_host()
    expected = poison.copy()
    inside = inside_mask(shape, start, box)
    rows = np.arange(box[0])[:, None] + start[0]
    cols = np.arange(box[1])[None, :] + start[1]
    rows, cols = np.broadcast_to(rows, box)[inside], np.broadcast_to(cols, box)[inside]
    expected[rows, cols] = tile[inside]
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# Plain bulk copies
# ---------------------------------------------------------------------------------------------


def test_multicast_fills_both_ctas(tensor_tma):
    rows_per_cta, cols = 16, 32
    tensor = random_tensor(rng(), (2 * rows_per_cta + 5, cols), np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), (rows_per_cta, cols), swizzle=128)
    half = tmap.box_bytes  # 2048, a multiple of 1024: both halves keep the swizzle alignment
    out = cuda.to_device(np.full((2, 2 * half), POISON, dtype=np.uint8))
    status = _status(2)
    launch(_multicast, 2, THREADS, (tmap.device, rows_per_cta, half, out, status),
           shared_bytes=2 * half + ALIGN, cluster=(2, 1, 1))
    _check_status(status)
    # CTA r loaded rows [16 r, 16 r + 16) into offset r * half of *both* CTAs.
    expected = np.concatenate([
        swizzle_bytes(tensor[r * rows_per_cta: (r + 1) * rows_per_cta], 128) for r in (0, 1)
    ])
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[0], expected)
    np.testing.assert_array_equal(got[1], expected)


# ---------------------------------------------------------------------------------------------
# The real driver accepts what the host checks accept
# ---------------------------------------------------------------------------------------------

@cuda.jit
def _prefetch(tmap, out):
    if cuda.threadIdx.x == 0:
        tma_prefetch_descriptor(tmap)
        out[0] = 1


def test_prefetch_tensormap_last(tensor_tma):
    """Kept last in this file: ``prefetch.tensormap`` is documented for maps in the .const or
    .param state spaces, and ours live in global memory; if the hardware faults on that, the
    fault (which poisons the context) cannot hide the results of the tests above."""
    tensor = np.zeros((64, 64), np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), (8, 8))
    out = cuda.to_device(np.zeros(1, np.int32))
    _prefetch[1, 32](tmap.device, out)
    assert out.copy_to_host()[0] == 1
