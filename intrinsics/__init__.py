"""Typed Numba intrinsics that emit the PTX of NVIDIA's tensor-core, asynchronous-copy and
synchronisation instructions, for use inside ``@cuda.jit`` kernels.

One module per instruction family; everything public is re-exported here.  The host models of
the layouts (shared-memory tiles, descriptors, fragment and tensor-memory maps) are the
``intrinsics.layout`` package, of which only ``SmemLayout`` is re-exported::

    import intrinsics as nt
    mma = nt.mma_sync("m16n8k16", "bf16", "bf16", "f32")
"""

from intrinsics._core import ArchitectureError
from intrinsics.emulate import install as _install_emulation

# Under numba's simulator (NUMBA_ENABLE_CUDASIM=1) the family modules' intrinsics are replaced by
# their CPU emulations before the names below are re-exported.
_install_emulation()
from intrinsics.atomic import atomic_add_global
from intrinsics.barrier import named_barrier_arrive, named_barrier_sync
from intrinsics.convert import (
    bits_from_f32,
    cvt_tf32,
    f32_from_bits,
    frag_pack_bf16x2,
    frag_pack_f16x2,
    pack_bf16x2,
    pack_e4m3x4,
    pack_e5m2x4,
    pack_f16x2,
    unpack_bf16x2,
    unpack_f16x2,
)
from intrinsics.fastmath import (
    ex2_approx,
    fma_f32,
    frag_exp2,
    frag_exp2_cols,
    frag_exp2_fma,
    frag_exp2_fma_cols,
    frag_mask_cols,
    frag_mask_cols_from,
    frag_mask_keys,
    frag_mask_keys_causal,
    frag_mul_diff_cols,
    frag_mul_diff_rows,
    frag_row_maxes,
    frag_row_sums,
    frag_scale_rows,
    tanh_approx,
)
from intrinsics.gmem import st_global_b32, st_global_v4_b32
from intrinsics.hints import opaque
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
    cp_async_mbarrier_arrive,
    cp_async_mbarrier_arrive_noinc,
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
from intrinsics.cluster import (
    cluster_arrive,
    cluster_arrive_relaxed,
    cluster_ctaid,
    cluster_ctarank,
    cluster_id,
    cluster_nctaid,
    cluster_nctarank,
    cluster_nclusterid,
    cluster_sync,
    cluster_wait,
    dsmem_load_f32,
    dsmem_load_u32,
    dsmem_store_f32,
    dsmem_store_u32,
    elect_sync,
    fence_acq_rel_cluster,
    fence_proxy_async,
    fence_proxy_async_global,
    fence_proxy_async_shared,
    map_shared_rank,
)
from intrinsics.launch import LaunchError
from intrinsics.layout import SmemLayout
from intrinsics.mbarrier import (
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster,
    mbarrier_arrive_count,
    mbarrier_arrive_expect_tx,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics.mma import MmaSpec, mma_specs, mma_sync, mma_sync_block_scale
from intrinsics.setmaxnreg import setmaxnreg_dec, setmaxnreg_inc
from intrinsics.shfl import shfl_bfly, shfl_down, shfl_idx, shfl_op, shfl_up
from intrinsics.smem import ld_shared_v4_b32, shared_address, st_shared_b32, swizzle, swizzle_offset
from intrinsics.tcgen05 import (
    make_instr_desc,
    make_instr_desc_block_scaled,
    make_umma_smem_desc,
    tcgen05_alloc,
    tcgen05_alloc_cg2,
    tcgen05_commit,
    tcgen05_commit_cg2,
    tcgen05_commit_multicast,
    tcgen05_commit_multicast_cg2,
    tcgen05_cp,
    tcgen05_dealloc,
    tcgen05_dealloc_cg2,
    tcgen05_fence_after_thread_sync,
    tcgen05_fence_before_thread_sync,
    tcgen05_ld,
    tcgen05_mma,
    tcgen05_relinquish_alloc_permit,
    tcgen05_relinquish_alloc_permit_cg2,
    tcgen05_st,
    tcgen05_wait_ld,
    tcgen05_wait_ld_regs,
    tcgen05_wait_st,
    tmem_address,
    umma_smem_desc,
)
from intrinsics.tensormap import TensorMap, TensorMapError
from intrinsics.tma import (
    bulk_commit_group,
    bulk_copy_g2s,
    bulk_copy_s2g,
    bulk_copy_s2s_cluster,
    bulk_reduce_add_f32,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_load_im2col,
    tma_load_multicast,
    tma_prefetch,
    tma_prefetch_descriptor,
    tensormap_fence_acquire,
    tma_store,
)
from intrinsics.wgmma import (
    make_smem_desc,
    smem_desc,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_fence_operand,
    wgmma_mma_async,
    wgmma_wait_group,
)

__version__ = "0.1.0"
