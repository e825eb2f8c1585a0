"""``numbatc.attention``: softmax(scale * Q K^T [+ causal mask]) V on CUDA arrays of any library,
FlashAttention-2 style (no S or P matrix in memory; fp32 softmax and accumulation).

This module is the user-facing layer: check -> allocate -> hand an :class:`AttentionProblem` to
``numbatc.kernels.dispatch.launch_attention`` (which picks a kernel and a configuration and
launches).
Inputs are read in place: any strides whose last dimension is contiguous.

This module is ``numbatc.attention_api``; ``numbatc.attention`` is its function.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from numbatc import gemm_api
from numbatc._warm import ABSENT, CACHE, MISS, Entry, remember, span
from numbatc.interop import alloc, arrays, streams
from numbatc.interop.arrays import CudaArray
from numbatc.interop.probes import allocate_probed, probe

__all__ = ["attention", "AttentionProblem", "DTYPES", "HEAD_DIMS"]

#: input (and output) dtypes; softmax and accumulation are float32 for both.
DTYPES = ("float16", "bfloat16")
#: supported head dims: every multiple of 8 up to 256.
HEAD_DIMS = tuple(range(8, 257, 8))
_MIN_CC = (8, 0)
_ACCEPTED_DTYPES = (
    "float16, bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, or numbatc.bfloat16(<uint16 array>))"
)
_SHAPES = {"q": "(batch, seqlen_q, heads_q, head_dim)", "k": "(batch, seqlen_k, heads_kv, head_dim)",
           "v": "(batch, seqlen_k, heads_kv, head_dim)", "out": "(batch, seqlen_q, heads_q, head_dim)"}


@dataclass(frozen=True)
class AttentionProblem:
    """One checked attention call, as the kernel layer sees it.

    q, out: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim);
    each a CudaArray with element strides and unit stride on head_dim.  ``lse`` is None or a
    float32 (batch, heads_q, seqlen_q) row-major CudaArray.  ``group`` = heads_q / heads_kv
    (query head h reads key/value head h // group).  ``causal``: query i sees keys
    j <= i + seqlen_k - seqlen_q.  ``scale`` multiplies Q K^T before the softmax.
    ``dispatch.launch_attention`` is called with batch, seqlen_q, heads_q >= 1 (seqlen_k may be
    0)."""

    q: CudaArray
    k: CudaArray
    v: CudaArray
    out: CudaArray
    lse: CudaArray | None
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    scale: float
    dtype: str
    device: int | None
    cc: tuple | None
    stream_handle: int

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @cached_property
    def stream(self):
        return streams.numba_stream(self.stream_handle, self.device)


def _device_capability(device):
    # numbatc.gemm's query (one cache, and one place for the CPU tests to patch)
    return gemm_api._device_capability(device)


def _check_4d(name, ca):
    if ca.ndim != 4:
        raise ValueError(f"{name} must be 4-D {_SHAPES[name]}, got shape {ca.shape}")
    if ca.size and ca.shape[3] > 1 and ca.strides[3] != 1:
        raise ValueError(
            f"{name} (shape {ca.shape}) has strides {ca.strides} (in elements): numbatc.attention "
            "reads any strides whose last dimension (head_dim) is contiguous, without copying; "
            f"this one has stride {ca.strides[3]} there: make it contiguous first"
        )
    if ca.size and any(s < 0 for n, s in zip(ca.shape, ca.strides) if n > 1):
        raise ValueError(f"{name} has a negative stride {ca.strides}; reverse views are not supported")


def _overlapping(ca: CudaArray) -> bool:
    """True when two elements of ``ca`` share memory (a stride-0 or folded view)."""
    dims = sorted((s, n) for n, s in zip(ca.shape, ca.strides) if n > 1)
    span = 1
    for stride, n in dims:
        if stride < span:
            return True
        span = stride * (n - 1) + span
    return False


def _scale(scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number (int or float) or None, got {scale!r}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return scale


def attention(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
    """``softmax(scale * q @ k^T) @ v`` per (batch, head), softmax and accumulation in float32.

    q (batch, seqlen_q, heads_q, head_dim); k, v (batch, seqlen_k, heads_kv, head_dim): CUDA
    arrays of any library (Numba, CuPy, PyTorch, ``__cuda_array_interface__``, DLPack), all
    float16 or all bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, or
    ``numbatc.bfloat16(<uint16 array>)``), any strides with a contiguous last dimension (views
    such as a slice of a packed QKV tensor are read in place).  heads_q must be a multiple of
    heads_kv (multi-query / grouped-query attention: query head h uses key/value head
    h // (heads_q // heads_kv)).  head_dim: any multiple of 8 up to 256.  seqlen_q and seqlen_k
    may differ.

    ``scale`` defaults to 1 / sqrt(head_dim).  ``causal=True`` masks aligned to the bottom right
    (as FlashAttention 2.1 and later): query i sees keys j <= i + seqlen_k - seqlen_q, so the
    last query sees every key; with seqlen_q > seqlen_k the first seqlen_q - seqlen_k queries see
    none.  A query that sees no key (those, or any query when seqlen_k == 0) gets output 0 and
    lse -inf.

    Returns an array of q's library (a ``numbatc.bfloat16`` view for marked inputs) shaped like
    q, or ``out`` written in place (same shape and dtype, last dimension contiguous, not
    overlapping the inputs); with ``return_lse=True`` the pair ``(out, lse)``, lse the float32
    (batch, heads_q, seqlen_q) log-sum-exp of the scaled scores (natural log).  Runs on the
    caller's current stream (torch's or CuPy's, else Numba's default).  Empty batch, heads or
    seqlen_q give empty results.
    """
    if (CACHE and _env_key is not None and type(causal) is bool and type(return_lse) is bool
            and (scale is None or type(scale) in (int, float))):
        try:
            key, ptrs = _warm_key(q, k, v, out, causal, scale, return_lse)
            warm = None if key is None else CACHE.get(key)
            if warm is not None and scale is not None:
                scale_f = float(scale)
                if not 0.0 < scale_f < math.inf:
                    warm = None  # the checks say what
        except Exception:  # anything odd (an unhashable argument ...): the checks say what
            warm = None
        if warm is not None:
            result = warm(ptrs, q, k, v, out, causal, warm.default_scale if scale is None
                          else scale_f)
            if result is not MISS:
                return result
    done, problem, relaunch = _attention_checked(q, k, v, causal, scale, out, return_lse)
    if relaunch is not None:
        _remember(q, k, v, out, causal, scale, return_lse, problem, relaunch)
    return done


def _attention_checked(q, k, v, causal, scale, out, return_lse):
    """The whole call: check -> allocate -> launch; (the result, the AttentionProblem or None
    for an empty one, the relaunch function dispatch.launch_attention returned or None)."""
    # --- operands: library, rank, dtype, shapes --------------------------------------------
    Q = arrays.as_cuda_array(q, "q")
    K = arrays.as_cuda_array(k, "k")
    V = arrays.as_cuda_array(v, "v")
    for name, ca in (("q", Q), ("k", K), ("v", V)):
        _check_4d(name, ca)
    for name, ca in (("q", Q), ("k", K), ("v", V)):
        if ca.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {ca.dtype}, not supported; supported: {_ACCEPTED_DTYPES}")
    if not Q.dtype == K.dtype == V.dtype:
        raise TypeError(f"q, k and v must have one dtype; got q {Q.dtype}, k {K.dtype}, v {V.dtype}")
    batch, seqlen_q, heads_q, head_dim = Q.shape
    if K.shape != V.shape:
        raise ValueError(f"k and v must have the same shape {_SHAPES['k']}; got k {K.shape}, v {V.shape}")
    kb, seqlen_k, heads_kv, kd = K.shape
    if kb != batch:
        raise ValueError(f"q has batch {batch} but k and v have batch {kb}")
    if kd != head_dim:
        raise ValueError(f"q has head_dim {head_dim} but k and v have head_dim {kd}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 256, got {head_dim}")
    if heads_kv == 0 and heads_q != 0 or heads_kv and heads_q % heads_kv:
        raise ValueError(
            f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}): query head h reads "
            "key/value head h // (heads_q // heads_kv)"
        )
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")
    scale = _scale(scale, head_dim)

    # --- out ------------------------------------------------------------------------------------
    OUT = None
    if out is not None:
        OUT = arrays.as_cuda_array(out, "out")
        _check_4d("out", OUT)
        if OUT.shape != Q.shape:
            raise ValueError(f"out must have q's shape {Q.shape}, got {OUT.shape}")
        if OUT.dtype != Q.dtype:
            raise TypeError(f"out has dtype {OUT.dtype}; it must have the inputs' dtype {Q.dtype}")
        if OUT.readonly:
            raise ValueError("out is read-only")
        if _overlapping(OUT):
            raise ValueError(f"out (shape {OUT.shape}, strides {OUT.strides}) has overlapping "
                             "elements: it cannot be written")
        for name, other in (("q", Q), ("k", K), ("v", V)):
            if OUT.shares_memory(other):
                raise ValueError(f"out overlaps {name} in memory; numbatc.attention cannot write its "
                                 "result over an input: pass a separate out")

    # --- device ---------------------------------------------------------------------------------
    device = arrays.same_device(Q, K, V, OUT, names=("q", "k", "v", "out"))
    cc = None
    if device is not None:
        cc = _device_capability(device)
        if tuple(cc) < _MIN_CC:
            raise ValueError(f"numbatc.attention needs a GPU of compute capability 8.0 (sm_80, "
                             f"Ampere) or newer; device {device} is sm_{cc[0]}{cc[1]}")

    # --- results --------------------------------------------------------------------------------
    if OUT is None:
        result = alloc.allocate_like(q, Q.shape, Q.dtype)
        OUT = arrays.as_cuda_array(result, "out")
    else:
        result = out
    lse_result = LSE = None
    if return_lse:
        lse_result = alloc.allocate_like(q, (batch, heads_q, seqlen_q), "float32")
        LSE = arrays.as_cuda_array(lse_result, "lse")
    done = (result, lse_result) if return_lse else result
    if batch == 0 or seqlen_q == 0 or heads_q == 0:
        return done, None, None

    problem = AttentionProblem(
        q=Q, k=K, v=V, out=OUT, lse=LSE, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, causal=bool(causal), scale=scale,
        dtype=Q.dtype, device=device if device is not None else OUT.device, cc=cc,
        stream_handle=streams.stream_handle(q),
    )
    return done, problem, _launch(problem)


def _launch(p: AttentionProblem):
    """Pick the kernel family and launch: numbatc.kernels.dispatch's attention table.

    On compute capability 9.0 the Hopper kernel (sm90_attention: wgmma, warp-specialised,
    FlashAttention-3 style) runs head_dim 64 and 128; every other problem runs the portable
    kernel (sm80_attention).  ``NUMBATC_ATTN_KERNEL=sm80`` forces the portable kernel,
    ``=sm90[:<config>]`` the Hopper one (and a config; in the CPU emulation too, which stands
    in for sm_90a but runs the portable kernel unless told: 384 Python threads per block are
    slow).  ``NUMBATC_PRINT_CONFIG=1`` prints the choice (and why sm90 was not taken, or why
    a TMA configuration ran its cp.async twin: sm90_attention.resolve).  The Hopper default is
    sm90_attention.choose_config's (its switch TMA_BY_DEFAULT picks the TMA configurations).
    Returns dispatch.launch_attention's relaunch function or None."""
    from numbatc.kernels import dispatch

    return dispatch.launch_attention(p)


# ---------------------------------------------------------------------------------------------
# the warm call (numbatc._warm, as numbatc.gemm's): a call whose arrays differ from a checked
# one only in their pointers skips the checks and the walk over the kernels.  The key holds
# everything those read: each array's probe key (library, shape, strides, dtype, device ...;
# ABSENT's None for no out), causal and return_lse (bools), whether scale is None (the default
# follows head_dim), the attention environment variables (dispatch.attention_env_key) and the
# thread.  A hit checks what depends on pointers and values: out against q's, k's and v's byte
# ranges (where they meet, the checks decide, exactly) and scale > 0 and finite; it builds the
# AttentionProblem from the arrays and launches the checked call's kernel and configuration,
# whose launch still decides what pointers decide (packing q, k and v; a TMA configuration's
# cp.async twin) -- or, where the kernel module handed back a pointer relaunch
# (dispatch.AttentionRelaunch.fast: sm90_attention's configurations), passes it the pointers,
# and it launches through a parameter buffer made once unless a start is not 16-byte aligned.
# ---------------------------------------------------------------------------------------------

_env_key = None  # numbatc.kernels.dispatch.attention_env_key, bound by the first _remember


def _warm_key(q, k, v, out, causal, scale, return_lse):
    """(key, (q, k, v, out pointers)), or (None, None) when an array has no warm path."""
    pq, pk, pv = probe(q), probe(k), probe(v)
    po = ABSENT if out is None else probe(out)
    if pq is None or pk is None or pv is None or po is None:
        return None, None
    key = ("attention", pq[1], pk[1], pv[1], po[1], causal, return_lse, scale is None,
           _env_key(), threading.get_ident())
    return key, (pq[0], pk[0], pv[0], po[0])


class _AttentionWarm(Entry):
    """numbatc.attention's entry: relaunch(problem) (dispatch.launch_attention's) for the
    AttentionProblem of a call like the checked one; ``fields`` the problem's fields that the
    key fixes, ``default_scale`` 1 / sqrt(head_dim), ``lse_alloc`` lse's allocator (None
    without return_lse)."""

    __slots__ = ("spans", "lse_alloc", "fields", "default_scale", "fast")

    def __init__(self, p: AttentionProblem, relaunch, allocate: bool):
        super().__init__(relaunch, p.q, p.out, allocate)
        self.fast = getattr(relaunch, "fast", None)  # dispatch.AttentionRelaunch's, or None
        self.spans = (span(p.q), span(p.k), span(p.v))
        self.lse_alloc = None if p.lse is None else alloc.allocator(p.q, p.lse.shape, "float32")
        self.fields = dict(batch=p.batch, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
                           heads_q=p.heads_q, heads_kv=p.heads_kv, head_dim=p.head_dim,
                           dtype=p.dtype, device=p.device, cc=p.cc)
        self.default_scale = 1.0 / math.sqrt(p.head_dim)

    def __call__(self, ptrs, q, k, v, out, causal, scale):
        q_ptr, k_ptr, v_ptr, out_ptr = ptrs
        if out is None:
            result, out_ptr = allocate_probed(self.alloc, q)
            if result is None:
                return MISS
        else:
            result = out
            hi = out_ptr + self.out_span
            for ptr, size in zip((q_ptr, k_ptr, v_ptr), self.spans):
                if size and ptr < hi and out_ptr < ptr + size:
                    return MISS  # overlap: the checked path names it
        lse = None
        fast = self.fast
        if fast is not None:
            lse_ptr = 0
            if self.lse_alloc is not None:
                lse, lse_ptr = allocate_probed(self.lse_alloc, q)
                if lse is None:
                    return MISS
            if fast(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, scale, self.stream()):
                return result if lse is None else (result, lse)
            # pointers the kernel's launch must decide on (packing, a TMA twin): the problem
            # path, with the lse just allocated
        if lse is None and self.lse_alloc is not None:
            lse = self.lse_alloc(q)
        as_cuda = arrays.as_cuda_array
        self.relaunch(AttentionProblem(
            q=as_cuda(q, "q"), k=as_cuda(k, "k"), v=as_cuda(v, "v"), out=as_cuda(result, "out"),
            lse=None if lse is None else as_cuda(lse, "lse"), causal=causal, scale=scale,
            stream_handle=self.stream(), **self.fields))
        return result if lse is None else (result, lse)


def _remember(q, k, v, out, causal, scale, return_lse, p, relaunch):
    """Cache ``relaunch`` for calls like this checked one (see _warm_key)."""
    global _env_key
    if _env_key is None:
        from numbatc.kernels.dispatch import attention_env_key

        _env_key = attention_env_key
    if not (type(causal) is bool and type(return_lse) is bool
            and (scale is None or type(scale) in (int, float))):
        return
    try:
        key, _ = _warm_key(q, k, v, out, causal, scale, return_lse)
    except Exception:
        return
    if key is not None:
        remember(key, _AttentionWarm(p, relaunch, allocate=out is None))
