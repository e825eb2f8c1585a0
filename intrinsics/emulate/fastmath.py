"""Emulation of intrinsics.fastmath: 2**x in float32 with subnormal results flushed to zero
(ex2.approx.ftz; the hardware's approximation is within 2 ulp of this), a fused multiply-add
with one rounding (the float32 product is exact in float64), and tanh rounded to float32 (the
hardware's tanh.approx is within 2**-10.987 relative of it); the fragment forms apply the same
per register (frag_row_sums adds in intrinsics.fastmath.frag_tree_order's order, in float32)."""

import numpy as np

_TINY = np.float32(2.0**-126)


def ex2_approx(x):
    x = np.float32(x)
    if abs(x) < _TINY:  # ftz: a subnormal input is 0
        x = np.float32(0)
    with np.errstate(over="ignore", under="ignore"):
        y = np.float32(np.exp2(np.float64(x)))
    return np.float32(0) if abs(y) < _TINY else y


def fma_f32(a, b, c):
    return np.float32(np.float64(np.float32(a)) * np.float64(np.float32(b)) + np.float64(np.float32(c)))


def tanh_approx(x):
    return np.float32(np.tanh(np.float64(np.float32(x))))


def _half(v):
    return (v // 2) % 2


def frag_exp2_fma(s, scale, b0, b1):
    bases = (b0, b1)
    return tuple(ex2_approx(fma_f32(x, scale, bases[_half(v)])) for v, x in enumerate(s))


def _exp2f(x):
    # exp2 rounded to float32 (libdevice's exp2f, ex2.approx with denormal scaling, is within 2
    # ulp of it)
    with np.errstate(over="ignore", under="ignore"):
        return np.float32(np.exp2(np.float64(x)))


def frag_exp2(s, scale, b0, b1):
    # s * scale - b in one rounding: the PTX's mul.f32 and sub.f32 carry no rounding modifier,
    # so ptxas contracts them into one FFMA (the SASS of every form: 16 FFMA a fragment; the
    # H100 put two roundings 11 ulp away from it after exp2)
    bases = (b0, b1)
    return tuple(_exp2f(fma_f32(x, scale, -np.float32(bases[_half(v)])))
                 for v, x in enumerate(s))


def frag_scale_rows(o, a0, a1):
    factors = (np.float32(a0), np.float32(a1))
    return tuple(np.float32(np.float32(x) * factors[_half(v)]) for v, x in enumerate(o))


def _mask(s, lims, keep):
    return tuple(np.float32(x) if keep(8 * (v // 4) + v % 2, int(lims[_half(v)]))
                 else np.float32(-np.inf) for v, x in enumerate(s))


def frag_mask_cols(s, lim0, lim1):
    return _mask(s, (lim0, lim1), lambda col, lim: col < lim)


def _col(v):
    return 2 * (v // 4) + v % 2


def frag_exp2_fma_cols(s, scale, c):
    return tuple(ex2_approx(fma_f32(x, scale, c[_col(v)])) for v, x in enumerate(s))


def frag_exp2_cols(s, scale, c):
    # frag_exp2 with one bias per column (the same contraction into FFMA)
    return tuple(_exp2f(fma_f32(x, scale, -np.float32(c[_col(v)]))) for v, x in enumerate(s))


def frag_mul_diff_rows(p, x, c0, c1):
    rows = (np.float32(c0), np.float32(c1))
    return tuple(np.float32(np.float32(a) * np.float32(np.float32(b) - rows[_half(v)]))
                 for v, (a, b) in enumerate(zip(p, x)))


def frag_mul_diff_cols(p, x, c):
    return tuple(np.float32(np.float32(a) * np.float32(np.float32(b) - np.float32(c[_col(v)])))
                 for v, (a, b) in enumerate(zip(p, x)))


def frag_mask_cols_from(s, lo0, lo1):
    return _mask(s, (lo0, lo1), lambda col, lim: col >= lim)


def _key_range(name, s, col0, end):
    """The hardware compares keys and ends in 32 bits: outside the documented range the
    emulation refuses rather than give what the GPU would not."""
    last = int(col0) + 8 * ((len(s) - 1) // 4) + 1
    if int(col0) < 0 or last >= 2**32 or int(end) >= 2**32:
        raise ValueError(f"{name}: keys {int(col0)}..{last} and end {int(end)} must lie in "
                         "[0, 2**32)")


def frag_mask_keys(s, col0, end):
    _key_range("frag_mask_keys", s, col0, end)
    return tuple(np.float32(x) if int(col0) + 8 * (v // 4) + v % 2 < int(end)
                 else np.float32(-np.inf) for v, x in enumerate(s))


def frag_mask_keys_causal(s, col0, end, row0, off):
    _key_range("frag_mask_keys_causal", s, col0, end)

    def keep(v):
        col = int(col0) + 8 * (v // 4) + v % 2
        return col < int(end) and col <= int(row0) + 8 * _half(v) + int(off)

    return tuple(np.float32(x) if keep(v) else np.float32(-np.inf) for v, x in enumerate(s))


def frag_row_sums(p):
    from intrinsics.fastmath import frag_tree_order

    def add(node):
        if isinstance(node, tuple):
            return np.float32(add(node[0]) + add(node[1]))
        return np.float32(p[node])

    return tuple(add(frag_tree_order([v for v in range(len(p)) if _half(v) == h]))
                 for h in (0, 1))


def frag_row_maxes(s):
    from intrinsics.fastmath import frag_tree_order

    def mx(node):
        if isinstance(node, tuple):
            a, b = mx(node[0]), mx(node[1])
            return np.float32(np.fmax(a, b))  # fmaxf: the other value where one is NaN
        return np.float32(s[node])

    return tuple(mx(frag_tree_order([v for v in range(len(s)) if _half(v) == h]))
                 for h in (0, 1))


EMULATIONS = {"ex2_approx": ex2_approx, "fma_f32": fma_f32, "tanh_approx": tanh_approx,
              "frag_exp2_fma": frag_exp2_fma, "frag_exp2": frag_exp2,
              "frag_scale_rows": frag_scale_rows,
              "frag_mask_cols": frag_mask_cols, "frag_row_sums": frag_row_sums,
              "frag_row_maxes": frag_row_maxes, "frag_exp2_fma_cols": frag_exp2_fma_cols,
              "frag_mul_diff_cols": frag_mul_diff_cols, "frag_mask_cols_from": frag_mask_cols_from,
              "frag_exp2_cols": frag_exp2_cols, "frag_mul_diff_rows": frag_mul_diff_rows,
              "frag_mask_keys": frag_mask_keys, "frag_mask_keys_causal": frag_mask_keys_causal}
