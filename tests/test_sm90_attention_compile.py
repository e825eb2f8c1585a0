"""The Hopper attention kernel without a GPU: every configuration compiles for sm_90a at head_dim
64 and 128 with the pipeline's instructions in the PTX (wgmma SS for Q K^T, RS with trans-b for
P V, setmaxnreg, cp.async with mbarrier arrivals, the proxy fence), and assembles whole-program
(as the driver JITs a setmaxnreg kernel) without local memory, spills, or serialised wgmma
(C7509 calls, C7513 registers defined inside a wgmma pipeline stage, C7519 injected arrives,
C7517 injected waits); with nvdisasm on PATH the SASS shows the HGMMAs, and the overlapped
schedule keeps its wgmma group in flight (DEPBAR.LE gsb0, 0x1), and the ping-pong ones (_pp)
have their named barriers 1 and 2 (barrier.sync/arrive 256; BAR.SYNC/BAR.ARV).  sm_80 refuses the kernel;
bad configurations and head dims are named."""

import functools
import re
import shutil
import subprocess

import pytest

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import compile_ptx
from numbatc.kernels import sm90_attention as attn
from tests.test_setmaxnreg_compile import whole_program_ptxas


@functools.cache
def _ptx(name, head_dim, dtype="bfloat16", causal=True, with_lse=True, arch="sm_90a"):
    cfg = attn.CONFIGS[name]
    var = attn.AttnVariant(head_dim, dtype, causal, with_lse)
    return compile_ptx(attn.kernel_for(cfg, var), attn.signature(var), arch,
                       launch_bounds=(cfg.threads, 1))


# every config at head_dim 128 (the most registers), the default and the in-order one at 64 too,
# and f16 without causal mask or lse (about 8 s each: numba compile + ptxas)
CASES = [(name, 128, "bfloat16", True, True) for name in sorted(attn.CONFIGS)]
CASES += [("n128_2s_ov", 64, "bfloat16", True, True), ("n128_2s", 64, "bfloat16", True, True),
          ("n128_2s_ov", 128, "float16", False, False), ("n64_2s", 64, "float16", False, True)]


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
                 "cp.async.mbarrier.arrive.noinc.shared::cta.b64", "fence.proxy.async.shared::cta",
                 "shfl.sync.bfly.b32", ".maxntid 384, 1, 1", ".extern .shared .align 1024"):
        assert text in ptx, text
    assert ("wgmma.wait_group.sync.aligned 1;" in ptx) == cfg.overlap
    # ping-pong: consumer w syncs on barrier 1 + w and arrives on the other's (256 threads)
    bars = set(re.findall(r"barrier\.(sync|arrive)\.aligned (\d+), %r", ptx))
    assert bars == ({(op, i) for op in ("sync", "arrive") for i in ("1", "2")}
                    if cfg.pingpong else set()), bars
    assert "ld.local" not in ptx and "st.local" not in ptx
    log = whole_program_ptxas(ptx, tmp_path)
    for code in ("C7504", "C7508", "C7509", "C7513", "C7517", "C7519"):
        assert code not in log, log
    assert "0 bytes spill stores, 0 bytes spill loads" in log, log
    disasm = shutil.which("nvdisasm")
    if disasm is None:
        return
    sass = subprocess.run([disasm, str(tmp_path / "kernel.cubin")], capture_output=True,
                          text=True, check=True).stdout
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert "USETMAXREG" in sass
    hgmma = re.findall(r"HGMMA\.64x(\d+)x16\.F32\b", sass)  # f16 inputs: no suffix
    assert len(hgmma) == len(mma)
    if cfg.overlap:
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
    if cfg.pingpong:
        for i in (1, 2):
            assert re.search(rf"\bBAR\.SYNC(\.DEFER_BLOCKING)? R\d+, 0x{i}\b|"
                             rf"\bBAR\.SYNC(\.DEFER_BLOCKING)? 0x{i}\b", sass), i
            assert re.search(rf"\bBAR\.ARV\b[^;]*0x{i}\b", sass), i


def test_refused_on_sm80():
    with pytest.raises(Exception) as info:
        _ptx("n128_2s", 64, arch="sm_80")
    assert isinstance(info.value, ArchitectureError) or "needs" in str(info.value)
    assert "sm_80" in str(info.value)


def test_bad_configs_and_head_dims_are_named():
    with pytest.raises(ValueError, match="block_n must be 64, 128 or 192"):
        attn.Sm90AttnConfig("bad", 96)
    with pytest.raises(ValueError, match="pingpong needs overlap"):
        attn.Sm90AttnConfig("bad", 128, pingpong=True)
    with pytest.raises(ValueError, match="stages must be >= 2"):
        attn.Sm90AttnConfig("bad", 128, stages=1)
    with pytest.raises(ValueError, match="168 per thread"):
        attn.Sm90AttnConfig("bad", 128, producer_regs=64, consumer_regs=224)
    with pytest.raises(ValueError, match="more than 227 KB"):
        attn.kernel_source(attn.Sm90AttnConfig("big", 192, stages=3),
                           attn.AttnVariant(128, "bfloat16", False, False))
    with pytest.raises(ValueError, match=r"head_dim \(64, 128\), got 96"):
        attn.kernel_source(attn.CONFIGS["n128_2s"], attn.AttnVariant(96, "bfloat16", False, False))
    with pytest.raises(ValueError, match=r"head_dim \(64, 128\), got 256"):
        attn.choose_config(256)
    for d in attn.HEAD_DIMS:
        assert attn.choose_config(d) in attn.CONFIGS.values()


def test_every_config_fits_shared_memory():
    for cfg in attn.CONFIGS.values():
        for d in attn.HEAD_DIMS:
            attn.check_fits(cfg, d)


@pytest.mark.parametrize("name", ["n128_2s_ov_fx", "n128_2s_ov_pp_fx"])
def test_fast_exp_configs_use_the_two_instruction_exponential(name):
    """fast_exp: every exponential is ex2.approx.ftz, every score's argument one fma.rn."""
    ptx = _ptx(name, 128, "bfloat16", True, True)
    plain = _ptx(name.removesuffix("_fx"), 128, "bfloat16", True, True)
    assert "ex2.approx.f32" not in ptx and ptx.count("ex2.approx.ftz.f32") >= 64 + 2
    assert ptx.count("fma.rn.f32") >= 64 > plain.count("fma.rn.f32")
