"""Choose a kernel and configuration for a :class:`numbatc.gemm.GemmProblem` and launch it.

The choice is a heuristic on the problem's shape; ``NUMBATC_PRINT_CONFIG=1`` prints it (with the
reason for any fallback) to stderr.
"""

import os
import sys

import numpy as np
from numba import cuda

from numbatc.kernels import sm80_gemm

__all__ = ["choose_sm80", "launch_gemm"]

_NUM_SMS_GUESS = 132  # H100/H200; only shapes the heuristic, never correctness


def choose_sm80(m, n, k):
    """Tile configuration for an (m, n, k) problem: small M gets short tiles, problems that fill
    the GPU with 128x256 tiles get those, the rest 128x128."""
    if m <= 64:
        return sm80_gemm.CONFIGS["64x128x32_4w_4s"]
    big = sm80_gemm.CONFIGS["128x256x32_8w_3s"]
    if sm80_gemm.grid_for(big, m, n) >= _NUM_SMS_GUESS:
        return big
    return sm80_gemm.CONFIGS["128x128x32_4w_4s"]


def _variant(p):
    return sm80_gemm.Sm80Variant(
        a_layout=p.a.layout,
        b_layout=p.b.layout,
        in_dtype=p.in_dtype,
        out_dtype=p.out_dtype,
        c_dtype=p.c.dtype if p.c is not None else None,
        bias_dtype=p.bias_dtype,
        activation=p.activation,
    )


@cuda.jit
def _pack(src, dst):
    """dst[i, j] = src[i, j] for the (rows, cols) of src; dst may be wider (padded rows)."""
    i, j = cuda.grid(2)
    if i < src.shape[0] and j < src.shape[1]:
        dst[i, j] = src[i, j]


def _aligned_view(operand, stream):
    """The operand's kernel view if its start and leading dimension are 16-byte aligned, else an
    aligned copy in the same layout (rows padded to a multiple of 8 elements).  The copy costs one
    pass over the operand; the GEMM kernel then needs no slow path (see sm80_gemm)."""
    view = operand.view
    if operand.alignment == 16:
        return view
    from numbatc._interop import transpose_view

    rows, cols = view.shape
    if operand.layout == "col":  # work on the row-major transpose
        view, (rows, cols) = transpose_view(view), (cols, rows)
    padded = cuda.device_array((rows, (cols + 7) // 8 * 8), dtype=view.dtype, stream=stream)
    packed = padded[:, :cols]
    _pack[((rows + 15) // 16, (cols + 15) // 16), (16, 16), stream](view, packed)
    return transpose_view(packed) if operand.layout == "col" else packed


def launch_gemm(p):
    """Launch the GEMM for problem ``p`` (m, n, k >= 1) on its stream."""
    cfg = choose_sm80(p.m, p.n, p.k)
    var = _variant(p)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.gemm M={p.m} N={p.n} K={p.k}: sm80_gemm {cfg.name} a={var.a_layout}"
              f"{'' if p.a.alignment == 16 else ' (packed: not 16-byte aligned)'} b={var.b_layout}"
              f"{'' if p.b.alignment == 16 else ' (packed: not 16-byte aligned)'} "
              f"{var.in_dtype}->{var.out_dtype}"
              f"{' +c' if var.c_dtype else ''}{' +bias' if var.bias_dtype else ''}"
              f"{' ' + var.activation if var.activation else ''}", file=sys.stderr)
    out = p.out.view
    c = p.c.view if p.c is not None else out
    bias = p.bias.view if p.bias is not None else out
    stream = p.stream
    a = _aligned_view(p.a, stream)
    b = _aligned_view(p.b, stream)
    sm80_gemm.launch(cfg, var, a, b, c, bias, out, p.m, p.n, p.k, np.float32(p.alpha),
                     np.float32(p.beta), stream=stream)
