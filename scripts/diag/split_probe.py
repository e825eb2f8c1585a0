"""Where a split-K launch's time goes: host time per call, GPU time of one call after a
synchronisation, and (under ncu) every kernel it launches."""
import os
import sys
import time

import torch

import numbatc

m, n, k, kern, split = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["NUMBATC_GEMM_KERNEL"] = kern
os.environ["NUMBATC_SPLIT_K"] = split
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).T
out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    numbatc.gemm(a, b, out=out)
torch.cuda.synchronize()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(3):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    e0.record()
    numbatc.gemm(a, b, out=out)
    e1.record()
    t1 = time.perf_counter()
    e1.synchronize()
    print(f"{kern} split {split}: host {1e6 * (t1 - t0):.1f} us, gpu {1e3 * e0.elapsed_time(e1):.1f} us")
