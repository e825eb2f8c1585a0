"""A GEMM or Hopper attention configuration's first compile without a GPU, as ``numbatc
precompile --cc 9.0a`` makes it (numba's typing, lowering, NVVM and the link, into a fresh disk
cache): wall time and where it went, one JSON line per configuration, in a fresh process of its
own.  The CPU-host side of issue 18's first-call target (scripts/diag/first_call.py measures
the GPU's).

    python scripts/diag/compile_time.py 128x256x64_3s_pt_tma_ts 64x128x64_6s_w1_tma \\
        fp8_128x256x128_3s_pt_tma_ts attn:n128_2s_ov_pp_fx_tma:128 [--repeat 3] \\
        [--profile out.prof] [--ptx DIR]

Each configuration runs ``--repeat`` times, each in a new process with a new NUMBATC_CACHE_DIR
(numba's first compile of the process -- its registries -- is made first and not counted);
the line gives every run and the median.  bf16 (or e4m3 for fp8_ names) row x col, bf16 out,
the variant numbatc.gemm runs for aligned operands (out_pairs); ``attn:<config>:<head_dim>``:
sm90_attention's, bf16, causal, the variant numbatc.attention runs for a contiguous out (pair
stores, O by TMA where the head dim has it); ``sm80:<config>``: the portable GEMM's;
``bwd:<head_dim>[:nd]``: the attention backward's kernels, all of them (see _backward);
``decode:<head_dim>[:causal]``: flash-decoding's split and combine kernels (see _decode).
``--ptx DIR``: each configuration's PTX into DIR/<name>.ptx.  Phases: typing+lowering is numba's (device functions
included), nvvm_ptx NVVM's, link_cubin the assembly of the PTX (nvJitLink).
"""

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import first_call  # scripts/diag: its timed() wrapper


def _variant(name):
    from numbatc.kernels import epilogue, sm80_gemm, sm90_attention, sm90_gemm

    if name.startswith("sm80:"):
        return sm80_gemm, sm80_gemm.CONFIGS[name[5:]], epilogue.GemmVariant(
            "row", "col", "bfloat16", "bfloat16", None, None, None, out_pairs=True)
    if name.startswith("attn:"):
        _, cfg, d = name.split(":")
        d = int(d)
        tma_store = sm90_attention.CONFIGS[cfg].tma and d in sm90_attention.TMA_STORE_HEAD_DIMS
        return sm90_attention, sm90_attention.CONFIGS[cfg], sm90_attention.AttnVariant(
            d, "bfloat16", True, False, pair_stores=True, tma_store=tma_store)

    cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
    if name.startswith("fp8_"):
        return sm90_gemm, cfg, sm90_gemm.Sm90Fp8Variant(
            "row", "col", "float8_e4m3fn", "bfloat16", None, None, None, b_dtype="float8_e4m3fn",
            out_pairs=True)
    return sm90_gemm, cfg, sm90_gemm.Sm90Variant("row", "col", "bfloat16", "bfloat16", None,
                                                 None, None, out_pairs=True)


def one(name, profile=None, ptx=None):
    """Compile ``name`` in this process; returns the phase times (seconds).  ``ptx``: a file
    to write the kernel's PTX to (for ptxas / nvdisasm)."""
    times = {}

    def timed(owner, attr, key, outer_only=False):
        first_call.timed(owner, attr, key, outer_only, times)

    from numba import cuda, types
    from numba.cuda import codegen, dispatcher

    from intrinsics import launch as launching

    precompile = importlib.import_module("numbatc.precompile")  # (numbatc.precompile: the function)

    timed(dispatcher, "compile_cuda", "typing+lowering", outer_only=True)
    timed(codegen.CUDACodeLibrary, "get_asm_strs", "nvvm_ptx")
    timed(codegen.CUDACodeLibrary, "get_ltoir", "nvvm_ltoir")
    timed(codegen.CUDACodeLibrary, "get_cubin", "link_cubin")

    @cuda.jit
    def warm(x):  # numba's first compile of the process, not counted
        x[0] = 1

    cc = (9, 0, "a")
    with precompile._target(cc):
        launching.compile_kernel(warm, (types.int32[::1],))
    times.clear()
    if name.startswith("bwd:"):
        return _backward(name, precompile, cc, times)
    if name.startswith("decode:"):
        return _decode(name, precompile, cc, times, profile)
    family, cfg, var = _variant(name)
    start = time.perf_counter()
    with first_call.profiled(profile):
        kernel, sig = precompile._kernel_and_signature(family, cfg, var)
        times["source+import"] = time.perf_counter() - start
        with precompile._target(cc):
            compiled = launching.compile_kernel(kernel, sig)
    times["total"] = time.perf_counter() - start
    if ptx:
        with open(ptx, "w") as f:
            f.write(compiled._codelibrary.get_asm_str(cc=cc))
    return {k: round(v, 3) for k, v in times.items()}


def _backward(name, precompile, cc, times):
    """``bwd:<head_dim>[:nd]``: every kernel numbatc.attention_backward's first call compiles
    for a causal bf16 problem of that head dim on sm_90a (``nd``: deterministic=False), through
    the family's compile_first as a launch does (links overlapped with typing: the phases are
    seconds spent in each, which overlap, against the wall-clock total)."""
    from numbatc.attention_backward_api import AttentionBackwardProblem, kernel_module

    parts = name.split(":")
    bp = AttentionBackwardProblem.contiguous(2, 1024, 1024, 16, 16, int(parts[1]), causal=True,
                                             dtype="bfloat16", cc=cc, ptr=1 << 20,
                                             deterministic="nd" not in parts)
    start = time.perf_counter()
    family, forced = kernel_module(bp)
    cfg, var = family.compiled(bp, family.choose(bp, forced))
    times["kernels"] = len(family.precompile_kernels(cfg, var))
    with precompile._target(cc):
        family.compile_first(cfg, var)
    times["total"] = time.perf_counter() - start
    times["family"] = family.__name__.rsplit(".", 1)[-1]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in times.items()}


def _decode(name, precompile, cc, times, profile=None):
    """``decode:<head_dim>[:causal]``: flash-decoding's two kernels (split, combine) as
    numbatc.attention's first call compiles them for a bf16 decode step (batch 8, one query,
    32 query heads over 8 KV heads, 4096 keys) of that head dim, as a first launch does
    (decode.compile_first)."""
    from numbatc.attention_api import AttentionProblem
    from numbatc.kernels import sm80_decode_attention as decode

    parts = name.split(":")
    d, causal = int(parts[1]), "causal" in parts
    p = AttentionProblem.contiguous(8, 1, 4096, 32, 8, d, causal=causal, dtype="bfloat16",
                                    cc=cc, ptr=1 << 20)
    start = time.perf_counter()
    with first_call.profiled(profile):
        cfg, var = decode.compiled(p, decode.choose(p))
        decode.precompile_kernels(cfg, var)  # the kernels' sources
        times["source+import"] = time.perf_counter() - start
        with precompile._target(cc):
            decode.compile_first(cfg, var)  # NUMBATC_SERIAL_LINK=1: one after the other
    times["total"] = time.perf_counter() - start
    times["config"] = cfg.name
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in times.items()}


def main(argv):
    repeat, profile, ptx, child, names = 3, None, None, None, []
    it = iter(argv)
    for arg in it:
        if arg == "--repeat":
            repeat = int(next(it))
        elif arg == "--profile":
            profile = next(it)
        elif arg == "--ptx":
            ptx = next(it)
        elif arg == "--child":
            child = next(it)
        else:
            names.append(arg)
    if child is not None:
        print(json.dumps(one(child, profile, ptx)))
        return
    if ptx:
        os.makedirs(ptx, exist_ok=True)
    for name in names:
        runs = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, NUMBATC_CACHE_DIR=cache)
                cmd = [sys.executable, __file__, "--child", name]
                if profile:
                    cmd += ["--profile", profile]
                if ptx:
                    cmd += ["--ptx", os.path.join(ptx, f"{name}.ptx")]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{name}: the child failed ({out.returncode}):\n{out.stderr}")
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        median = statistics.median(r["total"] for r in runs)
        print(json.dumps({"config": name, "median_s": median, "runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1:])
