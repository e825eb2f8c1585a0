"""Thread and process safety of first use, on the CPU: the generated-kernel loader
(numbatc.kernels.build.load_generated) hammered by threads and by processes sharing one cache directory
(NUMBATC_CACHE_DIR), a torn cache file, and the first touch of numba's device list.

Each test starts its threads at one barrier, many rounds over, each round in a fresh cache
directory, so that the races it guards against (two threads' temporary files, two imports of one
kernel, two fills of numba's device list) are hit, not hoped for."""

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from numbatc.kernels import build

ROOT = pathlib.Path(__file__).resolve().parents[1]

THREADS = 8
ROUNDS = 12


def _source(i, pad=400):
    # a module load_generated accepts: it defines gemm_kernel; the padding makes writes long
    # enough for a second writer to meet the first
    return f"gemm_kernel = ('kernel', {i})\n" + "# padding\n" * pad


def _run_threads(fn, n=THREADS):
    """fn(i) in n threads started together; (results, errors) by thread."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, [None] * n

    def body(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A function returning a new, empty NUMBATC_CACHE_DIR (and forgetting loaded modules)."""
    count = [0]

    def make():
        count[0] += 1
        root = tmp_path / f"cache{count[0]}"
        monkeypatch.setenv("NUMBATC_CACHE_DIR", str(root))
        monkeypatch.setattr(build, "_MODULES", {}, raising=False)
        return root / "kernels"

    return make


def test_cache_dir_follows_the_environment_variable(fresh_cache):
    where = fresh_cache()
    assert build.cache_dir() == where
    assert where.is_dir()


def test_threads_loading_one_kernel_at_once(fresh_cache):
    """8 threads of one process load the same new kernel at once: none fails (the old loader's
    per-process temporary name made one thread's os.replace find its file gone), all get the
    same kernel object (one import, so numba compiles once), the file is whole and no temporary
    file is left."""
    for _ in range(ROUNDS):
        where = fresh_cache()
        source = _source(7)
        results, errors = _run_threads(lambda i: build.load_generated("thr", source))
        assert errors == [None] * THREADS, [e for e in errors if e is not None][0]
        assert all(r is results[0] for r in results), "threads got different kernel objects"
        assert results[0] == ("kernel", 7)
        files = sorted(p.name for p in where.iterdir() if p.is_file())
        assert len(files) == 1 and files[0].startswith("thr_") and files[0].endswith(".py"), files
        assert (where / files[0]).read_text() == source


def test_threads_loading_different_kernels_at_once(fresh_cache):
    """Threads loading different kernels (and some the same) into one directory at once."""
    for _ in range(ROUNDS):
        where = fresh_cache()
        results, errors = _run_threads(
            lambda i: build.load_generated("mix", _source(i % 3)))
        assert errors == [None] * THREADS, [e for e in errors if e is not None][0]
        assert [r[1] for r in results] == [i % 3 for i in range(THREADS)]
        assert len(list(where.glob("mix_*.py"))) == 3
        assert not list(where.glob("*.tmp"))


def test_a_torn_cache_file_is_rewritten(fresh_cache):
    """A cache file that does not hold the source (a write cut short by an older numbatc, a full
    disk) is replaced, not imported."""
    where = fresh_cache()
    source = _source(3)
    build.load_generated("torn", source)
    (path,) = where.glob("torn_*.py")
    path.write_text(source[: len(source) // 3] + "gemm_kernel = (")  # a SyntaxError
    fresh_cache_modules = build._MODULES
    fresh_cache_modules.clear()
    assert build.load_generated("torn", source) == ("kernel", 3)
    assert path.read_text() == source


def test_user_globals_make_their_own_module(fresh_cache):
    """One generated file, two user epilogues: each gets its own module (USER_EPILOGUE set on
    it), the same one for the same function."""
    fresh_cache()
    source = "def gemm_kernel():\n    return USER_EPILOGUE\n"

    def f():
        pass

    def g():
        pass

    kf = build.load_generated("epi", source, USER_EPILOGUE=f)
    kg = build.load_generated("epi", source, USER_EPILOGUE=g)
    assert kf() is f and kg() is g
    assert build.load_generated("epi", source, USER_EPILOGUE=f) is kf


_PROCESS = textwrap.dedent("""
    import sys, threading, time
    from numbatc.kernels import build

    start, n = float(sys.argv[1]), int(sys.argv[2])
    while time.time() < start:
        time.sleep(0.001)
    errors = []

    def body(t):
        try:
            for i in range(n):
                src = f"gemm_kernel = ('kernel', {i})\\n" + "# padding\\n" * 400
                assert build.load_generated("proc", src) == ("kernel", i)
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=body, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("ERRORS" if errors else "OK", *errors)
""")


def test_two_processes_fill_one_cache_directory(tmp_path):
    """Two processes, each with 8 threads, fill one NUMBATC_CACHE_DIR with the same 40 kernels
    at once: both succeed and the directory holds each kernel once, whole."""
    # the children import this checkout's numbatc, not whichever one is installed
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env = dict(os.environ, NUMBATC_CACHE_DIR=str(tmp_path / "shared"), PYTHONPATH=path)
    script = tmp_path / "fill.py"
    script.write_text(_PROCESS)
    start = time.time() + 3.0  # both interpreters up by then
    procs = [subprocess.Popen([sys.executable, str(script), str(start), "40"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.startswith("OK"), out + err
    where = tmp_path / "shared" / "kernels"
    files = sorted(where.glob("proc_*.py"))
    assert len(files) == 40
    assert not list(where.glob("*.tmp"))
    assert sorted(f.read_text().split("\n", 1)[0] for f in files) == sorted(
        f"gemm_kernel = ('kernel', {i})" for i in range(40))


# ---------------------------------------------------------------------------------------------
# numba's device list, filled on first touch
# ---------------------------------------------------------------------------------------------


class _RacyDriver:
    """numba-cuda's Driver as far as its device list goes: get_device checks, then inserts into
    a dict that refuses a second insert (numba's UniqueDict), with time between the two."""

    def __init__(self):
        self.devices = {}

    def get_device_count(self):
        return 1

    def get_device(self, devnum=0):
        dev = self.devices.get(devnum)
        if dev is None:
            time.sleep(0.01)  # cuDeviceGet and the device's attributes
            dev = _FakeDevice(devnum)
            if devnum in self.devices:
                raise AssertionError(f"key already in dictionary: {devnum}")
            self.devices[devnum] = dev
        return dev


class _FakeDevice:
    def __init__(self, devnum):
        self.id = devnum
        self.compute_capability = (9, 0)

    def get_primary_context(self):
        raise AssertionError("not used")


def test_first_device_touch_from_threads(monkeypatch):
    """8 threads making their first numbatc call at once touch numba's lazily filled device list
    together: numbatc fills it under a lock (numba's own check-then-insert died on
    'AssertionError: key already in dictionary: 0')."""
    from numba import cuda
    from numba.cuda.cudadrv import devices

    from numbatc.interop import devices as numbatc_devices

    for _ in range(ROUNDS // 2):
        monkeypatch.setattr(devices, "driver", _RacyDriver())
        monkeypatch.setattr(cuda, "gpus", devices._DeviceList())  # lst not yet filled
        monkeypatch.setattr(numbatc_devices, "_devices_ready", False, raising=False)
        results, errors = _run_threads(lambda i: numbatc_devices.device_scope(0).compute_capability)
        assert errors == [None] * THREADS, [e for e in errors if e is not None][0]
        assert results == [(9, 0)] * THREADS


# ---------------------------------------------------------------------------------------------
# intrinsics.launch: a kernel's plan and a stream's object, made once
# ---------------------------------------------------------------------------------------------


def test_threads_first_launch_make_one_plan(monkeypatch):
    """Threads launching one kernel for the first time at once: one compile-load-configure
    (intrinsics.launch._plan), the same plan for all."""
    from numba import cuda

    from intrinsics import launch

    made = []

    def slow_plan(kernel, signature, shared_bytes, cluster, whole_program):
        made.append(kernel)
        time.sleep(0.02)  # compiling
        return (object(), object())

    monkeypatch.setattr(launch, "_plan", slow_plan)
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(cuda, "get_current_device", lambda: type("D", (), {"id": 0})())
    for round_ in range(ROUNDS // 2):
        kernel = f"kernel{round_}"
        results, errors = _run_threads(
            lambda i: launch._plan_for(kernel, ("sig",), 0, None, None))
        assert errors == [None] * THREADS
        assert all(r is results[0] for r in results)
    assert len(made) == ROUNDS // 2, f"{len(made)} plans made for {ROUNDS // 2} kernels"


def test_threads_first_use_of_a_stream_make_one_object(monkeypatch):
    from cuda import core

    from intrinsics import launch

    made = []

    def slow_from_handle(handle):
        made.append(handle)
        time.sleep(0.01)
        return ("stream", handle)

    monkeypatch.setattr(core, "Stream", type("Stream", (), {
        "from_handle": staticmethod(slow_from_handle)}))
    monkeypatch.setattr(launch, "_STREAMS", {})
    results, errors = _run_threads(lambda i: launch._core_stream(0x1234))
    assert errors == [None] * THREADS
    assert all(r is results[0] for r in results) and made == [0x1234]
