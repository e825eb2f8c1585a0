"""mma.sync on the GPU: every table row, every lane, against a float64 model built from the PTX
ISA's fragment tables (intrinsics.layout.fragments)."""

import functools

import numpy as np
import pytest
from numba import cuda

import intrinsics
from intrinsics.layout import mma_fragment, pack_fragment, unpack_fragment
from intrinsics.mma import mma_specs
from tests.helpers import lanes

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]

SPECS = mma_specs()
_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8,
         "f32": 32, "s32": 32, "f64": 64}


@functools.cache
def _kernel(spec):
    mma = intrinsics.mma_sync(spec.shape, spec.a, spec.b, spec.acc)
    load_a = lanes.LOADERS[spec.a_regs]
    load_b = lanes.LOADERS[spec.b_regs]
    load_c = lanes.LOADERS[spec.c_regs]
    store_d = lanes.STORERS[spec.c_regs]

    @cuda.jit
    def kernel(a, b, c, d):
        lane = cuda.threadIdx.x
        store_d(d, lane, mma(load_a(a, lane), load_b(b, lane), load_c(c, lane)))

    return kernel


def _register_array(regs, ptx_type):
    if ptx_type == "f64":
        return regs.view(np.float64)
    if ptx_type == "f32":
        return regs.astype(np.uint32).view(np.float32)
    if ptx_type == "s32":
        return regs.astype(np.uint32).view(np.int32)
    return regs.astype(np.uint32)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.shape}-{s.a}-{s.b}-{s.acc}")
def test_mma_every_lane(spec, device_cc):
    if spec.arch.minimum == (8, 9) and device_cc < (8, 9):
        pytest.skip("fp8 mma needs sm_89")
    if spec.a in ("bf16", "e4m3", "e5m2") and lanes.ml_dtypes is None:
        pytest.skip("ml_dtypes missing")
    gen = lanes.rng()
    m, n, k = spec.mnk
    a = lanes.random_values(gen, (m, k), spec.a)
    b = lanes.random_values(gen, (k, n), spec.b)
    c = lanes.random_values(gen, (m, n), "f16" if spec.acc == "f16" else spec.acc)
    fa, fb, fc = (mma_fragment(spec, x) for x in "abc")
    a_regs = pack_fragment(lanes.encode(a, spec.a), fa, _BITS[spec.a])
    b_regs = pack_fragment(lanes.encode(b, spec.b), fb, _BITS[spec.b])
    c_regs = pack_fragment(lanes.encode(c, spec.acc), fc, _BITS[spec.acc])
    c_dev = _register_array(c_regs, spec.acc)
    d_dev = cuda.to_device(np.full_like(c_dev, 0xFF if c_dev.dtype.kind in "iu" else np.nan))
    _kernel(spec)[1, 32](
        cuda.to_device(_register_array(a_regs, spec.a)),
        cuda.to_device(_register_array(b_regs, spec.b)),
        cuda.to_device(c_dev),
        d_dev,
    )
    d_regs = d_dev.copy_to_host()
    d_bits = unpack_fragment(d_regs.view(np.uint64 if spec.acc == "f64" else np.uint32), fc,
                             _BITS[spec.acc], (m, n))
    d = lanes.decode(d_bits, spec.acc)
    ref = a @ b + c
    if spec.acc == "s32":
        np.testing.assert_array_equal(d, ref)
    elif spec.acc == "f64":
        np.testing.assert_allclose(d, ref, rtol=1e-13, atol=1e-13)
    else:
        # f32: products are exact, sums rounded in fp32 (the hardware may truncate inside the
        # adder tree); f16: one rounding to f16 at the end.
        tol = 2e-3 if spec.acc == "f16" else 1e-5
        scale = np.abs(a) @ np.abs(b) + np.abs(c)
        assert np.all(np.abs(d - ref) <= tol * scale + 1e-6), (
            f"max error {np.max(np.abs(d - ref) / (scale + 1e-6))}"
        )
