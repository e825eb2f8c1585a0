"""The tcgen05.mma kinds and their 32-bit instruction descriptor (PTX ISA 9.7.16, tcgen05.mma,
"Kinds and types" and the "Instruction descriptor" tables).

:data:`TCGEN05_MMA_KINDS` is the table of what each ``.kind`` multiplies (K, element types,
accumulators, scale vectors): ``intrinsics.tcgen05.tcgen05_mma`` builds its variants from it, the
host builders here check a descriptor's fields against it, and the CPU emulation decodes with it.
:func:`encode_instr_desc` / :func:`encode_instr_desc_block_scaled` pack numeric codes (numba
compiles the same functions as ``intrinsics.tcgen05.make_instr_desc`` / ``make_instr_desc_block_
scaled``); :func:`make_instr_desc_host` / :func:`make_instr_desc_block_scaled_host` take names and
check every field; :func:`decode_instr_desc` unpacks one.

NOTE: no Blackwell GPU was available; the bit layout is the ISA's table (the same codes as
CUTLASS cute/arch/mma_sm100_desc.hpp), proven only by the assembler and the emulation.
"""

from dataclasses import dataclass

import numpy as np

__all__ = [
    "IDESC_AB_FORMATS",
    "IDESC_D_FORMATS",
    "IDESC_SCALE_FORMATS",
    "TCGEN05_MMA_KINDS",
    "TRANSPOSABLE_TYPES",
    "check_mma_shape",
    "decode_instr_desc",
    "encode_instr_desc",
    "encode_instr_desc_block_scaled",
    "make_instr_desc_block_scaled_host",
    "make_instr_desc_host",
]

# ---------------------------------------------------------------------------------------------
# The kinds
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    """One ``.kind`` of tcgen05.mma (PTX ISA 9.7.16, tcgen05.mma, "Kinds and types" table)."""

    k: int  # K of one instruction (dense); every kind reads 32 bytes of K per row
    ab_types: tuple  # the A/B element types of the instruction descriptor
    d_types: tuple  # accumulator (D) types
    elem_bits: int  # bits one element occupies in shared memory / TMEM
    block_scaled: bool
    scale_vecs: dict  # scale-vector qualifier -> scale factors per row per instruction
    scale_types: dict  # scale-vector qualifier -> scale formats the descriptor may name


TCGEN05_MMA_KINDS = {
    # kind: K, A/B types, D types, bits per element, block-scaled, scale vectors, scale types
    "f16": _Kind(16, ("f16", "bf16"), ("f32", "f16"), 16, False, {}, {}),
    "tf32": _Kind(8, ("tf32",), ("f32",), 32, False, {}, {}),
    # fp6/fp4 elements sit in 8-bit containers in shared memory and TMEM for this kind
    "f8f6f4": _Kind(32, ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1"), ("f32", "f16"), 8, False, {},
                    {}),
    "mxf8f6f4": _Kind(32, ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1"), ("f32",), 8, True,
                      {None: 1, "1X": 1, "block32": 1},
                      {None: ("ue8m0",), "1X": ("ue8m0",), "block32": ("ue8m0",)}),
    # packed fp4: two e2m1 per byte, the element with the lower K in the low nibble
    "mxf4": _Kind(64, ("e2m1",), ("f32",), 4, True,
                  {None: 2, "2X": 2, "block32": 2},
                  {None: ("ue8m0",), "2X": ("ue8m0",), "block32": ("ue8m0",)}),
    "mxf4nvf4": _Kind(64, ("e2m1",), ("f32",), 4, True,
                      {"2X": 2, "4X": 4, "block32": 2, "block16": 4},
                      {"2X": ("ue8m0",), "block32": ("ue8m0",), "4X": ("ue4m3", "ue8m0"),
                       "block16": ("ue4m3", "ue8m0")}),
}

# Instruction-descriptor codes (PTX ISA 9.7.16, "Instruction descriptor" tables; the same codes as
# CUTLASS cute/arch/mma_sm100_desc.hpp UMMA::F16F32Format / MXF8F6F4Format / MXF4Format /
# CFormat / ScaleFormat).
IDESC_D_FORMATS = {"f16": 0, "f32": 1}
IDESC_AB_FORMATS = {
    "f16": {"f16": 0, "bf16": 1},
    "tf32": {"tf32": 2},
    "f8f6f4": {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5},
    "mxf8f6f4": {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5},
    "mxf4": {"e2m1": 1},
    "mxf4nvf4": {"e2m1": 1},
}
IDESC_SCALE_FORMATS = {"ue4m3": 0, "ue8m0": 1}
# MN-major (transposed) operands exist only for these element types (CUTLASS InstrDescriptor:
# "Major value of 1 is only valid for E4M3, E5M2, INT8, F16, BF16 and TF32 source formats").
TRANSPOSABLE_TYPES = ("f16", "bf16", "tf32", "e4m3", "e5m2")


def check_mma_shape(kind, m, n, cta_group=1, a_from="smem"):
    """ValueError naming the valid shapes unless (M, N) is one for ``kind`` and ``cta_group``.

    The rules, from the PTX ISA tcgen05.mma "valid shapes" table as CUTLASS encodes it
    (cute/arch/mma_sm100_umma.hpp static_asserts): cta_group::1 dense kinds M 64 or 128, N a
    multiple of 8 in 8..256 (A from TMEM with M=128: a multiple of 16); block-scaled kinds M=128,
    N a multiple of 8 in 8..256; cta_group::2 M 128 or 256, N a multiple of 16 in 16..256.
    """
    row = TCGEN05_MMA_KINDS[kind]
    if cta_group == 1:
        ms = (128,) if row.block_scaled else (64, 128)
        step = 16 if (a_from == "tmem" and m == 128 and not row.block_scaled) else 8
    else:
        ms, step = (128, 256), 16
    if m not in ms:
        raise ValueError(f"tcgen05.mma kind::{kind} cta_group::{cta_group}: M must be one of "
                         f"{list(ms)}, got {m!r}")
    if not isinstance(n, (int, np.integer)) or n % step or not step <= n <= 256:
        raise ValueError(f"tcgen05.mma kind::{kind} cta_group::{cta_group} M={m}: N must be a "
                         f"multiple of {step} in {step}..256, got {n!r}")


# ---------------------------------------------------------------------------------------------
# The instruction descriptor
# ---------------------------------------------------------------------------------------------

_IDESC_TABLE = """PTX ISA 9.7.16, "Instruction descriptor" (tcgen05-instruction-desc), table
    "Instruction descriptor format for .kind::f16, .kind::tf32, .kind::f8f6f4 and .kind::i8"::

        bits  0-1   sparsity selector (0)          bit  2   sparsity (0: dense)
        bit   3     saturate (integer kinds; 0)    bits 4-5 D type: 0 F16, 1 F32 (2 S32)
        bits  7-9   A type, bits 10-12 B type:     kind::f16 F16 0, BF16 1; kind::tf32 TF32 2;
                    kind::f8f6f4 E4M3 0, E5M2 1, E2M3 3, E3M2 4, E2M1 5
        bit  13     negate A        bit 14  negate B
        bit  15     transpose A (0: K-major, 1: MN-major)   bit 16  transpose B
        bits 17-22  N >> 3          bits 24-28  M >> 4      bits 30-31  max shift (.ws; 0)"""

_IDESC_BS_TABLE = """PTX ISA 9.7.16, "Instruction descriptor" table "Instruction descriptor format
    for .kind::mxf8f6f4, .kind::mxf4 and .kind::mxf4nvf4"::

        bits  0-1   sparsity selector (0)          bit  2   sparsity (0: dense)
        bits  4-5   B scale-factor data ID (the byte of the SFB cell to start at)
        bits  7-9   A type, bits 10-12 B type:     kind::mxf8f6f4 E4M3 0, E5M2 1, E2M3 3,
                    E3M2 4, E2M1 5; kind::mxf4 / mxf4nvf4 E2M1 1
        bit  13     negate A        bit 14  negate B
        bit  15     transpose A     bit 16  transpose B (fp4/fp6: 0 only)
        bits 17-22  N >> 3          bit 23  scale type: 0 UE4M3, 1 UE8M0
        bits 24-28  M >> 4          bits 29-30  A scale-factor data ID
        bit  31     K: 0 = K of the table (the only value here)"""


def _add_table(fn, table):
    fn.__doc__ = (fn.__doc__ or "") + table


def encode_instr_desc(d_format, a_format, b_format, m, n, a_major, b_major, negate_a, negate_b):
    """The 32-bit tcgen05.mma instruction descriptor of a dense kind from numeric codes (those of
    :data:`IDESC_D_FORMATS` / :data:`IDESC_AB_FORMATS`; majors 0 K-major, 1 MN-major), a NumPy
    uint32.  NumPy scalar arithmetic so that numba compiles the same function for the kernels
    (``intrinsics.tcgen05.make_instr_desc``): every field through int64 first (numba types
    uint32/int64 mixtures as float64).  Layout: """
    desc = (((np.int64(d_format) & 3) << 4) | ((np.int64(a_format) & 7) << 7)
            | ((np.int64(b_format) & 7) << 10) | ((np.int64(negate_a) & 1) << 13)
            | ((np.int64(negate_b) & 1) << 14) | ((np.int64(a_major) & 1) << 15)
            | ((np.int64(b_major) & 1) << 16) | (((np.int64(n) >> 3) & 0x3F) << 17)
            | (((np.int64(m) >> 4) & 0x1F) << 24))
    return np.uint32(desc)


_add_table(encode_instr_desc, _IDESC_TABLE)


def encode_instr_desc_block_scaled(a_format, b_format, scale_format, m, n, a_major, b_major,
                                   negate_a, negate_b, sfa_id, sfb_id):
    """The 32-bit instruction descriptor of a block-scaled kind from numeric codes, a NumPy uint32
    (compiled for kernels as ``intrinsics.tcgen05.make_instr_desc_block_scaled``).  Layout:
    """
    desc = (((np.int64(sfb_id) & 3) << 4) | ((np.int64(a_format) & 7) << 7)
            | ((np.int64(b_format) & 7) << 10) | ((np.int64(negate_a) & 1) << 13)
            | ((np.int64(negate_b) & 1) << 14) | ((np.int64(a_major) & 1) << 15)
            | ((np.int64(b_major) & 1) << 16) | (((np.int64(n) >> 3) & 0x3F) << 17)
            | ((np.int64(scale_format) & 1) << 23) | (((np.int64(m) >> 4) & 0x1F) << 24)
            | ((np.int64(sfa_id) & 3) << 29))
    return np.uint32(desc)


_add_table(encode_instr_desc_block_scaled, _IDESC_BS_TABLE)


def _major_bit(name, major):
    if major not in ("K", "MN"):
        raise ValueError(f"{name} must be 'K' or 'MN', got {major!r}")
    return int(major == "MN")


def _major_bits(a, b, a_major, b_major):
    """(A's, B's) major bit (1: MN-major), each checked: 'K' or 'MN', and MN only for the
    transposable element types."""
    am, bm = _major_bit("a_major", a_major), _major_bit("b_major", b_major)
    for t, mj, what in ((a, am, "A"), (b, bm, "B")):
        if mj and t not in TRANSPOSABLE_TYPES:
            raise ValueError(f"{what} of type {t} must be K-major; MN-major exists only for "
                             f"{'/'.join(TRANSPOSABLE_TYPES)}")
    return am, bm


def _check_types(kind, a, b):
    row = TCGEN05_MMA_KINDS[kind]
    for what, t in (("A", a), ("B", b)):
        if t not in row.ab_types:
            raise ValueError(f"tcgen05.mma kind::{kind} takes {what} types "
                             f"{'/'.join(row.ab_types)}, got {t!r}")
    if kind == "f16" and a != b:
        raise ValueError(f"tcgen05.mma kind::f16 needs A and B of one type (f16 or bf16), got "
                         f"A={a}, B={b}")


def make_instr_desc_host(kind, a, b=None, d="f32", *, m=128, n, a_major="K", b_major="K",
                         negate_a=False, negate_b=False, cta_group=1, a_from="smem"):
    """Host builder of a dense kind's instruction descriptor (returns an int); checks every
    field against the ISA: ``kind`` "f16"/"tf32"/"f8f6f4", ``a``/``b`` element types, ``d``
    "f32" or "f16" (f16 and f8f6f4 only), (M, N) per :func:`check_mma_shape`, majors "K"/"MN"
    (MN only for f16/bf16/tf32/e4m3/e5m2).  Layout: """
    b = a if b is None else b
    if kind not in ("f16", "tf32", "f8f6f4"):
        raise ValueError(f"make_instr_desc_host builds the dense kinds f16/tf32/f8f6f4, got "
                         f"{kind!r} (block-scaled: make_instr_desc_block_scaled_host)")
    _check_types(kind, a, b)
    row = TCGEN05_MMA_KINDS[kind]
    if d not in row.d_types:
        raise ValueError(f"tcgen05.mma kind::{kind} accumulates in {'/'.join(row.d_types)}, "
                         f"got {d!r}")
    if a == "bf16" and d != "f32":
        raise ValueError(f"tcgen05.mma kind::f16 with bf16 inputs accumulates in f32 only, got "
                         f"{d!r}")
    check_mma_shape(kind, m, n, cta_group, a_from)
    am, bm = _major_bits(a, b, a_major, b_major)
    if a_from == "tmem" and am:
        raise ValueError("A in tensor memory is K-major (a_major='K')")
    codes = IDESC_AB_FORMATS[kind]
    return int(encode_instr_desc(IDESC_D_FORMATS[d], codes[a], codes[b], m, n, am, bm,
                                int(bool(negate_a)), int(bool(negate_b))))


_add_table(make_instr_desc_host, _IDESC_TABLE)


def make_instr_desc_block_scaled_host(kind, a, b=None, scale="ue8m0", *, m=128, n,
                                      scale_vec=None, a_major="K", b_major="K", negate_a=False,
                                      negate_b=False, sfa_id=0, sfb_id=0, cta_group=1,
                                      a_from="smem"):
    """Host builder of a block-scaled kind's instruction descriptor (returns an int).

    ``kind`` "mxf8f6f4"/"mxf4"/"mxf4nvf4"; ``scale`` "ue8m0" or "ue4m3" (mxf4nvf4 with scale_vec
    "4X"/"block16" only); ``sfa_id``/``sfb_id``: the byte of the scale-factor cell the first
    scale factor sits in -- 0..3 with 1 scale per row (1X), 0 or 2 with 2 (2X), 0 with 4 (4X).
    fp4/fp6 operands must be K-major.  Layout: """
    b = a if b is None else b
    if kind not in ("mxf8f6f4", "mxf4", "mxf4nvf4"):
        raise ValueError(f"make_instr_desc_block_scaled_host builds the block-scaled kinds "
                         f"mxf8f6f4/mxf4/mxf4nvf4, got {kind!r}")
    _check_types(kind, a, b)
    row = TCGEN05_MMA_KINDS[kind]
    if scale_vec not in row.scale_vecs:
        raise ValueError(f"tcgen05.mma kind::{kind} takes scale_vec "
                         f"{', '.join(repr(v) for v in row.scale_vecs)}, got {scale_vec!r}")
    if scale not in row.scale_types[scale_vec]:
        raise ValueError(f"tcgen05.mma kind::{kind} with scale_vec {scale_vec!r} takes scale "
                         f"type {'/'.join(row.scale_types[scale_vec])}, got {scale!r}")
    check_mma_shape(kind, m, n, cta_group, a_from)
    count = row.scale_vecs[scale_vec]
    ids = [i for i in range(4) if i % count == 0]
    for what, sf in (("sfa_id", sfa_id), ("sfb_id", sfb_id)):
        if sf not in ids:
            raise ValueError(f"{what} with {count} scale factor(s) per row must be one of {ids} "
                             f"(the starting byte of the 32-bit cell), got {sf!r}")
    am, bm = _major_bits(a, b, a_major, b_major)
    codes = IDESC_AB_FORMATS[kind]
    return int(encode_instr_desc_block_scaled(codes[a], codes[b], IDESC_SCALE_FORMATS[scale], m,
                                              n, am, bm, int(bool(negate_a)),
                                              int(bool(negate_b)), sfa_id, sfb_id))


_add_table(make_instr_desc_block_scaled_host, _IDESC_BS_TABLE)


def decode_instr_desc(idesc, block_scaled=False):
    """The fields of an instruction descriptor (numbers, as the tables give them): dict with
    sparse_id, sparse, a_format, b_format, negate_a, negate_b, a_major, b_major, n, m, and
    saturate, d_format, max_shift (dense) or sfa_id, sfb_id, scale_format, k_flag
    (block-scaled)."""
    x = int(idesc) & 0xFFFFFFFF
    f = {
        "sparse_id": x & 3, "sparse": (x >> 2) & 1, "a_format": (x >> 7) & 7,
        "b_format": (x >> 10) & 7, "negate_a": (x >> 13) & 1, "negate_b": (x >> 14) & 1,
        "a_major": (x >> 15) & 1, "b_major": (x >> 16) & 1, "n": ((x >> 17) & 0x3F) << 3,
        "m": ((x >> 24) & 0x1F) << 4,
    }
    if block_scaled:
        f.update(sfb_id=(x >> 4) & 3, scale_format=(x >> 23) & 1, sfa_id=(x >> 29) & 3,
                 k_flag=(x >> 31) & 1, reserved=((x >> 3) & 1) | ((x >> 6) & 1) << 1)
    else:
        f.update(saturate=(x >> 3) & 1, d_format=(x >> 4) & 3, max_shift=(x >> 30) & 3,
                 reserved=((x >> 6) & 1) | ((x >> 23) & 1) << 1 | ((x >> 29) & 1) << 2)
    return f
