"""Emulation of intrinsics.convert: the cvt roundings, bit for bit (see numerics.py)."""

import numpy as np

from intrinsics.emulate.numerics import decode, encode


def _pair(fmt):
    def pack(lo, hi):
        bits = encode(np.array([lo, hi], dtype=np.float32), fmt)
        return np.uint32(int(bits[0]) | int(bits[1]) << 16)

    return pack


def _unpack(fmt):
    def unpack(packed):
        packed = int(packed)
        values = decode(np.array([packed & 0xFFFF, packed >> 16]), fmt).astype(np.float32)
        return (values[0], values[1])

    return unpack


def _quad(fmt):
    def pack(x0, x1, x2, x3):
        bits = encode(np.array([x0, x1, x2, x3], dtype=np.float32).astype(np.float64), fmt,
                      saturate=True)
        return np.uint32(int(bits[0]) | int(bits[1]) << 8 | int(bits[2]) << 16 | int(bits[3]) << 24)

    return pack


def _fragment(fmt):
    pair = _pair(fmt)

    def pack(p):
        regs = [pair(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)]
        return tuple(tuple(regs[4 * c:4 * c + 4]) for c in range(len(regs) // 4))

    return pack


def cvt_tf32(x):
    return np.uint32(encode(np.array([x], dtype=np.float32), "tf32", rounding="rna")[0])


def f32_from_bits(bits):
    return np.array([int(bits) & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


def bits_from_f32(x):
    return np.array([x], dtype=np.float32).view(np.uint32)[0]


EMULATIONS = {
    "f32_from_bits": f32_from_bits,
    "bits_from_f32": bits_from_f32,
    "pack_bf16x2": _pair("bf16"),
    "pack_f16x2": _pair("f16"),
    "frag_pack_bf16x2": _fragment("bf16"),
    "frag_pack_f16x2": _fragment("f16"),
    "unpack_bf16x2": _unpack("bf16"),
    "unpack_f16x2": _unpack("f16"),
    "pack_e4m3x4": _quad("e4m3"),
    "pack_e5m2x4": _quad("e5m2"),
    "cvt_tf32": cvt_tf32,
}
