"""Level 6: attention -- softmax(Q K^T / sqrt(d)) V with P never leaving the registers.

Run:  python examples/ex06_attention.py
      (no GPU: NUMBA_ENABLE_CUDASIM=1 python examples/ex06_attention.py, about 15 s)

Part 1, one warp, one tile: 16 queries attend to 16 keys, head_dim 16, bf16 in, fp32 softmax.

    S = Q K^T      one ldmatrix.x4 gives Q's A fragment; K (keys x dims, row-major) is already
                   the B operand "column-major" layout, so a plain ldmatrix.x4 gives the B
                   fragments of keys 0-7 and 8-15; two mma.sync m16n8k16.
    softmax        lane l holds rows l/4 and l/4 + 8 of S, columns 2(l%4), 2(l%4) + 1 of each n8
                   tile: a row lives in the four lanes of a quad, so its max and sum take two
                   shfl.bfly steps (lane masks 1 and 2).
    O = P V        the C fragments of keys 0-7 and 8-15, packed to bf16 pairs, ARE the A fragment
                   of one m16k16 step (same rows, same column pairs): no shared-memory round trip.
                   V (keys x dims, row-major) is a row-major B operand: ldmatrix.x4.trans.

Part 2: ``numbatc.attention`` -- the same idea tiled (FlashAttention 2: a loop over key tiles with
an online softmax, cp.async double buffering, causal masking aligned bottom-right, GQA) -- on a
small problem, checked against NumPy in float64.
"""

import math

import numpy as np
from numba import cuda, types

import intrinsics as nt
import numbatc

MMA = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")


def bf16_bits(x):
    """float -> bf16 bit patterns (uint16), round to nearest even; and the values they hold."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@cuda.jit
def attention_tile(q, k, v, out, scale):
    sq = cuda.shared.array(256, np.uint16, alignment=128)  # 16 queries x 16 dims
    sk = cuda.shared.array(256, np.uint16, alignment=128)  # 16 keys x 16 dims
    sv = cuda.shared.array(256, np.uint16, alignment=128)  # 16 keys x 16 dims
    lane = cuda.threadIdx.x
    for i in range(lane, 256, 32):
        sq[i] = q[i]
        sk[i] = k[i]
        sv[i] = v[i]
    cuda.syncthreads()

    # S = Q K^T: matrices of the x4 are (rows 0-7 | 8-15) x (dims 0-7 | 8-15) of Q, and
    # (keys 0-7, dims 0-7 | 8-15), (keys 8-15, dims 0-7 | 8-15) of K.
    z = np.float32(0)
    qa = nt.ldmatrix_x4(sq, (lane % 16) * 16 + (lane // 16) * 8)
    kb = nt.ldmatrix_x4(sk, ((lane // 16) * 8 + lane % 8) * 16 + ((lane // 8) % 2) * 8)
    s0 = MMA(qa, (kb[0], kb[1]), (z, z, z, z))  # keys 0-7
    s1 = MMA(qa, (kb[2], kb[3]), (z, z, z, z))  # keys 8-15

    # Softmax of rows g (registers 0, 1) and g + 8 (registers 2, 3), across the quad.
    m_a = max(max(s0[0], s0[1]), max(s1[0], s1[1]))
    m_b = max(max(s0[2], s0[3]), max(s1[2], s1[3]))
    for step in (1, 2):
        m_a = max(m_a, nt.shfl_bfly(m_a, step))
        m_b = max(m_b, nt.shfl_bfly(m_b, step))
    p0 = (math.exp((s0[0] - m_a) * scale), math.exp((s0[1] - m_a) * scale),
          math.exp((s0[2] - m_b) * scale), math.exp((s0[3] - m_b) * scale))
    p1 = (math.exp((s1[0] - m_a) * scale), math.exp((s1[1] - m_a) * scale),
          math.exp((s1[2] - m_b) * scale), math.exp((s1[3] - m_b) * scale))
    l_a = p0[0] + p0[1] + p1[0] + p1[1]
    l_b = p0[2] + p0[3] + p1[2] + p1[3]
    for step in (1, 2):
        l_a += nt.shfl_bfly(l_a, step)
        l_b += nt.shfl_bfly(l_b, step)

    # P as the A fragment: (row g, keys 2t..), (row g+8, keys 2t..), (row g, keys 8+2t..), (row g+8, keys 8+2t..)
    pa = (nt.pack_bf16x2(p0[0], p0[1]), nt.pack_bf16x2(p0[2], p0[3]),
          nt.pack_bf16x2(p1[0], p1[1]), nt.pack_bf16x2(p1[2], p1[3]))
    # V's B fragments, transposed on the way: matrices (keys 0-7 | 8-15) x (dims 0-7 | 8-15).
    vb = nt.ldmatrix_x4_trans(sv, (((lane // 8) % 2) * 8 + lane % 8) * 16 + (lane // 16) * 8)
    o0 = MMA(pa, (vb[0], vb[1]), (z, z, z, z))  # dims 0-7
    o1 = MMA(pa, (vb[2], vb[3]), (z, z, z, z))  # dims 8-15

    g, t = lane // 4, (lane % 4) * 2
    out[g, t], out[g, t + 1] = o0[0] / l_a, o0[1] / l_a
    out[g + 8, t], out[g + 8, t + 1] = o0[2] / l_b, o0[3] / l_b
    out[g, 8 + t], out[g, 9 + t] = o1[0] / l_a, o1[1] / l_a
    out[g + 8, 8 + t], out[g + 8, 9 + t] = o1[2] / l_b, o1[3] / l_b


def reference(q, k, v, scale, causal=False):
    """float64 softmax(scale q k^T) v for (seq, dim) matrices; bottom-right causal mask."""
    s = q @ k.T * scale
    if causal:
        sq, sk = s.shape
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p @ v / p.sum(axis=1, keepdims=True)


def part1(gen, verbose):
    (qb, q), (kb, k), (vb, v) = (bf16_bits(gen.standard_normal((16, 16))) for _ in range(3))
    out = cuda.to_device(np.full((16, 16), np.nan, np.float32))
    scale = 1 / math.sqrt(16)
    attention_tile[1, 32](cuda.to_device(qb.ravel()), cuda.to_device(kb.ravel()),
                          cuda.to_device(vb.ravel()), out, np.float32(scale))
    got, want = out.copy_to_host(), reference(q, k, v, scale)
    err = np.abs(got - want).max()
    if verbose:
        print(f"part 1, one warp: max |error| {err:.2e} (P rounded to bf16: <= about 2**-8)")
    return err <= 2.0**-7


def part2(gen, verbose):
    b, sq, sk, hq, hkv, d = 1, 24, 40, 2, 1, 32  # two query heads share one key/value head
    data = [bf16_bits(gen.standard_normal(shape)) for shape in
            ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d))]
    dev = [numbatc.bfloat16(cuda.to_device(bits)) for bits, _ in data]
    out = numbatc.attention(*dev, causal=True)
    got = out.data.copy_to_host()
    got = (got.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    (_, q), (_, k), (_, v) = data
    worst = 0.0
    for h in range(hq):
        want = reference(q[0, :, h], k[0, :, h // (hq // hkv)], v[0, :, h // (hq // hkv)],
                         1 / math.sqrt(d), causal=True)
        worst = max(worst, np.abs(got[0, :, h] - want).max())
    if verbose:
        print(f"part 2, numbatc.attention {b}x{sq}x{hq}x{d} over {sk} keys, causal, GQA: "
              f"max |error| {worst:.2e}")
    return worst <= 2.0**-6


def run(verbose=True):
    gen = np.random.default_rng()
    return bool(part1(gen, verbose) & part2(gen, verbose))


KERNELS = [(attention_tile, (types.uint16[:], types.uint16[:], types.uint16[:],
                             types.float32[:, :], types.float32), "sm_80")]

if __name__ == "__main__":
    ok = run()
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)
