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
from types import SimpleNamespace

import numpy as np

from numbatc import _capture, gemm_api
from numbatc._warm import ABSENT, CACHE, MISS, Entry, remember, span
from numbatc.interop import alloc, arrays, streams
from numbatc.interop.arrays import CudaArray
from numbatc.interop.probes import allocate_probed, probe

__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "AttentionProblem", "DTYPES",
           "HEAD_DIMS", "PAGE_MULTIPLE"]

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
_VARLEN_SHAPES = {"q": "(total_q, heads_q, head_dim)", "k": "(total_k, heads_kv, head_dim)",
                  "v": "(total_k, heads_kv, head_dim)", "out": "(total_q, heads_q, head_dim)"}


@dataclass(frozen=True)
class AttentionProblem:
    """One checked attention call, as the kernel layer sees it.

    q, out: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim);
    each a CudaArray with element strides and unit stride on head_dim.  ``lse`` is None or a
    float32 (batch, heads_q, seqlen_q) row-major CudaArray.  ``group`` = heads_q / heads_kv
    (query head h reads key/value head h // group).  ``causal``: query i sees keys
    j <= i + seqlen_k - seqlen_q.  ``scale`` multiplies Q K^T before the softmax.
    ``dispatch.launch_attention`` is called with batch, seqlen_q, heads_q >= 1 (seqlen_k may be
    0).

    Variable-length problems (numbatc.attention_varlen, ``varlen`` True): q and out are
    (total_q, heads_q, head_dim), k and v (total_k, heads_kv, head_dim), ``cu_seqlens_q`` and
    ``cu_seqlens_k`` int32 (batch + 1,) contiguous device CudaArrays (sequence b: rows
    cu_seqlens[b] .. cu_seqlens[b + 1] - 1), ``batch`` the number of sequences, ``seqlen_q`` and
    ``seqlen_k`` max_seqlen_q and max_seqlen_k (the longest sequence may be shorter), lse
    (heads_q, total_q); causal aligns each sequence's bottom right.

    KV-cache problems (numbatc.attention_with_kvcache, ``kv_cache`` True): ``cache_seqlens`` an
    int32 (batch,) contiguous device CudaArray (sequence b's key count), ``seqlen_k`` the
    cache's capacity (what any sequence may hold: the kernels clamp cache_seqlens to it); k and
    v (batch, seqlen_cache, heads_kv, head_dim), or, ``paged`` (``block_table`` an int32 (batch,
    max_blocks) device CudaArray, last dimension contiguous), (num_blocks, page_size, heads_kv,
    head_dim) pages, key j of sequence b in page block_table[b, j // page_size]."""

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
    cu_seqlens_q: CudaArray | None = None
    cu_seqlens_k: CudaArray | None = None
    cache_seqlens: CudaArray | None = None
    block_table: CudaArray | None = None
    page_size: int = 0

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def kv_cache(self) -> bool:
        return self.cache_seqlens is not None

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @cached_property
    def stream(self):
        return streams.numba_stream(self.stream_handle, self.device)

    @classmethod
    def contiguous(cls, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, *, causal=False,
                   dtype="bfloat16", cc=(9, 0), lse=False, scale=None, ptr=4096):
        """The problem of contiguous q, k, v and out (one stand-in pointer ``ptr``; lse too
        with ``lse``) on no device: what the dispatcher and the kernel modules read (shapes,
        strides, alignments, dtypes), never the arrays.  numbatc.precompile plans with it, the
        tests describe problems with it.  ``scale``: head_dim ** -0.5 by default."""
        from types import SimpleNamespace

        def operand(shape):
            b, s, h, d = shape
            return SimpleNamespace(ptr=ptr, shape=shape, strides=(s * h * d, h * d, d, 1))

        q = operand((batch, seqlen_q, heads_q, head_dim))
        kv = operand((batch, seqlen_k, heads_kv, head_dim))
        lse_array = SimpleNamespace(ptr=ptr, shape=(batch, heads_q, seqlen_q),
                                    strides=(heads_q * seqlen_q, seqlen_q, 1)) if lse else None
        return cls(q=q, k=kv, v=kv, out=q, lse=lse_array, batch=batch, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                   causal=causal, scale=head_dim ** -0.5 if scale is None else scale,
                   dtype=dtype, device=None, cc=cc, stream_handle=0)


def _device_capability(device):
    # numbatc.gemm's query (one cache, and one place for the CPU tests to patch)
    return gemm_api._device_capability(device)


def _check_4d(name, ca, shapes=_SHAPES):
    """``ca`` has ``shapes[name]``'s rank (4, or 3 for numbatc.attention_varlen's), a contiguous
    last dimension and no negative stride."""
    ndim = shapes[name].count(",") + 1
    if ca.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shapes[name]}, got shape {ca.shape}")
    if ca.size and ca.shape[-1] > 1 and ca.strides[-1] != 1:
        raise ValueError(
            f"{name} (shape {ca.shape}) has strides {ca.strides} (in elements): numbatc.attention "
            "reads any strides whose last dimension (head_dim) is contiguous, without copying; "
            f"this one has stride {ca.strides[-1]} there: make it contiguous first"
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
    result = _warm_call(lambda: _warm_key(q, k, v, out, causal, scale, return_lse),
                        lambda warm, ptrs, s: warm(ptrs, q, k, v, out, causal, s),
                        causal, scale, return_lse)
    if result is not MISS:
        return result
    done, problem, relaunch = _attention_checked(q, k, v, causal, scale, out, return_lse)
    if relaunch is not None:
        _remember(q, k, v, out, causal, scale, return_lse, problem, relaunch)
    return done


def _warm_call(key_of, call, causal, scale, return_lse):
    """A front end's warm path: ``call(entry, pointers, scale)`` for the cached entry under
    ``key_of()``'s key, or MISS (nothing cached, flags or a scale the checks must see: they say
    what is wrong with them; anything odd, such as an unhashable argument)."""
    if not (CACHE and _env_key is not None and type(causal) is bool
            and type(return_lse) is bool and (scale is None or type(scale) in (int, float))):
        return MISS
    try:
        key, ptrs = key_of()
        warm = None if key is None else CACHE.get(key)
        if warm is None:
            return MISS
        if scale is None:
            scale = warm.default_scale
        else:
            scale = float(scale)
            if not 0.0 < scale < math.inf:
                return MISS
    except Exception:
        return MISS
    return call(warm, ptrs, scale)


def _attention_checked(q, k, v, causal, scale, out, return_lse):
    """The whole call: check -> allocate -> launch; (the result, the AttentionProblem or None
    for an empty one, the relaunch function dispatch.launch_attention returned or None)."""
    # --- operands: library, rank, dtype, shapes --------------------------------------------
    Q, K, V = _operands(q, k, v, _SHAPES)
    batch, seqlen_q, heads_q, head_dim = Q.shape
    if K.shape != V.shape:
        raise ValueError(f"k and v must have the same shape {_SHAPES['k']}; got k {K.shape}, v {V.shape}")
    kb, seqlen_k, heads_kv, kd = K.shape
    if kb != batch:
        raise ValueError(f"q has batch {batch} but k and v have batch {kb}")
    _check_heads(head_dim, kd, heads_q, heads_kv)
    _check_flags(causal, return_lse)
    scale = _scale(scale, head_dim)
    OUT = _checked_out(out, Q, K, V, _SHAPES)
    device, cc = _checked_device(Q, K, V, OUT)

    # --- results --------------------------------------------------------------------------------
    result, OUT, lse_result, LSE = _results(q, out, OUT, Q, return_lse, (batch, heads_q, seqlen_q))
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


def _operands(q, k, v, shapes):
    """(Q, K, V) CudaArrays of one supported dtype, of ``shapes``' rank, k and v alike."""
    Q = arrays.as_cuda_array(q, "q")
    K = arrays.as_cuda_array(k, "k")
    V = arrays.as_cuda_array(v, "v")
    for name, ca in (("q", Q), ("k", K), ("v", V)):
        _check_4d(name, ca, shapes)
    for name, ca in (("q", Q), ("k", K), ("v", V)):
        if ca.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {ca.dtype}, not supported; supported: {_ACCEPTED_DTYPES}")
    if not Q.dtype == K.dtype == V.dtype:
        raise TypeError(f"q, k and v must have one dtype; got q {Q.dtype}, k {K.dtype}, v {V.dtype}")
    if K.shape != V.shape:
        raise ValueError(f"k and v must have the same shape {shapes['k']}; got k {K.shape}, v {V.shape}")
    return Q, K, V


def _check_heads(head_dim, kd, heads_q, heads_kv):
    if kd != head_dim:
        raise ValueError(f"q has head_dim {head_dim} but k and v have head_dim {kd}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 256, got {head_dim}")
    if heads_kv == 0 and heads_q != 0 or heads_kv and heads_q % heads_kv:
        raise ValueError(
            f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv}): query head h reads "
            "key/value head h // (heads_q // heads_kv)"
        )


def _check_flags(causal, return_lse):
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")


def _checked_out(out, Q, K, V, shapes):
    """out's CudaArray (None for none), checked: q's shape and dtype, writable, not
    overlapping itself or an input."""
    OUT = None
    if out is not None:
        OUT = arrays.as_cuda_array(out, "out")
        _check_4d("out", OUT, shapes)
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
    return OUT


def _results(q, out, OUT, Q, return_lse, lse_shape):
    """(out, its CudaArray, lse, its CudaArray): the caller's out or a new array like q, and a
    new float32 lse of ``lse_shape`` when asked (else None, None)."""
    if OUT is None:
        out = alloc.allocate_like(q, Q.shape, Q.dtype)
        OUT = arrays.as_cuda_array(out, "out")
    if not return_lse:
        return out, OUT, None, None
    lse = alloc.allocate_like(q, lse_shape, "float32")
    return out, OUT, lse, arrays.as_cuda_array(lse, "lse")


def _checked_device(Q, K, V, OUT):
    """(device ordinal or None, its compute capability or None): one device, 8.0 or newer."""
    device = arrays.same_device(Q, K, V, OUT, names=("q", "k", "v", "out"))
    cc = None
    if device is not None:
        cc = _device_capability(device)
        if tuple(cc) < _MIN_CC:
            raise ValueError(f"numbatc.attention needs a GPU of compute capability 8.0 (sm_80, "
                             f"Ampere) or newer; device {device} is sm_{cc[0]}{cc[1]}")
    return device, cc


def _launch(p: AttentionProblem):
    """Pick the kernel family and launch: numbatc.kernels.dispatch's attention table.

    On compute capability 9.0 the Hopper kernel (sm90_attention: wgmma, warp-specialised,
    FlashAttention-3 style) runs the head dims of its DEFAULT_HEAD_DIMS, varlen problems
    included; decode shapes run flash-decoding (sm80_decode_attention); every other problem
    runs the portable kernel (sm80_attention).  ``NUMBATC_ATTN_KERNEL=sm80`` forces the portable kernel,
    ``=sm90[:<config>]`` the Hopper one (and a config; in the CPU emulation too, which stands
    in for sm_90a but runs the portable kernel unless told: 384 Python threads per block are
    slow).  ``NUMBATC_PRINT_CONFIG=1`` prints the choice (and why sm90 was not taken, or why
    a TMA configuration ran its cp.async twin: sm90_attention.resolve).  The Hopper default is
    sm90_attention.choose_config's (its switch TMA_BY_DEFAULT picks the TMA configurations).
    Returns dispatch.launch_attention's relaunch function or None."""
    from numbatc.kernels import dispatch

    return dispatch.launch_attention(p)


# ---------------------------------------------------------------------------------------------
# numbatc.attention_varlen: packed sequences of different lengths (flash-attn's varlen form)
# ---------------------------------------------------------------------------------------------


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, scale=None, out=None, return_lse=False):
    """:func:`attention` over ``batch`` sequences of different lengths packed along one row
    axis, with flash-attn's ``flash_attn_varlen_func`` conventions.

    q (total_q, heads_q, head_dim); k, v (total_k, heads_kv, head_dim): sequence b owns rows
    ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1`` of q (and of the output) and rows
    ``cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1`` of k and v.  ``cu_seqlens_q`` and
    ``cu_seqlens_k``: (batch + 1,) prefix sums starting at 0, non-decreasing (a sequence may be
    empty), ending at total_q and total_k; int32 contiguous CUDA arrays on q's device, or host
    arrays (NumPy of any integer dtype, lists, CPU tensors: copied to the device each call).
    ``max_seqlen_q`` / ``max_seqlen_k``: at least the longest sequence's length (the grid
    covers max_seqlen_q rows per sequence and head, so a much larger value costs idle blocks).
    dtypes, head dims, GQA (heads_q a multiple of heads_kv), ``scale`` and ``out`` as in
    :func:`attention`; ``causal`` is aligned to the bottom right of each sequence (query i of a
    sequence of lengths (len_q, len_k) sees keys j <= i + len_k - len_q).  Returns the output
    (total_q, heads_q, head_dim), or ``(out, lse)`` with ``return_lse=True``, lse float32
    (heads_q, total_q) as flash-attn's (-inf, and output 0, for a query that sees no key).

    Checks: device cu_seqlens are read back to the host and checked against the rules above,
    except while the stream captures a CUDA graph, where their values cannot be read: they are
    then not checked.  The copy is queued behind the work already on the stream, the kernel is
    launched, and the values are checked while it runs (:func:`_read_back_later`): the GPU
    does not wait for the host's checks, and a ValueError for bad values comes after the launch
    (out then holds unspecified rows).  Whatever they hold, the kernel clamps them to the rows
    of q and k (no read or write outside the arrays); values that break the rules give
    unspecified rows, and rows past max_seqlen_q of a sequence are not written.  Host
    cu_seqlens are checked before anything runs, and cannot be copied under capture (a
    CaptureError).  Runs sm90_attention on compute capability 9.0 (its TMA configurations:
    maps over the packed rows) at the head dims it takes, else the portable kernel
    (sm80_attention).  Warm calls (device cu_seqlens; arrays, max_seqlen and flags as a
    checked call's, other pointers) skip the argument checks and the dispatch, not the
    values' check (:class:`_VarlenWarm`)."""
    result = _warm_call(
        lambda: _varlen_warm_key(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, causal, scale, return_lse),
        lambda warm, ptrs, s: warm(ptrs, q, k, v, out, (cu_seqlens_q, cu_seqlens_k), causal, s),
        causal, scale, return_lse)
    if result is not MISS:
        return result
    done, problem, relaunch = _attention_varlen_checked(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, out,
        return_lse)
    if relaunch is not None:
        _remember_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         causal, scale, return_lse, problem, relaunch)
    return done


def _attention_varlen_checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal, scale, out, return_lse):
    """attention_varlen's whole checked call: (the result, the AttentionProblem or None, the
    relaunch dispatch.launch_attention returned or None: an empty problem, host cu_seqlens)."""
    Q, K, V = _operands(q, k, v, _VARLEN_SHAPES)
    total_q, heads_q, head_dim = Q.shape
    total_k, heads_kv, kd = K.shape
    _check_heads(head_dim, kd, heads_q, heads_kv)
    _check_flags(causal, return_lse)
    scale = _scale(scale, head_dim)
    max_seqlen_q = _max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _max_seqlen("max_seqlen_k", max_seqlen_k)
    OUT = _checked_out(out, Q, K, V, _VARLEN_SHAPES)
    device, cc = _checked_device(Q, K, V, OUT)
    stream = streams.stream_handle(q)
    CU_Q, host_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, q, Q, device, stream)
    CU_K, host_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, q, Q, device, stream)
    if CU_Q.shape != CU_K.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one shape (batch + 1,); got "
                         f"{CU_Q.shape} and {CU_K.shape}")
    batch = CU_Q.shape[0] - 1

    def check(host_q, host_k):
        _check_both_prefix_sums((host_q, host_k), (total_q, total_k),
                                (max_seqlen_q, max_seqlen_k))

    values = None  # device prefix sums: their values once the copies land
    if host_q is not None:
        check(host_q, host_k)
    elif not _capture.is_capturing(stream):
        values = _read_back_later((CU_Q, CU_K), stream)

    result, OUT, lse_result, LSE = _results(q, out, OUT, Q, return_lse, (heads_q, total_q))
    done = (result, lse_result) if return_lse else result
    if batch == 0 or total_q == 0 or heads_q == 0 or max_seqlen_q == 0:
        if values is not None:
            check(*values())
        return done, None, None
    problem = AttentionProblem(
        q=Q, k=K, v=V, out=OUT, lse=LSE, batch=batch, seqlen_q=max_seqlen_q,
        seqlen_k=max_seqlen_k, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
        causal=bool(causal), scale=scale, dtype=Q.dtype,
        device=device if device is not None else OUT.device, cc=cc, stream_handle=stream,
        cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K)
    relaunch = _launch_then(problem, values, lambda got: check(*got))
    return done, problem, (relaunch if host_q is None else None)


def _launch_then(problem, values, check):
    """Launch ``problem``; then, where ``values`` (:func:`_read_back_later`'s) is given,
    ``check(values())`` while the kernel runs.  A launch that raises still waits for the copies
    (their pinned buffer is reused) and its error is the one raised.  Returns the launch's
    relaunch function (:func:`_launch`'s)."""
    try:
        relaunch = _launch(problem)
    except BaseException:
        if values is not None:
            values()
        raise
    if values is not None:
        check(values())
    return relaunch


def _max_seqlen(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int (the longest sequence's length or more), got "
                        f"{value!r}")
    if not 0 <= value < 2**31:
        raise ValueError(f"{name} must be in 0 .. 2**31 - 1, got {value}")
    return int(value)


def _is_host(x):
    """True for what attention_varlen takes as host prefix sums: NumPy arrays, lists, tuples
    and CPU tensors."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return True
    return (arrays.library_of(x) == "torch" and x.device.type == "cpu")


def _cu_seqlens(name, x, q, Q, device, stream):
    """(int32 (batch + 1,) contiguous device CudaArray on q's device, its values on the host or
    None) for a cu_seqlens argument: a device array checked, a host array copied over."""
    if _is_host(x):
        host = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
        if host.ndim != 1 or host.size == 0:
            raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {host.shape}")
        if host.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers (int32 on the device), got dtype "
                            f"{host.dtype}")
        if host.min() < -2**31 or host.max() >= 2**31:
            raise ValueError(f"{name}'s values must fit in int32, got {host.min()} .. "
                             f"{host.max()}")
        host = np.ascontiguousarray(host, dtype=np.int32)
        _capture.refuse_if_capturing(stream, f"copy host {name} to the device",
                                     "pass them as an int32 device array")
        dev = alloc.allocate_like(q, host.shape, "int32")
        CU = arrays.as_cuda_array(dev, name)
        _host_to_device(CU, host, stream)
        return CU, host
    CU = arrays.as_cuda_array(x, name)
    if CU.dtype != "int32":
        raise TypeError(f"{name} must be int32 (flash-attn's prefix sums), got {CU.dtype}")
    if CU.ndim != 1 or CU.shape[0] == 0:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {CU.shape}")
    if CU.shape[0] > 1 and CU.strides[0] != 1:
        raise ValueError(f"{name} must be contiguous, got stride {CU.strides[0]} (in elements)")
    arrays.same_device(Q, CU, names=("q", name))  # a ValueError naming both where they differ
    return CU, None


def _host_copy(ca, stream):
    """The values of a small device array, copied to the host on ``stream`` (waits for it)."""
    from numbatc.interop.views import kernel_view

    s = streams.numba_stream(stream, ca.device)
    host = kernel_view(ca).copy_to_host(stream=s)
    s.synchronize()
    return host


_READ_BACK = threading.local()  # .raw: device -> (context, side stream, event, pinned buffer)


def _read_back_later(cas, stream):
    """Queue copies of small int32 device arrays ``cas`` (one device) to pinned host memory,
    ordered after the work queued on ``stream`` so far but not before what the caller queues
    next; return a function that waits for the copies and returns their values (new NumPy
    arrays, in order).

    Why: a copy on ``stream`` itself, waited for before the launch, drains the stream -- the
    GPU finishes every earlier kernel, then idles while the host checks and launches.  Here a
    side stream waits on an event recorded on ``stream`` and copies there: the caller launches
    its kernel first and waits for the values while the kernel runs.  On the GPU this is five
    driver calls on objects made once per thread and device (:func:`_raw_read_back`): Numba's
    stream, event and array wrappers cost about 0.25 ms a call (H200 profile of
    attention_varlen).  A non-contiguous array is copied as :func:`_host_copy` does, at once."""
    from numba import config, cuda

    from numbatc.interop import devices
    from numbatc.interop.views import kernel_view

    def contiguous(ca):
        want = 1
        for n, st in reversed(list(zip(ca.shape, ca.strides))):
            if n > 1 and st != want:
                return False
            want *= n
        return True

    if not all(map(contiguous, cas)):
        hosts = [_host_copy(ca, stream) for ca in cas]
        return lambda: hosts
    device = cas[0].device
    if not config.ENABLE_CUDASIM:
        return _raw_read_back(cas, stream, device)
    # the simulator: the same steps through Numba's objects
    with devices.device_scope(device):
        side = cuda.stream()
        ready = cuda.event()
        ready.record(streams.numba_stream(stream, device))
        ready.wait(side)
        parts = []
        for ca in cas:
            part = cuda.pinned_array(ca.shape, np.int32)
            kernel_view(ca).copy_to_host(part, stream=side)
            parts.append(part)

    def values():
        side.synchronize()
        return [part.copy() for part in parts]

    return values


def _raw_read_back(cas, stream, device):
    """:func:`_read_back_later` on the GPU through cuda.bindings: per thread and device one
    non-blocking side stream, one event (no timing) and one pinned buffer, made once in the
    device's primary context; per call cuEventRecord on ``stream``, cuStreamWaitEvent on the
    side stream, a cuMemcpyDtoHAsync per array, and (in the returned function)
    cuStreamSynchronize.  The calls run in the device's primary context, made current for them
    where another one is."""
    from cuda.bindings import driver as drv
    from numba import cuda

    from numbatc.interop import devices

    held = getattr(_READ_BACK, "raw", None)
    if held is None:
        held = _READ_BACK.raw = {}
    sizes = [ca.size for ca in cas]
    entry = held.get(device)
    if entry is None or entry[3].size < sum(sizes):
        with devices.device_scope(device):
            if entry is None:
                ctx = _ok(drv.cuCtxGetCurrent())
                side = _ok(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
                event = _ok(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            else:
                ctx, side, event = entry[:3]
            entry = held[device] = (ctx, side, event,
                                    cuda.pinned_array(max(sum(sizes), 256), np.int32))
    ctx, side, event, buf = entry
    pushed = int(_ok(drv.cuCtxGetCurrent())) != int(ctx)
    if pushed:
        _ok(drv.cuCtxPushCurrent(ctx))
    try:
        _ok(drv.cuEventRecord(event, drv.CUstream(stream)))
        _ok(drv.cuStreamWaitEvent(side, event, 0))
        host, at, spans = buf.ctypes.data, 0, []
        for ca, n in zip(cas, sizes):
            _ok(drv.cuMemcpyDtoHAsync(host + 4 * at, ca.ptr, 4 * n, side))
            spans.append((at, n, ca.shape))
            at += n
    finally:
        if pushed:
            _ok(drv.cuCtxPopCurrent())

    def values():
        _ok(drv.cuStreamSynchronize(side))
        return [buf[a:a + n].reshape(shape).copy() for a, n, shape in spans]

    return values


def _ok(result):
    """The value of a cuda.bindings call's (error, value) or (error,) result; raises on an
    error."""
    err, *value = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {getattr(err, 'name', err)} reading back "
                           "prefix sums / cache lengths")
    return value[0] if value else None


def _host_to_device(ca, host, stream):
    """Copy ``host`` into the device array ``ca`` on ``stream`` (pageable memory: the copy is
    staged before this returns)."""
    from numbatc.interop.views import kernel_view

    kernel_view(ca).copy_to_device(host, stream=streams.numba_stream(stream, ca.device))


def _check_both_prefix_sums(values, totals, maxima):
    """:func:`_check_prefix_sums` of (cu_seqlens_q, cu_seqlens_k)'s host ``values`` against
    (total_q, total_k) and (max_seqlen_q, max_seqlen_k)."""
    for c, value, total, most in zip("qk", values, totals, maxima):
        _check_prefix_sums(f"cu_seqlens_{c}", value, total, f"max_seqlen_{c}", most)


def _check_prefix_sums(name, cu, total, max_name, max_seqlen):
    """ValueError unless ``cu`` (host values) starts at 0, does not decrease, ends at ``total``
    and has no step above ``max_seqlen``."""
    cu = np.asarray(cu, dtype=np.int64)
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    steps = np.diff(cu)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise ValueError(f"{name} must not decrease: {name}[{b + 1}] = {cu[b + 1]} < "
                         f"{name}[{b}] = {cu[b]}")
    if cu[-1] != total:
        raise ValueError(f"{name}'s last entry {cu[-1]} must be the number of rows "
                         f"({'total_q of q' if name.endswith('q') else 'total_k of k and v'}): "
                         f"{total}")
    if steps.size and steps.max() > max_seqlen:
        b = int(np.argmax(steps))
        raise ValueError(f"{max_name} ({max_seqlen}) is smaller than sequence {b}'s length "
                         f"{steps[b]} ({name}[{b + 1}] - {name}[{b}])")


# ---------------------------------------------------------------------------------------------
# numbatc.attention_with_kvcache: a KV cache, contiguous or paged (flash_attn_with_kvcache's form)
# ---------------------------------------------------------------------------------------------

#: a paged cache's page_size must be a multiple of this (vLLM's 16, flash-attn's 256 ...): the
#: kernels look a page up once per 16-key group of a tile, which then never straddles a page
PAGE_MULTIPLE = 16
_KV_SHAPES = {"q": _SHAPES["q"], "out": _SHAPES["out"],
              "k_cache": "(batch, seqlen_cache, heads_kv, head_dim)",
              "v_cache": "(batch, seqlen_cache, heads_kv, head_dim)"}
_PAGED_SHAPES = {**_KV_SHAPES, "k_cache": "(num_blocks, page_size, heads_kv, head_dim)",
                 "v_cache": "(num_blocks, page_size, heads_kv, head_dim)"}


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None,
                           causal=False, scale=None, out=None, return_lse=False):
    """:func:`attention` of new queries against a KV cache, contiguous or paged, with flash-attn's
    ``flash_attn_with_kvcache`` conventions (its k=/v= append of new keys into the cache, rotary
    embeddings, cache_batch_idx, windows and softcap are not provided: write new keys into the
    cache first).

    q (batch, seqlen_q, heads_q, head_dim).  Without ``block_table``, k_cache and v_cache are
    (batch, seqlen_cache, heads_kv, head_dim) and sequence b uses its first
    ``cache_seqlens[b]`` keys.  With ``block_table`` (int32 (batch, max_blocks_per_seq), last
    dimension contiguous) they are pages (num_blocks, page_size, heads_kv, head_dim), the vLLM /
    FlashInfer layout: key j of sequence b is row ``j % page_size`` of page
    ``block_table[b, j // page_size]``; page_size must be a multiple of 16 (:data:`PAGE_MULTIPLE`:
    vLLM's 16, flash-attn's 256 ...).  ``cache_seqlens``: int32 (batch,) on q's device, a host
    array (NumPy, list, CPU tensor: copied each call) or an int for every sequence; block_table
    may be a host array too.  dtypes (float16 / bfloat16, one for all), head dims (multiples of
    8 up to 256), GQA / MQA (heads_q a multiple of heads_kv), ``scale`` and ``out`` as in
    :func:`attention`.  ``causal`` aligns each sequence's bottom right: query i sees keys
    j <= i + cache_seqlens[b] - seqlen_q (a query that sees no key gets 0 and lse -inf).
    Returns the output (q's shape), or ``(out, lse)`` with ``return_lse=True``, lse float32
    (batch, heads_q, seqlen_q).

    Kernels: seqlen_q <= 16 runs the flash-decoding kernel (sm80_decode_attention, each
    sequence's keys split across blocks by its own length), longer queries (prefill over a
    cached prefix) the portable kernel (sm80_attention); both on every GPU of compute
    capability 8.0 and newer.

    Checks: device cache_seqlens and block_table are read back to the host (a small copy that
    waits for the stream) and checked -- 0 <= cache_seqlens[b] <= the cache's capacity
    (seqlen_cache, or max_blocks_per_seq * page_size) and the entries a sequence uses
    (its first ceil(cache_seqlens[b] / page_size)) in 0 .. num_blocks - 1 -- except while the
    stream captures a CUDA graph, where they are not.  Whatever they hold, the kernels clamp
    cache_seqlens to the capacity and page numbers to 0 .. num_blocks - 1: no read outside
    k_cache or v_cache (results of values that break the rules are unspecified).  Warm calls
    (device cache_seqlens and block_table; arrays and flags as a checked call's, other
    pointers) skip the argument checks and the dispatch, not the values' check
    (:class:`_KvcacheWarm`)."""
    result = _warm_call(
        lambda: _kvcache_warm_key(q, k_cache, v_cache, out, cache_seqlens, block_table, causal,
                                  scale, return_lse),
        lambda warm, ptrs, s: warm(ptrs, q, k_cache, v_cache, out, (cache_seqlens, block_table),
                                   causal, s),
        causal, scale, return_lse)
    if result is not MISS:
        return result
    done, problem, relaunch, room = _kvcache_checked(q, k_cache, v_cache, cache_seqlens,
                                                     block_table, causal, scale, out, return_lse)
    if relaunch is not None:
        _remember_kvcache(q, k_cache, v_cache, out, cache_seqlens, block_table, causal, scale,
                          return_lse, problem, relaunch, room)
    return done


def _kvcache_checked(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, out,
                     return_lse):
    """attention_with_kvcache's whole checked call: (the result, the AttentionProblem or None,
    the relaunch dispatch.launch_attention returned or None: an empty problem, host lengths or
    block table; the words naming the cache's capacity)."""
    paged = block_table is not None
    shapes = _PAGED_SHAPES if paged else _KV_SHAPES
    Q = arrays.as_cuda_array(q, "q")
    K = arrays.as_cuda_array(k_cache, "k_cache")
    V = arrays.as_cuda_array(v_cache, "v_cache")
    for name, ca in (("q", Q), ("k_cache", K), ("v_cache", V)):
        _check_4d(name, ca, shapes)
        if ca.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {ca.dtype}, not supported; supported: "
                            f"{_ACCEPTED_DTYPES}")
    if not Q.dtype == K.dtype == V.dtype:
        raise TypeError(f"q, k_cache and v_cache must have one dtype; got q {Q.dtype}, k_cache "
                        f"{K.dtype}, v_cache {V.dtype}")
    if K.shape != V.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape {shapes['k_cache']}; got "
                         f"k_cache {K.shape}, v_cache {V.shape}")
    batch, seqlen_q, heads_q, head_dim = Q.shape
    blocks, rows, heads_kv, kd = K.shape
    _check_heads(head_dim, kd, heads_q, heads_kv)
    _check_flags(causal, return_lse)
    scale = _scale(scale, head_dim)
    OUT = _checked_out(out, Q, K, V, shapes)
    device, cc = _checked_device(Q, K, V, OUT)
    stream = streams.stream_handle(q)
    BT = host_bt = None
    page_size = 0
    if paged:
        page_size = rows
        if page_size == 0 or page_size % PAGE_MULTIPLE:
            raise ValueError(f"page_size (k_cache.shape[1]) must be a positive multiple of "
                             f"{PAGE_MULTIPLE}, got {page_size}")
        BT, host_bt = _int32_input("block_table", block_table, 2, "(batch, max_blocks_per_seq)",
                                   Q)
        if BT.shape[0] != batch:
            raise ValueError(f"block_table has {BT.shape[0]} rows; it must have one per sequence "
                             f"(batch {batch})")
        capacity = BT.shape[1] * page_size if blocks else 0
        room = (f"the pages block_table holds ({BT.shape[1]} a sequence x page_size "
                f"{page_size})" if blocks else "the pages of k_cache (none)")
    else:
        if blocks != batch:
            raise ValueError(f"q has batch {batch} but k_cache and v_cache have batch {blocks}")
        capacity = rows
        room = f"the cache's seqlen_cache ({rows})"
    if capacity >= 2**31:
        raise ValueError(f"the cache holds {capacity} keys a sequence; at most 2**31 - 1")
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens,
                                                                       (bool, np.bool_)):
        if not 0 <= cache_seqlens < 2**31:
            raise ValueError(f"cache_seqlens must be in 0 .. 2**31 - 1, got {cache_seqlens}")
        cache_seqlens = np.full(batch, cache_seqlens, np.int32)
    CS, host_cs = _int32_input("cache_seqlens", cache_seqlens, 1, "(batch,)", Q)
    if CS.shape != (batch,):
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({batch},), got {CS.shape}")

    result, OUT, lse_result, LSE = _results(q, out, OUT, Q, return_lse, (batch, heads_q, seqlen_q))
    done = (result, lse_result) if return_lse else result
    if batch == 0 or seqlen_q == 0 or heads_q == 0:
        return done, None, None, room
    if host_cs is not None:
        CS = _int32_to_device("cache_seqlens", host_cs, q, stream)
    if host_bt is not None:
        BT = _int32_to_device("block_table", host_bt, q, stream)
    values = None  # device cache_seqlens / block_table: their values once the copies land
    if not _capture.is_capturing(stream):
        device_arrays = [x for x, host in ((CS, host_cs), (BT, host_bt if paged else 0))
                         if host is None]
        if device_arrays:
            values = _read_back_later(device_arrays, stream)
        else:
            _check_cache(host_cs, capacity, room, host_bt, page_size, blocks)

    def check(read):
        got = iter(read)
        _check_cache(next(got) if host_cs is None else host_cs, capacity, room,
                     next(got) if paged and host_bt is None else host_bt, page_size, blocks)

    problem = AttentionProblem(
        q=Q, k=K, v=V, out=OUT, lse=LSE, batch=batch, seqlen_q=seqlen_q, seqlen_k=capacity,
        heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, causal=bool(causal), scale=scale,
        dtype=Q.dtype, device=device if device is not None else OUT.device, cc=cc,
        stream_handle=stream, cache_seqlens=CS, block_table=BT, page_size=page_size)
    relaunch = _launch_then(problem, values, lambda got: check(got))
    device_values = host_cs is None and host_bt is None
    return done, problem, (relaunch if device_values else None), room


def _int32_input(name, x, ndim, shape, Q):
    """(int32 CudaArray, None) for a device array, checked (int32, ``ndim``-D, last dimension
    contiguous, q's device); (a stand-in with the shape, the int32 host values) for a host one
    (copied over by :func:`_int32_to_device` when there is something to compute)."""
    if _is_host(x):
        host = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
        if host.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D {shape}, got shape {host.shape}")
        if host.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers (int32 on the device), got dtype "
                            f"{host.dtype}")
        if host.size and (host.min() < -2**31 or host.max() >= 2**31):
            raise ValueError(f"{name}'s values must fit in int32, got {host.min()} .. "
                             f"{host.max()}")
        host = np.ascontiguousarray(host, dtype=np.int32)
        return SimpleNamespace(shape=host.shape), host
    ca = arrays.as_cuda_array(x, name)
    if ca.dtype != "int32":
        raise TypeError(f"{name} must be int32, got {ca.dtype}")
    if ca.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape}, got shape {ca.shape}")
    if ca.size and ca.shape[-1] > 1 and ca.strides[-1] != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides "
                         f"{ca.strides} (in elements)")
    if ca.size and any(s < 0 for n, s in zip(ca.shape, ca.strides) if n > 1):
        raise ValueError(f"{name} has a negative stride {ca.strides}")
    arrays.same_device(Q, ca, names=("q", name))  # a ValueError naming both where they differ
    return ca, None


def _int32_to_device(name, host, q, stream):
    """A device copy of host int32 values, on q's device and ``stream``."""
    _capture.refuse_if_capturing(stream, f"copy host {name} to the device",
                                 "pass it as an int32 device array")
    ca = arrays.as_cuda_array(alloc.allocate_like(q, host.shape, "int32"), name)
    _host_to_device(ca, host, stream)
    return ca


def _check_cache(seqlens, capacity, room, table, page_size, blocks):
    """ValueError unless every 0 <= seqlens[b] <= capacity and, for a paged cache, the
    block_table entries each sequence uses are page numbers of k_cache."""
    seqlens = np.asarray(seqlens, dtype=np.int64)
    if seqlens.size and seqlens.min() < 0:
        b = int(np.argmin(seqlens))
        raise ValueError(f"cache_seqlens[{b}] = {seqlens[b]} is negative")
    if seqlens.size and seqlens.max() > capacity:
        b = int(np.argmax(seqlens))
        raise ValueError(f"cache_seqlens[{b}] = {seqlens[b]} is more keys than {room}")
    if table is None:
        return
    table = np.asarray(table)
    if table.size and 0 <= table.min() and table.max() < blocks:
        return  # every entry a page: the common case, two reductions (no int64 copies)
    used = -(-seqlens // page_size)
    table = table.astype(np.int64)
    bad = (np.arange(table.shape[1])[None, :] < used[:, None]) & ((table < 0) | (table >= blocks))
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"block_table[{b}, {j}] = {table[b, j]} is not a page of k_cache (0 .. "
                         f"{blocks - 1}); sequence {b} uses its first {used[b]} entries "
                         f"(cache_seqlens {seqlens[b]}, page_size {page_size})")


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


def _probed_key(front_end, arrays, *rest):
    """(key, the arrays' pointers) of a front end's call: ``front_end``, each array's probe key
    (ABSENT's for None: no out, no block table), then ``rest`` (the flags the checks read), the
    attention environment and the thread; (None, None) where an array has no warm path."""
    probes = [ABSENT if x is None else probe(x) for x in arrays]
    if None in probes:
        return None, None
    key = (front_end, *(x[1] for x in probes), *rest, _env_key(), threading.get_ident())
    return key, tuple(x[0] for x in probes)


def _warm_key(q, k, v, out, causal, scale, return_lse):
    """(key, (q, k, v, out pointers)), or (None, None) when an array has no warm path."""
    return _probed_key("attention", (q, k, v, out), causal, return_lse, scale is None)


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

    def outputs(self, ptrs, q, out):
        """(result, out pointer, lse or None, lse pointer or 0) for a call of pointers ``ptrs``
        (q, k, v, out first): out allocated, or checked against q's, k's and v's byte ranges;
        None where the checked path must decide (an allocation without a pointer, an
        overlap: the checks name it)."""
        q_ptr, k_ptr, v_ptr, out_ptr = ptrs[:4]
        if out is None:
            result, out_ptr = allocate_probed(self.alloc, q)
            if result is None:
                return None
        else:
            result = out
            hi = out_ptr + self.out_span
            for ptr, size in zip((q_ptr, k_ptr, v_ptr), self.spans):
                if size and ptr < hi and out_ptr < ptr + size:
                    return None
        lse, lse_ptr = None, 0
        if self.lse_alloc is not None:
            lse, lse_ptr = allocate_probed(self.lse_alloc, q)
            if lse is None:
                return None
        return result, out_ptr, lse, lse_ptr

    def problem(self, q, k, v, result, lse, causal, scale, stream, **more):
        """The AttentionProblem of a call like the checked one (its fields and ``more``)."""
        as_cuda = arrays.as_cuda_array
        return AttentionProblem(
            q=as_cuda(q, "q"), k=as_cuda(k, "k"), v=as_cuda(v, "v"), out=as_cuda(result, "out"),
            lse=None if lse is None else as_cuda(lse, "lse"), causal=causal, scale=scale,
            stream_handle=stream, **self.fields, **more)

    def __call__(self, ptrs, q, k, v, out, causal, scale):
        got = self.outputs(ptrs, q, out)
        if got is None:
            return MISS
        result, out_ptr, lse, lse_ptr = got
        stream = self.stream()
        fast = self.fast
        # the pointer relaunch, or the problem path where there is none or these pointers need
        # the launch's decisions (packing, a TMA configuration's twin)
        if fast is None or not fast(*ptrs[:3], out_ptr, lse_ptr, scale, stream):
            self.relaunch(self.problem(q, k, v, result, lse, causal, scale, stream))
        return result if lse is None else (result, lse)


class _ValuesWarm(_AttentionWarm):
    """The entries of calls that pass device values the checked call reads back and checks
    (attention_varlen's prefix sums, attention_with_kvcache's lengths and block table): each
    warm call still reads them back and checks them while its kernel runs
    (:func:`_read_back_later`; not while the stream captures a graph, as in the checked call).
    A subclass gives ``FAST_KW`` (the name under which the kernel module's pointer relaunch
    takes the values' pointers), :meth:`values_arrays` and :meth:`check`."""

    __slots__ = ()
    FAST_KW = ""

    def values_arrays(self, extras):
        """(the device arrays to read back, the AttentionProblem fields they fill)."""
        raise NotImplementedError

    def check(self, values):
        """Raise a ValueError for read-back values that break the rules."""
        raise NotImplementedError

    def __call__(self, ptrs, q, k, v, out, extras, causal, scale):
        """``ptrs``: q, k, v, out, then one pointer per array of ``extras`` (the values)."""
        got = self.outputs(ptrs, q, out)
        if got is None:
            return MISS
        result, out_ptr, lse, lse_ptr = got
        stream = self.stream()
        cas, more = self.values_arrays(extras)
        values = None if _capture.is_capturing(stream) else _read_back_later(cas, stream)
        fast = self.fast
        try:
            if fast is None or not fast(*ptrs[:3], out_ptr, lse_ptr, scale, stream,
                                        **{self.FAST_KW: self.fast_pointers(ptrs[4:])}):
                self.relaunch(self.problem(q, k, v, result, lse, causal, scale, stream, **more))
        except BaseException:
            if values is not None:
                values()  # the copies land before their buffer is reused
            raise
        if values is not None:
            self.check(values())
        return result if lse is None else (result, lse)

    def fast_pointers(self, extra_ptrs):
        return tuple(extra_ptrs)


def _varlen_warm_key(q, k, v, out, cu_q, cu_k, max_q, max_k, causal, scale, return_lse):
    """attention_varlen's (key, (q, k, v, out, cu_q, cu_k pointers)), or (None, None) where an
    array has no warm path (host prefix sums among them) or a max_seqlen is not an int."""
    if type(max_q) is not int or type(max_k) is not int:
        return None, None
    return _probed_key("attention_varlen", (q, k, v, out, cu_q, cu_k), max_q, max_k, causal,
                       return_lse, scale is None)


class _VarlenWarm(_ValuesWarm):
    """attention_varlen's entry: the prefix sums are read back and checked each call; the
    kernel module's pointer relaunch takes their pointers (``cu=(cu_q, cu_k)``)."""

    __slots__ = ("totals", "maxima")
    FAST_KW = "cu"

    def __init__(self, p: AttentionProblem, relaunch, allocate: bool):
        super().__init__(p, relaunch, allocate)
        self.totals = (p.q.shape[0], p.k.shape[0])
        self.maxima = (p.seqlen_q, p.seqlen_k)

    def values_arrays(self, extras):
        cu_q, cu_k = (arrays.as_cuda_array(x, name)
                      for x, name in zip(extras, ("cu_seqlens_q", "cu_seqlens_k")))
        return (cu_q, cu_k), dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)

    def check(self, values):
        _check_both_prefix_sums(values, self.totals, self.maxima)


def _kvcache_warm_key(q, k, v, out, seqlens, table, causal, scale, return_lse):
    """attention_with_kvcache's (key, (q, k_cache, v_cache, out, cache_seqlens[, block_table]
    pointers)), or (None, None) where an array has no warm path (host cache_seqlens or block
    tables among them)."""
    return _probed_key("attention_with_kvcache", (q, k, v, out, seqlens, table), causal,
                       return_lse, scale is None)


class _KvcacheWarm(_ValuesWarm):
    """attention_with_kvcache's entry: cache_seqlens (and a paged cache's block table) are read
    back and checked each call against the capacity and the pages; the kernel module's pointer
    relaunch takes their pointers (``kv=(cache_seqlens, block_table)``, cache_seqlens twice
    for a contiguous cache)."""

    __slots__ = ("capacity", "room", "page_size", "pages")
    FAST_KW = "kv"

    def __init__(self, p: AttentionProblem, relaunch, allocate: bool, room: str):
        super().__init__(p, relaunch, allocate)
        self.capacity, self.room, self.page_size = p.seqlen_k, room, p.page_size
        self.pages = p.k.shape[0]

    def values_arrays(self, extras):
        seqlens, table = extras
        cs = arrays.as_cuda_array(seqlens, "cache_seqlens")
        if table is None:
            return (cs,), dict(cache_seqlens=cs, block_table=None, page_size=0)
        bt = arrays.as_cuda_array(table, "block_table")
        return (cs, bt), dict(cache_seqlens=cs, block_table=bt, page_size=self.page_size)

    def fast_pointers(self, extra_ptrs):
        cs, bt = extra_ptrs
        return (cs, cs if self.page_size == 0 else bt)

    def check(self, values):
        _check_cache(values[0], self.capacity, self.room, values[1] if self.page_size else None,
                     self.page_size, self.pages)


def _remember_varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, p,
                     relaunch):
    """Cache ``relaunch`` for attention_varlen calls like this checked one (_varlen_warm_key)."""
    _remember_entry(lambda: _varlen_warm_key(q, k, v, out, cu_q, cu_k, max_q, max_k, causal,
                                             scale, return_lse),
                    lambda: _VarlenWarm(p, relaunch, allocate=out is None),
                    causal, scale, return_lse)


def _remember_kvcache(q, k, v, out, seqlens, table, causal, scale, return_lse, p, relaunch,
                      room):
    """Cache ``relaunch`` for attention_with_kvcache calls like this checked one
    (_kvcache_warm_key)."""
    _remember_entry(lambda: _kvcache_warm_key(q, k, v, out, seqlens, table, causal, scale,
                                              return_lse),
                    lambda: _KvcacheWarm(p, relaunch, allocate=out is None, room=room),
                    causal, scale, return_lse)


def _remember(q, k, v, out, causal, scale, return_lse, p, relaunch):
    """Cache ``relaunch`` for calls like this checked one (see _warm_key)."""
    _remember_entry(lambda: _warm_key(q, k, v, out, causal, scale, return_lse),
                    lambda: _AttentionWarm(p, relaunch, allocate=out is None),
                    causal, scale, return_lse)


def _remember_entry(key_of, entry, causal, scale, return_lse):
    """Store ``entry()`` under ``key_of()``'s key for both front ends (binding _env_key on the
    first call); nothing for flags and scales of other types, or a call without a key."""
    global _env_key
    if _env_key is None:
        from numbatc.kernels.dispatch import attention_env_key

        _env_key = attention_env_key
    if not (type(causal) is bool and type(return_lse) is bool
            and (scale is None or type(scale) in (int, float))):
        return
    try:
        key, _ = key_of()
    except Exception:
        return
    if key is not None:
        remember(key, entry())
