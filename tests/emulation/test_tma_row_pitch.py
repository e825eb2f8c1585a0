"""Where a swizzled box's rows land in shared memory follows one function,
``intrinsics.tensormap.smem_row_pitch`` (model ``SMEM_ROW_MODEL``): 'dense' packs the rows, 'span'
gives every row the whole swizzle span.  Narrow rows under 128B swizzle faulted on the H200
(CUDA_ERROR_ILLEGAL_ADDRESS); scripts/tma_rules.py's footprint probes decide the model, and
switching it must move the emulation's bytes with it.

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation``."""

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from intrinsics import tensormap  # noqa: E402
from intrinsics.launch import launch  # noqa: E402
from intrinsics.layout import swizzle_offset_host  # noqa: E402
from intrinsics.tensormap import TensorMap  # noqa: E402
from tests.helpers.tma import ALIGN, POISON, THREADS, footprint_kernel  # noqa: E402


def _landing(tmap, start, region):
    """The region dumped after one load at ``start`` (natural order)."""
    out = cuda.to_device(np.full(region, POISON, np.uint8))
    launch(footprint_kernel(2), 1, THREADS,
           (tmap.device, cuda.to_device(np.array(start[::-1], np.int32)), tmap.box_bytes, region,
            out, cuda.to_device(np.zeros(1, np.int32))), shared_bytes=region + ALIGN)
    return out.copy_to_host()


@pytest.mark.parametrize("model", ["dense", "span"])
@pytest.mark.parametrize("swizzle, cols", [(128, 8), (128, 16), (64, 8), (128, 32)])
def test_rows_land_at_the_models_pitch(monkeypatch, model, swizzle, cols):
    monkeypatch.setattr(tensormap, "SMEM_ROW_MODEL", model)
    tensor = np.random.default_rng().standard_normal((24, 128)).astype(np.float32)
    tmap = TensorMap.tiled(cuda.to_device(tensor), (8, cols), swizzle=swizzle)
    inner = cols * 4
    pitch = tensormap.smem_row_pitch(inner, swizzle)
    assert pitch == (inner if model == "dense" else max(inner, swizzle))
    assert tmap.smem_bytes == 8 * pitch
    got = _landing(tmap, (2, 0), 8 * 256 + 1024)
    box = np.ascontiguousarray(tensor[2:10, :cols]).view(np.uint8).reshape(8, inner)
    want = np.full(got.size, POISON, np.uint8)
    rows, cols_ = np.indices((8, inner))
    want[swizzle_offset_host((rows * pitch + cols_).reshape(-1), swizzle)] = box.reshape(-1)
    np.testing.assert_array_equal(got, want)
