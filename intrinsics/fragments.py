"""Where each element of a warp-level fragment lives: the PTX ISA's fragment tables as data.

``mma_fragment(spec, operand)`` returns an integer array ``(32, registers, elements_per_register,
2)`` holding, for lane ``l``, register ``r`` and packed element ``e`` (lowest bits first), the
``(row, column)`` of that element in the operand's matrix: A is M x K, B is K x N, C and D are
M x N.  ``ldmatrix_fragment(trans)`` does the same for one 8x8 matrix of ldmatrix/stmatrix/movmatrix.

Written from PTX ISA 9.7.14.5.8 - 9.7.14.5.14 (the "Matrix fragments for mma.m16n8k*" sections)
with ``g = lane // 4`` (groupID) and ``t = lane % 4`` (threadID_in_group).  The GPU lane tests check
these maps against the hardware, and the emulation and layout tools read them, so a mistake here
cannot hide.
"""

import numpy as np

__all__ = ["ldmatrix_fragment", "mma_fragment", "pack_fragment", "unpack_fragment"]

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
