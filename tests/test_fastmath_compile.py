"""ex2_approx / fma_f32 / tanh_approx without a GPU: each compiles to its one PTX instruction for
every architecture the project claims and assembles (tanh_approx in place of libdevice's
tanhf); ptxas makes ex2_approx one MUFU.EX2 where
math.exp2 needs denormal handling around it; in the CPU emulation
(tests/emulation/test_fastmath_emulated.py) 2**x flushes subnormal results and the FMA rounds once."""

import math

import pytest
from numba import config, cuda, types

import intrinsics as nt
from intrinsics.toolchain import ARCHS, assemble, compile_ptx
from tests.helpers.assemblers import nvdisasm_path


def _kernel(out, x, s, b):
    i = cuda.threadIdx.x
    out[i] = nt.ex2_approx(nt.fma_f32(x[i], s, b))


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_one_instruction_each(arch):
    ptx = compile_ptx(_kernel, (types.float32[:], types.float32[:], types.float32, types.float32),
                      arch)
    assert ptx.count("ex2.approx.ftz.f32") == 1 and ptx.count("fma.rn.f32") == 1, ptx
    assert len(assemble(ptx, arch)) > 0


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_tanh_is_one_instruction(arch):
    def kernel(out, x):
        i = cuda.threadIdx.x
        out[i] = nt.tanh_approx(x[i])

    def plain(out, x):
        i = cuda.threadIdx.x
        out[i] = math.tanh(x[i])

    sig = (types.float32[:], types.float32[:])
    ptx = compile_ptx(kernel, sig, arch)
    assert ptx.count("tanh.approx.f32") == 1 and "ex2" not in ptx
    assert len(assemble(ptx, arch)) > 0
    assert "ex2.approx" in compile_ptx(plain, sig, arch)  # libdevice's tanhf: ex2, rcp, ...


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_fewer_instructions_than_math_exp2():
    """The SASS of ex2_approx(fma_f32(...)) against math.exp2(x * s + b): the point of both.
    Instructions are counted without the NOPs that pad the code to its alignment (both kernels
    pad to the same length: 48 lines with nvdisasm 13.5; math.exp2 adds FSETP and two FMUL)."""
    import subprocess
    import tempfile

    disasm = nvdisasm_path()
    if disasm is None:
        pytest.skip("no nvdisasm")

    def plain(out, x, s, b):
        i = cuda.threadIdx.x
        out[i] = math.exp2(x[i] * s + b)

    counts = []
    for fn in (_kernel, plain):
        ptx = compile_ptx(fn, (types.float32[:], types.float32[:], types.float32, types.float32),
                          "sm_90a")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(assemble(ptx, "sm_90a"))
            f.flush()
            sass = subprocess.run([disasm, f.name], capture_output=True, text=True).stdout
        counts.append(sum(1 for line in sass.splitlines()
                          if "/*" in line and ";" in line and "NOP" not in line))
        assert "MUFU.EX2" in sass
    assert counts[0] < counts[1], counts


# ---------------------------------------------------------------------------------------------
# Whole fragments: the same instructions as the per-register expressions
# ---------------------------------------------------------------------------------------------

_NS = 32  # a 64-column score fragment of one thread


def _load(x):
    return (x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11], x[12],
            x[13], x[14], x[15]) + (x[16], x[17], x[18], x[19], x[20], x[21], x[22], x[23],
                                    x[24], x[25], x[26], x[27], x[28], x[29], x[30], x[31])


def _opcodes(ptx):
    import collections
    import re

    return collections.Counter(m.group(1) for m in re.finditer(
        r"^\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s", ptx, re.M)
        if m.group(1).split(".")[0] in ("fma", "ex2", "mul", "add", "sub", "selp", "setp"))


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_fragment_forms_are_the_per_register_instructions():
    """frag_mask_cols, frag_exp2_fma, frag_scale_rows and frag_row_sums on a 32-register
    fragment: one select, one fma.rn, one ex2.approx.ftz and one mul per register, and 15 adds
    per row half -- the instructions of the same work written register by register (the PTX of
    sm90_attention's kernels, whose softmax was written so, has the same opcode counts with
    them: docs/PERFORMANCE.md, ninth session)."""
    load = cuda.jit(device=True, forceinline=True)(_load)

    def fragments(out, x, lims):
        s = nt.frag_mask_cols(load(x), lims[0], lims[1])
        p = nt.frag_scale_rows(nt.frag_exp2_fma(s, x[32], x[33], x[34]), x[35], x[36])
        out[0], out[1] = nt.frag_row_sums(p)
        for v in range(_NS):
            out[2 + v] = p[v]

    got = _opcodes(compile_ptx(fragments, (types.float32[:], types.float32[:], types.int32[:]),
                               "sm_90a"))
    for op in ("fma.rn.f32", "ex2.approx.ftz.f32", "mul.f32", "add.f32", "selp.f32"):
        assert got[op] == {"add.f32": _NS - 2}.get(op, _NS), (op, got)


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_column_forms_are_the_per_register_instructions():
    """frag_mask_cols_from, frag_exp2_fma_cols and frag_mul_diff_cols on a 32-register
    fragment (attention backward's transposed tile): one select, one fma.rn, one ex2.approx.ftz,
    one sub and one mul per register."""
    load = cuda.jit(device=True, forceinline=True)(_load)

    def columns(out, x, lims):
        c = (x[32], x[33], x[34], x[35], x[36], x[37], x[38], x[39], x[40], x[41], x[42], x[43],
             x[44], x[45], x[46], x[47])
        s = nt.frag_mask_cols_from(load(x), lims[0], lims[1])
        p = nt.frag_exp2_fma_cols(s, x[48], c)
        d = nt.frag_mul_diff_cols(p, load(out), c)
        for v in range(_NS):
            out[v] = d[v]

    got = _opcodes(compile_ptx(columns, (types.float32[:], types.float32[:], types.int32[:]),
                               "sm_90a"))
    for op in ("fma.rn.f32", "ex2.approx.ftz.f32", "mul.f32", "sub.f32", "selp.f32"):
        assert got[op] == _NS, (op, got)


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_libdevice_exponential_is_the_per_register_expression():
    """frag_exp2 on an 8-register fragment compiles to the PTX of ``math.exp2(s[v] * scale -
    b_h)`` written register by register (a multiply, a subtraction and libdevice's exp2f each):
    the same opcode counts."""

    def fragment(out, x):
        p = nt.frag_exp2((x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]), x[8], x[9], x[10])
        out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = p

    def per_register(out, x):
        sc, b0, b1 = x[8], x[9], x[10]
        out[0], out[1], out[2], out[3] = (math.exp2(x[0] * sc - b0), math.exp2(x[1] * sc - b0),
                                          math.exp2(x[2] * sc - b1), math.exp2(x[3] * sc - b1))
        out[4], out[5], out[6], out[7] = (math.exp2(x[4] * sc - b0), math.exp2(x[5] * sc - b0),
                                          math.exp2(x[6] * sc - b1), math.exp2(x[7] * sc - b1))

    sig = (types.float32[:], types.float32[:])
    got = _opcodes(compile_ptx(fragment, sig, "sm_90a"))
    want = _opcodes(compile_ptx(per_register, sig, "sm_90a"))
    for op in ("ex2.approx.f32", "mul.f32", "sub.f32", "fma.rn.f32"):
        assert got[op] == want[op], (op, got, want)
    assert got["ex2.approx.f32"] == 8


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_column_exponential_and_row_difference_are_the_per_register_expressions():
    """frag_exp2_cols and frag_mul_diff_rows on an 8-register fragment compile to the PTX of
    ``math.exp2(s[v] * scale - c[col(v)])`` and ``p[v] * (x[v] - c_h)`` written register by
    register: the same opcode counts (the portable attention backward's P^T and dS)."""

    def fragment(out, x):
        s = (x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7])
        p = nt.frag_exp2_cols(s, x[8], (x[9], x[10], x[11], x[12]))
        d = nt.frag_mul_diff_rows(p, s, x[13], x[14])
        out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7] = d

    def per_register(out, x):
        sc, c0, c1, c2, c3, r0, r1 = x[8], x[9], x[10], x[11], x[12], x[13], x[14]
        p = (math.exp2(x[0] * sc - c0), math.exp2(x[1] * sc - c1), math.exp2(x[2] * sc - c0),
             math.exp2(x[3] * sc - c1), math.exp2(x[4] * sc - c2), math.exp2(x[5] * sc - c3),
             math.exp2(x[6] * sc - c2), math.exp2(x[7] * sc - c3))
        out[0], out[1], out[2], out[3] = (p[0] * (x[0] - r0), p[1] * (x[1] - r0),
                                          p[2] * (x[2] - r1), p[3] * (x[3] - r1))
        out[4], out[5], out[6], out[7] = (p[4] * (x[4] - r0), p[5] * (x[5] - r0),
                                          p[6] * (x[6] - r1), p[7] * (x[7] - r1))

    sig = (types.float32[:], types.float32[:])
    got = _opcodes(compile_ptx(fragment, sig, "sm_90a"))
    want = _opcodes(compile_ptx(per_register, sig, "sm_90a"))
    for op in ("ex2.approx.f32", "mul.f32", "sub.f32", "fma.rn.f32"):
        assert got[op] == want[op], (op, got, want)
    assert got["ex2.approx.f32"] == 8 and got["sub.f32"] == 16


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_key_masks_are_the_per_register_compares():
    """frag_mask_keys and frag_mask_keys_causal on a 32-register fragment, against the same
    kernel without them: one select per register and one 32-bit unsigned compare (the keys in
    [0, 2**32)) per distinct column against the end (16: the row halves share them), or per
    register against the causal form's end of its row half (min(end, row + off + 1), clamped at
    0); a float key is refused."""
    load = cuda.jit(device=True, forceinline=True)(_load)

    def plain(out, x, k):
        s = load(x)
        for v in range(_NS):
            out[v] = s[v]

    def ends(out, x, k):
        s = nt.frag_mask_keys(load(x), k[0], k[1])
        for v in range(_NS):
            out[v] = s[v]

    def diagonal(out, x, k):
        s = nt.frag_mask_keys_causal(load(x), k[0], k[1], k[2], k[3])
        for v in range(_NS):
            out[v] = s[v]

    sig = (types.float32[:], types.float32[:], types.int64[:])
    base = _opcodes(compile_ptx(plain, sig, "sm_90a"))
    for kernel, compares in ((ends, _NS // 2), (diagonal, _NS)):
        got = _opcodes(compile_ptx(kernel, sig, "sm_90a"))
        assert got["selp.f32"] - base["selp.f32"] == _NS, (got, base)
        added = sum(n - base[op] for op, n in got.items() if op.startswith("setp.")
                    and op.endswith("u32"))
        assert added == compares, (kernel.__name__, got, base)

    def bad(out, x, k):
        out[0] = nt.frag_mask_keys(load(x), x[0], k[1])[0]

    with pytest.raises(Exception, match="frag_mask_keys takes integer keys and bounds"):
        compile_ptx(bad, sig, "sm_90a")


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_column_forms_check_their_arguments():
    def bad(out, x):
        out[0] = nt.frag_exp2_fma_cols((x[0], x[1], x[2], x[3]), x[4], (x[5],))[0]

    with pytest.raises(Exception, match="one float32 per column of the fragment"):
        compile_ptx(bad, (types.float32[:], types.float32[:]), "sm_90a")


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_fragment_forms_check_their_arguments():
    def bad(out, x):
        out[0] = nt.frag_row_sums((x[0], x[1]))[0] + nt.frag_scale_rows((1, 2), x[0], x[1])[0]

    with pytest.raises(Exception, match="frag_scale_rows takes a UniTuple\\(float32, n\\)"):
        compile_ptx(bad, (types.float32[:], types.float32[:]), "sm_90a")


def test_tree_order_is_balanced():
    from intrinsics.fastmath import frag_tree_order

    assert frag_tree_order([0, 1, 4, 5, 8, 9]) == (((0, 1), (4, 5)), (8, 9))
    assert frag_tree_order([3]) == 3


@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="compiles PTX")
def test_fragment_pack_is_one_cvt_per_pair():
    """intrinsics.convert.frag_pack_bf16x2 of a 32-register fragment: 16 cvt.rn.bf16x2.f32, as
    16 pack_bf16x2 calls, returned as 4 A fragments of 4 registers."""
    load = cuda.jit(device=True, forceinline=True)(_load)

    def kernel(out, x):
        frags = nt.frag_pack_bf16x2(load(x))
        for c in range(4):
            for q in range(4):
                out[4 * c + q] = frags[c][q]

    ptx = compile_ptx(kernel, (types.uint32[:], types.float32[:]), "sm_90a")
    assert ptx.count("cvt.rn.bf16x2.f32") == 16, ptx.count("cvt.rn.bf16x2.f32")
    with pytest.raises(Exception, match="takes a UniTuple\\(float32, 8k\\)"):
        compile_ptx(lambda out, x: nt.frag_pack_f16x2((x[0], x[1])), (types.uint32[:],
                                                                          types.float32[:]),
                    "sm_90a")
