"""Ampere asynchronous copies global -> shared: ``cp.async`` with commit and wait groups
(PTX ISA 9.7.9.25.3, "Non-bulk copy": cp.async, cp.async.commit_group, cp.async.wait_group,
cp.async.wait_all).

``cp_async_op(size, cache, zfill)`` builds one form; the common ones are pre-built::

    cp_async_16(dst, dst_index, src, src_index)              # cp.async.cg ... 16
    cp_async_16_zfill(dst, dst_index, src, src_index, n)     # copies n bytes (0..16), zero-fills the rest
    cp_async_commit_group()
    cp_async_wait_group(1)                                   # literal: at most 1 group still pending
    cp_async_wait_all()

``dst`` is a shared array and ``src`` a global array, each with an element index; both addresses
must be aligned to the copy size.  The zero-fill forms are how kernels handle tile edges: pass
``n = 0`` for an element wholly outside the matrix (the source address is then not read but must
still be a valid address, so clamp it to the array's start).
"""

from numba import types

from intrinsics._core import (
    SM80,
    asm,
    as_i32,
    check_array,
    check_global,
    check_index,
    check_integer,
    global_address,
    intrinsic,
    literal_value,
    require_arch,
    shared_address,
    statement_intrinsic,
)

__all__ = [
    "CP_ASYNC_FORMS",
    "cp_async_op",
    "cp_async_4",
    "cp_async_8",
    "cp_async_16",
    "cp_async_4_zfill",
    "cp_async_8_zfill",
    "cp_async_16_zfill",
    "cp_async_ca_16",
    "cp_async_commit_group",
    "cp_async_mbarrier_arrive",
    "cp_async_mbarrier_arrive_noinc",
    "cp_async_wait_all",
    "cp_async_wait_group",
]

# (cache operator, copy size in bytes): .cg (cache in L2 only) exists for 16-byte copies only.
CP_ASYNC_FORMS = [("ca", 4), ("ca", 8), ("ca", 16), ("cg", 16)]


def _build(cache, size, zfill):
    name = f"cp.async.{cache}.shared.global"
    if zfill:
        template = f"{name} [$0], [$1], {size}, $2;"
        constraints = ["r", "l", "r"]
    else:
        template = f"{name} [$0], [$1], {size};"
        constraints = ["r", "l"]

    def check(dst, dst_index, src, src_index):
        check_array(name, dst, "a shared-memory destination array")
        check_index(name, dst, dst_index)
        check_global(name, src, "a global source array (or typed pointer)")
        check_index(name, src, src_index)

    def codegen(context, builder, sig, args):
        require_arch(name, SM80)
        tys = sig.args
        operands = [
            shared_address(context, builder, tys[0], args[0], tys[1], args[1]),
            global_address(context, builder, tys[2], args[2], tys[3], args[3]),
        ]
        if zfill:
            operands.append(as_i32(context, builder, tys[4], args[4]))
        asm(builder, template, constraints, [], operands, memory=True)
        return context.get_dummy_value()

    # numba intrinsics take no *args: one typer per arity.
    if zfill:

        def typer(typingctx, dst, dst_index, src, src_index, src_bytes):
            check(dst, dst_index, src, src_index)
            check_integer(name, src_bytes, "the source byte count")
            return types.void(dst, dst_index, src, src_index, src_bytes), codegen

    else:

        def typer(typingctx, dst, dst_index, src, src_index):
            check(dst, dst_index, src, src_index)
            return types.void(dst, dst_index, src, src_index), codegen

    suffix = "_zfill" if zfill else ""
    typer.__name__ = f"cp_async_{cache}_{size}{suffix}"
    typer.__doc__ = (
        f"Emits ``{template}`` (PTX ISA 9.7.9.25.3.1). Copies {size} bytes from "
        f"``src[src_index]`` to ``dst[dst_index]``"
        + (", reading only the first ``src_bytes`` and zero-filling the rest." if zfill else ".")
        + " Needs sm_80 or newer."
    )
    return intrinsic(typer)


_FORMS = {
    (cache, size, zfill): _build(cache, size, zfill)
    for cache, size in CP_ASYNC_FORMS
    for zfill in (False, True)
}


def cp_async_op(size, cache=None, zfill=False):
    """The cp.async intrinsic copying ``size`` bytes (4, 8 or 16).  ``cache`` is "ca" (L1 and L2)
    or "cg" (L2 only, 16 bytes only); by default "cg" for 16 bytes and "ca" otherwise."""
    cache = cache or ("cg" if size == 16 else "ca")
    key = (cache, size, bool(zfill))
    if key not in _FORMS:
        valid = ", ".join(f"{c}/{s}" for c, s in CP_ASYNC_FORMS)
        raise ValueError(f"cp.async has no .{cache} form of {size} bytes; valid: {valid}")
    return _FORMS[key]


cp_async_4 = cp_async_op(4)
cp_async_8 = cp_async_op(8)
cp_async_16 = cp_async_op(16)
cp_async_ca_16 = cp_async_op(16, "ca")
cp_async_4_zfill = cp_async_op(4, zfill=True)
cp_async_8_zfill = cp_async_op(8, zfill=True)
cp_async_16_zfill = cp_async_op(16, zfill=True)


cp_async_commit_group = statement_intrinsic(
    "cp_async_commit_group", "cp.async.commit_group;", SM80,
    """Emits ``cp.async.commit_group;`` (PTX ISA 9.7.9.25.3.2): closes the group of this thread's
    cp.async operations issued since the last commit. Needs sm_80 or newer.""",
    arch_name="cp.async.commit_group")


@intrinsic
def cp_async_wait_group(typingctx, n):
    """Emits ``cp.async.wait_group N;`` (PTX ISA 9.7.9.25.3.3): waits until at most N of this
    thread's committed groups are pending. N must be a literal 0..7. Needs sm_80 or newer."""
    value = literal_value("cp.async.wait_group", n, "N (a literal)", valid=range(8))
    if value is None:
        return None
    sig = types.void(n)

    def codegen(context, builder, sig, args):
        require_arch("cp.async.wait_group", SM80)
        asm(builder, f"cp.async.wait_group {value};", [], memory=True)
        return context.get_dummy_value()

    return sig, codegen


cp_async_wait_all = statement_intrinsic(
    "cp_async_wait_all", "cp.async.wait_all;", SM80,
    """Emits ``cp.async.wait_all;`` (PTX ISA 9.7.9.25.3.3): waits for all of this thread's
    cp.async operations, committed or not. Needs sm_80 or newer.""",
    arch_name="cp.async.wait_all")


def _mbarrier_arrive(noinc):
    suffix = ".noinc" if noinc else ""
    name = f"cp.async.mbarrier.arrive{suffix}.shared::cta.b64"

    def typer(typingctx, bars, index):
        check_array(name, bars, "a shared uint64 array of mbarriers")
        check_index(name, bars, index)
        sig = types.void(bars, index)

        def codegen(context, builder, sig, args):
            require_arch(name, SM80)
            address = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            asm(builder, f"{name} [$0];", ["r"], [], [address], memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = "cp_async_mbarrier_arrive" + ("_noinc" if noinc else "")
    typer.__doc__ = (
        f"Emits ``{name} [$0];`` (PTX ISA 9.7.9.25.3.4, cp.async.mbarrier.arrive): the mbarrier "
        "``bars[index]`` receives an arrive-on operation once all of this thread's earlier "
        "cp.async copies have completed -- how a cp.async producer feeds an mbarrier pipeline "
        "without TMA. "
        + ("With .noinc the arrival counts against the barrier's expected count (initialise it "
           "for these arrivals)." if noinc else
           "Without .noinc the pending count is raised by one first, so the phase does not wait "
           "for it in the count.")
        + " Needs sm_80 or newer."
    )
    return intrinsic(typer)


cp_async_mbarrier_arrive = _mbarrier_arrive(False)
cp_async_mbarrier_arrive_noinc = _mbarrier_arrive(True)
