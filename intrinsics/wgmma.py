"""Warpgroup-level matrix multiply-accumulate: ``wgmma`` (PTX ISA 9.7.15, "Asynchronous Warpgroup
Level Matrix Multiply-Accumulate Instructions"; sm_90a only -- sm_90 without the ``a``, sm_100a and
sm_120a all refuse it).

One table lists every input family; :func:`wgmma_mma_async` builds the intrinsic for one
combination of N, types, operand source, scales and transposes.  A call site looks like::

    mma = intrinsics.wgmma_mma_async(128, "bf16")            # m64n128k16, f32 accumulator, SS
    a_tile = SmemLayout("K", 128, 64, 64, 2)                  # (M=64, K=64) bf16, 128B swizzle
    b_tile = SmemLayout("K", 128, 128, 64, 2)                 # (N=128, K=64)

    @cuda.jit
    def kernel(...):
        smem = cuda.shared.array(..., np.uint32)           # a_at, b_at: 1024-B aligned words
        ...                                                # store the tiles (a_tile.offset)
        fence_proxy_async_shared()                         # generic-proxy stores -> async proxy
        cuda.syncthreads()
        acc = wgmma_fence_operand(acc)                     # acc: UniTuple(float32, 64)
        wgmma_fence()
        for ks in range(4):                                # K-slices of 16 (a_tile.k_offset)
            da = smem_desc(smem, a_at + 8 * ks, 16, 1024, 128)   # +32 B per slice
            db = smem_desc(smem, b_at + 8 * ks, 16, 1024, 128)
            acc = mma(acc, da, db, 1)                      # scale_d: 0 would ignore acc
        wgmma_commit_group()
        wgmma_wait_group(0)
        acc = wgmma_fence_operand(acc)                     # REQUIRED before reading acc
        ...                                                # epilogue reads acc

All 128 threads of a warpgroup (four consecutive warps, the first a multiple of 4) execute every
call here (``.sync.aligned``).

NOTE: ``wgmma.mma_async`` is asynchronous, but the inline asm that emits it hands LLVM its
accumulator registers as ordinary SSA results, "ready" at once.  Nothing stops LLVM from moving a
read of the accumulator (a store, a conversion) above ``wgmma.wait_group`` -- it would read a
register the tensor core is still writing.  :func:`wgmma_fence_operand` is an empty asm that takes
every accumulator register in and hands it back out; being volatile it stays below the (volatile)
wait, and every later read depends on its outputs.  The pattern is always::

    wgmma_wait_group(0)
    acc = wgmma_fence_operand(acc)

(CUTLASS: ``warpgroup_wait<0>(); warpgroup_fence_operand(accum);``.)  ptxas itself notices a read
of a register that a wgmma may still be writing and injects a wait (info C7517, "wgmma.wait_group
is injected ..."); the compile tests check that a kernel written with the pattern needs none.

Accumulators: ``UniTuple(float32, N/2)`` for f32, ``UniTuple(uint32, N/4)`` (two packed f16, low
half = even element) for f16.  Register-sourced A (RS form): ``UniTuple(uint32, 4)``.  Descriptors
are 64-bit integers built by :func:`make_smem_desc` / :func:`smem_desc`.  ``scale_d`` is a run-time
integer: 0 makes D = A*B (the input accumulator is ignored), anything else D = A*B + D.

Shared-memory layouts and the matrix descriptor
-----------------------------------------------
The operand tiles must be in one of the canonical layouts of PTX ISA 9.7.15.5.1.2 ("Shared Memory
Matrix Layout"), described to the instruction by a 64-bit matrix descriptor (9.7.15.5.1.2.2,
"Matrix Descriptor Format").  Their host models live in :mod:`intrinsics.layout` (shared with
tcgen05, the emulation and ``numbatc.layouts``): :class:`~intrinsics.layout.SmemLayout` (where
element (mn, k) of a tile lives, its LBO/SBO and K steps), the descriptor's bit fields and the
address the tensor core reads for each element (:mod:`intrinsics.layout.smem`), and the register
fragments of D and of an RS A (:func:`~intrinsics.layout.accumulator_coords`,
:func:`~intrinsics.layout.a_fragment_coords`).  This module keeps the device side:
:func:`make_smem_desc` (the layout package's encoder compiled for kernels) and :func:`smem_desc`.
"""

from dataclasses import dataclass

from numba import cuda, types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import (
    SM90A,
    asm,
    check_type,
    intrinsic,
    literal_value,
    pack,
    passthrough,
    register_list,
    require_arch,
    unpack,
    statement_intrinsic,
)
from intrinsics.layout.smem import encode_wgmma_smem_desc
from intrinsics.smem import shared_address

__all__ = [
    "WGMMA_TABLE",
    "WgmmaSpec",
    "make_smem_desc",
    "smem_desc",
    "wgmma_commit_group",
    "wgmma_fence",
    "wgmma_fence_operand",
    "wgmma_mma_async",
    "wgmma_specs",
    "wgmma_wait_group",
]

# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

_N_ALL = tuple(range(8, 257, 8))
_FLOAT16 = ("f16", "bf16")
_FP8 = ("e4m3", "e5m2")

# input family -> (K of the shape, element bytes, accumulators, valid N, transposes exist).
# PTX ISA 9.7.15.5.2 (wgmma.mma_async): .m64nNk16 for f16/bf16, .m64nNk8 for tf32, .m64nNk32 for
# e4m3/e5m2, N = 8..256 in steps of 8 for all of them (the compile tests assemble every row).  The
# imm-trans-a/b operands exist only for f16/bf16; tf32 and fp8 operands must be K-major.
WGMMA_TABLE = {
    # inputs      K  bytes  accumulators    N       transpose
    ("f16",): (16, 2, ("f32", "f16"), _N_ALL, True),
    ("bf16",): (16, 2, ("f32",), _N_ALL, True),
    ("tf32",): (8, 4, ("f32",), _N_ALL, False),
    _FP8: (32, 1, ("f32", "f16"), _N_ALL, False),
}

# numba type and inline-asm constraint of one accumulator register.
_ACC_REGISTER = {"f32": (types.float32, "f"), "f16": (types.uint32, "r")}


@dataclass(frozen=True)
class WgmmaSpec:
    """One wgmma.mma_async variant, resolved for concrete types, operand source and immediates."""

    n: int
    a: str
    b: str
    acc: str
    k: int
    elem_bytes: int
    a_from: str = "smem"
    scale_a: int = 1
    scale_b: int = 1
    trans_a: int = 0
    trans_b: int = 0
    arch: object = SM90A

    @property
    def shape(self):
        return f"m64n{self.n}k{self.k}"

    @property
    def ptx(self):
        return f"wgmma.mma_async.sync.aligned.{self.shape}.{self.acc}.{self.a}.{self.b}"

    @property
    def acc_regs(self):
        return self.n // 2 if self.acc == "f32" else self.n // 4

    @property
    def acc_type(self):
        return types.UniTuple(_ACC_REGISTER[self.acc][0], self.acc_regs)

    @property
    def a_type(self):
        """Type of the A operand: a descriptor (SS) or four packed registers (RS)."""
        return types.uint64 if self.a_from == "smem" else types.UniTuple(types.uint32, 4)

    @property
    def has_transpose(self):
        return self.a in _FLOAT16

    @property
    def immediates(self):
        """The trailing immediates: imm-scale-a, imm-scale-b[, imm-trans-a][, imm-trans-b]."""
        imms = [self.scale_a, self.scale_b]
        if self.has_transpose:
            if self.a_from == "smem":
                imms.append(self.trans_a)
            imms.append(self.trans_b)
        return imms

    @property
    def template(self):
        """The asm template: outputs $0.., tied accumulator inputs, A, B, scale-d."""
        r = self.acc_regs
        if self.a_from == "smem":
            a_operand, b_index = f"${2 * r}", 2 * r + 1
        else:
            a_operand, b_index = register_list(2 * r, 4), 2 * r + 4
        scale_d = b_index + 1
        imms = ", ".join(str(v) for v in self.immediates)
        return (
            "{ .reg .pred p; setp.ne.b32 p, $%d, 0; %s %s, %s, $%d, p, %s; }"
            % (scale_d, self.ptx, register_list(0, r), a_operand, b_index, imms)
        )

    @property
    def constraints(self):
        r = self.acc_regs
        c = _ACC_REGISTER[self.acc][1]
        a = ["l"] if self.a_from == "smem" else ["r"] * 4
        return ["=" + c] * r + [str(i) for i in range(r)] + a + ["l", "r"]


def _family(a):
    for family, row in WGMMA_TABLE.items():
        if a in family:
            return family, row
    return None, None


def wgmma_specs(a_from="smem"):
    """Every (N, a, b, acc) combination of the table with default immediates, as WgmmaSpecs."""
    specs = []
    for family, (k, nbytes, accs, ns, _) in WGMMA_TABLE.items():
        for a in family:
            for b in family if family == _FP8 else (a,):
                for acc in accs:
                    for n in ns:
                        specs.append(WgmmaSpec(n, a, b, acc, k, nbytes, a_from=a_from))
    return specs


def _resolve(n, a, b, acc, a_from, scale_a, scale_b, trans_a, trans_b):
    family, row = _family(a)
    types_valid = ", ".join(
        f"{'/'.join(fam)} -> {'/'.join(r[2])}" for fam, r in WGMMA_TABLE.items()
    )
    if family is None:
        raise ValueError(
            f"wgmma has no input type {a!r}; valid inputs -> accumulators: {types_valid}"
        )
    k, nbytes, accs, ns, transposable = row
    if b not in (family if family == _FP8 else (a,)):
        valid_b = "/".join(family) if family == _FP8 else a
        raise ValueError(f"wgmma with A={a} takes B={valid_b}, got B={b!r}")
    if acc not in accs:
        raise ValueError(
            f"wgmma with A={a} accumulates in {'/'.join(accs)}, got {acc!r}; "
            f"valid inputs -> accumulators: {types_valid}"
        )
    if not isinstance(n, int) or n not in ns:
        if ns == _N_ALL:
            raise ValueError(f"wgmma N must be a multiple of 8 in 8..256, got {n!r}")
        raise ValueError(f"wgmma N for A={a} must be one of {list(ns)}, got {n!r}")
    if a_from not in ("smem", "reg"):
        raise ValueError(
            f"wgmma a_from must be 'smem' (SS form) or 'reg' (RS form), got {a_from!r}"
        )
    for name, value in (("scale_a", scale_a), ("scale_b", scale_b)):
        if value not in (1, -1):
            raise ValueError(f"wgmma {name} must be 1 or -1, got {value!r}")
    for name, value in (("trans_a", trans_a), ("trans_b", trans_b)):
        if value not in (0, 1):
            raise ValueError(f"wgmma {name} must be 0 (K-major) or 1 (MN-major), got {value!r}")
    if (trans_a or trans_b) and not transposable:
        raise ValueError(
            f"wgmma transposes (MN-major operands) exist only for f16/bf16; A={a} needs "
            f"trans_a=0 and trans_b=0 (K-major), got trans_a={trans_a}, trans_b={trans_b}"
        )
    if trans_a and a_from == "reg":
        raise ValueError(
            "wgmma trans_a applies to A in shared memory only; the RS form takes trans_a=0"
        )
    return WgmmaSpec(
        n, a, b, acc, k, nbytes, a_from, int(scale_a), int(scale_b), int(trans_a), int(trans_b)
    )


_CACHE = {}


def wgmma_mma_async(
    n, a, b=None, acc="f32", *, a_from="smem", scale_a=1, scale_b=1, trans_a=0, trans_b=0
):
    """Build the ``wgmma.mma_async`` intrinsic for one variant (PTX ISA 9.7.15.5.2).

    ``a``/``b``: "f16", "bf16", "tf32", "e4m3", "e5m2" (``b`` defaults to ``a``; only the fp8
    types mix).  ``acc``: "f32", or "f16" for f16 and fp8 inputs.  ``a_from``: "smem" (SS form,
    called as ``acc = mma(acc, desc_a, desc_b, scale_d)``) or "reg" (RS form, ``acc = mma(acc,
    a_frag, desc_b, scale_d)`` with ``a_frag`` a UniTuple(uint32, 4) in the layout of
    :func:`a_fragment_coords`).  ``scale_a``/``scale_b`` (1 or -1) negate A/B;
    ``trans_a``/``trans_b`` (0 K-major, 1 MN-major; f16/bf16 only, not trans_a in RS form) are
    baked into the instruction as immediates.  A combination outside the table raises ValueError
    naming the valid values.  The intrinsic's docstring quotes the PTX it emits.
    """
    b = a if b is None else b
    spec = _resolve(n, a, b, acc, a_from, scale_a, scale_b, trans_a, trans_b)
    if spec not in _CACHE:
        _CACHE[spec] = _build(spec)
    return _CACHE[spec]


def _build(spec):
    template = spec.template
    constraints = spec.constraints
    name = spec.ptx
    n_out = spec.acc_regs
    acc_type = spec.acc_type

    def typer(typingctx, acc, a, b, scale_d):
        check_type(name, acc, acc_type, "the accumulator")
        if spec.a_from == "smem":
            _check_descriptor(name, a, "the A descriptor")
        else:
            check_type(name, a, spec.a_type, "the A fragment")
        _check_descriptor(name, b, "the B descriptor")
        if not isinstance(scale_d, (types.Integer, types.Boolean)):
            raise NumbaTypeError(f"{name}: scale_d must be an integer (0: D = A*B), got {scale_d}")
        sig = acc_type(acc, a, b, scale_d)

        def codegen(context, builder, sig, args):
            require_arch(name, spec.arch)
            acc_t, a_t, b_t, sd_t = sig.args
            acc_v, a_v, b_v, sd_v = args
            operands = unpack(builder, acc_t, acc_v)
            if spec.a_from == "smem":
                operands.append(context.cast(builder, a_v, a_t, types.uint64))
            else:
                operands += unpack(builder, a_t, a_v)
            operands.append(context.cast(builder, b_v, b_t, types.uint64))
            operands.append(context.cast(builder, sd_v, sd_t, types.int32))
            out_ll = context.get_value_type(_ACC_REGISTER[spec.acc][0])
            outs = asm(builder, template, constraints, [out_ll] * n_out, operands, memory=True)
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = f"wgmma_{spec.shape}_{spec.acc}_{spec.a}_{spec.b}_{spec.a_from}"
    a_arg = "desc_a (uint64)" if spec.a_from == "smem" else "a_frag (UniTuple(uint32, 4))"
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.15.5.2, wgmma.mma_async).\n\n"
        f"Called as ``acc = mma(acc, {a_arg}, desc_b (uint64), scale_d)`` by a whole warpgroup; "
        f"acc is {acc_type}.  Needs {spec.arch.text}."
    )
    fn = intrinsic(typer)
    fn.spec = spec
    return fn


def _check_descriptor(name, ty, what):
    if not isinstance(ty, types.Integer):
        raise NumbaTypeError(f"{name}: {what} must be a 64-bit integer (make_smem_desc), got {ty}")


# ---------------------------------------------------------------------------------------------
# Fences, groups, and the operand fence
# ---------------------------------------------------------------------------------------------


def _no_operand_intrinsic(pyname, text, doc):
    return statement_intrinsic(pyname, text, SM90A, doc)


wgmma_fence = _no_operand_intrinsic(
    "wgmma_fence",
    "wgmma.fence.sync.aligned;",
    """Emits ``wgmma.fence.sync.aligned;`` (PTX ISA 9.7.15.7.1).

    Orders earlier register and shared-memory accesses of the warpgroup before the wgmma.mma_async
    that follow: needed before the first mma_async, and whenever the accumulator or an RS A
    fragment was written by ordinary instructions since the last one (consecutive mma_async on the
    same accumulator need none).  Shared-memory operands written through the generic proxy also
    need ``fence.proxy.async.shared::cta`` first.  Needs sm_90a.""",
)

wgmma_commit_group = _no_operand_intrinsic(
    "wgmma_commit_group",
    "wgmma.commit_group.sync.aligned;",
    """Emits ``wgmma.commit_group.sync.aligned;`` (PTX ISA 9.7.15.7.2).

    Closes a wgmma-group with every mma_async issued since the last commit.  Needs sm_90a.""",
)


@intrinsic
def wgmma_wait_group(typingctx, n):
    """Emits ``wgmma.wait_group.sync.aligned N;`` (PTX ISA 9.7.15.7.3), N a literal 0..7.

    Waits until at most N wgmma-groups are pending.  Follow it with ``acc =
    wgmma_fence_operand(acc)`` before reading an accumulator.  Needs sm_90a."""
    value = literal_value("wgmma_wait_group", n, "the number of pending groups", range(8))
    if value is None:
        if isinstance(n, types.Integer):
            return None  # numba retries with the literal
        raise NumbaTypeError(f"wgmma_wait_group takes a literal integer 0..7, got {n}")
    sig = types.void(n)
    text = f"wgmma.wait_group.sync.aligned {value};"

    def codegen(context, builder, sig, args):
        require_arch("wgmma_wait_group", SM90A)
        asm(builder, text, [], memory=True)
        return context.get_dummy_value()

    return sig, codegen


_FENCEABLE = (types.float32, types.uint32, types.int32)


@intrinsic
def wgmma_fence_operand(typingctx, frag):
    """Emits an empty inline asm (``""``, constraints ``=f,...,0,1,...``) that takes every
    register of ``frag`` in and hands it back: ``acc = wgmma_fence_operand(acc)``.

    No instruction; it pins the accumulator's registers to this program point (CUTLASS's
    ``warpgroup_fence_operand``).  Use it right after ``wgmma_wait_group`` -- reads of the
    accumulator then depend on a volatile asm that LLVM keeps below the wait -- and, if the
    accumulator was just written by ordinary code, before ``wgmma_fence``.  ``frag`` is a
    float32/uint32/int32 scalar, a UniTuple of them, or a UniTuple of such UniTuples (the RS A
    fragments of several k steps: frag_pack_bf16x2's result) fenced in one asm.  Any
    architecture."""
    typed = passthrough(frag, _FENCEABLE, memory=True)
    if typed is None:
        raise NumbaTypeError(
            "wgmma_fence_operand takes a float32, uint32 or int32 register, a UniTuple of them "
            f"or a UniTuple of such UniTuples, got {frag}"
        )
    return typed


# ---------------------------------------------------------------------------------------------
# Matrix descriptors
# ---------------------------------------------------------------------------------------------

make_smem_desc = cuda.jit(device=True, inline="always")(encode_wgmma_smem_desc)
make_smem_desc.__doc__ = """Device function: the 64-bit wgmma matrix descriptor (PTX ISA
9.7.15.5.1.2.2) for a tile starting at shared address ``addr`` (bytes, 16-byte aligned), with
leading/stride byte offsets ``lbo_bytes``/``sbo_bytes`` and swizzle width ``swizzle_bytes``
(0, 32, 64 or 128; anything else encodes "none").  Base offset 0: the tile's swizzle atoms
must start on their repeat boundary (256/512/1024 bytes).  Returns uint64.  The encoder, its bit
table and the host twin (``make_smem_desc_host``) are in :mod:`intrinsics.layout.smem`."""


@cuda.jit(device=True, inline="always")
def smem_desc(array, index, lbo_bytes, sbo_bytes, swizzle_bytes):
    """Device function: :func:`make_smem_desc` for the tile that starts at ``array[index]`` in
    shared memory."""
    return make_smem_desc(shared_address(array, index), lbo_bytes, sbo_bytes, swizzle_bytes)
