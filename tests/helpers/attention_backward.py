"""numbatc.attention_backward on a device (or the CPU emulation) against a float64 reference
gradient, shared by tests/gpu/test_attention_backward_gpu.py and
tests/emulation/test_attention_backward_emulated.py.

``reference_backward`` computes the forward and the gradients in float64 with NumPy (FA2's
formulas: dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q;
tests/test_attention_backward.py checks it against torch autograd in float64).

Tolerance, per element, from where the kernels round (r: 2**-8 bf16, 2**-11 f16):
    E_ij  = r |dS_ij| + P_ij (r (|dO_i| . |O_i|) + e_i (|dP_ij| + |D_i|))
            (dS rounded to the format for its MMA; D from the stored, rounded O; P from lse with
            its error e_i)
    dQ: 2 (scale E |K| + r |dQ|) + 1e-6      dK: 2 (scale E^T |Q| + r |dK|) + 1e-6
    dV: 2 ((r + e) P^T |dO| + r |dV|) + 1e-6  (P rounded to the format; the result stored)
with e_i = 1e-5 (1 + scale max_j |q_i| . |k_j|) when the forward is numbatc's (its lse bound,
tests/helpers/attention.py) and 1e-6 when lse is the float64 one rounded to float32.
"""

import math

import numpy as np
from numba import cuda

import numbatc
from tests.helpers.attention import ROUNDING, reference, to_device, to_host, values


def reference_backward(q, k, v, do, causal, scale, dlse=None):
    """float64 (dq, dk, dv, parts): the gradients of sum(out * do) (+ sum(lse * dlse)) and, per
    (batch, head), the pieces of the tolerance (b, h, P, dS, dP, D, |dO| . |O| per row)."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    seen = (np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq) if causal
            else np.ones((Sq, Sk), bool))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    parts = []
    for b in range(B):
        for h in range(Hq):
            qh, kh, vh, doh = q[b, :, h], k[b, :, h // group], v[b, :, h // group], do[b, :, h]
            s = np.where(seen, qh @ kh.T * scale, -np.inf)
            rows = seen.any(axis=1)
            m = np.where(rows, s.max(axis=1, initial=-np.inf), 0)
            p = np.exp(s - m[:, None])
            p = p / np.where(rows, p.sum(axis=1), 1)[:, None]
            o = p @ vh
            dp = doh @ vh.T
            dd = (doh * o).sum(axis=1)
            g = 0 if dlse is None else dlse[b, h][:, None]  # d lse_i / d S_ij = P_ij
            ds = p * (dp - dd[:, None] + g)
            dq[b, :, h] = scale * ds @ kh
            dk[b, :, h // group] += scale * ds.T @ qh
            dv[b, :, h // group] += p.T @ doh
            parts.append((b, h, p, ds, dp, dd, (np.abs(doh) * np.abs(o)).sum(axis=1)))
    return dq, dk, dv, parts


def tolerances(q, k, v, do, dq, dk, dv, parts, scale, dtype, lse_err):
    """(tol_dq, tol_dk, tol_dv) as the module docstring; ``lse_err`` (B, Hq, Sq)."""
    r = ROUNDING[dtype]
    group = q.shape[2] // k.shape[2]
    tq, tk, tv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b, h, p, ds, dp, dd, doo in parts:
        e = lse_err[b, h][:, None]
        err = r * np.abs(ds) + p * (r * doo[:, None] + e * (np.abs(dp) + np.abs(dd)[:, None]))
        hk = h // group
        tq[b, :, h] += scale * err @ np.abs(k[b, :, hk])
        tk[b, :, hk] += scale * err.T @ np.abs(q[b, :, h])
        tv[b, :, hk] += ((r + e) * p).T @ np.abs(do[b, :, h])
    return (2 * (tq + r * np.abs(dq)) + 1e-6, 2 * (tk + r * np.abs(dk)) + 1e-6,
            2 * (tv + r * np.abs(dv)) + 1e-6)


def _f32_device(x, lib):
    if lib == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x)).cuda()
    return cuda.to_device(np.ascontiguousarray(x))


def _compare(what, name, got, ref, tol):
    bad = ~(np.abs(got - ref) <= tol)  # NaN (an unwritten element) counts as bad
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad {name} of {bad.size}, first at {i}: got "
                             f"{got[i]!r}, want {ref[i]!r} +- {tol[i]:.3g}")


def check_backward(b, sq, sk, hq, hkv, d, causal, dtype="bfloat16", lib="numba", scale=None,
                   forward="numpy", views=None, with_dlse=False, view_results=False):
    """One numbatc.attention_backward call (dq, dk, dv given, poisoned with NaN) against
    :func:`reference_backward`.  ``forward``: 'numpy' (out and lse from the float64 reference,
    rounded to the format and float32) or 'numbatc' (numbatc.attention's).  ``views(x64,
    dtype)`` makes a device input (default: contiguous arrays of ``lib``); ``with_dlse`` passes
    a random gradient through lse too; ``view_results`` makes dq, dk, dv with ``views`` as
    well (strided results).  Returns the device inputs and the results (host,
    float64) for further checks."""
    scale_f = scale or 1 / math.sqrt(d)
    q, k, v = values((b, sq, hq, d), dtype), values((b, sk, hkv, d), dtype), values((b, sk, hkv, d), dtype)
    do = values((b, sq, hq, d), dtype)
    make = views or (lambda x, dt: to_device(x, dt, lib))
    dq_, dk_, dv_, ddo = (make(x, dtype) for x in (q, k, v, do))
    if forward == "numpy":
        ref_out, ref_lse, _, sbound = reference(q, k, v, causal, scale_f)
        out = to_device(ref_out, dtype, lib)
        lse = _f32_device(ref_lse.astype(np.float32), lib)
        lse_err = np.full(ref_lse.shape, 1e-6)
    else:
        out, lse = numbatc.attention(dq_, dk_, dv_, causal=causal, scale=scale, return_lse=True)
        sbound = reference(q, k, v, causal, scale_f)[3]
        lse_err = 1e-5 * (1 + sbound)
    dlse = dlse_dev = None
    if with_dlse:
        dlse = np.random.default_rng().standard_normal((b, hq, sq)).astype(np.float32)
        dlse_dev = _f32_device(dlse, lib)
        dlse = dlse.astype(np.float64)
    poison = [(make if view_results else lambda x, dt: to_device(x, dt, lib))(
        np.full(x.shape, np.nan), dtype) for x in (q, k, v)]
    got = numbatc.attention_backward(dq_, dk_, dv_, out, lse, ddo, causal=causal, scale=scale,
                                     dq=poison[0], dk=poison[1], dv=poison[2], dlse=dlse_dev)
    assert all(g is p for g, p in zip(got, poison))
    cuda.synchronize()
    got = [to_host(x, dtype) for x in got]
    rdq, rdk, rdv, parts = reference_backward(q, k, v, do, causal, scale_f, dlse)
    tols = tolerances(q, k, v, do, rdq, rdk, rdv, parts, scale_f, dtype, lse_err)
    what = (f"attention_backward b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} causal={causal} "
            f"{dtype} {lib} forward={forward}")
    for name, g, ref, tol in zip(("dq", "dk", "dv"), got, (rdq, rdk, rdv), tols):
        _compare(what, name, g, ref, tol)
    return (dq_, dk_, dv_, out, lse, ddo), got
