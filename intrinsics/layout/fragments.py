"""Where each element of a register fragment lives: the PTX ISA's fragment tables as data.

``mma_fragment(spec, operand)`` returns an integer array ``(32, registers, elements_per_register,
2)`` holding, for lane ``l``, register ``r`` and packed element ``e`` (lowest bits first), the
``(row, column)`` of that element in the operand's matrix: A is M x K, B is K x N, C and D are
M x N.  ``ldmatrix_fragment(trans)`` does the same for one 8x8 matrix of ldmatrix/stmatrix/movmatrix.

Written from PTX ISA 9.7.14.5.8 - 9.7.14.5.14 (the "Matrix fragments for mma.m16n8k*" sections)
with ``g = lane // 4`` (groupID) and ``t = lane % 4`` (threadID_in_group).  The GPU lane tests check
these maps against the hardware, and the emulation and layout tools read them, so a mistake here
cannot hide.

The block-scaled forms of sm_120a (``intrinsics.mma.MmaBlockScaleSpec``) have their own maps:
``mma_block_scale_fragment(spec, operand)`` for A, B, C/D and ``mma_scale_fragment(spec, operand,
byte_id, thread_id)`` for the bytes of the scale-factor registers (PTX ISA 9.7.14.3, "Block
Scaling for mma.sync"; the m16n8k64 / m16n8k32 fragment sections of 9.7.14.5).

wgmma's warpgroup fragments (PTX ISA 9.7.15.5.1.1) are :func:`accumulator_coords` (D, every K and
type) and :func:`a_fragment_coords` (A in registers, the RS form): (rows, cols) arrays of shape
(128 threads, elements).
"""

import numpy as np

__all__ = [
    "a_fragment_coords",
    "accumulator_coords",
    "elements_per_register",
    "ldmatrix_fragment",
    "mma_block_scale_fragment",
    "mma_fragment",
    "mma_scale_fragment",
    "pack_fragment",
    "pack_scale_fragment",
    "unpack_fragment",
    "unpack_scale_fragment",
]

_ELEM_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8,
              "f32": 32, "s32": 32, "f64": 64}


def _c_layout(lane, reg, elem, pairs):
    """The m16n8 accumulator: pairs of columns 2t, 2t+1 in rows g and g+8."""
    g, t = lane // 4, lane % 4
    index = reg * pairs + elem  # element index c0..c3
    return g + 8 * (index // 2), 2 * t + index % 2


def _a_16bit(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    # reg 0: (g, 2t..), reg 1: (g+8, 2t..), reg 2: (g, 2t+8..), reg 3: (g+8, 2t+8..)
    return g + 8 * (reg % 2), 2 * t + elem + 8 * (reg // 2)


def _b_16bit(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    return 2 * t + elem + 8 * reg, g


def _a_8bit(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 4 * t + elem + 16 * (reg // 2)


def _b_8bit(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    return 4 * t + elem + 16 * reg, g


def _a_tf32(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    # m16n8k8: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); m16n8k4: a0, a1 only.
    return g + 8 * (reg % 2), t + 4 * (reg // 2)


def _b_tf32(shape, lane, reg, elem):
    g, t = lane // 4, lane % 4
    return t + 4 * reg, g


def _a_f64(shape, lane, reg, elem):
    return lane // 4, lane % 4


def _b_f64(shape, lane, reg, elem):
    return lane % 4, lane // 4


def _c_f64(lane, reg, elem):
    return lane // 4, 2 * (lane % 4) + reg


def _family(ptx_type):
    if ptx_type in ("f16", "bf16"):
        return "16bit"
    if ptx_type in ("e4m3", "e5m2", "s8", "u8"):
        return "8bit"
    return ptx_type


_A = {"16bit": _a_16bit, "8bit": _a_8bit, "tf32": _a_tf32, "f64": _a_f64}
_B = {"16bit": _b_16bit, "8bit": _b_8bit, "tf32": _b_tf32, "f64": _b_f64}


def elements_per_register(ptx_type):
    return max(1, 32 // _ELEM_BITS[ptx_type])


def mma_fragment(spec, operand):
    """(32, registers, elements per register, 2) array of (row, col) for operand 'a', 'b', 'c'
    (C and D share a layout) of an :class:`intrinsics.mma.MmaSpec`."""
    operand = operand.lower()
    if operand == "d":
        operand = "c"
    ptx_type = {"a": spec.a, "b": spec.b, "c": spec.acc}[operand]
    regs = {"a": spec.a_regs, "b": spec.b_regs, "c": spec.c_regs}[operand]
    per = elements_per_register(ptx_type)
    out = np.zeros((32, regs, per, 2), dtype=np.int64)
    for lane in range(32):
        for reg in range(regs):
            for elem in range(per):
                if operand == "c":
                    if ptx_type == "f64":
                        rc = _c_f64(lane, reg, elem)
                    else:
                        rc = _c_layout(lane, reg, elem, per)
                elif operand == "a":
                    rc = _A[_family(ptx_type)](spec.shape, lane, reg, elem)
                else:
                    rc = _B[_family(ptx_type)](spec.shape, lane, reg, elem)
                out[lane, reg, elem] = rc
    return out


def ldmatrix_fragment(trans=False):
    """(32, 2, 2) array: lane ``l``'s two 16-bit elements (low half first) of one 8x8 matrix
    loaded by ldmatrix (or stored by stmatrix), as (row, col) of that matrix."""
    out = np.zeros((32, 2, 2), dtype=np.int64)
    for lane in range(32):
        for elem in range(2):
            row, col = lane // 4, 2 * (lane % 4) + elem
            out[lane, elem] = (col, row) if trans else (row, col)
    return out


def pack_fragment(matrix_bits, fmap, bits):
    """Gather the per-lane registers of a fragment from a matrix of raw element bits.

    ``matrix_bits`` holds unsigned integers of width ``bits``; returns uint32 registers
    ``(32, registers)`` (uint64 for 64-bit elements), lowest element in the lowest bits."""
    lanes, regs, per, _ = fmap.shape
    dtype = np.uint64 if bits == 64 else np.uint32
    out = np.zeros((lanes, regs), dtype=dtype)
    for e in range(per):
        values = matrix_bits[fmap[:, :, e, 0], fmap[:, :, e, 1]].astype(dtype)
        out |= values << dtype(bits * e)
    return out


def unpack_fragment(registers, fmap, bits, shape):
    """Scatter per-lane registers back into a matrix of raw element bits (inverse of pack)."""
    lanes, regs, per, _ = fmap.shape
    dtype = np.uint64 if bits == 64 else np.uint32
    registers = registers.astype(dtype)
    mask = dtype((1 << bits) - 1) if bits < 64 else dtype(0xFFFFFFFFFFFFFFFF)
    out = np.zeros(shape, dtype=dtype)
    for e in range(per):
        out[fmap[:, :, e, 0], fmap[:, :, e, 1]] = (registers >> dtype(bits * e)) & mask
    return out

# ---------------------------------------------------------------------------------------------
# Block-scaled mma.sync (kind::mxf4 / mxf4nvf4 m16n8k64, kind::mxf8f6f4 m16n8k32)
# ---------------------------------------------------------------------------------------------


def _a_4bit(lane, reg, elem):
    """m16n8k64 A with eight e2m1 per register (PTX ISA "Matrix Fragments for mma.m16n8k64",
    the .e2m1 rows): a0..a7 row g, a8..a15 row g+8, a16..a23 row g, a24..a31 row g+8; columns
    8t .. 8t+7, plus 32 for a16..a31."""
    g, t = lane // 4, lane % 4
    return g + 8 * (reg % 2), 8 * t + elem + 32 * (reg // 2)


def _b_4bit(lane, reg, elem):
    """m16n8k64 B: b0..b7 rows 8t .. 8t+7, b8..b15 rows 8t+32 .., column g."""
    g, t = lane // 4, lane % 4
    return 8 * t + elem + 32 * reg, g


def mma_block_scale_fragment(spec, operand):
    """(32, registers, elements per register, 2) array of (row, col) for operand 'a' (M x K),
    'b' (K x N) or 'c'/'d' (M x N) of a block-scaled form (:class:`intrinsics.mma.MmaBlockScaleSpec`).

    kind::mxf4 / mxf4nvf4 (m16n8k64): eight 4-bit e2m1 per register, the lowest K in the low
    nibble.  kind::mxf8f6f4 (m16n8k32): four 8-bit containers per register laid out as the 8-bit
    m16n8k32 forms (an e2m1 sits in bits 5-2 of its byte, an e2m3/e3m2 in bits 5-0).
    C/D: the m16n8 f32 accumulator of every mma.sync."""
    operand = operand.lower()
    if operand == "d":
        operand = "c"
    regs = {"a": spec.a_regs, "b": spec.b_regs, "c": spec.c_regs}[operand]
    per = 1 if operand == "c" else 32 // spec.element_bits
    if operand == "a":
        layout = _a_4bit if spec.packed else (lambda l, r, e: _a_8bit(spec.shape, l, r, e))
    elif operand == "b":
        layout = _b_4bit if spec.packed else (lambda l, r, e: _b_8bit(spec.shape, l, r, e))
    else:
        layout = lambda l, r, e: _c_layout(l, r, e, 1)  # noqa: E731
    out = np.zeros((32, regs, per, 2), dtype=np.int64)
    for lane in range(32):
        for reg in range(regs):
            for elem in range(per):
                out[lane, reg, elem] = layout(lane, reg, elem)
    return out


def mma_scale_fragment(spec, operand, byte_id=0, thread_id=0):
    """(32, 4, 2) array: for lane ``l`` and byte ``j`` (lowest first) of its scale-factor register
    (``scale-a-data`` for operand 'a', ``scale-b-data`` for 'b'), the (row, column) of the scale
    matrix that byte supplies -- scale_A is M x X (one row per row of A, X = 1, 2, 4 for
    scale_vec::1X/2X/4X, column j scaling K block j), scale_B is X x N -- or (-1, -1) where the
    instruction does not read the byte.

    From PTX ISA 9.7.14.3 ("Block Scaling for mma.sync": the thread-id and byte-id rules, Figures
    43-45, Table 37) and CUTLASS's SM120 block-scaled MMA traits (``SFALayout`` / ``SFBLayout`` in
    cute/atom/mma_traits_sm120.hpp), which fix the row each lane of a pair holds:

    - scale_A: one thread pair per quad, ``thread_id`` 0 lanes 4g, 4g+1 and 1 lanes 4g+2, 4g+3;
      the even lane of the pair holds row g, the odd one row g+8 (A's two rows in quad g).
    - scale_B: one thread per quad, lane 4g + ``thread_id``, holds column g.
    - bytes: scale_vec::1X reads byte ``byte_id`` (0..3); 2X the pair ``byte_id``, ``byte_id``+1
      (``byte_id`` 0 or 2); 4X all four (``byte_id`` 0); byte ``byte_id`` + j is block j.
    """
    operand = operand.lower()
    count = spec.scale_count
    valid_byte, valid_thread = spec.selectors[0:2] if operand == "a" else spec.selectors[2:4]
    if byte_id not in valid_byte or thread_id not in valid_thread:
        raise ValueError(
            f"scale_vec::{spec.scale_vec} operand {operand}: byte-id must be in {list(valid_byte)} "
            f"and thread-id in {list(valid_thread)}, got {byte_id}, {thread_id}")
    out = np.full((32, 4, 2), -1, dtype=np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if operand == "a":
            if t // 2 != thread_id:
                continue
            row = g + 8 * (t % 2)
            for j in range(count):
                out[lane, byte_id + j] = (row, j)
        else:
            if t != thread_id:
                continue
            for j in range(count):
                out[lane, byte_id + j] = (j, g)
    return out


def pack_scale_fragment(scale_codes, smap, fill=None):
    """Per-lane scale registers (32,) uint32 from a matrix of 8-bit scale codes through a
    :func:`mma_scale_fragment` map.  Bytes the instruction does not read take ``fill`` (a (32, 4)
    array of bytes, e.g. random junk to show that they are ignored), zero by default."""
    codes = np.asarray(scale_codes).astype(np.uint32) & np.uint32(0xFF)
    out = np.zeros(32, dtype=np.uint32)
    for j in range(4):
        used = smap[:, j, 0] >= 0
        byte = np.zeros(32, dtype=np.uint32)
        byte[used] = codes[smap[used, j, 0], smap[used, j, 1]]
        if fill is not None:
            byte[~used] = np.asarray(fill)[~used, j].astype(np.uint32) & np.uint32(0xFF)
        out |= byte << np.uint32(8 * j)
    return out


def unpack_scale_fragment(registers, smap, shape):
    """The scale matrix (8-bit codes, ``shape``) that the instruction reads from the per-lane
    registers (32,) through a :func:`mma_scale_fragment` map (inverse of pack)."""
    registers = np.asarray(registers).astype(np.uint32)
    out = np.zeros(shape, dtype=np.uint32)
    for j in range(4):
        used = smap[:, j, 0] >= 0
        out[smap[used, j, 0], smap[used, j, 1]] = (registers[used] >> np.uint32(8 * j)) & 0xFF
    return out


# ---------------------------------------------------------------------------------------------
# wgmma (warpgroup) fragments
# ---------------------------------------------------------------------------------------------


def _thread_parts():
    t = np.arange(128)[:, None]
    return 16 * (t // 32), (t % 32) // 4, t % 4  # 16 * warp, groupID, threadID_in_group


def accumulator_coords(n):
    """(rows, cols) of accumulator element v of thread t (arrays of shape (128, n/2)) for
    m64nN (PTX ISA 9.7.15.5.1.1, "Matrix fragments for wgmma .m64nNk16", accumulator D; the same
    map for every K and type).  Warp w holds rows 16w..16w+15 like an mma.sync m16n8 C fragment
    repeated every 8 columns::

        row = 16*w + lane/4 + 8*((v/2) % 2)        col = 8*(v/4) + 2*(lane%4) + v%2

    f32: register i is element i.  f16: register r packs elements 2r (low 16 bits) and 2r+1."""
    w16, g, c = _thread_parts()
    v = np.arange(n // 2)[None, :]
    return w16 + g + 8 * ((v // 2) % 2), 8 * (v // 4) + 2 * c + v % 2


def a_fragment_coords(elem_bytes):
    """(rows, cols) of A element v of thread t for the RS form (PTX ISA 9.7.15.5.1.1, matrix A
    in registers): the mma.sync m16n8k{8,16,32} A fragment of each warp, warp w taking rows
    16w..16w+15.  Register r packs elements v = r*(4/elem_bytes) ... (low bits first).

        2-byte (k16): row = 16w + lane/4 + 8*((v/2)%2)   col = 2*(lane%4) + v%2 + 8*(v/4)
        1-byte (k32): row = 16w + lane/4 + 8*((v/4)%2)   col = 4*(lane%4) + v%4 + 16*(v/8)
        4-byte (k8):  row = 16w + lane/4 + 8*(v%2)       col = lane%4 + 4*(v/2)
    """
    w16, g, c = _thread_parts()
    if elem_bytes == 2:
        v = np.arange(8)[None, :]
        return w16 + g + 8 * ((v // 2) % 2), 2 * c + v % 2 + 8 * (v // 4)
    if elem_bytes == 1:
        v = np.arange(16)[None, :]
        return w16 + g + 8 * ((v // 4) % 2), 4 * c + v % 4 + 16 * (v // 8)
    if elem_bytes == 4:
        v = np.arange(4)[None, :]
        return w16 + g + 8 * (v % 2), c + 4 * (v // 2)
    raise ValueError(f"elem_bytes must be 1, 2 or 4, got {elem_bytes!r}")
