"""setmaxnreg: the warp-specialised pattern compiles and assembles on the architecture-specific
targets that have the instruction (sm_90a, sm_100a, sm_120a here; sm_103a, sm_110a and sm_121a
through retargeted PTX), is refused on sm_80, sm_89 and the portable sm_90/sm_100/sm_120, and
rejects a bad register count at typing time.

What ptxas does with it is checked too, because the instruction is only a hint:

- ``launch_bounds=(384, 1)`` puts ``.maxntid 384, 1, 1`` and ``.minnctapersm 1`` in the PTX;
- nvJitLink never reports C7508 ("unable to determine register count at entry") for it, but it
  compiles PTX as relocatable code and drops the instruction with C7504 ("ignored to maintain
  compatibility across compilation units") -- with or without launch bounds;
- whole-program ptxas (when a ``ptxas`` binary is on PATH) keeps it with launch bounds (the
  kernel is then allocated the capped 168 registers) and drops it with C7508 without them.
"""

import re

import pytest
from numba import cuda, types
from numba.core.errors import TypingError

from intrinsics.setmaxnreg import REGISTER_COUNTS, SETMAXNREG_ARCH, setmaxnreg_dec, setmaxnreg_inc
from intrinsics.toolchain import AssemblyError, assemble, compile_ptx
from tests.helpers.assemblers import nvjitlink_info_log, whole_program_ptxas
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.float32[:], types.float32[:])
THREADS = 384
# 65536 registers per SM shared by 384 threads, allocated in units of 8 per thread.
CAPPED_REGISTERS = 65536 // THREADS // 8 * 8


def warp_specialised(out, x):
    """Warpgroup 0 gives registers back, warpgroups 1 and 2 take them (CUTLASS's 40/232)."""
    tid = cuda.threadIdx.x
    if tid // 128 == 0:
        setmaxnreg_dec(40)
    else:
        setmaxnreg_inc(232)
        out[tid] = x[tid] * 2.0 + 1.0


EXPECTED = ["setmaxnreg.dec.sync.aligned.u32 40;", "setmaxnreg.inc.sync.aligned.u32 232;"]


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_setmaxnreg_assembles(arch):
    check_on_arch(warp_specialised, SIG, arch, SETMAXNREG_ARCH, EXPECTED)


def _ptx(launch_bounds=(THREADS, 1), arch="sm_90a"):
    return compile_ptx(warp_specialised, SIG, arch, launch_bounds=launch_bounds)


@pytest.mark.parametrize("cc", [(9, 0), (10, 0), (12, 0)], ids=["sm_90", "sm_100", "sm_120"])
def test_portable_targets_are_refused(cc):
    """A two-part capability from 9.0 on reads as the 'a' target at lowering (that is what numba
    compiles a launched kernel for), so an explicit compile_ptx(cc=(9, 0)) writes PTX for the
    portable target, and the assembler refuses setmaxnreg there, naming it."""
    name = "sm_%d%d" % cc
    ptx = compile_ptx(warp_specialised, SIG, cc)
    assert f".target {name}\n" in ptx
    with pytest.raises(AssemblyError, match="setmaxnreg"):
        assemble(ptx, name)


@pytest.mark.parametrize("arch", ["sm_103a", "sm_110a", "sm_121a"])
def test_other_specific_targets_assemble(arch):
    """The targets the Arch claims beyond the five the project builds for."""
    digits = arch[3:-1]
    assert SETMAXNREG_ARCH.accepts((int(digits[:-1]), int(digits[-1]), "a"))
    ptx = _ptx().replace(".target sm_90a", f".target {arch}")
    assert len(assemble(ptx, arch)) > 0


def test_launch_bounds_reach_the_ptx():
    ptx = _ptx()
    assert re.search(r"\.maxntid 384, 1, 1\s+\.minnctapersm 1", ptx)
    assert ".maxntid" not in _ptx(launch_bounds=None)


def test_docstrings_quote_the_ptx():
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in setmaxnreg_inc.__doc__
    assert "setmaxnreg.dec.sync.aligned.u32 232;" in setmaxnreg_dec.__doc__
    assert "9.7.19.5" in setmaxnreg_inc.__doc__


# ---------------------------------------------------------------------------------------------
# What the assemblers do with it
# ---------------------------------------------------------------------------------------------


def test_nvjitlink_sees_the_register_cap():
    log = nvjitlink_info_log(_ptx())
    assert "C7508" not in log, log


@pytest.mark.parametrize("launch_bounds", [(THREADS, 1), None], ids=["bounds", "no-bounds"])
def test_nvjitlink_compiles_relocatable_and_drops_setmaxnreg(launch_bounds):
    """A fact about the toolchain, pinned so that a change shows: nvJitLink (hence numba-cuda's
    ordinary launch path) compiles PTX with --compile-only and ignores setmaxnreg."""
    log = nvjitlink_info_log(_ptx(launch_bounds))
    assert "C7504" in log and "setmaxnreg" in log, log


def test_whole_program_keeps_setmaxnreg_with_launch_bounds(tmp_path):
    log = whole_program_ptxas(_ptx(), tmp_path)
    assert "C7508" not in log and "C7504" not in log, log
    used = re.search(r"Used (\d+) registers", log)
    assert used and int(used.group(1)) == CAPPED_REGISTERS, log


def test_whole_program_without_launch_bounds_warns_c7508(tmp_path):
    log = whole_program_ptxas(_ptx(launch_bounds=None), tmp_path)
    assert "C7508" in log and "unable to determine register count at entry" in log, log


# ---------------------------------------------------------------------------------------------
# Typing errors
# ---------------------------------------------------------------------------------------------


def bad_small(out, x):
    setmaxnreg_dec(16)


def bad_not_multiple(out, x):
    setmaxnreg_inc(100)


def bad_large(out, x):
    setmaxnreg_inc(264)


def bad_runtime(out, x):
    setmaxnreg_inc(int(x[0]))


@pytest.mark.parametrize(
    "kernel, message",
    [
        (bad_small, "setmaxnreg_dec: the register count must be a multiple of 8 in 24..256, "
                    "got 16"),
        (bad_not_multiple, "setmaxnreg_inc: .* multiple of 8 in 24..256, got 100"),
        (bad_large, "setmaxnreg_inc: .* multiple of 8 in 24..256, got 264"),
        (bad_runtime, "setmaxnreg_inc: the register count must be a literal"),
    ],
)
def test_bad_register_count_is_a_typing_error(kernel, message):
    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, SIG, "sm_90a")


def test_register_counts():
    assert list(REGISTER_COUNTS)[0] == 24 and list(REGISTER_COUNTS)[-1] == 256
    assert all(n % 8 == 0 for n in REGISTER_COUNTS) and len(REGISTER_COUNTS) == 30


def test_register_pool():
    from intrinsics.setmaxnreg import register_pool

    assert register_pool(384) == 168 * 384 == 64512  # not 65536
    assert register_pool(512) == 128 * 512
    assert 24 * 128 + 240 * 256 == register_pool(384)  # FlashAttention-3's split, the whole pool
    assert register_pool(256) == 65536
    for bad in (128, 200):
        with pytest.raises(ValueError, match="warpgroups"):
            register_pool(bad)
