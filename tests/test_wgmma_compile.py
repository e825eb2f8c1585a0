"""wgmma: every table row assembles on sm_90a and only there, the numba intrinsics emit it for
each accumulator type and operand form, invalid variants are refused at build or typing time, and
a multi-step N=256 loop keeps its accumulator in registers with no wait injected by ptxas."""

import re

import numpy as np
import pytest
from numba import cuda, types
from numba.cuda.np.unsafe.ndarray import to_fixed_tuple

from intrinsics._core import SM90A
from intrinsics.smem import shared_address
from intrinsics.toolchain import AssemblyError, assemble, compile_ptx
from intrinsics.wgmma import (
    WGMMA_TABLE,
    WgmmaSpec,
    make_smem_desc,
    smem_desc,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_fence_operand,
    wgmma_mma_async,
    wgmma_specs,
    wgmma_wait_group,
)
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

# ---------------------------------------------------------------------------------------------
# The table against ptxas, through hand-written PTX (fast: no numba in the loop)
# ---------------------------------------------------------------------------------------------


def raw_ptx(spec, target="sm_90a", body=None):
    """A one-kernel PTX module running ``spec``'s asm template with plain registers."""
    r = spec.acc_regs
    reg = "%f" if spec.acc == "f32" else "%h"

    def operand(match):
        i = int(match.group(1))
        if i < r:
            return f"{reg}{i}"
        rest = i - 2 * r
        if spec.a_from == "reg":
            if rest < 4:
                return f"%a{rest}"
            rest -= 3
        return ("%rd1", "%rd2", "%sd")[rest]

    if body is None:
        body = re.sub(r"\$(\d+)", operand, spec.template)
    return f"""
.version 8.0
.target {target}
.address_size 64
.visible .entry k(.param .u64 p)
{{
  .reg .b64 %rd<3>; .reg .b32 %sd; .reg .b32 %a<4>; .reg .f32 %f<{r}>; .reg .b32 %h<{r}>;
  ld.param.u64 %rd1, [p]; ld.param.u64 %rd2, [p]; mov.b32 %sd, 1;
  mov.b32 %a0, 0; mov.b32 %a1, 0; mov.b32 %a2, 0; mov.b32 %a3, 0;
  {body}
  ret;
}}
"""


def test_every_table_row_assembles_for_sm_90a():
    """Each input/accumulator combination with every N of the table, SS and RS forms."""
    specs = wgmma_specs("smem") + wgmma_specs("reg")
    assert len(specs) == 2 * 32 * (2 + 1 + 1 + 4 * 2)
    for spec in specs:
        try:
            assemble(raw_ptx(spec), "sm_90a")
        except AssemblyError as exc:
            pytest.fail(f"{spec.ptx} ({spec.a_from}) refused: {exc}")


@pytest.mark.parametrize(
    "spec, patch",
    [
        (WgmmaSpec(100, "bf16", "bf16", "f32", 16, 2), None),  # N not a multiple of 8
        (WgmmaSpec(264, "bf16", "bf16", "f32", 16, 2), None),  # N above 256
        (WgmmaSpec(64, "bf16", "bf16", "f16", 16, 2), None),  # bf16 has no f16 accumulator
        (WgmmaSpec(64, "tf32", "tf32", "f16", 8, 4), None),
        (WgmmaSpec(64, "f16", "bf16", "f32", 16, 2), None),  # no mixed 16-bit types
        (WgmmaSpec(64, "bf16", "bf16", "f32", 16, 2, scale_a=2), None),
        (WgmmaSpec(64, "bf16", "bf16", "f32", 16, 2, trans_b=2), None),
        # transposes for fp8 / tf32, and trans-a in the RS form, do not exist:
        (WgmmaSpec(64, "e4m3", "e4m3", "f32", 32, 1), ("p, 1, 1; }", "p, 1, 1, 0, 0; }")),
        (WgmmaSpec(64, "tf32", "tf32", "f32", 8, 4), ("p, 1, 1; }", "p, 1, 1, 0, 1; }")),
        (
            WgmmaSpec(64, "bf16", "bf16", "f32", 16, 2, a_from="reg"),
            ("p, 1, 1, 0; }", "p, 1, 1, 1, 0; }"),
        ),
    ],
    ids=lambda v: getattr(v, "ptx", None),
)
def test_ptxas_refuses_what_the_factory_refuses(spec, patch):
    ptx = raw_ptx(spec)
    if patch:
        assert patch[0] in ptx
        ptx = ptx.replace(*patch)
    with pytest.raises(AssemblyError):
        assemble(ptx, "sm_90a")


_ONE_INSTRUCTION = {
    "mma_async": None,
    "fence": "wgmma.fence.sync.aligned;",
    "commit_group": "wgmma.commit_group.sync.aligned;",
    "wait_group": "wgmma.wait_group.sync.aligned 0;",
}


@pytest.mark.parametrize("what", list(_ONE_INSTRUCTION))
@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"])
def test_only_sm_90a_assembles_wgmma(what, target):
    """The reason the intrinsics require SM90A: ptxas takes each wgmma instruction for sm_90a
    and refuses it for plain sm_90 and for the Blackwell targets."""
    spec = WgmmaSpec(64, "bf16", "bf16", "f32", 16, 2)
    ptx = raw_ptx(spec, target, body=_ONE_INSTRUCTION[what])
    if target == "sm_90a":
        assert assemble(ptx, target)
        assert SM90A.accepts((9, 0, "a"))
    else:
        with pytest.raises(AssemblyError, match="not supported on .target"):
            assemble(ptx, target)


# ---------------------------------------------------------------------------------------------
# The numba intrinsics
# ---------------------------------------------------------------------------------------------


def _kernel(mma, pattern=True):
    """acc from memory, one mma, commit/wait/fence_operand, acc back to memory."""
    spec = mma.spec
    regs = spec.acc_regs
    acc_t = types.float32 if spec.acc == "f32" else types.uint32

    if spec.a_from == "smem":

        def kernel(c, out, descs, scale_d):
            t = cuda.threadIdx.x
            acc = to_fixed_tuple(c[t], regs)
            wgmma_fence()
            acc = mma(acc, descs[0], descs[1], scale_d)
            wgmma_commit_group()
            wgmma_wait_group(0)
            acc = wgmma_fence_operand(acc)
            for i in range(regs):
                out[t, i] = acc[i]

        sig = (acc_t[:, ::1], acc_t[:, ::1], types.uint64[::1], types.int32)
    else:

        def kernel(c, out, descs, a, scale_d):
            t = cuda.threadIdx.x
            acc = to_fixed_tuple(c[t], regs)
            frag = (a[t, 0], a[t, 1], a[t, 2], a[t, 3])
            wgmma_fence()
            acc = mma(acc, frag, descs[1], scale_d)
            wgmma_commit_group()
            wgmma_wait_group(0)
            acc = wgmma_fence_operand(acc)
            for i in range(regs):
                out[t, i] = acc[i]

        sig = (acc_t[:, ::1], acc_t[:, ::1], types.uint64[::1], types.uint32[:, ::1], types.int32)
    return kernel, sig


_GROUP_PTX = [
    "wgmma.fence.sync.aligned;",
    "wgmma.commit_group.sync.aligned;",
    "wgmma.wait_group.sync.aligned 0;",
    "setp.ne.b32",
]


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("a_from", ["smem", "reg"])
def test_wgmma_n256_on_each_arch(arch, a_from):
    mma = wgmma_mma_async(256, "bf16", a_from=a_from)
    kernel, sig = _kernel(mma)
    check_on_arch(kernel, sig, arch, SM90A, [mma.spec.ptx] + _GROUP_PTX)


def _combinations():
    for family, (_, _, accs, _, _) in WGMMA_TABLE.items():
        for a in family:
            for b in family if len(family) > 1 else (a,):
                for acc in accs:
                    yield a, b, acc


@pytest.mark.parametrize("a_from", ["smem", "reg"])
@pytest.mark.parametrize("a, b, acc", list(_combinations()))
def test_every_type_combination_through_numba(a, b, acc, a_from):
    """Each (A, B, accumulator) with both operand forms, at N=24 (an odd multiple of 8)."""
    mma = wgmma_mma_async(24, a, b, acc, a_from=a_from)
    kernel, sig = _kernel(mma)
    ptx = compile_ptx(kernel, sig, "sm_90a")
    assert mma.spec.ptx in ptx
    assert len(assemble(ptx, "sm_90a")) > 0


@pytest.mark.parametrize(
    "kwargs, tail",
    [
        (dict(n=64, a="bf16"), "p, 1, 1, 0, 0; }"),
        (dict(n=64, a="bf16", scale_a=-1, trans_b=1), "p, -1, 1, 0, 1; }"),
        (dict(n=64, a="f16", scale_b=-1, trans_a=1, trans_b=1), "p, 1, -1, 1, 1; }"),
        (dict(n=64, a="bf16", a_from="reg", trans_b=1), "p, 1, 1, 1; }"),
        (dict(n=64, a="e4m3", b="e5m2", scale_a=-1), "p, -1, 1; }"),
        (dict(n=64, a="tf32", a_from="reg", scale_b=-1), "p, 1, -1; }"),
    ],
)
def test_immediates_in_the_instruction(kwargs, tail):
    mma = wgmma_mma_async(**kwargs)
    assert mma.spec.template.endswith(tail)
    assert mma.spec.template in mma.__doc__
    kernel, sig = _kernel(mma)
    ptx = compile_ptx(kernel, sig, "sm_90a")
    assert tail.rstrip(" }") in ptx
    assemble(ptx, "sm_90a")


def test_template_operands():
    ss = wgmma_mma_async(16, "bf16").spec  # 8 accumulator registers
    assert ss.template == (
        "{ .reg .pred p; setp.ne.b32 p, $18, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{$0, $1, $2, $3, $4, $5, $6, $7}, $16, $17, p, 1, 1, 0, 0; }"
    )
    assert ss.constraints == ["=f"] * 8 + [str(i) for i in range(8)] + ["l", "l", "r"]
    rs = wgmma_mma_async(16, "f16", acc="f16", a_from="reg").spec  # 4 packed f16x2 registers
    assert rs.template == (
        "{ .reg .pred p; setp.ne.b32 p, $13, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f16.f16.f16 "
        "{$0, $1, $2, $3}, {$8, $9, $10, $11}, $12, p, 1, 1, 0; }"
    )
    assert rs.constraints == ["=r"] * 4 + ["0", "1", "2", "3"] + ["r"] * 4 + ["l", "r"]


def test_factory_caches():
    assert wgmma_mma_async(64, "bf16") is wgmma_mma_async(64, "bf16", "bf16", "f32")
    assert wgmma_mma_async(64, "bf16") is not wgmma_mma_async(64, "bf16", scale_a=-1)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((100, "bf16"), {}, "wgmma N must be a multiple of 8 in 8..256, got 100"),
        ((0, "bf16"), {}, "wgmma N must be a multiple of 8 in 8..256, got 0"),
        ((264, "e4m3"), {}, "wgmma N must be a multiple of 8 in 8..256, got 264"),
        ((64, "s8"), {}, "no input type 's8'; valid inputs -> accumulators: f16 -> f32/f16"),
        ((64, "bf16", "bf16", "f16"), {}, "A=bf16 accumulates in f32, got 'f16'"),
        ((64, "tf32", "tf32", "f16"), {}, "A=tf32 accumulates in f32, got 'f16'"),
        ((64, "f16", "bf16"), {}, "A=f16 takes B=f16, got B='bf16'"),
        ((64, "e4m3", "f16"), {}, "A=e4m3 takes B=e4m3/e5m2"),
        ((64, "bf16"), {"scale_a": 2}, "scale_a must be 1 or -1, got 2"),
        ((64, "bf16"), {"scale_b": 0}, "scale_b must be 1 or -1, got 0"),
        ((64, "bf16"), {"trans_b": 2}, r"trans_b must be 0 \(K-major\) or 1 \(MN-major\), got 2"),
        ((64, "e4m3"), {"trans_b": 1}, "transposes .* exist only for f16/bf16"),
        ((64, "tf32"), {"trans_a": 1}, "transposes .* exist only for f16/bf16"),
        ((64, "bf16"), {"a_from": "reg", "trans_a": 1}, "the RS form takes trans_a=0"),
        ((64, "bf16"), {"a_from": "regs"}, "a_from must be 'smem' .* or 'reg'"),
    ],
)
def test_invalid_variants_name_the_valid_ones(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        wgmma_mma_async(*args, **kwargs)


def _typing_error(kernel, sig, message):
    from numba.core.errors import TypingError

    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, sig, "sm_90a")


def test_wrong_accumulator_type_is_a_typing_error():
    mma = wgmma_mma_async(16, "bf16")

    def kernel(out, d):
        acc = mma((out[0], out[1], out[2], out[3]), d[0], d[1], 1)
        out[0] = acc[0]

    _typing_error(
        kernel, (types.float32[::1], types.uint64[::1]),
        r"the accumulator must be UniTuple\(float32 x 8\)",
    )


def test_wrong_fragment_and_descriptor_types_are_typing_errors():
    rs = wgmma_mma_async(8, "bf16", a_from="reg")

    def kernel(out, d):
        acc = rs((out[0], out[1], out[2], out[3]), (d[0], d[1]), d[1], 1)
        out[0] = acc[0]

    _typing_error(
        kernel, (types.float32[::1], types.uint32[::1]),
        r"the A fragment must be UniTuple\(uint32 x 4\)",
    )
    ss = wgmma_mma_async(8, "bf16")

    def kernel2(out, d):
        acc = ss((out[0], out[1], out[2], out[3]), out[0], d[0], 1)
        out[0] = acc[0]

    _typing_error(
        kernel2, (types.float32[::1], types.uint64[::1]), "the A descriptor must be a 64-bit"
    )


def test_wait_group_takes_a_literal_0_to_7():
    def ok(x):
        wgmma_wait_group(7)

    ptx = compile_ptx(ok, (types.int32,), "sm_90a")
    assert "wgmma.wait_group.sync.aligned 7;" in ptx

    def too_big(x):
        wgmma_wait_group(8)

    _typing_error(too_big, (types.int32,), r"must be one of \[0, 1, 2, 3, 4, 5, 6, 7\], got 8")

    def runtime(x):
        wgmma_wait_group(x)

    _typing_error(runtime, (types.int32,), "wgmma_wait_group")


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_fences_and_groups_on_each_arch(arch):
    def kernel(x):
        wgmma_fence()
        wgmma_commit_group()
        wgmma_wait_group(1)

    check_on_arch(
        kernel, (types.int32,), arch, SM90A,
        ["wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
         "wgmma.wait_group.sync.aligned 1;"],
    )


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_descriptors_and_fence_operand_compile_everywhere(arch):
    """No instruction behind them: they compile for every architecture."""

    def kernel(out, f, lbo, sbo, sw):
        smem = cuda.shared.array(1024, dtype=np.uint32)
        out[0] = make_smem_desc(shared_address(smem, 64), lbo, sbo, sw)
        out[1] = smem_desc(smem, 64, lbo, sbo, sw)
        g = wgmma_fence_operand((f[0], f[1]))
        f[2] = g[0] + g[1]
        f[3] = wgmma_fence_operand(f[0])
        # nested: the RS A fragments of two k steps, one asm with 4 operands in and out
        u, w = np.uint32(lbo), np.uint32(sbo)
        pa = wgmma_fence_operand(((u, w), (w, u)))
        out[2] = pa[0][1] + pa[1][0]

    ptx = compile_ptx(
        kernel, (types.uint64[::1], types.float32[::1], types.int64, types.int32, types.int32), arch
    )
    assert "cvt.rn.f64" not in ptx and "cvt.rzi" not in ptx, "descriptor math went through floats"
    # the nested fence is one asm of 4 outputs tied to 4 inputs (no instruction inside)
    assert re.search(r"// begin inline asm\s*\n\s*// end inline asm", ptx)
    assemble(ptx, arch)


# ---------------------------------------------------------------------------------------------
# Registers, local memory and ptxas's view of the accumulator
# ---------------------------------------------------------------------------------------------


def _ptxas_log(ptx, arch, option):
    from cuda.bindings import nvjitlink

    opts = [f"-arch={arch}", "-O3", option]
    handle = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
        return bytes(log).rstrip(b"\0").decode(errors="replace")
    finally:
        nvjitlink.destroy(handle)


@pytest.mark.parametrize("acc", ["f32", "f16"])
def test_n256_k_loop_keeps_the_accumulator_in_registers(acc):
    """4 K-steps of m64n256k16 on one accumulator (the GEMM main-loop shape): no local memory in
    the PTX; ptxas (-v through nvJitLink's -Xptxas, and nvJitLink's own -verbose) reports no
    stack, no spills, no lmem; and it had to inject no wgmma.wait_group (info C7517), so the
    wait + fence_operand pattern keeps every read of the accumulator after the wait."""
    mma = wgmma_mma_async(256, "f16", acc=acc)
    regs = mma.spec.acc_regs
    acc_t = types.float32 if acc == "f32" else types.uint32

    def kernel(c, out, k_offsets, lbo, sbo):
        smem = cuda.shared.array(0, dtype=np.uint32)
        t = cuda.threadIdx.x
        acc = wgmma_fence_operand(to_fixed_tuple(c[t], regs))
        wgmma_fence()
        for ks in range(4):
            da = smem_desc(smem, k_offsets[ks], lbo, sbo, 128)
            db = smem_desc(smem, 2048 + k_offsets[ks], lbo, sbo, 128)
            acc = mma(acc, da, db, 1)
        wgmma_commit_group()
        wgmma_wait_group(0)
        acc = wgmma_fence_operand(acc)
        for i in range(regs):
            out[t, i] = acc[i]

    sig = (acc_t[:, ::1], acc_t[:, ::1], types.int64[::1], types.int32, types.int32)
    ptx = compile_ptx(kernel, sig, "sm_90a")
    assert ptx.count(mma.spec.ptx) >= 1
    assert "ld.local" not in ptx and "st.local" not in ptx and ".local" not in ptx

    # Every store of the result comes after the wait in the PTX.
    wait = ptx.index("wgmma.wait_group.sync.aligned 0;")
    store = "st.global.f32" if acc == "f32" else "st.global.u32"
    stores = [m.start() for m in re.finditer(re.escape(store), ptx)]
    assert stores and min(stores) > wait

    log = _ptxas_log(ptx, "sm_90a", "-Xptxas=-v")
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7517" not in log and "injected" not in log, log
    assert "serializ" not in log.lower(), log
    verbose = _ptxas_log(ptx, "sm_90a", "-verbose")
    assert "0 bytes lmem" in verbose and "0 stack" in verbose, verbose


def test_ptxas_reports_a_read_before_the_wait():
    """The check above can fail: without commit/wait, reading the accumulator makes ptxas inject
    a wait (C7517) -- the symptom the wait + fence_operand pattern avoids."""
    mma = wgmma_mma_async(64, "bf16")

    def kernel(c, out, descs):
        t = cuda.threadIdx.x
        acc = to_fixed_tuple(c[t], 32)
        wgmma_fence()
        acc = mma(acc, descs[0], descs[1], 1)
        for i in range(32):
            out[t, i] = acc[i]

    sig = (types.float32[:, ::1], types.float32[:, ::1], types.uint64[::1])
    ptx = compile_ptx(kernel, sig, "sm_90a")
    assert "C7517" in _ptxas_log(ptx, "sm_90a", "-Xptxas=-v")
