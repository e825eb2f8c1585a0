"""Tensor Memory Accelerator (TMA) and bulk copies, device side: ``cp.async.bulk.tensor``,
``cp.async.bulk``, their completion groups and ``prefetch.tensormap`` (PTX ISA 9.7.9.25.4,
"Bulk copy"; 9.7.9.25.5, "Tensor copy"; 9.7.9.25.6, "Bulk and Tensor copy completion
instructions"; 9.7.9.15, "prefetch"; tensors and tensor maps in 5.5, "Tensors").

One thread issues each copy; the TMA unit moves the whole box.  Build the tensor map on the
host with :class:`intrinsics.tensormap.TensorMap` and pass it to the kernel by value,
``tmap.param`` (as CUDA C++'s ``__grid_constant__`` parameter, :mod:`intrinsics.grid_constant`;
launch with :func:`intrinsics.launch.launch`), or as ``tmap.device`` (a ``uint64[:]`` copy in
device memory, which numba's own launch can pass).  A load completes on an mbarrier, a store on a bulk group::

    # prologue: one thread initialises the barrier (intrinsics.mbarrier)
    if tid == 0:
        mbarrier_arrive_expect_tx(bars, 0, TILE_BYTES)       # tmap.box_bytes on the host
        tma_load(smem, 0, tmap, (col, row), bars, 0)         # coords innermost first
    mbarrier_wait_parity(bars, 0, 0)

    fence_proxy_async_shared()                               # generic writes -> async proxy
    cuda.syncthreads()
    if tid == 0:
        tma_store(tmap, (col, row), smem, 0)
        bulk_commit_group()
        bulk_wait_group(0)

Conventions:

- Coordinates are a tuple of 1..5 integers (cast to ``.s32``), innermost dimension first, as in
  PTX: ``(col, row)`` for a row-major matrix.  They may be negative or run past the end: loads
  fill the outside with zeros (or NaN), stores drop it.
- The 16-byte rule: the innermost coordinate times the element size (im2col: the channel
  coordinate) must be a multiple of 16 bytes, negative ones included.  NOTE: measured on the
  lent H200 (driver 580.159.04) for a 2-d float32 tile load, box 16x16, no swizzle: innermost
  starts of 0, 16, 32 and -16 bytes ran exactly, 12, 4 and 360 bytes raised
  CUDA_ERROR_ILLEGAL_INSTRUCTION (which poisons the context); ``scripts/tma_rules.py`` measured
  the same for every form, element size, swizzle and rank (docs/TMA.md).  The emulation holds
  every copy to it (``intrinsics.tensormap.start_problem``) and ``TensorMap.check_start``
  checks a start known on the host.  Stores: no negative coordinate either (every store with
  one faulted on the H200; stores past the far end are clipped).
- Shared-memory operands are an array and an element index (a shared array and its element for
  the data, a ``uint64`` shared array and its element for the mbarrier).  The data address must
  be 128-byte aligned and, with swizzling, aligned to the pattern's repeat (1024 B for 128B);
  numba gives dynamic shared memory ``.align 1``, so align at run time from ``shared_address``.
- The tensor map operand is the ``uint64[:]`` device array; the instruction takes its generic
  address (tensor maps may live in ``.param``, ``.const`` or ``.global`` memory; this one is a
  64-byte-aligned global allocation).
- ``.shared::cluster`` destinations take the CTA's own 32-bit ``.shared::cta`` address, which
  lies inside the cluster window; multicast writes the same offset in every CTA of ``cta_mask``
  and signals the mbarrier at the same offset in each.

Architectures (PTX ISA: all need sm_90 or newer; nvJitLink 13.5 assembles every form for sm_90,
sm_90a, sm_100a and sm_120a -- tests/test_tma_compile.py proves it).  ``.multicast::cluster`` is
legal on all of them but the PTX ISA advises it for sm_90a / sm_100a-family targets, where it is
tuned; elsewhere it "may have substantially reduced performance".
"""

from dataclasses import dataclass

from numba import types
from numba.cuda import cgutils
from numba.cuda.core.errors import NumbaTypeError

from intrinsics import grid_constant
from intrinsics._core import (
    SM90,
    Arch,
    I64,
    asm,
    as_i32,
    check_array,
    check_global,
    check_index,
    check_integer,
    global_address,
    intrinsic,
    literal_value,
    register_list,
    require_arch,
    shared_address,
)

__all__ = [
    "BULK_COPIES",
    "TENSOR_COPIES",
    "BulkCopy",
    "TensorCopy",
    "bulk_commit_group",
    "bulk_copy_g2s",
    "bulk_copy_s2g",
    "bulk_copy_s2s_cluster",
    "bulk_reduce_add_f32",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "tma_load",
    "tma_load_im2col",
    "tma_load_multicast",
    "tma_prefetch",
    "tma_prefetch_descriptor",
    "tensormap_fence_acquire",
    "tma_store",
]

# ---------------------------------------------------------------------------------------------
# Tensor copies: the table
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCopy:
    """One ``cp.async.bulk.tensor`` form.  ``direction`` is 'g2s' (global -> shared, completes
    on an mbarrier), 's2g' (shared -> global, completes in a bulk group) or 'l2' (the prefetch
    into L2, ``cp.async.bulk.prefetch.tensor``: nothing completes); ``mode`` the load mode
    ('tile' or 'im2col'); ``ranks`` the tensor ranks it takes."""

    name: str
    direction: str
    mode: str
    multicast: bool
    ranks: tuple
    arch: Arch

    def ptx(self, rank):
        """The instruction (without operands) for a rank-``rank`` tensor."""
        if self.direction == "s2g":
            return f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group"
        if self.direction == "l2":
            return f"cp.async.bulk.prefetch.tensor.{rank}d.L2.global.{self.mode}"
        mode = ".im2col" if self.mode == "im2col" else ""
        multicast = ".multicast::cluster" if self.multicast else ""
        return (
            f"cp.async.bulk.tensor.{rank}d.shared::cluster.global{mode}"
            f".mbarrier::complete_tx::bytes{multicast}"
        )

    def template(self, rank):
        """(asm template, operand constraints) for a rank-``rank`` tensor.

        Operand order: g2s -- dst (r), tensor map (l), coords (r each), mbarrier (r), im2col
        offsets (h each), cta mask (h); s2g -- tensor map (l), coords (r each), src (r);
        l2 (prefetch) -- tensor map (l), coords (r each).
        """
        if self.direction == "s2g":
            text = f"{self.ptx(rank)} [$0, {register_list(1, rank)}], [${rank + 1}];"
            return text, ["l"] + ["r"] * rank + ["r"]
        if self.direction == "l2":
            return f"{self.ptx(rank)} [$0, {register_list(1, rank)}];", ["l"] + ["r"] * rank
        bar = 2 + rank
        text = f"{self.ptx(rank)} [$0], [$1, {register_list(2, rank)}], [${bar}]"
        constraints = ["r", "l"] + ["r"] * rank + ["r"]
        nxt = bar + 1
        if self.mode == "im2col":
            text += ", " + register_list(nxt, rank - 2)
            constraints += ["h"] * (rank - 2)
            nxt += rank - 2
        if self.multicast:
            text += f", ${nxt}"
            constraints += ["h"]
        return text + ";", constraints


_ALL_RANKS = (1, 2, 3, 4, 5)

TENSOR_COPIES = {
    c.name: c
    for c in [
        #          name                  direction mode     multicast ranks       arch
        TensorCopy("tma_load", "g2s", "tile", False, _ALL_RANKS, SM90),
        TensorCopy("tma_load_multicast", "g2s", "tile", True, _ALL_RANKS, SM90),
        TensorCopy("tma_load_im2col", "g2s", "im2col", False, (3, 4, 5), SM90),
        TensorCopy("tma_store", "s2g", "tile", False, _ALL_RANKS, SM90),
        TensorCopy("tma_prefetch", "l2", "tile", False, _ALL_RANKS, SM90),
    ]
}


# ---------------------------------------------------------------------------------------------
# Typing helpers
# ---------------------------------------------------------------------------------------------


def _check_tmap(name, ty):
    if grid_constant.is_param(ty):
        return
    if not (isinstance(ty, types.Array) and ty.dtype == types.uint64 and ty.ndim == 1):
        raise NumbaTypeError(
            f"{name}: the tensor map must be TensorMap.param (passed by value) or the uint64[:] "
            f"device array from TensorMap.device, got {ty}"
        )


def _check_bars(name, arrty, idxty):
    if not (isinstance(arrty, types.Array) and arrty.dtype == types.uint64):
        raise NumbaTypeError(
            f"{name}: the mbarrier must be a shared uint64 array and an element index, got "
            f"{arrty}"
        )
    check_index(name, arrty, idxty)


def _int_tuple(name, ty, counts, what):
    """The length of a tuple of integers whose length is in ``counts``, or a typing error."""
    ok = (
        isinstance(ty, types.BaseTuple)
        and all(isinstance(t, (types.Integer, types.Boolean)) for t in ty)
        and len(ty) in counts
    )
    if not ok:
        valid = (
            f"{counts[0]}" if len(counts) == 1
            else f"{counts[0]} to {counts[-1]}"
        )
        raise NumbaTypeError(f"{name}: {what} must be a tuple of {valid} integers, got {ty}")
    return len(ty)


def _check_coords(copy, ty):
    return _int_tuple(
        copy.name, ty, copy.ranks,
        "coords (one per tensor dimension, innermost first" + (
            "; im2col needs rank 3, 4 or 5)" if copy.mode == "im2col" else ")"
        ),
    )


def _tmap_address(context, builder, arrty, arr):
    """Generic 64-bit address of the tensor map: of the by-value parameter (its value is that
    address, see intrinsics.grid_constant) or of the array's first word."""
    if grid_constant.is_param(arrty):
        return arr
    ary = context.make_array(arrty)(context, builder, value=arr)
    return builder.ptrtoint(ary.data, I64)


def _cast_all(context, builder, tuple_ty, value, to):
    values = cgutils.unpack_tuple(builder, value, len(tuple_ty))
    return [context.cast(builder, v, t, to) for v, t in zip(values, tuple_ty)]


def _doc(copy, summary, args):
    forms = "\n".join(f"    {copy.template(r)[0]}" for r in copy.ranks)
    section = ("9.7.9.25.5.3, cp.async.bulk.prefetch.tensor" if copy.direction == "l2"
               else "9.7.9.25.5.1, cp.async.bulk.tensor")
    return (
        f"{summary}\n\nEmits, for a tensor of rank N = len(coords) in "
        f"{copy.ranks[0]}..{copy.ranks[-1]} (PTX ISA {section})::\n\n"
        f"{forms}\n\n{args}\n\n{_START_RULE}\n\nNeeds {copy.arch.text}."
    )


_START_RULE = (
    "The innermost coordinate times the element size (im2col: the channel coordinate) must be "
    "a multiple of 16 bytes (the 16-byte rule, see the module docstring and docs/TMA.md: the "
    "H200 raises CUDA_ERROR_ILLEGAL_INSTRUCTION otherwise, for every form measured).  The "
    "emulation refuses a start that breaks it."
)


# ---------------------------------------------------------------------------------------------
# Tensor copies: the intrinsics
# ---------------------------------------------------------------------------------------------


def _lower_g2s(copy, rank, extra):
    """Codegen for the loads; ``extra`` lists which optional operands follow the mbarrier."""
    template, constraints = copy.template(rank)

    def codegen(context, builder, sig, args):
        require_arch(copy.ptx(rank), copy.arch)
        tys = sig.args
        ops = [
            shared_address(context, builder, tys[0], args[0], tys[1], args[1]),
            _tmap_address(context, builder, tys[2], args[2]),
        ]
        ops += _cast_all(context, builder, tys[3], args[3], types.int32)
        i = 4
        offsets = None
        if "offsets" in extra:
            offsets = (tys[i], args[i])
            i += 1
        ops.append(shared_address(context, builder, tys[i], args[i], tys[i + 1], args[i + 1]))
        i += 2
        if offsets is not None:
            ops += _cast_all(context, builder, offsets[0], offsets[1], types.uint16)
        if "mask" in extra:
            ops.append(context.cast(builder, args[i], tys[i], types.uint16))
        asm(builder, template, constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return codegen


def _check_load(copy, dst, dst_index, tmap, coords, bars, bar_index):
    check_array(copy.name, dst, "a shared-memory destination array")
    check_index(copy.name, dst, dst_index)
    _check_tmap(copy.name, tmap)
    rank = _check_coords(copy, coords)
    _check_bars(copy.name, bars, bar_index)
    return rank


_LOAD = TENSOR_COPIES["tma_load"]
_MULTICAST = TENSOR_COPIES["tma_load_multicast"]
_IM2COL = TENSOR_COPIES["tma_load_im2col"]
_STORE = TENSOR_COPIES["tma_store"]


def _tma_load(typingctx, dst, dst_index, tmap, coords, bars, bar_index):
    rank = _check_load(_LOAD, dst, dst_index, tmap, coords, bars, bar_index)
    sig = types.void(dst, dst_index, tmap, coords, bars, bar_index)
    return sig, _lower_g2s(_LOAD, rank, ())


_tma_load.__doc__ = _doc(
    _LOAD,
    "Load one box of the tensor described by ``tmap`` into shared memory; completion is "
    "signalled on the mbarrier ``bars[bar_index]`` as bytes (arm it with "
    "``mbarrier_arrive_expect_tx(bars, bar_index, tmap.box_bytes)``).",
    "``tma_load(dst, dst_index, tmap, coords, bars, bar_index)``: ``dst[dst_index]`` is the "
    "box's first element in shared memory (128-byte aligned; 1024 B for 128B swizzle), "
    "``tmap`` ``TensorMap.param`` (by value) or the ``uint64[:]`` from ``TensorMap.device``, "
    "``coords`` the box's first element, "
    "innermost dimension first.  One thread issues it.",
)
_tma_load.__name__ = "tma_load"
tma_load = intrinsic(_tma_load)
tma_load.spec = _LOAD


def _tma_load_multicast(typingctx, dst, dst_index, tmap, coords, bars, bar_index, cta_mask):
    rank = _check_load(_MULTICAST, dst, dst_index, tmap, coords, bars, bar_index)
    check_integer(_MULTICAST.name, cta_mask, "the CTA mask (16 bits, bit i = CTA rank i)")
    sig = types.void(dst, dst_index, tmap, coords, bars, bar_index, cta_mask)
    return sig, _lower_g2s(_MULTICAST, rank, ("mask",))


_tma_load_multicast.__doc__ = _doc(
    _MULTICAST,
    "Load one box and write it to the same shared-memory offset in every CTA of the cluster "
    "whose bit is set in ``cta_mask``; each of them gets the complete_tx on its mbarrier at "
    "the offset of ``bars[bar_index]``.",
    "``tma_load_multicast(dst, dst_index, tmap, coords, bars, bar_index, cta_mask)``: as "
    "``tma_load``; ``cta_mask`` is a 16-bit mask of CTA ranks in the cluster (cast to .u16). "
    "Every destination CTA must have initialised its mbarrier (cluster barrier after init).",
)
_tma_load_multicast.__name__ = "tma_load_multicast"
tma_load_multicast = intrinsic(_tma_load_multicast)
tma_load_multicast.spec = _MULTICAST


def _tma_load_im2col(typingctx, dst, dst_index, tmap, coords, offsets, bars, bar_index):
    rank = _check_load(_IM2COL, dst, dst_index, tmap, coords, bars, bar_index)
    _int_tuple(_IM2COL.name, offsets, (rank - 2,),
               f"offsets (one per spatial dimension: rank {rank} takes {rank - 2}, innermost "
               f"first)")
    sig = types.void(dst, dst_index, tmap, coords, offsets, bars, bar_index)
    return sig, _lower_g2s(_IM2COL, rank, ("offsets",))


_tma_load_im2col.__doc__ = _doc(
    _IM2COL,
    "Load ``pixels_per_column`` pixels of ``channels_per_pixel`` channels in im2col mode "
    "(the tensor map must come from ``TensorMap.im2col``).",
    "``tma_load_im2col(dst, dst_index, tmap, coords, offsets, bars, bar_index)``: ``coords`` "
    "(c, w[, h[, d]], n) innermost first; ``offsets`` the filter-window position, one 16-bit "
    "offset per spatial dimension, innermost first ((w,), (w, h) or (w, h, d)).",
)
_tma_load_im2col.__name__ = "tma_load_im2col"
tma_load_im2col = intrinsic(_tma_load_im2col)
tma_load_im2col.spec = _IM2COL


def _tma_store(typingctx, tmap, coords, src, src_index):
    _check_tmap(_STORE.name, tmap)
    rank = _check_coords(_STORE, coords)
    check_array(_STORE.name, src, "a shared-memory source array")
    check_index(_STORE.name, src, src_index)
    sig = types.void(tmap, coords, src, src_index)
    template, constraints = _STORE.template(rank)

    def codegen(context, builder, sig, args):
        require_arch(_STORE.ptx(rank), _STORE.arch)
        tys = sig.args
        ops = [_tmap_address(context, builder, tys[0], args[0])]
        ops += _cast_all(context, builder, tys[1], args[1], types.int32)
        ops.append(shared_address(context, builder, tys[2], args[2], tys[3], args[3]))
        asm(builder, template, constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return sig, codegen


_tma_store.__doc__ = _doc(
    _STORE,
    "Store one box from shared memory to the tensor described by ``tmap``; the parts of the "
    "box outside the tensor are not written.  Completion joins the thread's current bulk "
    "group: ``bulk_commit_group()`` then ``bulk_wait_group_read(0)`` before overwriting the "
    "source, ``bulk_wait_group(0)`` before relying on the global writes.",
    "``tma_store(tmap, coords, src, src_index)``: ``src[src_index]`` is the box's first element "
    "in shared memory (128-byte aligned, in the tensor map's swizzle layout).  Make the "
    "threads' shared-memory writes visible to the async proxy first "
    "(``fence.proxy.async.shared::cta`` in each writer, then a block barrier).",
)
_tma_store.__name__ = "tma_store"
tma_store = intrinsic(_tma_store)
tma_store.spec = _STORE


_PREFETCH = TENSOR_COPIES["tma_prefetch"]


def _tma_prefetch(typingctx, tmap, coords):
    _check_tmap(_PREFETCH.name, tmap)
    rank = _check_coords(_PREFETCH, coords)
    sig = types.void(tmap, coords)
    template, constraints = _PREFETCH.template(rank)

    def codegen(context, builder, sig, args):
        require_arch(_PREFETCH.ptx(rank), _PREFETCH.arch)
        tys = sig.args
        ops = [_tmap_address(context, builder, tys[0], args[0])]
        ops += _cast_all(context, builder, tys[1], args[1], types.int32)
        asm(builder, template, constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return sig, codegen


_tma_prefetch.__doc__ = _doc(
    _PREFETCH,
    "Prefetch one box of the tensor described by ``tmap`` into the L2 cache (a hint: nothing "
    "lands in shared memory, nothing completes, nothing is waited for).",
    "``tma_prefetch(tmap, coords)``: ``tmap`` ``TensorMap.param`` or ``TensorMap.device``, "
    "``coords`` the box's first element, innermost dimension first, as for ``tma_load``.",
)
_tma_prefetch.__name__ = "tma_prefetch"
tma_prefetch = intrinsic(_tma_prefetch)
tma_prefetch.spec = _PREFETCH


# ---------------------------------------------------------------------------------------------
# Plain bulk copies
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BulkCopy:
    """One ``cp.async.bulk`` form (PTX ISA 9.7.9.25.4.1).  Both addresses 16-byte aligned,
    ``size`` a multiple of 16."""

    name: str
    ptx: str
    template: str
    constraints: tuple
    arch: Arch


BULK_COPIES = {
    c.name: c
    for c in [
        BulkCopy(
            "bulk_copy_g2s",
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
            "[$0], [$1], $2, [$3];",
            ("r", "l", "r", "r"),
            SM90,
        ),
        BulkCopy(
            "bulk_copy_s2s_cluster",
            "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
            "{\n\t"
            ".reg .b32 dst, bar;\n\t"
            "mapa.shared::cluster.u32 dst, $0, $4;\n\t"
            "mapa.shared::cluster.u32 bar, $3, $4;\n\t"
            "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
            "[dst], [$1], $2, [bar];\n\t"
            "}",
            ("r", "r", "r", "r", "r"),
            SM90,
        ),
        BulkCopy(
            "bulk_copy_s2g",
            "cp.async.bulk.global.shared::cta.bulk_group",
            "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
            ("l", "r", "r"),
            SM90,
        ),
        BulkCopy(
            "bulk_reduce_add_f32",
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
            ("l", "r", "r"),
            SM90,
        ),
    ]
}


def _check_nbytes(name, ty):
    # NOTE: a constant byte count reaches the typer as a plain integer (numba tries literal
    # types only after the plain ones fail), so "a positive multiple of 16" is the caller's.
    check_integer(name, ty, "the byte count (a positive multiple of 16)")


_G2S = BULK_COPIES["bulk_copy_g2s"]
_S2S = BULK_COPIES["bulk_copy_s2s_cluster"]
_S2G = BULK_COPIES["bulk_copy_s2g"]
_RED = BULK_COPIES["bulk_reduce_add_f32"]


@intrinsic
def bulk_copy_g2s(typingctx, dst, dst_index, src, src_index, nbytes, bars, bar_index):
    """Copy ``nbytes`` bytes from global ``src[src_index]`` to shared ``dst[dst_index]``,
    completing as bytes on the mbarrier ``bars[bar_index]``.

    Emits ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2,
    [$3];`` (PTX ISA 9.7.9.25.4.1, cp.async.bulk).  Both addresses 16-byte aligned, ``nbytes``
    a multiple of 16; ``src`` a 1-d array or a typed pointer.  Needs sm_90 or newer.
    """
    check_array(_G2S.name, dst, "a shared-memory destination array")
    check_index(_G2S.name, dst, dst_index)
    check_global(_G2S.name, src, "a global source array or typed pointer")
    check_index(_G2S.name, src, src_index)
    _check_nbytes(_G2S.name, nbytes)
    _check_bars(_G2S.name, bars, bar_index)
    sig = types.void(dst, dst_index, src, src_index, nbytes, bars, bar_index)

    def codegen(context, builder, sig, args):
        require_arch(_G2S.ptx, _G2S.arch)
        tys = sig.args
        ops = [
            shared_address(context, builder, tys[0], args[0], tys[1], args[1]),
            global_address(context, builder, tys[2], args[2], tys[3], args[3]),
            as_i32(context, builder, tys[4], args[4]),
            shared_address(context, builder, tys[5], args[5], tys[6], args[6]),
        ]
        asm(builder, _G2S.template, _G2S.constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def bulk_copy_s2s_cluster(typingctx, dst, dst_index, src, src_index, nbytes, bars, bar_index,
                          cta_rank):
    """Copy ``nbytes`` bytes from this CTA's shared ``src[src_index]`` to ``dst[dst_index]`` in
    the shared memory of the CTA of rank ``cta_rank`` in this cluster, completing as bytes on
    *that* CTA's mbarrier ``bars[bar_index]`` (distributed shared memory; the receiver expects the
    bytes with ``mbarrier_expect_tx``).  The copy moves bytes unchanged, so a 1024-byte-aligned
    block of a swizzled tile stays a valid swizzled tile at a 1024-byte-aligned destination.

    The source is read through the async proxy: generic writes to it (stores, and landed plain
    ``cp.async`` copies) need ``fence_proxy_async_shared()`` first.

    Emits (PTX ISA 9.7.9.25.4.1, cp.async.bulk; 9.7.9.23, mapa)::

        mapa.shared::cluster.u32 dst, $0, $4;
        mapa.shared::cluster.u32 bar, $3, $4;
        cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [$1], $2, [bar];

    Both addresses 16-byte aligned, ``nbytes`` a multiple of 16.  Needs sm_90 or newer.
    """
    check_array(_S2S.name, dst, "a shared-memory destination array")
    check_index(_S2S.name, dst, dst_index)
    check_array(_S2S.name, src, "a shared-memory source array")
    check_index(_S2S.name, src, src_index)
    _check_nbytes(_S2S.name, nbytes)
    _check_bars(_S2S.name, bars, bar_index)
    check_integer(_S2S.name, cta_rank, "the CTA rank")
    sig = types.void(dst, dst_index, src, src_index, nbytes, bars, bar_index, cta_rank)

    def codegen(context, builder, sig, args):
        require_arch(_S2S.ptx, _S2S.arch)
        tys = sig.args
        ops = [
            shared_address(context, builder, tys[0], args[0], tys[1], args[1]),
            shared_address(context, builder, tys[2], args[2], tys[3], args[3]),
            as_i32(context, builder, tys[4], args[4]),
            shared_address(context, builder, tys[5], args[5], tys[6], args[6]),
            context.cast(builder, args[7], tys[7], types.uint32),
        ]
        asm(builder, _S2S.template, _S2S.constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def bulk_copy_s2g(typingctx, dst, dst_index, src, src_index, nbytes):
    """Copy ``nbytes`` bytes from shared ``src[src_index]`` to global ``dst[dst_index]``;
    completion joins the thread's bulk group (``bulk_commit_group`` / ``bulk_wait_group``).

    Emits ``cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;`` (PTX ISA
    9.7.9.25.4.1, cp.async.bulk).  Both addresses 16-byte aligned, ``nbytes`` a multiple of 16.
    Needs sm_90 or newer.
    """
    return _shared_to_global(_S2G, dst, dst_index, src, src_index, nbytes)


def _shared_to_global(copy, dst, dst_index, src, src_index, nbytes):
    """The typing and codegen of a bulk operation from shared ``src[src_index]`` to global
    ``dst[dst_index]`` of ``nbytes`` bytes in the thread's bulk group (``copy``: BULK_COPIES'
    store or reduction)."""
    check_global(copy.name, dst, "a global destination array or typed pointer")
    check_index(copy.name, dst, dst_index)
    check_array(copy.name, src, "a shared-memory source array")
    check_index(copy.name, src, src_index)
    _check_nbytes(copy.name, nbytes)
    sig = types.void(dst, dst_index, src, src_index, nbytes)

    def codegen(context, builder, sig, args):
        require_arch(copy.ptx, copy.arch)
        tys = sig.args
        ops = [
            global_address(context, builder, tys[0], args[0], tys[1], args[1]),
            shared_address(context, builder, tys[2], args[2], tys[3], args[3]),
            as_i32(context, builder, tys[4], args[4]),
        ]
        asm(builder, copy.template, copy.constraints, [], ops, memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def bulk_reduce_add_f32(typingctx, dst, dst_index, src, src_index, nbytes):
    """Add the ``nbytes / 4`` float32 values at shared ``src[src_index]`` into global
    ``dst[dst_index]`` element by element (each add atomic at its address, float32 rounding);
    completion joins the thread's bulk group (``bulk_commit_group``; ``bulk_wait_group_read``
    frees the source, ``bulk_wait_group`` waits for the adds).  Two reductions into the same
    addresses that are in flight together add in no fixed order.

    Emits ``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;`` (PTX
    ISA 9.7.9.25.4.2, cp.reduce.async.bulk).  Both addresses 16-byte aligned, ``nbytes`` a
    multiple of 16; ``dst`` a float32 pointer or array.  Needs sm_90 or newer.
    """
    from numba.cuda.core.errors import NumbaTypeError

    if isinstance(dst, (types.Array, types.CPointer)) and dst.dtype != types.float32:
        raise NumbaTypeError(f"{_RED.name} adds into float32 memory, got {dst.dtype}")
    return _shared_to_global(_RED, dst, dst_index, src, src_index, nbytes)


# ---------------------------------------------------------------------------------------------
# Bulk groups and the descriptor prefetch
# ---------------------------------------------------------------------------------------------


@intrinsic
def bulk_commit_group(typingctx):
    """Emits ``cp.async.bulk.commit_group;`` (PTX ISA 9.7.9.25.6.1): closes the bulk group of
    this thread's bulk stores (``tma_store``, ``bulk_copy_s2g``) issued since the last commit.
    Needs sm_90 or newer."""
    sig = types.void()

    def codegen(context, builder, sig, args):
        require_arch("cp.async.bulk.commit_group", SM90)
        asm(builder, "cp.async.bulk.commit_group;", [], memory=True)
        return context.get_dummy_value()

    return sig, codegen


def _wait_group(read):
    ptx = "cp.async.bulk.wait_group" + (".read" if read else "")

    def typer(typingctx, n):
        value = literal_value(ptx, n, "N (a literal)")
        if value is None:
            return None
        if not isinstance(value, int) or value < 0:
            raise NumbaTypeError(f"{ptx}: N must be a non-negative integer literal, got {value!r}")
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            require_arch(ptx, SM90)
            asm(builder, f"{ptx} {value};", [], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    if read:
        typer.__name__ = "bulk_wait_group_read"
        typer.__doc__ = (
            "Emits ``cp.async.bulk.wait_group.read N;`` (PTX ISA 9.7.9.25.6.2): waits until at "
            "most N of this thread's bulk groups still have to finish *reading* their source, "
            "so that the shared memory they read may be overwritten.  N must be a literal "
            ">= 0. Needs sm_90 or newer."
        )
    else:
        typer.__name__ = "bulk_wait_group"
        typer.__doc__ = (
            "Emits ``cp.async.bulk.wait_group N;`` (PTX ISA 9.7.9.25.6.2): waits until at most "
            "N of this thread's bulk groups are pending, i.e. the others have completed their "
            "writes.  N must be a literal >= 0. Needs sm_90 or newer."
        )
    return intrinsic(typer)


bulk_wait_group = _wait_group(read=False)
bulk_wait_group_read = _wait_group(read=True)


@intrinsic
def tma_prefetch_descriptor(typingctx, tmap):
    """Emits ``prefetch.tensormap [$0];`` (PTX ISA 9.7.9.15, prefetch): brings the tensor map
    (``TensorMap.param`` or ``TensorMap.device``, by its generic address) into the cache ahead
    of the first TMA instruction that uses it.  Needs sm_90 or newer."""
    _check_tmap("prefetch.tensormap", tmap)
    sig = types.void(tmap)

    def codegen(context, builder, sig, args):
        require_arch("prefetch.tensormap", SM90)
        address = _tmap_address(context, builder, sig.args[0], args[0])
        asm(builder, "prefetch.tensormap [$0];", ["l"], [], [address], memory=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def tensormap_fence_acquire(typingctx, tmap):
    """Emits ``fence.proxy.tensormap::generic.acquire.sys [$0], 128;`` (PTX ISA 9.7.13.4,
    membar/fence, proxy tensormap): makes the tensor map that the host copied into global memory
    (``TensorMap.device``) visible to the tensormap proxy, which TMA reads it through.  A thread
    must execute it once before its first TMA instruction on that map; ``.sys`` because the
    writer is the host.  Needs sm_90 or newer.  For a map passed by value (TensorMap.param) it
    emits nothing: a kernel parameter is constant for the whole launch and is not written
    through the generic proxy."""
    _check_tmap("fence.proxy.tensormap", tmap)
    sig = types.void(tmap)

    def codegen(context, builder, sig, args):
        require_arch("fence.proxy.tensormap::generic.acquire", SM90)
        if grid_constant.is_param(sig.args[0]):
            return context.get_dummy_value()
        address = _tmap_address(context, builder, sig.args[0], args[0])
        asm(builder, "fence.proxy.tensormap::generic.acquire.sys [$0], 128;", ["l"], [], [address],
            memory=True)
        return context.get_dummy_value()

    return sig, codegen
