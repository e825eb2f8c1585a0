"""tcgen05: every asm form the module can emit assembles (nvJitLink) for sm_100a, sm_103a and
sm_110a -- their ``f`` targets too, except the ``.scale_vec::NX`` spellings -- and is refused for
sm_90a and sm_120a; the numba intrinsics emit it on each claimed architecture and raise
ArchitectureError elsewhere; bad variants are refused at build or typing time; the builders pack
the PTX ISA's bit fields (checked against hand-computed values); the layout models say what the
ISA tables say.  No Blackwell GPU was available: the assembler is the proof of the syntax, the
tables of the bit layouts."""

import re

import numpy as np

import intrinsics.catalog as catalog
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

from intrinsics._core import ArchitectureError
from intrinsics.layout import (
    TCGEN05_CP_SHAPES,
    SmemLayout,
    TCGEN05_LDST_SHAPES,
    TCGEN05_MMA_KINDS,
    check_mma_shape,
    cp_lane_map,
    decode_instr_desc,
    decode_tmem_address,
    decode_umma_smem_desc,
    ldst_coords,
    make_instr_desc_block_scaled_host,
    make_instr_desc_host,
    make_umma_smem_desc_host,
    scale_factor_coords,
    tmem_address_host,
    tmem_d_coords,
    umma_smem_desc_address_host,
)
from intrinsics.tcgen05 import (
    TCGEN05,
    TCGEN05_A_ONLY,
    Tcgen05MmaSpec,
    Tcgen05ValueError,
    make_instr_desc,
    make_instr_desc_block_scaled,
    make_umma_smem_desc,
    tcgen05_alloc,
    tcgen05_alloc_cg2,
    tcgen05_alloc_op,
    tcgen05_commit,
    tcgen05_commit_multicast,
    tcgen05_commit_multicast_cg2,
    tcgen05_commit_op,
    tcgen05_cp,
    tcgen05_dealloc,
    tcgen05_dealloc_cg2,
    tcgen05_dealloc_op,
    tcgen05_fence_after_thread_sync,
    tcgen05_fence_before_thread_sync,
    tcgen05_ld,
    tcgen05_mma,
    tcgen05_mma_specs,
    tcgen05_relinquish_alloc_permit,
    tcgen05_relinquish_alloc_permit_cg2,
    tcgen05_relinquish_alloc_permit_op,
    tcgen05_st,
    tcgen05_wait_ld,
    tcgen05_wait_ld_regs,
    tcgen05_wait_st,
    tmem_address,
    umma_smem_desc,
)
from intrinsics.toolchain import AssemblyError, assemble, compile_ptx
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

ACCEPT = ["sm_100a", "sm_103a", "sm_110a"]
ACCEPT_F = ["sm_100f", "sm_103f", "sm_110f"]
REFUSE = ["sm_90a", "sm_120a"]

# ---------------------------------------------------------------------------------------------
# Every form against ptxas (hand-written PTX around each asm template: fast, no numba)
# ---------------------------------------------------------------------------------------------


def raw_ptx(template, constraints, target):
    """A one-kernel PTX module running ``template`` with plain registers of each constraint."""
    regs = {"r": "%r{}", "l": "%rd{}", "h": "%h{}"}

    def operand(match):
        i = int(match.group(1))
        kind = constraints[i].lstrip("=")
        if kind.isdigit():  # tied to an output
            kind = constraints[int(kind)].lstrip("=")
        return regs[kind].format(i + 1)

    body = re.sub(r"\$(\d+)", operand, template)
    return f"""
.version 9.0
.target {target}
.address_size 64
.visible .entry k(.param .u64 p)
{{
  .reg .b32 %r<300>; .reg .b64 %rd<16>; .reg .b16 %h<16>; .reg .pred %p<4>;
  ld.param.u64 %rd1, [p]; setp.ne.b64 %p1, %rd1, 0;
  {body}
  ret;
}}
"""


def all_forms():
    """(name, template, constraints, Arch) of every asm form the module emits."""
    fns = [tcgen05_alloc, tcgen05_alloc_cg2, tcgen05_dealloc, tcgen05_dealloc_cg2,
           tcgen05_relinquish_alloc_permit, tcgen05_relinquish_alloc_permit_cg2,
           tcgen05_wait_ld, tcgen05_wait_st, tcgen05_wait_ld_regs,
           tcgen05_fence_before_thread_sync, tcgen05_fence_after_thread_sync]
    fns += [tcgen05_commit_op(g, m) for g in (1, 2) for m in (False, True)]
    fns += [tcgen05_cp(shape, g) for shape in TCGEN05_CP_SHAPES for g in (1, 2)]
    for shape, (_, top) in TCGEN05_LDST_SHAPES.items():
        for num in (1 << i for i in range(8) if 1 << i <= top):
            fns += [tcgen05_ld(shape, num), tcgen05_st(shape, num)]
    fns += [tcgen05_mma(s.kind, s.cta_group, s.a_from, s.scale_vec) for s in tcgen05_mma_specs()]
    return [(t, c, fn.arch) for fn in fns for t, c in fn.forms]


FORMS = all_forms()


def test_the_table_is_complete():
    specs = tcgen05_mma_specs()
    # 3 dense kinds + (3 + 3 + 4) block-scaled spellings, x 2 CTA groups x 2 A sources
    assert len(specs) == (3 + 10) * 2 * 2
    assert {s.kind for s in specs} == set(TCGEN05_MMA_KINDS)
    ldst = sum(1 for t, *_ in FORMS if t.startswith(("tcgen05.ld", "tcgen05.st")))
    assert ldst == 2 * (8 + 8 + 7 + 6)  # 32x32b, 16x64b: x1..x128; 16x128b: ..x64; 16x256b: ..x32
    # alloc/dealloc: 5 literal counts + a register, x 2 groups; relinquish 2; waits 3; fences 2;
    # commits 4; cp 6 shapes x 2 groups; ld/st 58; mma 52
    assert len(FORMS) == 2 * 2 * 6 + 2 + 3 + 2 + 4 + 12 + 58 + 52


def test_every_form_assembles_where_claimed_and_only_there():
    for template, constraints, arch in FORMS:
        targets = ACCEPT + ACCEPT_F + REFUSE
        for target in targets:
            ptx = raw_ptx(template, constraints, target)
            cc = (int(target[3:-2]), int(target[-2]), target[-1])
            if arch.accepts(cc):
                try:
                    assemble(ptx, target)
                except AssemblyError as exc:
                    pytest.fail(f"{template} refused for {target}: {exc}")
            else:
                with pytest.raises(AssemblyError, match="not supported on .target"):
                    assemble(ptx, target)


def test_the_claims():
    """What the table above proves, stated once: tcgen05 on sm_100/103/110 'a' and 'f' targets;
    the .scale_vec::NX spellings on the 'a' targets only; never on Hopper or sm_120."""
    for cc in [(10, 0, "a"), (10, 3, "a"), (11, 0, "a"), (10, 0, "f"), (11, 0, "f")]:
        assert TCGEN05.accepts(cc)
    for cc in [(9, 0, "a"), (12, 0, "a"), (12, 1, "a"), (10, 0), (8, 0)]:
        assert not TCGEN05.accepts(cc)
    assert TCGEN05_A_ONLY.accepts((10, 3, "a")) and not TCGEN05_A_ONLY.accepts((10, 0, "f"))
    assert tcgen05_mma("mxf4nvf4", scale_vec="4X").arch is TCGEN05_A_ONLY
    assert tcgen05_mma("mxf4nvf4", scale_vec="block16").arch is TCGEN05


_REGS256 = ", ".join(f"%r{i + 10}" for i in range(256))
_MMA_OPS = "[%r1], %rd1, %rd1, %r2, [%r3], [%r4], %p1;"


@pytest.mark.parametrize("template, error", [
    # ptxas refuses what the factories refuse, for the reason they give
    ("tcgen05.ld.sync.aligned.16x128b.x128.b32 {%s}, [%%r1];" % _REGS256, "Illegal vector size"),
    ("tcgen05.ld.sync.aligned.16x256b.x64.b32 {%s}, [%%r1];" % _REGS256, "Illegal vector size"),
    ("tcgen05.ld.sync.aligned.32x32b.x256.b32 {%s}, [%%r1];" % _REGS256,
     "Unknown modifier '.x256'"),
    ("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::2X " + _MMA_OPS,
     "'.kind::mxf8f6f4' cannot be combined with modifier '.scale_vec::2X'"),
    ("tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::1X " + _MMA_OPS,
     "'.kind::mxf4' cannot be combined with modifier '.scale_vec::1X'"),
    ("tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale " + _MMA_OPS,
     "'.kind::mxf4nvf4' requires modifier '.scale_vectorsize'"),
    ("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block16 " + _MMA_OPS,
     "'.kind::mxf8f6f4' cannot be combined with modifier '.block16'"),
    ("tcgen05.mma.cta_group::1.kind::f16.block_scale " + _MMA_OPS,
     "'.kind::f16' cannot be combined with modifier '.block_scale'"),
    ("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cta.b64 [%r1];",
     "State space incorrect"),
], ids=lambda t: t[:60])
def test_ptxas_refuses_what_the_factories_refuse(template, error):
    with pytest.raises(AssemblyError, match=re.escape(error)):
        assemble(raw_ptx(template, [], "sm_100a"), "sm_100a")


def test_a_kernel_cannot_mix_cta_groups():
    """NOTE: ptxas refuses a kernel that uses both .cta_group::1 and ::2 ("uses single CTA and CTA
    pair granularity and that is not allowed"): pick one per kernel."""
    body = ("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n"
            "  tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned;")
    with pytest.raises(AssemblyError, match="CTA pair granularity"):
        assemble(raw_ptx(body, [], "sm_100a"), "sm_100a")


# ---------------------------------------------------------------------------------------------
# The numba intrinsics
# ---------------------------------------------------------------------------------------------

# The kernel with every cta_group::1 intrinsic is the catalog's (python -m numbatc reports it).
list(catalog._tcgen05_probes())  # binds the factories' intrinsics it uses
_full_kernel = catalog.tcgen05_kernel
MMA, LD, ST, CP = catalog._TC_MMA, catalog._TC_LD, catalog._TC_ST, catalog._TC_CP


_FULL_SIG = catalog.TCGEN05_SIGNATURE
_FULL_PTX = [
    "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r", "], 128;",
    "tcgen05.fence::before_thread_sync;", "tcgen05.fence::after_thread_sync;",
    "tcgen05.cp.cta_group::1.32x128b.warpx4 [", "tcgen05.mma.cta_group::1.kind::f16 [",
    "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [",
    ".multicast::cluster.b64 [", "tcgen05.ld.sync.aligned.32x32b.x8.b32 {",
    "tcgen05.wait::ld.sync.aligned;", "tcgen05.st.sync.aligned.16x256b.x2.b32 [",
    "tcgen05.wait::st.sync.aligned;", "tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r",
    "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;",
]


@pytest.mark.parametrize("arch", ARCH_NAMES + ["sm_103a", "sm_110a"])
def test_the_intrinsics_on_each_arch(arch):
    """One kernel with every cta_group::1 intrinsic: emitted and assembled where claimed (the
    literal column count as an immediate, a run-time one in a register), an ArchitectureError
    naming the target elsewhere."""
    if arch in ARCH_NAMES:
        ptx = check_on_arch(_full_kernel, _FULL_SIG, arch, TCGEN05, _FULL_PTX)
    else:  # targets tests/helpers/compilecheck.py does not list: the same checks by hand
        ptx = compile_ptx(_full_kernel, _FULL_SIG, arch)
        assert all(text in ptx for text in _FULL_PTX) and "ld.local" not in ptx
        assemble(ptx, arch)
    if ptx is not None:
        assert re.search(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32 "
                         r"\[%r\d+\], %r\d+;", ptx), "run-time column count not in a register"


def test_cta_group_2_intrinsics():
    mma2 = tcgen05_mma("f16", cta_group=2)
    cp2 = tcgen05_cp("128x256b", cta_group=2)

    def kernel(descs):
        slot = cuda.shared.array(1, np.uint32)
        bars = cuda.shared.array(1, np.uint64)
        tcgen05_alloc_cg2(slot, 0, 256)
        cuda.syncthreads()
        d = slot[0]
        cp2(d, descs[0])
        mma2(d, descs[0], descs[1], np.uint32(descs[2]), 1)
        tcgen05_commit_multicast_cg2(bars, 0, 0x3)
        tcgen05_dealloc_cg2(d, 256)
        tcgen05_relinquish_alloc_permit_cg2()

    ptx = compile_ptx(kernel, (types.uint64[::1],), "sm_100a")
    for text in ["tcgen05.alloc.cta_group::2", "tcgen05.cp.cta_group::2.128x256b",
                 "tcgen05.mma.cta_group::2.kind::f16", "tcgen05.commit.cta_group::2",
                 "tcgen05.dealloc.cta_group::2", "tcgen05.relinquish_alloc_permit.cta_group::2"]:
        assert text in ptx
    assemble(ptx, "sm_100a")


def _calls(specs):
    """Source of a kernel calling every variant: numba needs each intrinsic as a global name."""
    lines = ["def kernel(descs, t):", "    a, b, i = descs[0], descs[1], np.uint32(descs[2])"]
    env = {"np": np}
    for n, s in enumerate(specs):
        env[f"m{n}"] = tcgen05_mma(s.kind, s.cta_group, s.a_from, s.scale_vec)
        a = "t + 64" if s.a_from == "tmem" else "a"
        scale = "t + 128, t + 136, " if s.block_scaled else ""
        lines.append(f"    m{n}(t, {a}, b, i, {scale}{n % 2})")
    exec("\n".join(lines), env)
    return env["kernel"]


@pytest.mark.parametrize("cta_group", [1, 2])
def test_every_mma_variant_through_numba(cta_group):
    """Each kind / A source / scale-vector spelling of one CTA group, in one kernel (ptxas allows
    one CTA group per kernel), emitted as the template says and assembled for sm_100a."""
    specs = [s for s in tcgen05_mma_specs() if s.cta_group == cta_group]
    ptx = compile_ptx(_calls(specs), (types.uint64[::1], types.uint32), "sm_100a")
    for s in specs:
        head = s.template.split("; ")[2].split(" [")[0]
        a = r"\[%r\d+\]" if s.a_from == "tmem" else r"%rd\d+"
        rest = r", \[%r\d+\], \[%r\d+\]" if s.block_scaled else ""
        pattern = re.escape(head) + r" \[%r\d+\], " + a + r", %rd\d+, %r\d+" + rest + ", p;"
        assert re.search(pattern, ptx), f"{head} ({s.a_from}) not emitted as expected"
    assemble(ptx, "sm_100a")


def test_scale_vec_spellings_follow_the_targets():
    """.scale_vec::4X needs an 'a' target (ArchitectureError for sm_100f); .block16 is portable."""
    nx = _calls([Tcgen05MmaSpec("mxf4nvf4", 1, "smem", "4X")])
    with pytest.raises(ArchitectureError, match="sm_100f"):
        compile_ptx(nx, (types.uint64[::1], types.uint32), "sm_100f")
    block = _calls([Tcgen05MmaSpec("mxf4nvf4", 1, "smem", "block16")])
    assemble(compile_ptx(block, (types.uint64[::1], types.uint32), "sm_100f"), "sm_100f")


def test_every_ld_st_shape_through_numba():
    """Each shape at its smallest and largest .num: the register tuple in and out (128 registers
    for the largest), no local memory, assembled for sm_100a."""
    lines = ["def kernel(out, t):"]
    env = {"tcgen05_wait_ld_regs": tcgen05_wait_ld_regs}
    n = 0
    for shape, (per, top) in TCGEN05_LDST_SHAPES.items():
        for num in (1, top):
            env[f"ld{n}"], env[f"st{n}"] = tcgen05_ld(shape, num), tcgen05_st(shape, num)
            lines += [f"    r{n} = tcgen05_wait_ld_regs(ld{n}(t))", f"    st{n}(t + 4, r{n})",
                      f"    out[{n}] = r{n}[{per * num - 1}]"]
            n += 1
    exec("\n".join(lines), env)
    ptx = check_on_arch(env["kernel"], (types.uint32[::1], types.uint32), "sm_100a", TCGEN05,
                        ["tcgen05.ld.sync.aligned.32x32b.x128.b32 {", "16x256b.x32.b32 {",
                         "tcgen05.st.sync.aligned.16x128b.x64.b32 ["])
    assert ptx.count("tcgen05.ld.sync.aligned") == ptx.count("tcgen05.st.sync.aligned") == n


def test_wait_ld_regs_ties_the_registers_through_the_wait():
    """The registers come out of the wait's asm: a use cannot be scheduled above it."""
    ld = tcgen05_ld("32x32b", 2)

    def kernel(out, t):
        r = tcgen05_wait_ld_regs(ld(t))
        out[0] = r[0] + r[1]

    ptx = compile_ptx(kernel, (types.uint32[::1], types.uint32), "sm_100a")
    lines = ptx.splitlines()
    wait = next(i for i, line in enumerate(lines) if "tcgen05.wait::ld" in line)
    add = next(i for i, line in enumerate(lines) if "add.s32" in line)
    assert wait < add
    assemble(ptx, "sm_100a")


# ---------------------------------------------------------------------------------------------
# Typing-time and build-time errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ncols", [16, 48, 100, 1024])
def test_literal_column_counts_are_checked_at_typing_time(ncols):
    def kernel(x):
        slot = cuda.shared.array(1, np.uint32)
        tcgen05_alloc(slot, 0, ncols)

    with pytest.raises(Tcgen05ValueError, match=(
            r"tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32: the column count must be "
            rf"a power of two in 32..512 \(one of \[32, 64, 128, 256, 512\]\), got {ncols}")):
        compile_ptx(kernel, (types.int32,), "sm_100a")

    def dealloc(x):
        tcgen05_dealloc(x, ncols)

    with pytest.raises(Tcgen05ValueError, match=rf"power of two in 32..512 .*got {ncols}"):
        compile_ptx(dealloc, (types.uint32,), "sm_100a")


def _typing_error(kernel, sig, message):
    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, sig, "sm_100a")


def test_wrong_argument_types_are_typing_errors():
    def alloc_into_int32(x):
        slot = cuda.shared.array(1, np.int32)
        tcgen05_alloc(slot, 0, 32)

    _typing_error(alloc_into_int32, (types.int32,), "the destination array must hold uint32")

    def commit_on_uint32(x):
        bars = cuda.shared.array(1, np.uint32)
        tcgen05_commit(bars, 0)

    _typing_error(commit_on_uint32, (types.int32,), "the mbarrier array must hold uint64")

    def store_wrong_tuple(x):
        ST(x, (x, x))

    _typing_error(store_wrong_tuple, (types.uint32,),
                  r"the registers must be UniTuple\(uint32 x 8\)")

    def mma_float_desc(x, f):
        MMA(x, f, f, x, 1)

    _typing_error(mma_float_desc, (types.uint32, types.float32),
                  "the A descriptor .* must be an integer")

    def wait_float(f):
        tcgen05_wait_ld_regs((f, f))

    _typing_error(wait_float, (types.float32,), "takes a uint32 or a UniTuple of uint32")


@pytest.mark.parametrize("call, message", [
    (lambda: tcgen05_mma("f32"), "no kind 'f32'; valid kinds: f16, tf32, f8f6f4, mxf8f6f4"),
    (lambda: tcgen05_mma("f16", cta_group=3), "cta_group must be 1 or 2, got 3"),
    (lambda: tcgen05_mma("f16", a_from="reg"), "a_from must be 'smem' .* or 'tmem'"),
    (lambda: tcgen05_mma("f16", scale_vec="1X"), "kind::f16 is not block-scaled"),
    (lambda: tcgen05_mma("mxf8f6f4", scale_vec="2X"),
     "kind::mxf8f6f4 takes scale_vec None, '1X', 'block32', got '2X'"),
    (lambda: tcgen05_mma("mxf4nvf4"), "kind::mxf4nvf4 takes scale_vec '2X', '4X', 'block32', "
                                      "'block16', got None"),
    (lambda: tcgen05_ld("16x128b", 128), r"16x128b takes .num \[1, 2, 4, 8, 16, 32, 64\]"),
    (lambda: tcgen05_st("16x32bx2", 1), "shape must be one of"),
    (lambda: tcgen05_ld("32x32b", 3), r"takes .num \[1, 2, 4, 8, 16, 32, 64, 128\]"),
    (lambda: tcgen05_cp("128x64b"), "tcgen05.cp shape must be one of"),
    (lambda: tcgen05_alloc_op(3), "cta_group must be 1 or 2"),
    (lambda: tcgen05_dealloc_op(0), "cta_group must be 1 or 2"),
    (lambda: tcgen05_relinquish_alloc_permit_op(4), "cta_group must be 1 or 2"),
    (lambda: tcgen05_commit_op(5), "cta_group must be 1 or 2"),
])
def test_invalid_variants_name_the_valid_ones(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_factories_cache():
    assert tcgen05_mma("f16") is tcgen05_mma("f16", 1, "smem", None)
    assert tcgen05_ld("32x32b", 4) is tcgen05_ld("32x32b", 4)
    assert tcgen05_alloc_op(1) is tcgen05_alloc
    assert tcgen05_commit_op(1, True) is tcgen05_commit_multicast


# ---------------------------------------------------------------------------------------------
# Builders: field packing against hand-computed values
# ---------------------------------------------------------------------------------------------


def test_instruction_descriptor_dense_fields():
    # kind::f16, BF16 x BF16 -> F32, M=128, N=256, both K-major:
    #   D F32 (1) << 4 = 0x10; A BF16 (1) << 7 = 0x80; B BF16 (1) << 10 = 0x400;
    #   N>>3 = 32 << 17 = 0x400000; M>>4 = 8 << 24 = 0x8000000
    assert make_instr_desc_host("f16", "bf16", m=128, n=256) == 0x08400490
    # kind::f16 F16 -> F16, M=64, N=8, A MN-major, negate B:
    #   D 0; A 0; B 0; negB 1 << 14 = 0x4000; A major 1 << 15 = 0x8000; N 1 << 17; M 4 << 24
    assert make_instr_desc_host("f16", "f16", d="f16", m=64, n=8, a_major="MN",
                                negate_b=True) == 0x0402C000
    # kind::tf32, M=128, N=64: D 0x10, A 2 << 7 = 0x100, B 2 << 10 = 0x800, N 8 << 17 = 0x100000
    assert make_instr_desc_host("tf32", "tf32", m=128, n=64) == 0x08100910
    # kind::f8f6f4 E4M3 x E2M1 -> F32, M=128, N=16, B MN? no (fp4 is K-major only):
    #   A 0, B 5 << 10 = 0x1400, N 2 << 17 = 0x40000
    assert make_instr_desc_host("f8f6f4", "e4m3", "e2m1", m=128, n=16) == 0x08041410
    assert make_instr_desc.py_func(1, 1, 1, 128, 256, 0, 0, 0, 0) == 0x08400490  # device twin


def test_instruction_descriptor_block_scaled_fields():
    # kind::mxf4nvf4, E2M1 x E2M1, UE4M3, 4X, M=128, N=128, sf ids 0:
    #   A 1 << 7 = 0x80, B 1 << 10 = 0x400, N 16 << 17 = 0x200000, scale 0, M 8 << 24
    assert make_instr_desc_block_scaled_host("mxf4nvf4", "e2m1", scale="ue4m3", m=128, n=128,
                                             scale_vec="4X") == 0x08200480
    # kind::mxf8f6f4, E4M3 x E5M2, UE8M0, M=128, N=64, sfa_id 3, sfb_id 2, negate A:
    #   sfb 2 << 4 = 0x20, B 1 << 10 = 0x400, negA 1 << 13 = 0x2000, N 8 << 17 = 0x100000,
    #   scale 1 << 23 = 0x800000, M 8 << 24 = 0x8000000, sfa 3 << 29 = 0x60000000
    assert make_instr_desc_block_scaled_host(
        "mxf8f6f4", "e4m3", "e5m2", m=128, n=64, sfa_id=3, sfb_id=2, negate_a=True) == 0x68902420
    assert make_instr_desc_block_scaled.py_func(0, 1, 1, 128, 64, 0, 0, 1, 0, 3, 2) == 0x68902420
    f = decode_instr_desc(0x68902420, block_scaled=True)
    assert (f["sfa_id"], f["sfb_id"], f["scale_format"], f["m"], f["n"], f["negate_a"]) == \
        (3, 2, 1, 128, 64, 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="f16", a="bf16", b="f16", n=64), "needs A and B of one type"),
    (dict(kind="f16", a="bf16", d="f16", n=64), "with bf16 inputs accumulates in f32 only"),
    (dict(kind="tf32", a="tf32", d="f16", n=64), "kind::tf32 accumulates in f32, got 'f16'"),
    (dict(kind="f16", a="f16", m=256, n=64), r"M must be one of \[64, 128\], got 256"),
    (dict(kind="f16", a="f16", n=260), "N must be a multiple of 8 in 8..256, got 260"),
    (dict(kind="f16", a="f16", n=24, a_from="tmem"), "N must be a multiple of 16 in 16..256"),
    (dict(kind="f16", a="f16", n=24, cta_group=2, m=256), "N must be a multiple of 16"),
    (dict(kind="f8f6f4", a="e2m1", n=64, a_major="MN"), "A of type e2m1 must be K-major"),
    (dict(kind="f8f6f4", a="e4m4", n=64), "takes A types e4m3/e5m2/e2m3/e3m2/e2m1"),
    (dict(kind="mxf4", a="e2m1", n=64), "builds the dense kinds"),
])
def test_dense_descriptor_rejects(kwargs, message):
    kind, a = kwargs.pop("kind"), kwargs.pop("a")
    with pytest.raises(ValueError, match=message):
        make_instr_desc_host(kind, a, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="mxf4nvf4", a="e2m1", scale="ue4m3", scale_vec="2X"),
     "scale_vec '2X' takes scale type ue8m0, got 'ue4m3'"),
    (dict(kind="mxf8f6f4", a="e4m3", scale="ue4m3"), "takes scale type ue8m0"),
    (dict(kind="mxf4nvf4", a="e2m1", scale_vec="4X", sfa_id=2), r"must be one of \[0\]"),
    (dict(kind="mxf4", a="e2m1", scale_vec="2X", sfb_id=1), r"must be one of \[0, 2\]"),
    (dict(kind="mxf8f6f4", a="e4m3", m=64), r"M must be one of \[128\]"),
    (dict(kind="mxf4", a="e4m3"), "takes A types e2m1"),
])
def test_block_scaled_descriptor_rejects(kwargs, message):
    kind, a = kwargs.pop("kind"), kwargs.pop("a")
    kwargs.setdefault("n", 64)
    with pytest.raises(ValueError, match=message):
        make_instr_desc_block_scaled_host(kind, a, **kwargs)


def test_shared_memory_descriptor_fields():
    # start 0x400 >> 4 = 0x40; LBO 16 >> 4 = 1 at 16; SBO 1024 >> 4 = 0x40 at 32; version 1 at 46;
    # 128B swizzle = 2 at 61
    desc = make_umma_smem_desc_host(0x400, 16, 1024, 128)
    assert desc == 0x40 | 1 << 16 | 0x40 << 32 | 1 << 46 | 2 << 61 == 0x4000404000010040
    assert int(make_umma_smem_desc.py_func(0x400, 16, 1024, 128)) == desc  # device twin (Python)
    assert make_umma_smem_desc_host(0x10, 256, 128, 0) == 0x1 | 16 << 16 | 8 << 32 | 1 << 46
    assert make_umma_smem_desc_host(0, 0, 0, 64) >> 61 == 4
    assert make_umma_smem_desc_host(0, 0, 0, 32) >> 61 == 6
    assert make_umma_smem_desc_host(0, 0, 0, "128B_base32B") >> 61 == 1
    # base offset 5 in bits 49-51, LBO mode 1 at bit 52: 0b1101
    assert make_umma_smem_desc_host(0, 0, 0, 0, base_offset=5, lbo_mode=1) >> 49 & 0xF == 0xD
    f = decode_umma_smem_desc(desc)
    assert (f["addr"], f["lbo"], f["sbo"], f["version"], f["swizzle"]) == (0x400, 16, 1024, 1, 128)
    with pytest.raises(ValueError, match="swizzle must be one of"):
        make_umma_smem_desc_host(0, 16, 16, 16)
    with pytest.raises(ValueError, match="address must be a multiple of 16"):
        make_umma_smem_desc_host(8, 16, 16, 0)


def test_descriptors_differ_from_hoppers_only_in_version_and_layout_bits():
    """The address model reuses wgmma's canonical layouts: the same tile, addressed through the
    sm100 descriptor, reads the bytes SmemLayout places it at."""
    layout = SmemLayout("K", 128, 16, 64, 2)
    base = 2048
    desc = make_umma_smem_desc_host(base, layout.lbo, layout.sbo, 128)
    mn, k = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    got = umma_smem_desc_address_host(desc + (layout.k_offset(16) >> 4), "K", 2, mn, k)
    assert np.array_equal(got, base + layout.offset(mn, k + 16))
    with pytest.raises(NotImplementedError):
        umma_smem_desc_address_host(make_umma_smem_desc_host(0, 0, 0, "128B_base32B"), "K", 2, 0, 0)


def test_device_builders_compile_everywhere_without_float_math():
    def kernel(out, i, j):
        smem = cuda.shared.array(64, np.uint32)
        out[0] = make_instr_desc(1, i, i, 128, j, 0, 1, 0, 0)
        out[1] = make_instr_desc_block_scaled(i, i, 1, 128, j, 0, 0, 0, 0, 0, 0)
        out[2] = umma_smem_desc(smem, i, 16, 1024, j)
        out[3] = tmem_address(i, j)

    for arch in ("sm_80", "sm_100a"):
        ptx = compile_ptx(kernel, (types.uint64[::1], types.int32, types.int32), arch)
        assert "cvt.rn.f64" not in ptx and "cvt.rzi" not in ptx, "descriptor math used floats"
        assemble(ptx, arch)


# ---------------------------------------------------------------------------------------------
# Layout models (host)
# ---------------------------------------------------------------------------------------------


def test_tmem_addresses():
    assert tmem_address_host(32, 5) == 0x00200005
    assert decode_tmem_address(0x00200005) == (32, 5)
    assert decode_tmem_address(0xC0200005) == (32, 5)  # scale-factor byte bits dropped
    with pytest.raises(ValueError):
        tmem_address_host(128, 0)


def test_ldst_fragment_tables_by_hand():
    """A few cells of each shape, worked out from the ISA figures (CUTLASS Copy_Traits)."""
    dl, dc = ldst_coords("32x32b", 4)
    assert (dl[7, 3], dc[7, 3]) == (7, 3)
    dl, dc = ldst_coords("16x64b", 2)  # lane l: row l/4 + 8*(l%2), column (l/2)%2 (+2 per reg)
    assert [(dl[l, 0], dc[l, 0]) for l in range(4)] == [(0, 0), (8, 0), (0, 1), (8, 1)]
    assert (dl[5, 1], dc[5, 1]) == (9, 2)
    dl, dc = ldst_coords("16x128b", 2)  # 2 regs per .x1: rows l/4 and l/4+8, column l%4
    assert [(dl[6, r], dc[6, r]) for r in range(4)] == [(1, 2), (9, 2), (1, 6), (9, 6)]
    dl, dc = ldst_coords("16x256b", 1)  # the m16n8 accumulator: g = l/4, c = l%4
    assert [(dl[31, r], dc[31, r]) for r in range(4)] == [(7, 6), (7, 7), (15, 6), (15, 7)]
    for shape, (per, top) in TCGEN05_LDST_SHAPES.items():  # each is a bijection onto its tile
        dl, dc = ldst_coords(shape, 4)
        rows = 32 if shape == "32x32b" else 16
        cells = set(zip(dl.ravel().tolist(), dc.ravel().tolist()))
        assert len(cells) == dl.size == rows * (dc.max() + 1)


def test_cp_lane_maps():
    assert cp_lane_map("128x256b")[5] == [5]
    assert cp_lane_map("4x256b") == [[0], [32], [64], [96]]
    assert cp_lane_map("64x128b.warpx2::02_13")[40] == [40, 104]
    assert cp_lane_map("64x128b.warpx2::01_23")[40] == [72, 104]
    assert cp_lane_map("32x128b.warpx4")[3] == [3, 35, 67, 99]


def test_d_and_scale_factor_layouts():
    lane, col, half = tmem_d_coords(128, 16)
    assert (lane[77, 9], col[77, 9], half[77, 9]) == (77, 9, 0)
    lane, col, half = tmem_d_coords(64, 16, "f16")  # layout F, two f16 per cell
    assert (lane[17, 5], col[17, 5], half[17, 5]) == (33, 2, 1)
    assert (lane[63, 0], lane[16, 0]) == (111, 32)
    with pytest.raises(ValueError):
        tmem_d_coords(256, 16)
    lanes, cols, bytes_ = scale_factor_coords("A", 128, 4, 0)
    assert (lanes[70, 2], cols[70, 2], bytes_[70, 2]) == (70, 2, 2)
    lanes, cols, bytes_ = scale_factor_coords("B", 256, 2, 2)
    assert (lanes[200, 1], cols[200, 1], bytes_[200, 1]) == (8, 6, 3)


def test_mma_shape_rules():
    check_mma_shape("f16", 64, 8)
    check_mma_shape("f16", 128, 256)
    check_mma_shape("mxf4nvf4", 128, 8)
    check_mma_shape("tf32", 256, 16, cta_group=2)
    for args in [("f16", 128, 12), ("mxf8f6f4", 64, 64), ("f16", 64, 64, 2), ("f16", 256, 24, 2)]:
        with pytest.raises(ValueError):
            check_mma_shape(*args)
