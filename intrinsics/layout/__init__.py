"""Host models of the tensor-core data layouts: where every element lives, as plain Python and
NumPy -- no device code, nothing here imports numba.

The PTX ISA specifies the layouts as tables and figures; this package holds them as functions
and data, once, for everyone who needs them:

- the device intrinsics (``intrinsics.wgmma``, ``intrinsics.tcgen05``, ``intrinsics.smem``)
  compile the pure encoders here (the descriptors, TMEM addresses, swizzles) as device functions
  and read their instruction tables from here;
- the CPU emulation (``intrinsics.emulate``) decodes descriptors and places fragments with them;
- kernels lay out their shared-memory tiles with :class:`SmemLayout`;
- the picture tool (``python -m numbatc.layouts``) draws these very maps, and the GPU lane tests
  check them against the hardware.

wgmma and tcgen05 read the same canonical shared-memory layouts through the same descriptor
format (:mod:`~intrinsics.layout.smem` has the one encoder and says where the two differ), which
is why they live here rather than in either family's module.

    swizzle      CuTe swizzles of a byte offset (TMA, wgmma, tcgen05, ldmatrix tiles)
    smem         SmemLayout (tile model), the shared-memory matrix descriptor of wgmma and
                 tcgen05 (encode, decode, the address each (mn, k) is read from)
    fragments    register fragment maps: mma.sync, ldmatrix, wgmma D and RS-A
    tmem         tensor memory: addresses, tcgen05.ld/st, tcgen05.cp, tcgen05.mma D and scale
                 factors
    instr_desc   the tcgen05.mma kinds and their 32-bit instruction descriptor
"""

from intrinsics.layout.fragments import (
    a_fragment_coords,
    accumulator_coords,
    elements_per_register,
    ldmatrix_fragment,
    mma_block_scale_fragment,
    mma_fragment,
    mma_scale_fragment,
    pack_fragment,
    pack_scale_fragment,
    unpack_fragment,
    unpack_scale_fragment,
)
from intrinsics.layout.instr_desc import (
    IDESC_AB_FORMATS,
    IDESC_D_FORMATS,
    IDESC_SCALE_FORMATS,
    TCGEN05_MMA_KINDS,
    TRANSPOSABLE_TYPES,
    check_mma_shape,
    decode_instr_desc,
    encode_instr_desc,
    encode_instr_desc_block_scaled,
    make_instr_desc_block_scaled_host,
    make_instr_desc_host,
)
from intrinsics.layout.smem import (
    SWIZZLE_DESC_CODES,
    TCGEN05_DESC_VERSION,
    UMMA_LAYOUT_TYPES,
    WGMMA_DESC_VERSION,
    SmemLayout,
    decode_smem_desc,
    decode_umma_smem_desc,
    encode_umma_smem_desc,
    encode_wgmma_smem_desc,
    make_smem_desc_host,
    make_umma_smem_desc_host,
    smem_desc_address_host,
    smem_desc_encoder,
    umma_smem_desc_address_host,
)
from intrinsics.layout.swizzle import SWIZZLE_MODES, swizzle_bits, swizzle_host, swizzle_offset_host
from intrinsics.layout.tmem import (
    TCGEN05_CP_SHAPES,
    TCGEN05_LDST_SHAPES,
    TMEM_COLUMNS,
    TMEM_LANES,
    cp_lane_map,
    decode_tmem_address,
    encode_tmem_address,
    ldst_coords,
    ldst_register_count,
    scale_factor_coords,
    tmem_address_host,
    tmem_d_coords,
)

__all__ = [
    "IDESC_AB_FORMATS",
    "IDESC_D_FORMATS",
    "IDESC_SCALE_FORMATS",
    "SWIZZLE_DESC_CODES",
    "SWIZZLE_MODES",
    "SmemLayout",
    "TCGEN05_CP_SHAPES",
    "TCGEN05_DESC_VERSION",
    "TCGEN05_LDST_SHAPES",
    "TCGEN05_MMA_KINDS",
    "TMEM_COLUMNS",
    "TMEM_LANES",
    "TRANSPOSABLE_TYPES",
    "UMMA_LAYOUT_TYPES",
    "WGMMA_DESC_VERSION",
    "a_fragment_coords",
    "accumulator_coords",
    "check_mma_shape",
    "cp_lane_map",
    "decode_instr_desc",
    "decode_smem_desc",
    "decode_tmem_address",
    "decode_umma_smem_desc",
    "elements_per_register",
    "encode_instr_desc",
    "encode_instr_desc_block_scaled",
    "encode_umma_smem_desc",
    "encode_wgmma_smem_desc",
    "encode_tmem_address",
    "ldmatrix_fragment",
    "ldst_coords",
    "ldst_register_count",
    "make_instr_desc_block_scaled_host",
    "make_instr_desc_host",
    "make_smem_desc_host",
    "make_umma_smem_desc_host",
    "mma_block_scale_fragment",
    "mma_fragment",
    "mma_scale_fragment",
    "pack_fragment",
    "pack_scale_fragment",
    "scale_factor_coords",
    "smem_desc_address_host",
    "smem_desc_encoder",
    "swizzle_bits",
    "swizzle_host",
    "swizzle_offset_host",
    "tmem_address_host",
    "tmem_d_coords",
    "umma_smem_desc_address_host",
    "unpack_fragment",
    "unpack_scale_fragment",
]
