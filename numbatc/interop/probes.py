"""The warm call's view of an array: (pointer, key), without building a CudaArray.

numbatc's front ends cache what validating and dispatching a call decided (numbatc._warm),
keyed on everything that decision read from the arrays; a probe returns that as a hashable key,
with the pointer (which changes from call to call) beside it.  A probe must cover every
attribute that :func:`~numbatc.interop.arrays.as_cuda_array` reads for its library, except the
pointer: library, shape, strides, dtype, device, layout.  (Changing an adapter in arrays.py
means changing its probe here.)
"""

from __future__ import annotations

from numbatc.interop.arrays import DTypeView, library_of

__all__ = ["probe", "allocate_probed", "PROBES"]


def _probe_torch(t):
    # NOTE: t.device covers the type ('cuda') and index; layout refuses sparse tensors.
    return t.data_ptr(), ("torch", t.shape, t.stride(), t.dtype, t.device, t.layout)


def _probe_cupy(t):
    return t.data.ptr, ("cupy", t.shape, t.strides, t.dtype, t.device.id)


def _probe_numba(t):
    gpu_data = t.gpu_data
    ctx = getattr(gpu_data, "context", None)
    if ctx is None:  # an empty array, or memory numba does not own: no warm path
        return None
    # the same address as arrays._from_numba's t.device_ctypes_pointer.value, without the
    # ctypes object
    return int(gpu_data.device_pointer), ("numba", t.shape, t.strides, t.dtype, ctx.device.id)


def _probe_simulator(t):
    # NUMBA_ENABLE_CUDASIM: the NumPy memory stands in for device 0 (arrays._from_simulator)
    host = t._ary
    return host.__array_interface__["data"][0], ("simulator", host.shape, host.strides,
                                                 host.dtype)


def _probe_marked(t):
    inner = probe(t.data)
    if inner is None:
        return None
    return inner[0], ("marked", t.dtype, inner[1])


def _no_probe(t):
    return None


#: type -> its probe (filled on first sight of a type)
PROBES: dict = {DTypeView: _probe_marked}


def probe(t):
    """(pointer, key) for ``t``, or None where numbatc has no warm path for its kind of array
    (bare __cuda_array_interface__ and DLPack exporters, whose device is a driver query).  Two
    arrays with equal keys normalise to CudaArrays that differ at most in ``ptr`` (and ``obj``).
    The simulator's arrays (NUMBA_ENABLE_CUDASIM) have a probe: numbatc.attention's warm calls
    run in the CPU emulation (the GEMM and softmax kernels hand back no relaunch function
    there, so their calls are never cached)."""
    ty = type(t)
    fn = PROBES.get(ty)
    if fn is None:
        lib = "simulator" if ty.__name__ == "FakeCUDAArray" else library_of(t)
        fn = {"torch": _probe_torch, "cupy": _probe_cupy, "numba": _probe_numba,
              "simulator": _probe_simulator}.get(lib, _no_probe)
        if len(PROBES) < 256:
            PROBES[ty] = fn
    return fn(t)


def allocate_probed(alloc, like):
    """(result, its device pointer) of ``alloc(like)`` for a warm call, or (None, None) where
    the result's kind has no probe (the caller then takes the checked path)."""
    result = alloc(like)
    probed = probe(result)
    return (None, None) if probed is None else (result, probed[0])
