"""Typed Numba intrinsics that emit the PTX of NVIDIA's tensor-core, asynchronous-copy and
synchronisation instructions, for use inside ``@cuda.jit`` kernels.

One module per instruction family; everything public is re-exported here::

    import intrinsics as nt
    mma = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")
"""

from intrinsics._core import ArchitectureError
from intrinsics.convert import (
    cvt_tf32,
    pack_bf16x2,
    pack_e4m3x4,
    pack_e5m2x4,
    pack_f16x2,
    unpack_bf16x2,
    unpack_f16x2,
)
from intrinsics.cp_async import (
    cp_async_op,
    cp_async_4,
    cp_async_4_zfill,
    cp_async_8,
    cp_async_8_zfill,
    cp_async_16,
    cp_async_16_zfill,
    cp_async_ca_16,
    cp_async_commit_group,
    cp_async_wait_all,
    cp_async_wait_group,
)
from intrinsics.ldmatrix import (
    ldmatrix_op,
    ldmatrix_x1,
    ldmatrix_x1_trans,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    movmatrix_trans,
    stmatrix_op,
    stmatrix_x1,
    stmatrix_x1_trans,
    stmatrix_x2,
    stmatrix_x2_trans,
    stmatrix_x4,
    stmatrix_x4_trans,
)
from intrinsics.launch import LaunchError
from intrinsics.mma import MmaSpec, mma_specs, mma_sync
from intrinsics.smem import shared_address, swizzle, swizzle_offset

__version__ = "0.1.0"
