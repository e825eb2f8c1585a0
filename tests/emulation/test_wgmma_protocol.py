"""wgmma in the CPU emulation: the protocol mistakes it must catch (each an EmulationError naming
block, warp, lane and the object), the bit-exact result for integer-valued inputs, and the
descriptor device functions running as Python under the simulator.

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation``
(the second pytest run of the README's test command does)."""

import functools

import numpy as np
import pytest
from numba import config, cuda

from intrinsics.layout import (
    SmemLayout,
    a_fragment_coords,
    accumulator_coords,
    decode_smem_desc,
    make_smem_desc_host,
)
from intrinsics.wgmma import wgmma_mma_async

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from intrinsics.emulate.runtime import EmulationError  # noqa: E402

WHERE = r"block \(0, 0, 0\) warp \d+ lane \d+"
N, K = 64, 32  # the protocol kernels: m64n64k16 bf16, two K-slices of a 64B-swizzled tile
LAYOUT_A = SmemLayout("K", 64, 64, K, 2)
LAYOUT_B = SmemLayout("K", 64, N, K, 2)
B_AT = 4096  # bytes from the aligned base to B's tile


def _bf16(values):
    return (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _images(rng):
    a = rng.integers(-4, 5, (64, K)).astype(np.float64)
    b = rng.integers(-4, 5, (N, K)).astype(np.float64)
    a_img = LAYOUT_A.place(_bf16(a)).view(np.uint32)
    b_img = LAYOUT_B.place(_bf16(b)).view(np.uint32)
    return a, b, a_img, b_img


# ---------------------------------------------------------------------------------------------
# One kernel with switches for the mistakes (the switches are plain Python under the simulator)
# ---------------------------------------------------------------------------------------------


@functools.cache
def protocol_kernel(proxy_fence=True, mma_fence=True, commit=True, wait=True,
                    read_early=None, overwrite=False, a_shift=0, uneven_desc=False):
    from intrinsics.cluster import fence_proxy_async_shared
    from intrinsics.smem import shared_address
    from intrinsics.wgmma import (
        smem_desc,
        wgmma_commit_group,
        wgmma_fence,
        wgmma_fence_operand,
        wgmma_wait_group,
    )

    mma = wgmma_mma_async(N, "bf16")
    lbo, sbo, sw = LAYOUT_A.lbo, LAYOUT_A.sbo, LAYOUT_A.swizzle
    koff = [LAYOUT_A.k_offset(k0) // 4 for k0 in range(0, K, 16)]

    @cuda.jit
    def kernel(a_img, b_img, out):
        smem = cuda.shared.array(0, dtype=np.uint32)
        t = cuda.threadIdx.x
        g = t // 128  # warpgroup: each multiplies its own copy of the tiles
        w0 = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4 + g * 2 * B_AT // 4
        wb = w0 + B_AT // 4
        for i in range(t % 128, a_img.size, 128):
            smem[w0 + i] = a_img[i]
        for i in range(t % 128, b_img.size, 128):
            smem[wb + i] = b_img[i]
        if proxy_fence:
            fence_proxy_async_shared()
        cuda.syncthreads()

        acc = (np.float32(0),) * (N // 2)
        if mma_fence:
            wgmma_fence()
        for ks in range(len(koff)):
            da = smem_desc(smem, w0 + a_shift + koff[ks], lbo, sbo, sw)
            if uneven_desc and t == 5:
                da += 1
            db = smem_desc(smem, wb + koff[ks], lbo, sbo, sw)
            acc = mma(acc, da, db, ks)
        if read_early == "before commit":
            out[t, 0] = acc[0]
        if commit:
            wgmma_commit_group()
        if read_early == "before wait":
            out[t, 0] = acc[0]
        if overwrite:
            smem[wb + t % 128] = 0
        if wait:
            wgmma_wait_group(0)
            acc = wgmma_fence_operand(acc)
            for i in range(N // 2):
                out[t, i] = acc[i]

    return kernel


def launch(rng=None, threads=128, **switches):
    a, b, a_img, b_img = _images(rng or np.random.default_rng())
    out = np.full((threads, N // 2), np.nan, dtype=np.float32)
    kernel = protocol_kernel(**switches)
    kernel[1, threads, 0, 1024 + 2 * B_AT * -(-threads // 128)](a_img, b_img, out)
    return a, b, out


def _gather(out, n=N):
    rows, cols = accumulator_coords(n)
    d = np.full((64, n), np.nan)
    d[rows, cols] = out[:128].astype(np.float64)
    return d


def test_a_correct_kernel_passes():
    a, b, out = launch()
    np.testing.assert_array_equal(_gather(out), a @ b.T)


def test_two_warpgroups_keep_separate_state():
    a, b, out = launch(threads=256)
    np.testing.assert_array_equal(_gather(out), a @ b.T)
    np.testing.assert_array_equal(out[128:], out[:128])


# ---------------------------------------------------------------------------------------------
# Protocol mistakes
# ---------------------------------------------------------------------------------------------


def test_missing_fence_proxy_async():
    with pytest.raises(EmulationError, match=(
            WHERE + r" \(warpgroup 0, warps 0-3\): wgmma.mma_async.*operand A.*reads shared "
            r"address \d+, which thread \d+ \(warp \d+ lane \d+\) wrote with an ordinary store "
            r"and did not order with fence.proxy.async")):
        launch(proxy_fence=False)


@pytest.mark.parametrize("threads", [64, 96, 160])
def test_partial_warpgroup(threads):
    # 64/96: warpgroup 0 is short; 160: warpgroup 1 is one warp.
    with pytest.raises(EmulationError, match=WHERE + r": wgmma.* needs a warpgroup of 128 "
                                                     r"threads, this block's warpgroup \d has "
                                                     r"(32|64|96)"):
        launch(threads=threads)


def test_descriptor_outside_shared_memory():
    # A's start moved 200 KB up: beyond the block's dynamic shared memory.
    with pytest.raises(EmulationError, match=(
            WHERE + r" \(warpgroup 0, warps 0-3\): wgmma.mma_async.*: the A descriptor "
            r"0x[0-9a-f]{16} \(start \d+, LBO 16, SBO 512, swizzle 64\) reads shared addresses "
            r"\[\d+, \d+\), outside this block's \d+ bytes of shared memory")):
        launch(a_shift=50000)


def test_missing_wgmma_fence():
    with pytest.raises(EmulationError, match=WHERE + r".*issued without a wgmma_fence by the "
                                                     r"warpgroup since the kernel started"):
        launch(mma_fence=False)


@pytest.mark.parametrize("when, status", [
    ("before commit", "it was never committed"),
    ("before wait", "its wgmma-group is still in flight"),
])
def test_reading_the_accumulator_before_the_wait(when, status):
    with pytest.raises(EmulationError, match=(
            WHERE + r": reads register 0 of the accumulator returned by "
            r"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 #2 of warpgroup 0 before a "
            r"wgmma_wait_group retired it: " + status)):
        launch(read_early=when)


def test_exit_with_groups_in_flight():
    with pytest.raises(EmulationError, match=WHERE + r" \(warpgroup 0, warps 0-3\): the "
                                                     r"warpgroup exited with 1 wgmma-group"):
        launch(wait=False)
    with pytest.raises(EmulationError, match=r"exited with 2 wgmma.mma_async never committed"):
        launch(commit=False, wait=False)


def test_overwriting_an_operand_in_flight():
    with pytest.raises(EmulationError, match=WHERE + r".*shared address \d+, which "
                                                     r"wgmma.mma_async #\d of the warpgroup "
                                                     r"reads, changed before wgmma_wait_group"):
        launch(overwrite=True)


def test_descriptor_must_be_uniform():
    with pytest.raises(EmulationError, match=(
            r"the A descriptor differs across the warpgroup \(thread 0: 0x[0-9a-f]{16}, "
            r"thread 5 \(warp 0 lane 5\): 0x[0-9a-f]{16}\)")):
        launch(uneven_desc=True)


def test_wait_group_may_exceed_the_groups_in_flight():
    from intrinsics.wgmma import wgmma_commit_group, wgmma_fence, wgmma_wait_group

    @cuda.jit
    def kernel(out):
        wgmma_fence()
        wgmma_commit_group()  # an empty group is legal
        wgmma_wait_group(7)
        wgmma_wait_group(0)
        out[cuda.threadIdx.x] = 1

    out = np.zeros(128, dtype=np.int32)
    kernel[1, 128](out)
    assert out.all()
    with pytest.raises(ValueError, match="literal integer 0..7, got 8"):
        wgmma_wait_group(8)


def test_the_factory_refuses_what_the_intrinsic_refuses():
    with pytest.raises(ValueError, match="multiple of 8 in 8..256, got 100"):
        wgmma_mma_async(100, "bf16")
    with pytest.raises(ValueError, match="transposes"):
        wgmma_mma_async(64, "e4m3", trans_b=1)
    assert wgmma_mma_async(64, "bf16").spec.ptx == (
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16")


# ---------------------------------------------------------------------------------------------
# Bit-exact results against NumPy (integer-valued inputs: the hardware is exact too)
# ---------------------------------------------------------------------------------------------


@functools.cache
def exact_kernel(spec):
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

    mma = wgmma_mma_async(spec.n, spec.a, spec.b, spec.acc, a_from=spec.a_from,
                          scale_a=spec.scale_a, scale_b=spec.scale_b, trans_a=spec.trans_a,
                          trans_b=spec.trans_b)
    regs = spec.acc_regs

    @cuda.jit
    def kernel(a_img, a_frag, b_img, a_desc, b_desc, a_koff, b_koff, c_in, out):
        # a_frag: (K-slices, 128, 4) A registers (RS form) or (0, 128, 4) (SS form)
        smem = cuda.shared.array(0, dtype=np.uint32)
        t = cuda.threadIdx.x
        w0 = ((1024 - (shared_address(smem, 0) & 1023)) & 1023) // 4
        wb = w0 + 8192 // 4
        for i in range(t, a_img.size, 128):
            smem[w0 + i] = a_img[i]
        for i in range(t, b_img.size, 128):
            smem[wb + i] = b_img[i]
        fence_proxy_async_shared()
        cuda.syncthreads()
        acc = wgmma_fence_operand(to_fixed_tuple(c_in[t], regs))
        for ks in range(b_koff.size):  # one wgmma-group per K-slice
            wgmma_fence()
            db = smem_desc(smem, wb + b_koff[ks] // 4, b_desc[0], b_desc[1], b_desc[2])
            if a_frag.shape[0] == 0:
                da = smem_desc(smem, w0 + a_koff[ks] // 4, a_desc[0], a_desc[1], a_desc[2])
                acc = mma(acc, da, db, 1)
            else:
                frag = (a_frag[ks, t, 0], a_frag[ks, t, 1], a_frag[ks, t, 2], a_frag[ks, t, 3])
                acc = mma(acc, frag, db, 1)
            wgmma_commit_group()
        wgmma_wait_group(0)
        acc = wgmma_fence_operand(acc)
        for i in range(regs):
            out[t, i] = acc[i]

    return kernel


def _exact_cases():
    """Every (A, B, accumulator) row of WGMMA_TABLE in both forms, N cycling through 8..256;
    the 16-bit rows also with MN-major operands and negated A or B."""
    from intrinsics.wgmma import WGMMA_TABLE

    rows = [(a, b, acc) for family, (_, _, accs, _, _) in WGMMA_TABLE.items()
            for a in family for b in (family if len(family) > 1 else (a,)) for acc in accs]
    ns = [8, 24, 40, 72, 136, 256, 16, 200]
    cases = []
    for i, (a, b, acc) in enumerate(rows):
        for j, form in enumerate(("smem", "reg")):
            n = ns[(2 * i + j) % len(ns)]
            wide = a in ("f16", "bf16")
            trans_a = int(wide and form == "smem" and i % 2 == 0)
            trans_b = int(wide and j == 1)
            scale_a, scale_b = (-1, 1) if wide and j == 0 else (1, -1) if wide else (1, 1)
            cases.append((form, a, b, acc, n, trans_a, trans_b, scale_a, scale_b))
    return cases


def _encoder(ptx_type):
    from intrinsics.emulate.numerics import encode

    itemsize = {"f16": np.uint16, "bf16": np.uint16, "tf32": np.uint32,
                "e4m3": np.uint8, "e5m2": np.uint8}[ptx_type]
    return lambda x: encode(x, ptx_type).astype(itemsize)


def _layout(major, mn, k, eb):
    """The widest swizzle the tile's contiguous extent allows."""
    extent = k * eb if major == "K" else mn * eb
    swizzle = next(s for s in (128, 64, 32, 0) if s == 0 or extent % s == 0)
    return SmemLayout(major, swizzle, mn, k, eb)


@pytest.mark.parametrize("form, a, b, acc, n, trans_a, trans_b, scale_a, scale_b",
                         _exact_cases())
def test_bits_match_numpy_for_integer_inputs(form, a, b, acc, n, trans_a, trans_b, scale_a,
                                             scale_b):
    rng = np.random.default_rng()
    spec = wgmma_mma_async(n, a, b, acc, a_from=form, scale_a=scale_a, scale_b=scale_b,
                           trans_a=trans_a, trans_b=trans_b).spec
    eb, k = spec.elem_bytes, 2 * spec.k  # two K-slices
    small = 3 if acc == "f16" else 8  # every partial sum is exact in the accumulator format
    a_val = rng.integers(-small, small + 1, (64, k)).astype(np.float64)
    b_val = rng.integers(-small, small + 1, (n, k)).astype(np.float64)
    c_val = rng.integers(-64, 65, (64, n)).astype(np.float64)
    la = _layout("MN" if trans_a else "K", 64, k, eb)
    lb = _layout("MN" if trans_b else "K", n, k, eb)
    a_img = la.place(_encoder(a)(a_val)).view(np.uint32)
    b_img = lb.place(_encoder(b)(b_val)).view(np.uint32)
    if form == "reg":
        rows, cols = a_fragment_coords(eb)
        bits = _encoder(a)(a_val)
        a_frag = np.stack([np.ascontiguousarray(bits[rows, k0 + cols]).view(np.uint32)
                           for k0 in range(0, k, spec.k)])
    else:
        a_frag = np.zeros((0, 128, 4), dtype=np.uint32)
    rows, cols = accumulator_coords(n)
    if acc == "f32":
        c_in = np.ascontiguousarray(c_val[rows, cols].astype(np.float32))
        out = np.full((128, spec.acc_regs), np.nan, dtype=np.float32)
    else:
        c_in = np.ascontiguousarray(c_val[rows, cols].astype(np.float16)).view(np.uint32)
        out = np.full((128, spec.acc_regs), 0xFFFFFFFF, dtype=np.uint32)
    koffs = [np.array([lay.k_offset(k0) for k0 in range(0, k, spec.k)]) for lay in (la, lb)]
    fields = [np.array([lay.lbo, lay.sbo, lay.swizzle]) for lay in (la, lb)]
    assert la.nbytes <= 8192
    exact_kernel(spec)[1, 128, 0, 8192 + lb.nbytes + 1024](
        a_img, a_frag, b_img, fields[0], fields[1], koffs[0], koffs[1], c_in, out)

    d = scale_a * scale_b * (a_val @ b_val.T) + c_val  # exact: integers far below 2**11
    if acc == "f32":
        want = d[rows, cols].astype(np.float32).view(np.uint32)
        got = out.view(np.uint32)
    else:
        h = np.ascontiguousarray(d[rows, cols].astype(np.float16)).view(np.uint16)
        want = h[:, 0::2].astype(np.uint32) | (h[:, 1::2].astype(np.uint32) << 16)
        got = out
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# The descriptor device functions run as Python and give the host's bits
# ---------------------------------------------------------------------------------------------


def test_descriptor_device_functions_give_the_host_bits():
    from intrinsics.smem import shared_address
    from intrinsics.wgmma import make_smem_desc, smem_desc

    cases = np.array([  # element index (uint32 words), LBO, SBO, swizzle
        [0, 16, 1024, 128], [8, 16, 512, 64], [264, 256, 128, 0], [40, 4096, 256, 32],
        [1000, 2048, 8192, 128],
    ], dtype=np.int64)

    @cuda.jit
    def kernel(cases, out, addresses):
        smem = cuda.shared.array(2048, dtype=np.uint32)
        i = cuda.threadIdx.x
        if i < cases.shape[0]:
            index, lbo, sbo, sw = cases[i, 0], cases[i, 1], cases[i, 2], cases[i, 3]
            addresses[i] = shared_address(smem, index)
            out[i, 0] = smem_desc(smem, index, lbo, sbo, sw)
            out[i, 1] = make_smem_desc(shared_address(smem, index), lbo, sbo, sw)

    out = np.zeros((len(cases), 2), dtype=np.uint64)
    addresses = np.zeros(len(cases), dtype=np.int64)
    kernel[1, 32](cases, out, addresses)
    for (index, lbo, sbo, sw), got, addr in zip(cases, out, addresses):
        want = make_smem_desc_host(int(addr), int(lbo), int(sbo), int(sw))
        assert int(got[0]) == int(got[1]) == want, (index, hex(int(got[0])), hex(want))
        assert decode_smem_desc(want) == dict(addr=int(addr), lbo=int(lbo), sbo=int(sbo),
                                              base_offset=0, swizzle=int(sw))
    assert addresses[1] - addresses[0] == 32
