"""Shared pieces of the GPU lane tests: encoders for the tensor-core input formats and small
device helpers that move fragments between global arrays and register tuples."""

import numpy as np
from numba import cuda

try:
    import ml_dtypes
except ImportError:  # the GPU tests that need it skip
    ml_dtypes = None


def rng():
    return np.random.default_rng()


def encode(values, ptx_type):
    """float64/int values -> raw bits of ``ptx_type`` (values must already be representable)."""
    if ptx_type == "f16":
        return values.astype(np.float16).view(np.uint16)
    if ptx_type == "bf16":
        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    if ptx_type == "e4m3":
        return values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    if ptx_type == "e5m2":
        return values.astype(ml_dtypes.float8_e5m2).view(np.uint8)
    if ptx_type in ("tf32", "f32"):
        return values.astype(np.float32).view(np.uint32)
    if ptx_type == "s8":
        return values.astype(np.int8).view(np.uint8)
    if ptx_type == "u8":
        return values.astype(np.uint8)
    if ptx_type == "s32":
        return values.astype(np.int32).view(np.uint32)
    if ptx_type == "f64":
        return values.astype(np.float64).view(np.uint64)
    raise ValueError(ptx_type)


def decode(bits, ptx_type):
    if ptx_type == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if ptx_type == "f32":
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    if ptx_type == "s32":
        return bits.astype(np.uint32).view(np.int32).astype(np.float64)
    if ptx_type == "f64":
        return bits.astype(np.uint64).view(np.float64)
    raise ValueError(ptx_type)


def random_values(gen, shape, ptx_type):
    """Random values exactly representable in ``ptx_type``, of moderate magnitude."""
    if ptx_type in ("s8",):
        return gen.integers(-128, 128, shape).astype(np.float64)
    if ptx_type in ("u8",):
        return gen.integers(0, 256, shape).astype(np.float64)
    if ptx_type == "s32":
        return gen.integers(-(2**20), 2**20, shape).astype(np.float64)
    x = gen.standard_normal(shape)
    if ptx_type == "tf32":
        bits = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32).astype(np.float64)
    if ptx_type in ("f32", "f64"):
        return x.astype(np.float32).astype(np.float64) if ptx_type == "f32" else x
    return decode_any(encode(x, ptx_type), ptx_type)


def decode_any(bits, ptx_type):
    if ptx_type == "bf16":
        return bits.view(ml_dtypes.bfloat16).astype(np.float64)
    if ptx_type == "e4m3":
        return bits.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if ptx_type == "e5m2":
        return bits.view(ml_dtypes.float8_e5m2).astype(np.float64)
    return decode(bits, ptx_type)


# --- fragment loaders/storers: (lanes, registers) global arrays <-> register tuples -------------


@cuda.jit(device=True, inline="always")
def load1(arr, lane):
    return arr[lane, 0]


@cuda.jit(device=True, inline="always")
def load2(arr, lane):
    return (arr[lane, 0], arr[lane, 1])


@cuda.jit(device=True, inline="always")
def load4(arr, lane):
    return (arr[lane, 0], arr[lane, 1], arr[lane, 2], arr[lane, 3])


LOADERS = {1: load1, 2: load2, 4: load4}


@cuda.jit(device=True, inline="always")
def store1(arr, lane, frag):
    arr[lane, 0] = frag


@cuda.jit(device=True, inline="always")
def store2(arr, lane, frag):
    arr[lane, 0] = frag[0]
    arr[lane, 1] = frag[1]


@cuda.jit(device=True, inline="always")
def store4(arr, lane, frag):
    arr[lane, 0] = frag[0]
    arr[lane, 1] = frag[1]
    arr[lane, 2] = frag[2]
    arr[lane, 3] = frag[3]


STORERS = {1: store1, 2: store2, 4: store4}
