"""The portable tensor-core GEMM (sm_80 and newer): cp.async multistage pipeline into swizzled
shared memory, ldmatrix into fragments, mma.sync m16n8k16 with fp32 accumulation, and an epilogue
that applies alpha, beta * C, bias and the activation while storing.

The kernel is written as Python source generated per (configuration, variant) and compiled by
numba-cuda: the warp tile's accumulators are named variables (``acc_i_j``, one 4-tuple per
16x8 mma tile) so that they stay in registers -- a loop over a tuple of tuples cannot be unrolled
by numba, and a local array indexed at run time would live in local memory.  The generated
module is compiled and cached on disk through numbatc.kernels.build; the epilogue, split-K and
the launch are every GEMM kernel's (numbatc.kernels.epilogue).

The k loop comes in two orders (:func:`mainloop_source`): wait, barrier, refill, then every k
step's ldmatrix and mma; or, for configurations with ``prefetch`` (the defaults for M > 64),
CUTLASS's multistage order, in which the fragments are double-buffered by k step and the next
k tile's first ones load under the last step's mma (on an H100, 8-17 % over the same tiles
without it: TILES' note).

Shared-memory tiles (one per operand per stage, addressed in bytes), each row of ``ROW`` bytes
swizzled so that the eight row addresses of an ldmatrix land in eight different 16-byte bank
groups:

    A row-major ('row', K contiguous):  [BM][BK]  -> ldmatrix      (A fragment directly)
    A col-major ('col', M contiguous):  [BK][BM]  -> ldmatrix.trans
    B row-major ('row', N contiguous):  [BK][BN]  -> ldmatrix.trans (B fragment: k pairs per n)
    B col-major ('col', K contiguous):  [BN][BK]  -> ldmatrix

Edges: tiles wholly inside a and b copy their whole k tiles with plain 16-byte cp.async
(``load_*_inside``: no bounds, byte-addressed operands, one 64-bit add per copy); edge tiles
and the ragged last k tile use copies with a source byte count (0 outside the matrix, the
remaining bytes at a ragged edge), so tiles past M, N or K read zeros and any M, N, K >= 1
works.  (NOTE: ptxas 13.0 SASS for sm_80, 128x256 tile, bf16 row/row: with checked copies
only, and 64-bit stage arithmetic, the k loop spent 331 instructions per k tile beside its 128
HMMA, 32 LDSM and 24 LDGSTS; the unchecked path spends 78 beside 128 HMMA, 32 LDSM and 12
LDGSTS.)  The operands' start and leading dimension must be 16-byte aligned; :func:`launch`
packs an operand that is not into an aligned copy first.  (NOTE: a plain-load path inside the
kernel for such operands made ptxas hoist its unrolled addresses and spill: 255 registers and
170 bytes of spills, against 254 and none without it.)
"""

import dataclasses
import functools
from dataclasses import dataclass

from numbatc.kernels import epilogue, gpus, operands, split_k
from numbatc.kernels.build import load_generated
from numbatc.kernels.epilogue import (  # what every GEMM kernel shares
    CONVERSIONS,
    SPLIT_HELPERS,
    GemmVariant,
    eargs_source,
    full_tile_epilogue,
    launch_gemm_kernel,
    split_epilogue_source,
    split_source,
    stores_source,
    variant_for,
)

__all__ = ["Sm80Config", "CONFIGS", "TILES", "unsupported", "choose", "compiled", "split",
           "launch", "explain", "grid_for", "kernel_for", "kernel_source", "launch_flat",
           "signature"]


#: 16-byte chunks per warp-tile row (warp_n / 8) that staged_epilogue's swizzle covers
_STAGED_CHUNKS = (4, 8)


@dataclass(frozen=True)
class Sm80Config:
    """Tile shape (BM x BN x BK), the warp grid (WARPS_M x WARPS_N warps, each computing
    (BM / WARPS_M) x (BN / WARPS_N)) and the cp.async pipeline depth."""

    name: str
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    # the k loop loads the next k tile's first fragments before the last k step's mma
    # (mainloop_source's ``prefetch``)
    prefetch: bool = False
    # (prefetch only) the refill of the next stage is issued after step 1's fragments are
    # loaded instead of at the top of the k tile: ptxas otherwise gives the copies' address
    # temporaries the registers of step 1's fragments, and the ldmatrix that writes them waits
    # (long scoreboard) until the cp.async has read them (mainloop_source)
    late_refill: bool = False
    # a tile inside the matrix stores its 16-bit out through shared memory as 16-byte rows
    # where out's rows are 16-byte aligned (GemmVariant.out_staged, staged_epilogue)
    staged: bool = False

    def __post_init__(self):
        wm, wn = self.bm // self.warps_m, self.bn // self.warps_n
        problems = []
        if self.bk not in (32, 64):
            problems.append(f"bk must be 32 or 64, got {self.bk}")
        if self.bm % self.warps_m or wm % 16:
            problems.append(f"bm / warps_m must be a multiple of 16, got {self.bm}/{self.warps_m}")
        if self.bn % self.warps_n or wn % 16:
            problems.append(f"bn / warps_n must be a multiple of 16, got {self.bn}/{self.warps_n}")
        if self.late_refill and not self.prefetch:
            problems.append("late_refill needs prefetch")
        if self.staged and wn // 8 not in _STAGED_CHUNKS:
            problems.append("staged needs warp tiles 32 or 64 columns wide")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if self.threads > 1024:
            problems.append(f"{self.threads} threads exceed 1024")
        for rows, cols in ((self.bm, self.bk), (self.bk, self.bm), (self.bn, self.bk), (self.bk, self.bn)):
            per_row = cols // 8
            if self.threads % per_row or (rows * per_row) % self.threads:
                problems.append(f"a {rows}x{cols} tile does not split into 16-byte copies evenly "
                                f"over {self.threads} threads")
        if self.shared_bytes > 227 * 1024:
            problems.append(f"{self.shared_bytes} bytes of shared memory exceed 227 KB")
        if problems:
            raise ValueError(f"invalid sm80 GEMM config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_m(self):
        return self.bm // self.warps_m

    @property
    def warp_n(self):
        return self.bn // self.warps_n

    @property
    def stage_elems(self):
        return (self.bm + self.bn) * self.bk

    @property
    def shared_bytes(self):
        return self.stages * self.stage_elems * 2


CONFIGS = {
    c.name: c
    for c in (
        # shared memory per block (stages x (BM + BN) x BK x 2 bytes) in the comments; which
        # GPUs fit them, and how many per SM, is numbatc.kernels.gpus' (see choose)
        Sm80Config("128x256x64_8w_3s", 128, 256, 64, 2, 4, 3),  # 144 KB: 8.0 / 8.7, 9.0, 10.x
        Sm80Config("128x128x64_4w_4s", 128, 128, 64, 2, 2, 4),  # 128 KB
        Sm80Config("64x128x64_4w_4s", 64, 128, 64, 1, 4, 4),  # 96 KB: fits every GPU
        Sm80Config("64x64x64_4w_3s", 64, 64, 64, 2, 2, 3),  # 48 KB
        # decode (M <= 16): 16-row tiles waste no mma.sync on rows that do not exist; 6 stages
        # keep 80 KB of B in flight per block (the problem is bound by reading B once); 4 (48
        # KB of B) where a block gets 99 KB (8.6, 8.9, 12.x)
        Sm80Config("16x128x64_4w_6s", 16, 128, 64, 1, 4, 6),  # 108 KB
        Sm80Config("16x128x64_4w_4s", 16, 128, 64, 1, 4, 4),  # 72 KB
        # 128-thread blocks that pair up on one SM (<= 256 registers per thread): see choose
        Sm80Config("128x128x64_4w_3s", 128, 128, 64, 2, 2, 3),  # 96 KB: 2 per SM in 228 KB
        Sm80Config("128x128x32_4w_4s", 128, 128, 32, 2, 2, 4),  # 64 KB: 2 per SM in 164 KB
        Sm80Config("128x128x32_4w_3s", 128, 128, 32, 2, 2, 3),  # 48 KB: 2 per SM in 100 KB
        Sm80Config("128x256x64_8w_4s", 128, 256, 64, 2, 4, 4),  # 192 KB: 9.0 / 10.x only
        # the k loop with the next tile's first fragments loaded before the last k step's mma
        # (mainloop_source's prefetch; TILES' note has their figures).  Not 128x128x64_4w_3s:
        # ptxas 13.0 spills 136-252 bytes there for sm_90a (its 64 x 64 warp tile holds 128
        # accumulators; two buffers of fragments across the loop do not fit beside them).
        Sm80Config("128x128x32_4w_4s_fp", 128, 128, 32, 2, 2, 4, prefetch=True),
        Sm80Config("128x256x64_8w_3s_fp", 128, 256, 64, 2, 4, 3, prefetch=True),
        Sm80Config("128x256x64_8w_4s_fp", 128, 256, 64, 2, 4, 4, prefetch=True),
        # the refill after step 1's fragments (Sm80Config.late_refill), by name until timed
        Sm80Config("128x256x64_8w_3s_fpr", 128, 256, 64, 2, 4, 3, prefetch=True,
                   late_refill=True),
        # the default tile with the staged epilogue (Sm80Config.staged), by name until timed
        Sm80Config("128x256x64_8w_3s_fps", 128, 256, 64, 2, 4, 3, prefetch=True, staged=True),
        Sm80Config("128x128x32_4w_3s_fp", 128, 128, 32, 2, 2, 3, prefetch=True),
        # the small-M tiles' prefetching twins (the Hopper dispatch's M <= 64 path; TILES' note
        # has their figures): the 16-row ones are the decode tiles
        Sm80Config("64x128x64_4w_4s_fp", 64, 128, 64, 1, 4, 4, prefetch=True),
        Sm80Config("16x128x64_4w_6s_fp", 16, 128, 64, 1, 4, 6, prefetch=True),
        Sm80Config("16x128x64_4w_4s_fp", 16, 128, 64, 1, 4, 4, prefetch=True),
    )
}


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def _swizzle_expr(row_bytes):
    """Expression swizzling byte offset ``o`` inside a tile whose rows are ``row_bytes`` long:
    the 16-byte chunk index is XORed with the row index (mod 8), so that eight consecutive rows'
    same chunk fall in eight different bank groups (64-byte rows: pairs of rows share 128 bytes,
    so the chunk takes (row // 2) % 4)."""
    if row_bytes == 64:
        return "(o ^ ((o >> 3) & 0x30))"
    shift = row_bytes.bit_length() - 1 - 4  # log2(row_bytes) - 4
    return f"(o ^ ((o >> {shift}) & 0x70))"


def tile_row_bytes(cfg, var):
    """(A's, B's) shared-memory tile row length in bytes: BK two-byte elements along K for a
    K-major operand ('row' A, 'col' B), the tile's M (N) extent for an MN-major one."""
    a_rowb = (cfg.bk if var.a_layout == "row" else cfg.bm) * 2
    b_rowb = (cfg.bk if var.b_layout == "col" else cfg.bn) * 2
    return a_rowb, b_rowb


@functools.cache
def _swizzle_code(row_bytes):
    return compile(_swizzle_expr(row_bytes), "<swizzle>", "eval")


def _swizzle(o, row_bytes):
    """The value of :func:`_swizzle_expr` (the generated swz_a / swz_b) at ``o``: the same
    expression evaluated on the host, so that the fragment-offset check cannot drift from the
    kernel's swizzle."""
    return eval(_swizzle_code(row_bytes), {"o": o})


def _fragment_rows(cfg, var, a_rowb, b_rowb):
    """Each ldmatrix.x4 of a k tile as ``(op, ks, idx, expr)``: op 'a' (idx: the warp's A tile
    i) or 'b' (idx: the first of a pair of B tiles j, j + 1); ``expr`` the source of the lane's
    row offset in bytes in the operand's tile, before the swizzle (in ``lane``, ``wm``, ``wn``)."""
    WM, WN, MI, NJ = cfg.warp_m, cfg.warp_n, cfg.warp_m // 16, cfg.warp_n // 8
    out = []
    for ks in range(cfg.bk // 16):
        for i in range(MI):
            mrow = f"wm * {WM} + {i * 16}"
            if var.a_layout == "row":
                # [m][k]: lanes 0-15 rows m, lanes 16-31 the same rows at k + 8
                o = f"({mrow} + lane % 16) * {a_rowb} + ({ks * 16} + (lane // 16) * 8) * 2"
            else:
                # [k][m], .trans: matrix q = lane // 8 covers k + (q // 2) * 8, m + (q % 2) * 8
                o = (f"({ks * 16} + ((lane // 8) // 2) * 8 + lane % 8) * {a_rowb} + "
                     f"({mrow} + ((lane // 8) % 2) * 8) * 2")
            out.append(("a", ks, i, o))
        for j in range(0, NJ, 2):
            ncol = f"wn * {WN} + {j * 8}"
            if var.b_layout == "col":
                # [n][k]: matrix q covers n + (q // 2) * 8, k + (q % 2) * 8
                o = (f"({ncol} + ((lane // 8) // 2) * 8 + lane % 8) * {b_rowb} + "
                     f"({ks * 16} + ((lane // 8) % 2) * 8) * 2")
            else:
                # [k][n], .trans: matrix q covers k + (q % 2) * 8, n + (q // 2) * 8
                o = (f"({ks * 16} + ((lane // 8) % 2) * 8 + lane % 8) * {b_rowb} + "
                     f"({ncol} + ((lane // 8) // 2) * 8) * 2")
            out.append(("b", ks, j, o))
    return out


@functools.cache
def _swizzled_values(expr, rowb, points):
    """swizzle(expr) at each (lane, wm, wn) of ``points`` (a tuple), expr compiled once."""
    code = compile(expr, "<fragment offset>", "eval")
    return [_swizzle(eval(code, {"lane": lane, "wm": wm, "wn": wn}), rowb)
            for lane, wm, wn in points]


def _xor_add(expr, base, rowb, cfg):
    """Constants (x, y) with swizzle(expr) == (swizzle(base) ^ x) + y for every lane and warp
    position (checked exhaustively on the host), x inside a 128-byte swizzle row so that it
    commutes with adding the stage's and the tile's offsets (multiples of 1024); None where
    there are none."""
    points = tuple((lane, wm, wn) for lane in range(32) for wm in range(cfg.warps_m)
                   for wn in range(cfg.warps_n))
    want = _swizzled_values(expr, rowb, points)
    have = _swizzled_values(base, rowb, points)
    for x in range(0, 128, 16):
        y = want[0] - (have[0] ^ x)
        if all(w == (h ^ x) + y for w, h in zip(want, have)):
            return x, y
    return None


def _fragment_offsets(w, cfg, var, a_rowb, b_rowb, a_elems):
    """Emit each lane's ldmatrix base offsets (``a_frag``, ``b_frag``: bytes, swizzled, from
    the stage's start, of the first A tile's and the first B pair's rows at k step 0) and return
    ``{(op, ks, idx): expr}``, the source of every ldmatrix's byte offset in ``smem`` given the
    stage's bases ``sa = so + a_frag`` and ``sb = so + b_frag``.

    The swizzle XORs a row's 16-byte chunk index with the row mod 8, and the tiles of a k tile
    lie whole multiples of 8 rows apart, so every fragment offset is the base XORed with one
    constant (the k step's chunk) plus another (the tile's rows): a LOP3 and ldmatrix's
    immediate offset, instead of a register per (k step, tile), 32 of them for a 64 x 64 warp
    tile.  (128 x 128 x 64, row x col, ptxas 13.0 for sm_90a: 293 -> 269 instructions on the k
    loop's unchecked path, 243 -> 240 registers; its first compile on a 2-core host 2.5 -> 2.1
    s, numba typing 32 fewer variables.  Compiled with maxntid 128, the old form spilled 44-112
    bytes inside the k loop, the new none.)  A configuration with an offset not of that form
    is refused (none among CONFIGS and sm80_gemm_softmax's)."""
    assert (cfg.stage_elems * 2) % 1024 == 0 and (a_elems * 2) % 1024 == 0
    rows = _fragment_rows(cfg, var, a_rowb, b_rowb)
    base = {op: next(e for o, _, _, e in rows if o == op) for op in "ab"}
    rowb = {"a": a_rowb, "b": b_rowb}
    w(f"    a_frag = np.int32(swz_a({base['a']}))")
    w(f"    b_frag = np.int32({a_elems * 2} + swz_b({base['b']}))")
    addr = {}
    for op, ks, idx, e in rows:
        xy = _xor_add(e, base[op], rowb[op], cfg)
        if xy is None:
            raise ValueError(f"sm80 config {cfg.name}: the ldmatrix rows of operand {op}, k step "
                             f"{ks}, tile {idx} are not its first rows XORed and moved by "
                             "constants")
        x, y = xy
        s = f"(s{op} ^ {x})" if x else f"s{op}"
        addr[(op, ks, idx)] = f"{s} + {y}" if y else s
    return addr


def loader_source(w, cfg, op, layout, rowb, base_elems, unit=2, inside=False):
    """Emit ``load_<op>``: the thread's 16-byte cp.async copies of one tile, checked; with
    ``inside``, also ``load_<op>_inside``: the same copies of a tile wholly inside the operand.

    Tile rows run along the operand's non-contiguous dimension, 8 elements per copy.  Thread t
    copies column chunk t % CPR of rows t // CPR + i * RSTEP.  Shared memory is addressed in
    bytes (``so``: the stage's byte offset; the tile starts ``base_elems`` two-byte elements
    into the stage); the operand in units of ``unit`` bytes (2: an element pointer, 1: a byte
    pointer; ``start`` and ``ld`` count units).  The swizzle depends on the row mod 8 alone, so
    copy i's shared offset is one of at most 8 / gcd(RSTEP, 8) per-thread swizzled bases plus a
    constant.

    ``load_<op>``: copies outside the matrix read 0 bytes (zero fill), the ragged edge reads only
    the bytes inside.  ``load_<op>_inside`` (the caller checks once per k tile that the tile lies
    inside): no bounds or byte counts; the global index of copy i is the first's plus
    i * (RSTEP * ld), a value passed through an empty volatile asm (``wgmma_fence_operand``, an
    optimisation barrier) so that LLVM computes the copies' addresses per k tile, one
    multiply-add each, instead of hoisting one 64-bit invariant per copy out of the k loop."""
    k_major = (op == "a" and layout == "row") or (op == "b" and layout == "col")
    mn = cfg.bm if op == "a" else cfg.bn
    rows, cols = (mn, cfg.bk) if k_major else (cfg.bk, mn)
    per_row = cols // 8
    step = cfg.threads // per_row
    count = rows * per_row // cfg.threads
    base = base_elems * 2
    # k_major: rows are m (or n), columns k; the k tile moves along the columns (offset k0).
    # otherwise: rows are k, columns m (or n); the k tile moves along the rows (offset k0 * ld).
    row_lim, col_lim = ("mn_lim", "k_lim") if k_major else ("k_lim", "mn_lim")
    koff = (f"k0 * {2 // unit}" if unit == 1 else "k0") if k_major else "k0 * ld"

    def bases_and_deltas():
        """[(q, constant)] per copy: copy i's shared offset is d<q> + constant."""
        out = []
        for i in range(count):
            q = (i * step) % 8 if step % 8 else 0
            out.append((q, (i * step - q) * rowb))
        return out

    copies = bases_and_deltas()
    w(f"""
@cuda.jit(device=True, forceinline=True)
def load_{op}(smem, so, src, start, ld, r0, c0, mn_lim, k0, k_lim):
    # {op.upper()}: {rows} x {cols} tile, {count} copies of 16 bytes per thread
    base = so + {base}
    g = start + {koff}
    cc = {col_lim} - c0""")
    for i in range(count):
        w(f"""    r = r0 + {i * step}
    o = r * {rowb} + c0 * 2
    if r < {row_lim} and cc > 0:
        CP(smem, base + swz_{op}(o), src, g + {i * step} * ld, min(cc, 8) * 2)
    else:
        CP(smem, base + swz_{op}(o), src, 0, 0)""")
    if inside:
        w(f"""
@cuda.jit(device=True, forceinline=True)
def load_{op}_inside(smem, so, src, start, ld, r0, c0, k0):
    # {op.upper()}: {rows} x {cols} tile wholly inside the operand, {count} copies, no bounds
    g = start + {koff}
    rstep = np.int64(nt.wgmma_fence_operand(np.int32({step} * ld)))""")
        for q in sorted({q for q, _ in copies}):
            w(f"    d{q} = so + {base} + swz_{op}((r0 + {q}) * {rowb} + c0 * 2)")
        for i, (q, delta) in enumerate(copies):
            src = "g" if i == 0 else f"g + {i} * rstep"
            w(f"    CP_IN(smem, d{q} + {delta}, src, {src})")
    return per_row


def _load_source(pad, so, k0, inside, bk, lds):
    """Lines loading k tile ``k0`` (source text) into the stage at byte offset ``so``: through
    load_a/load_b, or, with ``inside`` (the name of the kernel's flag that the tile's M and N
    extents lie inside the operands), through the unchecked loaders where the k tile is whole.
    ``lds``: the names of a's and b's leading dimensions (in the loaders' units)."""
    lda, ldb = lds
    checked = [f"load_a(smem, {so}, a, a_start, {lda}, a_r0, a_c0, m_lim, {k0}, K - {k0})",
               f"load_b(smem, {so}, b, b_start, {ldb}, b_r0, b_c0, n_lim, {k0}, K - {k0})"]
    if not inside:
        return "\n".join(pad + x for x in checked)
    fast = [f"load_a_inside(smem, {so}, a, a_start, {lda}, a_r0, a_c0, {k0})",
            f"load_b_inside(smem, {so}, b, b_start, {ldb}, b_r0, b_c0, {k0})"]
    return "\n".join([f"{pad}if {inside} and {k0} + {bk} <= K:"] + [pad + "    " + x for x in fast]
                     + [f"{pad}else:"] + [pad + "    " + x for x in checked])


def mainloop_source(w, cfg: Sm80Config, var: GemmVariant, inside=None, lds=("lda", "ldb")):
    """Emit (through ``w``) the main loop that sm80 kernels share, inside a kernel whose
    ``smem`` (uint8), ``t``, ``wm``/``wn``, ``m0``/``n0`` limits, ``k_tiles``, the copy starts
    (``a_start``, ``b_start``, ``a_r0`` ...) and ``load_a``/``load_b`` are defined: zeroed
    accumulators ``acc_i_j``, the ldmatrix offsets, the cp.async prologue (STAGES-1 tiles in
    flight) and the k loop (wait, refill, ldmatrix + mma.sync on every k step).  ``inside``:
    the name of the kernel's flag that the tile lies inside the operands' M and N extents; its
    whole k tiles are then copied by ``load_a_inside``/``load_b_inside`` (loader_source's
    ``inside``).  ``lds``: the names of the leading dimensions the loaders take."""
    BK, S = cfg.bk, cfg.stages
    MI, NJ = cfg.warp_m // 16, cfg.warp_n // 8
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    a_elems = cfg.bm * BK
    stage = cfg.stage_elems * 2
    for i in range(MI):
        for j in range(NJ):
            w(f"    acc_{i}_{j} = (np.float32(0), np.float32(0), np.float32(0), np.float32(0))")
    addr = _fragment_offsets(w, cfg, var, a_rowb, b_rowb, a_elems)
    w(f'''
    # Prologue: the first STAGES-1 tiles in flight.
    for s in range({S - 1}):
        if s < k_tiles:
{_load_source(" " * 12, f"np.int32(s * {stage})", f"s * {BK}", inside, BK, lds)}
        nt.cp_async_commit_group()

    # Main loop: wait for tile kt, refill the stage tile kt-1 used, compute on tile kt.  The
    # stages' byte offsets, of tile kt (so) and of tile kt + STAGES-1 (so_next), are counters
    # that wrap: no 64-bit kt % STAGES (a multiply-high sequence of ~15 instructions per k tile).
    so = np.int32(0)
    so_next = np.int32({(S - 1) * stage})''')
    a_ld = "ldmatrix_x4" if a_kmajor else "ldmatrix_x4_trans"
    b_ld = "ldmatrix_x4" if b_kmajor else "ldmatrix_x4_trans"

    def fragments(ks, buf, pad):
        """Load k step ks's fragments (buffer name suffix ``buf``) from the stage at sa / sb."""
        for i in range(MI):
            w(f"{pad}fa{buf}_{i} = nt.{a_ld}(smem, {addr[('a', ks, i)]})")
        for j in range(0, NJ, 2):
            w(f"{pad}fb = nt.{b_ld}(smem, {addr[('b', ks, j)]})")
            w(f"{pad}fb{buf}_{j} = (fb[0], fb[1])")
            w(f"{pad}fb{buf}_{j + 1} = (fb[2], fb[3])")

    def products(buf, pad):
        for i in range(MI):
            for j in range(NJ):
                w(f"{pad}acc_{i}_{j} = MMA(fa{buf}_{i}, fb{buf}_{j}, acc_{i}_{j})")

    refill = _load_source(" " * 12, "so_next", f"nxt * {BK}", inside, BK, lds)
    wrap = f"np.int32(0) if {{0}} == {(S - 1) * stage} else np.int32({{0}} + {stage})"
    if not cfg.prefetch:
        w(f'''    for kt in range(k_tiles):
        nt.cp_async_wait_group({S - 2})
        cuda.syncthreads()
        nxt = kt + {S - 1}
        if nxt < k_tiles:
{refill}
        nt.cp_async_commit_group()
        so_next = {wrap.format("so_next")}
        sa = so + a_frag
        sb = so + b_frag''')
        for ks in range(BK // 16):
            w(f"        # k step {ks}")
            fragments(ks, "", " " * 8)
            products("", " " * 8)
        w(f"        so = {wrap.format('so')}")
        return
    # prefetch (CUTLASS's multistage order): fragments are double-buffered by k step parity
    # (fa0 / fa1 ...); step ks + 1's are loaded before step ks's mma, and the wait for tile kt
    # + 1 and the barrier come after step K - 2's mma, so that tile kt + 1's first fragments
    # load under step K - 1's mma instead of after the barrier with nothing to hide them.
    # The barrier also orders every warp's reads of tile kt (its last fragments are loaded
    # before it) before the refill of tile kt's stage at the top of iteration kt + 1.
    KS = BK // 16
    w(f'''    nt.cp_async_wait_group({S - 2})
    cuda.syncthreads()
    sa = a_frag
    sb = b_frag''')
    fragments(0, "0", " " * 4)
    refill_block = f'''        nxt = kt + {S - 1}
        if nxt < k_tiles:
{refill}
        nt.cp_async_commit_group()
        so_next = {wrap.format("so_next")}'''
    w("    for kt in range(k_tiles):")
    if not cfg.late_refill:
        w(refill_block)
    for ks in range(KS):
        w(f"        # k step {ks}")
        if ks < KS - 1:
            fragments(ks + 1, str((ks + 1) % 2), " " * 8)
            if ks == 0 and cfg.late_refill:
                w(refill_block)
        else:  # the next tile's first step (its stage is ready: the barrier below step K - 2)
            w(f"        so = {wrap.format('so')}")
            w("        sa = so + a_frag")
            w("        sb = so + b_frag")
            fragments(0, "0", " " * 8)
        products(str(ks % 2), " " * 8)
        if ks == KS - 2:
            w(f"        nt.cp_async_wait_group({S - 2})")
            w("        cuda.syncthreads()")


def module_header(w, generator, cfg, var, constants=""):
    """Emit the head of a generated mma.sync GEMM module: its docstring, imports, the MMA and
    cp.async operations, ``constants`` (lines of module constants), and the swizzles of the A
    and B tiles (swz_a, swz_b) for ``var``'s layouts.  sm80_gemm and sm80_gemm_softmax."""
    ptx_in = _PTX_TYPE[var.in_dtype]
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    w(f'''"""Generated by numbatc.kernels.{generator} for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

MMA = nt.mma_sync("m16n8k16", "{ptx_in}", "{ptx_in}", "f32")
CP = nt.cp_async_op(16, zfill=True)
CP_IN = nt.cp_async_op(16)
{constants}

@cuda.jit(device=True, forceinline=True)
def swz_a(o):
    return {_swizzle_expr(a_rowb)}


@cuda.jit(device=True, forceinline=True)
def swz_b(o):
    return {_swizzle_expr(b_rowb)}

''')


def kernel_source(cfg: Sm80Config, var: GemmVariant) -> str:
    """Python source of the kernel for one configuration and variant."""
    BM, BN, BK = cfg.bm, cfg.bn, cfg.bk
    WM, WN = cfg.warp_m, cfg.warp_n
    MI, NJ = WM // 16, WN // 8  # mma tiles per warp
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    a_elems = BM * BK
    lines = []
    w = lines.append

    module_header(w, "sm80_gemm", cfg, var)
    w(CONVERSIONS)
    # a and b are byte pointers (see signature): start, lda_b and ldb_b count bytes
    a_per_row = loader_source(w, cfg, "a", var.a_layout, a_rowb, 0, unit=1, inside=True)
    b_per_row = loader_source(w, cfg, "b", var.b_layout, b_rowb, a_elems, unit=1, inside=True)
    w(f"\nfrom numbatc.kernels.tiles import make_tile_coords\n"
      f"tile_coords = make_tile_coords({BM}, {BN})\n")

    # --- the kernel ---------------------------------------------------------------------------
    # Operands are flat: element (i, j) of a 'row' matrix is x[i * ld + j], of a 'col' one
    # x[i + j * ld] (device pointers on the GPU, 1-d arrays in the emulation).
    a_start = "m0 * lda + a_c0 + a_r0 * lda" if a_kmajor else "a_r0 * lda + m0 + a_c0"
    b_start = "n0 * ldb + b_c0 + b_r0 * ldb" if b_kmajor else "b_r0 * ldb + n0 + b_c0"
    split_args, split_range, split_a, split_b = split_source(var, a_kmajor, b_kmajor)
    w(f'''

@cuda.jit(cache={var.epilogue is None})
def gemm_kernel(a, b, c, bias, out, M, N, K, lda, ldb, ldc, ldo, alpha, beta, group_m{split_args}{", eargs" if var.epilogue is not None else ""}):
    smem = cuda.shared.array(0, np.uint8, alignment=1024)
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    wm = warp // {cfg.warps_n}
    wn = warp % {cfg.warps_n}

    # Rasterisation: GROUP_M tile-rows at a time, in 32-bit arithmetic (numbatc.kernels.tiles)
    tm, tn = tile_coords(np.uint32(cuda.blockIdx.x), M, N, group_m)
    m0 = np.int64(tm) * {BM}
    n0 = np.int64(tn) * {BN}
{split_range}    k_tiles = (K + {BK - 1}) // {BK}
    m_lim = M - m0
    n_lim = N - n0

    # This thread's copies: one column chunk, rows r0 + i * step (see loader_source).
    a_r0 = t // {a_per_row}
    a_c0 = (t % {a_per_row}) * 8
    b_r0 = t // {b_per_row}
    b_c0 = (t % {b_per_row}) * 8
    # in bytes: this thread's first copy (a_start, b_start) and the leading dimensions
    a_start = ({a_start}{split_a}) * 2
    b_start = ({b_start}{split_b}) * 2
    lda_b = lda * 2
    ldb_b = ldb * 2
    # the tile's M and N extents lie inside the operands (and the inside loaders' row steps fit
    # in 32 bits): then every whole k tile is copied without bounds checks
    inside = (m_lim >= {BM} and n_lim >= {BN} and lda_b < {2**31 // (cfg.threads // a_per_row)}
              and ldb_b < {2**31 // (cfg.threads // b_per_row)})
''')
    mainloop_source(w, cfg, var, inside="inside", lds=("lda_b", "ldb_b"))
    w(f'''
    nt.cp_async_wait_all()

    # Epilogue: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1 of each tile.
    g = lane // 4
    tq = (lane % 4) * 2
    row_base = m0 + wm * {WM} + g
    col_base = n0 + wn * {WN} + tq''')
    tiles = [(f"acc_{i}_{j}", f"row_base + {i * 16}", f"col_base + {j * 8}")
             for i in range(MI) for j in range(NJ)]
    if var.split_k:
        split_epilogue_source(w, tiles, var, "cuda.blockIdx.x", "cuda.syncthreads()", "t == 0")
    elif var.out_staged:
        staged_epilogue(w, cfg, var, tiles, f"m0 + {BM} <= M and n0 + {BN} <= N")
    else:
        full_tile_epilogue(w, tiles, var, f"m0 + {BM} <= M and n0 + {BN} <= N")

    w(stores_source(var))
    if var.split_k:
        w(SPLIT_HELPERS)
    return "\n".join(lines)


def staged_epilogue(w, cfg: Sm80Config, var: GemmVariant, tiles, inside):
    """The epilogue of GemmVariant.out_staged: where ``inside`` (the block's tile lies in the
    matrix) every warp writes its fragments' values, packed to 16 bits, into its own
    warp_m x warp_n tile of shared memory (the pipeline's stages, free after a barrier), then
    reads it back a 16-byte chunk of a row per lane and stores that with one st.global.v4:
    4 or 8 lanes cover a row, where the fragments' own stores are 32 bits a lane, 8 rows of 16
    bytes per instruction.  Chunk c of row r lives at chunk c ^ (r % chunks) of its row, so that
    the eight rows a fragment store touches at once fall in different banks.  Otherwise (an
    edge tile) full_tile_epilogue's bounds-checked stores.  Values first, as
    full_tile_epilogue does, where a fragment's value loads something (c, bias, a user
    epilogue's arrays): the staging stores are asm with a memory clobber, which no load moves
    above."""
    WM, WN = cfg.warp_m, cfg.warp_n
    chunks = WN // 8  # 16-byte chunks per row of the warp's tile
    if chunks not in _STAGED_CHUNKS:
        raise ValueError(f"{cfg.name}: the staged epilogue needs warp tiles 32 or 64 columns "
                         "wide")
    rowb = WN * 2
    pack = {"bfloat16": "nt.pack_bf16x2", "float16": "nt.pack_f16x2"}[var.out_dtype]
    ea = ", " + eargs_source(var)
    loads = var.epilogue is not None or var.c_dtype is not None or var.bias_dtype is not None
    w(f"""    if {inside}:
        cuda.syncthreads()  # every warp's last ldmatrix is done: the stages are free
        ws = np.int32((wm * {cfg.warps_n} + wn) * {WM * WN * 2})
        sx = (g % {chunks}) * 16
        sq = ws + tq * 2""")
    for n, (acc, row, col) in enumerate(tiles):
        if loads:
            w(f"        ev_{n} = value_tile(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea})")
    for n, (acc, row, col) in enumerate(tiles):
        i, j = divmod(n, WN // 8)
        v = f"ev_{n}" if loads else "ev"
        if not loads:
            w(f"        ev = value_tile(c, bias, {acc}, {row}, {col}, ldc, alpha, beta{ea})")
        for half in range(2):
            r = f"({16 * i + 8 * half} + g)"
            w(f"        nt.st_shared_b32(smem, sq + {r} * {rowb} + ({j * 16} ^ sx), "
              f"{pack}({v}[{2 * half}], {v}[{2 * half + 1}]))")
    per = 32 // chunks  # rows per pass
    w(f"""        cuda.syncwarp()
        lr = g // {chunks // 4}  # lane // chunks and lane % chunks, from g and tq (live already)
        lc = (g % {chunks // 4}) * 4 + tq // 2
        o_row = m0 + wm * {WM}
        o_col = n0 + wn * {WN} + lc * 8
        for it in range({WM // per}):
            r = it * {per} + lr
            v = nt.ld_shared_v4_b32(smem, ws + r * {rowb} + ((lc ^ (r % {chunks})) * 16))
            nt.st_global_v4_b32(out, (o_row + r) * ldo + o_col, v)
    else:""")
    for acc, row, col in tiles:
        w(f"        store_tile(out, c, bias, {acc}, {row}, {col}, M, N, ldc, ldo, alpha, beta{ea})")


def variant(p, cfg: Sm80Config, split_k: bool):
    """The variant a launch of ``cfg`` for ``p`` compiles: epilogue.variant_for's, staged
    through shared memory (out_staged) where ``cfg`` is a staged configuration, out's rows are
    16-byte aligned and the tile is not split over K."""
    var = variant_for(p, split_k=split_k)
    if cfg.staged and var.out_pairs and not split_k and p.out.alignment >= 16:
        var = dataclasses.replace(var, out_staged=True)
    return var


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


@functools.cache
def kernel_for(cfg: Sm80Config, var: GemmVariant):
    """The compiled-on-demand kernel for (cfg, var) (see build.load_generated).  A variant
    with a user epilogue is compiled in this process only (its function is not in the generated
    file)."""
    extra = {} if var.epilogue is None else {"USER_EPILOGUE": var.epilogue}
    return load_generated("sm80_gemm", kernel_source(cfg, var), **extra)


def signature(var: GemmVariant):
    """The kernel's argument types: every GEMM kernel's (epilogue.signature), with a and b as
    uint8 pointers -- the loaders address their copies in bytes, so that a copy's address is
    one multiply-add from the first (a GEP on a 2-byte type adds a scaling per copy)."""
    return _byte_signature(var)


@functools.cache
def _byte_signature(var):
    from numba import types

    u8 = types.CPointer(types.uint8)
    return (u8, u8) + tuple(epilogue.signature(var)[2:])


def grid_for(cfg: Sm80Config, m: int, n: int):
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


def launch_flat(cfg: Sm80Config, var: GemmVariant, a, b, c, bias, out, m, n, k, lda, ldb, ldc,
                ldo, alpha, beta, stream=0, group_m=8, epilogue_args=(), prepare=False,
                split=None):
    """Launch the kernel.  Operands are flat: device pointers (ints) on the GPU, 1-d arrays in
    the emulation; their start and leading dimension must be 16-byte aligned (:func:`launch`
    packs operands that are not).

    ``prepare=True``: launch through an ``intrinsics.launch.PreparedLaunch`` and return a
    relaunch function ``fn(a, b, c, bias, out, alpha, beta, stream, eflat=())`` for the same
    shape and leading dimensions (the host cost of a warm ``numbatc.gemm``; ``eflat``: a user
    epilogue's arguments as epilogue.flat_epilogue_args gives them); None, after launching the
    ordinary way, where there is none (the emulation, an argument type a prepared launch cannot
    pass).

    ``split`` (variants with split_k): ``split(stream) -> (workspace, counters, k_chunk,
    splits)`` -- a float32 workspace of splits * m * n values and grid_for(cfg, m, n) int32
    counters, zero before the first launch (each launch leaves them zero), used by one stream
    (so one launch at a time); asked on every launch, relaunches too.  See
    numbatc.kernels.split_k.split_workspace."""
    grid = grid_for(cfg, m, n)
    if split is not None:
        grid = (grid, split(stream)[3])
    # the kernel takes a and b as bytes (see signature): emulated arrays are viewed as bytes;
    # on the GPU they are device pointers already
    a, b = operands.byte_view(a), operands.byte_view(b)
    return launch_gemm_kernel(kernel_for(cfg, var), var, grid, cfg.threads,
                              cfg.shared_bytes, None, a, b, c, bias, out, m, n, k, lda, ldb, ldc,
                              ldo, alpha, beta, stream, group_m, epilogue_args, prepare,
                              split=split, kernel_signature=signature(var))


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (numbatc.kernels.dispatch walks them): from a
# numbatc.gemm_api.GemmProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute GEMM problem ``p``, or None: it runs every bf16 / f16
    problem, any layouts, any M, N, K (K == 0 with a user epilogue)."""
    if p.block_scaled is not None or getattr(p, "tensor_scales", None) is not None:
        return "sm80_gemm takes bfloat16 / float16 operands without scales"
    if p.in_dtype not in _PTX_TYPE:
        return f"sm80_gemm takes bfloat16 / float16 operands, not {p.in_dtype}"
    return None


#: The heuristic's tiles per role, in order of preference (:func:`choose`).
#:
#: NOTE: measured on the H200 (cc 9.0, sm80_gemm forced, bf16, row-major, 4096^3 / 8192^3, in
#: the same run as cuBLAS; TFLOP/s): 128x128x64_4w_3s 376 / 379, 128x128x32_4w_4s 372 / 366,
#: 128x256x64_8w_4s 361 / 375, 128x256x64_8w_3s 357 / 371, 128x128x64_4w_4s 315 / 332,
#: 64x128x64_4w_4s 315 / 313, 64x64x64_4w_3s 309 / 286, 16x128x64_4w_6s 143 / 134.  The 128 x
#: 128 tiles two of which share an SM led; the 4-stage 128 x 128 x 64 (128 KB, one per SM)
#: trails the 3-stage one by 12-16 %.  Then the prefetching k loop (mainloop_source's
#: ``prefetch``; an H100, cc 9.0, 2026-12-05, two alternating rounds, b column-major):
#: 128x256x64_8w_3s_fp 430-432 / 421-423 (0.56-0.57 / 0.55-0.56x cuBLAS), its 4-stage twin
#: 424-427 / 417-429, 128x128x32_4w_4s_fp 421-422 / 383-396, 128x128x32_4w_3s_fp 407-417 /
#: 385-386, against 128x128x64_4w_3s 402-417 / 389-399 and 128x256x64_8w_3s 367-370 / 376-405
#: (the same tile without prefetch: +17 / +8 %).  So where a block gets the 144 KB,
#: 128x256x64_8w_3s_fp (also CUTLASS's Ampere default tile); elsewhere the first 128 x 128 tile
#: that keeps two blocks per SM, prefetching.  The choices on 8.x and 12.x are reasoned from the
#: limits (numbatc.kernels.gpus), not measured: no Ampere, Ada or consumer Blackwell GPU was at
#: hand.  8.0 / 8.7 (163 KB a block) take the 128 x 256 tile; 8.6 / 8.9 / 12.x (99 KB a block,
#: 100 KB per SM) 128x128x32_4w_3s_fp (48 KB), the one 128 x 128 tile two of which fit.
#: Decode (M <= 16, an H100, 2026-12-05, b column-major, the decode shapes; GB/s of B read
#: once): 16x128x64_4w_6s_fp 2554 / 2397 / 2808 / 2864 / 2857 / 2798 against 16x128x64_4w_6s
#: 2433 / 2146 / 2804 / 2834 / 2814 / 2663 at 1 and 16 x 8192 x 8192, x 28672 x 8192 and x 8192 x
#: 28672 (0.85-0.95x cuBLAS -> 0.89-1.00x): the prefetching twins.  (64x128x64_4w_4s_fp was
#: mixed against its plain twin, -6 to +2 %: "mid" keeps the plain one.)
TILES = {
    # M > 64: the 128 x 256 tile where it fits and fills the SMs, else the first 128 x 128
    # that pairs up
    "large": ("128x256x64_8w_3s_fp", "128x128x64_4w_3s", "128x128x32_4w_4s_fp",
              "128x128x32_4w_3s_fp"),
    # 16 < M <= 64: one tile row, split-K where it leaves SMs idle
    "mid": ("64x128x64_4w_4s", "64x64x64_4w_3s"),
    # M <= 16: the deepest pipeline that fits
    "decode": ("16x128x64_4w_6s_fp", "16x128x64_4w_4s_fp"),
}

_WHY = {
    "large": "M > 64",
    "mid": "16 < M <= 64: one row of 64-row tiles",
    "decode": "M <= 16: 16-row tiles, the deepest pipeline that fits",
}


def _occupancy(cfg: Sm80Config, lim):
    """Blocks of ``cfg`` per SM on a GPU of limits ``lim`` (0: it does not fit)."""
    return gpus.blocks_per_sm(lim, cfg.shared_bytes, cfg.threads)


def _pick(p):
    """(configuration, the reason) that the heuristic takes for problem ``p`` on its GPU."""
    lim = gpus.limits(p.cc)
    role = "decode" if p.m <= 16 else "mid" if p.m <= 64 else "large"
    fitting = [CONFIGS[n] for n in TILES[role] if _occupancy(CONFIGS[n], lim)]
    if not fitting:  # no GPU of numbatc.kernels.gpus' table gets here (48 KB fits all)
        raise ValueError(f"no sm80 {role} tile fits the {gpus.kb(lim.shared_per_block)} of "
                         f"shared memory per block of compute capability {lim.name}")
    cfg = fitting[0]
    why = _WHY[role]
    if role == "large":
        def how(gpu):
            if lim.cc == (9, 0):
                return f"measured best on {gpu}"
            if lim.shared_per_sm >= 228 * 1024:
                return f"as measured on {gpu}, whose 228 KB per SM this GPU has; not measured here"
            return "reasoned from the limits, not measured"

        sms = gpus.sm_count(p.cc, p.device)
        if cfg.name == TILES["large"][0]:
            if grid_for(cfg, p.m, p.n) >= sms or len(fitting) == 1:
                return cfg, why + (": 128 x 256 tiles of 8 warps, the k loop prefetching "
                                   f"({how('an H100')})")
            # fewer 128 x 256 tiles than SMs: the 128 x 128 tiles, twice as many and two to an
            # SM, leave fewer SMs idle (reasoned from the tile counts, not measured)
            fitting = fitting[1:]
            why += f" (fewer 128 x 256 tiles than the {sms} SMs)"
        pairs = [c for c in fitting if _occupancy(c, lim) >= 2]
        cfg = pairs[0] if pairs else fitting[0]
        why += (f": the first 128 x 128 tile that keeps two blocks per SM ({how('the H200')})"
                if pairs else
                ": no 128 x 128 tile keeps two blocks per SM here; the first that fits")
    return cfg, why


def explain(p, cfg: Sm80Config):
    """Why ``cfg`` runs problem ``p`` (NUMBATC_PRINT_CONFIG's line): its shared memory, the
    blocks one SM of the problem's GPU holds, and the heuristic's reason (or that it was
    forced)."""
    lim = gpus.limits(p.cc)
    n = _occupancy(cfg, lim)
    pick, why = _pick(p)
    return (f"{cfg.name}: {gpus.kb(cfg.shared_bytes)}, {n} block{'' if n == 1 else 's'} per SM "
            f"on cc {lim.name} ({gpus.kb(lim.shared_per_sm)} per SM); "
            + (why if cfg is pick else f"forced (the heuristic's: {pick.name})"))


def _check_fits(p, cfg: Sm80Config):
    """A ValueError naming the limit where ``cfg`` cannot launch on the problem's GPU."""
    lim = gpus.limits(p.cc)
    if not gpus.fits(lim, cfg.shared_bytes, cfg.threads):
        fitting = sorted(n for n, c in CONFIGS.items() if _occupancy(c, lim))
        raise ValueError(
            f"sm80 config {cfg.name} needs {gpus.kb(cfg.shared_bytes)} of shared memory per "
            f"block; compute capability {lim.name} allows {gpus.kb(lim.shared_per_block)}: "
            f"choose from {fitting}")


def choose(p, name=None):
    """The configuration for problem ``p`` on its GPU (``p.cc``; ``name``: one of CONFIGS,
    forced, a ValueError where it does not fit that GPU's shared memory): small M gets short
    tiles (:data:`TILES`), the rest 128 x 128 tiles that keep two blocks per SM where one does
    (the measured and reasoned choices are :data:`TILES`' note).  Only configurations whose
    shared memory fits one block of the GPU are taken (numbatc.kernels.gpus)."""
    if name is not None:
        if name not in CONFIGS:
            raise ValueError(f"no sm80 config {name!r}; choose from {sorted(CONFIGS)}")
        _check_fits(p, CONFIGS[name])
        return CONFIGS[name]
    return _pick(p)[0]


def split(p, cfg: Sm80Config):
    """(K slices, k_chunk) of ``cfg``'s launch for ``p`` (split_k.choose_split: M <= 64 whose
    tiles leave SMs idle, for the problem's GPU's SM count; (1, K): none)."""
    return split_k.choose_split(cfg, p.m, p.k, grid_for(cfg, p.m, p.n),
                                sms=gpus.sm_count(p.cc, p.device))


def compiled(p, cfg: Sm80Config):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments): split-K where :func:`split` splits."""
    return cfg, variant(p, cfg, split(p, cfg)[0] > 1)


def launch(p, cfg: Sm80Config):
    """Launch ``cfg`` for problem ``p`` on its stream (operands packed where not 16-byte
    aligned, K split where :func:`split` says); the relaunch function or None (see
    operands.launch_gemm).  A ValueError, before any launch, where ``cfg`` does not fit the
    problem's GPU; NUMBATC_PRINT_CONFIG prints :func:`explain`'s line."""
    import os

    _check_fits(p, cfg)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        import sys

        print(f"numbatc.gemm: sm80_gemm {explain(p, cfg)}", file=sys.stderr)
    slices = split(p, cfg)
    var = variant(p, cfg, slices[0] > 1)
    return operands.launch_gemm(launch_flat, p, cfg, var, slices, grid_for(cfg, p.m, p.n),
                                p.alpha)
