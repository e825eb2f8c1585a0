"""The GEMM kernels without a GPU: the heuristic picks an existing configuration for every kind
of shape, every configuration and variant compiles and assembles for sm_80 and sm_90a without
local memory, the SASS of the main ones has no division subroutine, and configurations are
validated."""

import re

import pytest

from intrinsics.toolchain import assemble, compile_ptx
from numbatc.kernels import sm80_gemm
from numbatc.kernels.epilogue import GemmVariant
from tests.helpers.assemblers import disassemble, main_loop, whole_program_ptxas
from tests.helpers.problems import gemm_problem

#: what numbatc.bench gemm runs (bf16, row-major a, b and out), a fused column-major-B variant and
#: the decode tiles' split-K form
BENCH = GemmVariant("row", "row", "bfloat16", "bfloat16", None, None, None, out_pairs=True)
FUSED = GemmVariant("row", "col", "bfloat16", "float32", "float32", "bfloat16", "gelu")
SPLIT = GemmVariant("row", "row", "bfloat16", "bfloat16", None, None, None, out_pairs=True,
                    split_k=True)
#: BENCH with out's rows 16-byte aligned: tiles inside the matrix staged through shared memory
STAGED = GemmVariant("row", "row", "bfloat16", "bfloat16", None, None, None, out_pairs=True,
                     out_staged=True)


@pytest.mark.parametrize("shape", [(1, 1, 1), (64, 4096, 4096), (65, 128, 64), (4096, 4096, 4096),
                                   (300, 300, 300), (8192, 8192, 8192), (1, 28672, 8192)])
def test_heuristic_names_a_real_config(shape):
    cfg = sm80_gemm.choose(gemm_problem(*shape))
    assert cfg in sm80_gemm.CONFIGS.values()


@pytest.mark.parametrize("name", sorted(sm80_gemm.CONFIGS))
def test_every_config_assembles_without_local_memory(name):
    var = GemmVariant("row", "col", "bfloat16", "float32", "float32", "bfloat16", "gelu")
    ptx = compile_ptx(sm80_gemm.kernel_for(sm80_gemm.CONFIGS[name], var),
                      sm80_gemm.signature(var), "sm_80")
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") > 0
    assemble(ptx, "sm_80")


@pytest.mark.parametrize("layouts", [("row", "row"), ("col", "col")])
def test_variant_layouts_and_f16_assemble(layouts):
    """A row-major B or a column-major A is loaded with the transposing ldmatrix; f16 operands
    go through the f16 mma, the f16 result is converted once; the kernel assembles."""
    var = GemmVariant(*layouts, "float16", "float16", "float16", "float32", "silu",
                                out_layout="col", c_layout="col")
    cfg = sm80_gemm.CONFIGS["64x128x64_4w_4s"]
    ptx = compile_ptx(sm80_gemm.kernel_for(cfg, var), sm80_gemm.signature(var), "sm_90a")
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and ".bf16" not in ptx
    assert "cvt.rn.f16x2.f32" in ptx
    assert assemble(ptx, "sm_90a")  # the cubin's bytes


#: configurations choose() never takes on a GPU of numbatc.kernels.gpus' table, for
#: NUMBATC_SM80_CONFIG (tests/test_gpu_limits.py pins every configuration's blocks per SM)
NAMED_ONLY = ["128x256x64_8w_3s", "128x256x64_8w_4s", "128x128x64_4w_4s", "64x64x64_4w_3s",
              "128x128x32_4w_4s", "128x128x32_4w_3s", "128x256x64_8w_4s_fp",
              "64x128x64_4w_4s_fp", "16x128x64_4w_6s", "16x128x64_4w_4s",
              "128x256x64_8w_3s_fpr", "128x256x64_8w_3s_fps"]


@pytest.mark.parametrize("name", NAMED_ONLY)
def test_named_only_configs(name):
    """The configurations kept for benchmarking by name: valid and never the heuristic's
    choice (sm80_gemm.TILES' note: the 4-stage 128 x 128 x 64 tiles, one block per SM, lost to
    the 128 x 128 tiles that pair up; the tiles without the prefetching k loop to their
    prefetching twins)."""
    cfg = sm80_gemm.CONFIGS[name]
    shapes = [(1, 1, 1), (64, 4096, 4096), (300, 300, 300), (4096, 4096, 4096), (8192, 8192, 8192)]
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):
        assert all(sm80_gemm.choose(gemm_problem(*shape, cc=cc)) is not cfg for shape in shapes)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="bk must be 32 or 64"):
        sm80_gemm.Sm80Config("bad", 128, 128, 48, 2, 2, 3)


def test_user_epilogue_variant_assembles_without_local_memory():
    from numba import cuda, types

    @cuda.jit(device=True)
    def residual_scale(v, r, c, residual, scale):
        return v * scale[c] + residual[r, c]

    var = GemmVariant("row", "col", "bfloat16", "bfloat16", None, None, "relu",
                                epilogue=residual_scale, epilogue_args=2)
    kernel = sm80_gemm.kernel_for(sm80_gemm.CONFIGS["128x256x64_8w_3s_fp"], var)  # the default
    sig = sm80_gemm.signature(var) + (types.Tuple([types.Array(types.float32, 2, "C"),
                                                   types.Array(types.float32, 1, "C")]),)
    ptx = compile_ptx(kernel, sig, "sm_90a")
    assert "ld.local" not in ptx and "st.local" not in ptx
    assemble(ptx, "sm_90a")


@pytest.mark.parametrize("name", ["16x128x64_4w_6s", "64x128x64_4w_4s"])
def test_split_k_variant_assembles_without_local_memory(name):
    var = GemmVariant("row", "row", "bfloat16", "bfloat16", None, "bfloat16", "gelu",
                                split_k=True)
    ptx = compile_ptx(sm80_gemm.kernel_for(sm80_gemm.CONFIGS[name], var),
                      sm80_gemm.signature(var), "sm_90a")
    assert "atom.global.add.u32" in ptx  # the tile's counter
    assert "ld.local" not in ptx and "st.local" not in ptx
    assemble(ptx, "sm_90a")


@pytest.mark.parametrize("m, n, k, want", [
    (1, 8192, 8192, (4, 2048)),      # 64 tiles: 4 slices of 32 k tiles
    (16, 4096, 4096, (8, 512)),      # 32 tiles: 8 slices
    (1, 28672, 8192, (1, 8192)),     # 224 tiles fill the GPU: no split
    (64, 8192, 28672, (4, 7168)),
    (1, 4096, 200, (1, 200)),        # 4 k tiles: too short to split
    (128, 8192, 8192, (1, 8192)),    # M > 64: not split
])
def test_split_k_choice(m, n, k, want, monkeypatch):
    monkeypatch.delenv("NUMBATC_SPLIT_K", raising=False)
    p = gemm_problem(m, n, k)
    assert sm80_gemm.split(p, sm80_gemm.choose(p)) == want
    monkeypatch.setenv("NUMBATC_SPLIT_K", "3")
    splits, chunk = sm80_gemm.split(p, sm80_gemm.choose(p))
    assert splits * chunk >= k > (splits - 1) * chunk and chunk % 64 == 0 or (splits, chunk) == (1, k)


@pytest.mark.parametrize("value", ["0", "-2", "four", "2.5"])
def test_bad_split_k_is_named(value, monkeypatch):
    monkeypatch.setenv("NUMBATC_SPLIT_K", value)
    with pytest.raises(ValueError, match="NUMBATC_SPLIT_K=.*a positive number of K slices"):
        p = gemm_problem(1, 4096, 4096)
        sm80_gemm.split(p, sm80_gemm.choose(p))


def _copies_per_thread(cfg):
    """16-byte copies per thread per k tile: (BM + BN) x BK two-byte elements."""
    return (cfg.bm + cfg.bn) * cfg.bk // 8 // cfg.threads


@pytest.mark.parametrize("name, var", [("128x256x64_8w_3s", BENCH), ("128x128x64_4w_4s", FUSED),
                                       ("128x128x64_4w_4s", BENCH), ("64x64x64_4w_3s", BENCH),
                                       ("16x128x64_4w_6s", SPLIT), ("128x128x32_4w_4s", BENCH),
                                       ("128x128x64_4w_3s", BENCH), ("128x128x32_4w_3s", BENCH),
                                       ("16x128x64_4w_4s", SPLIT), ("128x128x32_4w_4s_fp", BENCH),
                                       ("128x256x64_8w_3s_fp", FUSED),
                                       ("16x128x64_4w_6s_fp", SPLIT),
                                       ("128x256x64_8w_3s_fp", STAGED)],
                         ids=["128x256-bench", "128x128-fused", "128x128-bench", "64x64-bench",
                              "16x128-split", "128x128x32-bench", "128x128x64-3s-bench",
                              "128x128x32-3s-bench", "16x128-4s-split", "128x128x32-fp-bench",
                              "128x256-fp-fused", "16x128-fp-split", "128x256-fp-staged"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_main_loop_sass(name, var, arch, tmp_path):
    """Whole-program SASS for sm_80 and for sm_90a, where the H200 runs it (as the driver JITs
    the module):

    - the rasterisation, the stage counters and split-K's slices divide in 32 bits: no 64-bit
      div/rem in the PTX, no CALL to the division subroutines (__cuda_sm20_div_s64 / rem_s64);
    - every mma.sync an HMMA.16816 (a warp's (BM / WARPS_M) x (BN / WARPS_N) x BK / (16 x 8 x 16)
      per k tile);
    - no spills on sm_90a; on sm_80 none in the k loop, and at most 32 bytes around it (ptxas
      13.0 keeps 5 values of the 128 x 128 x 64 row x row kernel in local memory across the
      loop, stored before it and loaded after it, once per tile; before the ldmatrix offsets
      were XOR-and-add constants it spilled none there);
    - the k loop has a path without bounds checks (tiles wholly inside a and b): the thread's
      copies as plain LDGSTS (no ZFILL), at most a few integer instructions each around them.
      (Before the unchecked copies, the 128x256 loop spent 331 instructions per k tile beside
      its 128 HMMA, 32 LDSM and 24 LDGSTS; then 78 on that path for sm_80 and 116 for sm_90a;
      with the XOR-and-add ldmatrix offsets 84 and 97.)"""
    cfg = sm80_gemm.CONFIGS[name]
    ptx = compile_ptx(sm80_gemm.kernel_for(cfg, var), sm80_gemm.signature(var), arch)
    assert not re.search(r"\b(div|rem)\.[su]64\b", ptx)
    log = whole_program_ptxas(ptx, tmp_path, arch)
    spilled = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spilled, log
    assert max(map(int, spilled.groups())) <= (32 if arch == "sm_80" else 0), log
    sass = disassemble(tmp_path / "kernel.cubin")
    assert "__cuda_sm20_div" not in sass and "__cuda_sm20_rem" not in sass
    per_tile = cfg.warp_m * cfg.warp_n * cfg.bk // (16 * 8 * 16)
    assert len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)) == per_tile
    blocks = main_loop(sass)
    loop = [t.split()[0] for block in blocks for t in block]
    assert not any(op.startswith(("LDL", "STL")) for op in loop), loop
    ldsm = [t for block in blocks for t in block if t.startswith("LDSM")]
    assert len(ldsm) == cfg.bk // 16 * (cfg.warp_m // 16 + cfg.warp_n // 16)
    unchecked = [t for block in blocks if not any("ZFILL" in t for t in block) for t in block]
    ops = [t.split()[0] for t in unchecked]
    copies = _copies_per_thread(cfg)
    assert sum(op.startswith("HMMA") for op in ops) == per_tile
    assert sum(op.startswith("LDGSTS") for op in ops) == copies, ops
    others = [op for op in ops if not op.startswith(("HMMA", "LDSM", "LDGSTS"))]
    assert len(others) <= 56 + 4 * copies, (len(others), others)


@pytest.mark.parametrize("name", sorted(sm80_gemm.CONFIGS))
def test_fragment_offsets_are_one_base_xor_and_add(name):
    """Every ldmatrix of the k loop addresses the stage's base for its operand XORed with one
    constant plus another (sm80_gemm._fragment_offsets, which refuses a configuration where
    that does not hold), for every configuration and layout.  And the rule itself, lane by
    lane: the constants
    give the per-(k step, tile) offsets of the formulas for every lane and warp position, with
    the stage and tile bases added, of which the XOR must not change anything."""
    cfg = sm80_gemm.CONFIGS[name]
    for a_layout in ("row", "col"):
        for b_layout in ("row", "col"):
            var = GemmVariant(a_layout, b_layout, "bfloat16", "bfloat16", None, None, None)
            src = sm80_gemm.kernel_source(cfg, var)
            # a k tile's loads (and the first k step's once more before a prefetching loop)
            assert src.count("ldmatrix_x4") == (
                (cfg.bk // 16 + cfg.prefetch) * (cfg.warp_m // 16 + cfg.warp_n // 16))
            a_rowb, b_rowb = sm80_gemm.tile_row_bytes(cfg, var)
            rows = sm80_gemm._fragment_rows(cfg, var, a_rowb, b_rowb)
            bases = {op: next(e for o, _, _, e in rows if o == op) for op in "ab"}
            stage = cfg.stage_elems * 2
            for op, ks, idx, expr in rows:
                rowb = a_rowb if op == "a" else b_rowb
                tile = 0 if op == "a" else cfg.bm * cfg.bk * 2
                x, y = sm80_gemm._xor_add(expr, bases[op], rowb, cfg)
                for so in (tile, stage + tile, 2 * stage + tile):
                    for lane in range(32):
                        for wm in range(cfg.warps_m):
                            for wn in range(cfg.warps_n):
                                env = {"lane": lane, "wm": wm, "wn": wn}
                                want = so + sm80_gemm._swizzle(eval(expr, env), rowb)
                                base = so + sm80_gemm._swizzle(eval(bases[op], env), rowb)
                                assert (base ^ x) + y == want, (op, ks, idx, lane, wm, wn)


def test_fragment_offsets_not_of_the_form_are_refused(monkeypatch):
    """A configuration whose ldmatrix rows are not its first rows XORed and moved by constants
    (none today) is refused by name, not compiled with wrong addresses."""
    monkeypatch.setattr(sm80_gemm, "_xor_add", lambda *a: None)
    var = GemmVariant("row", "col", "bfloat16", "bfloat16", None, None, None)
    with pytest.raises(ValueError, match="sm80 config 64x64x64_4w_3s: the ldmatrix rows of "
                                         "operand a, k step 0, tile 0"):
        sm80_gemm.kernel_source(sm80_gemm.CONFIGS["64x64x64_4w_3s"], var)


@pytest.mark.parametrize("name", ["128x256x64_8w_3s_fp", "16x128x64_4w_6s_fp",
                                  "128x128x32_4w_3s_fp"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_staged_epilogue_sass(name, arch, tmp_path):
    """GemmVariant.out_staged: the inside tile's values go to shared memory as one 32-bit STS
    per fragment row pair and leave as 16-byte rows, one LDS.128 and one STG.E.128 per lane per
    pass (a warp tile's warp_m x warp_n bf16 values over 32 lanes of 16 bytes), where the plain
    variant stores 32 bits a fragment row pair; no local memory."""
    cfg = sm80_gemm.CONFIGS[name]
    ptx = compile_ptx(sm80_gemm.kernel_for(cfg, STAGED), sm80_gemm.signature(STAGED), arch)
    assert "ld.local" not in ptx and "st.local" not in ptx
    whole_program_ptxas(ptx, tmp_path, arch)
    sass = disassemble(tmp_path / "kernel.cubin")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
    frag_pairs = 2 * (cfg.warp_m // 16) * (cfg.warp_n // 8)
    passes = cfg.warp_m * cfg.warp_n * 2 // 512
    assert ops.count("STS") == frag_pairs
    assert ops.count("LDS.128") == passes and ops.count("STG.E.128") == passes
    assert ops.count("STG.E") == 0  # the 32-bit pair stores are gone from the inside path


def test_staged_variant_where_out_rows_are_16_byte_aligned():
    """sm80_gemm.variant stages through shared memory only for a staged configuration
    (Sm80Config.staged) and a 16-bit row-major out whose start and rows are 16-byte aligned,
    without split-K."""
    import dataclasses

    from numbatc.kernels import sm80_gemm as g
    from tests.helpers.problems import operand

    cfg = g.CONFIGS["128x256x64_8w_3s_fps"]
    p = gemm_problem(512, 512, 512)
    assert g.variant(p, cfg, False).out_staged
    assert not g.variant(p, g.CONFIGS["128x256x64_8w_3s_fp"], False).out_staged
    assert not g.variant(p, cfg, True).out_staged
    for alignment in (8, 4):  # 32-bit pair stores still, no 16-byte rows
        q = dataclasses.replace(p, out=operand("out", "row", 516, alignment))
        assert g.variant(q, cfg, False).out_pairs and not g.variant(q, cfg, False).out_staged
    assert not g.variant(gemm_problem(512, 512, 512, out_dtype="float32"), cfg, False).out_staged
