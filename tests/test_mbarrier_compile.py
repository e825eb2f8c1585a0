"""mbarrier: every form compiles, holds its instruction and assembles on each architecture that
has it (sm_80 for init/inval/arrive/test_wait, sm_90 for the tx-count, try_wait and cluster
forms -- nvJitLink refuses those for sm_80 and sm_89), and is refused with a clear error
elsewhere; bad arguments are typing errors."""

import re

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

from intrinsics.mbarrier import (
    MBARRIER_OPS,
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster,
    mbarrier_arrive_count,
    mbarrier_arrive_expect_tx,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics._core import SM90
from intrinsics.toolchain import compile_ptx
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.uint64[:], types.uint32[:])


# One small kernel per form.  Operands come from memory so that nothing folds; the barrier is
# element 1 of the shared array so that the index reaches the address.
def k_init(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_init(bars, 1, a[0])


def k_inval(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_inval(bars, 1)


def k_expect_tx(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_expect_tx(bars, 1, a[0])


def k_complete_tx(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_complete_tx(bars, 1, a[0])


def k_arrive(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_arrive(bars, 1)


def k_arrive_count(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_arrive_count(bars, 1, a[0])


def k_arrive_expect_tx(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_arrive_expect_tx(bars, 1, a[0])


def k_arrive_cluster(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_arrive_cluster(bars, 1, a[0])


def k_test_wait(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_test_wait(bars, 1, out[1])


def k_test_wait_parity(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_test_wait_parity(bars, 1, a[0])


def k_try_wait_parity(out, a):
    bars = cuda.shared.array(4, np.uint64)
    out[0] = mbarrier_try_wait_parity(bars, 1, a[0])


def k_wait_parity(out, a):
    bars = cuda.shared.array(4, np.uint64)
    # Twice: the fixed label lives in its own { } scope, so two copies must assemble.
    mbarrier_wait_parity(bars, 1, a[0])
    mbarrier_wait_parity(bars, 2, a[1])


KERNELS = {
    "init": k_init,
    "inval": k_inval,
    "expect_tx": k_expect_tx,
    "complete_tx": k_complete_tx,
    "arrive": k_arrive,
    "arrive_count": k_arrive_count,
    "arrive_expect_tx": k_arrive_expect_tx,
    "arrive_cluster": k_arrive_cluster,
    "test_wait": k_test_wait,
    "test_wait_parity": k_test_wait_parity,
    "try_wait_parity": k_try_wait_parity,
    "wait_parity": k_wait_parity,
}


def template_patterns(template):
    """Regexes for the lines of an asm template, with each ``$n`` standing for a register."""
    patterns = []
    for line in template.split("\n"):
        line = line.strip()
        if line in ("{", "}", ""):
            continue
        patterns.append(re.sub(r"\\\$\d+", r"%\\w+", re.escape(line)))
    return patterns


def test_every_form_has_a_kernel():
    assert set(KERNELS) == set(MBARRIER_OPS)


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("key", list(MBARRIER_OPS))
def test_mbarrier_assembles(key, arch):
    op = MBARRIER_OPS[key]
    ptx = check_on_arch(KERNELS[key], SIG, arch, op.arch, [])
    if ptx is not None:
        for pattern in template_patterns(op.template):
            assert re.search(pattern, ptx), f"{pattern!r} not in the PTX for {arch}"
        assert ".shared::cta.b64" in ptx or ".shared::cluster.b64" in ptx


def test_wait_loop_is_one_block_per_call():
    ptx = compile_ptx(k_wait_parity, SIG, "sm_90a")
    assert ptx.count("WAIT_PARITY:") == 2
    assert ptx.count("@!P1 bra WAIT_PARITY;") == 2


def test_remote_arrive_maps_then_arrives_with_sink():
    ptx = compile_ptx(k_arrive_cluster, SIG, "sm_90a")
    mapa = ptx.index("mapa.shared::cluster.u32 remote,")
    arrive = ptx.index("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];")
    assert mapa < arrive


def k_fence_init(out, a):
    fence_mbarrier_init()


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_fence_mbarrier_init(arch):
    check_on_arch(k_fence_init, SIG, arch, SM90, ["fence.mbarrier_init.release.cluster;"])


def test_docstrings_quote_the_ptx():
    assert "mbarrier.init.shared::cta.b64 [$0], $1;" in mbarrier_init.__doc__
    assert "9.7.13.15" in mbarrier_init.__doc__
    assert "mbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1;" in mbarrier_wait_parity.__doc__
    assert "fence.mbarrier_init.release.cluster;" in fence_mbarrier_init.__doc__


# ---------------------------------------------------------------------------------------------
# Typing errors
# ---------------------------------------------------------------------------------------------


def bad_dtype(out, a):
    bars = cuda.shared.array(4, np.uint32)
    mbarrier_init(bars, 0, 1)


def bad_not_array(out, a):
    mbarrier_arrive(out[0], 0)


def bad_float_count(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_init(bars, 0, 1.5)


def bad_index(out, a):
    bars = cuda.shared.array(4, np.uint64)
    mbarrier_inval(bars, 1.0)


@pytest.mark.parametrize(
    "kernel, message",
    [
        (bad_dtype, "mbarrier_init: the mbarrier array must hold uint64"),
        (bad_not_array, "mbarrier_arrive takes a shared uint64 array of mbarrier objects"),
        (bad_float_count, "mbarrier_init: the arrival count .* must be an integer, got float64"),
        (bad_index, "mbarrier_inval: the element index must be an integer"),
    ],
)
def test_bad_arguments_are_typing_errors(kernel, message):
    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, SIG, "sm_90a")
