"""numbatc: tensor-core kernels written in Numba ``@cuda.jit`` Python, on top of the
:mod:`intrinsics` layer (mma.sync, ldmatrix, cp.async, wgmma, TMA, mbarrier ...).

``python -m numbatc`` runs the demo: on a GPU it runs the examples and checks them; without one it
compiles every example kernel and intrinsic for each architecture the project claims and reports
what assembled.
"""

__version__ = "0.1.0"

from numbatc.interop import bfloat16, float4_e2m1, float8_e4m3, float8_e5m2  # noqa: E402
from numbatc.gemm_api import gemm  # noqa: E402  (the module is numbatc.gemm_api)
from numbatc.softmax_api import gemm_softmax, softmax  # noqa: E402  (the module is numbatc.softmax_api)
from numbatc.attention_api import attention, attention_varlen, attention_with_kvcache  # noqa: E402  (the module is numbatc.attention_api)
from numbatc.attention_backward_api import attention_backward  # noqa: E402  (the module is numbatc.attention_backward_api)
from numbatc._capture import CaptureError  # noqa: E402
from numbatc.precompile import precompile  # noqa: E402  (the function; it hides the module)


def __getattr__(name):
    # numbatc.torch (custom ops, Linear, patch) imports torch: only on first use
    if name == "torch":
        import importlib

        try:
            return importlib.import_module("numbatc.torch")
        except ImportError as exc:  # hasattr(numbatc, "torch") stays False without torch
            raise AttributeError(f"numbatc.torch is not available: {exc}") from exc
    raise AttributeError(f"module 'numbatc' has no attribute {name!r}")
