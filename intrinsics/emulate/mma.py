"""Emulation of mma.sync: the warp meets, its fragments are scattered into matrices through the
PTX ISA's fragment tables (intrinsics.fragments), multiplied, and gathered back.

Numerics: inputs are decoded exactly (bf16/f16/fp8/tf32 as the tensor core reads them; tf32 drops
the low 13 mantissa bits), every product and the whole sum are formed in float64 and rounded once
to the accumulator format.  The hardware adds in a fixed order at fp32 (or better) precision with
its own rounding inside the adder tree, so a float result may differ from it in the last bits: by
at most about K * 2**-23 relative to sum(|a*b|) + |c| for fp32 accumulation.  Integer and f64
results are exact.
"""

import numpy as np

from intrinsics.emulate.numerics import BITS, decode, encode
from intrinsics.emulate.runtime import collective
from intrinsics.fragments import mma_fragment, pack_fragment, unpack_fragment
from intrinsics.mma import _find_spec

_SCALAR = {"f32": np.float32, "f16": np.uint32, "s32": np.int32, "f64": np.float64}


def _registers(values, count, fmt):
    """Raw register bits (32, count) of one operand from every lane's value(s)."""
    rows = [v if isinstance(v, tuple) else (v,) for v in values]
    if fmt == "f64":
        return np.array(rows, dtype=np.float64).view(np.uint64)
    if fmt == "f32":
        return np.array(rows, dtype=np.float32).view(np.uint32)
    return np.array([[int(x) & 0xFFFFFFFF for x in r] for r in rows], dtype=np.uint32)


def _matrix(regs, spec, operand, fmt, shape):
    fmap = mma_fragment(spec, operand)
    return decode(unpack_fragment(regs, fmap, BITS[fmt], shape), fmt)


def mma_sync(shape, a, b=None, acc="f32", *, satfinite=False):
    b = a if b is None else b
    spec = _find_spec(shape, a, b, acc, satfinite)
    m, n, k = spec.mnk

    def compute(lanes):
        ordered = [lanes[i] for i in range(32)]
        A = _matrix(_registers([v[0] for v in ordered], spec.a_regs, spec.a), spec, "a", spec.a, (m, k))
        B = _matrix(_registers([v[1] for v in ordered], spec.b_regs, spec.b), spec, "b", spec.b, (k, n))
        C = _matrix(_registers([v[2] for v in ordered], spec.c_regs, spec.acc), spec, "c", spec.acc, (m, n))
        D = A @ B + C
        if spec.acc == "s32":
            D = np.clip(D, -2**31, 2**31 - 1) if spec.satfinite else D
            bits = (D.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
        else:
            bits = encode(D.astype(np.float32) if spec.acc == "f32" else D, spec.acc)
        regs = pack_fragment(bits, mma_fragment(spec, "c"), BITS[spec.acc])
        if spec.acc == "f64":
            regs = regs.view(np.float64)
        elif spec.acc == "f32":
            regs = regs.view(np.float32)
        elif spec.acc == "s32":
            regs = regs.view(np.int32)
        out = []
        for lane in range(32):
            values = tuple(_SCALAR[spec.acc](x) for x in regs[lane])
            out.append(values if spec.c_regs > 1 else values[0])
        return out

    def mma(a_frag, b_frag, c_frag):
        return collective("warp", spec.ptx, (a_frag, b_frag, c_frag), compute)

    mma.spec = spec
    mma.__name__ = "mma_" + "_".join((spec.shape, spec.a, spec.b, spec.acc))
    return mma


FACTORIES = {"mma_sync": mma_sync}
