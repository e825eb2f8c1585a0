"""TMA on the GPU (sm_90+): tile loads in 2-5 D land in shared memory in the swizzle pattern of
intrinsics.smem.swizzle_offset_host for every swizzle mode; boxes hanging over the tensor's
edges (negative and past-the-end starts) are filled with zeros or NaN on loads, and stores
past the far ends are clipped; multicast into every CTA of 2- and 4-CTA clusters; im2col loads;
the tensor prefetch and the descriptor prefetch; the mbarrier byte accounting
(``TensorMap.box_bytes`` is what arrive.expect_tx must promise); plain bulk copies with the
``.read`` wait.

Every tensor copy here starts its innermost dimension on a 16-byte boundary (the 16-byte rule,
``intrinsics.tensormap.start_problem``): the H200 faults otherwise (CUDA_ERROR_ILLEGAL_INSTRUCTION,
measured), and the emulation refuses such starts -- tests/emulation/test_tma_start_rule.py holds
the unaligned starts these tests used to take.

Only cases the H200 has run belong here: a fault poisons the CUDA context, and every later test
of the process fails with it.  What faults stays in scripts/tma_rules.py (docs/TMA.md has its
table): stores with a negative coordinate (any one of them: CUDA_ERROR_ILLEGAL_INSTRUCTION, so
``start_problem(..., op="store")`` refuses them), and loads into shared memory sized for dense
rows when the rows are narrower than the swizzle span (each row takes the whole span:
``intrinsics.tensormap.smem_row_pitch``, measured; ``TensorMap.smem_bytes`` is the size to
allocate).  Rank-1 maps run once the driver gets a non-empty stride list
(``intrinsics.tensormap.rank1_strides``, measured).

Every load kernel dumps the shared-memory bytes it received (from a 1024-byte-aligned base,
poisoned before the copy) back to global memory; the host compares them bit for bit with a NumPy
model (tests/helpers/tma.py).  Waits on mbarriers are bounded, so a byte count that never
arrives fails the test instead of hanging the GPU run.
"""

import numpy as np
import pytest
from numba import cuda

from intrinsics.launch import launch
from intrinsics.mbarrier import mbarrier_arrive_expect_tx
from intrinsics.tensormap import TensorMap, start_problem
from intrinsics.tma import (
    bulk_commit_group,
    bulk_copy_g2s,
    bulk_copy_s2g,
    bulk_wait_group,
    bulk_wait_group_read,
    tensormap_fence_acquire,
    tma_load,
)
from tests.helpers.tma import (
    ALIGN,
    footprint_kernel,
    POISON,
    THREADS,
    _aligned,
    _dump,
    _init_barrier,
    _poison,
    _wait,
    box_model,
    compare_box,
    descriptor_prefetch_kernel,
    device_coords,
    im2col_kernel,
    im2col_model,
    inside_mask,
    load_kernel,
    multicast_kernel,
    prefetch_kernel,
    random_tensor,
    store_kernel,
    swizzle_bytes,
    unswizzle_bytes,
)

# Every test also runs in the CPU emulation, except the ones that ask the real driver to encode
# tensor maps (hardware_only).
pytestmark = [pytest.mark.gpu(cc=(9, 0)), pytest.mark.emulation]


def rng():
    return np.random.default_rng()


def _start_id(start):
    """A test id without spaces (the GPU round passes node ids to pytest shards)."""
    return "_".join(map(str, start))


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


def _tmap(tensor, box, **kwargs):
    dtype = "bf16" if kwargs.pop("bf16", False) else None
    return TensorMap.tiled(cuda.to_device(tensor), box, dtype=dtype, **kwargs)


def _legal(tmap, start, op="load"):
    """The natural-order ``start`` as kernel coordinates, after checking the start rule."""
    coords = device_coords(start)
    problem = start_problem(tmap.dtype, coords, op=op)
    assert problem is None, (start, problem)
    return coords


def _measured(tmap):
    """Assert the map is of a kind the H200 has run (see the module docstring)."""
    assert not tmap.swizzle or tmap.smem_row_bytes == tmap.swizzle, (
        "rows narrower than the swizzle span: test_narrow_rows_take_the_swizzle_span")


def _load_and_check(tmap, tensor, start, type_name, prefetch=False, form="device"):
    """One tile load of the box at ``start`` (natural order); the received image unswizzled and
    compared with the NumPy model, fill included.  ``form``: the map in device memory
    (``tmap.device``) or passed by value (``tmap.param``, a __grid_constant__ parameter)."""
    _measured(tmap)
    coords = _legal(tmap, start)
    nbytes = tmap.box_bytes
    out, status = _device_bytes(nbytes), _status()
    launch(load_kernel(tmap.rank, prefetch), 1, THREADS,
           (getattr(tmap, form), cuda.to_device(coords), nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    dense = unswizzle_bytes(out.copy_to_host(), tmap.swizzle)
    got = dense.view(tensor.dtype).reshape(tmap.box)
    want = box_model(tensor, start, tmap.box, 0)
    inside = inside_mask(tensor.shape, start, tmap.box)
    problem = compare_box(got, want, inside, tmap.oob_fill, type_name)
    assert problem is None, f"{tmap!r} at {start}: {problem}"
    return inside


# ---------------------------------------------------------------------------------------------
# Tile loads: ranks 1-5, every swizzle
# ---------------------------------------------------------------------------------------------

# rank -> (element type, shape, the box's outer extents, an inside start of the outer dims);
ND = {
    1: (np.float32, (200,), (), ()),
    2: ("bf16", (40, 136), (24,), (3,)),
    3: (np.uint16, (5, 24, 96), (2, 8), (1, 4)),
    4: (np.float16, (3, 4, 10, 96), (2, 2, 4), (1, 1, 3)),
    5: (np.uint8, (2, 3, 4, 6, 160), (1, 2, 2, 3), (1, 1, 2, 3)),
}
WHERE = ["inside", "before", "past"]


def nd_case(rank, swizzle, where):
    """(tensor type, shape, box, start) natural order: the box's inner extent is the swizzle span
    (64 bytes without swizzle); 'inside' starts 32 bytes in, 'before' at -1 in every outer
    dimension the box spans more than one element of and -16 bytes innermost, 'past' over the
    far end of every dimension."""
    dtype, shape, outer_box, outer_start = ND[rank]
    esize = 2 if dtype == "bf16" else np.dtype(dtype).itemsize
    inner = (swizzle or 64) // esize
    box = outer_box + (inner,)
    if where == "inside":
        start = outer_start + (32 // esize,)
    elif where == "before":  # -1 where that leaves part of the box inside
        start = tuple(-1 if b > 1 else 0 for b in outer_box) + (-16 // esize,)
    else:
        last = shape[-1] - inner // 2
        start = tuple(n - 1 for n in shape[:-1]) + (last - last % (16 // esize),)
    return dtype, shape, box, start


ND_CASES = [(r, s, w) for r in ND for s in (0, 32, 64, 128) for w in WHERE]


@pytest.mark.parametrize("rank, swizzle, where", ND_CASES,
                         ids=[f"{r}d-sw{s}-{w}" for r, s, w in ND_CASES])
def test_tile_load(rank, swizzle, where):
    dtype, shape, box, start = nd_case(rank, swizzle, where)
    tensor = random_tensor(rng(), shape, dtype)
    tmap = _tmap(tensor, box, swizzle=swizzle, bf16=dtype == "bf16")
    _measured(tmap)
    assert tmap.box_bytes == tmap.smem_bytes == np.prod(box) * tensor.itemsize
    inside = _load_and_check(tmap, tensor, start, "bf16" if dtype == "bf16" else tensor.dtype)
    assert inside.all() == (where == "inside")


BY_VALUE_CASES = [(r, s, w) for r in ND for s in (0, 128) for w in ("inside", "before")]


@pytest.mark.parametrize("rank, swizzle, where", BY_VALUE_CASES,
                         ids=[f"{r}d-sw{s}-{w}" for r, s, w in BY_VALUE_CASES])
def test_tile_load_by_value(rank, swizzle, where):
    """The same loads with the map passed by value (``TensorMap.param``: 128 bytes in the
    kernel's parameter space, read in place, intrinsics.grid_constant), with a tensor prefetch
    through the parameter first."""
    dtype, shape, box, start = nd_case(rank, swizzle, where)
    tensor = random_tensor(rng(), shape, dtype)
    tmap = _tmap(tensor, box, swizzle=swizzle, bf16=dtype == "bf16")
    inside = _load_and_check(tmap, tensor, start, "bf16" if dtype == "bf16" else tensor.dtype,
                             prefetch=True, form="param")
    assert inside.all() == (where == "inside")


# Rows narrower than the swizzle span: each row of the box occupies the whole span in shared
# memory (measured: tma_rules' footprint probes), so the box needs TensorMap.smem_bytes.
NARROW_CASES = [
    # swizzle, row bytes
    (128, 16), (128, 32), (128, 64), (64, 16), (64, 32), (32, 16),
]


@pytest.mark.parametrize("swizzle, row_bytes", NARROW_CASES,
                         ids=[f"sw{s}-{r}B" for s, r in NARROW_CASES])
def test_narrow_rows_take_the_swizzle_span(swizzle, row_bytes):
    tensor = random_tensor(rng(), (24, 128), np.float32)
    box = (16, row_bytes // 4)
    tmap = _tmap(tensor, box, swizzle=swizzle)
    assert tmap.smem_bytes == box[0] * swizzle > tmap.box_bytes
    nbytes = tmap.smem_bytes
    out, status = _device_bytes(nbytes), _status()
    start = (3, 4)
    launch(footprint_kernel(2), 1, THREADS,
           (tmap.device, cuda.to_device(_legal(tmap, start)), tmap.box_bytes, nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    logical = unswizzle_bytes(out.copy_to_host(), swizzle).reshape(box[0], swizzle)
    got = np.ascontiguousarray(logical[:, :row_bytes]).view(np.float32)
    want = tensor[3:3 + box[0], 4:4 + box[1]]
    assert np.array_equal(got, want), f"{tmap!r}: rows did not land one swizzle span apart"


# The old 2-d cases (each at a legal innermost start now; their old starts are in
# tests/emulation/test_tma_start_rule.py).
SWIZZLE_CASES = [
    # swizzle, element type, tensor shape, box (rows, cols), start (row, col)
    (0, np.float32, (48, 96), (16, 16), (5, 4)),
    (32, np.float32, (48, 96), (16, 8), (5, 8)),
    (64, np.float32, (48, 96), (16, 16), (7, 40)),
    (128, np.float32, (48, 96), (16, 32), (9, 60)),
    (128, "bf16", (40, 136), (24, 64), (3, 72)),
    (64, np.float16, (40, 136), (8, 32), (30, 8)),
    (128, np.uint8, (32, 160), (8, 128), (11, 16)),
]


def _case_id(case):
    swizzle, dtype, *_ = case
    return f"sw{swizzle}-{dtype if isinstance(dtype, str) else np.dtype(dtype).name}"


@pytest.mark.parametrize("case", SWIZZLE_CASES, ids=_case_id)
def test_tile_load_swizzle_image(case):
    """The received bytes are exactly the swizzled image of the box (no unswizzling)."""
    swizzle, dtype, shape, box, start = case
    tensor = random_tensor(rng(), shape, dtype)
    tmap = _tmap(tensor, box, swizzle=swizzle, bf16=dtype == "bf16")
    _measured(tmap)
    nbytes = tmap.box_bytes
    out, status = _device_bytes(nbytes), _status()
    launch(load_kernel(2), 1, THREADS,
           (tmap.device, cuda.to_device(_legal(tmap, start)), nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    expected = swizzle_bytes(box_model(tensor, start, box, 0), swizzle)
    np.testing.assert_array_equal(out.copy_to_host(), expected)


# ---------------------------------------------------------------------------------------------
# Out-of-bounds fill
# ---------------------------------------------------------------------------------------------

# (row, col) starts of a (16, cols) box on a (40, 24) float32 tensor: negative and past the end
# in either dimension, every innermost start a multiple of 4 elements (16 bytes).
OOB_STARTS = [(30, 20), (-3, -4), (-7, 20), (36, 0), (-16, -8), (39, 16)]


@pytest.mark.parametrize("start", OOB_STARTS, ids=_start_id)
@pytest.mark.parametrize("fill", ["zero", "nan"])
@pytest.mark.parametrize("swizzle, cols", [(0, 8), (128, 32)])
def test_box_over_the_edge_is_filled(swizzle, cols, start, fill):
    tensor = random_tensor(rng(), (40, 24), np.float32)
    tmap = _tmap(tensor, (16, cols), swizzle=swizzle, oob_fill=fill)
    inside = _load_and_check(tmap, tensor, start, np.float32)
    assert (~inside).any()


@cuda.jit
def _load_two_boxes(tmap, a, b, nbytes, out, status):
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
        tma_load(dyn, pad, tmap, (a[0], a[1]), bars, 0)
        tma_load(dyn, pad + nbytes, tmap, (b[0], b[1]), bars, 0)
    _wait(bars, status, 0)
    _dump(dyn, pad, 2 * nbytes, out)


def test_two_loads_complete_one_barrier():
    shape, box = (64, 64), (8, 32)
    tensor = random_tensor(rng(), shape, np.float32)
    tmap = _tmap(tensor, box, swizzle=128)
    nbytes = tmap.box_bytes  # 1024: the second box stays 1024-byte aligned
    a, b = (3, 8), (40, 32)
    out, status = _device_bytes(2 * nbytes), _status()
    launch(_load_two_boxes, 1, THREADS,
           (tmap.device, cuda.to_device(_legal(tmap, a)), cuda.to_device(_legal(tmap, b)),
            nbytes, out, status), shared_bytes=2 * nbytes + ALIGN)
    _check_status(status)
    expected = np.concatenate([swizzle_bytes(box_model(tensor, s, box, 0), 128) for s in (a, b)])
    np.testing.assert_array_equal(out.copy_to_host(), expected)


# ---------------------------------------------------------------------------------------------
# Stores
# ---------------------------------------------------------------------------------------------

# Stores clip at the far ends only: a store with a negative coordinate faulted on the H200, and
# the old negative-start cases ((-5, -4) in 2-d with and without swizzle, (2, -3, 28),
# (1, -1, 3, 0, 8)) and the rank-1 case ((64,), box (32,), at 48) are probes now.
STORE_CASES = [
    # swizzle, tensor shape, box, start (natural order)
    (0, (40, 48), (16, 8), (3, 4)),
    (0, (40, 48), (16, 8), (30, 20)),
    (0, (40, 48), (16, 8), (0, 44)),
    (128, (40, 48), (16, 32), (3, 4)),
    (128, (40, 48), (16, 32), (30, 20)),
    (128, (40, 48), (16, 32), (0, 28)),
    (0, (1, 64), (1, 32), (0, 48)),
    (64, (3, 20, 40), (2, 8, 16), (2, 15, 28)),
    (32, (2, 3, 4, 5, 12), (2, 2, 2, 2, 8), (1, 2, 3, 4, 8)),
]


@pytest.mark.parametrize("form", ["device", "param"])
@pytest.mark.parametrize("swizzle, shape, box, start", STORE_CASES,
                         ids=[f"{len(s)}d-sw{w}-{_start_id(st)}" for w, s, _, st in STORE_CASES])
def test_store_clips_to_the_tensor(swizzle, shape, box, start, form):
    gen = rng()
    poison = np.full(shape, -7.25, dtype=np.float32)
    target = cuda.to_device(poison)
    tile = random_tensor(gen, box, np.float32)
    tmap = TensorMap.tiled(target, box, swizzle=swizzle)
    _measured(tmap)
    image = swizzle_bytes(tile, swizzle)
    launch(store_kernel(len(shape)), 1, THREADS,
           (getattr(tmap, form), cuda.to_device(_legal(tmap, start, "store")), cuda.to_device(image),
            image.size), shared_bytes=image.size + ALIGN)
    expected = poison.copy()
    inside = inside_mask(shape, start, box)
    at = np.nonzero(inside)
    expected[tuple(i + s for i, s in zip(at, start))] = tile[at]
    np.testing.assert_array_equal(target.copy_to_host(), expected)


# ---------------------------------------------------------------------------------------------
# Multicast
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["device", "param"])
@pytest.mark.parametrize("ctas", [2, 4])
def test_multicast_fills_every_cta(ctas, form):
    rows_per_cta, cols = 16, 32
    tensor = random_tensor(rng(), (ctas * rows_per_cta + 5, cols), np.float32)
    tmap = _tmap(tensor, (rows_per_cta, cols), swizzle=128)
    box = tmap.box_bytes  # 2048, a multiple of 1024: every box keeps the swizzle alignment
    out = cuda.to_device(np.full((ctas, ctas * box), POISON, dtype=np.uint8))
    status = _status(ctas)
    # CTA r loads rows [16 r, 16 r + 16): coordinate 1 (rows) steps by 16 per CTA rank.
    launch(multicast_kernel(2), ctas, THREADS,
           (getattr(tmap, form), cuda.to_device(_legal(tmap, (0, 0))), 1, rows_per_cta, box, out,
            status),
           shared_bytes=ctas * box + ALIGN, cluster=(ctas, 1, 1))
    _check_status(status)
    expected = np.concatenate([
        swizzle_bytes(tensor[r * rows_per_cta: (r + 1) * rows_per_cta], 128) for r in range(ctas)
    ])
    got = out.copy_to_host()
    for r in range(ctas):
        np.testing.assert_array_equal(got[r], expected, err_msg=f"CTA {r} of {ctas}")


# ---------------------------------------------------------------------------------------------
# im2col
# ---------------------------------------------------------------------------------------------

IM2COL_CASES = [
    # id, type, NHWC-like shape, corners (lower, upper), channels, pixels, swizzle, fill,
    # coords (c, w[, h], n) innermost first, offsets innermost first
    ("3x3-pad1", np.float16, (2, 8, 8, 32), ((-1, -1), (-1, -1)), 32, 32, 0, "zero",
     (0, -1, -1, 0), (0, 0)),
    # 64-byte rows under 64B swizzle (under 128B: a probe, 'im2col, 64 B rows, 128B swizzle')
    ("3x3-pad1-offset-next-image", np.float16, (2, 8, 8, 32), ((-1, -1), (-1, -1)), 32, 32,
     64, "zero", (0, 3, 5, 1), (2, 1)),
    ("channels-past-the-end", np.float16, (2, 8, 8, 32), ((-1, -1), (-1, -1)), 32, 16, 64,
     "nan", (8, 0, 0, 0), (1, 1)),
    ("1d-5tap-pad2", np.float32, (2, 40, 16), ((-2,), (-2,)), 16, 64, 0, "zero",
     (0, -2, 0), (3,)),
]


@pytest.mark.parametrize("case", IM2COL_CASES, ids=[c[0] for c in IM2COL_CASES])
def test_im2col_load(case):
    _, dtype, shape, (lower, upper), channels, pixels, swizzle, fill, coords, offsets = case
    tensor = random_tensor(rng(), shape, dtype)
    tmap = TensorMap.im2col(cuda.to_device(tensor), channels_per_pixel=channels,
                            pixels_per_column=pixels, lower_corner=lower, upper_corner=upper,
                            swizzle=swizzle, oob_fill=fill)
    assert start_problem(tmap.dtype, coords, "im2col") is None
    _measured(tmap)
    nbytes = tmap.box_bytes
    out, status = _device_bytes(nbytes), _status()
    launch(im2col_kernel(len(shape)), 1, THREADS,
           (tmap.device, cuda.to_device(np.array(coords, np.int32)),
            cuda.to_device(np.array(offsets, np.int32)), nbytes, out, status),
           shared_bytes=nbytes + ALIGN)
    _check_status(status)
    got = unswizzle_bytes(out.copy_to_host(), swizzle).view(tensor.dtype).reshape(pixels,
                                                                                   channels)
    want, inside = im2col_model(tensor, coords, offsets, lower, upper, pixels, channels, 0)
    problem = compare_box(got, want, inside, fill, tensor.dtype)
    assert problem is None, f"{tmap!r} at {coords} + {offsets}: {problem}"


# ---------------------------------------------------------------------------------------------
# Prefetch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [(5, 8), (-3, -4), (40, 92)], ids=_start_id)
def test_tensor_prefetch_then_load(start):
    """``cp.async.bulk.prefetch.tensor`` of a box (inside, negative, past the end), then the
    load of the same box, which must be exact."""
    tensor = random_tensor(rng(), (48, 96), np.float32)
    tmap = _tmap(tensor, (16, 16))
    _load_and_check(tmap, tensor, start, np.float32, prefetch=True)


@pytest.mark.parametrize("rank", [1, 2, 3, 5])
def test_tensor_prefetch_alone(rank):
    dtype, shape, box, start = nd_case(rank, 0, "inside")
    tensor = random_tensor(rng(), shape, dtype)
    tmap = _tmap(tensor, box)
    out = cuda.to_device(np.zeros(1, np.int32))
    launch(prefetch_kernel(rank), 1, 32, (tmap.device, cuda.to_device(_legal(tmap, start)), out))
    assert out.copy_to_host()[0] == 1


# ---------------------------------------------------------------------------------------------
# Plain bulk copies
# ---------------------------------------------------------------------------------------------


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
# The real driver accepts what the host checks accept
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
                         ids=[f"{np.dtype(d).name}-{_start_id(s)}-{i}"
                              for i, (d, s, _) in enumerate(DRIVER_CASES)])
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


def test_prefetch_descriptor_last():
    """Kept last in this file: ``prefetch.tensormap`` is documented for maps in the .const or
    .param state spaces, and ours live in global memory; were that to fault (which poisons the
    context), the fault could not hide the results of the tests above.  scripts/tma_rules.py
    probes it in a process of its own."""
    tensor = np.zeros((64, 64), np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), (8, 8))
    out = cuda.to_device(np.zeros(1, np.int32))
    descriptor_prefetch_kernel[1, 32](tmap.device, out)
    assert out.copy_to_host()[0] == 1
