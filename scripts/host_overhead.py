"""Host overhead of a warm ``numbatc.gemm`` call, stage by stage, and the first call's cost.

    python scripts/host_overhead.py [--shape 1024,1024,1024] [--libs torch,cupy,numba] [--first-call]

For each library's inputs (bf16 where the library names it, else float16) it prints the median
microseconds per call of each stage of a warm call (the time for the call to return, without
waiting for the GPU), measured on its own in a loop:

  probe a,b,out   pointer + key of the three arrays (numbatc.interop.probes.probe)
  key+lookup      gemm._warm_key (the probes again, the env and thread parts) + the lookup in
                  numbatc._warm.CACHE
  stream          the current-stream lookup (torch._C._cuda_getCurrentRawStream ...)
  launch          the relaunch function: one struct.pack_into + cuLaunchKernel
  cuLaunchKernel  the bare driver call through cuda.bindings with the same buffer (the floor)
  gemm (warm)     the whole numbatc.gemm(a, b, out=out)
  gemm (checked)  the full checks + dispatch every time (the path before the warm cache)
  torch.matmul    torch.matmul(a, b, out=out) for scale (torch inputs only)

``--first-call`` also runs two fresh processes: one with an empty kernel cache directory (the cold
first call: numba typing, lowering, NVVM, nvJitLink, module load) and one reusing it (numba's
disk cache), and prints their first-call seconds with numba's import separately.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def per_call_us(fn, calls=200, batches=15, sync=None):
    """Median over batches of the mean microseconds per call of ``fn`` (the GPU is drained
    between batches, untimed, so the launch queue never fills)."""
    fn()
    times = []
    for _ in range(batches):
        if sync:
            sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    if sync:
        sync()
    return statistics.median(times)


def make_inputs(lib, m, n, k):
    if lib == "torch":
        import torch

        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return a, b, out, torch.cuda.synchronize
    if lib == "cupy":
        import cupy

        a = cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
        b = cupy.random.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
        out = cupy.empty((m, n), dtype=cupy.float16)
        return a, b, out, cupy.cuda.runtime.deviceSynchronize
    if lib == "numba":
        import numpy as np
        from numba import cuda

        rng = np.random.default_rng(0)
        a = cuda.to_device(rng.standard_normal((m, k)).astype(np.float16))
        b = cuda.to_device(rng.standard_normal((k, n)).astype(np.float16))
        out = cuda.device_array((m, n), np.float16)
        return a, b, out, cuda.synchronize
    raise ValueError(lib)


def stages(lib, m, n, k):
    import numbatc
    from numbatc import _warm, gemm_api
    from numbatc.interop import probes

    a, b, out, sync = make_inputs(lib, m, n, k)
    numbatc.gemm(a, b, out=out)  # checked; compiles; caches the warm entry
    numbatc.gemm(a, b, out=out)
    sync()
    key, ptrs = gemm_api._warm_key(a, b, None, None, out, 1.0, 0.0, None, None)
    warm = _warm.CACHE.get(key)
    rows = []
    if warm is None:
        print(f"{lib}: no warm entry (emulation? unaligned? NUMBATC_PRINT_CONFIG set?)")
    probe = probes.probe
    rows.append(("probe a,b,out", per_call_us(lambda: (probe(a), probe(b), probe(out)))))
    fast = _warm.CACHE
    rows.append(("key+lookup", per_call_us(lambda: fast.get(gemm_api._warm_key(
        a, b, None, None, out, 1.0, 0.0, None, None)[0]))))
    if warm is not None:
        rows.append(("stream", per_call_us(warm.stream)))
        pa, pb, _, _, po = ptrs
        s = warm.stream()
        rows.append(("launch", per_call_us(
            lambda: warm.relaunch(pa, pb, po, po, po, 1.0, 0.0, s), sync=sync)))
        prepared = warm.relaunch.__closure__ and next(
            (c.cell_contents for c in warm.relaunch.__closure__
             if type(c.cell_contents).__name__ == "PreparedLaunch"), None)
        if prepared is not None:
            from cuda.bindings import driver

            g, bl, f, params = prepared.grid, prepared.block, prepared._f, prepared._params_addr
            cs = driver.CUstream(s)
            rows.append(("cuLaunchKernel", per_call_us(lambda: driver.cuLaunchKernel(
                f, g[0], g[1], g[2], bl[0], bl[1], bl[2], prepared.shared_bytes, cs, params, 0),
                sync=sync)))
    rows.append(("gemm (warm)", per_call_us(lambda: numbatc.gemm(a, b, out=out), sync=sync)))
    rows.append(("gemm (checked)", per_call_us(
        lambda: gemm_api._gemm_checked(a, b, None, 1.0, 0.0, None, None, out, None, None, ()),
        calls=50, sync=sync)))
    if lib == "torch":
        import torch

        rows.append(("torch.matmul", per_call_us(lambda: torch.matmul(a, b, out=out), sync=sync)))
    return rows


FIRST_CALL = r"""
import os, sys, time
t0 = time.perf_counter()
import torch
a = torch.randn({m}, {k}, device="cuda", dtype=torch.bfloat16)
b = torch.randn({k}, {n}, device="cuda", dtype=torch.bfloat16)
out = torch.empty({m}, {n}, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
import numbatc
t1 = time.perf_counter()
import numba.cuda
t2 = time.perf_counter()
numbatc.gemm(a, b, out=out)
torch.cuda.synchronize()
t3 = time.perf_counter()
print(f"numba import {{t2 - t1:.2f}} s, first gemm after it {{t3 - t2:.2f}} s, total {{t3 - t1:.2f}} s")
"""


def first_call(m, n, k):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBATC_CACHE_DIR=cache, PYTHONPATH=ROOT)
        code = FIRST_CALL.format(m=m, n=n, k=k)
        for label in ("cold cache", "warm cache"):
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            print(f"first call, {label}: {r.stdout.strip() or r.stderr.strip()[-2000:]}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1024,1024,1024", help="M,N,K")
    p.add_argument("--libs", default="torch,cupy,numba")
    p.add_argument("--first-call", action="store_true")
    args = p.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split(","))
    print(f"M={m} N={n} K={k}; microseconds per call (median of batches)")
    for lib in args.libs.split(","):
        try:
            rows = stages(lib, m, n, k)
        except ImportError as exc:
            print(f"{lib}: not installed ({exc})")
            continue
        print(f"\n{lib}")
        for name, us in rows:
            print(f"  {name:16s} {us:8.2f} us")
    if args.first_call:
        print()
        first_call(m, n, k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
