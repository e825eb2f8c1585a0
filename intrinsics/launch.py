"""Kernel launches that numba-cuda does not do by itself.

- Dynamic shared memory above 48 KB: the kernel's ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` attribute must be
  raised first (``cuKernelSetAttribute``); the limit on sm_90 is 227 KB per block.
- Thread-block clusters (sm_90+): numba's ``kernel[grid, block]`` has no cluster dimension; this
  launches through cuda.core's ``LaunchConfig(cluster=...)``.
- ``launch_bounds``: pass ``@cuda.jit(launch_bounds=(threads, 1))`` -- numba-cuda supports it, and
  ``setmaxnreg`` only takes effect with such a register cap.
- Whole-program compilation: numba links every kernel through nvJitLink, which compiles the PTX as
  relocatable code, and ptxas then drops ``setmaxnreg`` (info C7504, "ignored to maintain
  compatibility across compilation units").  A kernel whose PTX holds setmaxnreg is therefore
  loaded from its PTX by the driver's JIT, which compiles the whole program and keeps it
  (``whole_program=True`` forces this path for any kernel).

- Tensor maps passed by value (``TensorMap.param``, :mod:`intrinsics.grid_constant`): numba's
  and cuda.core's launches pass no 128-byte aggregate; :func:`launch` sends such a kernel through
  a prepared launch, which does.

``launch(kernel, grid, block, args, shared_bytes=0, cluster=None, stream=0)`` takes the grid in
blocks (as ``kernel[grid, block]`` does), whatever cuda.core version is installed.

``prepare(kernel, grid, block, signature, ...)`` returns a :class:`PreparedLaunch` for launching the
same kernel with the same grid again and again at the lowest host cost Python allows: the
arguments are packed with one ``struct.pack_into`` into a parameter buffer made once, and the
launch is one ``cuLaunchKernel`` call (about 2-3 microseconds of host time, against 50-150 for
numba's launch path, which builds a ctypes object per argument).
"""

import contextlib
import ctypes
import functools
import struct
import threading

import numpy as np

from numba import cuda

__all__ = ["LaunchError", "PreparedLaunch", "array_params", "compile_kernel", "compile_kernels",
           "flat_params",
           "has_param_blobs", "launch", "max_dynamic_shared_bytes", "prepare"]

_DEFAULT_DYNAMIC_LIMIT = 48 * 1024


class LaunchError(ValueError):
    """A launch configuration the hardware cannot run, named before the driver sees it."""


def _dim3(value, what):
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise LaunchError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return dims + (1,) * (3 - len(dims))


def max_dynamic_shared_bytes(device=None):
    """The most dynamic shared memory one block may opt in to on ``device`` (default: current)."""
    device = device or cuda.get_current_device()
    return device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


def _as_kernel_arg(value):
    # Foreign device arrays (torch, CuPy) become numba device arrays without a copy.
    if hasattr(value, "__cuda_array_interface__") and not cuda.is_cuda_array(value):
        return value
    if hasattr(value, "__cuda_array_interface__") and not isinstance(
        value, cuda.cudadrv.devicearray.DeviceNDArray
    ):
        return cuda.as_cuda_array(value)
    return value


@functools.lru_cache(maxsize=None)
def _cuda_core_grid_counts_clusters():
    # cuda.core 1.0 changed LaunchConfig.grid to count clusters when a cluster shape is given.
    from packaging import version
    from cuda import core

    return version.parse(core.__version__) >= version.parse("1.0.0")


def _set_kernel_attribute(core_kernel, device, attribute, value):
    from cuda.bindings import driver

    attr = getattr(driver.CUfunction_attribute, attribute)
    (err,) = driver.cuKernelSetAttribute(attr, value, core_kernel.handle, device.id)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"cuKernelSetAttribute({attribute}, {value}) failed: {err.name}")


def _kernel_attribute(core_kernel, device, attribute):
    from cuda.bindings import driver

    attr = getattr(driver.CUfunction_attribute, attribute)
    err, value = driver.cuKernelGetAttribute(attr, core_kernel.handle, device.id)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"cuKernelGetAttribute({attribute}) failed: {err.name}")
    return value


# PTX ISA versions to try when the driver's JIT is older than the NVVM that wrote the PTX (pip's
# NVVM 13.5 writes 9.5; a CUDA 13.0 driver reads up to 9.0).  NVVM writes its own newest version,
# not the oldest the kernel needs; everything the intrinsics emit exists in PTX 8.0 or later.
_PTX_VERSIONS = ["9.4", "9.3", "9.2", "9.1", "9.0", "8.8", "8.7", "8.6", "8.5", "8.4", "8.3",
                 "8.2", "8.1", "8.0"]
_WHOLE_PROGRAM = {}


def _whole_program_kernel(compiled, device):
    """The kernel loaded from its PTX by the driver's JIT (whole-program), cached."""
    import re

    from cuda.core import ObjectCode

    key = (id(compiled), device.id)
    if key in _WHOLE_PROGRAM:
        return _WHOLE_PROGRAM[key][1]
    ptx = compiled._codelibrary.get_asm_str()  # the device's target, with the 'a' from sm_90 on
    name = compiled._codelibrary._entry_name
    errors = []
    for version in [None] + _PTX_VERSIONS:
        text = ptx if version is None else re.sub(r"^\.version \S+", f".version {version}", ptx, flags=re.M)
        try:
            kernel = ObjectCode.from_ptx(text.encode(), name=name).get_kernel(name)
        except Exception as exc:  # the driver says which PTX it cannot read; try an older header
            errors.append(f"{version or 'as written'}: {exc}")
            if "PTX" not in str(exc) and "ptx" not in str(exc):
                break
            continue
        _WHOLE_PROGRAM[key] = (compiled, kernel)  # keep the compiled kernel alive with its key
        return kernel
    raise LaunchError("the driver could not JIT the kernel's PTX: " + "; ".join(errors[-3:]))


_PLANS = {}


def _launch_dims(grid, block, cluster):
    """(grid, block, cluster) as 3-tuples (cluster None when absent), or a LaunchError naming
    the rule broken: at most 1024 threads a block, a cluster shape that divides the grid and
    holds at most 16 blocks."""
    grid = _dim3(grid, "grid")
    block = _dim3(block, "block")
    if block[0] * block[1] * block[2] > 1024:
        raise LaunchError(f"a block has at most 1024 threads, got {block}")
    if cluster is not None:
        cluster = _dim3(cluster, "cluster")
        if any(g % c for g, c in zip(grid, cluster)):
            raise LaunchError(f"the cluster shape {cluster} must divide the grid {grid}")
        if cluster[0] * cluster[1] * cluster[2] > 16:
            raise LaunchError(f"a cluster has at most 16 blocks, got {cluster}")
    return grid, block, cluster


def launch(kernel, grid, block, args, shared_bytes=0, cluster=None, stream=0, whole_program=None,
           signature=None):
    """Launch a ``cuda.jit`` kernel with optional >48 KB dynamic shared memory and clusters.

    ``grid`` and ``block`` are block counts and thread counts (1-3 dims), ``args`` the kernel's
    arguments, ``shared_bytes`` the dynamic shared memory per block, ``cluster`` the cluster shape
    in blocks (each dimension must divide the grid's), ``stream`` a numba stream, 0, or a raw
    CUstream handle.
    ``whole_program``: load through the driver's whole-program JIT (default: when the kernel
    uses setmaxnreg, which nvJitLink's separate compilation drops).  ``signature``: the
    argument types to compile for (default: numba's typing of ``args``); give it to pass raw
    device pointers (ints) to ``types.CPointer`` parameters.

    The compiled kernel, its loaded function and its attributes are cached per (kernel,
    signature, shared memory, cluster), so a repeated launch only marshals the arguments.
    """
    grid, block, cluster = _launch_dims(grid, block, cluster)
    if shared_bytes < 0:
        raise LaunchError(f"shared_bytes must be >= 0, got {shared_bytes}")

    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:  # numba's simulator: the CPU emulation runs it
        from intrinsics.emulate.runtime import launch as emulated_launch

        return emulated_launch(kernel, grid, block, args, shared_bytes, cluster)

    from cuda.core import LaunchConfig, launch as core_launch

    if signature is None:
        args = tuple(_as_kernel_arg(a) for a in args)
        signature = tuple(kernel.typeof_pyval(a) for a in args)
    if has_param_blobs(signature):
        # cuda.core passes no 128-byte aggregate: a one-off prepared launch does
        prepared = prepare(kernel, grid, block, signature, shared_bytes, cluster, whole_program)
        if prepared is None:
            raise LaunchError(f"a kernel that takes a tensor map by value is launched through "
                              f"intrinsics.launch.prepare, which has no layout for {signature}")
        prepared(_stream_handle(stream), *flat_params(signature, args))
        return
    compiled, core_kernel = _plan_for(kernel, signature, shared_bytes, cluster, whole_program)

    core_grid = grid
    if cluster is not None and _cuda_core_grid_counts_clusters():
        core_grid = tuple(g // c for g, c in zip(grid, cluster))
    kernelargs = []
    retr = []
    for ty, value in zip(compiled.argument_types, args):
        compiled._prepare_args(ty, value, stream, retr, kernelargs)
    launch_config = LaunchConfig(grid=core_grid, cluster=cluster, block=block, shmem_size=shared_bytes)
    core_launch(_core_stream(stream), launch_config, core_kernel, *kernelargs)
    for writeback in retr:
        writeback()


_STREAMS = {}


#: Held while a plan is made: threads launching one kernel for the first time at once make one
#: plan (numba compiles under its own global lock anyway).  Stream objects have their own lock,
#: so a new stream never waits for another thread's compilation.
_BUILD_LOCK = threading.RLock()
_STREAMS_LOCK = threading.Lock()


def _stream_handle(stream):
    """The raw CUstream of a Numba stream, 0, or a raw handle (an int)."""
    if isinstance(stream, int):
        return stream
    return int(_core_stream(stream).handle)


def _core_stream(stream):
    """cuda.core's stream for a Numba stream, 0, or a raw CUstream handle (an int, as torch's
    ``current_stream().cuda_stream`` gives); objects for handles are made once and reused."""
    from numba.cuda.cudadrv.driver import _to_core_stream

    if not isinstance(stream, int) or stream == 0:
        return _to_core_stream(stream)
    core = _STREAMS.get(stream)
    if core is None:
        from cuda.core import Stream

        with _STREAMS_LOCK:
            core = _STREAMS.get(stream)
            if core is None:
                core = _STREAMS[stream] = Stream.from_handle(stream)
    return core


def _plan_for(kernel, signature, shared_bytes, cluster, whole_program):
    """(compiled kernel, cuda.core kernel) for the current device, made once per key."""
    key = (kernel, tuple(signature), shared_bytes, cluster, whole_program,
           cuda.get_current_device().id)
    plan = _PLANS.get(key)
    if plan is None:
        with _BUILD_LOCK:
            plan = _PLANS.get(key)
            if plan is None:
                plan = _PLANS[key] = _plan(kernel, signature, shared_bytes, cluster,
                                           whole_program)
    return plan


def compile_kernel(kernel, signature, whole_program=None):
    """numba's compile of ``kernel`` for ``signature`` exactly as a launch makes it (numba's disk
    cache first, then typing, lowering, NVVM and the link; the result is saved to that cache):
    :func:`linear_singly_assigned_scan`, and a kernel that will be loaded through the driver's
    whole-program JIT (``whole_program`` None or True, see :func:`_ptx_link_for_whole_program`)
    linked from its PTX.  ``numbatc.precompile`` fills the disk cache through this function, so
    that what it stores is what a launch looks up.  intrinsics.compile_passes' faster SSA pass and
    memo of call types make the same kernel in less time."""
    from intrinsics.compile_passes import linear_ssa, memo_call_types

    with linear_singly_assigned_scan(), linear_ssa(), memo_call_types(), \
            _ptx_link_for_whole_program(whole_program is not False), _ptx_on_demand(), \
            _gc_paused():
        return kernel.compile(tuple(signature))


def compile_kernels(jobs, whole_program=None):
    """:func:`compile_kernel` of each ``(kernel, signature)`` in ``jobs``, in that order, with
    each kernel's link (nvJitLink: LTO and ptxas, which release the GIL) run in a thread of its
    own while numba types and lowers the next kernel in this one; returns the compiled kernels.
    Each kernel is bound to the current context and saved to its disk cache, as numba's
    ``compile`` does, before this returns (the link's error, if one failed, raised here).  For
    the kernels of one operation that compile together on its first call (the attention
    backward's three or four): numba's typing holds its global lock, the links do not, so the
    first call waits for the typing of all and the last link instead of every link too.  Put the
    kernel that types longest first.  A kernel already compiled (in this process or the disk
    cache) costs what ``compile`` costs it; a kernel loaded through the driver's whole-program
    JIT (setmaxnreg) is not linked at all (see _ptx_link_for_whole_program).
    ``NUMBATC_SERIAL_LINK=1``: one :func:`compile_kernel` after another (numba's order)."""
    import os

    from numba.cuda import dispatcher

    if os.environ.get("NUMBATC_SERIAL_LINK"):
        return [compile_kernel(kernel, signature, whole_program) for kernel, signature in jobs]
    done = []  # per job: (the dispatcher, [(numba's _Kernel, link thread, [error])], saves)
    under = dispatcher._Kernel.bind  # numba's, or precompile's stand-in (numbatc.precompile)

    def bind(self):
        if not getattr(_DEFERRED, "active", False):
            return under(self)
        library, error = self._codelibrary, []
        cc = library._ensure_cc(None)  # here: a new thread would make its own context

        def link():
            try:
                library.get_cubin(cc)
            except BaseException as e:  # noqa: BLE001 -- raised again in the caller's thread
                error.append(e)

        thread = threading.Thread(target=link, name="numbatc-link", daemon=True)
        thread.start()
        done[-1][1].append((self, thread, error))

    results = []
    with _COMPILE_KERNELS_LOCK:  # one set of patches at a time
        dispatcher._Kernel.bind = bind
        try:
            _compile_deferred(jobs, whole_program, done, results)
        finally:
            dispatcher._Kernel.bind = under
            _finish_deferred(done)
    return results


def _compile_deferred(jobs, whole_program, done, results):
    """compile_kernels' first part: each job compiled, its binding and disk-cache save
    deferred (into ``done``)."""
    for kernel, signature in jobs:
        saves = []
        done.append((kernel, [], saves))
        # numba saves a new kernel to its disk cache right after binding it: here after the link
        kernel._cache.save_overload = lambda sig, data, saves=saves: saves.append((sig, data))
        _DEFERRED.active = True
        try:
            results.append(compile_kernel(kernel, signature, whole_program))
        finally:
            _DEFERRED.active = False
            del kernel._cache.save_overload


def _finish_deferred(done):
    """compile_kernels' second part: wait for each link, bind the kernel (the cubin is linked:
    this loads it), save it to the disk cache; the first link's error raised after."""
    failed = None
    for kernel, links, saves in done:
        for compiled, thread, error in links:
            thread.join()
            if error:
                failed = failed or error[0]
            else:
                compiled.bind()
        if not any(error for _, _, error in links):
            for sig, data in saves:
                kernel._cache.save_overload(sig, data)
    if failed is not None:
        raise failed


#: compile_kernels' switch, per thread: another thread's compile binds as numba does
_DEFERRED = threading.local()
_COMPILE_KERNELS_LOCK = threading.RLock()


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off for one compile (as it was again after): numba
    allocates some 10^5 objects typing and lowering a kernel, and each automatic full
    collection meanwhile walks every object of the process (numba's registries included):
    0.1-0.3 s of a GEMM kernel's 1-1.5 s compile on a 2-core host
    (scripts/diag/compile_time.py).  What the compile leaves behind is collected at the next
    automatic collection."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _plan(kernel, signature, shared_bytes, cluster, whole_program):
    """Compile, load and configure a kernel once: (compiled kernel, cuda.core kernel)."""
    compiled = compile_kernel(kernel, signature, whole_program)
    library = compiled._codelibrary
    if whole_program is None:
        whole_program = _holds_setmaxnreg(library)
    if whole_program:
        # numba's module of this kernel is never launched: not made (see
        # _ptx_link_for_whole_program), unless something asked numba for it
        from numba.cuda.cudadrv import devices

        device = devices.get_context().device
        core_kernel = _whole_program_kernel(compiled, device)
        static = _kernel_attribute(core_kernel, device, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")
    else:
        cufunc = library.get_cufunc()
        device, core_kernel, static = cufunc.device, cufunc.kernel, cufunc.attrs.shared

    # NOTE: without the opt-in, dynamic shared memory is limited to 48 KB *minus the kernel's
    # static shared memory*: 48 KB of dynamic plus one static byte fails at launch with
    # CUDA_ERROR_INVALID_VALUE (seen on the H200 with sm80_gemm_softmax's 32x64 tile: 49152 B of
    # stages plus its reduction array).
    static = static if shared_bytes else 0
    if shared_bytes + static > _DEFAULT_DYNAMIC_LIMIT:
        limit = max_dynamic_shared_bytes(device)
        if shared_bytes + static > limit:
            raise LaunchError(
                f"{shared_bytes} B of dynamic shared memory plus {static} B static exceeds the "
                f"device's per-block limit of {limit} B"
            )
        _set_kernel_attribute(core_kernel, device, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", shared_bytes)

    if cluster is not None and cluster[0] * cluster[1] * cluster[2] > 8:
        _set_kernel_attribute(core_kernel, device,
                              "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
    return compiled, core_kernel



# ---------------------------------------------------------------------------------------------
# prepared launches: one cuLaunchKernel with a parameter buffer made once
# ---------------------------------------------------------------------------------------------

#: numba type name -> struct code of the one kernel parameter numba passes for it (numba's
#: _prepare_args: a CPointer is a pointer-sized integer, an integer or float its own C type).
_PARAM_CODES = {
    "int8": "b", "int16": "h", "int32": "i", "int64": "q",
    "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q",
    "float32": "f", "float64": "d",
}


def param_layout(signature):
    """(struct format, byte offset of each parameter) for a kernel signature whose arguments are
    each passed as one kernel parameter: ``types.CPointer``/``voidptr`` (a device address),
    integers and float32/float64; arrays and tuples expand as numba expands them (an array into
    meminfo, parent, nitems, itemsize, data, shape..., strides...: :func:`array_params` gives
    those values; a tuple into its members in order).  None for anything else (records ...).
    The format uses native alignment, so each parameter sits at an offset aligned to its own
    size, as the kernel's .param space expects; a tensor map passed by value
    (``tensormap_param``, intrinsics.grid_constant) is 128 bytes (``128s``) at an offset
    aligned to 64, padded there with ``x``."""
    from numba import types

    from intrinsics import grid_constant

    codes = []

    def add(ty):
        if isinstance(ty, types.CPointer) or ty == types.voidptr:
            codes.append("Q")
        elif str(ty) in _PARAM_CODES and isinstance(ty, (types.Integer, types.Float)):
            codes.append(_PARAM_CODES[str(ty)])
        elif grid_constant.is_param(ty):
            codes.append(_BLOB_CODE)
        elif isinstance(ty, types.Array):
            # numba's array ABI: meminfo, parent, nitems, itemsize, data, shape[], strides[]
            codes.extend("QQqqQ" + "q" * (2 * ty.ndim))
        elif isinstance(ty, types.BaseTuple):
            for member in ty:
                if not add(member):
                    return False
        else:
            return False
        return True

    for ty in signature:
        if not add(ty):
            return None
    fmt, offsets = "@", []
    for code in codes:
        if code == _BLOB_CODE:
            pad = -struct.calcsize(fmt) % grid_constant.PARAM_ALIGN
            fmt += "x" * pad
            offsets.append(struct.calcsize(fmt))
            fmt += code
        else:
            offsets.append(struct.calcsize(fmt + code) - struct.calcsize(code))
            fmt += code
    return fmt, offsets


#: a tensor map passed by value: its 128 bytes (intrinsics.grid_constant)
_BLOB_CODE = "128s"


def _param_codes(fmt):
    """The struct code of each parameter of a :func:`param_layout` format, padding left out."""
    import re

    return [code for code in re.findall(r"\d*[a-zA-Z?]", fmt[1:]) if code != "x"]


def has_param_blobs(signature):
    """Whether a kernel signature passes a tensor map by value (which numba's launch cannot)."""
    from numba import types

    from intrinsics import grid_constant

    def any_blob(ty):
        if isinstance(ty, types.BaseTuple):
            return any(any_blob(t) for t in ty)
        return grid_constant.is_param(ty)

    return any(any_blob(ty) for ty in signature)


def flat_params(signature, args):
    """``args`` as the flat parameter values :func:`param_layout` lays out for ``signature``:
    device arrays (anything with ``__cuda_array_interface__``) as numba's 7+ parameters, tuples
    member by member, a by-value tensor map (TensorMapParam or TensorMap) as its 128 bytes,
    pointers and numbers as they are."""
    from numba import types

    from intrinsics import grid_constant

    out = []

    def add(ty, value):
        if grid_constant.is_param(ty):
            param = getattr(value, "param", value)  # a TensorMap gives its .param
            if getattr(param, "blob", None) is None:
                raise LaunchError(f"a tensormap_param argument needs TensorMap.param, got {value!r}")
            out.append(param.blob)
        elif isinstance(ty, types.Array):
            ca = getattr(value, "__cuda_array_interface__", None)
            if ca is None:
                raise LaunchError(f"an array argument of a kernel that takes a tensor map by value "
                                  f"must be on the device, got {type(value).__name__}")
            itemsize = np.dtype(ca["typestr"]).itemsize
            shape = tuple(ca["shape"])
            strides = ca.get("strides")
            if strides is None:  # C-contiguous, as numba's own launch reads it
                from numba.cuda.np.numpy_support import strides_from_shape

                strides = strides_from_shape(shape=shape, itemsize=itemsize, c_contiguous=True,
                                             f_contiguous=False)
            out.extend(array_params(ca["data"][0], shape, tuple(strides), itemsize))
        elif isinstance(ty, types.BaseTuple):
            for member, v in zip(ty, value):
                add(member, v)
        elif isinstance(ty, types.CPointer) or ty == types.voidptr:
            out.append(int(value))
        else:
            out.append(value)

    if len(args) != len(signature):
        raise LaunchError(f"the kernel takes {len(signature)} arguments ({signature}), got "
                          f"{len(args)}")
    for ty, value in zip(signature, args):
        add(ty, value)
    return out


def array_params(ptr, shape, strides, itemsize):
    """The kernel parameters numba passes for an array argument (see :func:`param_layout`):
    (meminfo, parent, nitems, itemsize, data, *shape, *strides), strides in bytes."""
    nitems = 1
    for extent in shape:
        nitems *= extent
    return (0, 0, nitems, itemsize, ptr, *shape, *strides)


_CUSTREAMS = {}


class PreparedLaunch:
    """A launch of one compiled kernel with a fixed grid, block, dynamic shared memory and
    parameter layout.  ``prepared(stream_handle, *args)`` packs ``args`` (in the kernel's
    parameter order: device addresses as ints, numbers) into the parameter buffer and calls
    ``cuLaunchKernel``; ``stream_handle`` is a raw CUstream (0: the legacy default stream, as
    numba's default stream; 1 legacy; 2 per-thread).

    NOTE: the buffer is reused, so one PreparedLaunch must not be called from two threads at
    once (cuLaunchKernel copies the parameters before it returns, so sequential reuse is safe).
    The kernel handle is a CUkernel (context-independent): with a non-NULL stream the launch
    runs in that stream's context, with a NULL one in the thread's current context."""

    __slots__ = ("fmt", "grid", "block", "shared_bytes", "cluster", "_f", "_buf", "_params",
                 "_params_addr", "_pack", "_cu_launch", "_success", "_float_slots", "_keep",
                 "_config", "_cu_launch_ex")

    def __init__(self, kernel_handle, grid, block, shared_bytes, layout, keep=None, cluster=None):
        from cuda.bindings import driver

        fmt, offsets = layout
        self.fmt = fmt
        self.grid, self.block, self.shared_bytes = grid, block, shared_bytes
        self.cluster = cluster
        self._config = None
        if cluster is not None:
            # cuLaunchKernelEx: the grid in blocks (a multiple of the cluster shape), the cluster
            # shape as a launch attribute; only hStream changes from launch to launch.
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_bytes
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = cluster
            config.attrs = [attr]
            config.numAttrs = 1
            self._config = config
        self._cu_launch_ex = driver.cuLaunchKernelEx
        self._f = driver.CUfunction(int(kernel_handle))  # a CUkernel may stand for a CUfunction
        self._buf = ctypes.create_string_buffer(max(struct.calcsize(fmt), 8))
        base = ctypes.addressof(self._buf)
        self._params = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self._params_addr = ctypes.addressof(self._params)
        self._pack = struct.Struct(fmt).pack_into
        self._cu_launch = driver.cuLaunchKernel
        self._success = driver.CUresult.CUDA_SUCCESS
        self._float_slots = [(i, code) for i, code in enumerate(_param_codes(fmt))
                             if code in "fd"]
        self._keep = keep  # the compiled kernel: its module stays loaded while this lives

    def pack(self, *args):
        """Pack ``args`` into the parameter buffer (no launch); returns its bytes (for tests)."""
        try:
            self._pack(self._buf, 0, *args)
        except OverflowError:  # a float beyond float32: numba's ctypes.c_float gives inf
            args = list(args)
            for i, code in self._float_slots:
                args[i] = float(np.float32(args[i])) if code == "f" else float(args[i])
            self._pack(self._buf, 0, *args)
        return self._buf.raw[:struct.calcsize(self.fmt)]

    def __call__(self, stream_handle, *args):
        try:
            self._pack(self._buf, 0, *args)
        except OverflowError:
            self.pack(*args)
        stream = _CUSTREAMS.get(stream_handle)
        if stream is None:
            from cuda.bindings import driver

            if len(_CUSTREAMS) > 256:
                _CUSTREAMS.clear()
            stream = _CUSTREAMS[stream_handle] = driver.CUstream(stream_handle)
        config = self._config
        if config is None:
            g, b = self.grid, self.block
            (err,) = self._cu_launch(self._f, g[0], g[1], g[2], b[0], b[1], b[2],
                                     self.shared_bytes, stream, self._params_addr, 0)
        else:
            config.hStream = stream
            (err,) = self._cu_launch_ex(config, self._f, self._params_addr, 0)
        if err != self._success:
            raise LaunchError(f"cuLaunchKernel failed: {getattr(err, 'name', err)}")


def prepare(kernel, grid, block, signature, shared_bytes=0, cluster=None, whole_program=None):
    """A :class:`PreparedLaunch` of ``kernel`` compiled for ``signature`` (on the current
    device, as :func:`launch`; ``cluster`` in blocks, launched with cuLaunchKernelEx), or None
    where one cannot be made: in numba's simulator, or when an argument type is not one kernel
    parameter (see :func:`param_layout`)."""
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:
        return None
    layout = param_layout(signature)
    if layout is None:
        return None
    grid, block, cluster = _launch_dims(grid, block, cluster)
    compiled, core_kernel = _plan_for(kernel, signature, shared_bytes, cluster, whole_program)
    return PreparedLaunch(core_kernel.handle, grid, block, shared_bytes, layout, keep=compiled,
                          cluster=cluster)


# ---------------------------------------------------------------------------------------------
# compile time: numba's lowering scans a block once per variable
# ---------------------------------------------------------------------------------------------


def _singly_assigned_linear(self):
    """numba-cuda's ``Lower._find_singly_assigned_variable`` with the same result, in one pass.

    NOTE: numba's version rescans the defining block's statements for every block-local
    variable, quadratic in the block's length: 0.5 s of the 3.3 s that sm80_gemm's
    128x256x64_8w_3s kernel takes to compile (its main loop is one block of ~3000 statements).
    Here each block's assignments are counted once."""
    from collections import Counter, defaultdict

    from numba.cuda.core import ir
    from numba.cuda.core.analysis import compute_use_defs, must_use_alloca

    blocks = self.func_ir.blocks
    sav = set()
    if not self.func_ir.func_id.is_generator:
        use_defs = compute_use_defs(blocks)
        alloca_vars = must_use_alloca(blocks)
        var_assign_map = defaultdict(set)
        for blk, vl in use_defs.defmap.items():
            for var in vl:
                var_assign_map[var].add(blk)
        var_use_map = defaultdict(set)
        for blk, vl in use_defs.usemap.items():
            for var in vl:
                var_use_map[var].add(blk)
        counts = {}
        for var, defblks in var_assign_map.items():
            if var in alloca_vars or len(defblks) != 1 or var_use_map[var]:
                continue
            [defblk] = defblks
            per_block = counts.get(defblk)
            if per_block is None:
                per_block = counts[defblk] = Counter(
                    stmt.target.name for stmt in self.blocks[defblk].find_insts(ir.assign_types))
            if per_block[var] == 1:
                sav.add(var)
    self._singly_assigned_vars = sav
    self._blk_local_varmap = {}


_SCAN_PATCHABLE = None


def _scan_patchable():
    """True when numba-cuda's lowering has the method body this replacement was written from
    (checked by its source text, so another numba-cuda version keeps its own)."""
    global _SCAN_PATCHABLE
    if _SCAN_PATCHABLE is None:
        import hashlib
        import inspect

        try:
            from numba.cuda import lowering

            src = inspect.getsource(lowering.Lower._find_singly_assigned_variable)
            _SCAN_PATCHABLE = hashlib.sha256(src.encode()).hexdigest()[:16] in _KNOWN_SCAN_SOURCES
        except Exception:
            _SCAN_PATCHABLE = False
    return _SCAN_PATCHABLE


#: sha256[:16] of numba-cuda's Lower._find_singly_assigned_variable source that
#: _singly_assigned_linear reproduces (numba-cuda 0.30.x).
_KNOWN_SCAN_SOURCES = {"c3b499f765172885"}


@contextlib.contextmanager
def _ptx_link_for_whole_program(active=True):
    """Within the block, numba links a kernel whose PTX holds setmaxnreg from that PTX instead
    of by LTO; ``NUMBATC_LTO_LINK=1`` keeps numba's own link.

    numba-cuda links every kernel by LTO where nvJitLink is present (``cuda.jit``'s default): NVVM
    writes the kernel's LTO-IR (on top of the PTX it has already written) and nvJitLink
    optimises and assembles it.  A kernel whose PTX holds setmaxnreg is loaded from that PTX by
    the driver's whole-program JIT instead (see _plan), so the LTO cubin, made inside numba's
    ``compile`` (and kept in its disk cache), is never launched.  Linking such a kernel from its
    PTX skips the LTO-IR and the LTO link (0.3 s of the 2.5 s of CPU time that sm90_gemm's
    128x256x64_4s_pt_tma takes to compile on a 2-core host); the PTX is the same text (up to the
    order of its unused environment symbols, which differs between any two processes), so the
    driver runs the same code (ptxas' whole-program SASS of both: byte-identical).

    Nor is such a kernel bound: numba's compile binds every new kernel (``_Kernel.bind``: link the
    cubin, load it into the context), only for _plan to load the kernel a second time from its
    PTX.  Within the block the binding of a setmaxnreg kernel is skipped (0.3-1.0 s of a first
    call: nvJitLink's ptxas and the module load); _plan takes the device and the static shared
    memory from the driver's whole-program kernel, and anything that asks numba for the cubin
    later (its SASS, its registers) still gets it, linked then."""
    import os

    if not active or os.environ.get("NUMBATC_LTO_LINK"):
        yield
        return
    from numba.cuda import codegen, dispatcher

    original = codegen.CUDACodeLibrary.__dict__["get_cubin"]
    original_bind = dispatcher._Kernel.bind  # (precompile's stand-in binding, within _target)

    def get_cubin(self, cc=None):
        if self._lto and _holds_setmaxnreg(self, cc):
            self._lto = False
        return original(self, cc)

    def bind(self):
        if not _holds_setmaxnreg(self._codelibrary):
            original_bind(self)

    codegen.CUDACodeLibrary.get_cubin = get_cubin
    dispatcher._Kernel.bind = bind
    try:
        yield
    finally:
        codegen.CUDACodeLibrary.get_cubin = original
        dispatcher._Kernel.bind = original_bind


def _holds_setmaxnreg(library, cc=None):
    """True when the kernel (numba's code library) holds setmaxnreg: launched through the
    driver's whole-program JIT (see _ptx_link_for_whole_program).  Read from the LLVM IR that
    NVVM compiles (the intrinsic's inline asm is its text, as in the PTX), so that asking does
    not make NVVM write the PTX (see _ptx_on_demand); ``cc`` is unused (one IR for every
    target).  The IR of a setmaxnreg that NVVM would drop as dead code still says True: such a
    kernel loads from its PTX, which runs the same code."""
    return any("setmaxnreg" in ir for ir in library.llvm_strs)


@contextlib.contextmanager
def _ptx_on_demand():
    """Within the block, a new kernel linked by LTO gets no PTX until something asks for it.

    numba-cuda's ``_Kernel.__init__`` has NVVM write the whole kernel's PTX (``get_asm_str``)
    only to search its text for the names of three helper libraries (reshape functions, NRT,
    cudadevrt's cooperative launch: the last read from the lowering's own flag), and then links
    the cubin by LTO from the LTO-IR that NVVM writes again (``get_ltoir``) without that PTX.
    For a kernel linked by LTO the PTX is work that nothing uses: 0.26-0.31 s of NVVM per
    kernel of the portable attention backward (dQ, dK / dV; head_dim 64, a 2-core host), as long
    as numba's typing of its body.  Inside ``_Kernel.__init__`` such a kernel's library answers
    ``get_asm_str`` with its LLVM IR instead: the helpers' names are the same identifiers there
    (``declare ... @name``).  NRT (``NUMBA_CUDA_ENABLE_NRT``), whose search is a PTX pattern, and
    kernels linked from PTX (setmaxnreg, see _ptx_link_for_whole_program; ``lto=False``) get
    the real PTX.  Anything asking later (a SASS test, ``inspect_asm``, the whole-program load)
    gets NVVM's PTX then, the same text as before; the cubin is the same bytes.
    ``NUMBATC_EAGER_PTX=1`` keeps numba's order; another numba-cuda version, whose
    ``_Kernel.__init__`` does not read the PTX in the one known statement, is left alone."""
    import os
    import threading

    if os.environ.get("NUMBATC_EAGER_PTX") or not _init_patchable():
        yield
        return
    from numba.cuda import codegen, config, dispatcher

    original_init = dispatcher._Kernel.__dict__["__init__"]
    original_asm = codegen.CUDACodeLibrary.__dict__["get_asm_str"]
    local = threading.local()

    def init(self, *args, **kwargs):
        local.active = True
        try:
            original_init(self, *args, **kwargs)
        finally:
            local.active = False

    def get_asm_str(self, cc=None):
        if (getattr(local, "active", False) and self._lto and not config.CUDA_ENABLE_NRT
                and not self._ptx_cache and not _holds_setmaxnreg(self)):
            return "\n".join(self.llvm_strs)
        return original_asm(self, cc)

    dispatcher._Kernel.__init__ = init
    codegen.CUDACodeLibrary.get_asm_str = get_asm_str
    try:
        yield
    finally:
        dispatcher._Kernel.__init__ = original_init
        codegen.CUDACodeLibrary.get_asm_str = original_asm


_INIT_PATCHABLE = None


def _init_patchable():
    """True when numba-cuda's ``_Kernel.__init__`` reads the PTX in exactly one statement,
    ``asm = lib.get_asm_str()``, and uses it only as _ptx_on_demand says (checked by the
    source text: the statement once, and ``asm`` passed to the two searches)."""
    global _INIT_PATCHABLE
    if _INIT_PATCHABLE is None:
        import inspect

        try:
            from numba.cuda import dispatcher

            src = inspect.getsource(dispatcher._Kernel.__init__)
            _INIT_PATCHABLE = (src.count("get_asm_str") == 1
                               and src.count("asm = lib.get_asm_str()") == 1
                               # "asm" twice in that statement, once in each search
                               and src.count("asm") == 4 and src.count(" in asm]") == 1
                               and src.count("tgt_ctx, asm)") == 1)
        except Exception:
            _INIT_PATCHABLE = False
    return _INIT_PATCHABLE


@contextlib.contextmanager
def linear_singly_assigned_scan():
    """Within the block, numba-cuda lowers with :func:`_singly_assigned_linear` (where its own
    method is the known one); ``NUMBATC_NUMBA_SCAN=1`` keeps numba's own."""
    import os

    if os.environ.get("NUMBATC_NUMBA_SCAN") or not _scan_patchable():
        yield
        return
    from numba.cuda import lowering

    original = lowering.Lower.__dict__["_find_singly_assigned_variable"]
    lowering.Lower._find_singly_assigned_variable = _singly_assigned_linear
    try:
        yield
    finally:
        lowering.Lower._find_singly_assigned_variable = original
