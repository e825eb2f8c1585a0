"""GPU tests carry the ``gpu`` marker (optionally ``gpu(cc=(9, 0))``).  They run on a CUDA GPU and
skip cleanly without one.  Under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) the GPU tests of
modules marked ``emulation`` run against numbatc's CPU emulation instead (same test, second back
end), as if on an sm_90a device; the others skip there."""

import os

import pytest

from numba import config, cuda

EMULATED = bool(config.ENABLE_CUDASIM)
EMULATED_CC = (9, 0)


def _gpu_cc():
    if EMULATED:
        return EMULATED_CC
    try:
        if cuda.is_available():
            return tuple(cuda.get_current_device().compute_capability)
    except Exception:  # a broken driver install counts as no GPU
        return None
    return None


GPU_CC = _gpu_cc()


def pytest_configure(config):
    config.addinivalue_line("markers", "emulation: this GPU test also runs in the CPU emulation")
    config.addinivalue_line("markers", "hardware_only: this GPU test needs a real device even "
                                       "under the simulator (driver calls, timings)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            if EMULATED and not item.get_closest_marker("emulation"):
                item.add_marker(pytest.mark.skip(reason="CPU test: run without NUMBA_ENABLE_CUDASIM"))
            continue
        if GPU_CC is None:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU"))
            continue
        if EMULATED and (not item.get_closest_marker("emulation")
                         or item.get_closest_marker("hardware_only")):
            item.add_marker(pytest.mark.skip(reason="not emulated: needs a real GPU"))
            continue
        need = marker.kwargs.get("cc")
        if need is not None and tuple(GPU_CC) < tuple(need):
            item.add_marker(pytest.mark.skip(reason=f"needs compute capability {need}, have {GPU_CC}"))


@pytest.fixture
def device_cc():
    """The compute capability the GPU tests run on (the emulated one under the simulator)."""
    return GPU_CC


def pytest_report_header(config):
    return f"numbatc tests: {'emulation' if EMULATED else 'GPU ' + str(GPU_CC) if GPU_CC else 'CPU only'}" + (
        f" (NUMBATC_TEST_ENV={os.environ.get('NUMBATC_TEST_ENV')})" if os.environ.get("NUMBATC_TEST_ENV") else "")
