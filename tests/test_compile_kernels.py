"""intrinsics.launch's first-call levers (CPU, sm_90a through numbatc.precompile's stand-in
device): a kernel linked by LTO gets no PTX from numba's compile (_ptx_on_demand) and the same
code; compile_kernels links each kernel in a thread while the next one types, binds and saves
every kernel to the disk cache before it returns, and raises a link's error in the caller."""

import importlib
import re
import threading

import pytest

CC = (9, 0, "a")

SOURCE = '''
from numba import cuda


@cuda.jit(cache=True)
def first(x, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * 2.0 + 1.0


@cuda.jit(cache=True)
def second(x, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * x[i] - 3.0
'''


def _sig():
    from numba import types

    return (types.float32[::1], types.int64)


def _kernels(tag):
    """``first`` and ``second`` of a generated module of their own (``tag`` makes the text, and
    so the module, new: numba compiles them here)."""
    from numbatc.kernels.build import load_generated

    source = SOURCE + f"\n# {tag}\n"
    return [load_generated("test_compile_kernels", source, entry=name)
            for name in ("first", "second")]


def _names_out(ptx):
    return re.sub(r"_Z\w+", "NAME", ptx)


@pytest.fixture
def target(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBATC_CACHE_DIR", str(tmp_path))
    pc = importlib.import_module("numbatc.precompile")
    with pc._target(CC):
        yield tmp_path


def test_lto_kernel_compiles_without_ptx(target, monkeypatch):
    """The kernel's library holds no PTX after compile_kernel, its cubin is linked, and the PTX
    made when asked is NVVM's, the same as numba's eager order makes (names aside)."""
    from intrinsics import launch as launching

    [lazy, _] = _kernels("lazy")
    compiled = launching.compile_kernel(lazy, _sig())
    library = compiled._codelibrary
    assert library._lto and not library._ptx_cache
    assert library._cubin_cache  # bound (precompile's stand-in: the cubin)
    monkeypatch.setenv("NUMBATC_EAGER_PTX", "1")
    [eager, _] = _kernels("eager")
    reference = launching.compile_kernel(eager, _sig())._codelibrary
    assert reference._ptx_cache  # numba's order: the PTX before the link
    assert _names_out(library.get_asm_str(cc=CC)) == _names_out(reference.get_asm_str(cc=CC))
    assert len(library.get_cubin(cc=CC).code) == len(reference.get_cubin(cc=CC).code)


def _link_threads(monkeypatch):
    """The names of the threads that link a cubin from now on (a list that fills)."""
    from numba.cuda import codegen

    threads = []
    original = codegen.CUDACodeLibrary.get_cubin

    def recording(self, cc=None):
        threads.append(threading.current_thread().name)
        return original(self, cc)

    monkeypatch.setattr(codegen.CUDACodeLibrary, "get_cubin", recording)
    return threads


def test_compile_kernels_links_in_threads_and_saves(target, monkeypatch):
    from numba.cuda import dispatcher

    from intrinsics import launch as launching

    threads = _link_threads(monkeypatch)
    bind = dispatcher._Kernel.bind
    kernels = _kernels("threads")
    compiled = launching.compile_kernels([(k, _sig()) for k in kernels])
    assert dispatcher._Kernel.bind is bind  # the deferral is off again
    assert len(compiled) == 2 and all(c._codelibrary._cubin_cache for c in compiled)
    assert threads.count("numbatc-link") == 2, threads
    # saved after the link: a cubin in each index's entry, loaded by a new dispatcher
    indexes = sorted(p.name for p in target.rglob("*.nbi"))
    assert len(indexes) == 2, indexes
    again = _kernels("threads")  # the same file: numba's cache loads what was saved
    for kernel in again:
        kernel.overloads.clear()
        kernel._cache_hits.clear()
        loaded = launching.compile_kernel(kernel, _sig())
        assert kernel._cache_hits[_sig()] == 1
        assert loaded._codelibrary._cubin_cache


def test_compile_kernels_raises_a_link_error(target, monkeypatch):
    from numba.cuda import codegen, dispatcher

    from intrinsics import launch as launching

    def failing(self, cc=None):
        raise RuntimeError("the link failed")

    monkeypatch.setattr(codegen.CUDACodeLibrary, "get_cubin", failing)
    bind = dispatcher._Kernel.bind
    with pytest.raises(RuntimeError, match="the link failed"):
        launching.compile_kernels([(k, _sig()) for k in _kernels("error")])
    assert dispatcher._Kernel.bind is bind
    assert not list(target.rglob("*.nbi"))  # nothing saved without a cubin


def test_serial_switch_compiles_one_after_another(target, monkeypatch):
    from intrinsics import launch as launching

    monkeypatch.setenv("NUMBATC_SERIAL_LINK", "1")
    threads = _link_threads(monkeypatch)
    launching.compile_kernels([(k, _sig()) for k in _kernels("serial")])
    assert threads and "numbatc-link" not in threads
