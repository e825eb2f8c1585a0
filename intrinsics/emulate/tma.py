"""Emulation of intrinsics.tma: tensor copies (tile and im2col mode) through a TensorMap, the
tensor prefetch, plain bulk copies, bulk groups and the descriptor fence / prefetch.

The tensor map.  Under the simulator ``TensorMap.tiled`` checks every documented rule but calls no
driver; ``tmap.device`` is a simulator array of 16 words that carries the TensorMap
(:func:`device_tensormap`), so the emulated instructions find its parameters and source array.

The box model (PTX ISA 5.5, "Tensors"; 9.7.9.25.5.1, cp.async.bulk.tensor), natural order
(outermost first) as TensorMap keeps it; the instruction's coordinates are innermost first:

- element ``i`` of box dimension ``d`` is tensor element ``start[d] + i * element_strides[d]``
  for ``i < TensorMap.smem_box[d]`` (the innermost element stride counts only with interleave);
- outside ``0 <= index < shape[d]`` in any dimension, a load writes the fill -- zero bytes, or
  with ``oob_fill='nan'`` the canonical NaN of the type (all bits but the sign set; the hardware
  only promises "a NaN") -- and a store writes nothing;
- shared memory holds the box in C order (the innermost dimension contiguous, rows of
  ``smem_box[-1] * element size`` bytes, one every ``smem_row_pitch`` bytes: densely packed
  unless ``intrinsics.tensormap.SMEM_ROW_MODEL`` says narrow rows take the whole swizzle span,
  which the H200 probes are to decide), and logical byte ``L`` of that layout lives at
  ``dst + swizzle_offset_host(L, swizzle)``.  The pattern is a function of the shared address
  bits (PTX ISA 9.7.9.27.5), so the box must start at a multiple of its repeat (256 / 512 /
  1024 bytes for 32B / 64B / 128B) and of 128 bytes in any case; otherwise EmulationError.

Where a copy may start: every tensor copy (load, multicast load, store, im2col load, prefetch)
is held to the 16-byte rule the H200 showed (``intrinsics.tensormap.start_problem``: the
innermost coordinate times the element size, im2col's channel coordinate, a multiple of 16
bytes); a store also to no negative coordinate (a store before the tensor faulted there).  A
start that breaks it is an EmulationError naming the block and thread, the coordinates, the byte
offset and the rule -- on the GPU it is CUDA_ERROR_ILLEGAL_INSTRUCTION, which poisons the
context.

Loads copy at issue and then perform complete_tx of ``TensorMap.box_bytes`` on the mbarrier at
the barrier operand's shared address -- in every CTA of ``cta_mask`` for multicast, which also
writes the box at the same shared offset in each of them.  A peer's barrier must exist
(initialised and made visible with a cluster barrier before the copy).

Stores (``tma_store``, ``bulk_copy_s2g``) are performed at issue: the async proxy reads shared
memory then (``SharedSpace.check_async_read``: bytes a thread stored without a following
``fence.proxy.async`` are an EmulationError) and writes global memory.  The thread's bulk group
remembers what was read; the wait that completes the group (``bulk_wait_group`` or
``bulk_wait_group_read``) checks that those shared bytes are unchanged, since the hardware may
read them as late as that wait -- overwriting the source earlier is an EmulationError.

im2col loads follow the PTX ISA's description (5.5.4; see ``tma_load_im2col``); the H200 agreed
on every im2col probe of ``scripts/tma_rules.py`` and tests/gpu/test_tma_gpu.py.  Not
emulated (NotImplementedError naming the reason): interleaved maps, the packed
sub-byte types and the tf32 / ftz types (whose conversions the hardware applies).
"""

import threading

import numpy as np

from intrinsics.emulate import memory
from intrinsics.emulate.cluster import peer_block
from intrinsics.emulate.mbarrier import barrier_address, complete_tx
from intrinsics.emulate.runtime import EmulationError, current
from intrinsics.layout.swizzle import swizzle_offset_host
from intrinsics.tensormap import smem_row_pitch, start_problem

__all__ = ["TensorMapWords", "device_tensormap"]

TENSOR_ALIGN = 128  # shared-memory box address (PTX ISA 9.7.9.25.5.1)
BULK_ALIGN = 16  # cp.async.bulk addresses and sizes (9.7.9.25.4.1)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Bits of the NaN the out-of-bounds fill writes, per TMA type.
_NAN_BITS = {"f16": 0x7FFF, "bf16": 0x7FFF, "f32": 0x7FFFFFFF, "f64": 0x7FFFFFFFFFFFFFFF}
_CONVERTING_TYPES = ("f32_ftz", "tf32", "tf32_ftz")


# ---------------------------------------------------------------------------------------------
# The tensor map on the device
# ---------------------------------------------------------------------------------------------


class TensorMapWords(np.ndarray):
    """The 16 ``uint64`` words of a tensor map under the simulator, carrying the TensorMap."""

    tensormap = None

    def __array_finalize__(self, obj):
        self.tensormap = getattr(obj, "tensormap", None)


def device_tensormap(tmap):
    """``TensorMap.device`` under the simulator: a simulator device array (uint64[16])."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    words = np.zeros(16, dtype=np.uint64).view(TensorMapWords)
    words.tensormap = tmap
    return FakeCUDAArray(words)


def _tensormap(thread, tmap, op):
    from intrinsics.grid_constant import TensorMapParam

    if isinstance(tmap, TensorMapParam):  # TensorMap.param: the map passed by value
        return tmap.tensormap
    array = memory.host_array(tmap)
    tm = getattr(array, "tensormap", None)
    if tm is None:
        raise EmulationError(
            f"{thread.where()}: {op}: the tensor map operand must be TensorMap.param or "
            f"TensorMap.device, got a "
            f"{array.dtype}{list(array.shape)} array that carries no TensorMap"
        )
    return tm


def _check_map(thread, tm, op, mode="tiled"):
    if tm.mode != mode:
        raise EmulationError(f"{thread.where()}: {op}: needs a {mode} tensor map, got {tm!r}")
    why = None
    if tm.interleave:
        why = f"interleaved maps ({tm.interleave}B interleave)"
    elif tm.dtype.packed:
        why = f"the packed type {tm.dtype.name}"
    elif tm.dtype.name in _CONVERTING_TYPES:
        why = f"the {tm.dtype.name} type (the copy converts the values; use 'f32')"
    if why:
        raise NotImplementedError(f"{thread.where()}: {op}: the emulation does not model {why}")


def _source(thread, tm, op):
    """The NumPy array behind the tensor map."""
    if tm.tensor is None:
        raise EmulationError(
            f"{thread.where()}: {op}: the tensor map was built from a raw pointer; the emulation "
            "needs the array (TensorMap.tiled(array, ...))"
        )
    array = memory.host_array(tm.tensor)
    if tuple(array.shape) != tuple(tm.shape) or array.itemsize * 8 != tm.dtype.bits:
        raise EmulationError(f"{thread.where()}: {op}: the source array {array.dtype}"
                             f"{list(array.shape)} does not match {tm!r}")
    return array


def _s32(value):
    return (int(value) + 2**31) % 2**32 - 2**31


def _box(thread, tm, coords, op):
    """Tensor indices per dimension of the box at ``coords`` and the in-bounds mask (natural
    order)."""
    coords = tuple(coords)
    if len(coords) != tm.rank:
        raise EmulationError(f"{thread.where()}: {op}: {len(coords)} coordinates for a rank-"
                             f"{tm.rank} tensor map")
    start = [_s32(c) for c in coords][::-1]
    strides = list(tm.element_strides)
    if tm.interleave == 0:
        strides[-1] = 1
    box = tm.smem_box
    index = [s + e * np.arange(b, dtype=np.int64) for s, e, b in zip(start, strides, box)]
    mask = np.ones(box, dtype=bool)
    for axis, (i, n) in enumerate(zip(index, tm.shape)):
        shape = [1] * len(box)
        shape[axis] = box[axis]
        mask &= ((i >= 0) & (i < n)).reshape(shape)
    return index, mask


def _check_start(thread, tm, coords, op, kind="load"):
    """The rule on the box's start (``start_problem``: the 16-byte rule; stores: no negative
    coordinate), or an EmulationError."""
    coords = tuple(_s32(c) for c in coords)
    problem = start_problem(tm.dtype, coords, tm.mode, kind)
    if problem is not None:
        raise EmulationError(
            f"{thread.where()}: {op}: the box at coords {coords} (innermost first) would fault "
            f"on the GPU: {problem}"
        )


def _image(thread, tm, address, nbytes, op):
    """Shared offsets (from ``address``) of the box image's bytes 0..nbytes-1: rows of
    ``tm.smem_row_bytes`` at the pitch :func:`intrinsics.tensormap.smem_row_pitch` gives, then
    swizzled."""
    swizzle = tm.swizzle
    repeat = 8 * swizzle
    if address % TENSOR_ALIGN or (repeat and address % repeat):
        need = (f"{repeat} bytes (the {swizzle}B swizzle pattern's repeat)" if repeat
                else "128 bytes")
        raise EmulationError(
            f"{thread.where()}: {op}: the shared-memory box at address {address:#x} is not "
            f"aligned to {need}"
        )
    dense = np.arange(nbytes, dtype=np.int64)
    inner = tm.smem_row_bytes
    pitch = smem_row_pitch(inner, swizzle)
    return swizzle_offset_host(dense // inner * pitch + dense % inner, swizzle)


def _shared(thread, block, address, nbytes, op):
    try:
        return block.shared.bytes(address, nbytes)
    except EmulationError as exc:
        raise EmulationError(f"{thread.where()}: {op}: {exc}") from None


def _rank_ptx(copy, rank):
    from intrinsics.tma import TENSOR_COPIES

    return TENSOR_COPIES[copy].ptx(rank)


# ---------------------------------------------------------------------------------------------
# Tensor loads
# ---------------------------------------------------------------------------------------------


def _load_image(thread, tm, coords, op):
    """The box's shared-memory image before the swizzle (uint8, C order)."""
    source = _source(thread, tm, op)
    index, mask = _box(thread, tm, coords, op)
    clipped = [np.clip(i, 0, n - 1) for i, n in zip(index, tm.shape)]
    bits = np.ascontiguousarray(source[np.ix_(*clipped)]).view(_UINT[source.itemsize])
    bits[~mask] = _NAN_BITS[tm.dtype.name] if tm.oob_fill == "nan" else 0
    image = bits.reshape(-1).view(np.uint8)
    assert image.size == tm.box_bytes
    return image


def _load(copy, dst, dst_index, tmap, coords, bars, bar_index, cta_mask=None):
    thread = current()
    op = _rank_ptx(copy, len(tuple(coords)))
    tm = _tensormap(thread, tmap, op)
    _check_map(thread, tm, op)
    address = memory.shared_address(dst, dst_index)
    bar = barrier_address(op, bars, bar_index)
    image = _load_image(thread, tm, coords, op)
    _check_start(thread, tm, coords, op)
    offsets = _image(thread, tm, address, image.size, op)
    if cta_mask is None:
        targets = [thread.block]
    else:
        mask = int(cta_mask) & 0xFFFF
        if not mask:
            raise EmulationError(f"{thread.where()}: {op}: cta_mask is 0: no CTA receives the box")
        targets = [peer_block(thread, r, op) for r in range(16) if mask >> r & 1]
    for block in targets:
        _shared(thread, block, address, int(offsets.max()) + 1, op)[offsets] = image
    for block in targets:
        complete_tx(thread, block, bar, image.size, op)


def tma_load(dst, dst_index, tmap, coords, bars, bar_index):
    _load("tma_load", dst, dst_index, tmap, coords, bars, bar_index)


def tma_load_multicast(dst, dst_index, tmap, coords, bars, bar_index, cta_mask):
    _load("tma_load_multicast", dst, dst_index, tmap, coords, bars, bar_index, cta_mask)


def _im2col_pixels(tm, coords):
    """The (n, spatial...) positions of the filter base for the load's pixels, and the channel
    start.  PTX ISA 5.5.4 (im2col mode): the bounding box in each spatial dimension runs from
    ``lower_corner`` to ``size - 1 + upper_corner`` (inclusive), in steps of that dimension's
    traversal stride; the instruction's spatial coordinates give the first filter base, N and C
    coordinates start offsets as in tile mode; pixels are walked W fastest, then H, then D, and
    past the box's last position into the next image (N + 1)."""
    inner = [_s32(c) for c in coords]  # innermost first: C, W, (H, (D,)) N
    c0, n0, base = inner[0], inner[-1], inner[1:-1]
    sizes = list(tm.shape[::-1][1:-1])  # W, H, D
    lower = list(tm.lower_corner[::-1])
    upper = list(tm.upper_corner[::-1])
    steps = list(tm.element_strides[::-1][1:-1])
    pixels = []
    n, pos = n0, list(base)
    for _ in range(tm.pixels_per_column):
        pixels.append((n, tuple(pos)))
        for i in range(len(pos)):
            pos[i] += steps[i]
            if pos[i] <= sizes[i] - 1 + upper[i]:
                break
            pos[i] = lower[i]
        else:
            n += 1
    return c0, pixels


def tma_load_im2col(dst, dst_index, tmap, coords, offsets, bars, bar_index):
    """Modelled from the PTX ISA's text and examples (5.5.4, im2col mode).  The old claim that
    im2col could not run on the H200 came from probes with an unaligned innermost start; the
    model is to be checked there by tests/gpu/test_tma_gpu.py and scripts/tma_rules.py.  The
    channel coordinate is the innermost start the 16-byte rule applies to."""
    thread = current()
    op = _rank_ptx("tma_load_im2col", len(tuple(coords)))
    tm = _tensormap(thread, tmap, op)
    _check_map(thread, tm, op, mode="im2col")
    if len(tuple(coords)) != tm.rank or len(tuple(offsets)) != tm.rank - 2:
        raise EmulationError(f"{thread.where()}: {op}: a rank-{tm.rank} im2col map takes "
                             f"{tm.rank} coordinates and {tm.rank - 2} offsets")
    _check_start(thread, tm, coords, op)
    source = _source(thread, tm, op)
    address = memory.shared_address(dst, dst_index)
    bar = barrier_address(op, bars, bar_index)
    offs = [int(o) & 0xFFFF for o in offsets]  # innermost first: W, H, D
    c0, pixels = _im2col_pixels(tm, coords)
    cpp = tm.channels_per_pixel
    uint = _UINT[source.itemsize]
    bits = np.zeros((len(pixels), cpp), dtype=uint)
    fill = _NAN_BITS[tm.dtype.name] if tm.oob_fill == "nan" else 0
    channels = c0 + np.arange(cpp)
    c_ok = (channels >= 0) & (channels < tm.shape[-1])
    for row, (n, base) in enumerate(pixels):
        spatial = [b + o for b, o in zip(base, offs)][::-1]  # natural order: (D,) (H,) W
        at = (n, *spatial)
        inside = all(0 <= i < size for i, size in zip(at, tm.shape[:-1]))
        bits[row] = fill
        if inside:
            bits[row, c_ok] = source[at].view(uint)[channels[c_ok]]
    image = bits.reshape(-1).view(np.uint8)
    shared_offsets = _image(thread, tm, address, image.size, op)
    _shared(thread, thread.block, address, int(shared_offsets.max()) + 1, op)[shared_offsets] = image
    complete_tx(thread, thread.block, bar, image.size, op)


# ---------------------------------------------------------------------------------------------
# Stores and bulk groups
# ---------------------------------------------------------------------------------------------


class _Read:
    """What an issued bulk store read from shared memory, checked again at its group's wait."""

    def __init__(self, block, address, offsets, data, op):
        self.block, self.address, self.offsets, self.data, self.op = (
            block, address, offsets, data, op)

    def verify(self, thread, wait):
        now = self.block.shared.memory[self.address + self.offsets]
        changed = np.flatnonzero(now != self.data)
        if changed.size:
            at = self.address + int(self.offsets[changed[0]])
            raise EmulationError(
                f"{thread.where()}: {wait}: the shared memory that {self.op} reads was "
                f"overwritten (first at shared address {at:#x}) before this wait; the copy may "
                "read its source until bulk_wait_group_read says it has finished"
            )


def _bulk():
    return current().state.setdefault("bulk", {"pending": [], "groups": []})


def _read_shared(thread, address, offsets, op):
    span = int(offsets.max()) + 1
    thread.block.shared.check_async_read(address, span, op, thread)
    data = _shared(thread, thread.block, address, span, op)[offsets].copy()
    _bulk()["pending"].append(_Read(thread.block, address, offsets, data, op))
    return data


def tma_store(tmap, coords, src, src_index):
    thread = current()
    op = _rank_ptx("tma_store", len(tuple(coords)))
    tm = _tensormap(thread, tmap, op)
    _check_map(thread, tm, op)
    address = memory.shared_address(src, src_index)
    target = _source(thread, tm, op)
    index, mask = _box(thread, tm, coords, op)
    _check_start(thread, tm, coords, op, "store")
    image = _read_shared(thread, address, _image(thread, tm, address, tm.box_bytes, op),
                         op)
    values = image.view(_UINT[target.itemsize]).reshape(mask.shape)
    inside = np.nonzero(mask)
    target.view(_UINT[target.itemsize])[tuple(i[p] for i, p in zip(index, inside))] = (
        values[inside])


def _check_bulk(thread, op, nbytes, shared, global_view):
    if nbytes <= 0 or nbytes % BULK_ALIGN:
        raise EmulationError(f"{thread.where()}: {op}: the byte count must be a positive multiple "
                             f"of 16, got {nbytes}")
    if shared % BULK_ALIGN:
        raise EmulationError(f"{thread.where()}: {op}: shared address {shared:#x} is not 16-byte "
                             "aligned")
    if global_view.__array_interface__["data"][0] % BULK_ALIGN:
        raise EmulationError(f"{thread.where()}: {op}: the global address is not 16-byte aligned")


def _global(thread, array, index, nbytes, op):
    try:
        return memory.global_bytes(array, index, nbytes)
    except EmulationError as exc:
        raise EmulationError(f"{thread.where()}: {op}: {exc}") from None


def bulk_copy_g2s(dst, dst_index, src, src_index, nbytes, bars, bar_index):
    from intrinsics.tma import BULK_COPIES

    thread = current()
    op = BULK_COPIES["bulk_copy_g2s"].ptx
    nbytes = int(nbytes)
    address = memory.shared_address(dst, dst_index)
    source = _global(thread, src, src_index, max(nbytes, 0), op)
    _check_bulk(thread, op, nbytes, address, source)
    bar = barrier_address(op, bars, bar_index)
    _shared(thread, thread.block, address, nbytes, op)[:] = source
    complete_tx(thread, thread.block, bar, nbytes, op)


def bulk_copy_s2s_cluster(dst, dst_index, src, src_index, nbytes, bars, bar_index, cta_rank):
    from intrinsics.tma import BULK_COPIES

    thread = current()
    op = BULK_COPIES["bulk_copy_s2s_cluster"].ptx
    nbytes = int(nbytes)
    source = memory.shared_address(src, src_index)
    target = memory.shared_address(dst, dst_index)
    if nbytes <= 0 or nbytes % BULK_ALIGN:
        raise EmulationError(f"{thread.where()}: {op}: the byte count must be a positive multiple "
                             f"of 16, got {nbytes}")
    for what, address in (("source", source), ("destination", target)):
        if address % BULK_ALIGN:
            raise EmulationError(f"{thread.where()}: {op}: {what} shared address {address:#x} is "
                                 "not 16-byte aligned")
    peer = peer_block(thread, cta_rank, op)
    bar = barrier_address(op, bars, bar_index)
    # completes on the receiver's mbarrier (not in a bulk group): read the source now
    thread.block.shared.check_async_read(source, nbytes, op, thread)
    data = _shared(thread, thread.block, source, nbytes, op).copy()
    _shared(thread, peer, target, nbytes, op)[:] = data
    complete_tx(thread, peer, bar, nbytes, op)


def _shared_to_global(name, dst, dst_index, src, src_index, nbytes):
    """(global bytes, the shared bytes read) of a bulk store or reduction: the checks, and the
    async-proxy read that its group's wait checks again."""
    from intrinsics.tma import BULK_COPIES

    thread = current()
    op = BULK_COPIES[name].ptx
    nbytes = int(nbytes)
    address = memory.shared_address(src, src_index)
    target = _global(thread, dst, dst_index, max(nbytes, 0), op)
    _check_bulk(thread, op, nbytes, address, target)
    return target, _read_shared(thread, address, np.arange(nbytes, dtype=np.int64), op)


def bulk_copy_s2g(dst, dst_index, src, src_index, nbytes):
    target, data = _shared_to_global("bulk_copy_s2g", dst, dst_index, src, src_index, nbytes)
    target[:] = data


#: the reductions' read-modify-write: the threads of a block (and the blocks of a cluster) run
#: together, and the hardware adds each element atomically
_REDUCE_LOCK = threading.Lock()


def bulk_reduce_add_f32(dst, dst_index, src, src_index, nbytes):
    """Performed at issue, as the stores: the shared float32 values are added into global
    memory in float32 (round to nearest, each element once, under a lock)."""
    target, data = _shared_to_global("bulk_reduce_add_f32", dst, dst_index, src, src_index,
                                     nbytes)
    acc = target.view(np.float32)
    with _REDUCE_LOCK:
        acc[:] = acc + data.view(np.float32)


def bulk_commit_group():
    queue = _bulk()
    queue["groups"].append(queue["pending"])
    queue["pending"] = []


def _wait_groups(n, wait):
    thread = current()
    n = int(n)
    if n < 0:
        raise EmulationError(f"{thread.where()}: {wait}: N must be >= 0, got {n}")
    queue = _bulk()
    while len(queue["groups"]) > n:
        for read in queue["groups"].pop(0):
            read.verify(thread, f"{wait} {n}")


def bulk_wait_group(n):
    _wait_groups(n, "cp.async.bulk.wait_group")


def bulk_wait_group_read(n):
    _wait_groups(n, "cp.async.bulk.wait_group.read")


# ---------------------------------------------------------------------------------------------
# Descriptor fence and prefetch
# ---------------------------------------------------------------------------------------------


def tensormap_fence_acquire(tmap):
    thread = current()
    _tensormap(thread, tmap, "fence.proxy.tensormap::generic.acquire.sys")


def tma_prefetch_descriptor(tmap):
    thread = current()
    _tensormap(thread, tmap, "prefetch.tensormap")


def tma_prefetch(tmap, coords):
    """A hint to L2: checks the map, the coordinates and the 16-byte rule; moves nothing."""
    thread = current()
    op = _rank_ptx("tma_prefetch", len(tuple(coords)))
    tm = _tensormap(thread, tmap, op)
    _check_map(thread, tm, op)
    _source(thread, tm, op)
    _box(thread, tm, coords, op)
    _check_start(thread, tm, coords, op)


EMULATIONS = {
    "bulk_commit_group": bulk_commit_group,
    "bulk_copy_g2s": bulk_copy_g2s,
    "bulk_copy_s2g": bulk_copy_s2g,
    "bulk_copy_s2s_cluster": bulk_copy_s2s_cluster,
    "bulk_reduce_add_f32": bulk_reduce_add_f32,
    "bulk_wait_group": bulk_wait_group,
    "bulk_wait_group_read": bulk_wait_group_read,
    "tensormap_fence_acquire": tensormap_fence_acquire,
    "tma_load": tma_load,
    "tma_load_im2col": tma_load_im2col,
    "tma_load_multicast": tma_load_multicast,
    "tma_prefetch": tma_prefetch,
    "tma_prefetch_descriptor": tma_prefetch_descriptor,
    "tma_store": tma_store,
}
