"""Emulation of mma.sync: the warp meets, its fragments are scattered into matrices through the
PTX ISA's fragment tables (intrinsics.layout.fragments), multiplied, and gathered back.

Numerics: inputs are decoded exactly (bf16/f16/fp8/tf32 as the tensor core reads them; tf32 drops
the low 13 mantissa bits), every product and the whole sum are formed in float64 and rounded once
to the accumulator format.  The hardware adds in a fixed order at fp32 (or better) precision with
its own rounding inside the adder tree, so a float result may differ from it in the last bits: by
at most about K * 2**-23 relative to sum(|a*b|) + |c| for fp32 accumulation.  Integer and f64
results are exact.

The block-scaled forms of sm_120a (``mma_sync_block_scale``) are modelled at the end of this
module; their numerics are stated in that factory's docstring.
"""

import numpy as np

from intrinsics.emulate.numerics import BITS, decode, encode
from intrinsics.emulate.runtime import EmulationError, collective
from intrinsics.emulate.tcgen05 import decode_minifloat  # e2m1/e2m3/e3m2, ue8m0, ue4m3 tables
from intrinsics.layout.fragments import (
    mma_block_scale_fragment,
    mma_fragment,
    mma_scale_fragment,
    pack_fragment,
    unpack_fragment,
    unpack_scale_fragment,
)
from intrinsics.mma import _find_block_scale_spec, _find_spec

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


# ---------------------------------------------------------------------------------------------
# Block-scaled mma.sync (sm_120a / sm_121a)
# ---------------------------------------------------------------------------------------------


def _block_scale_values(codes, spec, fmt):
    """Exact float64 values of an operand's element codes (from its fragment map).

    Packed kinds (mxf4 / mxf4nvf4): 4-bit e2m1 codes.  kind::mxf8f6f4: the 8-bit containers --
    e4m3/e5m2 whole, e2m1 in bits 5-2, e2m3/e3m2 in bits 5-0 (the other bits are ignored here;
    CUTLASS shifts e2m1 left by two for this kind: cute/atom/mma_traits_sm120.hpp fp4_shift_A)."""
    if fmt in ("e4m3", "e5m2"):
        return decode(codes, fmt)
    if fmt == "e2m1" and not spec.packed:
        codes = codes >> np.uint32(2)
    return decode_minifloat(codes, fmt)


def mma_sync_block_scale(shape, kind, scale_vec, a="e2m1", b=None, acc="f32", scale_type="ue8m0"):
    """Emulated block-scaled mma.sync.

    Semantics (PTX ISA 9.7.14.3): ``D = (A * scale_A) * (B * scale_B) + C`` where row m of A is cut
    into ``scale_count`` blocks of ``block`` K, block j scaled by scale_A[m, j], and column n of B
    likewise by scale_B[j, n].  The registers are scattered into A, B, scale_A, scale_B and C
    through ``intrinsics.layout.fragments`` (mma_block_scale_fragment, mma_scale_fragment) -- the
    selectors must be the same in all 32 lanes and inside PTX ISA Table 37, else EmulationError.

    Numerics assumed: every element and scale decoded exactly (e2m1, e2m3, e3m2, e4m3, e5m2,
    ue8m0 = 2**(code-127) with 0xFF NaN, ue4m3 = unsigned e4m3 with 0x7F NaN, bit 7 ignored);
    every product A*sa*B*sb exact and the whole sum plus C formed in float64, rounded once to
    float32 (round to nearest even).  The hardware sums in a fixed order at (at least) fp32 width
    with its own internal rounding, so results can differ in the last bits of float32 where the
    terms do not all fit one float32 mantissa; integer-valued power-of-two-scaled data whose sums
    stay below 2**24 are exact either way.  NOTE: never compared with Blackwell hardware.
    """
    b = a if b is None else b
    spec = _find_block_scale_spec(shape, kind, scale_vec, a, b, acc, scale_type)
    m, n, k = spec.mnk
    count, block = spec.scale_count, spec.block
    fa, fb, fc = (mma_block_scale_fragment(spec, x) for x in "abc")
    bits = spec.element_bits

    def compute(lanes):
        ordered = [lanes[i] for i in range(32)]
        selectors = {tuple(int(x) for x in v[5:9]) for v in ordered}
        if len(selectors) != 1:
            raise EmulationError(
                f"{spec.ptx}: the selectors (byte-id-a, thread-id-a, byte-id-b, thread-id-b) "
                f"differ between the lanes of the warp: {sorted(selectors)}")
        (bida, tida, bidb, tidb), = selectors
        for name, value, valid in zip(("byte-id-a", "thread-id-a", "byte-id-b", "thread-id-b"),
                                      (bida, tida, bidb, tidb), spec.selectors):
            if value not in valid:
                raise EmulationError(
                    f"{spec.ptx}: {name} must be one of {list(valid)} for "
                    f"scale_vec::{spec.scale_vec} (PTX ISA Table 37), got {value}")
        A = _block_scale_values(unpack_fragment(
            _registers([v[0] for v in ordered], spec.a_regs, "u32"), fa, bits, (m, k)), spec, spec.a)
        B = _block_scale_values(unpack_fragment(
            _registers([v[1] for v in ordered], spec.b_regs, "u32"), fb, bits, (k, n)), spec, spec.b)
        C = decode(unpack_fragment(
            _registers([v[2] for v in ordered], spec.c_regs, "f32"), fc, 32, (m, n)), "f32")
        sfa = np.array([int(v[3]) & 0xFFFFFFFF for v in ordered], dtype=np.uint32)
        sfb = np.array([int(v[4]) & 0xFFFFFFFF for v in ordered], dtype=np.uint32)
        SA = decode_minifloat(unpack_scale_fragment(
            sfa, mma_scale_fragment(spec, "a", bida, tida), (m, count)), spec.scale_type)
        SB = decode_minifloat(unpack_scale_fragment(
            sfb, mma_scale_fragment(spec, "b", bidb, tidb), (count, n)), spec.scale_type)
        # (A * scale_A) and (B * scale_B): every K of block j takes that block's factor.
        with np.errstate(all="ignore"):
            D = (A * np.repeat(SA, block, axis=1)) @ (B * np.repeat(SB, block, axis=0)) + C
        regs = pack_fragment(encode(D.astype(np.float32), "f32"), fc, 32).view(np.float32)
        return [tuple(np.float32(x) for x in regs[lane]) for lane in range(32)]

    def mma(a_frag, b_frag, c_frag, scale_a, scale_b, byte_id_a, thread_id_a, byte_id_b,
            thread_id_b):
        value = (a_frag, b_frag, c_frag, scale_a, scale_b, byte_id_a, thread_id_a, byte_id_b,
                 thread_id_b)
        return collective("warp", spec.ptx, value, compute)

    mma.spec = spec
    mma.__name__ = "mma_bs_" + "_".join(
        (spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b, spec.scale_type))
    return mma


FACTORIES["mma_sync_block_scale"] = mma_sync_block_scale
