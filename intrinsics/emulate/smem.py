"""Emulation of intrinsics.smem: shared addresses come from the block's SharedSpace."""

import numpy as np

from intrinsics.emulate import memory
from intrinsics.emulate.runtime import EmulationError


def shared_address(array, index):
    return np.uint32(memory.shared_address(array, index))


def _aligned(name, address, size):
    if address % size:
        raise EmulationError(f"{name}: shared address {address} is not {size}-byte aligned "
                             "(a misaligned-address error on the GPU)")
    return address


def st_shared_b32(array, index, value):
    address = _aligned("st_shared_b32", int(memory.shared_address(array, index)), 4)
    word = np.array([int(value) & 0xFFFFFFFF], np.uint32)
    memory.shared_bytes(address, 4)[:] = word.view(np.uint8)


def ld_shared_v4_b32(array, index):
    address = _aligned("ld_shared_v4_b32", int(memory.shared_address(array, index)), 16)
    return tuple(np.uint32(x) for x in memory.shared_bytes(address, 16).copy().view(np.uint32))


EMULATIONS = {"shared_address": shared_address, "st_shared_b32": st_shared_b32,
              "ld_shared_v4_b32": ld_shared_v4_b32}
