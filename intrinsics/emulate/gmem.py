"""Emulation of intrinsics.gmem: the 4 bytes land in the NumPy array behind the pointer, at the
byte offset of the element; a misaligned address is an error, as on the GPU."""

import numpy as np

from intrinsics.emulate.memory import host_array
from intrinsics.emulate.runtime import EmulationError


def st_global_b32(array, index, value):
    host = host_array(array)
    offset = int(index) * host.itemsize
    if (host.ctypes.data + offset) % 4:
        raise EmulationError(f"st_global_b32: address of element {int(index)} is not 4-byte aligned "
                             "(CUDA_ERROR_MISALIGNED_ADDRESS on the GPU)")
    raw = host.reshape(-1).view(np.uint8)
    raw[offset:offset + 4] = np.array([int(value) & 0xFFFFFFFF], np.uint32).view(np.uint8)


def st_global_v4_b32(array, index, value):
    host = host_array(array)
    offset = int(index) * host.itemsize
    if (host.ctypes.data + offset) % 16:
        raise EmulationError(f"st_global_v4_b32: address of element {int(index)} is not 16-byte "
                             "aligned (CUDA_ERROR_MISALIGNED_ADDRESS on the GPU)")
    raw = host.reshape(-1).view(np.uint8)
    words = np.array([int(v) & 0xFFFFFFFF for v in value], np.uint32)
    raw[offset:offset + 16] = words.view(np.uint8)


EMULATIONS = {"st_global_b32": st_global_b32, "st_global_v4_b32": st_global_v4_b32}
