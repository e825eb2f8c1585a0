"""setmaxnreg on the GPU: a warp-specialised kernel (384 threads; warpgroup 0 loads a tile into
shared memory after ``setmaxnreg_dec(40)``, warpgroups 1 and 2 compute from it after
``setmaxnreg_inc(232)``; ``launch_bounds=(384, 1)``) gives exact results.

NOTE: numba-cuda links every kernel through nvJitLink, which compiles PTX as relocatable code and
drops setmaxnreg (ptxas C7504), and it lowers launched kernels for the plain sm_90 (where the
intrinsic is refused).  So this test compiles the PTX for the architecture-specific target
itself and loads it two ways:

- ``driver-jit``: the PTX through ``cuModuleLoadData`` (whole-program JIT): setmaxnreg is kept,
  which shows as the kernel being allocated the capped register count (65536 / 384 -> 168);
- ``nvjitlink``: the cubin nvJitLink makes (what numba would run): setmaxnreg is dropped, the
  kernel uses fewer registers; the results are the same.
"""

import ctypes
import re

import numpy as np
import pytest
from numba import cuda, types

from intrinsics.setmaxnreg import SETMAXNREG_ARCH, setmaxnreg_dec, setmaxnreg_inc
from intrinsics.toolchain import arch_name, assemble, compile_ptx

# The results run in the CPU emulation too (setmaxnreg there checks that every warp of a
# warpgroup executes it with the same count); the register counts need the real driver.
pytestmark = pytest.mark.emulation

THREADS = 384
TILE = 256
CAPPED_REGISTERS = 65536 // THREADS // 8 * 8


def ws_kernel(x, y):
    buf = cuda.shared.array(TILE, np.float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * TILE
    if t // 128 == 0:
        # producer warpgroup: few registers, loads the tile
        setmaxnreg_dec(40)
        buf[t] = x[base + t]
        buf[t + 128] = x[base + t + 128]
    else:
        # consumer warpgroups: many registers
        setmaxnreg_inc(232)
    cuda.syncthreads()
    if t // 128 != 0:
        i = t - 128
        y[base + i] = buf[i] * np.float32(2.0) + buf[TILE - 1 - i]


SIG = (types.float32[:], types.float32[:])


# ---------------------------------------------------------------------------------------------
# A minimal loader: CUDA driver module + numba's kernel ABI for 1-d arrays
# ---------------------------------------------------------------------------------------------


def _driver():
    from cuda.bindings import driver

    return driver


def _check(result, what):
    driver = _driver()
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


# PTX versions to fall back to when the driver's JIT is older than the pip NVVM (9.5); the
# kernel uses nothing newer than PTX 8.0 (setmaxnreg, sm_90a).
_PTX_FALLBACK = ["9.4", "9.3", "9.2", "9.1", "9.0", "8.8", "8.7", "8.6", "8.5", "8.4", "8.3", "8.2",
                 "8.1", "8.0"]


def load_ptx_whole_program(ptx):
    driver = _driver()
    retry = (
        driver.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        driver.CUresult.CUDA_ERROR_INVALID_PTX,
    )
    err = None
    for version in [None, *_PTX_FALLBACK]:
        text = ptx if version is None else re.sub(r"^\.version \S+", f".version {version}", ptx,
                                                  flags=re.M)
        err, module = driver.cuModuleLoadData(text.encode() + b"\0")
        if err == driver.CUresult.CUDA_SUCCESS:
            return module
        if err not in retry:
            break
    raise RuntimeError(f"cuModuleLoadData(PTX) failed: {err}")


def load_cubin(cubin):
    return _check(_driver().cuModuleLoadData(cubin), "cuModuleLoadData(cubin)")


def array_params(arr):
    """numba's kernel ABI for a 1-d device array: meminfo, parent, nitems, itemsize, data,
    shape, strides."""
    values = (0, 0, arr.size, arr.dtype.itemsize, arr.device_ctypes_pointer.value,
              arr.shape[0], arr.strides[0])
    kinds = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_int64)
    return values, kinds


def run_module(module, name, grid, block, arrays):
    driver = _driver()
    func = _check(driver.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
    regs = _check(
        driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, func),
        "cuFuncGetAttribute",
    )
    values, kinds = (), ()
    for arr in arrays:
        v, k = array_params(arr)
        values += v
        kinds += k
    _check(driver.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, 0, driver.CUstream(0),
                                 (values, kinds), 0), "cuLaunchKernel")
    cuda.synchronize()
    return regs


@pytest.mark.gpu(cc=(9, 0))
@pytest.mark.hardware_only
@pytest.mark.parametrize("loader", ["driver-jit", "nvjitlink"])
def test_warp_specialised_kernel(loader):
    cc = tuple(cuda.get_current_device().compute_capability)
    target = (cc[0], cc[1], "a")
    if not SETMAXNREG_ARCH.accepts(target):
        pytest.skip(f"setmaxnreg needs {SETMAXNREG_ARCH.text}")
    ptx = compile_ptx(ws_kernel, SIG, target, launch_bounds=(THREADS, 1))
    assert ".maxntid 384, 1, 1" in ptx
    name = re.search(r"\.visible \.entry (\w+)\(", ptx).group(1)
    entry = ptx[ptx.index(".visible .entry"):ptx.index(")", ptx.index(".visible .entry"))]
    assert entry.count(".param") == 14, "numba's array ABI changed: 7 parameters per 1-d array"

    ctx = cuda.current_context()  # numba's primary context is current from here on
    assert ctx is not None
    if loader == "driver-jit":
        module = load_ptx_whole_program(ptx)
    else:
        module = load_cubin(assemble(ptx, arch_name(target)))

    rng = np.random.default_rng()
    blocks = 8
    x = rng.standard_normal(blocks * TILE).astype(np.float32)
    d_x = cuda.to_device(x)
    d_y = cuda.to_device(np.full(blocks * TILE, np.nan, dtype=np.float32))
    try:
        regs = run_module(module, name, blocks, THREADS, [d_x, d_y])
    finally:
        _driver().cuModuleUnload(module)

    # y[b*256 + i] for the 256 consumer threads i: x[i] * 2 + x[255 - i] within the block's tile
    np.testing.assert_array_equal(d_y.copy_to_host(), _expected(x, blocks))

    if loader == "driver-jit":
        assert regs == CAPPED_REGISTERS, (
            f"whole-program JIT should allocate the capped {CAPPED_REGISTERS} registers when it "
            f"keeps setmaxnreg, got {regs}"
        )
    else:
        assert regs < CAPPED_REGISTERS, f"nvJitLink was expected to drop setmaxnreg, {regs} regs"


def _expected(x, blocks):
    xt = x.reshape(blocks, TILE)
    i = np.arange(TILE)
    return (xt[:, i] * np.float32(2.0) + xt[:, TILE - 1 - i]).astype(np.float32).ravel()


def _run_through_launch(blocks):
    from intrinsics import launch as launching

    kernel = cuda.jit(launch_bounds=(THREADS, 1))(ws_kernel)
    rng = np.random.default_rng()
    x = rng.standard_normal(blocks * TILE).astype(np.float32)
    d_x = cuda.to_device(x)
    d_y = cuda.to_device(np.full(blocks * TILE, np.nan, dtype=np.float32))
    launching.launch(kernel, blocks, THREADS, (d_x, d_y))
    cuda.synchronize()
    np.testing.assert_array_equal(d_y.copy_to_host(), _expected(x, blocks))
    return kernel


@pytest.mark.gpu(cc=(9, 0))
def test_warp_specialised_kernel_through_launch():
    """The library path: ``cuda.jit(launch_bounds=...)`` + ``intrinsics.launch.launch`` gives
    exact results (on the GPU and in the emulation)."""
    _run_through_launch(blocks=2)


@pytest.mark.gpu(cc=(9, 0))
@pytest.mark.hardware_only
def test_launch_keeps_setmaxnreg():
    """``intrinsics.launch.launch`` sees setmaxnreg in the PTX and loads the kernel through the
    driver's whole-program JIT, so the kernel runs with the capped register allocation
    (setmaxnreg kept)."""
    from intrinsics import launch as launching

    kernel = _run_through_launch(blocks=2)
    (compiled,) = kernel.overloads.values()
    loaded = launching._WHOLE_PROGRAM[(id(compiled), cuda.get_current_device().id)][1]
    assert loaded.attributes.num_regs == CAPPED_REGISTERS
