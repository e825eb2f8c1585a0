"""Tensor maps passed by value, without a GPU: numbatc.kernels.tensor_maps' relaunch memo
(LastMaps) answers a repeat of the last pointers without building maps and builds for new ones;
a map's kernel parameter is its 128 bytes; intrinsics.grid_constant makes numba declare such a
parameter as CUDA C++'s ``__grid_constant__`` (128 bytes, 64-aligned, read in place through
``cvta.param``), also through a device function; intrinsics.launch lays the bytes out and packs
them where the kernel's .entry has them."""

import re
import struct

import numpy as np
import pytest

from numbatc.kernels.tensor_maps import LastMaps


class Param:
    def __init__(self, blob):
        self.blob = blob


class Map:
    """A stand-in tensor map whose by-value parameter is known (map_params reads it)."""

    def __init__(self, tag):
        self.param = Param(bytes([tag]) * 128)


def test_repeat_pointers_reuse_the_parameters():
    built = []

    def make(a, b):
        built.append((a, b))
        return Map(a), Map(b)

    last = LastMaps()
    one, two, three = (bytes([t]) * 128 for t in (1, 2, 3))
    assert last.params((1, 2), make, 1, 2) == (one, two)
    assert last.params((1, 2), make, 1, 2) == (one, two)
    assert built == [(1, 2)]
    assert last.params((1, 3), make, 1, 3) == (one, three)
    assert built == [(1, 2), (1, 3)]


def test_cache_holds_host_maps_only(monkeypatch):
    """The map cache is dropped whole at its limit: safe now that no device memory (and no
    graph) depends on a cached map -- a launch carries the map's bytes."""
    from numbatc.kernels import tensor_maps

    key = (4096, "bfloat16", (64, 64), (128,), (64, 64), tensor_maps.SWIZZLE)
    cached = Map(4)
    monkeypatch.setitem(tensor_maps._MAPS, key, cached)
    assert tensor_maps.tiled_map(4096, "bfloat16", (64, 64), (128,), (64, 64)) is cached
    assert tensor_maps.map_params(cached) == (bytes([4]) * 128,)


def _entry_params(ptx):
    entry = re.search(r"\.entry[^(]*\(([^)]*)\)", ptx).group(1)
    # (alignment of an aggregate, type, index, [bytes]); pointers may read .u64 .ptr .align 1
    return re.findall(r"\.param (?:\.align (\d+) )?\.(\w+)(?: \.ptr)?(?: \.align \d+)?\s+"
                      r"\S+?_param_(\d+)(\[\d+\])?", entry)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_param_map_is_a_grid_constant_in_the_ptx(arch):
    """Two by-value maps, one of them used only inside a device function: both are 128-byte,
    64-aligned .param entries whose address (mov + cvta.param) the TMA instructions read; the
    layout packs their bytes at the entry's offsets; ptxas assembles it.  For each target, as
    libNVVM reads a different byval spelling below and from sm_100 (grid_constant's
    _UntypedByval)."""
    from numba import cuda, types

    import intrinsics as nt
    from intrinsics.grid_constant import tensormap_param
    from intrinsics.launch import PreparedLaunch, param_layout
    from intrinsics.toolchain import assemble, compile_ptx

    @cuda.jit(device=True)
    def load(sm, tm, bars, k):
        nt.tma_load(sm, 0, tm, (k, 0), bars, 0)

    def kernel(out, ta, tb, n):
        sm = cuda.shared.array(2048, np.float32)
        bars = cuda.shared.array(1, np.uint64)
        nt.tma_prefetch_descriptor(ta)
        nt.tensormap_fence_acquire(ta)  # nothing to acquire for a parameter: no instruction
        load(sm, ta, bars, n)
        nt.tma_load(sm, 1024, tb, (n, 1), bars, 0)
        nt.tma_store(tb, (0, 0), sm, 0)

    sig = (types.float32[:], tensormap_param, tensormap_param, types.int32)
    ptx = compile_ptx(kernel, sig, arch)
    assemble(ptx, arch)
    params = _entry_params(ptx)
    assert [(a, t, n) for a, t, _, n in params][7:] == [("64", "b8", "[128]"), ("64", "b8", "[128]"),
                                                        ("", "u32", "")]
    assert "fence.proxy.tensormap" not in ptx
    for index in ("7", "8"):
        reg = re.search(rf"mov\.b64\s+(%rd\d+), \S+_param_{index};", ptx).group(1)
        generic = re.search(rf"cvta\.param\.u64\s+(%rd\d+), {re.escape(reg)};", ptx).group(1)
        assert re.search(rf"cp\.async\.bulk\.tensor\S+ \[[^]]*\], \[{re.escape(generic)},", ptx)
    assert ptx.count("cp.async.bulk.tensor") == 3

    fmt, offsets = param_layout(sig)
    assert offsets == [0, 8, 16, 24, 32, 40, 48, 64, 192, 320]
    ta, tb = bytes(range(128)), bytes(range(128, 256))
    prep = PreparedLaunch(0, (1, 1, 1), (32, 1, 1), 0, (fmt, offsets))
    raw = prep.pack(0, 0, 4, 4, 0x1000, 4, 4, ta, tb, 9)
    assert raw[64:192] == ta and raw[192:320] == tb
    assert struct.unpack_from("<i", raw, 320)[0] == 9


def test_float_slots_skip_padding_and_blobs():
    """A float beyond float32 still becomes inf where maps and padding sit before it."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param
    from intrinsics.launch import PreparedLaunch, param_layout

    sig = (types.int32, tensormap_param, types.float32)
    fmt, offsets = param_layout(sig)
    assert offsets == [0, 64, 192]
    prep = PreparedLaunch(0, (1, 1, 1), (32, 1, 1), 0, (fmt, offsets))
    raw = prep.pack(3, bytes(128), 1e39)
    assert np.frombuffer(raw[192:196], np.float32)[0] == np.inf


def test_flat_params_of_a_by_value_launch():
    from numba import types

    from intrinsics.grid_constant import TensorMapParam, tensormap_param
    from intrinsics.launch import LaunchError, flat_params, has_param_blobs

    class Dev:
        __cuda_array_interface__ = {"data": (0x2000, False), "shape": (3, 4), "strides": None,
                                    "typestr": "<f4", "version": 3}

    blob = bytes(range(128))
    sig = (types.float32[:, :], tensormap_param, types.UniTuple(types.int64, 2),
           types.CPointer(types.uint16))
    assert has_param_blobs(sig) and not has_param_blobs(sig[:1] + sig[2:])
    assert flat_params(sig, (Dev(), TensorMapParam(None, blob), (5, 6), 0x3000)) == [
        0, 0, 12, 4, 0x2000, 3, 4, 16, 4, blob, 5, 6, 0x3000]
    with pytest.raises(LaunchError, match="on the device"):
        flat_params(sig, (np.zeros((3, 4), np.float32), TensorMapParam(None, blob), (5, 6), 0))
    with pytest.raises(LaunchError, match="TensorMap.param"):
        flat_params(sig[1:2], (TensorMapParam(None, None),))
    with pytest.raises(ValueError, match="128 bytes"):
        TensorMapParam(None, bytes(16))
    with pytest.raises(LaunchError, match="takes 4 arguments"):
        flat_params(sig, (Dev(), TensorMapParam(None, blob)))


def test_launched_kernels_get_the_grid_constant_too():
    """The path a launch compiles through (numba's dispatcher, which calls its own imported
    kernel_fixup; here under precompile's stand-in of an sm_90a device): the map is the 64-aligned
    128-byte parameter, not a pointer whose value would be the map's first word (what the H200
    read before both names were wrapped), in the default Hopper GEMM kernel as well."""
    from numba import cuda

    import intrinsics as nt
    from intrinsics.grid_constant import tensormap_param
    from intrinsics.launch import compile_kernel
    from numbatc.kernels import sm90_gemm_tma
    from numbatc.precompile import _target

    @cuda.jit
    def kernel(tm, out):
        sm = cuda.shared.array(1024, np.float32)
        bars = cuda.shared.array(1, np.uint64)
        nt.tma_load(sm, 0, tm, (0, 0), bars, 0)
        out[0] = sm[0]

    from numba import types

    with _target((9, 0, "a")):
        compiled = compile_kernel(kernel, (tensormap_param, types.float32[:]))
    ptx = compiled._codelibrary.get_asm_str(cc=(9, 0, "a"))
    assert [(a, t, n) for a, t, _, n in _entry_params(ptx)][0] == ("64", "b8", "[128]")
    assert "cvta.param.u64" in ptx
    from numbatc.kernels.epilogue import GemmVariant  # the GEMM's maps are that type

    var = GemmVariant("row", "col", "bfloat16", "float32", None, "bfloat16", None)
    assert sm90_gemm_tma.signature(var)[:2] == (tensormap_param, tensormap_param)
