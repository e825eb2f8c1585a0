"""The synchronisation and copy families in the CPU emulation: each protocol mistake the
emulation must catch (mbarrier, cluster barrier, setmaxnreg, TMA and bulk copies) is provoked by a
small kernel, and the EmulationError must name the block, warp, lane and the object.

Run with ``NUMBA_ENABLE_CUDASIM=1 python3 -m pytest -q -m emulation tests/emulation``
(the second pytest run of the README's test command does)."""

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.emulation

if not config.ENABLE_CUDASIM:  # collected without the simulator: nothing to run
    pytest.skip("needs NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from intrinsics.cluster import (  # noqa: E402
    cluster_arrive,
    cluster_ctarank,
    cluster_sync,
    cluster_wait,
    elect_sync,
    fence_proxy_async_shared,
)
from intrinsics.emulate import runtime  # noqa: E402
from intrinsics.emulate.runtime import EmulationError  # noqa: E402
from intrinsics.launch import launch  # noqa: E402
from intrinsics.mbarrier import (  # noqa: E402
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster,
    mbarrier_arrive_expect_tx,
    mbarrier_complete_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_wait_parity,
)
from intrinsics.setmaxnreg import setmaxnreg_dec, setmaxnreg_inc  # noqa: E402
from intrinsics.tensormap import TensorMap  # noqa: E402
from intrinsics.tma import (  # noqa: E402
    bulk_commit_group,
    bulk_copy_s2g,
    bulk_reduce_add_f32,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_load_im2col,
    tma_load_multicast,
    tma_store,
)

WHERE0 = r"block \(0, 0, 0\) warp 0 lane 0"
ADDRESS = r"shared address 0x[0-9a-f]+"


@pytest.fixture
def quick_deadlock(monkeypatch):
    """Deadlocks are reported after 0.5 s without progress instead of 2 s."""
    monkeypatch.setattr(runtime, "DEADLOCK_SECONDS", 0.5)


def run(kernel, *args, grid=1, block=32, shared_bytes=0, cluster=None):
    launch(kernel, grid, block, args, shared_bytes=shared_bytes, cluster=cluster)


# ---------------------------------------------------------------------------------------------
# mbarrier
# ---------------------------------------------------------------------------------------------


@cuda.jit
def _mbarrier_misuse(case, out):
    bars = cuda.shared.array(2, np.uint64)
    if cuda.threadIdx.x == 0:
        if case == 0:  # used before init
            mbarrier_arrive(bars, 0)
        if case == 1:  # used after inval
            mbarrier_init(bars, 0, 1)
            mbarrier_inval(bars, 0)
            mbarrier_test_wait_parity(bars, 0, 0)
        if case == 2:  # initialised twice
            mbarrier_init(bars, 0, 1)
            mbarrier_init(bars, 0, 2)
        if case == 3:  # a second arrival while the phase still waits for its bytes
            mbarrier_init(bars, 0, 1)
            mbarrier_arrive_expect_tx(bars, 0, 1024)
            mbarrier_arrive(bars, 0)
        if case == 4:  # more bytes than expect_tx promised
            mbarrier_init(bars, 0, 1)
            mbarrier_arrive_expect_tx(bars, 0, 1000)
            mbarrier_complete_tx(bars, 0, 1024)
        if case == 5:  # a state from another barrier
            mbarrier_init(bars, 0, 2)
            mbarrier_init(bars, 1, 2)
            state = mbarrier_arrive(bars, 0)
            out[0] = mbarrier_test_wait(bars, 1, state)
        if case == 6:  # a state from two phases ago
            mbarrier_init(bars, 0, 1)
            state = mbarrier_arrive(bars, 0)
            mbarrier_arrive(bars, 0)
            mbarrier_arrive(bars, 0)
            out[0] = mbarrier_test_wait(bars, 0, state)


@pytest.mark.parametrize("case, message", [
    (0, rf"{WHERE0}: mbarrier.arrive: no mbarrier at {ADDRESS} of block \(0, 0, 0\): the "
        r"object was never initialised \(mbarrier.init\)"),
    (1, rf"{WHERE0}: mbarrier.test_wait.parity: no mbarrier at {ADDRESS} .* was invalidated"),
    (2, rf"{WHERE0}: mbarrier.init: mbarrier at {ADDRESS} .* is still valid"),
    (3, rf"{WHERE0}: mbarrier.arrive: 1 arrival\(s\) on mbarrier at {ADDRESS} .*: 0 of 1 "
        r"arrivals pending, tx-count 1024\): more arrivals than are pending"),
    (4, rf"{WHERE0}: mbarrier.complete_tx: mbarrier at {ADDRESS} .*tx-count -24\): every "
        r"arrival of the phase is in but 24 more transaction bytes completed than were expected"),
    (5, rf"{WHERE0}: mbarrier.test_wait: state 0x[0-9a-f]+ was not returned by an arrive on "
        rf"mbarrier at {ADDRESS}"),
    (6, rf"{WHERE0}: mbarrier.test_wait: the state is from phase 0 of mbarrier at {ADDRESS} "
        r".*phase 3.*current or the immediately preceding phase"),
], ids=["before-init", "after-inval", "init-twice", "arrive-underflow", "too-many-bytes",
        "foreign-state", "stale-state"])
def test_mbarrier_misuse(case, message):
    with pytest.raises(EmulationError, match=message):
        run(_mbarrier_misuse, case, np.zeros(1, np.int32))


@cuda.jit
def _never_completes(expect, complete, poll):
    """Thread 0 arms a count-``2`` barrier with ``expect`` bytes and completes ``complete``; only
    thread 0 arrives, so the phase needs a second arrival that never comes (and the bytes)."""
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1 if expect else 2)
        mbarrier_arrive_expect_tx(bars, 0, expect)
        mbarrier_complete_tx(bars, 0, complete)
    cuda.syncthreads()
    if poll:
        while not mbarrier_test_wait_parity(bars, 0, 0):
            cuda.nanosleep(100)
    else:
        mbarrier_wait_parity(bars, 0, 0)


@pytest.mark.parametrize("poll", [False, True], ids=["wait", "poll-loop"])
def test_bytes_that_never_come_deadlock(poll, quick_deadlock):
    with pytest.raises(EmulationError) as info:
        run(_never_completes, 2048, 1024, poll)
    text = str(info.value)
    assert text.startswith("deadlock: no thread can make progress")
    # Every waiter is listed with the barrier's live state: the bytes still owed.
    assert "block (0, 0, 0) warp 0 lane 0:" in text
    assert "0 of 1 arrivals pending, tx-count 1024" in text
    assert ("polls mbarrier.test_wait.parity 0" if poll else "wait_parity 0") in text


def test_wait_on_a_phase_that_never_completes(quick_deadlock):
    with pytest.raises(EmulationError) as info:
        run(_never_completes, 0, 0, False)
    text = str(info.value)
    assert text.startswith("deadlock: no thread can make progress")
    assert "waits on wait_parity 0 of mbarrier at shared address" in text
    assert "1 of 2 arrivals pending, tx-count 0" in text


@cuda.jit
def _remote_arrive_outside(out):
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()
    cluster_sync()
    if cuda.threadIdx.x == 0 and cluster_ctarank() == 0:
        mbarrier_arrive_cluster(bars, 0, 2)
    cluster_sync()


def test_remote_arrive_outside_the_cluster():
    with pytest.raises(EmulationError, match=rf"{WHERE0}: .*: CTA rank 2 is not in the cluster "
                                             r"of 2 CTAs"):
        run(_remote_arrive_outside, np.zeros(1), grid=2, cluster=(2, 1, 1))


# ---------------------------------------------------------------------------------------------
# Cluster barrier, elect.sync, setmaxnreg
# ---------------------------------------------------------------------------------------------


@cuda.jit
def _cluster_misuse(case):
    if case == 0:
        cluster_wait()
    else:
        cluster_arrive()
        cluster_arrive()


@pytest.mark.parametrize("case, message", [
    (0, "barrier.cluster.wait without a preceding barrier.cluster.arrive"),
    (1, "second barrier.cluster.arrive without a barrier.cluster.wait"),
], ids=["wait-first", "arrive-twice"])
def test_cluster_barrier_misuse(case, message):
    with pytest.raises(EmulationError, match=rf"{WHERE0}: barrier.cluster.*{message}"):
        run(_cluster_misuse, case, grid=2, cluster=(2, 1, 1))


@cuda.jit
def _cluster_barrier_skipped(out):
    # block rank 1's warp 1 never arrives and never exits: the others wait forever
    if cluster_ctarank() == 1 and cuda.threadIdx.x >= 32:
        cuda.syncthreads()
    else:
        cluster_sync()
        cuda.syncthreads()


def test_cluster_wait_deadlock_names_the_missing_threads(quick_deadlock):
    with pytest.raises(EmulationError) as info:
        run(_cluster_barrier_skipped, np.zeros(1), grid=2, block=64, cluster=(2, 1, 1))
    text = str(info.value)
    assert text.startswith("deadlock")
    assert ("barrier.cluster.wait (phase 0): 32 of 128 threads of the cluster have not "
            "arrived, first block (1, 0, 0) warp 1 lane 0") in text


@cuda.jit
def _partial_elect(out):
    if cuda.threadIdx.x < 16:
        out[cuda.threadIdx.x] = elect_sync()


def test_elect_sync_by_part_of_a_warp():
    with pytest.raises(EmulationError, match=r"elect.sync is a warp-collective, called by lanes "
                                             r"0-15 only; lanes 16-31 did not call it"):
        run(_partial_elect, np.zeros(32, np.int32))


@cuda.jit
def _setmaxnreg_mismatch(out):
    if cuda.threadIdx.x < 96:
        setmaxnreg_dec(40)
    else:
        setmaxnreg_dec(56)


def test_setmaxnreg_counts_differ_in_a_warpgroup():
    with pytest.raises(EmulationError,
                       match=r"block \(0, 0, 0\) warp \d lane \d+: "
                             r"setmaxnreg.dec.sync.aligned.u32: the warps of one warpgroup must "
                             r"execute it with the same register count, got warp\(s\) "
                             r"\[0, 1, 2\] of the warpgroup with 40; warp\(s\) \[3\] of the "
                             r"warpgroup with 56"):
        run(_setmaxnreg_mismatch, np.zeros(1), block=128)


def _split(producer, consumer):
    @cuda.jit
    def kernel(out):
        t = cuda.threadIdx.x
        if t < 128:
            setmaxnreg_dec(producer)
        else:
            setmaxnreg_inc(consumer)
        cuda.syncthreads()
        out[t] = 1
    return kernel


def test_setmaxnreg_split_within_the_pool_runs():
    # 384 threads start with 168 registers each: 24 / 240 gives back exactly what is taken, and
    # the consumers' .inc waits for the producer's .dec wherever it comes first
    out = np.zeros(384)
    run(_split(24, 240), out, block=384)
    assert (out == 1).all()


def test_setmaxnreg_split_beyond_the_pool_deadlocks(quick_deadlock):
    # 32 / 240: the producer gives 128 x 136 = 17408 registers back, the consumers ask for
    # 256 x 72 = 18432 -- on the GPU some consumer warps would wait forever
    with pytest.raises(EmulationError, match=r"deadlock(.|\n)*setmaxnreg.inc.sync.aligned.u32 240: "
                                             r"72 registers a thread from the block's pool"):
        run(_split(32, 240), np.zeros(384), block=384)


# ---------------------------------------------------------------------------------------------
# TMA and bulk copies
# ---------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _aligned(dyn):
    from intrinsics.smem import shared_address

    base = shared_address(dyn, 0)
    return (1024 - (base & 1023)) & 1023


@cuda.jit
def _tma_load_case(tmap, shift, expect, status):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1)
        mbarrier_arrive_expect_tx(bars, 0, expect)
        tma_load(dyn, pad + shift, tmap, (0, 0), bars, 0)
    cuda.syncthreads()
    mbarrier_wait_parity(bars, 0, 0)
    status[0] = 1


def _tmap(swizzle, box=(8, 32), fill=None):
    tensor = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    source = cuda.to_device(tensor if fill is None else np.full_like(tensor, fill))
    return TensorMap.tiled(source, box, swizzle=swizzle)


@pytest.mark.parametrize("swizzle, shift, need", [
    (0, 16, "128 bytes"), (32, 128, "256 bytes"), (64, 256, "512 bytes"), (128, 512, "1024 bytes"),
])
def test_tma_destination_misaligned(swizzle, shift, need):
    tmap = _tmap(swizzle, box=(8, swizzle // 4 or 8))
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: cp.async.bulk.tensor.2d.*: the shared-memory box at "
                             rf"address 0x[0-9a-f]+ is not aligned to {need}"):
        run(_tma_load_case, tmap.device, shift, tmap.box_bytes, np.zeros(1, np.int32),
            shared_bytes=4096)


def test_tma_bytes_beyond_expect_tx():
    tmap = _tmap(128)
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: cp.async.bulk.tensor.2d.*: mbarrier at {ADDRESS} .*"
                             r"16 more transaction bytes completed than were expected"):
        run(_tma_load_case, tmap.device, 0, tmap.box_bytes - 16, np.zeros(1, np.int32),
            shared_bytes=4096)


def test_tma_bytes_short_of_expect_tx_deadlock(quick_deadlock):
    tmap = _tmap(128)
    with pytest.raises(EmulationError, match=r"deadlock(.|\n)*0 of 1 arrivals pending, "
                                             r"tx-count 32"):
        run(_tma_load_case, tmap.device, 0, tmap.box_bytes + 32, np.zeros(1, np.int32),
            shared_bytes=4096)


@cuda.jit
def _multicast_uninitialised_peer(tmap, nbytes):
    dyn = cuda.shared.array(0, np.uint8)
    bars = cuda.shared.array(1, np.uint64)
    pad = _aligned(dyn)
    rank = cluster_ctarank()
    if cuda.threadIdx.x == 0 and rank == 0:  # only rank 0 initialises its barrier
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()
    cluster_sync()
    if cuda.threadIdx.x == 0 and rank == 0:
        mbarrier_arrive_expect_tx(bars, 0, nbytes)
        tma_load_multicast(dyn, pad, tmap, (0, 0), bars, 0, 0b11)
    cluster_sync()


def test_multicast_into_a_peer_without_barrier():
    tmap = _tmap(128)
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: .*multicast::cluster: no mbarrier at {ADDRESS} of "
                             r"block \(1, 0, 0\): the object was never initialised"):
        run(_multicast_uninitialised_peer, tmap.device, tmap.box_bytes, grid=2,
            shared_bytes=4096, cluster=(2, 1, 1))


@cuda.jit
def _store_case(tmap, fence, image):
    dyn = cuda.shared.array(0, np.uint8)
    pad = _aligned(dyn)
    for i in range(cuda.threadIdx.x, image.size, cuda.blockDim.x):
        dyn[pad + i] = image[i]
    if fence:
        fence_proxy_async_shared()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tma_store(tmap, (0, 0), dyn, pad)
        bulk_commit_group()
        bulk_wait_group_read(0)


def test_tma_store_reads_unfenced_stores():
    tmap = _tmap(0)
    image = np.arange(tmap.box_bytes, dtype=np.uint8)
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: cp.async.bulk.tensor.2d.global.shared::cta.bulk_group "
                             r"reads shared address \d+, which thread \d+ \(warp \d+ lane \d+\) "
                             r"wrote with an ordinary store and did not order with "
                             r"fence.proxy.async"):
        run(_store_case, tmap.device, False, image, shared_bytes=4096)
    run(_store_case, tmap.device, True, image, shared_bytes=4096)  # fenced: fine
    got = tmap.tensor.copy_to_host()[:8, :32]
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), image)


@cuda.jit
def _overwrite_before_read_wait(out, overwrite):
    dyn = cuda.shared.array(0, np.uint8)
    pad = _aligned(dyn)
    if cuda.threadIdx.x == 0:
        bulk_copy_s2g(out, 0, dyn, pad, 64)
        bulk_commit_group()
        if overwrite:
            dyn[pad + 5] = 7
        bulk_wait_group_read(0)


def test_bulk_store_source_overwritten_before_its_read_wait():
    out = np.zeros(64, np.uint8)
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: cp.async.bulk.wait_group.read 0: the shared memory "
                             r"that cp.async.bulk.global.shared::cta.bulk_group reads was "
                             r"overwritten \(first at shared address 0x[0-9a-f]+\) before this "
                             r"wait"):
        run(_overwrite_before_read_wait, out, True, shared_bytes=2048)
    run(_overwrite_before_read_wait, out, False, shared_bytes=2048)


@cuda.jit
def _reduce_case(acc, x, fence):
    # 32 threads write x[t] + block into shared memory; thread 0 adds the 32 values into acc
    f = cuda.shared.array(32, np.float32, alignment=16)
    t = cuda.threadIdx.x
    f[t] = x[t] + np.float32(cuda.blockIdx.x)
    if fence:
        fence_proxy_async_shared()
    cuda.syncthreads()
    if t == 0:
        bulk_reduce_add_f32(acc, 0, f, 0, 128)
        bulk_commit_group()
        bulk_wait_group(0)


def test_bulk_reduction_adds_float32_and_reads_fenced_stores():
    x = np.linspace(-1, 1, 32).astype(np.float32)
    acc = np.full(32, 0.5, np.float32)
    run(_reduce_case, acc, x, True, grid=3)  # three blocks, each adding its values
    want = np.float32(0.5)
    for blk in range(3):
        want = want + (x + np.float32(blk))
    np.testing.assert_array_equal(acc, want)
    with pytest.raises(EmulationError,
                       match=rf"{WHERE0}: cp.reduce.async.bulk.global.shared::cta.bulk_group."
                             r"add.f32 reads shared address \d+, which thread \d+"):
        run(_reduce_case, acc, x, False)


@cuda.jit
def _im2col(tmap, c, out):
    dyn = cuda.shared.array(0, np.uint16, alignment=1024)
    bars = cuda.shared.array(1, np.uint64, alignment=8)
    t = cuda.threadIdx.x
    if t == 0:
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        mbarrier_arrive_expect_tx(bars, 0, c[6])
        tma_load_im2col(dyn, 0, tmap, (c[0], c[1], c[2], c[3]), (np.uint16(c[4]), np.uint16(c[5])),
                        bars, 0)
    mbarrier_wait_parity(bars, 0, 0)
    for i in range(t, out.size, cuda.blockDim.x):
        out[i] = dyn[i]


def test_im2col_follows_the_convolution_window():
    """PTX ISA 5.5.4's model, checked against a convolution written directly: NHWC input, a 3x3
    filter with padding 1 (bounding box corners -1 / -1), 32 pixels from filter base (h, w) =
    (-1, -1) of image 0 (the box has 5 x 6 positions, so the last two pixels are image 1's), and
    im2col offsets (filter tap) (r, s) = (1, 2).  Unverified on hardware (TMA tensor copies fault
    on the lent H200)."""
    n_img, h, w, ch = 2, 5, 6, 16
    x = np.random.default_rng().integers(1, 60000, (n_img, h, w, ch)).astype(np.uint16)
    tmap = TensorMap.im2col(cuda.to_device(x), channels_per_pixel=16, pixels_per_column=32,
                            lower_corner=(-1, -1), upper_corner=(-1, -1))
    r, s_ = 1, 2
    coords = np.array([0, -1, -1, 0, s_, r, tmap.box_bytes], dtype=np.int32)  # c, w, h, n, offsets
    out = np.zeros(32 * ch, np.uint16)
    run(_im2col, tmap.device, coords, out, shared_bytes=2048)
    expected = np.zeros((32, ch), np.uint16)
    positions = [(n, oh - 1, ow - 1) for n in range(n_img) for oh in range(h) for ow in range(w)]
    for p, (n, bh, bw) in enumerate(positions[:32]):
        yy, xx = bh + r, bw + s_
        if 0 <= yy < h and 0 <= xx < w:
            expected[p] = x[n, yy, xx]
    np.testing.assert_array_equal(out.reshape(32, ch), expected)
