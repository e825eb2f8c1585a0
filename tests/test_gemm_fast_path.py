"""numbatc.gemm's warm call without a GPU: the cache of validated calls (numbatc._warm.CACHE), its
key, and the prepared launch it ends in (intrinsics.launch.PreparedLaunch).

``launch_gemm`` is replaced by a recorder that returns a recording relaunch function, so a call
either goes through the checks (the recorder sees a GemmProblem) or is warm (only the relaunch
function sees it).  Arrays are the stand-ins of tests/helpers/fake_arrays.py (a fake torch; fake
pointers)."""

import importlib
import threading

import numpy as np
import pytest

import numbatc
from numbatc import gemm_api
from numbatc import _warm
from tests.helpers.fake_arrays import (  # noqa: F401 (no_gpu: autouse fixture)
    T, fake_cupy, fake_ptr, fake_torch, no_gpu, value_devices)

dispatch = importlib.import_module("numbatc.kernels.dispatch")
gemm = numbatc.gemm


class Recorder:
    def __init__(self):
        self.checked = []  # GemmProblems that went through the checks
        self.relaunched = []  # (a, b, c, bias, out, alpha, beta, stream) of every launch

    def launch_gemm(self, p):
        self.checked.append(p)
        expected = (p.a.ptr, p.b.ptr, p.c.ptr if p.c is not None else p.out.ptr,
                    p.bias.ptr if p.bias is not None else p.out.ptr, p.out.ptr, p.alpha, p.beta,
                    p.stream_handle)
        self.relaunched.append(expected)  # the checked call's own launch
        return lambda *args: self.relaunched.append(args)


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(dispatch, "launch_gemm", r.launch_gemm)
    _warm.CACHE.clear()
    yield r
    _warm.CACHE.clear()


@pytest.fixture
def torch(monkeypatch):
    return value_devices(fake_torch(monkeypatch, current_stream=0x5150))


def test_second_call_is_warm_and_launches_the_same(rec, torch):
    a, b, out = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    gemm(a, b, out=out, alpha=2.0)
    assert len(rec.checked) == 1 and len(_warm.CACHE) == 1
    a2, b2, out2 = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    assert gemm(a2, b2, out=out2, alpha=3) is out2
    assert len(rec.checked) == 1  # no checks, no dispatch
    assert rec.relaunched[-1] == (a2.ptr, b2.ptr, out2.ptr, out2.ptr, out2.ptr, 3.0, 0.0, 0x5150)
    assert all(type(x) in (int, float) for x in rec.relaunched[-1])


def test_warm_call_allocates_the_result(rec, torch):
    a, b = T(torch, (16, 8), "bfloat16"), T(torch, (8, 24), "bfloat16")
    first = gemm(a, b, out_dtype=torch.float32)
    second = gemm(T(torch, (16, 8), "bfloat16"), T(torch, (8, 24), "bfloat16"),
                  out_dtype=torch.float32)
    assert len(rec.checked) == 1
    assert second is not first and second.dtype is torch.float32 and second.shape == (16, 24)
    assert rec.relaunched[-1][4] == second.ptr


def test_warm_calls_match_checked_calls(rec, torch):
    """Every warm launch equals what the checks would have launched for the same call."""
    rng = np.random.default_rng()
    for trial in range(40):
        m, n, k = (int(x) for x in rng.integers(1, 5, size=3) * 8)
        with_c, with_bias = bool(rng.integers(2)), bool(rng.integers(2))
        beta = float(rng.choice([0.0, 0.5])) if with_c else 0.0

        def call():
            a = T(torch, (m, k))
            b = T(torch, (n, k)).T if trial % 2 else T(torch, (k, n))
            c = T(torch, (m, n)) if with_c else None
            bias = T(torch, (n,), "float32") if with_bias else None
            out = T(torch, (m, n))
            gemm(a, b, c=c, beta=beta, bias=bias, out=out, alpha=1.5, activation="relu")

        _warm.CACHE.clear()
        call()  # checked, cached
        call()  # warm
        warm = rec.relaunched[-1]
        n_checked = len(rec.checked)
        _warm.CACHE.clear()
        call()  # checked again, with fresh pointers: the reference for the pattern
        assert len(rec.checked) == n_checked + 1
        ref = rec.relaunched[-1]
        # same pattern of which pointer goes where (c, bias replaced by out when absent)
        assert (warm[2] == warm[4]) == (ref[2] == ref[4])
        assert (warm[3] == warm[4]) == (ref[3] == ref[4])
        assert warm[5:] == ref[5:]


def _variants(torch):
    """(name, kwargs) pairs: each differs from the base in one thing validation reads."""
    def base(**over):
        kw = dict(a=T(torch, (64, 32)), b=T(torch, (32, 48)), out=T(torch, (64, 48)))
        kw.update(over)
        return kw

    return [
        ("base", base()),
        ("a shape", base(a=T(torch, (64, 40)), b=T(torch, (40, 48)))),
        ("m", base(a=T(torch, (32, 32)), out=T(torch, (32, 48)))),
        ("a strides (ld)", base(a=T(torch, (64, 32), strides=(40, 1)))),
        ("a column-major", base(a=T(torch, (32, 64)).T)),
        ("b column-major", base(b=T(torch, (48, 32)).T)),
        ("out strides", base(out=T(torch, (64, 48), strides=(56, 1)))),
        ("out column-major", base(out=T(torch, (48, 64)).T)),
        ("dtype", base(a=T(torch, (64, 32), "bfloat16"), b=T(torch, (32, 48), "bfloat16"),
                       out=T(torch, (64, 48), "bfloat16"))),
        ("out dtype", base(out=T(torch, (64, 48), "float32"))),
        ("device", base(a=T(torch, (64, 32), device=1), b=T(torch, (32, 48), device=1),
                        out=T(torch, (64, 48), device=1))),
        ("a misaligned", base(a=T(torch, (64, 32), ptr=fake_ptr() + 2))),
        ("b misaligned", base(b=T(torch, (32, 48), ptr=fake_ptr() + 8))),
        ("c given, beta 0", base(c=T(torch, (64, 48)))),
        ("c read", base(c=T(torch, (64, 48)), beta=1.0)),
        ("bias", base(bias=T(torch, (48,)))),
        ("bias float32", base(bias=T(torch, (48,), "float32"))),
        ("no out", base(out=None)),
        ("out_dtype", base(out=None, out_dtype="float32")),
        ("activation", base(activation="gelu")),
        ("marked bf16", base(a=numbatc.bfloat16(T(torch, (64, 32), "uint16")),
                             b=numbatc.bfloat16(T(torch, (32, 48), "uint16")),
                             out=numbatc.bfloat16(T(torch, (64, 48), "uint16")))),
    ]


def test_key_changes_with_everything_validation_reads(rec, torch, monkeypatch):
    gemm_api._env_key = dispatch.env_key
    keys = {}
    for name, kw in _variants(torch):
        kw = dict(kw)
        key, _ = gemm_api._warm_key(kw.pop("a"), kw.pop("b"), kw.pop("c", None),
                                    kw.pop("bias", None), kw.pop("out", None),
                                    kw.pop("alpha", 1.0), kw.pop("beta", 0.0),
                                    kw.pop("activation", None), kw.pop("out_dtype", None))
        assert not kw
        assert key is not None, name
        assert key not in keys, f"{name} has the key of {keys.get(key)}"
        keys[key] = name
    a, b = T(torch, (64, 32)), T(torch, (32, 48))
    plain = gemm_api._warm_key(a, b, None, None, None, 1.0, 0.0, None, None)[0]
    # the library (same shapes and dtype through CuPy) and the dispatch environment
    cupy = fake_cupy(monkeypatch)
    ca, cb = cupy.ndarray((64, 32), np.float16), cupy.ndarray((32, 48), np.float16)
    assert gemm_api._warm_key(ca, cb, None, None, None, 1.0, 0.0, None, None)[0] != plain
    monkeypatch.setenv("NUMBATC_SM80_CONFIG", "64x64x64_4w_3s")
    assert gemm_api._warm_key(a, b, None, None, None, 1.0, 0.0, None, None)[0] != plain
    monkeypatch.delenv("NUMBATC_SM80_CONFIG")
    assert gemm_api._warm_key(a, b, None, None, None, 1.0, 0.0, None, None)[0] == plain
    # the thread
    other = []
    t = threading.Thread(target=lambda: other.append(
        gemm_api._warm_key(a, b, None, None, None, 1.0, 0.0, None, None)[0]))
    t.start()
    t.join()
    assert other[0] != plain
    # the pointers themselves are not in it (beyond a's and b's alignment)
    a2, b2 = T(torch, (64, 32)), T(torch, (32, 48))
    assert gemm_api._warm_key(a2, b2, None, None, None, 1.0, 0.0, None, None)[0] == plain


def test_no_warm_path_for_odd_arguments(torch):
    gemm_api._env_key = dispatch.env_key
    a, b = T(torch, (64, 32)), T(torch, (32, 48))
    for alpha in (True, "2", 1j, np.array(2.0)):
        assert gemm_api._warm_key(a, b, None, None, None, alpha, 0.0, None, None) == (None, None)


def test_every_variant_warms_and_stays_correct(rec, torch):
    """Each variant: checked once, then warm; its warm launch matches its checked launch's
    pattern and scalars."""
    for name, kw in _variants(torch):
        _warm.CACHE.clear()
        n = len(rec.checked)
        gemm(**kw)
        if name in ("a misaligned", "b misaligned"):
            continue  # the recorder warms these too; the real dispatcher would not
        assert len(rec.checked) == n + 1, name
        ref = rec.relaunched[-1]
        fresh = {k: v for k, v in _variants(torch)}[name]
        gemm(**fresh)
        assert len(rec.checked) == n + 1, f"{name}: second call was not warm"
        warm = rec.relaunched[-1]
        assert warm[5:] == ref[5:], name
        assert (warm[2] == warm[4]) == (ref[2] == ref[4]), name


def test_warm_cache_still_rejects_bad_calls(rec, torch):
    a, b, out = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    gemm(a, b, out=out)
    gemm(a, b, out=T(torch, (64, 48)))
    assert len(rec.checked) == 1
    bad = [
        (dict(a=a, b=T(torch, (40, 48))), ValueError, "inner dimensions differ"),
        (dict(a=a, b=T(torch, (32, 48), "bfloat16")), TypeError, "mixed dtypes"),
        (dict(a=a, b=b, out=T(torch, (64, 48), "bfloat16")), TypeError, "out has dtype"),
        (dict(a=a, b=b, out=T(torch, (48, 64))), ValueError, "out must have shape"),
        (dict(a=a, b=T(torch, (32, 48), device=1), out=out), ValueError, "different devices"),
        (dict(a=torch.Tensor((64, 32), torch.float16, device=("cpu", None)), b=b, out=out),
         TypeError, "CPU torch.Tensor"),
        (dict(a=a, b=b, out=out, alpha=True), TypeError, "alpha must be a real number"),
        (dict(a=a, b=b, out=out, beta=0.5), ValueError, "beta = 0.5 but c is None"),
        (dict(a=a, b=b, out=out, activation="tanh"), ValueError, "activation must be"),
        (dict(a=a, b=b, out=out, activation=["relu"]), ValueError, "activation must be"),
        (dict(a=a, b=b, out=T(torch, (64, 48), strides=(0, 1))), ValueError, "overlapping"),
        # out over a or b: same key as the warm call, caught by the byte-range test
        (dict(a=a, b=b, out=T(torch, (64, 48), ptr=a.ptr)), ValueError, "out overlaps a"),
        (dict(a=a, b=b, out=T(torch, (64, 48), ptr=b.ptr + 64)), ValueError, "out overlaps b"),
    ]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            gemm(**kw)
    assert len(rec.checked) == 1 and len(rec.relaunched) == 2


def test_out_may_be_c_itself_when_warm(rec, torch):
    a, b = T(torch, (64, 32)), T(torch, (32, 48))
    c = T(torch, (64, 48))
    gemm(a, b, c=c, beta=1.0, out=c)
    c2 = T(torch, (64, 48))
    gemm(T(torch, (64, 32)), T(torch, (32, 48)), c=c2, beta=1.0, out=c2)
    assert len(rec.checked) == 1
    assert rec.relaunched[-1][2] == rec.relaunched[-1][4] == c2.ptr
    # part of c (same key: same shape and strides, pointer one row on) is refused
    buf = T(torch, (65, 48))
    with pytest.raises(ValueError, match="out overlaps c"):
        gemm(a, b, c=T(torch, (64, 48), ptr=buf.ptr), beta=1.0,
             out=T(torch, (64, 48), ptr=buf.ptr + 96))


def test_env_change_goes_back_through_dispatch(rec, torch, monkeypatch):
    a, b, out = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    gemm(a, b, out=out)
    gemm(a, b, out=out)
    assert len(rec.checked) == 1
    monkeypatch.setenv("NUMBATC_SM80_CONFIG", "64x64x64_4w_3s")
    gemm(a, b, out=out)
    assert len(rec.checked) == 2


def test_stream_getter_follows_the_current_stream(rec, monkeypatch):
    streams = iter(range(0x1000, 0x2000))
    torch = value_devices(fake_torch(monkeypatch))
    torch.cuda.current_stream = lambda device: type("S", (), {"cuda_stream": next(streams)})()
    a, b, out = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    gemm(a, b, out=out)
    gemm(a, b, out=out)
    gemm(a, b, out=out)
    assert [r[7] for r in rec.relaunched] == [0x1000, 0x1001, 0x1002]


# ---------------------------------------------------------------------------------------------
# the prepared launch: parameter layout against the kernel's .entry, and packing
# ---------------------------------------------------------------------------------------------


def test_param_layout_matches_the_ptx_entry():
    import re

    from numba import types

    from intrinsics.launch import param_layout
    from intrinsics.toolchain import compile_ptx
    from numbatc.kernels import sm80_gemm
    from numbatc.kernels.epilogue import GemmVariant

    var = GemmVariant("row", "col", "bfloat16", "float32", "float32", "bfloat16", "relu")
    sig = sm80_gemm.signature(var) + (types.int32, types.float64, types.uint8, types.voidptr)

    def kernel(a, b, c, bias, out, m, n, k, lda, ldb, ldc, ldo, alpha, beta, group_m, i, d, u, v):
        pass

    ptx = compile_ptx(kernel, sig, "sm_80")
    params = re.findall(r"\.param \.(\w)(\d+)", re.search(r"\.entry[^(]*\(([^)]*)\)", ptx).group(1))
    sizes = [int(bits) // 8 for _, bits in params]
    fmt, offsets = param_layout(sig)
    import struct

    assert [struct.calcsize(ch) for ch in fmt[1:]] == sizes  # one parameter per argument
    assert all(off % size == 0 for off, size in zip(offsets, sizes))
    assert [kind for kind, _ in params][12:14] == ["f", "f"]  # alpha, beta are f32
    # arrays and tuples expand as numba expands them: compare with a kernel that takes both
    extra = (types.float32[:, :], types.Tuple([types.uint16[:], types.float64, types.int64]))

    def kernel2(x, arr, tup):
        pass

    ptx = compile_ptx(kernel2, (types.int32,) + extra, "sm_80")
    params = re.findall(r"\.param \.(\w)(\d+)", re.search(r"\.entry[^(]*\(([^)]*)\)", ptx).group(1))
    fmt, offsets = param_layout((types.int32,) + extra)
    assert [struct.calcsize(ch) for ch in fmt[1:]] == [int(bits) // 8 for _, bits in params]
    assert len(offsets) == 1 + (5 + 4) + (5 + 2) + 2
    assert [kind for kind, _ in params][-2] == "f"  # the float64 inside the tuple
    assert param_layout(sig + (types.NPDatetime("D"),)) is None  # no layout for other types


def test_array_params_are_numbas_array_abi():
    from intrinsics.launch import array_params

    assert array_params(0x1000, (3, 4), (16, 4), 4) == (0, 0, 12, 4, 0x1000, 3, 4, 16, 4)


def test_prepared_launch_packs_like_numba():
    import ctypes

    from intrinsics.launch import PreparedLaunch, param_layout
    from numbatc.kernels import sm80_gemm
    from numbatc.kernels.epilogue import GemmVariant

    var = GemmVariant("row", "row", "float16", "float16", None, None, None)
    prep = PreparedLaunch(0, (4, 1, 1), (128, 1, 1), 0, param_layout(sm80_gemm.signature(var)))
    args = (0x7F0000001000, 0x7F0000002000, 3, 4, 5, 64, 48, 32, 32, 48, 0, 48, 1.1, -2.5, 8)
    raw = prep.pack(*args)
    fmt, offsets = param_layout(sm80_gemm.signature(var))
    u64 = lambda i: int.from_bytes(raw[offsets[i]:offsets[i] + 8], "little")  # noqa: E731
    f32 = lambda i: np.frombuffer(raw[offsets[i]:offsets[i] + 4], np.float32)[0]  # noqa: E731
    assert [u64(i) for i in range(12)] == list(args[:12]) and u64(14) == 8
    assert f32(12) == np.float32(1.1) and f32(13) == np.float32(-2.5)
    # the parameter array points into the buffer
    base = ctypes.addressof(prep._buf)
    assert [prep._params[i] for i in range(15)] == [base + o for o in offsets]
    # a float beyond float32 becomes inf, as numba's ctypes.c_float would give
    raw = prep.pack(*args[:12], 1e39, -1e39, 8)
    assert f32(12) == np.inf and f32(13) == -np.inf


def test_linear_scan_matches_numba():
    """intrinsics.launch's replacement for numba-cuda's quadratic lowering scan gives the same
    set of singly-assigned variables on every function of a generated GEMM kernel."""
    from numba import cuda
    from numba.cuda import lowering

    from intrinsics import launch as launching
    from intrinsics.toolchain import _device_shim
    from numbatc.kernels import sm80_gemm
    from numbatc.kernels.epilogue import GemmVariant

    if not launching._scan_patchable():
        pytest.skip("another numba-cuda version: its own scan is used")
    original = lowering.Lower._find_singly_assigned_variable
    seen = []

    def both(self):
        original(self)
        theirs = self._singly_assigned_vars
        launching._singly_assigned_linear(self)
        seen.append(len(theirs))
        assert self._singly_assigned_vars == theirs

    cfg = sm80_gemm.CONFIGS["64x64x64_4w_3s"]
    var = GemmVariant("col", "row", "float16", "float32", "float32", "float16", "silu")
    kernel = sm80_gemm.kernel_for(cfg, var)
    lowering.Lower._find_singly_assigned_variable = both
    try:
        with _device_shim((8, 0)):
            cuda.compile_ptx(kernel.py_func, sm80_gemm.signature(var), cc=(8, 0))
    finally:
        lowering.Lower._find_singly_assigned_variable = original
    assert len(seen) >= 3 and max(seen) > 100


def test_prepared_cluster_launch_config():
    """A cluster launch (sm90_gemm's two-CTA clusters) goes through cuLaunchKernelEx with the grid
    in blocks and the cluster shape as its one launch attribute."""
    from cuda.bindings import driver

    from intrinsics.launch import PreparedLaunch, param_layout
    from numbatc.kernels import sm80_gemm
    from numbatc.kernels.epilogue import GemmVariant

    var = GemmVariant("row", "row", "bfloat16", "bfloat16", None, None, None)
    prep = PreparedLaunch(0, (8, 1, 1), (384, 1, 1), 200_000,
                          param_layout(sm80_gemm.signature(var)), cluster=(2, 1, 1))
    cfg = prep._config
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (8, 1, 1)
    assert (cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (384, 200_000, 1)
    attr = cfg.attrs[0]
    assert attr.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z) == (2, 1, 1)
    assert PreparedLaunch(0, (8, 1, 1), (128, 1, 1), 0,
                          param_layout(sm80_gemm.signature(var)))._config is None


def test_user_epilogue_calls_are_warm(rec, torch, monkeypatch):
    """A user epilogue's call is cached with the function and its arguments' keys: a second call
    with other arrays of the same kind is warm and passes their pointers in numba's array
    parameters (data is the fifth); another shape, dtype, number type or function is checked."""
    from numba import cuda

    @cuda.jit(device=True)
    def add_residual(v, r, c, residual, scale):
        return v * scale + residual[r, c]

    @cuda.jit(device=True)
    def other(v, r, c, residual, scale):
        return v

    flat = []

    def fake_flattener(problem_args):  # kernel_view needs a GPU; the layout is tested above
        def flatten(values):
            flat.append(list(values))
            return values
        return flatten

    monkeypatch.setattr(gemm_api, "_epilogue_flattener", fake_flattener)

    def call(fn=add_residual, shape=(64, 48), dtype="float32", scale=2.0):
        residual = T(torch, shape, dtype)
        gemm(T(torch, (64, 32)), T(torch, (32, 48)), out=T(torch, (64, 48)), epilogue=fn,
             epilogue_args=(residual, scale))
        return residual

    call()
    assert len(rec.checked) == 1
    r2 = call(scale=3.5)
    assert len(rec.checked) == 1 and flat[-1] == [r2.ptr, 3.5]
    assert rec.relaunched[-1][8] == [r2.ptr, 3.5]
    for kw in (dict(shape=(64, 64)), dict(dtype="float16"), dict(scale=2), dict(fn=other)):
        n = len(rec.checked)
        call(**kw)
        assert len(rec.checked) == n + 1, kw
