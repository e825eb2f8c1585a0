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


def nvdisasm_path():
    """The ``nvdisasm`` binary: the one on PATH, else the one the ``nvidia-cuda-nvdisasm`` wheel
    (the test extra) installs under site-packages' nvidia/cu*/bin; None without either."""
    exe = shutil.which("nvdisasm")
    if exe is not None:
        return exe
    import importlib.util
    import os
    import pathlib

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for candidate in sorted(pathlib.Path(root).glob("cu*/bin/nvdisasm"), reverse=True):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def disassemble(cubin):
    """The SASS text of ``cubin`` (a path) from ``nvdisasm``; skips without one."""
    exe = nvdisasm_path()
    if exe is None:
        pytest.skip("no nvdisasm binary (PATH or the nvidia-cuda-nvdisasm wheel)")
    return subprocess.run([exe, str(cubin)], capture_output=True, text=True, check=True).stdout


def _instructions(sass):
    """[(address, instruction text without its predicate)] and {label: address} of SASS text."""
    code, labels, address = [], {}, 0
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = address
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            address = int(m.group(1), 16)
            code.append((address, re.sub(r"^@!?U?P\w+\s+", "", m.group(2))))
            address += 16
    return code, labels


def main_loop(sass, mma="HMMA"):
    """The basic blocks of the SASS loop (a backward branch's range) holding the most ``mma``
    instructions -- a GEMM's k loop -- as lists of instruction texts (predicates removed)."""
    code, labels = _instructions(sass)
    best = None
    for address, text in code:
        target = re.match(r"BRA\s+(?:\S+\s+)?`\((\.L_x_\d+)\)", text)
        if not target or labels.get(target.group(1), address + 1) > address:
            continue
        lo = labels[target.group(1)]
        body = [(a, t) for a, t in code if lo <= a <= address]
        count = sum(t.startswith(mma) for _, t in body)
        if best is None or count > best[0]:
            best = (count, lo, address)
    if best is None:
        return []
    _, lo, hi = best
    starts = set(labels.values())
    blocks, block = [], []
    for a, t in code:
        if not lo <= a <= hi:
            continue
        if a in starts and block:
            blocks.append(block)
            block = []
        block.append(t)
        if t.startswith("BRA"):
            blocks.append(block)
            block = []
    if block:
        blocks.append(block)
    return blocks
