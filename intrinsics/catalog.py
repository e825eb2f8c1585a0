"""A probe kernel for every intrinsic form, with the architectures that claim it.

``probes()`` yields :class:`Probe` objects: a small kernel that uses one instruction form, its
signature, the :class:`~intrinsics._core.Arch` that accepts it and the PTX text it must produce.
The CPU compile tests and ``python -m numbatc`` (without a GPU) compile each probe for every
architecture in :data:`intrinsics.toolchain.ARCHS`, check the PTX and assemble it with nvJitLink.
"""

from dataclasses import dataclass, field

import numpy as np
from numba import cuda, types
from numba.np import numpy_support

import intrinsics.convert as cv
import intrinsics.cp_async as ca
import intrinsics.ldmatrix as lm
import intrinsics.tcgen05 as tc
from intrinsics._core import SM75, SM80, SM89
from intrinsics.mma import mma_block_scale_specs, mma_specs, mma_sync, mma_sync_block_scale

__all__ = ["Probe", "probes"]


@dataclass(frozen=True)
class Probe:
    family: str
    name: str
    kernel: object
    signature: tuple
    arch: object
    expected: tuple = field(default=())


_ACC_DTYPE = {"f32": np.float32, "f16": np.uint32, "s32": np.int32, "f64": np.float64}


def _mma_probe(spec):
    mma = mma_sync(spec.shape, spec.a, spec.b, spec.acc)
    zero = _ACC_DTYPE[spec.acc](0)
    # Registers come from memory so that nothing folds away.
    if spec.a == "f64":
        def kernel(out, a):
            d = mma(a[0], a[1], (a[2], a[3]))
            out[0] = d[0]
            out[1] = d[1]

        return kernel, (types.float64[:], types.float64[:])
    if spec.a_regs == 4:
        def load(a):
            return (a[0], a[1], a[2], a[3]), (a[4], a[5])
    else:
        def load(a):
            return (a[0], a[1]), a[4]
    load = cuda.jit(device=True, inline="always")(load)
    if spec.c_regs == 4:
        def kernel(out, a):
            fa, fb = load(a)
            d = mma(fa, fb, (zero, zero, zero, zero))
            for i in range(4):
                out[i] = d[i]
    else:
        def kernel(out, a):
            fa, fb = load(a)
            d = mma(fa, fb, (zero, zero))
            for i in range(2):
                out[i] = d[i]
    out_t = numpy_support.from_dtype(np.dtype(_ACC_DTYPE[spec.acc]))[:]
    return kernel, (out_t, types.uint32[:])


def _mma_probes():
    for spec in mma_specs():
        kernel, sig = _mma_probe(spec)
        name = f"{spec.shape}.{spec.acc}.{spec.a}.{spec.b}"
        yield Probe("mma.sync", name, kernel, sig, spec.arch, (spec.ptx,))


def _mma_block_scale_probe(spec):
    mma = mma_sync_block_scale(spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b, spec.acc,
                               spec.scale_type)
    zero = np.float32(0)

    def kernel(out, a):
        d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (zero, zero, zero, zero), a[6], a[7],
                0, 0, 0, 0)
        for i in range(4):
            out[i] = d[i]

    return kernel, (types.float32[:], types.uint32[:])


def _mma_block_scale_probes():
    for spec in mma_block_scale_specs():
        kernel, sig = _mma_block_scale_probe(spec)
        name = f"{spec.shape}.{spec.kind}.{spec.scale_vec}.{spec.a}.{spec.b}.{spec.scale_type}"
        yield Probe("mma.sync.block_scale", name, kernel, sig, spec.arch,
                    (spec.ptx + " {", ", {0, 0}, "))


def _ldmatrix_probe(op, num, trans):
    ld = op == "ldmatrix"
    fn = lm.ldmatrix_op(num, trans) if ld else lm.stmatrix_op(num, trans)

    if ld:
        def kernel(out):
            tile = cuda.shared.array(256, np.uint16, alignment=16)
            lane = cuda.threadIdx.x
            r = fn(tile, (lane % 16) * 8)
            if num == 1:
                out[lane] = r
            else:
                for i in range(num):
                    out[lane * num + i] = r[i]
    else:
        def kernel(out):
            tile = cuda.shared.array(256, np.uint16, alignment=16)
            lane = cuda.threadIdx.x
            if num == 1:
                fn(tile, lane * 8, out[lane])
            elif num == 2:
                fn(tile, lane * 8, (out[lane], out[lane + 1]))
            else:
                fn(tile, lane * 8, (out[lane], out[lane + 1], out[lane + 2], out[lane + 3]))
            cuda.syncthreads()
            out[lane] = tile[lane]
    return kernel


def _ldmatrix_probes():
    for (op, num, trans), arch in sorted(lm.LDMATRIX_FORMS.items()):
        ptx = f"{op}.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
        kernel = _ldmatrix_probe(op, num, trans)
        name = f"x{num}{'.trans' if trans else ''}"
        yield Probe(op, name, kernel, (types.uint32[:],), arch, (ptx,))

    def movmatrix(out):
        out[0] = lm.movmatrix_trans(out[1])

    yield Probe("movmatrix", "m8n8.trans.b16", movmatrix, (types.uint32[:],), SM75,
                ("movmatrix.sync.aligned.m8n8.trans.b16",))


def _cp_async_probe(cache, size, zfill):
    fn = ca.cp_async_op(size, cache, zfill)
    words = size // 4
    if zfill:
        def kernel(out, src):
            smem = cuda.shared.array(256, np.uint32, alignment=16)
            lane = cuda.threadIdx.x
            fn(smem, lane * words, src, lane * words, src[0])
            ca.cp_async_commit_group()
            ca.cp_async_wait_group(0)
            out[lane] = smem[lane]
    else:
        def kernel(out, src):
            smem = cuda.shared.array(256, np.uint32, alignment=16)
            lane = cuda.threadIdx.x
            fn(smem, lane * words, src, lane * words)
            ca.cp_async_commit_group()
            ca.cp_async_wait_all()
            out[lane] = smem[lane]
    return kernel


def _cp_async_probes():
    for cache, size in ca.CP_ASYNC_FORMS:
        for zfill in (False, True):
            kernel = _cp_async_probe(cache, size, zfill)
            tail = f", {size}, %r" if zfill else f", {size};"
            wait = "cp.async.wait_group 0;" if zfill else "cp.async.wait_all;"
            name = f"{cache}.{size}{'.zfill' if zfill else ''}"
            yield Probe("cp.async", name, kernel, (types.uint32[:], types.int32[:]), SM80,
                        (f"cp.async.{cache}.shared.global", tail, "cp.async.commit_group;", wait))


def _cp_async_mbarrier_probe(fn):
    def kernel(out, src):
        smem = cuda.shared.array(64, np.uint32, alignment=16)
        bars = cuda.shared.array(1, np.uint64, alignment=8)
        ca.cp_async_16(smem, 0, src, 0)
        fn(bars, 0)
        out[0] = smem[0]

    return kernel


def _cp_async_mbarrier_probes():
    for noinc, fn in ((False, ca.cp_async_mbarrier_arrive), (True, ca.cp_async_mbarrier_arrive_noinc)):
        kernel = _cp_async_mbarrier_probe(fn)
        name = "mbarrier.arrive" + (".noinc" if noinc else "")
        yield Probe("cp.async", name, kernel, (types.uint32[:], types.int32[:]), SM80,
                    (f"cp.async.{name}.shared::cta.b64",))


def _convert_probes():
    def pairs(out, f):
        out[0] = cv.pack_bf16x2(f[0], f[1])
        out[1] = cv.pack_f16x2(f[0], f[1])
        out[2] = cv.cvt_tf32(f[2])
        a, b = cv.unpack_bf16x2(out[3])
        c, d = cv.unpack_f16x2(out[4])
        f[0] = a + b + c + d + cv.f32_from_bits(out[5])
        out[6] = cv.bits_from_f32(f[3])

    def fp8(out, f):
        out[0] = cv.pack_e4m3x4(f[0], f[1], f[2], f[3])
        out[1] = cv.pack_e5m2x4(f[0], f[1], f[2], f[3])

    sig = (types.uint32[:], types.float32[:])
    yield Probe("convert", "bf16x2/f16x2/tf32", pairs, sig, SM80,
                ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "cvt.rna.tf32.f32", "cvt.f32.f16"))
    yield Probe("convert", "e4m3x4/e5m2x4", fp8, sig, SM89,
                ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"))

    def fragments(out, f):
        p = (f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7])
        (a,) = cv.frag_pack_bf16x2(p)
        (b,) = cv.frag_pack_f16x2(p)
        out[0] = a[0] ^ a[3] ^ b[1] ^ b[2]

    yield Probe("convert", "whole fragments: bf16x2 / f16x2 A fragments", fragments, sig, SM80,
                ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32"))


def _mbarrier_probes():
    import intrinsics.mbarrier as mb
    from intrinsics._core import SM90

    def kernel(out, a):
        bars = cuda.shared.array(2, np.uint64, alignment=8)
        mb.mbarrier_init(bars, 0, a[0])
        mb.fence_mbarrier_init()
        state = mb.mbarrier_arrive(bars, 0)
        state += mb.mbarrier_arrive_count(bars, 0, a[1])
        state += mb.mbarrier_arrive_expect_tx(bars, 0, a[2])
        mb.mbarrier_expect_tx(bars, 0, a[2])
        mb.mbarrier_complete_tx(bars, 0, a[2])
        mb.mbarrier_arrive_cluster(bars, 1, a[3])
        ok = mb.mbarrier_test_wait(bars, 0, state) and mb.mbarrier_test_wait_parity(bars, 0, a[4])
        ok = ok and mb.mbarrier_try_wait_parity(bars, 0, a[4])
        mb.mbarrier_wait_parity(bars, 0, a[4])
        mb.mbarrier_inval(bars, 0)
        out[0] = ok

    yield Probe("mbarrier", "all operations", kernel, (types.uint64[:], types.uint32[:]), SM90,
                ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity",
                 "fence.mbarrier_init.release.cluster", "mbarrier.inval"))


def _barrier_probes():
    import intrinsics.barrier as br

    def kernel(out, n):
        br.named_barrier_sync(1, 256)
        br.named_barrier_arrive(2, 128)
        br.named_barrier_sync(15, n[0])  # a run-time count
        out[0] = n[0]

    yield Probe("barrier", "named sync/arrive", kernel, (types.uint32[:], types.uint32[:]), SM75,
                ("barrier.sync.aligned 1,", "barrier.arrive.aligned 2,",
                 "barrier.sync.aligned 15,"))


def _global_memory_probes():
    import intrinsics.atomic as at
    import intrinsics.convert as cvt
    import intrinsics.gmem as gm
    import intrinsics.smem as sm

    def kernel(counters, out, x):
        old = at.atomic_add_global(counters, 0, np.int32(1))
        gm.st_global_b32(out, 2 * old, cvt.pack_bf16x2(x[0], x[1]))

    yield Probe("global memory", "atomic add, 32-bit store", kernel,
                (types.CPointer(types.int32), types.CPointer(types.uint16), types.float32[:]),
                SM75, ("atom.global.add", "st.global.b32"))

    def staged(out, x):
        # a warp's 32 words into shared memory, read back as 16-byte rows, stored 16 bytes a lane
        words = cuda.shared.array(64, np.uint32)
        t = cuda.threadIdx.x
        sm.st_shared_b32(words, t, np.uint32(x[t]))
        cuda.syncwarp()
        gm.st_global_v4_b32(out, 4 * t, sm.ld_shared_v4_b32(words, 4 * (t % 8)))

    yield Probe("global memory", "staged: 32-bit shared store, 16-byte shared load and global "
                "store", staged, (types.CPointer(types.uint32), types.uint32[:]), SM75,
                ("st.shared.b32", "ld.shared.v4.b32", "st.global.v4.b32"))


def _fastmath_probes():
    import intrinsics.fastmath as fm

    def kernel(x):
        x[0] = fm.ex2_approx(fm.fma_f32(x[1], x[2], x[3])) + fm.tanh_approx(x[4])

    yield Probe("fast math", "ex2.approx.ftz, fma.rn, tanh.approx", kernel, (types.float32[:],),
                SM75, ("ex2.approx.ftz.f32", "fma.rn.f32", "tanh.approx.f32"))

    def fragments(x, lim):
        s = fm.frag_mask_cols((x[0], x[1], x[2], x[3]), lim[0], lim[1])
        p = fm.frag_scale_rows(fm.frag_exp2_fma(s, x[4], x[5], x[6]), x[7], x[8])
        x[0], x[1] = fm.frag_row_sums(p)
        x[2], x[3], x[4], x[5] = fm.frag_exp2(s, x[9], x[10], x[11])

    yield Probe("fast math", "whole fragments: mask, ex2(fma), row scale, row sums, exp2f",
                fragments, (types.float32[:], types.int32[:]), SM75,
                ("ex2.approx.ftz.f32", "fma.rn.f32", "selp.f32", "ex2.approx.f32"))

    def columns(x, lim):
        s = fm.frag_mask_cols_from((x[0], x[1], x[2], x[3]), lim[0], lim[1])
        p = fm.frag_exp2_fma_cols(s, x[4], (x[5], x[6]))
        x[0], x[1], x[2], x[3] = fm.frag_mul_diff_cols(p, (x[7], x[8], x[9], x[10]),
                                                       (x[11], x[12]))
        x[4], x[5], x[6], x[7] = fm.frag_exp2_cols(s, x[13], (x[14], x[15]))
        x[8], x[9], x[10], x[11] = fm.frag_mul_diff_rows(p, s, x[16], x[17])

    yield Probe("fast math", "whole fragments by column: mask from, ex2(fma), p * (x - c), "
                "exp2f; p * (x - c) by rows", columns, (types.float32[:], types.int32[:]), SM75,
                ("ex2.approx.ftz.f32", "fma.rn.f32", "selp.f32", "sub.f32", "mul.f32",
                 "ex2.approx.f32"))


    def keys(x, k):
        s = fm.frag_mask_keys((x[0], x[1], x[2], x[3]), k[0], k[1])
        x[0], x[1], x[2], x[3] = fm.frag_mask_keys_causal(s, k[0], k[1], k[2], k[3])

    yield Probe("fast math", "whole fragments: keys masked past the end / the causal diagonal",
                keys, (types.float32[:], types.int64[:]), SM75, ("selp.f32", "0fFF800000"))

def _cluster_probes():
    import intrinsics.cluster as cl
    from intrinsics._core import SM90

    def kernel(out, f):
        smem = cuda.shared.array(32, np.uint32, alignment=16)
        fsmem = cuda.shared.array(32, np.float32, alignment=16)
        rank = cl.cluster_ctarank()
        size = cl.cluster_nctarank()
        cl.fence_proxy_async()
        cl.fence_proxy_async_shared()
        cl.fence_proxy_async_global()
        cl.fence_acq_rel_cluster()
        cl.cluster_arrive_relaxed()
        cl.cluster_wait()
        cl.cluster_sync()
        cl.dsmem_store_u32(smem, 0, (rank + 1) % size, rank)
        cl.dsmem_store_f32(fsmem, 1, (rank + 1) % size, f[0])
        out[0] = cl.dsmem_load_u32(smem, 0, 0) + cl.map_shared_rank(smem, 2, 0)
        f[1] = cl.dsmem_load_f32(fsmem, 1, 0)
        out[1] = cl.elect_sync()

    yield Probe("cluster", "fences, barrier, DSMEM, elect", kernel,
                (types.uint32[:], types.float32[:]), SM90,
                ("barrier.cluster.arrive", "barrier.cluster.wait", "mapa.shared::cluster",
                 "elect.sync", "fence.proxy.async.shared::cta"))


def _setmaxnreg_probes():
    from intrinsics.setmaxnreg import SETMAXNREG_ARCH, setmaxnreg_dec, setmaxnreg_inc

    def kernel(out):
        if cuda.threadIdx.x < 128:
            setmaxnreg_dec(40)
        else:
            setmaxnreg_inc(232)
        out[cuda.threadIdx.x] = 1

    yield Probe("setmaxnreg", "inc/dec", kernel, (types.uint32[:],), SETMAXNREG_ARCH,
                ("setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232"))


def _tma_probe(rank):
    import intrinsics.tma as tma

    coords = {1: lambda c: (c[0],), 2: lambda c: (c[0], c[1]), 3: lambda c: (c[0], c[1], c[2]),
              4: lambda c: (c[0], c[1], c[2], c[3]),
              5: lambda c: (c[0], c[1], c[2], c[3], c[4])}[rank]
    coords = cuda.jit(device=True, inline="always")(coords)

    def kernel(tmap, c, out):
        smem = cuda.shared.array(4096, np.uint8, alignment=1024)
        bars = cuda.shared.array(1, np.uint64, alignment=8)
        tma.tensormap_fence_acquire(tmap)
        tma.tma_load(smem, 0, tmap, coords(c), bars, 0)
        tma.tma_load_multicast(smem, 0, tmap, coords(c), bars, 0, c[5])
        tma.tma_store(tmap, coords(c), smem, 0)
        tma.tma_prefetch(tmap, coords(c))
        tma.bulk_commit_group()
        tma.bulk_wait_group(0)
        tma.bulk_wait_group_read(0)
        out[0] = smem[0]

    return kernel


def _tma_probes():
    import intrinsics.cluster as cl
    import intrinsics.tma as tma
    from intrinsics._core import SM90

    sig = (types.uint64[:], types.int32[:], types.uint8[:])
    for rank in range(1, 6):
        yield Probe("tma", f"{rank}d load/multicast/store/prefetch", _tma_probe(rank), sig, SM90,
                    (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes",
                     ".multicast::cluster", f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group",
                     f"cp.async.bulk.prefetch.tensor.{rank}d.L2.global.tile"))

    def bulk(tmap, c, out):
        smem = cuda.shared.array(4096, np.uint8, alignment=1024)
        bars = cuda.shared.array(1, np.uint64, alignment=8)
        tma.tma_prefetch_descriptor(tmap)
        tma.bulk_copy_g2s(smem, 0, out, 0, 256, bars, 0)
        tma.bulk_copy_s2g(out, 256, smem, 0, 256)
        tma.bulk_copy_s2s_cluster(smem, 1024, smem, 0, 256, bars, 0, c[0])
        tma.bulk_commit_group()
        tma.bulk_wait_group(0)
        offsets = (np.uint16(c[3]), np.uint16(c[4]))
        tma.tma_load_im2col(smem, 0, tmap, (c[0], c[1], c[2], c[3]), offsets, bars, 0)

    yield Probe("tma", "bulk copies, prefetch, im2col", bulk, sig, SM90,
                ("cp.async.bulk.shared::cluster.global", "cp.async.bulk.global.shared::cta",
                 "cp.async.bulk.shared::cluster.shared::cta", "prefetch.tensormap", ".im2col"))

    def reduce(acc):
        smem = cuda.shared.array(256, np.float32, alignment=16)
        smem[cuda.threadIdx.x] = acc[cuda.threadIdx.x]
        cl.fence_proxy_async_shared()
        tma.bulk_reduce_add_f32(acc, 256, smem, 0, 1024)
        tma.bulk_commit_group()
        tma.bulk_wait_group(0)

    yield Probe("tma", "bulk reduction (add.f32)", reduce, (types.float32[:],), SM90,
                ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",))


def _wgmma_kernel(mma, regs, registers_a):
    from numba.cuda.np.unsafe.ndarray import to_fixed_tuple

    from intrinsics.wgmma import (wgmma_commit_group, wgmma_fence, wgmma_fence_operand,
                                  wgmma_wait_group)

    if registers_a:
        def kernel(c, out, d):
            acc = wgmma_fence_operand(to_fixed_tuple(c, regs))
            wgmma_fence()
            frag = (np.uint32(d[2]), np.uint32(d[3]), np.uint32(d[4]), np.uint32(d[5]))
            acc = mma(acc, frag, d[1], 1)
            wgmma_commit_group()
            wgmma_wait_group(0)
            out[0] = wgmma_fence_operand(acc)[0]
    else:
        def kernel(c, out, d):
            acc = wgmma_fence_operand(to_fixed_tuple(c, regs))
            wgmma_fence()
            acc = mma(acc, d[0], d[1], 1)
            wgmma_commit_group()
            wgmma_wait_group(0)
            out[0] = wgmma_fence_operand(acc)[0]
    return kernel


def _wgmma_probes():
    from intrinsics._core import SM90A
    from intrinsics.wgmma import wgmma_mma_async

    forms = [("bf16", "f32", 8, "smem"), ("bf16", "f32", 256, "smem"), ("f16", "f16", 128, "smem"),
             ("e4m3", "f32", 64, "smem"), ("tf32", "f32", 32, "smem"), ("bf16", "f32", 64, "reg")]
    for a, acc, n, a_from in forms:
        mma = wgmma_mma_async(n, a, None, acc, a_from=a_from)
        arr = numpy_support.from_dtype(np.dtype(np.float32 if acc == "f32" else np.uint32))[:]
        kernel = _wgmma_kernel(mma, mma.spec.acc_regs, a_from == "reg")
        yield Probe("wgmma", f"m64n{n} {a}->{acc} {a_from}", kernel, (arr, arr, types.uint64[:]),
                    SM90A, (mma.spec.ptx,))


def tcgen05_kernel(out, descs, ncols):
    """Every cta_group::1 tcgen05 intrinsic in one kernel (used by the catalog and by
    tests/test_tcgen05_compile.py)."""
    slot = cuda.shared.array(2, np.uint32)
    bars = cuda.shared.array(2, np.uint64)
    sf = cuda.shared.array(512, np.uint8)
    warp = cuda.threadIdx.x // 32
    if warp == 0:
        tc.tcgen05_alloc(slot, 0, 128)
        tc.tcgen05_alloc(slot, 1, ncols)
    tc.tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    tc.tcgen05_fence_after_thread_sync()
    d = slot[0]
    if cuda.threadIdx.x == 0:
        _TC_CP(d + 64, tc.umma_smem_desc(sf, 0, 16, 128, 0))
        _TC_MMA(d, descs[0], descs[1], np.uint32(descs[2]), 0)
        tc.tcgen05_commit(bars, 0)
        tc.tcgen05_commit_multicast(bars, 1, 3)
    regs = tc.tcgen05_wait_ld_regs(_TC_LD(d + ((32 * (warp % 4)) << 16)))
    _TC_ST(d, (regs[0], regs[1], regs[2], regs[3], regs[4], regs[5], regs[6], regs[7]))
    tc.tcgen05_wait_st()
    tc.tcgen05_wait_ld()
    out[cuda.threadIdx.x] = regs[7]
    tc.tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    if warp == 0:
        tc.tcgen05_dealloc(d, 128)
        tc.tcgen05_dealloc(slot[1], ncols)
        tc.tcgen05_relinquish_alloc_permit()


TCGEN05_SIGNATURE = (types.uint32[::1], types.uint64[::1], types.int32)


def _tcgen05_probes():
    global _TC_MMA, _TC_LD, _TC_ST, _TC_CP
    _TC_MMA = tc.tcgen05_mma("f16")
    _TC_LD = tc.tcgen05_ld("32x32b", 8)
    _TC_ST = tc.tcgen05_st("16x256b", 2)
    _TC_CP = tc.tcgen05_cp("32x128b.warpx4")
    yield Probe("tcgen05", "alloc/mma/commit/ld/st/cp/fences", tcgen05_kernel, TCGEN05_SIGNATURE,
                tc.TCGEN05, ("tcgen05.alloc.cta_group::1", "tcgen05.mma.cta_group::1.kind::f16",
                             "tcgen05.commit.cta_group::1", "tcgen05.ld.sync.aligned.32x32b.x8.b32",
                             "tcgen05.st.sync.aligned.16x256b.x2.b32", "tcgen05.dealloc"))


_TC_MMA = _TC_LD = _TC_ST = _TC_CP = None

def _opaque_probes():
    import intrinsics.hints as hn

    def kernel(x, y):
        t = hn.opaque(np.int64(cuda.threadIdx.x))
        x[t] = hn.opaque(x[t]) + hn.opaque((x[0], x[1]))[1]
        y[t] = hn.opaque(y[t] + np.uint64(2))

    yield Probe("optimiser barrier", "opaque (empty volatile asm)", kernel,
                (types.float32[:], types.uint64[:]), SM75, ("// begin inline asm",))


_FAMILIES = [_mma_probes, _mma_block_scale_probes, _ldmatrix_probes, _cp_async_probes, _cp_async_mbarrier_probes,
             _convert_probes, _mbarrier_probes, _barrier_probes, _global_memory_probes, _fastmath_probes,
             _opaque_probes,
             _cluster_probes, _setmaxnreg_probes, _tma_probes, _wgmma_probes, _tcgen05_probes]


def probes():
    """Every probe of every family, in a stable order."""
    for family in _FAMILIES:
        yield from family()
