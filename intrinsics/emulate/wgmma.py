"""Emulation of wgmma (PTX ISA 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate").

Every wgmma instruction is a warpgroup collective (``runtime.collective("warpgroup", ...)``): the
128 threads of four consecutive warps (the first a multiple of 4) meet, the last to arrive does
the work for all, each takes its own registers.  ``wgmma.mma_async`` then

- decodes both matrix descriptors with :func:`intrinsics.layout.decode_smem_desc` and finds every
  byte it reads with :func:`intrinsics.layout.smem_desc_address_host` (the canonical layouts and
  the swizzle of the host models; nothing is re-derived here); A comes from shared memory (SS
  form) or from the threads' registers through :func:`intrinsics.layout.a_fragment_coords` (RS);
- refuses bytes outside the block's shared memory, and bytes that ordinary stores wrote without
  their writer's ``fence.proxy.async`` (``SharedSpace.check_async_read``: the async proxy would
  not see them);
- computes ``D = (scale_a*A) @ (scale_b*B) + (C if scale_d else 0)`` and hands each thread its
  accumulator registers through :func:`intrinsics.layout.accumulator_coords`.

Numerics: the inputs are decoded exactly as the tensor core reads them (``numerics.decode``:
tf32 drops the low 13 mantissa bits), products and sums are formed in float64 (NumPy's matmul)
and rounded once, to nearest even, to the accumulator format, once per instruction (the
accumulator is a register between instructions on the hardware too).  Products of the inputs
are exact in float64; the float64 sum of K <= 32 products and C is within K * 2**-53 of
sum(|a*b|) + |c| of the exact value, so the result is the correctly rounded one unless the exact
sum lies that close to a rounding boundary.  Integer-valued inputs whose partial sums stay below
2**24 (f32 accumulator; 2**11 for fp8 inputs, whose hardware sums are narrower) or 2**11 (f16)
give exact results, equal to the hardware's.  The hardware differs for
other inputs: its adder tree sums the products of one instruction in a fixed order with its own
internal width and truncation (for fp8 inputs with an f32 accumulator it keeps notably fewer bits
-- DeepGEMM reports about 14 -- hence "promotion" to f32 registers every few instructions), so
float results may differ in the last bits, by up to about K * 2**-23 (f32) or K * 2**-10 (f16)
relative to sum(|a*b|) + |c|, and more for fp8.  Subnormal inputs and results are kept; NaN
results are NumPy's NaN rather than the hardware's canonical 0x7FFFFFFF.

Asynchrony, as the emulation models it: per warpgroup there is an open group (mma_async issued
since the last commit) and a queue of committed, in-flight groups; ``wgmma_commit_group`` closes
the open group, ``wgmma_wait_group(n)`` retires all but the newest ``n`` (``n`` larger than the
number outstanding is fine).  The arithmetic is done at issue, on the bytes shared memory holds
then, and the instruction counts as reading them until the wait that retires it.  The protocol
checks (each an ``EmulationError`` naming block, warp, lane and the object):

- mma_async without a ``wgmma_fence`` by the warpgroup since the kernel started or since its last
  ``wgmma_wait_group`` (simplified from PTX: a fence is needed before the first mma_async and
  after ordinary code touched the accumulator or A registers, which follows a wait in practice;
  CUTLASS and DeepGEMM fence at the top of every main-loop iteration);
- reading an element of an accumulator tuple that an mma_async returned before a wait retired it
  (the tuple is a ``tuple`` subclass that checks on indexing and iteration; passing it on to the
  next mma_async or to ``wgmma_fence_operand`` is not a read);
- shared-memory bytes an in-flight mma_async read that change before the wait retires it (the
  hardware may read them at any time until then: a pipeline that releases a stage too early);
- a warpgroup whose threads exit with mma_async not committed or groups not waited for (checked
  when the launch's cluster finishes);
- descriptors or scale-d that differ across the warpgroup (the emulation reads one value).
"""

import collections

import numpy as np

from intrinsics import layout
from intrinsics import wgmma as family
from intrinsics.emulate import memory, runtime
from intrinsics.emulate.numerics import decode, encode
from intrinsics.emulate.runtime import EmulationError, collective, current
from intrinsics.emulate.smem import shared_address

WARPGROUP = 128
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


# ---------------------------------------------------------------------------------------------
# Per-warpgroup state
# ---------------------------------------------------------------------------------------------


def _state(thread):
    """The wgmma state of ``thread``'s warpgroup (in its block's state dict)."""
    key = ("wgmma", thread.warp // 4)
    return thread.block.once(key, lambda: {
            "group": thread.warp // 4,
            "first": thread.block.threads[4 * (thread.warp // 4) * 32],  # warp 4g, lane 0
            "fenced": False,
            "since": "the kernel started",  # for the missing-fence message
            "issued": 0,  # mma_async issued so far (their sequence numbers are 1, 2, ...)
            "retired": 0,  # every mma_async with a sequence number <= this has completed
            "open": [],  # the uncommitted group: [(seq, reads)]
            "groups": collections.deque(),  # committed groups, oldest first
        })


def _who(state):
    first = state["first"]
    return f"{first.where()} (warpgroup {state['group']}, warps {4 * state['group']}-" \
           f"{4 * state['group'] + 3})"


class _Reader:
    """The reader named by SharedSpace.check_async_read: the warpgroup's first thread."""

    def __init__(self, state):
        self.state = state

    def where(self):
        return _who(self.state)


class _Accumulator(tuple):
    """Accumulator registers an mma_async returned: reading an element before the
    ``wgmma.wait_group`` that retires the instruction raises EmulationError."""

    def _check(self, what):
        state, seq = self._state, self._seq
        if seq > state["retired"]:
            committed = any(seq == s for group in state["groups"] for s, _ in group)
            status = ("its wgmma-group is still in flight" if committed else
                      "it was never committed (wgmma_commit_group)")
            raise EmulationError(
                f"{current().where()}: reads {what} of the accumulator returned by "
                f"{self._ptx} #{seq} of warpgroup {state['group']} before a wgmma_wait_group "
                f"retired it: {status}; call wgmma_wait_group, then "
                "acc = wgmma_fence_operand(acc), before reading the accumulator"
            )

    def __getitem__(self, index):
        self._check(f"register {index}")
        return tuple.__getitem__(self, index)

    def __iter__(self):
        self._check("the registers")
        return tuple.__iter__(self)


def _plain(values):
    """The raw registers of a tuple (bypassing the in-flight check) or of a scalar."""
    if isinstance(values, tuple):
        return tuple(tuple.__iter__(values))
    return (values,)


# ---------------------------------------------------------------------------------------------
# Operands
# ---------------------------------------------------------------------------------------------


def _smem_operand(space, desc, major, rows, spec, ptx_type, name, state):
    """Decoded (rows, K) values of one operand read through its descriptor, and the byte
    addresses read (for the in-flight check)."""
    eb = spec.elem_bytes
    fields = layout.decode_smem_desc(desc)
    mn, k = np.meshgrid(np.arange(rows), np.arange(spec.k), indexing="ij")
    try:
        addr = layout.smem_desc_address_host(desc, major, eb, mn, k)
    except NotImplementedError:
        raise EmulationError(
            f"{_who(state)}: {spec.ptx}: the {name} descriptor 0x{desc:016x} has base offset "
            f"{fields['base_offset']}; the emulation supports base offset 0 only"
        ) from None
    addr = addr[..., None] + np.arange(eb)  # (rows, K, eb) byte addresses
    lo, hi = int(addr.min()), int(addr.max()) + 1
    if hi > space.top:
        raise EmulationError(
            f"{_who(state)}: {spec.ptx}: the {name} descriptor 0x{desc:016x} (start "
            f"{fields['addr']}, LBO {fields['lbo']}, SBO {fields['sbo']}, swizzle "
            f"{fields['swizzle']}) reads shared addresses [{lo}, {hi}), outside this block's "
            f"{space.top} bytes of shared memory"
        )
    dirty = space.dirty[addr]
    if dirty.any():
        first = int(addr.reshape(-1)[np.flatnonzero(dirty.reshape(-1))[0]])
        space.check_async_read(first, 1, f"{spec.ptx} (operand {name}, descriptor "
                                         f"0x{desc:016x})", _Reader(state))
    window = memory.shared_bytes(lo, hi - lo, state["first"].block)
    raw = np.ascontiguousarray(window[addr - lo]).view(_UINT[eb])[..., 0]
    return decode(raw, ptx_type), addr


def _register_operand(frags, spec):
    """Decoded (64, K) A from every thread's four registers (RS form)."""
    regs = np.array([[int(x) & 0xFFFFFFFF for x in _plain(f)] for f in frags], dtype=np.uint32)
    elems = regs.view(_UINT[spec.elem_bytes])  # (128, 16 / eb), low bits first
    rows, cols = layout.a_fragment_coords(spec.elem_bytes)
    a = np.empty((64, spec.k))
    a[rows, cols] = decode(elems, spec.a)
    return a


def _accumulator_in(accs, spec):
    """C (64, N) float64 from every thread's accumulator registers."""
    rows, cols = layout.accumulator_coords(spec.n)
    if spec.acc == "f32":
        elems = np.array([_plain(v) for v in accs], dtype=np.float32).astype(np.float64)
    else:
        regs = np.array([[int(x) & 0xFFFFFFFF for x in _plain(v)] for v in accs], dtype=np.uint32)
        elems = decode(regs.view(np.uint16), "f16")  # element 2r: low half of register r
    c = np.empty((64, spec.n))
    c[rows, cols] = elems
    return c


def _accumulator_out(d, spec):
    """Registers (128, acc_regs) of D (64, N)."""
    rows, cols = layout.accumulator_coords(spec.n)
    if spec.acc == "f32":
        return d[rows, cols].astype(np.float32)
    bits = encode(d[rows, cols], "f16")  # uint32 holding 16-bit codes
    return bits[:, 0::2] | (bits[:, 1::2] << np.uint32(16))


def _uniform(values, what, state, spec, show=repr):
    first = values[0]
    for lane, value in enumerate(values):
        if value != first:
            raise EmulationError(
                f"{_who(state)}: {spec.ptx}: {what} differs across the warpgroup (thread 0: "
                f"{show(first)}, thread {lane} (warp {4 * state['group'] + lane // 32} lane "
                f"{lane % 32}): {show(value)}); the emulation needs one warpgroup-uniform value"
            )
    return first


def _hex(desc):
    return f"0x{desc:016x}"


# ---------------------------------------------------------------------------------------------
# wgmma.mma_async
# ---------------------------------------------------------------------------------------------

_CACHE = {}


def wgmma_mma_async(
    n, a, b=None, acc="f32", *, a_from="smem", scale_a=1, scale_b=1, trans_a=0, trans_b=0
):
    b = a if b is None else b
    spec = family._resolve(n, a, b, acc, a_from, scale_a, scale_b, trans_a, trans_b)
    if spec not in _CACHE:
        _CACHE[spec] = _build(spec)
    return _CACHE[spec]


def _build(spec):
    regs = spec.acc_regs
    a_major = "MN" if spec.trans_a else "K"
    b_major = "MN" if spec.trans_b else "K"
    name = f"{spec.ptx} (imm {', '.join(map(str, spec.immediates))})"

    def compute(lanes):
        threads = [lanes[t][0] for t in range(WARPGROUP)]
        state = _state(threads[0])
        space = threads[0].block.shared
        if not state["fenced"]:
            raise EmulationError(
                f"{_who(state)}: {spec.ptx} issued without a wgmma_fence by the warpgroup since "
                f"{state['since']}: wgmma.fence.sync.aligned must order the accumulator and A "
                "registers before the first mma_async and after ordinary code wrote them"
            )
        desc_b = _uniform([int(lanes[t][3]) & (2**64 - 1) for t in range(WARPGROUP)],
                          "the B descriptor", state, spec, _hex)
        use_c = _uniform([bool(lanes[t][4]) for t in range(WARPGROUP)],
                         "scale-d (zero or not)", state, spec)
        if spec.a_from == "smem":
            desc_a = _uniform([int(lanes[t][2]) & (2**64 - 1) for t in range(WARPGROUP)],
                              "the A descriptor", state, spec, _hex)
            a_val, a_addr = _smem_operand(space, desc_a, a_major, 64, spec, spec.a, "A", state)
        else:
            a_val, a_addr = _register_operand([lanes[t][2] for t in range(WARPGROUP)], spec), None
        b_val, b_addr = _smem_operand(space, desc_b, b_major, spec.n, spec, spec.b, "B", state)

        with np.errstate(all="ignore"):
            d = (spec.scale_a * a_val) @ (spec.scale_b * b_val).T
            if use_c:
                d = d + _accumulator_in([lanes[t][1] for t in range(WARPGROUP)], spec)
        out = _accumulator_out(d, spec)

        state["issued"] += 1
        seq = state["issued"]
        reads = [(addr, space.memory[addr]) for addr in (a_addr, b_addr) if addr is not None]
        state["open"].append((seq, reads))
        results = []
        for t in range(WARPGROUP):
            acc_t = _Accumulator(out[t])  # NumPy scalars, like the hardware's registers
            acc_t._state, acc_t._seq, acc_t._ptx = state, seq, spec.ptx
            results.append(acc_t)
        return results

    def mma(acc, a, b, scale_d):
        thread = current()
        acc_regs = _plain(acc)
        if len(acc_regs) != regs:
            raise TypeError(f"{spec.ptx}: the accumulator must be a tuple of {regs} registers "
                            f"({spec.acc_type}), got {len(acc_regs)}")
        if spec.a_from == "reg" and len(_plain(a)) != 4:
            raise TypeError(f"{spec.ptx}: the A fragment must be a tuple of 4 uint32, got {a!r}")
        return collective("warpgroup", name, (thread, acc, a, b, scale_d), compute)

    mma.spec = spec
    mma.__name__ = f"wgmma_{spec.shape}_{spec.acc}_{spec.a}_{spec.b}_{spec.a_from}"
    mma.__doc__ = (f"Emulated ``{spec.ptx}`` ({spec.a_from} A, immediates "
                   f"{spec.immediates}): acc = mma(acc, a, desc_b, scale_d).")
    return mma


# ---------------------------------------------------------------------------------------------
# Fences and groups
# ---------------------------------------------------------------------------------------------


def _warpgroup_op(op, action):
    def compute(lanes):
        state = _state(lanes[0])
        action(state)
        return [None] * WARPGROUP

    return collective("warpgroup", op, current(), compute)


def wgmma_fence():
    def action(state):
        state["fenced"] = True

    _warpgroup_op("wgmma.fence.sync.aligned", action)


def wgmma_commit_group():
    def action(state):
        state["groups"].append(state["open"])
        state["open"] = []

    _warpgroup_op("wgmma.commit_group.sync.aligned", action)


def _retire(state, group):
    for seq, reads in group:
        for addr, seen in reads:
            now = state["first"].block.shared.memory[addr]
            changed = now != seen
            if changed.any():
                where = int(addr[changed][0])
                raise EmulationError(
                    f"{_who(state)}: shared address {where}, which wgmma.mma_async #{seq} of the "
                    "warpgroup reads, changed before wgmma_wait_group retired it (the tensor "
                    "core may read its operands until then): wait for the wgmma-group before "
                    "overwriting or releasing its shared-memory stage"
                )
        state["retired"] = max(state["retired"], seq)


def wgmma_wait_group(n):
    if not isinstance(n, (int, np.integer)) or not 0 <= int(n) <= 7:
        raise ValueError(f"wgmma_wait_group takes a literal integer 0..7, got {n!r}")
    n = int(n)

    def action(state):
        while len(state["groups"]) > n:
            _retire(state, state["groups"].popleft())
        state["fenced"] = False
        state["since"] = "its last wgmma_wait_group"

    _warpgroup_op(f"wgmma.wait_group.sync.aligned {n}", action)


def wgmma_fence_operand(frag):
    # No instruction: the registers pass through unchanged (an in-flight accumulator stays one).
    return frag


# ---------------------------------------------------------------------------------------------
# Hooks into the runtime and numba (installed once, under the simulator only)
# ---------------------------------------------------------------------------------------------


def _check_exit(block):
    """A warpgroup must not finish with mma_async uncommitted or groups not waited for."""
    for key, state in list(block.state.items()):
        if not (isinstance(key, tuple) and key[0] == "wgmma"):
            continue
        if state["open"]:
            raise EmulationError(
                f"{_who(state)}: the warpgroup exited with {len(state['open'])} wgmma.mma_async "
                "never committed (wgmma_commit_group) nor waited for (wgmma_wait_group)"
            )
        if state["groups"]:
            raise EmulationError(
                f"{_who(state)}: the warpgroup exited with {len(state['groups'])} wgmma-group(s) "
                "in flight: wgmma_wait_group(0) before the kernel ends"
            )


def _to_fixed_tuple(array, length):
    """numba.cuda.np.unsafe.ndarray.to_fixed_tuple for the simulator."""
    return tuple(array[i] for i in range(length))


def _install_hooks():
    # NOTE: the runtime has no per-launch exit hook and numba's to_fixed_tuple (the usual way
    # to build an accumulator tuple) is an intrinsic that pure Python cannot call; both are
    # added here until the runtime offers them.
    launch = runtime.Launch
    if not getattr(launch._run_cluster, "checks_wgmma_exit", False):
        original = launch._run_cluster

        def run_cluster(self, cluster, args):
            original(self, cluster, args)
            for block in cluster.blocks:
                _check_exit(block)

        run_cluster.checks_wgmma_exit = True
        launch._run_cluster = run_cluster
    import numba.cuda.np.unsafe.ndarray as unsafe

    unsafe.to_fixed_tuple = _to_fixed_tuple


from intrinsics.emulate import ACTIVE as _ACTIVE  # noqa: E402

if _ACTIVE:
    _install_hooks()

EMULATIONS = {
    # smem_desc (a cuda.jit device function, which runs as Python) calls the shared_address
    # that intrinsics.wgmma imported; make sure it is the emulated one whatever the import order.
    "shared_address": shared_address,
    "wgmma_fence": wgmma_fence,
    "wgmma_commit_group": wgmma_commit_group,
    "wgmma_wait_group": wgmma_wait_group,
    "wgmma_fence_operand": wgmma_fence_operand,
}
FACTORIES = {"wgmma_mma_async": wgmma_mma_async}
