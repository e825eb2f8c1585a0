"""Every public intrinsic has a CPU emulation: after ``import intrinsics`` under the simulator,
no public name may still be a numba @intrinsic (those cannot run on the CPU).  Device functions
(``cuda.jit(device=True)``) and host helpers run as they are."""

import pytest
from numba import config

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

import importlib  # noqa: E402
import pkgutil  # noqa: E402

import intrinsics  # noqa: E402


def _family_modules():
    for info in pkgutil.iter_modules(intrinsics.__path__):
        if info.name.startswith("_") or info.name in ("emulate", "toolchain", "catalog"):
            continue
        yield importlib.import_module(f"intrinsics.{info.name}")


def test_no_public_intrinsic_is_left_unemulated():
    left = []
    for module in _family_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if type(obj).__name__ == "_Intrinsic":  # numba.core.extending's intrinsic wrapper
                left.append(f"{module.__name__}.{name}")
    assert not left, "intrinsics without a CPU emulation: " + ", ".join(left)


def test_factories_return_emulations():
    import intrinsics as nt

    assert not type(nt.mma_sync("m16n8k16", "bf16")).__name__ == "_Intrinsic"
    assert not type(nt.wgmma_mma_async(64, "bf16")).__name__ == "_Intrinsic"
    assert not type(nt.ldmatrix_op(4)).__name__ == "_Intrinsic"
    assert not type(nt.cp_async_op(16)).__name__ == "_Intrinsic"
