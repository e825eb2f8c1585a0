"""``numbatc.torch.Linear`` and ``numbatc.torch.patch(model)``."""

from __future__ import annotations

import sys

import torch
from torch import nn

import numbatc

__all__ = ["Linear", "patch"]

_DTYPES = (torch.float16, torch.bfloat16)


def _numbatc_runs(x, w) -> bool:
    """Whether Linear's forward runs numbatc.gemm for input ``x`` and weight ``w``."""
    return (x.is_cuda and x.dtype in _DTYPES and w.dtype == x.dtype
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)))


class Linear(nn.Linear):
    """``nn.Linear`` computed by ``numbatc.gemm(x, weight.T, bias=bias)`` (weight (out, in)
    row-major is read as the column-major (in, out) b, without a copy).

    numbatc runs when the input is a CUDA tensor of float16 or bfloat16 with the weight's dtype
    and no gradient is needed (numbatc's kernels are forward only); otherwise the forward is
    ``torch.nn.functional.linear``, so training, CPU and float32 modules behave as before.
    Leading dimensions of the input are flattened into M (``x.reshape(-1, in_features)``)."""

    def forward(self, x):
        w = self.weight
        if _numbatc_runs(x, w):
            bias = self.bias
            if bias is not None and bias.dtype not in (x.dtype, torch.float32):
                bias = bias.to(x.dtype)
            y = numbatc.gemm(x.reshape(-1, self.in_features), w.t(), bias=bias)
            return y.reshape(*x.shape[:-1], self.out_features)
        return nn.functional.linear(x, w, self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Linear":
        """A Linear sharing ``linear``'s weight and bias (no copy; made on the meta device, so
        nothing is allocated), with its training flag and hooks."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device="meta")
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_state_dict_hooks", "_load_state_dict_pre_hooks"):
            getattr(new, name).update(getattr(linear, name))
        return new


def patch(model: nn.Module, *, include=None, verbose: bool = False) -> int:
    """Replace each ``nn.Linear`` inside ``model`` (not ``model`` itself, nor subclasses of
    nn.Linear, which may compute something else) by a :class:`Linear` sharing its parameters;
    returns how many were swapped.  ``include(name, module) -> bool`` picks which (default:
    all).  ``verbose``: print the count (and what was left alone) to stderr."""
    swapped, left = 0, 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                if isinstance(child, nn.Linear) and not isinstance(child, Linear):
                    left += 1
                continue
            full = f"{parent_name}.{name}" if parent_name else name
            if include is not None and not include(full, child):
                left += 1
                continue
            setattr(parent, name, Linear.from_linear(child))
            swapped += 1
    if verbose:
        print(f"numbatc.torch.patch: {swapped} nn.Linear module(s) now run numbatc.gemm"
              + (f"; {left} left as they were" if left else ""), file=sys.stderr)
    return swapped
