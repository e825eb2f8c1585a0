"""intrinsics.fastmath on the GPU, lane by lane, against its CPU emulation
(intrinsics.emulate.fastmath): the masks, the row scaling, the row sums and maxes bit-exact; the
exponentials within 2 ulp (ex2.approx's bound, PTX ISA; the emulation rounds the exact value),
tanh.approx within 2**-10.987 relative.  Each thread holds a 16-register m16n8 fragment of
fresh random scores, some -inf, and its own bases, limits and keys."""

import numpy as np
import pytest
from numba import cuda

import intrinsics as nt
from intrinsics.emulate import fastmath as emu
from tests.helpers import lanes

pytestmark = pytest.mark.gpu
T = 256  # threads (8 warps)
R = 16  # registers a fragment


@cuda.jit
def _forms(s, f, lim, key, out, pair):
    # f[t] = (scale, b0, b1, a0, a1); lim[t] = (lim0, lim1, lo0, lo1); key[t] = (col0, end,
    # row0, off); out[k, t, :] = form k's fragment; pair[k, t, :] = form k's row pair
    t = cuda.grid(1)
    if t >= s.shape[0]:
        return
    x = (s[t, 0], s[t, 1], s[t, 2], s[t, 3], s[t, 4], s[t, 5], s[t, 6], s[t, 7],
         s[t, 8], s[t, 9], s[t, 10], s[t, 11], s[t, 12], s[t, 13], s[t, 14], s[t, 15])
    scale, b0, b1, a0, a1 = f[t, 0], f[t, 1], f[t, 2], f[t, 3], f[t, 4]
    c = (f[t, 1], f[t, 2], f[t, 3], f[t, 4], f[t, 2], f[t, 1], f[t, 4], f[t, 3])  # per column
    y = (x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15], x[0], x[1], x[2], x[3], x[4],
         x[5], x[6], x[7])  # a second fragment
    forms = (nt.frag_exp2_fma(x, scale, b0, b1), nt.frag_exp2(x, scale, b0, b1),
             nt.frag_scale_rows(x, a0, a1), nt.frag_mask_cols(x, lim[t, 0], lim[t, 1]),
             nt.frag_mask_cols_from(x, lim[t, 2], lim[t, 3]),
             nt.frag_mask_keys(x, key[t, 0], key[t, 1]),
             nt.frag_mask_keys_causal(x, key[t, 0], key[t, 1], key[t, 2], key[t, 3]),
             nt.frag_exp2_fma_cols(x, scale, c), nt.frag_exp2_cols(x, scale, c),
             nt.frag_mul_diff_cols(x, y, c), nt.frag_mul_diff_rows(x, y, b0, b1))
    for k in range(11):
        y = forms[k]
        for v in range(R):
            out[k, t, v] = y[v]
    pairs = (nt.frag_row_sums(x), nt.frag_row_maxes(x))
    for k in range(2):
        pair[k, t, 0] = pairs[k][0]
        pair[k, t, 1] = pairs[k][1]
    for v in range(R):  # the scalar forms, register by register
        out[11, t, v] = nt.ex2_approx(nt.fma_f32(x[v], scale, b0))
        out[12, t, v] = nt.tanh_approx(x[v] * np.float32(0.25))


def _inputs(gen):
    s = (gen.standard_normal((T, R)) * 8).astype(np.float32)
    s[gen.random((T, R)) < 0.05] = -np.inf  # masked scores
    f = np.empty((T, 5), np.float32)
    f[:, 0] = gen.uniform(0.05, 0.5, T)  # scale (log2 e / sqrt(d) and the like)
    f[:, 1:3] = gen.uniform(-4, 4, (T, 2))  # the rows' bases (-max)
    f[:, 3:5] = gen.uniform(0, 2, (T, 2))  # the rows' factors
    lim = gen.integers(-3, 40, (T, 4)).astype(np.int32)  # column limits around 0 .. 31
    key = np.empty((T, 4), np.int64)
    key[:, 0] = gen.integers(0, 2**31 - 64, T) // 8 * 8  # col0: a tile's first key
    key[:, 1] = key[:, 0] + gen.integers(-8, 40, T)  # end: Sk around the tile
    key[:, 1] = np.maximum(key[:, 1], 0)
    key[:, 2] = key[:, 0] + gen.integers(-40, 40, T)  # row0
    key[:, 3] = gen.integers(-20, 20, T)  # off = Sk - Sq
    return s, f, lim, key


def _ulps(got, want):
    """Distance in float32 ulps (both finite or both the same infinity / zero)."""
    a = got.view(np.int32).astype(np.int64)
    b = want.view(np.int32).astype(np.int64)
    a = np.where(a < 0, -(a & 0x7FFFFFFF), a)
    b = np.where(b < 0, -(b & 0x7FFFFFFF), b)
    return np.abs(a - b)


def test_fragment_forms_match_the_emulation_lane_by_lane():
    gen = lanes.rng()
    s, f, lim, key = _inputs(gen)
    out = cuda.to_device(np.full((13, T, R), np.nan, np.float32))
    pair = cuda.to_device(np.full((2, T, 2), np.nan, np.float32))
    _forms[T // 128, 128](cuda.to_device(s), cuda.to_device(f), cuda.to_device(lim),
                          cuda.to_device(key), out, pair)
    got, got_pair = out.copy_to_host(), pair.copy_to_host()
    want = np.empty_like(got)
    want_pair = np.empty_like(got_pair)
    for t in range(T):
        x = tuple(s[t])
        scale, b0, b1, a0, a1 = f[t]
        want[0, t] = emu.frag_exp2_fma(x, scale, b0, b1)
        want[1, t] = emu.frag_exp2(x, scale, b0, b1)
        want[2, t] = emu.frag_scale_rows(x, a0, a1)
        want[3, t] = emu.frag_mask_cols(x, lim[t, 0], lim[t, 1])
        want[4, t] = emu.frag_mask_cols_from(x, lim[t, 2], lim[t, 3])
        want[5, t] = emu.frag_mask_keys(x, key[t, 0], key[t, 1])
        want[6, t] = emu.frag_mask_keys_causal(x, *key[t])
        c = (f[t, 1], f[t, 2], f[t, 3], f[t, 4], f[t, 2], f[t, 1], f[t, 4], f[t, 3])
        y = x[8:] + x[:8]
        want[7, t] = emu.frag_exp2_fma_cols(x, scale, c)
        want[8, t] = emu.frag_exp2_cols(x, scale, c)
        want[9, t] = emu.frag_mul_diff_cols(x, y, c)
        want[10, t] = emu.frag_mul_diff_rows(x, y, b0, b1)
        want_pair[0, t] = emu.frag_row_sums(x)
        want_pair[1, t] = emu.frag_row_maxes(x)
        want[11, t] = [emu.ex2_approx(emu.fma_f32(v, scale, b0)) for v in x]
        want[12, t] = [emu.tanh_approx(np.float32(v) * np.float32(0.25)) for v in x]
    for k in (2, 3, 4, 5, 6, 9, 10):  # selects, one multiply or a subtraction and a multiply
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"form {k}")
    np.testing.assert_array_equal(got_pair, want_pair)
    for k in (0, 1, 7, 8, 11):  # ex2.approx (and exp2f, itself ex2.approx): within 2 ulp
        assert not np.isnan(got[k]).any(), k
        assert _ulps(got[k], want[k]).max() <= 2, (k, _ulps(got[k], want[k]).max())
    rel = np.abs(got[12].astype(np.float64) - want[12]) / np.maximum(np.abs(want[12]), 2.0**-126)
    finite = np.isfinite(want[12])
    assert rel[finite].max() <= 2.0**-10.987, rel[finite].max()
    # the masks did mask something and kept something (the inputs reach both sides)
    for k in (3, 4, 5, 6):
        masked = np.isneginf(got[k]) & np.isfinite(s)
        assert masked.any() and np.isfinite(got[k]).any(), k
