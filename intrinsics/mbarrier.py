"""Shared-memory barrier objects: ``mbarrier`` (PTX ISA 9.7.13.15, "Parallel Synchronization and
Communication Instructions: mbarrier").

An mbarrier is a 64-bit object in shared memory that completes a *phase* when two counts reach
zero: the pending arrivals (set by ``mbarrier.init``, decremented by each arrive-on operation) and
the transaction count (bytes that asynchronous copies promised with expect-tx and delivered with
complete-tx, 9.7.13.15.5).  On completion the phase number advances by one, the pending count
returns to the init count and the transaction count to zero.  Waiters name a phase by its parity
(even phases 0, odd phases 1): ``test_wait.parity(P)`` is true once the phase of parity ``P`` is
no longer the current one.  A fresh barrier is in phase 0, so parity 1 already reads as complete.

Kernels keep their barriers in a shared ``uint64`` array and name one by (array, element index),
which is also what a CPU emulation needs to find the object::

    bars = cuda.shared.array(2, np.uint64)              # full[0], empty[1]
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 0, 1)
        fence_mbarrier_init()                           # before async proxies or peer CTAs use it
    cuda.syncthreads()
    ...
    mbarrier_wait_parity(bars, 0, phase)                # blocks until phase ``phase`` completes

Each row of :data:`MBARRIER_OPS` is one instruction form: its asm template, the operands after
(bars, index), what it returns and which architectures have it.  Every form addresses the barrier
in the ``.shared::cta`` window (32-bit address) except :func:`mbarrier_arrive_cluster`, which maps
it into a peer CTA of the cluster first.  Every statement carries a memory clobber: arrivals
release and waits acquire, so ordinary loads and stores must stay on their side.
"""

from dataclasses import dataclass

from llvmlite import ir
from numba import types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import (
    I32,
    I64,
    SM80,
    SM90,
    asm,
    check_array,
    check_index,
    check_integer,
    intrinsic,
    require_arch,
    shared_address,
)

__all__ = [
    "MBARRIER_OPS",
    "MbarrierOp",
    "fence_mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_cluster",
    "mbarrier_arrive_count",
    "mbarrier_arrive_expect_tx",
    "mbarrier_complete_tx",
    "mbarrier_expect_tx",
    "mbarrier_init",
    "mbarrier_inval",
    "mbarrier_test_wait",
    "mbarrier_test_wait_parity",
    "mbarrier_try_wait_parity",
    "mbarrier_wait_parity",
]

# Operand kinds after (bars, index): the numba type each is cast to and its asm constraint.
_OPERANDS = {
    "count": (types.uint32, "r", "the arrival count (1 .. 2**20 - 1)"),
    "nbytes": (types.uint32, "r", "the transaction byte count (0 .. 2**20 - 1)"),
    "state": (types.uint64, "l", "the state returned by an arrive"),
    "parity": (types.uint32, "r", "the phase parity (0 or 1)"),
    "cta_rank": (types.uint32, "r", "the target CTA's rank in the cluster"),
}

# What a form returns: numba type, asm output constraint and LLVM type ("flag" is a predicate
# copied into a 32-bit register with selp and compared with zero).
_RESULTS = {
    "": (types.void, None, None),
    "state": (types.uint64, "=l", I64),
    "flag": (types.boolean, "=r", I32),
}


@dataclass(frozen=True)
class MbarrierOp:
    """One mbarrier instruction form.

    ``template`` numbers its asm operands in order: the result (when there is one), the 32-bit
    shared address of ``bars[index]``, then ``operands`` (keys of ``_OPERANDS``).
    """

    ptx: str  # the instruction, as named in error messages
    template: str
    operands: tuple
    result: str
    arch: object
    section: str


def _flag(ptx, operand):
    """A test/try form: the predicate it writes becomes 0/1 in ``$0``."""
    return (
        "{ .reg .pred P1; "
        f"{ptx} P1, [$1], {operand}; "
        "selp.u32 $0, 1, 0, P1; }"
    )


# NOTE: the label sits inside its own { } scope, so the block can be inlined any number of times
# into one kernel (PTX scopes labels to their block; NVVM's %= is not available).
_WAIT_LOOP = (
    "{\n\t"
    ".reg .pred P1;\n\t"
    "WAIT_PARITY:\n\t"
    "mbarrier.try_wait.parity.shared::cta.b64 P1, [$0], $1;\n\t"
    "@!P1 bra WAIT_PARITY;\n\t"
    "}"
)

_ARRIVE_REMOTE = (
    "{\n\t"
    ".reg .b32 remote;\n\t"
    "mapa.shared::cluster.u32 remote, $0, $1;\n\t"
    "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t"
    "}"
)

_S = "9.7.13.15"
MBARRIER_OPS = {
    "init": MbarrierOp(
        "mbarrier.init", "mbarrier.init.shared::cta.b64 [$0], $1;",
        ("count",), "", SM80, _S + ".9"),
    "inval": MbarrierOp(
        "mbarrier.inval", "mbarrier.inval.shared::cta.b64 [$0];",
        (), "", SM80, _S + ".10"),
    "expect_tx": MbarrierOp(
        "mbarrier.expect_tx", "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$0], $1;",
        ("nbytes",), "", SM90, _S + ".11"),
    "complete_tx": MbarrierOp(
        "mbarrier.complete_tx", "mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [$0], $1;",
        ("nbytes",), "", SM90, _S + ".12"),
    "arrive": MbarrierOp(
        "mbarrier.arrive", "mbarrier.arrive.shared::cta.b64 $0, [$1];",
        (), "state", SM80, _S + ".13"),
    "arrive_count": MbarrierOp(
        "mbarrier.arrive (count)", "mbarrier.arrive.shared::cta.b64 $0, [$1], $2;",
        ("count",), "state", SM90, _S + ".13"),
    "arrive_expect_tx": MbarrierOp(
        "mbarrier.arrive.expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;",
        ("nbytes",), "state", SM90, _S + ".13"),
    "arrive_cluster": MbarrierOp(
        "mbarrier.arrive.release.cluster.shared::cluster", _ARRIVE_REMOTE,
        ("cta_rank",), "", SM90, _S + ".13 and 9.7.9.23 (mapa)"),
    "test_wait": MbarrierOp(
        "mbarrier.test_wait", _flag("mbarrier.test_wait.shared::cta.b64", "$2"),
        ("state",), "flag", SM80, _S + ".16"),
    "test_wait_parity": MbarrierOp(
        "mbarrier.test_wait.parity", _flag("mbarrier.test_wait.parity.shared::cta.b64", "$2"),
        ("parity",), "flag", SM80, _S + ".16"),
    "try_wait_parity": MbarrierOp(
        "mbarrier.try_wait.parity", _flag("mbarrier.try_wait.parity.shared::cta.b64", "$2"),
        ("parity",), "flag", SM90, _S + ".16"),
    "wait_parity": MbarrierOp(
        "mbarrier.try_wait.parity (loop)", _WAIT_LOOP,
        ("parity",), "", SM90, _S + ".16"),
}


def _check_barriers(name, bars, index):
    check_array(name, bars, "a shared uint64 array of mbarrier objects")
    if bars.dtype != types.uint64:
        raise NumbaTypeError(
            f"{name}: the mbarrier array must hold uint64 (one 8-byte object each), "
            f"got {bars.dtype}"
        )
    check_index(name, bars, index)


def _resolve(key, bars, index, *operands):
    """Signature and codegen of ``MBARRIER_OPS[key]`` for these argument types."""
    op = MBARRIER_OPS[key]
    name = "mbarrier_" + key
    _check_barriers(name, bars, index)
    for kind, ty in zip(op.operands, operands):
        check_integer(name, ty, _OPERANDS[kind][2])
    ret, out_constraint, out_type = _RESULTS[op.result]
    sig = ret(bars, index, *operands)
    constraints = ([out_constraint] if out_constraint else []) + ["r"]
    constraints += [_OPERANDS[kind][1] for kind in op.operands]

    def codegen(context, builder, sig, args):
        require_arch(op.ptx, op.arch)
        addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        values = [addr]
        for kind, ty, value in zip(op.operands, sig.args[2:], args[2:]):
            values.append(context.cast(builder, value, ty, _OPERANDS[kind][0]))
        outs = [out_type] if out_type else []
        result = asm(builder, op.template, constraints, outs, values, memory=True)
        if op.result == "flag":
            return builder.icmp_unsigned("!=", result[0], ir.Constant(I32, 0))
        if op.result == "state":
            return result[0]
        return context.get_dummy_value()

    return sig, codegen


def _mbarrier(key, summary):
    """Decorator: register the typer as an intrinsic whose docstring quotes the PTX it emits."""
    op = MBARRIER_OPS[key]

    def wrap(typer):
        typer.__doc__ = (
            f"{summary}\n\nEmits (PTX ISA {op.section}, needs {op.arch.text})::\n\n"
            + "\n".join("    " + line.strip() for line in op.template.split("\n"))
        )
        fn = intrinsic(typer)
        fn.op = op
        return fn

    return wrap


@_mbarrier("init", "Initialise ``bars[index]`` for ``count`` arrivals per phase (phase 0, no "
           "transaction bytes pending).  One thread initialises; make it visible with "
           "``cuda.syncthreads()`` inside the CTA, or :func:`fence_mbarrier_init` plus a cluster "
           "barrier for the async proxy and peer CTAs.")
def mbarrier_init(typingctx, bars, index, count):
    return _resolve("init", bars, index, count)


@_mbarrier("inval", "Invalidate ``bars[index]`` so that its memory can be reused or the object "
           "re-initialised with a new count.")
def mbarrier_inval(typingctx, bars, index):
    return _resolve("inval", bars, index)


@_mbarrier("expect_tx", "Add ``nbytes`` to the current phase's transaction count without "
           "arriving (relaxed, CTA scope).")
def mbarrier_expect_tx(typingctx, bars, index, nbytes):
    return _resolve("expect_tx", bars, index, nbytes)


@_mbarrier("complete_tx", "Subtract ``nbytes`` from the transaction count, as a finished "
           "asynchronous copy would (relaxed, CTA scope); completes the phase when both counts "
           "reach zero.")
def mbarrier_complete_tx(typingctx, bars, index, nbytes):
    return _resolve("complete_tx", bars, index, nbytes)


@_mbarrier("arrive", "One arrive-on operation (release, CTA scope); returns the barrier state "
           "(uint64) before the arrival, for :func:`mbarrier_test_wait`.")
def mbarrier_arrive(typingctx, bars, index):
    return _resolve("arrive", bars, index)


@_mbarrier("arrive_count", "``count`` arrive-on operations at once; returns the state (uint64).")
def mbarrier_arrive_count(typingctx, bars, index, count):
    return _resolve("arrive_count", bars, index, count)


@_mbarrier("arrive_expect_tx", "Add ``nbytes`` to the transaction count, then arrive once; "
           "returns the state (uint64).  The producer's half of a TMA handshake.")
def mbarrier_arrive_expect_tx(typingctx, bars, index, nbytes):
    return _resolve("arrive_expect_tx", bars, index, nbytes)


@_mbarrier("arrive_cluster", "Arrive once on ``bars[index]`` of the CTA of rank ``cta_rank`` in "
           "this cluster (the same shared offset there), with release semantics at cluster "
           "scope.  Consumers use it to free a stage that a multicast producer fills.")
def mbarrier_arrive_cluster(typingctx, bars, index, cta_rank):
    return _resolve("arrive_cluster", bars, index, cta_rank)


@_mbarrier("test_wait", "True when the phase that ``state`` (from an arrive on this barrier, in "
           "the current or the preceding phase) belongs to has completed.  Never blocks.")
def mbarrier_test_wait(typingctx, bars, index, state):
    return _resolve("test_wait", bars, index, state)


@_mbarrier("test_wait_parity", "True when the current or immediately preceding phase of parity "
           "``parity`` has completed, i.e. the current phase's parity differs.  Never blocks.")
def mbarrier_test_wait_parity(typingctx, bars, index, parity):
    return _resolve("test_wait_parity", bars, index, parity)


@_mbarrier("try_wait_parity", "Like :func:`mbarrier_test_wait_parity`, but the thread may be "
           "suspended for a system-dependent time while the phase is incomplete (one try).")
def mbarrier_try_wait_parity(typingctx, bars, index, parity):
    return _resolve("try_wait_parity", bars, index, parity)


@_mbarrier("wait_parity", "Block until the phase of parity ``parity`` has completed: "
           "try_wait.parity in a loop, as CUTLASS's ClusterBarrier::wait (acquire, CTA scope).")
def mbarrier_wait_parity(typingctx, bars, index, parity):
    return _resolve("wait_parity", bars, index, parity)


_FENCE_INIT = "fence.mbarrier_init.release.cluster;"


@intrinsic
def fence_mbarrier_init(typingctx):
    sig = types.void()

    def codegen(context, builder, sig, args):
        require_arch("fence.mbarrier_init", SM90)
        asm(builder, _FENCE_INIT, [], memory=True)
        return context.get_dummy_value()

    return sig, codegen


fence_mbarrier_init.__doc__ = (
    "Make prior ``mbarrier.init`` operations of this thread visible to the cluster (peer CTAs "
    "and the async proxy: TMA, multicast) before a cluster barrier.\n\n"
    f"Emits (PTX ISA 9.7.13.4, membar/fence; needs {SM90.text})::\n\n    {_FENCE_INIT}"
)
