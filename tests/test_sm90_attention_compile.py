"""The Hopper attention kernel without a GPU: every configuration compiles for sm_90a at its head
dims (64 and 128; 192 or 256 for theirs) with the pipeline's instructions in the PTX (wgmma SS
for Q K^T, RS with trans-b for P V, setmaxnreg, cp.async with mbarrier arrivals, the proxy
fence), and assembles whole-program
(as the driver JITs a setmaxnreg kernel) without local memory, spills, or serialised wgmma
(C7509 calls, C7513 registers defined inside a wgmma pipeline stage, C7519 injected arrives,
C7517 injected waits); with nvdisasm on PATH the SASS shows the HGMMAs, and the overlapped
schedule keeps its wgmma group in flight (DEPBAR.LE gsb0, 0x1), and the ping-pong ones (_pp)
have their named barriers 1 and 2 (barrier.sync/arrive 256; BAR.SYNC/BAR.ARV).  The TMA
configurations (_tma) have 4-d tensor copies completing on mbarriers armed with expect_tx, the
descriptor prefetches, and neither cp.async nor the proxy fence (SASS: UTMALDG); their byte
counts are the boxes' sizes; the persistent one (_pt) loops over work tiles.  sm_80 refuses the kernel; bad configurations and head dims are
named."""

import functools
import re
import subprocess

import pytest
from numba import types

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import compile_ptx
from numbatc.kernels import sm90_attention as attn, sm90_attention_tma
from tests.helpers.assemblers import nvdisasm_path, whole_program_ptxas


@functools.cache
def _ptx(name, head_dim, dtype="bfloat16", causal=True, with_lse=True, arch="sm_90a"):
    cfg = attn.CONFIGS[name]
    var = attn.AttnVariant(head_dim, dtype, causal, with_lse)
    return compile_ptx(attn.kernel_for(cfg, var), attn.signature(var, cfg), arch,
                       launch_bounds=(cfg.threads, 1))


# every config at its largest head dim (the most registers: 128 for most), the default and the
# in-order one at 64 too, and f16 without causal mask or lse (about 8 s each: numba compile +
# ptxas; 20 s at head_dim 192 / 256)
CASES = [(name, max(attn.CONFIGS[name].head_dims), "bfloat16", True, True)
         for name in sorted(attn.CONFIGS)]
# three consumers (160 registers a consumer thread: see make_kernel's NOTE on their mask)
# without the mask and in f16
CASES += [(name, 64, "float16", False, True) for name in sorted(attn.CONFIGS)
          if attn.CONFIGS[name].consumers == 3]
CASES += [("n128_2s_ov", 64, "bfloat16", True, True), ("n128_2s", 64, "bfloat16", True, True),
          ("n128_2s_ov", 128, "float16", False, False), ("n64_2s", 64, "float16", False, True)]
# the TMA producer at head_dim 64 (one box per tile) too
CASES += [("n128_2s_ov_pp_fx_tma", 64, "bfloat16", True, True),
          ("n128_2s_fx_tma", 64, "float16", False, False),
          ("n128_2s_ov_pp_fx_tma_pt", 64, "float16", False, True)]
# head_dim 192 and 256's defaults and twins in the other variants: ptxas's allocation moved with
# each (it spilled 4-44 bytes in some before the epilogue computed b and h again)
CASES += [(name, d, dtype, causal, lse) for d in (192, 256)
          for name in (attn.DEFAULT_TMA[d], attn.DEFAULT[d])
          for dtype, causal, lse in (("float16", False, False), ("bfloat16", True, False),
                                     ("float16", False, True))]
# head_dim 96 (64B swizzle, three parts per row): the default, its cp.async twin, the 3-stage
# ring and the persistent one
CASES += [(name, 96, "bfloat16", True, True) for name in sorted(
    n for n, c in attn.CONFIGS.items() if 96 in c.head_dims)]
CASES += [(name, 96, "float16", False, False) for name in (attn.DEFAULT_TMA[96], attn.DEFAULT[96])]


@pytest.mark.parametrize("name, d, dtype, causal, with_lse", CASES,
                         ids=[f"{c[0]}-d{c[1]}-{c[2]}{'-causal' if c[3] else ''}"
                              f"{'-lse' if c[4] else ''}" for c in CASES])
def test_assembles_without_spills_or_serialised_wgmma(name, d, dtype, causal, with_lse, tmp_path):
    cfg = attn.CONFIGS[name]
    ptx = _ptx(name, d, dtype, causal, with_lse)
    t = "bf16" if dtype == "bfloat16" else "f16"
    mma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    qk = [x for x in mma if f".m64n{cfg.block_n}k16.f32.{t}.{t}" in x and "1, 1, 0, 0;" in x]
    pv = [x for x in mma if f".m64n{d}k16.f32.{t}.{t}" in x and "1, 1, 1;" in x]
    # in order: one copy of each GEMM; overlapped: the first tile's S, the loop's S and P V, the
    # last tile's P V.  (SS carries 4 immediates, RS 3: the two never match each other's test.)
    copies = 2 if cfg.overlap else 1
    assert len(qk) == copies * d // 16, len(qk)
    assert len(pv) == copies * cfg.block_n // 16, len(pv)
    assert len(mma) == len(qk) + len(pv), mma[0]
    assert any("{%r" in x for x in pv), "P V must take A from registers (RS)"
    for text in (f"setmaxnreg.dec.sync.aligned.u32 {cfg.producer_regs};",
                 f"setmaxnreg.inc.sync.aligned.u32 {cfg.consumer_regs};",
                 "shfl.sync.bfly.b32", f".maxntid {cfg.threads}, 1, 1",
                 ".extern .shared .align 1024"):
        assert text in ptx, text
    cp_async = ("cp.async.mbarrier.arrive.noinc.shared::cta.b64", "fence.proxy.async.shared::cta",
                "cp.async.cg.shared.global")
    tensor_copy = ("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                   " [%r")
    if cfg.tma:
        assert all(text not in ptx for text in cp_async), "a TMA config keeps a cp.async path"
        # Q's boxes, and at least one K and one V tile (LLVM unrolls the producer's loop)
        assert ptx.count(tensor_copy) >= 3 * d // 64, ptx.count(tensor_copy)
        assert "mbarrier.arrive.expect_tx.shared::cta.b64" in ptx
        assert ptx.count("prefetch.tensormap [%rd") == 3
        # persistent: the tile loops, and the producer's wait for the previous tile's Q
        assert ("%nctaid.x" in ptx) == cfg.persistent
    else:
        assert all(text in ptx for text in cp_async), cp_async
        assert "cp.async.bulk" not in ptx
    assert ("wgmma.wait_group.sync.aligned 1;" in ptx) == cfg.overlap
    # a wgmma.fence before each issue: in order S's and P V's; overlapped the first tile's S,
    # the loop's (and, with O rescaled between its S and P V, one more before that P V), the
    # last tile's P V
    fences = (3 + cfg.rescale_before_pv) if cfg.overlap else 2
    assert ptx.count("wgmma.fence.sync.aligned;") == fences, ptx.count("wgmma.fence.sync.aligned;")
    # ping-pong: consumer w syncs on barrier 1 + w and arrives on the next one's (256
    # threads); persistent: all sync on barrier 7 after each work tile
    bars = set(re.findall(r"barrier\.(sync|arrive)\.aligned (\d+), %r", ptx))
    turns = [str(1 + w) for w in range(cfg.consumers)]
    assert bars == ({(op, i) for op in ("sync", "arrive") for i in turns}
                    | ({("sync", "7")} if cfg.persistent else set())
                    if cfg.pingpong else set()), bars
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    for code in ("C7504", "C7508", "C7509", "C7513", "C7517", "C7519"):
        assert code not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = nvdisasm_path()
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert "USETMAXREG" in sass
    assert ("UTMALDG" in sass) == cfg.tma
    hgmma = re.findall(r"HGMMA\.64x(\d+)x16\.F32\b", sass)  # f16 inputs: no suffix
    assert len(hgmma) == len(mma)
    if cfg.overlap:
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    if cfg.pingpong:
        for i in range(1, 1 + cfg.consumers):
            assert re.search(rf"\bBAR\.SYNC(\.DEFER_BLOCKING)? R\d+, 0x{i}\b|"
                             rf"\bBAR\.SYNC(\.DEFER_BLOCKING)? 0x{i}\b", sass), i
            assert re.search(rf"\bBAR\.ARV\b[^;]*0x{i}\b", sass), i


def test_refused_on_sm80():
    with pytest.raises(Exception) as info:
        _ptx("n128_2s", 64, arch="sm_80")
    assert isinstance(info.value, ArchitectureError) or "needs" in str(info.value)
    assert "sm_80" in str(info.value)


def test_bad_configs_and_head_dims_are_named():
    with pytest.raises(ValueError, match=r"block_n must be one of \(64, 80, 96, 112, 128, 176, 192\)"):
        attn.Sm90AttnConfig("bad", 72)
    with pytest.raises(ValueError, match="head_dim 256 needs 328704 bytes of shared memory"):
        attn.Sm90AttnConfig("bad", 128, head_dims=(256,))
    with pytest.raises(ValueError, match=r"head_dims must be among \(64, 96, 128, 192, 256\)"):
        attn.Sm90AttnConfig("bad", 64, head_dims=(80,))
    with pytest.raises(ValueError, match="pingpong needs overlap"):
        attn.Sm90AttnConfig("bad", 128, pingpong=True)
    with pytest.raises(ValueError, match="stages must be >= 2"):
        attn.Sm90AttnConfig("bad", 128, stages=1)
    with pytest.raises(ValueError, match="168 per thread"):
        attn.Sm90AttnConfig("bad", 128, producer_regs=64, consumer_regs=224)
    with pytest.raises(ValueError, match="more than 227 KB"):
        sm90_attention_tma.make_kernel(attn.Sm90AttnConfig("big", 192, stages=3),
                                       attn.AttnVariant(128, "bfloat16", False, False))
    with pytest.raises(ValueError, match=r"head_dim \(64, 96, 128, 192, 256\), got 80"):
        attn.kernel_for(attn.CONFIGS["n128_2s"], attn.AttnVariant(80, "bfloat16", False, False))
    with pytest.raises(ValueError, match=r"head_dim \(64, 96, 128, 192, 256\), got 160"):
        attn.choose_config(160)
    for d in attn.HEAD_DIMS:
        assert attn.choose_config(d) in attn.CONFIGS.values()
        assert d in attn.choose_config(d).head_dims
        assert d in attn.CONFIGS[attn.DEFAULT[d]].head_dims and not attn.CONFIGS[attn.DEFAULT[d]].tma
        assert d in attn.CONFIGS[attn.DEFAULT_TMA[d]].head_dims
    assert set(attn.DEFAULT_HEAD_DIMS) <= set(attn.HEAD_DIMS)


def test_every_config_fits_shared_memory():
    """The launch's dynamic shared memory (shared_bytes) is exactly the tiles the kernel lays out
    (a Q tile of block_m rows -- 128, 192 with three consumers -- then ``stages`` K and V
    tiles; persistent configurations then O's block_m-row staging tile for its TMA stores), and with the 1024-byte static window in front of it
    fits the 227 KB an sm_90 block may have, as check_fits agrees."""
    for cfg in attn.CONFIGS.values():
        for d in cfg.head_dims:
            q_lay, k_lay, v_lay, _ = sm90_attention_tma.layouts(cfg, d)
            q_bytes = q_lay.nbytes if cfg.tma else 2 * q_lay.nbytes  # cp.async: 2 x 64 rows
            assert q_bytes == cfg.block_m * d * 2, (cfg.name, d, q_bytes)
            tiles = q_bytes + cfg.stages * (k_lay.nbytes + v_lay.nbytes)
            if cfg.persistent:
                tiles += cfg.block_m * d * 2  # O's staging tile
            nbytes = attn.shared_bytes(cfg, d)
            assert nbytes == tiles, (cfg.name, d, nbytes, tiles)
            total = tiles + attn._STATIC_SHARED
            assert total <= 227 * 1024, f"{cfg.name} at head_dim {d}: {total} bytes > 227 KB"
            assert attn.check_fits(cfg, d) is None


@pytest.mark.parametrize("name", ["n128_2s_ov_fx", "n128_2s_ov_pp_fx"])
def test_fast_exp_configs_use_the_two_instruction_exponential(name):
    """fast_exp: every exponential is ex2.approx.ftz, every score's argument one fma.rn."""
    ptx = _ptx(name, 128, "bfloat16", True, True)
    plain = _ptx(name.removesuffix("_fx"), 128, "bfloat16", True, True)
    assert "ex2.approx.f32" not in ptx and ptx.count("ex2.approx.ftz.f32") >= 64 + 2
    assert ptx.count("fma.rn.f32") >= 64 > plain.count("fma.rn.f32")


def test_tma_switch_twins_and_refusals(monkeypatch):
    """TMA_BY_DEFAULT picks the TMA configurations; each falls back to a cp.async twin of its
    tile where one exists, else (the 176-key tiles) to the cp.async default of the head dim; a
    misaligned start, a stride that is not 16 bytes, and no keys are refused with the reason."""
    from types import SimpleNamespace

    from numbatc.kernels import sm90_attention_tma

    with pytest.raises(ValueError, match="producer must be 'cp_async' or 'tma'"):
        attn.Sm90AttnConfig("bad", 128, producer="bulk")
    for flag in (False, True):
        monkeypatch.setattr(attn, "TMA_BY_DEFAULT", flag)
        assert all(attn.choose_config(d).tma == flag for d in attn.HEAD_DIMS)
    for cfg in attn.CONFIGS.values():
        for d in cfg.head_dims:
            twin = attn.twin(cfg, d) if cfg.tma else cfg
            assert not twin.tma and d in twin.head_dims
            own = cfg.name.removesuffix("_l2").removesuffix("_pt").removesuffix("_tma") in attn.CONFIGS
            assert twin.block_n == cfg.block_n if own or not cfg.tma else (
                twin is attn.CONFIGS[attn.DEFAULT[d]]), (cfg.name, d, twin.name)
    assert attn.twin(attn.CONFIGS["n176_2s_ov_pp_fx_tma"], 64).name == attn.DEFAULT[64]

    def operand(ptr=4096, shape=(2, 100, 4, 64), strides=(25600, 256, 64, 1)):
        return SimpleNamespace(ptr=ptr, shape=shape, strides=strides)

    def problem(q=None, k=None, v=None, seqlen_k=100):
        return SimpleNamespace(q=q or operand(), k=k or operand(), v=v or operand(),
                               seqlen_k=seqlen_k, head_dim=64)

    assert sm90_attention_tma.unsupported(problem()) is None
    # extent-1 dimensions are never stepped: their strides do not matter
    assert sm90_attention_tma.unsupported(problem(q=operand(shape=(1, 1, 4, 64),
                                                            strides=(3, 5, 64, 1)))) is None
    cases = [(problem(k=operand(ptr=4098)), "k starts at 0x1002, not 16-byte aligned"),
             (problem(v=operand(strides=(25600, 260, 64, 1))), "v's sequence stride is 260"),
             (problem(q=operand(strides=(25604, 256, 64, 1))), "q's batch stride is 25604"),
             (problem(seqlen_k=0), "seqlen_k is 0")]
    tma_cfg = attn.CONFIGS["n128_2s_ov_pp_fx_tma"]
    for p, why in cases:
        assert why in sm90_attention_tma.unsupported(p)
        cfg, reason = attn.resolve(p, tma_cfg)
        assert cfg.name == "n128_2s_ov_pp_fx" and reason.startswith("not n128_2s_ov_pp_fx_tma: ")
    assert attn.resolve(problem(), tma_cfg) == (tma_cfg, None)


@pytest.mark.parametrize("d", [96, 128])
def test_pair_stores_store_each_column_pair_once(d, tmp_path):
    """The pair-store variant (out 4-byte aligned: what numbatc.attention allocates) stores O as
    one st.global.b32 per column pair -- D / 4 per thread, two rows of D / 8 pairs -- and no
    16-bit store; the other keeps two st.global.u16 a pair.  Assembles without spills."""
    cfg = attn.CONFIGS[attn.DEFAULT_TMA[d]]
    stores = {}
    for pairs in (True, False):
        var = attn.AttnVariant(d, "bfloat16", True, True, pair_stores=pairs)
        ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var, cfg), "sm_90a",
                          launch_bounds=(cfg.threads, 1))
        stores[pairs] = (ptx.count("st.global.b32"), ptx.count("st.global.u16"))
        if pairs:
            log = whole_program_ptxas(ptx, tmp_path)
            assert "0 bytes spill stores, 0 bytes spill loads" in log, log
            for code in ("C7509", "C7513", "C7519"):
                assert code not in log, log
    assert stores == {True: (d // 4, 0), False: (0, d // 2)}, stores


TMA_STORE_CASES = [(attn.DEFAULT_TMA[d], d) for d in (64, 96, 128, 192)] + [
    ("n128_2s_ov_pp_fx_tma_pt", 96), ("n128_2s_ov_pp_fx_tma_pt", 128),
    ("m192_n128_2s_ov_pp_fx_tma", 64)]


@pytest.mark.parametrize("name, d", TMA_STORE_CASES, ids=[f"{n}-d{d}" for n, d in TMA_STORE_CASES])
def test_tma_store_of_o(name, d, tmp_path):
    """The TMA-store variant (TMA configurations, out described by a tensor map): O leaves
    through D / 16 stmatrix.x4 a warp and one 4-d tensor store per box of one swizzle row of
    columns (D / 32 at head_dim 96, D / 64 above), after the proxy fence and a named barrier of
    the warpgroup's 128 threads; no global store of O; the out map is the fourth tensor map;
    assembles without spills or serialised wgmma.  Persistent: through a staging tile behind
    the V ring, its thread 0 waiting for the previous tile's boxes before the warpgroup writes
    it again (a second wait_group.read, and the barrier before the stmatrix), and once more
    after the tile loop."""
    cfg = attn.CONFIGS[name]
    var = attn.AttnVariant(d, "bfloat16", True, True, pair_stores=True, tma_store=True)
    ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var, cfg), "sm_90a",
                      launch_bounds=(cfg.threads, 1))
    boxes = d // (attn.swizzle_for(d) // 2)
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == d // 16
    assert ptx.count("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group") == boxes
    assert "cp.async.bulk.commit_group" in ptx
    assert ptx.count("cp.async.bulk.wait_group.read 0") == (2 if cfg.persistent else 1)
    if cfg.persistent:  # the staging tile lies behind the V ring
        assert attn.shared_bytes(cfg, d) == (128 + 2 * cfg.stages * cfg.block_n + 128) * d * 2
    assert "fence.proxy.async.shared::cta" in ptx
    assert re.search(r"barrier\.sync\.aligned 4, %r", ptx) and re.search(
        r"barrier\.sync\.aligned 5, %r", ptx)
    assert "st.global.b32" not in ptx and "st.global.u16" not in ptx
    assert ptx.count("st.global.f32") == 2  # lse only
    # out's map is the fourth parameter (an empty tuple, no parameter, without the TMA store)
    sig, plain = attn.signature(var, cfg), attn.signature(attn.AttnVariant(d, "bfloat16", True,
                                                                          True), cfg)
    assert sig[3] == sig[0] and plain[3] == types.Tuple(()) and sig[4:] == plain[4:]
    log = whole_program_ptxas(ptx, tmp_path)
    if cfg.consumers == 3:
        # NOTE: causal with lse, ptxas keeps 20 bytes (five values live from before the key
        # loop to the epilogue) in local memory: stored once before the loop, loaded after it
        # (SASS of m192_n128_2s, 2026-12-07); the loop itself has none.  Not more.
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        assert int(spill.group(1)) <= 20 and int(spill.group(2)) <= 36, log
    else:
        assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    for code in ("C7509", "C7513", "C7517", "C7519"):
        assert code not in log, log


VARLEN_CASES = ([(attn.DEFAULT_TMA[d], d) for d in (64, 96, 128, 192, 256)]
                + [(attn.DEFAULT[d], d) for d in (128, 256)])


@pytest.mark.parametrize("name, d", VARLEN_CASES, ids=[f"{n}-d{d}" for n, d in VARLEN_CASES])
def test_varlen_variants_assemble_without_spills(name, d, tmp_path):
    """The varlen variant (causal, lse: the most live values) of the TMA defaults at every head
    dim and two cp.async twins: the prefix sums as int32 pointer parameters, the block's exit
    before the barriers' initialisation, no local memory, spills or serialised wgmma."""
    cfg = attn.CONFIGS[name]
    var = attn.AttnVariant(d, "bfloat16", True, True, varlen=True)
    ptx = compile_ptx(attn.kernel_for(cfg, var), attn.signature(var, cfg), "sm_90a",
                      launch_bounds=(cfg.threads, 1))
    assert "ld.global.s32" in ptx or "ld.global.nc.s32" in ptx  # cu_q / cu_k
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    for code in ("C7504", "C7508", "C7509", "C7513", "C7517", "C7519"):
        assert code not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log


def test_varlen_refuses_persistent_and_kv_cache():
    var = attn.AttnVariant(64, "bfloat16", True, False, varlen=True)
    with pytest.raises(ValueError, match="persistent configuration has no varlen variant"):
        sm90_attention_tma.make_kernel(attn.CONFIGS["n128_2s_ov_pp_fx_tma_pt"], var)
    kv = attn.AttnVariant(64, "bfloat16", True, False, kv_cache=True)
    for name in ("n128_2s_ov_pp_fx_tma", "n128_2s_ov_pp_fx"):
        with pytest.raises(ValueError, match="no KV-cache variant"):
            attn.kernel_for(attn.CONFIGS[name], kv)


def test_kernels_are_code_and_tma_takes_the_fast_exponential():
    """Every configuration's kernel is sm90_attention_tma.make_kernel's (one per producer, the
    cp.async one with flat operands and strides); a TMA configuration needs fast_exp."""
    var = attn.AttnVariant(64, "bfloat16", True, False)
    for name, params in (("n128_2s_ov_pp_fx_tma", 17), ("n128_2s_ov_pp_fx", 24)):
        cfg = attn.CONFIGS[name]
        kernel = attn.kernel_for(cfg, var)
        assert kernel is sm90_attention_tma.make_kernel(cfg, var)
        assert len(attn.signature(var, cfg)) == params
        assert kernel.py_func.__name__ == ("attention_kernel" if cfg.tma else
                                           "attention_kernel_cp")
    with pytest.raises(ValueError, match="producer='tma' needs fast_exp=True"):
        attn.Sm90AttnConfig("slow_tma", 128, producer="tma", producer_regs=24,
                            consumer_regs=240)


@pytest.mark.parametrize("bhn, m_blocks, Sk, D, group, budget", [
    (512, 8, 1024, 128, 1, 32 << 20),   # 64 pairs a section: 8 sections
    (256, 8, 1024, 128, 1, 32 << 20),   # 16 x 1024 x 16: 64 a section, 4 sections
    (40, 3, 300, 64, 4, 1 << 17),       # GQA: one kv head's 4 query heads a section
    (10, 3, 1024, 128, 1, 3 << 19),     # 3 pairs a section: 3 + 3 + 3 + 1 (a short last one)
    (24, 2, 512, 64, 2, 3 << 17),       # GQA, 3 kv heads a section: 6 + 6 + 6 + 6
    (6, 5, 200, 96, 2, 1),              # a budget below one kv head: its query heads alone
    (7, 4, 1 << 30, 128, 1, 32 << 20),  # a kv head past 32-bit bytes (Sk clamped)
    (12, 2, 64, 64, 3, 0),              # no budget: one section (the old order)
])
def test_l2_sections_order_every_tile_once_longest_first(bhn, m_blocks, Sk, D, group, budget):
    """The persistent causal order with an L2 budget (FA3's LPT sections): every work tile
    exactly once; within a section of pairs whose K and V fit the budget (at least one kv
    head's query heads, the last section the rest), the last query blocks first; sections one
    after another, each its pairs' every tile."""
    import numpy as np

    block_coords, _ = sm90_attention_tma._coords(128, True, True, 128, budget, D)
    Hq = group * 4
    seen = [block_coords.py_func(t, np.uint32(bhn), m_blocks, Hq, group, Sk)
            for t in range(bhn * m_blocks)]
    pairs = [(int(m0) // 128, int(bh)) for m0, b, h, hk, bh in seen]
    assert sorted(pairs) == [(mi, bh) for mi in range(m_blocks) for bh in range(bhn)]
    for m0, b, h, hk, bh in seen:
        assert (b, h, hk) == (bh // Hq, bh % Hq, (bh % Hq) // group)
    kv_bytes = min(Sk, 1 << 24) * D * 4
    per = min(max(budget // kv_bytes, 1) * group, bhn) if budget else bhn
    for start in range(0, bhn, per):
        tiles = pairs[start * m_blocks:(start + min(per, bhn - start)) * m_blocks]
        assert {bh for _, bh in tiles} == set(range(start, min(start + per, bhn)))
        levels = [mi for mi, _ in tiles]
        assert levels == sorted(levels, reverse=True)  # longest first within the section
