"""The tile walk every GEMM kernel shares, as device code: which output tile (tm, tn) block
``pid`` computes.  Generated kernel modules instantiate it with their tile shape
(``tile_coords = make_tile_coords(BM, BN)``); the functions are closures over the tile shape,
so numba folds it as constants."""

import functools

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

__all__ = ["make_tile_coords"]


@functools.cache
def make_tile_coords(bm, bn):
    """``tile_coords(pid, M, N, group_m) -> (tm, tn)``: GROUP_M rasterisation (blocks walk
    group_m tile-rows at a time so that neighbours share B in L2) for (bm, bn) tiles.

    NOTE: 32-bit unsigned arithmetic, every step truncated: a 64-bit division by a run-time
    value is a subroutine call in SASS (sm80_gemm's kernels had five or six), and a call
    anywhere in a Hopper kernel makes ptxas serialise every wgmma (C7509).  numba widens uint32
    arithmetic to 64 bits; the truncations let LLVM narrow the divisions back to div.u32."""

    @cuda.jit(device=True, forceinline=True)
    def tile_coords(pid, M, N, group_m):
        gm = np.uint32(group_m)
        tiles_m = np.uint32((M + (bm - 1)) // bm)
        tiles_n = np.uint32((N + (bn - 1)) // bn)
        in_group = np.uint32(gm * tiles_n)
        first_m = np.uint32(np.uint32(pid // in_group) * gm)
        size_m = min(np.uint32(tiles_m - first_m), gm)
        in_pos = np.uint32(pid % in_group)
        tm = np.uint32(first_m + np.uint32(in_pos % size_m))
        tn = np.uint32(in_pos // size_m)
        return tm, tn

    return tile_coords
