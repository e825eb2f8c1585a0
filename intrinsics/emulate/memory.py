"""Memory access for the emulated intrinsics: the NumPy array behind a kernel argument, shared
addresses of this block, and byte views for copies."""

import numpy as np

from intrinsics.emulate.runtime import EmulationError, current

__all__ = ["global_bytes", "host_array", "shared_address", "shared_bytes"]


def host_array(array):
    """The NumPy array behind a simulator array (kernel arguments are wrapped twice)."""
    item = getattr(array, "_item", None)  # FakeWithinKernelCUDAArray
    if item is not None:
        array = item
    inner = getattr(array, "_ary", None)  # FakeCUDAArray
    if inner is not None:
        array = inner
    if not isinstance(array, np.ndarray):
        raise EmulationError(f"expected an array, got {type(array).__name__}")
    return array


def shared_address(array, index):
    """This block's 32-bit shared address of ``array[index]``."""
    thread = current()
    try:
        return thread.block.shared.address(host_array(array), index)
    except EmulationError as exc:
        raise EmulationError(f"{thread.where()}: {exc}") from None


def shared_bytes(address, nbytes, block=None):
    """Writable uint8 view of ``nbytes`` of shared memory at ``address`` (this block's, or
    ``block``'s for distributed shared memory)."""
    block = block or current().block
    return block.shared.bytes(int(address), int(nbytes))


def global_bytes(array, index, nbytes):
    """Writable uint8 view of ``nbytes`` of a global array starting at element ``index``."""
    arr = host_array(array)
    if isinstance(index, tuple):
        offset = sum(int(i) * s for i, s in zip(index, arr.strides))
    else:
        offset = int(index) * arr.strides[0]
    # Any strides: view the bytes of the allocation that owns the array.
    owner = arr
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    flat = owner.reshape(-1, order="A").view(np.uint8) if (
        owner.flags.c_contiguous or owner.flags.f_contiguous) else None
    if flat is None:
        raise EmulationError("the global array's memory is not one contiguous allocation")
    start = arr.__array_interface__["data"][0] + offset - flat.__array_interface__["data"][0]
    if start < 0 or start + nbytes > flat.size:
        raise EmulationError(
            f"global access of {nbytes} bytes at byte {start} is outside the allocation of "
            f"{flat.size} bytes"
        )
    return flat[start: start + nbytes]
