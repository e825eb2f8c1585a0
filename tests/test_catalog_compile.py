"""Every probe of the intrinsic catalog, on every architecture the project claims: where the
instruction exists the PTX holds it, has no local memory, and nvJitLink assembles it; elsewhere
compilation stops with an ArchitectureError naming the target."""

import pytest

from intrinsics.catalog import probes
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

PROBES = list(probes())


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("probe", PROBES, ids=lambda p: f"{p.family}-{p.name}")
def test_probe(probe, arch):
    check_on_arch(probe.kernel, probe.signature, arch, probe.arch, probe.expected)


def test_catalog_covers_every_form():
    from intrinsics.cp_async import CP_ASYNC_FORMS
    from intrinsics.ldmatrix import LDMATRIX_FORMS
    from intrinsics.mma import mma_block_scale_specs, mma_specs

    families = [p.family for p in PROBES]
    assert families.count("mma.sync") == len(mma_specs())
    assert families.count("mma.sync.block_scale") == len(mma_block_scale_specs())
    assert families.count("ldmatrix") + families.count("stmatrix") == len(LDMATRIX_FORMS)
    assert families.count("cp.async") == 2 * len(CP_ASYNC_FORMS) + 2  # + the mbarrier arrives
