"""numbatc.layouts: every registered map is read faithfully from the library's layout data
(register fragments cover each matrix element exactly once, shared-memory layouts are
permutations), spot checks against the PTX ISA's statements, the text grid, the command line, the
PNG, and the bank-conflict model."""

import subprocess
import sys

import numpy as np
import pytest

from intrinsics.layout import ldmatrix_fragment, mma_fragment
from intrinsics.mma import mma_specs
from intrinsics.layout import SmemLayout, accumulator_coords
from numbatc import layouts as L

NAMES = L.names()
REGISTER_NAMES = [n for n in NAMES if L.fragment(n).kind == "registers"]
SMEM_NAMES = [n for n in NAMES if L.fragment(n).kind == "smem"]

# ---------------------------------------------------------------------------------------------
# The registry covers what the brief names
# ---------------------------------------------------------------------------------------------


def test_registry_names_every_family():
    assert {"ldmatrix.x1", "ldmatrix.x2", "ldmatrix.x4", "ldmatrix.x1.trans", "ldmatrix.x2.trans",
            "ldmatrix.x4.trans"} <= set(NAMES)
    assert {f"wgmma.m64n{n}.D" for n in range(8, 257, 8)} <= set(NAMES)
    assert {"wgmma.A.rs.8", "wgmma.A.rs.16", "wgmma.A.rs.32"} <= set(NAMES)
    assert {f"smem.{m}.{s}" for m in ("K", "MN") for s in (0, 32, 64, 128)} <= set(NAMES)
    assert len(NAMES) == len(set(NAMES))


def test_every_mma_spec_and_operand_is_registered_with_its_library_map():
    for spec in mma_specs():
        for operand, letter in (("a", "A"), ("b", "B"), ("c", "C"), ("d", "D")):
            name = f"mma.{spec.shape}.{spec.b if operand == 'b' else spec.a}.{letter}"
            if operand in "cd" and spec.acc == "f16":  # the second accumulator type
                name += ".f16"
            frag = L.fragment(name)
            coords = mma_fragment(spec, operand)
            m = L.layout_map(frag.name)
            lanes, regs, per, _ = coords.shape
            for lane in range(lanes):
                for r in range(regs):
                    for e in range(per):
                        row, col = coords[lane, r, e]
                        assert (m["lane"][row, col], m["reg"][row, col], m["elem"][row, col]) \
                            == (lane, r, e), (name, lane, r, e)


# ---------------------------------------------------------------------------------------------
# Every map: registers cover each element once; smem layouts are permutations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REGISTER_NAMES)
def test_register_map_covers_each_element_exactly_once(name):
    frag = L.fragment(name)
    coords = np.asarray(frag.build())  # the library's own data, read afresh
    threads, regs, per, _ = coords.shape
    assert threads == frag.threads
    count = np.zeros(frag.shape, dtype=int)
    np.add.at(count, (coords[..., 0].ravel(), coords[..., 1].ravel()), 1)
    assert (count == 1).all()
    m = L.layout_map(name)
    assert m.shape == frag.shape
    t, r, e = np.meshgrid(np.arange(threads), np.arange(regs), np.arange(per), indexing="ij")
    rows, cols = coords[..., 0], coords[..., 1]
    assert (m["lane"][rows, cols] == t).all()
    assert (m["reg"][rows, cols] == r).all()
    assert (m["elem"][rows, cols] == e).all()
    assert (m["index"] == m["reg"] * per + m["elem"]).all()
    # Each thread holds the same number of elements.
    assert (np.bincount(m["lane"].ravel(), minlength=threads) == regs * per).all()


@pytest.mark.parametrize("name", SMEM_NAMES)
def test_smem_map_is_a_permutation(name):
    frag = L.fragment(name)
    layout = frag.build()
    assert isinstance(layout, SmemLayout)
    m = L.layout_map(name)
    assert m.shape == (layout.mn, layout.k) == frag.shape
    off = m["offset"]
    eb = layout.elem_bytes
    assert (off % eb == 0).all()
    assert sorted((off // eb).ravel().tolist()) == list(range(layout.mn * layout.k))
    mn, k = np.meshgrid(np.arange(layout.mn), np.arange(layout.k), indexing="ij")
    assert (off == layout.offset(mn, k)).all()
    assert (m["chunk"] == off // 16).all() and (m["bank"] == (off // 4) % 32).all()
    # Swizzles move whole 16-byte chunks: each chunk holds 16 / eb elements.
    assert (np.bincount(m["chunk"].ravel()) == 16 // eb).all()


def test_swizzle_128_rows_match_the_seed_formula():
    # K-major 128B: row r's logical chunk j lands in chunk 8r + (j ^ r) (8 rows of 128 bytes).
    m = L.layout_map("smem.K.128")
    for r in range(8):
        for j in range(8):
            assert m["chunk"][r, 8 * j] == 8 * r + (j ^ r)
    plain = L.layout_map("smem.K.0")
    assert plain["chunk"][3, 8] == 8 + 3  # core matrices: next 16 B of K is 8 rows * 16 B on


# ---------------------------------------------------------------------------------------------
# Spot checks against the PTX ISA's statements
# ---------------------------------------------------------------------------------------------


def _cells(name, lane):
    m = L.layout_map(name)
    held = np.argwhere(m["lane"] == lane)
    order = np.argsort(m["index"][held[:, 0], held[:, 1]])
    return [tuple(int(v) for v in rc) for rc in held[order]]


def test_mma_c_lane5_rows_1_and_9_columns_2_and_3():
    # "lane l holds rows l/4 and l/4+8, columns 2(l%4) and 2(l%4)+1": c0..c3.
    assert _cells("mma.m16n8k16.bf16.C", 5) == [(1, 2), (1, 3), (9, 2), (9, 3)]
    assert _cells("mma.m16n8k16.f16.D", 5) == [(1, 2), (1, 3), (9, 2), (9, 3)]
    m = L.layout_map("mma.m16n8k16.f16.C.f16")  # f16 accumulator: c0,c1 in register 0
    assert (m["reg"][1, 2], m["elem"][1, 2], m["reg"][9, 3], m["elem"][9, 3]) == (0, 0, 1, 1)


def test_mma_a_and_b_lane5():
    # m16n8k16 16-bit A: a0,a1 (g, 2t..); a2,a3 (g+8, 2t..); a4,a5 (g, 2t+8..); a6,a7 (g+8, 2t+8..)
    assert _cells("mma.m16n8k16.bf16.A", 5) == [(1, 2), (1, 3), (9, 2), (9, 3),
                                                (1, 10), (1, 11), (9, 10), (9, 11)]
    # B (K x N): b0,b1 rows 2t, 2t+1; b2,b3 rows 2t+8, 2t+9; column g.
    assert _cells("mma.m16n8k16.bf16.B", 5) == [(2, 1), (3, 1), (10, 1), (11, 1)]
    # m8n8k4 f64: A (g, t); C (g, 2t), (g, 2t+1).
    assert _cells("mma.m8n8k4.f64.A", 5) == [(1, 1)]
    assert _cells("mma.m8n8k4.f64.C", 5) == [(1, 2), (1, 3)]


def test_ldmatrix_trans_swaps_rows_and_columns():
    for num in (1, 2, 4):
        plain = L.layout_map(f"ldmatrix.x{num}")
        trans = L.layout_map(f"ldmatrix.x{num}.trans")
        for m in range(num):
            block = slice(8 * m, 8 * m + 8)
            for field in ("lane", "reg", "elem", "index"):
                assert (trans[field][block] == plain[field][block].T).all()
            assert (plain["reg"][block] == m).all()  # matrix m -> register m
    # Lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of each matrix (ldmatrix_fragment).
    assert _cells("ldmatrix.x4", 5) == [(1, 2), (1, 3), (9, 2), (9, 3), (17, 2), (17, 3),
                                        (25, 2), (25, 3)]
    assert _cells("ldmatrix.x1.trans", 5) == [(2, 1), (3, 1)]
    assert (ldmatrix_fragment(True)[5] == [[2, 1], [3, 1]]).all()


def test_wgmma_accumulator_spot_checks():
    # Thread 37 = warp 1, lane 5: rows 16 + 1 and 16 + 9, columns 2, 3 of every 8-column block.
    cells = _cells("wgmma.m64n16.D", 37)
    assert cells == [(17, 2), (17, 3), (25, 2), (25, 3), (17, 10), (17, 11), (25, 10), (25, 11)]
    m = L.layout_map("wgmma.m64n256.D.f16")
    assert (m["lane"][25, 11], m["reg"][25, 11], m["elem"][25, 11]) == (37, 3, 1)
    rows, cols = accumulator_coords(256)
    assert (L.layout_map("wgmma.m64n256.D")["index"][rows[127], cols[127]] == np.arange(128)).all()


def test_wgmma_rs_a_is_the_mma_a_fragment_per_warp():
    mma_a = L.layout_map("mma.m16n8k16.bf16.A")
    rs = L.layout_map("wgmma.A.rs.16")
    for w in range(4):
        block = rs[16 * w:16 * w + 16]
        assert (block["lane"] - 32 * w == mma_a["lane"]).all()
        assert (block["index"] == mma_a["index"]).all()
    assert (L.layout_map("wgmma.A.rs.8")[:16]["lane"] == L.layout_map("mma.m16n8k32.s8.A")["lane"]).all()


def test_aliases_and_unknown_names():
    assert L.fragment("mma.m16n8k16.bf16.d").name == "mma.m16n8k16.bf16.C"
    assert L.fragment("mma.m16n8k16.bf16.a").name == "mma.m16n8k16.bf16.A"
    assert L.fragment("wgmma.m64n64.C").name == "wgmma.m64n64.D"
    with pytest.raises(KeyError, match=r"did you mean .*mma\.m16n8k16\.bf16\.C"):
        L.fragment("mma.m16n8k16.bf16.Q")
    with pytest.raises(KeyError, match="--list"):
        L.layout_map("nothing")


def test_layout_map_returns_a_copy():
    m = L.layout_map("mma.m16n8k16.bf16.C")
    m["lane"][:] = 99
    assert L.layout_map("mma.m16n8k16.bf16.C")["lane"][0, 0] == 0


# ---------------------------------------------------------------------------------------------
# Text grids and the command line
# ---------------------------------------------------------------------------------------------


def test_grid_every_lane_and_one_lane():
    text = L.render_grid("mma.m16n8k16.bf16.C")
    lines = text.splitlines()
    row9 = next(line for line in lines if line.startswith(" 9 |"))
    assert row9.split("|")[1].split()[2:4] == ["T5:2", "T5:3"]
    one = L.render_grid("mma.m16n8k16.bf16.C", lane=5)
    assert one.count("T5:") == 4  # its four cells only
    assert "T5 holds index:(row,col) 0:(1,2) 1:(1,3) 2:(9,2) 3:(9,3)" in one
    assert "T4:" not in one


def test_grid_column_range_keeps_big_ones_narrow():
    text = L.render_grid("wgmma.m64n256.D", cols=(240, 256))
    lines = text.splitlines()
    assert len(lines) == 4 + 64
    assert max(len(line) for line in lines[2:]) < 160
    assert lines[2].split("|")[1].split() == [str(c) for c in range(240, 256)]
    assert L.render_grid("wgmma.m64n256.D", cols="240:256", rows=slice(0, 64)) == text
    with pytest.raises(ValueError, match="column range"):
        L.render_grid("wgmma.m64n256.D", cols=(250, 260))


def test_grid_smem_and_bad_arguments():
    text = L.render_grid("smem.K.128", field="bank")
    assert "worst 1 wavefront" in text
    assert "worst 1 wavefront" in L.render_grid("smem.MN.64")
    with pytest.raises(ValueError, match="no lanes"):
        L.render_grid("smem.K.128", lane=3)
    with pytest.raises(ValueError, match=r"0\.\.31"):
        L.render_grid("ldmatrix.x4", lane=32)
    with pytest.raises(ValueError, match=r"0\.\.127"):
        L.render_grid("wgmma.m64n8.D", lane=128)
    with pytest.raises(ValueError, match="field must be one of"):
        L.render_grid("smem.K.0", field="lane")


def test_cli_in_process(capsys):
    assert L.main(["mma.m16n8k16.bf16.C", "--lane", "5"]) == 0
    out = capsys.readouterr().out
    assert " 9 |" in out and "T5:2" in out
    assert L.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == NAMES
    assert L.main(["--conflicts", "128"]) == 0
    out = capsys.readouterr().out
    assert "no swizzle    8" in out and "128B swizzle  1" in out
    with pytest.raises(SystemExit) as err:
        L.main(["mma.nope"])
    assert err.value.code == 2
    assert "no fragment layout named 'mma.nope'" in capsys.readouterr().err


def test_cli_module_entry_point():
    run = subprocess.run([sys.executable, "-m", "numbatc.layouts", "ldmatrix.x1.trans"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # progress-free
    assert "ldmatrix.x1.trans: 8 x 8" in run.stdout
    assert "0 |  T0:0  T4:0  T8:0 T12:0" in run.stdout  # stored row 0 goes to lanes 0, 4, 8 ..


# ---------------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, lane", [("mma.m16n8k16.bf16.A", None), ("ldmatrix.x4.trans", 6),
                                        ("smem.K.128", None), ("wgmma.m64n256.D", None)])
def test_png_written(tmp_path, name, lane):
    pytest.importorskip("matplotlib")
    path = tmp_path / "layout.png"
    assert L.render_png(name, str(path), lane) == str(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_png_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        L.render_png("mma.m16n8k16.bf16.C", str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------------------------
# Bank conflicts
# ---------------------------------------------------------------------------------------------


def test_four_byte_accesses():
    assert L.bank_conflicts([4 * i for i in range(32)], access_bytes=4) == 1  # stride 1 word
    assert L.bank_conflicts([0] * 32, access_bytes=4) == 1  # broadcast
    assert L.bank_conflicts([128 * i for i in range(32)], access_bytes=4) == 32  # stride 32 words
    assert L.bank_conflicts([8 * i for i in range(32)], access_bytes=4) == 2  # stride 2 words
    assert L.bank_conflicts([4 * (i // 2) for i in range(32)], access_bytes=4) == 1  # pairs share
    assert L.bank_conflicts([1, 2, 3, 0], access_bytes=1) == 1  # bytes of one word
    assert L.bank_conflicts([None] * 31 + [256], access_bytes=4) == 1
    assert L.bank_conflicts([], access_bytes=4) == 0


def test_wide_accesses_are_served_in_phases():
    assert L.bank_conflicts([16 * i for i in range(32)], access_bytes=16) == 4  # ideal LDS.128
    assert L.bank_conflicts([8 * i for i in range(32)], access_bytes=8) == 2  # ideal LDS.64
    # Lanes 0 and 8 share banks 0-3 but sit in different phases: no conflict.
    assert L.bank_conflicts([16 * (i % 8) + 128 * (i // 8) for i in range(32)], 16) == 4
    # Lanes 0-7 on banks 0-3 of 8 different lines: 8 wavefronts, then 1 for each other phase.
    assert L.bank_conflicts([128 * i for i in range(8)] + [16 * i for i in range(8, 32)], 16) == 11
    # Inside one phase two lines on banks 0-3: 2 wavefronts for that phase.
    assert L.bank_conflicts([0, 128] + [16 * i for i in range(2, 8)], 16) == 2
    with pytest.raises(ValueError, match="aligned to 16"):
        L.bank_conflicts([8], 16)
    with pytest.raises(ValueError, match="access_bytes"):
        L.bank_conflicts([0], 3)
    with pytest.raises(ValueError, match="32 lanes"):
        L.bank_conflicts([0] * 33, 4)


def test_ldmatrix_plain_128_byte_rows_conflict_8_way_and_swizzle_128_none():
    assert L.ldmatrix_conflicts(0, 128) == 8
    assert L.ldmatrix_conflicts(128, 128) == 1
    assert L.ldmatrix_conflicts(64, 128) == 2 and L.ldmatrix_conflicts(32, 128) == 4
    assert L.ldmatrix_conflicts(64, 64) == 1 and L.ldmatrix_conflicts(0, 64) == 4
    assert L.ldmatrix_conflicts(0, 16) == 1  # rows 16 bytes apart: one 128-byte line
    for c in range(8):
        assert L.ldmatrix_conflicts(128, 128, col_chunk=c, first_row=8) == 1
    with pytest.raises(ValueError, match="swizzle mode"):
        L.ldmatrix_conflicts(16, 128)
    with pytest.raises(ValueError, match="multiple of 16"):
        L.ldmatrix_conflicts(0, 40)


def test_ldmatrix_x4_warp_access_plain_vs_swizzled():
    # The README's A load: lane l names row l % 16, 16-byte chunk l // 16, rows of 128 bytes.
    plain = [(l % 16) * 128 + (l // 16) * 16 for l in range(32)]
    from intrinsics.layout import swizzle_offset_host

    swizzled = [swizzle_offset_host(a, 128) for a in plain]
    assert L.bank_conflicts(plain, 16) == 4 * 8
    assert L.bank_conflicts(swizzled, 16) == 4


@pytest.mark.parametrize("name", SMEM_NAMES)
def test_canonical_tiles_feed_ldmatrix_without_conflicts(name):
    """Each 8x8 core matrix (8 rows of 16 bytes) of every canonical layout is one wavefront:
    K-major rows run along k at fixed mn, MN-major rows along mn at fixed k (.trans)."""
    m = L.layout_map(name)
    layout = L.fragment(name).build()
    per_row = 16 // layout.elem_bytes
    if layout.major == "K":
        groups = [m["offset"][mn0:mn0 + 8, k0] for mn0 in range(0, layout.mn, 8)
                  for k0 in range(0, layout.k, per_row)]
    else:
        groups = [m["offset"][mn0, k0:k0 + 8] for k0 in range(0, layout.k, 8)
                  for mn0 in range(0, layout.mn, per_row)]
    for rows in groups:
        assert L.bank_conflicts([int(a) for a in rows], 16) == 1
