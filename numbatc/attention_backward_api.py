"""``numbatc.attention_backward``: dQ, dK and dV of :func:`numbatc.attention` from its output,
its log-sum-exp and the gradient of the output, FlashAttention-2's algorithm (P recomputed from
lse, never stored), deterministic (no atomics: two runs give the same bits).

This module is the user-facing layer: check -> allocate -> hand an
:class:`AttentionBackwardProblem` to numbatc.kernels.sm80_attention_backward (every GPU of
compute capability 8.0 or newer) or, on sm_90a at head_dim 128 (64 with
``deterministic=False``), numbatc.kernels.sm90_attention_backward (:func:`kernel_module`; it
asks the faces directly, as numbatc.softmax does).  ``numbatc.attention_backward`` is its
function.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from numbatc.attention_api import (_SHAPES, _check_4d, _check_flags, _check_heads,
                                   _checked_device, _operands, _overlapping, _scale)
from numbatc.interop import alloc, arrays, streams
from numbatc.interop.arrays import CudaArray

__all__ = ["attention_backward", "AttentionBackwardProblem", "kernel_module", "sm90_by_default"]


@dataclass(frozen=True)
class AttentionBackwardProblem:
    """One checked backward call, as the kernel layer sees it: q, k, v, out, do (dO) and the
    results dq, dk, dv as :class:`numbatc.attention_api.AttentionProblem`'s arrays (q, out, do,
    dq (batch, seqlen_q, heads_q, head_dim); k, v, dk, dv (batch, seqlen_k, heads_kv,
    head_dim)); lse float32 (batch, heads_q, seqlen_q), any strides, and dlse (None or like
    lse: the gradient through lse); ``dd`` and ``lse2`` float32
    scratch of batch * heads_q * pad_q elements (pad_q: seqlen_q rounded up to
    sm80_attention_backward.PAD_Q).  batch, heads_q >= 1; either seqlen may be 0."""

    q: CudaArray
    k: CudaArray
    v: CudaArray
    out: CudaArray
    do: CudaArray
    lse: CudaArray
    dlse: CudaArray | None
    dq: CudaArray
    dk: CudaArray
    dv: CudaArray
    dd: CudaArray
    lse2: CudaArray
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
    #: dQ's adds in a fixed order (sm90_attention_backward; sm80's has no atomics at all)
    deterministic: bool = True
    #: sm90_attention_backward's float32 dQ workspace and int32 counters (None for sm80's)
    ws: CudaArray | None = None
    counters: CudaArray | None = None

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @classmethod
    def contiguous(cls, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, *, causal=False,
                   dtype="bfloat16", cc=(9, 0), deterministic=True, ptr=4096):
        """The problem of contiguous operands and results (one stand-in pointer ``ptr``, with
        sm90_attention_backward's workspace) on no device: what the kernel modules read
        (shapes, strides, alignments, dtypes), never the arrays.  numbatc.precompile plans with
        it, the tests describe problems with it."""
        from types import SimpleNamespace

        from numbatc.kernels.sm90_attention_backward import workspace_floats

        def array(*shape):
            strides, step = [], 1
            for n in reversed(shape):
                strides.insert(0, step)
                step *= n
            return SimpleNamespace(ptr=ptr, shape=shape, strides=tuple(strides))

        q = array(batch, seqlen_q, heads_q, head_dim)
        kv = array(batch, seqlen_k, heads_kv, head_dim)
        n_ws, n_count = workspace_floats(batch, heads_q, seqlen_q, head_dim)
        return cls(q=q, k=kv, v=kv, out=q, do=q, lse=array(batch, heads_q, seqlen_q), dlse=None,
                   dq=q, dk=kv, dv=kv, dd=array(1), lse2=array(1), batch=batch,
                   seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                   head_dim=head_dim, causal=causal, scale=head_dim ** -0.5, dtype=dtype,
                   device=None, cc=cc, stream_handle=0, deterministic=deterministic,
                   ws=array(n_ws), counters=array(n_count))

    @cached_property
    def stream(self):
        return streams.numba_stream(self.stream_handle, self.device)


def _input(name, x, like, shape_name):
    """The CudaArray of ``out`` or ``dout``: 4-D, ``like``'s shape and dtype."""
    ca = arrays.as_cuda_array(x, name)
    _check_4d(name, ca, {**_SHAPES, "dout": _SHAPES["q"]})
    if ca.shape != like.shape:
        raise ValueError(f"{name} must have {shape_name}'s shape {like.shape}, got {ca.shape}")
    if ca.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {ca.dtype}; it must have q's dtype {like.dtype}")
    return ca


def _result(name, x, shape, dtype, inputs):
    """The CudaArray of a given dq, dk or dv: its shape and dtype, writable, not overlapping
    itself or an input."""
    ca = arrays.as_cuda_array(x, name)
    if ca.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {ca.shape}")
    if ca.dtype != dtype:
        raise TypeError(f"{name} has dtype {ca.dtype}; it must have the inputs' dtype {dtype}")
    if ca.size and ca.shape[-1] > 1 and ca.strides[-1] != 1:
        raise ValueError(f"{name} (shape {ca.shape}) must have a contiguous last dimension, got "
                         f"strides {ca.strides} (in elements)")
    if ca.size and any(s < 0 for n, s in zip(ca.shape, ca.strides) if n > 1):
        raise ValueError(f"{name} has a negative stride {ca.strides}")
    if ca.readonly:
        raise ValueError(f"{name} is read-only")
    if not ca.size:
        return ca  # nothing is written
    if _overlapping(ca):
        raise ValueError(f"{name} (shape {ca.shape}, strides {ca.strides}) has overlapping "
                         "elements: it cannot be written")
    for other_name, other in inputs:
        if other is not None and ca.shares_memory(other):
            raise ValueError(f"{name} overlaps {other_name} in memory: pass a separate {name}")
    return ca


def attention_backward(q, k, v, out, lse, dout, *, causal=False, scale=None, dq=None, dk=None,
                       dv=None, dlse=None, deterministic=True):
    """The gradients ``(dq, dk, dv)`` of ``out = numbatc.attention(q, k, v, causal=causal,
    scale=scale)`` for the output gradient ``dout``.

    q, k, v, causal, scale: as the forward call's (q (batch, seqlen_q, heads_q, head_dim); k, v
    (batch, seqlen_k, heads_kv, head_dim); float16 or bfloat16; any strides with a contiguous
    head_dim; heads_q a multiple of heads_kv; head_dim a multiple of 8 up to 256; causal aligned
    to the bottom right).  ``out`` and ``lse``: the forward's results (``numbatc.attention(...,
    return_lse=True)``): out like q; lse float32 (batch, heads_q, seqlen_q), natural log, -inf
    for a query that sees no key (its gradients are 0).  ``dout``: like q.  ``dlse`` (optional,
    float32 like lse): the gradient of the loss with respect to lse, where the loss uses it too.

    dk and dv are summed over the query heads that share a key/value head (GQA / MQA).
    Accumulation is float32, the results are in the inputs' dtype and library (or written into
    ``dq`` / ``dk`` / ``dv``: shapes of q, k, v, their dtype, contiguous last dimension, not
    overlapping an input), on the caller's current stream.  Deterministic: the same inputs give
    the same bits (the portable kernels use no atomics; the Hopper kernel, which runs head_dim
    128 on sm_90a, and 64 with ``deterministic=False`` (:func:`sm90_by_default`), adds dQ's
    parts in a fixed order unless ``deterministic=False``).  Empty batch or heads give empty
    results; seqlen_q == 0 gives dk = dv = 0 and seqlen_k == 0 dq = 0."""
    Q, K, V = _operands(q, k, v, _SHAPES)
    batch, seqlen_q, heads_q, head_dim = Q.shape
    kb, seqlen_k, heads_kv, kd = K.shape
    if kb != batch:
        raise ValueError(f"q has batch {batch} but k and v have batch {kb}")
    _check_heads(head_dim, kd, heads_q, heads_kv)
    _check_flags(causal, False)
    scale = _scale(scale, head_dim)
    OUT = _input("out", out, Q, "q")
    DO = _input("dout", dout, Q, "q")
    LSE = arrays.as_cuda_array(lse, "lse")
    if LSE.dtype != "float32":
        raise TypeError(f"lse must be float32 (numbatc.attention(..., return_lse=True)'s), got "
                        f"{LSE.dtype}")
    if LSE.shape != (batch, heads_q, seqlen_q):
        raise ValueError(f"lse must have shape (batch, heads_q, seqlen_q) = "
                         f"{(batch, heads_q, seqlen_q)}, got {LSE.shape}")
    DLSE = None
    if dlse is not None:
        DLSE = arrays.as_cuda_array(dlse, "dlse")
        if DLSE.dtype != "float32":
            raise TypeError(f"dlse must be float32 (as lse), got {DLSE.dtype}")
        if DLSE.shape != LSE.shape:
            raise ValueError(f"dlse must have lse's shape {LSE.shape}, got {DLSE.shape}")
    inputs = (("q", Q), ("k", K), ("v", V), ("out", OUT), ("dout", DO), ("lse", LSE),
              ("dlse", DLSE))
    given = {}
    for name, x, like in (("dq", dq, Q), ("dk", dk, K), ("dv", dv, V)):
        if x is not None:
            given[name] = _result(name, x, like.shape, like.dtype,
                                  inputs + tuple(given.items()))
    device, cc = _checked_device(Q, K, V, OUT)
    arrays.same_device(Q, DO, LSE, DLSE, *given.values(),
                       names=("q", "dout", "lse", "dlse", *given.keys()))

    results = []
    cas = {}
    for name, x, like in (("dq", dq, Q), ("dk", dk, K), ("dv", dv, V)):
        if x is None:
            x = alloc.allocate_like(q, like.shape, like.dtype)
        results.append(x)
        cas[name] = given.get(name) or arrays.as_cuda_array(x, name)
    done = tuple(results)
    if batch == 0 or heads_q == 0 or (seqlen_q == 0 and seqlen_k == 0):
        return done

    from numbatc.kernels import sm80_attention_backward

    pad_q = -(-seqlen_q // sm80_attention_backward.PAD_Q) * sm80_attention_backward.PAD_Q
    scratch = max(batch * heads_q * pad_q, 1)
    dd = arrays.as_cuda_array(alloc.allocate_like(q, (scratch,), "float32"), "dd")
    lse2 = arrays.as_cuda_array(alloc.allocate_like(q, (scratch,), "float32"), "lse2")
    p = AttentionBackwardProblem(
        q=Q, k=K, v=V, out=OUT, do=DO, lse=LSE, dlse=DLSE, dq=cas["dq"], dk=cas["dk"], dv=cas["dv"], dd=dd,
        lse2=lse2, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q,
        heads_kv=heads_kv, head_dim=head_dim, causal=bool(causal), scale=scale, dtype=Q.dtype,
        device=device if device is not None else OUT.device, cc=cc,
        stream_handle=streams.stream_handle(q), deterministic=bool(deterministic))
    kernels, name = kernel_module(p)
    reason = kernels.unsupported(p)
    if reason is not None:
        raise ValueError(f"numbatc.attention_backward: {reason}")
    if kernels is not sm80_attention_backward:  # the Hopper kernel's dQ workspace
        import dataclasses

        n_ws, n_count = kernels.workspace_floats(batch, heads_q, seqlen_q, head_dim)
        ws = arrays.as_cuda_array(alloc.allocate_like(q, (n_ws,), "float32"), "ws")
        counters = arrays.as_cuda_array(alloc.allocate_like(q, (n_count,), "int32"), "counters")
        p = dataclasses.replace(p, ws=ws, counters=counters)
    kernels.launch(p, kernels.choose(p, name))
    return done


def sm90_by_default(p):
    """Whether numbatc.attention_backward runs the Hopper kernel (sm90_attention_backward) for
    ``p`` without being asked, where it applies: at head_dim 128, and at 64 with
    ``deterministic=False``.  Measured on an H100 (2026-12-05, two sessions, ``bench
    attention-backward --shapes quick --kernel all``, the same runs): at 128 the deterministic
    Hopper kernel ran 1.2-2.0x the portable one's TFLOP/s on every row; at 64 it ran 0.6-1.0x,
    and 1.4-2.0x without the fixed order.  Its GPU suite passed there, and compute-sanitizer's
    memcheck, racecheck and synccheck found nothing."""
    return p.head_dim == 128 or (p.head_dim == 64 and not p.deterministic)


def kernel_module(p):
    """(kernel module, configuration name or None) for problem ``p``:
    ``NUMBATC_ATTN_BWD_KERNEL=sm80[:<config>]`` / ``sm90[:<config>]`` forces one (an error
    where it does not apply); ``NUMBATC_ATTN_BWD_CONFIG`` (a configuration of the portable
    kernel) picks the portable one; else the Hopper kernel where it applies and
    :func:`sm90_by_default` says so, the portable one otherwise."""
    import os

    from numbatc.kernels import sm80_attention_backward, sm90_attention_backward

    forced = os.environ.get("NUMBATC_ATTN_BWD_KERNEL", "").strip()
    if forced:
        family, _, name = forced.partition(":")
        mods = {"sm80": sm80_attention_backward, "sm90": sm90_attention_backward}
        if family not in mods:
            raise ValueError(f"NUMBATC_ATTN_BWD_KERNEL={forced!r}: the family must be sm80 or "
                             "sm90")
        return mods[family], name or None
    if os.environ.get("NUMBATC_ATTN_BWD_CONFIG"):
        return sm80_attention_backward, None
    from numba import config

    # (the CPU emulation runs the portable kernel unless told, as numbatc.gemm does: the Hopper
    # kernel's emulation is slow and has its own tests)
    if not config.ENABLE_CUDASIM and sm90_by_default(p) and sm90_attention_backward.applies(p):
        return sm90_attention_backward, None
    return sm80_attention_backward, None
