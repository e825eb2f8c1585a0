"""Host side of TMA: every documented rule of cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col is
checked before the driver is called (these tests run without libcuda), the natural-order
parameters reach the driver reversed, and a driver refusal comes back with every parameter."""

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

from intrinsics import tensormap
from intrinsics.tensormap import (
    TMA_TYPES,
    TensorMap,
    TensorMapError,
    check_im2col,
    check_tiled,
    tma_type,
)


class FakeDeviceArray:
    """Anything with __cuda_array_interface__ (numba, CuPy, torch arrays look like this)."""

    def __init__(self, shape, typestr="<f4", strides=None, address=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "strides": strides,
            "data": (address, False),
            "version": 3,
        }


class FakeDriver:
    """Stands in for the three driver calls; records what they receive."""

    def __init__(self, monkeypatch, result=driver.CUresult.CUDA_SUCCESS):
        self.calls = []
        self.result = result
        monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_SUCCESS,))
        monkeypatch.setattr(driver, "cuTensorMapEncodeTiled", self._encode("Tiled"))
        monkeypatch.setattr(driver, "cuTensorMapEncodeIm2col", self._encode("Im2col"))

    def _encode(self, kind):
        def encode(*args):
            self.calls.append((kind, args))
            tmap = driver.CUtensorMap()
            tmap.opaque = list(range(100, 116))
            return self.result, tmap

        return encode


@pytest.fixture
def fake_driver(monkeypatch):
    return FakeDriver(monkeypatch)


def _plain(values):
    return tuple(int(v) for v in values)


# ---------------------------------------------------------------------------------------------
# Tiled rules
# ---------------------------------------------------------------------------------------------

TILED_OK = dict(dtype="f32", address=0x10000, shape=(64, 128), strides=None, box=(32, 32),
                element_strides=None, interleave=0, swizzle=128, l2_promotion=128,
                oob_fill="zero")

TILED_BAD = [
    # (changes to TILED_OK, exception, message)
    (dict(shape=(), box=()), ValueError, r"tensorRank must be in 1..5, got shape \(\)"),
    (dict(shape=(2,) * 6, box=(2,) * 6, swizzle=0), ValueError, r"tensorRank must be in 1..5"),
    (dict(interleave=16, shape=(64, 128), swizzle=0), ValueError,
     r"with interleave 16B the tensorRank must be at least 3"),
    (dict(address=0x10008), ValueError, r"globalAddress must be 16-byte aligned \(always\), "
                                        r"got 0x10008"),
    (dict(address=0x10010, interleave=32, swizzle=32, shape=(4, 64, 128), box=(1, 8, 8)),
     ValueError, r"32-byte aligned \(with 32B interleave\)"),
    (dict(address=0x10010, dtype="16u4_align16b", shape=(4, 256), box=(4, 128), swizzle=0),
     ValueError, r"32-byte aligned \(for 16u4_align16b\)"),
    (dict(address=-16), ValueError, r"16-byte aligned"),
    (dict(address=0x10000 + 0.0), TypeError, r"global address must be an integer"),
    (dict(shape=(0, 128)), ValueError, r"every dimension must be in 1..2\^32.*axis 0"),
    (dict(shape=(64, 2**32 + 4), strides=(2**34, 4)), ValueError, r"1..2\^32.*axis 1"),
    (dict(shape=(64, 30), box=(32, 28), swizzle=0), ValueError,
     r"multiple of 16 bytes and below 2\^40, got strides \(120, 4\) \(axis 0: 120\)"),
    (dict(strides=(2**40, 4)), ValueError, r"below 2\^40"),
    (dict(strides=(-512, 4)), ValueError, r"multiple of 16 bytes"),
    (dict(strides=(1024, 8)), ValueError,
     r"innermost dimension must be contiguous: its stride must be the element size 4 B"),
    (dict(strides=(1024, 4, 4)), ValueError, r"byte stride of every axis \(2\) or of every axis "
                                             r"but the innermost \(1\)"),
    (dict(strides=(1024.5, 4)), TypeError, r"strides must hold integers"),
    (dict(interleave=32, swizzle=32, shape=(4, 64, 8), strides=(16 * 64 * 4 * 2, 48, 4),
          box=(1, 8, 8)), ValueError, r"multiple of 32 bytes \(32 with 32B interleave\)"),
    (dict(dtype="16u4_align16b", shape=(4, 256), strides=(144,), box=(4, 128), swizzle=0),
     ValueError, r"multiple of 32 bytes \(32 for 16u4_align16b\)"),
    (dict(box=(0, 32)), ValueError, r"every box dimension must be in 1..256, got box \(0, 32\)"),
    (dict(box=(257, 32)), ValueError, r"1..256, got box \(257, 32\) \(axis 0\)"),
    (dict(box=(32,)), ValueError, r"box must have one entry per tensor dimension \(2\)"),
    (dict(box=(32, 32.0)), TypeError, r"box must hold integers"),
    (dict(box=(8, 6), swizzle=0), ValueError,
     r"box's innermost extent must be a multiple of 16 bytes: box\[-1\] = 6 x 4 B \(f32\) = 24 B"),
    (dict(box=(8, 32), swizzle=64), ValueError,
     r"with swizzle 64 the box's innermost extent must be at most 64 bytes: 32 x 4 B \(f32\) = "
     r"128 B"),
    (dict(box=(8, 16), swizzle=32), ValueError, r"at most 32 bytes"),
    (dict(dtype="bf16", box=(8, 128)), ValueError, r"at most 128 bytes: 128 x 2 B \(bf16\)"),
    (dict(element_strides=(0, 1)), ValueError, r"every element stride must be in 1..8"),
    (dict(element_strides=(1, 9)), ValueError, r"1..8, got element_strides \(1, 9\) \(axis 1\)"),
    (dict(element_strides=(1,)), ValueError, r"element_strides must have one entry per tensor"),
    (dict(swizzle=16), ValueError, r"swizzle \(bytes\) must be one of \[0, 32, 64, 128\], got 16"),
    (dict(interleave=8), ValueError, r"interleave \(bytes\) must be one of \[0, 16, 32\]"),
    (dict(l2_promotion=512), ValueError, r"l2_promotion \(bytes\) must be one of \[0, 64, 128, "
                                         r"256\]"),
    (dict(oob_fill="inf"), ValueError, r"oob_fill must be one of \['zero', 'nan'\]"),
    (dict(dtype="u16", oob_fill="nan", box=(8, 64)), ValueError,
     r"oob_fill='nan' needs a floating-point element type, got u16"),
    (dict(dtype="16u4_align8b", oob_fill="nan", box=(8, 64), swizzle=0), ValueError,
     r"floating-point element type, got 16u4_align8b"),
    (dict(interleave=32, swizzle=0, shape=(4, 64, 128), box=(1, 8, 8)), ValueError,
     r"32B interleave requires swizzle 32, got swizzle 0"),
    (dict(dtype="16u6_align16b", interleave=16, shape=(2, 4, 256), box=(1, 4, 128), swizzle=0),
     ValueError, r"16u6_align16b requires interleave 0 \(none\), got 16"),
    (dict(dtype="16u4_align16b", shape=(4, 256), box=(4, 128), swizzle=64), ValueError,
     r"16u4_align16b supports swizzle 0 or 128 only, got 64"),
    (dict(dtype="16u6_align16b", shape=(4, 192), box=(4, 128), swizzle=0), ValueError,
     r"16u6_align16b needs the innermost dimension to be a multiple of 128 values"),
    (dict(dtype="16u4_align8b", shape=(4, 255), strides=(256,), box=(4, 64), swizzle=0),
     ValueError, r"multiple of 2 values"),
    (dict(dtype="16u4_align16b", shape=(4, 256), box=(4, 64), swizzle=0), ValueError,
     r"16u4_align16b needs box\[-1\] == 128"),
    (dict(dtype="16u4_align8b", shape=(4, 256), box=(4, 16), swizzle=0), ValueError,
     r"multiple of 16 bytes: box\[-1\] = 16 x 0.5 B \(16u4_align8b\) = 8 B"),
    (dict(dtype="f8"), TypeError, r"element type 'f8' is not a TMA type; valid: TMA names"),
    (dict(shape="64x128"), TypeError, r"shape must hold integers"),
]


@pytest.mark.parametrize("changes, exc, message", TILED_BAD, ids=[m for _, _, m in TILED_BAD])
def test_tiled_rule(changes, exc, message):
    with pytest.raises(exc, match=message):
        check_tiled(**{**TILED_OK, **changes})


TILED_GOOD = [
    dict(),
    dict(shape=(64, 2**32), strides=(2**34, 4), box=(1, 32)),  # largest dimension
    dict(box=(256, 32)),
    dict(swizzle=0, box=(1, 4)),  # 16-byte inner box, no swizzle
    dict(swizzle=32, box=(8, 8)),
    dict(swizzle=64, box=(8, 16)),
    dict(dtype="bf16", box=(8, 64)),
    dict(dtype="f16", oob_fill="nan", box=(8, 64)),
    dict(dtype="tf32", oob_fill="nan"),
    dict(element_strides=(8, 8)),
    dict(strides=(1024,)),  # outer strides only
    dict(strides=(0, 4)),  # a broadcast axis: 0 is a multiple of 16
    dict(l2_promotion=None, interleave=None),
    # interleave: the 16-byte and swizzle-span inner-box rules do not apply
    dict(dtype="u8", interleave=16, swizzle=32, shape=(4, 64, 16), box=(1, 64, 40)),
    dict(dtype="u16", interleave=32, swizzle=32, shape=(2, 64, 16), box=(2, 8, 16)),
    dict(dtype="16u4_align8b", shape=(4, 256), box=(4, 64), swizzle=32),
    dict(dtype="16u4_align16b", shape=(4, 256), box=(4, 128), swizzle=128),
    dict(dtype="16u6_align16b", shape=(4, 256), box=(4, 128), swizzle=0),
]


@pytest.mark.parametrize("changes", TILED_GOOD, ids=[str(c) for c in TILED_GOOD])
def test_tiled_accepts(changes):
    params = check_tiled(**{**TILED_OK, **changes})
    assert params["dtype"] is tma_type(changes.get("dtype", "f32"))


def test_packed_contiguous_strides():
    params = check_tiled(**{**TILED_OK, "dtype": "16u4_align8b", "shape": (3, 4, 256),
                            "box": (1, 4, 64), "swizzle": 0})
    assert params["strides"] == (512, 128, 0.5)
    params = check_tiled(**{**TILED_OK, "dtype": "16u6_align16b", "shape": (4, 256),
                            "box": (4, 128), "swizzle": 0})
    assert params["strides"] == (192, 0.75)


# ---------------------------------------------------------------------------------------------
# im2col rules
# ---------------------------------------------------------------------------------------------

IM2COL_OK = dict(dtype="f16", address=0x20000, shape=(2, 16, 16, 64), strides=None,
                 lower_corner=(-1, -1), upper_corner=(-1, -1), channels_per_pixel=64,
                 pixels_per_column=128, element_strides=None, interleave=0, swizzle=128,
                 l2_promotion=128, oob_fill="zero")

IM2COL_BAD = [
    (dict(shape=(16, 64), lower_corner=(), upper_corner=()), ValueError,
     r"tensorRank must be in 3..5, got shape \(16, 64\) \(rank 2\)"),
    (dict(lower_corner=(-1,)), ValueError,
     r"lower_corner needs one offset per spatial dimension \(2 for rank 4\), got \(-1,\)"),
    (dict(upper_corner=(-1, -1, -1)), ValueError, r"upper_corner needs one offset"),
    (dict(lower_corner=(-129, 0)), ValueError,
     r"for rank 4 every lower_corner offset must be in \[-128, 127\], got \(-129, 0\)"),
    (dict(upper_corner=(0, 128)), ValueError, r"\[-128, 127\]"),
    (dict(shape=(2, 4, 8, 16, 64), lower_corner=(0, 0, 16), upper_corner=(0, 0, 0)), ValueError,
     r"for rank 5 every lower_corner offset must be in \[-16, 15\]"),
    (dict(shape=(2, 16, 64), lower_corner=(-32769,), upper_corner=(0,)), ValueError,
     r"for rank 3 every lower_corner offset must be in \[-32768, 32767\]"),
    (dict(lower_corner=(0, 0), upper_corner=(-16, 0)), ValueError,
     r"pixel bounding box must have non-zero size: spatial axis 0 spans 16 \+ upper -16 - "
     r"lower 0 = 0 pixels"),
    (dict(lower_corner=(0, 5), upper_corner=(0, -12)), ValueError, r"spatial axis 1"),
    (dict(channels_per_pixel=0), ValueError, r"channels_per_pixel must be in 1..256, got 0"),
    (dict(channels_per_pixel=257, swizzle=0), ValueError, r"1..256, got 257"),
    (dict(pixels_per_column=0), ValueError, r"pixels_per_column must be in 1..1024, got 0"),
    (dict(pixels_per_column=1025), ValueError, r"1..1024, got 1025"),
    (dict(pixels_per_column=8.0), TypeError, r"must be integers"),
    (dict(channels_per_pixel=128), ValueError,
     r"with swizzle 128 the channel run's innermost extent must be at most 128 bytes: "
     r"128 x 2 B \(f16\) = 256 B"),
    (dict(dtype="16u4_align16b", shape=(2, 8, 8, 256), channels_per_pixel=64, swizzle=0),
     ValueError, r"16u4_align16b needs channels_per_pixel == 128"),
    (dict(element_strides=(1, 1, 9, 1)), ValueError, r"every element stride must be in 1..8"),
    (dict(dtype="s32", oob_fill="nan", channels_per_pixel=32), ValueError,
     r"needs a floating-point element type, got s32"),
    (dict(address=0x20004), ValueError, r"16-byte aligned"),
]


@pytest.mark.parametrize("changes, exc, message", IM2COL_BAD, ids=[m for _, _, m in IM2COL_BAD])
def test_im2col_rule(changes, exc, message):
    with pytest.raises(exc, match=message):
        check_im2col(**{**IM2COL_OK, **changes})


def test_im2col_accepts():
    assert check_im2col(**IM2COL_OK)["lower_corner"] == (-1, -1)
    check_im2col(**{**IM2COL_OK, "shape": (2, 4, 8, 16, 64), "lower_corner": (-16, -16, -16),
                    "upper_corner": (15, 15, 15), "pixels_per_column": 1024})
    check_im2col(**{**IM2COL_OK, "shape": (2, 16, 64), "lower_corner": (-32768,),
                    "upper_corner": (32767,), "channels_per_pixel": 256, "swizzle": 0})


# ---------------------------------------------------------------------------------------------
# Element types and sources
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, name",
    [
        (np.uint8, "u8"), (np.int8, "u8"), (np.int16, "u16"), (np.uint16, "u16"),
        (np.int32, "s32"), (np.uint32, "u32"), (np.int64, "s64"), (np.uint64, "u64"),
        (np.float16, "f16"), (np.float32, "f32"), (np.float64, "f64"),
        (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e4m3fn, "u8"),
        (ml_dtypes.float8_e5m2, "u8"), ("tf32", "tf32"), ("bf16", "bf16"),
        ("float16", "f16"), (np.dtype("<f4"), "f32"),
    ],
)
def test_tma_type(dtype, name):
    assert tma_type(dtype).name == name


@pytest.mark.parametrize("dtype", [np.complex64, "f8", "e4m3", "<f4", None])
def test_tma_type_refuses_unknown(dtype):
    # NumPy's short codes are refused: 'f8' is float64 to NumPy and fp8 to most readers.
    with pytest.raises(TypeError, match=r"is not a TMA type; valid: TMA names \["):
        tma_type(dtype)


def test_every_type_names_a_driver_enum():
    for t in TMA_TYPES.values():
        assert getattr(driver.CUtensorMapDataType, t.enum).name == t.enum


def test_array_source(fake_driver):
    a = FakeDeviceArray((48, 40), "<f4", strides=(256, 4), address=0x7F0000001000)
    tmap = TensorMap.tiled(a, box=(16, 8))
    assert (tmap.shape, tmap.strides, tmap.address) == ((48, 40), (256, 4), 0x7F0000001000)
    assert tmap.dtype.name == "f32" and tmap.tensor is a
    # C-contiguous when the interface gives no strides
    tmap = TensorMap.tiled(FakeDeviceArray((48, 40), "<f4"), box=(16, 8))
    assert tmap.strides == (160, 4)


def test_array_dtype_override(fake_driver):
    assert TensorMap.tiled(FakeDeviceArray((8, 64), "<u2"), (8, 64), dtype="bf16").dtype.name == (
        "bf16"
    )
    assert TensorMap.tiled(FakeDeviceArray((8, 64), "<f4"), (8, 32), dtype="tf32").dtype.name == (
        "tf32"
    )
    with pytest.raises(TypeError, match=r"dtype bf16 \(16 bits\) does not match the array's "
                                        r"32-bit elements"):
        TensorMap.tiled(FakeDeviceArray((8, 64), "<f4"), (8, 32), dtype="bf16")
    with pytest.raises(TypeError, match=r"element type '<V2' is opaque; pass dtype="):
        TensorMap.tiled(FakeDeviceArray((8, 64), "<V2"), (8, 64))
    assert TensorMap.tiled(FakeDeviceArray((8, 64), "<V2"), (8, 64), dtype="bf16").dtype.name == (
        "bf16"
    )
    assert TensorMap.tiled(FakeDeviceArray((8, 64), "|i1"), (8, 64)).dtype.name == "u8"


def test_source_errors(fake_driver):
    with pytest.raises(TypeError, match="shape= and strides= are for a raw pointer"):
        TensorMap.tiled(FakeDeviceArray((8, 64)), (8, 32), shape=(8, 64))
    with pytest.raises(TypeError, match="a raw device pointer needs dtype= and shape="):
        TensorMap.tiled(0x10000, (8, 32))
    with pytest.raises(TypeError, match=r"expected a device array .* got ndarray"):
        TensorMap.tiled(np.zeros((8, 64), np.float32), (8, 32))
    assert fake_driver.calls == []


def test_raw_pointer_source(fake_driver):
    tmap = TensorMap.tiled(0x10000, (4, 16), dtype=np.float16, shape=(9, 24), strides=(64, 2))
    assert (tmap.shape, tmap.strides, tmap.dtype.name) == ((9, 24), (64, 2), "f16")
    assert tmap.tensor is None


# ---------------------------------------------------------------------------------------------
# The driver call
# ---------------------------------------------------------------------------------------------


def test_rules_run_before_the_driver(fake_driver):
    with pytest.raises(ValueError, match="box"):
        TensorMap.tiled(FakeDeviceArray((64, 64)), box=(8, 64), swizzle=128)
    with pytest.raises(ValueError, match="pixels_per_column"):
        TensorMap.im2col(FakeDeviceArray((2, 8, 8, 64), "<f2"), channels_per_pixel=64,
                         pixels_per_column=2048, lower_corner=(0, 0), upper_corner=(0, 0))
    assert fake_driver.calls == []


def test_tiled_reaches_the_driver_innermost_first(fake_driver):
    a = FakeDeviceArray((3, 5, 40), "<f4", strides=(5 * 192, 192, 4), address=0x7F0000002000)
    tmap = TensorMap.tiled(a, box=(2, 4, 8), element_strides=(1, 2, 1), swizzle=32,
                           l2_promotion=256, oob_fill="nan")
    ((kind, args),) = fake_driver.calls
    assert kind == "Tiled"
    (dtype, rank, address, dims, strides, box, estrides, interleave, swizzle, l2, oob) = args
    assert dtype == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32
    assert (rank, address) == (3, 0x7F0000002000)
    assert _plain(dims) == (40, 5, 3)
    assert _plain(strides) == (192, 960)
    assert _plain(box) == (8, 4, 2)
    assert _plain(estrides) == (1, 2, 1)
    assert interleave == driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swizzle == driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B
    assert l2 == driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B
    assert oob == driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
    # Both orders are kept; the host words are the encoded map.
    assert tmap.global_dim == (40, 5, 3) and tmap.driver_params["globalDim"] == (40, 5, 3)
    assert tmap.driver_params["boxDim"] == (8, 4, 2)
    assert tmap.words.dtype == np.uint64 and list(tmap.words) == list(range(100, 116))


def test_im2col_reaches_the_driver_innermost_first(fake_driver):
    a = FakeDeviceArray((2, 6, 10, 12, 32), "<f2", address=0x7F0000004000)
    tmap = TensorMap.im2col(a, channels_per_pixel=32, pixels_per_column=64,
                            lower_corner=(-1, -2, -3), upper_corner=(1, 2, 3),
                            element_strides=(1, 1, 2, 2, 1), swizzle=64)
    ((kind, args),) = fake_driver.calls
    assert kind == "Im2col"
    (dtype, rank, address, dims, strides, lower, upper, cpp, ppc, estrides, *_rest) = args
    assert dtype == driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert (rank, address, cpp, ppc) == (5, 0x7F0000004000, 32, 64)
    assert _plain(dims) == (32, 12, 10, 6, 2)
    assert _plain(strides) == (64, 64 * 12, 64 * 12 * 10, 64 * 12 * 10 * 6)
    assert (tuple(lower), tuple(upper)) == ((-3, -2, -1), (3, 2, 1))  # {W, H, D}
    assert _plain(estrides) == (1, 2, 2, 1, 1)
    assert tmap.mode == "im2col" and tmap.box_bytes == 64 * 32 * 2


def test_driver_refusal_names_every_parameter(monkeypatch):
    FakeDriver(monkeypatch, result=driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(TensorMapError) as info:
        TensorMap.tiled(FakeDeviceArray((64, 64), address=0x7F0000008000), box=(16, 32))
    text = str(info.value)
    assert "cuTensorMapEncodeTiled refused the tensor map with CUDA_ERROR_INVALID_VALUE" in text
    for part in ["tensorDataType=CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "tensorRank=2",
                 f"globalAddress={0x7F0000008000}", "globalDim=(64, 64)", "globalStrides=(256,)",
                 "boxDim=(32, 16)", "elementStrides=(1, 1)",
                 "interleave=CU_TENSOR_MAP_INTERLEAVE_NONE", "swizzle=CU_TENSOR_MAP_SWIZZLE_NONE",
                 "l2Promotion=CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
                 "oobFill=CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"]:
        assert part in text


def test_missing_driver_is_a_tensor_map_error(monkeypatch):
    def no_driver(flags):
        raise RuntimeError("libcuda.so not found")

    monkeypatch.setattr(driver, "cuInit", no_driver)
    with pytest.raises(TensorMapError, match="the CUDA driver is not available"):
        TensorMap.tiled(FakeDeviceArray((64, 64)), box=(16, 32))


# ---------------------------------------------------------------------------------------------
# Derived values
# ---------------------------------------------------------------------------------------------


def test_box_bytes_and_smem_box(fake_driver):
    a = FakeDeviceArray((64, 64))
    assert TensorMap.tiled(a, box=(32, 32)).box_bytes == 32 * 32 * 4
    # A traversal stride of 2 on the rows halves them; the innermost stride is ignored without
    # interleave.
    tmap = TensorMap.tiled(a, box=(32, 32), element_strides=(2, 2))
    assert tmap.smem_box == (16, 32) and tmap.box_bytes == 16 * 32 * 4
    assert TensorMap.tiled(a, box=(31, 32), element_strides=(2, 1)).smem_box == (16, 32)
    packed = TensorMap.tiled(0x10000, box=(2, 128), dtype="16u4_align16b", shape=(4, 256))
    assert packed.box_bytes == 2 * 128  # one byte per value in shared memory


def test_repr(fake_driver):
    tmap = TensorMap.tiled(FakeDeviceArray((64, 64), address=0x7F0000010000), box=(16, 32),
                           swizzle=128)
    assert repr(tmap) == (
        "TensorMap.tiled(f32, shape=(64, 64), strides=(256, 4), box=(16, 32), "
        "element_strides=(1, 1), swizzle=128B, interleave=none, l2_promotion=128B, "
        "oob_fill=zero, address=0x7f0000010000)"
    )
    im = TensorMap.im2col(FakeDeviceArray((2, 8, 8, 64), "<f2"), channels_per_pixel=64,
                          pixels_per_column=32, lower_corner=(-1, -1), upper_corner=(-1, -1))
    assert "TensorMap.im2col(f16, shape=(2, 8, 8, 64)" in repr(im)
    assert "lower_corner=(-1, -1), upper_corner=(-1, -1), channels_per_pixel=64, " \
           "pixels_per_column=32" in repr(im)


def test_module_names_its_sources():
    doc = tensormap.__doc__
    assert "cuTensorMapEncodeTiled" in doc and "cuTensorMapEncodeIm2col" in doc
    assert "innermost first" in doc


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how, want", [("size", [1008]), ("zero", [0]), ("sixteen", [16]),
                                       ("none", [])])
def test_rank1_map_gets_one_stride(fake_driver, monkeypatch, how, want):
    """cuda.bindings passes an empty globalStrides list as NULL, which the H200's driver refused
    for every rank-1 map; _encode hands it rank1_strides instead (the tensor's byte size rounded
    up to 16 by default: 250 float32 -> 1008)."""
    monkeypatch.setattr(tensormap, "RANK1_STRIDES", how)
    tmap = TensorMap.tiled(FakeDeviceArray((250,)), box=(16,))
    ((_, args),) = fake_driver.calls
    assert args[1] == 1 and _plain(args[3]) == (250,) and _plain(args[4]) == tuple(want)
    assert tmap.driver_params["globalStrides"] == ()  # what the map has: no outer stride


def test_rank1_refusal_names_the_strides_passed(monkeypatch):
    FakeDriver(monkeypatch, result=driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    with pytest.raises(TensorMapError, match=r"globalStrides passed as \[1024\]: rank 1"):
        TensorMap.tiled(FakeDeviceArray((256,)), box=(16,))


def test_rank2_maps_keep_their_strides(fake_driver):
    TensorMap.tiled(FakeDeviceArray((4, 256)), box=(2, 16))
    ((_, args),) = fake_driver.calls
    assert _plain(args[4]) == (1024,)


@pytest.mark.parametrize("inner, swizzle, dense, span", [
    (32, 128, 32, 128), (64, 128, 64, 128), (128, 128, 128, 128), (32, 64, 32, 64),
    (16, 32, 16, 32), (48, 0, 48, 48),
])
def test_smem_row_pitch_models(inner, swizzle, dense, span):
    assert tensormap.smem_row_pitch(inner, swizzle, "dense") == dense
    assert tensormap.smem_row_pitch(inner, swizzle, "span") == span


def test_smem_bytes_follows_the_row_model(fake_driver, monkeypatch):
    """'span' (measured on the H200: each narrow row takes the whole swizzle span) by default."""
    tmap = TensorMap.tiled(FakeDeviceArray((24, 128)), box=(8, 8), swizzle=128)  # 32 B rows
    assert tensormap.SMEM_ROW_MODEL == "span"
    assert (tmap.smem_row_bytes, tmap.box_bytes, tmap.smem_bytes) == (32, 256, 1024)
    monkeypatch.setattr(tensormap, "SMEM_ROW_MODEL", "dense")
    assert (tmap.box_bytes, tmap.smem_bytes) == (256, 256)


# Where a copy may start: the 16-byte rule (measured on the H200; intrinsics.tensormap docstring)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inner, legal", [(0, True), (4, True), (8, True), (-4, True),
                                          (3, False), (1, False), (90, False)])
def test_start_rule_is_the_measured_table(inner, legal):
    """The H200's table: float32 innermost starts of 0, 4, 8, -4 elements ran; 3, 1, 90
    faulted (CUDA_ERROR_ILLEGAL_INSTRUCTION)."""
    assert (tensormap.start_problem("f32", (inner, 5)) is None) == legal


@pytest.mark.parametrize("dtype, inner, legal", [
    ("u8", 16, True), ("u8", 8, False), ("u8", -16, True), ("f16", 8, True), ("f16", 4, False),
    ("bf16", -8, True), ("f64", 2, True), ("f64", 1, False),
])
def test_start_rule_counts_bytes(dtype, inner, legal):
    problem = tensormap.start_problem(dtype, (inner, 0, 0))
    assert (problem is None) == legal
    if not legal:
        assert f"byte offset {inner * tma_type(dtype).element_bytes}" in problem
        assert "16-byte rule" in problem


def test_outer_coordinates_are_free():
    assert tensormap.start_problem("f32", (4, 3, -7, 1001)) is None


@pytest.mark.parametrize("coords", [(-4, 3), (0, -5), (4, -1), (-4, -5), (8, 0, 3, -1, 1)])
def test_stores_refuse_negative_coordinates(coords):
    """A store at (-4, -5) faulted on the H200 (loads there run); which coordinate matters is
    for the 'tile store, negative start' probes -- until then any negative one is refused."""
    assert tensormap.start_problem("f32", coords) is None
    problem = tensormap.start_problem("f32", coords, op="store")
    assert "negative" in problem and "store" in problem


def test_stores_past_the_end_are_legal():
    assert tensormap.start_problem("f32", (88, 40), op="store") is None
    # the 16-byte rule comes first
    assert "16-byte rule" in tensormap.start_problem("f32", (-3, -5), op="store")


def test_check_start(fake_driver):
    tmap = TensorMap.tiled(FakeDeviceArray((48, 96)), box=(16, 16))
    assert tmap.check_start((8, -3)) == (8, -3)
    with pytest.raises(ValueError, match=r"check_start: the box at coords \(3, 5\).*byte offset "
                                         r"12, not a multiple of 16.*16-byte rule.*multiple of 4 "
                                         r"elements; e\.g\. innermost 0 or 4"):
        tmap.check_start((3, 5))
    with pytest.raises(ValueError, match="one entry per tensor dimension"):
        tmap.check_start((4,))
    assert tmap.check_start((88, 40), op="store") == (88, 40)
    with pytest.raises(ValueError, match=r"cannot be stored: coordinate\(s\) \[1\]"):
        tmap.check_start((8, -3), op="store")
    im = TensorMap.im2col(FakeDeviceArray((2, 8, 8, 64), "<f2"), channels_per_pixel=64,
                          pixels_per_column=32, lower_corner=(-1, -1), upper_corner=(-1, -1))
    assert im.check_start((8, -1, -1, 0)) == (8, -1, -1, 0)
    with pytest.raises(ValueError, match="channel coordinate"):
        im.check_start((4, -1, -1, 0))


def test_numbatc_kernels_start_on_16_bytes():
    """numbatc's own tensor-copy kernels compute their starts on the device: sm100_gemm loads
    A and B at (kt * BK, m0) / (kt * BK, n0), sm100_scaled_gemm at (kt * 128 bytes, m0) --
    innermost starts that are multiples of the box's innermost extent, which the driver's rule
    makes a multiple of 16 bytes.  Every configuration obeys the 16-byte rule for every k tile."""
    from numbatc.kernels import sm100_gemm, sm100_scaled_gemm

    for cfg in sm100_gemm.CONFIGS.values():
        for dt in sm100_gemm._PTX_TYPE.values():
            for kt in range(4):
                assert tensormap.start_problem(dt, (kt * cfg.bk, 128)) is None, (cfg, dt)
    for kt in range(4):
        assert tensormap.start_problem("u8", (kt * sm100_scaled_gemm._K_BYTES, 128)) is None
