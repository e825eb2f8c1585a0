"""Host models of wgmma: the matrix descriptor bit layout, the canonical shared-memory layouts
(tile model vs the instruction's descriptor model), and the register fragment maps."""

import itertools

import numpy as np
import pytest

from intrinsics.layout import (
    SmemLayout,
    a_fragment_coords,
    accumulator_coords,
    decode_smem_desc,
    make_smem_desc_host,
    smem_desc_address_host,
    swizzle_offset_host,
)
from intrinsics.wgmma import make_smem_desc

SWIZZLES = (0, 32, 64, 128)

# ---------------------------------------------------------------------------------------------
# Descriptor bits (PTX ISA 9.7.15.5.1.2.2)
# ---------------------------------------------------------------------------------------------


def test_descriptor_fields_by_hand():
    desc = make_smem_desc_host(0x1230, 16, 1024, 128)
    assert desc == 0x123 | (1 << 16) | (64 << 32) | (1 << 62)
    assert make_smem_desc_host(0x400, 0x800, 0x80, 0) == 0x40 | (0x80 << 16) | (0x8 << 32)
    for swizzle, code in ((0, 0), (128, 1), (64, 2), (32, 3)):
        assert make_smem_desc_host(0, 0, 0, swizzle) >> 62 == code


def test_descriptor_round_trip():
    rng = np.random.default_rng()
    for _ in range(200):
        addr, lbo, sbo = (int(v) * 16 for v in rng.integers(0, 1 << 14, 3))
        swizzle = int(rng.choice(SWIZZLES))
        fields = decode_smem_desc(make_smem_desc_host(addr, lbo, sbo, swizzle))
        want = {"addr": addr, "lbo": lbo, "sbo": sbo, "base_offset": 0, "swizzle": swizzle}
        assert fields == want


def test_descriptor_advance_is_an_add_on_the_start_field():
    layout = SmemLayout("K", 128, 64, 64, 2)
    base = 0x2400
    d0 = layout.desc(base)
    for k0 in (16, 32, 48):
        assert layout.desc(base, k0) == d0 + ((k0 * 2) >> 4)


@pytest.mark.parametrize(
    "args, message",
    [
        ((8, 16, 16, 128), "address must be a multiple of 16"),
        ((16, 24, 16, 128), "LBO must be a multiple of 16"),
        ((16, 16, 1 << 18, 128), "SBO must be a multiple of 16"),
        ((16, 16, 16, 16), r"swizzle must be one of \[0, 32, 64, 128\] bytes, got 16"),
    ],
)
def test_descriptor_argument_errors(args, message):
    with pytest.raises(ValueError, match=message):
        make_smem_desc_host(*args)


def test_device_function_types_like_the_host_twin():
    """The device descriptor function, compiled by numba (CPU target, same integer typing rules
    as the CUDA target) with the argument types a kernel passes, packs the same bits: no
    uint64/int64 mix decays to float64 on the way."""
    numba = pytest.importorskip("numba")
    jitted = numba.njit(make_smem_desc.py_func)
    rng = np.random.default_rng()
    for _ in range(50):
        addr, lbo, sbo = (int(v) * 16 for v in rng.integers(0, 1 << 14, 3))
        swizzle = int(rng.choice(SWIZZLES))
        want = make_smem_desc_host(addr, lbo, sbo, swizzle)
        for conv in (np.uint32, np.int64, np.int32, np.uint64):
            got = jitted(conv(addr), conv(lbo), conv(sbo), conv(swizzle))
            assert isinstance(got, (np.uint64, int)) and int(got) == want


# ---------------------------------------------------------------------------------------------
# Canonical layouts
# ---------------------------------------------------------------------------------------------


def _layouts():
    """Every major-ness x swizzle x element size wgmma reads (MN-major exists for 16-bit types
    only), with tiles spanning several atoms each way."""
    for major, swizzle, eb in itertools.product(("K", "MN"), SWIZZLES, (1, 2, 4)):
        if major == "MN" and eb != 2:
            continue
        width = max(swizzle, 16) // eb  # elements along the contiguous direction of an atom
        if major == "K":
            shapes = [(64, width * 2), (24, max(width, 32 // eb)), (256, 2 * max(width, 32 // eb))]
        else:
            shapes = [(2 * width, 16), (max(width, 64), 32), (4 * width, 48)]
        for mn, k in shapes:
            if major == "K" and (k * eb) % 32:
                continue  # one instruction reads 32 bytes of K
            yield SmemLayout(major, swizzle, mn, k, eb)


LAYOUTS = list(_layouts())


def _ids(layout):
    return f"{layout.major}-sw{layout.swizzle}-{layout.mn}x{layout.k}-{layout.elem_bytes}B"


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_layout_is_a_dense_bijection(layout):
    mn, k = np.meshgrid(np.arange(layout.mn), np.arange(layout.k), indexing="ij")
    offs = layout.offset(mn, k).ravel()
    assert offs.min() >= 0 and offs.max() < layout.nbytes
    assert (offs % layout.elem_bytes == 0).all()
    assert len(np.unique(offs)) == offs.size


@pytest.mark.parametrize("layout", LAYOUTS, ids=_ids)
def test_layout_matches_the_descriptor_model(layout):
    """For every instruction K-slice, the address the descriptor model gives for (mn, kk) --
    start address advanced by k_offset(k0), the layout's LBO/SBO/swizzle -- is where the tile
    model put element (mn, k0 + kk)."""
    base = 3 * 1024  # any 1024-byte-aligned base
    k_inst = 32 // layout.elem_bytes
    major = layout.major
    mn, kk = np.meshgrid(np.arange(layout.mn), np.arange(k_inst), indexing="ij")
    for k0 in range(0, layout.k, k_inst):
        desc = layout.desc(base, k0)
        hw = smem_desc_address_host(desc, major, layout.elem_bytes, mn, kk) - base
        np.testing.assert_array_equal(hw, layout.offset(mn, k0 + kk), err_msg=f"k0={k0}")


@pytest.mark.parametrize(
    "args, lbo, sbo",
    [
        # CUTLASS make_gmma_desc, in bytes (uint128_t units * 16).
        (("K", 128, 64, 64, 2), 16, 1024),  # Layout_K_SW128_Atom<bf16>: SBO = 8 rows x 128 B
        (("K", 64, 128, 32, 2), 16, 512),
        (("K", 32, 128, 16, 2), 16, 256),
        (("K", 0, 64, 16, 2), 64 * 16, 128),  # interleave: LBO steps K core matrices
        (("MN", 128, 128, 16, 2), 1024, 128 * 2 * 8),  # LBO: next 64 n; SBO: next 8 k
        (("MN", 64, 64, 16, 2), 512, 64 * 2 * 8),
        (("MN", 0, 64, 16, 2), 64 * 2 * 8, 128),  # interleave: SBO steps MN, LBO steps K
        (("K", 128, 64, 128, 1), 16, 1024),  # fp8
        (("K", 128, 32, 32, 4), 16, 1024),  # tf32
    ],
)
def test_lbo_sbo_of_canonical_layouts(args, lbo, sbo):
    layout = SmemLayout(*args)
    assert (layout.lbo, layout.sbo) == (lbo, sbo)


def test_k_major_128b_is_the_smem_swizzle():
    """A 64-wide bf16 K-major tile in 128B mode is rows of 128 B under Swizzle<3,4,3>."""
    layout = SmemLayout("K", 128, 64, 64, 2)
    mn, k = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    np.testing.assert_array_equal(layout.offset(mn, k), swizzle_offset_host(mn * 128 + k * 2, 128))


def test_place_and_gather_round_trip():
    rng = np.random.default_rng()
    for layout in LAYOUTS[::5]:
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[layout.elem_bytes]
        tile = rng.integers(0, np.iinfo(dtype).max, (layout.mn, layout.k), dtype=dtype)
        image = layout.place(tile)
        assert image.size == layout.nbytes
        np.testing.assert_array_equal(layout.gather(image, dtype), tile)


@pytest.mark.parametrize(
    "args, message",
    [
        (("K", 128, 64, 32, 2), "K-major 128B-swizzle tile needs .* elem_bytes a multiple of 128"),
        (("K", 0, 12, 16, 2), "mn a multiple of 8"),
        (("MN", 64, 16, 16, 2), "MN-major 64B-swizzle tile needs mn \\* elem_bytes a multiple of"),
        (("MN", 0, 64, 12, 2), "k a multiple of 8"),
        (("row", 0, 64, 16, 2), "major must be 'K' or 'MN'"),
        (("K", 16, 64, 16, 2), "swizzle must be one of"),
        (("K", 0, 64, 16, 3), "elem_bytes must be 1, 2 or 4"),
    ],
)
def test_layout_errors(args, message):
    with pytest.raises(ValueError, match=message):
        SmemLayout(*args)


def test_k_offset_must_start_an_instruction_slice():
    with pytest.raises(ValueError, match="k0 must start an instruction K-slice"):
        SmemLayout("K", 128, 64, 64, 2).k_offset(8)


# ---------------------------------------------------------------------------------------------
# Fragment maps (PTX ISA 9.7.15.5.1.1)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 24, 64, 256])
def test_accumulator_map_covers_d_once(n):
    rows, cols = accumulator_coords(n)
    assert rows.shape == cols.shape == (128, n // 2)
    flat = (rows * n + cols).ravel()
    assert sorted(flat) == list(range(64 * n))


def test_accumulator_map_is_mma_sync_c_per_warp():
    """Warp w, columns 8j..8j+7: the mma.sync m16n8 C fragment (lane l: rows l/4, l/4+8; columns
    2(l%4), 2(l%4)+1 in c0..c3 order) shifted by 16w rows."""
    rows, cols = accumulator_coords(32)
    for t in (0, 5, 37, 127):
        w, lane = divmod(t, 32)
        for j in range(4):
            want_r = [16 * w + lane // 4 + 8 * (i // 2) for i in range(4)]
            want_c = [8 * j + 2 * (lane % 4) + i % 2 for i in range(4)]
            assert list(rows[t, 4 * j : 4 * j + 4]) == want_r
            assert list(cols[t, 4 * j : 4 * j + 4]) == want_c


@pytest.mark.parametrize("elem_bytes, k", [(2, 16), (1, 32), (4, 8)])
def test_a_fragment_map_covers_a_once(elem_bytes, k):
    rows, cols = a_fragment_coords(elem_bytes)
    assert rows.shape == (128, k // 2)
    assert sorted((rows * k + cols).ravel()) == list(range(64 * k))


def test_a_fragment_16bit_is_mma_sync_a():
    """bf16/f16: per warp the m16n8k16 A fragment (a0,a1: row g, cols 2c..; a2,a3: row g+8; a4..a7:
    cols +8)."""
    rows, cols = a_fragment_coords(2)
    for t in (3, 66, 127):
        w, lane = divmod(t, 32)
        g, c = divmod(lane, 4)
        want = [(g, 2 * c), (g, 2 * c + 1), (g + 8, 2 * c), (g + 8, 2 * c + 1),
                (g, 2 * c + 8), (g, 2 * c + 9), (g + 8, 2 * c + 8), (g + 8, 2 * c + 9)]
        got = [(r - 16 * w, col) for r, col in zip(rows[t], cols[t])]
        assert got == want
