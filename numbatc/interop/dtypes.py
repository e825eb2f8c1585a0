"""dtype names: what numbatc calls a dtype, whatever spelling the caller used.

A dtype is known by its NumPy name ('float16', 'bfloat16', 'float8_e4m3fn' ...), including the
ml_dtypes types NumPy cannot name itself; :data:`EXOTIC_STORAGE` gives the raw storage a Numba
kernel view uses for those (Numba kernels cannot name them either).  ml_dtypes is imported only
when data uses it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXOTIC_STORAGE", "dtype_name", "storage_typestr", "ml_dtype", "numpy_dtype_name"]

#: dtypes that NumPy itself cannot name: logical name -> NumPy name of the raw storage that a
#: Numba kernel view uses (same size, bit patterns untouched).
EXOTIC_STORAGE = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e8m0fnu": "uint8",  # ue8m0 block scales (MXFP8)
    "float4_e2m1fn_x2": "uint8",  # two e2m1 per byte, the lower index in the low nibble (NVFP4)
}

_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
    "e8m0": "float8_e8m0fnu",
}


def dtype_name(dtype) -> str:
    """A dtype name ('float16', 'bfloat16', 'float32', 'float8_e4m3fn', 'int8' ...) from a string,
    a NumPy dtype or scalar type (ml_dtypes' included) or a torch dtype."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").lower()
        return _ALIASES.get(name, name)
    if type(dtype).__module__.startswith("torch"):  # torch.dtype: str() is 'torch.float16'
        return str(dtype).removeprefix("torch.")
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(
            f"cannot interpret {dtype!r} as a dtype; use a name such as 'float16', 'bfloat16' or "
            "'float32', a NumPy/ml_dtypes dtype or a torch dtype"
        ) from None


def storage_typestr(name: str, itemsize: int) -> str:
    """The __cuda_array_interface__ typestr of the raw storage a kernel view uses."""
    if name in EXOTIC_STORAGE:
        return np.dtype(EXOTIC_STORAGE[name]).str
    try:
        dt = np.dtype(name)
    except TypeError:
        dt = None
    if dt is not None and dt.itemsize == itemsize and dt.kind in "biufc":
        return dt.str
    # any other type torch can name (float8_e4m3fnuz, ...): raw unsigned bits of the same size
    return np.dtype(f"u{itemsize}").str


def ml_dtype(name: str):
    """``ml_dtypes.<name>`` as a NumPy dtype (ml_dtypes is only needed when data uses it)."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


_NUMPY_NAMES: dict = {}


def numpy_dtype_name(dt: np.dtype, name: str, library: str) -> str:
    """The dtype name of a NumPy dtype carried by a ``library`` array (``name`` labels the
    message): TypeError for what numbatc cannot take (big-endian, objects, records ...)."""
    known = _NUMPY_NAMES.get(dt)  # dtype.name is slow (NumPy builds it on every access)
    if known is not None:
        return known
    if dt.name not in EXOTIC_STORAGE and (dt.kind not in "biufc" or dt.byteorder == ">"):
        raise TypeError(f"{name}: {library} array of dtype {dt} is not supported by numbatc")
    _NUMPY_NAMES[dt] = dt.name  # ml_dtypes' bfloat16 / float8 names included
    return dt.name
