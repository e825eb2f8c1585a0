"""Fences, elect.sync, cluster special registers, the cluster barrier and DSMEM: every intrinsic
compiles, holds its instruction and assembles on sm_90a, sm_100a and sm_120a, and is refused
with a clear error on sm_80 and sm_89 (nvJitLink refuses all of these instructions there)."""

import re

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

import intrinsics.cluster as cl
from intrinsics._core import SM90
from intrinsics.toolchain import compile_ptx
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

SIG = (types.uint32[:], types.float32[:])


def _statement_kernel(name):
    fn = getattr(cl, name)

    def kernel(out, f):
        out[0] = 1
        fn()
        out[1] = 2

    return kernel


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("name", list(cl.STATEMENTS))
def test_statement(name, arch):
    ptx_text = cl.STATEMENTS[name][0]
    expected = [line.strip() for line in ptx_text.split("\n")]
    ptx = check_on_arch(_statement_kernel(name), SIG, arch, SM90, expected)
    if ptx is not None and name == "cluster_sync":
        assert ptx.index("barrier.cluster.arrive.release") < ptx.index("barrier.cluster.wait")


def _register_kernel(name):
    fn = getattr(cl, name)
    if cl.SPECIAL_REGISTERS[name][1]:
        def kernel(out, f):
            x, y, z = fn()
            out[0] = x
            out[1] = y
            out[2] = z
    else:
        def kernel(out, f):
            out[0] = fn()
    return kernel


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("name", list(cl.SPECIAL_REGISTERS))
def test_special_register(name, arch):
    register, components, _ = cl.SPECIAL_REGISTERS[name]
    names = [f"{register}.{c}" for c in components] if components else [register]
    expected = [f"{reg};" for reg in names]
    ptx = check_on_arch(_register_kernel(name), SIG, arch, SM90, expected)
    if ptx is not None:
        for reg in names:
            assert re.search(r"mov\.u32 \t?%r\d+, " + re.escape(reg) + ";", ptx)


def k_elect(out, f):
    if cl.elect_sync():
        out[cuda.threadIdx.x] = 1


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_elect_sync(arch):
    check_on_arch(k_elect, SIG, arch, SM90, ["elect.sync _|P1, 0xffffffff;", "selp.u32"])


def k_mapa(out, f):
    buf = cuda.shared.array(64, np.uint32)
    out[0] = cl.map_shared_rank(buf, out[1], out[2])


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_map_shared_rank(arch):
    ptx = check_on_arch(k_mapa, SIG, arch, SM90, [])
    if ptx is not None:
        assert re.search(r"mapa\.shared::cluster\.u32 %r\d+, %r\d+, %r\d+;", ptx)


def k_load_u32(out, f):
    buf = cuda.shared.array(64, np.uint32)
    out[0] = cl.dsmem_load_u32(buf, out[1], out[2])


def k_load_u32_from_int32(out, f):
    buf = cuda.shared.array(64, np.int32)
    out[0] = cl.dsmem_load_u32(buf, out[1], out[2])


def k_load_f32(out, f):
    buf = cuda.shared.array(64, np.float32)
    f[0] = cl.dsmem_load_f32(buf, out[1], out[2])


def k_store_u32(out, f):
    buf = cuda.shared.array(64, np.uint32)
    cl.dsmem_store_u32(buf, out[1], out[2], out[3])


def k_store_f32(out, f):
    buf = cuda.shared.array(64, np.float32)
    cl.dsmem_store_f32(buf, out[1], out[2], f[3])


# NOTE: NVVM keeps float32 values in %f registers for sm_90a and in untyped %r registers for
# sm_100a and newer, so the patterns do not name the register class.
DSMEM = {
    "load_u32": (k_load_u32, ["ld.shared::cluster.b32 %"]),
    "load_u32_int32_array": (k_load_u32_from_int32, ["ld.shared::cluster.b32 %"]),
    "load_f32": (k_load_f32, ["ld.shared::cluster.b32 %"]),
    "store_u32": (k_store_u32, ["st.shared::cluster.b32 [remote], %"]),
    "store_f32": (k_store_f32, ["st.shared::cluster.b32 [remote], %"]),
}


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("case", list(DSMEM))
def test_dsmem(case, arch):
    kernel, expected = DSMEM[case]
    expected = expected + ["mapa.shared::cluster.u32 remote, %r"]
    ptx = check_on_arch(kernel, SIG, arch, SM90, expected)
    if ptx is not None:
        # one mapa + one access inside one block, so an emulator sees (array, index, rank)
        assert ptx.count("mapa.shared::cluster.u32 remote") == 1


def test_docstrings_quote_the_ptx():
    assert "fence.proxy.async.shared::cta;" in cl.fence_proxy_async_shared.__doc__
    assert "9.7.13.4" in cl.fence_proxy_async.__doc__
    assert "barrier.cluster.wait.acquire.aligned;" in cl.cluster_sync.__doc__
    assert "mov.u32 $0, %cluster_ctarank;" in cl.cluster_ctarank.__doc__
    assert "elect.sync _|P1, 0xffffffff;" in cl.elect_sync.__doc__
    assert "ld.shared::cluster.b32 $0, [remote];" in cl.dsmem_load_f32.__doc__
    assert "mapa.shared::cluster.u32 $0, $1, $2;" in cl.map_shared_rank.__doc__


# ---------------------------------------------------------------------------------------------
# Typing errors
# ---------------------------------------------------------------------------------------------


def bad_dtype(out, f):
    buf = cuda.shared.array(64, np.float64)
    out[0] = cl.dsmem_load_u32(buf, 0, 1)


def bad_f32_dtype(out, f):
    buf = cuda.shared.array(64, np.uint32)
    cl.dsmem_store_f32(buf, 0, 1, f[0])


def bad_rank(out, f):
    buf = cuda.shared.array(64, np.uint32)
    out[0] = cl.map_shared_rank(buf, 0, 1.5)


def bad_value(out, f):
    buf = cuda.shared.array(64, np.uint32)
    cl.dsmem_store_u32(buf, 0, 1, (1, 2))


def bad_not_array(out, f):
    out[0] = cl.dsmem_load_u32(out[0], 0, 1)


@pytest.mark.parametrize(
    "kernel, message",
    [
        (bad_dtype, "dsmem_load_u32: the array must hold uint32 or int32, got float64"),
        (bad_f32_dtype, "dsmem_store_f32: the array must hold float32, got uint32"),
        (bad_rank, "map_shared_rank: the CTA rank must be an integer, got float64"),
        (bad_value, "dsmem_store_u32: the value must be a number"),
        (bad_not_array, "dsmem_load_u32 takes a shared-memory array and an element index"),
    ],
)
def test_bad_arguments_are_typing_errors(kernel, message):
    with pytest.raises(TypingError, match=message):
        compile_ptx(kernel, SIG, "sm_90a")
