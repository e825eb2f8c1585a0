"""Building and loading kernels: the disk cache every kernel module compiles through.

Kernels written as code (factory-made ``@cuda.jit`` functions, sm90_gemm_tma's) take the disk
cache through :func:`cache_kernel`.  Kernels written as text: a kernel module renders its kernel
as Python source (one module per configuration and variant) and hands it to
:func:`load_generated`, which writes it to the cache directory (once, atomically) and imports it
from there, so that numba's on-disk cache (``cache=True``) keeps the compiled kernel next to it
between processes.  The file is named by the kernel family (``prefix``) and a
hash of the source together with the source of numbatc and intrinsics (every ``.py`` file, with
its path), so any change to either package, or to the generated text, gives a new file: a stale
entry is never loaded, whichever module the code that generated it lives in.

To see what a generated kernel module compiles, print its ``kernel_source(cfg, var)``; the files
under :func:`cache_dir` are the same text.  A kernel written as code is its module's source
(sm90_gemm_tma.describe names its constants).
"""

import contextlib
import functools
import hashlib
import importlib.util
import os
import pathlib
import threading
import uuid

__all__ = ["cache_dir", "cache_kernel", "load_generated"]


@functools.cache
def _source_fingerprint():
    """Hash of numbatc's and intrinsics' sources: part of every generated kernel's file name, so
    the on-disk cache is invalidated whenever either package changes.  Each file enters with its
    path (relative to its package) and length, so that moving code from one module to another
    cannot give the fingerprint of another tree."""
    digest = hashlib.sha256()
    for package in ("numbatc", "intrinsics"):
        root = pathlib.Path(importlib.util.find_spec(package).origin).parent
        for path in sorted(root.rglob("*.py")):
            data = path.read_bytes()
            name = f"{package}/{path.relative_to(root).as_posix()}"
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
    return digest.hexdigest()[:16]


def cache_dir():
    """Where generated kernels (and numba's cache of them) live: $NUMBATC_CACHE_DIR, else
    ~/.cache/numbatc."""
    root = os.environ.get("NUMBATC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "numbatc")
    path = pathlib.Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


#: (file path, ids of module_globals) -> (the module imported from it, the globals' values).
_MODULES: dict = {}
_MODULES_LOCK = threading.Lock()


def load_generated(prefix, source, *, entry="gemm_kernel", **module_globals):
    """Write generated kernel source to the cache directory (once, atomically) and import it;
    the file name hashes the source with numbatc's and intrinsics' own, so numba's on-disk cache
    next to it is never stale.  ``module_globals`` are set on the module before it runs (a user
    epilogue function).  Returns the module's attribute named ``entry``: the
    kernel (``gemm_kernel`` for the GEMM families, ``attention_kernel``, ``softmax_kernel`` ...).

    Safe from many threads and processes at once: each writer writes its own temporary file
    (in the same directory, named by process, thread and a random part) and renames it over the
    final name (atomic on POSIX and Windows), so a reader sees no file or a whole one; a file
    whose text is not the source (a torn write from an older numbatc, a disk error) is
    rewritten.  In one process one module is imported per (file, module_globals) (under a
    lock), so threads asking for the same kernel at once get the same dispatcher and numba
    compiles it once."""
    digest = hashlib.sha256((_source_fingerprint() + source).encode()).hexdigest()[:20]
    path = cache_dir() / f"{prefix}_{digest}.py"
    key = (str(path), tuple(sorted((name, id(value)) for name, value in module_globals.items())))
    with _MODULES_LOCK:
        found = _MODULES.get(key)
        if found is not None:
            return getattr(found[0], entry)
        _write_once(path, source)
        spec = importlib.util.spec_from_file_location(f"numbatc_generated.{prefix}_{digest}",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        for name, value in module_globals.items():  # before the module runs: it may use them
            setattr(module, name, value)
        spec.loader.exec_module(module)
        # the values are kept with the module: their ids in the key stay theirs
        _MODULES[key] = (module, tuple(module_globals.values()))
    return getattr(module, entry)


def _write_once(path, source):
    """Make ``path`` hold ``source``: left alone when it already does, else written to a
    temporary file of this call's own and renamed over ``path``."""
    try:
        if path.read_text() == source:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    # a name no other thread or process uses; "x" creates it (with the umask's permissions,
    # which tempfile.mkstemp's 0600 would not keep for a cache shared between users)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}."
                         f"{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cache_kernel(kernel, family, key):
    """Give ``kernel`` -- a ``cuda.jit`` dispatcher a factory made (its constants closure
    values) -- numba's disk cache in :func:`cache_dir`, one index per (family, key): ``key``
    names the factory's arguments (their reprs), and the index is stamped with numbatc's and
    intrinsics' source fingerprint, so a change to either package, or other arguments, never
    loads a stale kernel.  Returns ``kernel``.

    Why not ``cache=True``: numba's own index of a closure sits next to the factory's source
    (one index for every kernel the factory makes) and is keyed by a pickle of the closure's
    values (the device functions among them, pickled by value): their callees' modules
    (intrinsics) do not enter it, so a change there would load a stale kernel."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return kernel
    digest = hashlib.sha256(f"{family}\0{key}".encode()).hexdigest()[:20]
    kernel._cache = _keyed_cache()(kernel.py_func, f"{family}_{digest}")
    return kernel


@functools.cache
def _keyed_cache():
    """numba-cuda's CUDACache, its index named and stamped by numbatc (see cache_kernel)."""
    import numba_cuda
    from numba.cuda.core.caching import IndexDataCacheFile
    from numba.cuda.dispatcher import CUDACache

    class KeyedCache(CUDACache):
        def __init__(self, py_func, name):
            super().__init__(py_func)
            self._cache_path = str(cache_dir())
            self._cache_file = IndexDataCacheFile(cache_path=self._cache_path,
                                                  filename_base=name,
                                                  source_stamp=_source_fingerprint())
            self._launch_config_marker_path = os.path.join(self._cache_path, f"{name}.lcs")
            self.name = name  # the index's file name, less .nbi

        def _index_key(self, sig, codegen):
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, self.name)
            if self._launch_config_key is not None:
                key += (("launch_config", self._launch_config_key),)
            return key

    return KeyedCache
