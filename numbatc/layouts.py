"""See the fragment layouts: which lane holds which matrix element, and where a swizzled tile puts it.

Run ``python -m numbatc.layouts --list`` for every name, then for example::

    python -m numbatc.layouts mma.m16n8k16.bf16.C             # the accumulator, every lane
    python -m numbatc.layouts mma.m16n8k16.bf16.A --lane 5     # "pick a lane": only lane 5's cells
    python -m numbatc.layouts wgmma.m64n256.D --cols 0:32      # a column range of a big one
    python -m numbatc.layouts smem.K.128                       # where a 128B-swizzled tile lands
    python -m numbatc.layouts ldmatrix.x4.trans --png x4t.png  # a picture (needs matplotlib)
    python -m numbatc.layouts --conflicts 128                  # ldmatrix wavefronts per swizzle

or from Python: :func:`layout_map`, :func:`render_grid`, :func:`render_png`,
:func:`bank_conflicts`, :func:`ldmatrix_conflicts`.

Where the pictures come from
----------------------------
Nothing here computes an index formula of its own.  Every map is read from the host models the
intrinsics, their CPU emulation and the kernels themselves use, the ``intrinsics.layout``
package:

    mma.<shape>.<type>.A|B|C[.f16]   intrinsics.layout.mma_fragment(spec, operand) for every
                                     spec of intrinsics.mma.mma_specs() (PTX ISA 9.7.14.5.8-14)
    ldmatrix.x1|x2|x4[.trans]        intrinsics.layout.ldmatrix_fragment(trans) (PTX ISA
                                     9.7.14.5.15, ldmatrix; stmatrix uses the same map)
    wgmma.m64n<N>.D[.f16]            intrinsics.layout.accumulator_coords(N) (PTX ISA 9.7.15.5.1.1;
                                     the N of intrinsics.wgmma.WGMMA_TABLE)
    wgmma.A.rs.8|16|32               intrinsics.layout.a_fragment_coords(element bytes)
    smem.K|MN.0|32|64|128[.8|.32]    intrinsics.layout.SmemLayout(...).offset(mn, k), whose
                                     swizzle is intrinsics.layout.swizzle_offset_host (PTX ISA
                                     9.7.15.5.1.2 and 9.7.9.27.5)

Those are the very maps that the GPU lane tests check against the hardware, every lane, exactly,
with random data (tests/gpu/test_mma_gpu.py, test_ldmatrix_gpu.py, test_wgmma_gpu.py,
test_tma_gpu.py; they passed on an H200), and that the CPU emulation executes.  So a picture
drawn here is the fragment placement the GPU really uses, not a second reading of the PTX ISA's
tables that could disagree with it.

The maps
--------
:func:`layout_map` returns a NumPy structured array with one entry per matrix element (row, col):

* register fragments (``mma``, ``ldmatrix``, ``wgmma``): fields ``lane`` (the thread: 0..31, or
  0..127 of the warpgroup for wgmma), ``reg`` (which 32-bit register of that thread; a 64-bit one
  for f64), ``elem`` (which packed element of the register, lowest bits first) and ``index``
  (``reg * elements_per_register + elem``: the element number of the PTX ISA's figures, a0..a7,
  c0..c3, d0..dN).  Matrices: mma A is M x K, B is K x N, C/D M x N; ``ldmatrix.x<n>`` stacks its
  n 8x8 matrices vertically, so row R is the row whose address lane R supplies (matrix m = rows
  8m..8m+7, delivered to register m); wgmma D is 64 x N, wgmma A 64 x K.
* shared-memory layouts (``smem``): fields ``offset`` (byte offset of the element's first byte
  from the tile's base, which must be aligned to the swizzle repeat: 8 * swizzle bytes),
  ``chunk`` (offset // 16: the 16-byte chunk; swizzles move whole chunks) and ``bank``
  ((offset // 4) % 32).  The matrix is the operand tile indexed (mn, k) -- A: (m, k), B: (n, k)
  -- in the canonical wgmma layout CuTe calls ``GMMA::Layout_<major>_<swizzle>_Atom``: K-major
  tiles are 8 x (128 bytes of K), MN-major tiles (128 bytes of MN) x 8; 16-bit elements unless
  the name ends in .8 or .32 (bits per element).

Bank conflicts
--------------
:func:`bank_conflicts` counts the shared-memory wavefronts a warp's access needs, with the model
stated in its docstring; :func:`ldmatrix_conflicts` applies it to the 8 row addresses of one
ldmatrix matrix under each swizzle.
"""

import argparse
import difflib
import functools
import sys
from dataclasses import dataclass

import numpy as np

from intrinsics.layout import (
    SWIZZLE_MODES,
    SmemLayout,
    a_fragment_coords,
    accumulator_coords,
    ldmatrix_fragment,
    mma_fragment,
    swizzle_offset_host,
)
from intrinsics.mma import MMA_SHAPES, mma_specs
from intrinsics.wgmma import WGMMA_TABLE

__all__ = [
    "Fragment",
    "bank_conflicts",
    "fragment",
    "fragments",
    "layout_map",
    "ldmatrix_conflicts",
    "main",
    "names",
    "render_grid",
    "render_png",
]

REGISTER_DTYPE = np.dtype([("lane", np.int32), ("reg", np.int32), ("elem", np.int32),
                           ("index", np.int32)])
SMEM_DTYPE = np.dtype([("offset", np.int64), ("chunk", np.int64), ("bank", np.int32)])

BANKS = 32
BANK_BYTES = 4
WAVEFRONT_BYTES = BANKS * BANK_BYTES  # 128: what shared memory delivers per wavefront


@dataclass(frozen=True)
class Fragment:
    """One registered layout: its name, kind ("registers" or "smem"), matrix shape, the number
    of threads that hold it (registers), a description, and the library call it is read from."""

    name: str
    kind: str
    rows: int
    cols: int
    threads: int
    description: str
    source: str
    build: object  # () -> (threads, registers, elements per register, 2) coords | SmemLayout

    @property
    def shape(self):
        return self.rows, self.cols


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------

_BITS_TO_BYTES = {8: 1, 16: 2, 32: 4}


def _default_acc(spec):
    """The first accumulator type of the spec's MMA_SHAPES row (f32, s32 or f64)."""
    for (shape, family), (_, _, accs, _) in MMA_SHAPES.items():
        if shape == spec.shape and spec.a in family:
            return next(iter(accs))
    raise LookupError(spec)


def _mma_entries():
    out = {}
    for spec in mma_specs():
        m, n, k = spec.mnk
        operands = {
            "A": (f"mma.{spec.shape}.{spec.a}.A", "a", (m, k), spec.a, spec.a_regs),
            "B": (f"mma.{spec.shape}.{spec.b}.B", "b", (k, n), spec.b, spec.b_regs),
        }
        c_name = f"mma.{spec.shape}.{spec.a}.C"
        if spec.acc != _default_acc(spec):
            c_name += f".{spec.acc}"
        operands["C"] = (c_name, "c", (m, n), spec.acc, spec.c_regs)
        for letter, (name, operand, (rows, cols), ptx_type, regs) in operands.items():
            if name in out:
                continue
            what = {"A": "A (M x K)", "B": "B (K x N)", "C": "C/D (M x N)"}[letter]
            out[name] = Fragment(
                name, "registers", rows, cols, 32,
                f"mma.sync {spec.shape} {what}, {ptx_type}: {regs} register{'s' if regs > 1 else ''} "
                f"per lane",
                f"intrinsics.layout.mma_fragment(<{spec.ptx}>, {operand!r})",
                functools.partial(mma_fragment, spec, operand),
            )
    # List each (shape, type) together, A B C, in the table's order.
    first = {}
    for name in out:
        first.setdefault(tuple(name.split(".")[1:3]), len(first))
    return dict(sorted(out.items(), key=lambda kv: (first[tuple(kv[0].split(".")[1:3])], kv[0])))


def _ldmatrix_coords(num, trans):
    one = ldmatrix_fragment(trans)  # (32, 2 halves, 2): (row, col) in one 8x8 matrix
    coords = np.zeros((32, num, 2, 2), dtype=np.int64)
    for m in range(num):  # matrix m: rows named by lanes 8m..8m+7, lands in register m
        coords[:, m] = one + np.array([8 * m, 0])
    return coords


def _ldmatrix_entries():
    out = {}
    for num in (1, 2, 4):
        for trans in (False, True):
            name = f"ldmatrix.x{num}" + (".trans" if trans else "")
            out[name] = Fragment(
                name, "registers", 8 * num, 8, 32,
                f"ldmatrix/stmatrix{'.trans' if trans else ''}: {num} 8x8 b16 "
                f"{'matrix' if num == 1 else 'matrices'}; lane R addresses row R, matrix m -> "
                f"register m",
                f"intrinsics.layout.ldmatrix_fragment({trans})",
                functools.partial(_ldmatrix_coords, num, trans),
            )
    return out


def _wgmma_d_coords(n, acc):
    rows, cols = accumulator_coords(n)  # (128, n/2): element v of thread t
    per = 1 if acc == "f32" else 2  # f16: register r packs elements 2r (low) and 2r+1
    return np.stack([rows, cols], axis=-1).reshape(128, n // 2 // per, per, 2)


def _wgmma_a_coords(elem_bytes):
    rows, cols = a_fragment_coords(elem_bytes)  # (128, elements): register r packs 4/eb of them
    per = 4 // elem_bytes
    return np.stack([rows, cols], axis=-1).reshape(128, -1, per, 2)


def _wgmma_entries():
    out = {}
    ns = sorted({n for row in WGMMA_TABLE.values() for n in row[3]})
    for n in ns:
        for acc in ("f32", "f16"):
            name = f"wgmma.m64n{n}.D" + (".f16" if acc == "f16" else "")
            regs = n // 2 if acc == "f32" else n // 4
            out[name] = Fragment(
                name, "registers", 64, n, 128,
                f"wgmma m64n{n} accumulator D, {acc}: {regs} registers per thread",
                f"intrinsics.layout.accumulator_coords({n})",
                functools.partial(_wgmma_d_coords, n, acc),
            )
    k_of_bytes = {row[1]: row[0] for row in WGMMA_TABLE.values()}  # element bytes -> K
    for bits, nbytes in sorted(_BITS_TO_BYTES.items()):
        name = f"wgmma.A.rs.{bits}"
        k = k_of_bytes[nbytes]
        out[name] = Fragment(
            name, "registers", 64, k, 128,
            f"wgmma m64nNk{k} A in registers (RS form), {bits}-bit: 4 registers per thread",
            f"intrinsics.layout.a_fragment_coords({nbytes})",
            functools.partial(_wgmma_a_coords, nbytes),
        )
    return out


def _smem_layout(major, swizzle, elem_bytes):
    """The tile shown for a name: one 128-byte span of the contiguous direction, 8 of the other
    (one full 128B swizzle atom; 2 or 4 atoms of the narrower swizzles)."""
    span = WAVEFRONT_BYTES // elem_bytes
    if major == "K":
        return SmemLayout("K", swizzle, 8, span, elem_bytes)
    return SmemLayout("MN", swizzle, span, 8, elem_bytes)


def _smem_entries():
    out = {}
    for major in ("K", "MN"):
        for swizzle in sorted(SWIZZLE_MODES):
            for bits in (16, 8, 32):
                nbytes = _BITS_TO_BYTES[bits]
                name = f"smem.{major}.{swizzle}" + ("" if bits == 16 else f".{bits}")
                layout = _smem_layout(major, swizzle, nbytes)
                mode = f"{swizzle}B swizzle" if swizzle else "no swizzle"
                out[name] = Fragment(
                    name, "smem", layout.mn, layout.k, 0,
                    f"{major}-major wgmma tile (mn, k), {bits}-bit, {mode}: offset/chunk/bank",
                    f"intrinsics.layout.{layout!r}.offset(mn, k)",
                    functools.partial(lambda lay: lay, layout),
                )
    return out


@functools.cache
def fragments():
    """name -> :class:`Fragment` for every registered layout (in listing order)."""
    out = {}
    for part in (_mma_entries(), _ldmatrix_entries(), _wgmma_entries(), _smem_entries()):
        out.update(part)
    return out


def names():
    """Every registered name, in listing order."""
    return list(fragments())


def fragment(name):
    """The :class:`Fragment` registered as ``name``.  mma and wgmma accept D for C (and C for D),
    and the operand letter in lower case.  An unknown name raises KeyError naming close ones."""
    table = fragments()
    if name in table:
        return table[name]
    parts = name.split(".")
    for i, part in enumerate(parts):
        letter = part.upper()
        if letter in ("A", "B", "C", "D"):
            for swap in (letter, {"C": "D", "D": "C"}.get(letter, letter)):
                alias = ".".join(parts[:i] + [swap] + parts[i + 1:])
                if alias in table:
                    return table[alias]
    close = difflib.get_close_matches(name, list(table), n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(
        f"no fragment layout named {name!r}{hint} (python -m numbatc.layouts --list names all "
        f"{len(table)}: mma.<shape>.<type>.A|B|C, ldmatrix.x1|x2|x4[.trans], wgmma.m64n<N>.D, "
        f"wgmma.A.rs.8|16|32, smem.K|MN.0|32|64|128)"
    )


# ---------------------------------------------------------------------------------------------
# Maps
# ---------------------------------------------------------------------------------------------


def _register_map(name, coords, shape):
    threads, regs, per, _ = coords.shape
    t, r, e = np.meshgrid(np.arange(threads), np.arange(regs), np.arange(per), indexing="ij")
    rows, cols = coords[..., 0].ravel(), coords[..., 1].ravel()
    if rows.min() < 0 or cols.min() < 0 or rows.max() >= shape[0] or cols.max() >= shape[1]:
        raise RuntimeError(f"{name}: the library's map leaves the {shape[0]}x{shape[1]} matrix")
    count = np.zeros(shape, dtype=np.int64)
    np.add.at(count, (rows, cols), 1)
    if not (count == 1).all():
        raise RuntimeError(
            f"{name}: the library's map covers some element {count.min()}..{count.max()} times"
        )
    out = np.zeros(shape, dtype=REGISTER_DTYPE)
    out["lane"][rows, cols] = t.ravel()
    out["reg"][rows, cols] = r.ravel()
    out["elem"][rows, cols] = e.ravel()
    out["index"][rows, cols] = (r * per + e).ravel()
    return out


def _smem_map(layout):
    mn, k = np.meshgrid(np.arange(layout.mn), np.arange(layout.k), indexing="ij")
    offset = np.asarray(layout.offset(mn, k), dtype=np.int64)
    out = np.zeros(offset.shape, dtype=SMEM_DTYPE)
    out["offset"] = offset
    out["chunk"] = offset // 16
    out["bank"] = (offset // BANK_BYTES) % BANKS
    return out


@functools.cache
def _cached_map(name):
    frag = fragments()[name]
    if frag.kind == "smem":
        out = _smem_map(frag.build())
    else:
        out = _register_map(name, np.asarray(frag.build()), frag.shape)
    out.flags.writeable = False
    return out


def layout_map(name):
    """The layout ``name`` as a (rows, cols) NumPy structured array (a fresh copy).

    Register fragments: fields ``lane``, ``reg``, ``elem``, ``index`` -- element (row, col) is
    packed element ``elem`` of register ``reg`` of thread ``lane`` (``index`` = the element
    number of the PTX ISA's figures).  Shared-memory layouts: ``offset`` (bytes from the tile's
    base), ``chunk`` (offset // 16), ``bank`` ((offset // 4) % 32).  See the module docstring
    for the matrices, and :func:`fragment` for the name's description and source."""
    return _cached_map(fragment(name).name).copy()


# ---------------------------------------------------------------------------------------------
# Text grids
# ---------------------------------------------------------------------------------------------


def _span(value, size, what):
    """(start, stop) from None, a slice, a (start, stop) pair or a "start:stop" string."""
    if value is None:
        return 0, size
    if isinstance(value, str):
        a, _, b = value.partition(":")
        value = slice(int(a) if a.strip() else None, int(b) if b.strip() else None)
    if isinstance(value, slice):
        if value.step not in (None, 1):
            raise ValueError(f"{what} range takes no step, got {value}")
        start, stop, _ = value.indices(size)
    else:
        start, stop = value
    if not 0 <= start < stop <= size:
        raise ValueError(f"{what} range must lie in 0..{size} and be non-empty, got {start}:{stop}")
    return start, stop


def _check_lane(frag, lane):
    if lane is None:
        return None
    if frag.kind != "registers":
        raise ValueError(f"{frag.name} is a shared-memory layout: it has no lanes (drop --lane, "
                         "or lane= in render_grid / render_png)")
    if not isinstance(lane, (int, np.integer)) or not 0 <= lane < frag.threads:
        raise ValueError(f"{frag.name}: lane must be an integer in 0..{frag.threads - 1}, got {lane!r}")
    return int(lane)


_SMEM_FIELDS = ("chunk", "bank", "offset")


def render_grid(name, lane=None, *, rows=None, cols=None, field="chunk"):
    """The layout ``name`` as a text grid, one narrow cell per matrix element.

    Register fragments: each cell reads ``T<lane>:<index>`` (thread and element number of its
    fragment); with ``lane`` given only that lane's cells are filled (``.`` elsewhere) and a last
    line lists its elements in register order.  Shared-memory layouts: each cell shows ``field``
    of the element ("chunk": its 16-byte chunk, the default; "bank"; "offset" in bytes), and a
    last line gives the worst ldmatrix wavefront count over the tile's 8x8 core matrices.
    ``rows``/``cols`` pick a range ((start, stop), a slice or "start:stop") of a big matrix such
    as wgmma.m64n256.D."""
    frag = fragment(name)
    lane = _check_lane(frag, lane)
    r0, r1 = _span(rows, frag.rows, "row")
    c0, c1 = _span(cols, frag.cols, "column")
    full = _cached_map(frag.name)
    grid = full[r0:r1, c0:c1]
    if frag.kind == "registers":
        per = int(full["elem"].max()) + 1
        cells = np.char.add(np.char.add("T", grid["lane"].astype(str)),
                            np.char.add(":", grid["index"].astype(str)))
        if lane is not None:
            cells = np.where(grid["lane"] == lane, cells, ".")
        pack = f"register = index // {per}" if per > 1 else "register = index"
        legend = f"cell = T<lane>:<element index>; {pack}"
    else:
        if field not in _SMEM_FIELDS:
            raise ValueError(f"field must be one of {', '.join(_SMEM_FIELDS)}, got {field!r}")
        cells = grid[field].astype(str)
        legend = {"chunk": "cell = 16-byte chunk of the tile (bank = 4*(chunk % 8) .. +3)",
                  "bank": "cell = bank ((offset // 4) % 32)",
                  "offset": "cell = byte offset from the tile's base"}[field]
    width = max(len(str(c1 - 1)), max(len(c) for c in cells.ravel()))
    label = len(str(r1 - 1))
    lines = [f"{frag.name}: {frag.rows} x {frag.cols}, {frag.description}",
             f"  {legend}; rows {r0}..{r1 - 1}, columns {c0}..{c1 - 1}",
             " " * label + " | " + " ".join(f"{c:>{width}}" for c in range(c0, c1)),
             "-" * label + "-+-" + "-" * ((width + 1) * (c1 - c0) - 1)]
    for i, row in enumerate(cells):
        lines.append(f"{r0 + i:>{label}} | " + " ".join(f"{c:>{width}}" for c in row))
    if lane is not None:
        held = np.argwhere(full["lane"] == lane)
        order = np.argsort(full["index"][held[:, 0], held[:, 1]])
        items = [f"{full['index'][r, c]}:({r},{c})" for r, c in held[order]]
        lines.append(f"T{lane} holds index:(row,col) " + " ".join(items))
    if frag.kind == "smem":
        worst = _core_matrix_conflicts(frag.build())
        lines.append(f"ldmatrix of the tile's 8x8 core matrices: worst {worst} wavefront(s) per "
                     f"matrix (1 = conflict-free)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Pictures
# ---------------------------------------------------------------------------------------------


def _palette():
    """32 colours: 8 hues of 4 shades (matplotlib's tab20b + tab20c groups).  Lane l gets hue
    l // 4 (the mma groupID), shade l % 4 (threadID_in_group); bank b gets hue b // 4 (its
    16-byte bank group), shade b % 4."""
    from matplotlib import colormaps

    groups = list(colormaps["tab20b"].colors) + list(colormaps["tab20c"].colors)
    return np.array(groups[:32])


def render_png(name, path, lane=None, *, rows=None, cols=None, field="chunk"):
    """Draw the layout ``name`` into the PNG file ``path`` (needs matplotlib).

    Register fragments: cells coloured by lane (hue = lane // 4, shade = lane % 4; lane % 32 for
    a warpgroup) and labelled ``T<lane>:<index>`` where the cells are big enough; with ``lane``
    given only its cells are coloured.  Shared-memory layouts: coloured by bank, labelled with
    ``field``.  ``rows``/``cols`` as for :func:`render_grid`.  Returns ``path``."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "render_png needs matplotlib, an optional dependency of numbatc: "
            "python3 -m pip install matplotlib, or numbatc's plots extra: "
            "python3 -m pip install 'numbatc[plots]' (render_grid needs nothing)"
        ) from err
    frag = fragment(name)
    lane = _check_lane(frag, lane)
    r0, r1 = _span(rows, frag.rows, "row")
    c0, c1 = _span(cols, frag.cols, "column")
    grid = _cached_map(frag.name)[r0:r1, c0:c1]
    nr, nc = grid.shape
    palette = _palette()
    if frag.kind == "registers":
        image = palette[grid["lane"] % 32]
        labels = np.char.add(np.char.add("T", grid["lane"].astype(str)),
                             np.char.add(":", grid["index"].astype(str)))
        shown = np.ones(grid.shape, dtype=bool)
        if lane is not None:
            shown = grid["lane"] == lane
            image = np.where(shown[..., None], image, 0.93)
        title = f"{frag.name}: cell = T<lane>:<element index>"
    else:
        if field not in _SMEM_FIELDS:
            raise ValueError(f"field must be one of {', '.join(_SMEM_FIELDS)}, got {field!r}")
        image = palette[grid["bank"]]
        labels = grid[field].astype(str)
        shown = np.ones(grid.shape, dtype=bool)
        title = f"{frag.name}: colour = bank, label = {field}"
    cell = min(0.55, 36.0 / nc, 36.0 / nr)  # inches
    if frag.kind == "smem" and field == "chunk":  # one label per 16-byte chunk, at its centre
        places = [(np.argwhere(grid["chunk"] == c).mean(axis=0), str(c))
                  for c in np.unique(grid["chunk"])]
    else:
        places = [((i, j), text) for (i, j), text in np.ndenumerate(labels) if shown[i, j]]
    chars = max(len(text) for _, text in places)
    fontsize = min(cell * 72 * 0.85 / (0.62 * chars), cell * 72 * 0.6)
    fig = Figure(figsize=(max(4.0, nc * cell + 1.2), max(2.5, nr * cell + 1.2)), dpi=100)
    ax = fig.add_axes((0.6 / (nc * cell + 1.2), 0.3 / (nr * cell + 1.2),
                       nc * cell / (nc * cell + 1.2), nr * cell / (nr * cell + 1.2)))
    ax.imshow(image, interpolation="nearest", aspect="equal",
              extent=(c0 - 0.5, c1 - 0.5, r1 - 0.5, r0 - 0.5))
    if fontsize >= 4:  # labels only where they are legible
        for (i, j), text in places:
            ax.text(c0 + j, r0 + i, text, ha="center", va="center", fontsize=fontsize)
    step_c = 1 if nc <= 32 else 8
    step_r = 1 if nr <= 32 else 8
    ax.set_xticks(range(c0, c1, step_c))
    ax.set_yticks(range(r0, r1, step_r))
    ax.tick_params(labelsize=max(5, min(9, fontsize)), top=True, labeltop=True,
                   bottom=False, labelbottom=False)
    for x in range(c0 - c0 % 8 + 8, c1, 8):
        ax.axvline(x - 0.5, color="black", linewidth=0.8)
    for y in range(r0 - r0 % 8 + 8, r1, 8):
        ax.axhline(y - 0.5, color="black", linewidth=0.8)
    fig.suptitle(title, fontsize=10, y=0.999, va="top")
    fig.savefig(path, format="png")
    return path


# ---------------------------------------------------------------------------------------------
# Bank conflicts
# ---------------------------------------------------------------------------------------------


def bank_conflicts(addresses, access_bytes=16):
    """Shared-memory wavefronts one warp-wide access needs (1 per phase when conflict-free).

    ``addresses``: the byte address each lane accesses, lane i = ``addresses[i]`` (up to 32;
    ``None`` for an inactive lane), each aligned to ``access_bytes`` (1, 2, 4, 8 or 16: ld/st
    .shared of that width; 16 for each row address of ldmatrix/stmatrix).

    The model (the rules below, as Nsight Compute counts shared-memory wavefronts):

    * Shared memory has 32 banks of 4 bytes; word w = address // 4 lives in bank w % 32, and a
      wavefront delivers at most one word per bank: 128 bytes (CUDA C++ Programming Guide,
      "Compute Capabilities", shared memory of compute capability 5.x and later).
    * Lanes that access the same word do not conflict: a read is broadcast, a write is done by
      one of them (same section).
    * An access of 8 or 16 bytes per lane is a multi-word access: the warp is served in phases
      of 128 bytes -- 2 phases of 16 lanes (half-warps) for 8 bytes, 4 phases of 8 lanes
      (quarter-warps: lanes 0-7, 8-15, 16-23, 24-31) for 16 bytes -- and lanes conflict only
      with lanes of the same phase.  This is the rule NVIDIA's engineers state on the developer
      forums and in GTC 2022 talk S41723 ("How to Understand and Optimize Shared Memory Accesses
      using Nsight Compute"), and the reason a conflict-free LDS.128 shows 4 wavefronts, not 1,
      in Nsight Compute.  A 16-byte access covers 4 consecutive banks (16-byte aligned: banks
      4j..4j+3).  ldmatrix is served the same way: each 8x8 matrix's 8 row addresses of 16
      bytes is one phase (lanes 8m..8m+7 name matrix m's rows, PTX ISA 9.7.14.5.15).
    * Accesses of 4 bytes or less: one phase of all 32 lanes.

    Each phase then needs as many wavefronts as the largest number of *distinct words* (equally:
    distinct 128-byte lines) that fall into any one bank; the result is the sum over the phases
    (0 for no active lane).  So: 32 lanes reading consecutive words, 1; all lanes reading one
    word, 1; 32 lanes 128 bytes apart, 32; an ldmatrix.x4 of unswizzled 128-byte rows,
    4 x 8 = 32, and of 128B-swizzled rows, 4.

    Not modelled: the cc 7.x merging of a 16-byte access whose lane pairs share addresses into
    fewer phases, and any merging of phases that read identical addresses -- for those patterns
    this is an upper bound.  Bank conflicts proper are the wavefronts above the ideal (1 per
    phase)."""
    if access_bytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"access_bytes must be 1, 2, 4, 8 or 16, got {access_bytes!r}")
    addresses = list(addresses)
    if len(addresses) > 32:
        raise ValueError(f"a warp has 32 lanes; got {len(addresses)} addresses")
    for i, a in enumerate(addresses):
        if a is None:
            continue
        if int(a) != a or a < 0 or int(a) % access_bytes:
            raise ValueError(
                f"lane {i}: address {a!r} must be a non-negative integer aligned to "
                f"{access_bytes} bytes"
            )
    lanes_per_phase = 32 if access_bytes <= BANK_BYTES else WAVEFRONT_BYTES // access_bytes
    words_per_access = max(1, access_bytes // BANK_BYTES)
    total = 0
    for start in range(0, len(addresses), lanes_per_phase):
        banks = {}
        for a in addresses[start:start + lanes_per_phase]:
            if a is None:
                continue
            for w in range(int(a) // BANK_BYTES, int(a) // BANK_BYTES + words_per_access):
                banks.setdefault(w % BANKS, set()).add(w)
        if banks:
            total += max(len(words) for words in banks.values())
    return total


def ldmatrix_conflicts(swizzle, row_bytes, col_chunk=None, first_row=0):
    """Wavefronts one ldmatrix 8x8 matrix needs when its 8 rows are rows ``first_row`` ..
    ``first_row + 7`` of a row-major shared tile with ``row_bytes`` per row, stored with swizzle
    mode ``swizzle`` (0, 32, 64 or 128 bytes, applied by ``intrinsics.layout.swizzle_offset_host``
    to the byte offset; the tile's base aligned to the swizzle repeat).  Each row supplies 16
    bytes at 16-byte column chunk ``col_chunk``; by default the worst case over every chunk of
    the row.  The count is :func:`bank_conflicts` of those 8 addresses (one 16-byte phase):
    1 is conflict-free; plain 128-byte rows give 8 (all eight rows on banks 4c..4c+3), the
    128B swizzle 1."""
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle mode must be one of {sorted(SWIZZLE_MODES)} bytes, got {swizzle!r}")
    if not isinstance(row_bytes, (int, np.integer)) or row_bytes <= 0 or row_bytes % 16:
        raise ValueError(f"row_bytes must be a positive multiple of 16, got {row_bytes!r}")
    if col_chunk is not None and not 0 <= col_chunk < row_bytes // 16:
        raise ValueError(f"col_chunk must be in 0..{row_bytes // 16 - 1}, got {col_chunk!r}")
    if not isinstance(first_row, (int, np.integer)) or first_row < 0:
        raise ValueError(f"first_row must be a non-negative integer, got {first_row!r}")
    chunks = range(row_bytes // 16) if col_chunk is None else [col_chunk]
    worst = 0
    for c in chunks:
        rows = [swizzle_offset_host(r * row_bytes + 16 * c, swizzle)
                for r in range(first_row, first_row + 8)]
        worst = max(worst, bank_conflicts(rows, 16))
    return worst


def _core_matrix_conflicts(layout):
    """Worst ldmatrix wavefronts over the 8x8 (16-byte rows) core matrices of a canonical tile:
    K-major rows run along k at fixed mn; MN-major rows along mn at fixed k (ldmatrix .trans)."""
    per_row = 16 // layout.elem_bytes
    worst = 0
    if layout.major == "K":
        for mn0 in range(0, layout.mn, 8):
            for k0 in range(0, layout.k, per_row):
                rows = [int(layout.offset(mn0 + r, k0)) for r in range(8)]
                worst = max(worst, bank_conflicts(rows, 16))
    else:
        for k0 in range(0, layout.k, 8):
            for mn0 in range(0, layout.mn, per_row):
                rows = [int(layout.offset(mn0, k0 + r)) for r in range(8)]
                worst = max(worst, bank_conflicts(rows, 16))
    return worst


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _conflict_table(row_bytes):
    lines = [f"ldmatrix 8x8 matrix over rows of {row_bytes} bytes: wavefronts per matrix "
             f"(worst column chunk; 1 = conflict-free)"]
    for swizzle in sorted(SWIZZLE_MODES):
        mode = f"{swizzle}B swizzle" if swizzle else "no swizzle"
        lines.append(f"  {mode:<13} {ldmatrix_conflicts(swizzle, row_bytes)}")
    return "\n".join(lines)


def main(argv=None):
    """``python -m numbatc.layouts <fragment> [--lane N] [--png FILE] [--rows A:B] [--cols A:B]
    [--field chunk|bank|offset] | --list | --conflicts ROW_BYTES``: print the grid (or, with
    --png, only write the picture).  Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m numbatc.layouts",
        description="Show which lane holds which element of a tensor-core fragment, or where a "
                    "swizzled shared-memory tile puts it.",
    )
    parser.add_argument("fragment", nargs="?", help="a layout name (see --list)")
    parser.add_argument("--lane", type=int, help="show only this lane's (thread's) cells")
    parser.add_argument("--png", metavar="FILE", help="write a PNG picture instead (needs matplotlib: "
                        "pip install 'numbatc[plots]')")
    parser.add_argument("--rows", metavar="A:B", help="row range of a big matrix")
    parser.add_argument("--cols", metavar="A:B", help="column range (e.g. wgmma.m64n256.D)")
    parser.add_argument("--field", choices=_SMEM_FIELDS, default="chunk",
                        help="what an smem cell shows (default: chunk)")
    parser.add_argument("--list", action="store_true", help="list every layout name")
    parser.add_argument("--conflicts", type=int, metavar="ROW_BYTES",
                        help="ldmatrix wavefronts per swizzle mode for rows of ROW_BYTES")
    args = parser.parse_args(argv)
    if args.list:
        table = fragments()
        width = max(len(n) for n in table)
        for frag in table.values():
            print(f"{frag.name:<{width}}  {frag.rows:>3} x {frag.cols:<3}  {frag.description}")
        return 0
    if args.conflicts is not None:
        try:
            print(_conflict_table(args.conflicts))
        except ValueError as err:
            parser.error(str(err))
        return 0
    if args.fragment is None:
        parser.error("name a fragment layout (or --list, --conflicts ROW_BYTES)")
    try:
        if args.png:
            render_png(args.fragment, args.png, args.lane, rows=args.rows, cols=args.cols,
                       field=args.field)
        else:
            print(render_grid(args.fragment, args.lane, rows=args.rows, cols=args.cols,
                              field=args.field))
    except KeyError as err:
        parser.error(err.args[0])
    except (ValueError, ImportError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
