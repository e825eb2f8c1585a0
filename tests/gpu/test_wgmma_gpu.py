"""wgmma on the GPU: one warpgroup multiplies operand tiles that ordinary stores put in shared
memory in each canonical layout, and every thread's accumulator registers are checked against a
float64 NumPy product through the PTX ISA's fragment map.

The host builds each tile's shared-memory image with :class:`intrinsics.layout.SmemLayout` (the
swizzle model of ``intrinsics.smem.swizzle_offset_host``); the kernel copies the image to a
1024-byte-aligned spot of dynamic shared memory, fences it into the async proxy and runs one
wgmma per instruction K-slice with descriptors advanced by ``SmemLayout.k_offset``.  Layouts,
K, scale-d and the accumulator input are run-time arguments, so one compiled kernel serves every
layout of one instruction variant.
"""

import functools
from dataclasses import dataclass

import numpy as np
import pytest
from numba import cuda

from intrinsics.layout import (
    SmemLayout,
    a_fragment_coords,
    accumulator_coords,
    make_smem_desc_host,
    smem_desc_address_host,
)
from intrinsics.wgmma import wgmma_mma_async

# The GPU tests also run in the CPU emulation (NUMBA_ENABLE_CUDASIM=1); the host-model tests
# below run in both modes too.
pytestmark = pytest.mark.emulation

WARPGROUP = 128


# ---------------------------------------------------------------------------------------------
# Number formats (NumPy only)
# ---------------------------------------------------------------------------------------------


def bf16_bits(x):
    """float -> bf16 bits, round to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def fp8_value(codes, fmt):
    """e4m3 (OCP "fn": no infinities, S.1111.111 NaN) / e5m2 bytes -> float64."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if fmt == "e4m3":
        e, m, bias, mbits = (c >> 3) & 0xF, c & 7, 7, 3
    else:
        e, m, bias, mbits = (c >> 2) & 0x1F, c & 3, 15, 2
    frac = m / float(1 << mbits)
    value = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias))
    if fmt == "e4m3":
        value = np.where((e == 15) & (m == 7), np.nan, value)
    else:
        value = np.where(e == 31, np.where(m == 0, np.inf, np.nan), value)
    return sign * value


# Values whose products and sums of up to 128 terms need at most 11 significant bits: the fp8
# path (whose accumulation keeps fewer bits than f32) is then exact.
_FP8_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, -0.5, -1.0, -1.5, -2.0)


def operand(rng, ptx_type, shape):
    """Random operand: (raw bits with the type's item size, float64 values)."""
    if ptx_type == "bf16":
        bits = bf16_bits(rng.standard_normal(shape))
        return bits, bf16_value(bits)
    if ptx_type == "f16":
        h = rng.standard_normal(shape).astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    if ptx_type == "tf32":
        bits = rng.standard_normal(shape).astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits, bits.view(np.float32).astype(np.float64)
    if ptx_type in ("e4m3", "e5m2"):
        codes = np.arange(256, dtype=np.uint8)
        table = fp8_value(codes, ptx_type)
        allowed = codes[np.isin(table, _FP8_VALUES) & (codes != 0x80)]  # no -0
        bits = rng.choice(allowed, size=shape).astype(np.uint8)
        return bits, fp8_value(bits, ptx_type)
    raise ValueError(ptx_type)


# ---------------------------------------------------------------------------------------------
# Kernels, one per instruction variant (layouts, K, scale-d and C are run-time arguments)
# ---------------------------------------------------------------------------------------------


@functools.cache
def ss_kernel(spec):
    from numba.cuda.np.unsafe.ndarray import to_fixed_tuple

    from intrinsics.cluster import fence_proxy_async_shared
    from intrinsics.smem import shared_address
    from intrinsics.wgmma import (
        make_smem_desc,
        smem_desc,
        wgmma_commit_group,
        wgmma_fence,
        wgmma_fence_operand,
        wgmma_wait_group,
    )

    mma = _mma(spec)
    regs = spec.acc_regs

    @cuda.jit
    def kernel(a_img, b_img, b_at, a_koff, b_koff, a_desc, b_desc, c_in, out, scale_d):
        # a_desc / b_desc: (lbo, sbo, swizzle); a_koff / b_koff: byte offset of each K-slice.
        smem = cuda.shared.array(0, dtype=np.uint32)
        t = cuda.threadIdx.x
        # NOTE: numba declares dynamic shared memory .align 1; align the tiles at run time.
        w0 = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4
        wb = w0 + b_at // 4
        for i in range(t, a_img.size, 128):
            smem[w0 + i] = a_img[i]
        for i in range(t, b_img.size, 128):
            smem[wb + i] = b_img[i]
        fence_proxy_async_shared()
        cuda.syncthreads()

        acc = wgmma_fence_operand(to_fixed_tuple(c_in[t], regs))
        wgmma_fence()
        for ks in range(a_koff.size):
            da = smem_desc(smem, w0 + a_koff[ks] // 4, a_desc[0], a_desc[1], a_desc[2])
            db = make_smem_desc(
                shared_address(smem, wb) + b_koff[ks], b_desc[0], b_desc[1], b_desc[2]
            )
            acc = mma(acc, da, db, scale_d if ks == 0 else 1)
        wgmma_commit_group()
        wgmma_wait_group(0)
        acc = wgmma_fence_operand(acc)
        for i in range(regs):
            out[t, i] = acc[i]

    return kernel


@functools.cache
def rs_kernel(spec):
    from numba.cuda.np.unsafe.ndarray import to_fixed_tuple

    from intrinsics.cluster import fence_proxy_async_shared
    from intrinsics.smem import shared_address
    from intrinsics.wgmma import (
        smem_desc,
        wgmma_commit_group,
        wgmma_fence,
        wgmma_fence_operand,
        wgmma_wait_group,
    )

    mma = _mma(spec)
    regs = spec.acc_regs

    @cuda.jit
    def kernel(a_frag, b_img, b_koff, b_desc, c_in, out, scale_d):
        # a_frag: (k_steps, 128, 4) uint32, the A registers of every thread for each K-slice.
        smem = cuda.shared.array(0, dtype=np.uint32)
        t = cuda.threadIdx.x
        wb = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4
        for i in range(t, b_img.size, 128):
            smem[wb + i] = b_img[i]
        fence_proxy_async_shared()
        cuda.syncthreads()

        acc = wgmma_fence_operand(to_fixed_tuple(c_in[t], regs))
        for ks in range(b_koff.size):
            frag = (a_frag[ks, t, 0], a_frag[ks, t, 1], a_frag[ks, t, 2], a_frag[ks, t, 3])
            wgmma_fence()  # the A registers were just written by ordinary loads
            db = smem_desc(smem, wb + b_koff[ks] // 4, b_desc[0], b_desc[1], b_desc[2])
            acc = mma(acc, frag, db, scale_d if ks == 0 else 1)
        wgmma_commit_group()
        wgmma_wait_group(0)
        acc = wgmma_fence_operand(acc)
        for i in range(regs):
            out[t, i] = acc[i]

    return kernel


def _mma(spec):
    return wgmma_mma_async(
        spec.n, spec.a, spec.b, spec.acc, a_from=spec.a_from, scale_a=spec.scale_a,
        scale_b=spec.scale_b, trans_a=spec.trans_a, trans_b=spec.trans_b,
    )


# ---------------------------------------------------------------------------------------------
# Host side: operands, images, fragments, reference
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One launch: the variant, the kernel arguments in order, the dynamic shared bytes, the
    float64 operands and accumulator input the result is checked against."""

    spec: object
    args: tuple
    shared: int
    a_val: np.ndarray
    b_val: np.ndarray
    c_full: np.ndarray
    scale_d: int
    layouts: tuple  # (A layout or None for RS, B layout)

    @property
    def kernel(self):
        return ss_kernel(self.spec) if self.spec.a_from == "smem" else rs_kernel(self.spec)

    def check(self, out):
        _check(self.spec, _gather_d(self.spec, out), self.a_val, self.b_val, self.c_full,
               self.scale_d)


def _image_words(layout, bits):
    return layout.place(bits).view(np.uint32)


def _k_offsets(layout, k, k_inst):
    return np.array([layout.k_offset(k0) for k0 in range(0, k, k_inst)], dtype=np.int64)


def _desc_fields(layout):
    return np.array([layout.lbo, layout.sbo, layout.swizzle], dtype=np.int64)


def _accumulator_io(spec, c_full):
    """C of shape (64, N) -> the per-thread accumulator registers (128, regs)."""
    rows, cols = accumulator_coords(spec.n)
    elems = c_full[rows, cols]
    if spec.acc == "f32":
        return np.ascontiguousarray(elems.astype(np.float32))
    return np.ascontiguousarray(elems.astype(np.float16)).view(np.uint32)


def _gather_d(spec, out):
    """Registers (128, regs) -> D (64, N) float64 through the fragment map; NaN where unset."""
    rows, cols = accumulator_coords(spec.n)
    if spec.acc == "f32":
        elems = np.ascontiguousarray(out).view(np.float32).astype(np.float64)
    else:
        elems = np.ascontiguousarray(out).view(np.float16).astype(np.float64)
    d = np.full((64, spec.n), np.nan)
    d[rows, cols] = elems
    return d


def _c_input(rng, spec, scale_d):
    if scale_d:
        c = rng.standard_normal((64, spec.n))
        if spec.acc == "f16":
            c = c.astype(np.float16)
        return c.astype(np.float32).astype(np.float64)
    # scale-d = 0: the input accumulator must be ignored, so poison it.
    return np.full((64, spec.n), np.nan)


def _poisoned_out(spec):
    if spec.acc == "f32":
        return np.full((WARPGROUP, spec.acc_regs), np.nan, dtype=np.float32)
    return np.full((WARPGROUP, spec.acc_regs), 0xFFFFFFFF, dtype=np.uint32)  # f16 NaNs


def _check(spec, got, a_val, b_val, c_full, scale_d):
    sign = spec.scale_a * spec.scale_b
    ref = sign * (a_val @ b_val.T)
    mag = np.abs(a_val) @ np.abs(b_val).T
    if scale_d:
        ref = ref + c_full
        mag = mag + np.abs(c_full)
    assert not np.isnan(got).any(), "some accumulator element was not written (or is NaN)"
    # f32: fp32 accumulation of up to 128 exact products; f16: rounding to f16 along the way.
    rel = 1e-5 if spec.acc == "f32" else 2.0**-6
    err = np.abs(got - ref)
    bad = err > rel * mag + 1e-30
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise AssertionError(
            f"{bad.sum()} of {bad.size} elements wrong; first at D[{r}, {c}]: got {got[r, c]}, "
            f"want {ref[r, c]} (tolerance {rel * mag[r, c]:.3g})"
        )


def ss_case(n, a="bf16", b=None, acc="f32", *, k, a_layout=("K", 128), b_layout=("K", 128),
            scale_a=1, scale_b=1, scale_d=1, rng=None):
    """A and B both from shared memory; layouts are (major, swizzle bytes)."""
    b = a if b is None else b
    rng = rng or np.random.default_rng()
    spec = wgmma_mma_async(
        n, a, b, acc, scale_a=scale_a, scale_b=scale_b,
        trans_a=int(a_layout[0] == "MN"), trans_b=int(b_layout[0] == "MN"),
    ).spec
    la = SmemLayout(a_layout[0], a_layout[1], 64, k, spec.elem_bytes)
    lb = SmemLayout(b_layout[0], b_layout[1], n, k, spec.elem_bytes)
    a_bits, a_val = operand(rng, a, (64, k))
    b_bits, b_val = operand(rng, b, (n, k))
    c_full = _c_input(rng, spec, scale_d)
    b_at = -(-la.nbytes // 1024) * 1024  # B's tile starts on the next 1024-byte boundary
    args = (
        _image_words(la, a_bits),
        _image_words(lb, b_bits),
        np.int64(b_at),
        _k_offsets(la, k, spec.k),
        _k_offsets(lb, k, spec.k),
        _desc_fields(la),
        _desc_fields(lb),
        _accumulator_io(spec, c_full),
        _poisoned_out(spec),
        np.int32(scale_d),
    )
    return Case(spec, args, b_at + lb.nbytes + 1024, a_val, b_val, c_full, scale_d, (la, lb))


def rs_case(n, a="bf16", b=None, acc="f32", *, k, b_layout=("K", 64), scale_d=1, rng=None):
    """A from registers (a_fragment_coords), B from shared memory."""
    b = a if b is None else b
    rng = rng or np.random.default_rng()
    spec = wgmma_mma_async(n, a, b, acc, a_from="reg", trans_b=int(b_layout[0] == "MN")).spec
    lb = SmemLayout(b_layout[0], b_layout[1], n, k, spec.elem_bytes)
    a_bits, a_val = operand(rng, a, (64, k))
    b_bits, b_val = operand(rng, b, (n, k))
    c_full = _c_input(rng, spec, scale_d)
    rows, cols = a_fragment_coords(spec.elem_bytes)
    frags = np.stack(  # (k_steps, 128, 4): each thread's A registers for each K-slice
        [np.ascontiguousarray(a_bits[rows, k0 + cols]).view(np.uint32)
         for k0 in range(0, k, spec.k)]
    )
    args = (
        np.ascontiguousarray(frags),
        _image_words(lb, b_bits),
        _k_offsets(lb, k, spec.k),
        _desc_fields(lb),
        _accumulator_io(spec, c_full),
        _poisoned_out(spec),
        np.int32(scale_d),
    )
    return Case(spec, args, lb.nbytes + 1024, a_val, b_val, c_full, scale_d, (None, lb))


def run(case):
    assert case.shared <= 48 * 1024, "the cases stay below the default dynamic shared-memory limit"
    d_args = [cuda.to_device(x) if isinstance(x, np.ndarray) else x for x in case.args]
    case.kernel[1, WARPGROUP, 0, case.shared](*d_args)
    cuda.synchronize()
    case.check(d_args[-2].copy_to_host())


# ---------------------------------------------------------------------------------------------
# Tests: one table of cases, run on the GPU and (for the host plumbing) on the host emulation
# ---------------------------------------------------------------------------------------------


def _cases():
    cases = {}
    # Every class of N (smallest, odd multiple of 8, largest); 4 K-slices inside a 128B atom.
    for n in (8, 16, 24, 64, 128, 256):
        cases[f"bf16-n{n}"] = functools.partial(ss_case, n, "bf16", k=64)
    # K-major A and B in each swizzle mode (and mixed); K spans several core matrices / atoms.
    for a_sw, b_sw in [(0, 0), (32, 32), (64, 64), (128, 128), (0, 128), (128, 32)]:
        cases[f"k-major-a{a_sw}-b{b_sw}"] = functools.partial(
            ss_case, 64, "bf16", k=max(32, max(a_sw, b_sw) // 2),
            a_layout=("K", a_sw), b_layout=("K", b_sw))
    # trans-b = 1: B stored N-major; N=128 spans several atoms along N.
    for sw in (0, 32, 64, 128):
        cases[f"mn-major-b{sw}"] = functools.partial(
            ss_case, 128, "bf16", k=32, a_layout=("K", 64), b_layout=("MN", sw))
    # trans-a = 1: A stored M-major.
    for sw in (0, 64, 128):
        cases[f"mn-major-a{sw}"] = functools.partial(
            ss_case, 64, "bf16", k=64, a_layout=("MN", sw), b_layout=("K", 128))
    # RS form: A from registers in the a_fragment_coords layout.
    for sw in (64, 0):
        cases[f"rs-b{sw}"] = functools.partial(rs_case, 64, "bf16", k=32, b_layout=("K", sw))
    # scale-d 0 ignores the (NaN-poisoned) input accumulator; non-zero adds to a random C.
    for sd in (0, 1, 7):
        cases[f"scale-d-{sd}"] = functools.partial(ss_case, 64, "bf16", k=64, scale_d=sd)
    cases["scale-a-neg"] = functools.partial(ss_case, 64, "bf16", k=64, scale_a=-1)
    cases["scale-b-neg"] = functools.partial(ss_case, 64, "bf16", k=64, scale_b=-1)
    for acc in ("f32", "f16"):
        cases[f"f16-acc-{acc}"] = functools.partial(ss_case, 64, "f16", acc=acc, k=64)
    # fp8 m64n64k32: 4 K-slices through a 128B atom, C ignored.
    for a, b in (("e4m3", "e4m3"), ("e4m3", "e5m2")):
        cases[f"{a}-{b}"] = functools.partial(ss_case, 64, a, b, k=128, scale_d=0)
    cases["tf32"] = functools.partial(ss_case, 32, "tf32", k=32)
    return cases


CASES = _cases()


@pytest.mark.gpu(cc=(9, 0))
@pytest.mark.parametrize("name", list(CASES))
def test_wgmma_on_the_gpu(name, device_cc):
    cc = tuple(device_cc)  # (9, 0) in the emulation
    if cc != (9, 0):
        pytest.skip(f"wgmma needs sm_90a, this GPU is sm_{cc[0]}{cc[1]}")
    run(CASES[name]())


# ---------------------------------------------------------------------------------------------
# The host models above, checked on the CPU
# ---------------------------------------------------------------------------------------------


def test_number_formats_against_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    codes = np.arange(256, dtype=np.uint8)
    for fmt, dt in (("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)):
        want = codes.view(dt).astype(np.float64)
        np.testing.assert_array_equal(fp8_value(codes, fmt), want)
    x = np.random.default_rng().standard_normal(4096).astype(np.float32)
    np.testing.assert_array_equal(bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def _decode(raw, ptx_type):
    """(..., item bytes) uint8 -> float64 values."""
    raw = np.ascontiguousarray(raw)
    if ptx_type in ("e4m3", "e5m2"):
        return fp8_value(raw[..., 0], ptx_type)
    if ptx_type == "bf16":
        return bf16_value(raw.view(np.uint16)[..., 0])
    if ptx_type == "f16":
        return raw.view(np.float16)[..., 0].astype(np.float64)
    return raw.view(np.float32)[..., 0].astype(np.float64)  # tf32


def emulate(case, base=16):
    """Run a case's kernel on the host with the library's models: the images go into a dynamic
    shared buffer that starts at the (misaligned) address ``base``; each descriptor the kernel
    would build is read back through ``smem_desc_address_host``; the RS fragments through
    ``a_fragment_coords``; the registers through ``accumulator_coords``.  Returns ``out``."""
    spec = case.spec
    eb = spec.elem_bytes
    smem = np.zeros(case.shared, dtype=np.uint8)  # index = shared address - base
    rows, cols = accumulator_coords(spec.n)
    c_in, scale_d = case.args[-3], int(case.args[-1])
    if spec.acc == "f32":
        regs = c_in.astype(np.float64)
    else:
        regs = np.ascontiguousarray(c_in).view(np.float16).astype(np.float64)
    d = np.zeros((64, spec.n))
    d[rows, cols] = regs

    def read(desc, major, mn, ptx_type):
        idx_mn, idx_k = np.meshgrid(np.arange(mn), np.arange(spec.k), indexing="ij")
        addr = smem_desc_address_host(desc, major, eb, idx_mn, idx_k) - base
        return _decode(smem[addr[..., None] + np.arange(eb)], ptx_type)

    la, lb = case.layouts
    b_major = "MN" if spec.trans_b else "K"
    if spec.a_from == "smem":
        a_img, b_img, b_at, a_koff, b_koff, a_desc, b_desc = case.args[:7]
        w0 = ((1024 - (base & 1023)) & 1023) // 4
        wb = w0 + int(b_at) // 4
        smem[4 * w0 : 4 * w0 + a_img.nbytes] = a_img.view(np.uint8)
        smem[4 * wb : 4 * wb + b_img.nbytes] = b_img.view(np.uint8)
        steps = []
        for ks in range(a_koff.size):
            da = make_smem_desc_host(base + 4 * (w0 + int(a_koff[ks]) // 4), *a_desc)
            db = make_smem_desc_host(base + 4 * wb + int(b_koff[ks]), *b_desc)
            a_k = read(da, "MN" if spec.trans_a else "K", 64, spec.a)
            steps.append((a_k, read(db, b_major, spec.n, spec.b)))
    else:
        a_frag, b_img, b_koff, b_desc = case.args[:4]
        wb = ((1024 - (base & 1023)) & 1023) // 4
        smem[4 * wb : 4 * wb + b_img.nbytes] = b_img.view(np.uint8)
        a_rows, a_cols = a_fragment_coords(eb)
        steps = []
        for ks in range(b_koff.size):
            elems = np.ascontiguousarray(a_frag[ks]).view(np.uint8).reshape(WARPGROUP, -1, eb)
            a_k = np.zeros((64, spec.k))
            a_k[a_rows, a_cols] = _decode(elems, spec.a)
            db = make_smem_desc_host(base + 4 * (wb + int(b_koff[ks]) // 4), *b_desc)
            steps.append((a_k, read(db, b_major, spec.n, spec.b)))
    for ks, (a_k, b_k) in enumerate(steps):
        keep = scale_d != 0 or ks > 0
        d = spec.scale_a * spec.scale_b * (a_k @ b_k.T) + (d if keep else 0)
    if spec.acc == "f32":
        return d[rows, cols].astype(np.float32)
    return np.ascontiguousarray(d[rows, cols].astype(np.float16)).view(np.uint32)


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_passes_on_the_host_emulation(name):
    """The host plumbing of each GPU case (images, K offsets, descriptors, fragments, the check)
    agrees with the library's descriptor and fragment models.  What remains for the GPU to
    settle is whether those models are the hardware's."""
    case = CASES[name]()
    assert case.shared <= 48 * 1024
    case.check(emulate(case))


def test_the_check_catches_a_wrong_layout():
    case = ss_case(128, "bf16", k=32, a_layout=("K", 64), b_layout=("MN", 128))
    lbo, sbo, sw = case.args[6]
    case.args[6][:] = (sbo, lbo, sw)  # swap LBO and SBO of the MN-major B
    with pytest.raises(AssertionError, match="elements wrong"):
        case.check(emulate(case))
    case = ss_case(64, "bf16", k=64, scale_d=0)
    with pytest.raises(AssertionError, match="not written"):
        case.check(_poisoned_out(case.spec))
