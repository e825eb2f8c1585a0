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

The block-scaled forms of sm_120a / sm_121a (PTX ISA 9.7.14.3, "Block Scaling for mma.sync":
kind::mxf4, kind::mxf4nvf4 at m16n8k64 and kind::mxf8f6f4 at m16n8k32) live in a sibling table,
:data:`MMA_BLOCK_SCALE_FORMS`, built by :func:`mma_sync_block_scale`::

    mma = mma_sync_block_scale("m16n8k64", "mxf4nvf4", "4X", scale_type="ue4m3")

    @cuda.jit
    def kernel(...):
        d = mma(a, b, c, sfa, sfb, 0, 0, 0, 0)   # + scale registers and their selectors
"""

from dataclasses import dataclass

from numba import types
from numba.cuda.core.errors import NumbaTypeError
from numba.cuda.extending import _intrinsic

from intrinsics._core import (
    SM80,
    SM89,
    SM120A,
    asm,
    check_type,
    intrinsic,
    pack,
    register_list,
    require_arch,
    unpack,
)

__all__ = [
    "MMA_BLOCK_SCALE_FORMS",
    "MMA_BLOCK_SCALE_SELECTORS",
    "MMA_SHAPES",
    "MmaBlockScaleSpec",
    "MmaSelectorError",
    "MmaSpec",
    "mma_block_scale_specs",
    "mma_sync",
    "mma_sync_block_scale",
    "mma_specs",
]

# The numba type and the inline-asm constraint of one register of each PTX type.
_REGISTER = {
    "f16": (types.uint32, "r"),
    "bf16": (types.uint32, "r"),
    "tf32": (types.uint32, "r"),
    "e4m3": (types.uint32, "r"),
    "e5m2": (types.uint32, "r"),
    "s8": (types.uint32, "r"),
    "u8": (types.uint32, "r"),
    "e3m2": (types.uint32, "r"),
    "e2m3": (types.uint32, "r"),
    "e2m1": (types.uint32, "r"),
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



# ---------------------------------------------------------------------------------------------
# Block-scaled mma.sync (sm_120a / sm_121a)
# ---------------------------------------------------------------------------------------------

_F8F6F4 = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")

# PTX ISA 9.7.14.3 Table 36 ("Valid combinations of .scale_vec_size and .kind qualifier"), with
# the shape each kind has in 9.7.14.5.14's syntax:
#   (shape, kind): (A/B element types, {scale_vec: scale types})
# A is 4 x b32, B 2 x b32, C/D 4 x f32 in every form.  kind::mxf4 and kind::mxf4nvf4 pack eight
# e2m1 per register (4 bits each); kind::mxf8f6f4 holds one element per byte (an e2m1 in bits
# 5-2, an e2m3/e3m2 in bits 5-0 of its byte), the m16n8k32 8-bit fragment layout.
MMA_BLOCK_SCALE_FORMS = {
    ("m16n8k64", "mxf4"): (("e2m1",), {"2X": ("ue8m0",)}),
    ("m16n8k64", "mxf4nvf4"): (("e2m1",), {"2X": ("ue8m0",), "4X": ("ue8m0", "ue4m3")}),
    ("m16n8k32", "mxf8f6f4"): (_F8F6F4, {"1X": ("ue8m0",)}),
}

# Table 37 ("Valid values for various selector components"): scale_vec -> (byte-id-a,
# thread-id-a, byte-id-b, thread-id-b) value sets.  Anything else is undefined behaviour.
MMA_BLOCK_SCALE_SELECTORS = {
    "1X": ((0, 1, 2, 3), (0, 1), (0, 1, 2, 3), (0, 1, 2, 3)),
    "2X": ((0, 2), (0, 1), (0, 2), (0, 1, 2, 3)),
    "4X": ((0,), (0, 1), (0,), (0, 1, 2, 3)),
}
_SELECTOR_NAMES = ("byte-id-a", "thread-id-a", "byte-id-b", "thread-id-b")


class MmaSelectorError(ValueError):
    """A literal scale selector outside PTX ISA Table 37, found at typing time.  A plain ValueError
    on purpose: numba retries a typer that raises one of its own errors with non-literal argument
    types, which would accept the bad constant silently."""


@dataclass(frozen=True)
class MmaBlockScaleSpec:
    """One block-scaled form: ``D = (A * scale_A) * (B * scale_B) + C`` with ``scale_count``
    scale factors per row of A / column of B, each covering ``block`` consecutive K."""

    shape: str
    kind: str
    scale_vec: str
    a: str
    b: str
    scale_type: str
    acc: str = "f32"
    a_regs: int = 4
    b_regs: int = 2
    c_regs: int = 4
    arch: object = SM120A

    mnk = MmaSpec.mnk

    @property
    def scale_count(self):
        return int(self.scale_vec[0])

    @property
    def block(self):
        return self.mnk[2] // self.scale_count

    @property
    def packed(self):
        """True where eight e2m1 share a register (kind::mxf4 / mxf4nvf4), False for one element
        per byte (kind::mxf8f6f4)."""
        return self.kind in ("mxf4", "mxf4nvf4")

    @property
    def element_bits(self):
        return 4 if self.packed else 8

    @property
    def selectors(self):
        """Valid values of (byte-id-a, thread-id-a, byte-id-b, thread-id-b) (Table 37)."""
        return MMA_BLOCK_SCALE_SELECTORS[self.scale_vec]

    @property
    def ptx(self):
        return (
            f"mma.sync.aligned.{self.shape}.row.col.kind::{self.kind}.block_scale."
            f"scale_vec::{self.scale_vec}.{self.acc}.{self.a}.{self.b}.{self.acc}.{self.scale_type}"
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


def mma_block_scale_specs():
    """Every block-scaled form, as MmaBlockScaleSpec objects (mxf8f6f4: every A x B pair)."""
    specs = []
    for (shape, kind), (elements, scale_vecs) in MMA_BLOCK_SCALE_FORMS.items():
        for scale_vec, scale_types in scale_vecs.items():
            for scale_type in scale_types:
                for a in elements:
                    for b in elements:
                        specs.append(MmaBlockScaleSpec(shape, kind, scale_vec, a, b, scale_type))
    return specs


def _find_block_scale_spec(shape, kind, scale_vec, a, b, acc, scale_type):
    key = (shape, kind, scale_vec, a, b, acc, scale_type)
    for spec in mma_block_scale_specs():
        if (spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b, spec.acc,
                spec.scale_type) == key:
            return spec
    valid = []
    for (s, k), (elements, scale_vecs) in MMA_BLOCK_SCALE_FORMS.items():
        for v, stypes in scale_vecs.items():
            valid.append(f"{s} kind::{k} scale_vec::{v} A/B {'|'.join(elements)} "
                         f"scale {'|'.join(stypes)}")
    raise ValueError(
        f"mma.sync block_scale has no {shape} kind::{kind} scale_vec::{scale_vec} with "
        f"A={a}, B={b}, accumulator={acc}, scale type={scale_type}; valid (accumulator f32): "
        + "; ".join(valid)
    )


_BS_CACHE = {}


def mma_sync_block_scale(shape, kind, scale_vec, a="e2m1", b=None, acc="f32", scale_type="ue8m0"):
    """Build the block-scaled ``mma.sync`` intrinsic for one form of PTX ISA Table 36.

    ``b`` defaults to ``a``.  The intrinsic is called by all 32 lanes of a warp as::

        d = mma(a_frag, b_frag, c_frag, scale_a, scale_b,
                byte_id_a, thread_id_a, byte_id_b, thread_id_b)

    with A 4 x uint32, B 2 x uint32, C/D 4 x float32, ``scale_a``/``scale_b`` uint32 (the
    ``scale-a-data`` / ``scale-b-data`` registers) and four integer selectors.  Where the scale
    factors sit in those registers is :func:`intrinsics.layout.mma_scale_fragment`.  A literal
    selector is checked against Table 37 at typing time and emitted as an immediate; a run-time
    value goes into a 16-bit register (undefined behaviour outside Table 37).  A combination
    outside the table raises ValueError listing the valid ones.
    """
    b = a if b is None else b
    key = (shape, kind, scale_vec, a, b, acc, scale_type)
    if key not in _BS_CACHE:
        _BS_CACHE[key] = _build_block_scale(_find_block_scale_spec(*key))
    return _BS_CACHE[key]


def _selector_literal(name, spec, index, ty):
    """The literal value of selector ``index`` (checked against Table 37), None at run time."""
    what = _SELECTOR_NAMES[index]
    valid = spec.selectors[index]
    if isinstance(ty, types.IntegerLiteral):
        if ty.literal_value not in valid:
            raise MmaSelectorError(
                f"{name}: {what} must be one of {list(valid)} for scale_vec::{spec.scale_vec} "
                f"(PTX ISA Table 37), got {ty.literal_value}"
            )
        return ty.literal_value
    if isinstance(ty, (types.Integer, types.Boolean)):
        return None
    raise NumbaTypeError(f"{name}: {what} must be an integer in {list(valid)}, got {ty}")


def _build_block_scale(spec):
    name = spec.ptx
    n_out = spec.c_regs
    head = "%s %s, %s, %s, %s" % (
        spec.ptx,
        register_list(0, spec.c_regs),
        register_list(n_out, spec.a_regs),
        register_list(n_out + spec.a_regs, spec.b_regs),
        register_list(n_out + spec.a_regs + spec.b_regs, spec.c_regs),
    )
    first = n_out + spec.a_regs + spec.b_regs + spec.c_regs  # $ index of scale-a-data
    fixed = ["=f"] * n_out + ["r"] * (spec.a_regs + spec.b_regs) + ["f"] * spec.c_regs

    def template(literals):
        """The asm string and its constraints, with literal selectors as immediates."""
        constraints = fixed + ["r", "r"]  # scale-a-data, scale-b-data
        ops = []
        nxt = first + 2
        for value in literals:
            if value is None:
                ops.append(f"${nxt}")
                constraints.append("h")
                nxt += 1
            else:
                ops.append(str(value))
        text = (f"{head}, ${first}, {{{ops[0]}, {ops[1]}}}, ${first + 1}, "
                f"{{{ops[2]}, {ops[3]}}};")
        return text, constraints

    def typer(typingctx, a, b, c, sfa, sfb, byte_id_a, thread_id_a, byte_id_b, thread_id_b):
        check_type(name, a, spec.a_type, "the A fragment")
        check_type(name, b, spec.b_type, "the B fragment")
        check_type(name, c, spec.c_type, "the C fragment")
        check_type(name, sfa, types.uint32, "scale-a-data")
        check_type(name, sfb, types.uint32, "scale-b-data")
        selectors = (byte_id_a, thread_id_a, byte_id_b, thread_id_b)
        literals = tuple(_selector_literal(name, spec, i, ty) for i, ty in enumerate(selectors))
        sig = spec.c_type(a, b, c, sfa, sfb, *selectors)

        def codegen(context, builder, sig, args):
            require_arch(name, spec.arch)
            text, constraints = template(literals)
            operands = []
            for ty, value in zip(sig.args[:5], args[:5]):
                operands += unpack(builder, ty, value)
            for lit, ty, value in zip(literals, sig.args[5:], args[5:]):
                if lit is None:
                    operands.append(context.cast(builder, value, ty, types.uint16))
            out_ll = context.get_value_type(types.float32)
            outs = asm(builder, text, constraints, [out_ll] * n_out, operands)
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = "mma_bs_" + "_".join(
        (spec.shape, spec.kind, spec.scale_vec, spec.a, spec.b, spec.scale_type))
    example, _ = template((0, 0, 0, 0))
    typer.__doc__ = (
        f"Emits ``{example}`` with literal selectors (PTX ISA 9.7.14.5.14 mma, 9.7.14.3 \"Block "
        f"Scaling for mma.sync\"); run-time selectors go in 16-bit registers.\n\n"
        f"Arguments: A {spec.a_type}, B {spec.b_type}, C {spec.c_type}, scale-a-data uint32, "
        f"scale-b-data uint32, byte-id-a in {list(spec.selectors[0])}, thread-id-a in "
        f"{list(spec.selectors[1])}, byte-id-b in {list(spec.selectors[2])}, thread-id-b in "
        f"{list(spec.selectors[3])}; returns D {spec.c_type}.  {spec.scale_count} "
        f"{spec.scale_type} scale factor(s) per row of A / column of B, each over {spec.block} "
        f"consecutive K.  Needs {spec.arch.text}."
    )
    fn = _intrinsic(target="cuda", prefer_literal=True)(typer)
    fn.spec = spec
    fn.template = template
    return fn
