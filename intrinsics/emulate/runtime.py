"""The emulation runtime: runs a kernel under Numba's CUDA simulator with what tensor-core code
needs and the simulator lacks.

numba-cuda's simulator runs each thread of a block as a Python thread, one block after another,
with one shared-memory pool per launch and only ``syncthreads`` as a rendezvous.  This runtime
replaces its launch loop (``install()``) and adds:

- per-block shared memory with real 32-bit addresses (``SharedSpace``), so that addresses,
  swizzles and matrix descriptors resolve to arrays; ``alignment=`` is honoured;
- rendezvous of a warp or a warpgroup (``collective``): every lane deposits its operands, the last
  one to arrive computes the result for all, and each lane takes its own;
- thread-block clusters: the blocks of a cluster run concurrently and see each other's shared
  memory;
- deadlock detection: when every live thread of a cluster waits (on syncthreads, a collective or an
  mbarrier) and nothing has changed for a while, the launch stops with an ``EmulationError`` that
  names what each thread waits on, instead of hanging;
- protocol errors as Python exceptions naming the block, warp, lane and object.

Instruction families add their semantics in ``intrinsics/emulate/<family>.py`` on top of these
pieces; kernels run unchanged (no ``if simulator`` inside kernels).
"""

import functools
import threading
import time

import numpy as np

__all__ = [
    "EmulationError",
    "SharedSpace",
    "collective",
    "current",
    "install",
    "launch",
    "notify_progress",
    "wait_until",
]

# How long every live thread may wait without any progress before the launch is declared
# deadlocked.  Progress is any arrival, completion or state change an emulated instruction
# reports through notify_progress().
DEADLOCK_SECONDS = 2.0


class EmulationError(RuntimeError):
    """A protocol mistake or deadlock found by the emulation (names block, warp, lane, object)."""


# ---------------------------------------------------------------------------------------------
# Shared memory with addresses
# ---------------------------------------------------------------------------------------------


class TrackedArray(np.ndarray):
    """A shared-memory array whose element stores are recorded as generic-proxy writes.

    The async proxy (TMA stores, wgmma operand reads, tcgen05) sees such writes only after the
    writing thread executes ``fence.proxy.async``; the emulation checks that (see
    ``SharedSpace.check_async_read``)."""

    def __setitem__(self, index, value):
        np.ndarray.__setitem__(self, index, value)
        space = getattr(self, "_space", None)
        if space is None:
            return
        thread = threading.current_thread()
        if not isinstance(thread, EmuThread):
            return
        lo, hi = _byte_range(self, index)
        space.dirty[lo - space.origin: hi - space.origin] = thread.thread_id + 1

    def __array_finalize__(self, obj):
        self._space = getattr(obj, "_space", None)


def _byte_range(array, index):
    """[lo, hi) absolute byte addresses touched by ``array[index] = ...``."""
    base = array.__array_interface__["data"][0]
    if isinstance(index, (int, np.integer)) and array.ndim == 1:
        i = int(index) + (array.shape[0] if index < 0 else 0)
        lo = base + i * array.strides[0]
        return lo, lo + array.itemsize
    if (isinstance(index, tuple) and len(index) == array.ndim
            and all(isinstance(i, (int, np.integer)) for i in index)):
        lo = base + sum((int(i) + (n if i < 0 else 0)) * st
                        for i, n, st in zip(index, array.shape, array.strides))
        return lo, lo + array.itemsize
    view = np.ndarray.__getitem__(array.view(np.ndarray), index)
    lo, hi = np.byte_bounds(view)
    return lo, hi


class SharedSpace:
    """One block's shared memory: arrays placed at 32-bit addresses, like the hardware's window.

    Every allocation is a NumPy array over a slice of one byte buffer, so that an address can be
    resolved back to the bytes behind it whatever array type wrote them.  ``dirty`` holds, per
    byte, 1 + the thread id of a generic-proxy store not yet followed by that thread's
    ``fence.proxy.async`` (0: clean).
    """

    SIZE = 232448  # 227 KB, Hopper's per-block maximum

    def __init__(self, dynamic_bytes):
        self.memory = np.zeros(self.SIZE, dtype=np.uint8)
        self.origin = self.memory.__array_interface__["data"][0]
        self.dirty = np.zeros(self.SIZE, dtype=np.int32)
        self.top = 0
        self.static = {}
        self.dynamic_bytes = dynamic_bytes
        self.dynamic_base = None
        # The threads of a block run as Python threads: each array is placed by the first thread
        # that reaches its declaration, and the check and the placement are one step under this
        # lock (without it two threads could each place their own copy of "the" array).
        self.lock = threading.Lock()

    def _tracked(self, raw):
        array = raw.view(TrackedArray)
        array._space = self
        return array

    def fence_proxy_async(self, thread):
        """``fence.proxy.async`` by ``thread``: its generic stores become visible to the async proxy."""
        self.dirty[self.dirty == thread.thread_id + 1] = 0

    def check_async_read(self, address, nbytes, what, reader):
        """EmulationError when the async proxy reads bytes a thread stored without a fence."""
        region = self.dirty[address: address + nbytes]
        if region.any():
            offset = int(np.flatnonzero(region)[0])
            writer = int(region[offset]) - 1
            raise EmulationError(
                f"{reader.where()}: {what} reads shared address {address + offset}, which thread "
                f"{writer} (warp {writer // 32} lane {writer % 32}) wrote with an ordinary store "
                "and did not order with fence.proxy.async before the barrier"
            )

    def _place(self, nbytes, alignment):
        base = -(-self.top // alignment) * alignment
        if base + nbytes > self.SIZE:
            raise EmulationError(
                f"shared memory exhausted: {base + nbytes} bytes needed, {self.SIZE} available"
            )
        self.top = base + nbytes
        return base

    def array(self, key, shape, dtype, alignment=None):
        dtype = np.dtype(dtype)
        alignment = max(alignment or dtype.itemsize, dtype.itemsize)
        if shape == 0:
            # Dynamic shared memory follows the static arrays (the hardware places it likewise);
            # 1024-byte aligned, as the widest swizzle needs.
            with self.lock:
                if self.dynamic_base is None:
                    self.dynamic_base = self._place(self.dynamic_bytes, 1024)
            count = self.dynamic_bytes // dtype.itemsize
            raw = self.memory[self.dynamic_base: self.dynamic_base + count * dtype.itemsize]
            return self._tracked(raw.view(dtype))
        with self.lock:
            array = self.static.get(key)
            if array is None:
                shape = (shape,) if np.isscalar(shape) else tuple(shape)
                nbytes = int(np.prod(shape)) * dtype.itemsize
                base = self._place(nbytes, alignment)
                array = self._tracked(self.memory[base: base + nbytes].view(dtype).reshape(shape))
                self.static[key] = array
        return array

    def address(self, array, index):
        """Shared address of ``array[index]``; EmulationError if ``array`` is not in this space."""
        base = array.__array_interface__["data"][0] - self.memory.__array_interface__["data"][0]
        if not 0 <= base < self.SIZE or not np.shares_memory(array, self.memory):
            raise EmulationError("the array is not in this block's shared memory")
        if isinstance(index, tuple):
            offset = sum(int(i) * s for i, s in zip(index, array.strides))
        else:
            offset = int(index) * array.strides[0]
        return base + offset

    def bytes(self, address, nbytes):
        """A writable uint8 view of ``nbytes`` at ``address``."""
        if address < 0 or address + nbytes > self.SIZE:
            raise EmulationError(f"shared address range [{address}, {address + nbytes}) is outside shared memory")
        return self.memory[address: address + nbytes]


# ---------------------------------------------------------------------------------------------
# Threads, blocks, clusters
# ---------------------------------------------------------------------------------------------


class _Dim3(tuple):
    def __new__(cls, x, y=1, z=1):
        return super().__new__(cls, (x, y, z))

    x = property(lambda self: self[0])
    y = property(lambda self: self[1])
    z = property(lambda self: self[2])


class EmuThread(threading.Thread):
    """One CUDA thread.  Offers what the simulator's kernel API reads from the current thread."""

    def __init__(self, block, thread_index, target):
        super().__init__(target=target, daemon=True)
        self.block = block
        self.launch = block.launch
        self.threadIdx = _Dim3(*thread_index)
        self.blockIdx = block.index
        bx, by, _ = block.launch.block_dim
        x, y, z = thread_index
        self.thread_id = x + bx * (y + by * z)
        self.warp = self.thread_id // 32
        self.lane = self.thread_id % 32
        self.waiting = None  # what this thread waits on, for deadlock reports
        self.finished = False
        self.exception = None
        self.state = {}  # per-thread state of the families (cp.async groups, bulk groups ...)

    def run(self):
        try:
            super().run()
        except BaseException as exc:  # reported by the launch, with the thread's position
            self.exception = exc
            with self.launch.cond:
                if self.launch.failed is None:  # the first failure is the cause
                    self.launch.failed = exc
        finally:
            with self.launch.cond:
                self.finished = True
                self.launch.progress += 1
                self.launch.cond.notify_all()

    def where(self):
        return f"block {tuple(self.blockIdx)} warp {self.warp} lane {self.lane}"

    # -- the simulator's kernel API reads these ------------------------------------------------
    def syncthreads(self):
        self.block.barrier(self)

    def syncthreads_count(self, value):
        return self.block.barrier(self, value, lambda vs: int(np.count_nonzero(vs)))

    def syncthreads_and(self, value):
        return self.block.barrier(self, value, lambda vs: int(all(vs)))

    def syncthreads_or(self, value):
        return self.block.barrier(self, value, lambda vs: int(any(vs)))


class _Rendezvous:
    """A reusable meeting point of a fixed set of threads (a block, a warp, a warpgroup, a
    cluster).  ``exits_ok``: threads that have exited count as arrived (bar.sync semantics);
    otherwise a member that exits while others wait is a protocol error."""

    def __init__(self, name, members, exits_ok=False):
        self.name = name
        self.members = members
        self.exits_ok = exits_ok
        self.values = {}
        self.results = {}
        self.generation = 0
        self.op = None
        self.compute = None


class Block:
    def __init__(self, launch, index, cluster):
        self.launch = launch
        self.index = _Dim3(*index)
        self.cluster = cluster
        self.shared = SharedSpace(launch.dynamic_bytes)
        self.threads = []
        self.meetings = {}
        self.state = {}  # per-block state of the families (mbarriers ...): create it with once()
        self.lock = threading.Lock()

    def once(self, key, factory):
        """``self.state[key]``, made by ``factory()`` the first time any thread of the block asks.

        Every piece of per-block state that threads create lazily goes through here: the check
        and the creation are one step under the block's lock, so the block gets exactly one."""
        with self.lock:
            value = self.state.get(key)
            if value is None:
                value = self.state[key] = factory()
        return value

    def meeting(self, key, members, name, exits_ok=False):
        with self.lock:
            meeting = self.meetings.get(key)
            if meeting is None:
                meeting = self.meetings[key] = _Rendezvous(name, members, exits_ok)
        return meeting

    def barrier(self, thread, value=None, reduce=None):
        meeting = self.meeting("block", self.threads, "block", exits_ok=True)

        def compute(values):
            result = reduce(list(values.values())) if reduce else None
            return dict.fromkeys(values, result)

        return self.launch.meet(thread, meeting, "syncthreads", value, compute)

    def cluster_threads(self):
        return [t for b in self.cluster.blocks for t in b.threads]


class Cluster:
    def __init__(self, index):
        self.index = index
        self.blocks = []
        self.meetings = {}
        self.state = {}  # per-cluster state of the families: create it with once()
        self.lock = threading.Lock()

    once = Block.once

    def rank_of(self, block):
        return self.blocks.index(block)


class Launch:
    """One kernel launch in the emulation."""

    def __init__(self, fn, grid_dim, block_dim, dynamic_bytes, cluster_dim):
        self.fn = fn
        self.grid_dim = tuple(grid_dim)
        self.block_dim = tuple(block_dim)
        self.dynamic_bytes = dynamic_bytes
        self.cluster_dim = tuple(cluster_dim)
        self.cond = threading.Condition()
        self.progress = 0
        self.failed = None

    # -- rendezvous ----------------------------------------------------------------------------
    def meet(self, thread, meeting, op, value, compute):
        """Deposit ``value``; once every member has arrived, ``compute(values)`` maps
        {thread: value} to {thread: result}.  Returns this thread's result."""
        with self.cond:
            if meeting.op is not None and meeting.op != op:
                raise EmulationError(
                    f"{thread.where()}: {op} met {meeting.op} at the same {meeting.name}: the "
                    f"threads of one {meeting.name} must execute the same collective"
                )
            meeting.op = op
            meeting.compute = compute
            meeting.values[thread] = value
            generation = meeting.generation
            self._try_complete(meeting)
            if meeting.generation == generation:
                thread.waiting = f"{op} ({meeting.name})"
                self._wait(thread, lambda: meeting.generation != generation,
                           poll=lambda: self._poll(thread, meeting, op))
                thread.waiting = None
            return meeting.results[thread]

    def _try_complete(self, meeting):
        expected = [m for m in meeting.members
                    if m in meeting.values or not (meeting.exits_ok and m.finished)]
        if all(m in meeting.values for m in expected) and meeting.values:
            meeting.results = meeting.compute(meeting.values)
            meeting.values = {}
            meeting.op = None
            meeting.generation += 1
            self.progress += 1
            self.cond.notify_all()

    def _poll(self, thread, meeting, op):
        if meeting.exits_ok:
            self._try_complete(meeting)
            return
        gone = [m for m in meeting.members if m not in meeting.values and m.finished]
        # only once no member may still call it: a lane that is merely slower than the ones
        # that exited must not be reported missing (the report would depend on the thread
        # timing); a member blocked elsewhere for good is the deadlock detector's to report
        if gone and all(m in meeting.values or m.finished for m in meeting.members):
            called = _ranges(sorted(m.lane for m in meeting.values))
            missing = _ranges(sorted(m.lane for m in meeting.members if m not in meeting.values))
            raise EmulationError(
                f"{thread.where()}: {op} is a {meeting.name}-collective, called by lanes "
                f"{called} only; lanes {missing} did not call it "
                f"({_ranges(sorted(m.lane for m in gone))} exited without it)"
            )

    def _wait(self, thread, ready, poll=None):
        """Wait (holding self.cond) until ready(); detect deadlocks and abandoned collectives."""
        mark = (self.progress, time.monotonic())
        while not ready():
            if self.failed is not None:
                raise EmulationError(f"{thread.where()}: stopped, another thread failed")
            self.cond.wait(0.02)
            if ready():
                break
            if poll is not None:
                poll()
                if ready():
                    break
            if self.progress != mark[0]:
                mark = (self.progress, time.monotonic())
            elif time.monotonic() - mark[1] > DEADLOCK_SECONDS:
                # Only now scan the cluster (a scan on every wake-up starves big blocks): a
                # thread still running (not waiting) may yet make progress.
                if any(t.waiting is None and not t.finished for t in thread.block.cluster_threads()):
                    mark = (self.progress, time.monotonic())
                else:
                    self._deadlock(thread)

    def _deadlock(self, thread):
        waiting = [t for t in thread.block.cluster_threads() if not t.finished]
        # every distinct wait first (one thread each), then the others, up to 32 lines
        firsts = {}
        for t in waiting:
            firsts.setdefault(t.waiting, t)
        shown = list(firsts.values())
        shown += [t for t in waiting if firsts[t.waiting] is not t][:max(0, 32 - len(shown))]
        shown = shown[:32]
        lines = "\n".join(f"  {t.where()}: waits on {t.waiting}" for t in shown)
        more = f"\n  ... and {len(waiting) - len(shown)} more" if len(waiting) > len(shown) else ""
        raise EmulationError(f"deadlock: no thread can make progress\n{lines}{more}")

    def wait_until(self, thread, ready, what):
        """Block ``thread`` until ``ready()`` (evaluated under the launch lock)."""
        with self.cond:
            thread.waiting = what
            self._wait(thread, ready)
            thread.waiting = None

    # -- running -------------------------------------------------------------------------------
    def run(self, args):
        grid, cdim = self.grid_dim, self.cluster_dim
        for g, c in zip(grid, cdim):
            if g % c:
                raise EmulationError(f"the cluster shape {cdim} must divide the grid {grid}")
        cluster_grid = tuple(g // c for g, c in zip(grid, cdim))
        for cluster_index in np.ndindex(*cluster_grid[::-1]):
            cluster_index = cluster_index[::-1]
            cluster = Cluster(cluster_index)
            for local in np.ndindex(*cdim[::-1]):
                local = local[::-1]
                index = tuple(ci * c + li for ci, c, li in zip(cluster_index, cdim, local))
                cluster.blocks.append(Block(self, index, cluster))
            self._run_cluster(cluster, args)

    def _run_cluster(self, cluster, args):
        fn = self.fn
        for block in cluster.blocks:
            for thread_index in np.ndindex(*self.block_dim[::-1]):
                block.threads.append(EmuThread(block, thread_index[::-1], lambda: fn(*args)))
        threads = block.cluster_threads()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures = [t for t in threads if t.exception is not None]
        if failures:
            # The first exception raised is the cause; the others stopped because of it.
            first = next((t for t in failures if t.exception is self.failed), None)
            if first is None:
                first = next((t for t in failures if not _is_echo(t.exception)), failures[0])
            exc = first.exception
            if isinstance(exc, EmulationError):
                raise exc
            raise type(exc)(f"{first.where()}: {exc}").with_traceback(exc.__traceback__)


def _ranges(numbers):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}-{n}" if n != start else f"{n}")
            start = None
    return ", ".join(out)


def _is_echo(exc):
    return isinstance(exc, EmulationError) and "another thread failed" in str(exc)


# ---------------------------------------------------------------------------------------------
# Helpers for the families
# ---------------------------------------------------------------------------------------------


def current():
    """The EmuThread running this code; EmulationError outside an emulated kernel."""
    thread = threading.current_thread()
    if not isinstance(thread, EmuThread):
        raise EmulationError(
            "an emulated intrinsic was called outside a kernel launched under the emulation"
        )
    return thread


def collective(scope, op, value, compute):
    """Meet the other threads of this warp (scope 'warp', 32 lanes) or warpgroup ('warpgroup',
    128 threads starting at a multiple of 4 warps).  ``compute`` maps {lane: value} to a list
    (lane order) or dict of results; each caller gets its own."""
    thread = current()
    block = thread.block
    if scope == "warp":
        key = ("warp", thread.warp)
        members = [t for t in block.threads if t.warp == thread.warp]
        if len(members) != 32:
            raise EmulationError(f"{thread.where()}: {op} needs a full warp of 32 threads, "
                                 f"this block's warp {thread.warp} has {len(members)}")
    elif scope == "warpgroup":
        group = thread.warp // 4
        key = ("warpgroup", group)
        members = [t for t in block.threads if t.warp // 4 == group]
        if len(members) != 128:
            raise EmulationError(f"{thread.where()}: {op} needs a warpgroup of 128 threads, "
                                 f"this block's warpgroup {group} has {len(members)}")
    else:
        raise ValueError(scope)
    meeting = block.meeting(key, members, scope)
    base = members[0].thread_id

    def by_lane(values):
        out = compute({t.thread_id - base: v for t, v in values.items()})
        if not isinstance(out, dict):
            out = dict(enumerate(out))
        return {t: out[t.thread_id - base] for t in values}

    return thread.launch.meet(thread, meeting, op, value, by_lane)


def notify_progress():
    """Tell waiting threads that some state changed (an arrival, a completed copy ...)."""
    launch = current().launch
    with launch.cond:
        launch.progress += 1
        launch.cond.notify_all()


def wait_until(ready, what):
    """Block the calling thread until ``ready()``; a deadlock is reported naming ``what``."""
    thread = current()
    thread.launch.wait_until(thread, ready, what)


# ---------------------------------------------------------------------------------------------
# Hooking into numba's simulator
# ---------------------------------------------------------------------------------------------


class _Shared:
    """``cuda.shared`` for the emulation: per block, with alignment."""

    def array(self, shape, dtype, alignment=None):
        import sys

        from numba import types as nbtypes
        from numba.np import numpy_support

        if isinstance(dtype, nbtypes.Type):
            dtype = numpy_support.as_dtype(dtype)
        # One array per declaration, as the compiler allocates: the declaring code object and
        # bytecode offset name it (two declarations on one source line are two arrays).
        frame = sys._getframe(1)
        key = (frame.f_code, frame.f_lasti)
        return current().block.shared.array(key, shape, dtype, alignment)


def launch(kernel, grid, block, args, shared_bytes=0, cluster=None):
    """Run a simulator kernel (``cuda.jit`` under NUMBA_ENABLE_CUDASIM) in the emulation."""
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, swapped_cuda_module

    def dims(value):
        value = (value,) if isinstance(value, int) else tuple(value)
        return value + (1,) * (3 - len(value))

    grid, block = dims(grid), dims(block)
    cluster = dims(cluster or 1)
    module = FakeCUDAModule(grid, block, shared_bytes)
    module._shared = _Shared()
    run = Launch(kernel.fn, grid, block, shared_bytes, cluster)
    writebacks = []
    fake_args = [_fake_arg(a, writebacks) for a in args]
    with simkernel._push_kernel_context(module):
        with swapped_cuda_module(kernel.fn, module):
            run.run(fake_args)
    for writeback in writebacks:
        writeback()


def _fake_arg(arg, writebacks):
    """Host arrays are copied in and back, as the simulator does for kernel[...] calls."""
    from numba.cuda.simulator.args import InOut
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray

    if isinstance(arg, np.ndarray) and arg.ndim > 0:
        arg = InOut(arg).to_device(writebacks)
    if isinstance(arg, FakeCUDAArray):
        return FakeWithinKernelCUDAArray(arg)
    return arg


# cuda.jit options that matter to code generation only; the simulator's jit rejects them, so the
# emulation drops them and the same kernel source runs in both.
_CODEGEN_ONLY = ("forceinline", "launch_bounds", "max_registers", "lineinfo", "inline")


@functools.cache
def install():
    """Route ``kernel[grid, block](...)`` launches of the simulator through this runtime, and let
    its ``cuda.jit`` accept the code-generation options real kernels use."""
    import numba.cuda
    import numba.cuda.simulator.api as simapi
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    original = FakeCUDAKernel.__call__

    def call(self, *args):
        if self._device or _in_kernel():
            return original(self, *args)
        launch(self, self.grid_dim, self.block_dim, args, self.dynshared_size)

    FakeCUDAKernel.__call__ = call

    simulator_jit = simapi.jit

    @functools.wraps(simulator_jit)
    def jit(func_or_sig=None, device=False, **options):
        for name in _CODEGEN_ONLY:
            options.pop(name, None)
        return simulator_jit(func_or_sig, device=device, **options)

    simapi.jit = jit
    numba.cuda.jit = jit
    # cuda.syncwarp (bar.warp.sync), which the simulator's kernel-side cuda module lacks: a
    # rendezvous of the warp's 32 lanes (a partial mask is not emulated)
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    FakeCUDAModule.syncwarp = lambda self, mask=0xFFFFFFFF: syncwarp(mask)


def syncwarp(mask=0xFFFFFFFF):
    if int(mask) & 0xFFFFFFFF != 0xFFFFFFFF:
        raise EmulationError(f"{current().where()}: syncwarp with mask {int(mask):#x}: only the "
                             "full warp (0xffffffff) is emulated")
    collective("warp", "bar.warp.sync", None, lambda values: [None] * 32)


def _in_kernel():
    return isinstance(threading.current_thread(), EmuThread)
