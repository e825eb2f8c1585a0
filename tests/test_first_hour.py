"""What a new user meets in the first hour, on the CPU: ``python -m numbatc`` where the
examples are not installed says so and does not print the plain OK; ``python -m numbatc.bench``
explains every subcommand and option and what it needs; the layout viewer names ``--lane``;
the examples run without ml_dtypes (checked in the emulation by tests/test_emulation_suite.py;
here: they do not import it)."""

import pathlib
import subprocess
import sys

import pytest

from numbatc import demo

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_demo_without_examples_says_what_it_did_not_check(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "EXAMPLES", tmp_path / "examples")  # as after `pip install .`
    monkeypatch.setattr(demo, "_gpu_name", lambda: None)
    monkeypatch.setattr(demo, "compile_intrinsics", lambda archs: 0)
    monkeypatch.setattr(demo, "compile_library", lambda: 0)
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert "NOT checked" in out and "pip install -e ." in out
    last = out.strip().splitlines()[-1]
    assert last != "OK" and last.startswith("OK (intrinsics only")


def test_demo_with_examples_prints_plain_ok(monkeypatch, capsys):
    monkeypatch.setattr(demo, "_gpu_name", lambda: None)
    monkeypatch.setattr(demo, "compile_intrinsics", lambda archs: 0)
    monkeypatch.setattr(demo, "compile_examples", lambda modules, archs: 0)
    monkeypatch.setattr(demo, "compile_library", lambda: 0)
    monkeypatch.setattr(demo, "_load_examples", lambda: [])
    assert demo.main([]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "OK"


def test_demo_runs_the_examples_in_the_emulation(tmp_path, capsys):
    """Without a GPU the main job runs each example under NUMBA_ENABLE_CUDASIM=1: its last line
    decides (PASS, SKIP ..., anything else a failure)."""
    import types

    cases = {"ex90_pass": "print('PASS')", "ex91_skip": "print('SKIP: no torch')",
             "ex92_wrong": "print('FAIL')", "ex93_raises": "raise SystemExit(3)",
             "ex94_env": "import os; print('PASS' if os.environ['NUMBA_ENABLE_CUDASIM'] == '1' "
                         "else 'FAIL')"}
    modules = []
    for name, code in cases.items():
        path = tmp_path / f"{name}.py"
        path.write_text(code + "\n")
        modules.append(types.SimpleNamespace(__file__=str(path)))
    assert demo.emulate_examples(modules) == (2, 1)
    out = capsys.readouterr().out
    assert "ex90_pass" in out and "ex92_wrong                       FAIL" in out


def _bench(*args, block_torch=False):
    code = ("import sys; sys.modules['torch'] = None\n" if block_torch else "") + (
        "from numbatc.bench import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", "import sys\n" + code, *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_bench_help_names_every_subcommand():
    done = _bench("--help")
    assert done.returncode == 0
    for name in ("gemm", "attention", "softmax", "epilogue", "transformers"):
        assert name in done.stdout
    assert "Needs a CUDA GPU and PyTorch" in done.stdout


@pytest.mark.parametrize("sub, options", [
    ("gemm", ["--shapes", "--dtype", "--reps", "--csv", "--png", "--configs"]),
    ("attention", ["--shapes", "--dtype", "--reps", "--csv", "--png", "--configs"]),
    ("attention-backward", ["--shapes", "--dtype", "--reps", "--csv", "--configs"]),
    ("softmax", ["--shapes", "--dtype", "--reps", "--csv"]),
    ("epilogue", ["--shapes", "--dtype", "--reps", "--csv"]),
    ("transformers", ["--shapes", "--reps", "--csv"]),
])
def test_bench_every_option_has_help(sub, options):
    import argparse

    from numbatc.bench import _parser

    sub_parsers = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub_parsers.choices[sub]
    helped = {opt: action.help for action in parser._actions for opt in action.option_strings}
    for opt in options:
        assert helped.get(opt), f"{sub} {opt} has no help text"


def test_bench_without_torch_says_how_to_get_it():
    done = _bench("gemm", block_torch=True)
    assert done.returncode == 2
    assert "torch is not installed" in done.stderr
    assert "pip install torch" in done.stderr and "CUDA GPU" in done.stderr


def test_layouts_names_the_lane_option():
    from numbatc import layouts

    with pytest.raises(ValueError, match="--lane"):
        layouts.render_grid("smem.K.128", lane=3)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("ex*.py")), ids=lambda p: p.stem)
def test_examples_do_not_need_ml_dtypes(path):
    """The README's run command installs no ml_dtypes: the examples build bf16 inputs
    themselves (values exact in bf16, their bits the upper half of a float32)."""
    assert "ml_dtypes" not in path.read_text()


def test_package_metadata():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["authors"]
    assert not any(d.split("[")[0].split(">")[0].strip() == "llvmlite"
                   for d in meta["dependencies"]), "numba pins llvmlite itself"
    assert any(d.startswith("matplotlib") for d in meta["optional-dependencies"]["plots"])
