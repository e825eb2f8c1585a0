"""A tile staged through shared memory as numbatc's sm80 GEMM epilogue does it (st_shared_b32
per lane at a swizzled row address, syncwarp, then ld_shared_v4_b32 + st_global_v4_b32 of whole
16-byte chunks), run by the emulation and GPU tests, with its expected result on the host."""

import numpy as np
from numba import cuda

import intrinsics as nt


def staged_kernel(out, x):
    """Each warp stages its 64 words as 8 rows of two 16-byte chunks: lane l writes word l % 4 of
    chunk ``half`` of row l // 4, at byte row * 32 + (chunk ^ (row % 2)) * 16 + (l % 4) * 4 (the
    chunk XOR-swizzled by the row).  Then lanes 0-15 read one chunk each (undoing the swizzle)
    and store it: out[64 w + 4 k .. 64 w + 4 k + 3] = the warp's logical chunk k."""
    words = cuda.shared.array(128, np.uint32)
    t = cuda.threadIdx.x
    lane = t % 32
    base = (t // 32) * 256  # this warp's 256 bytes
    for half in range(2):
        row, chunk = lane // 4, half
        b = base + row * 32 + ((chunk ^ (row % 2)) * 16) + (lane % 4) * 4
        nt.st_shared_b32(words, b // 4, np.uint32(x[2 * t + half]))
    cuda.syncwarp()
    if lane < 16:
        row, chunk = lane // 2, lane % 2
        v = nt.ld_shared_v4_b32(words, (base + row * 32 + (chunk ^ (row % 2)) * 16) // 4)
        nt.st_global_v4_b32(out, (t // 32) * 64 + lane * 4, v)


def expected_staged(x):
    """out of :func:`staged_kernel` for input ``x`` (uint32, 2 words per thread)."""
    out = np.zeros_like(x)
    for t in range(len(x) // 2):
        w, lane = divmod(t, 32)
        for half in range(2):
            row, chunk = lane // 4, half
            # logical position: row, chunk, word lane % 4 -> out word 64 w + (2 row + chunk) * 4
            out[64 * w + (2 * row + chunk) * 4 + lane % 4] = x[2 * t + half]
    return out
