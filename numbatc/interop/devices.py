"""CUDA devices as numbatc asks about them: Numba's device list (filled once, under a lock), a
device's primary context made current for a block, and which device owns a pointer.

Numba is imported on first use only, so ``import numbatc`` touches no GPU.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["gpu", "device_scope", "pointer_device"]

_DEVICES_LOCK = threading.Lock()
_devices_ready = False


def gpu(device: int):
    """Numba's ``cuda.gpus[device]``, the device list filled under a lock on first use.

    NOTE: numba-cuda 0.30 fills ``cuda.gpus`` lazily and ``driver.get_device`` checks then
    inserts into a dict that refuses a second insert: two threads touching the device list
    first at once die on ``AssertionError: key already in dictionary: 0`` (seen with 8 threads'
    first numbatc.gemm calls on the H200).  numbatc takes numba's own runtime lock too, so a
    context numba creates meanwhile in another thread waits as well."""
    global _devices_ready
    from numba import cuda

    if not _devices_ready:
        from numba.cuda.cudadrv import devices

        runtime_lock = getattr(getattr(devices, "_runtime", None), "_lock", None)
        with _DEVICES_LOCK, (runtime_lock or contextlib.nullcontext()):
            if not _devices_ready:
                len(cuda.gpus)  # fills the list: cuInit, every device's handle
                _devices_ready = True
    return cuda.gpus[device]


def device_scope(device):
    """Make ``device``'s primary context current (Numba's ``cuda.gpus[i]``) for the block."""
    if device is None:
        return contextlib.nullcontext()
    return gpu(device)


def pointer_device(ptr: int, name: str = "array") -> int:
    """The device ordinal that owns device pointer ``ptr`` (a driver query; patched in tests)."""
    from numba.cuda.cudadrv.driver import CudaAPIError, binding, driver

    attr = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    try:
        return int(driver.cuPointerGetAttribute(attr, binding.CUdeviceptr(ptr)))
    except CudaAPIError:
        raise TypeError(
            f"{name}: pointer {ptr:#x} from __cuda_array_interface__ is not CUDA memory"
        ) from None
