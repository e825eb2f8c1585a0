"""Does a TMA tensor load work on this machine at all?  Checked with an implementation that is
not ours: Triton's host-side TensorDescriptor loading one tile, in a child process (a faulting
kernel poisons its CUDA context).

NOTE (2026-11-30, the lent H200, driver 580.159.04, Firecracker pass-through): every
``cp.async.bulk.tensor`` load faulted with CUDA_ERROR_ILLEGAL_INSTRUCTION -- Triton's own TMA
load, a plain CUDA C++ kernel with a ``__grid_constant__`` CUtensorMap (scripts/diag/tma_ref.cu:
shared::cluster and shared::cta destinations, cluster launch or not, map in param or global
memory, with and without fence.proxy.tensormap), and numbatc's intrinsics alike -- while
non-tensor ``cp.async.bulk`` copies, wgmma, mbarriers and cuBLAS ran.  The GPU tests that need
tensor copies skip, with this probe's output as the reason, only when the reference faults too.

Run directly: python tests/gpu/tma_probe.py  (prints 'TMA OK' or raises)."""

import functools
import subprocess
import sys


def _reference_load():
    import torch
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def copy_tile(desc, out_ptr):
        x = desc.load([5, 3])
        offs = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
        tl.store(out_ptr + offs, x)

    a = torch.arange(48 * 96, dtype=torch.float32, device="cuda").reshape(48, 96)
    out = torch.zeros(16, 16, device="cuda")
    copy_tile[(1,)](TensorDescriptor.from_tensor(a, [16, 16]), out)
    torch.cuda.synchronize()
    wrong = int((out != a[5:21, 3:19]).sum())
    if wrong:
        raise RuntimeError(f"Triton's TMA load returned {wrong} wrong elements")
    print("TMA OK")


@functools.cache
def tensor_tma_status():
    """(True, '') when Triton's reference TMA load works here; (False, why) when it fails;
    (None, why) when there is no Triton/torch to ask."""
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        return None, f"no reference available ({exc})"
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    if result.returncode == 0 and "TMA OK" in result.stdout:
        return True, ""
    lines = (result.stdout + result.stderr).strip().splitlines()
    cause = next((ln for ln in reversed(lines) if "rror" in ln), lines[-1] if lines else "?")
    return False, f"Triton's own TMA tensor load fails on this machine too: {cause.strip()}"


if __name__ == "__main__":
    _reference_load()
