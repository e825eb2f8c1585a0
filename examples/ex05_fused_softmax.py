"""Level 5: softmax with warp shuffles, then softmax fused into a tensor-core GEMM.

Run:  python examples/ex05_fused_softmax.py

Part 1 is a row softmax written here in full: one warp per row, each lane strides over the row
keeping its own maximum, then five butterfly shuffles (``shfl.sync.bfly`` with lane offsets 16, 8,
4, 2, 1) leave the warp's maximum in every lane -- no shared memory, no barrier.  The same for the
sum of ``exp(x - max)`` (subtracting the maximum keeps exp from overflowing), then each lane
writes its elements divided by the sum.

Part 2 calls ``numbatc.gemm_softmax(a, b, scale=...)``: ``softmax(scale * a @ b)`` for rows that
fit one tile (N <= 256, a classifier head or the scores of a short sequence).  A block owns whole
rows, so the row maximum and sum are reduced in the GEMM's epilogue (over the four lanes of a quad
that share a row, then over the warps holding the row's other columns) and the logits are never
written to memory.  Both are checked against NumPy in float64.
"""

import math

import numpy as np
from numba import cuda, types

import intrinsics as nt
import numbatc

NEG = np.float32(-math.inf)


@cuda.jit
def warp_softmax(x, out):
    """out[r, :] = softmax(x[r, :]); block (32, 4): warp w of block b owns row 4 b + w."""
    lane = cuda.threadIdx.x
    row = cuda.blockIdx.x * 4 + cuda.threadIdx.y
    n = x.shape[1] if row < x.shape[0] else 0  # every lane still joins the shuffles
    m = NEG
    for c in range(lane, n, 32):
        m = max(m, x[row, c])
    for offset in (16, 8, 4, 2, 1):  # butterfly: after 5 steps every lane has the maximum
        m = max(m, nt.shfl_bfly(m, offset))
    s = np.float32(0)
    for c in range(lane, n, 32):
        s += math.exp(x[row, c] - m)
    for offset in (16, 8, 4, 2, 1):
        s += nt.shfl_bfly(s, offset)
    for c in range(lane, n, 32):
        out[row, c] = math.exp(x[row, c] - m) / s


def softmax64(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def run(verbose=True):
    gen = np.random.default_rng()
    # Part 1: the warp-shuffle softmax, rows longer than a warp and a last block half full.
    x = (3 * gen.standard_normal((6, 70))).astype(np.float32)
    out = cuda.to_device(np.full(x.shape, np.nan, np.float32))
    warp_softmax[(x.shape[0] + 3) // 4, (32, 4)](cuda.to_device(x), out)
    err1 = float(np.max(np.abs(out.copy_to_host() - softmax64(x))))
    if verbose:
        print(f"warp-shuffle softmax of {x.shape[0]} rows of {x.shape[1]}: max |error| = {err1:.2e}")

    # Part 2: softmax(scale * a @ b), fused into the tensor-core GEMM.
    m, k, n = 20, 32, 24
    a = gen.standard_normal((m, k)).astype(np.float16)
    b = gen.standard_normal((k, n)).astype(np.float16)
    scale = 1 / math.sqrt(k)
    probs = numbatc.gemm_softmax(cuda.to_device(a), cuda.to_device(b), scale=scale,
                                 out=cuda.to_device(np.full((m, n), np.nan, np.float32)))
    got = probs.copy_to_host()
    err2 = float(np.max(np.abs(got - softmax64(scale * (a.astype(np.float64) @ b)))))
    if verbose:
        print(f"numbatc.gemm_softmax ({m}x{k}) @ ({k}x{n}): max |error| = {err2:.2e}, "
          f"rows sum to 1 within {float(np.max(np.abs(got.sum(axis=1) - 1))):.1e}")
    return err1 < 1e-6 and err2 < 1e-6


KERNELS = [(warp_softmax, (types.float32[:, :], types.float32[:, :]), "sm_80")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL: a softmax differs from the float64 reference")
    raise SystemExit(0 if ok else 1)
