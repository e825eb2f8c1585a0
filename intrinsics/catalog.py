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
from intrinsics._core import SM75, SM80, SM89
from intrinsics.mma import mma_specs, mma_sync

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
        f[0] = a + b + c + d

    def fp8(out, f):
        out[0] = cv.pack_e4m3x4(f[0], f[1], f[2], f[3])
        out[1] = cv.pack_e5m2x4(f[0], f[1], f[2], f[3])

    sig = (types.uint32[:], types.float32[:])
    yield Probe("convert", "bf16x2/f16x2/tf32", pairs, sig, SM80,
                ("cvt.rn.bf16x2.f32", "cvt.rn.f16x2.f32", "cvt.rna.tf32.f32", "cvt.f32.f16"))
    yield Probe("convert", "e4m3x4/e5m2x4", fp8, sig, SM89,
                ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"))


_FAMILIES = [_mma_probes, _ldmatrix_probes, _cp_async_probes, _cp_async_mbarrier_probes,
             _convert_probes]


def probes():
    """Every probe of every family, in a stable order."""
    for family in _FAMILIES:
        yield from family()
