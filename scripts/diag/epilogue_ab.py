"""The epilogue's cost at one shape, interleaved: plain and built-in bias+gelu (and the user
epilogue) alternate in blocks of launches, each block timed with CUDA events, SM clock read
through nvidia-smi between blocks, so that clocks or power cannot favour the one timed first.

    python scripts/diag/epilogue_ab.py [N] [--b-col]
"""
import subprocess
import sys

import torch

import numbatc

n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
if "--b-col" in sys.argv:
    b = b.t().contiguous().t()
out = torch.empty_like(a)
bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
variants = {
    "plain": lambda: numbatc.gemm(a, b, out=out),
    "bias+gelu": lambda: numbatc.gemm(a, b, out=out, bias=bias, activation="gelu"),
    "bias": lambda: numbatc.gemm(a, b, out=out, bias=bias),
    "gelu": lambda: numbatc.gemm(a, b, out=out, activation="gelu"),
}
for f in variants.values():
    f()
torch.cuda.synchronize()
times = {k: [] for k in variants}
reps = max(5, int(2e13 / (2 * n**3)))
for block in range(8):
    for name, f in variants.items():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            f()
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / reps
        clk = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        times[name].append(ms)
        print(f"block {block} {name:>10}: {ms:.3f} ms ({2 * n**3 / ms / 1e9:.0f} TFLOP/s)  [{clk}]")
for name, t in times.items():
    print(f"{name:>10}: median {sorted(t)[len(t) // 2]:.3f} ms, "
          f"+{(sorted(t)[len(t) // 2] / sorted(times['plain'])[2] - 1) * 100:.1f} %")
