"""Level 2: cp.async into a 128-byte-swizzled shared tile, ldmatrix into fragments, mma.sync.

Run:  python examples/ex02_ldmatrix_swizzle.py

One warp computes D (16 x 8) = A (16 x 64) @ B (64 x 8) in bf16 with fp32 accumulation.  A and the
transpose of B are 64 bf16 = 128 bytes per row.  Stored plainly, the eight rows an ldmatrix reads
would all start in the same four banks (an 8-way conflict); stored with the 128B swizzle (the
16-byte chunk index XOR row % 8, CuTe's Swizzle<3,4,3>) they land in eight different bank groups.

The tile is filled with 16-byte cp.async copies to swizzled addresses, then four K steps of 16:
ldmatrix.x4 gives the A fragment (matrices: rows 0-7 / 8-15 by k 0-7 / 8-15), ldmatrix.x2 on B^T
gives the B fragment, and mma.sync accumulates.  The example also counts the bank conflicts of one
ldmatrix phase with and without the swizzle.
"""

import numpy as np
from numba import cuda, types

import intrinsics as nt
from intrinsics.layout import swizzle_offset_host

MMA = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")
K = 64
ROW_BYTES = 128  # K bf16 values


@cuda.jit(device=True, inline="always")
def swizzled(row, col):
    """Element index of (row, col) in a 128B-swizzled tile of 64 bf16 per row."""
    return nt.swizzle_offset(row * ROW_BYTES + col * 2, 128) // 2


@cuda.jit
def swizzled_gemm_tile(a, bt, d_out):
    sa = cuda.shared.array(16 * 64, np.uint16, alignment=1024)
    sb = cuda.shared.array(8 * 64, np.uint16, alignment=1024)
    lane = cuda.threadIdx.x
    # Prologue: 16-byte chunks (8 bf16) from global to their swizzled place in shared memory.
    for chunk in range(lane, 16 * 8, 32):
        row, c = chunk // 8, chunk % 8
        nt.cp_async_16(sa, swizzled(row, c * 8), a, row * K + c * 8)
    for chunk in range(lane, 8 * 8, 32):
        row, c = chunk // 8, chunk % 8
        nt.cp_async_16(sb, swizzled(row, c * 8), bt, row * K + c * 8)
    nt.cp_async_commit_group()
    nt.cp_async_wait_group(0)
    cuda.syncthreads()

    # Main loop: four k-steps of 16.
    z = np.float32(0)
    acc = (z, z, z, z)
    for ks in range(K // 16):
        fa = nt.ldmatrix_x4(sa, swizzled(lane % 16, ks * 16 + (lane // 16) * 8))
        fb = nt.ldmatrix_x2(sb, swizzled(lane % 8, ks * 16 + ((lane // 8) % 2) * 8))
        acc = MMA(fa, fb, acc)

    # Epilogue: the accumulator layout, rows g and g+8, columns 2t and 2t+1.
    g = lane // 4
    t = lane % 4
    d_out[g, 2 * t] = acc[0]
    d_out[g, 2 * t + 1] = acc[1]
    d_out[g + 8, 2 * t] = acc[2]
    d_out[g + 8, 2 * t + 1] = acc[3]


def bank_conflicts(swizzle):
    """Worst-case lanes sharing a bank among the 8 row addresses of one ldmatrix matrix."""
    worst = 0
    for col in range(0, K, 8):
        banks = {}
        for row in range(8):
            offset = row * ROW_BYTES + col * 2
            offset = swizzle_offset_host(offset, 128) if swizzle else offset
            for word in range(4):  # each row is 16 bytes = 4 banks
                bank = (offset // 4 + word) % 32
                banks[bank] = banks.get(bank, 0) + 1
        worst = max(worst, max(banks.values()))
    return worst


def bf16_values(gen, shape):
    """Random values exact in bfloat16 (multiples of 1/8 in [-4, 4]) and their bf16 bits: the
    upper half of each float32 (the lower half is zero for them), so no bf16 library is needed."""
    x = gen.integers(-32, 33, size=shape).astype(np.float32) / 8
    return x, (x.view(np.uint32) >> 16).astype(np.uint16)


def run(verbose=True):
    gen = np.random.default_rng()
    a, a_bits = bf16_values(gen, (16, K))
    b, b_bits = bf16_values(gen, (K, 8))
    d = cuda.to_device(np.full((16, 8), np.nan, dtype=np.float32))
    swizzled_gemm_tile[1, 32](
        cuda.to_device(a_bits.ravel()),
        cuda.to_device(np.ascontiguousarray(b_bits.T).ravel()),
        d,
    )
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.max(np.abs(d.copy_to_host() - ref)) / np.max(np.abs(ref))
    if verbose:
        print(f"bank conflicts per ldmatrix phase: {bank_conflicts(False)}-way plain, "
              f"{bank_conflicts(True)}-way swizzled")
        print(f"max relative error vs float64: {err:.2e}")
    return bool(err < 1e-5)


KERNELS = [(swizzled_gemm_tile, (types.uint16[:], types.uint16[:], types.float32[:, :]), "sm_80")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)
