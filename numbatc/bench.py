"""Benchmarks: ``python -m numbatc.bench gemm [options]``.

For each shape it measures numbatc's GEMM and the reference (cuBLAS through ``torch.matmul``) in
the same run, on the same inputs: the median kernel time over many launches (CUDA events), the
first call (compilation, or loading the on-disk kernel cache, included) and the warm call's host
overhead (time for ``numbatc.gemm`` to return, without waiting for the GPU).  It prints a table,
and writes a CSV and a PNG plot (matplotlib, when installed) where asked.

``--dtype float8_e4m3`` / ``float8_e5m2``: FP8 with per-tensor scales (a row-major, b the
transpose of a row-major weight, bf16 output) against ``torch._scaled_mm`` in the same run.

Shapes: squares 1024..8192 and LLM shapes M in {1, 16, 64, 128, 256, 4096} x (N, K) in
{(4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672)}; ``--shapes decode``: M in {1, 16, 64,
128, 256} x 8192 x 8192 and M in {1, 16} at the two 28672 shapes, with the device's copy
bandwidth measured first (GB/s columns: bytes of a, b and out moved once per call); ``--shapes
llama8b``: Llama-3-8B's qkv, o, gate_up and down projections at M = 4096 tokens
(``quick+llama8b``: both sets in one process).  torch is needed for the inputs and the
reference; it is optional for numbatc itself.

``python -m numbatc.bench attention [--shapes quick] [--csv F] [--png F] [--configs]``: numbatc.attention
against torch's ``scaled_dot_product_attention`` (the fastest of its flash, cuDNN and
memory-efficient backends on each shape, measured in the same run), head_dim 64, 128, 192, 256,
seqlen 512..16384 with batch * seqlen = 16384 tokens and heads * head_dim = 2048, causal and not;
TFLOP/s count 4 * B * H * S^2 * D, halved when causal.  The ``x flash`` column is the ratio to
SDPA's flash backend alone (FlashAttention 2 on mma.sync, the portable kernel's peer).

``python -m numbatc.bench attention-backward [--shapes quick] [--csv F] [--configs]
[--kernel sm80|sm90|sm90-any|both|all]``:
numbatc.attention_backward (dQ, dK, dV from out, lse and dO) against the backward of torch's
``scaled_dot_product_attention`` (``torch.autograd.grad`` of its output; the fastest of its
flash, cuDNN and memory-efficient backends on each shape, same run), on the forward benchmark's
shapes (head_dim 64 and 128); TFLOP/s count the backward's five GEMMs, 10 * B * H * S^2 * D
(2.5 times the forward's), halved when causal.

``python -m numbatc.bench decode [--shapes quick] [--csv F] [--configs]``: numbatc.attention on
decode shapes (the flash-decoding kernel, numbatc.kernels.sm80_decode_attention) against torch
SDPA (fastest backend, GQA through ``enable_gqa`` or expanded K/V): batch 1 / 8 / 32 x seqlen_q
1 / 4 x seqlen_k 4096 .. 131072, 32 query heads over 8 KV heads, head_dim 128, no mask (SDPA's
is_causal aligns top-left, numbatc's bottom-right); the device's copy bandwidth is measured
first and each row gives GB/s of K and V read once and that as % of it.  ``--paged N``:
numbatc.attention_with_kvcache over pages of N rows (shuffled block tables), timed as CUDA graph
replays and back to back, against SDPA on the same keys gathered into a contiguous cache.

``python -m numbatc.bench softmax [--shapes quick] [--csv F]``: numbatc.softmax against
torch.softmax (rows 1024..32768 x row lengths 256..32768; GB/s of one read and one write, ratio),
then numbatc.gemm_softmax against torch.softmax(scale * a @ b) for (M, K, N) in
{4096, 8192, 16384} x 4096 x {128, 256}.

``python -m numbatc.bench epilogue [--shapes quick] [--csv F]``: what a fused user epilogue costs:
numbatc.gemm plain, with a bias + GELU + residual user epilogue (epilogue=...), and with the
built-in bias + gelu, at 4096^3 and 8192^3 in the same run, as overhead % over the plain GEMM; and
torch's unfused gelu(a @ b + bias) + residual for reference.

``python -m numbatc.bench transformers [--shapes quick] [--csv F]``: the prefill of a
random-weight transformers Llama (4 layers, hidden 1024, GQA 16/4, bf16) with every nn.Linear
through numbatc.gemm and attention through numbatc.attention, against the same model in torch
(needs transformers).
"""

import argparse
import csv
import statistics
import sys
import time

SQUARES = [(s, s, s) for s in (1024, 2048, 4096, 8192)]
LLM = [(m, n, k) for (n, k) in ((4096, 4096), (8192, 8192), (28672, 8192), (8192, 28672))
       for m in (1, 16, 64, 128, 256, 4096)]
DECODE = ([(m, 8192, 8192) for m in (1, 16, 64, 128, 256)]
          + [(m, n, k) for (n, k) in ((28672, 8192), (8192, 28672)) for m in (1, 16)])
#: Llama-3-8B's projections at 4096 tokens (M, N, K): qkv, o, gate_up, down.
LLAMA8B = [(4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336)]
SHAPES = {"squares": SQUARES, "llm": LLM, "all": SQUARES + LLM, "decode": DECODE,
          "quick": [(4096, 4096, 4096), (8192, 8192, 8192)], "llama8b": LLAMA8B}
SHAPES["quick+llama8b"] = SHAPES["quick"] + LLAMA8B
#: DeepSeek-V3's dense layers as DeepGEMM benchmarks them (N, K), at M = 64, 128, 4096: for
#: ``--dtype float8_e4m3 --fp8-scales block`` (DeepGEMM's recipe)
DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
               (7168, 2048))
SHAPES["deepseek"] = [(m, n, k) for (n, k) in DEEPSEEK_NK for m in (64, 128, 4096)]
#: The layers of issue 16's shape table, (name, N, K) as x @ W.T: Llama-3-8B (hidden 4096, GQA
#: 32/8, intermediate 14336), Llama-3-70B (hidden 8192, GQA 64/8, intermediate 28672) and a small
#: model (hidden 1024, GQA 16/4, intermediate 2816, a 32000 vocabulary).
TABLE_LAYERS = [("8b.qkv", 6144, 4096), ("8b.o", 4096, 4096), ("8b.gate_up", 28672, 4096),
                ("8b.down", 4096, 14336), ("70b.qkv", 10240, 8192), ("70b.o", 8192, 8192),
                ("70b.gate_up", 57344, 8192), ("70b.down", 8192, 28672),
                ("1k.q_o", 1024, 1024), ("1k.k_v", 256, 1024), ("1k.up", 2816, 1024),
                ("1k.down", 1024, 2816), ("1k.lm_head", 32000, 1024)]
TABLE_M = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: the table's (M, N, K) in (layer, M) order; ``--shapes table`` also writes a ratio heatmap
SHAPES["table"] = [(m, n, k) for _, n, k in TABLE_LAYERS for m in TABLE_M]
SHAPES["table-small"] = [(m, n, k) for _, n, k in TABLE_LAYERS[8:] for m in TABLE_M]
LAYER_OF = {(n, k): name for name, n, k in TABLE_LAYERS}


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total, label):
        self.total, self.label, self.done, self.start = total, label, 0, time.perf_counter()

    def step(self, what):
        self.done += 1
        elapsed = time.perf_counter() - self.start
        bar = "#" * (20 * self.done // self.total)
        line = f"{self.label} [{bar:<20s}] {self.done}/{self.total} {what} ({elapsed:.0f} s)"
        if sys.stderr.isatty():
            print("\r" + line, end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


#: how _time_gpu times a call: "stream" (back-to-back launches) or "graph" (CUDA graph replay);
#: set by ``--timing``
TIMING = "stream"


def _first_call_s(fn, torch):
    """Seconds of one call of ``fn`` from an idle device until its work is done (compiles,
    cache loads and the launch included): the benchmarks' first_call_s."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _time_gpu(fn, torch, reps, warmup=3, min_group=1):
    """Median milliseconds per call of ``fn`` on the current stream, by CUDA events around
    back-to-back calls: each timed group enqueues enough calls to last about a millisecond, so
    the host's time between calls overlaps the GPU's work as it does in a real program (the
    host cost of a call shows only where it exceeds the kernel's; see first_call_s and
    host_overhead_us for it).  Timing one call per event pair after a synchronisation would add
    the call's host time to every figure (docs/PERFORMANCE.md has figures taken that way).

    With ``TIMING == "graph"`` (``--timing graph``) the group of calls is captured once into a
    CUDA graph and the replays are timed: GPU time alone, the host's launch cost removed for
    numbatc and the reference alike (what a serving stack that replays graphs sees).  A call
    that cannot be captured is timed back to back and the row says so (``_time_gpu.fallbacks``).
    ``min_group``: at least this many calls per timed group (a kernel longer than a millisecond
    is otherwise timed one call at a time, each starting on an idle GPU)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if TIMING == "graph":
        try:
            return _time_graph(fn, torch, reps, min_group)
        except Exception as e:  # noqa: BLE001 -- any capture failure: time it back to back
            torch.cuda.synchronize()
            _time_gpu.fallbacks.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    inner = _group_size(start.elapsed_time(end), min_group)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


_time_gpu.fallbacks = []


def _group_size(one_ms, min_group):
    """Calls per timed group: enough to last about a millisecond (one call took ``one_ms``), at
    most 200, at least ``min_group``."""
    return max(min_group, min(200, int(1.0 / max(one_ms, 1e-3))))


def _time_graph(fn, torch, reps, min_group=1):
    """Median milliseconds per call of ``fn`` replayed from a CUDA graph of enough calls to
    last about a millisecond (at most 200; one call first measures how many)."""
    def captured(count):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(count):
                fn()
        graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()
        return graph

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one = captured(1)
    start.record()
    one.replay()
    end.record()
    end.synchronize()
    inner = _group_size(start.elapsed_time(end), min_group)
    graph = captured(inner) if inner > 1 else one
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def bench_gemm(shapes, dtype="bfloat16", reps=20, b_layout="row", fp8_scales="tensor"):
    import torch

    import numbatc

    fp8 = dtype.startswith("float8")
    if fp8:  # per-tensor scales; the reference is torch._scaled_mm (cuBLASLt's FP8 GEMM)
        tdt = {"float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}[dtype]
    else:
        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    progress = Progress(len(shapes), "gemm")
    for m, n, k in shapes:
        if fp8:
            # a row-major, b = w.T of a row-major (n, k) weight: the K-major operands FP8 needs
            a = torch.randn(m, k, device="cuda").to(tdt)
            b = torch.randn(n, k, device="cuda").to(tdt).T
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            sa, sb = 0.5, 0.25
            ta, tb = (torch.tensor(x, device="cuda") for x in (sa, sb))
            if fp8_scales == "block":
                # DeepGEMM's recipe: scale_a (m, ceil(k/128)) M-major, scale_b per 128 x 128;
                # the reference stays the per-tensor _scaled_mm (the same products)
                kb, nb = -(-k // 128), -(-n // 128)
                bsa = (torch.rand(kb, m, device="cuda") + 0.5).T
                bsb = torch.rand(nb, kb, device="cuda") + 0.5
                ours_fn = lambda: numbatc.gemm(a, b, out=out, scale_a=bsa,  # noqa: E731
                                               scale_b=bsb)
            else:
                ours_fn = lambda: numbatc.gemm(a, b, out=out, scale_a=sa,  # noqa: E731
                                               scale_b=sb)
            ref_fn = lambda: torch._scaled_mm(a, b, scale_a=ta, scale_b=tb,  # noqa: E731
                                              out_dtype=torch.bfloat16, out=out)
        else:
            a = torch.randn(m, k, device="cuda", dtype=tdt)
            if b_layout == "col":  # b = w.T of a row-major (n, k) weight, as x @ W.T
                b = torch.randn(n, k, device="cuda", dtype=tdt).T
            else:
                b = torch.randn(k, n, device="cuda", dtype=tdt)
            out = torch.empty(m, n, device="cuda", dtype=tdt)
            sa = sb = 1.0
            ours_fn = lambda: numbatc.gemm(a, b, out=out)  # noqa: E731
            ref_fn = lambda: torch.matmul(a, b, out=out)  # noqa: E731
        first = _first_call_s(ours_fn, torch)
        chosen = _chosen_config(ours_fn)
        if fp8 and fp8_scales == "block":
            fa = bsa.repeat_interleave(128, 1)[:, :k]
            fb = bsb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            ref = (a.float() * fa) @ (b.float() * fb.T)
        else:
            ref = (a.float() @ b.float()) * (sa * sb)
        err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        # host overhead of a warm call: enqueue only
        calls = 50
        t0 = time.perf_counter()
        for _ in range(calls):
            ours_fn()
        host_us = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        r = max(3, min(reps, int(2e12 / max(2 * m * n * k, 1))))
        ours = _time_gpu(ours_fn, torch, r)
        try:
            theirs = _time_gpu(ref_fn, torch, r)
        except RuntimeError as exc:  # e.g. _scaled_mm's own shape rules (dims multiples of 16)
            print(f"reference failed at {m}x{n}x{k}: {exc}", file=sys.stderr)
            theirs = float("nan")
        flops = 2.0 * m * n * k
        # bytes that must move at least once: a, b read, out written (decode shapes: b's)
        moved = (m * k * a.element_size() + k * n * b.element_size()
                 + m * n * out.element_size())
        rows.append(dict(m=m, n=n, k=k, dtype=dtype + ("/block" if fp8 and fp8_scales == "block"
                                                       else ""),
                         numbatc_ms=ours, cublas_ms=theirs,
                         numbatc_gbs=moved / ours / 1e6, cublas_gbs=moved / theirs / 1e6,
                         numbatc_tflops=flops / ours / 1e9, cublas_tflops=flops / theirs / 1e9,
                         ratio=theirs / ours, first_call_s=first, host_overhead_us=host_us,
                         max_rel_err=err, config=chosen))
        progress.step(f"{m}x{n}x{k}: {rows[-1]['ratio']:.2f}x cuBLAS")
        a = b = out = ref = ours_fn = ref_fn = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    return rows


def _chosen_config(fn):
    """What numbatc.gemm ran for ``fn``'s call ("sm90_gemm 128x256x64_4s_pt_tma", plus a split-K
    note): one call with NUMBATC_PRINT_CONFIG set, its stderr lines read back."""
    import io
    import os

    saved, sys.stderr = sys.stderr, io.StringIO()
    os.environ["NUMBATC_PRINT_CONFIG"] = "1"
    try:
        fn()
    finally:
        os.environ.pop("NUMBATC_PRINT_CONFIG", None)
        text, sys.stderr = sys.stderr.getvalue(), saved
    picked = []
    for line in text.splitlines():
        if line.startswith("numbatc.gemm M="):
            picked.append(" ".join(line.split(": ", 1)[1].split()[:2]))
        elif line.startswith("numbatc.gemm: split-K"):
            picked.append("split " + line.split("split-K, ", 1)[1].split(" slices")[0])
    return " ".join(picked)


def copy_bandwidth(torch, nbytes=2**30, reps=10):
    """GB/s of a device-to-device copy of ``nbytes`` (read + write counted), the memory-bound
    ceiling the decode shapes are held against."""
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = _time_gpu(lambda: y.copy_(x), torch, reps)
    return 2 * nbytes / ms / 1e6


def print_table(rows):
    head = (f"{'M':>6} {'N':>6} {'K':>6}  {'numbatc TF/s':>12} {'cuBLAS TF/s':>11} {'ratio':>6}"
            f"  {'numbatc GB/s':>12} {'cuBLAS GB/s':>11}"
            f"  {'first call s':>12} {'host us':>8} {'max rel err':>11}  config")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['m']:>6} {r['n']:>6} {r['k']:>6}  {r['numbatc_tflops']:>12.1f} "
              f"{r['cublas_tflops']:>11.1f} {r['ratio']:>6.2f}  {r['numbatc_gbs']:>12.0f} "
              f"{r['cublas_gbs']:>11.0f}  {r['first_call_s']:>12.2f} "
              f"{r['host_overhead_us']:>8.1f} {r['max_rel_err']:>11.2e}  {r.get('config', '')}")


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _grid(rows):
    """(layer names, Ms, {(layer, m): ratio}) of the table shapes among ``rows``."""
    cells = {(LAYER_OF[(r["n"], r["k"])], r["m"]): r["ratio"] for r in rows
             if (r["n"], r["k"]) in LAYER_OF}
    layers = [name for name, _, _ in TABLE_LAYERS if any(c[0] == name for c in cells)]
    ms = [m for m in TABLE_M if any(c[1] == m for c in cells)]
    return layers, ms, cells


def print_ratio_grid(rows):
    """The table's ratios (numbatc / reference) as a grid: a row per layer, a column per M."""
    layers, ms, cells = _grid(rows)
    print("\nratio to the reference, by layer (rows) and M (columns)")
    print(f"{'layer':>12} " + " ".join(f"{m:>5}" for m in ms))
    for name in layers:
        print(f"{name:>12} " + " ".join(f"{cells.get((name, m), float('nan')):>5.2f}" for m in ms))
    worst = min(cells.values()) if cells else float("nan")
    print(f"min {worst:.2f}; cells >= 1.0: {sum(v >= 1.0 for v in cells.values())}/{len(cells)}")


def write_heatmap(rows, path, dtype):
    """A heatmap PNG of the ratio by (layer, M) to ``path`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no heatmap written", file=sys.stderr)
        return
    layers, ms, cells = _grid(rows)
    grid = [[cells.get((name, m), float("nan")) for m in ms] for name in layers]
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(ms), 1.0 + 0.42 * len(layers)))
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(ms)), [str(m) for m in ms])
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("M (tokens)")
    ref = "torch._scaled_mm" if dtype.startswith("float8") else "cuBLAS (torch.matmul)"
    ax.set_title(f"numbatc.gemm / {ref}, {dtype}", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"heatmap written to {path}", file=sys.stderr)


def write_png(rows, path):
    write_bars(rows, path, [f"{r['m']}x{r['n']}x{r['k']}" for r in rows], "cublas_tflops",
               "cuBLAS (torch)")


def write_bars(rows, path, labels, ref_key, ref_label):
    """A bar plot of numbatc's TFLOP/s beside the reference's (``ref_key``) per row, written to
    ``path`` (needs matplotlib; says so and writes nothing without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.45), 4))
    ax.bar([i - 0.2 for i in x], [r["numbatc_tflops"] for r in rows], 0.4, label="numbatc")
    ax.bar([i + 0.2 for i in x], [r[ref_key] for r in rows], 0.4, label=ref_label)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=70, fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------------------------
# attention: numbatc.attention against torch's scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------

#: (head_dim, seqlen): batch * seqlen = 16384 tokens, heads * head_dim = 2048.
ATTENTION_SHAPES = {
    "all": [(d, s) for d in (64, 96, 128, 192, 256)
            for s in (512, 1024, 2048, 4096, 8192, 16384)],
    "quick": [(d, s) for d in (64, 128) for s in (1024, 4096)],
    "large": [(d, s) for d in (96, 192, 256) for s in (1024, 4096, 16384)],  # issue 17's new ones
    # the portable kernel's head dims (issue 22): NUMBATC_ATTN_KERNEL=sm80, the x flash column
    "portable": [(d, s) for d in (64, 128, 256) for s in (1024, 4096)],
    # one head dim each: NUMBATC_ATTN_KERNEL=sm90:<config> names a configuration of that head dim
    # (head_dim 96: 21 heads, 2016 columns)
    "hd64": [(64, s) for s in (1024, 2048, 4096, 16384)],
    "hd128": [(128, s) for s in (1024, 2048, 4096, 16384)],
    "hd96": [(96, s) for s in (1024, 4096, 16384)],
    "hd192": [(192, s) for s in (1024, 4096, 16384)],
    "hd256": [(256, s) for s in (1024, 4096, 16384)],
}


def _sdpa_backends(torch):
    """(name, context manager factory) for each SDPA backend this torch has; the fastest one that
    runs a shape is the reference."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # old torch: its own choice only
        import contextlib

        return [("default", contextlib.nullcontext)]
    names = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
    return [(n.lower(), lambda b=getattr(SDPBackend, n): sdpa_kernel(b))
            for n in names if hasattr(SDPBackend, n)]


def bench_attention(shapes, dtype="bfloat16", reps=20, causal_modes=(False, True)):
    """numbatc.attention and torch SDPA (its fastest backend) on (batch, seqlen, heads, head_dim)
    inputs; TFLOP/s count 4 * B * H * S * S * D (half of it when causal)."""
    import torch
    import torch.nn.functional as F

    import numbatc

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    cases = [(d, s, c) for d, s in shapes for c in causal_modes]
    progress = Progress(len(cases), "attention")
    for d, s, causal in cases:
        b, h = max(1, 16384 // s), max(1, 2048 // d)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=tdt) for _ in range(3))
        out = torch.empty_like(q)
        first = _first_call_s(lambda: numbatc.attention(q, k, v, causal=causal, out=out), torch)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (B, H, S, D), same memory
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        r = max(3, min(reps, int(4e13 / flops)))
        ours = _time_gpu(lambda: numbatc.attention(q, k, v, causal=causal, out=out), torch, r)
        theirs, backend, ref, flash = float("inf"), "none", None, float("nan")
        for name, context in _sdpa_backends(torch):
            try:
                with context():
                    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    ms = _time_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                   torch, r)
            except RuntimeError:  # this backend does not take the shape
                continue
            if name == "flash_attention":
                flash = ms
            if ms < theirs:
                theirs, backend = ms, name
        err = float("nan") if ref is None else (out - ref.transpose(1, 2)).abs().max().item()
        ran = _chosen_attention(lambda: numbatc.attention(q, k, v, causal=causal, out=out))
        # ratio_flash: against SDPA's flash backend alone (FlashAttention 2, mma.sync: the
        # portable kernel's peer; the fastest backend on Hopper is usually cuDNN's wgmma kernel)
        rows.append(dict(batch=b, seqlen=s, heads=h, head_dim=d, causal=causal, dtype=dtype,
                         numbatc_ms=ours, ref_ms=theirs, numbatc_tflops=flops / ours / 1e9,
                         ref_tflops=flops / theirs / 1e9, ratio=theirs / ours, ref_backend=backend,
                         ratio_flash=flash / ours, first_call_s=first, max_abs_err=err,
                         config=ran))
        progress.step(f"d={d} s={s}{' causal' if causal else ''}: {rows[-1]['ratio']:.2f}x SDPA ({backend})")
        q = k = v = out = qt = kt = vt = ref = None
        torch.cuda.empty_cache()
    return rows


#: (head_dim, shortest, longest) of the varlen benchmark: sequences of seeded random lengths in
#: [shortest, longest], as many as fit 16384 tokens, packed; heads * head_dim = 2048
VARLEN_SHAPES = {
    "all": [(d, lo, hi) for d in (64, 128) for lo, hi in ((64, 1024), (512, 4096), (2048, 8192))],
    "quick": [(d, 512, 4096) for d in (64, 128)],
}


def varlen_lengths(shortest, longest, total=16384, seed=0):
    """Sequence lengths drawn uniformly from [shortest, longest] (seeded) while they fit
    ``total`` tokens (at least one sequence)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lens = [int(rng.integers(shortest, longest + 1))]
    while True:
        n = int(rng.integers(shortest, longest + 1))
        if sum(lens) + n > total:
            return lens
        lens.append(n)


def _torch_varlen(torch):
    """torch's own varlen attention (``torch.nn.attention.varlen.varlen_attn``, FlashAttention
    underneath) as ``fn(q, k, v, cu_q, cu_k, max_q, max_k, causal)``, or None where this torch
    has none.  Its causal flag was ``is_causal`` at first and ``window_size=(-1, 0)`` later."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        return lambda q, k, v, cq, ck, mq, mk, causal: varlen_attn(q, k, v, cq, ck, mq, mk,
                                                                   is_causal=causal)
    return lambda q, k, v, cq, ck, mq, mk, causal: varlen_attn(
        q, k, v, cq, ck, mq, mk, window_size=(-1, 0) if causal else (-1, -1))


def bench_varlen(shapes, dtype="bfloat16", reps=20, causal_modes=(False, True)):
    """numbatc.attention_varlen against torch's varlen attention (``_torch_varlen``) on the same
    packed sequences (each sequence's queries and keys the same length); TFLOP/s count the work
    of the real rows only: 4 * H * D * sum(L * L) (sum(L * (L + 1) / 2) when causal).  Each
    numbatc call reads the prefix sums back and checks them while its kernel runs (see
    numbatc.attention_varlen), which back-to-back timing includes; ``--timing graph`` leaves it
    out (no check under capture)."""
    import numpy as np
    import torch

    import numbatc

    ref_fn = _torch_varlen(torch)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    cases = [(d, lo, hi, c) for d, lo, hi in shapes for c in causal_modes]
    progress = Progress(len(cases), "attention varlen")
    for d, lo, hi, causal in cases:
        lens = varlen_lengths(lo, hi)
        h, total, longest = max(1, 2048 // d), sum(lens), max(lens)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=tdt) for _ in range(3))
        out = torch.empty_like(q)

        def ours_call():
            numbatc.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal, out=out)

        first = _first_call_s(ours_call, torch)
        pairs = sum(n * (n + 1) / 2 if causal else n * n for n in lens)
        flops = 4.0 * h * d * pairs
        r = max(3, min(reps, int(4e13 / flops)))
        ours = _time_gpu(ours_call, torch, r)
        theirs, backend, err = float("nan"), "none", float("nan")
        if ref_fn is not None:
            try:
                ref = ref_fn(q, k, v, cu, cu, longest, longest, causal)
                ref = ref[0] if isinstance(ref, tuple) else ref
                theirs = _time_gpu(lambda: ref_fn(q, k, v, cu, cu, longest, longest, causal),
                                   torch, r)
                backend, err = "varlen_attn", (out - ref).abs().max().item()
            except (RuntimeError, TypeError) as e:  # this torch's varlen_attn refused the case
                backend = f"varlen_attn: {type(e).__name__}"
        rows.append(dict(sequences=len(lens), tokens=total, shortest=min(lens), longest=longest,
                         heads=h, head_dim=d, causal=causal, dtype=dtype, numbatc_ms=ours,
                         ref_ms=theirs, numbatc_tflops=flops / ours / 1e9,
                         ref_tflops=flops / theirs / 1e9, ratio=theirs / ours,
                         ref_backend=backend, first_call_s=first, max_abs_err=err))
        progress.step(f"d={d} lengths {lo}..{hi}{' causal' if causal else ''}: "
                      f"{rows[-1]['ratio']:.2f}x {backend}")
        q = k = v = out = ref = None
        torch.cuda.empty_cache()
    return rows


def main_varlen(args):
    """``python -m numbatc.bench varlen``: the sweep, then the table (and --csv)."""
    rows = bench_varlen(VARLEN_SHAPES[args.shapes], args.dtype, args.reps)
    _table(rows, [("sequences", "seqs", "d"), ("tokens", "tokens", "d"),
                  ("shortest", "shortest", "d"), ("longest", "longest", "d"),
                  ("head_dim", "D", "d"), ("causal", "causal", ""),
                  ("numbatc_tflops", "numbatc TF/s", ".1f"), ("ref_tflops", "torch TF/s", ".1f"),
                  ("ratio", "ratio", ".2f"), ("ref_backend", "reference", ""),
                  ("first_call_s", "first call s", ".2f"), ("max_abs_err", "max abs err", ".2e")])
    if args.csv:
        write_csv(rows, args.csv)
    return 0


#: (head_dim, seqlen) of the backward benchmark: batch * seqlen = 16384, heads * head_dim = 2048
ATTENTION_BACKWARD_SHAPES = {
    "all": [(d, s) for d in (64, 128) for s in (1024, 2048, 4096, 8192, 16384)],
    "quick": [(d, s) for d in (64, 128) for s in (1024, 4096)],
}


def bench_attention_backward(shapes, dtype="bfloat16", reps=20, causal_modes=(False, True),
                             deterministic=True):
    """numbatc.attention_backward and the backward of torch SDPA (its fastest backend) on
    (batch, seqlen, heads, head_dim) inputs: the same q, k, v, and dO; ours from numbatc's
    forward's out and lse, SDPA's through autograd (``torch.autograd.grad`` with retain_graph:
    the backward alone is timed).  max_abs_err: dq, dk, dv against SDPA's."""
    import torch
    import torch.nn.functional as F

    import numbatc

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    cases = [(d, s, c) for d, s in shapes for c in causal_modes]
    progress = Progress(len(cases), "attention backward")
    for d, s, causal in cases:
        b, h = max(1, 16384 // s), max(1, 2048 // d)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=tdt) for _ in range(4))
        out, lse = numbatc.attention(q, k, v, causal=causal, return_lse=True)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))

        def ours_call():
            numbatc.attention_backward(q, k, v, out, lse, do, causal=causal, dq=grads[0],
                                       dk=grads[1], dv=grads[2], deterministic=deterministic)

        first = _first_call_s(ours_call, torch)
        flops = 10.0 * b * h * s * s * d / (2 if causal else 1)
        r = max(3, min(reps, int(4e13 / flops)))
        ours = _time_gpu(ours_call, torch, r)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)
        theirs, backend, ref = float("inf"), "none", None
        for name, context in _sdpa_backends(torch):
            try:
                with context():
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    ref = torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
                    ms = _time_gpu(lambda: torch.autograd.grad(o, (qt, kt, vt), dot,
                                                               retain_graph=True), torch, r)
            except RuntimeError:  # this backend does not take the shape
                continue
            if ms < theirs:
                theirs, backend = ms, name
            o = None
        err = float("nan") if ref is None else max(
            (g - x.transpose(1, 2)).abs().max().item() for g, x in zip(grads, ref))
        rows.append(dict(batch=b, seqlen=s, heads=h, head_dim=d, causal=causal, dtype=dtype,
                         numbatc_ms=ours, ref_ms=theirs, numbatc_tflops=flops / ours / 1e9,
                         ref_tflops=flops / theirs / 1e9, ratio=theirs / ours, ref_backend=backend,
                         first_call_s=first, max_abs_err=err))
        progress.step(f"d={d} s={s}{' causal' if causal else ''}: {rows[-1]['ratio']:.2f}x SDPA "
                      f"backward ({backend})")
        q = k = v = do = out = lse = grads = qt = kt = vt = dot = ref = None
        torch.cuda.empty_cache()
    return rows


def main_attention_backward(args):
    """``python -m numbatc.bench attention-backward``: the sweep, then the table (and --csv).
    ``--kernel sm80 | sm90 | sm90-any | both | all`` forces the kernel family
    (NUMBATC_ATTN_BWD_KERNEL) for the sweep (sm90-any: the Hopper kernel with
    deterministic=False); ``both`` runs sm80 and sm90, ``all`` those and sm90-any, one sweep
    each, each row naming its kernel, SDPA timed in each."""
    import os

    shapes = ATTENTION_BACKWARD_SHAPES.get(args.shapes, ATTENTION_BACKWARD_SHAPES["all"])
    kernels = {"default": (None,), "both": ("sm80", "sm90"),
               "all": ("sm80", "sm90", "sm90-any")}.get(args.kernel, (args.kernel,))
    rows = []
    for kernel in kernels:
        if kernel is not None:
            os.environ["NUMBATC_ATTN_BWD_KERNEL"] = kernel.split("-")[0]
        for row in bench_attention_backward(shapes, args.dtype, args.reps,
                                            deterministic=kernel != "sm90-any"):
            row["kernel"] = kernel or "default"
            rows.append(row)
        os.environ.pop("NUMBATC_ATTN_BWD_KERNEL", None)
    if args.configs:
        from numbatc.kernels.sm80_attention_backward import CONFIGS

        for name in CONFIGS:
            os.environ["NUMBATC_ATTN_BWD_CONFIG"] = name
            for row in bench_attention_backward(shapes, args.dtype, args.reps):
                row["config"] = name
                rows.append(row)
        os.environ.pop("NUMBATC_ATTN_BWD_CONFIG")
    print_attention_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


#: decode shapes (batch, seqlen_q, seqlen_k); 32 query heads over 8 KV heads, head_dim 128
DECODE_ATTENTION_SHAPES = {
    "all": [(b, sq, sk) for b in (1, 8, 32) for sq in (1, 4)
            for sk in (4096, 16384, 65536, 131072)],
    "quick": [(1, 1, 32768), (8, 1, 8192), (32, 4, 4096)],
}


def bench_decode(shapes, dtype="bfloat16", reps=20, heads=(32, 8), head_dim=128,
                 max_bytes=24e9):
    """numbatc.attention and torch SDPA (its fastest backend) on decode shapes; GB/s count K
    and V once (2 * B * Sk * Hkv * D * element size); shapes whose K and V exceed
    ``max_bytes`` are skipped."""
    import torch
    import torch.nn.functional as F

    import numbatc

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    hq, hkv = heads
    gqa = _sdpa_takes_gqa(torch, F)
    rows = []
    progress = Progress(len(shapes), "decode")
    for b, sq, sk in shapes:
        kv_bytes = 2 * b * sk * hkv * head_dim * 2
        if kv_bytes > max_bytes:
            progress.step(f"b={b} sq={sq} sk={sk}: skipped ({kv_bytes / 1e9:.0f} GB of K and V)")
            continue
        q = torch.randn(b, sq, hq, head_dim, device="cuda", dtype=tdt)
        k, v = (torch.randn(b, sk, hkv, head_dim, device="cuda", dtype=tdt) for _ in range(2))
        out = torch.empty_like(q)
        first = _first_call_s(lambda: numbatc.attention(q, k, v, out=out), torch)
        config = _chosen_attention(lambda: numbatc.attention(q, k, v, out=out))
        ours = _time_gpu(lambda: numbatc.attention(q, k, v, out=out), torch, reps)
        theirs, backend, ref = _sdpa_decode(q, k, v, gqa, reps)
        err = float("nan") if ref is None else (out - ref.transpose(1, 2)).abs().max().item()
        rows.append(dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv,
                         head_dim=head_dim, dtype=dtype, numbatc_ms=ours, ref_ms=theirs,
                         numbatc_gbs=kv_bytes / ours / 1e6, ref_gbs=kv_bytes / theirs / 1e6,
                         ratio=theirs / ours, ref_backend=backend, first_call_s=first,
                         max_abs_err=err, config=config))
        progress.step(f"b={b} sq={sq} sk={sk}: {rows[-1]['numbatc_gbs']:.0f} GB/s, "
                      f"{rows[-1]['ratio']:.2f}x SDPA ({backend})")
        q = k = v = out = ref = None
        torch.cuda.empty_cache()
    return rows


def _sdpa_decode(q, k, v, gqa, reps):
    """(ms, backend, output in SDPA's (B, H, Sq, D)) of torch SDPA's fastest backend on q
    (B, Sq, Hq, D) against contiguous k, v (B, Sk, Hkv, D); (inf, 'none', None) where none
    takes the shape."""
    import torch
    import torch.nn.functional as F

    hq, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (B, H, S, D), same memory
    extra = {"enable_gqa": True} if gqa else {}
    if not gqa:  # an old torch: K and V expanded to every query head (not timed)
        kt, vt = (x.repeat_interleave(hq // hkv, dim=1) for x in (kt, vt))
    theirs, backend, ref = float("inf"), "none", None
    for name, context in _sdpa_backends(torch):
        try:
            with context():
                out = F.scaled_dot_product_attention(qt, kt, vt, **extra)
                ms = _time_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt, **extra),
                               torch, reps)
        except RuntimeError:  # this backend does not take the shape
            continue
        ref = out
        if ms < theirs:
            theirs, backend = ms, name
    return theirs, backend, ref


def bench_decode_paged(shapes, page_size, dtype="bfloat16", reps=20, heads=(32, 8),
                       head_dim=128, max_bytes=24e9):
    """numbatc.attention_with_kvcache on decode shapes over a paged cache (``page_size`` rows a
    page, every sequence's pages shuffled over the pool, cache_seqlens = seqlen_k), timed as a
    serving stack that replays graphs runs it: the call captured once in a CUDA graph and the
    graph replayed.  The row's ``eager_ms`` times the same warm calls back to back (each reads
    cache_seqlens and the block table back to the host and checks them while its kernels run,
    so the host waits for the previous call's kernels: what an eager loop pays).  Reference:
    torch SDPA's fastest backend on the same keys gathered into a contiguous cache (the gather
    not timed).  GB/s count K and V once."""
    import torch
    import torch.nn.functional as F

    import numbatc

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    hq, hkv = heads
    gqa = _sdpa_takes_gqa(torch, F)
    rows = []
    progress = Progress(len(shapes), f"decode paged {page_size}")
    for b, sq, sk in shapes:
        kv_bytes = 2 * b * sk * hkv * head_dim * 2
        if 2 * kv_bytes > max_bytes:  # the pages and the gathered copy
            progress.step(f"b={b} sq={sq} sk={sk}: skipped ({kv_bytes / 1e9:.0f} GB of K and V)")
            continue
        blocks = -(-sk // page_size)
        q = torch.randn(b, sq, hq, head_dim, device="cuda", dtype=tdt)
        kp, vp = (torch.randn(b * blocks, page_size, hkv, head_dim, device="cuda", dtype=tdt)
                  for _ in range(2))
        table = torch.randperm(b * blocks, device="cuda").to(torch.int32).view(b, blocks)
        seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)

        def call():
            numbatc.attention_with_kvcache(q, kp, vp, seqlens, block_table=table, out=out)

        first = _first_call_s(call, torch)
        config = _chosen_attention(call)
        eager = _time_gpu(call, torch, reps)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # warm on a side stream before capturing, as torch asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        ours = _time_gpu(graph.replay, torch, reps)
        graph.replay()
        kc, vc = (x[table.long()].reshape(b, blocks * page_size, hkv, head_dim)[:, :sk]
                  for x in (kp, vp))
        theirs, backend, ref = _sdpa_decode(q, kc, vc, gqa, reps)
        torch.cuda.synchronize()
        err = float("nan") if ref is None else (out - ref.transpose(1, 2)).abs().max().item()
        rows.append(dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv,
                         head_dim=head_dim, dtype=dtype, page_size=page_size, numbatc_ms=ours,
                         ref_ms=theirs, numbatc_gbs=kv_bytes / ours / 1e6,
                         ref_gbs=kv_bytes / theirs / 1e6, ratio=theirs / ours,
                         ref_backend=backend, first_call_s=first, eager_ms=eager,
                         max_abs_err=err, config=f"{config} paged{page_size}"))
        progress.step(f"b={b} sq={sq} sk={sk}: {rows[-1]['numbatc_gbs']:.0f} GB/s, "
                      f"{rows[-1]['ratio']:.2f}x SDPA ({backend}), back to back "
                      f"{1e3 * eager:.0f} us")
        q = kp = vp = kc = vc = out = ref = graph = None
        torch.cuda.empty_cache()
    return rows


def _sdpa_takes_gqa(torch, F):
    """Whether this torch's SDPA takes ``enable_gqa`` (torch >= 2.5), by a tiny call: it is a
    builtin, which inspect.signature cannot read."""
    q = torch.zeros(1, 2, 1, 8, device="cuda", dtype=torch.float16)
    kv = torch.zeros(1, 1, 1, 8, device="cuda", dtype=torch.float16)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


def _chosen_attention(fn):
    """What numbatc.attention ran for ``fn``'s call: the kernel, configuration and splits from
    its NUMBATC_PRINT_CONFIG line."""
    import io
    import os

    saved, sys.stderr = sys.stderr, io.StringIO()
    os.environ["NUMBATC_PRINT_CONFIG"] = "1"
    try:
        fn()
    finally:
        os.environ.pop("NUMBATC_PRINT_CONFIG", None)
        text, sys.stderr = sys.stderr.getvalue(), saved
    for line in text.splitlines():
        if line.startswith("numbatc.attention B="):
            words = line.split(": ", 1)[1].split()
            splits = line.split("m block(s), ", 1)[1].split(" split(s)")[0] if "split(s)" in line else ""
            return " ".join(words[:2]) + (f" x{splits}" if splits else "")
    return ""


def print_decode_table(rows, copy_gbs):
    head = (f"{'B':>3} {'Sq':>3} {'Sk':>7} {'Hq/Hkv':>6} {'D':>4}  {'numbatc us':>10} "
            f"{'GB/s':>6} {'% copy':>6}  {'SDPA us':>8} {'GB/s':>6} {'ratio':>6}  "
            f"{'SDPA backend':>19} {'max abs err':>11}  config")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['batch']:>3} {r['seqlen_q']:>3} {r['seqlen_k']:>7} "
              f"{str(r['heads_q']) + '/' + str(r['heads_kv']):>6} {r['head_dim']:>4}  "
              f"{1e3 * r['numbatc_ms']:>10.1f} {r['numbatc_gbs']:>6.0f} "
              f"{100 * r['numbatc_gbs'] / copy_gbs:>5.0f}%  {1e3 * r['ref_ms']:>8.1f} "
              f"{r['ref_gbs']:>6.0f} {r['ratio']:>6.2f}  {r['ref_backend']:>19} "
              f"{r['max_abs_err']:>11.2e}  {r['config']}"
              + (f", back to back {1e3 * r['eager_ms']:.1f} us ({r['ref_ms'] / r['eager_ms']:.2f}x)"
                 if "eager_ms" in r else ""))


def main_decode(args):
    """``python -m numbatc.bench decode``: the copy bandwidth, the sweep, the table (--csv);
    ``--configs`` also times every decode configuration (NUMBATC_ATTN_KERNEL=decode:<name>)
    whose shared memory fits."""
    import os

    import torch

    copy_gbs = copy_bandwidth(torch)
    print(f"device copy bandwidth: {copy_gbs:.0f} GB/s (read + write of 1 GiB)", flush=True)
    shapes = DECODE_ATTENTION_SHAPES[args.shapes]
    if args.paged:
        rows = bench_decode_paged(shapes, args.paged, args.dtype, args.reps)
        if args.configs:
            raise SystemExit("--configs times numbatc.attention's configurations; drop --paged")
    else:
        rows = bench_decode(shapes, args.dtype, args.reps)
    if args.configs:
        from numbatc.kernels import sm80_decode_attention as decode

        var = decode.DecodeVariant(128, args.dtype, False, False)
        for name, cfg in decode.CONFIGS.items():
            if decode.shared_bytes(cfg, var) > 227 * 1024:
                continue
            os.environ["NUMBATC_ATTN_KERNEL"] = f"decode:{name}"
            for row in bench_decode(shapes, args.dtype, args.reps):
                rows.append(row)
        os.environ.pop("NUMBATC_ATTN_KERNEL")
    for r in rows:
        r["copy_gbs"] = copy_gbs
    print_decode_table(rows, copy_gbs)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


def print_attention_table(rows):
    head = (f"{'B':>4} {'S':>6} {'H':>4} {'D':>4} {'causal':>6}  {'numbatc TF/s':>12} "
            f"{'SDPA TF/s':>9} {'ratio':>6}  {'SDPA backend':>19} {'x flash':>7} "
            f"{'first call s':>12} "
            f"{'max abs err':>11}  config")
    print(head)
    print("-" * len(head))
    for r in rows:
        flash = r.get("ratio_flash")  # (the backward's rows have none)
        print(f"{r['batch']:>4} {r['seqlen']:>6} {r['heads']:>4} {r['head_dim']:>4} "
              f"{str(r['causal']):>6}  {r['numbatc_tflops']:>12.1f} {r['ref_tflops']:>9.1f} "
              f"{r['ratio']:>6.2f}  {r['ref_backend']:>19} "
              f"{'-' if flash is None else format(flash, '.2f'):>7} "
              f"{r['first_call_s']:>12.2f} "
              f"{r['max_abs_err']:>11.2e}  {r.get('config', '')}"
              f"{' ' + r['kernel'] if r.get('kernel', 'default') != 'default' else ''}")


def write_attention_png(rows, path):
    write_bars(rows, path,
               [f"d{r['head_dim']} s{r['seqlen']}{' c' if r['causal'] else ''}" for r in rows],
               "ref_tflops", "torch SDPA (fastest)")


def main_attention(args):
    """``python -m numbatc.bench attention``: the sweep, then the table (and --csv / --png)."""
    import os

    shapes = ATTENTION_SHAPES.get(args.shapes, ATTENTION_SHAPES["all"])
    rows = bench_attention(shapes, args.dtype, args.reps)
    if args.configs:
        from numbatc.kernels.sm80_attention import CONFIGS

        for name in CONFIGS:
            os.environ["NUMBATC_ATTN_CONFIG"] = name
            for row in bench_attention(shapes, args.dtype, args.reps):
                row["config"] = name
                rows.append(row)
        os.environ.pop("NUMBATC_ATTN_CONFIG")
    print_attention_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    if args.png:
        write_attention_png(rows, args.png)
    return 0


# ---------------------------------------------------------------------------------------------
# softmax and the epilogue's cost
# ---------------------------------------------------------------------------------------------

SOFTMAX_SHAPES = {
    "all": [(r, n) for n in (256, 1024, 4096, 16384) for r in (1024, 4096, 16384, 32768)]
    + [(1024, 32768), (4096, 32768), (8, 1 << 20)],
    "quick": [(4096, 1024), (16384, 4096), (4096, 32768)],
}
GEMM_SOFTMAX_SHAPES = {
    "all": [(m, 4096, n) for n in (128, 256) for m in (4096, 8192, 16384)],
    "quick": [(8192, 4096, 128), (16384, 4096, 256)],
}
EPILOGUE_SHAPES = {"all": [(4096,) * 3, (8192,) * 3], "quick": [(4096,) * 3]}


def _table(rows, columns):
    """Print ``rows`` (dicts) as a table of ``columns``: (key, header, format)."""
    widths = [max(len(h), 10) for _, h, _ in columns]
    print("  ".join(f"{h:>{w}}" for (_, h, _), w in zip(columns, widths)))
    print("-" * (sum(widths) + 2 * len(widths)))
    for r in rows:
        print("  ".join(f"{format(r[k], f):>{w}}" for (k, _, f), w in zip(columns, widths)))


def bench_softmax(shapes, gemm_shapes, dtype="bfloat16", reps=20):
    import math

    import torch

    import numbatc

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    progress = Progress(len(shapes) + len(gemm_shapes), "softmax")
    for r, n in shapes:
        x = torch.randn(r, n, device="cuda", dtype=tdt) * 3
        out = torch.empty_like(x)
        numbatc.softmax(x, out=out)
        err = (out.float() - torch.softmax(x.float(), -1)).abs().max().item()
        ours = _time_gpu(lambda: numbatc.softmax(x, out=out), torch, reps)
        theirs = _time_gpu(lambda: torch.softmax(x, -1), torch, reps)
        gb = 2 * x.numel() * x.element_size() / 1e9
        rows.append(dict(kind="softmax", m=r, n=n, k=0, dtype=dtype, numbatc_ms=ours,
                         torch_ms=theirs, numbatc_gbs=gb / ours * 1e3, torch_gbs=gb / theirs * 1e3,
                         ratio=theirs / ours, max_abs_err=err))
        progress.step(f"softmax {r}x{n}: {rows[-1]['numbatc_gbs']:.0f} GB/s, {rows[-1]['ratio']:.2f}x torch")
        x = out = None
        torch.cuda.empty_cache()
    for m, k, n in gemm_shapes:
        a = torch.randn(m, k, device="cuda", dtype=tdt)
        b = torch.randn(k, n, device="cuda", dtype=tdt)
        scale = 1 / math.sqrt(k)
        out = torch.empty(m, n, device="cuda", dtype=tdt)
        numbatc.gemm_softmax(a, b, scale=scale, out=out)
        err = (out.float() - torch.softmax(scale * (a.float() @ b.float()), -1)).abs().max().item()
        ours = _time_gpu(lambda: numbatc.gemm_softmax(a, b, scale=scale, out=out), torch, reps)
        theirs = _time_gpu(lambda: torch.softmax(torch.matmul(a, b) * scale, -1), torch, reps)
        tf = 2.0 * m * n * k / 1e12
        rows.append(dict(kind="gemm_softmax", m=m, n=n, k=k, dtype=dtype, numbatc_ms=ours,
                         torch_ms=theirs, numbatc_gbs=tf / ours * 1e3, torch_gbs=tf / theirs * 1e3,
                         ratio=theirs / ours, max_abs_err=err))
        progress.step(f"gemm_softmax {m}x{k}x{n}: {rows[-1]['ratio']:.2f}x torch")
        a = b = out = None
        torch.cuda.empty_cache()
    return rows


def print_softmax_table(rows):
    print("softmax: GB/s of one read and one write; gemm_softmax: TFLOP/s of the GEMM; ratio = "
          "torch time / numbatc time")
    _table(rows, [("kind", "kernel", "s"), ("m", "rows/M", "d"), ("n", "N", "d"), ("k", "K", "d"),
                  ("numbatc_ms", "numbatc ms", ".3f"), ("torch_ms", "torch ms", ".3f"),
                  ("numbatc_gbs", "numbatc GB/s|TF/s", ".1f"), ("torch_gbs", "torch GB/s|TF/s", ".1f"),
                  ("ratio", "ratio", ".2f"), ("max_abs_err", "max abs err", ".1e")])


def bench_epilogue(shapes, dtype="bfloat16", reps=20):
    import math

    import numpy as np
    import torch
    from numba import cuda

    import intrinsics as nt
    import numbatc

    @cuda.jit(device=True)
    def bias_gelu_residual(v, r, c, bias, residual):
        x = v + bias[c]
        inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)
        res = nt.unpack_bf16x2(np.uint32(residual[r, c]))[0]  # bf16 bits (the kernel's view)
        return np.float32(0.5) * x * (np.float32(1) + math.tanh(inner)) + res

    @cuda.jit(device=True)
    def bias_gelu_residual_fast(v, r, c, bias, residual):
        # the same with tanh.approx.f32 (one MUFU.TANH; error below bf16's rounding)
        x = v + bias[c]
        inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)
        res = nt.unpack_bf16x2(np.uint32(residual[r, c]))[0]
        return np.float32(0.5) * x * (np.float32(1) + nt.tanh_approx(inner)) + res

    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    rows = []
    progress = Progress(len(shapes), "epilogue")
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=tdt)
        b = torch.randn(k, n, device="cuda", dtype=tdt)
        bias32 = torch.randn(n, device="cuda", dtype=torch.float32)
        bias = bias32.to(tdt)
        residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=tdt)
        variants = {
            "plain": lambda: numbatc.gemm(a, b, out=out),
            "user bias+gelu+residual": lambda: numbatc.gemm(
                a, b, out=out, epilogue=bias_gelu_residual, epilogue_args=(bias32, residual)),
            "user, tanh.approx": lambda: numbatc.gemm(
                a, b, out=out, epilogue=bias_gelu_residual_fast, epilogue_args=(bias32, residual)),
            "built-in bias+gelu": lambda: numbatc.gemm(a, b, out=out, bias=bias, activation="gelu"),
            "torch unfused": lambda: torch.nn.functional.gelu(
                torch.matmul(a, b) + bias, approximate="tanh") + residual,
        }
        ref = torch.nn.functional.gelu(a.float() @ b.float() + bias32, approximate="tanh") + residual.float()
        errs = {}
        for name in ("user bias+gelu+residual", "user, tanh.approx"):
            variants[name]()
            torch.cuda.synchronize()
            errs[name] = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        times = {name: _time_gpu(fn, torch, reps) for name, fn in variants.items()}
        # the plain GEMM once more at the end: the overhead is not a clock drift
        times["plain"] = min(times["plain"], _time_gpu(variants["plain"], torch, reps))
        # and each in groups of at least 8 back-to-back calls (at 8192^3 a group otherwise holds
        # one call; the two ways disagreed by 15 points on the H100, docs/PERFORMANCE.md)
        b2b = {name: _time_gpu(fn, torch, reps, min_group=8) for name, fn in variants.items()}
        flops = 2.0 * m * n * k
        for name, t in times.items():
            rows.append(dict(m=m, n=n, k=k, dtype=dtype, variant=name, ms=t,
                             tflops=flops / t / 1e9,
                             overhead_pct=(t / times["plain"] - 1) * 100, ms_b2b=b2b[name],
                             overhead_b2b_pct=(b2b[name] / b2b["plain"] - 1) * 100,
                             max_rel_err=errs.get(name, float("nan"))))
        progress.step(f"{m}x{n}x{k}: user epilogue +"
                      f"{(times['user bias+gelu+residual'] / times['plain'] - 1) * 100:.1f}%")
        a = b = out = residual = ref = None
        torch.cuda.empty_cache()
    return rows


def print_epilogue_table(rows):
    print("overhead = time / plain numbatc.gemm time - 1 (target: user epilogue < 5% at 4096^3)")
    _table(rows, [("m", "M", "d"), ("n", "N", "d"), ("k", "K", "d"), ("variant", "variant", "s"),
                  ("ms", "ms", ".3f"), ("tflops", "TFLOP/s", ".1f"),
                  ("overhead_pct", "overhead %", "+.1f"), ("ms_b2b", "ms, 8+ a group", ".3f"),
                  ("overhead_b2b_pct", "overhead %", "+.1f"),
                  ("max_rel_err", "max rel err", ".1e")])


def main_softmax(args):
    key = "quick" if args.shapes == "quick" else "all"
    rows = bench_softmax(SOFTMAX_SHAPES[key], GEMM_SOFTMAX_SHAPES[key], args.dtype, args.reps)
    print_softmax_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


def main_epilogue(args):
    key = "quick" if args.shapes == "quick" else "all"
    rows = bench_epilogue(EPILOGUE_SHAPES[key], args.dtype, args.reps)
    print_epilogue_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    return 0


# ---------------------------------------------------------------------------------------------
# transformers: a Llama's prefill through numbatc against the same model in torch
# ---------------------------------------------------------------------------------------------

TRANSFORMERS_SHAPES = {"all": [(1, 128), (1, 512), (1, 2048), (8, 512), (4, 2048)],
                       "quick": [(1, 512), (4, 2048)]}


def bench_transformers(shapes, reps):
    """Prefill of a random-weight LlamaForCausalLM (4 layers, hidden 1024, GQA 16/4, bf16):
    torch (cuBLAS + SDPA) and the same model with numbatc.torch.patch and the "numbatc"
    attention implementation (examples/ex07_transformers.py checks its results)."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import numbatc.torch

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                         max_position_embeddings=4096)
    ref = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ours = copy.deepcopy(ref)
    numbatc.torch.patch(ours)
    ours.set_attn_implementation(numbatc.torch.register_transformers())
    rows = []
    with torch.no_grad():
        for batch, seq in shapes:
            ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
            start = time.perf_counter()
            got = ours(ids).logits.float()
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            want = ref(ids).logits.float()
            rel = ((got - want).norm() / want.norm()).item()
            ms_ours = _time_gpu(lambda: ours(ids), torch, reps)
            ms_ref = _time_gpu(lambda: ref(ids), torch, reps)
            rows.append({"batch": batch, "seq": seq, "numbatc_ms": ms_ours, "torch_ms": ms_ref,
                         "ratio": ms_ours / ms_ref, "first_call_s": first, "rel_err": rel})
            torch.cuda.empty_cache()
    return rows


def main_transformers(args):
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("python -m numbatc.bench transformers needs transformers: pip install "
              "transformers", file=sys.stderr)
        return 2
    rows = bench_transformers(TRANSFORMERS_SHAPES[args.shapes], args.reps)
    print("prefill of a random-weight Llama (4 layers, hidden 1024, GQA 16/4, bf16); ratio = "
          "numbatc time / torch time")
    _table(rows, [("batch", "batch", "d"), ("seq", "seq", "d"), ("numbatc_ms", "numbatc ms",
                  ".2f"), ("torch_ms", "torch ms", ".2f"), ("ratio", "ratio", ".2f"),
                  ("first_call_s", "first call s", ".1f"), ("rel_err", "logits rel err", ".1e")])
    if args.csv:
        write_csv(rows, args.csv)
    return 0


_SUBCOMMANDS = {
    "gemm": "numbatc.gemm against cuBLAS (torch.matmul; torch._scaled_mm for float8)",
    "attention": "numbatc.attention against torch's scaled_dot_product_attention (fastest "
                 "backend)",
    "attention-backward": "numbatc.attention_backward against the backward of torch's "
                          "scaled_dot_product_attention (fastest backend)",
    "varlen": "numbatc.attention_varlen over packed sequences of random lengths against torch's "
              "varlen attention (torch.nn.attention.varlen)",
    "decode": "numbatc.attention on decode shapes (flash-decoding) against torch SDPA, in GB/s of "
              "K and V against the copy bandwidth",
    "softmax": "numbatc.softmax against torch.softmax, then numbatc.gemm_softmax",
    "epilogue": "what a fused user epilogue costs over the plain numbatc.gemm",
    "transformers": "a transformers Llama's prefill through numbatc against torch (needs "
                    "transformers)",
}

_NEEDS = ("python -m numbatc.bench needs a CUDA GPU and PyTorch with CUDA (for the inputs and "
          "the reference kernels: cuBLAS, SDPA); numbatc itself does not need torch")
_GET_TORCH = ("install a CUDA build of torch: pip install torch (https://pytorch.org/get-started/ "
              "names the wheel for your CUDA driver)")


def _parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dtype", default="bfloat16",
                        choices=["bfloat16", "float16", "float8_e4m3", "float8_e5m2"],
                        help="input dtype (default bfloat16); float8_*: gemm only, per-tensor "
                             "scales, bf16 output, against torch._scaled_mm")
    common.add_argument("--reps", type=int, default=20, metavar="N",
                        help="timed launches per measurement (default 20; the median is shown)")
    common.add_argument("--csv", metavar="FILE", help="also write the table as CSV to FILE")
    common.add_argument("--timing", default="stream", choices=("stream", "graph"),
                        help="stream (default): back-to-back calls, the host's launch cost "
                             "shows where it exceeds the kernel's; graph: the calls captured in "
                             "a CUDA graph and replayed, GPU time alone, for numbatc and the "
                             "reference alike")
    parser = argparse.ArgumentParser(
        prog="python -m numbatc.bench", description=__doc__.splitlines()[0],
        epilog="Each subcommand has its own --help.  Needs a CUDA GPU and PyTorch with CUDA "
               "(inputs and references).")
    sub = parser.add_subparsers(dest="what", required=True, metavar="{" + ",".join(_SUBCOMMANDS)
                                + "}")
    gemm = sub.add_parser("gemm", parents=[common], help=_SUBCOMMANDS["gemm"],
                          description=_SUBCOMMANDS["gemm"])
    gemm.add_argument("--shapes", default="all", choices=sorted(SHAPES),
                      help="squares: 1024..8192 cubes; llm: M in {1 .. 4096} x LLM weight "
                           "shapes; all (default): both; decode: M <= 256 with the copy "
                           "bandwidth; quick: 4096^3 and 8192^3; llama8b: Llama-3-8B's layers "
                           "at 4096 tokens; table: M in {1 .. 4096} x the Llama-3-8B / -70B / "
                           "hidden-1024 layers, with a ratio grid and a heatmap PNG (--png, "
                           "default gemm_table_<dtype>.png; use --b-layout col for x @ W.T); "
                           "table-small: the hidden-1024 rows only; deepseek: DeepSeek-V3's "
                           "layers at M = 64 / 128 / 4096 (DeepGEMM's set, for --fp8-scales "
                           "block)")
    gemm.add_argument("--png", metavar="FILE", help="write a bar plot to FILE (needs "
                      "matplotlib: pip install numbatc[plots])")
    gemm.add_argument("--b-layout", default="row", choices=("row", "col"),
                      help="b row-major (k, n) (default), or col: b = w.T of a row-major (n, k) "
                           "weight, as a Linear layer's x @ W.T (bf16/f16; float8 is always col)")
    gemm.add_argument("--fp8-scales", default="tensor", choices=("tensor", "block"),
                      help="float8 only: per-tensor scales (default), or block: DeepGEMM's "
                           "blockwise recipe (float32 scale_a per row and 128 K values, scale_b "
                           "per 128 x 128 block); the reference stays the per-tensor "
                           "torch._scaled_mm")
    gemm.add_argument("--configs", action="store_true",
                      help="also time every sm80 tile configuration on the shapes (forced "
                           "through NUMBATC_SM80_CONFIG), to tune the heuristic")
    attention = sub.add_parser("attention", parents=[common], help=_SUBCOMMANDS["attention"],
                               description=_SUBCOMMANDS["attention"])
    attention.add_argument("--shapes", default="all", choices=sorted(ATTENTION_SHAPES),
                           help="all (default): head_dim 64/96/128/192/256 x seqlen "
                                "512..16384; quick: head_dim 64/128 x seqlen 1024/4096; large: "
                                "head_dim 96/192/256 x seqlen 1024/4096/16384; hd64, hd96, hd128, "
                                "hd192, hd256: one of them")
    attention.add_argument("--png", metavar="FILE", help="write a bar plot to FILE (needs "
                           "matplotlib: pip install numbatc[plots])")
    attention.add_argument("--configs", action="store_true",
                           help="also time every sm80_attention configuration "
                                "(NUMBATC_ATTN_CONFIG)")
    backward = sub.add_parser("attention-backward", parents=[common],
                              help=_SUBCOMMANDS["attention-backward"],
                              description=_SUBCOMMANDS["attention-backward"])
    backward.add_argument("--shapes", default="all", choices=sorted(ATTENTION_BACKWARD_SHAPES),
                          help="all (default): head_dim 64/128 x seqlen 1024..16384; quick: "
                               "head_dim 64/128 x seqlen 1024/4096")
    backward.add_argument("--configs", action="store_true",
                          help="also time every sm80_attention_backward configuration "
                               "(NUMBATC_ATTN_BWD_CONFIG)")
    backward.add_argument("--kernel", default="default",
                          choices=("default", "sm80", "sm90", "sm90-any", "both", "all"),
                          help="force the kernel family (NUMBATC_ATTN_BWD_KERNEL): sm80 (the "
                               "portable kernels), sm90 (the Hopper wgmma kernel, head_dim 64 / "
                               "128), sm90-any (it with deterministic=False), both (sm80 and "
                               "sm90), all (the three; one sweep each)")
    varlen = sub.add_parser("varlen", parents=[common], help=_SUBCOMMANDS["varlen"],
                            description=_SUBCOMMANDS["varlen"])
    varlen.add_argument("--shapes", default="all", choices=sorted(VARLEN_SHAPES),
                        help="all (default): head_dim 64/128 x lengths 64..1024, 512..4096, "
                             "2048..8192 (16384 tokens); quick: head_dim 64/128 x 512..4096")
    decode = sub.add_parser("decode", parents=[common], help=_SUBCOMMANDS["decode"],
                            description=_SUBCOMMANDS["decode"])
    decode.add_argument("--shapes", default="all", choices=sorted(DECODE_ATTENTION_SHAPES),
                        help="all (default): batch 1/8/32 x seqlen_q 1/4 x seqlen_k 4k..128k; "
                             "quick: three shapes")
    decode.add_argument("--configs", action="store_true",
                        help="also time every sm80_decode_attention configuration "
                             "(NUMBATC_ATTN_KERNEL=decode:<name>)")
    decode.add_argument("--paged", type=int, default=0, metavar="PAGE_SIZE",
                        help="numbatc.attention_with_kvcache over a paged cache of PAGE_SIZE "
                             "rows a page (a multiple of 16; shuffled pages), CUDA-graph "
                             "replays timed, against SDPA on the gathered cache")
    for name, table in (("softmax", SOFTMAX_SHAPES), ("epilogue", EPILOGUE_SHAPES),
                        ("transformers", TRANSFORMERS_SHAPES)):
        p = sub.add_parser(name, parents=[common], help=_SUBCOMMANDS[name],
                           description=_SUBCOMMANDS[name])
        p.add_argument("--shapes", default="all", choices=sorted(table),
                       help="all (default) or quick (a few shapes)")
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dtype.startswith("float8") and args.what != "gemm":
        parser.error(f"--dtype {args.dtype} is for the gemm benchmark only")
    try:
        import torch
    except ImportError:
        parser.error(f"torch is not installed. {_NEEDS}; {_GET_TORCH}")
    if not torch.cuda.is_available():
        build = " (a CPU-only build)" if torch.version.cuda is None else ""
        parser.error(f"torch {torch.__version__}{build} sees no CUDA GPU. {_NEEDS}"
                     + (f"; {_GET_TORCH}" if build else ""))
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, timing "
          f"{args.timing}", flush=True)
    global TIMING
    TIMING = args.timing
    try:
        return _main(args)
    finally:
        if _time_gpu.fallbacks:
            print(f"timed back to back, not from a graph ({len(_time_gpu.fallbacks)} calls): "
                  + "; ".join(sorted(set(_time_gpu.fallbacks))), flush=True)


def _main(args):
    import torch

    if args.what == "attention":
        return main_attention(args)
    if args.what == "attention-backward":
        return main_attention_backward(args)
    if args.what == "decode":
        return main_decode(args)
    if args.what == "varlen":
        return main_varlen(args)
    if args.what == "softmax":
        return main_softmax(args)
    if args.what == "epilogue":
        return main_epilogue(args)
    if args.what == "transformers":
        return main_transformers(args)
    if args.shapes in ("decode", "table", "table-small"):
        print(f"device copy bandwidth: {copy_bandwidth(torch):.0f} GB/s (read + write of 1 GiB)",
              flush=True)
    rows = bench_gemm(SHAPES[args.shapes], args.dtype, args.reps, args.b_layout,
                      args.fp8_scales)
    if args.configs:
        import os

        from numbatc.kernels.sm80_gemm import CONFIGS

        for name in CONFIGS:
            os.environ["NUMBATC_SM80_CONFIG"] = name
            for row in bench_gemm(SHAPES[args.shapes], args.dtype, args.reps, args.b_layout):
                row["config"] = name
                rows.append(row)
        os.environ.pop("NUMBATC_SM80_CONFIG")
    print_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    if args.shapes.startswith("table"):
        print_ratio_grid(rows)
        write_heatmap(rows, args.png or f"gemm_{args.shapes}_{args.dtype}.png", args.dtype)
    elif args.png:
        write_png(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
