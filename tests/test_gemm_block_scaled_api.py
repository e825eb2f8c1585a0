"""numbatc.gemm's block-scaled inputs (MXFP8, NVFP4) without a GPU: the contract's checks
(formats, scale shapes and dtypes, K, K-major layouts, the compute capability), the GemmProblem
that reaches ``numbatc.kernels.dispatch.launch_gemm`` (a recorder here), the marking wrappers,
and the dispatcher's refusals.  Arrays are tests/helpers/fake_arrays.py's fakes: nothing is
dereferenced."""

import importlib

import pytest

import numbatc
from numbatc import gemm_api
from numbatc.interop import DTypeView
from tests.helpers.fake_arrays import FakeCuda, col_major, launched, no_gpu  # noqa: F401 (fixtures)

gemm = numbatc.gemm


@pytest.fixture
def blackwell(monkeypatch):
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: (10, 0))


def f8(shape, kind="e4m3", col=False):
    """A marked fp8 (rows, cols) fake: row-major, or column-major with ``col``."""
    raw = col_major(*shape, dtype="uint8") if col else FakeCuda(shape, "uint8")
    return numbatc.float8_e4m3(raw) if kind == "e4m3" else numbatc.float8_e5m2(raw)


def f4(shape, col=False):
    raw = col_major(*shape, dtype="uint8") if col else FakeCuda(shape, "uint8")
    return numbatc.float4_e2m1(raw)


def mxfp8(m=64, n=48, k=128, kinds=("e4m3", "e4m3")):
    return (f8((m, k), kinds[0]), f8((k, n), kinds[1], col=True),
            FakeCuda((m, k // 32), "uint8"), FakeCuda((n, k // 32), "uint8"))


def nvfp4(m=64, n=48, k=256):
    return (f4((m, k // 2)), f4((k // 2, n), col=True),
            numbatc.float8_e4m3(FakeCuda((m, k // 16), "uint8")),
            numbatc.float8_e4m3(FakeCuda((n, k // 16), "uint8")))


# ---------------------------------------------------------------------------------------------
# the problem handed to launch_gemm
# ---------------------------------------------------------------------------------------------


def test_mxfp8_reaches_launch_gemm(launched, blackwell, no_gpu):
    a, b, sa, sb = mxfp8(kinds=("e5m2", "e4m3"))
    bias = FakeCuda((48,), "float32")
    out = gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, activation="relu", alpha=2.0)
    (p,) = launched.launches
    assert (p.m, p.n, p.k) == (64, 48, 128)
    assert p.block_scaled is gemm_api.BLOCK_SCALED["mxfp8"]
    assert (p.in_dtype, p.b_dtype, p.out_dtype, p.bias_dtype) == (
        "float8_e5m2", "float8_e4m3fn", "bfloat16", "float32")
    assert (p.a.layout, p.b.layout, p.a.ld, p.b.ld) == ("row", "col", 128, 128)
    assert (p.scale_a.ptr, p.scale_a.shape) == (sa.ptr, (64, 4))
    assert (p.scale_b.ptr, p.scale_b.shape) == (sb.ptr, (48, 4))
    assert p.cc == (10, 0) and p.alpha == 2.0
    assert [(s, d) for s, d, _ in no_gpu] == [((64, 48), "bfloat16")]
    assert isinstance(out, DTypeView) and out.dtype == "bfloat16"


def test_nvfp4_counts_two_values_a_byte(launched, blackwell):
    a, b, sa, sb = nvfp4(m=3, n=5, k=96)
    gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="float16")
    (p,) = launched.launches
    assert (p.m, p.n, p.k) == (3, 5, 96)
    assert p.block_scaled.name == "nvfp4" and p.out_dtype == "float16"
    assert p.a.shape == (3, 48) and p.scale_a.shape == (3, 6) and p.scale_b.dtype == "float8_e4m3fn"


def test_e8m0_scales_and_float32_out(launched, blackwell):
    a, b, _, _ = mxfp8(k=64)
    sa = FakeCuda((64, 2), "uint8")
    sb = DTypeView(FakeCuda((48, 2), "uint8"), "float8_e8m0fnu")
    gemm(a, b, scale_a=sa, scale_b=sb, out_dtype="float32")
    assert launched.launches[0].out_dtype == "float32"


@pytest.mark.parametrize("cc, ok", [((10, 0), True), ((10, 3), True), ((9, 0), False),
                                    ((12, 0), False), ((8, 0), False)])
def test_only_compute_capability_10(monkeypatch, launched, cc, ok):
    monkeypatch.setattr(gemm_api, "_device_capability", lambda device: cc)
    a, b, sa, sb = mxfp8()
    if ok:
        gemm(a, b, scale_a=sa, scale_b=sb)
        assert launched.launches[0].cc == cc
    else:
        with pytest.raises(ValueError, match=(
                rf"block-scaled GEMM \(MXFP8\) needs sm_100 \(Blackwell, compute capability "
                rf"10.x\); this GPU is sm_{cc[0]}{cc[1]}")):
            gemm(a, b, scale_a=sa, scale_b=sb)
        assert not launched.launches


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------


def _cases():
    a, b, sa, sb = mxfp8()
    fa, fb, fsa, fsb = nvfp4()
    h = FakeCuda((64, 128), "float16")
    hb = col_major(128, 48, "float16")
    return [
        (dict(a=a, b=b, scale_a=1.0, scale_b=1.0), ValueError,  # per-tensor: sm_90a only
         r"FP8 with per-tensor scales needs compute capability 9.0 \(sm_90a\); this GPU is "
         r"sm_100"),
        (dict(a=h, b=hb, scale_a=sa, scale_b=sb), TypeError,
         r"scale_a/scale_b are block scales for MXFP8 .* a is float16 and b is float16"),
        (dict(a=a, b=b), TypeError,
         r"MXFP8 inputs \(float8_e4m3fn x float8_e4m3fn\) need block scales: scale_a \(M, K/32\)"
         r".*or per-tensor scales: scale_a and scale_b Python numbers \(sm_90\)"),
        (dict(a=a, b=b, scale_a=sa), TypeError, r"need block scales"),
        (dict(a=a, b=fb, scale_a=sa, scale_b=sb), TypeError,
         r"a is float8_e4m3fn but b is float4_e2m1fn_x2: block-scaled inputs are both MXFP8"),
        (dict(a=a, b=hb, scale_a=sa, scale_b=sb), TypeError, r"a is float8_e4m3fn but b is float16"),
        (dict(a=a, b=b, scale_a=FakeCuda((64, 3), "uint8"), scale_b=sb), ValueError,
         r"scale_a must have shape \(M, K/32\) = \(64, 4\) for MXFP8, got \(64, 3\)"),
        (dict(a=a, b=b, scale_a=sa, scale_b=FakeCuda((1, 1), "uint8")), ValueError,
         r"scale_b must have shape \(N, K/32\) = \(48, 4\) .* got \(1, 1\) \(per-tensor scales "
         r"are Python or NumPy numbers"),
        (dict(a=a, b=b, scale_a=FakeCuda((64, 4), "float16"), scale_b=sb), TypeError,
         r"scale_a has dtype float16; MXFP8 scales are ue8m0 exponents: uint8"),
        (dict(a=fa, b=fb, scale_a=FakeCuda((64, 16), "uint8"), scale_b=fsb), TypeError,
         r"scale_a has dtype uint8; NVFP4 scales are ue4m3: float8_e4m3fn .*numbatc.float8_e4m3"),
        (dict(a=f8((64, 80)), b=f8((80, 48), col=True), scale_a=FakeCuda((64, 3), "uint8"),
              scale_b=FakeCuda((48, 3), "uint8")), ValueError,
         r"MXFP8 needs K to be a multiple of 32 .*; K = 80"),
        (dict(a=f4((64, 24)), b=f4((24, 48), col=True), scale_a=fsa, scale_b=fsb), ValueError,
         r"NVFP4 needs K to be a multiple of 32 .*; K = 2 \* a.shape\[1\] = 48"),
        (dict(a=a, b=f8((128, 48)), scale_a=sa, scale_b=sb), ValueError,
         r"MXFP8 GEMM reads b K-major: \(K, N\) column-major, e.g. w.T"),
        (dict(a=f8((64, 128), col=True), b=b, scale_a=sa, scale_b=sb), ValueError,
         r"MXFP8 GEMM reads a K-major: a \(M, K\) row-major"),
        (dict(a=a, b=b, scale_a=sa, scale_b=sb, out_dtype="float8_e4m3fn"), TypeError,
         r"out_dtype float8_e4m3fn is not available for float8_e4m3fn inputs; choose one of "
         r"bfloat16, float16, float32"),
        (dict(a=a, b=b, scale_a=sa, scale_b=sb, bias=FakeCuda((48,), "uint8")), TypeError,
         r"bias has dtype uint8"),
        (dict(a=a, b=b, scale_a=sa, scale_b=FakeCuda((48, 4), "uint8", device=1)), ValueError,
         r"operands are on different devices .*scale_b on cuda:1"),
    ]


CASES = 17  # the fakes need the autouse no_gpu fixture: the cases are built inside the test


@pytest.mark.parametrize("case", range(CASES))
def test_refusals(launched, blackwell, case):
    cases = _cases()
    assert len(cases) == CASES
    kwargs, exc, msg = cases[case]
    a, b = kwargs.pop("a"), kwargs.pop("b")
    with pytest.raises(exc, match=msg):
        gemm(a, b, **kwargs)
    assert not launched.launches


def test_out_must_not_overlap_the_scales(launched, blackwell):
    a, b, sa, sb = mxfp8(m=64, n=48)
    buf = FakeCuda((64, 64), "uint8")
    sa = buf.at(0, 0, (64, 4))
    out = numbatc.bfloat16(FakeCuda((64, 48), "uint16", ptr=buf.ptr))
    with pytest.raises(ValueError, match="out overlaps scale_a"):
        gemm(a, b, scale_a=sa, scale_b=sb, out=out)


def test_the_markers():
    u8 = FakeCuda((4, 4), "uint8")
    for mark, dtype in ((numbatc.float8_e4m3, "float8_e4m3fn"),
                        (numbatc.float8_e5m2, "float8_e5m2"),
                        (numbatc.float4_e2m1, "float4_e2m1fn_x2")):
        v = mark(u8)
        assert isinstance(v, DTypeView) and v.dtype == dtype and mark(v) is v
        assert v.T.shape == (4, 4) and v.T.dtype == dtype
    with pytest.raises(TypeError, match="numbatc.float4_e2m1 got an array already marked as "
                                        "float8_e4m3fn"):
        numbatc.float4_e2m1(numbatc.float8_e4m3(u8))
    with pytest.raises(TypeError, match="marks a CUDA uint8 array .* got an array of dtype uint16"):
        numbatc.float8_e4m3(FakeCuda((4, 4), "uint16"))


# ---------------------------------------------------------------------------------------------
# the dispatcher
# ---------------------------------------------------------------------------------------------


def _problem(fmt="mxfp8", cc=(10, 0), n=48):
    from tests.helpers.problems import gemm_problem

    dtype = "float8_e4m3fn" if fmt == "mxfp8" else "float4_e2m1fn_x2"
    return gemm_problem(64, n, 256, cc=cc, dtype=dtype, block_scaled=gemm_api.BLOCK_SCALED[fmt])


def test_dispatch_picks_and_refuses_configs(monkeypatch):
    dispatch = importlib.import_module("numbatc.kernels.dispatch")

    def pick(p, choice):
        monkeypatch.setenv("NUMBATC_GEMM_KERNEL", choice)
        module, cfg = dispatch.choose(p)
        assert module.__name__.endswith("sm100_scaled_gemm")
        return cfg

    assert pick(_problem(), "").name == "mxfp8_128x128_6s"
    assert pick(_problem(n=300), "").name == "mxfp8_128x256_4s"
    assert pick(_problem("nvfp4", n=129), "sm100").name == "nvfp4_128x256_4s"
    assert pick(_problem("nvfp4"), "sm100:nvfp4_128x256_4s").name == "nvfp4_128x256_4s"
    with pytest.raises(ValueError, match=r"block-scaled GEMM \(NVFP4\) needs sm_100 \(Blackwell\); "
                                         r"this GPU is sm_90"):
        pick(_problem("nvfp4", cc=(9, 0)), "sm100")  # forcing works in the emulation only
    with pytest.raises(ValueError, match=r"NUMBATC_GEMM_KERNEL='sm80': block-scaled \(MXFP8\) "
                                         r"GEMM runs on sm100 only"):
        pick(_problem(), "sm80")
    with pytest.raises(ValueError, match=r"no sm100 MXFP8 config 'nvfp4_128x128_6s'; choose from "
                                         r"\['mxfp8_128x128_6s', 'mxfp8_128x256_4s'\]"):
        pick(_problem(), "sm100:nvfp4_128x128_6s")
