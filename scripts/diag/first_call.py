"""First calls of numbatc.gemm in a fresh process, per shape: wall time, where it went (numba
typing/lowering, NVVM, LTO-IR, nvJitLink, driver JIT, cache load), numba's disk-cache hits and
misses for the configuration, and the result against a float32 reference.  One JSON line per shape.

    python scripts/diag/first_call.py 4096x4096x4096 16x4096x4096 ...
    python scripts/diag/first_call.py attn:2x1024x1024x16x4x128c attn:1x1x8192x32x8x128

``attn:BxSQxSKxHQxHKVxD[c]`` is a numbatc.attention call (bf16, ``c``: causal), timed the same way
(its configuration line names the kernel family and config that ran).  ``bwd:...[c][n]`` is
numbatc.attention_backward's first call on the same shapes (``n``: deterministic=False).

On the H200, for issue 18's first-call target (not yet run there): cold, with
``CUDA_CACHE_DISABLE=1`` (and ``NUMBATC_LTO_LINK=1`` for numba's own LTO link), against a cache
filled by ``CUDA_VISIBLE_DEVICES= python -m numbatc precompile --shapes ... --cc 9.0a`` (the
path a CPU host takes; disk_hits 1 / disk_misses 0 and a small rel_err say it was found and runs
right) and by ``python -m numbatc precompile`` on the GPU itself.  Tried here under the
simulator only (NUMBA_ENABLE_CUDASIM=1: no compiler phases to time).
"""

import contextlib
import json
import os
import sys
import time

import numpy as np

T = {}


def timed(owner, attr, name, outer_only=False, times=T):
    """Wrap ``owner.attr`` so that its seconds add up in ``times[name]`` (``outer_only``: only
    the outermost of nested calls)."""
    orig = getattr(owner, attr)
    depth = [0]

    def wrap(*a, **k):
        depth[0] += 1
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            depth[0] -= 1
            if not outer_only or depth[0] == 0:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t

    setattr(owner, attr, wrap)


def main(shapes):
    t0 = time.perf_counter()
    from numba import config, cuda

    import numbatc
    from intrinsics import launch as launching

    pc = sys.modules["numbatc.precompile"]
    if not config.ENABLE_CUDASIM:  # (the simulator, to try the script: no compiler to time)
        from numba.cuda import codegen, dispatcher
        from numba.cuda.core import caching

        timed(dispatcher, "compile_cuda", "typing+lowering", outer_only=True)
        timed(codegen.CUDACodeLibrary, "get_asm_strs", "nvvm_ptx")
        timed(codegen.CUDACodeLibrary, "get_ltoir", "nvvm_ltoir")
        timed(codegen.CUDACodeLibrary, "get_cubin", "link_cubin")
        timed(codegen.CUDACodeLibrary, "get_cufunc", "module_load+link")
        timed(launching, "_whole_program_kernel", "driver_jit")
        timed(caching.Cache, "load_overload", "cache_load")
    import_s = time.perf_counter() - t0

    @cuda.jit
    def warm(x):  # numba's first compile of the process (its registries) and the context
        x[0] = 1

    t = time.perf_counter()
    x = cuda.device_array(1, np.int32)
    warm[1, 1](x)
    cuda.synchronize()
    init_s = time.perf_counter() - t
    print(json.dumps({"import_s": round(import_s, 3), "numba_init_s": round(init_s, 3)}))
    rng = np.random.default_rng(0)
    for spec in shapes:
        if spec.startswith("attn:"):
            first_attention(spec, rng, numbatc)
            continue
        if spec.startswith("bwd:"):
            first_backward(spec, rng, numbatc)
            continue
        m, n, k = (int(v) for v in spec.split("x"))
        a32 = rng.standard_normal((m, k), dtype=np.float32)
        w32 = rng.standard_normal((n, k), dtype=np.float32)
        bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16, truncated
        a16, w16 = bits(a32), bits(w32)
        f32 = lambda b: (b.astype(np.uint32) << 16).view(np.float32)
        ref = f32(a16) @ f32(w16).T
        a = numbatc.bfloat16(cuda.to_device(a16))
        wd = cuda.to_device(w16)
        # b = w.T, a column-major view of the row-major weight (no copy), as x @ W.T
        bt = wd.T if config.ENABLE_CUDASIM else cuda.cudadrv.devicearray.DeviceNDArray(
            (k, n), (2, 2 * k), np.dtype(np.uint16), gpu_data=wd.gpu_data)
        b = numbatc.bfloat16(bt)
        T.clear()
        t = time.perf_counter()
        out = numbatc.gemm(a, b)
        cuda.synchronize()
        first = time.perf_counter() - t
        t = time.perf_counter()
        numbatc.gemm(a, b)
        cuda.synchronize()
        second = time.perf_counter() - t
        got = f32(out.copy_to_host().view(np.uint16))
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        cc = (9, 0) if config.ENABLE_CUDASIM else tuple(cuda.get_current_device().compute_capability)
        [(job, _)] = pc.plan(spec, cc=cc).items()
        family = __import__(job.family, fromlist=["x"])
        kernel, sig = pc._kernel_and_signature(family, job.config, job.variant)
        print(json.dumps({"shape": spec, "config": job.label, "first_s": round(first, 3),
                          "second_s": round(second, 4),
                          "phases": {key: round(v, 3) for key, v in T.items()},
                          "disk_hits": getattr(kernel, "_cache_hits", {}).get(sig),
                          "disk_misses": getattr(kernel, "_cache_misses", {}).get(sig),
                          "rel_err": err}), flush=True)


@contextlib.contextmanager
def profiled(path):
    """cProfile around the block into file ``path`` (None: no profile)."""
    if not path:
        yield
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        prof.dump_stats(path)


def _profile_path(spec):
    """``$FIRST_CALL_PROFILE/<spec>.prof`` where that variable names a folder (on the GPU host,
    whose first calls run longer than the CPU host's compiles of the same kernels: what else
    they spend it on), else None."""
    folder = os.environ.get("FIRST_CALL_PROFILE")
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, spec.replace(":", "_") + ".prof")


def first_attention(spec, rng, numbatc):
    from numba import cuda

    from numbatc.kernels import dispatch

    dims = spec[5:]
    causal = dims.endswith("c")
    b, sq, sk, hq, hkv, d = (int(v) for v in dims.rstrip("c").split("x"))
    bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)
    f32 = lambda u: (u.astype(np.uint32) << 16).view(np.float32)
    q16, k16, v16 = (bits(rng.standard_normal(shape, dtype=np.float32))
                     for shape in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))
    q, k, v = (numbatc.bfloat16(cuda.to_device(x)) for x in (q16, k16, v16))
    chosen = []
    choose = dispatch.choose_attention

    def recording(p):
        module, cfg = choose(p)
        chosen.append(f"{module.__name__.rsplit('.', 1)[-1]}:{getattr(cfg, 'name', cfg)}")
        return module, cfg

    dispatch.choose_attention = recording
    T.clear()
    with profiled(_profile_path(spec)):
        t = time.perf_counter()
        out = numbatc.attention(q, k, v, causal=causal)
        cuda.synchronize()
        first = time.perf_counter() - t
    t = time.perf_counter()
    numbatc.attention(q, k, v, causal=causal)
    cuda.synchronize()
    second = time.perf_counter() - t
    # float64 reference on a few (batch, head) pairs' rows
    got = f32(out.copy_to_host().view(np.uint16))
    g = hq // hkv
    err = 0.0
    for bi, h in {(0, 0), (b - 1, hq - 1)}:
        s = f32(q16[bi, :, h]).astype(np.float64) @ f32(k16[bi, :, h // g]).astype(np.float64).T
        s /= np.sqrt(d)
        if causal:
            s[np.triu(np.ones((sq, sk), bool), sk - sq + 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        ref = (p / p.sum(1, keepdims=True)) @ f32(v16[bi, :, h // g])
        err = max(err, float(np.abs(got[bi, :, h] - ref).max() / np.abs(ref).max()))
    print(json.dumps({"shape": spec, "config": chosen[0] if chosen else None,
                      "first_s": round(first, 3), "second_s": round(second, 4),
                      "phases": {key: round(v, 3) for key, v in T.items()}, "rel_err": err}),
          flush=True)


def first_backward(spec, rng, numbatc):
    """``bwd:BxSQxSKxHQxHKVxD[c][n]``: numbatc.attention_backward's first call (every kernel it
    compiles; ``n``: deterministic=False) after a forward with return_lse (compiled first, not
    counted); rel_err is the first call's dq, dk, dv against the second's (bit-equal when
    deterministic; the GPU suites check them against float64)."""
    from numba import cuda

    from numbatc import attention_backward_api as api

    dims = spec[4:]
    nd = dims.endswith("n")
    dims = dims.rstrip("n")
    causal = dims.endswith("c")
    b, sq, sk, hq, hkv, d = (int(v) for v in dims.rstrip("c").split("x"))
    bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)
    f32 = lambda u: (u.astype(np.uint32) << 16).view(np.float32)
    shapes = ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, hq, d))
    q, k, v, do = (numbatc.bfloat16(cuda.to_device(bits(rng.standard_normal(sh, np.float32))))
                   for sh in shapes)
    out, lse = numbatc.attention(q, k, v, causal=causal, return_lse=True)
    cuda.synchronize()
    chosen = []
    pick = api.kernel_module

    def recording(p):
        module, name = pick(p)
        chosen.append(module.__name__.rsplit(".", 1)[-1])
        return module, name

    api.kernel_module = recording
    runs = []
    for _ in range(2):
        T.clear()
        t = time.perf_counter()
        grads = numbatc.attention_backward(q, k, v, out, lse, do, causal=causal,
                                           deterministic=not nd)
        cuda.synchronize()
        runs.append((time.perf_counter() - t, dict(T),
                     [f32(g.copy_to_host().view(np.uint16)) for g in grads]))
    api.kernel_module = pick
    err = max(float(np.abs(a - c).max() / max(np.abs(c).max(), 1e-30))
              for a, c in zip(runs[0][2], runs[1][2]))
    finite = all(np.isfinite(g).all() for g in runs[0][2])
    print(json.dumps({"shape": spec, "family": chosen[0] if chosen else None,
                      "first_s": round(runs[0][0], 3), "second_s": round(runs[1][0], 4),
                      "phases": {key: round(v, 3) for key, v in runs[0][1].items()},
                      "finite": finite, "rel_err_vs_second": err}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
