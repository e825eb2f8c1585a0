"""Level 3 (Hopper, sm_90a): the bulk copy engine + mbarrier + wgmma: one warpgroup computes
D (64 x 64, fp32) = A (64 x 64) @ B (64 x 64) in bf16, with both operands read by the tensor
core straight from 128B-swizzled shared memory.

Run:  python examples/ex03_bulk_copy_wgmma.py      (an H100/H200, or the CPU emulation:
      NUMBA_ENABLE_CUDASIM=1 python examples/ex03_bulk_copy_wgmma.py)

What it teaches:
- ``cp.async.bulk`` copies (the TMA unit's plain form) complete on an mbarrier by *bytes*: one
  thread arms the barrier with ``arrive.expect_tx(16384)``, every copy subtracts its bytes, and
  the phase flips when all 16 KB have landed.  Each 16-byte chunk goes straight to its swizzled
  place: row r's chunk j lands at ``r * 128 + ((j ^ (r % 8)) * 16)`` -- the same 128B pattern
  the wgmma descriptor names, so the tensor core reads it back conflict-free.
  (The tensor form of TMA, ``cp.async.bulk.tensor``, does this placement by itself from a
  tensor map: level 3b, examples/ex03b_tma_wgmma.py.)
- wgmma reads A and B through 64-bit shared-memory descriptors (start address, LBO, SBO,
  swizzle).  Advancing K by 16 elements inside the 128-byte swizzle atom is adding 32 bytes to
  the start address.
- The accumulator lives in registers: 32 floats per thread, thread t of the warpgroup holding
  rows 16*(t/32) + (t%32)/4 (+8) and columns 8*(v/4) + 2*(t%4) + v%2.
"""

import numpy as np
from numba import cuda, types

import intrinsics as nt
from intrinsics.layout import SmemLayout, accumulator_coords

# NOTE: after `import intrinsics`, which gives the CPU emulation its own to_fixed_tuple.
from numba.cuda.np.unsafe.ndarray import to_fixed_tuple  # noqa: E402

MMA = nt.wgmma_mma_async(64, "bf16", "bf16", "f32")
LAYOUT = SmemLayout("K", 128, 64, 64, 2)  # 64 rows x 64 bf16 (128 bytes), 128B swizzle
LBO, SBO = LAYOUT.lbo, LAYOUT.sbo
TILE_BYTES = 8192


@cuda.jit
def wgmma_tile(a, bt, out):
    smem = cuda.shared.array(16384, np.uint8, alignment=1024)  # A at 0, B^T at 8192
    bar = cuda.shared.array(1, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    if t == 0:
        nt.mbarrier_init(bar, 0, 1)
        nt.fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        nt.mbarrier_arrive_expect_tx(bar, 0, 2 * TILE_BYTES)
    cuda.syncthreads()

    # 1024 chunks of 16 bytes (512 of A, 512 of B^T), each to its swizzled place.
    for q in range(t, 1024, 128):
        which = q // 512
        r = (q % 512) // 8
        j = q % 8
        dst = which * TILE_BYTES + nt.swizzle_offset(r * 128 + j * 16, 128)
        if which == 0:
            nt.bulk_copy_g2s(smem, dst, a, r * 64 + j * 8, 16, bar, 0)
        else:
            nt.bulk_copy_g2s(smem, dst, bt, r * 64 + j * 8, 16, bar, 0)
    nt.mbarrier_wait_parity(bar, 0, 0)

    zeros = cuda.local.array(32, np.float32)
    for i in range(32):
        zeros[i] = 0
    acc = to_fixed_tuple(zeros, 32)
    nt.wgmma_fence()
    for ks in range(4):  # K = 64 in steps of 16: +32 bytes inside the swizzle atom
        da = nt.smem_desc(smem, ks * 32, LBO, SBO, 128)
        db = nt.smem_desc(smem, TILE_BYTES + ks * 32, LBO, SBO, 128)
        acc = MMA(acc, da, db, 1)
    nt.wgmma_commit_group()
    nt.wgmma_wait_group(0)
    acc = nt.wgmma_fence_operand(acc)
    for i in range(32):
        out[t, i] = acc[i]


def bf16_values(gen, shape):
    """Random values exact in bfloat16 (multiples of 1/8 in [-4, 4]) and their bf16 bits: the
    upper half of each float32 (the lower half is zero for them), so no bf16 library is needed."""
    x = gen.integers(-32, 33, size=shape).astype(np.float32) / 8
    return x, (x.view(np.uint32) >> 16).astype(np.uint16)


def run(verbose=True):
    gen = np.random.default_rng()
    a, a_bits = bf16_values(gen, (64, 64))
    b, b_bits = bf16_values(gen, (64, 64))
    regs = cuda.to_device(np.full((128, 32), np.nan, dtype=np.float32))
    wgmma_tile[1, 128](
        cuda.to_device(a_bits.ravel()),
        cuda.to_device(np.ascontiguousarray(b_bits.T).ravel()),
        regs,
    )
    rows, cols = accumulator_coords(64)
    d = np.full((64, 64), np.nan)
    d[rows, cols] = regs.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.max(np.abs(d - ref)) / np.max(np.abs(ref))
    if verbose:
        print(f"descriptor: LBO {LBO} B, SBO {SBO} B, 128B swizzle; max relative error {err:.2e}")
    return bool(err < 1e-5)


KERNELS = [(wgmma_tile, (types.uint16[:], types.uint16[:], types.float32[:, :]), "sm_90a")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)
