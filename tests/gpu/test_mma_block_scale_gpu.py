"""Block-scaled mma.sync (sm_120a / sm_121a: kind::mxf4, mxf4nvf4 m16n8k64, kind::mxf8f6f4
m16n8k32) on every lane, against a NumPy model built from the PTX ISA's fragment maps
(intrinsics.layout.fragments: mma_block_scale_fragment for A/B/C/D, mma_scale_fragment for the
bytes of the scale registers): random element codes, random scale factors, random valid
selectors, and random junk in every scale-register byte the instruction must not read.

NOTE: no Blackwell GPU was available when this was written.  ``test_every_lane`` (marker
gpu(cc=(12, 0))) has never run on hardware; ``test_every_lane_emulated`` runs the same check in
the CPU emulation (NUMBA_ENABLE_CUDASIM=1), which emulates an sm_90a device and so would skip a
cc=(12, 0) test."""

import functools

import numpy as np
import pytest
from numba import config, cuda

import intrinsics  # noqa: F401  (installs the emulation under the simulator)
from intrinsics.emulate.tcgen05 import decode_minifloat
from intrinsics.layout import (
    mma_block_scale_fragment,
    mma_scale_fragment,
    pack_fragment,
    pack_scale_fragment,
    unpack_fragment,
)
from intrinsics.mma import mma_block_scale_specs, mma_sync_block_scale
from tests.helpers import lanes

EMULATED = bool(config.ENABLE_CUDASIM)
SPECS = mma_block_scale_specs()
# Every fp4 form; for kind::mxf8f6f4 the five same-type pairs and a few mixed ones (the other
# pairs differ only in the decoding table, which the same-type pairs cover).
_MIXED = {("e4m3", "e2m1"), ("e2m1", "e5m2"), ("e3m2", "e2m3"), ("e2m3", "e4m3")}
FORMS = [s for s in SPECS if s.packed or s.a == s.b or (s.a, s.b) in _MIXED]


def _ids(spec):
    return f"{spec.kind}-{spec.scale_vec}-{spec.a}-{spec.b}-{spec.scale_type}"


# --- random data ------------------------------------------------------------------------------


def _element_codes(gen, shape, fmt, packed):
    """Random codes of ``fmt`` as the instruction reads them (containers for mxf8f6f4)."""
    if fmt == "e2m1":
        codes = gen.integers(0, 16, shape)
        return codes if packed else codes << 2  # mxf8f6f4: bits 5-2 of the byte
    if fmt in ("e2m3", "e3m2"):
        return gen.integers(0, 64, shape)  # bits 5-0, no NaN or infinity
    codes = gen.integers(0, 256, shape)
    if fmt == "e4m3":  # no NaN (S.1111.111)
        return np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes)
    return np.where((codes & 0x7C) == 0x7C, codes & 0x83, codes)  # e5m2: no inf / NaN


def _element_values(codes, fmt, packed):
    codes = np.asarray(codes)
    if fmt in ("e4m3", "e5m2"):
        return lanes.decode_any(codes.astype(np.uint8), fmt) if lanes.ml_dtypes else None
    if fmt == "e2m1" and not packed:
        codes = codes >> 2
    return decode_minifloat(codes, fmt)


def _scale_codes(gen, shape, scale_type):
    """Random scale factors of moderate size: ue8m0 2**-6 .. 2**6, ue4m3 2**-3 .. ~2**4 (and
    an occasional zero)."""
    if scale_type == "ue8m0":
        return gen.integers(127 - 6, 127 + 7, shape)
    codes = gen.integers(4 << 3, 11 << 3, shape)  # exponent field 4..10 -> 2**-3 .. 2**3 * 1.875
    return np.where(gen.random(shape) < 0.05, 0, codes)


def _scale_values(codes, scale_type):
    if scale_type == "ue8m0":
        return 2.0 ** (np.asarray(codes, dtype=np.float64) - 127)
    return lanes.decode_any(np.asarray(codes, dtype=np.uint8), "e4m3")


def _random_selectors(gen, spec):
    return tuple(int(gen.choice(valid)) for valid in spec.selectors)


# --- kernels ----------------------------------------------------------------------------------


@functools.cache
def _kernel(spec, literal):
    """Run-time selectors (16-bit registers) from ``sel``, or the literal ones in ``literal``."""
    mma = mma_sync_block_scale(spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b, spec.acc,
                               spec.scale_type)
    load4, load2, store4 = lanes.LOADERS[4], lanes.LOADERS[2], lanes.STORERS[4]
    if literal is None:
        @cuda.jit
        def kernel(a, b, c, s, sel, d):
            lane = cuda.threadIdx.x
            store4(d, lane, mma(load4(a, lane), load2(b, lane), load4(c, lane), s[lane, 0],
                                s[lane, 1], sel[0], sel[1], sel[2], sel[3]))
    else:
        bida, tida, bidb, tidb = literal

        @cuda.jit
        def kernel(a, b, c, s, sel, d):
            lane = cuda.threadIdx.x
            store4(d, lane, mma(load4(a, lane), load2(b, lane), load4(c, lane), s[lane, 0],
                                s[lane, 1], bida, tida, bidb, tidb))
    return kernel


def _check(spec, selectors, literal, gen):
    if not lanes.ml_dtypes:
        pytest.skip("ml_dtypes missing")
    m, n, k = spec.mnk
    count, block = spec.scale_count, spec.block
    bida, tida, bidb, tidb = selectors
    a_codes = _element_codes(gen, (m, k), spec.a, spec.packed)
    b_codes = _element_codes(gen, (k, n), spec.b, spec.packed)
    sa_codes = _scale_codes(gen, (m, count), spec.scale_type)
    sb_codes = _scale_codes(gen, (count, n), spec.scale_type)
    c = gen.standard_normal((m, n)).astype(np.float32)

    fa, fb, fc = (mma_block_scale_fragment(spec, x) for x in "abc")
    bits = spec.element_bits
    a_regs = pack_fragment(a_codes, fa, bits)
    b_regs = pack_fragment(b_codes, fb, bits)
    c_regs = pack_fragment(c.view(np.uint32), fc, 32).view(np.float32)
    junk = gen.integers(0, 256, (32, 4))  # in every byte the instruction must ignore
    s_regs = np.stack([
        pack_scale_fragment(sa_codes, mma_scale_fragment(spec, "a", bida, tida), junk),
        pack_scale_fragment(sb_codes, mma_scale_fragment(spec, "b", bidb, tidb), junk[::-1]),
    ], axis=1)
    d_dev = cuda.to_device(np.full((32, 4), np.nan, dtype=np.float32))
    _kernel(spec, literal)[1, 32](
        cuda.to_device(a_regs), cuda.to_device(b_regs), cuda.to_device(c_regs),
        cuda.to_device(s_regs), cuda.to_device(np.array(selectors, dtype=np.int32)), d_dev)
    d = unpack_fragment(d_dev.copy_to_host().view(np.uint32), fc, 32, (m, n)).view(np.float32)

    # D = (A * scale_A) (B * scale_B) + C, in float64 (every product is exact there)
    a = _element_values(a_codes, spec.a, spec.packed) * np.repeat(
        _scale_values(sa_codes, spec.scale_type), block, axis=1)
    b = _element_values(b_codes, spec.b, spec.packed) * np.repeat(
        _scale_values(sb_codes, spec.scale_type), block, axis=0)
    ref = a @ b + c
    scale = np.abs(a) @ np.abs(b) + np.abs(c)
    if EMULATED:  # the model: one rounding of the exact sum to float32
        np.testing.assert_array_equal(d, ref.astype(np.float32))
    # the hardware: fp32 accumulation with its own internal rounding
    err = np.abs(d.astype(np.float64) - ref)
    assert np.all(err <= 1e-5 * scale + 1e-30), f"max error {np.max(err / (scale + 1e-30))}"
    assert np.any(ref != c), "the data left D equal to C: the test would not see a wrong map"


@pytest.mark.gpu(cc=(12, 0))
@pytest.mark.parametrize("literal", [False, True], ids=["runtime-selectors", "literal-selectors"])
@pytest.mark.parametrize("spec", FORMS, ids=_ids)
def test_every_lane(spec, literal):
    gen = lanes.rng()
    selectors = _random_selectors(gen, spec)
    _check(spec, selectors, selectors if literal else None, gen)


@pytest.mark.emulation
@pytest.mark.skipif(not EMULATED, reason="the emulated twin of test_every_lane (NUMBA_ENABLE_CUDASIM=1)")
@pytest.mark.parametrize("spec", FORMS, ids=_ids)
def test_every_lane_emulated(spec):
    gen = lanes.rng()
    selectors = _random_selectors(gen, spec)
    _check(spec, selectors, selectors if gen.random() < 0.5 else None, gen)


@pytest.mark.emulation
@pytest.mark.skipif(not EMULATED, reason="emulation only")
def test_every_selector_nvfp4_emulated():
    """scale_vec::4X ue4m3 (NVFP4): each thread-id-a / thread-id-b pair picks other lanes."""
    spec = next(s for s in SPECS if s.scale_vec == "4X" and s.scale_type == "ue4m3")
    gen = lanes.rng()
    for tida in spec.selectors[1]:
        for tidb in spec.selectors[3]:
            _check(spec, (0, tida, 0, tidb), None, gen)


@pytest.mark.emulation
@pytest.mark.skipif(not EMULATED, reason="emulation only")
def test_selectors_must_agree_and_be_valid_emulated():
    from intrinsics.emulate.runtime import EmulationError

    spec = next(s for s in SPECS if s.scale_vec == "2X" and s.kind == "mxf4")
    mma = mma_sync_block_scale(spec.shape, spec.kind, spec.scale_vec, scale_type=spec.scale_type)

    @cuda.jit
    def kernel(sel, d):
        lane = cuda.threadIdx.x
        z = np.uint32(0)
        f = np.float32(0)
        r = mma((z, z, z, z), (z, z), (f, f, f, f), z, z, sel[lane, 0], sel[lane, 1],
                sel[lane, 2], sel[lane, 3])
        d[lane] = r[0]

    sel = np.zeros((32, 4), dtype=np.int32)
    sel[5, 1] = 1  # one lane disagrees
    with pytest.raises(EmulationError, match="differ between the lanes"):
        kernel[1, 32](sel, np.zeros(32, np.float32))
    sel[:] = 0
    sel[:, 0] = 1  # byte-id-a 1 is undefined for scale_vec::2X
    with pytest.raises(EmulationError, match=r"byte-id-a must be one of \[0, 2\]"):
        kernel[1, 32](sel, np.zeros(32, np.float32))
