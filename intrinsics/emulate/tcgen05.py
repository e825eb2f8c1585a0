"""Emulation of tcgen05 and tensor memory (PTX ISA 9.7.16, "TensorCore 5th Generation Family
Instructions").

NOTE: there is no Blackwell GPU behind this emulation.  It implements the models of
``intrinsics/tcgen05.py`` and ``intrinsics/layout`` -- the PTX ISA's rules and tables, and where the ISA's figures were not
at hand, CUTLASS's and DeepGEMM's usage -- and nothing here has been compared with hardware.  The
places that rest on usage rather than the ISA text: the scale-factor layout in TMEM
(:func:`intrinsics.layout.scale_factor_coords`), the f16-accumulator packing and A-in-TMEM layout
(two / four elements per 32-bit cell, the lower K in the low bits), and the position of fp6/fp4
values in their 8-bit containers for kind::f8f6f4 / mxf8f6f4 (e2m1 in bits 5-2, e2m3/e3m2 in bits
5-0: the sign at bit 5 in both, so an e2m1 container reads as the e2m3 value with two zero
mantissa bits).

Tensor memory.  Each CTA (``Block.state["tcgen05"]``) has 128 lanes x 512 columns of uint32.
(On the hardware the CTAs resident on one SM share those 512 columns; here every CTA has its own,
so an allocation never waits on another CTA.)  Fresh allocations read 0xFFFFFFFF (a NaN as f32).
The rules, each an EmulationError naming block, warp, lane and the TMEM address:

- ``tcgen05.alloc``: the column count must be a power of two in 32..512 (the typed intrinsic
  checks a literal at compile time; here every value is checked); allocations are placed first
  fit at a multiple of their size; an alloc that does not fit waits until a dealloc frees room
  (a wait that can never end is reported as a deadlock); alloc after the CTA's
  ``relinquish_alloc_permit`` is refused; every lane of the warp must pass the same count and
  destination.  The address (lane 0, first column) is written to the shared uint32 at (array,
  index) without marking it as a generic-proxy store.  The cta_group::2 forms act on the
  executing CTA's tensor memory alone (the pair's joint allocation is not modelled).
- ``tcgen05.dealloc``: the address and count must name one live allocation exactly.
- Every allocation must be freed before the CTA exits (checked when its cluster finishes).
- ``tcgen05.ld`` / ``tcgen05.st``: warp w may touch lanes 32*(w%4) .. 32*(w%4)+31 only; every
  column touched must be allocated; the address must be the same in every lane; cells an
  uncommitted ``tcgen05.mma`` or ``tcgen05.cp`` writes may not be read or written (commit first,
  then wait on the mbarrier).  A loaded register read before the thread's ``tcgen05.wait::ld``
  raises (the returned tuple checks on indexing and iteration; ``tcgen05_wait_ld_regs`` hands
  back plain registers).
- ``tcgen05.mma`` / ``tcgen05.cp``: every TMEM cell they read or write must be allocated; shared
  memory they read must lie in the CTA's shared memory and must not hold generic-proxy stores
  their writer did not order with ``fence.proxy.async`` (``SharedSpace.check_async_read``).

Asynchrony, as modelled: ``tcgen05.mma`` and ``tcgen05.cp`` are performed when issued, by the one
issuing thread, on the bytes shared memory holds then; they stay "uncommitted" until that thread's
``tcgen05.commit``, which arrives (count 1) at once on the mbarrier -- of this CTA, or with
``.multicast::cluster`` on the barrier at the same shared address of every CTA whose bit is set in
the mask (``intrinsics/emulate/mbarrier.py``'s Barrier objects).  ``tcgen05.ld`` results are
available at the wait; ``tcgen05.st`` writes at issue.  The fences are accepted and do nothing.

What ``tcgen05.mma`` supports here: cta_group::1 only (cta_group::2 raises: the CTA pair is not
modelled); dense kinds f16 (f16/bf16 -> f32 or f16 D), tf32, f8f6f4 (e4m3, e5m2, e2m3, e3m2,
e2m1) with M=64 (layout F) or M=128 (layout D); block-scaled kinds mxf8f6f4 (ue8m0 x 1), mxf4
(ue8m0 x 2) and mxf4nvf4 (ue8m0 x 2, ue4m3 or ue8m0 x 4) with M=128; N per the shape rules
(multiples of 8 up to 256); A from shared memory (K- or MN-major, swizzle none/32B/64B/128B, base
offset 0) or from TMEM (K-major, rows in D's lanes, its 32 bytes of K in 8 consecutive columns);
negation bits.  Sparse descriptors, saturation, ``.ws`` shifts, the K=96 flag and
128B_base32B descriptors raise.

Numerics: inputs are decoded exactly (f16/bf16/tf32/fp8 by ``numerics.decode``; fp6, fp4, ue8m0
and ue4m3 by the tables below), each instruction's products and sums are formed in float64 and
rounded once to the accumulator format (round to nearest even).  For block-scaled kinds
D += sum_j (sfa_j * sfb_j) * (A_j . B_j) over the instruction's scale blocks j.  Integer-valued
(and power-of-two-scaled) inputs whose sums stay below 2**24 give exact results; the hardware's
internal adder widths are not modelled (see intrinsics/emulate/wgmma.py for the discussion).
"""

import numpy as np

from intrinsics import layout
from intrinsics import tcgen05 as family
from intrinsics.emulate import memory, runtime
from intrinsics.emulate.mbarrier import barrier_address, barrier_at
from intrinsics.emulate.numerics import decode, encode
from intrinsics.emulate.runtime import EmulationError, collective, current

__all__ = ["EMULATIONS", "FACTORIES", "decode_minifloat", "tmem_of"]

LANES, COLUMNS = layout.TMEM_LANES, layout.TMEM_COLUMNS
_KEY = "tcgen05"
POISON = np.uint32(0xFFFFFFFF)

# ---------------------------------------------------------------------------------------------
# Number formats: fp6, fp4 and the scale-factor formats (bit-exact tables)
# ---------------------------------------------------------------------------------------------


def _minifloat_table(exp_bits, man_bits, bias, signed=True):
    """Every value of a format without infinities or NaNs (OCP MX: e2m1, e2m3, e3m2)."""
    width = exp_bits + man_bits + (1 if signed else 0)
    codes = np.arange(1 << width)
    exp = (codes >> man_bits) & ((1 << exp_bits) - 1)
    man = codes & ((1 << man_bits) - 1)
    mag = np.where(exp == 0, man / 2.0**man_bits * 2.0 ** (1 - bias),
                   (1 + man / 2.0**man_bits) * 2.0 ** (exp.astype(np.float64) - bias))
    if signed:
        mag = np.where(codes >> (exp_bits + man_bits), -mag, mag)
    return mag


_TABLES = {
    "e2m1": _minifloat_table(2, 1, 1),   # 0, 0.5, 1, 1.5, 2, 3, 4, 6
    "e2m3": _minifloat_table(2, 3, 1),   # largest 7.5
    "e3m2": _minifloat_table(3, 2, 3),   # largest 28
}
_UE8M0 = np.where(np.arange(256) == 255, np.nan, 2.0 ** (np.arange(256) - 127.0))
_UE4M3 = decode(np.arange(128), "e4m3")  # unsigned e4m3: bias 7, 0x7F is NaN; bit 7 ignored


def decode_minifloat(bits, fmt):
    """Exact float64 values of raw codes: "e2m1" (4 bits), "e2m3"/"e3m2" (6 bits), "ue8m0" and
    "ue4m3" (8 bits); anything else goes to ``numerics.decode``."""
    bits = np.asarray(bits).astype(np.int64)
    if fmt in _TABLES:
        return _TABLES[fmt][bits & (len(_TABLES[fmt]) - 1)]
    if fmt == "ue8m0":
        return _UE8M0[bits & 0xFF]
    if fmt == "ue4m3":
        return _UE4M3[bits & 0x7F]
    return decode(bits, fmt)


# ---------------------------------------------------------------------------------------------
# Tensor memory of a CTA
# ---------------------------------------------------------------------------------------------


class Tmem:
    """One CTA's tensor memory and the tcgen05 bookkeeping beside it."""

    def __init__(self, block):
        self.block = block
        self.cells = np.full((LANES, COLUMNS), POISON, dtype=np.uint32)
        self.owner = np.full(COLUMNS, -1, dtype=np.int64)  # column -> start of its allocation
        self.allocs = {}  # start column -> (ncols, allocating thread)
        self.relinquished = None  # the thread that relinquished the permit
        self.pending = {}  # issuing thread -> [(what, lanes (lo, hi), columns (lo, hi))]

    def fit(self, ncols):
        for start in range(0, COLUMNS, ncols):
            if (self.owner[start: start + ncols] < 0).all():
                return start
        return None

    def describe(self):
        if not self.allocs:
            return "no columns allocated"
        return "allocated: " + ", ".join(f"columns {s}..{s + n - 1}"
                                         for s, (n, _) in sorted(self.allocs.items()))


def tmem_of(block):
    """The Tmem of ``block`` (created on first use)."""
    return block.once(_KEY, lambda: Tmem(block))


def _addr(address):
    return f"TMEM address {int(address) & 0xFFFFFFFF:#010x}"


def _check_cells(thread, op, tmem, address, lanes, columns):
    """EmulationError unless lanes (lo, hi) and columns (lo, hi) (inclusive) are in TMEM and
    every column is allocated."""
    (llo, lhi), (clo, chi) = lanes, columns
    if llo < 0 or lhi >= LANES or clo < 0 or chi >= COLUMNS:
        raise EmulationError(
            f"{thread.where()}: {op} at {_addr(address)} touches lanes {llo}..{lhi}, columns "
            f"{clo}..{chi}: outside tensor memory (lanes 0..127, columns 0..511)")
    missing = np.flatnonzero(tmem.owner[clo: chi + 1] < 0)
    if missing.size:
        col = clo + int(missing[0])
        raise EmulationError(
            f"{thread.where()}: {op} at {_addr(address)} touches column {col}, which is not "
            f"allocated (tcgen05.alloc) in block {tuple(tmem.block.index)}; {tmem.describe()}")


def _check_pending(thread, op, tmem, address, lanes, columns, pipelined=False):
    """EmulationError when (lanes, columns) overlap cells an uncommitted mma/cp writes.

    ``pipelined``: the access is itself a tcgen05.mma/cp, which the ISA executes in issue order
    after the same thread's earlier mma/cp (no commit needed between them)."""
    for issuer, writes in tmem.pending.items():
        if pipelined and issuer is thread:
            continue
        for what, (llo, lhi), (clo, chi) in writes:
            if llo <= lanes[1] and lanes[0] <= lhi and clo <= columns[1] and columns[0] <= chi:
                raise EmulationError(
                    f"{thread.where()}: {op} at {_addr(address)} touches TMEM lanes "
                    f"{max(llo, lanes[0])}.., columns {max(clo, columns[0])}.. that {what} "
                    f"issued by {issuer.where()} writes, and that thread has not committed it "
                    "(tcgen05.commit, then wait on the mbarrier and tcgen05.fence::"
                    "after_thread_sync before touching the result)")


def _progress(launch):
    """Count a state change and wake waiters (caller holds launch.cond)."""
    launch.progress += 1
    launch.cond.notify_all()


def _uniform(values, what, op, first_thread, show=repr):
    first = values[0]
    for lane, value in enumerate(values):
        if value != first:
            raise EmulationError(
                f"{first_thread.where()}: {op}: {what} differs across the warp (lane 0: "
                f"{show(first)}, lane {lane}: {show(value)}); every lane must pass the same")
    return first


# ---------------------------------------------------------------------------------------------
# tcgen05.alloc / dealloc / relinquish_alloc_permit
# ---------------------------------------------------------------------------------------------


def _alloc_name(cta_group):
    return f"tcgen05.alloc.cta_group::{cta_group}.sync.aligned.shared::cta.b32"


def tcgen05_alloc_op(cta_group=1):
    family._check_cta_group("tcgen05_alloc_op", cta_group)
    op = _alloc_name(cta_group)

    def compute(lanes):
        threads = [lanes[i][0] for i in range(32)]
        first = threads[0]
        ncols = _uniform([lanes[i][1] for i in range(32)], "the column count", op, first)
        dst = _uniform([lanes[i][2] for i in range(32)], "the destination address", op, first)
        if ncols not in family._NCOLS:
            raise EmulationError(
                f"{first.where()}: {op}: the column count must be a power of two in 32..512 "
                f"(one of {list(family._NCOLS)}), got {ncols}")
        tmem = tmem_of(first.block)
        if tmem.relinquished is not None:
            raise EmulationError(
                f"{first.where()}: {op} of {ncols} columns after {tmem.relinquished.where()} "
                "executed tcgen05.relinquish_alloc_permit: the CTA may not allocate any more")
        start = tmem.fit(ncols)
        if start is None:
            return [None] * 32
        tmem.owner[start: start + ncols] = start
        tmem.allocs[start] = (ncols, first)
        tmem.cells[:, start: start + ncols] = POISON
        address = np.uint32(start)
        memory.shared_bytes(dst, 4, first.block)[:] = np.array([address]).view(np.uint8)
        _progress(first.launch)
        return [address] * 32

    def alloc(array, index, ncols):
        thread = current()
        host = memory.host_array(array)
        if host.dtype != np.uint32:
            raise EmulationError(f"{thread.where()}: {op}: the destination array must hold "
                                 f"uint32, got {host.dtype}")
        dst = memory.shared_address(array, index)
        if dst % 4:
            raise EmulationError(f"{thread.where()}: {op}: the destination shared address "
                                 f"{dst:#x} is not 4-byte aligned")
        ncols = int(ncols)
        while True:
            got = collective("warp", op, (thread, ncols, dst), compute)
            if got is not None:
                return
            tmem = tmem_of(thread.block)
            thread.launch.wait_until(
                thread, lambda: tmem.fit(ncols) is not None,
                f"{op} of {ncols} columns (tensor memory full: {tmem.describe()})")

    alloc.__name__ = "tcgen05_alloc" + ("_cg2" if cta_group == 2 else "")
    return alloc


def tcgen05_dealloc_op(cta_group=1):
    family._check_cta_group("tcgen05_dealloc_op", cta_group)
    op = f"tcgen05.dealloc.cta_group::{cta_group}.sync.aligned.b32"

    def compute(lanes):
        first = lanes[0][0]
        taddr = _uniform([lanes[i][1] for i in range(32)], "the TMEM address", op, first, _addr)
        ncols = _uniform([lanes[i][2] for i in range(32)], "the column count", op, first)
        tmem = tmem_of(first.block)
        lane, col = layout.decode_tmem_address(taddr)
        entry = tmem.allocs.get(col)
        if ncols not in family._NCOLS or lane or entry is None or entry[0] != ncols:
            raise EmulationError(
                f"{first.where()}: {op} of {ncols} columns at {_addr(taddr)} (lane {lane}, "
                f"column {col}) does not match an allocation: dealloc takes the address "
                f"tcgen05.alloc wrote and the same column count; {tmem.describe()}")
        del tmem.allocs[col]
        tmem.owner[col: col + ncols] = -1
        _progress(first.launch)
        return [None] * 32

    def dealloc(taddr, ncols):
        collective("warp", op, (current(), int(taddr) & 0xFFFFFFFF, int(ncols)), compute)

    dealloc.__name__ = "tcgen05_dealloc" + ("_cg2" if cta_group == 2 else "")
    return dealloc


def tcgen05_relinquish_alloc_permit_op(cta_group=1):
    family._check_cta_group("tcgen05_relinquish_alloc_permit_op", cta_group)
    op = f"tcgen05.relinquish_alloc_permit.cta_group::{cta_group}.sync.aligned"

    def compute(lanes):
        first = lanes[0]
        tmem = tmem_of(first.block)
        if tmem.relinquished is None:
            tmem.relinquished = first
        return [None] * 32

    def relinquish():
        collective("warp", op, current(), compute)

    relinquish.__name__ = "tcgen05_relinquish_alloc_permit" + ("_cg2" if cta_group == 2 else "")
    return relinquish


# ---------------------------------------------------------------------------------------------
# tcgen05.ld / tcgen05.st / waits
# ---------------------------------------------------------------------------------------------

_LD_STATE = "tcgen05.ld"


def _ld_state(thread):
    state = thread.state.get(_LD_STATE)
    if state is None:
        state = thread.state[_LD_STATE] = {"issued": 0, "waited": 0}
    return state


class _Loaded(tuple):
    """Registers a tcgen05.ld returned: reading one before the thread's tcgen05.wait::ld raises."""

    def _check(self, what):
        if self._seq > _ld_state(self._thread)["waited"]:
            raise EmulationError(
                f"{current().where()}: reads {what} of the registers {self._ptx} returned before "
                "tcgen05.wait::ld: the load is asynchronous; regs = tcgen05_wait_ld_regs(regs) "
                "first")

    def __getitem__(self, index):
        self._check(f"register {index}")
        return tuple.__getitem__(self, index)

    def __iter__(self):
        self._check("the registers")
        return tuple.__iter__(self)


def _plain(values):
    if isinstance(values, tuple):
        return tuple(tuple.__iter__(values))
    return (values,)


def _warp_cells(op, shape, num, lanes_threads, taddr):
    """(lane index array, column index array) of the cells a warp's ld/st touches, checked."""
    first = lanes_threads[0]
    warp = first.warp
    tmem = tmem_of(first.block)
    lane0, col0 = layout.decode_tmem_address(taddr)
    dl, dc = layout.ldst_coords(shape, num)
    lanes, cols = lane0 + dl, col0 + dc
    allowed = 32 * (warp % 4)
    lo, hi = int(lanes.min()), int(lanes.max())
    if lo < allowed or hi > allowed + 31:
        raise EmulationError(
            f"{first.where()}: {op} at {_addr(taddr)} (lane {lane0}, column {col0}) touches TMEM "
            f"lanes {lo}..{hi}, but warp {warp} (warp {warp % 4} of its warpgroup) may access "
            f"lanes {allowed}..{allowed + 31} only")
    span = ((lo, hi), (int(cols.min()), int(cols.max())))
    _check_cells(first, op, tmem, taddr, *span)
    _check_pending(first, op, tmem, taddr, *span)
    return tmem, lanes, cols


_LDST_CACHE = {}


def tcgen05_ld(shape, num):
    key = ("ld", shape, num)
    if key not in _LDST_CACHE:
        _LDST_CACHE[key] = _build_ld(shape, num)
    return _LDST_CACHE[key]


def tcgen05_st(shape, num):
    key = ("st", shape, num)
    if key not in _LDST_CACHE:
        _LDST_CACHE[key] = _build_st(shape, num)
    return _LDST_CACHE[key]


def _build_ld(shape, num):
    layout.ldst_register_count("ld", shape, num)  # validates (the factory is this module's)
    op = f"tcgen05.ld.sync.aligned.{shape}.x{num}.b32"

    def compute(lanes):
        threads = [lanes[i][0] for i in range(32)]
        taddr = _uniform([lanes[i][1] for i in range(32)], "the TMEM address", op, threads[0],
                         _addr)
        tmem, tl, tc = _warp_cells(op, shape, num, threads, taddr)
        values = tmem.cells[tl, tc]
        out = []
        for i, thread in enumerate(threads):
            state = _ld_state(thread)
            state["issued"] += 1
            regs = _Loaded(np.uint32(v) for v in values[i])
            regs._thread, regs._seq, regs._ptx = thread, state["issued"], op
            out.append(regs)
        return out

    def ld(taddr):
        return collective("warp", op, (current(), int(taddr) & 0xFFFFFFFF), compute)

    ld.__name__ = f"tcgen05_ld_{shape}_x{num}"
    return ld


def _build_st(shape, num):
    regs = layout.ldst_register_count("st", shape, num)
    op = f"tcgen05.st.sync.aligned.{shape}.x{num}.b32"

    def compute(lanes):
        threads = [lanes[i][0] for i in range(32)]
        taddr = _uniform([lanes[i][1] for i in range(32)], "the TMEM address", op, threads[0],
                         _addr)
        tmem, tl, tc = _warp_cells(op, shape, num, threads, taddr)
        tmem.cells[tl, tc] = np.array([lanes[i][2] for i in range(32)], dtype=np.uint32)
        return [None] * 32

    def st(taddr, values):
        thread = current()
        vals = [int(v) & 0xFFFFFFFF for v in values]  # a tcgen05.ld result checks its wait here
        if len(vals) != regs:
            raise TypeError(f"{op}: takes {regs} uint32 registers, got {len(vals)}")
        collective("warp", op, (thread, int(taddr) & 0xFFFFFFFF, vals), compute)

    st.__name__ = f"tcgen05_st_{shape}_x{num}"
    return st


def _wait_ld_compute(lanes):
    for thread in lanes.values():
        state = _ld_state(thread)
        state["waited"] = state["issued"]
    return [None] * 32


def tcgen05_wait_ld():
    collective("warp", "tcgen05.wait::ld.sync.aligned", current(), _wait_ld_compute)


def tcgen05_wait_ld_regs(frag):
    collective("warp", "tcgen05.wait::ld.sync.aligned", current(), _wait_ld_compute)
    if isinstance(frag, tuple):
        return _plain(frag)
    return frag


def tcgen05_wait_st():
    collective("warp", "tcgen05.wait::st.sync.aligned", current(), lambda lanes: [None] * 32)


def tcgen05_fence_before_thread_sync():
    current()


def tcgen05_fence_after_thread_sync():
    current()


# ---------------------------------------------------------------------------------------------
# Shared-memory operands through descriptors
# ---------------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, thread):
        self.thread = thread

    def where(self):
        return self.thread.where()


def _smem_bytes(thread, op, desc, major, rows, elem_bytes, k, what):
    """uint8 array (rows, k * elem_bytes): the bytes of each row of one operand, in K order,
    read through an sm100 shared-memory descriptor (K-major reads bytes; MN-major elements)."""
    desc = int(desc) & (2**64 - 1)
    fields = layout.decode_umma_smem_desc(desc)
    space = thread.block.shared
    if fields["version"] != 1:
        raise EmulationError(
            f"{thread.where()}: {op}: the {what} descriptor {desc:#018x} has version bits "
            f"46-48 = {fields['version']}; tcgen05 descriptors carry 0b001 (a Hopper wgmma "
            "descriptor has 0 there: build it with make_umma_smem_desc)")
    mn = np.arange(rows)[:, None]
    try:
        if major == "K":
            addr = layout.umma_smem_desc_address_host(desc, "K", 1, mn,
                                                      np.arange(k * elem_bytes)[None, :])
        else:
            addr = layout.umma_smem_desc_address_host(desc, "MN", elem_bytes, mn,
                                                      np.arange(k)[None, :])
            addr = (addr[..., None] + np.arange(elem_bytes)).reshape(rows, k * elem_bytes)
    except NotImplementedError as exc:
        raise EmulationError(f"{thread.where()}: {op}: the {what} descriptor {desc:#018x}: "
                             f"{exc}") from None
    lo, hi = int(addr.min()), int(addr.max()) + 1
    if hi > space.top:
        raise EmulationError(
            f"{thread.where()}: {op}: the {what} descriptor {desc:#018x} (start "
            f"{fields['addr']}, LBO {fields['lbo']}, SBO {fields['sbo']}, swizzle "
            f"{fields['swizzle']}) reads shared addresses [{lo}, {hi}), outside this block's "
            f"{space.top} bytes of shared memory")
    dirty = space.dirty[addr]
    if dirty.any():
        first = int(addr.reshape(-1)[np.flatnonzero(dirty.reshape(-1))[0]])
        space.check_async_read(first, 1, f"{op} (operand {what}, descriptor {desc:#018x})",
                               _Reader(thread))
    return space.memory[addr]


# ---------------------------------------------------------------------------------------------
# tcgen05.mma
# ---------------------------------------------------------------------------------------------


def _values(kind, fmt, raw):
    """Decoded (rows, K) float64 of an operand given its bytes (rows, 32) in K order."""
    if kind == "f16":
        return decode(raw.view(np.uint16), fmt)
    if kind == "tf32":
        return decode(raw.view(np.uint32), "tf32")
    if kind in ("mxf4", "mxf4nvf4"):  # packed: the lower K in the low nibble
        nibbles = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[0], -1)
        return decode_minifloat(nibbles, "e2m1")
    if fmt in ("e4m3", "e5m2"):
        return decode(raw, fmt)
    if fmt == "e2m1":  # 8-bit container: bits 5-2
        return decode_minifloat(raw >> 2, "e2m1")
    return decode_minifloat(raw, fmt)  # e2m3 / e3m2: bits 5-0


def _names(kind, code):
    for name, c in layout.IDESC_AB_FORMATS[kind].items():
        if c == code:
            return name
    return None


def _d_lanes(m):
    rows = np.arange(m)
    return rows if m == 128 else 32 * (rows // 16) + rows % 16


def _region(lanes, clo, ncols):
    return (int(lanes.min()), int(lanes.max())), (clo, clo + ncols - 1)


_MMA_CACHE = {}


def tcgen05_mma(kind, cta_group=1, a_from="smem", scale_vec=None):
    spec = family._resolve_mma(kind, cta_group, a_from, scale_vec)
    if spec not in _MMA_CACHE:
        _MMA_CACHE[spec] = _build_mma(spec)
    return _MMA_CACHE[spec]


def _decode_idesc(thread, spec, idesc):
    op, kind = spec.ptx, spec.kind
    f = layout.decode_instr_desc(idesc, spec.block_scaled)
    where = f"{thread.where()}: {op}: instruction descriptor {int(idesc) & 0xFFFFFFFF:#010x}"
    if f["sparse"] or f["sparse_id"]:
        raise EmulationError(f"{where} asks for sparsity (bits 0-2); dense tcgen05.mma takes 0")
    if not spec.block_scaled and (f["saturate"] or f["max_shift"]):
        raise EmulationError(f"{where} sets saturate (bit 3) or a .ws max shift (bits 30-31); "
                             "neither applies to a dense float kind")
    if spec.block_scaled and f["k_flag"]:
        raise EmulationError(f"{where} sets bit 31 (K=96); only the table's K is modelled")
    a, b = _names(kind, f["a_format"]), _names(kind, f["b_format"])
    if a is None or b is None:
        valid = ", ".join(f"{n} {c}" for n, c in layout.IDESC_AB_FORMATS[kind].items())
        raise EmulationError(f"{where} has A/B type codes {f['a_format']}/{f['b_format']}; "
                             f"kind::{kind} takes {valid}")
    if kind == "f16" and a != b:
        raise EmulationError(f"{where}: kind::f16 needs A and B of one type, got {a}/{b}")
    d = "f32"
    if not spec.block_scaled:
        d = {v: k for k, v in layout.IDESC_D_FORMATS.items()}.get(f["d_format"])
        if d not in spec.row.d_types or (a == "bf16" and d != "f32"):
            raise EmulationError(f"{where} has D type code {f['d_format']}; kind::{kind} "
                                 f"accumulates in {'/'.join(spec.row.d_types)} (bf16 inputs: "
                                 "f32 only)")
    try:
        layout.check_mma_shape(kind, f["m"], f["n"], spec.cta_group, spec.a_from)
    except ValueError as exc:
        raise EmulationError(f"{where}: {exc}") from None
    for name, t, major in (("A", a, f["a_major"]), ("B", b, f["b_major"])):
        if major and (t not in layout.TRANSPOSABLE_TYPES or spec.kind in ("mxf4", "mxf4nvf4")):
            raise EmulationError(f"{where}: {name} of type {t} must be K-major (bit "
                                 f"{15 if name == 'A' else 16} = 0)")
    if spec.a_from == "tmem" and f["a_major"]:
        raise EmulationError(f"{where}: A in tensor memory is K-major (bit 15 = 0)")
    scale = None
    if spec.block_scaled:
        scale = {v: k for k, v in layout.IDESC_SCALE_FORMATS.items()}[f["scale_format"]]
        if scale not in spec.row.scale_types[spec.scale_vec]:
            raise EmulationError(
                f"{where} names scale type {scale}; kind::{kind} with scale_vec "
                f"{spec.scale_vec!r} takes {'/'.join(spec.row.scale_types[spec.scale_vec])}")
        count = spec.scale_count
        for what, sf in (("A", f["sfa_id"]), ("B", f["sfb_id"])):
            if sf % count or sf + count > 4:
                raise EmulationError(
                    f"{where}: the {what} scale-factor data ID is {sf}; with {count} scale "
                    f"factor(s) per row it must be one of {[i for i in range(0, 4, count)]}")
    return f, a, b, d, scale


def _build_mma(spec):
    op, kind, row = spec.ptx, spec.kind, spec.row
    elem_bytes = max(row.elem_bits // 8, 1)
    k_elems = 32 // elem_bytes  # elements in the 32 bytes of K one instruction reads per row

    def issue(d_tmem, a, b_desc, idesc, sfa, sfb, enable_input_d):
        thread = current()
        if spec.cta_group != 1:
            raise EmulationError(
                f"{thread.where()}: {op}: cta_group::2 (the CTA pair) is not emulated; the "
                "emulation models cta_group::1 only")
        f, a_t, b_t, d_t, scale = _decode_idesc(thread, spec, idesc)
        m, n = f["m"], f["n"]
        launch = thread.launch
        with launch.cond:
            tmem = tmem_of(thread.block)
            # D's cells
            lanes = _d_lanes(m)
            d_lane0, d_col = layout.decode_tmem_address(d_tmem)
            d_cols = n if d_t == "f32" else n // 2
            if d_lane0:
                raise EmulationError(f"{thread.where()}: {op}: the D address {_addr(d_tmem)} "
                                     "must be at lane 0 (D spans the data-path lanes)")
            d_region = _region(lanes, d_col, d_cols)
            _check_cells(thread, op + " (D)", tmem, d_tmem, *d_region)
            # A and B
            if spec.a_from == "smem":
                raw_a = _smem_bytes(thread, op, a, "MN" if f["a_major"] else "K", m,
                                    elem_bytes, k_elems, "A")
            else:
                a_lane0, a_col = layout.decode_tmem_address(a)
                if a_lane0:
                    raise EmulationError(f"{thread.where()}: {op}: the A address {_addr(a)} "
                                         "must be at lane 0")
                a_region = _region(lanes, a_col, 8)
                _check_cells(thread, op + " (A)", tmem, a, *a_region)
                _check_pending(thread, op + " (A)", tmem, a, *a_region, pipelined=True)
                raw_a = np.ascontiguousarray(tmem.cells[lanes][:, a_col: a_col + 8]).view(np.uint8)
            raw_b = _smem_bytes(thread, op, b_desc, "MN" if f["b_major"] else "K", n,
                                elem_bytes, k_elems, "B")
            va, vb = _values(kind, a_t, raw_a), _values(kind, b_t, raw_b)
            if f["negate_a"]:
                va = -va
            if f["negate_b"]:
                vb = -vb
            with np.errstate(all="ignore"):
                if spec.block_scaled:
                    prod = _block_scaled(thread, spec, tmem, f, scale, va, vb, sfa, sfb)
                else:
                    prod = va @ vb.T
                tl, tc, half = layout.tmem_d_coords(m, n, d_t)
                tc = tc + d_col
                if d_t == "f32":
                    if enable_input_d:
                        prod = prod + decode(tmem.cells[tl, tc], "f32")
                    tmem.cells[tl, tc] = encode(prod, "f32")
                else:
                    cells = tmem.cells[tl, tc]
                    if enable_input_d:
                        old = np.where(half == 1, cells >> np.uint32(16), cells & 0xFFFF)
                        prod = prod + decode(old, "f16")
                    bits = encode(prod, "f16")
                    lo, hi = bits[:, 0::2], bits[:, 1::2]
                    tmem.cells[tl[:, 0::2], tc[:, 0::2]] = lo | (hi << np.uint32(16))
            tmem.pending.setdefault(thread, []).append((op,) + d_region)

    if spec.block_scaled:
        def mma(d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d):
            issue(d_tmem, a, b_desc, idesc, sfa_tmem, sfb_tmem, enable_input_d)
    else:
        def mma(d_tmem, a, b_desc, idesc, enable_input_d):
            issue(d_tmem, a, b_desc, idesc, None, None, enable_input_d)

    mma.spec = spec
    mma.__name__ = (f"tcgen05_mma_cg{spec.cta_group}_{spec.kind}_{spec.a_from}"
                    f"{'_' + spec.scale_vec if spec.scale_vec else ''}")
    mma.__doc__ = f"Emulated ``{op}`` ({spec.a_from} A), issued by one thread."
    return mma


def _block_scaled(thread, spec, tmem, f, scale, va, vb, sfa, sfb):
    """sum over the instruction's scale blocks j of (sfa_j * sfb_j) * (A_j . B_j), (M, N)."""
    op = spec.ptx
    m, n, count = f["m"], f["n"], spec.scale_count
    k = va.shape[1]
    block = k // count
    sa_lane0, sa_col = layout.decode_tmem_address(sfa)
    sb_lane0, sb_col = layout.decode_tmem_address(sfb)
    if sa_lane0 or sb_lane0:
        raise EmulationError(f"{thread.where()}: {op}: the scale-factor addresses "
                             f"{_addr(sfa)} / {_addr(sfb)} must be at lane 0")
    a_lanes, a_cols, a_bytes = layout.scale_factor_coords("A", m, count, f["sfa_id"])
    b_lanes, b_cols, b_bytes = layout.scale_factor_coords("B", n, count, f["sfb_id"])
    for what, addr, col, cols in (("SFA", sfa, sa_col, a_cols), ("SFB", sfb, sb_col, b_cols)):
        region = ((0, LANES - 1), (col, col + int(cols.max())))
        _check_cells(thread, f"{op} ({what})", tmem, addr, *region)
        _check_pending(thread, f"{op} ({what})", tmem, addr, *region, pipelined=True)
    cells = tmem.cells.astype(np.int64)
    sfa_codes = (cells[a_lanes, sa_col + a_cols] >> (8 * a_bytes)) & 0xFF  # (M, count)
    sa = decode_minifloat(sfa_codes, scale)
    # warp w's data path reads B's scale factors from its own 32 lanes
    sb = np.stack([decode_minifloat((cells[32 * w + b_lanes, sb_col + b_cols] >> (8 * b_bytes))
                                    & 0xFF, scale) for w in range(4)])  # (4, N, count)
    sb_rows = sb[np.arange(m) // 32]  # (M, N, count): the warp of each D row (M=128: lane m)
    out = np.zeros((m, n))
    for j in range(count):
        part = va[:, j * block: (j + 1) * block] @ vb[:, j * block: (j + 1) * block].T
        out += part * sa[:, j][:, None] * sb_rows[:, :, j]
    return out


# ---------------------------------------------------------------------------------------------
# tcgen05.cp
# ---------------------------------------------------------------------------------------------

_CP_CACHE = {}


def tcgen05_cp(shape, cta_group=1):
    if shape not in layout.TCGEN05_CP_SHAPES:
        raise ValueError(f"tcgen05.cp shape must be one of {list(layout.TCGEN05_CP_SHAPES)}, "
                         f"got {shape!r}")
    family._check_cta_group("tcgen05_cp", cta_group)
    key = (shape, cta_group)
    if key not in _CP_CACHE:
        _CP_CACHE[key] = _build_cp(shape, cta_group)
    return _CP_CACHE[key]


def _build_cp(shape, cta_group):
    op = f"tcgen05.cp.cta_group::{cta_group}.{shape}"
    rows, row_bytes = layout.TCGEN05_CP_SHAPES[shape]
    lane_map = layout.cp_lane_map(shape)
    words = row_bytes // 4

    def cp(taddr, s_desc):
        thread = current()
        if cta_group != 1:
            raise EmulationError(f"{thread.where()}: {op}: cta_group::2 is not emulated")
        with thread.launch.cond:
            tmem = tmem_of(thread.block)
            lane0, col = layout.decode_tmem_address(taddr)
            dst = np.array([[lane0 + x for x in lanes] for lanes in lane_map])  # (rows, copies)
            region = ((int(dst.min()), int(dst.max())), (col, col + words - 1))
            _check_cells(thread, op, tmem, taddr, *region)
            raw = _smem_bytes(thread, op, s_desc, "K", rows, 1, row_bytes, "source")
            data = np.ascontiguousarray(raw).view(np.uint32)  # (rows, words)
            for c in range(dst.shape[1]):
                tmem.cells[dst[:, c][:, None], col + np.arange(words)[None, :]] = data
            tmem.pending.setdefault(thread, []).append((op,) + region)

    cp.__name__ = "tcgen05_cp_" + shape.replace(".", "_").replace("::", "_")
    return cp


# ---------------------------------------------------------------------------------------------
# tcgen05.commit
# ---------------------------------------------------------------------------------------------


def tcgen05_commit_op(cta_group=1, multicast=False):
    family._check_cta_group("tcgen05_commit_op", cta_group)
    op = (f"tcgen05.commit.cta_group::{cta_group}.mbarrier::arrive::one.shared::cluster"
          f"{'.multicast::cluster' if multicast else ''}.b64")

    def arrive(bars, index, cta_mask):
        from intrinsics.emulate.cluster import peer_block

        thread = current()
        address = barrier_address(op, bars, index)
        launch = thread.launch
        if multicast:
            mask = int(cta_mask) & 0xFFFF
            blocks = [peer_block(thread, r, op) for r in range(16) if mask >> r & 1]
        else:
            blocks = [thread.block]
        with launch.cond:
            tmem = tmem_of(thread.block)
            tmem.pending.pop(thread, None)  # everything this thread issued is complete now
            for block in blocks:
                barrier = barrier_at(thread, block, address, op)
                if barrier.pending < 1:
                    raise EmulationError(
                        f"{thread.where()}: {op}: the arrive on {barrier.describe()} would make "
                        "more arrivals than are pending in this phase")
                barrier.pending -= 1
                barrier.complete_if_done(thread, op)
            _progress(launch)

    if multicast:
        def commit(bars, index, cta_mask):
            arrive(bars, index, cta_mask)
    else:
        def commit(bars, index):
            arrive(bars, index, None)
    commit.__name__ = (f"tcgen05_commit{'_multicast' if multicast else ''}"
                       f"{'_cg2' if cta_group == 2 else ''}")
    return commit


# ---------------------------------------------------------------------------------------------
# Exit check: every allocation freed before the CTA ends
# ---------------------------------------------------------------------------------------------


def _check_exit(block):
    tmem = block.state.get(_KEY)
    if tmem is None or not tmem.allocs:
        return
    start, (ncols, thread) = sorted(tmem.allocs.items())[0]
    raise EmulationError(
        f"{thread.where()}: the CTA exited with tensor memory still allocated: {ncols} columns "
        f"at {_addr(start)} (columns {start}..{start + ncols - 1}; {tmem.describe()}), allocated "
        "by this warp's tcgen05.alloc; every allocation must be freed with tcgen05.dealloc "
        "before the kernel exits")


def _install_hooks():
    # NOTE: the runtime has no per-launch exit hook; like intrinsics/emulate/wgmma.py this wraps
    # Launch._run_cluster (keeping any earlier wrapper's marks).
    launch = runtime.Launch
    if getattr(launch._run_cluster, "checks_tcgen05_exit", False):
        return
    original = launch._run_cluster

    def run_cluster(self, cluster, args):
        original(self, cluster, args)
        for block in cluster.blocks:
            _check_exit(block)

    run_cluster.__dict__.update(getattr(original, "__dict__", {}))
    run_cluster.checks_tcgen05_exit = True
    launch._run_cluster = run_cluster


from intrinsics.emulate import ACTIVE as _ACTIVE  # noqa: E402

if _ACTIVE:
    _install_hooks()


def _variants(factory, name):
    return {name: factory(1), name + "_cg2": factory(2)}


EMULATIONS = {
    **_variants(tcgen05_alloc_op, "tcgen05_alloc"),
    **_variants(tcgen05_dealloc_op, "tcgen05_dealloc"),
    **_variants(tcgen05_relinquish_alloc_permit_op, "tcgen05_relinquish_alloc_permit"),
    "tcgen05_commit": tcgen05_commit_op(1),
    "tcgen05_commit_cg2": tcgen05_commit_op(2),
    "tcgen05_commit_multicast": tcgen05_commit_op(1, True),
    "tcgen05_commit_multicast_cg2": tcgen05_commit_op(2, True),
    "tcgen05_wait_ld": tcgen05_wait_ld,
    "tcgen05_wait_ld_regs": tcgen05_wait_ld_regs,
    "tcgen05_wait_st": tcgen05_wait_st,
    "tcgen05_fence_before_thread_sync": tcgen05_fence_before_thread_sync,
    "tcgen05_fence_after_thread_sync": tcgen05_fence_after_thread_sync,
}
FACTORIES = {
    "tcgen05_alloc_op": tcgen05_alloc_op,
    "tcgen05_dealloc_op": tcgen05_dealloc_op,
    "tcgen05_relinquish_alloc_permit_op": tcgen05_relinquish_alloc_permit_op,
    "tcgen05_commit_op": tcgen05_commit_op,
    "tcgen05_mma": tcgen05_mma,
    "tcgen05_ld": tcgen05_ld,
    "tcgen05_st": tcgen05_st,
    "tcgen05_cp": tcgen05_cp,
}
