"""Bit-exact encodings of the tensor-core number formats, in NumPy (no ml_dtypes needed).

``decode(bits, fmt)`` gives the exact float64 value of raw bits; ``encode(values, fmt, rounding)``
rounds float64/float32 values to the format: round to nearest even ("rn"), nearest with ties away
from zero ("rna", tf32's cvt.rna), and for the 8-bit float formats ``satfinite`` clamps to the
largest finite value as ``cvt.rn.satfinite`` does.
"""

import functools

import numpy as np

__all__ = ["BITS", "decode", "encode"]

BITS = {"f16": 16, "bf16": 16, "tf32": 32, "f32": 32, "f64": 64, "e4m3": 8, "e5m2": 8,
        "s8": 8, "u8": 8, "s32": 32}


@functools.cache
def _fp8_table(fmt):
    """All 256 values of an 8-bit float format (NaN where the code is NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    if fmt == "e4m3":  # e4m3fn: bias 7, no infinities, S.1111.111 is NaN
        exp, man, bias, mbits = (codes >> 3) & 0xF, codes & 0x7, 7, 3
    else:  # e5m2: bias 15, IEEE-like infinities and NaNs
        exp, man, bias, mbits = (codes >> 2) & 0x1F, codes & 0x3, 15, 2
    normal = (1.0 + man / 2.0**mbits) * 2.0 ** (exp.astype(np.float64) - bias)
    subnormal = (man / 2.0**mbits) * 2.0 ** (1 - bias)
    values = sign * np.where(exp == 0, subnormal, normal)
    if fmt == "e4m3":
        values[(codes & 0x7F) == 0x7F] = np.nan
    else:
        values[((codes >> 2) & 0x1F) == 0x1F] = np.nan
        values[(codes & 0x7F) == 0x7C] = sign[(codes & 0x7F) == 0x7C] * np.inf
    return values


def decode(bits, fmt):
    """Exact float64 values of raw ``bits`` in format ``fmt`` (integers for s8/u8/s32)."""
    with np.errstate(all="ignore"):
        return _decode(np.asarray(bits), fmt)


def _decode(bits, fmt):
    if fmt == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if fmt in ("tf32", "f32"):
        b = bits.astype(np.uint32)
        if fmt == "tf32":  # the tensor core ignores the low 13 mantissa bits
            b = b & np.uint32(0xFFFFE000)
        return b.view(np.float32).astype(np.float64)
    if fmt == "f64":
        return bits.astype(np.uint64).view(np.float64)
    if fmt in ("e4m3", "e5m2"):
        return _fp8_table(fmt)[bits.astype(np.uint32) & 0xFF]
    if fmt == "s8":
        return bits.astype(np.uint32).astype(np.uint8).view(np.int8).astype(np.float64)
    if fmt == "u8":
        return (bits.astype(np.uint32) & 0xFF).astype(np.float64)
    if fmt == "s32":
        return bits.astype(np.uint32).view(np.int32).astype(np.float64)
    raise ValueError(f"unknown format {fmt!r}")


def _round_float(values, mant_bits, rounding):
    """Round float32 values to ``mant_bits`` explicit mantissa bits, keeping float32 storage."""
    x = np.asarray(values, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    drop = 23 - mant_bits
    half = np.uint64(1 << (drop - 1))
    if rounding == "rna":
        rounded = bits + half
    else:  # round to nearest even
        lsb = (bits >> np.uint64(drop)) & np.uint64(1)
        rounded = bits + half - np.uint64(1) + lsb
    rounded &= ~np.uint64((1 << drop) - 1)
    finite = np.isfinite(x)
    out = np.where(finite, rounded, bits).astype(np.uint32)
    return out


def _encode_fp8(values, fmt, saturate):
    table = _fp8_table(fmt)
    finite_codes = np.array([c for c in range(128) if np.isfinite(table[c])], dtype=np.uint32)
    mags = table[finite_codes]
    order = np.argsort(mags)
    mags, finite_codes = mags[order], finite_codes[order]
    x = np.asarray(values, dtype=np.float64)
    a = np.abs(x)
    largest = mags[-1]
    idx = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo, hi = mags[idx - 1], mags[idx]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (finite_codes[idx] % 2 == 0))
    code = np.where(pick_hi, finite_codes[idx], finite_codes[idx - 1])
    # Beyond the largest finite value: round-to-nearest overflows (to NaN for e4m3, inf for
    # e5m2) unless saturating.  Halfway to the next power of two still rounds down.
    step = largest - mags[-2]
    overflow = a >= largest + step / 2 if fmt == "e5m2" else a > largest + step / 2
    if saturate:
        code = np.where(a > largest, finite_codes[-1], code)
    else:
        code = np.where(overflow, 0x7C if fmt == "e5m2" else 0x7F, code)
    code = np.where(np.signbit(x), code | 0x80, code)
    code = np.where(np.isnan(x), 0x7F, code)
    if fmt == "e5m2" and not saturate:
        code = np.where(np.isinf(x), np.where(x > 0, 0x7C, 0xFC), code)
    return code.astype(np.uint32)


def encode(values, fmt, rounding="rn", saturate=False):
    """Raw bits (uint32 array, uint64 for f64) of ``values`` rounded to ``fmt``."""
    with np.errstate(all="ignore"):
        return _encode(np.asarray(values), fmt, rounding, saturate)


def _encode(x, fmt, rounding, saturate):
    if fmt == "f32":
        return x.astype(np.float32).view(np.uint32)
    if fmt == "f64":
        return x.astype(np.float64).view(np.uint64)
    if fmt == "f16":
        return x.astype(np.float16).view(np.uint16).astype(np.uint32)
    if fmt == "bf16":
        bits = _round_float(x, 7, rounding) >> np.uint32(16)
        # A NaN whose payload sits only in the dropped bits must stay a (quiet) NaN.
        return np.where(np.isnan(x), bits | np.uint32(0x40), bits)
    if fmt == "tf32":
        return _round_float(x, 10, rounding)
    if fmt in ("e4m3", "e5m2"):
        return _encode_fp8(x, fmt, saturate)
    if fmt == "s32":
        return x.astype(np.int64).astype(np.int32).view(np.uint32)
    raise ValueError(f"cannot encode to {fmt!r}")
