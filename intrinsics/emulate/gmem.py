"""Emulation of intrinsics.gmem: the 4 or 16 bytes land in the NumPy array behind the pointer,
at the byte offset of the element; a misaligned address is an error, as on the GPU."""

import numpy as np

from intrinsics.emulate.memory import host_array
from intrinsics.emulate.runtime import EmulationError


def _store_words(name, array, index, words):
    """The 32-bit ``words`` at the byte offset of ``array[index]``, which must be aligned to
    their total size."""
    host = host_array(array)
    offset = int(index) * host.itemsize
    size = 4 * len(words)
    if (host.ctypes.data + offset) % size:
        raise EmulationError(f"{name}: address of element {int(index)} is not {size}-byte "
                             "aligned (CUDA_ERROR_MISALIGNED_ADDRESS on the GPU)")
    raw = host.reshape(-1).view(np.uint8)
    raw[offset:offset + size] = np.array([int(v) & 0xFFFFFFFF for v in words],
                                         np.uint32).view(np.uint8)


def st_global_b32(array, index, value):
    _store_words("st_global_b32", array, index, (value,))


def st_global_v4_b32(array, index, value):
    _store_words("st_global_v4_b32", array, index, value)


EMULATIONS = {"st_global_b32": st_global_b32, "st_global_v4_b32": st_global_v4_b32}
