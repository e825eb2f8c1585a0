"""The README's kernel compiles and assembles (it is documentation that must not rot), and
.ci/run runs exactly the README's test command."""

import pathlib
import re

from numba import types

from intrinsics.toolchain import assemble, compile_ptx

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_kernel_assembles():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    code = next(b for b in blocks if "@cuda.jit" in b)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    sig = (types.uint16[:], types.uint16[:], types.float32[:, :])
    ptx = compile_ptx(scope["tile"], sig, "sm_80")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assemble(ptx, "sm_80")


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^    (python3 -m pip install .*)$", README, re.M)
    assert len(commands) == 2, commands
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
