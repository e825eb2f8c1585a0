"""numbatc.torch on the GPU: torch.compile(fullgraph=True) of code using numbatc (the plain
functions, torch.ops.numbatc, a model patched by numbatc.torch.patch) compiles with no graph
break and matches eager numbatc; mode="reduce-overhead" (CUDA graphs) too."""

import math

import pytest

torch = pytest.importorskip("torch")

import numbatc  # noqa: E402
import numbatc.torch  # noqa: E402

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="torch has no CUDA here")]


def _randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _block(x, w1, b1, w2, q, k, v):
    h = numbatc.gemm(x, w1.t(), bias=b1, activation="gelu")
    y = torch.ops.numbatc.gemm(h, w2.t())
    p = numbatc.softmax(y)
    o = numbatc.attention(q, k, v, causal=True)
    s = numbatc.gemm_softmax(x, w1.t(), scale=0.125)
    return y + 1, p, o * 2, s


def _args():
    return (_randn(48, 256), _randn(512, 256, scale=1 / 16), _randn(512), _randn(256, 512,
            scale=1 / math.sqrt(512)), _randn(2, 64, 8, 64), _randn(2, 64, 2, 64),
            _randn(2, 64, 2, 64))


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_matches_eager(mode):
    torch._dynamo.reset()
    compiled = torch.compile(_block, fullgraph=True, mode=mode)
    for _ in range(3):  # fresh inputs each time; reduce-overhead replays its graph from the 2nd
        args = _args()
        want = _block(*args)
        got = compiled(*args)
        for g, w in zip(got, want):
            g = g.clone()  # reduce-overhead's outputs are overwritten by the next replay
            assert not torch.isnan(g).any()
            # the same kernels on the same inputs: equal up to the split-K order
            torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)


def test_patched_mlp_compiles_and_matches_torch():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(1024, 256)).cuda().to(torch.bfloat16).eval()
    x = _randn(4, 33, 256)
    with torch.no_grad():
        want = model(x).double()
        assert numbatc.torch.patch(model) == 2
        eager = model(x)
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True)(x)
    for y in (eager, got):
        err = ((y.double() - want).abs().max() / want.abs().max()).item()
        assert err < 2e-2, err
    torch.testing.assert_close(got, eager, rtol=1e-2, atol=1e-2)
