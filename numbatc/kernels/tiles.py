"""The tile walk every GEMM kernel shares, as device code: which output tile (tm, tn) block
``pid`` computes.  Generated kernel modules instantiate it with their tile shape
(``tile_coords = make_tile_coords(BM, BN)``); the functions are closures over the tile shape,
so numba folds it as constants.  Also the attention kernels' paged KV-cache loader
(:func:`make_paged_kv_loader`) and the mma.sync kernels' product pairs (:func:`make_mma_pairs`)."""

import functools

import numpy as np
from numba import cuda  # a module global: the simulator swaps it in device functions

import intrinsics as nt

__all__ = ["make_mma_pairs", "make_paged_kv_lookahead", "make_paged_kv_loader",
           "make_tile_coords"]


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


@functools.cache
def make_paged_kv_loader(rows, pitch, swizzled, chunks, real_chunks, threads):
    """``load_kv_paged(smem, ks, vs, k, v, k_head, v_head, key0, rlim, t, bt, bt_row,
    page_size, pages, k_sp, k_ss, v_sp, v_ss)``: this thread's 16-byte cp.async copies of one
    (rows x chunks) K tile and the V tile of the same keys from a paged KV cache (the attention
    kernels' KV-cache variants, numbatc.attention_with_kvcache).

    Tile row r is key ``key0 + r`` of the sequence, which lives at page ``bt[bt_row + key //
    page_size]`` (clamped to 0 .. pages - 1: no entry sends a copy outside k or v), row ``key %
    page_size``; its chunk c comes from ``k[page * k_sp + row * k_ss + k_head + 8 c]`` (v alike)
    and goes to ``smem[ks + soff(r, c)]`` (``vs``).  Rows at or past ``rlim`` and the padding
    chunks (c >= real_chunks) are zero-filled without a lookup.  Shared rows are ``pitch``
    elements, 16-byte chunk c of row r stored at chunk c ^ (r % 8) where ``swizzled`` (the
    attention kernels' shared_layout).

    key0 and page_size must be multiples of 16, so that a 16-row group of the tile lies in one
    page: where the threads cover whole rows (``threads`` a multiple of ``chunks``), each thread
    looks the page up once per 16-row group it copies (its rows r0, r0 + step ... fall in
    16 / step groups' worth of lookups), and K and V share the lookup; otherwise once per chunk.
    NOTE: 32-bit division (key // page_size): a 64-bit division by a run-time value is a
    subroutine call (see make_tile_coords)."""
    CH, REAL, T = chunks, real_chunks, threads
    TOTAL = rows * CH
    COPIES = -(-TOTAL // T)
    BY_ROWS = T % CH == 0 and rows % (T // CH) == 0
    STEP = T // CH if BY_ROWS else 0
    PER_LOOKUP = max(1, 16 // STEP) if BY_ROWS else 1  # a thread's rows in one 16-row group
    LOOKUPS = COPIES // PER_LOOKUP
    CP = nt.cp_async_op(16, zfill=True)

    @cuda.jit(device=True, forceinline=True)
    def soff(r, c):
        if swizzled:
            return np.int32(r * pitch + ((c ^ (r & 7)) << 3))
        return np.int32(r * pitch + (c << 3))

    @cuda.jit(device=True, forceinline=True)
    def page_of(key, bt, bt_row, page_size, pages):
        """(page, row in the page) of a key (0 <= key < 2**31)."""
        blk = np.uint32(np.uint32(key) // np.uint32(page_size))
        page = min(max(np.int64(bt[bt_row + np.int64(blk)]), 0), pages - 1)
        return page, np.int64(np.uint32(np.uint32(key) - np.uint32(blk * np.uint32(page_size))))

    @cuda.jit(device=True, forceinline=True)
    def load_kv_paged(smem, ks, vs, k, v, k_head, v_head, key0, rlim, t, bt, bt_row, page_size,
                      pages, k_sp, k_ss, v_sp, v_ss):
        if BY_ROWS:
            r0 = t // CH
            c = t % CH
            for j in range(LOOKUPS):
                rg = r0 + j * PER_LOOKUP * STEP  # the first of this thread's rows in a group
                kg = np.int64(0)
                vg = np.int64(0)
                if rg < rlim:
                    page, prow = page_of(key0 + rg, bt, bt_row, page_size, pages)
                    kg = page * k_sp + prow * k_ss + k_head + c * 8
                    vg = page * v_sp + prow * v_ss + v_head + c * 8
                for i in range(PER_LOOKUP):
                    r = rg + i * STEP
                    if r < rlim and c < REAL:
                        CP(smem, ks + soff(r, c), k, kg + i * STEP * k_ss, 16)
                        CP(smem, vs + soff(r, c), v, vg + i * STEP * v_ss, 16)
                    else:
                        CP(smem, ks + soff(r, c), k, 0, 0)
                        CP(smem, vs + soff(r, c), v, 0, 0)
        else:
            for j in range(COPIES):
                i = t + j * T
                if TOTAL % T == 0 or i < TOTAL:
                    r = i // CH
                    c = i % CH
                    if r < rlim and c < REAL:
                        page, prow = page_of(key0 + r, bt, bt_row, page_size, pages)
                        CP(smem, ks + soff(r, c), k, page * k_sp + prow * k_ss + k_head + c * 8,
                           16)
                        CP(smem, vs + soff(r, c), v, page * v_sp + prow * v_ss + v_head + c * 8,
                           16)
                    else:
                        CP(smem, ks + soff(r, c), k, 0, 0)
                        CP(smem, vs + soff(r, c), v, 0, 0)

    return load_kv_paged


@functools.cache
def make_paged_kv_lookahead(rows, pitch, swizzled, chunks, real_chunks, threads):
    """(slots, lookup, issue): :func:`make_paged_kv_loader`'s load in two halves, so that a
    kernel can look the pages of tile n + 1 up while tile n is computed (the lookups' global
    loads then wait in registers, not in front of the copies).

    ``lookup(pg, key0, rlim, t, bt, bt_row, page_size, pages)`` writes this thread's (page, row
    in the page) pairs of the tile starting at key ``key0`` into ``pg`` (an int32 local array of
    ``2 * slots``); ``issue(smem, ks, vs, k, v, k_head, v_head, pg, rlim, t, k_sp, k_ss, v_sp,
    v_ss)`` makes the copies from them (``rlim`` as the lookup's).  Arguments as
    make_paged_kv_loader's."""
    CH, REAL, T = chunks, real_chunks, threads
    TOTAL = rows * CH
    COPIES = -(-TOTAL // T)
    BY_ROWS = T % CH == 0 and rows % (T // CH) == 0
    STEP = T // CH if BY_ROWS else 0
    PER_LOOKUP = max(1, 16 // STEP) if BY_ROWS else 1
    SLOTS = COPIES // PER_LOOKUP
    CP = nt.cp_async_op(16, zfill=True)

    @cuda.jit(device=True, forceinline=True)
    def soff(r, c):
        if swizzled:
            return np.int32(r * pitch + ((c ^ (r & 7)) << 3))
        return np.int32(r * pitch + (c << 3))

    @cuda.jit(device=True, forceinline=True)
    def lookup(pg, key0, rlim, t, bt, bt_row, page_size, pages):
        c = t % CH
        for j in range(SLOTS):
            if BY_ROWS:
                r = t // CH + j * PER_LOOKUP * STEP
                live = r < rlim
            else:
                i = t + j * T
                r = i // CH
                c = i % CH
                live = (TOTAL % T == 0 or i < TOTAL) and r < rlim and c < REAL
            if live:
                key = np.uint32(key0 + r)
                blk = np.uint32(key // np.uint32(page_size))
                page = min(max(np.int64(bt[bt_row + np.int64(blk)]), 0), pages - 1)
                pg[2 * j] = np.int32(page)
                pg[2 * j + 1] = np.int32(np.uint32(key - np.uint32(blk * np.uint32(page_size))))

    @cuda.jit(device=True, forceinline=True)
    def issue(smem, ks, vs, k, v, k_head, v_head, pg, rlim, t, k_sp, k_ss, v_sp, v_ss):
        if BY_ROWS:
            r0 = t // CH
            c = t % CH
            for j in range(SLOTS):
                rg = r0 + j * PER_LOOKUP * STEP
                page = np.int64(pg[2 * j])
                prow = np.int64(pg[2 * j + 1])
                kg = page * k_sp + prow * k_ss + k_head + c * 8
                vg = page * v_sp + prow * v_ss + v_head + c * 8
                for i in range(PER_LOOKUP):
                    r = rg + i * STEP
                    if r < rlim and c < REAL:
                        CP(smem, ks + soff(r, c), k, kg + i * STEP * k_ss, 16)
                        CP(smem, vs + soff(r, c), v, vg + i * STEP * v_ss, 16)
                    else:
                        CP(smem, ks + soff(r, c), k, 0, 0)
                        CP(smem, vs + soff(r, c), v, 0, 0)
        else:
            for j in range(COPIES):
                i = t + j * T
                if TOTAL % T == 0 or i < TOTAL:
                    r = i // CH
                    c = i % CH
                    if r < rlim and c < REAL:
                        page = np.int64(pg[2 * j])
                        prow = np.int64(pg[2 * j + 1])
                        CP(smem, ks + soff(r, c), k, page * k_sp + prow * k_ss + k_head + c * 8,
                           16)
                        CP(smem, vs + soff(r, c), v, page * v_sp + prow * v_ss + v_head + c * 8,
                           16)
                    else:
                        CP(smem, ks + soff(r, c), k, 0, 0)
                        CP(smem, vs + soff(r, c), v, 0, 0)

    return SLOTS, lookup, issue


@functools.cache
def make_mma_pairs(ptx_type):
    """``(mma_pair, ldsm_pair, ldsm_pair_t)`` for m16n8k16 mma.sync of ``ptx_type`` ('bf16' or
    'f16') inputs into float32: two products of one A fragment with the two B fragments (n8 tiles
    j and j + 1) that one ldmatrix.x4 gives::

        c0, c1 = mma_pair(a, fb, c0, c1)             # fb: an ldmatrix_x4's four registers
        c0, c1 = ldsm_pair(a, smem, addr, c0, c1)    # fb = ldmatrix_x4(smem, addr) first
        c0, c1 = ldsm_pair_t(a, smem, addr, c0, c1)  # ... ldmatrix_x4_trans

    The same instructions as the statements written out (PTX opcode counts equal), in one
    statement of the generated kernels instead of three with four tuple reads and two tuple
    builds: numba types and lowers each statement on its own (issue 18: with the fragment
    intrinsics for the softmax steps, the portable attention's kernels compile 17-39 % faster,
    docs/PERFORMANCE.md).  (sm80_gemm's main loop, whose B fragments serve several row tiles,
    gained nothing measurable: not used there.)"""
    mma = nt.mma_sync("m16n8k16", ptx_type, ptx_type, "f32")

    @cuda.jit(device=True, forceinline=True)
    def mma_pair(a, fb, c0, c1):
        return mma(a, (fb[0], fb[1]), c0), mma(a, (fb[2], fb[3]), c1)

    @cuda.jit(device=True, forceinline=True)
    def ldsm_pair(a, smem, addr, c0, c1):
        fb = nt.ldmatrix_x4(smem, addr)
        return mma(a, (fb[0], fb[1]), c0), mma(a, (fb[2], fb[3]), c1)

    @cuda.jit(device=True, forceinline=True)
    def ldsm_pair_t(a, smem, addr, c0, c1):
        fb = nt.ldmatrix_x4_trans(smem, addr)
        return mma(a, (fb[0], fb[1]), c0), mma(a, (fb[2], fb[3]), c1)

    return mma_pair, ldsm_pair, ldsm_pair_t
