"""Which TMA path works on this GPU: each variant runs in its own process (a fault poisons the
context).  Usage: python scripts/diag/tma_diag.py [variant]

The tensor loads start at column 4 (16 bytes), a legal innermost start; the 'tma-unaligned'
variant starts at column 3 (12 bytes), which faults on the H200 (CUDA_ERROR_ILLEGAL_INSTRUCTION,
measured 2026-12-01) and which every variant used before, hence the old belief that TMA tensor
copies fault there.  The systematic measurement is scripts/tma_rules.py."""

import subprocess
import sys

import numpy as np
from numba import cuda

from intrinsics.mbarrier import fence_mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait_parity
from intrinsics.tensormap import TensorMap
from intrinsics.tma import bulk_copy_g2s, tensormap_fence_acquire, tma_load

R, C = 48, 96
HOST = np.arange(R * C, dtype=np.float32).reshape(R, C)


@cuda.jit
def k_bulk(src, out):
    tile = cuda.shared.array(256, np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64, alignment=8)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 0, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, 0, 1024)
        bulk_copy_g2s(tile, 0, src, 0, 1024, bar, 0)
    mbarrier_wait_parity(bar, 0, 0)
    for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[i] = tile[i]


@cuda.jit
def k_tma(tmap, out, fence, x0):
    tile = cuda.shared.array(256, np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64, alignment=8)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 0, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        if fence:
            tensormap_fence_acquire(tmap)
        mbarrier_arrive_expect_tx(bar, 0, 1024)
        tma_load(tile, 0, tmap, (x0, 5), bar, 0)
    mbarrier_wait_parity(bar, 0, 0)
    for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[i] = tile[i]


def run(variant):
    d = cuda.to_device(HOST)
    out = cuda.to_device(np.zeros(256, np.float32))
    tmap = TensorMap.tiled(d, (16, 16))
    print("map words", " ".join(f"{int(w):016x}" for w in tmap.words[:2]), "addr", hex(d.device_ctypes_pointer.value))
    if variant == "bulk":
        k_bulk[1, 128](d.ravel(), out)
        expected = HOST.ravel()[:256]
    elif variant in ("tma", "tma-nofence", "tma-unaligned"):
        x0 = 3 if variant == "tma-unaligned" else 4
        k_tma[1, 128](tmap.device, out, variant != "tma-nofence", x0)
        expected = HOST[5:21, x0:x0 + 16].ravel()
    elif variant == "tma-const":
        words = tmap.words.copy()

        @cuda.jit
        def k_const(out):
            cmap = cuda.const.array_like(words)
            tile = cuda.shared.array(256, np.float32, alignment=1024)
            bar = cuda.shared.array(1, np.uint64, alignment=8)
            if cuda.threadIdx.x == 0:
                mbarrier_init(bar, 0, 1)
                fence_mbarrier_init()
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                mbarrier_arrive_expect_tx(bar, 0, 1024)
                tma_load(tile, 0, cmap, (4, 5), bar, 0)
            mbarrier_wait_parity(bar, 0, 0)
            for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
                out[i] = tile[i]

        k_const[1, 128](out)
        expected = HOST[5:21, 4:20].ravel()
    cuda.synchronize()
    got = out.copy_to_host()
    print(variant, "wrong elements:", int((got != expected).sum()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for v in ["bulk", "tma", "tma-nofence", "tma-const", "tma-unaligned"]:
            r = subprocess.run([sys.executable, __file__, v], capture_output=True, text=True, timeout=120)
            tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
            print(f"== {v}: exit {r.returncode}\n   " + "\n   ".join(t[:300] for t in tail))
