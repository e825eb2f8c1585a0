"""The 16-byte rule in the CPU emulation: a tensor copy whose innermost start is not a multiple
of 16 bytes (coordinate x element size; im2col: the channel coordinate) is an EmulationError
naming the block and thread, the coordinates, the byte offset and the rule -- on the H200 the
same copy raises CUDA_ERROR_ILLEGAL_INSTRUCTION (measured for 2-d float32 tile loads: innermost
starts of 0, 16, 32, -16 bytes run, 12, 4, 360 bytes fault; intrinsics.tensormap.start_problem).

The illegal cases are the starts the GPU tests and probes used before the rule was known
(tests/gpu/test_tma_gpu.py, tests/gpu/tma_probe.py, scripts/diag/), which is why tensor copies
were wrongly thought to fault on that H200; the GPU tests now take legal starts.

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation``."""

import re

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from intrinsics.emulate.runtime import EmulationError  # noqa: E402
from intrinsics.launch import launch  # noqa: E402
from intrinsics.tensormap import TensorMap  # noqa: E402
from tests.helpers.tma import (  # noqa: E402
    ALIGN,
    THREADS,
    box_model,
    device_coords,
    im2col_kernel,
    load_kernel,
    multicast_kernel,
    prefetch_kernel,
    random_tensor,
    store_kernel,
    unswizzle_bytes,
)


def _message(coords, offset, block=r"\(0, 0, 0\)"):
    """What the error must say: block and thread, the coordinates, the byte offset, the rule."""
    coords = tuple(int(c) for c in coords)
    return (rf"block {block} warp 0 lane 0: .*coords {re.escape(str(coords))} .*"
            rf"byte offset {offset}, not a multiple of 16.*16-byte rule")


def _tmap(tensor, box, bf16=False, **kwargs):
    return TensorMap.tiled(cuda.to_device(tensor), box, dtype="bf16" if bf16 else None, **kwargs)


def _load(tmap, coords):
    nbytes = tmap.box_bytes
    out = cuda.to_device(np.zeros(nbytes, np.uint8))
    launch(load_kernel(tmap.rank), 1, THREADS,
           (tmap.device, cuda.to_device(np.asarray(coords, np.int32)), nbytes, out,
            cuda.to_device(np.zeros(1, np.int32))), shared_bytes=nbytes + ALIGN)
    return out.copy_to_host()


# (id, element type, tensor shape, box, TensorMap keyword arguments, old start (natural order),
#  its innermost byte offset)
OLD_LOADS = [
    ("tma_probe-and-diag", np.float32, (48, 96), (16, 16), {}, (5, 3), 12),
    ("swizzle-none-f32", np.float32, (48, 96), (16, 16), {}, (5, 3), 12),
    ("swizzle-128-bf16", "bf16", (40, 136), (24, 64), dict(swizzle=128), (3, 70), 140),
    ("swizzle-64-f16", np.float16, (40, 136), (8, 32), dict(swizzle=64), (30, 1), 2),
    ("swizzle-128-u8", np.uint8, (32, 160), (8, 128), dict(swizzle=128), (11, 17), 17),
    ("oob-zero-negative", np.float32, (40, 24), (16, 8), {}, (-3, -5), -20),
    ("oob-nan-negative", np.float32, (40, 24), (16, 8), dict(oob_fill="nan"), (-3, -5), -20),
    ("oob-zero-past", np.float32, (40, 24), (16, 8), {}, (-7, 18), 72),
    ("oob-nan-past", np.float32, (40, 24), (16, 8), dict(oob_fill="nan"), (-7, 18), 72),
    ("3d-past", np.uint16, (5, 24, 40), (2, 8, 16), {}, (4, 20, 30), 60),
    ("3d-negative", np.uint16, (5, 24, 40), (2, 8, 16), {}, (-1, -2, -3), -6),
    ("two-loads-second-box", np.float32, (64, 64), (8, 32), dict(swizzle=128), (40, 30), 120),
    # the H200's faulting starts (besides 3): 1 and 90 float32 elements
    ("measured-1", np.float32, (48, 96), (16, 16), {}, (5, 1), 4),
    ("measured-90", np.float32, (48, 96), (16, 16), {}, (5, 90), 360),
]


@pytest.mark.parametrize("case", OLD_LOADS, ids=[c[0] for c in OLD_LOADS])
def test_unaligned_load_is_refused(case):
    _, dtype, shape, box, kwargs, start, offset = case
    tensor = random_tensor(np.random.default_rng(), shape, dtype)
    tmap = _tmap(tensor, box, bf16=dtype == "bf16", **kwargs)
    coords = device_coords(start)
    with pytest.raises(EmulationError, match=_message(coords, offset)):
        _load(tmap, coords)
    with pytest.raises(ValueError, match=f"byte offset {offset}, not a multiple of 16"):
        tmap.check_start(coords)


@pytest.mark.parametrize("inner", [0, 4, 8, -4])
def test_the_measured_legal_starts_run(inner):
    """The starts the H200 ran exactly (0, 16, 32, -16 bytes) run here too, exactly."""
    tensor = random_tensor(np.random.default_rng(), (48, 96), np.float32)
    tmap = _tmap(tensor, (16, 16))
    got = _load(tmap, tmap.check_start((inner, 5))).view(np.float32).reshape(16, 16)
    np.testing.assert_array_equal(got, box_model(tensor, (5, inner), (16, 16), 0))


@pytest.mark.parametrize("swizzle, box, start, offset", [
    (0, (16, 8), (-5, -3), -12),
    (128, (16, 32), (-5, -3), -12),
    (0, (16, 8), (3, 5), 20),
])
def test_unaligned_store_is_refused(swizzle, box, start, offset):
    target = cuda.to_device(np.zeros((40, 48), np.float32))
    tmap = TensorMap.tiled(target, box, swizzle=swizzle)
    image = np.zeros(tmap.box_bytes, np.uint8)
    coords = device_coords(start)
    with pytest.raises(EmulationError, match=_message(coords, offset)):
        launch(store_kernel(2), 1, THREADS,
               (tmap.device, cuda.to_device(coords), cuda.to_device(image), image.size),
               shared_bytes=image.size + ALIGN)
    assert not target.copy_to_host().any(), "a refused store must write nothing"


@pytest.mark.parametrize("start", [(3, -4), (-5, 4), (-5, -4)])
def test_negative_store_is_refused(start):
    """A store whose box starts before the tensor (any negative coordinate, 16-byte aligned)
    faulted on the H200 (store at (-4, -5), innermost first); until the probes separate the
    innermost from the outer coordinates the emulation refuses every negative one."""
    target = cuda.to_device(np.zeros((40, 48), np.float32))
    tmap = TensorMap.tiled(target, (16, 8))
    image = np.zeros(tmap.box_bytes, np.uint8)
    coords = device_coords(start)
    with pytest.raises(EmulationError, match=r"block \(0, 0, 0\) warp 0 lane 0: .*coords "
                       + re.escape(str(tuple(int(c) for c in coords))) + r".*negative.*store"):
        launch(store_kernel(2), 1, THREADS,
               (tmap.device, cuda.to_device(coords), cuda.to_device(image), image.size),
               shared_bytes=image.size + ALIGN)
    assert not target.copy_to_host().any(), "a refused store must write nothing"


def test_unaligned_multicast_is_refused():
    tensor = random_tensor(np.random.default_rng(), (37, 40), np.float32)
    tmap = _tmap(tensor, (16, 32), swizzle=128)
    box = tmap.box_bytes
    coords = np.array([2, 0], np.int32)  # 8 bytes in; CTA 1 loads rows 16.. (coords (2, 16))
    out = cuda.to_device(np.zeros((2, 2 * box), np.uint8))
    either = r"block \((0|1), 0, 0\) warp 0 lane 0: .*coords \(2, (0|16)\) .*byte offset 8, not"
    with pytest.raises(EmulationError, match=either + r" a multiple of 16.*16-byte rule"):
        launch(multicast_kernel(2), 2, THREADS,
               (tmap.device, cuda.to_device(coords), 1, 16, box, out,
                cuda.to_device(np.zeros(2, np.int32))),
               shared_bytes=2 * box + ALIGN, cluster=(2, 1, 1))


def test_unaligned_im2col_channel_is_refused():
    tensor = random_tensor(np.random.default_rng(), (2, 8, 8, 32), np.float16)
    tmap = TensorMap.im2col(cuda.to_device(tensor), channels_per_pixel=16, pixels_per_column=32,
                            lower_corner=(-1, -1), upper_corner=(-1, -1))
    coords = np.array([4, -1, -1, 0], np.int32)  # channel 4 x 2 bytes = 8 bytes
    out = cuda.to_device(np.zeros(tmap.box_bytes, np.uint8))
    with pytest.raises(EmulationError, match=_message(coords, 8)) as caught:
        launch(im2col_kernel(4), 1, THREADS,
               (tmap.device, cuda.to_device(coords), cuda.to_device(np.zeros(2, np.int32)),
                tmap.box_bytes, out, cuda.to_device(np.zeros(1, np.int32))),
               shared_bytes=tmap.box_bytes + ALIGN)
    assert "channel coordinate" in str(caught.value)
    with pytest.raises(ValueError, match="channel coordinate"):
        tmap.check_start(coords)


def test_unaligned_prefetch_is_refused():
    tmap = _tmap(np.zeros((48, 96), np.float32), (16, 16))
    coords = device_coords((5, 3))
    with pytest.raises(EmulationError, match=_message(coords, 12)):
        launch(prefetch_kernel(2), 1, 32,
               (tmap.device, cuda.to_device(coords), cuda.to_device(np.zeros(1, np.int32))))


def test_swizzled_legal_load_still_matches_after_the_rule():
    """A 128B-swizzled load at a legal negative start is exact (fill included): the rule
    refuses only the starts it names."""
    tensor = random_tensor(np.random.default_rng(), (40, 64), np.float32)
    tmap = _tmap(tensor, (16, 32), swizzle=128)
    got = unswizzle_bytes(_load(tmap, device_coords((-3, -4))), 128).view(np.float32)
    np.testing.assert_array_equal(got.reshape(16, 32), box_model(tensor, (-3, -4), (16, 32), 0))
