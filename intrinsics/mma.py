"""Warp-level matrix multiply-accumulate: ``mma.sync.aligned`` (PTX ISA 9.7.14.5, "Warp-level
matrix multiply-accumulate instructions"; fragment tables in 9.7.14.5.8 onwards).

One table lists every shape and type combination; :func:`mma_sync` builds the intrinsic for one
row.  A call site looks like::

    mma = intrinsics.mma_sync("m16n8k16", "bf16", "bf16", "f32")   # at module level

    @cuda.jit
    def kernel(...):
        d = mma(a, b, c)    # a: 4 x uint32, b: 2 x uint32, c/d: 4 x float32

Operand registers are ``uint32`` for every packed input type (two f16/bf16, four 8-bit values, one
tf32 -- see :mod:`intrinsics.convert` for packing), ``float64`` for f64.  Accumulators are
``float32`` for f32, ``uint32`` (two packed f16) for f16, ``int32`` for s32 and ``float64`` for f64.
Every lane of the warp must execute the call (``.sync.aligned``).
"""

from dataclasses import dataclass

from numba import types

from intrinsics._core import (
    SM80,
    SM89,
    asm,
    check_type,
    intrinsic,
    pack,
    register_list,
    require_arch,
    unpack,
)

__all__ = ["MMA_SHAPES", "MmaSpec", "mma_sync", "mma_specs"]

# The numba type and the inline-asm constraint of one register of each PTX type.
_REGISTER = {
    "f16": (types.uint32, "r"),
    "bf16": (types.uint32, "r"),
    "tf32": (types.uint32, "r"),
    "e4m3": (types.uint32, "r"),
    "e5m2": (types.uint32, "r"),
    "s8": (types.uint32, "r"),
    "u8": (types.uint32, "r"),
    "f32": (types.float32, "f"),
    "s32": (types.int32, "r"),
    "f64": (types.float64, "d"),
}

# (shape, input family) -> (registers of A, of B, accumulator types with their register count,
# architecture).  The counts are the PTX ISA's fragment sizes per lane.
_FLOAT16 = ("f16", "bf16")
_FP8 = ("e4m3", "e5m2")
_INT8 = ("s8", "u8")

MMA_SHAPES = {
    # shape       inputs      A  B  {accumulator: registers}   arch
    ("m16n8k16", _FLOAT16): (4, 2, {"f32": 4, "f16": 2}, SM80),
    ("m16n8k8", _FLOAT16): (2, 1, {"f32": 4, "f16": 2}, SM80),
    ("m16n8k8", ("tf32",)): (4, 2, {"f32": 4}, SM80),
    ("m16n8k4", ("tf32",)): (2, 1, {"f32": 4}, SM80),
    ("m16n8k32", _FP8): (4, 2, {"f32": 4}, SM89),
    ("m16n8k32", _INT8): (4, 2, {"s32": 4}, SM80),
    ("m16n8k16", _INT8): (2, 1, {"s32": 4}, SM80),
    ("m8n8k4", ("f64",)): (1, 1, {"f64": 2}, SM80),
}


@dataclass(frozen=True)
class MmaSpec:
    """One row of the table, resolved for concrete types."""

    shape: str
    a: str
    b: str
    acc: str
    a_regs: int
    b_regs: int
    c_regs: int
    arch: object
    satfinite: bool = False

    @property
    def mnk(self):
        m, rest = self.shape[1:].split("n")
        n, k = rest.split("k")
        return int(m), int(n), int(k)

    @property
    def ptx(self):
        sat = ".satfinite" if self.satfinite else ""
        return (
            f"mma.sync.aligned.{self.shape}.row.col{sat}."
            f"{self.acc}.{self.a}.{self.b}.{self.acc}"
        )

    @property
    def a_type(self):
        return _fragment_type(self.a, self.a_regs)

    @property
    def b_type(self):
        return _fragment_type(self.b, self.b_regs)

    @property
    def c_type(self):
        return _fragment_type(self.acc, self.c_regs)


def _fragment_type(ptx_type, count):
    reg = _REGISTER[ptx_type][0]
    return reg if count == 1 else types.UniTuple(reg, count)


def mma_specs():
    """Every supported (shape, a, b, acc) combination, as MmaSpec objects."""
    specs = []
    for (shape, family), (a_regs, b_regs, accs, arch) in MMA_SHAPES.items():
        for a in family:
            # Mixed operand types are legal within the 8-bit families only.
            b_choices = family if family in (_FP8, _INT8) else (a,)
            for b in b_choices:
                for acc, c_regs in accs.items():
                    if acc == "f16" and a != "f16":
                        continue
                    specs.append(MmaSpec(shape, a, b, acc, a_regs, b_regs, c_regs, arch))
    return specs


def _find_spec(shape, a, b, acc, satfinite):
    matches = [s for s in mma_specs() if (s.shape, s.a, s.b, s.acc) == (shape, a, b, acc)]
    if not matches:
        valid = sorted({(s.shape, s.a, s.b, s.acc) for s in mma_specs()})
        listing = ", ".join("/".join(v) for v in valid)
        raise ValueError(
            f"mma.sync has no {shape} with A={a}, B={b}, accumulator={acc}; valid: {listing}"
        )
    spec = matches[0]
    if satfinite:
        if spec.acc != "s32":
            raise ValueError("mma.sync: .satfinite applies to the integer (s32) forms only")
        spec = MmaSpec(**{**spec.__dict__, "satfinite": True})
    return spec


_CACHE = {}


def mma_sync(shape, a, b=None, acc="f32", *, satfinite=False):
    """Build the ``mma.sync`` intrinsic for one shape and type combination.

    ``b`` defaults to ``a``.  The returned intrinsic is called as ``d = mma(a_frag, b_frag,
    c_frag)`` by all 32 lanes of a warp; its docstring quotes the PTX it emits.  A combination
    outside the table raises ValueError listing the valid ones.
    """
    b = a if b is None else b
    key = (shape, a, b, acc, satfinite)
    if key not in _CACHE:
        _CACHE[key] = _build(_find_spec(shape, a, b, acc, satfinite))
    return _CACHE[key]


def _build(spec):
    n_out = spec.c_regs
    a_constraint = _REGISTER[spec.a][1]
    c_constraint = _REGISTER[spec.acc][1]
    template = "%s %s, %s, %s, %s;" % (
        spec.ptx,
        register_list(0, spec.c_regs),
        register_list(n_out, spec.a_regs),
        register_list(n_out + spec.a_regs, spec.b_regs),
        register_list(n_out + spec.a_regs + spec.b_regs, spec.c_regs),
    )
    constraints = (
        ["=" + c_constraint] * spec.c_regs
        + [a_constraint] * (spec.a_regs + spec.b_regs)
        + [c_constraint] * spec.c_regs
    )
    name = spec.ptx

    def typer(typingctx, a, b, c):
        check_type(name, a, spec.a_type, "the A fragment")
        check_type(name, b, spec.b_type, "the B fragment")
        check_type(name, c, spec.c_type, "the C fragment")
        sig = spec.c_type(a, b, c)

        def codegen(context, builder, sig, args):
            require_arch(name, spec.arch)
            operands = []
            for ty, value in zip(sig.args, args):
                operands += unpack(builder, ty, value)
            out_ll = context.get_value_type(_REGISTER[spec.acc][0])
            outs = asm(builder, template, constraints, [out_ll] * n_out, operands)
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = "mma_" + "_".join((spec.shape, spec.a, spec.b, spec.acc))
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.14.5.14, mma).\n\n"
        f"Arguments: A {spec.a_type}, B {spec.b_type}, C {spec.c_type}; returns D {spec.c_type}. "
        f"Needs {spec.arch.text}."
    )
    fn = intrinsic(typer)
    fn.spec = spec
    return fn

