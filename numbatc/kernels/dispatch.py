"""Choose a kernel and configuration for a :class:`numbatc.gemm.GemmProblem` and launch it.

The choice is a heuristic on the problem's shape; ``NUMBATC_PRINT_CONFIG=1`` prints it (with the
reason for any fallback) to stderr.
"""

import os
import sys

import numpy as np
from numba import cuda

from numba import config

from numbatc.kernels import sm80_gemm

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["choose_sm80", "launch_gemm"]

_NUM_SMS_GUESS = 132  # H100/H200; only shapes the heuristic, never correctness


def choose_sm80(m, n, k):
    """Tile configuration for an (m, n, k) problem: small M gets short tiles, problems that fill
    the GPU with 128x256 tiles get those, the rest 128x128."""
    if m <= 64:
        return sm80_gemm.CONFIGS["64x128x64_4w_4s"]
    big = sm80_gemm.CONFIGS["128x256x64_8w_3s"]
    if sm80_gemm.grid_for(big, m, n) >= _NUM_SMS_GUESS:
        return big
    return sm80_gemm.CONFIGS["128x128x64_4w_4s"]


def _variant(p):
    return sm80_gemm.Sm80Variant(
        a_layout=p.a.layout,
        b_layout=p.b.layout,
        in_dtype=p.in_dtype,
        out_dtype=p.out_dtype,
        c_dtype=p.c.dtype if p.c is not None else None,
        bias_dtype=p.bias_dtype,
        activation=p.activation,
        out_layout=p.out.layout,
        c_layout=p.c.layout if p.c is not None else "row",
    )


@cuda.jit
def _pack(src, dst):
    """dst[i, j] = src[i, j] for the (rows, cols) of src; dst may be wider (padded rows)."""
    i, j = cuda.grid(2)
    if i < src.shape[0] and j < src.shape[1]:
        dst[i, j] = src[i, j]


def _aligned(operand, stream):
    """(view, ld) of the operand if its start and leading dimension are 16-byte aligned, else of
    an aligned copy in the same layout (rows padded to a multiple of 8 elements).  The copy costs
    one pass over the operand; the GEMM kernel then needs no slow path (see sm80_gemm)."""
    view = operand.view
    if operand.alignment == 16:
        return view, operand.ld
    from numbatc._interop import transpose_view

    rows, cols = view.shape
    if operand.layout == "col":  # work on the row-major transpose
        view, (rows, cols) = transpose_view(view), (cols, rows)
    ld = (cols + 7) // 8 * 8
    padded = cuda.device_array((rows, ld), dtype=view.dtype, stream=stream)
    packed = padded[:, :cols]
    _pack[((rows + 15) // 16, (cols + 15) // 16), (16, 16), stream](view, packed)
    return (transpose_view(packed) if operand.layout == "col" else packed), ld


def _flat(view, keep):
    """The kernel's flat operand: a device pointer (int) on the GPU; in the emulation a 1-d array
    over the same memory starting at element (0, 0).  ``keep`` holds temporaries alive until the
    launch has been queued."""
    keep.append(view)
    if view.size == 0:
        return 0
    if _EMULATED:
        import numpy as np

        host = getattr(view, "_ary", view)
        itemsize = host.dtype.itemsize
        span = sum((d - 1) * st for d, st in zip(host.shape, host.strides)) // itemsize + 1
        return np.lib.stride_tricks.as_strided(host, shape=(span,), strides=(itemsize,))
    return view.device_ctypes_pointer.value


def _bits(view):
    """float16 data as uint16 bits: the kernel reads and writes raw 16-bit patterns (bf16
    arrays already arrive as uint16)."""
    return view.view(np.uint16) if view.dtype == np.float16 else view


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
    stream = p.stream
    keep = []
    a_view, lda = _aligned(p.a, stream)
    b_view, ldb = _aligned(p.b, stream)
    out = _flat(_bits(p.out.view), keep)
    c = _flat(_bits(p.c.view), keep) if p.c is not None else out
    bias = _flat(_bits(p.bias.view), keep) if p.bias is not None else out
    ldc = p.c.ld if p.c is not None else 0
    sm80_gemm.launch(cfg, var, _flat(a_view, keep), _flat(b_view, keep), c, bias, out, p.m, p.n,
                     p.k, lda, ldb, ldc, p.out.ld, p.alpha, p.beta, stream=stream)
