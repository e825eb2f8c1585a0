"""Register packing on the GPU against ml_dtypes / NumPy rounding."""

import numpy as np
import pytest
from numba import cuda

from intrinsics import convert as cv
from tests.helpers import lanes

pytestmark = [pytest.mark.gpu, pytest.mark.emulation]
N = 4096


@cuda.jit
def _pairs(x, out, back):
    i = cuda.grid(1)
    if i < x.size // 2:
        lo = x[2 * i]
        hi = x[2 * i + 1]
        out[0, i] = cv.pack_bf16x2(lo, hi)
        out[1, i] = cv.pack_f16x2(lo, hi)
        out[2, i] = cv.cvt_tf32(lo)
        a, b = cv.unpack_bf16x2(out[0, i])
        back[0, 2 * i] = a
        back[0, 2 * i + 1] = b
        c, d = cv.unpack_f16x2(out[1, i])
        back[1, 2 * i] = c
        back[1, 2 * i + 1] = d


@cuda.jit
def _quads(x, out):
    i = cuda.grid(1)
    if i < x.size // 4:
        out[0, i] = cv.pack_e4m3x4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3])
        out[1, i] = cv.pack_e5m2x4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3])


def test_pairs_round_to_nearest_even():
    ml = pytest.importorskip("ml_dtypes")
    x = (lanes.rng().standard_normal(N) * 100).astype(np.float32)
    out = cuda.to_device(np.zeros((3, N // 2), dtype=np.uint32))
    back = cuda.to_device(np.full((2, N), np.nan, dtype=np.float32))
    _pairs[N // 256, 128](cuda.to_device(x), out, back)
    got = out.copy_to_host()
    bf = x.astype(ml.bfloat16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(got[0], bf[0::2] | (bf[1::2] << 16))
    h = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(got[1], h[0::2] | (h[1::2] << 16))
    # tf32 with round-to-nearest, ties away from zero: add half an ulp of the 10-bit mantissa.
    bits = x[0::2].view(np.uint32)
    np.testing.assert_array_equal(got[2], (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000))
    b = back.copy_to_host()
    np.testing.assert_array_equal(b[0], x.astype(ml.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(b[1], x.astype(np.float16).astype(np.float32))


def test_fp8_quads_round_and_saturate():
    ml = pytest.importorskip("ml_dtypes")
    x = (lanes.rng().standard_normal(N) * 50).astype(np.float32)
    x[:4] = [1e6, -1e6, 448.0, 57344.0 * 4]
    out = cuda.to_device(np.zeros((2, N // 4), dtype=np.uint32))
    _quads[N // 256, 64](cuda.to_device(x), out)
    got = out.copy_to_host()
    for row, (dtype, limit) in enumerate([(ml.float8_e4m3fn, 448.0), (ml.float8_e5m2, 57344.0)]):
        sat = np.clip(x, -limit, limit)  # satfinite: clamp to the largest finite value
        expected = sat.astype(dtype).view(np.uint8).astype(np.uint32)
        packed = (expected[0::4] | expected[1::4] << 8 | expected[2::4] << 16
                  | expected[3::4] << 24)
        np.testing.assert_array_equal(got[row], packed)
