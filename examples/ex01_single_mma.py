"""Level 1: a single mma.sync, with constants you can read, and which lane holds what.

Run:  python examples/ex01_single_mma.py

One warp computes D = A @ B for m16n8k16 in bf16 with fp32 accumulation.  A[i, k] = 16*i + k and B
is the identity on its first 8 rows, so D[i, n] = 16*i + n: every accumulator value names its own
(row, column).  Each lane builds its A and B registers from the PTX ISA's fragment table
(g = lane // 4, t = lane % 4: A register 0 holds row g, columns 2t and 2t+1 ...), and the example
prints where each lane's four results landed -- the table every tensor-core kernel is built on.
"""

import numpy as np
from numba import cuda, types

import intrinsics as nt

MMA = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")


@cuda.jit
def single_mma(d_out):
    lane = cuda.threadIdx.x
    g = lane // 4
    t = lane % 4
    # A fragment: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..) -- values 16*row + col.
    a0 = nt.pack_bf16x2(16.0 * g + 2 * t, 16.0 * g + 2 * t + 1)
    a1 = nt.pack_bf16x2(16.0 * (g + 8) + 2 * t, 16.0 * (g + 8) + 2 * t + 1)
    a2 = nt.pack_bf16x2(16.0 * g + 2 * t + 8, 16.0 * g + 2 * t + 9)
    a3 = nt.pack_bf16x2(16.0 * (g + 8) + 2 * t + 8, 16.0 * (g + 8) + 2 * t + 9)
    # B fragment: register 0 holds B[2t, g], B[2t+1, g]; register 1 holds B[2t+8, g], B[2t+9, g].
    b0 = nt.pack_bf16x2(1.0 if 2 * t == g else 0.0, 1.0 if 2 * t + 1 == g else 0.0)
    b1 = nt.pack_bf16x2(0.0, 0.0)
    z = np.float32(0)
    d = MMA((a0, a1, a2, a3), (b0, b1), (z, z, z, z))
    for i in range(4):
        d_out[lane, i] = d[i]


def expected():
    a = np.arange(16)[:, None] * 16.0 + np.arange(16)[None, :]
    b = np.zeros((16, 8))
    b[np.arange(8), np.arange(8)] = 1.0
    return a @ b


def run(verbose=True):
    d = cuda.to_device(np.full((32, 4), np.nan, dtype=np.float32))
    single_mma[1, 32](d)
    got = d.copy_to_host()
    ref = expected()
    ok = True
    for lane in range(32):
        g, t = lane // 4, lane % 4
        places = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
        if verbose and lane < 8:
            cells = ", ".join(f"D[{r:2d},{c}]={v:5.0f}" for (r, c), v in zip(places, got[lane]))
            print(f"lane {lane:2d} holds {cells}")
        ok &= all(got[lane, i] == ref[r, c] for i, (r, c) in enumerate(places))
    if verbose:
        print("... (every lane l: rows l//4 and l//4+8, columns 2*(l%4) and 2*(l%4)+1)")
    return ok


KERNELS = [(single_mma, (types.float32[:, :],), "sm_80")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL: a lane holds a value that is not 16*row + col")
    raise SystemExit(0 if ok else 1)
