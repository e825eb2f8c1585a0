"""Tensor memory (TMEM), the Blackwell tcgen05 family's accumulator store: its addresses and
where each instruction's elements land in it (PTX ISA 9.7.16, "TensorCore 5th Generation Family
Instructions").

    TMEM                   128 lanes x 512 columns of 32-bit cells per SM; an address is
                           (lane << 16) | column (:func:`encode_tmem_address`)
    tcgen05.ld / .st       :func:`ldst_coords`: the (lane, column) of each register of each lane
    tcgen05.cp             :func:`cp_lane_map`: the lanes each source row goes to
    tcgen05.mma D          :func:`tmem_d_coords`: the (lane, column, half) of D[row, col]
    block-scaled mma       :func:`scale_factor_coords`: the cell and byte of each scale factor

NOTE: no Blackwell GPU was available while these were written; they are modelled from the PTX ISA
and, where its figures were not at hand, from CUTLASS and DeepGEMM (each function says which).
The CPU emulation (``intrinsics/emulate/tcgen05.py``) implements exactly these models; a Blackwell
run must confirm them.
"""

import numpy as np

__all__ = [
    "TCGEN05_CP_SHAPES",
    "TCGEN05_LDST_SHAPES",
    "TMEM_COLUMNS",
    "TMEM_LANES",
    "cp_lane_map",
    "decode_tmem_address",
    "encode_tmem_address",
    "ldst_coords",
    "ldst_register_count",
    "scale_factor_coords",
    "tmem_address_host",
    "tmem_d_coords",
]

TMEM_LANES = 128
TMEM_COLUMNS = 512


def encode_tmem_address(lane, column):
    """The 32-bit TMEM address of (lane, column): ``(lane << 16) | column`` -- PTX ISA 9.7.16,
    "Tensor Memory" addresses a cell with the lane in bits 31-16 and the column in bits 15-0.
    A NumPy uint32; ``intrinsics.tcgen05.tmem_address`` is this function compiled for kernels."""
    return np.uint32(((np.int64(lane) & 0xFFFF) << 16) | (np.int64(column) & 0xFFFF))


def tmem_address_host(lane, column):
    """Host twin of ``intrinsics.tcgen05.tmem_address`` (checks the ranges)."""
    if not 0 <= lane < TMEM_LANES or not 0 <= column < TMEM_COLUMNS:
        raise ValueError(f"TMEM has lanes 0..127 and columns 0..511, got lane {lane}, "
                         f"column {column}")
    return int(encode_tmem_address(lane, column))


def decode_tmem_address(address):
    """(lane, column) of a TMEM address.  Bits 30-31 are dropped from the lane: CUTLASS keeps the
    byte of a scale-factor cell there (``make_runtime_instr_desc_block_scaled``)."""
    address = int(address)
    return (address >> 16) & 0x3FFF, address & 0xFFFF


# ---------------------------------------------------------------------------------------------
# tcgen05.ld / tcgen05.st
# ---------------------------------------------------------------------------------------------

# shape -> (registers per repetition, largest .num).  PTX ISA 9.7.16, tcgen05.ld/st, ".num"
# table: every shape repeats .x1, .x2, .x4 ... while a thread holds at most 128 registers
# (nvJitLink refuses 16x128b.x128 and 16x256b.x64: "Illegal vector size: 256").
TCGEN05_LDST_SHAPES = {"32x32b": (1, 128), "16x64b": (1, 128), "16x128b": (2, 64),
                       "16x256b": (4, 32)}


def ldst_register_count(op, shape, num):
    """Registers per thread of ``tcgen05.<op>.<shape>.<num>`` (``op`` "ld" or "st", for the
    message), or ValueError naming the valid shapes and .num values."""
    if shape not in TCGEN05_LDST_SHAPES:
        raise ValueError(f"tcgen05.{op} shape must be one of {list(TCGEN05_LDST_SHAPES)}, "
                         f"got {shape!r}")
    per, top = TCGEN05_LDST_SHAPES[shape]
    nums = [1 << i for i in range(8) if 1 << i <= top]
    if num not in nums:
        raise ValueError(f"tcgen05.{op}.{shape} takes .num {nums} (at most 128 registers), "
                         f"got {num!r}")
    return per * num


def ldst_coords(shape, num):
    """(lane offsets, column offsets), each an int array (32, registers): register ``r`` of warp
    lane ``l`` holds TMEM cell (lane + dl, column + dc) of the instruction's address.

    The "Matrix fragments for tcgen05.ld/st" figures of PTX ISA 9.7.16, as encoded by CUTLASS
    (cute/atom/copy_traits_sm100.hpp, Copy_Traits<SM100_TMEM_LOAD_16dp{64,128,256}b1x /
    32dp32b1x>) and the Apache TVM tcgen05 docs, repeated along the columns for ``.num``::

        32x32b   dl = l                         dc = r
        16x64b   dl = l/4 + 8*(l%2)             dc = (l/2)%2 + 2*r
        16x128b  dl = l/4 + 8*(r%2)             dc = l%4 + 4*(r/2)
        16x256b  dl = l/4 + 8*((r/2)%2)         dc = 2*(l%4) + r%2 + 8*(r/4)

    (16x256b is the mma.sync m16n8 accumulator layout, repeated every 8 columns.)"""
    regs = ldst_register_count("ld", shape, num)
    lane = np.arange(32)[:, None]
    r = np.arange(regs)[None, :]
    if shape == "32x32b":
        dl, dc = lane + 0 * r, r + 0 * lane
    elif shape == "16x64b":
        dl, dc = lane // 4 + 8 * (lane % 2) + 0 * r, (lane // 2) % 2 + 2 * r
    elif shape == "16x128b":
        dl, dc = lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    else:
        dl, dc = lane // 4 + 8 * ((r // 2) % 2), 2 * (lane % 4) + r % 2 + 8 * (r // 4)
    return dl, dc


# ---------------------------------------------------------------------------------------------
# tcgen05.cp
# ---------------------------------------------------------------------------------------------

# shape -> (rows, bytes per row).  PTX ISA 9.7.16, tcgen05.cp, ".shape" table.
TCGEN05_CP_SHAPES = {
    "128x256b": (128, 32),
    "4x256b": (4, 32),
    "128x128b": (128, 16),
    "64x128b.warpx2::02_13": (64, 16),
    "64x128b.warpx2::01_23": (64, 16),
    "32x128b.warpx4": (32, 16),
}


def cp_lane_map(shape):
    """TMEM lanes (relative to the address's lane) that row ``r`` of the source goes to: a list
    of lists.  PTX ISA 9.7.16, tcgen05.cp, "multicast" shapes: warpx2::02_13 copies each of the
    64 rows to lanes r and r+64 (warps 0 and 2, 1 and 3); warpx2::01_23 row r to 64*(r/32)+r%32
    and 32 above it (warps 0 and 1, 2 and 3); warpx4 each of 32 rows to the four warps' lanes
    r, r+32, r+64, r+96; 4x256b its 4 rows to lanes 0, 32, 64, 96."""
    rows = TCGEN05_CP_SHAPES[shape][0]
    if shape == "4x256b":
        return [[32 * r] for r in range(rows)]
    if shape == "64x128b.warpx2::02_13":
        return [[r, r + 64] for r in range(rows)]
    if shape == "64x128b.warpx2::01_23":
        return [[64 * (r // 32) + r % 32, 64 * (r // 32) + r % 32 + 32] for r in range(rows)]
    if shape == "32x128b.warpx4":
        return [[r + 32 * w for w in range(4)] for r in range(rows)]
    return [[r] for r in range(rows)]


# ---------------------------------------------------------------------------------------------
# tcgen05.mma: D and the scale factors
# ---------------------------------------------------------------------------------------------

def tmem_d_coords(m, n, d="f32"):
    """(lane, column, half) of D[row, col] for cta_group::1 (int arrays of shape (m, n)).

    PTX ISA 9.7.16.10.5, "Data path layout organization": M=128 is layout D (row i in lane i);
    M=64 (not .ws) is layout F (rows 16w..16w+15 in lanes 32w..32w+15: half of each warp's
    lanes).  An f32 element fills a column (half 0); an f16 accumulator packs two columns' values
    into one 32-bit cell, the even one in the low half (CUTLASS tmem_ptr: 16-bit elements at two
    per column) -- the f16 packing is modelled from CUTLASS, not from an ISA figure."""
    rows, cols = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    if m == 128:
        lanes = rows
    elif m == 64:
        lanes = 32 * (rows // 16) + rows % 16
    else:
        raise ValueError(f"cta_group::1 D layouts exist for M=64 and M=128, got M={m}")
    if d == "f16":
        return lanes, cols // 2, cols % 2
    return lanes, cols, np.zeros_like(cols)


def scale_factor_coords(operand, rows, count, sf_id=0):
    """(lane, column offset, byte) of scale factor j of row ``r`` of A or B for cta_group::1,
    M=128: int arrays of shape (rows, count) (B: for the datapath of warp 0; warp w's datapath
    reads the same cells 32*w lanes higher).

    MODELLED, not from an ISA figure I could check: the layout CUTLASS and DeepGEMM produce for
    block-scaled UMMA -- their 128-row scale-factor chunk (rows r at byte offset 16*(r%32) +
    4*(r/32) + j of 512 bytes) copied with ``tcgen05.cp.32x128b.warpx4`` -- read as::

        A row m:  lane m,                 column sfa + m/32,   byte sf_id + j
        B row n:  lane 32*w + n%32,       column sfb + n/32,   byte sf_id + j

    where w is the warp (TMEM sub-partition) whose lanes hold the D rows being computed: every
    sub-partition needs all of B's scale factors, which is why they are replicated four times."""
    r = np.arange(rows)[:, None]
    j = np.arange(count)[None, :]
    if operand == "A":
        return r + 0 * j, r // 32 + 0 * j, sf_id + j + 0 * r
    if operand == "B":
        return r % 32 + 0 * j, r // 32 + 0 * j, sf_id + j + 0 * r
    raise ValueError(f"operand must be 'A' or 'B', got {operand!r}")
