"""``python -m numbatc precompile``: fill the kernel disk cache before the first call.

A GEMM configuration numbatc has not run before compiles on its first call (numba's typing and
lowering, NVVM, nvJitLink: 2-4 s each on a 2-core host; a model touches a dozen).  Given the
shapes a program will run, :func:`precompile` works out which kernel configurations
``numbatc.gemm`` launches for them (the dispatcher's own plan, numbatc.kernels.dispatch.plan),
drops duplicates, and compiles them in parallel worker processes into the disk cache that
``numbatc.gemm`` reads (``$NUMBATC_CACHE_DIR``, else ``~/.cache/numbatc``): the entries have the
cache key of a launch, so the next process's first call loads them instead of compiling.

Without a GPU (or for another GPU than this one) it compiles for a given compute capability
(``cc="9.0a"``; default: the current device's, else 9.0a): numba compiles and keys its cache by
the current device, for which a stand-in of that capability is used (:func:`_target`).  On the
GPU it compiles for, each kernel is also loaded, as its first launch would, so that the driver's
JIT cache holds the PTX that setmaxnreg kernels are loaded from (intrinsics.launch).

Shapes: ``M x N x K`` with ``dtype`` operands, a row-major ``a`` and ``b`` as ``b_layout``
('col': ``x @ W.T`` of a row-major (N, K) weight, as ``nn.Linear``; 'row': a row-major (K, N)
``b``), 16-byte aligned, numbatc's own output; or the names of ``numbatc.bench.SHAPES``
(``llama8b``, ``decode``, ``table`` ...).  FP8 dtypes (``float8_e4m3fn``, ``float8_e5m2``) are
the per-tensor-scaled GEMM (bf16 output).  Kernels with a user epilogue are compiled per process
and never cached, so they cannot be precompiled.

Attention shapes (``attention=`` / ``--attention``): ``BxSQxSKxHQxHKVxD`` with a trailing ``c``
for causal, e.g. ``2x1024x1024x16x4x128c`` (batch, seqlen_q, seqlen_k, query heads, key/value
heads, head_dim) -- what ``numbatc.attention(q, k, v, causal=...)`` compiles for contiguous
``dtype`` operands (bfloat16 or float16), through numbatc.kernels.dispatch.choose_attention: the
Hopper kernel, the portable one, or flash-decoding's two kernels for a few queries against many
keys.  ``attention_lse=True`` compiles the variants that also write the log-sum-exp
(``return_lse=True``, and torch autograd's forward); ``attention_backward=True``
(``--attention-backward``) those numbatc.attention_backward runs on the same shapes (its
family as ``NUMBATC_ATTN_BWD_KERNEL`` picks it).  An attention kernel's first compile is
the slowest of numbatc's (4-5 s on the H200's host for the Hopper kernel at head_dim 128).
"""

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import os
import re
import sys
import time

__all__ = ["precompile", "parse_shapes", "parse_attention", "parse_cc", "plan", "PrecompileResult",
           "ConfigResult"]

_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
           "f16": "float16", "half": "float16", "float8_e4m3fn": "float8_e4m3fn",
           "float8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
           "e5m2": "float8_e5m2"}
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_ACTIVATIONS = (None, "relu", "gelu", "silu")


# ---------------------------------------------------------------------------------------------
# what to compile
# ---------------------------------------------------------------------------------------------


def _named_sets():
    from numbatc.bench import SHAPES  # stdlib-only at import: no torch

    return SHAPES


def parse_shapes(spec):
    """[(M, N, K), ...] from ``spec``: a string of comma-separated items, each ``MxNxK``
    (positive integers) or a name of numbatc.bench.SHAPES, or an iterable of such strings and
    (M, N, K) tuples.  Duplicates are kept (the plan merges them); a bad item raises ValueError
    naming it and what is accepted."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    shapes = []
    for item in items:
        if isinstance(item, str):
            if item == "":
                continue
            named = _named_sets().get(item)
            if named is not None:
                shapes.extend(tuple(s) for s in named)
                continue
            match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*", item)
            if match is None:
                raise ValueError(
                    f"shape {item!r}: write MxNxK (three positive integers, e.g. 16x4096x4096) or "
                    f"a named set: {', '.join(sorted(_named_sets()))}")
            item = tuple(int(v) for v in match.groups())
        try:
            m, n, k = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ValueError(f"shape {item!r}: an (M, N, K) of three positive integers") from None
        if min(m, n, k) < 1:
            raise ValueError(f"shape {m}x{n}x{k}: M, N and K must be >= 1 (an empty product "
                             "launches no kernel)")
        shapes.append((m, n, k))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def parse_attention(spec):
    """[(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal), ...] from ``spec``: a
    string of comma-separated ``BxSQxSKxHQxHKVxD`` items, ``c`` appended for causal, or an
    iterable of such strings; a bad item raises ValueError naming it."""
    from numbatc.attention_api import _check_heads

    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    shapes = []
    for item in items:
        if item == "":
            continue
        match = re.fullmatch(r"\s*(\d+)x(\d+)x(\d+)x(\d+)x(\d+)x(\d+)(c?)\s*", str(item).lower())
        if match is None:
            raise ValueError(f"attention shape {item!r}: write BxSQxSKxHQxHKVxD (batch, seqlen_q, "
                             "seqlen_k, heads_q, heads_kv, head_dim), with a trailing c for "
                             "causal, e.g. 2x1024x1024x16x4x128c")
        b, sq, sk, hq, hkv, d = (int(v) for v in match.groups()[:6])
        if min(b, sq, hq, hkv) < 1:
            raise ValueError(f"attention shape {item!r}: batch, seqlen_q and the head counts must "
                             "be >= 1 (an empty call launches no kernel)")
        try:  # numbatc.attention's own check of head_dim and the head counts
            _check_heads(d, d, hq, hkv)
        except ValueError as exc:
            raise ValueError(f"attention shape {item!r}: {exc}") from None
        shapes.append((b, sq, sk, hq, hkv, d, match.group(7) == "c"))
    if not shapes:
        raise ValueError("no attention shapes given")
    return shapes


def _attention_name(shape):
    b, sq, sk, hq, hkv, d, causal = shape
    return f"{b}x{sq}x{sk}x{hq}x{hkv}x{d}{'c' if causal else ''}"


def _attention_problem(shape, dtype, lse, cc):
    """numbatc.attention's problem description for contiguous q, k, v of ``shape``."""
    from numbatc.attention_api import AttentionProblem

    b, sq, sk, hq, hkv, d, causal = shape
    return AttentionProblem.contiguous(b, sq, sk, hq, hkv, d, causal=causal, dtype=dtype, cc=cc,
                                       lse=lse, ptr=1 << 20)


def parse_cc(cc):
    """(major, minor) of a compute capability written '9.0a', '9.0', '90a', 'sm_90a', 8.0 or
    (9, 0); the 'a' is implied (numba compiles sm_90 and newer as sm_XYa)."""
    if isinstance(cc, (tuple, list)):
        text = ".".join(str(v) for v in cc[:2])
    else:
        text = str(cc)
    match = re.fullmatch(r"\s*(?:sm_?|compute_)?(\d+)\.?(\d)\s*[af]?\s*", text.lower())
    if match is None:
        raise ValueError(f"compute capability {cc!r}: write it as 9.0a, 9.0, 8.0, sm_90a ...")
    major, minor = int(match.group(1)), int(match.group(2))
    if (major, minor) < (8, 0):
        raise ValueError(f"compute capability {major}.{minor}: numbatc needs 8.0 or newer")
    return major, minor


def _cc_name(cc):
    return f"{cc[0]}.{cc[1]}{'a' if cc >= (9, 0) else ''}"


def _device_cc():
    """(major, minor) of the current CUDA device, or None without one."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        return tuple(cuda.get_current_device().compute_capability)
    except Exception:  # a broken driver counts as no GPU
        return None


def _problem(m, n, k, dtype, a_layout, b_layout, out_dtype, bias, activation, cc):
    """numbatc.gemm's problem description for the shape, as numbatc.gemm builds it for aligned
    operands (the dispatcher reads layouts, alignments, dtypes and sizes, never the arrays)."""
    from numbatc.gemm_api import GemmProblem, Operand

    def operand(name, layout, rows, cols):
        return Operand(name, None, layout, cols if layout == "row" else rows, 16)

    fp8 = dtype in _FP8
    out_dtype = out_dtype or ("bfloat16" if fp8 else dtype)
    return GemmProblem(
        m=m, n=n, k=k, a=operand("a", a_layout, m, k), b=operand("b", b_layout, k, n), c=None,
        bias=Operand("bias", None, "row", n, 16) if bias else None,
        out=operand("out", "row", m, n), alpha=1.0, beta=0.0, activation=activation,
        in_dtype=dtype, b_dtype=dtype, out_dtype=out_dtype,
        bias_dtype=out_dtype if bias else None, acc_dtype="float32", device=None, cc=cc,
        stream_handle=0, tensor_scales=(1.0, 1.0) if fp8 else None)


@dataclasses.dataclass(frozen=True)
class _Job:
    family: str  # the kernel module's name
    config: object
    variant: object
    cc: tuple

    @property
    def label(self):
        extra = " split-K" if getattr(self.variant, "split_k", False) else ""
        if hasattr(self.variant, "head_dim"):  # attention: one configuration serves several
            extra = f" d{self.variant.head_dim}{' causal' if self.variant.causal else ''}"
        return f"{self.family.rsplit('.', 1)[1]} {self.config.name}{extra}"


def plan(shapes, dtype="bfloat16", *, a_layout="row", b_layout="col", out_dtype=None, bias=False,
         activation=None, cc=None, attention=None, attention_lse=False, attention_backward=False):
    """{job: [shapes]}: the distinct kernel configurations (and variants) numbatc.gemm would
    launch for ``shapes`` and numbatc.attention for ``attention`` (with
    ``attention_backward``, numbatc.attention_backward's too), see :func:`precompile`, each
    with the shapes that use it, in the order first met.  Raises ValueError for a bad
    argument."""
    dtype = _DTYPES.get(str(dtype).lower())
    if dtype is None:
        raise ValueError(f"dtype: one of {', '.join(sorted(set(_DTYPES.values())))}")
    for name, value in (("a_layout", a_layout), ("b_layout", b_layout)):
        if value not in ("row", "col"):
            raise ValueError(f"{name}={value!r}: 'row' or 'col'")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation={activation!r}: one of {_ACTIVATIONS}")
    if out_dtype is not None:
        out_dtype = _DTYPES.get(str(out_dtype).lower(), str(out_dtype).lower())
        if out_dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"out_dtype={out_dtype!r}: bfloat16, float16 or float32")
    if dtype in _FP8 and (a_layout, b_layout) != ("row", "col"):
        raise ValueError("FP8 runs K-major operands only: a_layout='row', b_layout='col'")
    from numbatc.kernels import dispatch

    if shapes is None and attention is None:
        raise ValueError("no shapes given: pass GEMM shapes and/or attention shapes")
    cc = parse_cc(cc) if cc is not None else (_device_cc() or (9, 0))
    attention = parse_attention(attention) if attention is not None else []
    if attention and dtype not in ("bfloat16", "float16"):
        raise ValueError(f"attention runs bfloat16 or float16 operands, not {dtype}")
    jobs = {}
    for m, n, k in parse_shapes(shapes) if shapes is not None else ():
        p = _problem(m, n, k, dtype, a_layout, b_layout, out_dtype, bias, activation, cc)
        family, cfg, var = dispatch.plan(p)
        jobs.setdefault(_Job(family.__name__, cfg, var, cc), []).append((m, n, k))
    for shape in attention:
        p = _attention_problem(shape, dtype, attention_lse, cc)
        family, cfg = dispatch.choose_attention(p)
        cfg, var = family.compiled(p, cfg)
        jobs.setdefault(_Job(family.__name__, cfg, var, cc), []).append(_attention_name(shape))
        if attention_backward:  # the kernels numbatc.attention_backward's walk runs
            from numbatc.attention_backward_api import AttentionBackwardProblem, kernel_module

            b, sq, sk, hq, hkv, d, causal = shape
            bp = AttentionBackwardProblem.contiguous(b, sq, sk, hq, hkv, d, causal=causal,
                                                     dtype=dtype, cc=cc, ptr=1 << 20)
            family, name = kernel_module(bp)
            reason = family.unsupported(bp)
            if reason is not None:
                raise ValueError(f"attention backward shape {_attention_name(shape)}: {reason}")
            cfg, var = family.compiled(bp, family.choose(bp, name))
            jobs.setdefault(_Job(family.__name__, cfg, var, cc), []).append(
                _attention_name(shape) + " backward")
    return jobs


# ---------------------------------------------------------------------------------------------
# compiling (in worker processes)
# ---------------------------------------------------------------------------------------------


class _Device:
    """Stands in for the current device when compiling for another (or without one)."""

    id = 0

    def __init__(self, cc):
        self.compute_capability = tuple(cc)


class _Context:
    def __init__(self, cc):
        self.device = _Device(cc)


@contextlib.contextmanager
def _target(cc):
    """numba compiles for, and keys its disk cache by, the current device's compute capability
    (``get_current_device``, ``devices.get_context().device``), and binds each new kernel to the
    current context.  Within the block, unless the current device has capability ``cc``, a
    stand-in of ``cc`` answers, and binding makes the cubin (what a launch would load) without
    loading it: the cache entry is the one a process on such a GPU writes and reads."""
    if _device_cc() == tuple(cc):
        yield
        return
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import devices

    saved = (dispatcher.get_current_device, devices.get_context, dispatcher._Kernel.bind)
    dispatcher.get_current_device = lambda: _Device(cc)
    devices.get_context = lambda devnum=None: _Context(cc)
    dispatcher._Kernel.bind = lambda self: self._codelibrary.get_cubin()
    try:
        yield
    finally:
        dispatcher.get_current_device, devices.get_context, dispatcher._Kernel.bind = saved


def _kernel_and_signature(family, cfg, var):
    """The kernel a launch of (cfg, var) compiles, and the argument types it compiles it for."""
    [(kernel, sig)] = _kernels_and_signatures(family, cfg, var)
    return kernel, sig


def _kernels_and_signatures(family, cfg, var):
    """[(kernel, argument types)] that a launch of (cfg, var) compiles: one, or what a module
    lists (``precompile_kernels``: the attention backward's, flash-decoding's split and combine
    kernels)."""
    if hasattr(family, "precompile_kernels"):
        return [(k, tuple(sig)) for k, sig in family.precompile_kernels(cfg, var)]
    kernel = family.kernel_for(cfg, var)
    if hasattr(family, "kernel_signature"):  # sm90_gemm: tensor maps under the TMA producer
        sig = family.kernel_signature(cfg, var)
    elif len(inspect.signature(family.signature).parameters) > 1:
        sig = family.signature(var, cfg)  # sm90_attention: tensor maps under its TMA producer
    else:
        sig = family.signature(var)
    return [(kernel, tuple(sig))]


def _compile_job(job):
    """Compile ``job`` into the disk cache as a launch would: ("compiled" | "cached" | "failed",
    seconds, error text or None)."""
    start = time.perf_counter()
    try:
        from intrinsics import launch as launching

        family = importlib.import_module(job.family)
        kernels = _kernels_and_signatures(family, job.config, job.variant)
        misses = [kernel._cache_misses[sig] for kernel, sig in kernels]  # numba's counts
        if _device_cc() == tuple(job.cc):
            # the first launch's own path: compile (or load), load the module, and for a
            # setmaxnreg kernel the driver's JIT of its PTX (whose cache then holds it)
            launching.compile_kernels(kernels)
            for kernel, sig in kernels:
                launching._plan_for(kernel, sig, 0, None, None)
        else:
            with _target(job.cc):
                launching.compile_kernels(kernels)
        # neither count moves when this process has the kernel in memory already (jobs=0)
        compiled = any(kernel._cache_misses[sig] > before
                       for (kernel, sig), before in zip(kernels, misses))
        return "compiled" if compiled else "cached", time.perf_counter() - start, None
    except Exception as exc:  # reported with the job; the others go on
        text = f"{type(exc).__name__}: {str(exc).strip()}"
        return "failed", time.perf_counter() - start, text


# ---------------------------------------------------------------------------------------------
# the entry points
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ConfigResult:
    kernel: str  # e.g. "sm90_gemm 128x256x64_4s_pt_tma"
    variant: object
    shapes: list
    status: str  # "compiled" | "cached" | "failed"
    seconds: float
    error: str | None = None


@dataclasses.dataclass
class PrecompileResult:
    configs: list
    seconds: float
    cc: tuple
    cache_dir: str
    jobs: int

    def _count(self, status):
        return sum(r.status == status for r in self.configs)

    @property
    def compiled(self):
        return self._count("compiled")

    @property
    def cached(self):
        return self._count("cached")

    @property
    def failed(self):
        return self._count("failed")

    def summary(self):
        shapes = sum(len(r.shapes) for r in self.configs)
        return (f"precompile: {len(self.configs)} configuration(s) for {shapes} shape(s), "
                f"cc {_cc_name(self.cc)}: {self.compiled} compiled, {self.cached} already "
                f"cached, {self.failed} failed in {self.seconds:.1f} s ({self.jobs} process(es)); "
                f"cache: {self.cache_dir}")


def _cache_dir():
    from numbatc.kernels.build import cache_dir

    return str(cache_dir())


def _worker_init():
    import warnings

    warnings.filterwarnings("ignore", module="numba")


def precompile(shapes, dtype="bfloat16", *, a_layout="row", b_layout="col", out_dtype=None,
               bias=False, activation=None, cc=None, jobs=None, progress=True, attention=None,
               attention_lse=False, attention_backward=False):
    """Fill the disk cache with the GEMM kernels ``numbatc.gemm`` would compile for ``shapes``
    and the attention kernels ``numbatc.attention`` would compile for ``attention``.

    ``shapes``: "1x4096x4096,16x4096x4096", a named set of numbatc.bench.SHAPES ("llama8b"), or a
    list of (M, N, K) tuples / such strings; ``dtype`` of a and b (bfloat16, float16,
    float8_e4m3fn, float8_e5m2); ``b_layout`` 'col' (``x @ W.T``, the default) or 'row';
    ``out_dtype``, ``bias`` and ``activation`` as the calls will pass them (they select the
    kernel's epilogue).  ``cc``: the compute capability to compile for ("9.0a"; default: the
    current device's, else 9.0a).  ``jobs``: worker processes (default os.cpu_count(); 0
    compiles in this process).  ``progress``: a progress bar on stderr.  ``attention``:
    "2x1024x1024x16x4x128c,..." (``BxSQxSKxHQxHKVxD``, ``c`` for causal; ``shapes`` may then be
    None), in ``dtype``; ``attention_lse``: the calls return the log-sum-exp too;
    ``attention_backward``: numbatc.attention_backward runs on them too (training).

    Returns a :class:`PrecompileResult` (its ``summary()`` is the line the command prints); a
    configuration that fails to compile is reported there (``failed``), not raised."""
    start = time.perf_counter()
    planned = plan(shapes, dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out_dtype,
                   bias=bias, activation=activation, cc=cc, attention=attention,
                   attention_lse=attention_lse, attention_backward=attention_backward)
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 0:
        raise ValueError(f"jobs={jobs}: a number of processes >= 0")
    # the longest compiles first: attention, then the large Hopper GEMM tiles
    order = sorted(planned, key=lambda j: -(getattr(j.config, "bm", 0) * getattr(j.config, "bn", 0)
                                            * (2 if "sm90" in j.family else 1)
                                            + (10**6 if "attention" in j.family else 0)))
    bar = None
    if progress:
        from numbatc.bench import Progress

        bar = Progress(len(order), "precompile")
    results = {}

    def record(job, outcome):
        status, seconds, error = outcome
        results[job] = ConfigResult(job.label, job.variant, planned[job], status, seconds, error)
        if bar is not None:
            bar.step(f"{job.label}: {status}")

    workers = min(jobs, len(order))
    if workers == 0:
        for job in order:
            record(job, _compile_job(job))
    else:
        import concurrent.futures
        import multiprocessing

        # spawn: a worker must not inherit a CUDA context, nor numba state patched by another
        with concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init) as pool:
            futures = {pool.submit(_compile_job, job): job for job in order}
            for future in concurrent.futures.as_completed(futures):
                job = futures[future]
                try:
                    outcome = future.result()
                except Exception as exc:  # a worker that died (out of memory, a signal)
                    outcome = ("failed", 0.0, f"{type(exc).__name__}: {exc}")
                record(job, outcome)
    configs = [results[job] for job in planned]
    return PrecompileResult(configs, time.perf_counter() - start,
                            next(iter(planned)).cc, _cache_dir(), max(workers, 1))


def main(argv=None):
    """``python -m numbatc precompile``: see the module docstring (and --help)."""
    names = ", ".join(sorted(_named_sets()))
    parser = argparse.ArgumentParser(
        prog="python -m numbatc precompile",
        description="Compile the GEMM kernels numbatc.gemm and the attention kernels "
                    "numbatc.attention will choose for lists of shapes into their disk cache "
                    "($NUMBATC_CACHE_DIR, else ~/.cache/numbatc), in parallel, so that their "
                    "first calls load instead of compiling.")
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated MxNxK GEMM shapes and/or named sets ({names}), "
                             "e.g. 1x4096x4096,16x4096x4096,llama8b")
    parser.add_argument("--attention", default=None,
                        help="comma-separated numbatc.attention shapes BxSQxSKxHQxHKVxD (batch, "
                             "seqlen_q, seqlen_k, query heads, key/value heads, head_dim), a "
                             "trailing c for causal, e.g. 2x1024x1024x16x4x128c,1x1x8192x32x8x128")
    parser.add_argument("--attention-lse", action="store_true",
                        help="the attention calls return the log-sum-exp too (return_lse=True, "
                             "torch autograd)")
    parser.add_argument("--attention-backward", action="store_true",
                        help="numbatc.attention_backward runs on the attention shapes too "
                             "(training; its kernel family as NUMBATC_ATTN_BWD_KERNEL chooses)")
    parser.add_argument("--dtype", default="bfloat16",
                        help="a's and b's dtype: bfloat16 (default), float16, float8_e4m3fn, "
                             "float8_e5m2 (FP8 with per-tensor scales)")
    parser.add_argument("--b-layout", default="col", choices=("col", "row"),
                        help="b's layout: col = the transpose of a row-major (N, K) weight, "
                             "x @ W.T as nn.Linear (default); row = a row-major (K, N) b")
    parser.add_argument("--a-layout", default="row", choices=("row", "col"),
                        help="a's layout (default row)")
    parser.add_argument("--out-dtype", default=None,
                        help="output dtype (default: a's; bfloat16 for FP8)")
    parser.add_argument("--bias", action="store_true", help="the calls pass a bias")
    parser.add_argument("--activation", default=None, choices=("relu", "gelu", "silu"),
                        help="the calls' activation")
    parser.add_argument("--cc", default=None,
                        help="compute capability to compile for, e.g. 9.0a or 8.0 (default: "
                             "the current GPU's, else 9.0a)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: os.cpu_count(), here %(default)s; 0: "
                             "compile in this process)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the configurations the shapes use, compile nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.shapes and not args.attention:
        parser.error("give --shapes (GEMM) and/or --attention")
    options = dict(a_layout=args.a_layout, b_layout=args.b_layout, out_dtype=args.out_dtype,
                   bias=args.bias, activation=args.activation, cc=args.cc,
                   attention=args.attention, attention_lse=args.attention_lse,
                   attention_backward=args.attention_backward)
    try:
        if args.dry_run:
            planned = plan(args.shapes, args.dtype, **options)
            for job, shapes in planned.items():
                print(f"{job.label}: " + ", ".join(
                    s if isinstance(s, str) else "x".join(map(str, s)) for s in shapes))
            return 0
        result = precompile(args.shapes, args.dtype, jobs=args.jobs,
                            progress=not args.quiet, **options)
    except ValueError as exc:
        parser.error(str(exc))
    for r in result.configs:
        if r.status == "failed":
            print(f"FAILED {r.kernel}: {r.error}", file=sys.stderr)
    print(result.summary())
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
