"""Emulation of intrinsics.cluster: fences, elect.sync, the cluster special registers, the
cluster barrier and distributed shared memory.

- ``elect_sync``: a warp collective (all 32 lanes meet); the lowest lane is elected.
- ``fence_proxy_async`` / ``fence_proxy_async_shared``: this thread's ordinary shared-memory
  stores become visible to the async proxy (``SharedSpace.fence_proxy_async``), which TMA
  stores and wgmma then check.  ``fence_proxy_async_global`` orders global memory only, so it
  leaves shared-memory stores unfenced.  ``fence_acq_rel_cluster``: no effect (the emulation's
  memory is sequentially consistent).
- Special registers from the block's Cluster: ``%cluster_ctarank`` = x + nx * (y + ny * z) of
  the block's position in its cluster, ``%clusterid`` the cluster's position in the grid.
- ``cluster_arrive`` / ``cluster_wait`` (``barrier.cluster``, PTX ISA 9.7.13.3): every thread
  counts its arrivals; a wait returns once every thread of every block of the cluster has arrived
  as often as the waiter (threads that exited count as arrived).  A thread must alternate
  arrive and wait: two arrives in a row, or a wait without an arrive, is an EmulationError.
- Distributed shared memory: the emulation's ``.shared::cluster`` window.  Addresses below
  ``1 << 24`` are the executing CTA's own ``.shared::cta`` window (PTX: the CTA's shared window
  lies inside the cluster window); CTA rank ``r``'s shared memory sits at
  ``(r + 1) << 24 | offset``.  ``map_shared_rank`` returns such an address and
  :func:`resolve_cluster_address` maps one back to (block, offset); ``dsmem_load_*`` /
  ``dsmem_store_*`` go through it to the other block's SharedSpace.  Touching the shared memory of
  a CTA whose threads have all exited is an EmulationError (its shared memory is gone).
  DSMEM stores are not tracked for the async-proxy check.
"""

import numpy as np

from intrinsics.emulate import memory
from intrinsics.emulate.mbarrier import Live, quiet_wait
from intrinsics.emulate.runtime import EmulationError, collective, current

__all__ = ["CLUSTER_WINDOW_SHIFT", "peer_block", "resolve_cluster_address"]

CLUSTER_WINDOW_SHIFT = 24  # each CTA's window in the emulated .shared::cluster space


# ---------------------------------------------------------------------------------------------
# Fences and elect.sync
# ---------------------------------------------------------------------------------------------


def fence_proxy_async():
    thread = current()
    thread.block.shared.fence_proxy_async(thread)


def fence_proxy_async_shared():
    thread = current()
    thread.block.shared.fence_proxy_async(thread)


def fence_proxy_async_global():
    current()  # global memory is not tracked; shared-memory stores stay unfenced


def fence_acq_rel_cluster():
    current()


def elect_sync():
    def compute(lanes):
        leader = min(lanes)
        return [lane == leader for lane in range(32)]

    return bool(collective("warp", "elect.sync", None, compute))


# ---------------------------------------------------------------------------------------------
# Special registers
# ---------------------------------------------------------------------------------------------


def _u32x3(values):
    return tuple(np.uint32(v) for v in values)


def _local(thread):
    """(the block's position in its cluster, the cluster shape)."""
    shape = thread.launch.cluster_dim
    return tuple(i % c for i, c in zip(thread.block.index, shape)), shape


def cluster_ctarank():
    thread = current()
    (x, y, z), (nx, ny, _) = _local(thread)
    return np.uint32(x + nx * (y + ny * z))


def cluster_nctarank():
    nx, ny, nz = current().launch.cluster_dim
    return np.uint32(nx * ny * nz)


def cluster_ctaid():
    return _u32x3(_local(current())[0])


def cluster_nctaid():
    return _u32x3(current().launch.cluster_dim)


def cluster_id():
    thread = current()
    return _u32x3(i // c for i, c in zip(thread.block.index, thread.launch.cluster_dim))


def cluster_nclusterid():
    launch = current().launch
    return _u32x3(g // c for g, c in zip(launch.grid_dim, launch.cluster_dim))


# ---------------------------------------------------------------------------------------------
# The cluster barrier
# ---------------------------------------------------------------------------------------------


def _barrier_state(thread):
    """Per cluster: each thread's arrivals and completed waits, how many threads have arrived at
    least k times (``count[k]``), the threads waiters have seen exited, and per phase the
    launch.progress of the last look for exited threads with its answer (``scans``: shared by
    the waiters, one look per change instead of one per waiter)."""
    return thread.block.cluster.once(
        "barrier.cluster",
        lambda: {"arrived": {}, "waited": {}, "count": {}, "exited": set(), "scans": {}})


def _arrive(op):
    thread = current()
    launch = thread.launch
    with launch.cond:
        state = _barrier_state(thread)
        arrived = state["arrived"].get(thread, 0)
        if arrived != state["waited"].get(thread, 0):
            raise EmulationError(
                f"{thread.where()}: {op}: second barrier.cluster.arrive without a "
                "barrier.cluster.wait after the first (each thread alternates arrive and wait)"
            )
        state["arrived"][thread] = arrived + 1
        count = state["count"][arrived + 1] = state["count"].get(arrived + 1, 0) + 1
        launch.progress += 1
        # Waiters only care about the last arrival (exits wake them through the runtime).
        if count + len(state["exited"]) >= len(thread.block.cluster_threads()):
            launch.cond.notify_all()


def _wait(op):
    thread = current()
    launch = thread.launch
    members = thread.block.cluster_threads()
    with launch.cond:
        state = _barrier_state(thread)
        target = state["arrived"].get(thread, 0)
        if target != state["waited"].get(thread, 0) + 1:
            raise EmulationError(
                f"{thread.where()}: {op}: barrier.cluster.wait without a preceding "
                "barrier.cluster.arrive (each thread alternates arrive and wait)"
            )
    arrived, count, exited, scans = (state[k] for k in ("arrived", "count", "exited", "scans"))

    def missing():
        exited.update(t for t in members if t.finished)
        return [t for t in members if not t.finished and arrived.get(t, 0) < target]

    def ready():
        if count.get(target, 0) == len(members):
            return True
        # Threads that exited count as arrived; look for them only when something changed.
        seen = scans.get(target)
        if seen is None or seen[0] != launch.progress:
            seen = scans[target] = (launch.progress, not missing())
        return seen[1]

    def what():
        late = missing()
        first = f", first {late[0].where()}" if late else ""
        return (f"barrier.cluster.wait (phase {target - 1}): {len(late)} of {len(members)} "
                f"threads of the cluster have not arrived{first}")

    quiet_wait(thread, ready, Live(what))
    with launch.cond:
        state["waited"][thread] = target


def cluster_arrive():
    _arrive("barrier.cluster.arrive.release.aligned")


def cluster_arrive_relaxed():
    _arrive("barrier.cluster.arrive.relaxed.aligned")


def cluster_wait():
    _wait("barrier.cluster.wait.acquire.aligned")


def cluster_sync():
    _arrive("barrier.cluster.arrive.release.aligned")
    _wait("barrier.cluster.wait.acquire.aligned")


# ---------------------------------------------------------------------------------------------
# Distributed shared memory
# ---------------------------------------------------------------------------------------------


def peer_block(thread, cta_rank, op, alive=True):
    """The block of rank ``cta_rank`` in ``thread``'s cluster (still running, if ``alive``)."""
    blocks = thread.block.cluster.blocks
    rank = int(cta_rank)
    if not 0 <= rank < len(blocks):
        raise EmulationError(f"{thread.where()}: {op}: CTA rank {rank} is not in the cluster of "
                             f"{len(blocks)} CTAs (ranks 0..{len(blocks) - 1})")
    block = blocks[rank]
    if alive and block.threads and all(t.finished for t in block.threads):
        raise EmulationError(
            f"{thread.where()}: {op}: CTA rank {rank} (block {tuple(block.index)}) has exited, "
            "and its shared memory with it; end kernels that touch peers' shared memory with a "
            "cluster barrier"
        )
    return block


def resolve_cluster_address(thread, address, op):
    """(block, shared offset) of an emulated ``.shared::cluster`` address."""
    address = int(address)
    window = address >> CLUSTER_WINDOW_SHIFT
    offset = address & ((1 << CLUSTER_WINDOW_SHIFT) - 1)
    block = thread.block if window == 0 else peer_block(thread, window - 1, op)
    return block, offset


def map_shared_rank(array, index, cta_rank):
    op = "mapa.shared::cluster"
    thread = current()
    peer_block(thread, cta_rank, op, alive=False)  # a rank outside the cluster is an error
    address = memory.shared_address(array, index)
    return np.uint32((int(cta_rank) + 1) << CLUSTER_WINDOW_SHIFT | address)


def _remote_word(op, array, index, cta_rank):
    thread = current()
    address = map_shared_rank(array, index, cta_rank)
    block, offset = resolve_cluster_address(thread, address, op)
    if offset % 4:
        raise EmulationError(f"{thread.where()}: {op}: shared address {offset:#x} is not 4-byte "
                             "aligned")
    try:
        return block.shared.bytes(offset, 4)
    except EmulationError as exc:
        raise EmulationError(f"{thread.where()}: {op}: {exc}") from None


def _dsmem_load(kind):
    dtype = {"u32": np.uint32, "f32": np.float32}[kind]
    op = f"ld.shared::cluster.b32 (dsmem_load_{kind})"

    def load(array, index, cta_rank):
        return _remote_word(op, array, index, cta_rank).view(dtype)[0]

    load.__name__ = f"dsmem_load_{kind}"
    return load


def _as_u32(value):
    if isinstance(value, (float, np.floating)):
        value = int(value)  # fptoui: truncation toward zero
    return np.uint32(int(value) & 0xFFFFFFFF)


def _dsmem_store(kind):
    op = f"st.shared::cluster.b32 (dsmem_store_{kind})"

    def store(array, index, cta_rank, value):
        word = _remote_word(op, array, index, cta_rank)
        bits = np.float32(value) if kind == "f32" else _as_u32(value)
        word[:] = np.frombuffer(bits.tobytes(), dtype=np.uint8)

    store.__name__ = f"dsmem_store_{kind}"
    return store


EMULATIONS = {
    "cluster_arrive": cluster_arrive,
    "cluster_arrive_relaxed": cluster_arrive_relaxed,
    "cluster_ctaid": cluster_ctaid,
    "cluster_ctarank": cluster_ctarank,
    "cluster_id": cluster_id,
    "cluster_nclusterid": cluster_nclusterid,
    "cluster_nctaid": cluster_nctaid,
    "cluster_nctarank": cluster_nctarank,
    "cluster_sync": cluster_sync,
    "cluster_wait": cluster_wait,
    "dsmem_load_f32": _dsmem_load("f32"),
    "dsmem_load_u32": _dsmem_load("u32"),
    "dsmem_store_f32": _dsmem_store("f32"),
    "dsmem_store_u32": _dsmem_store("u32"),
    "elect_sync": elect_sync,
    "fence_acq_rel_cluster": fence_acq_rel_cluster,
    "fence_proxy_async": fence_proxy_async,
    "fence_proxy_async_global": fence_proxy_async_global,
    "fence_proxy_async_shared": fence_proxy_async_shared,
    "map_shared_rank": map_shared_rank,
}
