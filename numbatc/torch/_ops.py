"""``torch.ops.numbatc``: numbatc's calls as torch custom ops (``torch.library.custom_op``),
each with a fake (meta) implementation giving the result's shape, dtype and strides, so that
``torch.compile(fullgraph=True)`` and FakeTensorMode trace them without running numba.

    numbatc::gemm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., float beta=0.,
                  Tensor? bias=None, str? activation=None, ScalarType? out_dtype=None) -> Tensor
    numbatc::attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None)
                  -> Tensor
    numbatc::attention_lse(... as attention) -> (Tensor out, Tensor lse)
    numbatc::attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                  Tensor dout, bool causal=False, float? scale=None, Tensor? dlse=None)
                  -> (Tensor dq, Tensor dk, Tensor dv)
    numbatc::softmax(Tensor x) -> Tensor
    numbatc::gemm_softmax(Tensor a, Tensor b, Tensor? bias=None, float scale=1.) -> Tensor

The kernels are registered for CUDA tensors only; results are new row-major (contiguous)
tensors, as the eager calls return.  ``attention`` and ``attention_lse`` have autograd
formulas (``torch.library.register_autograd``) that run ``attention_backward``, so
``loss.backward()`` works through them: attention_lse's saves its lse (and takes the gradient
through lse too); attention's saves its output and recomputes the lse with one more forward
(call attention_lse where that forward counts).  The others are forward only.  ``register()`` also
tells dynamo to trace ``numbatc.gemm`` / ``attention`` / ``softmax`` / ``gemm_softmax`` as
these ops (``torch.compiler.substitute_in_graph``), so a model calling the plain functions
compiles with fullgraph=True too; arguments the ops do not take (out=, a user epilogue, FP8
scales) raise under torch.compile and stay eager-only.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
from torch import Tensor

import numbatc
from numbatc.interop.dtypes import dtype_name

__all__ = ["register", "OPS"]

_LOCK = threading.Lock()
OPS: dict = {}  # name -> the torch.library CustomOpDef, filled by register()


def _out_dtype(out_dtype):
    if out_dtype is None or isinstance(out_dtype, torch.dtype):
        return out_dtype
    return getattr(torch, dtype_name(out_dtype))


def register():
    """Define the ops (once per process; later calls return the same dict)."""
    with _LOCK:
        if not OPS:
            _define()
            _substitute()
    return OPS


def _define():
    @torch.library.custom_op("numbatc::gemm", mutates_args=(), device_types="cuda")
    def gemm(a: Tensor, b: Tensor, c: Optional[Tensor] = None, alpha: float = 1.0,
             beta: float = 0.0, bias: Optional[Tensor] = None, activation: Optional[str] = None,
             out_dtype: Optional[torch.dtype] = None) -> Tensor:
        return numbatc.gemm(a, b, c=c, alpha=alpha, beta=beta, bias=bias,
                            activation=activation, out_dtype=out_dtype)

    @gemm.register_fake
    def _(a, b, c=None, alpha=1.0, beta=0.0, bias=None, activation=None, out_dtype=None):
        torch._check(a.dim() == 2 and b.dim() == 2,
                     lambda: f"numbatc::gemm: a and b must be 2-D, got {a.shape} and {b.shape}")
        torch._check(a.shape[1] == b.shape[0], lambda: (
            f"numbatc::gemm: inner dimensions differ: a is {tuple(a.shape)}, b is "
            f"{tuple(b.shape)}"))
        torch._check(a.dtype == b.dtype,
                     lambda: f"numbatc::gemm: a is {a.dtype} but b is {b.dtype}")
        return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)

    @torch.library.custom_op("numbatc::attention", mutates_args=(), device_types="cuda")
    def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                  scale: Optional[float] = None) -> Tensor:
        return numbatc.attention(q, k, v, causal=causal, scale=scale)

    def _check_attention(q, k, v):
        torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: (
            "numbatc::attention: q, k, v are (batch, seq, heads, head_dim), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"))
        torch._check(k.shape == v.shape, lambda: (
            f"numbatc::attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ"))
        torch._check(q.shape[3] == k.shape[3] and q.shape[0] == k.shape[0], lambda: (
            f"numbatc::attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch "
            "or head_dim"))

    @attention.register_fake
    def _(q, k, v, causal=False, scale=None):
        _check_attention(q, k, v)
        return q.new_empty(q.shape)

    @torch.library.custom_op("numbatc::attention_lse", mutates_args=(), device_types="cuda")
    def attention_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                      scale: Optional[float] = None) -> tuple[Tensor, Tensor]:
        return numbatc.attention(q, k, v, causal=causal, scale=scale, return_lse=True)

    @attention_lse.register_fake
    def _(q, k, v, causal=False, scale=None):
        _check_attention(q, k, v)
        return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]),
                                                 dtype=torch.float32)

    @torch.library.custom_op("numbatc::attention_backward", mutates_args=(),
                             device_types="cuda")
    def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                           dout: Tensor, causal: bool = False, scale: Optional[float] = None,
                           dlse: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(numbatc.attention_backward(q, k, v, out, lse, dout, causal=causal,
                                                scale=scale, dlse=dlse))

    @attention_backward.register_fake
    def _(q, k, v, out, lse, dout, causal=False, scale=None, dlse=None):
        _check_attention(q, k, v)
        torch._check(out.shape == q.shape and dout.shape == q.shape, lambda: (
            f"numbatc::attention_backward: out {tuple(out.shape)} and dout "
            f"{tuple(dout.shape)} must have q's shape {tuple(q.shape)}"))
        torch._check(lse.shape == (q.shape[0], q.shape[2], q.shape[1]), lambda: (
            f"numbatc::attention_backward: lse {tuple(lse.shape)} must be (batch, heads_q, "
            f"seqlen_q) = {(q.shape[0], q.shape[2], q.shape[1])}"))
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    _register_attention_autograd(attention, attention_lse)

    @torch.library.custom_op("numbatc::softmax", mutates_args=(), device_types="cuda")
    def softmax(x: Tensor) -> Tensor:
        return numbatc.softmax(x)

    @softmax.register_fake
    def _(x):
        torch._check(x.dim() >= 1, lambda: "numbatc::softmax: x needs at least one dimension")
        return x.new_empty(x.shape)

    @torch.library.custom_op("numbatc::gemm_softmax", mutates_args=(), device_types="cuda")
    def gemm_softmax(a: Tensor, b: Tensor, bias: Optional[Tensor] = None,
                     scale: float = 1.0) -> Tensor:
        return numbatc.gemm_softmax(a, b, bias=bias, scale=scale)

    @gemm_softmax.register_fake
    def _(a, b, bias=None, scale=1.0):
        torch._check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], lambda: (
            f"numbatc::gemm_softmax: a {tuple(a.shape)} @ b {tuple(b.shape)}"))
        return a.new_empty((a.shape[0], b.shape[1]))

    OPS.update(gemm=gemm, attention=attention, attention_lse=attention_lse,
               attention_backward=attention_backward, softmax=softmax, gemm_softmax=gemm_softmax)


def _attention_args(inputs):
    """(q, k, v, causal, scale) of an attention op's inputs (the schema's defaults filled)."""
    q, k, v, *rest = inputs
    return q, k, v, bool(rest[0]) if rest else False, rest[1] if len(rest) > 1 else None


def _register_attention_autograd(attention, attention_lse):
    """The autograd formulas of numbatc::attention and numbatc::attention_lse (see the module
    docstring): dq, dk, dv from numbatc::attention_backward; causal and scale get none."""

    def grads(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        elif grad_out.stride(-1) != 1:  # an expanded gradient (sum()'s): head_dim must be dense
            grad_out = grad_out.contiguous()
        dq, dk, dv = torch.ops.numbatc.attention_backward(q, k, v, out, lse, grad_out,
                                                          ctx.causal, ctx.scale, grad_lse)
        return dq, dk, dv, None, None

    def setup_lse(ctx, inputs, output):
        q, k, v, ctx.causal, ctx.scale = _attention_args(inputs)
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)

    def backward_lse(ctx, grad_out, grad_lse):
        return grads(ctx, grad_out, grad_lse)

    attention_lse.register_autograd(backward_lse, setup_context=setup_lse)

    def setup(ctx, inputs, output):
        q, k, v, ctx.causal, ctx.scale = _attention_args(inputs)
        ctx.save_for_backward(q, k, v, output)

    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        # the forward kept no lse: recompute it (its out is the saved one, bit for bit)
        _, lse = torch.ops.numbatc.attention_lse(q, k, v, ctx.causal, ctx.scale)
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        dq, dk, dv = torch.ops.numbatc.attention_backward(q, k, v, out, lse, grad_out,
                                                          ctx.causal, ctx.scale, None)
        return dq, dk, dv, None, None

    attention.register_autograd(backward, setup_context=setup)


def _eager_only(what):
    raise NotImplementedError(
        f"{what} is not traced by torch.compile (torch.ops.numbatc has no such argument): call "
        "it outside the compiled region")


def _substitute():
    """Let dynamo trace the plain numbatc functions as the ops (same signatures)."""
    substitute = getattr(getattr(torch, "compiler", None), "substitute_in_graph", None)
    if substitute is None:  # torch < 2.6: torch.ops.numbatc.* still work under torch.compile
        return

    @substitute(numbatc.gemm)
    def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, bias=None, activation=None, out=None,
             out_dtype=None, epilogue=None, epilogue_args=(), scale_a=None, scale_b=None):
        if out is not None:
            _eager_only("numbatc.gemm(out=...)")
        if epilogue is not None or epilogue_args:
            _eager_only("numbatc.gemm with a user epilogue")
        if scale_a is not None or scale_b is not None:
            _eager_only("numbatc.gemm with FP8 or block scales")
        return torch.ops.numbatc.gemm(a, b, c, float(alpha), float(beta), bias, activation,
                                      _out_dtype(out_dtype))

    @substitute(numbatc.attention)
    def attention(q, k, v, *, causal=False, scale=None, out=None, return_lse=False):
        if out is not None:
            _eager_only("numbatc.attention(out=...)")
        if return_lse:
            return torch.ops.numbatc.attention_lse(q, k, v, causal, scale)
        return torch.ops.numbatc.attention(q, k, v, causal, scale)

    @substitute(numbatc.softmax)
    def softmax(x, *, out=None):
        if out is not None:
            _eager_only("numbatc.softmax(out=...)")
        return torch.ops.numbatc.softmax(x)

    @substitute(numbatc.gemm_softmax)
    def gemm_softmax(a, b, *, bias=None, scale=1.0, out=None):
        if out is not None:
            _eager_only("numbatc.gemm_softmax(out=...)")
        return torch.ops.numbatc.gemm_softmax(a, b, bias, float(scale))
