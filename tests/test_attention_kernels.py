"""The attention kernel without a GPU: the chosen configuration for each head_dim compiles and
assembles for sm_80 and sm_90a, with ptxas's register report checked (no spills up to head_dim
128; head_dim 256 is known to spill a little, held to that), and configurations validate."""

import re

import pytest

from intrinsics.toolchain import compile_ptx
from numbatc.kernels import sm80_attention as attn


def ptxas_report(ptx, arch):
    """(registers, spill store bytes) from nvJitLink's ``-Xptxas=-v`` info log."""
    from cuda.bindings import nvjitlink

    options = [f"-arch={arch}", "-O3", "-Xptxas=-v"]
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "attention")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    text = bytes(log).decode(errors="replace")
    registers = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", text).group(1))
    return registers, spills


@pytest.mark.parametrize("head_dim, dtype, causal, arch, max_spill, varlen", [
    (64, "bfloat16", True, "sm_80", 0, False),
    (128, "float16", False, "sm_80", 0, False),
    (128, "bfloat16", True, "sm_90a", 0, False),
    (40, "bfloat16", True, "sm_80", 0, False),   # padded to 48, rows padded to an odd chunk count
    (256, "bfloat16", True, "sm_80", 256, False),  # known: ~170 bytes (see choose_config)
    (128, "bfloat16", True, "sm_90a", 0, True),    # numbatc.attention_varlen's variant
    (64, "float16", False, "sm_80", 0, True),
])
def test_chosen_config_assembles(head_dim, dtype, causal, arch, max_spill, varlen):
    cfg = attn.choose_config(head_dim)
    var = attn.AttnVariant(head_dim, dtype, causal, with_lse=True, varlen=varlen)
    ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var), arch)
    ptx_type = "bf16" if dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx  # V
    assert "shfl.sync.bfly.b32" in ptx and "cp.async.cg.shared.global" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    registers, spills = ptxas_report(ptx, arch)
    assert registers <= 255 and spills <= max_spill, (registers, spills)


@pytest.mark.parametrize("head_dim, varlen", [(64, False), (128, True)])
def test_pair_stores_variant(head_dim, varlen):
    """pair_stores (out 4-byte aligned, strides even): O's column pairs are st.global.b32, as
    many as the other variant's st.global.u16 halved, and no 16-bit store; no spills on sm_80."""
    cfg = attn.choose_config(head_dim)
    stores = {}
    for pairs in (True, False):
        var = attn.AttnVariant(head_dim, "bfloat16", True, with_lse=True, varlen=varlen,
                               pair_stores=pairs)
        ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var), "sm_80")
        stores[pairs] = (ptx.count("st.global.b32"), ptx.count("st.global.u16"))
        if pairs:
            assert ptxas_report(ptx, "sm_80")[1] == 0
    assert stores[True][1] == 0 and stores[False][0] == 0, stores
    assert 2 * stores[True][0] == stores[False][1] >= head_dim // 2, stores


def test_heuristic_names_a_real_config():
    for d in range(8, 257, 8):
        assert attn.choose_config(d) in attn.CONFIGS.values()


def test_every_config_generates_valid_source():
    """Every configuration's source parses and defines the entry kernel_for loads, a
    ``cuda.jit`` kernel taking the arguments of ``signature`` (what launch passes)."""
    import ast

    for cfg in attn.CONFIGS.values():
        for d in (8, 40, 64, 256):
            var = attn.AttnVariant(d, "float16", d % 16 == 0, d == 40)
            tree = ast.parse(attn.kernel_source(cfg, var))
            (kernel,) = [n for n in tree.body
                         if isinstance(n, ast.FunctionDef) and n.name == "attention_kernel"]
            assert any(ast.unparse(dec).startswith("cuda.jit") for dec in kernel.decorator_list)
            assert len(kernel.args.args) == len(attn.signature(var)), (cfg.name, d)


def test_shared_layouts():
    assert attn.shared_layout(64) == (64, True)      # 128-byte rows: swizzled
    assert attn.shared_layout(256) == (256, True)
    assert attn.shared_layout(48) == (56, False)     # 6 chunks -> 7 (odd)
    assert attn.shared_layout(16) == (24, False)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="block_m / warps must be 16 or 32"):
        attn.AttnConfig("bad", 128, 64, 2, True)
    with pytest.raises(ValueError, match="block_n must be a multiple of 16"):
        attn.AttnConfig("bad", 64, 40, 4, True)
