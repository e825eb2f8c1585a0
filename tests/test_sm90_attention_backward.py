"""numbatc.kernels.sm90_attention_backward without a GPU: which kernel numbatc.attention_backward
runs (the Hopper one at head_dim 128, and 64 without the fixed order, unless
``NUMBATC_ATTN_BWD_KERNEL`` forces another; the workspace the Hopper one gets), what the Hopper
kernel refuses and why, its configurations, and its assembly
for sm_90a: the wgmma forms and the bulk reduction in the PTX, no local memory, ptxas's
whole-program report (no serialised wgmma, spills held to what is known) and the SASS (HGMMA,
TMA, the bulk reduction, setmaxnreg; no local memory where nothing spills).

Arrays are the fakes of tests/helpers/fake_arrays.py (made-up device pointers, never
dereferenced); its autouse fixture ``no_gpu`` answers the device queries (an sm_90 GPU)."""

import re

import pytest

import numbatc
from numbatc import attention_backward_api as api
from numbatc.kernels import sm80_attention_backward as bwd80
from numbatc.kernels import sm90_attention_backward as bwd90
from tests.helpers.fake_arrays import FakeCuda, no_gpu  # noqa: F401  (no_gpu: autouse)

_LAUNCH = bwd90.launch  # (the fixture ``launched`` replaces it by a recorder)


def args(b=2, sq=100, sk=300, hq=4, hkv=2, d=64, dtype="float16"):
    """(q, k, v, out, lse, dout) fakes."""
    return (FakeCuda((b, sq, hq, d), dtype), FakeCuda((b, sk, hkv, d), dtype),
            FakeCuda((b, sk, hkv, d), dtype), FakeCuda((b, sq, hq, d), dtype),
            FakeCuda((b, hq, sq), "float32"), FakeCuda((b, sq, hq, d), dtype))


@pytest.fixture
def launched(monkeypatch):
    """{'sm80': [...], 'sm90': [...]}: the problems each module's launch was handed."""
    calls = {"sm80": [], "sm90": []}
    monkeypatch.delenv("NUMBATC_ATTN_BWD_KERNEL", raising=False)
    monkeypatch.delenv("NUMBATC_ATTN_BWD_CONFIG", raising=False)
    monkeypatch.setattr(bwd80, "launch", lambda p, cfg: calls["sm80"].append((p, cfg)))
    monkeypatch.setattr(bwd90, "launch", lambda p, cfg: calls["sm90"].append((p, cfg)))
    return calls


@pytest.mark.parametrize("d, deterministic, family", [
    (64, True, "sm80"), (64, False, "sm90"), (128, True, "sm90"), (128, False, "sm90"),
    (96, True, "sm80"), (256, False, "sm80"),
])
def test_the_default_kernel(launched, d, deterministic, family):
    """On an sm_90 GPU (the fakes' device) the Hopper kernel runs head_dim 128, and 64 without
    the fixed order (api.sm90_by_default: where it measured faster); the portable one the rest,
    without a workspace."""
    numbatc.attention_backward(*args(d=d), deterministic=deterministic)
    other = {"sm80": "sm90", "sm90": "sm80"}[family]
    assert len(launched[family]) == 1 and not launched[other]
    ((p, _),) = launched[family]
    assert (p.ws is None) == (family == "sm80") and api.sm90_by_default(p) == (family == "sm90")


@pytest.mark.parametrize("d, name", [(64, "d64"), (128, "d128")])
def test_forced_sm90_gets_its_workspace(launched, monkeypatch, d, name):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    numbatc.attention_backward(*args(d=d), causal=True, deterministic=False)
    ((p, cfg),) = launched["sm90"]
    assert cfg is bwd90.CONFIGS[name] and not p.deterministic
    # two 64 x 68 float32 tiles per (batch, query head, 64 rows of seqlen_q padded to 128)
    tiles = 2 * 4 * (128 // 64) * 2
    assert p.ws.shape == (tiles * 64 * 68,) and p.ws.dtype == "float32"
    assert p.counters.shape == (tiles,) and p.counters.dtype == "int32"
    assert bwd90.workspace_floats(2, 4, 100, d) == (tiles * 64 * 68, tiles)


def test_forced_config_and_family_errors(launched, monkeypatch):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90:d64_3s")
    numbatc.attention_backward(*args())
    assert launched["sm90"][0][1] is bwd90.CONFIGS["d64_3s"]
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90:nope")
    with pytest.raises(ValueError, match="no sm90 attention backward config"):
        numbatc.attention_backward(*args())
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm75")
    with pytest.raises(ValueError, match="sm80 or sm90"):
        numbatc.attention_backward(*args())
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm80:d128")
    numbatc.attention_backward(*args())
    assert launched["sm80"][-1][1] is bwd80.CONFIGS["d128"]


@pytest.mark.parametrize("change, reason", [
    (dict(d=96), "head_dim"),
    (dict(d=256), "head_dim"),
    (dict(dtype="float32"), None),  # refused by the API before any kernel
])
def test_forced_sm90_refuses_with_the_reason(launched, monkeypatch, change, reason):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    with pytest.raises((ValueError, TypeError), match=reason):
        numbatc.attention_backward(*args(**change))
    assert not launched["sm90"]


def test_refuses_misaligned_operands_and_other_gpus(launched, monkeypatch):
    import dataclasses

    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    numbatc.attention_backward(*args())
    p = launched["sm90"][0][0]
    assert bwd90.unsupported(p) is None and bwd90.applies(p)
    assert "sm_90" in bwd90.unsupported(dataclasses.replace(p, cc=(8, 0)))
    assert "sm_90" in bwd90.unsupported(dataclasses.replace(p, cc=(10, 0)))
    assert "unknown" in bwd90.unsupported(dataclasses.replace(p, cc=None))
    odd = dataclasses.replace(p.q, ptr=p.q.ptr + 2)
    assert "16-byte" in bwd90.unsupported(dataclasses.replace(p, q=odd))
    with pytest.raises(ValueError, match="workspace"):  # the API allocates it
        _LAUNCH(dataclasses.replace(p, ws=None), bwd90.CONFIGS["d64"])
    assert "no queries" in bwd90.unsupported(dataclasses.replace(p, seqlen_k=0))


def test_configs_fit_and_validate():
    from intrinsics.setmaxnreg import register_pool

    for cfg in bwd90.CONFIGS.values():  # what the .dec gives back covers what the .inc takes
        assert 128 * cfg.producer_regs + 256 * cfg.consumer_regs <= register_pool(384) == 64512
    for d, name in bwd90.TILES.items():
        var = bwd90.Sm90BwdVariant(d, "bfloat16", True)
        assert bwd90.shared_bytes(bwd90.CONFIGS[name], var) + 1024 <= 227 * 1024
    with pytest.raises(ValueError, match="64512"):
        bwd90.Sm90BwdConfig("x", 2, 32, 240)  # 1024 registers more than the pool


def _whole_program_log(ptx, tmp_path):
    from tests.helpers.assemblers import whole_program_ptxas

    return whole_program_ptxas(ptx, tmp_path)


@pytest.mark.parametrize("d, dtype, causal, det, max_spill", [
    (64, "bfloat16", True, True, 0),
    (64, "float16", False, False, 0),
    # head_dim 128 under 24 / 240: 8 bytes outside the main loop where causal (CONFIGS)
    (128, "bfloat16", True, True, 8),
    (128, "float16", False, True, 0),
])
def test_kernel_assembles_for_sm90a(tmp_path, d, dtype, causal, det, max_spill):
    from intrinsics.toolchain import compile_ptx

    cfg = bwd90.CONFIGS[bwd90.TILES[d]]
    var = bwd90.Sm90BwdVariant(d, dtype, causal, det)
    ptx = compile_ptx(bwd90.make_kernel(cfg, var), bwd90.kernel_signature(var), "sm_90a",
                      launch_bounds=(384, 1))
    t = "bf16" if dtype == "bfloat16" else "f16"
    forms = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\." + t, ptx)
    # S^T and dP^T (D / 16 each, N 64), dV and dK (4 each, N = D), dQ (N 64; 8 at head_dim 128,
    # 4 at 64)
    if d == 128:
        assert forms.count("m64n64k16") == 24 and forms.count("m64n128k16") == 8, forms
    else:
        assert forms.count("m64n64k16") == 20 and len(forms) == 20, forms
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in ptx
    assert ("atom.global.add.u32" in ptx) == det  # the counters of the fixed order
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 {cfg.consumer_regs};" in ptx
    log = _whole_program_log(ptx, tmp_path)
    for code in ("C7504", "C7508", "C7509", "C7513", "C7517", "C7519", "C7520"):
        assert code not in log, log
    spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    assert spills <= max_spill, log
    from tests.helpers.assemblers import disassemble

    sass = disassemble(tmp_path / "kernel.cubin")
    assert len(re.findall(r"\bHGMMA\.", sass)) == (32 if d == 128 else 20)
    for op in ("UTMALDG", "UBLKRED", "UBLKCP", "USETMAXREG", "STSM"):
        assert op in sass, op
    # the producer's loop stays rolled (nt.opaque): K and V once, Q and dO per step, D / 64
    # boxes each
    assert len(re.findall(r"\bUTMALDG\.", sass)) == 4 * d // 64
    if max_spill == 0:
        assert not re.search(r"\b(LDL|STL)\b", sass)


def test_postprocess_and_clear_compile():
    from numba import types

    from intrinsics.toolchain import compile_ptx

    f32p, u16p, i32p = (types.CPointer(t) for t in (types.float32, types.uint16, types.int32))
    for d in (64, 128):
        ptx = compile_ptx(bwd90.make_postprocess("bfloat16", d),
                          (f32p, u16p) + (types.int64,) * 6 + (types.float32, types.int64),
                          "sm_90a")
        assert "st.global.b32" in ptx and "cvt.rn.bf16x2.f32" in ptx
    ptx = compile_ptx(bwd90.make_clear(), (f32p, types.int64, i32p, types.int64), "sm_90a")
    assert "st.global" in ptx
