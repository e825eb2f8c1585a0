"""tcgen05 in the CPU emulation (there is no Blackwell GPU here): MMAs through tensor memory
against NumPy models written from the PTX ISA -- dense kinds exactly for integer-valued inputs,
block-scaled MXFP8 and NVFP4 against a model of the block-scaled formats -- the tcgen05.ld/st
shapes against the fragment table, the builders' device twins, and the protocol mistakes the
emulation must catch (each an EmulationError naming block, warp, lane and the TMEM address).

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation`` (the second pytest
run of the README's test command does)."""

import functools

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

import intrinsics  # noqa: E402,F401  (installs the emulation)
from intrinsics.cluster import fence_proxy_async_shared  # noqa: E402
from intrinsics.emulate.runtime import EmulationError  # noqa: E402
from intrinsics.layout import (  # noqa: E402
    TCGEN05_CP_SHAPES,
    SmemLayout,
    cp_lane_map,
    ldst_coords,
    make_instr_desc_block_scaled_host,
    make_instr_desc_host,
    make_umma_smem_desc_host,
)
from intrinsics.mbarrier import (  # noqa: E402
    fence_mbarrier_init,
    mbarrier_init,
    mbarrier_wait_parity,
)
from intrinsics.smem import shared_address  # noqa: E402
from intrinsics.tcgen05 import (  # noqa: E402
    make_instr_desc,
    make_instr_desc_block_scaled,
    make_umma_smem_desc,
    tcgen05_alloc,
    tcgen05_commit,
    tcgen05_commit_multicast,
    tcgen05_cp,
    tcgen05_dealloc,
    tcgen05_fence_after_thread_sync,
    tcgen05_fence_before_thread_sync,
    tcgen05_ld,
    tcgen05_mma,
    tcgen05_relinquish_alloc_permit,
    tcgen05_st,
    tcgen05_wait_ld,
    tcgen05_wait_ld_regs,
    tcgen05_wait_st,
    tmem_address,
    umma_smem_desc,
)
from numba.cuda.np.unsafe.ndarray import to_fixed_tuple  # noqa: E402  (emulated after install)

WHERE = r"block \(0, 0, 0\) warp \d+ lane \d+"

# ---------------------------------------------------------------------------------------------
# NumPy models of the number formats (written here from the OCP MX / PTX definitions, not
# shared with the emulation)
# ---------------------------------------------------------------------------------------------


def minifloat(codes, exp_bits, man_bits, bias, signed=True):
    codes = np.asarray(codes, dtype=np.int64)
    e = (codes >> man_bits) & ((1 << exp_bits) - 1)
    f = (codes & ((1 << man_bits) - 1)) / 2.0**man_bits
    v = np.where(e == 0, f * 2.0 ** (1 - bias), (1 + f) * 2.0 ** (e - bias))
    if signed:
        v = np.where((codes >> (exp_bits + man_bits)) & 1, -v, v)
    return v


FORMATS = {  # name -> (decode, code bits, byte in an 8-bit container)
    "e4m3": (lambda c: minifloat(c, 4, 3, 7), 8, lambda c: c),
    "e5m2": (lambda c: minifloat(c, 5, 2, 15), 8, lambda c: c),
    "e2m3": (lambda c: minifloat(c, 2, 3, 1), 6, lambda c: c),  # container bits 5-0
    "e3m2": (lambda c: minifloat(c, 3, 2, 3), 6, lambda c: c),
    "e2m1": (lambda c: minifloat(c, 2, 1, 1), 4, lambda c: c << 2),  # container bits 5-2
}


def ue8m0(codes):
    return 2.0 ** (np.asarray(codes, dtype=np.float64) - 127)


def ue4m3(codes):
    return minifloat(codes, 4, 3, 7, signed=False)


def random_codes(rng, fmt, shape):
    """Random finite codes of ``fmt`` (fp8: no NaN/inf, exponent field kept modest)."""
    decode, bits, _ = FORMATS[fmt]
    while True:
        codes = rng.integers(0, 1 << bits, shape)
        if fmt == "e4m3":
            codes = codes & 0xBF  # exponent <= 7: |x| < 2, never NaN
        if fmt == "e5m2":
            codes = codes & 0x8F | 0x30  # exponent 12..15
        if np.isfinite(decode(codes)).all():
            return codes


def bf16_bits(values):
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------------------------
# Dense kinds: one kernel per variant
# ---------------------------------------------------------------------------------------------

ELEM_BYTES = {"f16": 2, "bf16": 2, "tf32": 4}


@functools.cache
def dense_kernel(kind, a_t, b_t, d_t, m, n, k, swizzle, a_from, b_major):
    eb = ELEM_BYTES.get(a_t, 1)
    kstep = 32 // eb
    a_swizzle = swizzle if (k * eb) % max(swizzle, 1) == 0 else 64  # A is always K-major
    la = SmemLayout("K", a_swizzle, m, k, eb)
    lb = SmemLayout(b_major, swizzle, n, k, eb)
    b_at = -(-la.nbytes // 1024) * 1024
    d_cols = n if d_t == "f32" else n // 2
    a_col = 256  # A in TMEM (a_from "tmem"): K bytes of each row in columns 256..
    a_cells = k * eb // 4
    mma = tcgen05_mma(kind, a_from=a_from)
    ld = tcgen05_ld("32x32b", 1 << (d_cols - 1).bit_length())  # D's columns (and a few more)
    st_a = tcgen05_st("32x32b", a_cells)
    idesc = make_instr_desc_host(kind, a_t, b_t, d_t, m=m, n=n, b_major=b_major, a_from=a_from)
    a_off = [la.k_offset(k0) // 4 for k0 in range(0, k, kstep)]
    b_off = [lb.k_offset(k0) // 4 for k0 in range(0, k, kstep)]
    steps = len(a_off)

    @cuda.jit
    def kernel(a_img, b_img, a_rows, out):
        smem = cuda.shared.array(0, dtype=np.uint32)
        slot = cuda.shared.array(1, dtype=np.uint32)
        bars = cuda.shared.array(1, dtype=np.uint64)
        t = cuda.threadIdx.x
        warp = t // 32
        w0 = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4
        wb = w0 + b_at // 4
        for i in range(t, a_img.size, 128):
            smem[w0 + i] = a_img[i]
        for i in range(t, b_img.size, 128):
            smem[wb + i] = b_img[i]
        fence_proxy_async_shared()
        if t == 0:
            mbarrier_init(bars, 0, 1)
            fence_mbarrier_init()
        if warp == 0:
            tcgen05_alloc(slot, 0, 512)
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        tcgen05_fence_after_thread_sync()
        d = slot[0]
        if a_from == "tmem":  # each thread stores the row of A in its TMEM lane
            st_a(d + ((32 * warp) << 16) + a_col, to_fixed_tuple(a_rows[t], a_cells))
            tcgen05_wait_st()
            tcgen05_fence_before_thread_sync()
            cuda.syncthreads()
            tcgen05_fence_after_thread_sync()
        if t == 0:
            for ks in range(steps):
                if a_from == "tmem":
                    a = d + a_col + 8 * ks
                else:
                    a = umma_smem_desc(smem, w0 + a_off[ks], la.lbo, la.sbo, a_swizzle)
                db = umma_smem_desc(smem, wb + b_off[ks], lb.lbo, lb.sbo, swizzle)
                mma(d, a, db, idesc, ks)
            tcgen05_commit(bars, 0)
        mbarrier_wait_parity(bars, 0, 0)
        tcgen05_fence_after_thread_sync()
        regs = tcgen05_wait_ld_regs(ld(d + ((32 * warp) << 16)))
        for i in range(d_cols):
            out[t, i] = regs[i]
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        if warp == 0:
            tcgen05_dealloc(d, 512)

    kernel.layouts, kernel.d_cols, kernel.b_at = (la, lb), d_cols, b_at
    return kernel


def dense_operands(rng, kind, fmt, rows, k):
    """(values float64 (rows, k), raw element bits) of one operand, integer-valued for 16/32-bit
    types (exact sums) and random finite codes for the 8-bit-container kinds."""
    if fmt in ("f16", "bf16", "tf32"):
        x = rng.integers(-8, 9, (rows, k)).astype(np.float64)
        if fmt == "f16":
            return x, x.astype(np.float16).view(np.uint16)
        if fmt == "bf16":
            return x, bf16_bits(x)
        return x, x.astype(np.float32).view(np.uint32)  # tf32: exact small integers
    codes = random_codes(rng, fmt, (rows, k))
    decode, _, container = FORMATS[fmt]
    return decode(codes), container(codes).astype(np.uint8)


@pytest.mark.parametrize("kind, a_t, b_t, d_t, m, n, k, swizzle, a_from, b_major", [
    ("f16", "bf16", "bf16", "f32", 128, 64, 64, 128, "smem", "K"),    # 128xNx16 x 4 K-steps
    ("f16", "f16", "f16", "f16", 64, 32, 32, 64, "smem", "K"),        # layout F, packed f16 D
    ("f16", "bf16", "bf16", "f32", 128, 64, 32, 128, "smem", "MN"),   # B MN-major
    ("tf32", "tf32", "tf32", "f32", 128, 32, 32, 32, "tmem", "K"),    # A from tensor memory
    ("f8f6f4", "e4m3", "e2m3", "f32", 128, 48, 64, 0, "smem", "K"),   # fp6 in 8-bit containers
    ("f8f6f4", "e5m2", "e2m1", "f32", 64, 16, 32, 32, "smem", "K"),   # fp4 in 8-bit containers
], ids=lambda v: str(v))
def test_dense_mma_through_tmem_matches_numpy(kind, a_t, b_t, d_t, m, n, k, swizzle, a_from,
                                              b_major):
    rng = np.random.default_rng()
    kernel = dense_kernel(kind, a_t, b_t, d_t, m, n, k, swizzle, a_from, b_major)
    la, lb = kernel.layouts
    a, a_bits = dense_operands(rng, kind, a_t, m, k)
    b, b_bits = dense_operands(rng, kind, b_t, n, k)
    a_img = la.place(a_bits).view(np.uint32)
    b_img = lb.place(b_bits).view(np.uint32)
    a_rows = np.zeros((128, 128), dtype=np.uint32)
    a_rows[:m, : k * a_bits.itemsize // 4] = np.ascontiguousarray(a_bits).view(np.uint32)
    out = np.full((128, kernel.d_cols), 0xFFFFFFFF, dtype=np.uint32)
    kernel[1, 128, 0, 1024 + kernel.b_at + lb.nbytes](a_img, b_img, a_rows, out)

    ref = a @ b.T  # exact in float64 for these inputs
    if m == 128:
        got_rows = out  # layout D: row i in lane i
    else:  # layout F: rows 16w..16w+15 in lanes 32w..32w+15
        got_rows = np.concatenate([out[32 * w: 32 * w + 16] for w in range(4)])
    if d_t == "f32":
        np.testing.assert_array_equal(got_rows.view(np.float32), ref.astype(np.float32))
    else:  # two f16 per cell, the even column in the low half
        halves = np.stack([got_rows & 0xFFFF, got_rows >> 16], axis=-1).reshape(m, n)
        np.testing.assert_array_equal(halves.astype(np.uint16).view(np.float16),
                                      ref.astype(np.float16))


# ---------------------------------------------------------------------------------------------
# Block-scaled kinds: MXFP8 (mxf8f6f4, ue8m0) and NVFP4 (mxf4nvf4, ue4m3), M=128
# ---------------------------------------------------------------------------------------------


def sf_chunk(scales):
    """The 512-byte scale-factor chunk of 128 rows x 4 blocks (CUTLASS / DeepGEMM layout that
    tcgen05.cp .32x128b.warpx4 copies): row r, block j at byte 16*(r%32) + 4*(r/32) + j."""
    chunk = np.zeros(512, dtype=np.uint8)
    rows = np.arange(scales.shape[0])[:, None]
    j = np.arange(scales.shape[1])[None, :]
    chunk[16 * (rows % 32) + 4 * (rows // 32) + j] = scales
    return chunk


@functools.cache
def scaled_kernel(kind, scale_vec, a_t, b_t, scale, n, k):
    m = 128
    k_inst = 32 if kind == "mxf8f6f4" else 64  # K of one instruction
    count = {"mxf8f6f4": 1, "mxf4": 2}.get(kind, 4 if scale_vec in ("4X", "block16") else 2)
    packed = kind in ("mxf4", "mxf4nvf4")
    k_bytes = k // 2 if packed else k
    steps = k // k_inst
    chunks = -(-(steps * count) // 4)  # 4 scale bytes per row per chunk
    swizzle = 64 if k_bytes % 64 == 0 else 32
    la = SmemLayout("K", swizzle, m, k_bytes, 1)
    lb = SmemLayout("K", swizzle, n, k_bytes, 1)
    b_at = -(-la.nbytes // 1024) * 1024
    sf_at = b_at + -(-lb.nbytes // 1024) * 1024  # SFA chunks, then SFB chunks (512 B each)
    sfa_col, sfb_col = n, n + 4 * chunks  # TMEM: D in 0..n-1, then the scale factors
    mma = tcgen05_mma(kind, scale_vec=scale_vec)
    cp = tcgen05_cp("32x128b.warpx4")
    ld = tcgen05_ld("32x32b", 1 << (n - 1).bit_length())
    a_offs = [la.k_offset(32 * s) // 4 for s in range(steps)]  # 32 bytes of K per instruction
    b_offs = [lb.k_offset(32 * s) // 4 for s in range(steps)]
    # instruction s uses scale blocks count*s .. count*s+count-1: chunk (count*s)//4, byte %4
    idescs = [make_instr_desc_block_scaled_host(
        kind, a_t, b_t, scale, m=m, n=n, scale_vec=scale_vec,
        sfa_id=(count * s) % 4, sfb_id=(count * s) % 4) for s in range(steps)]
    sf_cols = [4 * ((count * s) // 4) for s in range(steps)]

    @cuda.jit
    def kernel(a_img, b_img, sf_img, out):
        smem = cuda.shared.array(0, dtype=np.uint32)
        slot = cuda.shared.array(1, dtype=np.uint32)
        bars = cuda.shared.array(1, dtype=np.uint64)
        t = cuda.threadIdx.x
        warp = t // 32
        w0 = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4
        for i in range(t, a_img.size, 128):
            smem[w0 + i] = a_img[i]
        for i in range(t, b_img.size, 128):
            smem[w0 + b_at // 4 + i] = b_img[i]
        for i in range(t, sf_img.size, 128):
            smem[w0 + sf_at // 4 + i] = sf_img[i]
        fence_proxy_async_shared()
        if t == 0:
            mbarrier_init(bars, 0, 1)
            fence_mbarrier_init()
        if warp == 0:
            tcgen05_alloc(slot, 0, 256)
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        tcgen05_fence_after_thread_sync()
        d = slot[0]
        if t == 0:
            for c in range(chunks):  # scale factors: shared memory -> TMEM, 4 columns a chunk
                cp(d + sfa_col + 4 * c, umma_smem_desc(smem, w0 + (sf_at + 512 * c) // 4, 16,
                                                       128, 0))
                cp(d + sfb_col + 4 * c,
                   umma_smem_desc(smem, w0 + (sf_at + 512 * (chunks + c)) // 4, 16, 128, 0))
            for s in range(steps):  # tcgen05.cp then tcgen05.mma by one thread: in order
                da = umma_smem_desc(smem, w0 + a_offs[s], la.lbo, la.sbo, swizzle)
                db = umma_smem_desc(smem, w0 + b_at // 4 + b_offs[s], lb.lbo, lb.sbo, swizzle)
                mma(d, da, db, idescs[s], d + sfa_col + sf_cols[s], d + sfb_col + sf_cols[s], s)
            tcgen05_commit(bars, 0)
        mbarrier_wait_parity(bars, 0, 0)
        tcgen05_fence_after_thread_sync()
        regs = tcgen05_wait_ld_regs(ld(d + ((32 * warp) << 16)))
        for i in range(n):
            out[t, i] = regs[i]
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        if warp == 0:
            tcgen05_dealloc(d, 256)

    kernel.shape = (m, n, k, k_inst, k_inst // count, chunks, packed, la, lb, sf_at)
    return kernel


def _scaled_operand(rng, fmt, rows, k, packed):
    codes = random_codes(rng, fmt, (rows, k))
    decode, _, container = FORMATS[fmt]
    if packed:  # two e2m1 per byte, the lower K in the low nibble
        raw = (codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint8)
    else:
        raw = container(codes).astype(np.uint8)
    return decode(codes), raw


@pytest.mark.parametrize("kind, scale_vec, a_t, b_t, scale, n, k", [
    ("mxf8f6f4", None, "e4m3", "e2m1", "ue8m0", 64, 128),    # MXFP8 x MXFP4(unpacked), 1X
    ("mxf8f6f4", "1X", "e5m2", "e3m2", "ue8m0", 32, 64),
    ("mxf4nvf4", "4X", "e2m1", "e2m1", "ue4m3", 32, 128),    # NVFP4: 16-element blocks, ue4m3
    ("mxf4nvf4", "block32", "e2m1", "e2m1", "ue8m0", 48, 128),  # MXFP4 through mxf4nvf4, 2X
    ("mxf4", "2X", "e2m1", "e2m1", "ue8m0", 16, 64),
], ids=lambda v: str(v))
def test_block_scaled_mma_matches_the_model(kind, scale_vec, a_t, b_t, scale, n, k):
    rng = np.random.default_rng()
    kernel = scaled_kernel(kind, scale_vec, a_t, b_t, scale, n, k)
    m, n, k, k_inst, block, chunks, packed, la, lb, sf_at = kernel.shape
    a, a_raw = _scaled_operand(rng, a_t, m, k, packed)
    b, b_raw = _scaled_operand(rng, b_t, n, k, packed)
    blocks = k // block
    if scale == "ue8m0":
        sa_codes = rng.integers(124, 131, (m, blocks))
        sb_codes = rng.integers(124, 131, (n, blocks))
        sa, sb = ue8m0(sa_codes), ue8m0(sb_codes)
    else:  # ue4m3 scales with exponents near 1 (any finite code would do)
        sa_codes = rng.integers(0x20, 0x50, (m, blocks))
        sb_codes = rng.integers(0x20, 0x50, (n, blocks))
        sa, sb = ue4m3(sa_codes), ue4m3(sb_codes)
    # the block-scaled product: sum_k a[m,k] sa[m,k/block] * b[n,k] sb[n,k/block], exact in
    # float64 per instruction; the f32 accumulator in TMEM rounds after each instruction
    a_scaled = a * np.repeat(sa, block, axis=1)
    b_scaled = b * np.repeat(sb, block, axis=1)
    ref = np.zeros((m, n), dtype=np.float32)
    for k0 in range(0, k, k_inst):
        part = a_scaled[:, k0: k0 + k_inst] @ b_scaled[:, k0: k0 + k_inst].T
        ref = (ref.astype(np.float64) + part).astype(np.float32)

    sf = np.zeros((2 * chunks, 512), dtype=np.uint8)
    pad_a = np.zeros((128, 4 * chunks), dtype=np.int64)
    pad_a[:, :blocks] = sa_codes
    pad_b = np.zeros((128, 4 * chunks), dtype=np.int64)
    pad_b[:n, :blocks] = sb_codes
    for c in range(chunks):
        sf[c] = sf_chunk(pad_a[:, 4 * c: 4 * c + 4])
        sf[chunks + c] = sf_chunk(pad_b[:, 4 * c: 4 * c + 4])
    a_img = la.place(a_raw).view(np.uint32)
    b_img = lb.place(b_raw).view(np.uint32)
    out = np.full((128, n), 0xFFFFFFFF, dtype=np.uint32)
    kernel[1, 128, 0, 1024 + sf_at + sf.size](a_img, b_img, sf.reshape(-1).view(np.uint32), out)
    np.testing.assert_array_equal(out[:, :n].view(np.float32), ref)


# ---------------------------------------------------------------------------------------------
# tcgen05.ld / tcgen05.st shapes against the fragment table
# ---------------------------------------------------------------------------------------------


@functools.cache
def ldst_kernel(shape, num):
    regs = len(ldst_coords(shape, num)[1][0])
    ld, st = tcgen05_ld(shape, num), tcgen05_st(shape, num)
    ld32, st32 = tcgen05_ld("32x32b", 64), tcgen05_st("32x32b", 64)
    half = 16 if shape != "32x32b" else 0

    @cuda.jit
    def kernel(pattern, values, loaded, stored):
        slot = cuda.shared.array(1, dtype=np.uint32)
        t = cuda.threadIdx.x
        warp = t // 32
        if warp == 0:
            tcgen05_alloc(slot, 0, 128)
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        tcgen05_fence_after_thread_sync()
        mine = slot[0] + ((32 * warp) << 16)
        # 1. cells (lane, col) = pattern through the plain 32x32b shape; read with `shape`
        st32(mine, to_fixed_tuple(pattern[t], 64))
        tcgen05_wait_st()
        r = tcgen05_wait_ld_regs(ld(mine + (half << 16)))
        for i in range(regs):
            loaded[t, i] = r[i]
        # 2. store `values` with `shape` into columns 64.., read back with 32x32b
        st(mine + (half << 16) + 64, to_fixed_tuple(values[t], regs))
        tcgen05_wait_st()
        r2 = ld32(mine + 64)
        tcgen05_wait_ld()
        for i in range(64):
            stored[t, i] = r2[i]
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        if warp == 0:
            tcgen05_dealloc(slot[0], 128)

    kernel.regs, kernel.half = regs, half
    return kernel


@pytest.mark.parametrize("shape, num", [("32x32b", 8), ("16x64b", 4), ("16x128b", 2),
                                        ("16x256b", 2)])
def test_ld_st_shapes_follow_the_fragment_table(shape, num):
    kernel = ldst_kernel(shape, num)
    regs, half = kernel.regs, kernel.half
    lanes = np.arange(128)[:, None]
    pattern = (lanes * 1000 + np.arange(64)[None, :]).astype(np.uint32)  # cell (lane, col)
    values = np.random.default_rng().integers(0, 2**32, (128, regs), dtype=np.uint32)
    loaded = np.zeros((128, regs), dtype=np.uint32)
    stored = np.zeros((128, 64), dtype=np.uint32)
    kernel[1, 128](pattern, values, loaded, stored)

    dl, dc = ldst_coords(shape, num)
    for warp in range(4):
        base = 32 * warp + half
        t = slice(32 * warp, 32 * warp + 32)
        np.testing.assert_array_equal(loaded[t], pattern[base + dl, dc])
        cells = np.zeros((128, 64), dtype=np.uint32)
        cells[base + dl, dc] = values[t]
        touched = np.zeros((128, 64), dtype=bool)
        touched[base + dl, dc] = True
        rows = slice(32 * warp, 32 * warp + 32)
        np.testing.assert_array_equal(stored[rows][touched[rows]], cells[rows][touched[rows]])
    if shape == "16x256b":  # the mma.sync m16n8 accumulator layout, by hand: lane 5 = g1, c1
        got = [(int(dl[5, r]), int(dc[5, r])) for r in range(4)]
        assert got == [(1, 2), (1, 3), (9, 2), (9, 3)]


# ---------------------------------------------------------------------------------------------
# tcgen05.cp shapes and the multicast commit
# ---------------------------------------------------------------------------------------------


@functools.cache
def cp_kernel(shape):
    rows, row_bytes = TCGEN05_CP_SHAPES[shape]
    cp = tcgen05_cp(shape)
    ld = tcgen05_ld("32x32b", 8)

    @cuda.jit
    def kernel(src, out):
        smem = cuda.shared.array(1024, dtype=np.uint32, alignment=1024)
        slot = cuda.shared.array(1, dtype=np.uint32)
        bars = cuda.shared.array(1, dtype=np.uint64)
        t = cuda.threadIdx.x
        warp = t // 32
        for i in range(t, src.size, 128):
            smem[i] = src[i]
        fence_proxy_async_shared()
        if t == 0:
            mbarrier_init(bars, 0, 1)
            fence_mbarrier_init()
        if warp == 0:
            tcgen05_alloc(slot, 0, 32)
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        tcgen05_fence_after_thread_sync()
        d = slot[0]
        if t == 0:  # K-major, no swizzle: 8-row x 16-byte core matrices, LBO 128, SBO 8 rows
            cp(d + 8, umma_smem_desc(smem, 0, 128, 8 * row_bytes, 0))
            tcgen05_commit(bars, 0)
        mbarrier_wait_parity(bars, 0, 0)
        tcgen05_fence_after_thread_sync()
        regs = tcgen05_wait_ld_regs(ld(d + ((32 * warp) << 16) + 8))
        for i in range(8):
            out[t, i] = regs[i]
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        if warp == 0:
            tcgen05_dealloc(d, 32)

    return kernel


@pytest.mark.parametrize("shape", list(TCGEN05_CP_SHAPES))
def test_cp_places_rows_per_the_lane_map(shape):
    rows, row_bytes = TCGEN05_CP_SHAPES[shape]
    words = row_bytes // 4
    data = np.random.default_rng().integers(0, 2**32, (rows, words), dtype=np.uint32)
    # the no-swizzle K-major source: byte c of row r at (r % 8) * 16 + (r / 8) * SBO + c % 16 +
    # (c / 16) * LBO, with LBO 128 (the next core matrix) and SBO 8 * row_bytes
    src = np.zeros(4096 // 4, dtype=np.uint32)
    for r in range(rows):
        for c in range(words):
            byte = (r % 8) * 16 + (r // 8) * 8 * row_bytes + (4 * c) % 16 + (4 * c // 16) * 128
            src[byte // 4] = data[r, c]
    out = np.full((128, 8), 0xFFFFFFFF, dtype=np.uint32)
    cp_kernel(shape)[1, 128](src, out)
    expect = np.full((128, 8), 0xFFFFFFFF, dtype=np.uint32)  # fresh TMEM reads 0xFFFFFFFF
    for r, lanes in enumerate(cp_lane_map(shape)):
        for lane in lanes:
            expect[lane, :words] = data[r]
    np.testing.assert_array_equal(out, expect)


def test_multicast_commit_arrives_on_every_masked_cta():
    """CTA 0 of a 2-CTA cluster commits with mask 0b11: both CTAs' mbarriers complete."""
    from intrinsics.cluster import cluster_ctarank, cluster_sync
    from intrinsics.launch import launch

    @cuda.jit
    def kernel(out):
        bars = cuda.shared.array(1, dtype=np.uint64)
        t = cuda.threadIdx.x
        rank = cluster_ctarank()
        if t == 0:
            mbarrier_init(bars, 0, 1)
            fence_mbarrier_init()
        cluster_sync()
        if rank == 0 and t == 0:
            tcgen05_commit_multicast(bars, 0, 3)
        mbarrier_wait_parity(bars, 0, 0)
        out[rank, t] = 1
        cluster_sync()

    out = np.zeros((2, 32), dtype=np.int32)
    launch(kernel, 2, 32, (out,), cluster=(2, 1, 1))
    assert (out == 1).all()


# ---------------------------------------------------------------------------------------------
# The builders' device twins run as Python under the simulator
# ---------------------------------------------------------------------------------------------


def test_device_builders_match_the_host_builders():
    @cuda.jit
    def kernel(out):
        smem = cuda.shared.array(256, dtype=np.uint32, alignment=16)
        out[0] = make_instr_desc(1, 1, 1, 128, 256, 0, 1, 1, 0)
        out[1] = make_instr_desc_block_scaled(1, 1, 0, 128, 64, 0, 0, 0, 1, 0, 0)
        out[2] = make_umma_smem_desc(shared_address(smem, 8), 16, 1024, 128)
        out[3] = umma_smem_desc(smem, 8, 16, 1024, 128)
        out[4] = tmem_address(96, 17)

    out = np.zeros(5, dtype=np.uint64)
    kernel[1, 1](out)
    assert out[0] == make_instr_desc_host("f16", "bf16", m=128, n=256, b_major="MN",
                                          negate_a=True)
    assert out[1] == make_instr_desc_block_scaled_host("mxf4nvf4", "e2m1", scale="ue4m3", m=128,
                                                       n=64, scale_vec="4X", negate_b=True)
    assert out[2] == out[3] == make_umma_smem_desc_host(int(out[2] & 0x3FFF) << 4, 16, 1024, 128)
    assert out[4] == (96 << 16 | 17)


# ---------------------------------------------------------------------------------------------
# Protocol mistakes
# ---------------------------------------------------------------------------------------------


@functools.cache
def protocol_kernel(ncols=64, dealloc=True, ld_lane_warp=None, relinquish_first=False,
                    dealloc_cols=None, read_before_wait=False, read_uncommitted=False,
                    ld_column=0):
    """One warp-0 alloc, optional mistakes, and (unless told otherwise) a matching dealloc."""
    ld = tcgen05_ld("32x32b", 4)
    mma = tcgen05_mma("f16")
    idesc = make_instr_desc_host("f16", "bf16", m=128, n=64)

    @cuda.jit
    def kernel(n, out):
        slot = cuda.shared.array(1, dtype=np.uint32)
        tile = cuda.shared.array(8192, dtype=np.uint32)
        bars = cuda.shared.array(1, dtype=np.uint64)
        t = cuda.threadIdx.x
        warp = t // 32
        if t == 0:
            mbarrier_init(bars, 0, 1)
        if warp == 0:
            if relinquish_first:
                tcgen05_relinquish_alloc_permit()
            tcgen05_alloc(slot, 0, n)
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        tcgen05_fence_after_thread_sync()
        d = slot[0]
        if read_uncommitted and t == 0:
            desc = umma_smem_desc(tile, 0, 16, 1024, 128)
            mma(d, desc, desc, idesc, 0)
        cuda.syncthreads()
        lane = 32 * (warp if ld_lane_warp is None else ld_lane_warp)
        if warp == 1 or ld_lane_warp is None:
            r = ld(d + (lane << 16) + ld_column)
            if not read_before_wait:
                tcgen05_wait_ld()
            out[t] = r[0]
        tcgen05_fence_before_thread_sync()
        cuda.syncthreads()
        if warp == 0 and dealloc:
            tcgen05_dealloc(d, dealloc_cols or n)

    return kernel


def run_protocol(n=64, **switches):
    out = np.zeros(128, dtype=np.uint32)
    protocol_kernel(**switches)[1, 128](n, out)
    return out


def test_the_protocol_kernel_passes_when_used_correctly():
    """Used correctly, the protocol runs to the end: each of the 4 warps loads its own 32 TMEM
    lanes of the fresh allocation, which reads 0xFFFFFFFF in the emulation (out starts at 0)."""
    for n in (64, 512):
        out = run_protocol(n=n)
        assert (out == 0xFFFFFFFF).all(), (n, np.flatnonzero(out != 0xFFFFFFFF))


def test_wrong_warp_tmem_access_names_warp_lane_and_address():
    with pytest.raises(EmulationError, match=(
            WHERE + r": tcgen05.ld.sync.aligned.32x32b.x4.b32 at TMEM address 0x00000000 "
            r"\(lane 0, column 0\) touches TMEM lanes 0..31, but warp 1 \(warp 1 of its "
            r"warpgroup\) may access lanes 32..63 only")):
        run_protocol(ld_lane_warp=0)


def test_missing_dealloc_is_reported_at_block_end():
    with pytest.raises(EmulationError, match=(
            r"block \(0, 0, 0\) warp 0 lane 0: the CTA exited with tensor memory still "
            r"allocated: 64 columns at TMEM address 0x00000000")):
        run_protocol(dealloc=False)


@pytest.mark.parametrize("n", [48, 16, 1024])
def test_alloc_needs_a_power_of_two_from_32_to_512(n):
    with pytest.raises(EmulationError, match=(
            WHERE + r": tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32: the column "
            rf"count must be a power of two in 32..512 \(one of \[32, 64, 128, 256, 512\]\), "
            rf"got {n}")):
        run_protocol(n=n)


def test_alloc_after_relinquish_is_refused():
    with pytest.raises(EmulationError, match="after .* executed tcgen05.relinquish_alloc_permit"):
        run_protocol(relinquish_first=True)


def test_dealloc_must_match_the_allocation():
    with pytest.raises(EmulationError, match=(
            r"tcgen05.dealloc.* of 32 columns at TMEM address 0x00000000 .* does not match an "
            r"allocation.*columns 0..63")):
        run_protocol(dealloc_cols=32)


def test_reading_loaded_registers_before_wait_ld_is_refused():
    with pytest.raises(EmulationError, match=(
            WHERE + r": reads register 0 of the registers tcgen05.ld.* returned before "
            r"tcgen05.wait::ld")):
        run_protocol(read_before_wait=True)


def test_unallocated_columns_are_refused():
    with pytest.raises(EmulationError, match=(
            WHERE + r": tcgen05.ld.* at TMEM address 0x00[0246]00040 touches column 64, which is "
            r"not allocated")):
        run_protocol(ld_column=64)


def test_reading_an_uncommitted_mma_result_is_refused():
    with pytest.raises(EmulationError, match=(
            WHERE + r": tcgen05.ld.* touches TMEM lanes .* that tcgen05.mma.cta_group::1."
            r"kind::f16 issued by block \(0, 0, 0\) warp 0 lane 0 writes, and that thread has "
            r"not committed it")):
        run_protocol(read_uncommitted=True)
