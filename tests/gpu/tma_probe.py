"""Does a TMA tensor load work on this machine?  One legal tile load, done twice: by an
implementation that is not ours (Triton's host-side TensorDescriptor) and by numbatc's own
``intrinsics.tma.tma_load``, each in a child process (a faulting kernel poisons its CUDA context).

The load: a 48x96 float32 tensor, box 16x16, no swizzle, starting at row 5, column 4 -- an
innermost start of 16 bytes.  NOTE (the lent H200, driver 580.159.04, 2026-12-01): this load
runs and is exact in Triton, in plain CUDA C++ (scripts/diag/tma_ref.cu) and in numbatc; the
same load at column 3 (12 bytes), 1 or 90 raises CUDA_ERROR_ILLEGAL_INSTRUCTION in all three.
An earlier version of this probe started at column 3, which is why tensor copies were wrongly
thought to fault on that machine.  The rule (``intrinsics.tensormap.start_problem``) and what
scripts/tma_rules.py measures of it: docs/TMA.md.

Run directly: python tests/gpu/tma_probe.py  (prints 'TMA OK' or the failing side's error)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW, COL = 5, 4  # the box's start: COL * 4 bytes = 16, a legal innermost start


def _triton_load():
    import torch
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def copy_tile(desc, out_ptr, row, col):
        x = desc.load([row, col])
        offs = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
        tl.store(out_ptr + offs, x)

    a = torch.arange(48 * 96, dtype=torch.float32, device="cuda").reshape(48, 96)
    out = torch.zeros(16, 16, device="cuda")
    copy_tile[(1,)](TensorDescriptor.from_tensor(a, [16, 16]), out, ROW, COL)
    torch.cuda.synchronize()
    return int((out != a[ROW:ROW + 16, COL:COL + 16]).sum())


def _numbatc_load():
    import numpy as np
    from numba import cuda

    from intrinsics.launch import launch
    from intrinsics.tensormap import TensorMap
    from tests.helpers.tma import ALIGN, load_kernel

    host = np.arange(48 * 96, dtype=np.float32).reshape(48, 96)
    tmap = TensorMap.tiled(cuda.to_device(host), (16, 16))
    coords = np.array(tmap.check_start((COL, ROW)), np.int32)
    out = cuda.to_device(np.zeros(tmap.box_bytes, np.uint8))
    status = cuda.to_device(np.zeros(1, np.int32))
    launch(load_kernel(2), 1, 128, (tmap.device, cuda.to_device(coords), tmap.box_bytes, out,
                                    status), shared_bytes=tmap.box_bytes + ALIGN)
    cuda.synchronize()
    got = out.copy_to_host().view(np.float32).reshape(16, 16)
    return int((got != host[ROW:ROW + 16, COL:COL + 16]).sum()) + int(status.copy_to_host()[0])


SIDES = {"triton": _triton_load, "numbatc": _numbatc_load}


def tensor_tma_status():
    """{side: (True, '') | (False, why) | (None, why)} for each side, each run in a child
    process: True when its legal load is exact, None when it cannot run here (no Triton)."""
    status = {}
    for side in SIDES:
        result = subprocess.run([sys.executable, __file__, side], capture_output=True, text=True,
                                timeout=300)
        text = (result.stdout + result.stderr).strip()
        if result.returncode == 0 and "TMA OK" in result.stdout:
            status[side] = (True, "")
        elif "ModuleNotFoundError" in text or "ImportError" in text:
            status[side] = (None, text.splitlines()[-1])
        else:
            lines = text.splitlines()
            cause = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "?")
            status[side] = (False, cause.strip())
    return status


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: tests.helpers is found from the root
    if len(sys.argv) > 1:
        wrong = SIDES[sys.argv[1]]()
        if wrong:
            raise SystemExit(f"{sys.argv[1]}: the TMA load returned {wrong} wrong elements")
        print("TMA OK")
    else:
        report = tensor_tma_status()
        for side, (ok, why) in report.items():
            print(f"{side}: {'TMA OK' if ok else ('not available: ' if ok is None else 'FAILED: ') + why}")
        raise SystemExit(0 if all(ok is not False for ok, _ in report.values()) else 1)
