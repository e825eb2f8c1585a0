"""Tensor maps passed to a kernel by value, as CUDA C++'s ``const __grid_constant__ CUtensorMap``
parameter: 128 bytes in the kernel's parameter space, read in place by TMA.

Why: a map in device memory (``TensorMap.device``) must be copied there before the launch -- a
synchronous copy for every new pointer on the eager path, and, while a stream captures a CUDA
graph, a kernel recorded only to write it (a copy would break the capture).  A parameter travels
with the launch: the graph records its bytes, the host never copies, and nothing outlives the
call.  (PTX ISA 5.1.6.1, "Kernel function parameters": the address of a kernel parameter is taken
with ``mov`` and made generic with ``cvta.param``; CUDA C++ Programming Guide,
``__grid_constant__``; CUTLASS passes every TMA descriptor this way.)

How numba is made to emit it -- numba-cuda has no by-value aggregate kernel parameter:

- :data:`tensormap_param` (the numba type of :class:`TensorMapParam`, ``TensorMap.param`` on the
  host) is, inside a function, the 64-bit generic address of the map; as a function argument it
  is a pointer to ``[16 x i64]``.  The data model's ``from_argument`` marks the LLVM argument.
- numba-cuda turns a compiled function into a kernel in ``numba.cuda.compiler.kernel_fixup``
  (called from there and from ``numba.cuda.dispatcher``, which imports the name); this module
  wraps it in both places (:func:`install`, done on import) so that every marked argument of the
  kernel gets ``byval align 64`` and the NVVM annotation ``grid_constant``.  NVVM then declares
  ``.param .align 64 .b8 <kernel>_param_<i>[128]`` and takes its address with ``mov`` +
  ``cvta.param``, as nvcc does for ``__grid_constant__``.  Device functions that receive the map
  get the generic address as a plain pointer argument (they are inlined into the kernel).
- Launch such a kernel through :func:`intrinsics.launch.launch` or
  :func:`intrinsics.launch.prepare`, which pass the 128 bytes; numba's own ``kernel[grid,
  block](...)`` path has no way to pass an aggregate and raises ``NotImplementedError``.

The TMA intrinsics (:mod:`intrinsics.tma`) take either form of map: this parameter or the
``uint64[:]`` device array.
"""

import functools

from llvmlite import ir
from numba import types
from numba.cuda import cgutils

__all__ = ["TensorMapParam", "TensorMapParamType", "install", "is_param", "tensormap_param"]

I64 = ir.IntType(64)
I32 = ir.IntType(32)
#: the 128-byte CUtensorMap as NVVM sees the parameter's pointee
_BLOB = ir.ArrayType(I64, 16)
PARAM_BYTES = 128
PARAM_ALIGN = 64


class TensorMapParamType(types.Type):
    """The numba type of a tensor map passed by value (``TensorMap.param``)."""

    def __init__(self):
        super().__init__(name="tensormap_param")


tensormap_param = TensorMapParamType()


class TensorMapParam:
    """A tensor map as a kernel argument passed by value: ``blob`` its 128 encoded bytes (None
    under numba's simulator, where no driver encodes maps), ``tensormap`` the
    :class:`intrinsics.tensormap.TensorMap` it came from (the emulation reads the geometry
    there)."""

    __slots__ = ("blob", "tensormap")

    def __init__(self, tensormap, blob):
        if blob is not None and len(blob) != PARAM_BYTES:
            raise ValueError(f"a tensor map is {PARAM_BYTES} bytes, got {len(blob)}")
        self.tensormap, self.blob = tensormap, blob

    def __repr__(self):
        return f"TensorMapParam({self.tensormap!r})"


def is_param(ty):
    """Whether numba type ``ty`` is a by-value tensor map."""
    return isinstance(ty, TensorMapParamType)


class _UntypedByval(ir.values.ArgumentAttributes):
    """llvmlite writes ``byval(<type>)``, which libNVVM (CUDA 13) reads for sm_100 and newer;
    for older targets its parser reads only the bare ``byval`` (measured on this toolchain:
    each form is a parse error for the other targets, tests/test_tensor_maps.py)."""

    def _expand(self, name, typ):
        return name if name == "byval" else super()._expand(name, typ)


def _typed_byval(cc):
    """Whether libNVVM wants ``byval(<type>)`` for target ``cc`` (see _UntypedByval)."""
    return cc is not None and tuple(cc[:2]) >= (10, 0)


def _register():
    from numba.cuda.datamodel.models import PrimitiveModel
    from numba.cuda.extending import typeof_impl
    from numba.cuda.models import register_model

    @register_model(TensorMapParamType)
    class TensorMapParamModel(PrimitiveModel):
        """Value: the map's generic address (i64).  Argument: a pointer to the 128 bytes -- in
        a kernel the by-value parameter (see :func:`_mark_kernel`), in a device function the
        caller's address."""

        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, I64)

        def get_argument_type(self):
            return _BLOB.as_pointer()

        def as_argument(self, builder, value):
            return builder.inttoptr(value, _BLOB.as_pointer())

        def from_argument(self, builder, value):
            from intrinsics._core import compile_cc

            # read by _mark_kernel if this is the kernel (after lowering, when the target being
            # compiled for is no longer at hand)
            value._numbatc_grid_constant = ("target", compile_cc())
            return builder.ptrtoint(value, I64)

    @typeof_impl.register(TensorMapParam)
    def _typeof(val, c):
        return tensormap_param


def _mark_kernel(kernel):
    """Give the kernel's marked arguments ``byval align 64`` and list them (1-based) under the
    kernel's ``grid_constant`` NVVM annotation (NVVM IR specification, "grid_constant")."""
    positions = []
    for i, arg in enumerate(kernel.args):
        mark = getattr(arg, "_numbatc_grid_constant", None)
        if mark is not None:
            attributes = ir.values.ArgumentAttributes() if _typed_byval(mark[1]) else \
                _UntypedByval()
            attributes.add("byval")
            attributes.align = PARAM_ALIGN
            arg.attributes = attributes
            positions.append(i + 1)
    if positions:
        module = kernel.module
        md = module.add_metadata((kernel, ir.MetaDataString(module, "grid_constant"),
                                  module.add_metadata([I32(p) for p in positions])))
        cgutils.get_or_insert_named_metadata(module, "nvvm.annotations").add(md)


@functools.cache
def install():
    """Register the type and wrap numba-cuda's ``kernel_fixup`` (once per process) where it is
    called: ``numba.cuda.compiler`` (compile_ptx) and ``numba.cuda.dispatcher``, which imports
    the name (a launched or precompiled kernel)."""
    from numba.cuda import compiler, dispatcher

    _register()
    original = compiler.kernel_fixup

    def kernel_fixup(kernel, debug):
        original(kernel, debug)
        _mark_kernel(kernel)

    kernel_fixup.__wrapped__ = original
    for module in (compiler, dispatcher):
        if module.kernel_fixup is not original:
            raise RuntimeError(f"intrinsics.grid_constant: {module.__name__}.kernel_fixup is not "
                               f"numba-cuda's; tensor maps by value would compile wrong")
        module.kernel_fixup = kernel_fixup


def _install_unless_simulated():
    from numba import config

    if not config.ENABLE_CUDASIM:  # numba's simulator neither types nor lowers kernels
        install()


_install_unless_simulated()
