"""Fences, leader election and thread-block clusters (sm_90+).

- proxy and cluster fences: ``fence.proxy.async`` ... (PTX ISA 9.7.13.4, "membar / fence");
- ``elect.sync`` (9.7.13.14): one lane of the warp gets True;
- the cluster special registers ``%cluster_ctarank``, ``%clusterid`` ... (PTX ISA 10, "Special
  Registers");
- the cluster barrier ``barrier.cluster.arrive/wait`` (9.7.13.3);
- distributed shared memory: ``mapa.shared::cluster`` (9.7.9.23) maps a shared address of this
  CTA to the same offset in another CTA of the cluster, and ``ld/st.shared::cluster`` (9.7.9.8,
  9.7.9.11) reach it.

The fences and cluster barriers are one table (:data:`STATEMENTS`) of operand-less statements;
the special registers another (:data:`SPECIAL_REGISTERS`); the DSMEM loads and stores a table of
element types (:data:`DSMEM_TYPES`).  Remote accesses take (array, index, cta_rank) -- the local
shared array and element whose twin in CTA ``cta_rank`` is meant -- so that an emulator can find
the buffer::

    buf = cuda.shared.array(128, np.float32)
    cluster_sync()                                          # peers have started
    dsmem_store_f32(buf, tid, (rank + 1) % n, value)        # into the neighbour's buf[tid]
    cluster_sync()                                          # stores visible, and nobody exits
    x = buf[tid]                                            # while a peer may still touch it

A CTA's shared memory disappears when it exits: end every kernel that touches a peer's shared
memory with a cluster barrier.
"""

from llvmlite import ir
from numba import types
from numba.cuda.core.errors import NumbaTypeError

from intrinsics._core import (
    I32,
    SM90,
    asm,
    check_array,
    check_index,
    check_integer,
    intrinsic,
    pack,
    require_arch,
    shared_address,
    statement_intrinsic,
)

__all__ = [
    "DSMEM_TYPES",
    "SPECIAL_REGISTERS",
    "STATEMENTS",
    "cluster_arrive",
    "cluster_arrive_relaxed",
    "cluster_ctaid",
    "cluster_ctarank",
    "cluster_id",
    "cluster_nclusterid",
    "cluster_nctaid",
    "cluster_nctarank",
    "cluster_sync",
    "cluster_wait",
    "dsmem_load_f32",
    "dsmem_load_u32",
    "dsmem_store_f32",
    "dsmem_store_u32",
    "elect_sync",
    "fence_acq_rel_cluster",
    "fence_proxy_async",
    "fence_proxy_async_global",
    "fence_proxy_async_shared",
    "map_shared_rank",
]


# ---------------------------------------------------------------------------------------------
# Operand-less statements: fences and the cluster barrier
# ---------------------------------------------------------------------------------------------

# name -> (PTX, PTX ISA section, what it is for).  All need sm_90 and all order memory.
STATEMENTS = {
    "fence_proxy_async": (
        "fence.proxy.async;", "9.7.13.4",
        "Order this thread's generic-proxy memory accesses (ordinary loads and stores) against "
        "the async proxy (TMA, wgmma operands, tcgen05) in every state space."),
    "fence_proxy_async_shared": (
        "fence.proxy.async.shared::cta;", "9.7.13.4",
        "As fence_proxy_async, for this CTA's shared memory only: issue it after writing shared "
        "memory that a TMA store or wgmma will read."),
    "fence_proxy_async_global": (
        "fence.proxy.async.global;", "9.7.13.4",
        "As fence_proxy_async, for global memory only."),
    "fence_acq_rel_cluster": (
        "fence.acq_rel.cluster;", "9.7.13.4",
        "Acquire-release fence at cluster scope; pairs with cluster_arrive_relaxed."),
    "cluster_arrive": (
        "barrier.cluster.arrive.release.aligned;", "9.7.13.3",
        "Arrive at the cluster barrier (release): memory accesses before it are visible to "
        "threads that complete cluster_wait.  Every thread of the cluster arrives once per "
        "phase; .aligned: all lanes of a warp execute it together."),
    "cluster_arrive_relaxed": (
        "barrier.cluster.arrive.relaxed.aligned;", "9.7.13.3",
        "Arrive at the cluster barrier without memory ordering (e.g. only to know that peer "
        "CTAs are running)."),
    "cluster_wait": (
        "barrier.cluster.wait.acquire.aligned;", "9.7.13.3",
        "Wait until every non-exited thread of the cluster has arrived (acquire)."),
    "cluster_sync": (
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;",
        "9.7.13.3",
        "cluster_arrive then cluster_wait: a __syncthreads for the whole cluster."),
}


def _statement(name):
    ptx, section, summary = STATEMENTS[name]

    doc = (
        f"{summary}\n\nEmits (PTX ISA {section}, needs {SM90.text})::\n\n"
        + "\n".join("    " + line.strip() for line in ptx.split("\n"))
    )
    return statement_intrinsic(name, ptx, SM90, doc, arch_name=ptx.split(";")[0])


fence_proxy_async = _statement("fence_proxy_async")
fence_proxy_async_shared = _statement("fence_proxy_async_shared")
fence_proxy_async_global = _statement("fence_proxy_async_global")
fence_acq_rel_cluster = _statement("fence_acq_rel_cluster")
cluster_arrive = _statement("cluster_arrive")
cluster_arrive_relaxed = _statement("cluster_arrive_relaxed")
cluster_wait = _statement("cluster_wait")
cluster_sync = _statement("cluster_sync")


# ---------------------------------------------------------------------------------------------
# elect.sync
# ---------------------------------------------------------------------------------------------

_ELECT = "{ .reg .pred P1; elect.sync _|P1, 0xffffffff; selp.u32 $0, 1, 0, P1; }"


@intrinsic
def elect_sync(typingctx):
    sig = types.boolean()

    def codegen(context, builder, sig, args):
        require_arch("elect.sync", SM90)
        (flag,) = asm(builder, _ELECT, ["=r"], [I32], [], memory=True)
        return builder.icmp_unsigned("!=", flag, ir.Constant(I32, 0))

    return sig, codegen


elect_sync.__doc__ = (
    "True in exactly one lane of the (fully active) warp, the same lane every time; all 32 "
    "lanes must execute it.\n\n"
    f"Emits (PTX ISA 9.7.13.14, needs {SM90.text})::\n\n    {_ELECT}"
)


# ---------------------------------------------------------------------------------------------
# Cluster special registers
# ---------------------------------------------------------------------------------------------

# name -> (PTX special register, components, meaning).  One component reads as a uint32, three
# as a (x, y, z) tuple of uint32.
SPECIAL_REGISTERS = {
    "cluster_ctarank": ("%cluster_ctarank", "", "this CTA's linear rank in its cluster"),
    "cluster_nctarank": ("%cluster_nctarank", "", "the number of CTAs in the cluster"),
    "cluster_ctaid": ("%cluster_ctaid", "xyz", "this CTA's position in its cluster"),
    "cluster_nctaid": ("%cluster_nctaid", "xyz", "the cluster's shape in CTAs"),
    "cluster_id": ("%clusterid", "xyz", "this cluster's position in the grid"),
    "cluster_nclusterid": ("%nclusterid", "xyz", "the grid's shape in clusters"),
}


def _special_register(name):
    register, components, meaning = SPECIAL_REGISTERS[name]
    if components:
        names = [f"{register}.{c}" for c in components]
        ret = types.UniTuple(types.uint32, len(components))
    else:
        names = [register]
        ret = types.uint32
    template = "\n\t".join(f"mov.u32 ${i}, {reg};" for i, reg in enumerate(names))

    def typer(typingctx):
        sig = ret()

        def codegen(context, builder, sig, args):
            require_arch(register, SM90)
            outs = asm(builder, template, ["=r"] * len(names), [I32] * len(names), [])
            return pack(context, builder, sig.return_type, outs)

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = (
        f"{meaning[0].upper() + meaning[1:]} ({ret}).\n\n"
        f"Emits (PTX ISA 10, Special Registers; needs {SM90.text})::\n\n"
        + "\n".join("    " + line.strip() for line in template.split("\n"))
    )
    return intrinsic(typer)


cluster_ctarank = _special_register("cluster_ctarank")
cluster_nctarank = _special_register("cluster_nctarank")
cluster_ctaid = _special_register("cluster_ctaid")
cluster_nctaid = _special_register("cluster_nctaid")
cluster_id = _special_register("cluster_id")
cluster_nclusterid = _special_register("cluster_nclusterid")


# ---------------------------------------------------------------------------------------------
# Distributed shared memory
# ---------------------------------------------------------------------------------------------

_MAPA = "mapa.shared::cluster.u32 $0, $1, $2;"


@intrinsic
def map_shared_rank(typingctx, array, index, cta_rank):
    check_array("map_shared_rank", array, "a shared-memory array")
    check_index("map_shared_rank", array, index)
    check_integer("map_shared_rank", cta_rank, "the CTA rank")
    sig = types.uint32(array, index, cta_rank)

    def codegen(context, builder, sig, args):
        require_arch("mapa.shared::cluster", SM90)
        addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        rank = context.cast(builder, args[2], sig.args[2], types.uint32)
        (remote,) = asm(builder, _MAPA, ["=r", "r", "r"], [I32], [addr, rank])
        return remote

    return sig, codegen


map_shared_rank.__doc__ = (
    "The 32-bit ``.shared::cluster`` address of ``array[index]`` in the CTA of rank "
    "``cta_rank`` of this cluster (for instructions that take such an address: TMA multicast "
    "barriers, ld/st.shared::cluster).\n\n"
    f"Emits (PTX ISA 9.7.9.23, needs {SM90.text})::\n\n    {_MAPA}"
)

# element type -> (numba register type, asm constraint, array dtypes accepted).  Loads and
# stores move 32 bits (.b32); the register type decides how numba sees them.
DSMEM_TYPES = {
    "u32": (types.uint32, "r", (types.uint32, types.int32)),
    "f32": (types.float32, "f", (types.float32,)),
}

_DSMEM_LOAD = (
    "{\n\t"
    ".reg .b32 remote;\n\t"
    "mapa.shared::cluster.u32 remote, $1, $2;\n\t"
    "ld.shared::cluster.b32 $0, [remote];\n\t"
    "}"
)
_DSMEM_STORE = (
    "{\n\t"
    ".reg .b32 remote;\n\t"
    "mapa.shared::cluster.u32 remote, $0, $1;\n\t"
    "st.shared::cluster.b32 [remote], $2;\n\t"
    "}"
)


def _check_dsmem(name, kind, array, index, cta_rank):
    accepted = DSMEM_TYPES[kind][2]
    check_array(name, array, "a shared-memory array")
    if array.dtype not in accepted:
        raise NumbaTypeError(
            f"{name}: the array must hold {' or '.join(str(t) for t in accepted)}, "
            f"got {array.dtype}"
        )
    check_index(name, array, index)
    check_integer(name, cta_rank, "the CTA rank")


def _dsmem_load(kind):
    reg, constraint, _ = DSMEM_TYPES[kind]
    name = f"dsmem_load_{kind}"

    def typer(typingctx, array, index, cta_rank):
        _check_dsmem(name, kind, array, index, cta_rank)
        sig = reg(array, index, cta_rank)

        def codegen(context, builder, sig, args):
            require_arch("ld.shared::cluster", SM90)
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            rank = context.cast(builder, args[2], sig.args[2], types.uint32)
            (value,) = asm(
                builder, _DSMEM_LOAD, ["=" + constraint, "r", "r"],
                [context.get_value_type(reg)], [addr, rank], memory=True,
            )
            return value

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = (
        f"Load ``array[index]`` of the CTA of rank ``cta_rank`` in this cluster ({reg}).\n\n"
        f"Emits (PTX ISA 9.7.9.23 and 9.7.9.8; needs {SM90.text})::\n\n"
        + "\n".join("    " + line.strip() for line in _DSMEM_LOAD.split("\n"))
    )
    return intrinsic(typer)


def _dsmem_store(kind):
    reg, constraint, _ = DSMEM_TYPES[kind]
    name = f"dsmem_store_{kind}"

    def typer(typingctx, array, index, cta_rank, value):
        _check_dsmem(name, kind, array, index, cta_rank)
        if not isinstance(value, (types.Integer, types.Float, types.Boolean)):
            raise NumbaTypeError(f"{name}: the value must be a number ({reg}), got {value}")
        sig = types.void(array, index, cta_rank, value)

        def codegen(context, builder, sig, args):
            require_arch("st.shared::cluster", SM90)
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            rank = context.cast(builder, args[2], sig.args[2], types.uint32)
            data = context.cast(builder, args[3], sig.args[3], reg)
            asm(builder, _DSMEM_STORE, ["r", "r", constraint], [], [addr, rank, data],
                memory=True)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = name
    typer.__doc__ = (
        f"Store ``value`` (cast to {reg}) into ``array[index]`` of the CTA of rank "
        f"``cta_rank`` in this cluster.\n\n"
        f"Emits (PTX ISA 9.7.9.23 and 9.7.9.11; needs {SM90.text})::\n\n"
        + "\n".join("    " + line.strip() for line in _DSMEM_STORE.split("\n"))
    )
    return intrinsic(typer)


dsmem_load_u32 = _dsmem_load("u32")
dsmem_load_f32 = _dsmem_load("f32")
dsmem_store_u32 = _dsmem_store("u32")
dsmem_store_f32 = _dsmem_store("f32")
