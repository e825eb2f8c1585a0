"""The Blackwell GEMM (sm_100a): TMA -> tcgen05.mma -> tensor memory -> tcgen05.ld epilogue,
warp-specialised, bf16/f16 in, fp32 accumulation in tensor memory, and the shared fused epilogue
(alpha, beta * C, bias, activation, user epilogues).

NOTE: there is no Blackwell GPU here.  This kernel is verified by assembling it for sm_100a and
by running it in the CPU emulation (tests/emulation/test_sm100_gemm_emulated.py); it has never
run on hardware.  numbatc.gemm uses it on compute capability 10.x.

    block = 192 threads = 6 warps, one CTA per (BM=128) x BN output tile
      warps 0-3  epilogue   wait acc -> tcgen05.ld 32x32b (warp w reads TMEM lanes 32w..32w+31,
                            i.e. rows 32w.. of the tile, 32 columns a load) -> store
      warp 4     producer   lane 0: wait empty[s] -> expect_tx -> TMA A (BM x BK), B (BN x BK)
      warp 5     MMA        lane 0: wait full[s] -> 4 x tcgen05.mma (K = 16 each) ->
                            tcgen05.commit -> empty[s]; after the last tile commit -> acc
      warp 0 also allocates BN columns of tensor memory first and frees them last.

Shared memory, per stage (dynamic, 1024-byte aligned): A (BM, BK=64) and B (BN, BK=64), both
K-major with 64 two-byte elements = one 128-byte swizzle row per M/N row, exactly as the TMA box
(rows, 64) with 128B swizzle writes them; the tcgen05 descriptors use SmemLayout's LBO/SBO and
K offsets.  TMA fills out-of-bounds rows and columns with zeros, so any M, N, K >= 1 works.

Layouts: A must be K-major ('row') and B K-major ('col', e.g. ``w.T`` of a row-major (N, K)
weight); other layouts, and M or N beyond what a tensor map can describe, run sm80_gemm
(:func:`unsupported` says why, NUMBATC_PRINT_CONFIG=1 prints it).  The tensor maps need 16-byte
aligned operand starts and leading dimensions (:func:`launch` packs operands that are not).

First version, correctness first: one output tile per CTA (no persistent scheduler), each
epilogue thread stores its own row (uncoalesced), no 2-CTA (cta_group::2) MMA.
"""

import functools
from dataclasses import dataclass

from numbatc.kernels import build, epilogue, operands

__all__ = ["Sm100Config", "CONFIGS", "check_variant", "kernel_for", "kernel_source", "launch",
           "grid_for", "signature", "prologue_source", "epilogue_warps_source"]

_THREADS = 192
_EPILOGUE_WARPS = 4
PRODUCER_WARP = 4
MMA_WARP = 5
_SWIZZLE = 128


@dataclass(frozen=True)
class Sm100Config:
    """Tile shape (BM x BN x BK) and pipeline depth."""

    name: str
    bn: int
    stages: int
    bm: int = 128
    bk: int = 64

    def __post_init__(self):
        problems = []
        if self.bm != 128:
            problems.append(f"bm must be 128 (tcgen05.mma M = 128, TMEM lane = tile row), got "
                            f"{self.bm}")
        if self.bk != 64:
            problems.append(f"bk must be 64 (one 128-byte swizzle row of bf16/f16), got {self.bk}")
        if self.bn not in (32, 64, 128, 256):
            problems.append(f"bn must be 32, 64, 128 or 256 (a power-of-two TMEM allocation "
                            f"of at least 32 columns, tcgen05 N <= 256), got {self.bn}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if self.shared_bytes > 227 * 1024:
            problems.append(f"{self.shared_bytes} bytes of shared memory exceed 227 KB")
        if problems:
            raise ValueError(f"invalid sm100 GEMM config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return _THREADS

    @property
    def a_bytes(self):
        return self.bm * self.bk * 2

    @property
    def stage_bytes(self):
        return (self.bm + self.bn) * self.bk * 2

    @property
    def shared_bytes(self):
        return self.stages * self.stage_bytes


CONFIGS = {
    c.name: c
    for c in (
        Sm100Config("128x256x64_4s", 256, 4),
        Sm100Config("128x128x64_4s", 128, 4),
        Sm100Config("128x64x64_6s", 64, 6),
    )
}

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def check_variant(var):
    """ValueError naming what this kernel does not implement (:func:`unsupported`'s reason: the
    dispatcher then runs sm80_gemm and prints it)."""
    if var.in_dtype not in _PTX_TYPE:
        raise ValueError(f"sm100_gemm takes bfloat16 or float16 inputs, got {var.in_dtype!r}")
    if var.a_layout != "row" or var.b_layout != "col":
        raise ValueError(f"sm100_gemm takes K-major operands only (a row-major, b column-major, "
                         f"e.g. w.T), got a={var.a_layout!r}, b={var.b_layout!r}")


def _layout(rows):
    from intrinsics.layout import SmemLayout

    return SmemLayout("K", _SWIZZLE, rows, 64, 2)


def kernel_source(cfg: Sm100Config, var) -> str:
    """Python source of the kernel for one configuration and variant."""
    from intrinsics.layout import make_instr_desc_host

    check_variant(var)
    BM, BN, BK, S = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    la, lb = _layout(BM), _layout(BN)
    ptx = _PTX_TYPE[var.in_dtype]
    idesc = make_instr_desc_host("f16", ptx, ptx, "f32", m=BM, n=BN)
    ea = ", eargs" if var.epilogue is not None else ""
    words = cfg.stage_bytes // 4
    lines = []
    w = lines.append
    w(f'''"""Generated by numbatc.kernels.sm100_gemm for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

MMA = nt.tcgen05_mma("f16")
LD = nt.tcgen05_ld("32x32b", 32)
IDESC = np.uint32({idesc:#x})  # kind::f16, {ptx} x {ptx} -> f32, M={BM}, N={BN}, A and B K-major
''')
    w(epilogue.epilogue_source(var))
    w(f'''

@cuda.jit(cache={var.epilogue is None}, launch_bounds=({_THREADS}, 1))
def gemm_kernel(tma_a, tma_b, c, bias, out, M, N, K, ldc, ldo, alpha, beta, group_m{ea}):
    # {S} stages of [A ({BM}, {BK}) | B ({BN}, {BK})] {var.in_dtype}, K-major, 128B swizzle,
    # {cfg.stage_bytes} bytes each ({words} words)''')
    prologue_source(w, cfg, BK, BN, f"128 lanes x {BN} f32 columns: the accumulator")
    w(f'''    if warp == {PRODUCER_WARP}:
        # ---- producer: one thread issues the TMA loads ---------------------------------------
        if lane == 0:
            for kt in range(k_tiles):
                s = kt % {S}
                nt.mbarrier_wait_parity(bars, {S} + s, ((kt // {S}) + 1) & 1)
                nt.mbarrier_arrive_expect_tx(bars, s, {cfg.stage_bytes})
                nt.tma_load(smem, s * {words}, tma_a, (kt * {BK}, m0), bars, s)
                nt.tma_load(smem, s * {words} + {cfg.a_bytes // 4}, tma_b, (kt * {BK}, n0), bars, s)
    elif warp == {MMA_WARP}:
        # ---- MMA: one thread issues tcgen05.mma; commits release stages and the accumulator --
        if lane == 0:
            for kt in range(k_tiles):
                s = kt % {S}
                nt.mbarrier_wait_parity(bars, s, (kt // {S}) & 1)
                nt.tcgen05_fence_after_thread_sync()
                base = s * {words}''')
    for ks in range(BK // 16):
        a_off = la.k_offset(16 * ks) // 4
        b_off = cfg.a_bytes // 4 + lb.k_offset(16 * ks) // 4
        acc = "kt > 0" if ks == 0 else "1"
        w(f"                MMA(d, nt.umma_smem_desc(smem, base + {a_off}, {la.lbo}, {la.sbo}, "
          f"{_SWIZZLE}), nt.umma_smem_desc(smem, base + {b_off}, {lb.lbo}, {lb.sbo}, "
          f"{_SWIZZLE}), IDESC, {acc})")
    epilogue_warps_source(w, cfg, BN, ea)
    return "\n".join(lines) + "\n"


def prologue_source(w, cfg, bk, tmem_cols, what):
    """Emit (through ``w``) the first part of a warp-specialised sm100 kernel's body, shared by
    sm100_gemm and sm100_scaled_gemm: shared memory and barriers, the tile's (m0, n0) after
    GROUP_M rasterisation, ``k_tiles`` for a K tile of ``bk`` elements, barrier init and the
    allocation of ``tmem_cols`` TMEM columns (``what``: the comment saying what they hold)."""
    BM, BN, S = cfg.bm, cfg.bn, cfg.stages
    w(f'''    smem = cuda.shared.array(0, np.uint32, alignment=1024)
    # full[s] = bars[s] (the TMA bytes), empty[s] = bars[{S} + s] (tcgen05.commit after the
    # stage's MMAs), acc = bars[{2 * S}] (tcgen05.commit after the last MMA)
    bars = cuda.shared.array({2 * S + 1}, np.uint64, alignment=8)
    slot = cuda.shared.array(1, np.uint32)  # the TMEM address tcgen05.alloc writes
    t = cuda.threadIdx.x
    warp = t // 32
    lane = t % 32

    # Rasterisation: blocks walk GROUP_M tile-rows at a time so that neighbours share B in L2.
    pid = cuda.blockIdx.x
    tiles_m = (M + {BM - 1}) // {BM}
    tiles_n = (N + {BN - 1}) // {BN}
    in_group = group_m * tiles_n
    first_m = (pid // in_group) * group_m
    size_m = min(tiles_m - first_m, group_m)
    m0 = (first_m + (pid % in_group) % size_m) * {BM}
    n0 = ((pid % in_group) // size_m) * {BN}
    k_tiles = (K + {bk - 1}) // {bk}

    # ---- prologue: barriers, tensor memory -------------------------------------------------
    if t == 0:
        for s in range({S}):
            nt.mbarrier_init(bars, s, 1)
            nt.mbarrier_init(bars, {S} + s, 1)
        nt.mbarrier_init(bars, {2 * S}, 1)
        nt.fence_mbarrier_init()
    if warp == 0:
        nt.tcgen05_alloc(slot, 0, {tmem_cols})  # {what}
        nt.tcgen05_relinquish_alloc_permit()
    nt.tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    nt.tcgen05_fence_after_thread_sync()
    d = slot[0]

    # Phase bookkeeping as sm90_gemm: k tile kt uses stage s = kt % {S} in round r = kt // {S};
    # the producer waits for empty[s] with parity (r + 1) & 1 (a fresh barrier passes at once),
    # the MMA thread for full[s] with parity r & 1.''')


def epilogue_warps_source(w, cfg, tmem_cols, ea):
    """Emit the end of the kernel body after the MMA thread's k loop (inside ``if lane == 0``
    of the MMA warp): the accumulator commit, the epilogue warps (tcgen05.ld 32x32b of the
    BN accumulator columns, epilogue.store_pair) and the TMEM teardown."""
    BN, S = cfg.bn, cfg.stages
    w(f'''                nt.tcgen05_commit(bars, {S} + s)  # stage s free once these MMAs have read it
            nt.tcgen05_commit(bars, {2 * S})  # the accumulator is complete
    else:
        # ---- epilogue warps 0-3: TMEM lanes 32w..32w+31 hold rows 32w.. of the tile --------
        nt.mbarrier_wait_parity(bars, {2 * S}, 0)
        nt.tcgen05_fence_after_thread_sync()
        r = m0 + 32 * warp + lane
        lanes = (32 * warp) << 16''')
    for ch in range(BN // 32):
        w(f"        v = nt.tcgen05_wait_ld_regs(LD(d + lanes + {32 * ch}))  # columns {32 * ch}..{32 * ch + 31}")
        w("        if r < M:")
        for i in range(0, 32, 2):
            w(f"            if n0 + {32 * ch + i} < N:")
            w(f"                store_pair(out, c, bias, r, n0 + {32 * ch + i}, nt.f32_from_bits(v[{i}]), "
              f"nt.f32_from_bits(v[{i + 1}]), N, ldc, ldo, alpha, beta{ea or ', ()'})")
    w(f'''
    # ---- teardown: every TMEM read done before warp 0 frees the columns ---------------------
    nt.tcgen05_fence_before_thread_sync()
    cuda.syncthreads()
    if warp == 0:
        nt.tcgen05_dealloc(d, {tmem_cols})
''')


@functools.cache
def kernel_for(cfg: Sm100Config, var):
    """The compiled-on-demand kernel for (cfg, var) (see build.load_generated); a variant
    with a user epilogue is compiled in this process only."""
    extra = {} if var.epilogue is None else {"USER_EPILOGUE": var.epilogue}
    return build.load_generated("sm100_gemm", kernel_source(cfg, var), **extra)


def grid_for(cfg: Sm100Config, m: int, n: int):
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


@functools.cache
def signature(var):
    """Argument types on the GPU: the two tensor maps (passed by value, TensorMap.param:
    intrinsics.grid_constant), then c, bias and out as typed pointers as in every GEMM kernel
    (epilogue.signature)."""
    from intrinsics.grid_constant import tensormap_param as tmap

    base = epilogue.signature(var)
    return (tmap, tmap) + base[2:5] + (base[5], base[6], base[7]) + base[10:]


def tensor_maps(cfg: Sm100Config, var, a_view, b_view):
    """(TMA map of A, of B): boxes of (BM, 64) and (BN, 64) elements, 128B swizzle, zero fill.
    ``a_view`` is (M, K) row-major, ``b_view`` (K, N) column-major (its transpose, (N, K), is
    row-major): both are described as K-contiguous 2-D tensors."""
    from intrinsics.tensormap import TensorMap
    from numbatc.interop.views import transpose_view

    dt = _PTX_TYPE[var.in_dtype]
    ta = TensorMap.tiled(a_view, (cfg.bm, cfg.bk), dtype=dt, swizzle=_SWIZZLE)
    tb = TensorMap.tiled(transpose_view(b_view), (cfg.bn, cfg.bk), dtype=dt, swizzle=_SWIZZLE)
    return ta, tb


def launch_flat(cfg: Sm100Config, var, tma_a, tma_b, c, bias, out, m, n, k, ldc, ldo, alpha,
                beta, stream=0, group_m=8, epilogue_args=()):
    """Launch the kernel: ``tma_a``/``tma_b`` are the tensor maps' ``.param``, c, bias
    and out flat as in sm80_gemm.launch_flat."""
    import numpy as np

    from intrinsics import launch as launching

    kernel = kernel_for(cfg, var)
    args = (tma_a, tma_b, c, bias, out, m, n, k, ldc, ldo, np.float32(alpha), np.float32(beta),
            group_m)
    args, sig = epilogue.with_epilogue_args(kernel, var, args, signature(var), epilogue_args)
    launching.launch(kernel, grid_for(cfg, m, n), cfg.threads, args,
                     shared_bytes=cfg.shared_bytes, stream=stream, signature=sig)


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (numbatc.kernels.dispatch walks them): from a
# numbatc.gemm_api.GemmProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute GEMM problem ``p``, or None: bf16 / f16 with K-major
    operands, K >= 1."""
    if p.block_scaled is not None or p.tensor_scales is not None:
        return "sm100_gemm takes bfloat16 / float16 operands without scales"
    try:
        check_variant(epilogue.variant_for(p))
    except ValueError as exc:
        return str(exc)
    if p.k == 0:
        return "K == 0"
    return None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced): 128 x 256 tiles
    for N > 128, else 128 x 128."""
    name = name or ("128x256x64_4s" if p.n > 128 else "128x128x64_4s")
    if name not in CONFIGS:
        raise ValueError(f"no sm100 config {name!r}; choose from {sorted(CONFIGS)}")
    return CONFIGS[name]


def compiled(p, cfg: Sm100Config):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments; no split-K)."""
    return cfg, epilogue.variant_for(p)


def launch(p, cfg: Sm100Config):
    """Launch ``cfg`` for problem ``p`` on its stream: tensor maps of A and B (packed first where
    not 16-byte aligned), c, bias and out as for the other kernels.  No warm relaunch yet (the
    maps hold pointers): returns None."""
    keep = []
    out = operands.pointer(p.out, keep)
    a_view, _ = operands.aligned_view(p.a, p.stream)
    b_view, _ = operands.aligned_view(p.b, p.stream)
    var = epilogue.variant_for(p)
    ta, tb = tensor_maps(cfg, var, a_view, b_view)
    keep += [ta, tb, a_view, b_view]
    c = operands.pointer(p.c, keep) if p.c is not None else out
    bias = operands.pointer(p.bias, keep) if p.bias is not None else out
    launch_flat(cfg, var, ta.param, tb.param, c, bias, out, p.m, p.n, p.k,
                p.c.ld if p.c is not None else 0, p.out.ld, p.alpha, p.beta,
                stream=operands.launch_stream(p), **operands.epilogue_args(p))
    return None
