"""numbatc.attention as a transformers attention implementation.

    import numbatc.torch
    name = numbatc.torch.register_transformers()       # "numbatc"
    model.set_attn_implementation(name)                 # or attn_implementation=name at load

transformers calls an attention implementation as ``fn(module, query, key, value,
attention_mask, dropout=..., scaling=..., **kwargs) -> (attn_output, attn_weights)`` with query
(batch, heads, seq_q, head_dim), key and value (batch, kv_heads, seq_k, head_dim) -- the KV
cache's tensors, not repeated for grouped-query attention -- and expects attn_output as
(batch, seq_q, heads, head_dim).  numbatc.attention takes (batch, seq, heads, head_dim) with
any strides and a contiguous last dimension, so ``x.transpose(1, 2)`` of each is read in place
(no copy) and GQA is numbatc's own.

numbatc handles the masks a causal decoder needs without a mask tensor: none (full attention)
and causal, for prefill (seq_q == seq_k) and decode (seq_q == 1, which sees every cached key).
The mask is made as for "sdpa" (``AttentionMaskInterface``), which gives None exactly then;
anything else -- a padding or sliding-window mask, dropout, softcapping, attention sinks,
gradients, CPU or float32 tensors, head_dim not a multiple of 8 up to 256, a chunked prefill
(1 < seq_q < seq_k) -- runs transformers' own sdpa_attention_forward, unchanged.
"""

from __future__ import annotations

import torch

import numbatc

__all__ = ["attention_forward", "register", "why_not"]

_DTYPES = (torch.float16, torch.bfloat16)
#: keyword arguments that change the computation numbatc does not implement (when not None)
_UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks", "head_mask")


def why_not(module, query, key, value, attention_mask, dropout=0.0, **kwargs):
    """Why numbatc does not run this call (transformers' sdpa runs it), or None."""
    if attention_mask is not None:
        return "an attention mask (padding, sliding window ...)"
    if dropout:
        return "dropout"
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            return name
    if not (query.is_cuda and key.is_cuda and value.is_cuda):
        return "tensors not on a CUDA device"
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (numbatc: float16, bfloat16)"
    d = query.shape[-1]
    if d % 8 or d > 256 or value.shape[-1] != d:
        return f"head_dim {d} (numbatc: a multiple of 8 up to 256)"
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                    or value.requires_grad):
        return "gradients (numbatc.attention is forward only)"
    sq, sk = query.shape[2], key.shape[2]
    if _causal(module, kwargs) and 1 < sq != sk:
        return "a causal chunk (1 < seq_q != seq_k) without a mask"
    return None


def _causal(module, kwargs):
    is_causal = kwargs.get("is_causal")
    return getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)


def _sdpa(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      **kwargs):
    """transformers' attention-implementation calling convention; see the module docstring."""
    if why_not(module, query, key, value, attention_mask, dropout, **kwargs) is not None:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout,
                     scaling=scaling, **kwargs)
    # seq_q == 1 sees every key (causal or not); seq_q == seq_k: numbatc's bottom-right
    # causal mask is transformers' top-left one
    causal = _causal(module, kwargs) and query.shape[2] > 1
    out = numbatc.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                            causal=causal, scale=scaling)
    return out, None


def register(name: str = "numbatc") -> str:
    """Register :func:`attention_forward` with transformers as ``name`` (and sdpa's mask
    function for it: None where no mask is needed); returns ``name``."""
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        raise ImportError("numbatc.torch.register_transformers needs transformers (4.48 or "
                          "newer: AttentionInterface)") from exc
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers build masks by implementation name themselves
        pass
    else:
        AttentionMaskInterface.register(name, sdpa_mask)
    return name
