"""numbatc.torch on the CPU (a CPU build of torch is enough): the torch.ops.numbatc custom ops'
schemas and fake implementations (FakeTensorMode, torch.library.opcheck), torch.compile with
fullgraph=True of code calling the plain numbatc functions, and numbatc.torch.patch's swapping.

The ops' kernels are CUDA only; here a float64 torch reference is registered as their CPU
kernel, so that opcheck and the compiled graph can run.  The compiled run on the GPU, against
eager numbatc: tests/gpu/test_torch_gpu.py."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import numbatc  # noqa: E402
import numbatc.torch  # noqa: E402
from numbatc.torch import nn as ntnn  # noqa: E402

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


# ---------------------------------------------------------------------------------------------
# CPU stand-in kernels (float64 references), registered once for this process
# ---------------------------------------------------------------------------------------------


def _gemm_ref(a, b, c=None, alpha=1.0, beta=0.0, bias=None, activation=None, out_dtype=None):
    y = alpha * (a.double() @ b.double())
    if c is not None and beta != 0:
        y = y + beta * c.double()
    if bias is not None:
        y = y + bias.double()
    y = {None: y, "relu": torch.relu(y), "silu": torch.nn.functional.silu(y),
         "gelu": torch.nn.functional.gelu(y, approximate="tanh")}[activation]
    return y.to(out_dtype or a.dtype).contiguous()


def _attention_ref(q, k, v, causal=False, scale=None):
    return _attention_lse_ref(q, k, v, causal, scale)[0]


def _attention_lse_ref(q, k, v, causal=False, scale=None):
    qd, kd, vd = q.double(), k.double(), v.double()
    g = q.shape[2] // k.shape[2]
    kd, vd = kd.repeat_interleave(g, dim=2), vd.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * (scale or q.shape[-1] ** -0.5)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vd)
    return o.to(q.dtype).contiguous(), lse.float().contiguous()


def _attention_backward_ref(q, k, v, out, lse, dout, causal=False, scale=None, dlse=None):
    """FA2's formulas in float64 (no autograd inside a kernel): dS = P (dO V^T - D), D =
    rowsum(dO * O) - dlse; dK and dV summed over each group of query heads."""
    scale = scale or q.shape[-1] ** -0.5
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qd, do = q.double(), dout.double()
    kd, vd = k.double().repeat_interleave(g, dim=2), v.double().repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    if causal:
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    p = torch.softmax(s, -1)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vd)
    dd = (do * o).sum(-1).transpose(1, 2)  # (b, h, q)
    if dlse is not None:
        dd = dd - dlse.double()
    ds = p * (torch.einsum("bqhd,bkhd->bhqk", do, vd) - dd[..., None])
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kd) * scale
    dk = (torch.einsum("bhqk,bqhd->bkhd", ds, qd) * scale).reshape(b, sk, hkv, g, d).sum(3)
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do).reshape(b, sk, hkv, g, d).sum(3)
    return (dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(),
            dv.to(v.dtype).contiguous())


def _softmax_ref(x):
    return torch.softmax(x.double(), -1).to(x.dtype).contiguous()


def _gemm_softmax_ref(a, b, bias=None, scale=1.0):
    y = scale * (a.double() @ b.double()) + (0 if bias is None else bias.double())
    return torch.softmax(y, -1).to(a.dtype).contiguous()


_REFS = {"gemm": _gemm_ref, "attention": _attention_ref, "attention_lse": _attention_lse_ref,
         "attention_backward": _attention_backward_ref, "softmax": _softmax_ref,
         "gemm_softmax": _gemm_softmax_ref}


@pytest.fixture(scope="module", autouse=True)
def cpu_kernels():
    for name, op in numbatc.torch.OPS.items():
        op.register_kernel("cpu")(_REFS[name])


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


# ---------------------------------------------------------------------------------------------


def test_import_numbatc_does_not_import_torch():
    code = ("import sys, numbatc; assert 'torch' not in sys.modules, 'torch imported'; "
            "numbatc.torch; assert 'torch' in sys.modules; import torch; "
            "assert hasattr(torch.ops.numbatc, 'gemm')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_register_is_idempotent():
    assert numbatc.torch.register() is numbatc.torch.OPS
    assert set(numbatc.torch.OPS) == {"gemm", "attention", "attention_lse",
                                      "attention_backward", "softmax", "gemm_softmax"}


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_gemm_fake_shapes(out_dtype):
    with FakeTensorMode():
        a = torch.empty(37, 64, dtype=torch.bfloat16, device="cuda")
        b = torch.empty_strided((64, 5), (1, 64), dtype=torch.bfloat16, device="cuda")
        y = torch.ops.numbatc.gemm(a, b, out_dtype=out_dtype)
        assert y.shape == (37, 5) and y.dtype == (out_dtype or torch.bfloat16)
        assert y.device.type == "cuda" and y.is_contiguous()


def test_gemm_fake_checks_shapes():
    with FakeTensorMode():
        a = torch.empty(4, 8, dtype=torch.float16, device="cuda")
        b = torch.empty(9, 3, dtype=torch.float16, device="cuda")
        with pytest.raises(RuntimeError, match="inner dimensions differ"):
            torch.ops.numbatc.gemm(a, b)


def test_attention_softmax_fake_shapes():
    with FakeTensorMode():
        q = torch.empty(2, 7, 8, 64, dtype=torch.float16, device="cuda")
        k = torch.empty(2, 11, 2, 64, dtype=torch.float16, device="cuda")
        o = torch.ops.numbatc.attention(q, k, k, True)
        assert o.shape == q.shape and o.dtype == q.dtype
        o, lse = torch.ops.numbatc.attention_lse(q, k, k)
        assert lse.shape == (2, 8, 7) and lse.dtype == torch.float32
        x = torch.empty(3, 5, 70, dtype=torch.float16, device="cuda")
        assert torch.ops.numbatc.softmax(x).shape == x.shape
        a = torch.empty(16, 32, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(32, 100, dtype=torch.bfloat16, device="cuda")
        p = torch.ops.numbatc.gemm_softmax(a, b, None, 0.5)
        assert p.shape == (16, 100) and p.dtype == torch.bfloat16


OPCHECK_CASES = [
    ("gemm", lambda: (_rand(9, 16), _rand(16, 24)), {}),
    ("gemm", lambda: (_rand(9, 16), _rand(16, 24), _rand(9, 24), 0.5, 2.0, _rand(24), "gelu",
                      None), {}),
    ("gemm", lambda: (_rand(3, 8, dtype=torch.float16), _rand(8, 4, dtype=torch.float16)),
     {"out_dtype": torch.float32}),
    ("attention", lambda: (_rand(1, 5, 4, 16), _rand(1, 7, 2, 16), _rand(1, 7, 2, 16)),
     {"causal": True}),
    ("attention_lse", lambda: (_rand(2, 3, 2, 8), _rand(2, 3, 2, 8), _rand(2, 3, 2, 8)), {}),
    ("attention_backward", lambda: (_rand(1, 5, 4, 16), _rand(1, 7, 2, 16), _rand(1, 7, 2, 16),
                                    _rand(1, 5, 4, 16), torch.randn(1, 4, 5),
                                    _rand(1, 5, 4, 16)), {"causal": True}),
    ("attention_lse", lambda: tuple(torch.randn(1, 6, 2, 8, requires_grad=True)
                                    for _ in range(3)), {}),  # its autograd formula too
    ("softmax", lambda: (_rand(5, 70, dtype=torch.float16),), {}),
    ("gemm_softmax", lambda: (_rand(4, 8), _rand(8, 12), None, 0.25), {}),
]


@pytest.mark.parametrize("name, make, kwargs", OPCHECK_CASES)
def test_opcheck(name, make, kwargs):
    """torch.library.opcheck: the schema, the fake implementation against the (CPU stand-in)
    kernel, and that dynamo / AOT autograd can trace the op."""
    op = getattr(torch.ops.numbatc, name).default
    torch.library.opcheck(op, make(), kwargs)


def test_attention_backward_fake_shapes():
    with FakeTensorMode():
        q = torch.empty(2, 7, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 11, 2, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 8, 7, device="cuda")
        dq, dk, dv = torch.ops.numbatc.attention_backward(q, k, k, q, lse, q, True)
        assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
        assert dq.dtype == dk.dtype == torch.bfloat16 and dv.device.type == "cuda"
        with pytest.raises(RuntimeError, match=r"lse .* must be \(batch, heads_q, seqlen_q\)"):
            torch.ops.numbatc.attention_backward(q, k, k, q, lse.transpose(1, 2), q)


def _plain_attention(q, k, v, causal, scale):
    """(out, lse) with torch's own autograd (float64)."""
    g = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv), torch.logsumexp(s, -1)


@pytest.mark.parametrize("op", ["attention", "attention_lse"])
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_formulas_run_attention_backward(op, causal):
    """loss.backward() through the ops (their CPU stand-ins here) runs the registered formulas,
    which call numbatc::attention_backward: the gradients of q, k, v (GQA) match torch's own
    autograd in float64, through lse too; sum()'s expanded gradient is taken."""
    q, k, v = (torch.randn(*s, dtype=torch.float64, requires_grad=True)
               for s in ((2, 5, 4, 8), (2, 7, 2, 8), (2, 7, 2, 8)))
    w, wl = torch.randn(2, 5, 4, 8, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    if op == "attention":
        loss = (torch.ops.numbatc.attention(q, k, v, causal, 0.3) * w).sum()
    else:
        out, lse = torch.ops.numbatc.attention_lse(q, k, v, causal, 0.3)
        loss = (out * w).sum() + (lse.double() * wl).sum()
    got = torch.autograd.grad(loss, (q, k, v))
    out, lse = _plain_attention(q, k, v, causal, 0.3)
    ref_loss = (out * w).sum() + ((lse * wl).sum() if op == "attention_lse" else 0)
    want = torch.autograd.grad(ref_loss, (q, k, v))
    for g, r in zip(got, want):  # lse is float32: its gradient is rounded once
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(torch.ops.numbatc.attention(q, k, v, causal, None).sum(), (q,))
    want = torch.autograd.grad(_plain_attention(q, k, v, causal, 8 ** -0.5)[0].sum(), (q,))
    torch.testing.assert_close(got[0], want[0])


def test_compile_fullgraph_traces_the_plain_functions():
    """torch.compile(fullgraph=True) of code calling numbatc.gemm / softmax / attention /
    gemm_softmax themselves: dynamo traces them as the ops (no graph break, which fullgraph
    would turn into an error), and the result matches the references."""
    def f(x, w, q, k, v):
        h = numbatc.gemm(x, w.t(), activation="relu", out_dtype="float32")
        p = numbatc.softmax(h.to(torch.bfloat16))
        o = numbatc.attention(q, k, v, causal=True)
        s = numbatc.gemm_softmax(x, w.t(), scale=0.5)
        return h, p, o, s

    args = (_rand(6, 16), _rand(24, 16), _rand(1, 5, 4, 16), _rand(1, 5, 2, 16),
            _rand(1, 5, 2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    got = compiled(*args)
    x, w, q, k, v = args
    want = (_gemm_ref(x, w.t(), activation="relu", out_dtype=torch.float32),
            _softmax_ref(_gemm_ref(x, w.t(), activation="relu", out_dtype=torch.float32)
                         .to(torch.bfloat16)),
            _attention_ref(q, k, v, causal=True), _gemm_softmax_ref(x, w.t(), scale=0.5))
    for g, ref in zip(got, want):
        torch.testing.assert_close(g, ref)


def test_compile_refuses_eager_only_arguments():
    def f(x, w, out):
        return numbatc.gemm(x, w, out=out)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="not traced by torch.compile"):
        torch.compile(f, fullgraph=True, backend="eager")(_rand(2, 8), _rand(8, 4),
                                                          _rand(2, 4))


# ---------------------------------------------------------------------------------------------
# Linear and patch
# ---------------------------------------------------------------------------------------------


class _Scaled(torch.nn.Linear):
    """A subclass of nn.Linear: patch leaves it alone (its forward may differ)."""


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(),
            torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False), _Scaled(32, 8)))
        self.heads = torch.nn.ModuleDict({"head": torch.nn.Linear(8, 4)})

    def forward(self, x):
        return self.heads["head"](self.body(x))


def _model():
    return _Net()


def test_patch_swaps_every_plain_linear_and_shares_parameters():
    model = _model()
    weights = [m.weight for m in model.modules() if type(m) is torch.nn.Linear]
    assert numbatc.torch.patch(model) == 3
    swapped = [m for m in model.modules() if isinstance(m, numbatc.torch.Linear)]
    assert [m.weight for m in swapped] == weights  # the same Parameter objects
    assert all(m.weight is w for m, w in zip(swapped, weights))
    assert type(model.body[2][1]) is _Scaled
    assert numbatc.torch.patch(model) == 0  # nothing left to swap


def test_patch_include_and_verbose(capsys):
    model = _model()
    n = numbatc.torch.patch(model, include=lambda name, m: not name.startswith("heads."),
                            verbose=True)
    assert n == 2
    assert type(model.heads["head"]) is torch.nn.Linear
    err = capsys.readouterr().err
    assert "2 nn.Linear module(s) now run numbatc.gemm" in err and "2 left" in err


def test_patched_model_on_cpu_is_unchanged():
    """Where numbatc cannot run (CPU, float32) the forward is nn.functional.linear."""
    model = _model()
    x = torch.randn(3, 5, 16)
    want = model(x)
    numbatc.torch.patch(model)
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def test_linear_calls_numbatc_gemm(monkeypatch):
    """Where numbatc runs, Linear calls numbatc.gemm(x flattened to 2-D, weight.T (a
    column-major view, no copy), bias) and restores the leading dimensions."""
    calls = []

    def fake_gemm(a, b, bias=None):
        calls.append((a.shape, b.shape, b.stride(), bias is not None))
        return _gemm_ref(a, b, bias=bias)

    monkeypatch.setattr(ntnn, "_numbatc_runs", lambda x, w: True)
    monkeypatch.setattr(numbatc, "gemm", fake_gemm)
    lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
    fast = numbatc.torch.Linear.from_linear(lin)
    x = _rand(2, 3, 16)
    with torch.no_grad():
        y = fast(x)
        want = lin(x)
    assert calls == [((6, 16), (16, 8), (1, 16), True)]
    assert y.shape == (2, 3, 8)
    torch.testing.assert_close(y, want, rtol=1.6e-2, atol=1e-2)


def test_linear_needs_no_grad_for_numbatc():
    lin = numbatc.torch.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    assert not ntnn._numbatc_runs(x, lin.weight)


# ---------------------------------------------------------------------------------------------
# the transformers attention implementation (transformers itself is not needed here)
# ---------------------------------------------------------------------------------------------

from numbatc.torch import transformers_attention as hf  # noqa: E402


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(b=2, hq=8, hk=2, sq=5, sk=5, d=64, dtype=torch.bfloat16):
    return (_rand(b, hq, sq, d, dtype=dtype), _rand(b, hk, sk, d, dtype=dtype),
            _rand(b, hk, sk, d, dtype=dtype))


@pytest.fixture
def on_gpu(monkeypatch):
    """Make CPU tensors count as CUDA ones for why_not, and record numbatc/sdpa calls."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))

    def fake_attention(q, k, v, causal=False, scale=None):
        calls.append(("numbatc", q.shape, k.shape, q.stride(), causal, scale))
        return _attention_ref(q, k, v, causal, scale)

    def fake_sdpa(module, q, k, v, mask, dropout=0.0, scaling=None, **kw):
        calls.append(("sdpa", mask is not None, dropout, kw))
        return q.transpose(1, 2), None

    monkeypatch.setattr(numbatc, "attention", fake_attention)
    monkeypatch.setattr(hf, "_sdpa", fake_sdpa)
    return calls


@pytest.mark.parametrize("sq, sk, causal", [(5, 5, True), (1, 9, False), (7, 7, True)])
def test_transformers_attention_runs_numbatc(on_gpu, sq, sk, causal):
    """transformers' layout (batch, heads, seq, dim) reaches numbatc transposed in place (a
    strided view, no copy); decode (seq_q = 1) is not causal; the output is (b, s, h, d)."""
    q, k, v = _qkv(sq=sq, sk=sk)
    with torch.no_grad():
        out, weights = hf.attention_forward(_Module(), q, k, v, None, dropout=0.0,
                                            scaling=0.125)
    (name, qshape, kshape, qstride, got_causal, scale), = on_gpu
    assert name == "numbatc" and qshape == (2, sq, 8, 64) and kshape == (2, sk, 2, 64)
    assert qstride == (8 * sq * 64, 64, sq * 64, 1)  # q.transpose(1, 2) itself
    assert got_causal is causal and scale == 0.125 and weights is None
    want = _attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, 0.125)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("change, reason", [
    (dict(attention_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool)), "an attention mask"),
    (dict(dropout=0.1), "dropout"),
    (dict(sliding_window=4), "sliding_window"),
    (dict(softcap=30.0), "softcap"),
    (dict(dtype=torch.float32), "dtype"),
    (dict(d=12), "head_dim 12"),
    (dict(sq=3, sk=9), "a causal chunk"),
])
def test_transformers_attention_falls_back_to_sdpa(on_gpu, change, reason):
    change = dict(change)
    mask = change.pop("attention_mask", None)
    dropout = change.pop("dropout", 0.0)
    kwargs = {k: change.pop(k) for k in ("sliding_window", "softcap") if k in change}
    q, k, v = _qkv(**change)
    with torch.no_grad():
        assert reason in hf.why_not(_Module(), q, k, v, mask, dropout, **kwargs)
        hf.attention_forward(_Module(), q, k, v, mask, dropout=dropout, **kwargs)
    assert on_gpu[0][0] == "sdpa"


def test_transformers_attention_cpu_and_grad_fall_back():
    q, k, v = _qkv()
    assert "CUDA" in hf.why_not(_Module(), q, k, v, None)


def test_register_transformers_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="needs transformers"):
        numbatc.torch.register_transformers()
