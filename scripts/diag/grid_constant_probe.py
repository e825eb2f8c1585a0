"""Probe tensor maps passed by value (intrinsics.grid_constant) on the GPU, one variant per
process (a TMA fault poisons the context):

    python scripts/diag/grid_constant_probe.py words|load|load_device|sass [whole]

words: the kernel reads the 16 words back through the parameter's generic address (ld.u64) and
writes them out, with the launch's other parameters, to check the layout and the address;
load: one 2-d tile load through the parameter; load_device: the same through TensorMap.device;
sass: cuobjdump of the words kernel's cubin (parameter info and SASS); ``whole``: load through
the driver's whole-program JIT instead of numba's nvJitLink link.
"""

import sys

import numpy as np
from numba import cuda, types

import intrinsics as nt
from intrinsics._core import I64, asm, intrinsic
from intrinsics.launch import launch
from intrinsics.tensormap import TensorMap


@intrinsic
def _word(typingctx, tm, i):
    sig = types.uint64(tm, types.int64)

    def codegen(context, builder, sig, args):
        address = builder.add(args[0], builder.mul(args[1], I64(8)))
        return asm(builder, "ld.u64 $0, [$1];", ["=l", "l"], [I64], [address])[0]

    return sig, codegen


@intrinsic
def _address(typingctx, tm):
    sig = types.uint64(tm)

    def codegen(context, builder, sig, args):
        return args[0]

    return sig, codegen


@cuda.jit
def words_kernel(x, tm, y, out):
    i = cuda.threadIdx.x
    if i < 16:
        out[i] = _word(tm, i)
    if i == 16:
        out[16] = x
        out[17] = y
        out[18] = _address(tm)


@cuda.jit
def load_kernel(tm, coords, out):
    smem = cuda.shared.array(4096, np.float32)
    bars = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        nt.mbarrier_init(bars, 0, 1)
        nt.fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        nt.mbarrier_arrive_expect_tx(bars, 0, 16 * 16 * 4)
        nt.tma_load(smem, 0, tm, (coords[0], coords[1]), bars, 0)
    nt.mbarrier_wait_parity(bars, 0, 0)
    for j in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        out[j] = smem[j]


def main(what, whole=None):
    tensor = np.arange(48 * 96, dtype=np.float32).reshape(48, 96)
    dev = cuda.to_device(tensor)
    tm = TensorMap.tiled(dev, (16, 16))
    if what in ("words", "sass"):
        out = cuda.to_device(np.zeros(19, np.uint64))
        launch(words_kernel, 1, 32, (np.uint64(0x1111), tm.param, np.uint64(0x2222), out),
               whole_program=whole)
        got = out.copy_to_host()
        print("words match:", bool((got[:16] == tm.words).all()))
        print("read:    ", [hex(w) for w in got[:4]])
        print("expected:", [hex(w) for w in tm.words[:4]])
        print("x, y:", hex(got[16]), hex(got[17]), "param address:", hex(got[18]),
              "mod 64 =", int(got[18]) % 64)
        if what == "sass":
            import subprocess
            import tempfile

            sig = tuple(words_kernel.signatures)[0]
            cubin = words_kernel.overloads[sig]._codelibrary.get_cubin()
            cubin = getattr(cubin, "code", cubin)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(cubin)
                f.flush()
                print(subprocess.run(["cuobjdump", "-elf", "-sass", f.name], capture_output=True,
                                     text=True).stdout[-6000:])
        return
    out = cuda.to_device(np.full(256, -1, np.float32))
    arg = tm.param if what == "load" else tm.device
    launch(load_kernel, 1, 128, (arg, cuda.to_device(np.array([16, 8], np.int32)), out),
           whole_program=whole)
    got = out.copy_to_host().reshape(16, 16)
    print(what, "exact:", bool((got == tensor[8:24, 16:32]).all()))


if __name__ == "__main__":
    main(sys.argv[1], True if "whole" in sys.argv[2:] else None)
