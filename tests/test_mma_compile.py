"""mma.sync: the table rejects combinations it lacks and the intrinsic checks fragment types (the
assembly of every form is in test_catalog_compile.py)."""

import pytest
from numba import types
from numba.core.errors import TypingError

import intrinsics
from intrinsics.toolchain import compile_ptx


def test_satfinite_integer_form():
    spec = intrinsics.mma_sync("m16n8k32", "s8", "u8", "s32", satfinite=True).spec
    assert spec.ptx == "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.u8.s32"


@pytest.mark.parametrize(
    "args, message",
    [
        (("m16n8k16", "tf32"), "no m16n8k16 with A=tf32"),
        (("m16n8k32", "e4m3", "s8"), "no m16n8k32 with A=e4m3, B=s8"),
        (("m16n8k16", "bf16", "bf16", "f16"), "accumulator=f16"),
    ],
)
def test_bad_combination_names_valid_ones(args, message):
    with pytest.raises(ValueError, match=message) as info:
        intrinsics.mma_sync(*args)
    assert "m16n8k16/bf16/bf16/f32" in str(info.value)


def test_wrong_fragment_type_is_a_typing_error():
    mma = intrinsics.mma_sync("m16n8k16", "bf16")

    def kernel(out, a):
        d = mma((a[0], a[1]), (a[4], a[5]), (out[0], out[0], out[0], out[0]))
        out[0] = d[0]

    with pytest.raises(TypingError, match="the A fragment must be UniTuple\\(uint32 x 4\\)"):
        compile_ptx(kernel, (types.float32[:], types.uint32[:]), "sm_90a")


# --- block-scaled mma.sync (sm_120a / sm_121a) ----------------------------------------------

from intrinsics._core import ArchitectureError  # noqa: E402
from intrinsics.layout import mma_block_scale_fragment, mma_scale_fragment  # noqa: E402
from intrinsics.mma import (  # noqa: E402
    MMA_BLOCK_SCALE_FORMS,
    MmaSelectorError,
    mma_block_scale_specs,
    mma_sync_block_scale,
)
from intrinsics.toolchain import assemble  # noqa: E402

_NVFP4 = ("m16n8k64", "mxf4nvf4", "4X", "e2m1", "e2m1", "f32", "ue4m3")


def _bs_kernel(mma, selectors):
    """A probe whose selectors are literals, or run-time values (None) read from memory."""
    if selectors is None:
        def kernel(out, a):
            d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (out[0], out[1], out[2], out[3]),
                    a[6], a[7], a[8], a[9], a[10], a[11])
            out[0] = d[0] + d[1] + d[2] + d[3]
        return kernel
    bida, tida, bidb, tidb = selectors

    def kernel(out, a):
        d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (out[0], out[1], out[2], out[3]),
                a[6], a[7], bida, tida, bidb, tidb)
        out[0] = d[0] + d[1] + d[2] + d[3]
    return kernel


_BS_SIG = (types.float32[:], types.uint32[:])


def test_block_scale_ptx_text():
    mma = mma_sync_block_scale("m16n8k64", "mxf4nvf4", "4X", scale_type="ue4m3")
    assert mma.spec.ptx == ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale."
                            "scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3")
    ptx = compile_ptx(_bs_kernel(mma, (0, 1, 0, 3)), _BS_SIG, "sm_120a")
    assert mma.spec.ptx + " {" in ptx and ", {0, 1}, " in ptx and ", {0, 3};" in ptx
    spec = mma_sync_block_scale("m16n8k32", "mxf8f6f4", "1X", "e4m3", "e2m1").spec
    assert spec.ptx == ("mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale."
                        "scale_vec::1X.f32.e4m3.e2m1.f32.ue8m0")
    assert (spec.scale_count, spec.block) == (1, 32)
    assert len(mma_block_scale_specs()) == 1 + 3 + 25


@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
def test_block_scale_runtime_selectors_assemble(arch):
    """Run-time selectors travel in 16-bit registers (a .b32 register is refused by ptxas)."""
    for key in (_NVFP4, ("m16n8k64", "mxf4", "2X", "e2m1", "e2m1", "f32", "ue8m0"),
                ("m16n8k32", "mxf8f6f4", "1X", "e3m2", "e2m3", "f32", "ue8m0")):
        mma = mma_sync_block_scale(*key)
        ptx = compile_ptx(_bs_kernel(mma, None), _BS_SIG, arch)
        line = next(x for x in ptx.splitlines() if mma.spec.ptx in x)
        assert line.count("%rs") == 4, line
        assert len(assemble(ptx, arch)) > 0


def test_block_scale_every_form_assembles_for_sm_121a():
    """The catalog covers toolchain.ARCHS (sm_120a among them); sm_121a is checked here."""
    for spec in mma_block_scale_specs():
        mma = mma_sync_block_scale(spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b,
                                   spec.acc, spec.scale_type)
        ptx = compile_ptx(_bs_kernel(mma, (0, 0, 0, 0)), _BS_SIG, "sm_121a")
        assert spec.ptx in ptx
        assert len(assemble(ptx, "sm_121a")) > 0


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_block_scale_refused_before_the_assembler(arch):
    mma = mma_sync_block_scale(*_NVFP4)
    with pytest.raises(ArchitectureError, match=f"needs sm_120a/sm_121a.*{arch}"):
        compile_ptx(_bs_kernel(mma, (0, 0, 0, 0)), _BS_SIG, arch)


def test_block_scale_table_matches_the_assembler():
    """Every (kind, scale_vec, scale type) spelling: nvJitLink accepts exactly the table's rows
    (PTX ISA Table 36), so the table neither misses nor invents a form."""
    base = mma_sync_block_scale(*_NVFP4)
    ptx = compile_ptx(_bs_kernel(base, (0, 0, 0, 0)), _BS_SIG, "sm_120a")
    old = base.spec.ptx
    shapes = {kind: shape for (shape, kind) in MMA_BLOCK_SCALE_FORMS}
    for kind, shape in shapes.items():
        elements, scale_vecs = MMA_BLOCK_SCALE_FORMS[(shape, kind)]
        a = elements[0]
        for vec in ("1X", "2X", "4X"):
            for stype in ("ue8m0", "ue4m3"):
                new = (f"mma.sync.aligned.{shape}.row.col.kind::{kind}.block_scale."
                       f"scale_vec::{vec}.f32.{a}.{a}.f32.{stype}")
                expected = stype in scale_vecs.get(vec, ())
                try:
                    assemble(ptx.replace(old, new), "sm_120a")
                    accepted = True
                except Exception:  # AssemblyError with ptxas's log
                    accepted = False
                assert accepted == expected, f"{new}: assembler {accepted}, table {expected}"


@pytest.mark.parametrize(
    "args, message",
    [
        (("m16n8k64", "mxf4nvf4", "2X", "e2m1", None, "f32", "ue4m3"), "scale type=ue4m3"),
        (("m16n8k64", "mxf4", "4X"), "kind::mxf4 scale_vec::4X"),
        (("m16n8k64", "mxf8f6f4", "1X", "e4m3"), "m16n8k64 kind::mxf8f6f4"),
        (("m16n8k32", "mxf8f6f4", "1X", "e4m3", "s8"), "B=s8"),
        (("m16n8k64", "mxf4nvf4", "4X", "e2m1", None, "f16", "ue4m3"), "accumulator=f16"),
    ],
)
def test_block_scale_bad_combination_names_valid_ones(args, message):
    with pytest.raises(ValueError, match=message) as info:
        mma_sync_block_scale(*args)
    assert "m16n8k64 kind::mxf4nvf4 scale_vec::4X A/B e2m1 scale ue8m0|ue4m3" in str(info.value)


@pytest.mark.parametrize(
    "key, selectors, message",
    [
        (_NVFP4, (2, 0, 0, 0), r"byte-id-a must be one of \[0\]"),
        (_NVFP4, (0, 2, 0, 0), r"thread-id-a must be one of \[0, 1\]"),
        (("m16n8k64", "mxf4", "2X", "e2m1", "e2m1", "f32", "ue8m0"), (0, 0, 1, 0),
         r"byte-id-b must be one of \[0, 2\]"),
        (("m16n8k32", "mxf8f6f4", "1X", "e4m3", "e4m3", "f32", "ue8m0"), (3, 1, 3, 4),
         r"thread-id-b must be one of \[0, 1, 2, 3\]"),
    ],
)
def test_block_scale_literal_selectors_checked_at_typing(key, selectors, message):
    mma = mma_sync_block_scale(*key)
    with pytest.raises(MmaSelectorError, match=message):
        compile_ptx(_bs_kernel(mma, selectors), _BS_SIG, "sm_120a")


def test_block_scale_wrong_scale_register_type():
    mma = mma_sync_block_scale(*_NVFP4)

    def kernel(out, a):
        d = mma((a[0], a[1], a[2], a[3]), (a[4], a[5]), (out[0], out[1], out[2], out[3]),
                out[4], a[7], 0, 0, 0, 0)
        out[0] = d[0]

    with pytest.raises(TypingError, match="scale-a-data must be uint32"):
        compile_ptx(kernel, _BS_SIG, "sm_120a")


# The maps of intrinsics.layout.fragments against CUTLASS's CuTe layouts for the same instructions
# (cute/atom/mma_traits_sm120.hpp SM120_16x8x64_TN_VS / SM120_16x8x32_TN_VS, the latter reusing
# mma_traits_sm80.hpp SM80_16x8x32_S32S8S8S32_TN): (thread, value) -> column-major index into the
# (M, K) / (N, K) / (M, N) tile.  An independent second source for every lane of every map.

_CUTE = {
    "m16n8k64": {
        "A": (((4, 8), (8, 2, 2)), ((128, 1), (16, 8, 512))),
        "B": (((4, 8), (8, 2)), ((64, 1), (8, 256))),
        "SFA": (((2, 2, 8), 64), ((8, 0, 1), 16)),
        "SFB": (((4, 8), 64), ((0, 1), 8)),
    },
    "m16n8k32": {
        "A": (((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256))),
        "B": (((4, 8), (4, 2)), ((32, 1), (8, 128))),
        "SFA": (((2, 2, 8), 32), ((8, 0, 1), 16)),
        "SFB": (((4, 8), 32), ((0, 1), 8)),
    },
    "C": (((4, 8), (2, 2)), ((32, 1), (16, 8))),
}


def _flat(x):
    return [y for z in x for y in _flat(z)] if isinstance(x, tuple) else [x]


def _cute(layout, thread, value):
    """CuTe layout of (thread, value): each mode's flat index split colexicographically."""
    total = 0
    for index, (shape, stride) in zip((thread, value), zip(*layout)):
        for s, d in zip(_flat(shape), _flat(stride)):
            total += (index % s) * d
            index //= s
    return total


@pytest.mark.parametrize("shape", ["m16n8k64", "m16n8k32"])
def test_block_scale_fragments_match_cutlass_layouts(shape):
    spec = next(s for s in mma_block_scale_specs() if s.shape == shape)
    m, n, k = spec.mnk
    cute = _CUTE[shape]
    fa, fb, fc = (mma_block_scale_fragment(spec, x) for x in "abc")
    per = fa.shape[2]
    for lane in range(32):
        for r in range(4):
            for e in range(per):
                idx = _cute(cute["A"], lane, r * per + e)
                assert tuple(fa[lane, r, e]) == (idx % m, idx // m)
                if r < 2:
                    idx = _cute(cute["B"], lane, r * per + e)
                    assert tuple(fb[lane, r, e]) == (idx // n, idx % n)  # B is K x N here
            idx = _cute(_CUTE["C"], lane, r)
            assert tuple(fc[lane, r, 0]) == (idx % m, idx // m)
        # scale factors: CuTe's value v is K; the byte-id + v // block holds that K's factor
        for tid_a in spec.selectors[1]:
            sa = mma_scale_fragment(spec, "a", 0, tid_a)
            rows = {_cute(cute["SFA"], lane, v) % m for v in range(k)}
            (row,) = rows
            if (lane % 4) // 2 == tid_a:
                assert {tuple(sa[lane, j]) for j in range(spec.scale_count)} == {
                    (row, j) for j in range(spec.scale_count)}
            else:
                assert (sa[lane] == -1).all()
        for tid_b in spec.selectors[3]:
            sb = mma_scale_fragment(spec, "b", 0, tid_b)
            (col,) = {_cute(cute["SFB"], lane, v) % n for v in range(k)}
            if lane % 4 == tid_b:
                assert [tuple(sb[lane, j]) for j in range(spec.scale_count)] == [
                    (j, col) for j in range(spec.scale_count)]
            else:
                assert (sb[lane] == -1).all()
