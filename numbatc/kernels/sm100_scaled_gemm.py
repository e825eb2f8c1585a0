"""The block-scaled Blackwell GEMM (sm_100a): MXFP8 and NVFP4 operands with per-block scale
factors, TMA -> tcgen05.cp (scales to tensor memory) -> block-scaled tcgen05.mma -> tcgen05.ld
epilogue, warp-specialised as sm100_gemm (whose prologue, epilogue warps and teardown it shares),
fp32 accumulation and the shared fused epilogue (alpha, beta * C, bias, activation, user
epilogues).

NOTE: there is no Blackwell GPU here.  This kernel is verified by assembling it for sm_100a and
by running it in the CPU emulation (tests/emulation/test_gemm_block_scaled_emulated.py), whose
scale-factor layout in tensor memory is itself a model (intrinsics.tcgen05.scale_factor_coords:
CUTLASS's and DeepGEMM's usage, not an ISA figure); it has never run on hardware.

Formats (``ScaledVariant.fmt``)::

    mxfp8  A, B e4m3 or e5m2 (each its own), one ue8m0 scale per 32 K values of a row;
           tcgen05.mma kind::mxf8f6f4 (scale_vec 1X), K = 32 per instruction
    nvfp4  A, B e2m1 packed two per byte (the lower K in the low nibble), one ue4m3 scale per
           16 K values; tcgen05.mma kind::mxf4nvf4.block_scale.scale_vec::4X, K = 64

A k tile is 128 bytes of K for every row of A and of B (128 fp8 or 256 fp4 values: one 128-byte
swizzle row, as the TMA box (rows, 128 bytes) with 128B swizzle writes it), i.e. four MMA
instructions, each reading 32 bytes of K per row and 1 (mxfp8) or 4 (nvfp4) scale bytes.

Scale factors.  Once per call, :func:`scale_chunks` rearranges each operand's (rows, blocks)
scale bytes into 512-byte chunks of 128 rows x 4 blocks -- row r, block j at byte
16*(r%32) + 4*(r/32) + j, the layout ``tcgen05.cp.32x128b.warpx4`` copies into 4 TMEM columns
of all 128 lanes -- ordered [k tile][group of 128 rows][chunk of the k tile], so that one
``cp.async.bulk`` per operand and stage brings the k tile's chunks (CPK = 1 (mxfp8) or 4 (nvfp4)
per 128 rows) next to its A and B tiles.  The MMA thread copies them to TMEM with tcgen05.cp
and points each MMA at them (sfa_id/sfb_id select the byte of the cell)::

    TMEM columns  0 .. BN-1                 the f32 accumulator (lane = tile row)
                  BN + 4c                   SFA chunk c of the k tile (c < CPK)
                  BN + 4*CPK + 4*(c*NH + h) SFB chunk c, rows 128h.. of the B tile (NH = BN/128)

    block = 192 threads = 6 warps, one CTA per (BM=128) x BN output tile (as sm100_gemm)
      warps 0-3  epilogue   wait acc -> tcgen05.ld 32x32b -> store_pair
      warp 4     producer   lane 0: wait empty[s] -> expect_tx -> TMA A, TMA B, bulk SFA, SFB
      warp 5     MMA        lane 0: wait full[s] -> tcgen05.cp x CPK*(1+NH) -> 4 x tcgen05.mma
                            -> tcgen05.commit -> empty[s]; after the last tile commit -> acc

Layouts: A (M, K) row-major and B K-major ((K, N) column-major: ``w.T`` of a row-major (N, K)
weight), 16-byte aligned rows (:func:`launch` packs operands that are not); K a multiple of 32.
TMA zero-fills rows beyond M and N and bytes beyond K; the chunks of scales beyond them are 0.

First version, correctness first: one output tile per CTA, each epilogue thread stores its own
row, no 2-CTA MMA, no TMA multicast, BN 128 or 256 only (a B chunk is 128 rows).
"""

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda

from numbatc.kernels import build, epilogue, operands, sm100_gemm

__all__ = ["FORMATS", "ScaledFormat", "ScaledConfig", "ScaledVariant", "CONFIGS", "kernel_for",
           "kernel_source", "launch", "grid_for", "signature", "tensor_maps", "chunk_groups",
           "scale_chunks", "scale_chunks_host"]

_THREADS = 192
_SWIZZLE = 128
_K_BYTES = 128  # bytes of K per row per k tile: one 128B swizzle row
_CHUNK = 512  # bytes of one scale-factor chunk: 128 rows x 4 blocks


@dataclass(frozen=True)
class ScaledFormat:
    """One block-scaled format: the tcgen05.mma kind and scale vector, the scale type, the K
    values one scale covers and how many values a byte holds."""

    name: str
    kind: str
    scale_vec: object
    scale: str
    block: int
    per_byte: int

    @property
    def per_instruction(self):
        """Scale factors per row per MMA instruction (32 bytes of K)."""
        return 32 * self.per_byte // self.block

    @property
    def bk(self):
        """K values per k tile."""
        return _K_BYTES * self.per_byte


FORMATS = {
    f.name: f
    for f in (
        ScaledFormat("mxfp8", "mxf8f6f4", None, "ue8m0", 32, 1),
        ScaledFormat("nvfp4", "mxf4nvf4", "4X", "ue4m3", 16, 2),
    )
}


@dataclass(frozen=True)
class ScaledConfig:
    """Format, tile width BN and pipeline depth (BM = 128 rows, 128 bytes of K a stage)."""

    name: str
    fmt: str
    bn: int
    stages: int
    bm: int = 128

    def __post_init__(self):
        problems = []
        if self.fmt not in FORMATS:
            problems.append(f"fmt must be one of {sorted(FORMATS)}, got {self.fmt!r}")
        if self.bm != 128:
            problems.append(f"bm must be 128 (block-scaled tcgen05.mma M = 128), got {self.bm}")
        if self.bn not in (128, 256):
            problems.append(f"bn must be 128 or 256 (whole 128-row scale-factor chunks of B), "
                            f"got {self.bn}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if not problems and self.shared_bytes > 227 * 1024:
            problems.append(f"{self.shared_bytes} bytes of shared memory exceed 227 KB")
        if problems:
            raise ValueError(f"invalid sm100 block-scaled GEMM config {self.name}: "
                             + "; ".join(problems))

    @property
    def threads(self):
        return _THREADS

    @property
    def format(self):
        return FORMATS[self.fmt]

    @property
    def bk(self):
        return self.format.bk

    @property
    def chunks(self):
        """CPK: scale-factor chunks per 128 rows per k tile (4 instructions' scales / 4)."""
        return self.format.per_instruction

    @property
    def groups_b(self):
        """NH: 128-row groups in a B tile."""
        return self.bn // 128

    @property
    def a_bytes(self):
        return self.bm * _K_BYTES

    @property
    def b_bytes(self):
        return self.bn * _K_BYTES

    @property
    def sfa_bytes(self):
        return self.chunks * _CHUNK

    @property
    def sfb_bytes(self):
        return self.groups_b * self.chunks * _CHUNK

    @property
    def payload_bytes(self):
        """Bytes one stage receives (the full barrier's transaction count)."""
        return self.a_bytes + self.b_bytes + self.sfa_bytes + self.sfb_bytes

    @property
    def stage_bytes(self):
        """A stage, rounded up to 1024 bytes (each stage's A starts 1024-aligned: 128B swizzle)."""
        return -(-self.payload_bytes // 1024) * 1024

    @property
    def shared_bytes(self):
        return self.stages * self.stage_bytes

    @property
    def sf_columns(self):
        return 4 * self.chunks * (1 + self.groups_b)

    @property
    def tmem_cols(self):
        """The TMEM allocation: accumulator and scale factors, rounded up to a power of two."""
        need = self.bn + self.sf_columns
        return max(32, 1 << (need - 1).bit_length())


CONFIGS = {
    c.name: c
    for c in (
        ScaledConfig("mxfp8_128x256_4s", "mxfp8", 256, 4),
        ScaledConfig("mxfp8_128x128_6s", "mxfp8", 128, 6),
        ScaledConfig("nvfp4_128x256_4s", "nvfp4", 256, 4),
        ScaledConfig("nvfp4_128x128_6s", "nvfp4", 128, 6),
    )
}


@dataclass(frozen=True)
class ScaledVariant:
    """What the kernel is specialised for besides the tile: the format, each operand's element
    type ('e4m3' | 'e5m2' for mxfp8, 'e2m1' for nvfp4) and the epilogue (as GemmVariant)."""

    fmt: str
    a_type: str
    b_type: str
    out_dtype: str
    c_dtype: str | None = None
    bias_dtype: str | None = None
    activation: str | None = None
    out_layout: str = "row"
    c_layout: str = "row"
    epilogue: object = None
    epilogue_args: int = 0

    def __post_init__(self):
        types = ("e2m1",) if self.fmt == "nvfp4" else ("e4m3", "e5m2")
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {sorted(FORMATS)}, got {self.fmt!r}")
        for what, t in (("a_type", self.a_type), ("b_type", self.b_type)):
            if t not in types:
                raise ValueError(f"{self.fmt} takes {what} {' or '.join(types)}, got {t!r}")

    @property
    def epilogue_variant(self):
        """The GEMM variant whose epilogue (store_pair) and c/bias/out argument types this
        kernel uses; its operand fields are placeholders (this kernel reads A and B by TMA)."""
        return epilogue.GemmVariant("row", "col", "bfloat16", self.out_dtype, self.c_dtype,
                                     self.bias_dtype, self.activation, self.out_layout,
                                     self.c_layout, self.epilogue, self.epilogue_args)


def _layout(rows):
    from intrinsics.layout import SmemLayout

    return SmemLayout("K", _SWIZZLE, rows, _K_BYTES, 1)


def kernel_source(cfg: ScaledConfig, var: ScaledVariant) -> str:
    """Python source of the kernel for one configuration and variant."""
    from intrinsics.layout import make_instr_desc_block_scaled_host

    if cfg.fmt != var.fmt:
        raise ValueError(f"config {cfg.name} is for {cfg.fmt}, the variant is {var.fmt}")
    f = cfg.format
    BM, BN, BK, S = cfg.bm, cfg.bn, cfg.bk, cfg.stages
    CPK, NH = cfg.chunks, cfg.groups_b
    la, lb = _layout(BM), _layout(BN)
    count = f.per_instruction
    ea = ", eargs" if var.epilogue is not None else ""
    words = cfg.stage_bytes // 4
    b_w = cfg.a_bytes // 4
    sfa_w = (cfg.a_bytes + cfg.b_bytes) // 4
    sfb_w = sfa_w + cfg.sfa_bytes // 4
    sfa_col, sfb_col = BN, BN + 4 * CPK
    vec = f"scale_vec={f.scale_vec!r}" if f.scale_vec else "scale_vec=None"
    lines = []
    w = lines.append
    w(f'''"""Generated by numbatc.kernels.sm100_scaled_gemm for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

MMA = nt.tcgen05_mma("{f.kind}", {vec})
CP = nt.tcgen05_cp("32x128b.warpx4")
LD = nt.tcgen05_ld("32x32b", 32)
# kind::{f.kind}, {var.a_type} x {var.b_type} -> f32, {f.scale} scales, M={BM}, N={BN}, K-major;
# instruction i of a k tile reads scale bytes {count}*i.. = chunk ({count}*i)//4, byte ({count}*i)%4''')
    for i in range(4):
        sf_id = (count * i) % 4
        idesc = make_instr_desc_block_scaled_host(
            f.kind, var.a_type, var.b_type, f.scale, m=BM, n=BN, scale_vec=f.scale_vec,
            sfa_id=sf_id, sfb_id=sf_id)
        w(f"IDESC_{i} = np.uint32({idesc:#x})  # sfa_id = sfb_id = {sf_id}")
    w(epilogue.epilogue_source(var.epilogue_variant))
    w(f'''

@cuda.jit(cache={var.epilogue is None}, launch_bounds=({_THREADS}, 1))
def gemm_kernel(tma_a, tma_b, sfa, sfb, c, bias, out, M, N, K, ldc, ldo, alpha, beta, group_m{ea}):
    # {S} stages of [A ({BM}, {_K_BYTES} B) | B ({BN}, {_K_BYTES} B) | SFA {CPK} x {_CHUNK} B | SFB {NH * CPK} x {_CHUNK} B],
    # A and B K-major with 128B swizzle, {cfg.stage_bytes} bytes each ({words} words); K counts
    # {f.name} values ({BK} a k tile)''')
    sm100_gemm.prologue_source(
        w, cfg, BK, cfg.tmem_cols,
        f"accumulator ({BN} columns), then {cfg.sf_columns} of scale factors")
    w(f'''    if warp == {sm100_gemm.PRODUCER_WARP}:
        # ---- producer: one thread issues the TMA loads and the scale chunks' bulk copies -----
        if lane == 0:
            for kt in range(k_tiles):
                s = kt % {S}
                nt.mbarrier_wait_parity(bars, {S} + s, ((kt // {S}) + 1) & 1)
                nt.mbarrier_arrive_expect_tx(bars, s, {cfg.payload_bytes})
                nt.tma_load(smem, s * {words}, tma_a, (kt * {_K_BYTES}, m0), bars, s)
                nt.tma_load(smem, s * {words} + {b_w}, tma_b, (kt * {_K_BYTES}, n0), bars, s)
                # the chunks of k tile kt: [kt][row group][chunk], {CPK} chunks per 128 rows
                nt.bulk_copy_g2s(smem, s * {words} + {sfa_w}, sfa,
                                 (kt * tiles_m + m0 // {BM}) * {cfg.sfa_bytes}, {cfg.sfa_bytes}, bars, s)
                nt.bulk_copy_g2s(smem, s * {words} + {sfb_w}, sfb,
                                 (kt * tiles_n + n0 // {BN}) * {cfg.sfb_bytes}, {cfg.sfb_bytes}, bars, s)
    elif warp == {sm100_gemm.MMA_WARP}:
        # ---- MMA: one thread copies the scales to TMEM and issues tcgen05.mma -----------------
        # NOTE: tcgen05.cp and tcgen05.mma issued by one thread execute in issue order, so the
        # next k tile's tcgen05.cp into the same scale columns follows this tile's MMAs (one set
        # of scale columns, as DeepGEMM's sm100 kernels keep).
        if lane == 0:
            for kt in range(k_tiles):
                s = kt % {S}
                nt.mbarrier_wait_parity(bars, s, (kt // {S}) & 1)
                nt.tcgen05_fence_after_thread_sync()
                base = s * {words}
                # chunks: 32 rows x 16 bytes, K-major without swizzle (LBO 16, SBO 128)''')
    for c in range(CPK):
        w(f"                CP(d + {sfa_col + 4 * c}, nt.umma_smem_desc(smem, base + "
          f"{sfa_w + c * _CHUNK // 4}, 16, 128, 0))  # SFA chunk {c}")
    for h in range(NH):
        for c in range(CPK):
            w(f"                CP(d + {sfb_col + 4 * (c * NH + h)}, nt.umma_smem_desc(smem, base + "
              f"{sfb_w + (h * CPK + c) * _CHUNK // 4}, 16, 128, 0))  # SFB chunk {c}, rows "
              f"{128 * h}..")
    for i in range(4):
        a_off = la.k_offset(32 * i) // 4
        b_off = b_w + lb.k_offset(32 * i) // 4
        chunk = (count * i) // 4
        acc = "kt > 0" if i == 0 else "1"
        w(f"                MMA(d, nt.umma_smem_desc(smem, base + {a_off}, {la.lbo}, {la.sbo}, "
          f"{_SWIZZLE}), nt.umma_smem_desc(smem, base + {b_off}, {lb.lbo}, {lb.sbo}, "
          f"{_SWIZZLE}), IDESC_{i}, d + {sfa_col + 4 * chunk}, d + {sfb_col + 4 * NH * chunk}, "
          f"{acc})")
    sm100_gemm.epilogue_warps_source(w, cfg, cfg.tmem_cols, ea)
    return "\n".join(lines) + "\n"


@functools.cache
def kernel_for(cfg: ScaledConfig, var: ScaledVariant):
    """The compiled-on-demand kernel for (cfg, var) (see build.load_generated); a variant
    with a user epilogue is compiled in this process only."""
    extra = {} if var.epilogue is None else {"USER_EPILOGUE": var.epilogue}
    return build.load_generated("sm100_scaled_gemm", kernel_source(cfg, var), **extra)


def grid_for(cfg: ScaledConfig, m: int, n: int):
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


@functools.cache
def signature(var: ScaledVariant):
    """Argument types on the GPU: the two tensor maps (passed by value, TensorMap.param:
    intrinsics.grid_constant), the two scale-chunk buffers (uint8[:]), then c, bias, out and
    the scalars as in sm100_gemm."""
    from numba import types

    from intrinsics.grid_constant import tensormap_param as tmap

    base = epilogue.signature(var.epilogue_variant)
    chunks = types.Array(types.uint8, 1, "C")
    return (tmap, tmap, chunks, chunks) + base[2:8] + base[10:]


def tensor_maps(cfg: ScaledConfig, a_view, b_view):
    """(TMA map of A, of B) over the raw bytes: boxes of (BM, 128) and (BN, 128) bytes, 128B
    swizzle, zero fill.  ``a_view`` is (M, K bytes) row-major uint8, ``b_view`` (K bytes, N)
    column-major (its transpose is row-major)."""
    from intrinsics.tensormap import TensorMap
    from numbatc.interop.views import transpose_view

    ta = TensorMap.tiled(a_view, (cfg.bm, _K_BYTES), dtype="u8", swizzle=_SWIZZLE)
    tb = TensorMap.tiled(transpose_view(b_view), (cfg.bn, _K_BYTES), dtype="u8",
                         swizzle=_SWIZZLE)
    return ta, tb


# ---------------------------------------------------------------------------------------------
# Scale factors: (rows, blocks) -> 512-byte chunks, [k tile][group of 128 rows][chunk]
# ---------------------------------------------------------------------------------------------


def chunk_groups(cfg: ScaledConfig, m: int, n: int) -> tuple:
    """(groups of A's chunk buffer, groups of B's): ceil(M / 128), and ceil(N / BN) * BN / 128
    (whole B tiles, so that a tile's groups are one contiguous run)."""
    return (m + cfg.bm - 1) // cfg.bm, (n + cfg.bn - 1) // cfg.bn * cfg.groups_b


def scale_chunks_host(scales, groups, k_tiles, cpk):
    """The chunk buffer (uint8, k_tiles * groups * cpk * 512 bytes) of ``scales`` (rows, blocks)
    uint8 codes: scale (row, block) of group g = row // 128, k tile kt and chunk c (block =
    4 * (kt * cpk + c) + j) at byte 16 * (row % 32) + 4 * ((row % 128) // 32) + j of chunk
    (kt, g, c); rows and blocks beyond the scales' are 0."""
    scales = np.asarray(scales, dtype=np.uint8)
    rows, blocks = scales.shape
    padded = np.zeros((groups * 128, k_tiles * cpk * 4), np.uint8)
    padded[:rows, :blocks] = scales
    x = padded.reshape(groups, 4, 32, k_tiles, cpk, 4)  # g, q = (r%128)//32, p = r%32, kt, c, j
    return np.ascontiguousarray(x.transpose(3, 0, 4, 2, 1, 5)).reshape(-1)


@cuda.jit
def _scale_chunks_kernel(src, dst, groups, cpk):
    """dst byte i of the chunk buffer from src (rows, blocks), as scale_chunks_host."""
    i = cuda.grid(1)
    if i < dst.size:
        byte = i % 512
        chunk = i // 512  # (kt * groups + g) * cpk + c
        c = chunk % cpk
        g = (chunk // cpk) % groups
        kt = chunk // (cpk * groups)
        row = g * 128 + 32 * ((byte % 16) // 4) + byte // 16
        block = 4 * (kt * cpk + c) + byte % 4
        if row < src.shape[0] and block < src.shape[1]:
            dst[i] = src[row, block]
        else:
            dst[i] = 0


def scale_chunks(scales, groups, k_tiles, cpk, stream=0, device=None):
    """The chunk buffer of a (rows, blocks) uint8 device array ``scales`` (any strides), as a
    new uint8 device array: rearranged on the GPU by a small kernel (``device=True``, the
    default outside the emulation) or on the host (NumPy, the emulation's path)."""
    from numba import config

    if device is None:
        device = not config.ENABLE_CUDASIM
    size = k_tiles * groups * cpk * _CHUNK
    if not device:
        host = scales.copy_to_host(stream=stream)
        return cuda.to_device(scale_chunks_host(host, groups, k_tiles, cpk), stream=stream)
    dst = cuda.device_array(size, dtype=np.uint8, stream=stream)
    _scale_chunks_kernel[(size + 255) // 256, 256, stream](scales, dst, groups, cpk)
    return dst


def launch_flat(cfg: ScaledConfig, var: ScaledVariant, tma_a, tma_b, sfa, sfb, c, bias, out, m,
                n, k, ldc, ldo, alpha, beta, stream=0, group_m=8, epilogue_args=()):
    """Launch the kernel: ``tma_a``/``tma_b`` the tensor maps' ``.param``, ``sfa``/``sfb``
    the chunk buffers (:func:`scale_chunks`; A's with ceil(M/128) groups, B's with
    ceil(N/BN) * BN/128), c, bias and out flat as in sm80_gemm.launch_flat; ``k`` counts
    values."""

    from intrinsics import launch as launching

    kernel = kernel_for(cfg, var)
    args = (tma_a, tma_b, sfa, sfb, c, bias, out, m, n, k, ldc, ldo, np.float32(alpha),
            np.float32(beta), group_m)
    args, sig = epilogue.with_epilogue_args(kernel, var, args, signature(var), epilogue_args)
    launching.launch(kernel, grid_for(cfg, m, n), cfg.threads, args,
                     shared_bytes=cfg.shared_bytes, stream=stream, signature=sig)


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (numbatc.kernels.dispatch walks them): from a
# numbatc.gemm_api.GemmProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute GEMM problem ``p``, or None: block-scaled (MXFP8, NVFP4)
    K-major operands, K >= 1."""
    if p.block_scaled is None:
        return "sm100_scaled_gemm takes block-scaled operands (MXFP8, NVFP4) only"
    if p.k == 0:
        return "K == 0 (a user epilogue without a product) is not implemented"
    return None


def choose(p, name=None):
    """The configuration for block-scaled problem ``p`` (``name``: one of its format's CONFIGS,
    forced): 128 x 256 tiles (4 stages) for N > 128, else 128 x 128 (6 stages)."""
    fmt = p.block_scaled.name
    names = sorted(n for n, c in CONFIGS.items() if c.fmt == fmt)
    name = name or f"{fmt}_128x{256 if p.n > 128 else 128}_{4 if p.n > 128 else 6}s"
    if name not in names:
        raise ValueError(f"no sm100 {fmt.upper()} config {name!r}; choose from {names}")
    return CONFIGS[name]


def compiled(p, cfg: ScaledConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments): the format, each operand's element type and the epilogue."""
    return cfg, _variant(p)


def _variant(p) -> ScaledVariant:
    fmt = p.block_scaled
    return ScaledVariant(
        fmt.name, fmt.element_type(p.in_dtype), fmt.element_type(p.b_dtype), p.out_dtype,
        p.c.dtype if p.c is not None else None, p.bias_dtype, p.activation, p.out.layout,
        p.c.layout if p.c is not None else "row", p.epilogue, len(p.epilogue_args))


def launch(p, cfg: ScaledConfig):
    """Launch ``cfg`` for problem ``p`` on its stream (NOTE: never run on Blackwell hardware):
    tensor maps of A and B (packed first where not 16-byte aligned), the scales rearranged into
    their chunk buffers, c, bias and out as for the other kernels.  No warm relaunch: returns
    None."""
    var = _variant(p)
    keep = []
    out = operands.pointer(p.out, keep)
    a_view, _ = operands.aligned_view(p.a, p.stream)
    b_view, _ = operands.aligned_view(p.b, p.stream)
    ta, tb = tensor_maps(cfg, a_view, b_view)
    groups_a, groups_b = chunk_groups(cfg, p.m, p.n)
    k_tiles = (p.k + cfg.bk - 1) // cfg.bk
    sfa = scale_chunks(p.scale_a.view, groups_a, k_tiles, cfg.chunks, stream=p.stream)
    sfb = scale_chunks(p.scale_b.view, groups_b, k_tiles, cfg.chunks, stream=p.stream)
    keep += [ta, tb, a_view, b_view, sfa, sfb]
    c = operands.pointer(p.c, keep) if p.c is not None else out
    bias = operands.pointer(p.bias, keep) if p.bias is not None else out
    launch_flat(cfg, var, ta.param, tb.param, sfa, sfb, c, bias, out, p.m, p.n, p.k,
                p.c.ld if p.c is not None else 0, p.out.ld, p.alpha, p.beta,
                stream=operands.launch_stream(p), **operands.epilogue_args(p))
    return None
