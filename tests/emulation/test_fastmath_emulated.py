"""The fast-math intrinsics in the CPU emulation: ex2_approx flushes subnormal results to zero
(2**-141 -> 0) and takes -inf to 0, fma_f32 rounds once, tanh_approx matches tanh to float32.
(Their PTX and SASS: tests/test_fastmath_compile.py.)"""

import numpy as np
import pytest
from numba import config, cuda

import intrinsics as nt

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]


def test_emulation():
    @cuda.jit
    def kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.ex2_approx(nt.fma_f32(x[i], np.float32(2), np.float32(-1)))

    x = np.array([0, 1.5, -70, -np.inf, 3], np.float32)
    out = np.zeros_like(x)
    kernel[1, 5](out, x)
    want = np.exp2(2.0 * x.astype(np.float64) - 1).astype(np.float32)
    want[np.abs(want) < 2.0**-126] = 0  # 2**-141 flushes
    assert np.array_equal(out, want), (out, want)

    @cuda.jit
    def tanh_kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.tanh_approx(x[i])

    tanh_kernel[1, 5](out, x)
    assert np.array_equal(out, np.tanh(x.astype(np.float64)).astype(np.float32))


def test_fragment_forms():
    """The whole-fragment forms against the per-register expressions, in the emulation: the
    mask from per-row column limits, ex2(fma) with each row half's base, the rows' factors,
    and the row sums added in frag_tree_order's order (float32)."""
    from intrinsics.fastmath import frag_tree_order

    rng = np.random.default_rng(3)
    s = tuple(np.float32(x) for x in rng.standard_normal(32))
    lims = (np.int32(13), np.int32(40))
    masked = nt.frag_mask_cols(s, *lims)
    for v, x in enumerate(masked):
        col, h = 8 * (v // 4) + v % 2, (v // 2) % 2
        assert x == (s[v] if col < lims[h] else -np.inf)
    p = nt.frag_exp2_fma(masked, np.float32(1.4), np.float32(-0.5), np.float32(0.25))
    for v, x in enumerate(p):
        base = (np.float32(-0.5), np.float32(0.25))[(v // 2) % 2]
        assert x == nt.ex2_approx(nt.fma_f32(masked[v], np.float32(1.4), base))
    o = nt.frag_scale_rows(p, np.float32(3), np.float32(0.5))
    assert all(o[v] == p[v] * (np.float32(3), np.float32(0.5))[(v // 2) % 2] for v in range(32))
    l0, l1 = nt.frag_row_sums(p)

    def add(node):
        return np.float32(add(node[0]) + add(node[1])) if isinstance(node, tuple) else p[node]

    assert l0 == add(frag_tree_order([v for v in range(32) if (v // 2) % 2 == 0]))
    assert l1 == add(frag_tree_order([v for v in range(32) if (v // 2) % 2 == 1]))
    assert l0 == np.float32(sum(np.float64(p[v]) for v in range(32) if (v // 2) % 2 == 0)) \
        or abs(l0 - sum(p[v] for v in range(32) if (v // 2) % 2 == 0)) < 1e-5


def test_column_forms():
    """The column-wise fragment forms against the per-register expressions: the lower column
    limits per row half, ex2(fma) with each column's bias, p * (x - c) per column."""
    rng = np.random.default_rng(5)
    s = tuple(np.float32(x) for x in rng.standard_normal(32))
    x = tuple(np.float32(v) for v in rng.standard_normal(32))
    c = tuple(np.float32(v) for v in rng.standard_normal(16))
    lims = (np.int32(9), np.int32(-3))
    masked = nt.frag_mask_cols_from(s, *lims)
    for v, y in enumerate(masked):
        col, h = 8 * (v // 4) + v % 2, (v // 2) % 2
        assert y == (s[v] if col >= lims[h] else -np.inf)
    assert sum(np.isinf(masked)) == 3  # row half 0's columns 0, 1 and 8
    p = nt.frag_exp2_fma_cols(masked, np.float32(0.7), c)
    for v, y in enumerate(p):
        assert y == nt.ex2_approx(nt.fma_f32(masked[v], np.float32(0.7), c[2 * (v // 4) + v % 2]))
    d = nt.frag_mul_diff_cols(p, x, c)
    for v, y in enumerate(d):
        assert y == np.float32(p[v] * np.float32(x[v] - c[2 * (v // 4) + v % 2]))


def _fused(a, b, c):
    """a * b - c in one rounding to float32 (the FFMA ptxas makes of mul.f32 and sub.f32)."""
    return np.float32(np.float64(a) * np.float64(b) - np.float64(c))


def test_libdevice_exponential():
    """frag_exp2: exp2 of s * scale - b_h in one rounding (ptxas contracts the PTX's mul.f32
    and sub.f32 into an FFMA), rounded to float32; some arguments differ from two roundings'."""
    s = tuple(np.float32(x) for x in np.random.default_rng(5).standard_normal(64) * 8)
    scale, b0, b1 = np.float32(0.3), np.float32(1.5), np.float32(-2.25)
    unfused = 0
    for v, y in enumerate(nt.frag_exp2(s, scale, b0, b1)):
        b = (b0, b1)[(v // 2) % 2]
        arg = _fused(s[v], scale, b)
        assert y == np.float32(np.exp2(np.float64(arg))) and isinstance(y, np.float32)
        unfused += arg != np.float32(np.float32(s[v] * scale) - b)
    assert unfused


def test_column_exponential_and_row_difference():
    """frag_exp2_cols: exp2 of s * scale - c_col in one rounding (as frag_exp2), rounded to
    float32; frag_mul_diff_rows: p * (x - c_h) per row half, each step rounded."""
    rng = np.random.default_rng(7)
    s = tuple(np.float32(x) for x in rng.standard_normal(16))
    x = tuple(np.float32(v) for v in rng.standard_normal(16))
    c = tuple(np.float32(v) for v in rng.standard_normal(8))
    scale, r0, r1 = np.float32(0.9), np.float32(0.5), np.float32(-1.25)
    for v, y in enumerate(nt.frag_exp2_cols(s, scale, c)):
        arg = _fused(s[v], scale, c[2 * (v // 4) + v % 2])
        assert y == np.float32(np.exp2(np.float64(arg))) and isinstance(y, np.float32)
    for v, y in enumerate(nt.frag_mul_diff_rows(s, x, r0, r1)):
        assert y == np.float32(s[v] * np.float32(x[v] - (r0, r1)[(v // 2) % 2]))


def test_key_masks():
    """frag_mask_keys and frag_mask_keys_causal against the per-register rule: key col0 +
    column(v) below the end, and at most row0 + 8 h + off with the causal form."""
    s = tuple(np.float32(v + 1) for v in range(32))
    col0, end, row0, off = 40, 57, 3, 45
    for v, y in enumerate(nt.frag_mask_keys(s, np.int64(col0), np.int64(end))):
        col = col0 + 8 * (v // 4) + v % 2
        assert y == (s[v] if col < end else -np.inf)
    masked = nt.frag_mask_keys_causal(s, np.int64(col0), np.int64(end), np.int64(row0),
                                      np.int64(off))
    for v, y in enumerate(masked):
        col, h = col0 + 8 * (v // 4) + v % 2, (v // 2) % 2
        assert y == (s[v] if col < end and col <= row0 + 8 * h + off else -np.inf)
    assert 0 < sum(np.isinf(masked)) < 32
    # the GPU compares in 32 bits: keys outside [0, 2**32) are refused, not masked wrongly
    for col0, end in ((-1, 57), (2**32 - 8, 2**32 - 1), (0, 2**32)):
        with pytest.raises(ValueError, match="must lie in"):
            nt.frag_mask_keys(s, np.int64(col0), np.int64(end))


def test_fragment_pack():
    """frag_pack_bf16x2 / f16x2 in the emulation: register pairs packed as pack_*x2 packs
    them, four to an A fragment."""
    p = tuple(np.float32(x) for x in np.linspace(-3, 5, 16))
    for frag, pair in ((nt.frag_pack_bf16x2, nt.pack_bf16x2), (nt.frag_pack_f16x2, nt.pack_f16x2)):
        packed = frag(p)
        assert len(packed) == 2 and all(len(a) == 4 for a in packed)
        assert [r for a in packed for r in a] == [pair(p[2 * i], p[2 * i + 1]) for i in range(8)]
