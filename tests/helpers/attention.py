"""numbatc.attention on a device (or the CPU emulation) against a float64 reference, shared by
tests/gpu/test_attention_gpu.py, test_sm90_attention_gpu.py and
tests/emulation/test_sm90_attention_emulated.py: random inputs exactly representable in the
dtype (``values``), device arrays (``to_device``, ``to_host``), the reference (``reference``),
``check`` (one call with a poisoned output, outputs and lse checked), the sweep's seqlen pairs
and head counts (``SEQLENS``, ``HEADS``) and the fixture ``sm90`` (forces sm90_attention and a
config, records the configs launched; import it into a test module to use it).

Tolerance: P is rounded to the input format before P @ V and O once more when stored, so
|out - ref| <= 2 r (|ref| + (p @ |v|) / l) + 1e-6 with r the format's relative rounding
(2**-8 bf16, 2**-11 f16) and (p @ |v|) / l the row's softmax-weighted |v|; lse is within
1e-5 (1 + scale * |q| @ |k|) of the reference.  Rows that see no key must give exactly 0 and
lse -inf."""

import math

import numpy as np
import pytest
from numba import cuda

import numbatc
from numbatc.interop import DTypeView

ml_dtypes = pytest.importorskip("ml_dtypes")

ROUNDING = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
NP_DTYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def values(shape, dtype):
    """Random values exactly representable in ``dtype``, in float64."""
    return np.random.default_rng().standard_normal(shape).astype(NP_DTYPE[dtype]).astype(np.float64)


def to_device(x64, dtype, lib="numba"):
    host = np.ascontiguousarray(x64).astype(NP_DTYPE[dtype])
    if lib == "torch":
        import torch

        t = torch.from_numpy(host.view(np.uint16) if dtype == "bfloat16" else host)
        return (t.view(torch.bfloat16) if dtype == "bfloat16" else t).to("cuda")
    d = cuda.to_device(host.view(np.uint16) if dtype == "bfloat16" else host)
    return numbatc.bfloat16(d) if dtype == "bfloat16" else d


def to_host(x, dtype):
    if hasattr(x, "cpu"):  # torch
        return x.float().cpu().numpy().astype(np.float64)
    data = x.data if isinstance(x, DTypeView) else x
    host = data.copy_to_host()
    if dtype == "bfloat16":
        host = host.view(ml_dtypes.bfloat16)
    return host.astype(np.float64)


def reference(q, k, v, causal, scale):
    """(out, lse, weighted |v|, |s| bound) in float64; rows that see no key: 0, -inf."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv if Hkv else 1
    out = np.zeros(q.shape)
    wabs = np.zeros(q.shape)
    lse = np.full((B, Hq, Sq), -np.inf)
    sbound = np.zeros((B, Hq, Sq))
    seen = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq) if causal else np.ones((Sq, Sk), bool)
    for b in range(B):
        for h in range(Hq):
            qh, kh, vh = q[b, :, h], k[b, :, h // group], v[b, :, h // group]
            s = np.where(seen, qh @ kh.T * scale, -np.inf)
            sbound[b, h] = (np.abs(qh) @ np.abs(kh).T * scale).max(axis=1, initial=0)
            rows = seen.any(axis=1)
            m = np.where(rows, s.max(axis=1, initial=-np.inf), 0)
            p = np.exp(s - m[:, None])
            l = p.sum(axis=1)
            safe = np.where(rows, l, 1)
            out[b, :, h] = np.where(rows[:, None], p @ vh / safe[:, None], 0)
            wabs[b, :, h] = np.where(rows[:, None], p @ np.abs(vh) / safe[:, None], 0)
            lse[b, h] = np.where(rows, m + np.log(safe), -np.inf)
    return out, lse, wabs, sbound


def offset_out(poisoned, dtype, elements=1):
    """A numba device output holding ``poisoned`` that starts ``elements`` 16-bit elements past
    an allocation's start: 1 (2 bytes) defeats the attention kernels' 32-bit pair stores, 2 (4
    bytes) sm90_attention's TMA stores of O but not the pair stores."""
    host = poisoned.astype(NP_DTYPE[dtype])
    host = host.view(np.uint16) if dtype == "bfloat16" else host
    dev = cuda.to_device(np.zeros(host.size + elements, host.dtype))[elements:].reshape(host.shape)
    dev.copy_to_device(host)
    return numbatc.bfloat16(dev) if dtype == "bfloat16" else dev


def check(b, sq, sk, hq, hkv, d, causal, dtype="bfloat16", lib="numba", scale=None, views=None,
          out_view=None):
    """One numbatc.attention call against :func:`reference`; ``views(q, k, v, dtype)`` makes
    the device q, k, v, ``out_view(poisoned, dtype)`` the device output from its NaN-poisoned
    float64 contents (defaults: contiguous arrays of ``lib``)."""
    q, k, v = values((b, sq, hq, d), dtype), values((b, sk, hkv, d), dtype), values((b, sk, hkv, d), dtype)
    if views is None:
        dq, dk, dv = (to_device(x, dtype, lib) for x in (q, k, v))
    else:
        dq, dk, dv = views(q, k, v, dtype)
    poisoned = np.full(q.shape, np.nan)
    out = to_device(poisoned, dtype, lib) if out_view is None else out_view(poisoned, dtype)
    got, lse = numbatc.attention(dq, dk, dv, causal=causal, scale=scale, out=out, return_lse=True)
    assert got is out
    cuda.synchronize()
    got = to_host(got, dtype)
    lse = to_host(lse, "float32") if hasattr(lse, "cpu") else lse.copy_to_host().astype(np.float64)
    ref, ref_lse, wabs, sbound = reference(q, k, v, causal, scale or 1 / math.sqrt(d))
    what = f"attention b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} causal={causal} {dtype} {lib}"
    tol = 2 * ROUNDING[dtype] * (np.abs(ref) + wabs) + 1e-6
    bad = ~(np.abs(got - ref) <= tol)  # NaN (an unwritten element) counts as bad
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad outputs, first at {i}: got {got[i]!r}, "
                             f"want {ref[i]!r} +- {tol[i]:.3g}")
    empty = np.isinf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), f"{what}: lse -inf where no key is seen, only there"
    lse_tol = 1e-5 * (1 + sbound)
    bad = ~(np.abs(np.where(empty, 0, lse) - np.where(empty, 0, ref_lse)) <= lse_tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad lse, first at {i}: got {lse[i]!r}, "
                             f"want {ref_lse[i]!r} +- {lse_tol[i]:.3g}")


# the GPU-sized sweep's shapes
SEQLENS = [(1, 1), (113, 113), (1023, 1023), (1, 1023), (1023, 1), (113, 517), (517, 113),
           (128, 128), (64, 200), (257, 129)]
HEADS = [(1, 1), (4, 4), (8, 2), (6, 1)]


@pytest.fixture
def sm90(monkeypatch, device_cc):
    """``sm90(name=None)`` forces the kernel (and a config); returns the configs launched."""
    if device_cc is not None and tuple(device_cc)[:2] != (9, 0):
        pytest.skip(f"sm90_attention runs on compute capability 9.0 only, have {device_cc}")
    from numbatc.kernels import sm90_attention

    used = []  # the configurations launched (a TMA one's cp.async twin where it falls back)
    real = sm90_attention.launch

    def recording(p, cfg):
        used.append(sm90_attention.compiled(p, cfg)[0].name)
        return real(p, cfg)

    monkeypatch.setattr(sm90_attention, "launch", recording)

    def force(name=None):
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", "sm90" + (f":{name}" if name else ""))
        used.clear()
        return used

    return force


# --- numbatc.attention_varlen --------------------------------------------------------------


def prefix_sums(lengths):
    """int32 (len(lengths) + 1,) prefix sums starting at 0 (flash-attn's cu_seqlens)."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def reference_varlen(q, k, v, lens_q, lens_k, causal, scale):
    """(out, lse (heads_q, total_q), weighted |v|, |s| bound (heads_q, total_q)) in float64:
    :func:`reference` per sequence, each its own batch of one."""
    hq = q.shape[1]
    out, wabs = np.zeros(q.shape), np.zeros(q.shape)
    lse, sbound = np.full((hq, q.shape[0]), -np.inf), np.zeros((hq, q.shape[0]))
    cq, ck = prefix_sums(lens_q), prefix_sums(lens_k)
    for b in range(len(lens_q)):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        o, l, w, s = reference(q[None, rows], k[None, keys], v[None, keys], causal, scale)
        out[rows], wabs[rows], lse[:, rows], sbound[:, rows] = o[0], w[0], l[0], s[0]
    return out, lse, wabs, sbound


def check_varlen(lens_q, lens_k, hq, hkv, d, causal, dtype="bfloat16", lib="numba", scale=None,
                 views=None, host_cu=False, max_seqlen=None, out_view=None):
    """One numbatc.attention_varlen call (output poisoned with NaN, lse asked) against
    :func:`reference_varlen`.  ``views(q, k, v, dtype)`` makes the device q, k, v (default:
    contiguous arrays of ``lib``); ``host_cu`` passes the prefix sums as NumPy arrays;
    ``max_seqlen``: (max_seqlen_q, max_seqlen_k), default the longest lengths; ``out_view`` as
    :func:`check`'s."""
    tq, tk = int(sum(lens_q)), int(sum(lens_k))
    q, k, v = values((tq, hq, d), dtype), values((tk, hkv, d), dtype), values((tk, hkv, d), dtype)
    if views is None:
        dq, dk, dv = (to_device(x, dtype, lib) for x in (q, k, v))
    else:
        dq, dk, dv = views(q, k, v, dtype)
    cq, ck = prefix_sums(lens_q), prefix_sums(lens_k)
    if not host_cu:
        if lib == "torch":
            import torch

            cq, ck = (torch.from_numpy(c).cuda() for c in (cq, ck))
        else:
            cq, ck = cuda.to_device(cq), cuda.to_device(ck)
    mq, mk = max_seqlen or (max(lens_q, default=0), max(lens_k, default=0))
    poisoned = np.full(q.shape, np.nan)
    out = to_device(poisoned, dtype, lib) if out_view is None else out_view(poisoned, dtype)
    got, lse = numbatc.attention_varlen(dq, dk, dv, cq, ck, mq, mk, causal=causal, scale=scale,
                                        out=out, return_lse=True)
    assert got is out
    cuda.synchronize()
    got = to_host(got, dtype)
    lse = to_host(lse, "float32") if hasattr(lse, "cpu") else lse.copy_to_host().astype(np.float64)
    ref, ref_lse, wabs, sbound = reference_varlen(q, k, v, lens_q, lens_k, causal,
                                                  scale or 1 / math.sqrt(d))
    what = (f"attention_varlen lens_q={list(lens_q)} lens_k={list(lens_k)} hq={hq} hkv={hkv} "
            f"d={d} causal={causal} {dtype} {lib}")
    assert lse.shape == (hq, tq), f"{what}: lse shape {lse.shape}"
    tol = 2 * ROUNDING[dtype] * (np.abs(ref) + wabs) + 1e-6
    bad = ~(np.abs(got - ref) <= tol)  # NaN (an unwritten element) counts as bad
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad outputs, first at {i}: got {got[i]!r}, "
                             f"want {ref[i]!r} +- {tol[i]:.3g}")
    empty = np.isinf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), f"{what}: lse -inf where no key is seen, only there"
    lse_tol = 1e-5 * (1 + sbound)
    bad = ~(np.abs(np.where(empty, 0, lse) - np.where(empty, 0, ref_lse)) <= lse_tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad lse, first at {i}: got {lse[i]!r}, "
                             f"want {ref_lse[i]!r} +- {lse_tol[i]:.3g}")


# --- numbatc.attention_with_kvcache ----------------------------------------------------------


def kvcache_inputs(b, sq, lens, hq, hkv, d, dtype, page_size=None, spare=2, gen=None):
    """Random q and a KV cache holding ``lens[i]`` keys for sequence i, in float64: (q, k_cache,
    v_cache, block_table or None, (k, v) the per-sequence keys gathered).  Unpaged: the cache's
    seqlen_cache is max(lens) + 3, rows past each length NaN.  Paged: pages of ``page_size``
    rows, each sequence's pages shuffled over the pool with ``spare`` NaN pages among them (a
    wrong page shows), rows past a length in its last page NaN, unused block_table entries
    -1 (never looked at)."""
    gen = gen or np.random.default_rng()
    q = values((b, sq, hq, d), dtype)
    keys = [(values((n, hkv, d), dtype), values((n, hkv, d), dtype)) for n in lens]
    if page_size is None:
        cap = max(lens, default=0) + 3
        kc, vc = np.full((b, cap, hkv, d), np.nan), np.full((b, cap, hkv, d), np.nan)
        for i, (k, v) in enumerate(keys):
            kc[i, :lens[i]], vc[i, :lens[i]] = k, v
        return q, kc, vc, None, keys
    used = [-(-n // page_size) for n in lens]
    pages = sum(used) + spare
    order = gen.permutation(pages)
    kc = np.full((pages, page_size, hkv, d), np.nan)
    vc = np.full((pages, page_size, hkv, d), np.nan)
    table = np.full((b, max(used, default=0) + 1), -1, np.int32)
    at = 0
    for i, (k, v) in enumerate(keys):
        for j in range(used[i]):
            page = order[at]
            at += 1
            table[i, j] = page
            rows = slice(j * page_size, min(lens[i], (j + 1) * page_size))
            n = rows.stop - rows.start
            kc[page, :n], vc[page, :n] = k[rows], v[rows]
    return q, kc, vc, table, keys


def reference_kvcache(q, keys, causal, scale):
    """:func:`reference` per sequence over its gathered keys: (out, lse (b, hq, sq), weighted
    |v|, |s| bound)."""
    out, wabs = np.zeros(q.shape), np.zeros(q.shape)
    b, sq, hq, _ = q.shape
    lse, sbound = np.full((b, hq, sq), -np.inf), np.zeros((b, hq, sq))
    for i, (k, v) in enumerate(keys):
        o, l, w, s = reference(q[i:i + 1], k[None], v[None], causal, scale)
        out[i], wabs[i], lse[i], sbound[i] = o[0], w[0], l[0], s[0]
    return out, lse, wabs, sbound


def check_kvcache(b, sq, lens, hq, hkv, d, causal, dtype="bfloat16", page_size=None,
                  lib="numba", scale=None, host_seqlens=False):
    """One numbatc.attention_with_kvcache call (output poisoned with NaN, lse asked) on
    :func:`kvcache_inputs` against :func:`reference_kvcache`.  ``host_seqlens`` passes
    cache_seqlens as a NumPy array (else an int32 device array of ``lib``)."""
    q, kc, vc, table, keys = kvcache_inputs(b, sq, lens, hq, hkv, d, dtype, page_size)
    dq, dk, dv = (to_device(x, dtype, lib) for x in (q, kc, vc))
    seqlens = np.array(lens, np.int32)
    if not host_seqlens:
        seqlens = _int_device(seqlens, lib)
    dt = None if table is None else _int_device(table, lib)
    out = to_device(np.full(q.shape, np.nan), dtype, lib)
    got, lse = numbatc.attention_with_kvcache(dq, dk, dv, seqlens, block_table=dt,
                                              causal=causal, scale=scale, out=out,
                                              return_lse=True)
    assert got is out
    cuda.synchronize()
    got = to_host(got, dtype)
    lse = to_host(lse, "float32") if hasattr(lse, "cpu") else lse.copy_to_host().astype(np.float64)
    ref, ref_lse, wabs, sbound = reference_kvcache(q, keys, causal, scale or 1 / math.sqrt(d))
    what = (f"attention_with_kvcache b={b} sq={sq} lens={list(lens)} hq={hq} hkv={hkv} d={d} "
            f"causal={causal} {dtype} page_size={page_size} {lib}")
    assert lse.shape == (b, hq, sq), f"{what}: lse shape {lse.shape}"
    tol = 2 * ROUNDING[dtype] * (np.abs(ref) + wabs) + 1e-6
    bad = ~(np.abs(got - ref) <= tol)  # NaN (an unwritten element, a poisoned key) counts as bad
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad outputs, first at {i}: got {got[i]!r}, "
                             f"want {ref[i]!r} +- {tol[i]:.3g}")
    empty = np.isinf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), (f"{what}: lse -inf where no key is seen, "
                                                      "only there")
    lse_tol = 1e-5 * (1 + sbound)
    bad = ~(np.abs(np.where(empty, 0, lse) - np.where(empty, 0, ref_lse)) <= lse_tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {bad.sum()} bad lse, first at {i}: got {lse[i]!r}, "
                             f"want {ref_lse[i]!r} +- {lse_tol[i]:.3g}")


def _int_device(host, lib):
    if lib == "torch":
        import torch

        return torch.from_numpy(host).cuda()
    return cuda.to_device(host)
