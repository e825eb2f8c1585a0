"""Host side of TMA: tensor maps (``CUtensorMap``) built with the CUDA driver's
``cuTensorMapEncodeTiled`` and ``cuTensorMapEncodeIm2col``, checked against every documented rule
before the driver sees them.

A tensor map is a 128-byte opaque descriptor of a tensor in global memory and of the box one TMA
instruction moves (PTX ISA 5.5, "Tensors"; CUDA Driver API 6.30, "Tensor Map Object Management").
Build one on the host and hand it to a kernel by value, ``tmap.param`` (CUDA C++'s
``__grid_constant__`` parameter, :mod:`intrinsics.grid_constant`), or as ``tmap.device`` (16
``uint64`` words copied to device memory); the kernel passes it on to the intrinsics in
:mod:`intrinsics.tma`::

    a = cuda.to_device(np.zeros((M, K), np.float32))
    tmap = TensorMap.tiled(a, box=(64, 32), swizzle=128)    # (rows, cols): 64 rows x 128 B
    launch(kernel, grid, block, (tmap.param, ...))          # intrinsics.launch; tensormap_param
    kernel[grid, block](tmap.device, ...)                   # or: kernel argument type uint64[:]

    # in the kernel: coordinates are innermost first, as PTX takes them -- (col, row)
    tma_load(smem, 0, tmap, (k0, m0), bars, 0)

Dimension order
---------------
Everything given to :class:`TensorMap` -- ``shape``, ``strides``, ``box``, ``element_strides``,
the im2col ``lower_corner`` / ``upper_corner`` -- is in the *natural* order, outermost first, as
NumPy writes shapes: a row-major ``(rows, cols)`` matrix has ``shape=(rows, cols)`` and
``strides=(row_pitch_bytes, itemsize)``.  The driver wants the reverse, innermost first
(``globalDim[0]`` is the contiguous dimension); :class:`TensorMap` reverses every list before the
call and keeps both (``tmap.shape`` natural, ``tmap.global_dim`` CUDA order).

The *device* intrinsics take coordinates the way PTX does: innermost first.  For the matrix above,
``coords = (col, row)``; for a 5-d NHWC-like tensor ``(N, D, H, W, C)`` they are
``(c, w, h, d, n)``.  Coordinates are signed element indices of the box's first element; a box
that hangs over any edge (negative coordinates included) is filled with zeros (or NaN, see
``oob_fill``) on loads, and its outside part is discarded on stores.

Rules checked before the driver call
------------------------------------
From the driver documentation of ``cuTensorMapEncodeTiled`` / ``cuTensorMapEncodeIm2col``
(CUDA 13 driver API; the same text ships as the docstrings of ``cuda.bindings.driver``).  Every
one raises ValueError (a bad value) or TypeError (a bad type) naming the rule and the value:

- rank 1..5 (tiled), 3..5 (im2col); at least 3 when ``interleave`` is not none.
- ``globalAddress`` 16-byte aligned; 32-byte aligned with 32B interleave or the 16-byte-aligned
  packed types (``16u4_align16b``, ``16u6_align16b``).
- every ``globalDim`` in 1..2^32; packed types: innermost dimension a multiple of 128
  (``*_align16b``) or of 2 (``16u4_align8b``).
- every ``globalStride`` (all but the innermost dimension) a multiple of 16 and below 2^40; a
  multiple of 32 with 32B interleave or the ``*_align16b`` types.  (Implied by the API, which has
  no innermost stride: the innermost dimension must be contiguous.)
- every ``boxDim`` in 1..256; without interleave, ``boxDim[0] * elementSize`` a multiple of
  16 bytes; ``*_align16b`` types: ``boxDim[0] == 128``.
- every ``elementStrides`` in 1..8 (the innermost one is ignored without interleave).
- 32B interleave requires 32B swizzle; ``16u6_align16b`` requires no interleave.
- without interleave and with a swizzle, the box's inner dimension in bytes (im2col:
  ``channelsPerPixel * elementSize``) at most the swizzle span (32, 64 or 128 bytes).
- ``*_align16b`` types: swizzle none or 128B only.
- NaN out-of-bounds fill only for floating-point, non-packed types.
- im2col: ``pixelBoxLowerCorner`` / ``pixelBoxUpperCorner`` have rank-2 entries each in
  [-32768, 32767] (rank 3), [-128, 127] (rank 4) or [-16, 15] (rank 5); the box they bound has
  non-zero size in every spatial dimension (``dim + upper - lower >= 1``);
  ``channelsPerPixel`` in 1..256 (``*_align16b``: exactly 128); ``pixelsPerColumn`` in 1..1024.

What the driver still refuses is re-raised as :class:`TensorMapError` listing every parameter in
the driver's order, never a bare ``CUDA_ERROR_INVALID_VALUE``.

Device-side requirements the host cannot check (PTX ISA 9.7.9.25.5.1): the shared-memory box
must be 128-byte aligned, and aligned to the swizzle pattern's repeat (256 B for 32B, 512 B for
64B, 1024 B for 128B swizzle) for the pattern to match :func:`intrinsics.smem.swizzle_offset`.

Where a tensor copy may start: the 16-byte rule
----------------------------------------------
The innermost start coordinate of a tensor copy, in bytes (coordinate x element size; im2col:
the channel coordinate), must be a multiple of 16.  The PTX ISA and the driver documentation do
not state this; the lent H200 showed it (driver 580.159.04, 2026-12-01): a 2-d tile load of a
48x96 float32 tensor, box 16x16, no swizzle, ran exactly for innermost starts of 0, 4, 8 and -4
elements (0, 16, 32, -16 bytes) and raised CUDA_ERROR_ILLEGAL_INSTRUCTION for 3, 1 and 90
(12, 4, 360 bytes) -- in numbatc, in Triton and in plain CUDA C++ alike.  ``scripts/tma_rules.py``
then measured the whole family (216 probes, docs/TMA.md and docs/TMA_PROBES.md): the rule holds
for loads, multicast, im2col (the channel coordinate), prefetches and stores, for element sizes
1/2/4, every swizzle, ranks 1-5 and box widths 16-512 B; loads may start at any outer coordinate
and over the edges (negative or past the end, aligned innermost), filled exactly; a store may
have no negative coordinate at all (:func:`_store_problem`; past the far end it is clipped).

:func:`start_problem` is the rule, in one place: the emulation refuses a copy that breaks it
(EmulationError naming block, thread, coordinates and byte offset) and
:meth:`TensorMap.check_start` refuses a start known on the host (ValueError).  A start that is a
multiple of the box's innermost extent always obeys it, since ``box[-1] * elementSize`` is a
multiple of 16 bytes (the driver's rule above).
"""

from dataclasses import dataclass
from math import prod

import numpy as np

__all__ = [
    "TMA_TYPES",
    "TensorMap",
    "TensorMapError",
    "TmaType",
    "check_im2col",
    "check_tiled",
    "smem_row_pitch",
    "start_problem",
    "tma_type",
]


class TensorMapError(RuntimeError):
    """The driver refused a tensor map that passed the documented checks (or is unavailable)."""


# ---------------------------------------------------------------------------------------------
# Element types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TmaType:
    """One ``CUtensorMapDataType``.

    ``bits`` is the size of one element in global memory, ``smem_bits`` in shared memory (they
    differ for the 16-byte-aligned packed types, which leave gaps in shared memory).
    """

    name: str
    enum: str  # CUtensorMapDataType member name
    bits: int
    smem_bits: int
    is_float: bool
    packed: bool = False
    align16b: bool = False  # the 16U4_ALIGN16B / 16U6_ALIGN16B family

    @property
    def element_bytes(self):
        """Bytes per element in global memory (0.5 and 0.75 for the packed 4- and 6-bit types)."""
        return self.bits / 8 if self.bits % 8 else self.bits // 8


def _t(name, enum, bits, is_float, smem_bits=None, packed=False, align16b=False):
    return TmaType(name, "CU_TENSOR_MAP_DATA_TYPE_" + enum, bits, smem_bits or bits, is_float,
                   packed, align16b)


TMA_TYPES = {
    t.name: t
    for t in [
        _t("u8", "UINT8", 8, False),
        _t("u16", "UINT16", 16, False),
        _t("u32", "UINT32", 32, False),
        _t("s32", "INT32", 32, False),
        _t("u64", "UINT64", 64, False),
        _t("s64", "INT64", 64, False),
        _t("f16", "FLOAT16", 16, True),
        _t("f32", "FLOAT32", 32, True),
        _t("f64", "FLOAT64", 64, True),
        _t("bf16", "BFLOAT16", 16, True),
        _t("f32_ftz", "FLOAT32_FTZ", 32, True),
        _t("tf32", "TFLOAT32", 32, True),
        _t("tf32_ftz", "TFLOAT32_FTZ", 32, True),
        # Blackwell's packed sub-byte types: 16 values per group; dims count values.
        _t("16u4_align8b", "16U4_ALIGN8B", 4, False, packed=True),
        _t("16u4_align16b", "16U4_ALIGN16B", 4, False, smem_bits=8, packed=True, align16b=True),
        _t("16u6_align16b", "16U6_ALIGN16B", 6, False, smem_bits=8, packed=True, align16b=True),
    ]
}

# NumPy dtypes -> TMA type.  A copy is bitwise, so types TMA lacks travel as the unsigned type
# of their size (int8, int16, fp8); only the NaN fill and the tf32/ftz conversions care.
_NUMPY_TYPES = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "u8",
    np.dtype(np.bool_): "u8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int16): "u16",
    np.dtype(np.uint32): "u32",
    np.dtype(np.int32): "s32",
    np.dtype(np.uint64): "u64",
    np.dtype(np.int64): "s64",
    np.dtype(np.float16): "f16",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
}


def tma_type(dtype):
    """The :class:`TmaType` of a TMA type name ('bf16', 'f32', 'tf32' ...) or a NumPy dtype
    (a dtype object, type or full name such as 'float32'; ml_dtypes' bfloat16 maps to bf16, its
    1-byte float types to u8); TypeError otherwise."""
    if isinstance(dtype, TmaType):
        return dtype
    if isinstance(dtype, str) and dtype in TMA_TYPES:
        return TMA_TYPES[dtype]
    try:
        npd = None if dtype is None else np.dtype(dtype)  # np.dtype(None) would be float64
    except TypeError:
        npd = None
    if isinstance(dtype, str) and npd is not None and npd.name != dtype:
        npd = None  # NumPy codes such as 'f8' (float64, not fp8) are too easy to misread
    if npd is not None:
        if npd in _NUMPY_TYPES:
            return TMA_TYPES[_NUMPY_TYPES[npd]]
        if npd.name == "bfloat16":
            return TMA_TYPES["bf16"]
        if npd.itemsize == 1 and npd.name.startswith(("float8", "float6", "float4")):
            return TMA_TYPES["u8"]
    raise TypeError(
        f"tensor map: element type {dtype!r} is not a TMA type; valid: TMA names "
        f"{sorted(TMA_TYPES)} or NumPy dtypes {sorted(str(d) for d in _NUMPY_TYPES)} "
        f"(and ml_dtypes bfloat16 / float8)"
    )


# ---------------------------------------------------------------------------------------------
# Enumerations (the user-facing value -> the driver enum member name)
# ---------------------------------------------------------------------------------------------

SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
INTERLEAVES = {0: "NONE", 16: "16B", 32: "32B"}
L2_PROMOTIONS = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}
OOB_FILLS = {"zero": "NONE", "nan": "NAN_REQUEST_ZERO_FMA"}

MAX_RANK = 5
MAX_DIM = 2**32
MAX_STRIDE = 2**40
MAX_BOX = 256
MAX_ELEMENT_STRIDE = 8
MAX_CHANNELS_PER_PIXEL = 256
MAX_PIXELS_PER_COLUMN = 1024
# im2col corner offset ranges per rank (one, two or three spatial dimensions).
IM2COL_CORNER_RANGE = {3: (-(2**15), 2**15 - 1), 4: (-128, 127), 5: (-16, 15)}


# ---------------------------------------------------------------------------------------------
# Validation: pure functions, natural (outermost-first) order, no driver needed
# ---------------------------------------------------------------------------------------------


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _ints(where, name, values, length=None):
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a sequence of integers, got {values!r}")
    for v in values:
        if not _is_int(v):
            raise TypeError(f"{where}: {name} must hold integers, got {values!r}")
    if length is not None and len(values) != length:
        raise ValueError(
            f"{where}: {name} must have one entry per tensor dimension ({length}), got {values!r}"
        )
    return tuple(int(v) for v in values)


def _enum_value(where, name, value, table):
    if value is None and 0 in table:
        value = 0
    if value not in table:
        raise ValueError(f"{where}: {name} must be one of {list(table)}, got {value!r}")
    return value


def _check_common(where, t, address, shape, strides, element_strides, interleave, swizzle,
                  l2_promotion, oob_fill, ranks):
    """Rules shared by the tiled and im2col encoders; returns the normalised values."""
    t = tma_type(t)
    shape = _ints(where, "shape", shape)
    rank = len(shape)
    if rank not in ranks:
        raise ValueError(
            f"{where}: tensorRank must be in {ranks[0]}..{ranks[-1]}, got shape {shape} "
            f"(rank {rank})"
        )
    interleave = _enum_value(where, "interleave (bytes)", interleave, INTERLEAVES)
    swizzle = _enum_value(where, "swizzle (bytes)", swizzle, SWIZZLES)
    l2_promotion = _enum_value(where, "l2_promotion (bytes)", l2_promotion, L2_PROMOTIONS)
    oob_fill = _enum_value(where, "oob_fill", "zero" if oob_fill is None else oob_fill, OOB_FILLS)
    if interleave and rank < 3:
        raise ValueError(
            f"{where}: with interleave {interleave}B the tensorRank must be at least 3, got "
            f"shape {shape}"
        )

    # globalAddress
    if not _is_int(address):
        raise TypeError(f"{where}: the global address must be an integer, got {address!r}")
    align = 32 if (interleave == 32 or t.align16b) else 16
    if address < 0 or address % align:
        why = (
            "with 32B interleave" if interleave == 32
            else f"for {t.name}" if t.align16b else "always"
        )
        raise ValueError(
            f"{where}: globalAddress must be {align}-byte aligned ({why}), got {address:#x}"
        )

    # globalDim
    for axis, d in enumerate(shape):
        if not 1 <= d <= MAX_DIM:
            raise ValueError(
                f"{where}: every dimension must be in 1..2^32, got shape {shape} (axis {axis})"
            )
    if t.align16b and shape[-1] % 128:
        raise ValueError(
            f"{where}: {t.name} needs the innermost dimension to be a multiple of 128 values, "
            f"got shape {shape}"
        )
    if t.name == "16u4_align8b" and shape[-1] % 2:
        raise ValueError(
            f"{where}: {t.name} needs the innermost dimension to be a multiple of 2 values, "
            f"got shape {shape}"
        )

    # globalStrides: NumPy-style byte strides of every axis, or of every axis but the innermost.
    if strides is None:
        strides = _contiguous_strides(shape, t)
    else:
        strides = tuple(strides)
        if len(strides) == rank - 1:
            strides = strides + (t.element_bytes,)
        if len(strides) != rank:
            raise ValueError(
                f"{where}: strides must give the byte stride of every axis ({rank}) or of every "
                f"axis but the innermost ({rank - 1}), got {strides!r}"
            )
        outer = _ints(where, "strides", strides[:-1])
        if strides[-1] != t.element_bytes:
            raise ValueError(
                f"{where}: the innermost dimension must be contiguous: its stride must be the "
                f"element size {t.element_bytes} B for {t.name}, got strides {strides!r} "
                f"(TMA takes no innermost stride)"
            )
        strides = outer + (t.element_bytes,)
    stride_align = 32 if (interleave == 32 or t.align16b) else 16
    for axis, s in enumerate(strides[:-1]):
        if s < 0 or s % stride_align or s >= MAX_STRIDE:
            why = (
                " (32 with 32B interleave)" if interleave == 32
                else f" (32 for {t.name})" if t.align16b else ""
            )
            raise ValueError(
                f"{where}: every stride but the innermost must be a multiple of {stride_align} "
                f"bytes{why} and below 2^40, got strides {strides} (axis {axis}: {s})"
            )

    # elementStrides
    if element_strides is None:
        element_strides = (1,) * rank
    element_strides = _ints(where, "element_strides", element_strides, rank)
    for axis, e in enumerate(element_strides):
        if not 1 <= e <= MAX_ELEMENT_STRIDE:
            raise ValueError(
                f"{where}: every element stride must be in 1..8, got element_strides "
                f"{element_strides} (axis {axis})"
            )

    # interleave and swizzle combinations
    if interleave == 32 and swizzle != 32:
        raise ValueError(
            f"{where}: 32B interleave requires swizzle 32, got swizzle {swizzle}"
        )
    if t.name == "16u6_align16b" and interleave:
        raise ValueError(f"{where}: {t.name} requires interleave 0 (none), got {interleave}")
    if t.align16b and swizzle not in (0, 128):
        raise ValueError(f"{where}: {t.name} supports swizzle 0 or 128 only, got {swizzle}")

    # OOB fill
    if oob_fill == "nan" and (not t.is_float or t.packed):
        raise ValueError(
            f"{where}: oob_fill='nan' needs a floating-point element type, got {t.name}; "
            f"use oob_fill='zero'"
        )
    return t, shape, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill


def _contiguous_strides(shape, t):
    """C-contiguous byte strides (the innermost one is the element size, 0.5 or 0.75 for the
    packed types; an outer stride that is not a whole number of bytes stays fractional and
    fails the multiple-of-16 rule)."""
    strides = []
    bits = t.bits
    for d in reversed(shape):
        strides.append(bits // 8 if bits % 8 == 0 else bits / 8)
        bits *= d
    return tuple(strides[::-1])


def _check_inner_box(where, t, inner, interleave, swizzle, what):
    """The bytes rules on the box's innermost extent (``inner`` elements)."""
    inner_bytes = inner * t.bits / 8
    if interleave == 0 and what == "box" and inner_bytes % 16:
        raise ValueError(
            f"{where}: without interleave the box's innermost extent must be a multiple of "
            f"16 bytes: box[-1] = {inner} x {t.element_bytes} B ({t.name}) = {inner_bytes:g} B"
        )
    smem_bytes = inner * t.smem_bits // 8
    if interleave == 0 and swizzle and smem_bytes > swizzle:
        raise ValueError(
            f"{where}: with swizzle {swizzle} the {what}'s innermost extent must be at most "
            f"{swizzle} bytes: {inner} x {t.element_bytes} B ({t.name}) = {smem_bytes} B; "
            f"split the box or use a wider swizzle"
        )


def check_tiled(dtype, address, shape, strides, box, element_strides=None, interleave=0,
                swizzle=0, l2_promotion=128, oob_fill="zero"):
    """Check the parameters of a tiled tensor map against the rules of
    ``cuTensorMapEncodeTiled`` (listed in this module's docstring) without calling the driver.

    All sequences are in natural order (outermost first).  ``strides`` are byte strides (NumPy
    convention) of every axis or of every axis but the innermost; None means C-contiguous.
    Raises ValueError / TypeError naming the broken rule; returns the normalised parameters as a
    dict (natural order) on success.
    """
    where = "TensorMap.tiled"
    t, shape, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill = (
        _check_common(where, dtype, address, shape, strides, element_strides, interleave,
                      swizzle, l2_promotion, oob_fill, range(1, MAX_RANK + 1))
    )
    box = _ints(where, "box", box, len(shape))
    for axis, b in enumerate(box):
        if not 1 <= b <= MAX_BOX:
            raise ValueError(f"{where}: every box dimension must be in 1..256, got box {box} "
                             f"(axis {axis})")
    if t.align16b and box[-1] != 128:
        raise ValueError(f"{where}: {t.name} needs box[-1] == 128, got box {box}")
    _check_inner_box(where, t, box[-1], interleave, swizzle, "box")
    return dict(dtype=t, address=int(address), shape=shape, strides=strides, box=box,
                element_strides=element_strides, interleave=interleave, swizzle=swizzle,
                l2_promotion=l2_promotion, oob_fill=oob_fill)


def check_im2col(dtype, address, shape, strides, lower_corner, upper_corner, channels_per_pixel,
                 pixels_per_column, element_strides=None, interleave=0, swizzle=0,
                 l2_promotion=128, oob_fill="zero"):
    """Check the parameters of an im2col tensor map against the rules of
    ``cuTensorMapEncodeIm2col`` without calling the driver.

    ``shape`` is natural order, e.g. ``(N, H, W, C)`` for rank 4; ``lower_corner`` and
    ``upper_corner`` hold one offset per spatial dimension in the same order (``(H, W)``), which
    the driver receives reversed (``{W, H}``).  Returns the normalised parameters as a dict.
    """
    where = "TensorMap.im2col"
    t, shape, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill = (
        _check_common(where, dtype, address, shape, strides, element_strides, interleave,
                      swizzle, l2_promotion, oob_fill, range(3, MAX_RANK + 1))
    )
    rank = len(shape)
    n_spatial = rank - 2
    lower = _ints(where, "lower_corner", lower_corner)
    upper = _ints(where, "upper_corner", upper_corner)
    lo, hi = IM2COL_CORNER_RANGE[rank]
    for name, corner in (("lower_corner", lower), ("upper_corner", upper)):
        if len(corner) != n_spatial:
            raise ValueError(
                f"{where}: {name} needs one offset per spatial dimension ({n_spatial} for rank "
                f"{rank}), got {corner}"
            )
        for c in corner:
            if not lo <= c <= hi:
                raise ValueError(
                    f"{where}: for rank {rank} every {name} offset must be in [{lo}, {hi}], got "
                    f"{corner}"
                )
    spatial = shape[1:-1]
    for axis, (d, l, u) in enumerate(zip(spatial, lower, upper)):
        if d + u - l < 1:
            raise ValueError(
                f"{where}: the pixel bounding box must have non-zero size: spatial axis {axis} "
                f"spans {d} + upper {u} - lower {l} = {d + u - l} pixels"
            )
    if not _is_int(channels_per_pixel) or not _is_int(pixels_per_column):
        raise TypeError(
            f"{where}: channels_per_pixel and pixels_per_column must be integers, got "
            f"{channels_per_pixel!r}, {pixels_per_column!r}"
        )
    if not 1 <= channels_per_pixel <= MAX_CHANNELS_PER_PIXEL:
        raise ValueError(
            f"{where}: channels_per_pixel must be in 1..256, got {channels_per_pixel}"
        )
    if t.align16b and channels_per_pixel != 128:
        raise ValueError(
            f"{where}: {t.name} needs channels_per_pixel == 128, got {channels_per_pixel}"
        )
    if not 1 <= pixels_per_column <= MAX_PIXELS_PER_COLUMN:
        raise ValueError(
            f"{where}: pixels_per_column must be in 1..1024, got {pixels_per_column}"
        )
    _check_inner_box(where, t, int(channels_per_pixel), interleave, swizzle, "channel run")
    return dict(dtype=t, address=int(address), shape=shape, strides=strides,
                lower_corner=lower, upper_corner=upper,
                channels_per_pixel=int(channels_per_pixel),
                pixels_per_column=int(pixels_per_column), element_strides=element_strides,
                interleave=interleave, swizzle=swizzle, l2_promotion=l2_promotion,
                oob_fill=oob_fill)


# ---------------------------------------------------------------------------------------------
# Where a copy may start (measured on the H200; see the module docstring)
# ---------------------------------------------------------------------------------------------

START_ALIGN = 16  # bytes: the innermost start of a tensor copy


def start_problem(dtype, coords, mode="tiled", op="load"):
    """Why the hardware refuses a tensor copy (``op``: 'load' -- loads, multicast, im2col and
    prefetches -- or 'store') of a ``mode`` ('tiled' or 'im2col') map of ``dtype`` whose box
    starts at ``coords`` (device order: innermost first, as the intrinsics take them), or None
    when the start is legal.

    NOTE: the rule as the H200 measured it (module docstring): the innermost coordinate times
    the element size must be a multiple of 16 bytes; negative multiples (-16) run too.  For
    im2col the innermost coordinate is the channel start.  Adjust this one function when
    ``scripts/tma_rules.py`` shows more (the emulation and TensorMap.check_start both use it).
    """
    t = tma_type(dtype)
    coords = tuple(int(c) for c in coords)
    if not coords:
        return "no coordinates"
    inner = coords[0]
    offset = inner * t.element_bytes
    if offset % START_ALIGN == 0:
        return _store_problem(coords) if op == "store" else None
    step = START_ALIGN / t.element_bytes
    step = int(step) if step == int(step) else step
    what = "the channel coordinate (im2col's innermost)" if mode == "im2col" else (
        "the innermost coordinate")
    return (
        f"{what} {inner} x {t.element_bytes} B ({t.name}) is byte offset {offset:g}, not a "
        f"multiple of {START_ALIGN}: a tensor copy must start its innermost dimension on a "
        f"16-byte boundary (the 16-byte rule; a tile load that breaks it raises "
        f"CUDA_ERROR_ILLEGAL_INSTRUCTION on the H200) -- start at a multiple of {step} elements"
    )


def _store_problem(coords):
    """The store-only part of :func:`start_problem`.

    NOTE: on the H200 (first tma_rules run, 2026-12-01) a 2-d float32 tile store at coords
    (-4, -5) raised CUDA_ERROR_ILLEGAL_INSTRUCTION (row 134) while one at (88, 40), past the end,
    ran exactly; in the GPU test shards the first fault of two shards was a store with negative
    outer coordinates only ((8, 0, 3, -1, 1) and (28, -3, 2), innermost 32 and 112 bytes).
    Until the 'tile store, negative start' probes (--only followup) separate innermost from
    outer, any negative coordinate on a store is refused."""
    negative = [axis for axis, c in enumerate(coords) if c < 0]
    if not negative:
        return None
    return (
        f"coordinate(s) {negative} (innermost first) of {coords} are negative: a tensor store "
        f"whose box starts before the tensor faulted on the H200 (CUDA_ERROR_ILLEGAL_INSTRUCTION; "
        f"stores past the far end are clipped) -- store the part inside the tensor instead"
    )


# ---------------------------------------------------------------------------------------------
# Where a box lands in shared memory: the row pitch under a swizzle
# ---------------------------------------------------------------------------------------------

# Measured on the H200 (scripts/tma_rules.py's footprint probes, docs/TMA.md): under a swizzle,
# a box row narrower than the swizzle span still takes the whole span in shared memory ('span':
# 16-, 32- and 64-byte rows under 128B swizzle landed 128 bytes apart, 16/32-byte rows under
# 64B 64 apart, 16-byte rows under 32B 32 apart), so an allocation sized for packed rows
# ('dense') overflows: the first run's narrow-row loads raised CUDA_ERROR_ILLEGAL_ADDRESS.
# 'dense' stays selectable for tests of the model itself.
SMEM_ROW_MODEL = "span"


def smem_row_pitch(inner_bytes, swizzle, model=None):
    """Bytes from the start of one box row (its innermost extent, ``inner_bytes`` bytes in
    shared memory) to the next under ``swizzle`` (0, 32, 64, 128): ``inner_bytes`` for the
    'dense' model, ``max(inner_bytes, swizzle)`` for 'span' (``model`` defaults to
    :data:`SMEM_ROW_MODEL`).  Byte ``c`` of row ``r`` then sits at logical offset
    ``r * pitch + c``, which the swizzle permutes (``intrinsics.layout.swizzle_offset_host``)."""
    model = model or SMEM_ROW_MODEL
    if model == "dense" or not swizzle:
        return inner_bytes
    if model == "span":
        return max(inner_bytes, swizzle)
    raise ValueError(f"smem_row_pitch: model must be 'dense' or 'span', got {model!r}")


# ---------------------------------------------------------------------------------------------
# The source tensor
# ---------------------------------------------------------------------------------------------


def _simulated():
    """True under numba's CUDA simulator: no driver, the CPU emulation runs the kernels."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _array_interface(tensor):
    """The ``__cuda_array_interface__`` of a device array; under the simulator also the array
    interface of the NumPy array behind a simulator device array (``cuda.to_device``)."""
    if hasattr(tensor, "__cuda_array_interface__"):
        return tensor.__cuda_array_interface__
    if _simulated() and isinstance(getattr(tensor, "_ary", None), np.ndarray):
        return tensor._ary.__array_interface__
    return None


def _describe_source(tensor, dtype, shape, strides):
    """(TmaType, address, shape, strides, owner) of an array with ``__cuda_array_interface__``
    or a raw device pointer plus ``dtype`` and ``shape``."""
    cai = _array_interface(tensor)
    if cai is not None:
        if shape is not None or strides is not None:
            raise TypeError(
                "tensor map: shape= and strides= are for a raw pointer; an array brings its own"
            )
        array_dtype = np.dtype(cai["typestr"])
        if cai.get("mask") is not None:
            raise TypeError("tensor map: masked arrays are not supported")
        if dtype is None:
            if array_dtype.kind == "V":
                raise TypeError(
                    f"tensor map: the array's element type {cai['typestr']!r} is opaque; pass "
                    f"dtype= (e.g. 'bf16'); valid: {sorted(TMA_TYPES)}"
                )
            t = tma_type(array_dtype)
        else:
            t = tma_type(dtype)
            if t.packed or t.bits != array_dtype.itemsize * 8:
                raise TypeError(
                    f"tensor map: dtype {t.name} ({t.bits} bits) does not match the array's "
                    f"{array_dtype.itemsize * 8}-bit elements; packed types need the raw-pointer "
                    f"form"
                )
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        if strides is None:
            strides = _contiguous_strides(shape, t) if shape else ()
        return t, int(cai["data"][0]), shape, tuple(strides), tensor
    if _is_int(tensor):
        if dtype is None or shape is None:
            raise TypeError("tensor map: a raw device pointer needs dtype= and shape=")
        return tma_type(dtype), int(tensor), tuple(shape), strides, None
    raise TypeError(
        f"tensor map: expected a device array (with __cuda_array_interface__) or an integer "
        f"device pointer, got {type(tensor).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# The driver call
# ---------------------------------------------------------------------------------------------


def _driver():
    from cuda.bindings import driver

    return driver


def _encode(kind, params):
    """Call cuTensorMapEncode<kind> with ``params`` (CUDA order, driver names); returns the
    CUtensorMap or raises TensorMapError with every parameter in the message."""
    d = _driver()
    function = "cuTensorMapEncode" + kind
    listing = ", ".join(f"{k}={v}" for k, v in params.items())
    try:
        (err,) = d.cuInit(0)
    except Exception as exc:  # no libcuda: the checks above already ran
        raise TensorMapError(f"{function}: the CUDA driver is not available ({exc})") from exc
    if err != d.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"{function}: cuInit failed with {err.name}")

    u32, u64 = d.cuuint32_t, d.cuuint64_t
    strides = list(params["globalStrides"]) or rank1_strides(params)
    args = [
        getattr(d.CUtensorMapDataType, params["tensorDataType"]),
        params["tensorRank"],
        params["globalAddress"],
        [u64(v) for v in params["globalDim"]],
        [u64(v) for v in strides],
    ]
    if kind == "Tiled":
        args += [[u32(v) for v in params["boxDim"]]]
    else:
        args += [
            list(params["pixelBoxLowerCorner"]),
            list(params["pixelBoxUpperCorner"]),
            params["channelsPerPixel"],
            params["pixelsPerColumn"],
        ]
    args += [
        [u32(v) for v in params["elementStrides"]],
        getattr(d.CUtensorMapInterleave, params["interleave"]),
        getattr(d.CUtensorMapSwizzle, params["swizzle"]),
        getattr(d.CUtensorMapL2promotion, params["l2Promotion"]),
        getattr(d.CUtensorMapFloatOOBfill, params["oobFill"]),
    ]
    err, tmap = getattr(d, function)(*args)
    if err != d.CUresult.CUDA_SUCCESS:
        raise TensorMapError(
            f"{function} refused the tensor map with {err.name} although it passed numbatc's "
            f"checks of the documented rules; parameters (driver order, innermost first): "
            f"{listing}" + (f" (globalStrides passed as {strides}: rank 1, see rank1_strides)"
                            if params["tensorRank"] == 1 else "")
        )
    return tmap


# How a rank-1 map's (absent) globalStrides reach the driver.  "size": one stride, the tensor's
# byte size rounded up to 16 (Triton's init1DTMADescriptor passes the byte size; CUTLASS's
# make_tma_copy_desc a pointer into a zeroed array, i.e. 0); "zero": [0]; "sixteen": [16];
# "none": an empty list, which cuda.bindings passes as NULL.
# NOTE: with "none" the H200 refused every rank-1 map (CUDA_ERROR_INVALID_VALUE; driver
# 580.159.04, scripts/tma_rules.py rows 81-85, 2026-12-01).  The driver reads tensorRank - 1 = 0
# strides, so any non-NULL array should do; which ones it takes: the 'rank-1 encoding' probes
# (scripts/tma_rules.py --only followup).  Set this once they have run.
RANK1_STRIDES = "size"


def rank1_strides(params, how=None):
    """The globalStrides list handed to the driver for a rank-1 map (``params``: driver order);
    ``how`` defaults to :data:`RANK1_STRIDES`."""
    how = how or RANK1_STRIDES
    if how == "none":
        return []
    if how == "zero":
        return [0]
    if how == "sixteen":
        return [16]
    if how == "size":
        bits = next(t.bits for t in TMA_TYPES.values() if t.enum == params["tensorDataType"])
        nbytes = int(params["globalDim"][0]) * bits // 8
        return [-(-max(nbytes, 1) // 16) * 16]
    raise ValueError(f"rank1_strides: how must be 'size', 'zero', 'sixteen' or 'none', got {how!r}")


# ---------------------------------------------------------------------------------------------
# TensorMap
# ---------------------------------------------------------------------------------------------


class TensorMap:
    """An encoded TMA tensor map plus every parameter that built it.

    Build one with :meth:`tiled` or :meth:`im2col`.  Attributes (natural order, outermost
    first): ``mode`` ('tiled' or 'im2col'), ``dtype`` (a :class:`TmaType`), ``address``,
    ``shape``, ``strides`` (bytes), ``box`` (tiled), ``lower_corner`` / ``upper_corner`` /
    ``channels_per_pixel`` / ``pixels_per_column`` (im2col), ``element_strides``,
    ``interleave`` / ``swizzle`` / ``l2_promotion`` (bytes, 0 = none), ``oob_fill``
    ('zero' or 'nan'), ``tensor`` (the source array, None for a raw pointer).
    ``driver_params`` holds what the driver received (innermost first).

    ``words`` is the encoded map as 16 ``uint64`` on the host.  Pass it to a kernel by value as
    ``param`` (the kernel's parameter type is then ``tensormap_param``, launched through
    intrinsics.launch), or as ``device``, a copy in device memory made once (a numba device
    array, 64-byte aligned; parameter type ``uint64[:]``) -- keep that TensorMap alive while
    kernels use it.  Either goes on to the TMA intrinsics.  Keep the tensor alive too.
    """

    def __init__(self, mode, params, driver_params, encoded, owner=None):
        self.mode = mode
        for key, value in params.items():
            setattr(self, key, value)
        self.driver_params = driver_params
        self.encoded = encoded
        self.tensor = owner  # the source array (None for a raw pointer)
        self._device = None
        self._param = None

    # -- constructors --------------------------------------------------------------------------

    @classmethod
    def tiled(cls, tensor, box, *, dtype=None, shape=None, strides=None, element_strides=None,
              swizzle=0, interleave=0, l2_promotion=128, oob_fill="zero"):
        """A tiled tensor map (``cuTensorMapEncodeTiled``; PTX ISA 5.5, "Tensors": tiled mode).

        ``tensor``: a device array (anything with ``__cuda_array_interface__``: numba, CuPy,
        torch) or an integer device pointer, then with ``dtype`` and ``shape`` (and ``strides``
        in bytes, default C-contiguous).  ``dtype`` may also reinterpret an array's elements
        ('bf16' for a uint16 array, 'tf32' for float32 ...).  ``box``: the box one instruction
        moves, natural order (``(rows, cols)``).  ``element_strides``: traversal step per
        dimension, 1..8 (the box then holds ``ceil(box / stride)`` elements per dimension).
        ``swizzle``: 0, 32, 64 or 128 (bytes).  ``interleave``: 0, 16 or 32 (bytes).
        ``l2_promotion``: 0, 64, 128 or 256 (bytes).  ``oob_fill``: 'zero' or 'nan' (floats;
        ``CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA``).

        The packed Blackwell types ('16u4_align8b', '16u4_align16b', '16u6_align16b') take the
        raw-pointer form only: ``shape`` counts 4- or 6-bit values, ``strides`` are bytes (of
        the outer axes; the innermost is the packed value size).  The driver allows
        '16u4_align16b' with 128B swizzle for loads only; a TensorMap cannot know the direction.

        Every documented rule is checked first (ValueError / TypeError); see the module
        docstring.  A refusal by the driver raises :class:`TensorMapError`.
        """
        t, address, shape, strides, owner = _describe_source(tensor, dtype, shape, strides)
        params = check_tiled(t, address, shape, strides, box, element_strides, interleave,
                             swizzle, l2_promotion, oob_fill)
        driver_params = _driver_params(params)
        driver_params["boxDim"] = params["box"][::-1]
        driver_params = _ordered(driver_params, tiled=True)
        encoded = None if _simulated() else _encode("Tiled", driver_params)
        return cls("tiled", params, driver_params, encoded, owner)

    @classmethod
    def im2col(cls, tensor, *, channels_per_pixel, pixels_per_column, lower_corner,
               upper_corner, dtype=None, shape=None, strides=None, element_strides=None,
               swizzle=0, interleave=0, l2_promotion=128, oob_fill="zero"):
        """An im2col tensor map (``cuTensorMapEncodeIm2col``; PTX ISA 5.5, "Tensors": im2col
        mode).

        ``tensor`` is a rank 3..5 channels-last tensor, natural order ``(N, W, C)``,
        ``(N, H, W, C)`` or ``(N, D, H, W, C)``.  ``lower_corner`` / ``upper_corner``: the
        pixel bounding box's offsets from the tensor's first and last pixel, one per spatial
        dimension in natural order (``(h, w)``); for a convolution with padding ``p``, filter
        ``r`` and dilation ``s`` per dimension these are ``-p_lo`` and ``p_hi - (r - 1) * s``.
        ``channels_per_pixel`` (1..256) channels of ``pixels_per_column`` (1..1024) pixels are
        loaded per instruction; ``element_strides`` are the traversal (convolution) strides.
        Other parameters as for :meth:`tiled`.
        """
        t, address, shape, strides, owner = _describe_source(tensor, dtype, shape, strides)
        params = check_im2col(t, address, shape, strides, lower_corner, upper_corner,
                              channels_per_pixel, pixels_per_column, element_strides,
                              interleave, swizzle, l2_promotion, oob_fill)
        driver_params = _driver_params(params)
        driver_params["pixelBoxLowerCorner"] = params["lower_corner"][::-1]
        driver_params["pixelBoxUpperCorner"] = params["upper_corner"][::-1]
        driver_params["channelsPerPixel"] = params["channels_per_pixel"]
        driver_params["pixelsPerColumn"] = params["pixels_per_column"]
        driver_params = _ordered(driver_params, tiled=False)
        encoded = None if _simulated() else _encode("Im2col", driver_params)
        return cls("im2col", params, driver_params, encoded, owner)

    # -- where a copy may start -----------------------------------------------------------------

    def check_start(self, coords, op="load"):
        """Check a box start known on the host: ``coords`` in device order (innermost first, as
        ``tma_load`` takes them), one per dimension; ``op`` 'load' or 'store'.  Returns them as
        a tuple of ints, or raises ValueError naming the rule (:func:`start_problem`) and, for
        the 16-byte rule, the nearest legal starts.
        """
        where = f"TensorMap.{self.mode}.check_start"
        coords = _ints(where, "coords (innermost first)", coords, self.rank)
        problem = start_problem(self.dtype, coords, self.mode, op)
        if problem is not None and (coords[0] * self.dtype.element_bytes) % START_ALIGN == 0:
            raise ValueError(f"{where}: the box at coords {coords} (innermost first) cannot be "
                             f"stored: {problem}")
        if problem is not None:
            step = int(START_ALIGN // self.dtype.element_bytes) or 1
            lower = coords[0] - coords[0] % step
            raise ValueError(
                f"{where}: the box at coords {coords} (innermost first) cannot be copied: "
                f"{problem}; e.g. innermost {lower} or {lower + step}"
            )
        return coords

    # -- derived values ------------------------------------------------------------------------

    @property
    def rank(self):
        return len(self.shape)

    @property
    def global_dim(self):
        """The dimensions as the driver and the device coordinates see them: innermost first."""
        return self.shape[::-1]

    @property
    def smem_box(self):
        """Elements one load writes to shared memory per dimension (natural order).

        Tiled: ``ceil(box / element_stride)`` per dimension, except that the innermost
        element stride is ignored without interleave.  im2col: ``(pixels_per_column,
        channels_per_pixel)``.
        """
        if self.mode == "im2col":
            return (self.pixels_per_column, self.channels_per_pixel)
        out = []
        for axis, (b, e) in enumerate(zip(self.box, self.element_strides)):
            if axis == self.rank - 1 and self.interleave == 0:
                e = 1
            out.append(-(-b // e))
        return tuple(out)

    @property
    def box_bytes(self):
        """Bytes one load delivers to shared memory (out-of-bounds fill included): the count
        to give ``mbarrier.arrive.expect_tx``."""
        return prod(self.smem_box) * self.dtype.smem_bits // 8

    @property
    def smem_row_bytes(self):
        """Bytes of one box row (the innermost extent) in shared memory."""
        return self.smem_box[-1] * self.dtype.smem_bits // 8

    @property
    def smem_bytes(self):
        """Bytes of shared memory one load spans from its base (:func:`smem_row_pitch`): what to
        allocate per box.  Equal to :attr:`box_bytes` unless narrow rows are padded."""
        rows = prod(self.smem_box[:-1])
        return rows * smem_row_pitch(self.smem_row_bytes, self.swizzle)

    @property
    def words(self):
        """The encoded 128-byte map as 16 host ``uint64`` words."""
        if self.encoded is None:
            raise TensorMapError(
                "TensorMap.words: under numba's simulator there is no CUDA driver; the map was "
                "checked against every documented rule but not encoded"
            )
        return np.array([int(w) for w in self.encoded.opaque], dtype=np.uint64)

    @property
    def param(self):
        """The map as a kernel argument passed by value (an
        :class:`intrinsics.grid_constant.TensorMapParam`, numba type ``tensormap_param``): no
        device memory, no copy; the launch carries its 128 bytes (see
        :mod:`intrinsics.grid_constant`).  Made once."""
        param = self._param
        if param is None:
            from intrinsics.grid_constant import TensorMapParam

            blob = None if self.encoded is None else self.words.tobytes()
            param = self._param = TensorMapParam(self, blob)
        return param

    @property
    def device(self):
        """The map in device memory (a numba device array of 16 ``uint64``), copied once.

        Under numba's simulator: a simulator array of 16 words that carries this TensorMap, so
        that the emulated TMA instructions find its parameters and source array
        (:func:`intrinsics.emulate.tma.device_tensormap`)."""
        if self._device is None and self.encoded is None:
            from intrinsics.emulate.tma import device_tensormap

            self._device = device_tensormap(self)
        if self._device is None:
            from numba import cuda

            array = cuda.to_device(self.words)
            address = array.__cuda_array_interface__["data"][0]
            if address % 64:
                raise TensorMapError(
                    f"the device copy of the tensor map sits at {address:#x}, which is not "
                    f"64-byte aligned as TMA requires"
                )
            self._device = array
        return self._device

    def __repr__(self):
        def bytes_(v):
            return f"{v}B" if v else "none"

        if self.mode == "tiled":
            geometry = f"box={self.box}"
        else:
            geometry = (
                f"lower_corner={self.lower_corner}, upper_corner={self.upper_corner}, "
                f"channels_per_pixel={self.channels_per_pixel}, "
                f"pixels_per_column={self.pixels_per_column}"
            )
        return (
            f"TensorMap.{self.mode}({self.dtype.name}, shape={self.shape}, "
            f"strides={self.strides}, {geometry}, element_strides={self.element_strides}, "
            f"swizzle={bytes_(self.swizzle)}, interleave={bytes_(self.interleave)}, "
            f"l2_promotion={bytes_(self.l2_promotion)}, oob_fill={self.oob_fill}, "
            f"address={self.address:#x})"
        )


def _driver_params(params):
    """The parameters shared by both encoders, in the driver's terms and order."""
    t = params["dtype"]
    return {
        "tensorDataType": t.enum,
        "tensorRank": len(params["shape"]),
        "globalAddress": params["address"],
        "globalDim": params["shape"][::-1],
        "globalStrides": tuple(params["strides"][:-1][::-1]),
        "elementStrides": params["element_strides"][::-1],
        "interleave": "CU_TENSOR_MAP_INTERLEAVE_" + INTERLEAVES[params["interleave"]],
        "swizzle": "CU_TENSOR_MAP_SWIZZLE_" + SWIZZLES[params["swizzle"]],
        "l2Promotion": "CU_TENSOR_MAP_L2_PROMOTION_" + L2_PROMOTIONS[params["l2_promotion"]],
        "oobFill": "CU_TENSOR_MAP_FLOAT_OOB_FILL_" + OOB_FILLS[params["oob_fill"]],
    }


_TILED_ORDER = ["tensorDataType", "tensorRank", "globalAddress", "globalDim", "globalStrides",
                "boxDim", "elementStrides", "interleave", "swizzle", "l2Promotion", "oobFill"]
_IM2COL_ORDER = ["tensorDataType", "tensorRank", "globalAddress", "globalDim", "globalStrides",
                 "pixelBoxLowerCorner", "pixelBoxUpperCorner", "channelsPerPixel",
                 "pixelsPerColumn", "elementStrides", "interleave", "swizzle", "l2Promotion",
                 "oobFill"]


def _ordered(params, tiled):
    return {k: params[k] for k in (_TILED_ORDER if tiled else _IM2COL_ORDER)}
