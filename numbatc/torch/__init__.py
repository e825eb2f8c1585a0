"""numbatc for PyTorch: what users otherwise write by hand.

- ``torch.ops.numbatc.gemm / attention / attention_lse / attention_backward / softmax /
  gemm_softmax``: custom ops with fake implementations (registered when this module is
  imported; ``numbatc.torch`` is imported on first use of the attribute, so ``import numbatc``
  alone never imports torch); attention and attention_lse have autograd formulas
  (``loss.backward()`` runs attention_backward).
  ``torch.compile(fullgraph=True)`` traces them, and the plain ``numbatc.gemm`` etc. as them.
- :class:`Linear`: an ``nn.Linear`` whose forward runs ``numbatc.gemm`` (CUDA float16/bfloat16
  inputs, no gradient needed; anything else runs ``torch.nn.functional.linear``).
- :func:`patch` ``(model)``: swaps a model's ``nn.Linear`` modules for :class:`Linear` in place,
  sharing their parameters, and returns how many it swapped.
- :func:`register_transformers` ``(name="numbatc")``: numbatc.attention as a transformers
  attention implementation (``model.set_attn_implementation(name)``; see
  :mod:`numbatc.torch.transformers_attention` for what runs where).

    import numbatc.torch
    n = numbatc.torch.patch(model)        # every nn.Linear now runs numbatc.gemm
    y = torch.ops.numbatc.gemm(a, b)      # or numbatc.gemm(a, b), also inside torch.compile
"""

try:
    import torch  # noqa: F401  (the top-level torch: absolute import)
except ImportError as exc:  # pragma: no cover - only where torch is absent
    raise ImportError("numbatc.torch needs PyTorch (pip install torch; a CUDA build to run the "
                      "kernels)") from exc

from numbatc.torch._ops import OPS, register  # noqa: E402
from numbatc.torch.nn import Linear, patch  # noqa: E402
from numbatc.torch.transformers_attention import register as register_transformers  # noqa: E402

register()

__all__ = ["Linear", "OPS", "patch", "register", "register_transformers"]
