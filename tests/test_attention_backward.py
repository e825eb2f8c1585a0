"""numbatc.attention_backward without a GPU: every validation error, empty problems, the
results' allocation and the AttentionBackwardProblem that reaches the kernel module's
``launch`` (replaced here by a recorder); the kernel module's face (configurations, choice,
forcing); the float64 reference gradient of tests/helpers/attention_backward.py against central
finite differences; and the kernels' assembly for sm_80 and sm_90a (ptxas registers, spills,
no local memory).

Arrays are the fakes of tests/helpers/fake_arrays.py (made-up device pointers, never
dereferenced); its autouse fixture ``no_gpu`` answers the device queries."""

import math
import re

import numpy as np
import pytest

import numbatc
from numbatc import gemm_api
from numbatc.interop import DTypeView
from numbatc.kernels import sm80_attention_backward as bwd
from tests.helpers.attention_backward import reference_backward
from tests.helpers.fake_arrays import FakeCuda, no_gpu  # noqa: F401  (no_gpu: autouse)


@pytest.fixture
def launched(monkeypatch):
    """The problems handed to sm80_attention_backward.launch, with the configuration (the
    portable kernel forced: on the fakes' sm_90 device head_dim 128 runs the Hopper one by
    default, tests/test_sm90_attention_backward.py)."""
    calls = []
    monkeypatch.delenv("NUMBATC_ATTN_BWD_CONFIG", raising=False)
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm80")
    monkeypatch.setattr(bwd, "launch", lambda p, cfg: calls.append((p, cfg)))
    return calls


def args(b=2, sq=5, sk=7, hq=4, hkv=2, d=64, dtype="float16", device=0):
    """(q, k, v, out, lse, dout) fakes."""
    return (FakeCuda((b, sq, hq, d), dtype, device=device),
            FakeCuda((b, sk, hkv, d), dtype, device=device),
            FakeCuda((b, sk, hkv, d), dtype, device=device),
            FakeCuda((b, sq, hq, d), dtype, device=device),
            FakeCuda((b, hq, sq), "float32", device=device),
            FakeCuda((b, sq, hq, d), dtype, device=device))


# --- a call that reaches the kernel layer ----------------------------------------------------


def test_problem_reaches_the_kernel_layer(launched):
    a = args()
    dq, dk, dv = numbatc.attention_backward(*a, causal=True)
    ((p, cfg),) = launched
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim) == (2, 5, 7, 4, 2, 64)
    assert p.group == 2 and p.causal and p.dtype == "float16" and p.dlse is None
    assert p.scale == pytest.approx(1 / math.sqrt(64)) and p.cc == (9, 0)
    assert dq.shape == (2, 5, 4, 64) and dk.shape == dv.shape == (2, 7, 2, 64)
    assert (p.dq.ptr, p.dk.ptr, p.dv.ptr) == (dq.ptr, dk.ptr, dv.ptr)
    assert p.lse.ptr == a[4].ptr and p.do.ptr == a[5].ptr and p.out.ptr == a[3].ptr
    pad = bwd.PAD_Q  # the scratch: seqlen_q rounded up, per (batch, head)
    assert p.dd.shape == p.lse2.shape == (2 * 4 * pad,) and p.dd.dtype == "float32"
    assert cfg is bwd.CONFIGS["d64"]


def test_results_in_place_bf16_scale_and_dlse(launched):
    b, sq, sk, hq, hkv, d = 1, 9, 3, 8, 1, 40
    q, k, v, out, dout = (DTypeView(FakeCuda(s, "uint16"), "bfloat16") for s in
                          ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, hq, d),
                           (b, sq, hq, d)))
    lse, dlse = FakeCuda((b, hq, sq), "float32"), FakeCuda((b, hq, sq), "float32")
    dq = DTypeView(FakeCuda((b, sq, hq, d), "uint16"), "bfloat16")
    got = numbatc.attention_backward(q, k, v, out, lse, dout, scale=0.25, dq=dq, dlse=dlse)
    ((p, cfg),) = launched
    assert got[0] is dq and isinstance(got[1], DTypeView) and got[1].shape == (b, sk, hkv, d)
    assert p.scale == 0.25 and p.group == 8 and p.dlse.ptr == dlse.ptr and p.dtype == "bfloat16"
    assert cfg is bwd.CONFIGS["d64"]


@pytest.mark.parametrize("d, name", [(8, "d64"), (64, "d64"), (72, "d128"), (128, "d128"),
                                     (136, "d256"), (256, "d256")])
def test_config_by_head_dim(launched, d, name):
    numbatc.attention_backward(*args(d=d))
    assert launched[0][1].name == name


def test_forced_config(launched, monkeypatch):
    monkeypatch.setenv("NUMBATC_ATTN_BWD_CONFIG", "small")
    numbatc.attention_backward(*args())
    assert launched[0][1].name == "small"
    monkeypatch.setenv("NUMBATC_ATTN_BWD_CONFIG", "nope")
    with pytest.raises(ValueError, match="NUMBATC_ATTN_BWD_CONFIG='nope' is not one of"):
        numbatc.attention_backward(*args())


def test_strided_views_are_passed_as_they_are(launched):
    """q, k, v as slices of one packed (b, s, 3h, d) buffer: read in place."""
    b, s, h, d = 2, 11, 4, 64
    st = (s * 3 * h * d, 3 * h * d, d, 1)
    base = FakeCuda((b, s, 3 * h, d), "float16")
    q = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr)
    k = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr + h * d * 2)
    v = FakeCuda((b, s, h, d), "float16", strides=st, ptr=base.ptr + 2 * h * d * 2)
    _, _, _, out, lse, dout = args(b, s, s, h, h, d)
    numbatc.attention_backward(q, k, v, out, lse, dout)
    ((p, _),) = launched
    assert p.q.ptr == q.ptr and p.k.strides == st and p.v.ptr == v.ptr


@pytest.mark.parametrize("b, sq, sk, hq, hkv", [(0, 5, 7, 4, 2), (2, 5, 7, 0, 0), (2, 0, 0, 4, 2)])
def test_empty_results_launch_nothing(launched, b, sq, sk, hq, hkv):
    dq, dk, dv = numbatc.attention_backward(*args(b, sq, sk, hq, hkv))
    assert launched == [] and dq.shape == (b, sq, hq, 64) and dk.shape == (b, sk, hkv, 64)


@pytest.mark.parametrize("sq, sk", [(0, 7), (5, 0)])
def test_one_empty_sequence_still_launches(launched, sq, sk):
    """seqlen_q == 0: dk, dv must be written (zeros); seqlen_k == 0: dq (zeros)."""
    numbatc.attention_backward(*args(sq=sq, sk=sk))
    assert len(launched) == 1
    # an empty result array given (a Numba one has strides 0) is taken as it is
    empty = FakeCuda((2, 0, 4, 64), strides=(0, 0, 0, 0)) if sq == 0 else None
    numbatc.attention_backward(*args(sq=sq, sk=sk), dq=empty)
    assert len(launched) == 2


# --- errors ----------------------------------------------------------------------------------


def test_operand_errors():
    q, k, v, out, lse, dout = args()
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        numbatc.attention_backward(FakeCuda((5, 4, 64)), k, v, out, lse, dout)
    with pytest.raises(TypeError, match="k has dtype float32, not supported"):
        numbatc.attention_backward(q, FakeCuda(k.shape, "float32"), v, out, lse, dout)
    with pytest.raises(ValueError, match="q has batch 3 but k and v have batch 2"):
        numbatc.attention_backward(FakeCuda((3, 5, 4, 64)), k, v, out, lse, dout)
    with pytest.raises(ValueError, match=r"heads_q \(4\) must be a multiple of heads_kv \(3\)"):
        numbatc.attention_backward(q, FakeCuda((2, 7, 3, 64)), FakeCuda((2, 7, 3, 64)), out,
                                   lse, dout)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 8 from 8 to 256, got 12"):
        a = args(d=12)
        numbatc.attention_backward(*a)
    with pytest.raises(TypeError, match="causal must be True or False"):
        numbatc.attention_backward(q, k, v, out, lse, dout, causal=1)
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        numbatc.attention_backward(q, k, v, out, lse, dout, scale=-1.0)


def test_out_dout_lse_errors():
    q, k, v, out, lse, dout = args()
    with pytest.raises(ValueError, match=r"out must have q's shape \(2, 5, 4, 64\), got \(2, 5, 4, 32\)"):
        numbatc.attention_backward(q, k, v, FakeCuda((2, 5, 4, 32)), lse, dout)
    with pytest.raises(TypeError, match="dout has dtype bfloat16; it must have q's dtype float16"):
        numbatc.attention_backward(q, k, v, out, lse, DTypeView(FakeCuda(q.shape, "uint16"), "bfloat16"))
    with pytest.raises(ValueError, match=r"dout must be 4-D"):
        numbatc.attention_backward(q, k, v, out, lse, FakeCuda((5, 4, 64)))
    with pytest.raises(ValueError, match=r"dout .* has strides .* last dimension"):
        numbatc.attention_backward(q, k, v, out, lse, FakeCuda(q.shape, strides=(1280, 256, 1, 4)))
    with pytest.raises(TypeError, match="lse must be float32"):
        numbatc.attention_backward(q, k, v, out, FakeCuda((2, 4, 5), "float16"), dout)
    with pytest.raises(ValueError, match=r"lse must have shape \(batch, heads_q, seqlen_q\) = \(2, 4, 5\), got \(2, 5, 4\)"):
        numbatc.attention_backward(q, k, v, out, FakeCuda((2, 5, 4), "float32"), dout)
    with pytest.raises(ValueError, match=r"dlse must have lse's shape"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dlse=FakeCuda((2, 4, 4), "float32"))
    with pytest.raises(TypeError, match="dlse must be float32"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dlse=FakeCuda((2, 4, 5), "float16"))
    with pytest.raises(TypeError, match="move it to the GPU first"):
        numbatc.attention_backward(q, k, v, out, np.zeros((2, 4, 5), np.float32), dout)


def test_result_errors():
    q, k, v, out, lse, dout = args()
    with pytest.raises(ValueError, match=r"dk must have shape \(2, 7, 2, 64\), got \(2, 7, 4, 64\)"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dk=FakeCuda((2, 7, 4, 64)))
    with pytest.raises(TypeError, match="dq has dtype float32; it must have the inputs' dtype float16"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dq=FakeCuda(q.shape, "float32"))
    with pytest.raises(ValueError, match="dv is read-only"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dv=FakeCuda(v.shape, readonly=True))
    with pytest.raises(ValueError, match="dq overlaps dout in memory"):
        numbatc.attention_backward(q, k, v, out, lse, dout, dq=dout)
    with pytest.raises(ValueError, match="dv overlaps dk in memory"):
        dk = FakeCuda(k.shape)
        numbatc.attention_backward(q, k, v, out, lse, dout, dk=dk, dv=dk)
    with pytest.raises(ValueError, match="dq .* overlapping elements"):
        numbatc.attention_backward(q, k, v, out, lse, dout,
                                   dq=FakeCuda(q.shape, strides=(0, 256, 64, 1)))


def test_devices_and_old_gpus(monkeypatch):
    q, k, v, out, lse, dout = args()
    with pytest.raises(ValueError, match=r"different devices .*lse on cuda:1"):
        numbatc.attention_backward(q, k, v, out, FakeCuda(lse.shape, "float32", device=1), dout)
    with pytest.raises(ValueError, match=r"different devices .*v on cuda:1"):
        numbatc.attention_backward(q, k, FakeCuda(v.shape, device=1), out, lse, dout)
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: (7, 5))
    with pytest.raises(ValueError, match="compute capability 8.0 .* device 0 is sm_75"):
        numbatc.attention_backward(q, k, v, out, lse, dout)


# --- the kernel module's face ----------------------------------------------------------------


def test_configs_validate_and_fit():
    with pytest.raises(ValueError, match="kv_tile_m must be a multiple of 16 dividing 128"):
        bwd.BwdConfig("bad", 64, 48, False, False, 64, 32, False)
    with pytest.raises(ValueError, match="kv_block_n must be a multiple of 16"):
        bwd.BwdConfig("bad", 40, 32, False, False, 64, 32, False)
    for d in range(8, 257, 8):  # the heuristic's choice fits sm_80 and sm_90 (8.6: 99 KB too)
        cfg = bwd.choose_config(d)
        var = bwd.BwdVariant(d, "bfloat16", True)
        for cc in ((8, 0), (8, 6), (9, 0)):
            bwd._check_fits(cfg, var, cc)
        assert max(bwd.shared_bytes(cfg, var, k) for k in ("dkdv", "dq")) <= 96 * 1024


def test_every_config_generates_valid_source():
    for cfg in bwd.CONFIGS.values():
        for d in (16, 40, 64, 128, 256):
            var = bwd.BwdVariant(d, "float16", True)
            compile(bwd.dq_source(cfg, var), "dq", "exec")
            for part in ("both", "dk", "dv"):
                compile(bwd.dkdv_source(cfg, var, part), "dkdv", "exec")
            compile(bwd.preprocess_source(var), "pre", "exec")


# --- the reference gradient ------------------------------------------------------------------


@pytest.mark.parametrize("causal, sq, sk", [(False, 5, 7), (True, 5, 7), (True, 7, 4)])
def test_reference_gradient_matches_finite_differences(causal, sq, sk):
    """reference_backward's dq, dk, dv are the gradient of sum(out * dout) (central differences
    in float64), GQA included; rows that see no key (sq > sk causal) have none."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, sq, 4, 8)), rng.standard_normal((1, sk, 2, 8)), rng.standard_normal((1, sk, 2, 8))
    do = rng.standard_normal(q.shape)
    scale = 0.4
    from tests.helpers.attention import reference

    def loss(q, k, v):
        return (reference(q, k, v, causal, scale)[0] * do).sum()

    grads = reference_backward(q, k, v, do, causal, scale)[:3]
    for x, g in zip((q, k, v), grads):
        num = np.zeros(x.shape)
        for i in np.ndindex(x.shape):
            hi, lo = x.copy(), x.copy()
            hi[i] += 1e-6
            lo[i] -= 1e-6
            args3 = [hi if y is x else y for y in (q, k, v)]
            args3l = [lo if y is x else y for y in (q, k, v)]
            num[i] = (loss(*args3) - loss(*args3l)) / 2e-6
        np.testing.assert_allclose(g, num, atol=1e-6, rtol=1e-5)


# --- assembly --------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim, dtype, causal, arch, max_spill", [
    (64, "bfloat16", True, "sm_80", 0),
    (128, "float16", False, "sm_80", 0),
    (128, "bfloat16", True, "sm_90a", 0),
    (40, "bfloat16", True, "sm_80", 0),  # padded to 48, rows padded to an odd chunk count
    (256, "bfloat16", True, "sm_80", 128),  # known: dK and dV launches spill (see choose_config)
])
def test_chosen_config_assembles(head_dim, dtype, causal, arch, max_spill):
    from intrinsics.toolchain import compile_ptx
    from tests.test_attention_kernels import ptxas_report

    cfg = bwd.choose_config(head_dim)
    var = bwd.BwdVariant(head_dim, dtype, causal)
    sigs = bwd.signatures()
    ptx_type = "bf16" if dtype == "bfloat16" else "f16"
    for name, kernel in bwd.kernels_for(cfg, var).items():
        ptx = compile_ptx(kernel, sigs["dkdv" if name in ("both", "dk", "dv") else name], arch)
        if name != "pre":
            assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in ptx
            assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
            assert "cp.async.cg.shared.global" in ptx
        assert not re.search(r"^\s*(atom|red)\.", ptx, re.M)  # deterministic: no atomics
        registers, spills = ptxas_report(ptx, arch)
        assert registers <= 255 and spills <= max_spill, (name, registers, spills)
        if max_spill == 0:
            assert "ld.local" not in ptx and "st.local" not in ptx
