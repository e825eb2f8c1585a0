"""CUDA graph capture of numbatc's calls under ``torch.cuda.graph``: numbatc.gemm on each path
(the portable kernel, split-K in both kernels, bias + activation, out given), attention,
softmax and gemm_softmax (fused and the wide-row fallback).

Each case: a warm call on a side stream (compiles, fills the warm-call cache), a capture, then
three replays with fresh random inputs copied into the captured (static) inputs and the output
poisoned with NaN before each replay, each compared against a float64 reference of that replay's
inputs.  A replay that ran the captured kernels on stale inputs or stale workspaces fails.
Plus: what cannot be captured raises numbatc.CaptureError and leaves the capture usable."""

import math

import pytest

torch = pytest.importorskip("torch")

import numbatc  # noqa: E402

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # a CPU build of torch on a GPU machine
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="torch has no CUDA here")]

TOL = {torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def _check(got, ref, dtype, what):
    got = got.double()
    assert not torch.isnan(got).any(), f"{what}: NaN left in the output (kernel did not write)"
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    assert err < TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


def _capture_and_replay(make_inputs, call, reference, dtype, what, poison=None, replays=3):
    """Warm ``call(*static)`` on a side stream, capture it, replay with fresh inputs."""
    static = make_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call(*static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call(*static)
    outs = result if isinstance(result, tuple) else (result,)
    for trial in range(replays):
        fresh = make_inputs()
        for dst, src in zip(static, fresh):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        for o in outs if poison is None else poison(static):
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        refs = reference(*fresh)
        refs = refs if isinstance(refs, tuple) else (refs,)
        for i, (o, r) in enumerate(zip(outs, refs)):
            _check(o, r, dtype, f"{what} replay {trial} output {i}")
    return graph


def _randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


# ---------------------------------------------------------------------------------------------
# numbatc.gemm
# ---------------------------------------------------------------------------------------------

GEMM_CASES = [
    # (m, n, k, extras): M = 16 splits K in sm80_gemm (the case that failed to capture), M = 128
    # at N = 2048 splits K in sm90_gemm on an H200, the rest one block per tile
    (16, 4096, 4096, {}),
    (1, 256, 512, {}),
    (128, 2048, 4096, {}),
    (300, 520, 264, {"bias": True, "activation": "gelu"}),
    (517, 1031, 257, {}),
]


def _gemm_reference(a, b, bias=None, activation=None):
    ref = a.double() @ b.double()
    if bias is not None:
        ref = ref + bias.double()
    if activation == "gelu":
        ref = 0.5 * ref * (1 + torch.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref ** 3)))
    return ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k, extra", GEMM_CASES)
def test_gemm_graph(m, n, k, extra, dtype):
    with_bias, activation = extra.get("bias", False), extra.get("activation")

    def make():
        a = _randn(m, k, dtype=dtype)
        b = _randn(k, n, dtype=dtype, scale=1 / math.sqrt(k))
        bias = _randn(n, dtype=dtype) if with_bias else None
        return (a, b, bias)

    def call(a, b, bias):
        return numbatc.gemm(a, b, bias=bias, activation=activation)

    _capture_and_replay(make, call, lambda a, b, bias: _gemm_reference(a, b, bias, activation),
                        dtype, f"gemm {m}x{n}x{k}")


@pytest.mark.parametrize("config", ["", "sm90:128x256x64_4s_pt_tma", "sm90:128x128x64_4s_w1_tma",
                                    "sm90:128x256x64_3s_pt_tma_ts"])
def test_gemm_graph_operands_made_inside_the_capture(config, monkeypatch):
    """A model's activations are allocated inside the capture (torch's graph pool), at
    addresses no eager call has seen: the TMA kernels' tensor maps for them are made on the host
    and passed by value (intrinsics.grid_constant), so the graph records them with the launch;
    a host copy would invalidate the capture.  Both operands here are made inside the captured
    region."""
    if config:
        monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    m, n, k = 300, 520, 264
    dtype = torch.bfloat16

    def make():
        return (_randn(m, k), _randn(n, k, scale=1 / math.sqrt(k)))

    def call(x, w):
        a = x * 2  # new allocations inside the capture
        b = (w * 0.5).T  # K-major B, as x @ W.T
        return numbatc.gemm(a, b)

    _capture_and_replay(make, call, lambda x, w: _gemm_reference(x * 2, (w * 0.5).T), dtype,
                        f"gemm of captured operands {config or 'default'}")


def _graph_node_kinds(graph):
    """[node type name, ...] of a torch.cuda.CUDAGraph (scripts/diag/graph_nodes.py's count)."""
    from cuda.bindings import driver

    raw = driver.CUgraph(graph.raw_cuda_graph())
    _, _, count = driver.cuGraphGetNodes(raw, 0)
    _, found, count = driver.cuGraphGetNodes(raw, count)
    return [driver.cuGraphNodeGetType(node)[1].name.replace("CU_GRAPH_NODE_TYPE_", "").lower()
            for node in found[:count]]


@pytest.mark.parametrize("config", ["sm90:128x256x64_4s_pt_tma", "sm90:128x256x64_3s_pt_tma_ts"])
def test_captured_tma_gemm_records_its_kernel_only(config, monkeypatch):
    """A captured TMA GEMM into an output first allocated inside the capture (a pointer numbatc
    has not seen, so new tensor maps) records one kernel node: the maps are kernel parameters
    (intrinsics.grid_constant), where a one-block kernel used to be recorded to write each new
    map into device memory.  The replay is checked against float64.  (M > 256: no split-K,
    whose second launch is a kernel of its own.)"""
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", config)
    m, n, k = 520, 384, 512
    a, w = _randn(m, k), _randn(n, k, scale=1 / math.sqrt(k))
    numbatc.gemm(a, w.T)  # compiled and warm before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)  # its nodes stay readable
    with torch.cuda.graph(graph):
        out = numbatc.gemm(a, w.T)
    assert _graph_node_kinds(graph) == ["kernel"], config
    graph.instantiate()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, _gemm_reference(a, w.T), torch.bfloat16, f"captured {config}")


@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (200, 1000, 520)])
def test_gemm_graph_out_given(m, n, k):
    """out= a static tensor written in place by each replay."""
    dtype = torch.bfloat16
    out = torch.empty(m, n, dtype=dtype, device="cuda")

    def make():
        return (_randn(m, k), _randn(k, n, scale=1 / math.sqrt(k)))

    _capture_and_replay(make, lambda a, b: numbatc.gemm(a, b, out=out),
                        lambda a, b: _gemm_reference(a, b), dtype, f"gemm out= {m}x{n}x{k}",
                        poison=lambda static: (out,))


def test_gemm_graph_forced_split_k(monkeypatch):
    """NUMBATC_SPLIT_K forces slices: the captured workspace is torch's, not the eager one."""
    monkeypatch.setenv("NUMBATC_SPLIT_K", "4")
    m, n, k = 48, 768, 2048

    def make():
        return (_randn(m, k), _randn(k, n, scale=1 / math.sqrt(k)))

    graph = _capture_and_replay(make, lambda a, b: numbatc.gemm(a, b),
                                lambda a, b: _gemm_reference(a, b), torch.bfloat16,
                                "gemm split 4")
    # eager calls on the same shape between replays use numbatc's own workspace
    a, b = make()
    _check(numbatc.gemm(a, b), _gemm_reference(a, b), torch.bfloat16, "eager after capture")
    graph.replay()
    torch.cuda.synchronize()


def test_gemm_unaligned_operand_is_packed_inside_the_capture():
    """An operand that must be packed (not 16-byte aligned): for torch inputs the packed copy
    comes from torch's allocator on the capturing stream (dispatch._aligned_view), so the call
    is recorded, and each replay packs the new data."""
    m, n, k = 64, 256, 128

    def make():
        base = _randn(m, k + 2)
        return (base, _randn(k, n, scale=1 / math.sqrt(k)))

    def call(base, b):
        return numbatc.gemm(base[:, 1:k + 1], b)  # start 2 bytes past a 16-byte boundary

    _capture_and_replay(make, call, lambda base, b: _gemm_reference(base[:, 1:k + 1], b),
                        torch.bfloat16, "gemm of a packed operand")


# ---------------------------------------------------------------------------------------------
# attention, softmax, gemm_softmax
# ---------------------------------------------------------------------------------------------


def _attention_reference(q, k, v, causal):
    q, k, v = q.double(), k.double(), v.double()
    hq, hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(hq // hk, dim=2)
    v = v.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d", [(2, 128, 128, 8, 8, 64), (1, 1, 300, 16, 4, 128),
                                                   (2, 77, 200, 4, 2, 96)])
def test_attention_graph(b, sq, sk, hq, hk, d, causal):
    dtype = torch.bfloat16

    def make():
        return (_randn(b, sq, hq, d), _randn(b, sk, hk, d), _randn(b, sk, hk, d))

    _capture_and_replay(make, lambda q, k, v: numbatc.attention(q, k, v, causal=causal),
                        lambda q, k, v: _attention_reference(q, k, v, causal), dtype,
                        f"attention {b}x{sq}x{sk}x{hq}/{hk}x{d}{' causal' if causal else ''}")


@pytest.mark.parametrize("config", ["", "sm90:n128_2s_ov_pp_fx_tma", "sm90:n128_2s_ov_pp_fx_tma_pt",
                                    "sm90:n128_2s_ov_pp_fx", "decode"])
def test_attention_graph_operands_made_inside_the_capture(config, monkeypatch):
    """q, k and v made inside the capture (a model's projections: torch's graph pool, addresses
    no eager call has seen), replayed with fresh inputs, then an eager call and another replay:
    the TMA configurations' tensor maps for captured operands travel by value with the
    recorded launch (intrinsics.grid_constant), where a host copy would invalidate the capture."""
    if config:
        monkeypatch.setenv("NUMBATC_ATTN_KERNEL", config)
    b, sq, sk, hq, hk, d = (2, 1, 2048, 8, 2, 128) if config == "decode" else \
        (2, 200, 333, 8, 2, 128)
    dtype = torch.bfloat16

    def make():
        return (_randn(b, sq, hq, d), _randn(b, sk, hk, d), _randn(b, sk, hk, d))

    def call(q, k, v):
        return numbatc.attention(q * 2, k * 0.5, v + 1, causal=True)

    def reference(q, k, v):
        return _attention_reference(q * 2, k * 0.5, v + 1, True)

    graph = _capture_and_replay(make, call, reference, dtype,
                                f"attention of captured operands {config or 'default'}")
    # eager calls at addresses the capture saw, before and after another replay
    fresh = make()
    _check(numbatc.attention(*fresh, causal=True), _attention_reference(*fresh, True), dtype,
           "eager call after the capture")
    graph.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 70), (64, 1000), (3, 4, 40000)])
def test_softmax_graph(shape, dtype):
    def make():
        return (_randn(*shape, dtype=dtype, scale=3.0),)

    _capture_and_replay(make, numbatc.softmax, lambda x: torch.softmax(x.double(), dim=-1),
                        dtype, f"softmax {shape}")


@pytest.mark.parametrize("m, n, k", [(64, 128, 256), (33, 256, 100), (64, 1000, 128)])
def test_gemm_softmax_graph(m, n, k):
    """N <= 256 is the fused kernel; N = 1000 is numbatc.gemm into float32 + numbatc.softmax."""
    dtype = torch.float16
    scale = 1 / math.sqrt(k)

    def make():
        return (_randn(m, k, dtype=dtype), _randn(k, n, dtype=dtype))

    _capture_and_replay(make, lambda a, b: numbatc.gemm_softmax(a, b, scale=scale),
                        lambda a, b: torch.softmax(scale * (a.double() @ b.double()), dim=-1),
                        dtype, f"gemm_softmax {m}x{n}x{k}")


def test_threads_and_streams_first_calls():
    """8 threads, each on its own torch stream, making their first calls at once (fresh
    shapes, so each compiles or loads): no call is lost and every result is right."""
    import threading

    barrier = threading.Barrier(8)
    errors = []

    def body(t):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                barrier.wait()
                for i in range(6):
                    m = (16, 48, 96, 130, 200, 257)[i]
                    a, b = _randn(m, 512), _randn(512, 384 + 8 * t, scale=1 / math.sqrt(512))
                    out = numbatc.gemm(a, b)
                    x = _randn(m, 100 + t)
                    p = numbatc.softmax(x)
                    stream.synchronize()
                    _check(out, _gemm_reference(a, b), torch.bfloat16, f"thread {t} gemm {m}")
                    _check(p, torch.softmax(x.double(), -1), torch.bfloat16, f"thread {t} sm")
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(f"thread {t}: {exc!r}")

    threads = [threading.Thread(target=body, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
