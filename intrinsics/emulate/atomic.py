"""Emulation of intrinsics.atomic: the simulator runs one block's threads as Python threads (and
the blocks of a cluster together), so the read-modify-write holds a lock."""

import threading

from intrinsics.emulate.memory import host_array

_LOCK = threading.Lock()


def atomic_add_global(array, index, value):
    host = host_array(array)
    with _LOCK:
        old = host[index]
        host[index] = old + host.dtype.type(value)
    return old


EMULATIONS = {"atomic_add_global": atomic_add_global}
