import pytest

from numba import cuda


def _gpu_cc():
    try:
        if cuda.is_available():
            return cuda.get_current_device().compute_capability
    except Exception:  # a broken driver install counts as no GPU
        return None
    return None


GPU_CC = _gpu_cc()


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        if GPU_CC is None:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU"))
            continue
        need = marker.kwargs.get("cc")
        if need is not None and tuple(GPU_CC) < tuple(need):
            item.add_marker(pytest.mark.skip(reason=f"needs compute capability {need}, have {GPU_CC}"))
