"""numbatc.softmax and numbatc.gemm_softmax without a GPU: every validation error names what is
wrong, rows flatten (or are refused) as documented, the vector-load decision, empty inputs, the
fused/unfused choice around N = 256 and what reaches the launches (replaced here by recorders).
Arrays are tests/helpers/fake_arrays.py's fakes (made-up pointers, never dereferenced)."""

import numpy as np
import pytest

import numbatc
from numbatc import _warm, gemm_api, softmax_api
from numbatc.interop import DTypeView, devices, streams
from tests.helpers.fake_arrays import FakeCuda, col_major, no_gpu  # noqa: F401  (no_gpu: autouse)


@pytest.fixture
def launched(monkeypatch):
    calls = {"softmax": [], "fused": [], "gemm": []}
    monkeypatch.setattr(softmax_api, "_launch_softmax", calls["softmax"].append)
    from numbatc.kernels import sm80_gemm_softmax

    monkeypatch.setattr(sm80_gemm_softmax, "launch_flat",
                        lambda *a, **k: calls["fused"].append(a))
    monkeypatch.setattr(gemm_api, "gemm", lambda *a, **k: calls["gemm"].append(k) or
                        FakeCuda((a[0].shape[0], a[1].shape[1]), "float32"))
    monkeypatch.setattr(softmax_api, "_emulated", lambda: False)
    # no driver: streams, device scopes and operand packing answered without one
    import contextlib

    from numbatc.kernels import operands

    monkeypatch.setattr(streams, "stream_handle", lambda t: 0)
    monkeypatch.setattr(streams, "numba_stream", lambda handle, device=None: None)
    monkeypatch.setattr(devices, "device_scope", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(operands, "operand", lambda op, stream, keep: (op.ptr, op.ld))
    return calls


def test_softmax_rejects_bad_dtypes_and_scalars():
    with pytest.raises(TypeError, match="numbatc.softmax takes bfloat16, float16, float32"):
        numbatc.softmax(FakeCuda((4, 4), "float64"))
    with pytest.raises(ValueError, match="at least one dimension"):
        numbatc.softmax(FakeCuda((), "float32"))


def test_softmax_needs_unit_stride_and_flattenable_rows():
    with pytest.raises(ValueError, match="unit stride on its last dimension"):
        numbatc.softmax(col_major(8, 8))
    x = FakeCuda((2, 3, 8), "float16", strides=(100, 8, 1))  # a gap between the 2 blocks
    with pytest.raises(ValueError, match="do not flatten into rows"):
        numbatc.softmax(x)


class IndexableFake(FakeCuda):
    """A FakeCuda that indexes its leading dimensions into views, as torch, CuPy and Numba do."""

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        st = self._strides()
        ptr = self.ptr + sum(i * s for i, s in zip(index, st)) * self.dtype.itemsize
        return IndexableFake(self.shape[len(index):], self.dtype, st[len(index):], ptr=ptr,
                             device=self.device)


def test_softmax_splits_leading_dimensions_that_do_not_flatten(launched):
    # (2, 3, 5, 8) with a gap after each (5, 8) block and each 3-block: one launch per (i, j)
    x = IndexableFake((2, 3, 5, 8), "float16", strides=(1000, 100, 16, 1))
    out = IndexableFake((2, 3, 5, 8), "float16")
    numbatc.softmax(x, out=out)
    calls = launched["softmax"]
    assert [(p.rows, p.n, p.ldx, p.ldo) for p in calls] == [(5, 8, 16, 8)] * 6
    starts = [(p.x.ptr - x.ptr) // 2 for p in calls]
    assert starts == [i * 1000 + j * 100 for i in range(2) for j in range(3)]
    assert [(p.out.ptr - out.ptr) // 2 for p in calls] == [k * 40 for k in range(6)]


def test_softmax_out_is_checked():
    x = FakeCuda((4, 8), "float16")
    with pytest.raises(ValueError, match=r"out must have shape \(4, 8\)"):
        numbatc.softmax(x, out=FakeCuda((8, 4), "float16"))
    with pytest.raises(TypeError, match="out has dtype int32"):
        numbatc.softmax(x, out=FakeCuda((4, 8), "int32"))
    with pytest.raises(ValueError, match="read-only"):
        numbatc.softmax(x, out=FakeCuda((4, 8), "float16", readonly=True))
    with pytest.raises(ValueError, match="out overlaps x"):
        numbatc.softmax(x, out=FakeCuda((4, 8), "float16", ptr=x.ptr + 2))


def test_softmax_flattens_rows_and_runs_in_place(launched):
    x = FakeCuda((2, 3, 8), "float16", strides=(48, 16, 1))  # rows of 8 at a stride of 16
    assert numbatc.softmax(x, out=x) is x
    p = launched["softmax"][0]
    assert (p.rows, p.n, p.ldx, p.ldo) == (6, 8, 16, 16)
    assert (p.x.ptr, p.out.ptr, p.in_dtype, p.out_dtype) == (x.ptr, x.ptr, "float16", "float16")


def test_softmax_empty_launches_nothing(launched):
    numbatc.softmax(FakeCuda((0, 5), "float32"))
    numbatc.softmax(FakeCuda((3, 0), "float32"))
    assert launched["softmax"] == []


def test_softmax_result_has_the_input_dtype(no_gpu, launched):
    numbatc.softmax(DTypeView(FakeCuda((3, 5), "uint16"), "bfloat16"))
    assert no_gpu[-1][:2] == ((3, 5), "bfloat16")


def test_vector_loads_need_8_byte_rows(launched):
    from numbatc.kernels.row_softmax import vectors_ok

    def problem(x, out=None):
        numbatc.softmax(x, out=out)
        return launched["softmax"][-1]

    assert vectors_ok(problem(FakeCuda((4, 8), "float16")))
    assert vectors_ok(problem(FakeCuda((4, 8), "float16"), FakeCuda((4, 8), "float32")))
    assert not vectors_ok(problem(FakeCuda((4, 6), "float16")))  # rows 12 bytes apart
    assert not vectors_ok(problem(FakeCuda((4, 8), "float32")))
    odd = FakeCuda((4, 12), "float16").at(0, 1, (4, 8))  # starts 2 bytes past 8
    assert not vectors_ok(problem(odd))
    assert not vectors_ok(problem(FakeCuda((4, 8), "float16"), odd))
    assert vectors_ok(problem(FakeCuda((4, 12), "float16").at(0, 4, (4, 8))))


def test_gemm_softmax_validation():
    a, b = FakeCuda((8, 16), "float16"), FakeCuda((16, 32), "float16")
    with pytest.raises(ValueError, match="inner dimensions differ"):
        numbatc.gemm_softmax(a, FakeCuda((15, 32), "float16"))
    with pytest.raises(TypeError, match="mixed dtypes"):
        numbatc.gemm_softmax(a, DTypeView(FakeCuda((16, 32), "uint16"), "bfloat16"))
    with pytest.raises(ValueError, match=r"bias must have shape \(N,\) = \(32,\)"):
        numbatc.gemm_softmax(a, b, bias=FakeCuda((16,), "float16"))
    with pytest.raises(TypeError, match="bias has dtype float64"):
        numbatc.gemm_softmax(a, b, bias=FakeCuda((32,), "float64"))
    with pytest.raises(TypeError, match="scale must be a real number"):
        numbatc.gemm_softmax(a, b, scale="0.1")
    with pytest.raises(TypeError, match="out has dtype bfloat16"):
        numbatc.gemm_softmax(a, b, out=DTypeView(FakeCuda((8, 32), "uint16"), "bfloat16"))
    with pytest.raises(ValueError, match="must be row-major"):
        numbatc.gemm_softmax(a, b, out=col_major(8, 32))
    with pytest.raises(ValueError, match="out overlaps a"):
        numbatc.gemm_softmax(a, b, out=FakeCuda((8, 32), "float16", ptr=a.ptr))


def test_gemm_softmax_fused_up_to_256_columns(launched, monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    a = FakeCuda((100, 64), "float16")
    numbatc.gemm_softmax(a, FakeCuda((64, 256), "float16"), scale=0.125,
                         bias=FakeCuda((256,), "float32"))
    cfg, var = launched["fused"][0][:2]  # launch_flat's arguments
    assert (cfg.bn, var.bias_dtype, var.out_dtype) == (256, "float32", "float16")
    assert launched["fused"][0][-1] == 0.125
    assert "sm80_gemm_softmax 32x256x64_8w_4s" in capsys.readouterr().err


def test_gemm_softmax_wider_rows_run_unfused(launched, monkeypatch, capsys):
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    numbatc.gemm_softmax(FakeCuda((10, 64), "float16"), FakeCuda((64, 257), "float16"), scale=2.0)
    assert launched["fused"] == []
    assert launched["gemm"] == [dict(alpha=2.0, bias=None, out_dtype="float32")]
    assert len(launched["softmax"]) == 1
    assert "N > 256 does not fit" in capsys.readouterr().err


def test_gemm_softmax_empty(launched):
    numbatc.gemm_softmax(FakeCuda((0, 4), "float16"), FakeCuda((4, 8), "float16"))
    assert launched["fused"] == [] and launched["softmax"] == []


# --- warm calls -------------------------------------------------------------------------------


@pytest.fixture
def warm_rec(monkeypatch):
    """_launch_softmax replaced by a recorder returning a recording relaunch function."""
    rec = {"checked": [], "relaunched": []}

    def launch(p):
        rec["checked"].append((p.x.ptr, p.out.ptr, p.rows, p.n, p.ldx, p.ldo))
        return lambda x, out, stream: rec["relaunched"].append((x, out, stream))

    monkeypatch.setattr(softmax_api, "_launch_softmax", launch)
    _warm.CACHE.clear()
    yield rec
    _warm.CACHE.clear()


def test_softmax_second_call_is_warm(warm_rec, monkeypatch):
    from tests.helpers.fake_arrays import T, fake_torch, value_devices

    torch = value_devices(fake_torch(monkeypatch, current_stream=0x77))
    x, out = T(torch, (64, 48)), T(torch, (64, 48))
    assert numbatc.softmax(x, out=out) is out
    assert len(warm_rec["checked"]) == 1 and len(_warm.CACHE) == 1
    x2, out2 = T(torch, (64, 48)), T(torch, (64, 48))
    assert numbatc.softmax(x2, out=out2) is out2
    assert len(warm_rec["checked"]) == 1  # no checks
    assert warm_rec["relaunched"] == [(x2.ptr, out2.ptr, 0x77)]
    assert numbatc.softmax(x2, out=x2) is x2  # in place: the same decision, still warm
    assert warm_rec["relaunched"][-1] == (x2.ptr, x2.ptr, 0x77)
    # another shape or a partial overlap goes through the checks
    numbatc.softmax(T(torch, (64, 40)))
    assert len(warm_rec["checked"]) == 2
    with pytest.raises(ValueError, match="out overlaps x"):
        numbatc.softmax(x2, out=T(torch, (64, 48), ptr=x2.ptr + 2))


def test_gemm_softmax_second_call_is_warm(monkeypatch):
    import contextlib

    from numbatc.kernels import operands, sm80_gemm_softmax
    from tests.helpers.fake_arrays import T, fake_torch, value_devices

    calls = {"checked": [], "relaunched": []}

    def launch(cfg, var, a, b, bias, out, m, n, k, lda, ldb, ldo, scale, stream=0, prepare=False):
        calls["checked"].append((a, b, bias, out, scale))
        return lambda *args: calls["relaunched"].append(args)

    monkeypatch.setattr(sm80_gemm_softmax, "launch_flat", launch)
    monkeypatch.setattr(softmax_api, "_emulated", lambda: False)
    monkeypatch.setattr(streams, "numba_stream", lambda handle, device=None: None)
    monkeypatch.setattr(devices, "device_scope", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(operands, "operand", lambda op, stream, keep: (op.ptr, op.ld))
    _warm.CACHE.clear()
    torch = value_devices(fake_torch(monkeypatch, current_stream=0x99))
    a, b, out = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    numbatc.gemm_softmax(a, b, out=out, scale=0.5)
    assert len(calls["checked"]) == 1
    a2, b2, out2 = T(torch, (64, 32)), T(torch, (32, 48)), T(torch, (64, 48))
    assert numbatc.gemm_softmax(a2, b2, out=out2, scale=0.25) is out2
    assert len(calls["checked"]) == 1
    assert calls["relaunched"] == [(a2.ptr, b2.ptr, out2.ptr, out2.ptr, 0.25, 0x99)]
    with pytest.raises(ValueError, match="out overlaps a"):  # not warm: the checks name it
        numbatc.gemm_softmax(a2, b2, out=T(torch, (64, 48), ptr=a2.ptr))
    _warm.CACHE.clear()
