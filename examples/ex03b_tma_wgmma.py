"""Level 3b (Hopper, sm_90a): TMA tensor copies feed wgmma directly.  One warpgroup computes
D (64 x 64, fp32) = A (64 x 128) @ B (128 x 64) in bf16; each operand tile is one
``cp.async.bulk.tensor`` load of a 64 x 64 box with 128B swizzle, which the tensor core reads
from shared memory as it landed.

Run:  python examples/ex03b_tma_wgmma.py      (an H100/H200, or the CPU emulation:
      NUMBA_ENABLE_CUDASIM=1 python examples/ex03b_tma_wgmma.py)

What it teaches (after level 3, which placed every 16-byte chunk itself with plain bulk copies):
- A tensor map (``TensorMap.tiled``, built on the host) describes the tensor in global memory
  and the box one instruction moves: here (64 rows, 64 bf16 = 128 bytes) with 128B swizzle.
  One thread issues ``tma_load(smem, offset, tmap, (k, row), bar, 0)`` -- coordinates innermost
  first -- and the TMA unit writes the whole 8 KB box in the 128B swizzle pattern: exactly the
  K-major layout a wgmma descriptor with 128B swizzle names (LBO/SBO from ``SmemLayout``), so no
  thread touches the data.  The box's shared-memory base must be 1024-byte aligned.
- Completion is counted in bytes on an mbarrier: ``arrive.expect_tx`` promises the four boxes'
  ``4 * tmap.box_bytes`` bytes and the phase flips when they have all landed.
- The 16-byte rule: a tensor copy's innermost start (here k, in bf16 elements) times the element
  size must be a multiple of 16 bytes, or the GPU raises CUDA_ERROR_ILLEGAL_INSTRUCTION.  k tiles
  of 64 elements start at 0 and 128 bytes; ``TensorMap.check_start`` checks a start on the host,
  and the emulation refuses a copy that breaks the rule.
"""

import numpy as np
from numba import cuda, types

import intrinsics as nt
from intrinsics.tensormap import TensorMap
from intrinsics.layout import SmemLayout, accumulator_coords

# NOTE: after `import intrinsics`, which gives the CPU emulation its own to_fixed_tuple.
from numba.cuda.np.unsafe.ndarray import to_fixed_tuple  # noqa: E402

M, N, K, BK = 64, 64, 128, 64
MMA = nt.wgmma_mma_async(64, "bf16", "bf16", "f32")
LAYOUT = SmemLayout("K", 128, 64, BK, 2)  # 64 rows x 64 bf16 (128 bytes), 128B swizzle
LBO, SBO = LAYOUT.lbo, LAYOUT.sbo
TILE_BYTES = 64 * BK * 2  # one box: 8192 bytes
K_TILES = K // BK
SMEM_BYTES = 2 * K_TILES * TILE_BYTES  # A's and B^T's k tiles


@cuda.jit
def tma_wgmma(tma_a, tma_bt, out):
    # [A k-tile 0 | A k-tile 1 | B^T k-tile 0 | B^T k-tile 1], each (64, 64) bf16, 128B swizzle
    smem = cuda.shared.array(SMEM_BYTES, np.uint8, alignment=1024)
    bar = cuda.shared.array(1, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    if t == 0:
        nt.mbarrier_init(bar, 0, 1)
        nt.fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        nt.tensormap_fence_acquire(tma_a)  # the host wrote the maps: acquire them once
        nt.tensormap_fence_acquire(tma_bt)
        nt.mbarrier_arrive_expect_tx(bar, 0, 2 * K_TILES * TILE_BYTES)
        for kt in range(K_TILES):  # coords (k, row), innermost first; k * 2 bytes: 0, 128
            nt.tma_load(smem, kt * TILE_BYTES, tma_a, (kt * BK, 0), bar, 0)
            nt.tma_load(smem, (K_TILES + kt) * TILE_BYTES, tma_bt, (kt * BK, 0), bar, 0)
    nt.mbarrier_wait_parity(bar, 0, 0)

    zeros = cuda.local.array(32, np.float32)
    for i in range(32):
        zeros[i] = 0
    acc = to_fixed_tuple(zeros, 32)
    nt.wgmma_fence()
    for kt in range(K_TILES):
        for ks in range(BK // 16):  # K steps of 16: +32 bytes inside the swizzle atom
            da = nt.smem_desc(smem, kt * TILE_BYTES + ks * 32, LBO, SBO, 128)
            db = nt.smem_desc(smem, (K_TILES + kt) * TILE_BYTES + ks * 32, LBO, SBO, 128)
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
    a, a_bits = bf16_values(gen, (M, K))
    b, b_bits = bf16_values(gen, (K, N))
    a_dev = cuda.to_device(a_bits)
    bt_dev = cuda.to_device(np.ascontiguousarray(b_bits.T))  # (N, K): K-major
    tma_a = TensorMap.tiled(a_dev, (64, BK), dtype="bf16", swizzle=128)
    tma_bt = TensorMap.tiled(bt_dev, (64, BK), dtype="bf16", swizzle=128)
    assert tma_a.box_bytes == tma_bt.box_bytes == TILE_BYTES
    for kt in range(K_TILES):  # the starts the kernel uses obey the 16-byte rule
        tma_a.check_start((kt * BK, 0))
        tma_bt.check_start((kt * BK, 0))
    regs = cuda.to_device(np.full((128, 32), np.nan, dtype=np.float32))
    tma_wgmma[1, 128](tma_a.device, tma_bt.device, regs)
    rows, cols = accumulator_coords(64)
    d = np.full((M, N), np.nan)
    d[rows, cols] = regs.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.max(np.abs(d - ref)) / np.max(np.abs(ref))
    if verbose:
        print(f"TMA boxes (64, {BK}) bf16, 128B swizzle, {tma_a.box_bytes} B each; wgmma "
              f"descriptors LBO {LBO} B, SBO {SBO} B; max relative error {err:.2e}")
    return bool(err < 1e-5)


KERNELS = [(tma_wgmma, (types.uint64[:], types.uint64[:], types.float32[:, :]), "sm_90a")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)
