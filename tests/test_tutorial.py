"""docs/tutorial.md runs: its python blocks, in order, as one program, in the CPU emulation (a
child process with NUMBA_ENABLE_CUDASIM=1), and each of its steps checks itself."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"


def test_tutorial_runs_in_the_emulation(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    assert len(blocks) >= 3
    script = tmp_path / "tutorial.py"
    script.write_text("\n\n".join(blocks))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "step 2:" in result.stdout and "step 3:" in result.stdout


def test_tutorial_kernels_assemble_for_the_gpu():
    """The emulation accepts some things the GPU compiler does not (a shared-array size given as
    an expression, for one); so compile the kernels for sm_80 and sm_90a too.  Each block's code
    before its '# -- run --' line defines, the rest launches."""
    from numba import types

    from intrinsics.toolchain import assemble, compile_ptx

    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    scope = {}
    exec(compile("\n\n".join(b.split("# -- run --")[0] for b in blocks), "tutorial", "exec"), scope)
    u32, u16, f32 = types.uint32[:, :], types.uint16[:, :], types.float32
    # fused_tile: one mma.sync; fused_gemm, the block GEMM, reads its swizzled tiles with ldmatrix
    for name, sig, needs in [
            ("fused_tile", (u32, u32, f32[:], f32[:, :]), ()),
            ("fused_gemm", (u16, u16, f32[:], f32[:, :], types.int64),
             ("ldmatrix.sync.aligned.m8n8.x4.shared.b16",))]:
        for arch in ("sm_80", "sm_90a"):
            ptx = compile_ptx(scope[name], sig, arch)
            for text in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", *needs):
                assert text in ptx, (name, arch, text)
            assert assemble(ptx, arch), (name, arch)  # the cubin's bytes
