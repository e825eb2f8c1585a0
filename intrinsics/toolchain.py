"""Compile and assemble kernels without a GPU.

``compile_ptx`` turns a Python kernel into PTX for one architecture through numba-cuda;
``assemble`` feeds the PTX to nvJitLink (the pip-installed one, which understands the PTX version
the pip NVVM writes -- the CUDA 13.0 ``ptxas`` rejects PTX 9.5) and returns the cubin, or raises
:class:`AssemblyError` with the assembler's log.  Tests use both to prove that every intrinsic
assembles for each architecture it claims; the demo uses them to report what compiles where.
"""

import contextlib

from numba import cuda

__all__ = ["ARCHS", "AssemblyError", "assemble", "compile_ptx", "cc_of", "arch_name"]

# The architectures the project claims, as numba-cuda compute-capability tuples.
ARCHS = {
    "sm_80": (8, 0),
    "sm_89": (8, 9),
    "sm_90a": (9, 0, "a"),
    "sm_100a": (10, 0, "a"),
    "sm_120a": (12, 0, "a"),
}


class AssemblyError(RuntimeError):
    """nvJitLink refused the PTX; the message holds the assembler's log."""


def cc_of(arch):
    """'sm_90a' -> (9, 0, 'a')."""
    if arch in ARCHS:
        return ARCHS[arch]
    digits = arch.removeprefix("sm_")
    suffix = digits[-1] if digits[-1].isalpha() else ""
    digits = digits.rstrip("af")
    cc = (int(digits[:-1]), int(digits[-1]))
    return cc + ((suffix,) if suffix else ())


def arch_name(cc):
    return "sm_%d%d%s" % (cc[0], cc[1], cc[2] if len(cc) > 2 else "")


class _TargetDevice:
    """Stands in for the current device while compiling without a GPU (see _device_shim)."""

    def __init__(self, cc):
        self.compute_capability = cc[:2]


@contextlib.contextmanager
def _device_shim(cc):
    """numba-cuda compiles a kernel's *device* functions for ``get_current_device()``'s
    capability (dispatcher.compile_device), which needs a driver.  Without a GPU, answer with the
    target being compiled for; with one, change nothing."""
    from numba.cuda import dispatcher

    if cuda.is_available():
        yield
        return
    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _TargetDevice(cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original


def compile_ptx(pyfunc, sig, arch, **options):
    """PTX text of ``pyfunc`` (a plain Python function, or a ``cuda.jit`` dispatcher) compiled
    as a kernel with signature ``sig`` for ``arch`` ('sm_90a' or a cc tuple).  Works without a
    GPU, device functions included."""
    cc = cc_of(arch) if isinstance(arch, str) else tuple(arch)
    pyfunc = getattr(pyfunc, "py_func", pyfunc)
    with _device_shim(cc):
        ptx, _ = cuda.compile_ptx(pyfunc, sig, cc=cc, **options)
    return ptx


def assemble(ptx, arch, name="kernel"):
    """Assemble PTX into a cubin for ``arch`` with nvJitLink; returns the cubin bytes."""
    from cuda.bindings import nvjitlink

    arch = arch if isinstance(arch, str) else arch_name(arch)
    handle = nvjitlink.create(2, [f"-arch={arch}", "-O3"])
    try:
        data = ptx.encode() if isinstance(ptx, str) else ptx
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), name)
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            nvjitlink.get_error_log(handle, log)
            text = bytes(log).rstrip(b"\0").decode(errors="replace")
            raise AssemblyError(f"nvJitLink could not assemble {name} for {arch}: {exc}\n{text}")
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)
