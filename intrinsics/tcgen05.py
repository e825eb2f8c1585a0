"""Blackwell's fifth-generation tensor-core family: ``tcgen05`` with tensor memory (PTX ISA 9.7.16,
"TensorCore 5th Generation Family Instructions").

NOTE: no Blackwell GPU was available while this module was written.  Every instruction form here
is proven by nvJitLink 13.5 to assemble for sm_100a, sm_103a and sm_110a (the ``f`` family targets
too, except the ``.scale_vec::NX`` spellings) and to be refused for sm_90a and sm_120a; the
*behaviour* -- bit fields, data layouts, the tensor-memory rules -- is modelled from the PTX ISA
(and, where the ISA's figures were not at hand, from how CUTLASS and DeepGEMM use the
instruction: each such place says so).  Those models -- the tcgen05.mma kinds table, the
instruction and shared-memory descriptors' bit fields, where each TMEM cell and register lands --
live in :mod:`intrinsics.layout` (``instr_desc``, ``smem``, ``tmem``), shared with wgmma, the
emulation and ``numbatc.layouts``; this module holds the device side.  The CPU emulation
(``intrinsics/emulate/tcgen05.py``) implements exactly these models; a Blackwell run must confirm
them.

The pieces, and who executes them::

    tensor memory (TMEM)   128 lanes x 512 columns of 32-bit cells per SM, shared by the CTAs
                           resident there; an address is (lane << 16) | column
                           (:func:`tmem_address`)
    tcgen05.alloc          one whole warp; writes the address of the columns it got into a
                           shared uint32 (array, index); power-of-two columns, 32..512
    tcgen05.dealloc        one whole warp; every allocation must be freed before the kernel exits
    tcgen05.relinquish_alloc_permit   one whole warp; the CTA will not allocate again
    tcgen05.mma            ONE thread (elect one); D (TMEM) = A (smem descriptor or TMEM) x
                           B (smem descriptor) [+ D]; asynchronous
    tcgen05.cp             ONE thread; shared memory -> TMEM (scale factors); asynchronous
    tcgen05.commit         ONE thread; an mbarrier arrive once every earlier asynchronous tcgen05
                           operation of that thread has completed (optionally multicast)
    tcgen05.ld / .st       one whole warp; TMEM <-> registers; warp w may touch only lanes
                           32*(w%4) .. 32*(w%4)+31; asynchronous until tcgen05.wait::ld / ::st
    tcgen05.fence::before_thread_sync / after_thread_sync
                           order tcgen05 operations around thread synchronisation (bar.sync,
                           mbarrier waits)

A single-CTA GEMM step reads (kernel-side sketch; ``idesc``, ``da``, ``db`` from the builders)::

    if warp == 0:
        tcgen05_alloc(tmem_slot, 0, 128)                 # 128 columns; address -> tmem_slot[0]
    tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    tcgen05_fence_after_thread_sync()
    d_tmem = tmem_slot[0]
    if threadIdx.x == 0:                                 # one thread issues
        for ks in range(K // 16):
            mma(d_tmem, da + ks * 2, db + ks * 2, idesc, ks)   # +32 B of K: start address >> 4
        tcgen05_commit(bars, 0)                          # arrive when the MMAs are done
    mbarrier_wait_parity(bars, 0, 0)
    tcgen05_fence_after_thread_sync()
    regs = ld32(d_tmem + ((32 * (warp % 4)) << 16))      # this warp's 32 lanes
    regs = tcgen05_wait_ld_regs(regs)                    # REQUIRED before using regs
    ...
    tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    if warp == 0:
        tcgen05_dealloc(d_tmem, 128)

NOTE: like wgmma's accumulator, the registers ``tcgen05.ld`` returns are written asynchronously
but reach LLVM as ordinary SSA results: nothing stops LLVM from moving a use above a plain
``tcgen05.wait::ld`` asm.  :func:`tcgen05_wait_ld_regs` emits the wait with every register tied
through it (in and out), so every later use depends on the wait.  Use it; :func:`tcgen05_wait_ld`
(no operands) is for loads whose registers are consumed only after other ordering.

Architectures (:data:`TCGEN05`): nvJitLink 13.5 assembles every form for sm_100a, sm_103a and
sm_110a (CUDA 13 renamed sm_101a to sm_110a; nvJitLink 13.5 answers ERROR_UNSUPPORTED_ARCH for
sm_101a and numba-cuda cannot target it) and their ``f`` targets, and refuses sm_90a and
sm_120a/sm_121a.  The
``.block_scale.scale_vec::1X/2X/4X`` spellings assemble for the ``a`` targets only
(:data:`TCGEN05_A_ONLY`); ``.block32`` / ``.block16`` mean the same and are portable to the ``f``
targets.  ``.kind::i8`` (sm_100a/sm_110a only), sparse ``tcgen05.mma.sp``, ``.ws``, the
``disable-output-lane`` / ``scale-input-d`` operands, ``.pack::16b``, the ``.16x32bx2`` shape,
``tcgen05.shift`` and ``tcgen05.cp`` decompression are not wrapped here.
"""

from dataclasses import dataclass

from numba import cuda, types
from numba.cuda.core.errors import NumbaTypeError
from numba.cuda.extending import _intrinsic

from intrinsics._core import (
    I32,
    Arch,
    asm,
    check_array,
    check_index,
    check_type,
    intrinsic,
    pack,
    register_list,
    require_arch,
    shared_address,
    unpack,
    statement_intrinsic,
)
from intrinsics.layout.instr_desc import (
    TCGEN05_MMA_KINDS,
    encode_instr_desc,
    encode_instr_desc_block_scaled,
)
from intrinsics.layout.smem import encode_umma_smem_desc
from intrinsics.layout.tmem import (
    TCGEN05_CP_SHAPES,
    TCGEN05_LDST_SHAPES,
    encode_tmem_address,
    ldst_register_count,
)
from intrinsics.smem import shared_address as smem_shared_address

__all__ = [
    "TCGEN05",
    "TCGEN05_A_ONLY",
    "Tcgen05MmaSpec",
    "Tcgen05ValueError",
    "make_instr_desc",
    "make_instr_desc_block_scaled",
    "make_umma_smem_desc",
    "tcgen05_alloc",
    "tcgen05_alloc_cg2",
    "tcgen05_alloc_op",
    "tcgen05_commit",
    "tcgen05_commit_cg2",
    "tcgen05_commit_multicast",
    "tcgen05_commit_multicast_cg2",
    "tcgen05_commit_op",
    "tcgen05_cp",
    "tcgen05_dealloc",
    "tcgen05_dealloc_cg2",
    "tcgen05_dealloc_op",
    "tcgen05_fence_after_thread_sync",
    "tcgen05_fence_before_thread_sync",
    "tcgen05_ld",
    "tcgen05_mma",
    "tcgen05_mma_specs",
    "tcgen05_relinquish_alloc_permit",
    "tcgen05_relinquish_alloc_permit_cg2",
    "tcgen05_relinquish_alloc_permit_op",
    "tcgen05_st",
    "tcgen05_wait_ld",
    "tcgen05_wait_ld_regs",
    "tcgen05_wait_st",
    "tmem_address",
    "umma_smem_desc",
]

# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------

# Proven with nvJitLink 13.5 (tests/test_tcgen05_compile.py assembles every form for each).
TCGEN05 = Arch(
    "sm_100a/sm_103a/sm_110a (Blackwell datacenter targets with tcgen05; also their 'f' targets)",
    specific=[(10, 0), (10, 3), (11, 0)],
)


class _ArchSuffixA(Arch):
    """An Arch that only the architecture-specific ``a`` targets satisfy (not ``f``)."""

    def accepts(self, cc):
        return len(cc) > 2 and cc[2] == "a" and tuple(cc[:2]) in self.specific


TCGEN05_A_ONLY = _ArchSuffixA(
    "sm_100a/sm_103a/sm_110a (the .scale_vec::NX spellings; the 'f' targets refuse them)",
    specific=[(10, 0), (10, 3), (11, 0)],
)


class Tcgen05ValueError(ValueError):
    """A literal argument outside its valid values, found at typing time.

    A plain ValueError on purpose: numba retries a typer that raises one of its own errors with
    non-literal argument types, which would accept the bad constant silently."""


# A typer that sees constants as literals first (and plain integers for run-time values).
_literal_intrinsic = _intrinsic(target="cuda", prefer_literal=True)


def _with_forms(fn, forms, arch):
    """Attach the asm forms an intrinsic can emit (template, constraints) and its Arch: the
    compile tests assemble each form on every architecture."""
    fn.forms = tuple((template, tuple(constraints)) for template, constraints in forms)
    fn.arch = arch
    return fn

# ---------------------------------------------------------------------------------------------
# Tensor memory addresses
# ---------------------------------------------------------------------------------------------

_NCOLS = (32, 64, 128, 256, 512)
CTA_GROUPS = (1, 2)


tmem_address = cuda.jit(device=True, inline="always")(encode_tmem_address)
tmem_address.__doc__ = """Device function: the 32-bit TMEM address of (lane, column) --
``(lane << 16) | column``: PTX ISA 9.7.16, "Tensor Memory" addresses a cell with the lane in bits
31-16 and the column in bits 15-0.  Add a lane offset to an allocation's address with
``d_tmem + (lane << 16)``.  (Host twin: ``intrinsics.layout.tmem_address_host``.)"""


# ---------------------------------------------------------------------------------------------
# tcgen05.alloc / dealloc / relinquish_alloc_permit
# ---------------------------------------------------------------------------------------------

_ALLOC = ("9.7.16 \"Tensor Memory Allocation and Management Instructions\" (tcgen05.alloc, "
          "tcgen05.dealloc, tcgen05.relinquish_alloc_permit)")


def _ncols_literal(name, ty):
    """The literal column count (checked), None for a run-time integer."""
    if isinstance(ty, types.IntegerLiteral):
        value = ty.literal_value
        if value not in _NCOLS:
            raise Tcgen05ValueError(
                f"{name}: the column count must be a power of two in 32..512 "
                f"(one of {list(_NCOLS)}), got {value}"
            )
        return value
    if isinstance(ty, types.Integer):
        return None
    raise NumbaTypeError(f"{name}: the column count must be an integer (32..512), got {ty}")


def _check_cta_group(what, cta_group):
    if cta_group not in CTA_GROUPS:
        raise ValueError(f"{what}: cta_group must be 1 or 2, got {cta_group!r}")


_PAIR = (" (the CTA pair: per the PTX ISA a warp in each of the two peer CTAs executes it and "
         "both get the same columns)")


def _build_alloc(cta_group):
    name = f"tcgen05.alloc.cta_group::{cta_group}.sync.aligned.shared::cta.b32"

    def typer(typingctx, array, index, ncols):
        check_array(name, array, "a shared uint32 array")
        if array.dtype != types.uint32:
            raise NumbaTypeError(f"{name}: the destination array must hold uint32, got {array}")
        check_index(name, array, index)
        literal = _ncols_literal(name, ncols)
        sig = types.void(array, types.unliteral(index), ncols)

        def codegen(context, builder, sig, args):
            require_arch(name, TCGEN05)
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            if literal is not None:
                asm(builder, f"{name} [$0], {literal};", ["r"], [], [addr], memory=True)
            else:
                n = context.cast(builder, args[2], sig.args[2], types.uint32)
                asm(builder, f"{name} [$0], $1;", ["r", "r"], [], [addr, n], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = "tcgen05_alloc" + ("_cg2" if cta_group == 2 else "")
    forms = [(f"{name} [$0], {n};", ["r"]) for n in _NCOLS] + [(f"{name} [$0], $1;", ["r", "r"])]
    typer.__doc__ = f"""Emits ``{name} [$0], NCOLS;`` (PTX ISA {_ALLOC}).

    ``tcgen05_alloc(array, index, ncols)``, executed by every thread of ONE warp: allocates
    ``ncols`` columns (all 128 lanes) of tensor memory and writes their TMEM address (lane 0,
    first column) to ``array[index]`` (a shared uint32).  ``ncols`` is a power of two in 32..512;
    a literal outside that raises Tcgen05ValueError at typing time (a run-time value goes into a
    register).  Blocks until enough columns are free.  Read the address after
    ``tcgen05_fence_before_thread_sync(); syncthreads(); tcgen05_fence_after_thread_sync()``.
    cta_group::{cta_group}{_PAIR if cta_group == 2 else ''}.  Needs {TCGEN05.text}."""
    return _with_forms(_literal_intrinsic(typer), forms, TCGEN05)


def _build_dealloc(cta_group):
    name = f"tcgen05.dealloc.cta_group::{cta_group}.sync.aligned.b32"

    def typer(typingctx, taddr, ncols):
        if not isinstance(taddr, types.Integer):
            raise NumbaTypeError(f"{name}: the TMEM address must be a 32-bit integer, got {taddr}")
        literal = _ncols_literal(name, ncols)
        sig = types.void(types.unliteral(taddr), ncols)

        def codegen(context, builder, sig, args):
            require_arch(name, TCGEN05)
            t = context.cast(builder, args[0], sig.args[0], types.uint32)
            if literal is not None:
                asm(builder, f"{name} $0, {literal};", ["r"], [], [t], memory=True)
            else:
                n = context.cast(builder, args[1], sig.args[1], types.uint32)
                asm(builder, f"{name} $0, $1;", ["r", "r"], [], [t, n], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = "tcgen05_dealloc" + ("_cg2" if cta_group == 2 else "")
    forms = [(f"{name} $0, {n};", ["r"]) for n in _NCOLS] + [(f"{name} $0, $1;", ["r", "r"])]
    typer.__doc__ = f"""Emits ``{name} $0, NCOLS;`` (PTX ISA {_ALLOC}).

    ``tcgen05_dealloc(taddr, ncols)``, executed by every thread of one warp: frees ``ncols``
    columns allocated at ``taddr``.  Every allocation must be freed before the kernel exits (after
    the last tcgen05.ld/st/mma using it: fence::before_thread_sync + barrier first).  Needs
    {TCGEN05.text}."""
    return _with_forms(_literal_intrinsic(typer), forms, TCGEN05)


def _build_relinquish(cta_group):
    name = f"tcgen05.relinquish_alloc_permit.cta_group::{cta_group}.sync.aligned"

    pyname = "tcgen05_relinquish_alloc_permit" + ("_cg2" if cta_group == 2 else "")
    doc = f"""Emits ``{name};`` (PTX ISA {_ALLOC}).

    Executed by every thread of one warp: the CTA gives up its right to allocate tensor memory
    (a later tcgen05.alloc by the CTA is undefined behaviour), which lets other CTAs on the SM
    allocate without waiting.  Needs {TCGEN05.text}."""
    fn = statement_intrinsic(pyname, f"{name};", TCGEN05, doc, arch_name=name)
    return _with_forms(fn, [(f"{name};", [])], TCGEN05)


_ALLOC_OPS = {g: (_build_alloc(g), _build_dealloc(g), _build_relinquish(g)) for g in CTA_GROUPS}


def tcgen05_alloc_op(cta_group=1):
    """The tcgen05.alloc intrinsic for ``cta_group`` 1 or 2."""
    _check_cta_group("tcgen05_alloc_op", cta_group)
    return _ALLOC_OPS[cta_group][0]


def tcgen05_dealloc_op(cta_group=1):
    """The tcgen05.dealloc intrinsic for ``cta_group`` 1 or 2."""
    _check_cta_group("tcgen05_dealloc_op", cta_group)
    return _ALLOC_OPS[cta_group][1]


def tcgen05_relinquish_alloc_permit_op(cta_group=1):
    """The tcgen05.relinquish_alloc_permit intrinsic for ``cta_group`` 1 or 2."""
    _check_cta_group("tcgen05_relinquish_alloc_permit_op", cta_group)
    return _ALLOC_OPS[cta_group][2]


tcgen05_alloc = tcgen05_alloc_op(1)
tcgen05_alloc_cg2 = tcgen05_alloc_op(2)
tcgen05_dealloc = tcgen05_dealloc_op(1)
tcgen05_dealloc_cg2 = tcgen05_dealloc_op(2)
tcgen05_relinquish_alloc_permit = tcgen05_relinquish_alloc_permit_op(1)
tcgen05_relinquish_alloc_permit_cg2 = tcgen05_relinquish_alloc_permit_op(2)

# ---------------------------------------------------------------------------------------------
# tcgen05.mma (its kinds table, TCGEN05_MMA_KINDS, is intrinsics.layout.instr_desc's)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tcgen05MmaSpec:
    """One tcgen05.mma variant: kind, CTA group, where A lives and the scale-vector qualifier."""

    kind: str
    cta_group: int = 1
    a_from: str = "smem"
    scale_vec: object = None

    @property
    def row(self):
        return TCGEN05_MMA_KINDS[self.kind]

    @property
    def block_scaled(self):
        return self.row.block_scaled

    @property
    def arch(self):
        return TCGEN05_A_ONLY if self.scale_vec in ("1X", "2X", "4X") else TCGEN05

    @property
    def scale_count(self):
        """Scale factors per row of A (and of B) per instruction (1, 2 or 4)."""
        return self.row.scale_vecs[self.scale_vec] if self.block_scaled else 0

    @property
    def ptx(self):
        text = f"tcgen05.mma.cta_group::{self.cta_group}.kind::{self.kind}"
        if self.block_scaled:
            text += ".block_scale"
            if self.scale_vec in ("1X", "2X", "4X"):
                text += f".scale_vec::{self.scale_vec}"
            elif self.scale_vec is not None:
                text += f".{self.scale_vec}"
        return text

    @property
    def template(self):
        """``[d], a, b, idesc[, [sfa], [sfb]], p`` with p = (enable_input_d != 0)."""
        a = "[$1]" if self.a_from == "tmem" else "$1"
        if self.block_scaled:
            return ("{ .reg .pred p; setp.ne.b32 p, $6, 0; "
                    f"{self.ptx} [$0], {a}, $2, $3, [$4], [$5], p; }}")
        return "{ .reg .pred p; setp.ne.b32 p, $4, 0; " f"{self.ptx} [$0], {a}, $2, $3, p; }}"

    @property
    def constraints(self):
        a = "r" if self.a_from == "tmem" else "l"
        return ["r", a, "l", "r"] + (["r", "r"] if self.block_scaled else []) + ["r"]


def tcgen05_mma_specs():
    """Every variant of the table: each kind x cta_group x A source x scale-vector spelling."""
    specs = []
    for kind, row in TCGEN05_MMA_KINDS.items():
        for cta_group in CTA_GROUPS:
            for a_from in ("smem", "tmem"):
                for vec in (row.scale_vecs if row.block_scaled else (None,)):
                    specs.append(Tcgen05MmaSpec(kind, cta_group, a_from, vec))
    return specs


def _resolve_mma(kind, cta_group, a_from, scale_vec):
    if kind not in TCGEN05_MMA_KINDS:
        raise ValueError(f"tcgen05.mma has no kind {kind!r}; valid kinds: "
                         f"{', '.join(TCGEN05_MMA_KINDS)}")
    _check_cta_group("tcgen05_mma", cta_group)
    if a_from not in ("smem", "tmem"):
        raise ValueError(f"tcgen05_mma a_from must be 'smem' (A descriptor) or 'tmem' (A in "
                         f"tensor memory), got {a_from!r}")
    row = TCGEN05_MMA_KINDS[kind]
    if not row.block_scaled:
        if scale_vec is not None:
            raise ValueError(f"tcgen05.mma kind::{kind} is not block-scaled; scale_vec must be "
                             f"None, got {scale_vec!r}")
    elif scale_vec not in row.scale_vecs:
        valid = ", ".join(repr(v) for v in row.scale_vecs)
        raise ValueError(f"tcgen05.mma kind::{kind} takes scale_vec {valid}, got {scale_vec!r}")
    return Tcgen05MmaSpec(kind, cta_group, a_from, scale_vec)


_MMA_CACHE = {}


def tcgen05_mma(kind, cta_group=1, a_from="smem", scale_vec=None):
    """Build the ``tcgen05.mma`` intrinsic for one variant (PTX ISA 9.7.16, tcgen05.mma).

    ``kind``: "f16" (f16/bf16 in, f32 or f16 accumulator), "tf32", "f8f6f4" (e4m3/e5m2/e2m3/
    e3m2/e2m1), or the block-scaled "mxf8f6f4", "mxf4", "mxf4nvf4".  ``cta_group``: 1 or 2.
    ``a_from``: "smem" (A by a 64-bit shared-memory descriptor) or "tmem" (A in tensor memory,
    a 32-bit TMEM address).  ``scale_vec`` (block-scaled kinds only): mxf8f6f4 None/"1X"/
    "block32" (1 scale per 32 K); mxf4 None/"2X"/"block32" (2 per 64 K); mxf4nvf4 "2X"/"block32"
    (2 per 64 K, ue8m0) or "4X"/"block16" (4 per 64 K, ue4m3 or ue8m0).  None emits the ISA's
    default (no qualifier).  The NX spellings assemble for the ``a`` targets only.

    Called by ONE thread::

        mma(d_tmem, a, b_desc, idesc, enable_input_d)                      # dense kinds
        mma(d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d)  # block-scaled

    ``idesc`` is the 32-bit instruction descriptor (``intrinsics.layout.make_instr_desc_host``
    ...) that holds M, N, the types, transposes and negations; ``enable_input_d`` 0 makes D = A*B (the old D is
    ignored), anything else D = A*B + D.  The intrinsic's docstring quotes the PTX it emits.
    """
    spec = _resolve_mma(kind, cta_group, a_from, scale_vec)
    if spec not in _MMA_CACHE:
        _MMA_CACHE[spec] = _build_mma(spec)
    return _MMA_CACHE[spec]


def _check_int(name, ty, what):
    if not isinstance(ty, (types.Integer, types.Boolean)):
        raise NumbaTypeError(f"{name}: {what} must be an integer, got {ty}")


def _build_mma(spec):
    name, template, constraints = spec.ptx, spec.template, spec.constraints
    a_what = "the A TMEM address (uint32)" if spec.a_from == "tmem" else "the A descriptor (uint64)"

    def check(d, a, b, idesc, rest):
        _check_int(name, d, "the D TMEM address")
        _check_int(name, a, a_what)
        _check_int(name, b, "the B descriptor (uint64)")
        _check_int(name, idesc, "the instruction descriptor (uint32)")
        for ty, what in rest:
            _check_int(name, ty, what)

    def operands(context, builder, sig, args):
        casts = [types.uint32, types.uint32 if spec.a_from == "tmem" else types.uint64,
                 types.uint64] + [types.uint32] * (len(args) - 3)
        return [context.cast(builder, v, t, c) for v, t, c in zip(args, sig.args, casts)]

    def codegen(context, builder, sig, args):
        require_arch(name, spec.arch)
        asm(builder, template, constraints, [], operands(context, builder, sig, args),
            memory=True)
        return context.get_dummy_value()

    if spec.block_scaled:
        def typer(typingctx, d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d):
            check(d_tmem, a, b_desc, idesc,
                  [(sfa_tmem, "the A scale-factor TMEM address"),
                   (sfb_tmem, "the B scale-factor TMEM address"),
                   (enable_input_d, "enable_input_d")])
            return types.void(d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d), codegen
        call = "mma(d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d)"
    else:
        def typer(typingctx, d_tmem, a, b_desc, idesc, enable_input_d):
            check(d_tmem, a, b_desc, idesc, [(enable_input_d, "enable_input_d")])
            return types.void(d_tmem, a, b_desc, idesc, enable_input_d), codegen
        call = "mma(d_tmem, a, b_desc, idesc, enable_input_d)"

    typer.__name__ = (f"tcgen05_mma_cg{spec.cta_group}_{spec.kind}_{spec.a_from}"
                      f"{'_' + spec.scale_vec if spec.scale_vec else ''}")
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.16, tcgen05.mma).\n\n"
        f"Called as ``{call}`` by ONE thread (A: {a_what}).  Asynchronous: completion is "
        f"observed through tcgen05_commit on an mbarrier.  Needs {spec.arch.text}."
    )
    fn = _with_forms(intrinsic(typer), [(template, constraints)], spec.arch)
    fn.spec = spec
    return fn


# ---------------------------------------------------------------------------------------------
# tcgen05.commit
# ---------------------------------------------------------------------------------------------

_COMMIT = "9.7.16 \"tcgen05.commit\""


def _build_commit(cta_group, multicast):
    base = (f"tcgen05.commit.cta_group::{cta_group}.mbarrier::arrive::one.shared::cluster"
            f"{'.multicast::cluster' if multicast else ''}.b64")
    text = f"{base} [$0], $1;" if multicast else f"{base} [$0];"

    def check(bars, index):
        check_array(base, bars, "a shared uint64 mbarrier array")
        if bars.dtype != types.uint64:
            raise NumbaTypeError(f"{base}: the mbarrier array must hold uint64, got {bars}")
        check_index(base, bars, index)

    def codegen(context, builder, sig, args):
        require_arch(base, TCGEN05)
        addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        ops = [addr]
        if multicast:
            ops.append(context.cast(builder, args[2], sig.args[2], types.uint16))
        asm(builder, text, ["r", "h"] if multicast else ["r"], [], ops, memory=True)
        return context.get_dummy_value()

    if multicast:
        def typer(typingctx, bars, index, cta_mask):
            check(bars, index)
            _check_int(base, cta_mask, "the CTA mask (16 bits, bit r = CTA rank r)")
            return types.void(bars, index, cta_mask), codegen
        call = "commit(bars, index, cta_mask)"
        what = ("an arrive-one on the mbarrier at the same shared offset in every CTA of the "
                "cluster whose rank's bit is set in the 16-bit ``cta_mask``")
    else:
        def typer(typingctx, bars, index):
            check(bars, index)
            return types.void(bars, index), codegen
        call = "commit(bars, index)"
        what = "an arrive-one on the mbarrier ``bars[index]`` of this CTA"
    typer.__name__ = (f"tcgen05_commit{'_multicast' if multicast else ''}"
                      f"{'_cg2' if cta_group == 2 else ''}")
    typer.__doc__ = f"""Emits ``{text}`` (PTX ISA {_COMMIT}).

    ``{call}``, by ONE thread: once every asynchronous tcgen05 operation this thread issued
    before (mma, cp) has completed, performs {what}.  The mbarrier is a shared uint64 (array,
    index), initialised with mbarrier_init.  Needs {TCGEN05.text}."""
    return _with_forms(intrinsic(typer), [(text, ["r", "h"] if multicast else ["r"])], TCGEN05)


_COMMITS = {(g, m): _build_commit(g, m) for g in CTA_GROUPS for m in (False, True)}


def tcgen05_commit_op(cta_group=1, multicast=False):
    """The tcgen05.commit intrinsic for ``cta_group`` 1 or 2, optionally ``.multicast::cluster``."""
    _check_cta_group("tcgen05_commit_op", cta_group)
    return _COMMITS[(cta_group, bool(multicast))]


tcgen05_commit = tcgen05_commit_op(1)
tcgen05_commit_cg2 = tcgen05_commit_op(2)
tcgen05_commit_multicast = tcgen05_commit_op(1, True)
tcgen05_commit_multicast_cg2 = tcgen05_commit_op(2, True)

# ---------------------------------------------------------------------------------------------
# tcgen05.ld / tcgen05.st / tcgen05.wait
# ---------------------------------------------------------------------------------------------

_LDST = "9.7.16 \"tcgen05.ld\" / \"tcgen05.st\" (and \"Matrix fragments for tcgen05.ld/st\")"
_LDST_CACHE = {}


def tcgen05_ld(shape, num):
    """The ``tcgen05.ld.sync.aligned.<shape>.x<num>.b32`` intrinsic: ``regs = ld(taddr)``,
    a UniTuple of uint32 (``intrinsics.layout.ldst_coords`` gives each register's cell).  Shapes and .num:
    32x32b and 16x64b x1..x128, 16x128b x1..x64, 16x256b x1..x32."""
    regs = ldst_register_count("ld", shape, num)
    key = ("ld", shape, num)
    if key not in _LDST_CACHE:
        _LDST_CACHE[key] = _build_ld(shape, num, regs)
    return _LDST_CACHE[key]


def tcgen05_st(shape, num):
    """The ``tcgen05.st.sync.aligned.<shape>.x<num>.b32`` intrinsic: ``st(taddr, regs)`` with
    regs a UniTuple of uint32 (same shapes, .num and cells as :func:`tcgen05_ld`)."""
    regs = ldst_register_count("st", shape, num)
    key = ("st", shape, num)
    if key not in _LDST_CACHE:
        _LDST_CACHE[key] = _build_st(shape, num, regs)
    return _LDST_CACHE[key]


_WARP_RULE = ("warp w of the CTA may access TMEM lanes 32*(w%4) .. 32*(w%4)+31 only; the 16-lane "
              "shapes start at that base or 16 above it")


def _build_ld(shape, num, regs):
    name = f"tcgen05.ld.sync.aligned.{shape}.x{num}.b32"
    template = f"{name} {register_list(0, regs)}, [${regs}];"
    ret = types.UniTuple(types.uint32, regs)

    def typer(typingctx, taddr):
        _check_int(name, taddr, "the TMEM address")
        sig = ret(taddr)

        def codegen(context, builder, sig, args):
            require_arch(name, TCGEN05)
            t = context.cast(builder, args[0], sig.args[0], types.uint32)
            outs = asm(builder, template, ["=r"] * regs + ["r"], [I32] * regs, [t], memory=True)
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = f"tcgen05_ld_{shape}_x{num}"
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA {_LDST}).\n\n``regs = ld(taddr)`` by a whole warp; "
        f"returns {ret}.  {_WARP_RULE}.  Asynchronous: ``regs = tcgen05_wait_ld_regs(regs)`` "
        f"before using them.  Needs {TCGEN05.text}."
    )
    return _with_forms(intrinsic(typer), [(template, ["=r"] * regs + ["r"])], TCGEN05)


def _build_st(shape, num, regs):
    name = f"tcgen05.st.sync.aligned.{shape}.x{num}.b32"
    template = f"{name} [$0], {register_list(1, regs)};"
    frag = types.UniTuple(types.uint32, regs)

    def typer(typingctx, taddr, values):
        _check_int(name, taddr, "the TMEM address")
        check_type(name, values, frag, "the registers")
        sig = types.void(taddr, values)

        def codegen(context, builder, sig, args):
            require_arch(name, TCGEN05)
            t = context.cast(builder, args[0], sig.args[0], types.uint32)
            vals = unpack(builder, sig.args[1], args[1])
            asm(builder, template, ["r"] * (regs + 1), [], [t] + vals, memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = f"tcgen05_st_{shape}_x{num}"
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA {_LDST}).\n\n``st(taddr, regs)`` by a whole warp, regs "
        f"{frag}.  {_WARP_RULE}.  Asynchronous: tcgen05_wait_st before the cells are read by "
        f"another tcgen05 operation.  Needs {TCGEN05.text}."
    )
    return _with_forms(intrinsic(typer), [(template, ["r"] * (regs + 1))], TCGEN05)


def _no_operand(pyname, text, doc):
    return _with_forms(statement_intrinsic(pyname, text, TCGEN05, doc), [(text, [])], TCGEN05)


tcgen05_wait_ld = _no_operand(
    "tcgen05_wait_ld", "tcgen05.wait::ld.sync.aligned;",
    f"""Emits ``tcgen05.wait::ld.sync.aligned;`` (PTX ISA 9.7.16, "tcgen05.wait").

    By a whole warp: waits until every tcgen05.ld of this thread has completed.  Prefer
    :func:`tcgen05_wait_ld_regs`, which also pins the uses of the loaded registers below the wait.
    Needs {TCGEN05.text}.""")

tcgen05_wait_st = _no_operand(
    "tcgen05_wait_st", "tcgen05.wait::st.sync.aligned;",
    f"""Emits ``tcgen05.wait::st.sync.aligned;`` (PTX ISA 9.7.16, "tcgen05.wait").

    By a whole warp: waits until every tcgen05.st of this thread has completed (before another
    tcgen05 operation or thread reads the cells).  Needs {TCGEN05.text}.""")


@intrinsic
def tcgen05_wait_ld_regs(typingctx, frag):
    """Emits ``tcgen05.wait::ld.sync.aligned;`` with every register of ``frag`` tied through it
    (constraints ``=r,...,0,1,...``): ``regs = tcgen05_wait_ld_regs(regs)``.

    The same wait as :func:`tcgen05_wait_ld`, by a whole warp; because its outputs are the
    registers, every later use depends on the (volatile) wait and LLVM cannot move it above.
    ``frag``: a uint32 or a UniTuple of uint32 (what tcgen05_ld returns).  Needs sm_100a/sm_103a/
    sm_110a."""
    dtype = frag.dtype if isinstance(frag, types.UniTuple) else frag
    if dtype != types.uint32:
        raise NumbaTypeError(
            f"tcgen05_wait_ld_regs takes a uint32 or a UniTuple of uint32 (tcgen05_ld's result), "
            f"got {frag}")
    count = frag.count if isinstance(frag, types.UniTuple) else 1
    constraints = ["=r"] * count + [str(i) for i in range(count)]
    sig = frag(frag)

    def codegen(context, builder, sig, args):
        require_arch("tcgen05_wait_ld_regs", TCGEN05)
        values = unpack(builder, sig.args[0], args[0])
        outs = asm(builder, "tcgen05.wait::ld.sync.aligned;", constraints, [I32] * count, values,
                   memory=True)
        return pack(context, builder, sig.return_type, outs)

    return sig, codegen


tcgen05_wait_ld_regs = _with_forms(tcgen05_wait_ld_regs, [("tcgen05.wait::ld.sync.aligned;", [])],
                                   TCGEN05)

tcgen05_fence_before_thread_sync = _no_operand(
    "tcgen05_fence_before_thread_sync", "tcgen05.fence::before_thread_sync;",
    f"""Emits ``tcgen05.fence::before_thread_sync;`` (PTX ISA 9.7.16, "tcgen05.fence").

    Orders this thread's earlier asynchronous tcgen05 operations before a following thread
    synchronisation (bar.sync, mbarrier arrive): e.g. before the barrier that ends the epilogue's
    tcgen05.ld and precedes tcgen05.dealloc, or that publishes tcgen05.alloc's address.  Needs
    {TCGEN05.text}.""")

tcgen05_fence_after_thread_sync = _no_operand(
    "tcgen05_fence_after_thread_sync", "tcgen05.fence::after_thread_sync;",
    f"""Emits ``tcgen05.fence::after_thread_sync;`` (PTX ISA 9.7.16, "tcgen05.fence").

    Orders this thread's later tcgen05 operations after a preceding thread synchronisation
    (bar.sync, an mbarrier wait): e.g. after waiting on tcgen05.commit's mbarrier and before
    tcgen05.ld of the accumulator.  Needs {TCGEN05.text}.""")

# ---------------------------------------------------------------------------------------------
# tcgen05.cp (shared memory -> tensor memory)
# ---------------------------------------------------------------------------------------------

_CP_CACHE = {}


def tcgen05_cp(shape, cta_group=1):
    """The ``tcgen05.cp.cta_group::N.<shape>`` intrinsic: ``cp(taddr, s_desc)`` by ONE thread.

    Copies a ``rows x bits`` matrix from shared memory, described by the sm100 shared-memory
    descriptor ``s_desc`` (:func:`make_umma_smem_desc`; rows are the descriptor's MN dimension,
    the row's bytes its K), to TMEM at ``taddr``: row r to the lanes of ``intrinsics.layout.cp_lane_map``, its
    32-bit words to consecutive columns.  Asynchronous; complete it with tcgen05_commit.  Shapes:
    128x256b, 4x256b, 128x128b, 64x128b.warpx2::02_13, 64x128b.warpx2::01_23, 32x128b.warpx4."""
    if shape not in TCGEN05_CP_SHAPES:
        raise ValueError(f"tcgen05.cp shape must be one of {list(TCGEN05_CP_SHAPES)}, "
                         f"got {shape!r}")
    _check_cta_group("tcgen05_cp", cta_group)
    key = (shape, cta_group)
    if key not in _CP_CACHE:
        _CP_CACHE[key] = _build_cp(shape, cta_group)
    return _CP_CACHE[key]


def _build_cp(shape, cta_group):
    name = f"tcgen05.cp.cta_group::{cta_group}.{shape}"
    template = f"{name} [$0], $1;"

    def typer(typingctx, taddr, s_desc):
        _check_int(name, taddr, "the TMEM address")
        _check_int(name, s_desc, "the shared-memory descriptor (uint64)")
        sig = types.void(taddr, s_desc)

        def codegen(context, builder, sig, args):
            require_arch(name, TCGEN05)
            t = context.cast(builder, args[0], sig.args[0], types.uint32)
            d = context.cast(builder, args[1], sig.args[1], types.uint64)
            asm(builder, template, ["r", "l"], [], [t, d], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = "tcgen05_cp_" + shape.replace(".", "_").replace("::", "_")
    typer.__doc__ = (f"Emits ``{template}`` (PTX ISA 9.7.16, tcgen05.cp).\n\n``cp(taddr, "
                     f"s_desc)`` by ONE thread.  Needs {TCGEN05.text}.")
    return _with_forms(intrinsic(typer), [(template, ["r", "l"])], TCGEN05)


# ---------------------------------------------------------------------------------------------
# Builders: the instruction descriptor and the shared-memory descriptor (device side)
# ---------------------------------------------------------------------------------------------
# The bit layouts, the host builders (make_instr_desc_host, make_instr_desc_block_scaled_host,
# make_umma_smem_desc_host), the decoders and the address model live in intrinsics.layout
# (instr_desc and smem); these are the same encoders compiled for kernels.

make_instr_desc = cuda.jit(device=True, inline="always")(encode_instr_desc)
make_instr_desc.__doc__ = """Device function: the 32-bit tcgen05.mma instruction descriptor of a
dense kind from numeric codes: ``make_instr_desc(d_format, a_format, b_format, m, n, a_major,
b_major, negate_a, negate_b)`` (codes of ``intrinsics.layout.IDESC_D_FORMATS`` /
``IDESC_AB_FORMATS``; majors 0 K-major, 1 MN-major).  Returns uint32.

""" + (encode_instr_desc.__doc__ or "")

make_instr_desc_block_scaled = cuda.jit(device=True, inline="always")(
    encode_instr_desc_block_scaled)
make_instr_desc_block_scaled.__doc__ = """Device function: the 32-bit instruction descriptor of a
block-scaled kind: ``make_instr_desc_block_scaled(a_format, b_format, scale_format, m, n,
a_major, b_major, negate_a, negate_b, sfa_id, sfb_id)``.  Returns uint32.

""" + (encode_instr_desc_block_scaled.__doc__ or "")

make_umma_smem_desc = cuda.jit(device=True, inline="always")(encode_umma_smem_desc)
make_umma_smem_desc.__doc__ = """Device function: the 64-bit tcgen05 shared-memory descriptor
(PTX ISA 9.7.16, "Shared memory descriptor") of a tile at shared address ``addr`` (bytes, 16-byte
aligned) with leading/stride byte offsets and swizzle width ``swizzle_bytes`` (0, 32, 64 or 128;
anything else encodes "none").  Version 1, base offset 0, relative LBO.  Returns uint64.  wgmma's
descriptor with the version field set: the one encoder and its bit table are in
:mod:`intrinsics.layout.smem`; the host twin (with base offset and LBO mode) is
``intrinsics.layout.make_umma_smem_desc_host``."""


@cuda.jit(device=True, inline="always")
def umma_smem_desc(array, index, lbo_bytes, sbo_bytes, swizzle_bytes):
    """Device function: :func:`make_umma_smem_desc` for the tile that starts at ``array[index]``
    in shared memory."""
    return make_umma_smem_desc(smem_shared_address(array, index), lbo_bytes, sbo_bytes,
                               swizzle_bytes)
