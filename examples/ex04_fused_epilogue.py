"""Level 4: a fused epilogue -- your own device function runs on every output element of
numbatc's tensor-core GEMM before it is stored.

Run:  python examples/ex04_fused_epilogue.py

A transformer MLP's ``gelu(x @ W + bias) + residual`` is usually three kernels (GEMM, bias + GELU,
residual add), each reading and writing the whole (M, N) activation.  ``numbatc.gemm`` takes
``epilogue=fn``: a ``@cuda.jit(device=True)`` function ``fn(value, row, col, *epilogue_args)``
that receives each float32 accumulator with its coordinates and returns the value to store, so
the three run as one kernel and the activation is written once.  ``epilogue_args`` carry the extra
arrays (here the bias and the residual) into the kernel.  The result is checked against NumPy in
float64.  (``python -m numbatc.bench epilogue`` measures what the fusion costs over the plain GEMM.)
"""

import math

import numpy as np
from numba import cuda

import numbatc

M, N, K = 48, 40, 64


@cuda.jit(device=True)
def bias_gelu_residual(v, row, col, bias, residual):
    """gelu(v + bias[col]) + residual[row, col], GELU in its tanh form, all in float32."""
    x = v + bias[col]
    inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1) + math.tanh(inner)) + residual[row, col]


def reference(a, w, bias, residual):
    x = a.astype(np.float64) @ w.astype(np.float64) + bias
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))) + residual


def run(verbose=True):
    gen = np.random.default_rng()
    a = gen.standard_normal((M, K)).astype(np.float16)
    w = (gen.standard_normal((K, N)) / math.sqrt(K)).astype(np.float16)
    bias = gen.standard_normal(N).astype(np.float32)
    residual = gen.standard_normal((M, N)).astype(np.float32)
    out = numbatc.gemm(cuda.to_device(a), cuda.to_device(w), out_dtype="float32",
                       epilogue=bias_gelu_residual,
                       epilogue_args=(cuda.to_device(bias), cuda.to_device(residual)))
    got = out.copy_to_host()
    want = reference(a, w, bias, residual)
    err = float(np.max(np.abs(got - want)))
    if verbose:
        print(f"gelu(a @ w + bias) + residual, ({M}x{K}) @ ({K}x{N}), one kernel: max |error| = {err:.2e}")
    return err < 1e-4 * (1 + np.abs(want).max())


KERNELS = []  # the GEMM is numbatc's own kernel (compiled per epilogue at the first call)

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL: the fused epilogue differs from the float64 reference")
    raise SystemExit(0 if ok else 1)
