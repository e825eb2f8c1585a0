"""The examples, run against the CPU emulation (NUMBA_ENABLE_CUDASIM=1 must be set before numba
is imported, hence a child process per example).  The GPU lane tests marked ``emulation`` run
against the emulation in the README test command's second pytest run, each reported on its own;
on a GPU machine the same lane tests run on the hardware: same test, two back ends.

This module holds only what must be a subprocess (one example per child process, each its own
test) and two checks that keep that second run wired up; every other emulation test belongs in
tests/gpu or tests/emulation, where the second run collects it as a test of its own."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("ex[0-9][0-9]*_*.py"))
#: examples that run torch models: they print "SKIP: <why>" in the emulation
NEEDS_TORCH_ON_A_GPU = {"ex07_transformers"}


def _emulated(args, timeout):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    return result, time.perf_counter() - start


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_passes_in_the_emulation(example):
    result, seconds = _emulated([str(example)], timeout=600)
    print(f"{example.stem}: {seconds:.1f} s in the emulation")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    if example.stem in NEEDS_TORCH_ON_A_GPU:  # the emulation runs no torch tensors
        assert last.startswith("SKIP: "), result.stdout[-3000:]
        return
    assert last == "PASS", result.stdout[-3000:]


def test_the_test_command_runs_the_emulated_tests():
    """The README's test command ends with the emulation run over tests/gpu and tests/emulation
    (if it were dropped, every emulated test would silently stop running in CI)."""
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if "pytest" in line and "pip install" in line)
    run = command.split("&&")[-1].split()
    assert run[0] == "NUMBA_ENABLE_CUDASIM=1" and "-m" in run and "emulation" in run, command
    assert "tests/gpu" in run and "tests/emulation" in run, command


def test_emulated_tests_live_where_the_emulation_run_collects_them():
    """The emulation run collects tests/gpu and tests/emulation only: an emulation-marked test
    elsewhere would never run (two did, until they moved)."""
    stray = [p.name for p in (ROOT / "tests").glob("*.py")
             if "mark.emulation" in p.read_text() and p.name != pathlib.Path(__file__).name]
    assert not stray, f"emulation tests outside tests/gpu and tests/emulation: {stray}"
