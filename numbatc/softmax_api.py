"""``numbatc.softmax``: row softmax over the last dimension; ``numbatc.gemm_softmax``:
``softmax(scale * (a @ b) + bias)`` with the softmax fused into the GEMM's epilogue.

Both take CUDA arrays of any library (as numbatc.gemm: Numba, CuPy, PyTorch,
``__cuda_array_interface__``, DLPack, ``numbatc.bfloat16``), compute in float32, run on the
caller's current stream and return an array of the input's library.  Check -> allocate -> hand a
:class:`SoftmaxProblem` to numbatc.kernels.row_softmax, or a :class:`GemmSoftmaxProblem` to
numbatc.kernels.sm80_gemm_softmax (the kernel modules' face: ``unsupported``, ``choose``,
``launch``); ``NUMBATC_PRINT_CONFIG=1`` prints the choice to stderr.

The fused kernel holds a whole row in one tile: N <= 256 (``sm80_gemm_softmax.MAX_N``).  Wider
rows are computed unfused -- numbatc.gemm into a float32 scratch, then numbatc.softmax -- with
the same result, and NUMBATC_PRINT_CONFIG says so.

This module is ``numbatc.softmax_api``; ``numbatc.softmax`` and ``numbatc.gemm_softmax`` are its
functions.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from functools import cached_property

from numbatc import gemm_api
from numbatc._warm import ABSENT, CACHE, MISS, Entry, remember, span
from numbatc.interop import alloc, arrays, streams
from numbatc.interop.arrays import CudaArray
from numbatc.interop.probes import allocate_probed, probe

__all__ = ["softmax", "gemm_softmax", "SoftmaxProblem", "GemmSoftmaxProblem", "SOFTMAX_DTYPES"]

SOFTMAX_DTYPES = ("bfloat16", "float16", "float32")


# ---------------------------------------------------------------------------------------------
# the problems handed to the kernel layer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxProblem:
    """One checked numbatc.softmax launch, as the kernel layer sees it: ``x`` and ``out``
    (CudaArrays) seen as ``rows`` rows of ``n`` elements with unit stride, row r starting at
    element r * ``ldx`` of x and r * ``ldo`` of out (out may be x itself).  ``in_dtype`` and
    ``out_dtype`` are theirs (bfloat16, float16 or float32); ``device`` the CUDA ordinal (None
    where unknown), ``cc`` its compute capability; ``stream_handle`` the raw CUstream of the
    caller's library (0 in the emulation).  Built only with rows, n >= 1."""

    x: CudaArray
    out: CudaArray
    rows: int
    n: int
    ldx: int
    ldo: int
    in_dtype: str
    out_dtype: str
    device: int | None
    cc: tuple | None
    stream_handle: int


@dataclass(frozen=True)
class GemmSoftmaxProblem:
    """One checked numbatc.gemm_softmax call, ``out = softmax(scale * (a @ b) + bias)`` over
    each row: a (m, k), b (k, n), out (m, n) and bias (n,) or None as numbatc.gemm_api.Operand
    (layout, leading dimension, alignment); ``in_dtype`` a's and b's, ``out_dtype`` out's,
    ``bias_dtype`` bias's or None; ``device``, ``cc`` and ``stream_handle`` as
    :class:`SoftmaxProblem`'s, ``stream`` the Numba stream object for the handle.  Built only
    with m, n >= 1 and a row-major out (k may be 0: a and b are then never read)."""

    m: int
    n: int
    k: int
    a: gemm_api.Operand
    b: gemm_api.Operand
    bias: gemm_api.Operand | None
    out: gemm_api.Operand
    scale: float
    in_dtype: str
    out_dtype: str
    bias_dtype: str | None
    device: int | None
    cc: tuple | None
    stream_handle: int

    @cached_property
    def stream(self):
        return streams.numba_stream(self.stream_handle, self.device)


def _print_config(text):
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(text, file=sys.stderr)


def _emulated():
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _check_device(names, operands, what):
    """(device, compute capability) of the operands (None, None where unknown)."""
    device = arrays.same_device(*operands, names=names)
    cc = None
    if device is not None:
        cc = gemm_api._device_capability(device)
        if tuple(cc) < (8, 0):
            raise ValueError(f"{what} needs a GPU of compute capability 8.0 (sm_80, Ampere) or "
                             f"newer; device {device} is sm_{cc[0]}{cc[1]}")
    return device, cc


def _leading_stride(shape, strides, n):
    """The row stride when dimensions ``shape`` (with ``strides``) flatten into rows of one
    stride, else None."""
    live = [(sh, st) for sh, st in zip(shape, strides) if sh > 1]
    ld = live[-1][1] if live else n
    expect = ld
    for sh, st in reversed(live):
        if st != expect:
            return None
        expect = st * sh
    return ld


def _outer_dims(ca):
    """How many leading dimensions must be looped over so that the rest flatten into rows of one
    stride (0: all of them flatten)."""
    for split in range(max(ca.ndim - 1, 0)):
        if _leading_stride(ca.shape[split:-1], ca.strides[split:-1], ca.shape[-1]) is not None:
            return split
    return max(ca.ndim - 1, 0)


def _rows(name, ca):
    """(rows, n, ld) of an array seen as rows of its last dimension: the last dimension must have
    unit stride and the leading ones must flatten into one (no copies)."""
    if ca.ndim == 0:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    n = ca.shape[-1]
    rows = 1
    for s in ca.shape[:-1]:
        rows *= s
    if rows == 0 or n == 0:
        return rows, n, max(n, 1)
    if n > 1 and ca.strides[-1] != 1:
        raise ValueError(f"{name} (shape {ca.shape}, strides {ca.strides} in elements) must have "
                         "unit stride on its last dimension: make it contiguous first")
    ld = _leading_stride(ca.shape[:-1], ca.strides[:-1], n)
    if ld is None:
        raise ValueError(f"{name} (shape {ca.shape}, strides {ca.strides} in elements): its "
                         "leading dimensions do not flatten into rows of one stride, and it "
                         "cannot be indexed to split them; make it contiguous first")
    if ld < n and rows > 1:
        raise ValueError(f"{name} (shape {ca.shape}, strides {ca.strides}) has overlapping rows")
    return rows, n, ld


def _check_out(out_ca, shape, dtypes, what):
    if out_ca.shape != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {out_ca.shape}")
    if out_ca.dtype not in dtypes:
        raise TypeError(f"out has dtype {out_ca.dtype}; {what} writes {' or '.join(dtypes)}")
    if out_ca.readonly:
        raise ValueError("out is read-only")


def softmax(x, *, out=None):
    """Row softmax over the last dimension of ``x``, ``exp(x - max) / sum(exp(x - max))``,
    computed in float32.

    ``x``: a CUDA array (any library) of bfloat16, float16 or float32 with at least one dimension
    and unit stride on the last; leading dimensions are flattened into rows without a copy (where
    they do not flatten into one row stride, as in ``x[:, :, 2:]`` of a 4-D array, the outer ones
    are looped over: one launch per outer index).  Returns an array of x's library and dtype, or writes ``out`` (x's shape,
    dtype bfloat16, float16 or float32; it may be x itself, but not overlap it otherwise).  Rows
    of any length: up to 32768 elements a row (16384 for float32 or rows not 8-byte aligned)
    stays in registers (one read, one write); longer rows take two reads.
    A row holding NaN gives NaN; a row of -inf gives NaN (as torch)."""
    if CACHE:
        try:
            px = probe(x)
            po = ABSENT if out is None else probe(out)
            warm = None
            if px is not None and po is not None:
                warm = CACHE.get(("softmax", px[1], po[1], px[0] & 15, po[0] & 15,
                                  threading.get_ident()))
        except Exception:  # anything odd: the checks say what
            warm = None
        if warm is not None:
            result = warm(px[0], po[0], x, out)
            if result is not MISS:
                return result
    X = arrays.as_cuda_array(x, "x")
    if X.dtype not in SOFTMAX_DTYPES:
        raise TypeError(f"x has dtype {X.dtype}; numbatc.softmax takes {', '.join(SOFTMAX_DTYPES)}")
    if X.ndim > 2 and X.size and hasattr(x, "__getitem__"):
        split = _outer_dims(X)
        if out is not None:
            split = max(split, _outer_dims(arrays.as_cuda_array(out, "out")))
        if split:
            return _softmax_split(x, X, out, split)
    rows, n, ldx = _rows("x", X)
    OUT = None if out is None else arrays.as_cuda_array(out, "out")
    if OUT is not None:
        _check_out(OUT, X.shape, SOFTMAX_DTYPES, "numbatc.softmax")
        _, _, ldo = _rows("out", OUT)
        same = (OUT.ptr, OUT.strides, OUT.dtype) == (X.ptr, X.strides, X.dtype)
        if not same and OUT.shares_memory(X):
            raise ValueError("out overlaps x in memory; it may be x itself (in place), but not "
                             "part of it: pass a separate out")
    device, cc = _check_device(("x", "out"), (X, OUT), "numbatc.softmax")
    if OUT is None:
        result = alloc.allocate_like(x, X.shape, X.dtype)
        OUT = arrays.as_cuda_array(result, "out")
        _, _, ldo = _rows("out", OUT)
    else:
        result = out
    if rows == 0 or n == 0:
        return result
    relaunch = _launch_softmax(SoftmaxProblem(
        x=X, out=OUT, rows=rows, n=n, ldx=ldx, ldo=ldo, in_dtype=X.dtype, out_dtype=OUT.dtype,
        device=device, cc=cc, stream_handle=0 if _emulated() else streams.stream_handle(X.obj)))
    if relaunch is not None:
        _remember(x, out, X, OUT, relaunch)
    return result


# ---------------------------------------------------------------------------------------------
# warm calls (numbatc._warm, as numbatc.gemm's): a call whose arrays differ from a checked one
# only in their pointers reuses its decision -- config, grid, prepared launch -- and costs two
# probes, a dict lookup, an overlap test and one cuLaunchKernel.  The key: 'softmax', each
# array's probe key (library, shape, strides, dtype, device ...; ABSENT's for no out), both
# pointers modulo 16 (the vector-load decision reads their alignment) and the thread.
# ---------------------------------------------------------------------------------------------


class _SoftmaxWarm(Entry):
    """numbatc.softmax's entry: relaunch(x, out pointers, stream); out may be x itself."""

    __slots__ = ("x_span",)

    def __init__(self, relaunch, X, OUT, allocate: bool):
        super().__init__(relaunch, X, OUT, allocate)
        self.x_span = span(X)

    def __call__(self, x_ptr, out_ptr, x, out):
        if out is None:
            result, out_ptr = allocate_probed(self.alloc, x)
            if result is None:
                return MISS
        else:
            result = out
            if (out_ptr != x_ptr and x_ptr < out_ptr + self.out_span
                    and out_ptr < x_ptr + self.x_span):
                return MISS  # partial overlap: the checked path names it
        self.relaunch(x_ptr, out_ptr, self.stream())
        return result


def _remember(x, out, X, OUT, relaunch):
    try:
        px = probe(x)
        po = ABSENT if out is None else probe(out)
    except Exception:
        return
    if px is None or po is None:
        return
    if out is not None and OUT.ptr != X.ptr and OUT.shares_memory(X):
        return
    remember(("softmax", px[1], po[1], px[0] & 15, po[0] & 15, threading.get_ident()),
             _SoftmaxWarm(relaunch, X, OUT, allocate=out is None))


def _softmax_split(x, X, out, split):
    """softmax of a view whose leading dimensions do not flatten into rows of one stride (e.g.
    x[:, :, 2:] of a 4-D array): one launch per index of the first ``split`` dimensions, on the
    caller's own views x[i] and out[i] (every library indexes leading dimensions without a
    copy)."""
    import numpy as np

    if out is None:
        out = alloc.allocate_like(x, X.shape, X.dtype)
    OUT = arrays.as_cuda_array(out, "out")
    _check_out(OUT, X.shape, SOFTMAX_DTYPES, "numbatc.softmax")
    same = (OUT.ptr, OUT.strides, OUT.dtype) == (X.ptr, X.strides, X.dtype)
    if not same and OUT.shares_memory(X):
        raise ValueError("out overlaps x in memory; it may be x itself (in place), but not "
                         "part of it: pass a separate out")
    for index in np.ndindex(*X.shape[:split]):
        softmax(x[index], out=out[index])
    return out


def _launch_softmax(p: SoftmaxProblem):
    """row_softmax's configuration for ``p``, launched: its relaunch function or None (see
    row_softmax.launch).  numbatc.softmax's checks leave nothing row_softmax refuses."""
    from numbatc.kernels import row_softmax

    cfg = row_softmax.choose(p)
    _, var = row_softmax.compiled(p, cfg)
    _print_config(f"numbatc.softmax rows={p.rows} N={p.n}: row_softmax {cfg.name}_{var.name} "
                  f"({cfg.rows_per_block} row(s) per block of {cfg.threads} threads)")
    return row_softmax.launch(p, cfg)


def gemm_softmax(a, b, *, bias=None, scale=1.0, out=None):
    """``softmax(scale * (a @ b) + bias)`` over each row, the softmax fused into the GEMM.

    a (M, K), b (K, N): CUDA arrays (any library), both float16 or both bfloat16, row- or
    column-major; ``bias`` (N,) of the input dtype or float32; ``scale`` a real number (e.g.
    1/sqrt(d) for attention scores).  Returns an (M, N) array of a's library and dtype, or writes
    ``out`` (M, N; row-major; the input dtype or float32).  Accumulates and normalises in float32.
    N <= 256 runs one fused kernel (a block owns whole rows); wider rows run numbatc.gemm into a
    float32 scratch and then numbatc.softmax (NUMBATC_PRINT_CONFIG says so)."""
    if CACHE:
        try:
            key, ptrs = _gs_key(a, b, bias, out, scale)
            warm = None if key is None else CACHE.get(key)
        except Exception:  # anything odd: the checks say what
            warm = None
        if warm is not None:
            result = warm(ptrs, a, out, float(scale))
            if result is not MISS:
                return result
    A = arrays.as_cuda_array(a, "a")
    B = arrays.as_cuda_array(b, "b")
    gemm_api._check_2d("a", A)
    gemm_api._check_2d("b", B)
    (m, k), (k2, n) = A.shape, B.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: a is (M, K) = {A.shape} but b is (K, N) = "
                         f"{B.shape}; a.shape[1] must equal b.shape[0]")
    rule = gemm_api._rule_for(A, B)
    scale = gemm_api._real("scale", scale)
    BIAS = None if bias is None else arrays.as_cuda_array(bias, "bias")
    if BIAS is not None:
        if BIAS.ndim != 1 or BIAS.shape[0] != n:
            raise ValueError(f"bias must have shape (N,) = ({n},), got {BIAS.shape}")
        if BIAS.dtype not in rule.bias:
            raise TypeError(f"bias has dtype {BIAS.dtype}; for {rule.a} inputs it must be "
                            f"{' or '.join(rule.bias)}")
    OUT = None if out is None else arrays.as_cuda_array(out, "out")
    outputs = (rule.a, "float32")
    if OUT is not None:
        gemm_api._check_2d("out", OUT)
        _check_out(OUT, (m, n), outputs, "numbatc.gemm_softmax")
        for nm, other in (("a", A), ("b", B), ("bias", BIAS)):
            if other is not None and OUT.shares_memory(other):
                raise ValueError(f"out overlaps {nm} in memory: pass a separate out")
    device, cc = _check_device(("a", "b", "bias", "out"), (A, B, BIAS, OUT),
                               "numbatc.gemm_softmax")
    op_a = gemm_api._matrix("a", A, m, k)
    op_b = gemm_api._matrix("b", B, k, n)
    # unit stride, or a ValueError naming it
    op_bias = None if BIAS is None else gemm_api._vector("bias", BIAS)
    if OUT is None:
        result = alloc.allocate_like(a, (m, n), rule.a)
        OUT = arrays.as_cuda_array(result, "out")
    else:
        result = out
    op_out = gemm_api._matrix("out", OUT, m, n, writable=True)
    if m == 0 or n == 0:
        return result
    if op_out.layout != "row" and n > 1:
        raise ValueError(f"out (strides {OUT.strides}) must be row-major (unit stride on its last "
                         "dimension) for numbatc.gemm_softmax")

    from numbatc.kernels import sm80_gemm_softmax as fused

    p = GemmSoftmaxProblem(
        m=m, n=n, k=k, a=op_a, b=op_b, bias=op_bias, out=op_out, scale=scale, in_dtype=rule.a,
        out_dtype=OUT.dtype, bias_dtype=None if BIAS is None else BIAS.dtype, device=device,
        cc=cc,
        stream_handle=0 if _emulated() else streams.stream_handle(a))
    why = fused.unsupported(p)
    if why is not None:  # rows wider than the fused kernel's tile
        _print_config(f"numbatc.gemm_softmax M={m} N={n} K={k}: {why}: numbatc.gemm (float32) "
                      "+ numbatc.softmax")
        logits = gemm_api.gemm(a, b, alpha=scale, bias=bias, out_dtype="float32")
        softmax(logits, out=result)
        return result
    cfg = fused.choose(p)
    _, var = fused.compiled(p, cfg)
    _print_config(f"numbatc.gemm_softmax M={m} N={n} K={k}: sm80_gemm_softmax {cfg.name} "
                  f"a={var.a_layout} b={var.b_layout} {var.in_dtype}->{var.out_dtype}"
                  f"{' +bias' if BIAS is not None else ''} scale={scale:g}")
    relaunch = fused.launch(p, cfg)
    if relaunch is not None:
        _remember_gs(a, b, bias, out, A, B, BIAS, OUT, relaunch)
    return result


class _GemmSoftmaxWarm(Entry):
    """numbatc.gemm_softmax's entry: relaunch(a, b, bias, out pointers, scale, stream); bias
    replaced by out where the call has none."""

    __slots__ = ("spans",)

    def __init__(self, relaunch, A, B, BIAS, OUT, allocate: bool):
        super().__init__(relaunch, A, OUT, allocate)
        self.spans = tuple(span(X) for X in (A, B, BIAS))

    def __call__(self, ptrs, a, out, scale):
        a_ptr, b_ptr, bias_ptr, out_ptr = ptrs
        if out is None:
            result, out_ptr = allocate_probed(self.alloc, a)
            if result is None:
                return MISS
        else:
            result = out
            hi = out_ptr + self.out_span
            for ptr, size in zip((a_ptr, b_ptr, bias_ptr), self.spans):
                if size and ptr < hi and out_ptr < ptr + size:
                    return MISS  # overlap: the checked path names it
        self.relaunch(a_ptr, b_ptr, bias_ptr if self.spans[2] else out_ptr, out_ptr, scale,
                      self.stream())
        return result


def _gs_key(a, b, bias, out, scale):
    if type(scale) not in (int, float):
        return None, None
    probed = [probe(a), probe(b), ABSENT if bias is None else probe(bias),
              ABSENT if out is None else probe(out)]
    if any(p is None for p in probed):
        return None, None
    key = ("gemm_softmax",) + tuple(p[1] for p in probed) + (
        probed[0][0] & 15, probed[1][0] & 15, threading.get_ident())
    return key, tuple(p[0] for p in probed)


def _remember_gs(a, b, bias, out, A, B, BIAS, OUT, relaunch):
    try:
        key, _ = _gs_key(a, b, bias, out, 1.0)
    except Exception:
        return
    if key is None:
        return
    remember(key, _GemmSoftmaxWarm(relaunch, A, B, BIAS, OUT, allocate=out is None))
