"""intrinsics.compile_passes (CPU): the linear SSA reconstruction gives numba-cuda's IR, statement
for statement, on every function of generated kernels; the memo of call types gives the same PTX;
both patches come off when the last block leaves; and a setmaxnreg kernel's compile for a
whole-program launch makes no cubin (intrinsics.launch), while any other kernel is bound as
numba binds it."""

import copy
import importlib
import re

import pytest

from intrinsics import compile_passes

pytestmark = pytest.mark.skipif(not compile_passes.ssa_patchable(),
                                reason="another numba-cuda version: its own SSA pass is used")


def _render(blocks):
    """The IR of ``blocks`` as text: every statement of every block, in order, with labels."""
    return "\n".join(f"{label}:\n" + "\n".join(f"  {stmt}" for stmt in blk.body)
                     for label, blk in sorted(blocks.items()))


def _attention_kernel(d=128, fresh=False):
    """The default sm90 attention kernel; ``fresh``: made anew by its factory (new closures), so
    that its device functions compile here (the ones kernel_for caches would have been compiled
    already when an earlier test in the same process used them)."""
    from numbatc.kernels import sm80_attention, sm90_attention, sm90_attention_tma

    var = sm80_attention.AttnVariant(d, "bfloat16", True, True)
    cfg = sm90_attention.choose_config(d)
    sig = sm90_attention.signature(var, cfg)
    if not fresh:
        return sm90_attention.kernel_for(cfg, var), sig, cfg
    assert cfg.tma, cfg
    return sm90_attention_tma.make_kernel.__wrapped__(cfg, var), sig, cfg


def _gemm_kernel(name="128x256x64_3s_pt_tma_ts", fresh=False):
    """The default Hopper GEMM kernel; ``fresh``: of an epilogue no other test compiles (f16 out,
    f16 c, bf16 bias, silu), so that its device functions compile here -- an Epilogue's are
    shared by every kernel with the same epilogue (numbatc.kernels.epilogue.make_epilogue), and
    one compiled by an earlier test in the same process would not run its SSA pass again."""
    from numbatc.kernels import sm90_gemm

    cfg = sm90_gemm.CONFIGS[name]
    if fresh:
        var = sm90_gemm.Sm90Variant("row", "col", "bfloat16", "float16", "float16", "bfloat16",
                                    "silu", out_pairs=True)
    else:
        var = sm90_gemm.Sm90Variant("row", "col", "bfloat16", "bfloat16", None, None, None,
                                    out_pairs=True)
    return sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var), cfg


def _both_ways(original, violators):
    """A stand-in for numba's ``ssa._run_ssa`` that runs it and the linear version on deep
    copies of the same blocks (each copy with its own scope, so that fresh names count from the
    same state), asserts that both render to the same text, records each function's number of
    SSA violators in ``violators``, and returns numba's result."""
    from numba.cuda.core import ssa
    from numba.cuda.core.analysis import compute_cfg_from_blocks

    def both(blocks):
        ours_in = copy.deepcopy(blocks)
        if blocks:
            violators.append(len(ssa._find_defs_violators(blocks, compute_cfg_from_blocks(blocks))))
        theirs = original(blocks)
        ours = compile_passes._run_ssa_linear(ours_in)
        assert _render(ours) == _render(theirs)
        return theirs

    return both


@pytest.mark.parametrize("which", ["attention", "gemm"])
def test_linear_ssa_gives_numbas_ir(which):
    """Each function's SSA reconstruction renders to the same text both ways (_both_ways), on
    every function of the default attention kernel (written as code since the twelfth session:
    its consumers' tile function has 24 violators; the generated kernel's body had 36, and 111
    before its tile softmax became a device function) and a GEMM kernel (_gemm_kernel's fresh
    one)."""
    from numba.cuda.core import ssa

    from intrinsics.toolchain import compile_ptx

    kernel, sig, cfg = (_attention_kernel(fresh=True) if which == "attention"
                        else _gemm_kernel(fresh=True))
    original = ssa._run_ssa
    violators = []
    ssa._run_ssa = _both_ways(original, violators)
    try:
        compile_ptx(kernel.py_func, sig, "sm_90a", launch_bounds=(cfg.threads, 1))
    finally:
        ssa._run_ssa = original
    assert len(violators) >= 5  # the kernel and its device functions
    assert max(violators) >= (20 if which == "attention" else 3)


def test_linear_ssa_handles_loops_and_phis():
    """A small function whose variables are redefined in loops and branches (phi nodes at the
    loop head and the join): the same IR both ways, and the same PTX compiled with numba's pass
    and, inside linear_ssa, with the linear one."""
    from numba import types
    from numba.cuda.core import ssa

    from intrinsics.toolchain import compile_ptx

    def f(out, n, k):
        acc = 0
        x = 1
        for i in range(n):
            if i % 3 == k:
                acc += x
                x = x * 2
            else:
                x = x + i
            acc = acc ^ i
        while acc > 100:
            acc = acc // 2
        out[0] = acc + x

    sig = (types.int64[::1], types.int64, types.int64)
    original = ssa._run_ssa
    violators = []
    ssa._run_ssa = _both_ways(original, violators)
    try:
        plain = compile_ptx(f, sig, (8, 0))
    finally:
        ssa._run_ssa = original
    assert max(violators) >= 2  # acc and x
    with compile_passes.linear_ssa():
        assert ssa._run_ssa is compile_passes._run_ssa_linear
        patched = compile_ptx(f, sig, (8, 0))
    assert ssa._run_ssa is original
    assert _normalise(patched) == _normalise(plain)


def _normalise(ptx):
    """PTX without what differs between two compiles of the same function: numba's version
    counters in mangled names, the order of its environment symbols, numbered shared arrays."""
    ptx = re.sub(r"B\d+v\d+B", "BvB", ptx)
    names = {}
    ptx = re.sub(r"_cudapy_smem_\d+", lambda m: names.setdefault(m.group(0), f"s{len(names)}"), ptx)
    lines = ptx.splitlines()
    return sorted(l for l in lines if "NumbaEnv" in l), [l for l in lines if "NumbaEnv" not in l]


def test_memo_gives_the_same_ptx_and_comes_off():
    """The default GEMM kernel compiled with and without the memo of call types: the same PTX.
    Inside the block the memo answers repeated questions (far fewer template searches than
    calls); after it, numba's own methods are back and the memo is empty."""
    from numba.core.types import functions
    from numba.cuda import lowering
    from numba.cuda.typing import context

    from intrinsics.toolchain import compile_ptx

    kernel, sig, cfg = _gemm_kernel("64x128x64_6s_w1_tma_ts")
    before = (functions.BaseFunction.__dict__["get_call_type"],
              context.BaseContext.__dict__["resolve_value_type"])
    lit_or_omitted = lowering._lit_or_omitted
    plain = compile_ptx(kernel.py_func, sig, "sm_90a", launch_bounds=(cfg.threads, 1))
    calls = [0]
    original = functions.BaseFunction.get_call_type

    def counting(self, *a):
        calls[0] += 1
        return original(self, *a)

    functions.BaseFunction.get_call_type = counting  # the memo wraps this one
    try:
        with compile_passes.memo_call_types():
            with compile_passes.memo_call_types():  # nested: one patch
                memo = compile_ptx(kernel.py_func, sig, "sm_90a", launch_bounds=(cfg.threads, 1))
            assert compile_passes._MEMO  # still on for the outer block
        assert functions.BaseFunction.get_call_type is counting
    finally:
        functions.BaseFunction.get_call_type = original
    assert (functions.BaseFunction.__dict__["get_call_type"],
            context.BaseContext.__dict__["resolve_value_type"]) == before
    assert lowering._lit_or_omitted is lit_or_omitted
    assert not compile_passes._MEMO and not compile_passes._VALUE_MEMO
    assert _normalise(memo) == _normalise(plain)
    assert 0 < calls[0] < 1000  # template searches behind thousands of calls


def test_binop_static_types_and_error_text():
    """Inside the block: lowering's static-operand types are numba's own answers (Omitted for an
    operand with no compile-time value, a literal for one with), and errors numba makes keep
    their text as it is (no colour codes); after it numba's colour scheme is back."""
    from numba.core import errors as core_errors
    from numba.cuda import lowering
    from numba.cuda.core import errors as cuda_errors
    from numba.cuda.core import ir

    original = lowering._lit_or_omitted
    schemes = (core_errors.termcolor(), cuda_errors.termcolor())
    with compile_passes.memo_call_types():
        for value in (ir.UNDEFINED, 3, 2.5, "s"):
            assert lowering._lit_or_omitted(value) == original(value)
        assert lowering._lit_or_omitted is not original
        assert core_errors.TypingError("bad input").msg == "bad input"
        assert "bad input" in str(cuda_errors.TypingError("bad input"))
        assert "\x1b" not in str(core_errors.TypingError("bad input"))
    assert lowering._lit_or_omitted is original
    assert (core_errors.termcolor(), cuda_errors.termcolor()) == schemes


def test_off_switches(monkeypatch):
    from numba.core.types import functions
    from numba.cuda.core import ssa

    monkeypatch.setenv("NUMBATC_NUMBA_SSA", "1")
    monkeypatch.setenv("NUMBATC_NUMBA_MEMO", "1")
    before = ssa._run_ssa, functions.BaseFunction.get_call_type
    with compile_passes.linear_ssa(), compile_passes.memo_call_types():
        assert (ssa._run_ssa, functions.BaseFunction.get_call_type) == before


def test_setmaxnreg_kernel_compiles_without_a_cubin(tmp_path, monkeypatch):
    """compile_kernel (the launch's and precompile's path) for a setmaxnreg kernel makes its PTX
    and no cubin: the launch loads it from the PTX through the driver's JIT.  The cubin is still
    there when asked for.  A kernel without setmaxnreg is bound (its cubin made) as before."""
    monkeypatch.setenv("NUMBATC_CACHE_DIR", str(tmp_path))
    from intrinsics import launch as launching
    from numbatc.kernels import sm80_gemm
    from numbatc.kernels.epilogue import GemmVariant

    pc = importlib.import_module("numbatc.precompile")
    kernel, sig, cfg = _gemm_kernel("64x128x64_6s_w1_tma_ts")
    with pc._target((9, 0, "a")):
        compiled = launching.compile_kernel(kernel, tuple(sig))
        library = compiled._codelibrary
        assert launching._holds_setmaxnreg(library)
    assert not library._cubin_cache
    assert library.get_cubin(cc=(9, 0, "a"))  # made on demand

    var = GemmVariant("row", "col", "bfloat16", "bfloat16", None, None, None)
    small = sm80_gemm.kernel_for(sm80_gemm.CONFIGS["64x64x64_4w_3s"], var)
    with pc._target((8, 0)):
        compiled = launching.compile_kernel(small, tuple(sm80_gemm.signature(var)))
        assert not launching._holds_setmaxnreg(compiled._codelibrary)
    assert compiled._codelibrary._cubin_cache  # bound: precompile's stand-in made the cubin


def test_value_memo_keeps_equal_values_of_other_types_apart():
    """(1, 2) == (1.0, 2.0) and (np.float32(0),) == (0,) in Python, but their numba types differ:
    the memo of global types answers only for values whose equality means the same thing
    (functions, classes, intrinsics, device functions), so each tuple gets its own type."""
    import numpy as np
    from numba.cuda.descriptor import cuda_target

    import intrinsics as nt

    ctx = cuda_target.typing_context
    with compile_passes.memo_call_types():
        assert str(ctx.resolve_value_type((1, 2))) == "UniTuple(int64 x 2)"
        assert str(ctx.resolve_value_type((1.0, 2.0))) == "UniTuple(float64 x 2)"
        assert str(ctx.resolve_value_type((np.float32(0),) * 3)) == "UniTuple(float32 x 3)"
        assert str(ctx.resolve_value_type((0,) * 3)) == "UniTuple(int64 x 3)"
        assert str(ctx.resolve_value_type(np.float32(1))) == "float32"
        assert str(ctx.resolve_value_type(1.0)) == "float64"
        first = ctx.resolve_value_type(nt.ex2_approx)
        assert ctx.resolve_value_type(nt.ex2_approx) is first  # memoised
        assert len(compile_passes._VALUE_MEMO) == 1
