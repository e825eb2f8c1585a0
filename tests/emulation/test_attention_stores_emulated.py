"""The portable attention kernel's O stores in the CPU emulation: one 32-bit store per column pair
where out starts 4-byte aligned and its strides are even (what numbatc.attention allocates),
two 16-bit stores where it starts 2 bytes past that; both against the float64 reference, for
numbatc.attention and numbatc.attention_varlen.  The emulation faults a misaligned 32-bit
store as the GPU does (intrinsics.emulate.gmem), so a pair store on the offset out would fail."""

import pytest
from numba import config

from numbatc.kernels import sm80_attention

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
pytest.importorskip("ml_dtypes")

from tests.helpers.attention import check, check_varlen, offset_out  # noqa: E402


@pytest.fixture
def pair_stores(monkeypatch):
    """The pair_stores flag of every sm80_attention kernel compiled (a list)."""
    for var in ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    seen = []
    real = sm80_attention.kernel_for
    monkeypatch.setattr(sm80_attention, "kernel_for",
                        lambda cfg, var: seen.append(var.pair_stores) or real(cfg, var))
    return seen


def test_pairs_where_out_is_aligned_halves_elsewhere(pair_stores):
    check(1, 40, 70, 2, 1, 64, True, "bfloat16")
    assert pair_stores and all(pair_stores), pair_stores
    pair_stores.clear()
    check(1, 40, 70, 2, 1, 64, True, "float16", out_view=offset_out)
    assert pair_stores and not any(pair_stores), pair_stores


def test_varlen_pairs_and_halves(pair_stores):
    check_varlen([5, 0, 37], [20, 3, 37], 2, 2, 64, True, "bfloat16")
    assert pair_stores and all(pair_stores), pair_stores
    pair_stores.clear()
    check_varlen([5, 0, 37], [20, 3, 37], 2, 2, 64, False, "float16", out_view=offset_out)
    assert pair_stores and not any(pair_stores), pair_stores
