"""TMA kernels and NumPy models shared by tests/gpu/test_tma_gpu.py, the emulation tests in
tests/emulation/ and scripts/tma_rules.py.

Each kernel issues one kind of tensor copy from thread 0 and, for loads, dumps the shared-memory
bytes it received (from a 1024-byte-aligned base, poisoned before the copy) to global memory.
Coordinates reach the kernels as an ``int32`` array in device order (innermost first, as the
intrinsics take them); one kernel is compiled per rank (:func:`load_kernel` etc. are cached).
Waits on mbarriers are bounded (test_wait + nanosleep): a byte count that never arrives sets
``status[cta]`` instead of hanging the GPU.

The models work in natural order (outermost first, as NumPy and ``TensorMap`` write shapes).
"""

import functools

import numpy as np
from numba import cuda

from intrinsics.cluster import cluster_ctarank, cluster_sync, fence_proxy_async_shared
from intrinsics.layout import swizzle_offset_host
from intrinsics.mbarrier import (
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_test_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics.smem import shared_address
from intrinsics.tma import (
    bulk_commit_group,
    bulk_wait_group,
    tensormap_fence_acquire,
    tma_load,
    tma_load_im2col,
    tma_load_multicast,
    tma_prefetch,
    tma_prefetch_descriptor,
    tma_store,
)

THREADS = 128
ALIGN = 1024  # the 128B swizzle pattern repeats every 1024 bytes
POISON = 0xA5  # 0xA5A5A5A5 is a finite float32 (-2.9e-16), distinct from 0 and NaN
SPINS = 1_000_000  # x >= 100 ns: a missing byte fails in well under a minute


# ---------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------

# The coordinate tuple of each rank from an int32 array (its length must be static).
_TUPLES = {
    1: cuda.jit(device=True, inline="always")(lambda c: (c[0],)),
    2: cuda.jit(device=True, inline="always")(lambda c: (c[0], c[1])),
    3: cuda.jit(device=True, inline="always")(lambda c: (c[0], c[1], c[2])),
    4: cuda.jit(device=True, inline="always")(lambda c: (c[0], c[1], c[2], c[3])),
    5: cuda.jit(device=True, inline="always")(lambda c: (c[0], c[1], c[2], c[3], c[4])),
}
# im2col offsets, one 16-bit value per spatial dimension.
_OFFSETS = {
    3: cuda.jit(device=True, inline="always")(lambda o: (np.uint16(o[0]),)),
    4: cuda.jit(device=True, inline="always")(lambda o: (np.uint16(o[0]), np.uint16(o[1]))),
    5: cuda.jit(device=True, inline="always")(
        lambda o: (np.uint16(o[0]), np.uint16(o[1]), np.uint16(o[2]))),
}


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
# Kernels, one per rank
# ---------------------------------------------------------------------------------------------


@functools.cache
def load_kernel(rank, prefetch=False):
    """``kernel(tmap, coords, nbytes, out, status)``: one ``tma_load`` of the box at ``coords``
    (``int32[rank]``, innermost first) into a 1024-aligned base, dumped to ``out``; with
    ``prefetch`` a ``tma_prefetch`` of the same box first."""
    coords_of = _TUPLES[rank]

    @cuda.jit
    def kernel(tmap, coords, nbytes, out, status):
        dyn = cuda.shared.array(0, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        pad = _aligned(dyn)
        _poison(dyn, pad, nbytes)
        _init_barrier(bars)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tensormap_fence_acquire(tmap)
            if prefetch:
                tma_prefetch(tmap, coords_of(coords))
            mbarrier_arrive_expect_tx(bars, 0, nbytes)
            tma_load(dyn, pad, tmap, coords_of(coords), bars, 0)
        _wait(bars, status, 0)
        _dump(dyn, pad, nbytes, out)

    return kernel


@functools.cache
def footprint_kernel(rank):
    """``kernel(tmap, coords, expect, region, out, status)``: like :func:`load_kernel`, but the
    barrier expects ``expect`` bytes while ``region`` bytes (at least the box's, generously more)
    are poisoned before the load and all dumped to ``out`` -- where the box's bytes landed, and
    whether any landed beyond the box's dense size (scripts/tma_rules.py, op 'footprint')."""
    coords_of = _TUPLES[rank]

    @cuda.jit
    def kernel(tmap, coords, expect, region, out, status):
        dyn = cuda.shared.array(0, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        pad = _aligned(dyn)
        _poison(dyn, pad, region)
        _init_barrier(bars)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tensormap_fence_acquire(tmap)
            mbarrier_arrive_expect_tx(bars, 0, expect)
            tma_load(dyn, pad, tmap, coords_of(coords), bars, 0)
        _wait(bars, status, 0)
        _dump(dyn, pad, region, out)

    return kernel


@functools.cache
def multicast_kernel(rank):
    """``kernel(tmap, coords, axis, step, nbytes, out, status)`` on a cluster of n CTAs: CTA r
    loads the box at ``coords`` + ``r * step`` on coordinate ``axis`` (innermost first) into
    offset ``r * nbytes`` of every CTA of the cluster; each CTA dumps all n boxes to
    ``out[r]`` (``(n, n * nbytes)`` bytes)."""
    coords_of = _TUPLES[rank]

    @cuda.jit
    def kernel(tmap, coords, axis, step, nbytes, out, status):
        dyn = cuda.shared.array(0, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        here = cuda.local.array(5, np.int32)
        rank_ = cluster_ctarank()
        ctas = out.shape[0]
        pad = _aligned(dyn)  # the same offset in every CTA (same kernel, same layout)
        _poison(dyn, pad, ctas * nbytes)
        _init_barrier(bars)
        cuda.syncthreads()
        cluster_sync()  # every barrier initialised (and poison written) before any CTA loads
        if cuda.threadIdx.x == 0:
            for i in range(coords.size):
                here[i] = coords[i]
            here[axis] += rank_ * step
            mbarrier_arrive_expect_tx(bars, 0, ctas * nbytes)  # own box + every peer's
            tensormap_fence_acquire(tmap)
            tma_load_multicast(dyn, pad + rank_ * nbytes, tmap, coords_of(here), bars, 0,
                               (1 << ctas) - 1)
        _wait(bars, status, rank_)
        for i in range(cuda.threadIdx.x, ctas * nbytes, cuda.blockDim.x):
            out[rank_, i] = dyn[pad + i]
        cluster_sync()  # no CTA exits while a peer's multicast may still write into it

    return kernel


@functools.cache
def store_kernel(rank):
    """``kernel(tmap, coords, image, nbytes)``: the threads write ``image`` (the box's
    shared-memory image, swizzled as the map says) to a 1024-aligned base; one ``tma_store``."""
    coords_of = _TUPLES[rank]

    @cuda.jit
    def kernel(tmap, coords, image, nbytes):
        dyn = cuda.shared.array(0, np.uint8)
        pad = _aligned(dyn)
        for i in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
            dyn[pad + i] = image[i]
        fence_proxy_async_shared()  # the TMA store (async proxy) reads what the threads wrote
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tensormap_fence_acquire(tmap)
            tma_store(tmap, coords_of(coords), dyn, pad)
            bulk_commit_group()
            bulk_wait_group(0)

    return kernel


@functools.cache
def im2col_kernel(rank):
    """``kernel(tmap, coords, offsets, nbytes, out, status)``: one ``tma_load_im2col``
    (``offsets``: ``int32[rank - 2]``, innermost first), dumped to ``out``."""
    coords_of = _TUPLES[rank]
    offsets_of = _OFFSETS[rank]

    @cuda.jit
    def kernel(tmap, coords, offsets, nbytes, out, status):
        dyn = cuda.shared.array(0, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        pad = _aligned(dyn)
        _poison(dyn, pad, nbytes)
        _init_barrier(bars)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_arrive_expect_tx(bars, 0, nbytes)
            tensormap_fence_acquire(tmap)
            tma_load_im2col(dyn, pad, tmap, coords_of(coords), offsets_of(offsets), bars, 0)
        _wait(bars, status, 0)
        _dump(dyn, pad, nbytes, out)

    return kernel


@functools.cache
def prefetch_kernel(rank):
    """``kernel(tmap, coords, out)``: one ``tma_prefetch`` (nothing lands), then ``out[0] = 1``."""
    coords_of = _TUPLES[rank]

    @cuda.jit
    def kernel(tmap, coords, out):
        if cuda.threadIdx.x == 0:
            tensormap_fence_acquire(tmap)
            tma_prefetch(tmap, coords_of(coords))
            out[0] = 1

    return kernel


@cuda.jit
def descriptor_prefetch_kernel(tmap, out):
    """``prefetch.tensormap`` of a map in global memory, then ``out[0] = 1``."""
    if cuda.threadIdx.x == 0:
        tma_prefetch_descriptor(tmap)
        out[0] = 1


# ---------------------------------------------------------------------------------------------
# Host side: data, models, checks
# ---------------------------------------------------------------------------------------------


def device_coords(start):
    """Natural-order start (outermost first) -> the kernels' int32 coordinates (innermost
    first)."""
    return np.array(tuple(start)[::-1], dtype=np.int32)


def random_tensor(gen, shape, dtype):
    """Fresh random data: normal floats, bf16 as the top half of float32 bits (uint16), or
    integers over the whole range."""
    if dtype in (np.float32, np.float16, "float32", "float16"):
        return gen.standard_normal(shape).astype(dtype)
    if dtype == "bf16":
        return (gen.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(
            np.uint16)
    return gen.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


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
    """Shared-memory image of a C-order tile under TMA swizzle ``mode``: every 16-byte chunk at
    logical byte offset L lands at swizzle_offset_host(L, mode) (tile base 1024-aligned)."""
    flat = np.ascontiguousarray(tile).view(np.uint8).reshape(-1)
    phys = swizzle_offset_host(np.arange(flat.size, dtype=np.int64), mode)
    out = np.empty_like(flat)
    out[phys] = flat
    return out


def unswizzle_bytes(image, mode):
    """The inverse of :func:`swizzle_bytes`: the dense C-order bytes of a box image."""
    image = np.asarray(image, dtype=np.uint8).reshape(-1)
    return image[swizzle_offset_host(np.arange(image.size, dtype=np.int64), mode)]


def is_nan_bits(values, dtype):
    """NaN test on an array of ``dtype`` ('bf16' arrays hold uint16 bits)."""
    if dtype == "bf16":
        bits = np.asarray(values).view(np.uint16)
        return ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
    return np.isnan(np.asarray(values))


def compare_box(got, want, inside, fill, dtype):
    """None when ``got`` (the box, natural shape) holds ``want`` bit for bit inside the tensor
    and the fill outside ('zero': all bits 0, 'nan': any NaN); otherwise a sentence naming how
    many elements differ and the first of them."""
    bits = got.view(f"u{got.itemsize}")
    wbits = want.view(f"u{want.itemsize}")
    bad = inside & (bits != wbits)
    if fill == "nan":
        bad |= ~inside & ~is_nan_bits(got, dtype)
    else:
        bad |= ~inside & (bits != 0)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = "inside" if inside[first] else f"outside (fill {fill})"
    return (f"{int(bad.sum())} of {bad.size} elements wrong; first at box index {first} "
            f"({where}): got bits {int(bits[first]):#x}, want {int(wbits[first]):#x}")


def im2col_model(tensor, coords, offsets, lower, upper, pixels, channels, fill):
    """The (pixels, channels) rows one im2col load writes, and the in-bounds mask, from the PTX
    ISA's description (5.5.4): the filter bases walk the padded bounding box -- per spatial
    dimension from ``lower`` to ``size - 1 + upper`` (natural order, as ``TensorMap.im2col``
    takes them) -- in raster order (W fastest, then H, D, then the next image), starting at the
    instruction's (n, spatial) coordinates; each row is the pixel at base + ``offsets`` and the
    ``channels`` channels from the C coordinate on.  ``coords`` / ``offsets`` innermost first,
    as the instruction takes them; traversal strides 1."""
    inner = [int(c) for c in coords]
    c0, n0, base = inner[0], inner[-1], inner[1:-1][::-1]  # base: natural (d,) (h,) w
    offs = [int(o) for o in offsets][::-1]
    sizes = tensor.shape[1:-1]
    ranges = [range(lo, n + up) for lo, n, up in zip(lower, sizes, upper)]
    grid = [(n, *pos) for n in range(n0, n0 + pixels + 1)
            for pos in np.ndindex(*[len(r) for r in ranges])]
    grid = [(n, *(r[p] for r, p in zip(ranges, pos))) for n, *pos in grid]
    first = grid.index((n0, *base))
    out = np.full((pixels, channels), fill, dtype=tensor.dtype)
    mask = np.zeros((pixels, channels), dtype=bool)
    chan = c0 + np.arange(channels)
    c_ok = (chan >= 0) & (chan < tensor.shape[-1])
    for row, (n, *pos) in enumerate(grid[first: first + pixels]):
        at = (n, *(p + o for p, o in zip(pos, offs)))
        if all(0 <= i < s for i, s in zip(at, tensor.shape[:-1])):
            out[row, c_ok] = tensor[at][chan[c_ok]]
            mask[row, c_ok] = True
    return out, mask
