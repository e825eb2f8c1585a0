"""``python -m numbatc``: the project's main job.

On a machine with a CUDA GPU it runs every example in ``examples/`` and checks its result.  Without
one it compiles every example kernel, numbatc's default GEMM and attention kernels (with the
attention backward and the paged decode kernel) and every intrinsic probe
(:mod:`intrinsics.catalog`) for each architecture the project claims, assembles the PTX with
nvJitLink, runs every example in the CPU emulation (each in a child process with
``NUMBA_ENABLE_CUDASIM=1``: the simulator must be chosen before numba is imported), and reports
what it found.  The exit status is 0 only when everything that should work did.
"""

import argparse
import collections
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import ARCHS, assemble, cc_of, compile_ptx

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _gpu_name():
    from numba import cuda

    try:
        if not cuda.is_available():
            return None
        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else device.name
        return f"{name} (cc {device.compute_capability[0]}.{device.compute_capability[1]})"
    except Exception:  # a broken driver counts as no GPU
        return None


def _load_examples():
    if not EXAMPLES.is_dir():
        print(f"examples/ is not next to the package ({EXAMPLES}): an installed (non-editable) "
              "numbatc ships no examples, so they are NOT checked; run `python -m numbatc` "
              "from a source checkout (pip install -e .) to check them")
        return None
    modules = []
    for path in sorted(EXAMPLES.glob("ex[0-9][0-9]*_*.py")):
        spec = importlib.util.spec_from_file_location(f"numbatc_examples.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules


def _compile_one(kernel, signature, arch):
    """'ok', 'refused' (ArchitectureError) or an error message."""
    try:
        assemble(compile_ptx(kernel, signature, arch), arch)
        return "ok"
    except ArchitectureError:
        return "refused"
    except Exception as exc:  # report, do not hide: the caller counts it as a failure
        cause = exc
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, ArchitectureError) or "needs sm_" in str(exc):
            return "refused"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def run_examples(modules):
    """(failures, skipped): an example's run() returns True, False, or None when what it needs
    (torch, transformers) is not installed."""
    failures, skipped = 0, 0
    print("\n== examples on the GPU")
    for module in modules:
        name = module.__name__.rsplit(".", 1)[1]
        start = time.perf_counter()
        try:
            ok = module.run(verbose=False)
            status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        except Exception as exc:
            ok, status = False, f"ERROR {type(exc).__name__}: {exc}"
        if ok is None:
            skipped += 1
            status += f" ({module._missing()})" if hasattr(module, "_missing") else ""
        else:
            failures += not ok
        print(f"  {name:32s} {status}  ({time.perf_counter() - start:.1f} s)")
    return failures, skipped


def compile_examples(modules, archs):
    failures = 0
    print(f"\n== example kernels, compiled and assembled for {', '.join(archs)}")
    for module in modules:
        name = module.__name__.rsplit(".", 1)[1]
        for kernel, signature, oldest in module.KERNELS:
            results = []
            for arch in archs:
                if cc_of(arch)[:2] < cc_of(oldest)[:2] or (
                    len(cc_of(oldest)) > 2 and cc_of(arch) != cc_of(oldest)
                ):
                    results.append(f"{arch}: -")
                    continue
                outcome = _compile_one(kernel, signature, arch)
                failures += outcome != "ok"
                results.append(f"{arch}: {outcome}")
            kname = getattr(kernel, "__name__", getattr(getattr(kernel, "py_func", None), "__name__", "?"))
            print(f"  {name}.{kname}: " + "  ".join(results))
    return failures


def _library_kernels():
    """(name, kernel, signature, arch, launch_bounds) of the kernels numbatc.gemm and
    numbatc.attention choose by default: the portable ones for sm_80, the Hopper ones (TMA and
    cp.async producers, bf16 and FP8; attention at head_dim 128 and 256) for sm_90a; and those
    of numbatc.attention_backward (the portable ones and the Hopper one) and of
    numbatc.attention_with_kvcache's paged decode."""
    from numbatc.kernels import (sm80_attention, sm80_attention_backward, sm80_decode_attention,
                                 sm80_gemm, sm90_attention, sm90_attention_backward, sm90_gemm)
    from numbatc.kernels.epilogue import GemmVariant

    bf16 = GemmVariant("row", "col", "bfloat16", "bfloat16", None, None, None)
    fp8 = sm90_gemm.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                                   b_dtype="float8_e4m3fn")
    cases = []
    cfg = sm80_gemm.CONFIGS[sorted(sm80_gemm.CONFIGS)[0]]
    cases.append((f"sm80_gemm {cfg.name}", sm80_gemm.kernel_for(cfg, bf16),
                  sm80_gemm.signature(bf16), "sm_80", None))
    for name, var in (("128x256x64_4s_pt_tma", bf16), ("128x256x64_4s_pt", bf16),
                      ("fp8_128x256x128_4s_pt_tma", fp8)):
        cfg = sm90_gemm.CONFIGS.get(name) or sm90_gemm.FP8_CONFIGS[name]
        cases.append((f"sm90_gemm {name}", sm90_gemm.kernel_for(cfg, var),
                      sm90_gemm.kernel_signature(cfg, var), "sm_90a", (cfg.threads, 1)))
    var = sm80_attention.AttnVariant(128, "bfloat16", True, True)
    cfg = sm80_attention.choose_config(128)
    cases.append((f"sm80_attention {cfg.name}", sm80_attention.kernel_for(cfg, var),
                  sm80_attention.signature(var), "sm_80", None))
    for d in (128, 256):  # head_dim 256: the Hopper kernel's 128 x 80 tiles
        var = sm80_attention.AttnVariant(d, "bfloat16", True, True)
        cfg = sm90_attention.choose_config(d)
        cases.append((f"sm90_attention {cfg.name} d{d}", sm90_attention.kernel_for(cfg, var),
                      sm90_attention.signature(var, cfg), "sm_90a", (cfg.threads, 1)))
    # the attention backward's three kernels, and flash-decoding over a paged KV cache
    bvar = sm80_attention_backward.BwdVariant(128, "bfloat16", True)
    bcfg = sm80_attention_backward.choose_config(128)
    sigs = sm80_attention_backward.signatures()
    for part, kernel in sm80_attention_backward.kernels_for(bcfg, bvar).items():
        cases.append((f"sm80_attention_backward {bcfg.name} {part}", kernel,
                      sigs["dkdv" if part in ("both", "dk", "dv") else part], "sm_80", None))
    # the Hopper backward (head_dim 128 by default, 64 with deterministic=False)
    for d in sm90_attention_backward.HEAD_DIMS:
        hcfg = sm90_attention_backward.CONFIGS[sm90_attention_backward.TILES[d]]
        hvar = sm90_attention_backward.Sm90BwdVariant(d, "bfloat16", True)
        cases.append((f"sm90_attention_backward {hcfg.name}",
                      sm90_attention_backward.make_kernel(hcfg, hvar),
                      sm90_attention_backward.kernel_signature(hvar), "sm_90a", (hcfg.threads, 1)))
    dvar = sm80_decode_attention.DecodeVariant(128, "bfloat16", True, True, kv_cache=True,
                                               paged=True)
    dcfg = sm80_decode_attention.CONFIGS["m16_w4_k16_s3"]
    for part, kernel, sig in zip(("split", "combine"), sm80_decode_attention.kernel_for(dcfg, dvar),
                                 sm80_decode_attention.signature(dvar)):
        cases.append((f"sm80_decode_attention {dcfg.name} paged {part}", kernel, sig, "sm_80",
                      None))
    return cases


def compile_library():
    failures = 0
    print("\n== numbatc's default kernels (gemm, attention), compiled and assembled")
    for name, kernel, signature, arch, bounds in _library_kernels():
        start = time.perf_counter()
        try:
            assemble(compile_ptx(kernel, signature, arch, launch_bounds=bounds), arch)
            outcome = "ok"
        except Exception as exc:  # report, do not hide
            outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        failures += outcome != "ok"
        print(f"  {name} ({arch}): {outcome}  ({time.perf_counter() - start:.1f} s)", flush=True)
    return failures


def emulate_examples(modules):
    """(failures, skipped): each example run as a script under the CPU emulation."""
    failures = skipped = 0
    print("\n== examples in the CPU emulation (NUMBA_ENABLE_CUDASIM=1, one process each)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    for module in modules:
        path = pathlib.Path(module.__file__)
        start = time.perf_counter()
        try:
            run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                                 text=True, timeout=900)
            last = (run.stdout.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            run, last = None, "TIMEOUT (900 s)"
        if run is not None and run.returncode == 0 and last.startswith("SKIP"):
            skipped += 1
            status = last
        elif run is not None and run.returncode == 0 and last == "PASS":
            status = "PASS"
        else:
            failures += 1
            tail = "" if run is None else (run.stderr.strip().splitlines() or [""])[-1][:200]
            status = f"FAIL: {last} {tail}".strip()
        print(f"  {path.stem:32s} {status}  ({time.perf_counter() - start:.1f} s)", flush=True)
    return failures, skipped


def compile_intrinsics(archs):
    from intrinsics.catalog import probes

    print(f"\n== intrinsics: one probe kernel per form, for {', '.join(archs)}")
    table = collections.OrderedDict()
    failures = []
    for probe in probes():
        row = table.setdefault(probe.family, {arch: [0, 0] for arch in archs})
        for arch in archs:
            expect = probe.arch.accepts(cc_of(arch))
            outcome = _compile_one(probe.kernel, probe.signature, arch)
            if outcome == "ok" and expect:
                row[arch][0] += 1
            elif outcome == "refused" and not expect:
                row[arch][1] += 1
            else:
                failures.append(f"{probe.family} {probe.name} on {arch}: {outcome} "
                                f"(expected {'to assemble' if expect else 'a refusal'})")
        if sys.stdout.isatty():  # progress on a terminal; logs get the table only
            print(f"  {probe.family:12s} {probe.name:40s}", end="\r", flush=True)
    width = max(len(f) for f in table) if table else 8
    if sys.stdout.isatty():
        print(" " * 60, end="\r")
    print(f"  {'family':{width}s}  " + "  ".join(f"{a:>14s}" for a in archs))
    for family, row in table.items():
        cells = "  ".join(f"{ok:4d} ok {ref:3d} n/a" for ok, ref in (row[a] for a in archs))
        print(f"  {family:{width}s}  {cells}")
    print("  (ok: compiled and assembled; n/a: refused by design, the architecture lacks it)")
    for line in failures:
        print("  UNEXPECTED:", line)
    return len(failures)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m numbatc", description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true",
                        help="compile and assemble only: no GPU run, no emulation run")
    parser.add_argument("--arch", action="append", choices=list(ARCHS),
                        help="architectures to compile for (default: all claimed)")
    args = parser.parse_args(argv)
    archs = args.arch or list(ARCHS)

    import intrinsics
    import numbatc

    gpu = None if args.compile_only else _gpu_name()
    print(f"numbatc {numbatc.__version__}, intrinsics {intrinsics.__version__}; "
          f"GPU: {gpu or 'none (compile' + ('-only mode)' if args.compile_only else ' and emulation mode)')}")
    modules = _load_examples()
    failures = skipped = 0
    if gpu and modules is not None:
        failures, skipped = run_examples(modules)
    else:
        if modules is not None:
            failures += compile_examples(modules, archs)
        failures += compile_library()
        failures += compile_intrinsics(archs)
        if modules is not None and not args.compile_only:
            bad, skipped = emulate_examples(modules)
            failures += bad
    if failures:
        print(f"\n{failures} FAILURE(S)")
    elif modules is None:
        # NOTE: not the plain OK: this job checked the intrinsics only
        print("\nOK (intrinsics only: the examples were not checked, see above)")
    elif skipped:
        print(f"\nOK ({skipped} example(s) skipped, see above)")
    else:
        print("\nOK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
