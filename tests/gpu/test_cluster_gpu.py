"""Clusters on the GPU (sm_90+): the cluster special registers against the launch geometry,
DSMEM stores into a neighbour CTA read back after cluster_sync (2- and 4-CTA clusters), DSMEM
loads from a neighbour, mapa address arithmetic, arrivals on a peer CTA's mbarrier, and
elect.sync choosing exactly one lane per warp.

Cluster launches go through ``intrinsics.launch.launch`` (the grid counts blocks).  Every kernel
that touches a peer's shared memory ends with a cluster barrier: a CTA's shared memory goes away
when it exits.
"""

import numpy as np
import pytest
from numba import cuda

from intrinsics.cluster import (
    cluster_arrive,
    cluster_arrive_relaxed,
    cluster_ctaid,
    cluster_ctarank,
    cluster_id,
    cluster_nclusterid,
    cluster_nctaid,
    cluster_nctarank,
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
from intrinsics.mbarrier import (
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics.tma import bulk_copy_s2s_cluster

gpu90 = pytest.mark.gpu(cc=(9, 0))
pytestmark = pytest.mark.emulation  # every test also runs in the CPU emulation
POISON_U32 = np.uint32(0xFFFFFFFF)
THREADS = 128


def cluster_launch(kernel, grid, block, args, cluster):
    from intrinsics.launch import launch

    launch(kernel, grid, block, args, cluster=cluster)
    cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# Special registers
# ---------------------------------------------------------------------------------------------


@cuda.jit
def ranks_kernel(out):
    cluster_arrive_relaxed()  # every CTA of the cluster has started
    cluster_wait()
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    if cuda.threadIdx.x == 0:
        out[b, 0] = cluster_ctarank()
        out[b, 1] = cluster_nctarank()
        x, y, z = cluster_ctaid()
        out[b, 2] = x
        out[b, 3] = y
        out[b, 4] = z
        x, y, z = cluster_nctaid()
        out[b, 5] = x
        out[b, 6] = y
        out[b, 7] = z
        x, y, z = cluster_id()
        out[b, 8] = x
        out[b, 9] = y
        out[b, 10] = z
        x, y, z = cluster_nclusterid()
        out[b, 11] = x
        out[b, 12] = y
        out[b, 13] = z
    # The fences have no visible effect here; they must execute.
    fence_proxy_async()
    fence_proxy_async_shared()
    fence_proxy_async_global()
    fence_acq_rel_cluster()
    cluster_arrive()
    cluster_wait()


def expected_ranks(grid, cluster):
    """PTX ISA 10: %cluster_ctaid is the CTA's position in its cluster (%ctaid modulo the
    cluster shape), %clusterid the cluster's position in the grid, %cluster_ctarank the linear
    rank x + y*nx + z*nx*ny, %cluster_nctarank the cluster's size."""
    rows = []
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                c = [bx % cluster[0], by % cluster[1], bz % cluster[2]]
                rank = c[0] + cluster[0] * (c[1] + cluster[1] * c[2])
                size = cluster[0] * cluster[1] * cluster[2]
                cid = [bx // cluster[0], by // cluster[1], bz // cluster[2]]
                ncid = [g // k for g, k in zip(grid, cluster)]
                rows.append([rank, size, *c, *cluster, *cid, *ncid])
    return np.array(rows, dtype=np.uint32)


@gpu90
@pytest.mark.parametrize(
    "grid, cluster",
    [
        ((8, 1, 1), (2, 1, 1)),
        ((8, 1, 1), (4, 1, 1)),
        ((4, 4, 1), (2, 2, 1)),
        ((2, 2, 2), (1, 2, 2)),
    ],
)
def test_cluster_special_registers(grid, cluster):
    blocks = grid[0] * grid[1] * grid[2]
    out = cuda.to_device(np.full((blocks, 14), POISON_U32, dtype=np.uint32))
    cluster_launch(ranks_kernel, grid, 64, (out,), cluster)
    np.testing.assert_array_equal(out.copy_to_host(), expected_ranks(grid, cluster))


# ---------------------------------------------------------------------------------------------
# Distributed shared memory
# ---------------------------------------------------------------------------------------------


@cuda.jit
def dsmem_kernel(vals_u, vals_f, own_u, own_f, peek_u, peek_f, addr):
    bu = cuda.shared.array(THREADS, np.uint32)
    bf = cuda.shared.array(THREADS, np.float32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    r = cluster_ctarank()
    n = cluster_nctarank()
    nxt = (r + 1) % n
    bu[t] = 0xFFFFFFFF
    bf[t] = np.float32(np.nan)
    cluster_sync()  # poison written everywhere, every peer running
    j = (5 * t + 3) % THREADS  # a permutation of the slots
    dsmem_store_u32(bu, j, nxt, vals_u[b, t])
    dsmem_store_f32(bf, j, nxt, vals_f[b, t])
    cluster_sync()  # the stores are visible
    own_u[b, t] = bu[t]
    own_f[b, t] = bf[t]
    peek_u[b, t] = dsmem_load_u32(bu, t, nxt)
    peek_f[b, t] = dsmem_load_f32(bf, t, nxt)
    base = map_shared_rank(bu, 0, nxt)
    addr[b, t, 0] = map_shared_rank(bu, t, nxt) - base
    addr[b, t, 1] = base != map_shared_rank(bu, 0, r)
    cluster_sync()  # nobody exits while a peer may still read its shared memory


@gpu90
@pytest.mark.parametrize("n", [2, 4])
def test_dsmem_store_to_neighbour_and_load_back(n):
    rng = np.random.default_rng()
    blocks = 2 * n  # two clusters
    vals_u = rng.integers(0, 2**32 - 1, (blocks, THREADS), dtype=np.uint32)  # never the poison
    vals_f = rng.standard_normal((blocks, THREADS)).astype(np.float32)
    own_u = cuda.to_device(np.full((blocks, THREADS), POISON_U32, dtype=np.uint32))
    peek_u = cuda.to_device(np.full((blocks, THREADS), POISON_U32, dtype=np.uint32))
    own_f = cuda.to_device(np.full((blocks, THREADS), np.nan, dtype=np.float32))
    peek_f = cuda.to_device(np.full((blocks, THREADS), np.nan, dtype=np.float32))
    addr = cuda.to_device(np.full((blocks, THREADS, 2), POISON_U32, dtype=np.uint32))
    args = (cuda.to_device(vals_u), cuda.to_device(vals_f), own_u, own_f, peek_u, peek_f, addr)
    cluster_launch(dsmem_kernel, (blocks, 1, 1), THREADS, args, (n, 1, 1))

    t = np.arange(THREADS)
    j = (5 * t + 3) % THREADS
    exp_own_u = np.empty_like(vals_u)
    exp_own_f = np.empty_like(vals_f)
    for b in range(blocks):
        r, first = b % n, b - b % n
        prev = first + (r - 1) % n  # the CTA whose stores land here
        exp_own_u[b, j] = vals_u[prev, t]
        exp_own_f[b, j] = vals_f[prev, t]
    # The successor's buffer holds what this CTA stored into it.
    exp_peek_u = np.empty_like(vals_u)
    exp_peek_f = np.empty_like(vals_f)
    exp_peek_u[:, j] = vals_u[:, t]
    exp_peek_f[:, j] = vals_f[:, t]
    np.testing.assert_array_equal(own_u.copy_to_host(), exp_own_u)
    np.testing.assert_array_equal(own_f.copy_to_host(), exp_own_f)
    np.testing.assert_array_equal(peek_u.copy_to_host(), exp_peek_u)
    np.testing.assert_array_equal(peek_f.copy_to_host(), exp_peek_f)
    addr = addr.copy_to_host()
    np.testing.assert_array_equal(addr[:, :, 0], np.broadcast_to(4 * t, (blocks, THREADS)))
    assert (addr[:, :, 1] == 1).all(), "mapa gave the same address for two ranks"


# ---------------------------------------------------------------------------------------------
# Arrivals on a peer CTA's mbarrier
# ---------------------------------------------------------------------------------------------


@cuda.jit
def remote_arrive_kernel(out):
    """A ring: CTA r arrives r + 1 times on its successor's barrier.  CTA q's barrier expects
    its predecessor's arrivals plus one local arrival, so it completes only if every remote
    arrival landed in the right CTA."""
    bars = cuda.shared.array(1, np.uint64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    r = cluster_ctarank()
    n = cluster_nctarank()
    pred = (r + n - 1) % n
    if t == 0:
        mbarrier_init(bars, 0, pred + 2)
        fence_mbarrier_init()
    cluster_sync()  # every barrier initialised and visible to the cluster
    if t < r + 1:
        mbarrier_arrive_cluster(bars, 0, (r + 1) % n)
    cluster_sync()  # every remote arrival performed
    if t == 0:
        out[b, 0] = mbarrier_test_wait_parity(bars, 0, 0)  # one local arrival still missing
        state = mbarrier_arrive(bars, 0)
        done = False
        for _ in range(1 << 16):
            if mbarrier_test_wait(bars, 0, state):
                done = True
                break
        out[b, 1] = done
        out[b, 2] = mbarrier_test_wait_parity(bars, 0, 1)  # phase 1 has not completed
    cluster_sync()


@gpu90
@pytest.mark.parametrize("n", [2, 4])
def test_remote_mbarrier_arrive(n):
    blocks = 2 * n
    out = cuda.to_device(np.full((blocks, 3), -1, dtype=np.int32))
    cluster_launch(remote_arrive_kernel, (blocks, 1, 1), THREADS, (out,), (n, 1, 1))
    np.testing.assert_array_equal(out.copy_to_host(), np.tile([0, 1, 0], (blocks, 1)))


# ---------------------------------------------------------------------------------------------
# Bulk copies between CTAs (cp.async.bulk.shared::cluster.shared::cta)
# ---------------------------------------------------------------------------------------------

S2S_BYTES = 2048
S2S_INBOX = S2S_BYTES + 16  # NOTE: a shared array's shape must be one constant, not an expression


@cuda.jit
def s2s_kernel(src, out, shift):
    """CTA r writes its slice of ``src`` into its shared memory (generic stores), then thread 0
    copies it in one bulk copy into CTA (r + shift) % n's ``inbox``, signalling that CTA's
    barrier; every CTA waits for its own inbox and writes it out.  The inbox starts 16 bytes
    past a 1024-byte boundary, so the copy is checked away from the swizzle repeat too."""
    mine = cuda.shared.array(S2S_BYTES, np.uint8, alignment=1024)
    inbox = cuda.shared.array(S2S_INBOX, np.uint8, alignment=1024)
    bars = cuda.shared.array(1, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    r = cluster_ctarank()
    n = cluster_nctarank()
    for i in range(t, S2S_BYTES, THREADS):
        mine[i] = src[b, i]
        inbox[16 + i] = 0xEE
    if t == 0:
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bars, 0, S2S_BYTES)
    fence_proxy_async_shared()  # generic writes of `mine` -> the copy's async-proxy reads
    cluster_sync()  # every barrier initialised and expecting, every source written
    if t == 0:
        bulk_copy_s2s_cluster(inbox, 16, mine, 0, S2S_BYTES, bars, 0, (r + shift) % n)
    mbarrier_wait_parity(bars, 0, 0)
    for i in range(t, S2S_BYTES, THREADS):
        out[b, i] = inbox[16 + i]
    cluster_sync()


@gpu90
@pytest.mark.parametrize("n, shift", [(2, 1), (4, 3), (2, 0)])
def test_bulk_copy_between_ctas(n, shift):
    blocks = 2 * n
    rng = np.random.default_rng()
    src = rng.integers(0, 256, size=(blocks, S2S_BYTES), dtype=np.uint8)
    out = cuda.to_device(np.full((blocks, S2S_BYTES), 0xFF, dtype=np.uint8))
    cluster_launch(s2s_kernel, (blocks, 1, 1), THREADS, (cuda.to_device(src), out, shift), (n, 1, 1))
    # block b received from the CTA of rank (r - shift) % n of its own cluster
    b = np.arange(blocks)
    sender = b - b % n + (b % n - shift) % n
    np.testing.assert_array_equal(out.copy_to_host(), src[sender])


# ---------------------------------------------------------------------------------------------
# elect.sync
# ---------------------------------------------------------------------------------------------


@cuda.jit
def elect_kernel(out):
    t = cuda.threadIdx.x
    out[0, t] = elect_sync()
    out[1, t] = elect_sync()


@gpu90
def test_elect_sync_one_lane_per_warp():
    warps = 8
    out = cuda.to_device(np.full((2, 32 * warps), -1, dtype=np.int32))
    elect_kernel[1, 32 * warps](out)
    out = out.copy_to_host().reshape(2, warps, 32)
    assert set(np.unique(out)) <= {0, 1}
    np.testing.assert_array_equal(out.sum(axis=2), np.ones((2, warps)))
    # The same membermask elects the same leader every time (PTX ISA 9.7.13.14).
    np.testing.assert_array_equal(out[0], out[1])
