"""Helpers for the CPU compile tests (tests/test_*_compile.py): compile a small kernel for every
architecture the project claims, check the PTX text, assemble it, and check the refusal on
architectures that lack it."""

import pytest

from intrinsics._core import ArchitectureError
from intrinsics.toolchain import ARCHS, assemble, compile_ptx

ARCH_NAMES = list(ARCHS)


def check_on_arch(kernel, sig, arch_name, requirement, expected):
    """Compile ``kernel`` for ``arch_name``.  Where ``requirement`` (an intrinsics Arch) accepts
    the architecture, every string in ``expected`` must be in the PTX and nvJitLink must
    assemble it; elsewhere compilation must fail with an ArchitectureError naming it."""
    cc = ARCHS[arch_name]
    if requirement.accepts(cc):
        ptx = compile_ptx(kernel, sig, cc)
        for text in expected:
            assert text in ptx, f"{text!r} not in the PTX for {arch_name}"
        assert "ld.local" not in ptx and "st.local" not in ptx, "fragment went to local memory"
        assert len(assemble(ptx, arch_name)) > 0
        return ptx
    with pytest.raises(Exception) as info:
        compile_ptx(kernel, sig, cc)
    assert isinstance(info.value, ArchitectureError) or "needs" in str(info.value)
    assert arch_name in str(info.value)
    return None
