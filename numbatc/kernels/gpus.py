"""What the portable kernels' heuristics need to know about a GPU, per compute capability: how
much shared memory one block may take and one SM holds, its registers, its resident threads and
blocks, and a typical SM count -- and the blocks of a configuration one SM then holds.

The limits are the CUDA C++ Programming Guide's "Technical Specifications per Compute
Capability" table, as NVIDIA's CCCL encodes it (libcudacxx ``cuda/__device/arch_traits.h``,
``arch_traits<arch_id::sm_XY>``): per block, the opt-in maximum of dynamic shared memory
(``cudaDevAttrMaxSharedMemoryPerBlockOptin``) is the SM's amount less the 1 KB the driver
reserves per block from compute capability 8.0 on; 64K 32-bit registers per SM and per block,
at most 255 per thread, on every part here.  The SM counts are not a compute-capability fact
(parts of one capability differ): each names the part it is from, and on a GPU
:func:`sm_count` asks the device instead.

    cc     shared / block   shared / SM   threads / SM   blocks / SM   typical SMs
    8.0    163 KB           164 KB        2048           32            108 (A100)
    8.6     99 KB           100 KB        1536           16             72 (A10; RTX 3090: 82)
    8.7    163 KB           164 KB        1536           16             16 (Jetson AGX Orin)
    8.8     99 KB           100 KB        1536           16             (CCCL: as 8.6)
    8.9     99 KB           100 KB        1536           24             58 (L4; RTX 4090: 128)
    9.0    227 KB           228 KB        2048           32            132 (H100 / H200 SXM)
    10.0   227 KB           228 KB        2048           32            148 (B200)
    10.3   227 KB           228 KB        2048           32            148 (B300)
    11.0   227 KB           228 KB        1536           24             20 (Jetson Thor)
    12.0    99 KB           100 KB        1536           24            170 (RTX 5090)
    12.1    99 KB           100 KB        1536           24             48 (DGX Spark GB10)

A compute capability not in the table gets the smallest limits of the table (99 KB per block),
so that what is chosen for it still launches; ``None`` (no device: the CPU emulation, which
stands in for an sm_90a GPU) gets 9.0's.
"""

import functools
from dataclasses import dataclass

__all__ = ["GpuLimits", "LIMITS", "blocks_per_sm", "fits", "kb", "limits", "sm_count"]


@dataclass(frozen=True)
class GpuLimits:
    """One compute capability's limits (bytes, registers, threads, blocks) and a typical SM
    count (``sms``, of the part ``part``)."""

    cc: tuple
    shared_per_block: int  # the opt-in maximum of dynamic shared memory per block
    shared_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int
    sms: int
    part: str
    reserved_per_block: int = 1024  # shared memory the driver keeps per resident block
    registers_per_sm: int = 65536
    registers_per_thread: int = 255

    @property
    def name(self):
        return f"{self.cc[0]}.{self.cc[1]}"


_KB = 1024

#: Per compute capability (see the module docstring for the source).
LIMITS = {
    lim.cc: lim
    for lim in (
        GpuLimits((8, 0), 163 * _KB, 164 * _KB, 2048, 32, 108, "A100"),
        GpuLimits((8, 6), 99 * _KB, 100 * _KB, 1536, 16, 72, "A10"),
        GpuLimits((8, 7), 163 * _KB, 164 * _KB, 1536, 16, 16, "Jetson AGX Orin"),
        GpuLimits((8, 8), 99 * _KB, 100 * _KB, 1536, 16, 72, "as 8.6"),
        GpuLimits((8, 9), 99 * _KB, 100 * _KB, 1536, 24, 58, "L4"),
        GpuLimits((9, 0), 227 * _KB, 228 * _KB, 2048, 32, 132, "H100 / H200 SXM"),
        GpuLimits((10, 0), 227 * _KB, 228 * _KB, 2048, 32, 148, "B200"),
        GpuLimits((10, 3), 227 * _KB, 228 * _KB, 2048, 32, 148, "B300"),
        GpuLimits((11, 0), 227 * _KB, 228 * _KB, 1536, 24, 20, "Jetson Thor"),
        GpuLimits((12, 0), 99 * _KB, 100 * _KB, 1536, 24, 170, "RTX 5090"),
        GpuLimits((12, 1), 99 * _KB, 100 * _KB, 1536, 24, 48, "DGX Spark"),
    )
}


def limits(cc) -> GpuLimits:
    """The limits of compute capability ``cc`` ((major, minor)); None: 9.0's (the CPU
    emulation's GPU); one not in :data:`LIMITS`: the smallest of each limit there, under its own
    cc."""
    return _limits((9, 0) if cc is None else tuple(cc)[:2])


@functools.cache
def _limits(cc):
    if cc in LIMITS:
        return LIMITS[cc]
    low = min(LIMITS.values(), key=lambda lim: (lim.shared_per_block, lim.threads_per_sm))
    return GpuLimits(cc, low.shared_per_block, low.shared_per_sm, low.threads_per_sm,
                     min(lim.blocks_per_sm for lim in LIMITS.values()), low.sms,
                     "not in numbatc's table: the smallest limits")


def kb(nbytes):
    """``nbytes`` as a message names it: '96 KB', '1.5 KB'."""
    return f"{nbytes / _KB:g} KB"


def fits(lim: GpuLimits, shared_bytes, threads):
    """Whether one block of ``threads`` threads taking ``shared_bytes`` of shared memory can
    launch on a GPU of limits ``lim``: its shared memory within the per-block maximum, and its
    registers (up to 255 per thread, allocated as 256) within the SM's."""
    return shared_bytes <= lim.shared_per_block and threads * 256 <= lim.registers_per_sm


def blocks_per_sm(lim: GpuLimits, shared_bytes, threads, registers=256):
    """Blocks of ``threads`` threads and ``shared_bytes`` of shared memory one SM holds at once
    (0: one does not fit): by shared memory (each block also costs the driver's reserved 1 KB),
    by registers (``registers`` per thread: 256 by default, what the mma.sync kernels' 240-255
    are allocated as), by resident threads and by resident blocks."""
    if not fits(lim, shared_bytes, threads):
        return 0
    return min(lim.shared_per_sm // (shared_bytes + lim.reserved_per_block),
               lim.registers_per_sm // (threads * registers),
               lim.threads_per_sm // threads, lim.blocks_per_sm)


def sm_count(cc, device=None):
    """SMs of the GPU: on a GPU, device ``device``'s multiprocessor count (asked once per
    device); in the CPU emulation (or without a device) the typical count of ``cc``
    (:data:`LIMITS`)."""
    from numba import config

    if config.ENABLE_CUDASIM or device is None:
        return limits(cc).sms
    return _device_sms(device)


@functools.cache
def _device_sms(device):
    from numbatc.interop import devices

    return int(devices.gpu(device).MULTIPROCESSOR_COUNT)
