"""The Hopper GEMM without a GPU: every configuration and the operand layouts compile for sm_90a
with the pipeline's instructions in the PTX, assemble without local memory, spills or serialised
wgmma (nvJitLink, as numba links; and whole-program ptxas, as the driver JITs a setmaxnreg
kernel, where the producer runs in 40 registers); sm_80 refuses the kernel; unsupported variants
and configurations are named."""

import functools
import re
import subprocess
from dataclasses import replace

import pytest

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import assemble, compile_ptx
from numbatc.kernels import sm90_gemm
from tests.helpers.assemblers import nvdisasm_path, nvjitlink_info_log, whole_program_ptxas

PLAIN = sm90_gemm.Sm90Variant("row", "row", "bfloat16", "float32", None, None, None)
FUSED = sm90_gemm.Sm90Variant("row", "col", "float16", "bfloat16", "bfloat16", "float16", "gelu",
                              out_layout="col")
A_COL = sm90_gemm.Sm90Variant("col", "row", "bfloat16", "float16", "float32", None, "relu")


@functools.cache
def _ptx(name, var, arch="sm_90a"):
    cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
    return compile_ptx(sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var),
                       arch, launch_bounds=(cfg.threads, 1))


def _cp_async(configs):
    return sorted(name for name, cfg in configs.items() if cfg.producer == "cp.async")


CASES = [(name, PLAIN) for name in _cp_async(sm90_gemm.CONFIGS)] + [
    ("128x128x64_4s", FUSED), ("128x256x64_3s", A_COL)]


@pytest.mark.parametrize("name, var", CASES, ids=[f"{n}-{v.a_layout}{v.b_layout}" for n, v in CASES])
def test_assembles_for_sm90a_without_local_memory(name, var):
    cfg = sm90_gemm.CONFIGS[name]
    ptx = _ptx(name, var)
    trans = f"1, 1, {0 if var.a_layout == 'row' else 1}, {0 if var.b_layout == 'col' else 1};"
    mma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(mma) == cfg.bk // 16
    assert all(f".m64n{cfg.bn}k16.f32." in line and trans in line for line in mma), mma[0]
    publish = "cp.async.mbarrier.arrive.noinc.shared::cta.b64"
    for text in (f"setmaxnreg.dec.sync.aligned.u32 {cfg.producer_regs};",
                 f"setmaxnreg.inc.sync.aligned.u32 {cfg.consumer_regs};",
                 publish, "fence.proxy.async.shared::cta",
                 f"wgmma.wait_group.sync.aligned {cfg.inflight};",
                 f".maxntid {cfg.threads}, 1, 1",
                 ".extern .shared .align 1024"):
        assert text in ptx, text
    assert "ld.local" not in ptx and "st.local" not in ptx
    # the producer's two paths: every copy of a stage once unchecked (tiles inside the operands),
    # once with a source byte count (edge tiles); the inside path must not be lost
    copies = cfg.stage_bytes // 16 // 128  # per thread
    plain = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16;", ptx)
    zfill = re.findall(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16, %r\d+;", ptx)
    assert len(plain) == copies and len(zfill) >= copies, (len(plain), len(zfill), copies)
    log = nvjitlink_info_log(ptx, options=("-O3", "-Xptxas=-v"))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7509" not in log, log  # "wgmma.mma_async instructions are serialized"
    assert len(assemble(ptx, "sm_90a")) > 0


@pytest.mark.parametrize("pairs", [False, True])
def test_pair_stores_only_where_out_allows(pairs):
    """GemmVariant.out_pairs: a 16-bit out's column pairs inside the matrix as one st.global.b32
    each (BN / 8 fragments x 2 rows per thread); without it, 16-bit stores only."""
    var = sm90_gemm.Sm90Variant("row", "row", "bfloat16", "bfloat16", None, None, None,
                                out_pairs=pairs)
    cfg = sm90_gemm.CONFIGS["128x256x64_4s_pt"]
    ptx = compile_ptx(sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var),
                      "sm_90a", launch_bounds=(384, 1))
    assert ptx.count("st.global.b32") == (2 * 256 // 8 if pairs else 0)
    assert "st.global.b16" in ptx or "st.global.u16" in ptx  # the edge tiles' element stores


@pytest.mark.parametrize("name", ["128x256x64_3s", "128x128x64_4s", "128x256x64_4s_w1",
                                  "128x256x64_4s_pt", "128x256x64_4s_w1_pt"])
def test_whole_program_keeps_setmaxnreg_without_spills(name, tmp_path):
    """As the driver compiles it (intrinsics.launch loads setmaxnreg kernels whole-program): the
    register split is honoured and the 40-register producer does not spill."""
    log = whole_program_ptxas(_ptx(name, PLAIN), tmp_path)
    assert "C7504" not in log and "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = nvdisasm_path()
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    bn = sm90_gemm.CONFIGS[name].bn
    assert len(re.findall(rf"HGMMA\.64x{bn}x16\.F32\.BF16", sass)) == 4
    assert "USETMAXREG" in sass
    # the in-flight group survives ptxas: no wait was injected before the barrier wait
    inflight = sm90_gemm.CONFIGS[name].inflight
    assert f"WARPGROUP.DEPBAR.LE gsb0, 0x{inflight}" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_refused_on_sm80():
    with pytest.raises(Exception) as info:
        _ptx("128x128x64_4s", PLAIN, "sm_80")
    assert isinstance(info.value, ArchitectureError) or "needs" in str(info.value)
    assert "sm_80" in str(info.value)


def test_unsupported_variants_and_configs_are_named():
    bad = sm90_gemm.Sm90Variant("row", "row", "float32", "float32", None, None, None)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        sm90_gemm.kernel_for(sm90_gemm.CONFIGS["128x128x64_4s"], bad)
    with pytest.raises(ValueError, match="bk must be 64"):
        sm90_gemm.Sm90Config("bad", 128, 3, bk=32)
    with pytest.raises(ValueError, match="more than the 64512"):
        sm90_gemm.Sm90Config("regs", 128, 3, producer_regs=80, consumer_regs=232)


#: spill bytes a user epilogue (bias + GELU + a residual and a column scale) may cost: none where
#: the consumers hold 240 registers (the TMA producer's split); the cp.async producer's 40 / 232
#: split leaves the epilogue's every-value-first form (epilogue.full_tile_epilogue's NOTE) 16
#: bytes short, stored and loaded once per tile outside the main loop (the generated kernel it
#: replaced: 0; its persistent form, 56 / 224: 16)
USER_EPILOGUE_SPILL = {"128x256x64_3s_pt_tma_ts": 0, "128x256x64_4s_pt_tma": 0,
                       "128x128x64_4s_w1_tma": 0, "128x256x64_4s_w1": 16}


@pytest.mark.parametrize("name", list(USER_EPILOGUE_SPILL))
def test_user_epilogue_variant_keeps_wgmma_unserialised(name, tmp_path):
    """A user epilogue (here a per-column scale and a residual add) fused into the Hopper kernel:
    no local memory in the PTX, no call left (a call would serialise every wgmma: C7509), and
    at most :data:`USER_EPILOGUE_SPILL` bytes of spill in the whole-program build with
    setmaxnreg."""
    from numba import cuda, types

    @cuda.jit(device=True)
    def residual_scale(v, r, c, residual, scale):
        return v * scale[c] + residual[r, c]

    var = sm90_gemm.Sm90Variant("row", "row", "bfloat16", "bfloat16", None, "bfloat16", "gelu",
                                epilogue=residual_scale, epilogue_args=2)
    cfg = sm90_gemm.CONFIGS[name]
    sig = sm90_gemm.kernel_signature(cfg, var) + (types.Tuple([types.Array(types.float32, 2, "C"),
                                                   types.Array(types.float32, 1, "C")]),)
    ptx = compile_ptx(sm90_gemm.kernel_for(cfg, var), sig, "sm_90a", launch_bounds=(cfg.threads, 1))
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert "call.uni" not in ptx and "call " not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    spill = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert spill and max(spill) <= USER_EPILOGUE_SPILL[name], log
    assert "C7509" not in log, log


# ---------------------------------------------------------------------------------------------
# FP8 (per-tensor scales): K-major a and b, m64nNk32 e4m3/e5m2 -> f32
# ---------------------------------------------------------------------------------------------

FP8_PLAIN = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                                     b_dtype="float8_e4m3fn")
FP8_FUSED = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e5m2", "float16", "float16", "float32",
                                     "gelu", b_dtype="float8_e4m3fn")
FP8_CASES = [(name, FP8_PLAIN) for name in _cp_async(sm90_gemm.FP8_CONFIGS)] + [
    ("fp8_128x256x128_4s_w1", FP8_FUSED)]


@functools.cache
def _fp8_ptx(name, var, arch="sm_90a"):
    cfg = sm90_gemm.FP8_CONFIGS[name]
    return compile_ptx(sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var), arch,
                       launch_bounds=(cfg.threads, 1))


@pytest.mark.parametrize("name, var", FP8_CASES,
                         ids=[f"{n}-{v.in_dtype[7:]}x{v.b_dtype[7:]}" for n, v in FP8_CASES])
def test_fp8_assembles_for_sm90a_without_spills(name, var, tmp_path):
    """Four wgmma m64nBNk32 with the operands' fp8 types and no transpose immediates per k tile
    of 128 values; no local memory, spills or serialised wgmma, through nvJitLink and as the
    driver builds it (whole-program ptxas with setmaxnreg)."""
    cfg = sm90_gemm.FP8_CONFIGS[name]
    ptx = _fp8_ptx(name, var)
    types = f"{sm90_gemm.FP8_DTYPES[var.in_dtype]}.{sm90_gemm.FP8_DTYPES[var.b_dtype]}"
    mma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    assert len(mma) == cfg.bk // 32 == 4
    assert all(f".m64n{cfg.bn}k32.f32.{types} " in line and line.rstrip().endswith("p, 1, 1; }")
               for line in mma), mma[0]
    for text in (f"setmaxnreg.dec.sync.aligned.u32 {cfg.producer_regs};",
                 f"setmaxnreg.inc.sync.aligned.u32 {cfg.consumer_regs};",
                 "cp.async.mbarrier.arrive.noinc.shared::cta.b64", "fence.proxy.async.shared::cta",
                 f"wgmma.wait_group.sync.aligned {cfg.inflight};", ".maxntid 384, 1, 1"):
        assert text in ptx, text
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = nvjitlink_info_log(ptx, options=("-O3", "-Xptxas=-v"))
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7509" not in log, log
    whole = whole_program_ptxas(ptx, tmp_path)
    assert "C7504" not in whole and "C7508" not in whole and "C7509" not in whole, whole
    assert "0 bytes spill stores, 0 bytes spill loads" in whole, whole
    disasm = nvdisasm_path()
    if disasm is not None:
        sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                              text=True, check=True).stdout
        assert len(re.findall(rf"QGMMA\.64x{cfg.bn}x32\.F32", sass)) == 4, sass.count("GMMA")
        assert not re.search(r"\b(LDL|STL)\b", sass)


def test_fp8_variants_and_configs_are_checked():
    cfg = sm90_gemm.FP8_CONFIGS["fp8_128x128x128_4s_w1"]
    bad = sm90_gemm.Sm90Fp8Variant("row", "row", "float8_e4m3fn", "bfloat16", None, None, None)
    with pytest.raises(ValueError, match="both operands K-major .* a_layout 'row' and b_layout 'col'"):
        sm90_gemm.kernel_for(cfg, bad)
    with pytest.raises(ValueError, match="is for fp8 inputs, the variant's are bfloat16: use CONFIGS"):
        sm90_gemm.kernel_for(cfg, PLAIN)
    with pytest.raises(ValueError, match="is for bf16/f16 inputs.*use FP8_CONFIGS"):
        sm90_gemm.kernel_for(sm90_gemm.CONFIGS["128x128x64_4s"], FP8_PLAIN)
    with pytest.raises(ValueError, match=r"bk must be 128 \(one 128-byte swizzle row of fp8\)"):
        sm90_gemm.Sm90Config("bad", 128, 3, elem_bytes=1)
    # every fp8 tile has the bytes per stage of its bf16 shape (the blockwise-only tiles have
    # no bf16 form)
    assert all(c.stage_bytes == sm90_gemm.CONFIGS[n[4:].replace("x128_", "x64_")].stage_bytes
               for n, c in sm90_gemm.FP8_CONFIGS.items()
               if n not in sm90_gemm.BLOCKWISE_CONFIGS)


@pytest.mark.parametrize("name", ["128x256x64_4s", "128x256x64_4s_w1", "128x128x64_4s_w1"])
def test_split_k_variant_keeps_setmaxnreg_without_spills(name, tmp_path):
    """Split-K (small M): the consumers' epilogue through the workspace, a named barrier over the
    256 consumer threads, the tile counter's atom.global.add; as the driver compiles it."""
    var = sm90_gemm.Sm90Variant("row", "row", "bfloat16", "bfloat16", None, "float32", "gelu",
                                split_k=True)
    ptx = _ptx(name, var)
    assert "atom.global.add.u32" in ptx and ptx.count("barrier.sync.aligned 1,") == 2
    log = whole_program_ptxas(ptx, tmp_path)
    assert "C7504" not in log and "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


def test_fp8_split_k_variant_assembles(tmp_path):
    var = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                                   split_k=True, b_dtype="float8_e5m2")
    cfg = sm90_gemm.FP8_CONFIGS["fp8_128x256x128_4s_w1"]
    ptx = compile_ptx(sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var),
                      "sm_90a", launch_bounds=(cfg.threads, 1))
    assert "atom.global.add.u32" in ptx and "e4m3.e5m2" in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    assert "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


# ---------------------------------------------------------------------------------------------
# The TMA producer (sm90_gemm_tma): one thread's tensor copies, expect_tx of the stage's bytes
# ---------------------------------------------------------------------------------------------

TMA_NAMES = sorted(n for n, c in {**sm90_gemm.CONFIGS, **sm90_gemm.FP8_CONFIGS}.items()
                   if c.producer == "tma" and c.store == "direct")
#: the TMA store epilogue's configurations (bf16 / f16 row-major outs only: see
#: test_tma_store_epilogue_assembles)
TS_NAMES = sorted(n for n, c in {**sm90_gemm.CONFIGS, **sm90_gemm.FP8_CONFIGS}.items()
                  if c.store == "tma")
SPLIT = sm90_gemm.Sm90Variant("col", "row", "bfloat16", "bfloat16", None, "float32", "gelu",
                              split_k=True)
FP8_SPLIT = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                                     split_k=True, b_dtype="float8_e5m2")
TMA_CASES = ([(n, FP8_PLAIN if n.startswith("fp8") else PLAIN) for n in TMA_NAMES]
             + [("128x256x64_4s_pt_tma", v) for v in (FUSED, A_COL)]
             + [(n, SPLIT) for n in ("128x256x64_4s_w1_tma", "64x256x64_4s_w1_tma",
                                     "64x128x64_6s_w1_tma", "128x128x64_6s_w1_tma")]
             + [("fp8_128x256x128_4s_w1_tma", FP8_SPLIT),
                ("fp8_64x128x128_6s_w1_tma", FP8_SPLIT),  # FP8's small tiles split K
                ("fp8_64x256x128_4s_w1_tma", FP8_SPLIT),
                ("fp8_128x256x128_4s_pt_tma", FP8_FUSED)])


def _boxes(cfg, var):
    """Tensor copies per stage: one box per K-major operand, one per 64 mn of an MN-major one."""
    a = 1 if var.a_layout == "row" else cfg.bm // 64
    b = 1 if var.b_layout == "col" else cfg.bn // 64
    return a + b


@pytest.mark.parametrize("name, var", TMA_CASES,
                         ids=[f"{n}-{v.a_layout}{v.b_layout}{'-split' if v.split_k else ''}"
                              f"{'-' + v.activation if v.activation else ''}"
                              for n, v in TMA_CASES])
def test_tma_producer_assembles_without_spills(name, var, tmp_path):
    """The PTX has the tensor copies (1D..2D tile loads into shared::cluster with mbarrier
    completion) and the stage's expect_tx, and no cp.async or proxy fence at all (the consumers
    read what the async proxy wrote); as the driver builds it (whole-program ptxas with
    setmaxnreg 24 / 240): no spills, no local memory, no serialised wgmma."""
    cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
    ptx = _ptx(name, var)
    loads = [line for line in ptx.splitlines() if "cp.async.bulk.tensor" in line]
    assert loads and all(".2d.shared::cluster.global.mbarrier::complete_tx::bytes" in line
                         for line in loads), loads[:1]
    # LLVM may unroll the producer's k loop: whole copies of the stage's group of loads
    arms = [line for line in ptx.splitlines() if "mbarrier.arrive.expect_tx" in line]
    assert arms and len(loads) % _boxes(cfg, var) == 0, (len(loads), len(arms))
    # the count: the stage's bytes, whatever the edges (the zero fill counts), in a register
    assert all(re.search(r"\], %r\d+;$", line.strip()) for line in arms), arms[:1]
    assert re.search(rf"mov\.u32\s+%r\d+, {cfg.stage_bytes};", ptx), cfg.stage_bytes
    assert "cp.async.cg" not in ptx and "cp.async.ca" not in ptx and "cp.async.mbarrier" not in ptx
    assert "fence.proxy.async" not in ptx
    mma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    halves = 2 if cfg.pingpong else 1  # ping-pong: a warpgroup's tile is both 64-row halves
    assert len(mma) == 4 * halves
    if cfg.pingpong:  # the turns at the main loop: named barriers 4 and 5
        for text in ("barrier.sync.aligned 4, ", "barrier.sync.aligned 5, ",
                     "barrier.arrive.aligned 4, ", "barrier.arrive.aligned 5, "):
            assert text in ptx, text
    for text in (f"setmaxnreg.dec.sync.aligned.u32 {cfg.producer_regs};",
                 f"setmaxnreg.inc.sync.aligned.u32 {cfg.consumer_regs};",
                 f"wgmma.wait_group.sync.aligned {cfg.inflight};",
                 f".maxntid {cfg.threads}, 1, 1",
                 "prefetch.tensormap"):
        assert text in ptx, text
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    assert "C7504" not in log and "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = nvdisasm_path()
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    assert "UTMALDG" in sass and "LDGSTS" not in sass
    assert len(re.findall(rf"[HQ]GMMA\.64x{cfg.bn}x", sass)) == 4 * halves
    assert not re.search(r"\b(LDL|STL)\b", sass)


TS_BF16 = sm90_gemm.Sm90Variant("row", "col", "bfloat16", "bfloat16", None, None, None,
                                out_pairs=True)
TS_FUSED = sm90_gemm.Sm90Variant("col", "row", "float16", "float16", "float16", "float16", "gelu")
TS_FP8 = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                                  b_dtype="float8_e4m3fn", out_pairs=True)
TS_CASES = ([(n, TS_FP8 if n.startswith("fp8") else TS_BF16) for n in TS_NAMES]
            + [("128x256x64_3s_pt_tma_ts", TS_FUSED)])


@pytest.mark.parametrize("name, var", TS_CASES,
                         ids=[f"{n}-{v.out_dtype}{'-' + v.activation if v.activation else ''}"
                              for n, v in TS_CASES])
def test_tma_store_epilogue_assembles(name, var, tmp_path):
    """The TMA store epilogue: per consumer warpgroup BN / 16 stmatrix.x4 into the staging tile
    and BN / 64 tensor stores from shared memory, the writers' proxy fence before them, the
    staging tile's wait for the previous stores' reads and the final wait; no spills, no local
    memory, no serialised wgmma (whole-program ptxas, as the driver builds it)."""
    cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
    ptx = _ptx(name, var)
    lines = ptx.splitlines()
    stores = [x for x in lines if "cp.async.bulk.tensor" in x and ".global.shared::cta" in x]
    # ping-pong: each 64-row half of a warpgroup's tile, LLVM keeping the halves' loop rolled
    # (one copy of the stores, run twice) or not
    halves = {1, 2} if cfg.pingpong else {1}
    assert len(stores) in {h * cfg.bn // 64 for h in halves}, stores
    assert (sum("stmatrix.sync.aligned.m8n8.x4.shared.b16" in x for x in lines)
            in {h * cfg.bn // 16 for h in halves})
    for text in ("fence.proxy.async.shared::cta", "cp.async.bulk.commit_group",
                 "cp.async.bulk.wait_group.read 0", "cp.async.bulk.wait_group 0",
                 "barrier.sync.aligned 2, ", "barrier.sync.aligned 3, "):
        assert text in ptx, text
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    assert "C7504" not in log and "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = nvdisasm_path()
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    assert len(re.findall(r"\bUTMASTG\b", sass)) in {h * cfg.bn // 64 for h in halves}
    assert len(re.findall(r"\bSTSM\b", sass)) in {h * cfg.bn // 16 for h in halves}
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_tma_store_configs_and_twins():
    """Every _ts configuration has its direct-store twin (the fallback for outs a tensor map
    cannot describe) and a split twin; a TMA store needs the TMA producer; the staging tile
    comes after the stages, 1024-byte aligned."""
    for name in TS_NAMES:
        cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
        twin = sm90_gemm.with_store(cfg, "direct")
        assert twin.store == "direct" and twin.name == name.removesuffix("_ts"), name
        assert sm90_gemm.with_store(twin, "tma") is cfg
        assert (twin.bm, twin.bn, twin.stages, twin.inflight, twin.persistent) == (
            cfg.bm, cfg.bn, cfg.stages, cfg.inflight, cfg.persistent)
        # a K slice runs direct stores: the _ts name's split twin, and the persistent direct
        # twin's (a one-tile-per-block twin splits as itself)
        assert name in sm90_gemm.SPLIT_TWIN
        assert twin.name in sm90_gemm.SPLIT_TWIN or not twin.persistent
        # (ping-pong: a staging tile per consumer warpgroup)
        assert cfg.shared_bytes == cfg.stages * cfg.stage_bytes + cfg.bm * cfg.bn * 2 * (
            2 if cfg.pingpong else 1)
        assert cfg.stages * cfg.stage_bytes % 1024 == 0
    with pytest.raises(ValueError, match="TMA store epilogue is implemented with the TMA"):
        sm90_gemm.Sm90Config("ts", 128, 3, store="tma")
    with pytest.raises(ValueError, match="store must be 'direct' or 'tma'"):
        sm90_gemm.Sm90Config("ts", 128, 3, store="stmatrix")


def test_tma_layouts_match_the_descriptors():
    """What the boxes write is what the consumers' descriptors read: for every element of an
    MN-major tile, the K-first layout's offset (the (BK, 64) boxes' images) equals wgmma's
    address model (intrinsics.wgmma.smem_desc_address_host) for its LBO / SBO at each K slice;
    K-major tiles keep SmemLayout's."""
    import numpy as np

    from intrinsics.layout import make_smem_desc_host, smem_desc_address_host
    from numbatc.kernels import sm90_gemm_tma

    cfg = sm90_gemm.CONFIGS["128x256x64_4s_tma"]
    for op, mn in (("a", 64), ("b", cfg.bn)):  # a: one consumer's 64 rows
        lay = sm90_gemm_tma.operand_layout(cfg, op, k_major=False)
        assert (lay.lbo, lay.sbo) == (cfg.bk * 128, 1024)
        for k0 in range(0, cfg.bk, 16):
            desc = make_smem_desc_host(lay.k_offset(k0), lay.lbo, lay.sbo, 128)
            m_, k_ = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
            model = smem_desc_address_host(desc, "MN", 2, m_, k_)
            assert np.array_equal(model, lay.offset(m_, k0 + k_)), (op, k0)
    # box j of (BK, 64) lands at j * BK * 128: the layout of mn = 64 j + i is box j's image
    lay = sm90_gemm_tma.operand_layout(cfg, "b", k_major=False)
    assert int(lay.offset(64, 0)) == cfg.bk * 128
    k_lay = sm90_gemm_tma.operand_layout(cfg, "b", k_major=True)
    assert (k_lay.lbo, k_lay.sbo) == (16, 1024) and int(k_lay.offset(8, 0)) == 8 * 128


def test_tma_twins_and_the_default_switch():
    """Every TMA configuration but the small tiles (bf16's 64-row ones, FP8's 64-row and
    6-stage 128 x 128 ones) has a cp.async twin with the same tile, stages and schedule (the
    fallback for operands a tensor map cannot describe); the small tiles have none, and dispatch
    chooses them only where a tensor map describes the operands (tests/test_gemm_heuristic.py)."""
    from dataclasses import replace

    assert sm90_gemm.DEFAULT_PRODUCER in ("cp.async", "tma")
    # ... and the direct-store twins of the TMA store configurations (a forced _ts
    # configuration's fallback for an out a tensor map cannot describe: they load by TMA only),
    # and the blockwise FP8 configurations
    tma_only = {"64x128x64_6s_w1_tma", "64x256x64_4s_w1_tma",
                *(name for name, _ in sm90_gemm.FP8_SMALL_TILES), sm90_gemm.FP8_MID_TILE,
                "128x256x64_3s_pt_tma", "128x256x64_3s_w1_pt_tma", "128x128x64_4s_w1_pt_tma",
                "fp8_128x256x128_3s_pt_tma", *sm90_gemm.BLOCKWISE_CONFIGS,
                *(name for name in TMA_NAMES if sm90_gemm.CONFIGS.get(name, None) is not None
                  and sm90_gemm.CONFIGS[name].pingpong)}  # ping-pong: TMA only
    for name in TMA_NAMES:
        cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
        twin = sm90_gemm.with_producer(cfg, "cp.async")
        if name in tma_only:
            assert twin is cfg and name.removesuffix("_tma") not in {
                **sm90_gemm.CONFIGS, **sm90_gemm.FP8_CONFIGS}
            continue
        assert twin.producer == "cp.async" and twin.name == name.removesuffix("_tma")
        assert replace(twin, name=name, producer="tma", producer_regs=24,
                       consumer_regs=240) == cfg
        assert sm90_gemm.with_producer(twin, "tma") is cfg
    assert sm90_gemm.tma_unsupported((("a", 16), ("b", 16))) is None
    assert "b not 16-byte aligned" in sm90_gemm.tma_unsupported((("a", 16), ("b", 8)))


BW = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                              b_dtype="float8_e4m3fn", out_pairs=True, blockwise=True)
BW_CASES = [(n, BW) for n in sm90_gemm.BLOCKWISE_CONFIGS] + [
    ("fp8_64x128x128_8s_pt_tma", replace(BW, split_k=True, b_dtype="float8_e5m2",
                                         out_dtype="float32", out_pairs=False))]


@pytest.mark.parametrize("name, var", BW_CASES,
                         ids=[f"{n}{'-split' if v.split_k else ''}" for n, v in BW_CASES])
def test_fp8_blockwise_assembles_without_spills(name, var, tmp_path):
    """FP8 with blockwise scales: per k tile 4 wgmma into the tile's product (the first with
    scale-d 0), its wait, and BN / 2 fused multiply-adds into the accumulator per thread; 64 +
    64 accumulator registers and no spills, no local memory, no serialised wgmma."""
    cfg = sm90_gemm.FP8_CONFIGS[name]
    ptx = _ptx(name, var)
    assert len([x for x in ptx.splitlines() if "wgmma.mma_async" in x]) == 4
    assert ptx.count("fma.rn.f32") >= cfg.bn // 2
    assert "wgmma.wait_group.sync.aligned 0;" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    assert "C7504" not in log and "C7508" not in log and "C7509" not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = nvdisasm_path()
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    assert len(re.findall(rf"QGMMA\.64x{cfg.bn}x32", sass)) == 4
    assert not re.search(r"\b(LDL|STL)\b", sass)


# ---------------------------------------------------------------------------------------------
# The TMA kernel as code (sm90_gemm_tma.make_kernel): its parameters, its constants
# ---------------------------------------------------------------------------------------------

PARAM_CASES = [("128x256x64_4s_pt_tma", PLAIN, 2 + 13),
               ("128x256x64_3s_pt_tma_ts", TS_FUSED, 3 + 13),
               ("64x128x64_6s_w1_tma", SPLIT, 2 + 13 + 4),
               (BW_CASES[-1][0], BW_CASES[-1][1], 2 + 13 + 6 + 4)]


@pytest.mark.parametrize("name, var, count", PARAM_CASES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(PARAM_CASES)])
def test_code_kernel_parameters_are_the_flat_launch_layout(name, var, count):
    """make_kernel's kernel takes out's tensor map, the blockwise scales, split-K's arguments
    and a user epilogue's arrays as tuples, empty where the variant has none: in the PTX .entry
    an empty tuple is no parameter and a tuple's members are parameters in order, so the
    parameters are the flat list the launch packs (intrinsics.launch.param_layout of the same
    signature: one per member, a tensor map 128 bytes at a 64-byte aligned offset)."""
    import struct

    from intrinsics.launch import param_layout

    cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
    sig = sm90_gemm.kernel_signature(cfg, var)
    entry = re.search(r"\.entry[^(]*\(([^)]*)\)", _ptx(name, var)).group(1)
    sizes = [128 if "[128]" in p else int(re.search(r"\.[a-z](\d+)", p).group(1)) // 8
             for p in entry.split(",")]
    fmt, offsets = param_layout(sig)
    codes = [c for c in re.findall(r"\d*[a-zA-Z?]", fmt[1:]) if c != "x"]
    assert len(sizes) == len(codes) == count
    assert [struct.calcsize(c) for c in codes] == sizes
    assert all(off % 64 == 0 for off, c in zip(offsets, codes) if c == "128s")


def test_code_kernel_describes_its_constants():
    """describe() names where the kernel's code is and the constants its functions close over:
    the tile, the stages' ring, the chosen epilogue functions."""
    from numbatc.kernels import sm90_gemm_tma

    text = sm90_gemm_tma.describe(sm90_gemm.CONFIGS["128x256x64_3s_pt_tma_ts"], TS_FUSED)
    assert "make_kernel.<locals>.gemm_kernel: BK=64, BM=128, BN=256" in text
    assert "tma_store=True" in text and "pers=True" in text
    assert "S=3" in text  # the ring's stages
    assert "activation_fn=_gelu" in text  # the variant's activation, chosen by make_epilogue
    text = sm90_gemm_tma.describe(sm90_gemm.CONFIGS["128x256x64_4s_pt"], TS_FUSED)
    assert "cp_async=True" in text and "make_cp_producer.<locals>.produce" in text
