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

``launch(kernel, grid, block, args, shared_bytes=0, cluster=None, stream=0)`` takes the grid in
blocks (as ``kernel[grid, block]`` does), whatever cuda.core version is installed.
"""

import functools

from numba import cuda

__all__ = ["LaunchError", "launch", "max_dynamic_shared_bytes"]

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
    grid = _dim3(grid, "grid")
    block = _dim3(block, "block")
    if block[0] * block[1] * block[2] > 1024:
        raise LaunchError(f"a block has at most 1024 threads, got {block}")
    if shared_bytes < 0:
        raise LaunchError(f"shared_bytes must be >= 0, got {shared_bytes}")
    if cluster is not None:
        cluster = _dim3(cluster, "cluster")
        if any(g % c for g, c in zip(grid, cluster)):
            raise LaunchError(f"the cluster shape {cluster} must divide the grid {grid}")
        if cluster[0] * cluster[1] * cluster[2] > 16:
            raise LaunchError(f"a cluster has at most 16 blocks, got {cluster}")

    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM:  # numba's simulator: the CPU emulation runs it
        from intrinsics.emulate.runtime import launch as emulated_launch

        return emulated_launch(kernel, grid, block, args, shared_bytes, cluster)

    from cuda.core import LaunchConfig, launch as core_launch

    if signature is None:
        args = tuple(_as_kernel_arg(a) for a in args)
        signature = tuple(kernel.typeof_pyval(a) for a in args)
    key = (kernel, tuple(signature), shared_bytes, cluster, whole_program,
           cuda.get_current_device().id)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(kernel, signature, grid, shared_bytes, cluster, whole_program)
    compiled, core_kernel = plan

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


def _core_stream(stream):
    """cuda.core's stream for a Numba stream, 0, or a raw CUstream handle (an int, as torch's
    ``current_stream().cuda_stream`` gives); objects for handles are made once and reused."""
    from numba.cuda.cudadrv.driver import _to_core_stream

    if not isinstance(stream, int) or stream == 0:
        return _to_core_stream(stream)
    core = _STREAMS.get(stream)
    if core is None:
        from cuda.core import Stream

        core = _STREAMS[stream] = Stream.from_handle(stream)
    return core


def _plan(kernel, signature, grid, shared_bytes, cluster, whole_program):
    """Compile, load and configure a kernel once: (compiled kernel, cuda.core kernel)."""
    compiled = kernel.compile(tuple(signature))
    cufunc = compiled._codelibrary.get_cufunc()
    if whole_program is None:
        whole_program = "setmaxnreg" in compiled._codelibrary.get_asm_str()
    core_kernel = _whole_program_kernel(compiled, cufunc.device) if whole_program else cufunc.kernel

    if shared_bytes > _DEFAULT_DYNAMIC_LIMIT:
        limit = max_dynamic_shared_bytes(cufunc.device)
        static = cufunc.attrs.shared
        if shared_bytes + static > limit:
            raise LaunchError(
                f"{shared_bytes} B of dynamic shared memory plus {static} B static exceeds the "
                f"device's per-block limit of {limit} B"
            )
        _set_kernel_attribute(core_kernel, cufunc.device, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", shared_bytes)

    if cluster is not None and cluster[0] * cluster[1] * cluster[2] > 8:
        _set_kernel_attribute(core_kernel, cufunc.device,
                              "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
    return compiled, core_kernel

