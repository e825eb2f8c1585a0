"""Emulation of intrinsics.smem: shared addresses come from the block's SharedSpace."""

import numpy as np

from intrinsics.emulate import memory


def shared_address(array, index):
    return np.uint32(memory.shared_address(array, index))


EMULATIONS = {"shared_address": shared_address}
