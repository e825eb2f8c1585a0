"""TMA device side: every tensor-copy form and rank, the bulk copies, the bulk groups and the
descriptor prefetch compile, hold their exact instruction and assemble (nvJitLink) on each
architecture that has them, are refused with an ArchitectureError on sm_80 / sm_89, and reject
bad operands at typing time with a message naming the valid values."""

import numpy as np
import pytest
from numba import cuda, types
from numba.core.errors import TypingError

from intrinsics.tma import (
    BULK_COPIES,
    TENSOR_COPIES,
    bulk_commit_group,
    bulk_copy_g2s,
    bulk_copy_s2g,
    bulk_reduce_add_f32,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_load_im2col,
    tma_load_multicast,
    tma_prefetch,
    tma_prefetch_descriptor,
    tma_store,
)
from intrinsics._core import SM90
from intrinsics.toolchain import compile_ptx
from tests.helpers.compilecheck import ARCH_NAMES, check_on_arch

TMAP_SIG = (types.uint64[::1], types.int32)

# Coordinate tuples of each rank built from one runtime value (so that nothing folds).
_COORDS = {
    1: cuda.jit(device=True, inline="always")(lambda x: (x,)),
    2: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1)),
    3: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1, x + 2)),
    4: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1, x + 2, x + 3)),
    5: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1, x + 2, x + 3, x + 4)),
}
_OFFSETS = {
    3: cuda.jit(device=True, inline="always")(lambda x: (x,)),
    4: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1)),
    5: cuda.jit(device=True, inline="always")(lambda x: (x, x + 1, x + 2)),
}


def _kernel(op, rank):
    coords = _COORDS[rank]
    if op == "tma_load":

        def kernel(tmap, x):
            smem = cuda.shared.array(4096, np.uint8)
            bars = cuda.shared.array(2, np.uint64)
            tma_load(smem, 128, tmap, coords(x), bars, 1)

    elif op == "tma_load_multicast":

        def kernel(tmap, x):
            smem = cuda.shared.array(4096, np.uint8)
            bars = cuda.shared.array(2, np.uint64)
            tma_load_multicast(smem, 128, tmap, coords(x), bars, 1, x & 3)

    elif op == "tma_load_im2col":
        offsets = _OFFSETS[rank]

        def kernel(tmap, x):
            smem = cuda.shared.array(4096, np.uint8)
            bars = cuda.shared.array(2, np.uint64)
            tma_load_im2col(smem, 128, tmap, coords(x), offsets(x), bars, 1)

    elif op == "tma_prefetch":

        def kernel(tmap, x):
            tma_prefetch(tmap, coords(x))

    else:

        def kernel(tmap, x):
            smem = cuda.shared.array(4096, np.uint8)
            tma_store(tmap, coords(x), smem, 256)

    return kernel


def _expected_asm(copy, rank):
    """The opcode with the start of its operand list (NVVM chooses the register numbers)."""
    return copy.ptx(rank) + (" [%r" if copy.direction == "g2s" else " [%rd")


CASES = [(name, rank) for name, copy in TENSOR_COPIES.items() for rank in copy.ranks]


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("op, rank", CASES, ids=[f"{n}-{r}d" for n, r in CASES])
def test_tensor_copy_assembles(op, rank, arch):
    copy = TENSOR_COPIES[op]
    ptx = check_on_arch(_kernel(op, rank), TMAP_SIG, arch, copy.arch, [_expected_asm(copy, rank)])
    if ptx is not None:
        (line,) = [l.strip() for l in ptx.splitlines() if copy.ptx(rank) in l]
        # The operand shape: coordinate vector of `rank` registers; offsets and mask where due.
        coords = line.split("{")[1].split("}")[0]
        assert len(coords.split(",")) == rank, line
        if copy.mode == "im2col":
            offsets = line.rsplit("{", 1)[1].split("}")[0]
            assert len(offsets.split(",")) == rank - 2 and "%rs" in offsets, line
        if copy.multicast:
            assert line.rstrip(";").rsplit(",", 1)[1].strip().startswith("%rs"), line


def test_templates_are_the_documented_ptx():
    load = TENSOR_COPIES["tma_load"]
    assert load.template(2) == (
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[$0], [$1, {$2, $3}], [$4];",
        ["r", "l", "r", "r", "r"],
    )
    assert TENSOR_COPIES["tma_load_multicast"].template(1) == (
        "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [$0], [$1, {$2}], [$3], $4;",
        ["r", "l", "r", "r", "h"],
    )
    assert TENSOR_COPIES["tma_load_im2col"].template(5) == (
        "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes "
        "[$0], [$1, {$2, $3, $4, $5, $6}], [$7], {$8, $9, $10};",
        ["r", "l", "r", "r", "r", "r", "r", "r", "h", "h", "h"],
    )
    assert TENSOR_COPIES["tma_store"].template(3) == (
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [$0, {$1, $2, $3}], [$4];",
        ["l", "r", "r", "r", "r"],
    )
    assert TENSOR_COPIES["tma_prefetch"].template(2) == (
        "cp.async.bulk.prefetch.tensor.2d.L2.global.tile [$0, {$1, $2}];",
        ["l", "r", "r"],
    )
    assert BULK_COPIES["bulk_copy_g2s"].template == (
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];"
    )
    assert BULK_COPIES["bulk_copy_s2g"].template == (
        "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;"
    )
    for fn in (tma_load, tma_load_multicast, tma_load_im2col, tma_store, tma_prefetch):
        assert fn.spec.ptx(fn.spec.ranks[0]) in fn._defn.__doc__


def _bulk_kernel(g, x):
    smem = cuda.shared.array(4096, np.uint8)
    bars = cuda.shared.array(2, np.uint64)
    bulk_copy_g2s(smem, 16, g, x, 256, bars, 0)
    bulk_copy_s2g(g, 32, smem, 1024, x)
    bulk_commit_group()
    bulk_wait_group_read(1)
    bulk_wait_group(0)


def _prefetch_kernel(tmap, x):
    tma_prefetch_descriptor(tmap)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_bulk_copies_and_groups_assemble(arch):
    check_on_arch(
        _bulk_kernel,
        (types.uint8[::1], types.int32),
        arch,
        SM90,
        [
            BULK_COPIES["bulk_copy_g2s"].ptx + " [%r",
            BULK_COPIES["bulk_copy_s2g"].ptx + " [%rd",
            "cp.async.bulk.commit_group;",
            "cp.async.bulk.wait_group.read 1;",
            "cp.async.bulk.wait_group 0;",
        ],
    )


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_prefetch_descriptor_assembles(arch):
    check_on_arch(_prefetch_kernel, TMAP_SIG, arch, SM90, ["prefetch.tensormap [%rd"])


def test_tensor_map_operand_is_the_arrays_generic_address():
    # The uint64[:] argument's data pointer (a kernel parameter) goes to the instruction as is:
    # no conversion to another state space.
    ptx = compile_ptx(_kernel("tma_load", 2), TMAP_SIG, "sm_90a")
    (line,) = [l.strip() for l in ptx.splitlines() if "cp.async.bulk.tensor" in l]
    reg = line.split("[")[2].split(",")[0]
    assert reg.startswith("%rd"), line
    (source,) = [l.strip() for l in ptx.splitlines() if l.strip().split(",")[0].endswith(reg)]
    assert source.startswith("ld.param.u64"), source


# ---------------------------------------------------------------------------------------------
# Typing-time errors
# ---------------------------------------------------------------------------------------------


def _typing_error(kernel, sig, match):
    with pytest.raises(TypingError, match=match):
        compile_ptx(kernel, sig, "sm_90a")


def test_six_coordinates_are_refused():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        tma_load(smem, 0, tmap, (x, x, x, x, x, x), bars, 0)

    _typing_error(kernel, TMAP_SIG, r"tma_load: coords .* must be a tuple of 1 to 5 integers")


def test_bare_integer_coordinate_is_refused():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        tma_store(tmap, x, smem, 0)

    _typing_error(kernel, TMAP_SIG, r"tma_store: coords .* tuple of 1 to 5 integers, got int32")


def test_float_coordinates_are_refused():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        tma_store(tmap, (x, 1.5), smem, 0)

    _typing_error(kernel, TMAP_SIG, "tma_store: coords .* integers")


def test_im2col_needs_rank_3_to_5():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        tma_load_im2col(smem, 0, tmap, (x, x), (x,), bars, 0)

    _typing_error(kernel, TMAP_SIG, r"tma_load_im2col: coords .*rank 3, 4 or 5.* 3 to 5 integers")


def test_im2col_offsets_count_is_rank_minus_2():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        tma_load_im2col(smem, 0, tmap, (x, x, x, x), (x,), bars, 0)

    _typing_error(kernel, TMAP_SIG, r"offsets .*rank 4 takes 2.* tuple of 2 integers")


def test_tensor_map_must_be_uint64_vector():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        tma_load(smem, 0, tmap, (x, x), bars, 0)

    _typing_error(kernel, (types.float32[:], types.int32),
                  r"tensor map must be TensorMap.param \(passed by value\) or the uint64\[:\] "
                  r"device array from TensorMap.device")
    _typing_error(kernel, (types.uint64[:, :], types.int32), r"uint64\[:\] device array")


def test_mbarrier_must_be_uint64():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(2, np.int32)
        tma_load(smem, 0, tmap, (x, x), bars, 0)

    _typing_error(kernel, TMAP_SIG, "mbarrier must be a shared uint64 array")


def test_multicast_mask_must_be_integer():
    def kernel(tmap, x):
        smem = cuda.shared.array(64, np.uint8)
        bars = cuda.shared.array(1, np.uint64)
        tma_load_multicast(smem, 0, tmap, (x, x), bars, 0, 1.0)

    _typing_error(kernel, TMAP_SIG, "CTA mask .* must be an integer")


def test_destination_must_be_array_and_index():
    def kernel(tmap, x):
        bars = cuda.shared.array(1, np.uint64)
        tma_load(x, 0, tmap, (x, x), bars, 0)

    _typing_error(kernel, TMAP_SIG, "tma_load takes a shared-memory destination array")


def test_wait_group_needs_a_literal():
    def kernel(tmap, x):
        bulk_wait_group(x)

    _typing_error(kernel, TMAP_SIG, "wait_group")


def _reduce_kernel(acc, x):
    smem = cuda.shared.array(1024, np.float32, alignment=16)
    bulk_reduce_add_f32(acc, 64, smem, 16, x)
    bulk_commit_group()
    bulk_wait_group(0)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_bulk_reduction_assembles(arch):
    """cp.reduce.async.bulk .add.f32 into global memory (an array or a typed pointer)."""
    assert BULK_COPIES["bulk_reduce_add_f32"].template == (
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;")
    check_on_arch(_reduce_kernel, (types.float32[::1], types.int32), arch, SM90,
                  [BULK_COPIES["bulk_reduce_add_f32"].ptx + " [%rd"])
    check_on_arch(_reduce_kernel, (types.CPointer(types.float32), types.int32), arch, SM90,
                  [BULK_COPIES["bulk_reduce_add_f32"].ptx + " [%rd"])


def test_bulk_reduction_adds_float32_only():
    def kernel(g, x):
        smem = cuda.shared.array(64, np.float32)
        bulk_reduce_add_f32(g, 0, smem, 0, 32)

    _typing_error(kernel, (types.int32[::1], types.int32), "adds into float32 memory")


def test_wait_group_refuses_negative():
    def kernel(tmap, x):
        bulk_wait_group_read(-1)

    _typing_error(kernel, TMAP_SIG, r"cp.async.bulk.wait_group.read: N must be a non-negative")


def test_bulk_size_must_be_integer():
    def kernel(g, x):
        smem = cuda.shared.array(64, np.uint8)
        bulk_copy_s2g(g, 0, smem, 0, 32.0)

    _typing_error(kernel, (types.uint8[::1], types.int32), "byte count .* must be an integer")
