"""numbatc.precompile / ``python -m numbatc precompile`` (CPU): the configurations a list of shapes
uses, merged; one real fill of a temporary NUMBATC_CACHE_DIR for compute capability 8.0 (two
small sm80_gemm configurations), found again by a second run and by the launch's compile path;
clear errors for bad specifications."""

import importlib
import os
import subprocess
import sys

import pytest

import numbatc

pc = importlib.import_module("numbatc.precompile")  # the module; numbatc.precompile is the function


def test_parse_shapes_accepts_sizes_and_named_sets():
    from numbatc.bench import SHAPES

    assert pc.parse_shapes("1x4096x4096, 16X4096x4096") == [(1, 4096, 4096), (16, 4096, 4096)]
    assert pc.parse_shapes("llama8b") == [tuple(s) for s in SHAPES["llama8b"]]
    assert pc.parse_shapes([(2, 3, 4), "5x6x7"]) == [(2, 3, 4), (5, 6, 7)]


@pytest.mark.parametrize("spec, message", [
    ("4096x4096", "MxNxK"),
    ("llama9b", "named set"),
    ("16x4096x0", ">= 1"),
    ("", "no shapes"),
    ([(1, 2)], "three positive integers"),
])
def test_bad_shapes_say_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message):
        pc.parse_shapes(spec)


def test_parse_cc():
    assert pc.parse_cc("9.0a") == pc.parse_cc("sm_90a") == pc.parse_cc("90") == (9, 0)
    assert pc.parse_cc(8.0) == pc.parse_cc((8, 0)) == (8, 0)
    with pytest.raises(ValueError, match="8.0 or newer"):
        pc.parse_cc("7.5")
    with pytest.raises(ValueError, match="9.0a"):
        pc.parse_cc("hopper")


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="dtype"):
        pc.plan("16x16x16", "int8", cc="9.0a")
    with pytest.raises(ValueError, match="b_layout"):
        pc.plan("16x16x16", b_layout="diag", cc="9.0a")
    with pytest.raises(ValueError, match="K-major"):
        pc.plan("16x16x16", "float8_e4m3fn", b_layout="row", cc="9.0a")


def test_cli_reports_a_bad_spec(capsys):
    with pytest.raises(SystemExit) as exit_:
        pc.main(["--shapes", "1x2", "--cc", "9.0a"])
    assert exit_.value.code == 2
    assert "shape '1x2': write MxNxK" in capsys.readouterr().err


def test_plan_merges_shapes_that_share_a_configuration():
    """Every shape lands in exactly one job, and jobs are distinct (config, variant) choices of
    the dispatcher; the llama8b layers at M = 4096 and a 4096^3 square share one."""
    shapes = "1x4096x4096,16x4096x4096,4096x4096x4096,llama8b,1x4096x4096"
    planned = pc.plan(shapes, cc="9.0a")
    assert sum(len(v) for v in planned.values()) == len(pc.parse_shapes(shapes))
    keys = [(job.family, job.config.name, job.variant) for job in planned]
    assert len(set(keys)) == len(keys)
    square = next(job for job, members in planned.items() if (4096, 4096, 4096) in members)
    assert all(s in planned[square] for s in [(4096, 6144, 4096), (4096, 28672, 4096)])
    from numbatc.kernels import dispatch

    for job, members in planned.items():  # each job is the dispatcher's plan for its shapes
        for m, n, k in members:
            p = pc._problem(m, n, k, "bfloat16", "row", "col", None, False, None, (9, 0))
            family, cfg, var = dispatch.plan(p)
            assert (family.__name__, cfg, var) == (job.family, job.config, job.variant)


def test_each_configuration_is_compiled_once(monkeypatch):
    """The compile step runs once per distinct configuration; a second run reports them cached."""
    done, calls = set(), []

    def fake(job):
        calls.append(job)
        status = "cached" if job in done else "compiled"
        done.add(job)
        return status, 0.0, None

    monkeypatch.setattr(pc, "_compile_job", fake)
    shapes = "1x4096x4096,16x4096x4096,32x4096x4096,128x4096x4096,4096x4096x4096,llama8b"
    first = numbatc.precompile(shapes, cc="9.0a", jobs=0, progress=False)
    assert len(calls) == len(first.configs) == len(pc.plan(shapes, cc="9.0a"))
    assert (first.compiled, first.cached, first.failed) == (len(calls), 0, 0)
    second = numbatc.precompile(shapes, cc="9.0a", jobs=0, progress=False)
    assert (second.compiled, second.cached) == (0, len(first.configs))
    assert "already cached" in second.summary()


def test_a_failing_configuration_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(pc, "_compile_job", lambda job: ("failed", 0.0, "RuntimeError: boom"))
    result = numbatc.precompile("16x4096x4096", cc="8.0", jobs=0, progress=False)
    assert result.failed == 1 and result.configs[0].error == "RuntimeError: boom"


def test_precompile_fills_the_cache_the_launch_reads(tmp_path, monkeypatch):
    """Two sm80_gemm configurations (three shapes) compiled for cc 8.0 by a worker process into
    a fresh NUMBATC_CACHE_DIR; a second run (a new worker) finds both; and the launch's own
    compile path (intrinsics.launch.compile_kernel, as for a GPU of cc 8.0) takes numba's
    disk-cache hit for them, compiling nothing."""
    monkeypatch.setenv("NUMBATC_CACHE_DIR", str(tmp_path / "cache"))
    shapes = "1x256x256,16x512x256,32x256x256"
    planned = pc.plan(shapes, cc="8.0")
    assert sorted(job.config.name for job in planned) == ["16x128x64_4w_6s_fp", "64x128x64_4w_4s"]
    first = numbatc.precompile(shapes, cc="8.0", jobs=1, progress=False)
    assert (first.compiled, first.cached, first.failed) == (2, 0, 0), first.configs
    assert len(list((tmp_path / "cache" / "kernels" / "__pycache__").glob("*.nbi"))) == 2
    second = numbatc.precompile(shapes, cc="8.0", jobs=1, progress=False)
    assert (second.compiled, second.cached, second.failed) == (0, 2, 0), second.configs

    from intrinsics import launch as launching

    for job in planned:
        family = importlib.import_module(job.family)
        kernel_for = getattr(family.kernel_for, "__wrapped__", family.kernel_for)  # no memo
        kernel = kernel_for(job.config, job.variant)
        sig = pc._kernel_and_signature(family, job.config, job.variant)[1]
        with pc._target((8, 0)):
            launching.compile_kernel(kernel, sig)
        assert (kernel._cache_hits[sig], kernel._cache_misses[sig]) == (1, 0)


def test_python_m_numbatc_precompile_dry_run():
    run = subprocess.run([sys.executable, "-m", "numbatc", "precompile", "--shapes",
                          "16x4096x4096,4096x4096x4096", "--cc", "9.0a", "--dry-run"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 2 and any("4096x4096x4096" in line for line in lines)


def test_attention_shapes_plan_the_kernels_the_call_chooses():
    """Attention shapes plan what numbatc.attention's walk chooses: the Hopper kernel at head dims
    64 / 128 / 256 on 9.0 (causal and not: separate variants), flash-decoding for one query
    against many keys, the portable kernel on 8.0; one configuration per variant, however many
    shapes share it."""
    planned = pc.plan(None, cc="9.0a", attention="2x1024x1024x16x4x128c,4x512x512x8x8x128c,"
                                                 "1x1x8192x32x8x128,1x2048x2048x8x8x256,"
                                                 "4x100x200x8x2x64")
    labels = {job.label: shapes for job, shapes in planned.items()}
    assert labels == {
        "sm90_attention n128_2s_ov_pp_fx_tma d128 causal": ["2x1024x1024x16x4x128c",
                                                            "4x512x512x8x8x128c"],
        "sm80_decode_attention m16_w4_k16_s3 d128": ["1x1x8192x32x8x128"],
        "sm90_attention n80_2s_ov_pp_fx_tma d256": ["1x2048x2048x8x8x256"],
        "sm90_attention n128_2s_ov_pp_fx_tma d64": ["4x100x200x8x2x64"]}
    [job] = pc.plan(None, cc="8.0", attention="2x1024x1024x16x4x128c")
    assert job.family.endswith("sm80_attention") and job.variant.causal
    [job] = pc.plan(None, cc="9.0a", attention="2x64x64x2x2x64", attention_lse=True)
    assert job.variant.with_lse
    both = pc.plan("16x4096x4096", cc="9.0a", attention="2x64x64x2x2x64")
    assert len(both) == 2


def test_attention_backward_plans_the_family_the_call_runs(monkeypatch):
    """attention_backward=True adds numbatc.attention_backward's kernels for the same shapes: the
    family the call runs (on 9.0a the Hopper one at head_dim 128, the portable one at 64; on 8.0
    the portable one), the Hopper one where NUMBATC_ATTN_BWD_KERNEL=sm90 forces it (an error
    naming the reason where it cannot run the shape); each job lists the kernels a launch
    compiles (precompile_kernels)."""
    monkeypatch.delenv("NUMBATC_ATTN_BWD_KERNEL", raising=False)
    spec = "2x1024x1024x16x4x128c,1x300x700x8x2x64"
    planned = pc.plan(None, cc="9.0a", attention=spec, attention_backward=True)
    labels = {job.label: shapes for job, shapes in planned.items()}
    assert labels["sm90_attention_backward d128 d128 causal"] == ["2x1024x1024x16x4x128c backward"]
    assert labels["sm80_attention_backward d64 d64"] == ["1x300x700x8x2x64 backward"]
    assert len(labels) == 4
    planned = pc.plan(None, cc="8.0", attention=spec, attention_backward=True)
    assert {job.label for job in planned if "backward" in job.family} == {
        "sm80_attention_backward d128 d128 causal", "sm80_attention_backward d64 d64"}
    for job in planned:
        if "backward" in job.family:
            family = importlib.import_module(job.family)
            assert len(pc._kernels_and_signatures(family, job.config, job.variant)) == 3
    monkeypatch.setenv("NUMBATC_ATTN_BWD_KERNEL", "sm90")
    planned = pc.plan(None, cc="9.0a", attention="1x300x700x8x2x64", attention_backward=True)
    [job] = [j for j in planned if "backward" in j.family]
    assert job.label == "sm90_attention_backward d64 d64" and job.variant.deterministic
    family = importlib.import_module(job.family)
    kernels = pc._kernels_and_signatures(family, job.config, job.variant)
    assert len(kernels) == 4 and all(isinstance(sig, tuple) for _, sig in kernels)
    with pytest.raises(ValueError, match="head_dim"):
        pc.plan(None, cc="9.0a", attention="1x300x700x8x2x96", attention_backward=True)


@pytest.mark.parametrize("spec, message", [
    ("2x1024x1024x16x128", "BxSQxSKxHQxHKVxD"),
    ("2x64x64x6x4x64", "multiple of heads_kv"),
    ("2x64x64x4x4x60", "multiple of 8"),
    ("0x64x64x4x4x64", ">= 1"),
    (" , ", "no attention shapes"),
])
def test_bad_attention_shapes_say_what_is_accepted(spec, message):
    with pytest.raises(ValueError, match=message):
        pc.plan(None, cc="9.0a", attention=spec)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        pc.plan(None, "float8_e4m3fn", cc="9.0a", attention="2x64x64x2x2x64")
    with pytest.raises(ValueError, match="no shapes given"):
        pc.plan(None, cc="9.0a")


def test_precompile_fills_the_attention_cache_the_launch_reads(tmp_path, monkeypatch):
    """An attention shape (the portable kernel on 8.0) and a decode shape (flash-decoding's two
    kernels) compiled into a fresh cache by a worker process; every kernel is then a disk-cache
    hit for the launch's compile path in this one."""
    monkeypatch.setenv("NUMBATC_CACHE_DIR", str(tmp_path / "cache"))
    spec = "2x64x80x2x1x64c,1x1x8192x8x1x64"
    first = numbatc.precompile(None, cc="8.0", jobs=1, progress=False, attention=spec)
    assert (first.compiled, first.failed) == (2, 0), first.configs

    from intrinsics import launch as launching

    kernels = 0
    for job in pc.plan(None, cc="8.0", attention=spec):
        family = importlib.import_module(job.family)
        kernel_for = getattr(family.kernel_for, "__wrapped__", family.kernel_for)  # no memo
        made = kernel_for(job.config, job.variant)
        made = made if isinstance(made, (tuple, list)) else (made,)
        sigs = [sig for _, sig in pc._kernels_and_signatures(family, job.config, job.variant)]
        for kernel, sig in zip(made, sigs):
            with pc._target((8, 0)):
                launching.compile_kernel(kernel, sig)
            assert (kernel._cache_hits[sig], kernel._cache_misses[sig]) == (1, 0), job.label
            kernels += 1
    assert kernels == 3


def test_precompile_fills_the_cache_of_a_kernel_written_as_code(tmp_path, monkeypatch):
    """sm90_gemm's TMA kernel is factory-made code (sm90_gemm_tma.make_kernel), cached through
    numbatc.kernels.build.cache_kernel: precompile for cc 9.0a compiles it in a worker process
    into a fresh NUMBATC_CACHE_DIR, a second run finds it, and a new dispatcher of the same
    configuration and variant (the launch's compile path, in this process) loads it, compiling
    nothing -- while another variant's kernel misses (the index is per kernel)."""
    from dataclasses import replace

    from numbatc.kernels import sm90_gemm_tma

    monkeypatch.setenv("NUMBATC_CACHE_DIR", str(tmp_path / "cache"))
    shapes = "64x4096x4096"
    [job] = pc.plan(shapes, cc="9.0a")
    assert job.config.producer == "tma", job.config.name
    first = numbatc.precompile(shapes, cc="9.0a", jobs=1, progress=False)
    assert (first.compiled, first.cached, first.failed) == (1, 0, 0), first.configs
    second = numbatc.precompile(shapes, cc="9.0a", jobs=1, progress=False)
    assert (second.compiled, second.cached, second.failed) == (0, 1, 0), second.configs

    from intrinsics import launch as launching

    family = importlib.import_module(job.family)
    sig = pc._kernel_and_signature(family, job.config, job.variant)[1]
    kernel = sm90_gemm_tma.make_kernel.__wrapped__(job.config, job.variant)  # a new dispatcher
    with pc._target(job.cc):
        launching.compile_kernel(kernel, sig)
    assert (kernel._cache_hits[sig], kernel._cache_misses[sig]) == (1, 0)
    assert [p.name for p in (tmp_path / "cache" / "kernels").glob("*.nbi")] == [
        f"{kernel._cache.name}.nbi"]
    other = sm90_gemm_tma.make_kernel.__wrapped__(job.config,
                                                  replace(job.variant, activation="relu"))
    assert other._cache.name != kernel._cache.name
