"""The Blackwell GEMM without Blackwell: every configuration compiles for sm_100a with TMA,
tcgen05.mma/commit/ld and the tensor-memory allocation in its PTX, and nvJitLink assembles it
without local memory or spills; Hopper refuses it; unsupported variants are named."""

import pytest

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import assemble, compile_ptx
from numbatc.kernels import sm100_gemm
from numbatc.kernels.epilogue import GemmVariant as Variant
from tests.helpers.assemblers import nvjitlink_info_log

PLAIN = Variant("row", "col", "bfloat16", "bfloat16", None, None, None)
FUSED = Variant("row", "col", "float16", "float32", "float32", "float16", "silu")


@pytest.mark.parametrize("name, var", [(n, PLAIN) for n in sorted(sm100_gemm.CONFIGS)]
                         + [("128x128x64_4s", FUSED)])
def test_assembles_for_sm100a_without_local_memory(name, var):
    cfg = sm100_gemm.CONFIGS[name]
    ptx = compile_ptx(sm100_gemm.kernel_for(cfg, var), sm100_gemm.signature(var), "sm_100a",
                      launch_bounds=(cfg.threads, 1))
    for text in ("cp.async.bulk.tensor.2d.shared::cluster.global", "tcgen05.alloc.cta_group::1",
                 "tcgen05.mma.cta_group::1.kind::f16", "tcgen05.commit.cta_group::1",
                 "tcgen05.ld.sync.aligned.32x32b.x32", "tcgen05.dealloc.cta_group::1"):
        assert text in ptx, text
    # BK / 16 MMAs per k tile (LLVM may peel or version the loop: a multiple of them)
    mmas = ptx.count("tcgen05.mma.cta_group::1.kind::f16")
    assert mmas >= cfg.bk // 16 and mmas % (cfg.bk // 16) == 0, mmas
    assert ptx.count("tcgen05.ld.sync.aligned.32x32b.x32") == cfg.bn // 32
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = nvjitlink_info_log(ptx, arch="sm_100a", options=("-O3", "-Xptxas=-v"))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert len(assemble(ptx, "sm_100a")) > 0


def test_hopper_refuses_the_kernel():
    cfg = sm100_gemm.CONFIGS["128x64x64_6s"]
    with pytest.raises(ArchitectureError):
        compile_ptx(sm100_gemm.kernel_for(cfg, PLAIN), sm100_gemm.signature(PLAIN), "sm_90a")


def test_unsupported_variants_are_named():
    with pytest.raises(ValueError, match="K-major operands only"):
        sm100_gemm.check_variant(Variant("row", "row", "bfloat16", "bfloat16", None, None, None))
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        sm100_gemm.check_variant(Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None,
                                         None))
