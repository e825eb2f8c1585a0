"""The canonical shared-memory operand layouts of wgmma and tcgen05.mma, and the 64-bit matrix
descriptor that describes one to the tensor core.

The operand tile must be in one of the canonical layouts (PTX ISA 9.7.15.5.1.2, "Shared Memory
Matrix Layout", with 9.7.15.5.1.2.1 "Major-ness supported by Strides" and its "Canonical
Layouts" table; CUTLASS ``make_gmma_desc`` in cute/atom/mma_traits_sm90_gmma.hpp).  tcgen05.mma
reads the same layouts (same core matrices, same swizzles).  With S the swizzle width in bytes
and (mn, k) the indices of an element of one instruction's operand (A: m, k; B: n, k), the byte
address the tensor core reads is::

    K-major  (trans 0)   none:  (mn%8)*16 + (mn/8)*SBO + (kb%16) + (kb/16)*LBO
                         S:     (mn%8)*S  + (mn/8)*SBO + kb                    (LBO unused, "1")
    MN-major (trans 1)   none:  (mb%16)   + (mb/16)*SBO + (k%8)*16 + (k/8)*LBO
                         S:     (mb%S)    + (mb/S)*LBO  + (k%8)*S  + (k/8)*SBO

    (kb = k * element bytes, mb = mn * element bytes; the start address is added and then the
    swizzle XORs address bits [4, 4+log2(S/16)) with bits [7, 7+log2(S/16)))

so the two offsets step along different directions depending on the layout:

    K-major,  any swizzle:   SBO = next 8 rows (MN);   LBO = next 16 B of K (no swizzle only;
                             swizzled: unused, "assumed 1" -- one instruction reads 32 B of K)
    MN-major, swizzled:      LBO = next atom along MN (S bytes of MN);   SBO = next 8 k
    MN-major, no swizzle:    SBO = next 16 B along MN;   LBO = next 8 k

:class:`SmemLayout` is the tile-level model (where element (mn, k) of a whole tile lives) with the
LBO/SBO that describe it; :func:`smem_desc_address_host` is the instruction-level model above.

Advancing along K: the descriptor for the K-slice that starts at ``k0`` is the tile's descriptor
with its start address moved to element (0, k0): ``SmemLayout.k_offset(k0)`` bytes, i.e.
``k0 * element_bytes`` inside a K-major swizzle atom.  Because the start field holds the address
>> 4, that is ``desc + (k_offset >> 4)`` (no carry can leave the 14-bit field: shared addresses are
below 256 KiB).  Inside a K-major swizzle atom the start address then stops being aligned to the
swizzle repeat; that is fine (CUTLASS and DeepGEMM do it): the swizzle is a function of the
address bits, and the base-offset field only matters when the atom itself is misaligned.

The descriptor: one format, two families
----------------------------------------
wgmma (PTX ISA 9.7.15.5.1.2.2, "Matrix Descriptor Format") and tcgen05 (PTX ISA 9.7.16, "Shared
memory descriptor", tcgen05-shared-memory-desc-layout) pack the same fields into the same bits::

    bits  0-13  start address >> 4          (shared state space, 16-byte aligned)
    bits 16-29  leading-dimension byte offset (LBO) >> 4
    bits 32-45  stride-dimension byte offset  (SBO) >> 4
    bits 46-48  version: wgmma 0; tcgen05 fixed 0b001
    bits 49-51  base offset (0 when every swizzle atom starts on its repeat boundary)
    bit  52     LBO mode (tcgen05 only): 0 relative byte offset, 1 absolute address (48 B K tiles)
    bits 53-60  fixed 0
    bits 61-63  layout: 0 no swizzle, 1 128B with 32B atomic (tcgen05 only), 2 128B, 4 64B, 6 32B

wgmma's table names a 2-bit swizzle field at bits 62-63 (0 none, 1 128B, 2 64B, 3 32B,
:data:`SWIZZLE_DESC_CODES`); with bit 61 zero those are the same bits as tcgen05's 3-bit layout
field at 61-63 (:data:`UMMA_LAYOUT_TYPES`; CUTLASS ``GMMA::LayoutType`` against
``UMMA::LayoutType``).  So one encoder, :func:`smem_desc_encoder`, serves both: the families differ
only in the version field (and in which layouts and LBO modes they accept, checked by the host
builders :func:`make_smem_desc_host` and :func:`make_umma_smem_desc_host`, which use the same
encoder).  The device modules compile its two instances, :data:`encode_wgmma_smem_desc` (version
0) and :data:`encode_umma_smem_desc` (version 1), as ``intrinsics.wgmma.make_smem_desc`` and
``intrinsics.tcgen05.make_umma_smem_desc``.
"""

from dataclasses import dataclass

import numpy as np

from intrinsics.layout.swizzle import swizzle_offset_host

__all__ = [
    "SWIZZLE_DESC_CODES",
    "SmemLayout",
    "TCGEN05_DESC_VERSION",
    "UMMA_LAYOUT_TYPES",
    "WGMMA_DESC_VERSION",
    "decode_smem_desc",
    "decode_umma_smem_desc",
    "encode_umma_smem_desc",
    "encode_wgmma_smem_desc",
    "make_smem_desc_host",
    "make_umma_smem_desc_host",
    "smem_desc_address_host",
    "smem_desc_encoder",
    "umma_smem_desc_address_host",
]

# swizzle -> the 3-bit layout code of descriptor bits 61-63 (tcgen05's table; CUTLASS
# UMMA::LayoutType).
UMMA_LAYOUT_TYPES = {0: 0, "128B_base32B": 1, 128: 2, 64: 4, 32: 6}
# swizzle width in bytes -> wgmma's 2-bit code of bits 62-63 (CUTLASS GMMA::LayoutType): the same
# bits, one place higher.
SWIZZLE_DESC_CODES = {0: 0, 128: 1, 64: 2, 32: 3}

# The version field (bits 46-48) of each family.
WGMMA_DESC_VERSION = 0
TCGEN05_DESC_VERSION = 1


def smem_desc_encoder(version):
    """The descriptor encoder of the family whose version field (bits 46-48) is ``version``
    (:data:`WGMMA_DESC_VERSION` 0, :data:`TCGEN05_DESC_VERSION` 1): a function ``encode(addr,
    lbo_bytes, sbo_bytes, swizzle_bytes)`` -> NumPy uint64 for a tile at shared address ``addr``
    (bytes) with leading/stride byte offsets ``lbo_bytes``/``sbo_bytes`` and swizzle width
    ``swizzle_bytes`` (0, 32, 64 or 128; anything else encodes "none"); base offset 0, relative
    LBO.

    One body for both families, specialised by the closure constant ``version``; plain NumPy
    scalar arithmetic, so that numba compiles the very same function for kernels
    (``intrinsics.wgmma.make_smem_desc``, ``intrinsics.tcgen05.make_umma_smem_desc``).  Every
    field goes through int64 first: numba types uint64-with-int64 arithmetic as float64."""
    version_bits = (int(version) & 7) << 14  # bits 46-48, in the high word

    def encode_smem_desc(addr, lbo_bytes, sbo_bytes, swizzle_bytes):
        code = 0  # the 3-bit layout field, bits 61-63
        if swizzle_bytes == 128:
            code = 2
        elif swizzle_bytes == 64:
            code = 4
        elif swizzle_bytes == 32:
            code = 6
        lo = ((np.int64(addr) & 0x3FFFF) >> 4) | (((np.int64(lbo_bytes) & 0x3FFFF) >> 4) << 16)
        hi = (((np.int64(sbo_bytes) & 0x3FFFF) >> 4) | np.int64(version_bits)
              | (np.int64(code) << 29))
        return (np.uint64(hi) << np.uint64(32)) | np.uint64(lo)

    return encode_smem_desc


encode_wgmma_smem_desc = smem_desc_encoder(WGMMA_DESC_VERSION)
encode_umma_smem_desc = smem_desc_encoder(TCGEN05_DESC_VERSION)


def _check_byte_fields(addr, lbo_bytes, sbo_bytes):
    for name, value in (("address", addr), ("LBO", lbo_bytes), ("SBO", sbo_bytes)):
        if value % 16 or not 0 <= value < 1 << 18:
            raise ValueError(f"descriptor {name} must be a multiple of 16 in 0..2**18, got {value}")


def make_smem_desc_host(addr, lbo_bytes, sbo_bytes, swizzle_bytes):
    """The wgmma matrix descriptor (PTX ISA 9.7.15.5.1.2.2) as a Python int: the host twin of
    ``intrinsics.wgmma.make_smem_desc`` (the same encoder); checks its arguments.
    ``swizzle_bytes`` 0, 32, 64 or 128; base offset 0."""
    if swizzle_bytes not in SWIZZLE_DESC_CODES:
        raise ValueError(
            f"swizzle must be one of {sorted(SWIZZLE_DESC_CODES)} bytes, got {swizzle_bytes!r}"
        )
    _check_byte_fields(addr, lbo_bytes, sbo_bytes)
    return int(encode_wgmma_smem_desc(int(addr), int(lbo_bytes), int(sbo_bytes), swizzle_bytes))


def make_umma_smem_desc_host(addr, lbo_bytes, sbo_bytes, swizzle, base_offset=0, lbo_mode=0):
    """The tcgen05 shared-memory descriptor (PTX ISA 9.7.16, "Shared memory descriptor") as a
    Python int: the host twin of ``intrinsics.tcgen05.make_umma_smem_desc`` (the same encoder),
    plus the fields the device builder leaves at 0.  ``swizzle`` 0, 32, 64, 128 (bytes) or
    "128B_base32B"; ``base_offset`` 0..7; ``lbo_mode`` 0 (relative) or 1 (absolute)."""
    if swizzle not in UMMA_LAYOUT_TYPES:
        raise ValueError(f"swizzle must be one of {list(UMMA_LAYOUT_TYPES)}, got {swizzle!r}")
    _check_byte_fields(addr, lbo_bytes, sbo_bytes)
    if not 0 <= base_offset < 8 or lbo_mode not in (0, 1):
        raise ValueError(f"base_offset must be 0..7 and lbo_mode 0 or 1, got {base_offset}, "
                         f"{lbo_mode}")
    base32 = swizzle == "128B_base32B"  # the one layout a swizzle width cannot name
    desc = int(encode_umma_smem_desc(int(addr), int(lbo_bytes), int(sbo_bytes),
                                     0 if base32 else swizzle))
    return (desc | int(base_offset) << 49 | int(lbo_mode) << 52
            | (UMMA_LAYOUT_TYPES["128B_base32B"] << 61 if base32 else 0))


def _fields(desc):
    desc = int(desc)
    return {
        "addr": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4,
        "sbo": ((desc >> 32) & 0x3FFF) << 4, "version": (desc >> 46) & 7,
        "base_offset": (desc >> 49) & 7, "lbo_mode": (desc >> 52) & 1,
        "layout": (desc >> 61) & 7, "fixed": (desc >> 53) & 0xFF,
    }


def decode_smem_desc(desc):
    """The fields of a wgmma descriptor: dict(addr, lbo, sbo, base_offset, swizzle) in bytes
    (swizzle from the 2-bit field at bits 62-63)."""
    f = _fields(desc)
    codes = {v: k for k, v in SWIZZLE_DESC_CODES.items()}
    return {"addr": f["addr"], "lbo": f["lbo"], "sbo": f["sbo"], "base_offset": f["base_offset"],
            "swizzle": codes[f["layout"] >> 1]}


def decode_umma_smem_desc(desc):
    """The fields of a tcgen05 shared-memory descriptor: dict(addr, lbo, sbo (bytes), version,
    base_offset, lbo_mode, layout (the code), swizzle (bytes or "128B_base32B"; None for an
    undefined code), fixed (bits 53-60))."""
    f = _fields(desc)
    names = {v: k for k, v in UMMA_LAYOUT_TYPES.items()}
    return {
        "addr": f["addr"], "lbo": f["lbo"], "sbo": f["sbo"], "version": f["version"],
        "base_offset": f["base_offset"], "lbo_mode": f["lbo_mode"], "layout": f["layout"],
        "swizzle": names.get(f["layout"]), "fixed": f["fixed"],
    }


def _operand_address(f, major, elem_bytes, mn, k):
    """The canonical-layout formulas of the module docstring for decoded fields ``f``."""
    mn = np.asarray(mn, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    s, lbo, sbo = f["swizzle"], f["lbo"], f["sbo"]
    if major == "K":
        kb = k * elem_bytes
        if s == 0:
            off = (mn % 8) * 16 + (mn // 8) * sbo + kb % 16 + (kb // 16) * lbo
        else:
            off = (mn % 8) * s + (mn // 8) * sbo + kb
    elif major == "MN":
        mb = mn * elem_bytes
        if s == 0:
            off = mb % 16 + (mb // 16) * sbo + (k % 8) * 16 + (k // 8) * lbo
        else:
            off = mb % s + (mb // s) * lbo + (k % 8) * s + (k // 8) * sbo
    else:
        raise ValueError(f"major must be 'K' or 'MN', got {major!r}")
    return swizzle_offset_host(f["addr"] + off, s)


def smem_desc_address_host(desc, major, elem_bytes, mn, k):
    """Shared-memory byte address that wgmma reads for element (mn, k) of one instruction's
    operand, given its descriptor: the canonical-layout formulas of the module docstring (PTX ISA
    9.7.15.5.1.2; CUTLASS make_gmma_desc), then the swizzle.  ``mn``/``k`` may be NumPy arrays;
    ``k`` counts within the instruction (0..K-1).  ``major`` is "K" (trans 0) or "MN" (trans 1).
    Base offset must be 0.  This is the model the layout tests and a CPU emulation rely on."""
    f = decode_smem_desc(desc)
    if f["base_offset"]:
        raise NotImplementedError("descriptors with a non-zero base offset")
    return _operand_address(f, major, elem_bytes, mn, k)


def umma_smem_desc_address_host(desc, major, elem_bytes, mn, k):
    """Shared byte address that tcgen05 reads for element (mn, k) of one instruction's operand
    (A: mn = m, B: mn = n; ``k`` within the instruction, 0..K-1), given its descriptor.

    The canonical layouts are wgmma's, so this is :func:`smem_desc_address_host`'s model (one
    model for both families).  Supported: swizzle none/32B/64B/128B, base offset 0, LBO mode 0;
    anything else raises NotImplementedError."""
    f = decode_umma_smem_desc(desc)
    if f["swizzle"] not in (0, 32, 64, 128) or f["base_offset"] or f["lbo_mode"]:
        raise NotImplementedError(
            f"descriptor layout {f['swizzle']!r} (code {f['layout']}), base offset "
            f"{f['base_offset']}, LBO mode {f['lbo_mode']}: only swizzle none/32B/64B/128B with "
            "base offset 0 and relative LBO are modelled")
    return _operand_address(f, major, elem_bytes, mn, k)


# ---------------------------------------------------------------------------------------------
# Tile layouts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmemLayout:
    """A canonical shared-memory layout of an (mn, k) operand tile (A: mn = m; B: mn = n), as
    wgmma and tcgen05.mma read it.

    ``major``: "K" (K contiguous; trans 0) or "MN" (MN contiguous; trans 1).  ``swizzle``: 0, 32,
    64 or 128 bytes.  ``elem_bytes``: 1 (fp8), 2 (f16/bf16), 4 (tf32).  The tile is built from
    swizzle atoms (CuTe ``GMMA::Layout_{K,MN}_{INTER,SW32,SW64,SW128}_Atom``) tiled MN-first, then
    along K (CuTe ``tile_to_shape``'s default order), densely, starting at a base aligned to
    :attr:`align`:

        K-major,  none:  8 rows x 16 B core matrices; MN step 128 B, K step mn*16 B
        K-major,  S:     rows of S bytes (S/elem_bytes k values), 8-row atoms of 8*S bytes stacked
                         along MN; the next S bytes of K start mn*S bytes further
        MN-major, none:  8 k x 16 B core matrices; MN step 128 B, 8-k step mn*elem_bytes*8 B
        MN-major, S:     8 k-rows of S bytes (S/elem_bytes mn values); atoms of 8*S bytes stacked
                         along MN; the next 8 k start mn*elem_bytes*8 bytes further

    then the swizzle of the mode is applied to the byte offset.  :attr:`lbo` and :attr:`sbo` are
    the descriptor offsets of either family; :meth:`desc` builds the wgmma descriptor.
    """

    major: str
    swizzle: int
    mn: int
    k: int
    elem_bytes: int

    def __post_init__(self):
        if self.major not in ("K", "MN"):
            raise ValueError(f"major must be 'K' or 'MN', got {self.major!r}")
        if self.swizzle not in SWIZZLE_DESC_CODES:
            raise ValueError(
                f"swizzle must be one of {sorted(SWIZZLE_DESC_CODES)} bytes, got {self.swizzle!r}"
            )
        if self.elem_bytes not in (1, 2, 4):
            raise ValueError(f"elem_bytes must be 1, 2 or 4, got {self.elem_bytes!r}")
        width = max(self.swizzle, 16)  # bytes of the contiguous direction in one atom
        if self.major == "K":
            if self.mn % 8 or (self.k * self.elem_bytes) % width:
                raise ValueError(
                    f"a K-major {self._mode} tile needs mn a multiple of 8 and k * elem_bytes a "
                    f"multiple of {width}, got mn={self.mn}, k={self.k} ({self.elem_bytes} B)"
                )
        elif (self.mn * self.elem_bytes) % width or self.k % 8:
            raise ValueError(
                f"an MN-major {self._mode} tile needs mn * elem_bytes a multiple of {width} and k "
                f"a multiple of 8, got mn={self.mn}, k={self.k} ({self.elem_bytes} B)"
            )

    @property
    def _mode(self):
        return f"{self.swizzle}B-swizzle" if self.swizzle else "no-swizzle"

    @property
    def nbytes(self):
        return self.mn * self.k * self.elem_bytes

    @property
    def align(self):
        """Alignment the tile's base needs: the swizzle repeat (8 rows), 16 B without swizzle."""
        return 8 * self.swizzle if self.swizzle else 16

    @property
    def lbo(self):
        """Leading-dimension byte offset for the descriptor."""
        s = self.swizzle
        if self.major == "K":
            return self.mn * 16 if s == 0 else 16  # swizzled K-major: unused, "assumed 1"
        return self.mn * self.elem_bytes * 8 if s == 0 else 8 * s

    @property
    def sbo(self):
        """Stride-dimension byte offset for the descriptor."""
        s = self.swizzle
        if self.major == "K":
            return 128 if s == 0 else 8 * s
        return 128 if s == 0 else self.mn * self.elem_bytes * 8

    def offset(self, mn, k):
        """Byte offset of element (mn, k) from the tile's base (NumPy arrays welcome)."""
        mn = np.asarray(mn, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)
        s, eb = self.swizzle, self.elem_bytes
        if self.major == "K":
            kb = k * eb
            if s == 0:
                return (kb // 16) * (self.mn * 16) + (mn // 8) * 128 + (mn % 8) * 16 + kb % 16
            return swizzle_offset_host((kb // s) * (self.mn * s) + mn * s + kb % s, s)
        mb = mn * eb
        kstep = self.mn * eb * 8
        if s == 0:
            return (k // 8) * kstep + (mb // 16) * 128 + (k % 8) * 16 + mb % 16
        return swizzle_offset_host((k // 8) * kstep + (mb // s) * (8 * s) + (k % 8) * s + mb % s, s)

    def k_offset(self, k0):
        """Bytes to add to the tile's start address for the instruction K-slice starting at k0."""
        if (k0 * self.elem_bytes) % 32:
            raise ValueError(f"k0 must start an instruction K-slice (32 bytes of K), got {k0}")
        return int(self.offset(0, k0))

    def desc(self, base_addr, k0=0):
        """Host wgmma descriptor for the K-slice at ``k0`` of this tile placed at ``base_addr``."""
        return make_smem_desc_host(base_addr + self.k_offset(k0), self.lbo, self.sbo, self.swizzle)

    def place(self, tile):
        """The ``nbytes`` uint8 image of ``tile`` (an (mn, k) array of ``elem_bytes`` items)."""
        tile = np.ascontiguousarray(tile)
        if tile.shape != (self.mn, self.k) or tile.dtype.itemsize != self.elem_bytes:
            raise ValueError(
                f"tile must be ({self.mn}, {self.k}) of {self.elem_bytes}-byte items, got "
                f"{tile.shape} of {tile.dtype}"
            )
        mn, k = np.meshgrid(np.arange(self.mn), np.arange(self.k), indexing="ij")
        offs = self.offset(mn, k)
        src = tile.view(np.uint8).reshape(self.mn, self.k, self.elem_bytes)
        image = np.zeros(self.nbytes, dtype=np.uint8)
        for byte in range(self.elem_bytes):
            image[offs + byte] = src[..., byte]
        return image

    def gather(self, image, dtype):
        """Inverse of :meth:`place`: the (mn, k) tile of ``dtype`` stored in ``image``."""
        mn, k = np.meshgrid(np.arange(self.mn), np.arange(self.k), indexing="ij")
        offs = self.offset(mn, k)
        image = np.asarray(image, dtype=np.uint8)
        out = np.empty((self.mn, self.k, self.elem_bytes), dtype=np.uint8)
        for byte in range(self.elem_bytes):
            out[..., byte] = image[offs + byte]
        return out.reshape(-1).view(dtype).reshape(self.mn, self.k)
