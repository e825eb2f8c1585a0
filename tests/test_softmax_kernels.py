"""The softmax kernels without a GPU: every configuration the choice can produce for the row
softmax (registers and online forms, vectorised and scalar, each dtype) and every fused GEMM +
softmax tile (both operand layouts, bias and output dtypes) compile and assemble for sm_80 and
sm_90a without local memory or spills, with the instructions they are built on in the PTX; the
configuration choice covers row lengths from 1 to 10^6."""

import re

import pytest

from intrinsics.toolchain import compile_ptx
from numbatc.kernels import row_softmax, sm80_gemm_softmax
from numbatc.kernels.epilogue import GemmVariant
from tests.helpers.assemblers import nvjitlink_info_log
from tests.helpers.problems import softmax_problem

def _no_spills(ptx, arch):
    assert "ld.local" not in ptx and "st.local" not in ptx, "values went to local memory"
    log = nvjitlink_info_log(ptx, arch, options=("-O3", "-Xptxas=-v"))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    return int(re.search(r"Used (\d+) registers", log).group(1))


def _row_choice(n, in_dtype, out_dtype, aligned):
    """(configuration, variant) row_softmax chooses for rows of ``n`` (8-byte aligned rows, or
    rows 2 bytes past a boundary)."""
    p = softmax_problem(1, n, in_dtype, out_dtype, ptr=4096 if aligned else 4098)
    return row_softmax.compiled(p, row_softmax.choose(p))


ROW_CONFIGS = sorted({
    _row_choice(n, i, o, aligned)
    for n in (7, 1000, 4096, 32768, 40000)
    for i, o in (("bfloat16", "bfloat16"), ("float32", "float16"))
    for aligned in (True, False)
}, key=lambda cv: f"{cv[0].name}_{cv[1].name}")


# Every configuration for the lent GPU (sm_90a), a few for sm_80 (the compile time adds up).
ROW_CASES = ([(c, v, "sm_90a") for c, v in ROW_CONFIGS]
             + [(c, v, "sm_80") for c, v in ROW_CONFIGS[::4]])


@pytest.mark.parametrize("cfg, var, arch", ROW_CASES,
                         ids=[f"{c.name}_{v.name}-{a}" for c, v, a in ROW_CASES])
def test_row_softmax_assembles_without_spills(cfg, var, arch):
    kernel = row_softmax.kernel_for(cfg, var)
    assert kernel.targetoptions["launch_bounds"] == (cfg.threads,)
    ptx = compile_ptx(kernel, row_softmax.signature(cfg, var), arch, launch_bounds=(cfg.threads,))
    assert "shfl.sync.bfly.b32" in ptx and "ex2.approx" in ptx
    if cfg.vec == 4:
        assert "ld.global.u64" in ptx or "ld.global.nc.u64" in ptx
    assert f".maxntid {cfg.threads}, 1, 1" in ptx
    registers = _no_spills(ptx, arch)
    assert registers * cfg.threads <= 65536, f"{registers} registers x {cfg.threads} threads"


@pytest.mark.parametrize("n", [1, 3, 128, 129, 1024, 4097, 32768, 32769, 10**6])
def test_row_softmax_choice_covers_the_row(n):
    cfg = row_softmax.choose(softmax_problem(1, n, "bfloat16"))
    if cfg.chunks:
        assert cfg.wpr * 32 * cfg.vec * cfg.chunks >= n
    else:
        assert n > 32 * 1024
    scalar = row_softmax.choose(softmax_problem(1, n, "float32"))
    assert scalar.vec == 1 and (scalar.chunks * 1024 >= n if scalar.chunks else n > 16 * 1024)


FUSED = [(name, GemmVariant("row", "row", "bfloat16", "bfloat16", None, None, None))
         for name in sorted(sm80_gemm_softmax.CONFIGS)] + [
    ("64x256x64_8w_3s", GemmVariant("row", "col", "float16", "float32", None, "float32", None)),
    ("32x128x64_4w_4s", GemmVariant("col", "row", "bfloat16", "bfloat16", None, "bfloat16", None)),
]


FUSED_CASES = [(n, v, "sm_90a") for n, v in FUSED] + [(n, v, "sm_80") for n, v in FUSED[-2:]]


@pytest.mark.parametrize("name, var, arch", FUSED_CASES,
                         ids=[f"{n}-{v.a_layout}{v.b_layout}-{v.bias_dtype}-{a}" for n, v, a in FUSED_CASES])
def test_fused_gemm_softmax_assembles_without_spills(name, var, arch):
    cfg = sm80_gemm_softmax.CONFIGS[name]
    ptx = compile_ptx(sm80_gemm_softmax.kernel_for(cfg, var), sm80_gemm_softmax.signature(var), arch)
    assert ptx.count("mma.sync.aligned.m16n8k16") == (cfg.bk // 16) * (cfg.warp_m // 16) * (cfg.warp_n // 8)
    assert "shfl.sync.bfly.b32" in ptx and "cp.async" in ptx and "ldmatrix" in ptx
    _no_spills(ptx, arch)


def test_fused_choice():
    assert sm80_gemm_softmax.choose_config(4096, 128).name == "32x128x64_4w_4s"
    assert sm80_gemm_softmax.choose_config(16384, 256).name == "64x256x64_8w_3s"
    assert sm80_gemm_softmax.choose_config(1, 1).name == "32x64x64_4w_4s"
    with pytest.raises(ValueError, match="at most 256"):
        sm80_gemm_softmax.choose_config(16, 257)
