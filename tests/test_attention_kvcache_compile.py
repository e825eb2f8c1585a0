"""The KV-cache variants of the attention kernels without a GPU (numbatc.attention_with_kvcache):
the flash-decoding kernel's (sm80_decode_attention, paged and contiguous) and the portable
kernel's (sm80_attention, prefill over a cached prefix) compile and assemble for sm_80 and
sm_90a with their default configurations: mma.sync, ldmatrix and cp.async present, no local
memory, no spills and at most 255 registers (ptxas -v through nvJitLink), no LDL / STL in the
SASS where nvdisasm is installed (the decode cases skip at that step where it is not, after the
PTX and ptxas checks).
That the fixed-length kernels' code is unchanged by the variant flags: their generated source
is the same text (the flags add lines only under compile-time branches) -- checked here on the
source; the PTX was compared once against the tree before (see the commit)."""

import ast
import re

import pytest

from intrinsics.toolchain import compile_ptx
from numbatc.kernels import sm80_attention as attn, sm80_decode_attention as decode
from tests.helpers.assemblers import disassemble, nvjitlink_info_log, whole_program_ptxas
from tests.helpers.problems import attention_problem


def _report(ptx, arch):
    log = nvjitlink_info_log(ptx, arch, ("-O3", "-Xptxas=-v"))
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    return registers, spills, log


@pytest.mark.parametrize("head_dim, dtype, causal, paged, arch, rows", [
    (128, "bfloat16", True, True, "sm_80", 4),
    (64, "float16", False, True, "sm_90a", 32),    # two m16 tiles
    (128, "float16", True, False, "sm_90a", 8),    # contiguous cache
    (40, "bfloat16", False, True, "sm_80", 4),     # padded head_dim: the per-chunk lookups
])
def test_decode_variants_assemble(head_dim, dtype, causal, paged, arch, rows, tmp_path):
    p = attention_problem(batch=1, seqlen_q=1, seqlen_k=32768, heads_q=rows, heads_kv=1,
                          head_dim=head_dim, dtype=dtype, causal=causal)
    cfg = decode.choose(p)
    var = decode.DecodeVariant(head_dim, dtype, causal, True, kv_cache=True, paged=paged)
    split_kernel, _ = decode.kernel_for(cfg, var)
    ptx = compile_ptx(split_kernel, decode.signature(var)[0], arch)
    t = "bf16" if dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx
    assert "cp.async.cg.shared.global" in ptx and "ldmatrix.sync.aligned.m8n8.x4.trans" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx, "a fragment array left in memory"
    # cache_seqlens (once), and the block table's lookups (per 16-row group of a tile)
    assert ptx.count("ld.global.s32") > 1 if paged else ptx.count("ld.global.s32") == 1
    assert "div.u64" not in ptx and "div.s64" in ptx  # as many s64 as the fixed-length kernel
    registers, spills, log = _report(ptx, arch)
    assert spills == 0 and registers <= 255, log
    whole_program_ptxas(ptx, tmp_path, arch)
    sass = disassemble(tmp_path / "kernel.cubin")
    assert "HMMA.16816.F32" in sass and "LDGSTS" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.parametrize("head_dim, dtype, causal, paged, arch", [
    (128, "bfloat16", True, True, "sm_90a"),
    (64, "float16", False, True, "sm_80"),
    (128, "float16", True, False, "sm_80"),
])
def test_prefill_variants_assemble(head_dim, dtype, causal, paged, arch):
    cfg = attn.choose_config(head_dim)
    var = attn.AttnVariant(head_dim, dtype, causal, True, kv_cache=True, paged=paged)
    ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var), arch)
    t = "bf16" if dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx
    assert "cp.async.cg.shared.global" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    registers, spills, log = _report(ptx, arch)
    assert spills == 0 and registers <= 255, log


def test_entry_points_take_the_signature():
    """Each variant's generated entry point takes as many arguments as its signature types
    (what launch_flat passes), the KV-cache ones five more."""
    for var in (attn.AttnVariant(64, "float16", True, False),
                attn.AttnVariant(64, "float16", True, False, kv_cache=True),
                attn.AttnVariant(40, "float16", False, True, kv_cache=True, paged=True)):
        for cfg in attn.CONFIGS.values():
            tree = ast.parse(attn.kernel_source(cfg, var))
            (kernel,) = [n for n in tree.body
                         if isinstance(n, ast.FunctionDef) and n.name == "attention_kernel"]
            assert len(kernel.args.args) == len(attn.signature(var)), (cfg.name, var)
    for var in (decode.DecodeVariant(64, "float16", True, False),
                decode.DecodeVariant(64, "float16", True, False, kv_cache=True, paged=True)):
        tree = ast.parse(decode.kernel_source(decode.CONFIGS["m16_w4_k16_s3"], var))
        (kernel,) = [n for n in tree.body
                     if isinstance(n, ast.FunctionDef) and n.name == "split_kernel"]
        assert len(kernel.args.args) == len(decode.signature(var)[0])
    assert len(decode.signature(var)[0]) == len(decode.signature(
        decode.DecodeVariant(64, "float16", True, False))[0]) + 5


def test_fixed_length_source_is_unchanged_by_the_flags():
    """The fixed-length and varlen kernels' sources carry no KV-cache line: the variant flags
    only add code under their own branches."""
    for cfg in list(attn.CONFIGS.values())[:3]:
        for varlen in (False, True):
            src = attn.kernel_source(cfg, attn.AttnVariant(128, "bfloat16", True, True, varlen))
            body = src.split("\n", 1)[1]  # past the docstring naming the variant
            assert "seqlens, bt" not in body and "Sk_cap" not in body and "paged" not in body
        paged = attn.kernel_source(cfg, attn.AttnVariant(128, "bfloat16", True, True, False,
                                                         True, True))
        assert "load_kv_paged(" in paged
        assert "Sk = min(max(np.int64(seqlens[b]), 0), Sk_cap)" in paged
