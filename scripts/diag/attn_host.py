"""Where a numbatc.attention call's time goes, per configuration: the benchmark's back-to-back
figure (bench._time_gpu), the same calls replayed from a CUDA graph (the kernels alone, no host
code), the host time of a warm call (a tiny problem, wall time over many calls), and the warm
call's top functions under cProfile.  A back-to-back figure above the replay says the host path,
not the kernel, sets the benchmark's number.

    python scripts/diag/attn_host.py [config ...]      (default: the default and the TMA ones)

Configurations are NUMBATC_ATTN_KERNEL values ("" is the default choice).  GPU only.
"""

import cProfile
import io
import os
import pstats
import sys
import time

import torch

import numbatc
from numbatc.bench import _time_gpu

SHAPES = [(16, 1024, 16, 128, True), (16, 1024, 16, 128, False), (4, 4096, 16, 128, True),
          (16, 1024, 32, 64, True)]


def flops(b, s, h, d, causal):
    return 4 * b * s * s * h * d * (0.5 if causal else 1.0)


def replay_ms(fn, reps=20, inner=10):
    """Milliseconds per call of ``fn`` replayed from a CUDA graph of ``inner`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm: the capture must not compile or build maps
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return sorted(times)[len(times) // 2]


def host_us(fn, calls=300):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host / calls * 1e6


def profile_top(fn, calls=200, top=12):
    """The ``top`` functions by own time of ``calls`` calls of ``fn`` under cProfile, as
    pstats prints them (the header line first)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    lines = text.getvalue().splitlines()
    first = next(i for i, line in enumerate(lines) if "ncalls" in line)
    return "\n".join(line for line in lines[first:] if line.strip())


def main():
    configs = sys.argv[1:] or ["", "sm90:n128_2s_ov_pp_fx", "sm90:n128_2s_ov_pp_fx_tma",
                               "sm90:n128_2s_ov_pp_fx_tma_pt"]
    for cfg in configs:
        if cfg:
            os.environ["NUMBATC_ATTN_KERNEL"] = cfg
        else:
            os.environ.pop("NUMBATC_ATTN_KERNEL", None)
        print(f"== {cfg or 'default'}", flush=True)
        for b, s, h, d, causal in SHAPES:
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            out = torch.empty_like(q)

            def fn():
                numbatc.attention(q, k, v, causal=causal, out=out)

            try:
                back = _time_gpu(fn, torch, 15)
                rep = replay_ms(fn)
            except Exception as exc:  # noqa: BLE001 -- a diagnostic: say it and go on
                print(f"  {b}x{s}x{h}x{d} causal={causal}: {type(exc).__name__}: {exc}")
                continue
            f = flops(b, s, h, d, causal)
            print(f"  {b}x{s}x{h}x{d} causal={causal}: back-to-back {back * 1e3:8.1f} us "
                  f"({f / back / 1e9:6.1f} TF/s), graph replay {rep * 1e3:8.1f} us "
                  f"({f / rep / 1e9:6.1f} TF/s)", flush=True)
        q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        out = torch.empty_like(q)

        def tiny():
            numbatc.attention(q, k, v, causal=True, out=out)

        print(f"  host per warm call (1x128x16x128, out given): {host_us(tiny):.1f} us")
        q2 = q.clone()

        def tiny_alloc():
            numbatc.attention(q2, k, v, causal=True)

        print(f"  host per warm call (out allocated): {host_us(tiny_alloc):.1f} us")
        print(profile_top(tiny))
    # the same host measurements for decode (the default walk takes the decode kernel) and for
    # torch SDPA on both problems: the host time a serving loop pays per layer
    os.environ.pop("NUMBATC_ATTN_KERNEL", None)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    print(f"== torch SDPA host per call (1x128x16x128 causal): "
          f"{host_us(lambda: sdpa(qt, kt, vt, is_causal=True)):.1f} us")
    q = torch.randn(8, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 4096, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(q)
    print(f"== decode host per warm call (8x1x32/8x128, seqlen_k 4096, out given): "
          f"{host_us(lambda: numbatc.attention(q, k, v, out=out)):.1f} us")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    print(f"== torch SDPA host per call (same, enable_gqa): "
          f"{host_us(lambda: sdpa(qt, kt, vt, enable_gqa=True)):.1f} us")


if __name__ == "__main__":
    main()
