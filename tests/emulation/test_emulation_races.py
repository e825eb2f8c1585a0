"""The emulation under thread-switch stress: the threads of a block are Python threads, and
every piece of per-block state they create lazily (shared arrays, dynamic shared memory, warp
and warpgroup rendezvous, mbarrier tables, wgmma and tensor-memory state) must be created
exactly once per block.  With a switch interval of a microsecond the interpreter switches
threads between almost any two bytecodes, so a check-then-act race shows within a few runs:
before the fix, the README's kernel gave wrong answers (two threads each placing their own copy
of "the" shared array) and deadlocked (two copies of one warp's rendezvous), and the Hopper
GEMM failed on "no mbarrier at shared address ...".

Each test runs its kernel many times and every run must be exact.
"""

import re
import sys

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

import pathlib  # noqa: E402

import intrinsics as nt  # noqa: E402
from intrinsics.smem import shared_address  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def thread_switch_stress():
    """Switch Python threads every microsecond (the default is 5 ms) for the test's duration."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _readme_kernel():
    code = next(b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
                if "@cuda.jit" in b)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    return scope["tile"]


def test_readme_kernel_is_exact_under_stress(thread_switch_stress):
    tile = _readme_kernel()
    gen = np.random.default_rng()
    wrong = []
    for run in range(40):
        a = gen.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
        b = gen.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
        d = np.full((16, 8), np.nan, dtype=np.float32)
        tile[1, 32](a.view(np.uint16).ravel(), np.ascontiguousarray(b.T).view(np.uint16).ravel(), d)
        err = np.max(np.abs(d - a.astype(np.float64) @ b.astype(np.float64)))
        if not err < 1e-4:
            wrong.append((run, float(err)))
    assert not wrong, f"runs with a wrong answer (run, max abs error): {wrong}"


@cuda.jit
def _placement(addresses, out):
    # Three static arrays (two declared on one line), then dynamic shared memory: every thread
    # must see the same placement, and each thread's writes must land in the block's one copy.
    s32 = cuda.shared.array(96, np.uint32, alignment=16)
    s16, s64 = cuda.shared.array(64, np.uint16, alignment=128), cuda.shared.array(8, np.float64)
    dyn = cuda.shared.array(0, np.uint32)
    t = cuda.threadIdx.x
    addresses[t, 0] = shared_address(s32, 0)
    addresses[t, 1] = shared_address(s16, 0)
    addresses[t, 2] = shared_address(s64, 0)
    addresses[t, 3] = shared_address(dyn, 0)
    s32[t] = t + 1
    s16[t % 64] = t % 64
    dyn[t] = 1000 + t
    cuda.syncthreads()
    total = 0
    for i in range(96):
        total += s32[i] + dyn[i]
    out[t] = total


def test_shared_arrays_are_placed_once_per_block(thread_switch_stress):
    for run in range(10):
        addresses = np.zeros((96, 4), dtype=np.int64)
        out = np.zeros(96, dtype=np.int64)
        _placement[2, 96, 0, 96 * 4](addresses, out)
        assert (addresses == addresses[0]).all(), f"run {run}: threads disagree on placement"
        s32, s16, s64, dyn = addresses[0]
        assert len({s32, s16, s64}) == 3, "two declarations on one line share an array"
        assert s16 % 128 == 0 and s32 % 16 == 0 and dyn % 1024 == 0
        assert dyn >= max(s32 + 96 * 4, s16 + 64 * 2, s64 + 8 * 8), "dynamic overlaps static"
        expected = sum(range(1, 97)) + sum(range(1000, 1096))
        assert (out == expected).all(), f"run {run}: a thread wrote another copy of an array"


def test_ex03_bulk_copy_wgmma_under_stress(thread_switch_stress):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import ex03_bulk_copy_wgmma as ex03
    finally:
        sys.path.pop(0)
    failures = [run for run in range(4) if not ex03.run(verbose=False)]
    assert not failures, f"ex03 gave a wrong answer in runs {failures}"


def test_sm90_gemm_under_stress(thread_switch_stress):
    """The warp-specialised Hopper GEMM with the cp.async producer (make_cp_producer: 128
    threads' copies, .noinc arrivals): one block of 384 threads, four stages of mbarriers in
    dynamic shared memory, wgmma state per warpgroup."""
    from numbatc.kernels import sm90_gemm

    cfg = sm90_gemm.CONFIGS["128x128x64_4s"]
    var = sm90_gemm.Sm90Variant("row", "col", "bfloat16", "float32", None, None, None)
    gen = np.random.default_rng()
    m, n, k = 40, 24, 72
    for run in range(2):
        a = gen.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = gen.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        lda, ldb, ldo = 72, 72, 24
        da = np.ascontiguousarray(a).view(np.uint16).ravel()
        db = np.ascontiguousarray(b.T).view(np.uint16).ravel()
        out = np.full(m * ldo, np.nan, dtype=np.float32)
        sm90_gemm.launch_flat(cfg, var, da, db, out, out, out, m, n, k, lda, ldb, 0, ldo, 1.0,
                              0.0)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        err = np.max(np.abs(out.reshape(m, ldo) - ref))
        assert err < 1e-3, f"run {run}: max abs error {err}"


def test_sm90_gemm_tma_code_kernel_under_stress(thread_switch_stress):
    """The Hopper GEMM written as code (sm90_gemm_tma.make_kernel) with its TMA store epilogue:
    the producer thread's tensor copies, a consumer warpgroup's staging tile (stmatrix of the
    fragments frag_pack_bf16x2 packs) and its tensor stores; a tile wholly inside the matrix."""
    from numbatc.kernels import sm90_gemm

    cfg = sm90_gemm.CONFIGS["64x128x64_6s_w1_tma_ts"]
    var = sm90_gemm.Sm90Variant("row", "col", "bfloat16", "bfloat16", None, None, None,
                                out_pairs=True)
    gen = np.random.default_rng()
    m, n, k = 64, 128, 72
    for run in range(2):
        a = gen.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        b = gen.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
        da = np.ascontiguousarray(a).view(np.uint16).ravel()
        db = np.ascontiguousarray(b.T).view(np.uint16).ravel()
        out = np.full(m * n, 0x7FC0, dtype=np.uint16)  # bf16 NaN: a value never stored shows
        sm90_gemm.launch_flat(cfg, var, da, db, out, out, out, m, n, k, k, k, 0, n, 1.0, 0.0)
        got = out.reshape(m, n).view(ml_dtypes.bfloat16).astype(np.float64)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
        assert np.all(np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * scale), f"run {run}"


def test_sm90_attention_backward_under_stress(thread_switch_stress, monkeypatch):
    """The Hopper attention backward (sm90_attention_backward) under a 1 us thread-switch
    interval: the producer's tensor and bulk copies, the consumers' named barriers with the dQ
    writer warp, the bulk reductions and their counters (2 key blocks take turns), checked
    against the float64 reference gradient."""
    from tests.helpers.attention_backward import check_backward

    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    check_backward(1, 40, 150, 1, 1, 64, True, "bfloat16")
