"""The block-scaled Blackwell GEMM (sm100_scaled_gemm) without Blackwell: every configuration
compiles for sm_100a with TMA, the scale chunks' cp.async.bulk, tcgen05.cp, the block-scaled
tcgen05.mma, commit, ld and the tensor-memory allocation in its PTX, and nvJitLink assembles it
without local memory or spills; Hopper refuses it; the scale rearrangement kernel assembles."""

import pytest
from numba import types

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import assemble, compile_ptx
from numbatc.kernels import sm100_scaled_gemm as sg
from tests.helpers.assemblers import nvjitlink_info_log

PLAIN = {"mxfp8": sg.ScaledVariant("mxfp8", "e4m3", "e5m2", "bfloat16"),
         "nvfp4": sg.ScaledVariant("nvfp4", "e2m1", "e2m1", "bfloat16")}
FUSED = sg.ScaledVariant("mxfp8", "e4m3", "e4m3", "float16", "float16", "float32", "gelu")
MMA_PTX = {"mxfp8": "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale",
           "nvfp4": "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X"}


@pytest.mark.parametrize("name, var", [(n, PLAIN[c.fmt]) for n, c in sorted(sg.CONFIGS.items())]
                         + [("mxfp8_128x128_6s", FUSED)])
def test_assembles_for_sm100a_without_local_memory(name, var):
    cfg = sg.CONFIGS[name]
    ptx = compile_ptx(sg.kernel_for(cfg, var), sg.signature(var), "sm_100a",
                      launch_bounds=(cfg.threads, 1))
    for text in ("cp.async.bulk.tensor.2d.shared::cluster.global",
                 "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                 "tcgen05.alloc.cta_group::1", "tcgen05.cp.cta_group::1.32x128b.warpx4",
                 MMA_PTX[cfg.fmt], "tcgen05.commit.cta_group::1",
                 "tcgen05.ld.sync.aligned.32x32b.x32", "tcgen05.dealloc.cta_group::1"):
        assert text in ptx, text
    # 4 MMAs and CPK * (1 + NH) scale copies per k tile (LLVM may peel the loop: multiples)
    mmas = ptx.count(MMA_PTX[cfg.fmt])
    cps = ptx.count("tcgen05.cp.cta_group::1.32x128b.warpx4")
    assert mmas >= 4 and mmas % 4 == 0, mmas
    per_tile = cfg.chunks * (1 + cfg.groups_b)
    assert cps >= per_tile and cps % per_tile == 0 and cps // per_tile == mmas // 4, cps
    assert ptx.count("tcgen05.ld.sync.aligned.32x32b.x32") == cfg.bn // 32
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = nvjitlink_info_log(ptx, arch="sm_100a", options=("-O3", "-Xptxas=-v"))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert len(assemble(ptx, "sm_100a")) > 0


def test_hopper_refuses_the_kernel():
    cfg = sg.CONFIGS["nvfp4_128x128_6s"]
    with pytest.raises(ArchitectureError):
        compile_ptx(sg.kernel_for(cfg, PLAIN["nvfp4"]), sg.signature(PLAIN["nvfp4"]), "sm_90a")


def test_the_scale_rearrangement_kernel_assembles():
    sig = (types.Array(types.uint8, 2, "A"), types.Array(types.uint8, 1, "C"), types.int64,
           types.int64)
    ptx = compile_ptx(sg._scale_chunks_kernel, sig, "sm_100a")
    assert len(assemble(ptx, "sm_100a")) > 0


def test_bad_configs_and_variants_are_named():
    with pytest.raises(ValueError, match="bn must be 128 or 256"):
        sg.ScaledConfig("bad", "mxfp8", 64, 4)
    with pytest.raises(ValueError, match="exceed 227 KB"):
        sg.ScaledConfig("big", "nvfp4", 256, 5)
    with pytest.raises(ValueError, match="fmt must be one of"):
        sg.ScaledConfig("bad", "mxfp6", 128, 4)
    with pytest.raises(ValueError, match="nvfp4 takes a_type e2m1"):
        sg.ScaledVariant("nvfp4", "e4m3", "e2m1", "float32")
    with pytest.raises(ValueError, match="config mxfp8_128x128_6s is for mxfp8"):
        sg.kernel_source(sg.CONFIGS["mxfp8_128x128_6s"], PLAIN["nvfp4"])
