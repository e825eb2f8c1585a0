"""``numbatc.gemm``: ``out = activation(alpha * (a @ b) + beta * c + bias)`` on CUDA arrays of any
library, accumulating in float32.

This module is the user-facing layer: check -> allocate -> hand a :class:`GemmProblem` to
``numbatc.kernels.dispatch.launch_gemm`` (which picks a configuration and launches). It makes no
copies: each operand may be row-major (unit stride on its last dimension) or column-major (a
transposed view: unit stride on its first dimension), and the problem records which, with the
leading-dimension stride.

This module is ``numbatc.gemm_api``; ``numbatc.gemm`` is its function.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from functools import cached_property
import numpy as np

from numbatc._warm import ABSENT, CACHE, MISS, Entry, remember, span
from numbatc.interop import alloc, arrays, devices, streams, views
from numbatc.interop.arrays import CudaArray
from numbatc.interop.dtypes import dtype_name
from numbatc.interop.probes import allocate_probed, probe

__all__ = ["gemm", "GemmProblem", "Operand", "DTypeRule", "DTYPE_RULES", "FP8_RULES",
           "ACTIVATIONS", "BlockScaledFormat", "BLOCK_SCALED"]


# ---------------------------------------------------------------------------------------------
# what is supported: dtypes and activations, as data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DTypeRule:
    """One supported (a, b) dtype pair: the output dtypes it may produce (the first is the
    default), the dtypes ``bias`` may have, and the oldest GPU that runs it. ``c`` always has the
    output dtype (as C and D in BLAS)."""

    a: str
    b: str
    outputs: tuple
    bias: tuple
    min_cc: tuple
    acc: str = "float32"


#: (a dtype, b dtype) -> rule (unscaled inputs; fp8 with per-tensor scales: FP8_RULES).
DTYPE_RULES = {
    (r.a, r.b): r
    for r in (
        DTypeRule("float16", "float16", outputs=("float16", "float32"),
                  bias=("float16", "float32"), min_cc=(8, 0)),
        DTypeRule("bfloat16", "bfloat16", outputs=("bfloat16", "float32"),
                  bias=("bfloat16", "float32"), min_cc=(8, 0)),
    )
}


_FP8 = ("float8_e4m3fn", "float8_e5m2")
_FP8_OUT = ("bfloat16", "float16", "float32")

#: FP8 with per-tensor scales (numbatc.gemm(a, b, scale_a=<number>, scale_b=<number>)): a and b
#: float8_e4m3fn or float8_e5m2, each its own; sm90_gemm only (compute capability 9.0, sm_90a).
FP8_RULES = {
    (x, y): DTypeRule(x, y, outputs=_FP8_OUT, bias=_FP8_OUT, min_cc=(9, 0))
    for x in _FP8 for y in _FP8
}


@dataclass(frozen=True)
class BlockScaledFormat:
    """A block-scaled input format (sm_100, tcgen05.mma block_scale): the a/b dtypes it takes
    with their PTX element types, the K values one scale covers, the values a byte of a/b holds,
    the scale dtypes (and the scale format they hold). Output and bias dtypes: bfloat16 (the
    default output), float16, float32."""

    name: str
    inputs: tuple  # ((dtype, PTX element type), ...)
    block: int
    per_byte: int
    scales: tuple
    scale_format: str

    def element_type(self, dtype):
        return dict(self.inputs).get(dtype)

    def rule(self, a_dtype, b_dtype) -> DTypeRule:
        outs = ("bfloat16", "float16", "float32")
        return DTypeRule(a_dtype, b_dtype, outputs=outs, bias=outs, min_cc=(10, 0))


#: MXFP8: a, b float8_e4m3fn or float8_e5m2 (each its own), one ue8m0 scale (uint8 exponent
#: e: 2**(e - 127), or float8_e8m0fnu) per 32 values of K. NVFP4: a, b packed e2m1, two values a
#: byte (float4_e2m1fn_x2, numbatc.float4_e2m1), one ue4m3 scale (float8_e4m3fn, sign clear)
#: per 16 values of K.
BLOCK_SCALED = {
    f.name: f
    for f in (
        BlockScaledFormat("mxfp8", (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2")), 32, 1,
                          ("uint8", "float8_e8m0fnu"), "ue8m0"),
        BlockScaledFormat("nvfp4", (("float4_e2m1fn_x2", "e2m1"),), 16, 2, ("float8_e4m3fn",),
                          "ue4m3"),
    )
}

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _relu(x):
    return np.maximum(x, np.float32(0))


def _gelu_tanh(x):
    x = x.astype(np.float32, copy=False)
    inner = np.float32(_SQRT_2_OVER_PI) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))


def _silu(x):
    x = x.astype(np.float32, copy=False)
    with np.errstate(over="ignore"):
        return x / (np.float32(1) + np.exp(-x))


#: activation name -> NumPy float32 model (the reference the kernels must match):
#: relu max(x, 0); gelu, tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); silu x sigmoid(x).
ACTIVATIONS = {None: lambda x: x, "relu": _relu, "gelu": _gelu_tanh, "silu": _silu}

_ACCEPTED_DTYPES = (
    "float16, bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, or numbatc.bfloat16(<uint16 array>))"
)


# ---------------------------------------------------------------------------------------------
# the problem handed to the kernel layer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """One operand as the kernel sees it.

    ``layout`` 'row': element (i, j) of a matrix is at ``ptr + (i * ld + j) * itemsize``;
    'col': at ``ptr + (i + j * ld) * itemsize``. For bias (1-D, unit stride) layout is 'row' and
    ld its length. ``ld`` is normally >= the contiguous extent; it is 0 for a stride-0 broadcast
    input (``x.expand(m, k)``), never for ``out``. ``alignment`` is the largest power of two
    <= 16 bytes dividing the pointer and every row/column start: the widest vector access the
    kernel may use on it. ``view`` is a Numba device array over the same memory with the user's
    shape and strides (bf16 as uint16, fp8 as uint8), built on first use;
    ``interop.transpose_view(view)`` of a 'col' operand is row-major (NOTE: not ``view.T``:
    Numba's ``.T`` launches a transpose kernel and returns a copy)."""

    name: str
    array: CudaArray
    layout: str
    ld: int
    alignment: int

    @property
    def ptr(self) -> int:
        return self.array.ptr

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def dtype(self) -> str:
        return self.array.dtype

    @property
    def itemsize(self) -> int:
        return self.array.itemsize

    @cached_property
    def view(self):
        return views.kernel_view(self.array)


@dataclass(frozen=True)
class GemmProblem:
    """``out = activation(alpha * (a @ b) + beta * c + bias)``, checked and laid out.

    a (m, k), b (k, n), out (m, n); ``c`` (m, n) is None when the call had no c or beta == 0
    (then c is not read, as in BLAS: NaN in c does not propagate); ``bias`` (n,) or None.
    ``in_dtype`` is a's dtype ('float16' | 'bfloat16'), ``b_dtype`` b's (equal until mixed fp8
    pairs are added), ``out_dtype`` out's (c has it too), ``bias_dtype`` bias's or None,
    ``acc_dtype`` the accumulator ('float32'). ``device`` is the CUDA ordinal, ``cc`` its compute
    capability (major, minor). ``stream_handle`` is the raw CUstream the caller's library is
    using (0: Numba's default stream); ``stream`` the Numba stream object for it.
    ``launch_gemm`` is only called with m, n >= 1, and k >= 1 unless there is a user epilogue
    (which a kernel must run: K == 0 then gives fn(activation(beta * c + bias))).

    Block-scaled problems (``block_scaled`` set, see :data:`BLOCK_SCALED`): ``k`` counts values
    (NVFP4: twice a's bytes per row), a is row-major and b column-major (both K-major), and
    ``scale_a`` (m, k / block) and ``scale_b`` (n, k / block) hold one byte per scale.

    FP8 with per-tensor scales (``tensor_scales`` = (scale_a, scale_b), Python floats; see
    :data:`FP8_RULES`): a row-major, b column-major (both K-major); the kernel computes
    ``alpha * scale_a * scale_b * (a @ b)`` (the dispatcher folds the scales into alpha).
    FP8 with blockwise scales (``blockwise``, :data:`FP8_BLOCK`): ``scale_a`` and ``scale_b``
    hold them and ``tensor_scales`` is (1.0, 1.0)."""

    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    c: Operand | None
    bias: Operand | None
    out: Operand
    alpha: float
    beta: float
    activation: str | None
    in_dtype: str
    b_dtype: str
    out_dtype: str
    bias_dtype: str | None
    acc_dtype: str
    device: int | None
    cc: tuple | None
    stream_handle: int
    epilogue: object = None
    epilogue_args: tuple = ()
    block_scaled: BlockScaledFormat | None = None
    scale_a: Operand | None = None
    scale_b: Operand | None = None
    tensor_scales: tuple | None = None
    # FP8 with blockwise scales (DeepGEMM's recipe, see FP8_BLOCK): scale_a (m, ceil(k / 128))
    # and scale_b (ceil(n / 128), ceil(k / 128)) float32, tensor_scales (1.0, 1.0)
    blockwise: bool = False

    @cached_property
    def stream(self):
        return streams.numba_stream(self.stream_handle, self.device)


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------


@functools.cache
def _device_capability(device: int) -> tuple:
    """(major, minor) of CUDA device ``device`` (patched in CPU tests)."""
    from numba import config

    if config.ENABLE_CUDASIM:  # the CPU emulation stands in for an sm_90a device
        return (9, 0)
    return tuple(devices.gpu(device).compute_capability)


def _alignment(ptr: int, step_bytes: int | None) -> int:
    g = 16
    while g > 1 and (ptr % g or (step_bytes is not None and step_bytes % g)):
        g //= 2
    return g


def _matrix(name: str, ca: CudaArray, rows: int, cols: int, writable: bool = False) -> Operand:
    """Layout of a (rows, cols) operand: 'row' if it has unit stride along its columns, 'col' if
    along its rows (a transposed view). No copies: anything else is an error naming the strides."""
    if ca.size == 0:  # never read nor written
        return Operand(name, ca, "row", max(cols, 1), 16)
    s0, s1 = ca.strides
    if cols > 1 and s1 == 1:
        layout, ld, outer, extent = "row", (s0 if rows > 1 else cols), rows, cols
    elif rows > 1 and s0 == 1:
        layout, ld, outer, extent = "col", (s1 if cols > 1 else rows), cols, rows
    elif cols == 1:  # a single column: element i at ptr + i * s0
        layout, ld, outer, extent = "row", (s0 if rows > 1 else 1), rows, 1
    elif rows == 1:  # a single row: element j at ptr + j * s1
        layout, ld, outer, extent = "col", (s1 if cols > 1 else 1), cols, 1
    else:
        raise ValueError(
            f"{name} (shape {ca.shape}) has strides {ca.strides} (in elements): no unit stride in "
            "either dimension; numbatc.gemm reads row-major (unit stride on the last dimension) "
            "or column-major (a transposed view, unit stride on the first dimension) operands "
            "without copying: make it contiguous first"
        )
    if ld < 0:
        raise ValueError(f"{name} has a negative stride {ca.strides}; reverse views are not supported")
    if writable and outer > 1 and ld < extent:
        raise ValueError(
            f"{name} (shape {ca.shape}, strides {ca.strides}) has overlapping elements: it cannot "
            "be written"
        )
    step = ld * ca.itemsize if outer > 1 else None
    return Operand(name, ca, layout, ld, _alignment(ca.ptr, step))


def _vector(name: str, ca: CudaArray) -> Operand:
    if ca.size > 1 and ca.strides[0] != 1:
        raise ValueError(
            f"{name} (shape {ca.shape}) has stride {ca.strides[0]}; bias must have unit stride: "
            "make it contiguous first"
        )
    return Operand(name, ca, "row", max(ca.shape[0], 1), _alignment(ca.ptr, None))


def _real(name, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number (int or float), got {value!r}")
    return float(value)


def _check_2d(name, ca):
    if ca.ndim != 2:
        what = "(M, K)" if name == "a" else "(K, N)" if name == "b" else "(M, N)"
        raise ValueError(f"{name} must be 2-D {what}, got shape {ca.shape}")


def _rule_for(A: CudaArray, B: CudaArray) -> DTypeRule:
    rule = DTYPE_RULES.get((A.dtype, B.dtype))
    if rule is not None:
        return rule
    known = {d for pair in DTYPE_RULES for d in pair}
    for nm, ca in (("a", A), ("b", B)):
        if ca.dtype not in known:
            raise TypeError(f"{nm} has dtype {ca.dtype}, not supported; supported: {_ACCEPTED_DTYPES}")
    pairs = ", ".join(f"({x}, {y})" for x, y in DTYPE_RULES)
    raise TypeError(
        f"mixed dtypes: a is {A.dtype} but b is {B.dtype}; supported (a, b) pairs: {pairs}"
    )


def _block_format(ca: CudaArray):
    for f in BLOCK_SCALED.values():
        if f.element_type(ca.dtype) is not None:
            return f
    return None


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _tensor_scales(A, B, scale_a, scale_b):
    """(scale_a, scale_b) as floats for FP8 with per-tensor scales (both real numbers), or None
    when neither is a number (an ordinary or block-scaled call)."""
    if not (_is_number(scale_a) or _is_number(scale_b)):
        return None
    for nm, x in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not _is_number(x):
            raise TypeError(
                f"{nm} = {x!r}: with per-tensor FP8 scales both scale_a and scale_b are real "
                "numbers (Python or NumPy scalars; device arrays are block scales)"
            )
        if not math.isfinite(float(x)):
            raise ValueError(f"{nm} = {x!r}: a per-tensor scale must be finite")
    if A.dtype not in _FP8 or B.dtype not in _FP8:
        raise TypeError(
            f"per-tensor scales (scale_a, scale_b numbers) are for FP8 inputs, a and b "
            f"float8_e4m3fn or float8_e5m2 (torch, ml_dtypes, or numbatc.float8_e4m3 / "
            f"numbatc.float8_e5m2(<uint8 array>)); a is {A.dtype} and b is {B.dtype}"
        )
    return float(scale_a), float(scale_b)


#: FP8 with blockwise scales (DeepGEMM's fine-grained recipe; sm_90a): a (M, K) and b (K, N)
#: float8_e4m3fn / float8_e5m2, both K-major; scale_a float32 (M, ceil(K / 128)), one scale per
#: row and 128 values of K; scale_b float32 (ceil(N / 128), ceil(K / 128)), one per block of 128
#: columns x 128 values of K (either layout each).  out = alpha * sum over K blocks kb of
#: scale_a[:, kb, None] * scale_b[None, n // 128, kb] * (a[:, kb] @ b[kb, :]), in float32.
FP8_BLOCK = 128


def _fp8_blockwise(A, B, scale_a, scale_b):
    """Whether (a, b, scale_a, scale_b) is FP8 with blockwise (float32 array) scales."""
    if A.dtype not in _FP8 or B.dtype not in _FP8 or scale_a is None or scale_b is None:
        return False
    kinds = []
    for nm, x in (("scale_a", scale_a), ("scale_b", scale_b)):
        try:
            kinds.append(arrays.as_cuda_array(x, nm).dtype == "float32")
        except TypeError:
            return False
    if kinds[0] != kinds[1]:
        raise TypeError(
            "scale_a and scale_b must both be float32 device arrays for FP8 with blockwise "
            "scales (scale_a (M, ceil(K/128)), scale_b (ceil(N/128), ceil(K/128))), or both "
            "ue8m0 block scales for MXFP8 (sm_100)"
        )
    return kinds[0]


def _check_blockwise_scales(SA, SB, m, n, k):
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    for nm, ca, want, what in (("scale_a", SA, (m, kb), "(M, ceil(K/128))"),
                               ("scale_b", SB, (nb, kb), "(ceil(N/128), ceil(K/128))")):
        if ca.ndim != 2 or tuple(ca.shape) != want:
            per = "row and 128 values of K" if nm == "scale_a" else "128 x 128 block of b"
            extra = (" (per-tensor scales are Python or NumPy numbers, e.g. "
                     f"{nm}=float(s.item()), not device arrays)"
                     if ca.ndim == 0 or ca.size == 1 else "")
            raise ValueError(
                f"{nm} must have shape {what} = {want} for FP8 with blockwise scales (one "
                f"float32 scale per {per}), got {tuple(ca.shape)}{extra}"
            )
    if k % 16:
        raise ValueError(
            f"FP8 with blockwise scales needs K to be a multiple of 16 (a and b are loaded by "
            f"TMA: 16-byte rows); K = {k}"
        )


def _block_scaled_format(A, B, scale_a, scale_b):
    """The BlockScaledFormat of (a, b, scale_a, scale_b), or None for an ordinary call."""
    fa, fb = _block_format(A), _block_format(B)
    if fa is None and fb is None:
        if scale_a is not None or scale_b is not None:
            raise TypeError(
                f"scale_a/scale_b are block scales for MXFP8 (float8_e4m3fn / float8_e5m2) or "
                f"NVFP4 (float4_e2m1fn_x2, numbatc.float4_e2m1) inputs; a is {A.dtype} and b is "
                f"{B.dtype}"
            )
        return None
    if fa is not fb:
        raise TypeError(
            f"a is {A.dtype} but b is {B.dtype}: block-scaled inputs are both MXFP8 "
            "(float8_e4m3fn or float8_e5m2, either mix) or both NVFP4 (float4_e2m1fn_x2)"
        )
    if scale_a is None or scale_b is None:
        raise TypeError(
            f"{fa.name.upper()} inputs ({A.dtype} x {B.dtype}) need block scales: scale_a "
            f"(M, K/{fa.block}) and scale_b (N, K/{fa.block}), {fa.scale_format} (sm_100)"
            + ("; or per-tensor scales: scale_a and scale_b Python numbers (sm_90)"
               if fa.name == "mxfp8" else "")
        )
    return fa


def _check_scales(fmt, SA, SB, m, n, k):
    """Shapes and dtypes of block scales for an (m, n, k) problem (k in values)."""
    if k % 32:
        what = f"K = 2 * a.shape[1] = {k}" if fmt.per_byte == 2 else f"K = {k}"
        raise ValueError(
            f"{fmt.name.upper()} needs K to be a multiple of 32 (the {fmt.block}-value scale "
            f"blocks and 16-byte rows for TMA); {what}"
        )
    blocks = k // fmt.block
    for nm, ca, rows, what in (("scale_a", SA, m, "M"), ("scale_b", SB, n, "N")):
        if ca.shape != (rows, blocks):
            extra = (" (per-tensor scales are Python or NumPy numbers, e.g. "
                     f"{nm}=float(s.item()), not device arrays)"
                     if ca.ndim == 0 or ca.size == 1 else "")
            raise ValueError(
                f"{nm} must have shape ({what}, K/{fmt.block}) = ({rows}, {blocks}) for "
                f"{fmt.name.upper()}, got {ca.shape}{extra}"
            )
        if ca.dtype not in fmt.scales:
            if fmt.name == "mxfp8":
                want = ("ue8m0 exponents: uint8 (e means 2**(e - 127)) or float8_e8m0fnu")
            else:
                want = ("ue4m3: float8_e4m3fn (torch, ml_dtypes, or numbatc.float8_e4m3(<uint8 "
                        "array>)), sign bit clear")
            raise TypeError(f"{nm} has dtype {ca.dtype}; {fmt.name.upper()} scales are {want}")


def _check_block_scaled_gpu(fmt, cc):
    """ValueError unless the GPU is compute capability 10.x (or the emulation is told to run
    the sm100 kernels with NUMBATC_GEMM_KERNEL=sm100)."""
    if cc is None or tuple(cc)[0] == 10:
        return
    import os

    from numba import config

    if config.ENABLE_CUDASIM and os.environ.get("NUMBATC_GEMM_KERNEL", "").startswith("sm100"):
        return
    raise ValueError(
        f"block-scaled GEMM ({fmt.name.upper()}) needs sm_100 (Blackwell, compute capability "
        f"10.x); this GPU is sm_{cc[0]}{cc[1]}"
    )


def _check_k_major(label, op_a, op_b):
    """ValueError unless a is row-major and b column-major (both K-major); ``label`` names the
    GEMM ('MXFP8', 'NVFP4', 'FP8')."""
    if op_a.layout != "row":
        raise ValueError(
            f"{label} GEMM reads a K-major: a (M, K) row-major; a is column-major "
            "(make it contiguous first)"
        )
    if op_b.layout != "col":
        raise ValueError(
            f"{label} GEMM reads b K-major: (K, N) column-major, e.g. w.T of a "
            "row-major (N, K) weight; b is row-major (pass w.T, or b.T.contiguous().T)"
        )


def _check_fp8_gpu(cc):
    """ValueError unless the GPU is compute capability 9.0 (the emulation stands in for one)."""
    if cc is not None and tuple(cc)[:2] != (9, 0):
        raise ValueError(
            "FP8 with per-tensor scales needs compute capability 9.0 (sm_90a); this GPU is "
            f"sm_{cc[0]}{cc[1]}"
        )


def _check_activation(activation):
    if activation is None or (isinstance(activation, str) and activation in ACTIVATIONS):
        return activation
    names = ", ".join(repr(x) for x in ACTIVATIONS if x is not None)
    extra = " (arbitrary epilogues are not supported yet)" if callable(activation) else ""
    raise ValueError(
        f"activation must be None or one of {names} (gelu is the tanh form); got {activation!r}{extra}"
    )


# ---------------------------------------------------------------------------------------------
# the call
# ---------------------------------------------------------------------------------------------


def _check_epilogue(epilogue, epilogue_args):
    """A user epilogue is a ``numba.cuda.jit(device=True)`` function; its extra arguments CUDA
    arrays (or numbers)."""
    if epilogue is None:
        if epilogue_args:
            raise ValueError("epilogue_args given without an epilogue")
        return None, ()
    device = getattr(epilogue, "targetoptions", {}).get("device") or getattr(epilogue, "_device", False)
    if not device:
        raise TypeError(
            "epilogue must be a numba CUDA device function, fn(value, row, col, *epilogue_args) -> "
            f"value, made with @numba.cuda.jit(device=True); got {epilogue!r}"
        )
    if not isinstance(epilogue_args, (tuple, list)):
        raise TypeError(f"epilogue_args must be a tuple, got {type(epilogue_args).__name__}")
    args = []
    for i, x in enumerate(epilogue_args):
        args.append(x if isinstance(x, (int, float)) else arrays.as_cuda_array(x, f"epilogue_args[{i}]"))
    return epilogue, tuple(args)


def gemm(a, b, *, c=None, alpha=1.0, beta=0.0, bias=None, activation=None, out=None,
         out_dtype=None, epilogue=None, epilogue_args=(), scale_a=None, scale_b=None):
    """``activation(alpha * (a @ b) + beta * c + bias)``, accumulated in float32.

    a (M, K) and b (K, N): CUDA arrays of any library (Numba, CuPy, PyTorch, anything with
    ``__cuda_array_interface__`` or ``__dlpack__``), row- or column-major (transposed views are
    not copied), both float16 or both bfloat16 (torch.bfloat16, ml_dtypes.bfloat16, or
    ``numbatc.bfloat16(<uint16 array>)``). ``c`` (M, N) has the output dtype and is read only when
    beta != 0; ``bias`` (N,) has the input dtype or float32; ``activation`` is None, 'relu',
    'gelu' (tanh form) or 'silu'.

    ``epilogue``: a user function ``fn(value, row, col, *epilogue_args) -> value`` written with
    ``@numba.cuda.jit(device=True)``, called once per output element (in float32) after alpha,
    beta * c, bias and the activation, before the conversion to the output dtype; the GEMM kernel
    is compiled for it (once per process).  ``epilogue_args`` are extra CUDA arrays (or numbers)
    it receives, e.g. a residual to add: ``fn(v, r, c, res): return v + res[r, c]``.

    Block-scaled inputs (sm_100 / Blackwell only, compute capability 10.x; see BLOCK_SCALED):
    MXFP8 -- a (M, K), b (K, N) float8_e4m3fn or float8_e5m2 (torch or ml_dtypes dtypes, or
    ``numbatc.float8_e4m3(<uint8 array>)`` / ``numbatc.float8_e5m2(...)``), ``scale_a``
    (M, K/32) and ``scale_b`` (N, K/32) ue8m0 exponents (uint8 e meaning 2**(e - 127), or
    float8_e8m0fnu); NVFP4 -- a (M, K/2), b (K/2, N) bytes of packed e2m1, two values a byte,
    the lower K index in the low nibble (torch.float4_e2m1fn_x2 or
    ``numbatc.float4_e2m1(<uint8 array>)``), K = 2 * a.shape[1], ``scale_a`` (M, K/16) and
    ``scale_b`` (N, K/16) ue4m3 (float8_e4m3fn, sign clear). Then a @ b is
    sum_k a[m, k] * scale_a[m, k // block] * b[k, n] * scale_b[n, k // block]; a must be
    row-major and b column-major (K-major: ``w.T`` of a row-major (N, K) weight), K a multiple
    of 32; the output is bfloat16 (default), float16 or float32 with the same c, bias,
    activation and epilogue. NOTE: never run on Blackwell hardware (checked by assembling for
    sm_100a and in the CPU emulation).

    FP8 with per-tensor scales (sm_90a / Hopper only, compute capability 9.0): a (M, K) and b
    (K, N) float8_e4m3fn or float8_e5m2 (each its own; torch, ml_dtypes, or the numbatc markers),
    ``scale_a`` and ``scale_b`` Python or NumPy real numbers (finite; device-array scales are not
    taken: pass ``float(s.item())``), a row-major and b column-major (K-major, e.g. ``w.T`` of a
    row-major (N, K) weight; other layouts are a ValueError, never a silent copy), any K (rows
    not 16-byte aligned are packed first). Then out = activation(scale_a * scale_b * alpha *
    (a @ b) + beta * c + bias) in bfloat16 (default), float16 or float32, bias of one of those
    dtypes; the scales are folded into alpha (one float32) and the product accumulates in
    float32 (wgmma m64nNk32).

    FP8 with blockwise scales (DeepGEMM's fine-grained recipe, sm_90a): the same a and b (K a
    multiple of 16, 16-byte aligned), ``scale_a`` a float32 device array (M, ceil(K/128)) -- one
    scale per row and 128 values of K -- and ``scale_b`` float32 (ceil(N/128), ceil(K/128)) --
    one per 128 x 128 block of b -- each row- or column-major.  Each k block's product is scaled
    as it is added into the float32 accumulator: a @ b = sum over kb of scale_a[m, kb] *
    scale_b[n // 128, kb] * (a[m, kb-block] @ b[kb-block, n]); then the epilogue as above.

    Returns an array of a's library (a ``numbatc.bfloat16`` view for marked inputs) of dtype
    ``out_dtype`` (default: the input dtype; 'float32' on request), or ``out`` written in place
    (it must not overlap a, b or bias; it may be c itself). Runs on the caller's current stream
    (torch's or CuPy's, else Numba's default). M or N == 0 gives an empty result; K == 0 gives
    activation(beta * c + bias) (zeros without c and bias). Small M (<= 64, or <= 256 on compute
    capability 9.0) may split K across blocks (``NUMBATC_SPLIT_K=<n>`` forces n slices): the
    partial products go to a float32 workspace that numbatc keeps per device and stream (slices
    x M x N values, grown when a larger problem needs it, kept for the process), and are summed in
    a fixed order, so results do not depend on the block schedule.
    """
    scaled = scale_a is not None or scale_b is not None
    if (CACHE and type(epilogue_args) is tuple and (epilogue is not None or not epilogue_args)
            and (not scaled or (type(scale_a) in _REAL_TYPES and type(scale_b) in _REAL_TYPES))):
        evals = None
        try:
            key, ptrs = _warm_key(a, b, c, bias, out, alpha, beta, activation, out_dtype, scaled)
            if key is not None and epilogue is not None:
                ekey, evals = _epilogue_key(epilogue_args)
                key = None if ekey is None else key + (epilogue, ekey)
            warm = None if key is None else CACHE.get(key)
            if warm is not None and scaled:  # per-tensor FP8 scales fold into alpha
                if not math.isfinite(scale_a * scale_b):
                    warm = None  # the checks say what
                else:
                    warm_alpha = float(alpha) * float(scale_a) * float(scale_b)
        except Exception:  # anything odd (an unhashable argument ...): the checks say what
            warm = None
        if warm is not None:
            result = warm(ptrs, a, out, warm_alpha if scaled else alpha, beta, evals)
            if result is not MISS:
                _release_captured()
                return result
    result, problem, relaunch = _gemm_checked(
        a, b, c, alpha, beta, bias, activation, out, out_dtype, epilogue, epilogue_args,
        scale_a, scale_b)
    _release_captured()
    if relaunch is not None and (not scaled or problem.tensor_scales is not None) and not (
            problem.blockwise):  # blockwise launches are never prepared: no warm path
        _remember(a, b, c, bias, out, alpha, beta, activation, out_dtype, problem, relaunch,
                  scaled, epilogue_args)
    return result


def _release_captured():
    from numbatc.kernels.dispatch import release_captured  # imported when first launched

    release_captured()


def _gemm_checked(a, b, c, alpha, beta, bias, activation, out, out_dtype, epilogue,
                  epilogue_args, scale_a=None, scale_b=None):
    """The whole call: check -> allocate -> launch; (result, GemmProblem or None, the relaunch
    function launch_gemm returned or None)."""
    # --- operands: library, dtype, shape -----------------------------------------------------
    A = arrays.as_cuda_array(a, "a")
    B = arrays.as_cuda_array(b, "b")
    _check_2d("a", A)
    _check_2d("b", B)
    (m, k), (k2, n) = A.shape, B.shape
    if k != k2:
        raise ValueError(
            f"inner dimensions differ: a is (M, K) = {A.shape} but b is (K, N) = {B.shape}; "
            "a.shape[1] must equal b.shape[0]"
        )
    scales = _tensor_scales(A, B, scale_a, scale_b)
    blockwise = scales is None and _fp8_blockwise(A, B, scale_a, scale_b)
    fmt = None
    if scales is None and not blockwise:
        fmt = _block_scaled_format(A, B, scale_a, scale_b)
    SA = SB = None
    if blockwise:
        rule = FP8_RULES[(A.dtype, B.dtype)]
        SA = arrays.as_cuda_array(scale_a, "scale_a")
        SB = arrays.as_cuda_array(scale_b, "scale_b")
        _check_blockwise_scales(SA, SB, m, n, k)
        scales = (1.0, 1.0)
    elif scales is not None:
        rule = FP8_RULES[(A.dtype, B.dtype)]
    elif fmt is None:
        rule = _rule_for(A, B)
    else:
        k *= fmt.per_byte  # NVFP4: two values a byte
        rule = fmt.rule(A.dtype, B.dtype)
        SA = arrays.as_cuda_array(scale_a, "scale_a")
        SB = arrays.as_cuda_array(scale_b, "scale_b")
        _check_scales(fmt, SA, SB, m, n, k)
    activation = _check_activation(activation)
    epilogue, eargs = _check_epilogue(epilogue, epilogue_args)
    alpha = _real("alpha", alpha)
    beta = _real("beta", beta)

    C = None if c is None else arrays.as_cuda_array(c, "c")
    BIAS = None if bias is None else arrays.as_cuda_array(bias, "bias")
    OUT = None if out is None else arrays.as_cuda_array(out, "out")
    if beta != 0.0 and C is None:
        raise ValueError(f"beta = {beta} but c is None; pass c (shape ({m}, {n})) or beta = 0")

    # --- output dtype -------------------------------------------------------------------------
    if out_dtype is not None:
        odt = dtype_name(out_dtype)
        if odt not in rule.outputs:
            raise TypeError(
                f"out_dtype {odt} is not available for {rule.a} inputs; choose one of "
                f"{', '.join(rule.outputs)}"
            )
    else:
        odt = OUT.dtype if OUT is not None else rule.outputs[0]
    if OUT is not None:
        _check_2d("out", OUT)
        if OUT.shape != (m, n):
            raise ValueError(f"out must have shape (M, N) = ({m}, {n}), got {OUT.shape}")
        if OUT.dtype != odt or OUT.dtype not in rule.outputs:
            want = odt if out_dtype is not None else " or ".join(rule.outputs)
            raise TypeError(f"out has dtype {OUT.dtype}; for {rule.a} inputs it must be {want}")
        if OUT.readonly:
            raise ValueError("out is read-only")
    if C is not None:
        _check_2d("c", C)
        if C.shape != (m, n):
            raise ValueError(f"c must have the output's shape (M, N) = ({m}, {n}), got {C.shape}")
        if C.dtype != odt:
            raise TypeError(f"c has dtype {C.dtype}; it must have the output dtype {odt}")
    if BIAS is not None:
        if BIAS.ndim != 1 or BIAS.shape[0] != n:
            raise ValueError(f"bias must have shape (N,) = ({n},), got {BIAS.shape}")
        if BIAS.dtype not in rule.bias:
            raise TypeError(
                f"bias has dtype {BIAS.dtype}; for {rule.a} inputs it must be "
                f"{' or '.join(rule.bias)}"
            )

    # --- device -------------------------------------------------------------------------------
    earrays = [x for x in eargs if isinstance(x, CudaArray)]
    device = arrays.same_device(A, B, C, BIAS, OUT, SA, SB, *earrays,
                                names=("a", "b", "c", "bias", "out", "scale_a", "scale_b",
                                       *(f"epilogue_args[{i}]" for i in range(len(earrays)))))
    cc = None
    if device is not None:
        cc = _device_capability(device)
        if fmt is not None:
            _check_block_scaled_gpu(fmt, cc)
        elif scales is not None:
            _check_fp8_gpu(cc)
        elif tuple(cc) < rule.min_cc:
            need = "%d.%d" % rule.min_cc
            raise ValueError(
                f"numbatc.gemm needs a GPU of compute capability {need} (sm_{need.replace('.', '')}, "
                f"Ampere) or newer for {rule.a}; device {device} is sm_{cc[0]}{cc[1]}"
            )

    # --- layouts and aliasing -------------------------------------------------------------------
    op_a = _matrix("a", A, m, A.shape[1])  # NVFP4: bytes
    op_b = _matrix("b", B, B.shape[0], n)
    op_sa = op_sb = None
    if fmt is not None:
        _check_k_major(fmt.name.upper(), op_a, op_b)
        op_sa = _matrix("scale_a", SA, m, SA.shape[1])
        op_sb = _matrix("scale_b", SB, n, SB.shape[1])
    if scales is not None:
        _check_k_major("FP8", op_a, op_b)
    if blockwise:
        op_sa = _matrix("scale_a", SA, *SA.shape)
        op_sb = _matrix("scale_b", SB, *SB.shape)
    op_c = _matrix("c", C, m, n) if C is not None else None
    op_bias = _vector("bias", BIAS) if BIAS is not None else None
    if OUT is not None:
        op_out = _matrix("out", OUT, m, n, writable=True)
        for nm, other in (("a", A), ("b", B), ("bias", BIAS), ("c", C if beta != 0.0 else None),
                          ("scale_a", SA), ("scale_b", SB)):
            if other is None or not OUT.shares_memory(other):
                continue
            if nm == "c" and (C.ptr, C.strides) == (OUT.ptr, OUT.strides):
                continue  # out is c itself: each element is read before it is written
            raise ValueError(
                f"out overlaps {nm} in memory; numbatc.gemm cannot write its result over an "
                f"input{' (out may be c itself, but not part of it)' if nm == 'c' else ''}: "
                "pass a separate out"
            )

    # --- result -------------------------------------------------------------------------------
    if OUT is None:
        result = alloc.allocate_like(A, (m, n), odt)
        OUT = arrays.as_cuda_array(result, "out")
        op_out = _matrix("out", OUT, m, n, writable=True)
    else:
        result = out
    if m == 0 or n == 0:
        return result, None, None

    problem = GemmProblem(
        m=m, n=n, k=k, a=op_a, b=op_b, c=op_c if beta != 0.0 else None, bias=op_bias,
        out=op_out, alpha=alpha, beta=beta, activation=activation, in_dtype=A.dtype,
        b_dtype=B.dtype, out_dtype=odt, bias_dtype=None if BIAS is None else BIAS.dtype,
        acc_dtype=rule.acc, device=device if device is not None else OUT.device, cc=cc,
        stream_handle=streams.stream_handle(A), epilogue=epilogue, epilogue_args=eargs,
        block_scaled=fmt, scale_a=op_sa, scale_b=op_sb, tensor_scales=scales,
        blockwise=blockwise,
    )
    if k == 0 and epilogue is None:
        _epilogue_without_product(problem)
        return result, problem, None
    from numbatc.kernels import dispatch

    return result, problem, dispatch.launch_gemm(problem)


# ---------------------------------------------------------------------------------------------
# the warm call: what a checked call decided, reused by calls that differ only in pointers
# ---------------------------------------------------------------------------------------------
#
# The cache and what every entry holds: numbatc._warm.  numbatc.gemm's key holds everything the
# checks above read besides pointer values: each array's probe key (None for an absent one),
# a's and b's pointer modulo 16 (alignment decides packing), out's (its alignment decides
# whether column pairs are stored as one word, GemmVariant.out_pairs), whether beta is 0
# (decides whether c is read; alpha and beta themselves only need to be real numbers of the
# types in _REAL_TYPES, checked on every call), activation, out_dtype, the dispatch environment
# variables and the thread.  Pointer-dependent checks run on every call (_GemmWarm): out
# against each input's byte range; where ranges meet, the full (exact) check decides.

_REAL_TYPES = frozenset({int, float, np.float64, np.float32, np.float16, np.int64, np.int32})
_env_key = None  # numbatc.kernels.dispatch.env_key, bound by the first _remember


def _warm_key(a, b, c, bias, out, alpha, beta, activation, out_dtype, scaled=False):
    """(key, (a, b, c, bias, out) pointers), or (None, None) when no warm path applies.
    ``scaled``: the call has per-tensor FP8 scales (their product is folded into alpha)."""
    if type(alpha) not in _REAL_TYPES or type(beta) not in _REAL_TYPES:
        return None, None
    pa = probe(a)
    pb = probe(b)
    pc = ABSENT if c is None else probe(c)
    pbias = ABSENT if bias is None else probe(bias)
    pout = ABSENT if out is None else probe(out)
    if pa is None or pb is None or pc is None or pbias is None or pout is None:
        return None, None
    key = ("gemm", pa[1], pb[1], pc[1], pbias[1], pout[1], pa[0] & 15, pb[0] & 15, pout[0] & 15,
           beta == 0, activation, out_dtype, _env_key(), threading.get_ident())
    key += (True,) if scaled else ()
    return key, (pa[0], pb[0], pc[0], pbias[0], pout[0])


def _epilogue_key(epilogue_args):
    """(key, values) of a user epilogue's arguments for the warm path: an array's probe key and
    pointer, a number's type and value; (None, None) when an argument has no warm path."""
    keys, values = [], []
    for x in epilogue_args:
        ty = type(x)
        if ty in _REAL_TYPES:
            keys.append(ty)
            values.append(x)
            continue
        probed = probe(x)
        if probed is None:
            return None, None
        keys.append(probed[1])
        values.append(probed[0])
    return tuple(keys), values


def _epilogue_flattener(problem_args):
    """``fn(values) -> kernel parameters`` for the epilogue arguments of a checked call (CudaArrays
    and numbers, as GemmProblem.epilogue_args holds them): the arrays' parameters made once
    (numba's array ABI, kernels.epilogue.flat_epilogue_args), only their data pointers taken from
    ``values`` (see _epilogue_key) on each call."""
    from numbatc.kernels.epilogue import flat_epilogue_args

    parts = []
    for x in problem_args:
        if isinstance(x, CudaArray):
            parts.append(list(flat_epilogue_args((views.kernel_view(x),))))
        else:
            parts.append(None)

    def flatten(values):
        flat = []
        for part, value in zip(parts, values):
            if part is None:
                flat.append(value)
            else:
                part[4] = value  # the data pointer (array_params' fifth slot)
                flat.extend(part)
        return flat

    return flatten


class _GemmWarm(Entry):
    """numbatc.gemm's entry: relaunch(a, b, c, bias, out pointers, alpha, beta, stream[,
    epilogue parameters]); c and bias replaced by out where the call has none."""

    __slots__ = ("a_span", "b_span", "c_span", "bias_span", "has_c", "has_bias", "c_may_be_out",
                 "eflat")

    def __init__(self, p: GemmProblem, relaunch, allocate: bool, eflat=None):
        super().__init__(relaunch, p.a.array, p.out.array, allocate)
        self.a_span, self.b_span = span(p.a.array), span(p.b.array)
        self.has_c, self.has_bias = p.c is not None, p.bias is not None
        self.c_span = span(p.c.array) if self.has_c else 0
        self.bias_span = span(p.bias.array) if self.has_bias else 0
        self.c_may_be_out = self.has_c and p.c.array.strides == p.out.array.strides
        self.eflat = eflat

    def __call__(self, ptrs, a, out, alpha, beta, evals=None):
        a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr = ptrs
        if out is None:
            result, out_ptr = allocate_probed(self.alloc, a)
            if result is None:
                return MISS
        else:
            result = out
            hi = out_ptr + self.out_span
            if (a_ptr < hi and out_ptr < a_ptr + self.a_span) or (
                    b_ptr < hi and out_ptr < b_ptr + self.b_span):
                return MISS
            if self.has_bias and bias_ptr < hi and out_ptr < bias_ptr + self.bias_span:
                return MISS
            if (self.has_c and c_ptr < hi and out_ptr < c_ptr + self.c_span
                    and not (c_ptr == out_ptr and self.c_may_be_out)):
                return MISS
        if self.eflat is None:
            self.relaunch(a_ptr, b_ptr, c_ptr if self.has_c else out_ptr,
                          bias_ptr if self.has_bias else out_ptr, out_ptr, float(alpha),
                          float(beta), self.stream())
        else:
            self.relaunch(a_ptr, b_ptr, c_ptr if self.has_c else out_ptr,
                          bias_ptr if self.has_bias else out_ptr, out_ptr, float(alpha),
                          float(beta), self.stream(), self.eflat(evals))
        return result


def _remember(a, b, c, bias, out, alpha, beta, activation, out_dtype, p, relaunch,
              scaled=False, epilogue_args=()):
    """Cache ``relaunch`` for calls like this checked one (see _warm_key; with a user epilogue
    the key also holds the function and _epilogue_key of its arguments)."""
    global _env_key
    if _env_key is None:
        from numbatc.kernels.dispatch import env_key

        _env_key = env_key
    try:
        key, _ = _warm_key(a, b, c, bias, out, alpha, beta, activation, out_dtype, scaled)
    except Exception:
        return
    if key is None:
        return
    eflat = None
    if p.epilogue is not None:
        ekey, _ = _epilogue_key(epilogue_args)
        if ekey is None:
            return
        key += (p.epilogue, ekey)
        eflat = _epilogue_flattener(p.epilogue_args)
    remember(key, _GemmWarm(p, relaunch, allocate=out is None, eflat=eflat))


# ---------------------------------------------------------------------------------------------
# K == 0: no product, only the epilogue
# ---------------------------------------------------------------------------------------------


def _to_float32(host: np.ndarray, dtype: str) -> np.ndarray:
    """Host storage (bf16 as uint16 bits) -> float32."""
    if dtype == "bfloat16":
        from intrinsics.emulate.numerics import decode  # not at import: `import numbatc` stays light

        return decode(host, "bf16").astype(np.float32)
    return host.astype(np.float32)


def _from_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> host storage of ``dtype`` (bf16: round to nearest even, as uint16 bits)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        from intrinsics.emulate.numerics import encode

        return encode(x, "bf16").astype(np.uint16)
    return x.astype(np.dtype(dtype))


def _epilogue_without_product(p: GemmProblem) -> None:
    """out = activation(beta * c + bias) for K == 0.

    NOTE: a degenerate case, computed on the host rather than by a GEMM kernel with an empty main
    loop: c and bias are read and out written on the caller's stream (a strided out goes through
    Numba's own assignment kernel), and the host waits for that stream."""
    from numbatc._capture import refuse_if_capturing

    refuse_if_capturing(p.stream_handle, "run numbatc.gemm with K == 0 (computed on the host: "
                        "it copies c and bias to the host and waits for the stream)")
    stream = p.stream
    c_host = p.c.view.copy_to_host(stream=stream) if p.c is not None else None
    bias_host = p.bias.view.copy_to_host(stream=stream) if p.bias is not None else None
    stream.synchronize()
    acc = np.zeros((p.m, p.n), np.float32)
    if c_host is not None:
        acc += np.float32(p.beta) * _to_float32(c_host, p.c.dtype)
    if bias_host is not None:
        acc += _to_float32(bias_host, p.bias.dtype)[None, :]
    host = _from_float32(ACTIVATIONS[p.activation](acc), p.out_dtype)
    view = p.out.view
    if view.is_c_contiguous() or view.is_f_contiguous():
        view.copy_to_device(host, stream=stream)
    else:
        view.setitem(slice(None), host, stream=stream)  # any strides: numba's assign kernel
    stream.synchronize()

