"""What the assemblers make of a kernel's PTX, shared by the compile tests: nvJitLink's info log
(the project toolchain's path, which compiles relocatable code), whole-program ``ptxas -v``
(as the driver's JIT compiles a module; skips without a ``ptxas`` binary on PATH) and the SASS
of its cubin (``nvdisasm``; skips without one on PATH)."""

import re
import shutil
import subprocess

import pytest


def nvjitlink_info_log(ptx, arch="sm_90a", options=("-O3",)):
    """Assemble with nvJitLink as the project's toolchain does and return its info log."""
    from cuda.bindings import nvjitlink

    opts = [f"-arch={arch}", *options]
    handle = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        size = nvjitlink.get_info_log_size(handle)
        log = bytearray(size)
        if size:
            nvjitlink.get_info_log(handle, log)
        return bytes(log).rstrip(b"\0").decode(errors="replace")
    finally:
        nvjitlink.destroy(handle)


def whole_program_ptxas(ptx, tmp_path, arch="sm_90a"):
    """Run ``ptxas -v -arch=<arch>`` (whole-program, as the driver's JIT compiles a module) on
    ``ptx``, writing ``tmp_path / "kernel.cubin"``; returns its log.  An older ptxas gets the PTX
    with its own ``.version`` (the kernels use nothing newer than PTX 8.0)."""
    exe = shutil.which("ptxas")
    if exe is None:
        pytest.skip("no ptxas binary on PATH")
    src = tmp_path / "kernel.ptx"
    for _ in range(2):
        src.write_text(ptx)
        run = subprocess.run(
            [exe, "-v", f"-arch={arch}", str(src), "-o", str(tmp_path / "kernel.cubin")],
            capture_output=True, text=True,
        )
        log = run.stdout + run.stderr
        if run.returncode == 0:
            return log
        newest = re.search(r"Unsupported \.version \S+; current version is '([\d.]+)'", log)
        if newest is None:
            break
        ptx = re.sub(r"^\.version \S+", f".version {newest.group(1)}", ptx, flags=re.M)
    pytest.fail(f"ptxas failed:\n{log}")


def disassemble(cubin):
    """The SASS text of ``cubin`` (a path) from ``nvdisasm``; skips without one on PATH."""
    exe = shutil.which("nvdisasm")
    if exe is None:
        pytest.skip("no nvdisasm binary on PATH")
    return subprocess.run([exe, str(cubin)], capture_output=True, text=True, check=True).stdout
