"""Emulation of cp.async: each thread's copies are queued, grouped by commit_group and carried
out by wait_group / wait_all -- so a kernel that reads shared memory before waiting sees the old
bytes, as it may on the hardware."""

from intrinsics.emulate import memory
from intrinsics.emulate.runtime import EmulationError, current, notify_progress
from intrinsics.cp_async import CP_ASYNC_FORMS


def _queue():
    state = current().state
    return state.setdefault("cp.async", {"pending": [], "groups": []})


def cp_async_op(size, cache=None, zfill=False):
    cache = cache or ("cg" if size == 16 else "ca")
    if (cache, size) not in CP_ASYNC_FORMS:
        valid = ", ".join(f"{c}/{s}" for c, s in CP_ASYNC_FORMS)
        raise ValueError(f"cp.async has no .{cache} form of {size} bytes; valid: {valid}")
    name = f"cp.async.{cache}.shared.global ({size} bytes)"

    def cp_async(dst, dst_index, src, src_index, src_bytes=None):
        thread = current()
        address = memory.shared_address(dst, dst_index)
        # The hardware reads only the first src_bytes (the rest of the copy is zero-filled).
        count = size if src_bytes is None else int(src_bytes)
        source = memory.global_bytes(src, src_index, count) if count > 0 else None
        if address % size:
            raise EmulationError(f"{thread.where()}: {name}: shared address {address} is not {size}-byte aligned")
        if source is not None and source.__array_interface__["data"][0] % size:
            raise EmulationError(f"{thread.where()}: {name}: the global address is not {size}-byte aligned")
        if not 0 <= count <= size:
            raise EmulationError(f"{thread.where()}: {name}: src_bytes must be 0..{size}, got {count}")
        _queue()["pending"].append((thread.block, address, source, count, size))

    cp_async.__name__ = name
    return cp_async


def _perform(copies):
    for block, address, source, count, size in copies:
        target = memory.shared_bytes(address, size, block)
        target[:count] = source[:count] if count else target[:0]
        target[count:] = 0


def cp_async_commit_group():
    queue = _queue()
    queue["groups"].append(queue["pending"])
    queue["pending"] = []


def cp_async_wait_group(n):
    queue = _queue()
    while len(queue["groups"]) > n:
        _perform(queue["groups"].pop(0))
    notify_progress()


def cp_async_wait_all():
    queue = _queue()
    for group in queue["groups"] + [queue["pending"]]:
        _perform(group)
    queue["groups"], queue["pending"] = [], []
    notify_progress()


def _mbarrier_arrive(noinc):
    def arrive(bars, index):
        """All of this thread's cp.async copies complete (they land now), then the arrive-on
        fires: counted against the expected arrivals with .noinc, balanced by a pending
        increment without it."""
        from intrinsics.emulate import mbarrier as emu_mbarrier

        queue = _queue()
        for group in queue["groups"] + [queue["pending"]]:
            _perform(group)
        queue["groups"], queue["pending"] = [], []
        op = "cp.async.mbarrier.arrive" + (".noinc" if noinc else "")
        if noinc:
            emu_mbarrier._arrive_op(op, bars, index)
        else:  # pending + 1, then the arrival: the count is unchanged; the barrier must exist
            thread = current()
            address = emu_mbarrier.barrier_address(op, bars, index)
            with thread.launch.cond:
                emu_mbarrier.barrier_at(thread, thread.block, address, op)
        notify_progress()

    return arrive


EMULATIONS = {
    "cp_async_mbarrier_arrive": _mbarrier_arrive(False),
    "cp_async_mbarrier_arrive_noinc": _mbarrier_arrive(True),
    "cp_async_commit_group": cp_async_commit_group,
    "cp_async_wait_group": cp_async_wait_group,
    "cp_async_wait_all": cp_async_wait_all,
}
EMULATIONS.update({name: cp_async_op(size, None if name.find("ca_") < 0 else "ca", zfill)
                   for name, size, zfill in [
                       ("cp_async_4", 4, False), ("cp_async_8", 8, False), ("cp_async_16", 16, False),
                       ("cp_async_ca_16", 16, False), ("cp_async_4_zfill", 4, True),
                       ("cp_async_8_zfill", 8, True), ("cp_async_16_zfill", 16, True)]})
FACTORIES = {"cp_async_op": cp_async_op}
