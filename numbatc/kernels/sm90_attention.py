"""The Hopper attention forward kernel (sm_90a), FlashAttention-3 style: warp-specialised, a
cp.async producer warpgroup feeding two wgmma consumer warpgroups through mbarriers; S = Q K^T
and O += P V on the tensor core with the fp32 accumulators in registers; P = softmax(S) never
leaves the registers (it is the A operand of the second wgmma, RS form).

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1); BLOCK_M = 128 query rows
      WG0  producer  setmaxnreg.dec 56   Q once, then per key tile: wait k_empty[s] -> cp.async K
                                         -> arrive k_full[s]; wait v_empty[s] -> V -> v_full[s]
      WG1  consumer  setmaxnreg.inc 224  rows 0..63 of the block, WG2 rows 64..127; per key tile:
      WG2  consumer                      S = Q K^T   wgmma SS m64n{BLOCK_N}k16 (Q, K K-major)
                                         mask, online softmax (fp32, log2 domain, quad shuffles)
                                         O += P V    wgmma RS m64n{head_dim}k16 (V MN-major)

The cp.async producer: each producer thread issues 16-byte ``cp.async`` copies straight into
their 128B-swizzled places and signals the stage's full barrier with
``cp.async.mbarrier.arrive.noinc`` (fires once all of its earlier copies have landed).  Rows past
the end of the sequence are zero-filled (0 source bytes): a zero K row gives a score that the mask
replaces with -inf, a zero V row contributes 0 * 0.  The ``_tma`` configurations load with TMA
tensor copies instead (numbatc.kernels.sm90_attention_tma; the end of this docstring).

Shared memory (dynamic, 1024-byte aligned; every tile on a 1024-byte boundary, so descriptors
have base offset 0), with D = head_dim (64, 96, 128, 192 or 256) and BN = BLOCK_N:

    Q    2 parts (one per consumer) of (64, D) K-major, 128B swizzle      2 x 64 * D * 2 bytes
    K    ``stages`` x (BN, D) K-major (keys = the wgmma N index)            BN * D * 2 each
    V    ``stages`` x (BN keys, D) MN-major (D = the wgmma N index,        BN * D * 2 each
         contiguous): 8-key atoms of 8 x 128 B along D, trans-b 1

(intrinsics.layout.SmemLayout gives the byte layouts, the descriptors' LBO/SBO and K steps; for
D = 64 both K and V tiles are simply 128-byte rows, swizzled.  At D = 96 every tile takes the
64B swizzle instead (:func:`swizzle_for`): rows of 32 columns, three parts per row.)

Register fragments: the m64nBN f32 accumulator of S holds, in thread (warp w, lane l), rows
16w + l/4 (+8) and columns 8j + 2(l%4) (+1) in registers 4j..4j+3
(intrinsics.wgmma.accumulator_coords); the RS A fragment of k16 step c
(intrinsics.wgmma.a_fragment_coords) holds the same rows and columns 16c + 2(l%4) (+1, +8, +9),
so packing S registers 8c..8c+7 pairwise to bf16/f16 (low half = even column) *is* the A operand
of keys 16c..16c+15: no shuffle, no shared memory.

Scheduling: ``overlap=False`` configurations run each tile's two GEMMs and softmax in order.
``overlap=True`` ones (``_ov``) are FlashAttention-3's intra-warpgroup pipeline: the wgmma of
S(n) = Q K(n)^T and that of O += P(n-1) V(n-1) are issued back to back, the consumer waits for
S(n) only (``wgmma_wait_group(1)``) and computes softmax(S(n)) while P(n-1) V(n-1) runs on the
tensor core; O is rescaled once that group retired.

``pingpong=True`` ones (``_pp``, on top of ``_ov``) add FA3's inter-warpgroup ping-pong: the two
consumers take turns issuing their GEMMs, so that one warpgroup's softmax runs while the other's
GEMMs keep the tensor core busy.  Two named barriers over the 256 consumer threads
(intrinsics.barrier; ids 1 and 2 = consumer 0's and 1's): a turn is ``bar.sync own id`` -> issue
the tile's wgmma groups (S(n) = Q K(n)^T, and P(n-1) V(n-1) from the second tile on) -> ``bar.arrive
the other's id``.  Consumer 1 arrives on consumer 0's barrier once before its first turn
(consumer 0 goes first); every warpgroup takes exactly one turn per key tile the block loaded,
empty ones (sync + arrive) for the causal tiles its rows do not see, so both take the same number;
consumer 0 ends with one more ``bar.sync`` that consumes consumer 1's last arrival: every arrive is
matched by a sync and no barrier is left part-full at exit.  The last tile's P V is issued outside
any turn.

Causal (bottom-right aligned, query i sees keys j <= i + Sk - Sq): a block loads the key tiles
its last row sees; each consumer computes the tiles its own rows see and only waits for and
releases the others; only tiles that cross the diagonal or the end of the keys run the masks.
GQA: query head h reads key/value head h // group.  The cp.async configurations' kernel is
generated Python source per (configuration, variant) (:func:`kernel_source` prints it), cached on
disk (numbatc.kernels.build), launched through intrinsics.launch (setmaxnreg: whole-program JIT).

The ``_tma`` configurations replace the cp.async producer with one thread issuing TMA tensor
copies of Q, K and V, and are written as code: numbatc.kernels.sm90_attention_tma.make_kernel
(maps, boxes, byte counts, barriers, persistent tiles, O's TMA stores; the same schedules as
the generated text).  :data:`TMA_BY_DEFAULT` switches the default to them.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np

from intrinsics.setmaxnreg import register_pool
from numbatc.kernels import sm80_attention
from numbatc.kernels.build import load_generated

__all__ = ["Sm90AttnConfig", "CONFIGS", "DEFAULT", "DEFAULT_HEAD_DIMS", "DEFAULT_TMA", "HEAD_DIMS",
           "TMA_BY_DEFAULT", "unsupported", "choose", "compiled", "declines", "launch",
           "choose_config", "div_bn", "kernel_for", "kernel_source", "launch_flat", "resolve",
           "shared_bytes", "signature", "swizzle_for", "twin", "why_chosen", "TMA_STORE_HEAD_DIMS",
           "column_limit_mask"]

AttnVariant = sm80_attention.AttnVariant
LOG2E = sm80_attention.LOG2E
#: head dims this kernel implements (others stay on sm80_attention): Q, K and V tiles of whole
#: swizzle rows (128 bytes, 64 bf16 / f16 columns; 64 bytes at head_dim 96, :func:`swizzle_for`),
#: O's accumulator (D / 2 registers a thread) within the consumers' setmaxnreg budget
HEAD_DIMS = (64, 96, 128, 192, 256)
#: head dims numbatc.attention's default walk sends here (:func:`declines` the others, which
#: then run sm80_attention); ``NUMBATC_ATTN_KERNEL=sm90[:<config>]`` forces any of HEAD_DIMS.
#: 192 and 256 are in since they were added (branch hd256), before their H200 measurements.
DEFAULT_HEAD_DIMS = (64, 96, 128, 192, 256)
#: head dims whose TMA configurations store O through shared memory and TMA
#: (AttnVariant.tma_store); NOTE: at 256 (O: 128 registers a consumer thread) ptxas spilled 36
#: bytes with it (whole program), so 256 keeps the register stores
TMA_STORE_HEAD_DIMS = (64, 96, 128, 192)
#: BLOCK_N values: multiples of 16 (the k16 steps of P V; 8-row swizzle atoms of K) whose
#: m64nBNk16 Q K^T is a legal wgmma (N a multiple of 8 up to 256)
BLOCK_NS = (64, 80, 96, 112, 128, 176, 192)

_THREADS_PER_WG = 128
BLOCK_M = 128  # query rows per block: 64 per consumer warpgroup
# NOTE: ptxas puts the 1024-aligned dynamic window after the static mbarriers, at 1024.
_STATIC_SHARED = 1024
_POOL = register_pool(384)  # registers a (384, 1)-bounded block is launched with
_SHARED_MAX = 227 * 1024  # shared memory an sm_90 block may have


@dataclass(frozen=True)
class Sm90AttnConfig:
    """BLOCK_N keys per tile, the depth of the K and V rings, whether softmax overlaps the P V
    wgmma of the previous tile (see the module docstring), and the setmaxnreg register counts."""

    name: str
    block_n: int
    stages: int = 2
    overlap: bool = False
    # NOTE: sm90_gemm's 40/232 split spilled 8-16 bytes in this producer (it keeps K's and V's
    # pointers, strides and positions across the key loop); 56/224 spills nothing in the
    # overlapped kernel, whose consumers use up to R206 at head_dim 128 (ptxas, whole-program).
    producer_regs: int = 56
    consumer_regs: int = 224
    pingpong: bool = False  # FA3's inter-warpgroup ping-pong (named barriers; needs overlap)
    # P = ex2.approx.ftz(fma(s, scale_log2, -max)): FFMA + MUFU.EX2 per score (intrinsics.
    # fastmath) instead of math.exp2's denormal-scaled ex2 after a separate multiply and subtract
    fast_exp: bool = False
    # "cp_async": 128 producer threads copy 16 bytes each (this module); "tma": one thread issues
    # tensor copies of whole boxes (numbatc.kernels.sm90_attention_tma)
    producer: str = "cp_async"
    # a persistent grid (one block per SM) walking the (batch, head, query block) tiles, longest
    # first under a causal mask (sm90_attention_tma.WORK_TILE); TMA producers only
    persistent: bool = False
    # the head dims it is meant for (tested, and chosen by name): its tiles fit shared memory
    head_dims: tuple = (64, 128)

    def __post_init__(self):
        problems = []
        if self.producer not in ("cp_async", "tma"):
            problems.append(f"producer must be 'cp_async' or 'tma', got {self.producer!r}")
        if self.producer == "tma" and not self.fast_exp:
            # NOTE: the TMA kernels are code (sm90_attention_tma.make_kernel) and take FA3's
            # ex2.approx(fma) only: it measured best or equal-best at every shape (choose_config)
            problems.append("producer='tma' needs fast_exp=True")
        if self.persistent and self.producer != "tma":
            problems.append("persistent needs producer='tma'")
        if self.block_n not in BLOCK_NS:
            problems.append(f"block_n must be one of {BLOCK_NS}, got {self.block_n}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if self.pingpong and not self.overlap:
            problems.append("pingpong needs overlap=True (it is built on the _ov schedule)")
        # NOTE: the pool setmaxnreg redistributes is what the block was launched with: 65536 /
        # 384 rounded down to a multiple of 8 = 168 per thread, 64512 in all (not 65536); an
        # .inc that asks for more than the pool holds waits forever.
        regs = (self.producer_regs + 2 * self.consumer_regs) * _THREADS_PER_WG
        if regs > _POOL:
            problems.append(f"setmaxnreg {self.producer_regs}/{self.consumer_regs} needs {regs} "
                            f"registers, more than the block's {_POOL} (168 per thread)")
        for d in self.head_dims:
            nbytes = shared_bytes(self, d) + _STATIC_SHARED
            if d not in HEAD_DIMS:
                problems.append(f"head_dims must be among {HEAD_DIMS}, got {d}")
            elif nbytes > _SHARED_MAX:
                problems.append(f"head_dim {d} needs {nbytes} bytes of shared memory, more than "
                                "227 KB")
        if problems:
            raise ValueError(f"invalid sm90 attention config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return 3 * _THREADS_PER_WG

    @property
    def block_m(self):
        return BLOCK_M

    @property
    def tma(self):
        return self.producer == "tma"


def shared_bytes(cfg: Sm90AttnConfig, head_dim: int) -> int:
    """Dynamic shared memory: Q, then K x stages, then V x stages; a persistent configuration
    then the (128, head_dim) staging tile of O's TMA stores (Q's buffer, where the other
    configurations stage O, holds the next work tile's Q by then)."""
    staging = BLOCK_M if cfg.persistent else 0
    return (BLOCK_M + 2 * cfg.stages * cfg.block_n + staging) * head_dim * 2


CONFIGS = {
    c.name: c
    for c in (
        # NOTE: ptxas's producer allocation is fickle: the in-order kernel at head_dim 128
        # spills 8 bytes in the producer with 56/224 (and 4 with 72/216) but none with 64/216;
        # tests/test_sm90_attention_compile.py holds every config to 0.
        Sm90AttnConfig("n128_2s", 128, producer_regs=64, consumer_regs=216),
        Sm90AttnConfig("n128_2s_ov", 128, overlap=True),
        Sm90AttnConfig("n64_2s", 64, producer_regs=64, consumer_regs=216),
        Sm90AttnConfig("n64_2s_ov", 64, overlap=True),
        Sm90AttnConfig("n128_3s_ov", 128, stages=3, overlap=True),
        # FA3's inter-warpgroup ping-pong on top of _ov (head_dim 128's default)
        Sm90AttnConfig("n128_2s_ov_pp", 128, overlap=True, pingpong=True),
        Sm90AttnConfig("n64_2s_ov_pp", 64, overlap=True, pingpong=True),
        # the two-instruction exponential (fast_exp); _pp_fx is the default for every head dim
        Sm90AttnConfig("n128_2s_ov_fx", 128, overlap=True, fast_exp=True),
        Sm90AttnConfig("n128_2s_ov_pp_fx", 128, overlap=True, pingpong=True, fast_exp=True,
                       head_dims=(64, 96, 128)),
        # TMA producers (sm90_attention_tma): one thread, so 24 registers; the consumers get 240.
        # Each falls back to its cp.async twin (the name without _tma, else the default) for
        # operands a tensor map cannot describe (see :func:`resolve`).
        # (the in-order schedule: the TMA kernels all take the two-instruction exponential)
        Sm90AttnConfig("n128_2s_fx_tma", 128, fast_exp=True, producer="tma", producer_regs=24,
                       consumer_regs=240),
        Sm90AttnConfig("n128_2s_ov_fx_tma", 128, overlap=True, fast_exp=True, producer="tma",
                       producer_regs=24, consumer_regs=240),
        Sm90AttnConfig("n128_2s_ov_pp_fx_tma", 128, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240,
                       head_dims=(64, 96, 128)),
        Sm90AttnConfig("n128_3s_ov_pp_fx_tma", 128, stages=3, overlap=True, pingpong=True,
                       fast_exp=True, producer="tma", producer_regs=24, consumer_regs=240,
                       head_dims=(64, 96, 128)),
        # persistent: the producer loads the next tile's Q and K/V during this one's epilogue
        Sm90AttnConfig("n128_2s_ov_pp_fx_tma_pt", 128, overlap=True, pingpong=True,
                       fast_exp=True, producer="tma", producer_regs=24, consumer_regs=240,
                       persistent=True, head_dims=(64, 96, 128)),
        # head_dim 256 (FA3's tiles: 128 x 80, 2 stages): O is 128 registers a consumer thread,
        # S 40, P 20; Q 64 KB + 2 x (K 40 KB + V 40 KB) = 224 KB of shared memory.
        Sm90AttnConfig("n80_2s_ov_pp_fx_tma", 80, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240, head_dims=(256,)),
        Sm90AttnConfig("n80_2s_ov_fx_tma", 80, overlap=True, fast_exp=True, producer="tma",
                       producer_regs=24, consumer_regs=240, head_dims=(256,)),
        Sm90AttnConfig("n80_2s_ov_pp_fx", 80, overlap=True, pingpong=True, fast_exp=True,
                       producer_regs=40, consumer_regs=232, head_dims=(256,)),
        Sm90AttnConfig("n64_2s_ov_pp_fx", 64, overlap=True, pingpong=True, fast_exp=True,
                       head_dims=(256,)),
        Sm90AttnConfig("n64_2s_ov_pp_fx_tma", 64, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240, head_dims=(256,)),
        # head_dim 64 with longer key tiles (FA3 takes 176 keys at 64 when not causal, with
        # three consumer warpgroups): S 88 registers, P 44, O 32; 104 KB (LONG_KEY_TILES)
        Sm90AttnConfig("n176_2s_ov_pp_fx_tma", 176, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240,
                       head_dims=(64, 96, 128)),
        # head_dim 192 (FA3's 128 x 112): O 96 registers, S 56, P 28; 216 KB
        Sm90AttnConfig("n112_2s_ov_pp_fx_tma", 112, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240, head_dims=(192,)),
        Sm90AttnConfig("n112_2s_ov_pp_fx", 112, overlap=True, pingpong=True, fast_exp=True,
                       head_dims=(192,)),
    )
}

#: The switch: True makes :func:`choose_config` return the TMA configuration (DEFAULT_TMA) for
#: every head dim; False keeps the cp.async one (DEFAULT).  True since 2026-12-02, measured on
#: the H200 (bench attention --shapes quick, same run, bf16; TFLOP/s TMA / cp.async): hd64
#: S1024 288.9 / 273.8 (causal 189.2 / 180.0), S4096 376.1 / 362.7 (319.0 / 298.8); hd128 S1024
#: 401.7 / 356.0 (268.5 / 249.5), S4096 583.1 / 508.4 (467.6 / 414.5); and the TMA default
#: passed the attention GPU suites (docs/PERFORMANCE.md).  Operands no tensor map describes run
#: the cp.async twin (:func:`resolve`).
TMA_BY_DEFAULT = True
DEFAULT = {64: "n128_2s_ov_pp_fx", 96: "n128_2s_ov_pp_fx", 128: "n128_2s_ov_pp_fx",
           192: "n112_2s_ov_pp_fx", 256: "n80_2s_ov_pp_fx"}
DEFAULT_TMA = {64: "n128_2s_ov_pp_fx_tma", 96: "n128_2s_ov_pp_fx_tma",
               128: "n128_2s_ov_pp_fx_tma", 192: "n112_2s_ov_pp_fx_tma",
               256: "n80_2s_ov_pp_fx_tma"}


#: head_dim -> (configuration, least seqlen_k): the longer key tiles :func:`choose` takes over
#: DEFAULT_TMA without the causal mask (FA3's 176 keys there; it too keeps 128 for causal).
#: Measured on the H200 (docs/PERFORMANCE.md, 2026-12-03: bench attention --shapes hd64 / hd128
#: / hd96, each configuration forced in one run, bf16; TFLOP/s n176 / the default
#: n128_2s_ov_pp_fx_tma):
#:
#:     not causal, seqlen   1024          2048          4096          16384
#:     head_dim 64          330.4 / 331.4               419.6 / 384.7 453.5 / 419.1
#:     head_dim 128         515.3 / 524.8 596.1 / 561.1 638.8 / 615.5 668.4 / 643.3
#:     head_dim 96          434.3 / 443.5               545.0 / 543.6 558.4 / 570.4
#:
#: Causal, n176 lost or tied at every head dim (hd64 1024 / 4096 / 16384: 192.7 / 222.2, 316.1
#: / 356.8, 403.9 / 429.0; hd128 2048: 417.1 / 449.4); head_dim 96 gains nothing; 192-key tiles
#: at 64 measured as n176 at 4096 / 16384 and 273.9 at 1024 (not kept).  Longer tiles take fewer
#: per-tile steps per key (the row max and sum's shuffles, the named barriers, O's rescale); why
#: the causal kernel loses with them was not profiled.  At 2048, head_dim 64 chose n176 in the
#: run that measured hd128 (373.5 TFLOP/s, 0.91x cuDNN).
LONG_KEY_TILES = {64: ("n176_2s_ov_pp_fx_tma", 2048), 128: ("n176_2s_ov_pp_fx_tma", 2048)}


def check_fits(cfg: Sm90AttnConfig, head_dim: int):
    nbytes = shared_bytes(cfg, head_dim) + _STATIC_SHARED
    if nbytes > _SHARED_MAX:
        raise ValueError(f"sm90 attention config {cfg.name} at head_dim {head_dim} needs "
                         f"{nbytes} bytes of shared memory, more than 227 KB")


def choose_config(head_dim: int) -> Sm90AttnConfig:
    """The configuration for a head dim (``NUMBATC_ATTN_KERNEL=sm90:<name>`` forces one).

    BLOCK_N = 128 at head_dim 64 and 128 (FA3's tile for them): the consumers hold O (D / 2
    registers), S (64) and P (32), which fits 232 registers (see tests/test_sm90_attention_compile
    for ptxas's counts).  At 192 and 256 FA3's 112 and 80 (O 96 / 128 registers, S 56 / 40, P 28
    / 20; 2 stages fill 217 / 225 KB of shared memory): ptxas at head_dim 256 (whole program,
    bf16, causal, lse): consumers up to R227 of 240, the TMA producer R19 of 24, the cp.async twin
    (40 / 232) R226 and R31, no spills -- not yet measured on the H200 (DEFAULT_HEAD_DIMS).
    Measured on the H200 (bench attention --shapes quick, each config
    forced, docs/PERFORMANCE.md): the ping-pong schedule with the two-instruction exponential
    (n128_2s_ov_pp_fx) is best or equal-best for both head dims on every long shape (at seqlen
    4096 hd128 429.6 / 325.4 TFLOP/s not causal / causal against 421.5 / 313.2 for _pp, hd64
    323.7 / 251.3 against 307.2 / 227.1 for _ov)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"sm90_attention implements head_dim {HEAD_DIMS}, got {head_dim}")
    return CONFIGS[(DEFAULT_TMA if TMA_BY_DEFAULT else DEFAULT)[head_dim]]


def twin(cfg: Sm90AttnConfig, head_dim: int) -> Sm90AttnConfig:
    """The cp.async configuration a TMA one falls back to: the same name without ``_tma`` where
    it exists, else the cp.async default for the head dim."""
    return CONFIGS.get(cfg.name.removesuffix("_pt").removesuffix("_tma")) or CONFIGS[DEFAULT[head_dim]]


def resolve(p, cfg: Sm90AttnConfig):
    """(the configuration to launch for problem ``p``, why it is not ``cfg`` or None): a TMA
    configuration falls back to its :func:`twin` where a tensor map cannot describe the
    operands (sm90_attention_tma.unsupported)."""
    if not cfg.tma:
        return cfg, None
    from numbatc.kernels import sm90_attention_tma

    why = sm90_attention_tma.unsupported(p)
    if why is None:
        return cfg, None
    return twin(cfg, p.head_dim), f"not {cfg.name}: {why}"


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def _tup(items):
    """Source of a tuple of ``items``.  NOTE: a literal tuple of more than 30 values compiles
    (CPython 3.11) to BUILD_LIST + LIST_TO_TUPLE, which numba's IR peephole rejects; a sum of
    16-value tuples types as one UniTuple and folds away."""
    parts = [items[i:i + 16] for i in range(0, len(items), 16)]
    return " + ".join("(" + ", ".join(p) + ",)" for p in parts)


def _tree(op, terms):
    """Source of a balanced reduction (shorter dependency chains than a left fold), in
    intrinsics.fastmath.frag_tree_order's pairs -- the order the fragment intrinsics reduce in."""
    from intrinsics.fastmath import frag_tree_order

    def render(node):
        if not isinstance(node, tuple):
            return node
        a, b = render(node[0]), render(node[1])
        return f"({a} + {b})" if op == "+" else f"{op}({a}, {b})"

    return render(frag_tree_order(terms))


def div_bn(x, BN):
    """Source of ``x // BN`` for a non-negative int64 ``x`` below 2**32 (key counts: seqlen_k <
    2**31, see :func:`unsupported`).  NOTE: for a BN that is not a power of two (80, 96, 112) the
    64-bit division by a constant is a 64-bit magic multiply whose temporaries, computed before
    the role branch, must fit the producer's setmaxnreg count with everything else live there:
    at head_dim 256 ptxas spilled n_tiles and Sk - Sq (28-44 bytes) until it was done in 32 bits."""
    if BN & (BN - 1) == 0:
        return f"{x} // {BN}"
    return f"np.int64(np.uint32({x}) // np.uint32({BN}))"


def _layouts(cfg, D):
    """(Q, K stage, V stage) shared layouts and the byte offset of consumer 1's Q rows."""
    from intrinsics.layout import SmemLayout

    sw = swizzle_for(D)
    return (SmemLayout("K", sw, 64, D, 2),             # Q part of one consumer
            SmemLayout("K", sw, cfg.block_n, D, 2),    # K stage
            SmemLayout("MN", sw, D, cfg.block_n, 2),   # V stage (mn = D, k = keys)
            64 * D * 2)                                # consumer 1's Q part


def swizzle_for(D):
    """Bytes of the tiles' shared-memory swizzle at head dim ``D``: 128 (swizzle rows of 64 bf16
    / f16 values) where D is a multiple of 64, else 64 (rows of 32: head_dim 96).  One mode for
    every tile of the kernel: P V's N is all of D, so V's MN-major atoms must tile D exactly (as
    FA3's shared-memory selector picks 64B atoms for head_dim 96)."""
    return 128 if D % 64 == 0 else 64


def _chunks_per_row(D):
    """Producer threads that share one row of a tile in the cp.async loaders: D / 8 (one 16-byte
    chunk each) up to head_dim 128 with the 128B swizzle; otherwise the chunks of one swizzle
    row (8 of 128 B above head_dim 128, 4 of 64 B at 96), each thread copying its chunk of
    every part of the row in turn, so that the rows a thread steps stay a multiple of 8."""
    sw = swizzle_for(D)
    return D // 8 if D <= 128 and sw == 128 else sw // 16


def _loader(w, name, rows, D, delta, half=0):
    """Emit ``load_<name>``: one producer thread's 16-byte cp.async copies of a (rows, D) tile.

    Thread p copies chunk j = p % C of rows r0 + i * STEP (C = _chunks_per_row(D), r0 = p // C <
    STEP = 128 / C, a multiple of 8): in every layout here the shared offset of copy i is the
    thread's swizzled base ``d`` plus a constant ``delta(i * STEP)`` (a swizzle depends on the
    row mod 8 only), and the global index advances by STEP rows per copy.  Where a thread's
    chunks cover one swizzle row only (above head_dim 128: C = 8 of 128 B; head_dim 96: C = 4 of
    64 B) each row step copies chunk j of every part of the row (64 or 32 columns): ``half``
    bytes further in shared memory, a part's columns further in global memory.

    NOTE: as in sm90_gemm's loaders, the producer runs in few registers and LLVM's LICM would
    hoist per-copy invariants out of the key loop (and spill them): STEP * ld and the rows left
    pass through ``wgmma_fence_operand`` (an empty volatile asm, opaque to LLVM) so that
    everything derived from them is computed per tile."""
    cpr = _chunks_per_row(D)
    step = _THREADS_PER_WG // cpr
    count = rows // step
    halves = D // 8 // cpr
    part = swizzle_for(D) // 2  # columns of one swizzle row
    assert step % 8 == 0 and rows % step == 0 and halves * cpr * 8 == D, (step, rows, D)
    w(f"""
@cuda.jit(device=True, forceinline=True)
def load_{name}(smem, d, src, g, ld, rows_left):
    # ({rows}, {D}) tile: {count * halves} copies of 16 bytes per thread, rows r0 + {step} i""" +
      (f" (x {halves} parts)" if halves > 1 else "") + f"""; rows at or
    # past rows_left (counted from r0) are zero-filled
    row_ld = np.int64(nt.wgmma_fence_operand(np.int32({step} * ld)))
    left = np.int64(nt.wgmma_fence_operand(np.int32(max(min(rows_left, {rows}), -1))))""")
    for i in range(count):
        if i:
            w("    g += row_ld")
        if halves == 1:
            w(f"""    if {i * step} < left:
        CP(smem, d + {delta(i * step)}, src, g, 16)
    else:
        CP(smem, d + {delta(i * step)}, src, 0, 0)""")
            continue
        w(f"    if {i * step} < left:")
        for hh in range(halves):
            w(f"        CP(smem, d + {delta(i * step) + hh * half}, src, g + {part * hh}, 16)")
        w("    else:")
        for hh in range(halves):
            w(f"        CP(smem, d + {delta(i * step) + hh * half}, src, 0, 0)")


def column_limit_mask(D: int, BN: int) -> bool:
    """Whether the kernel masks S with FA3's per-row column limit (two int32 limits per thread,
    then one compare per register) rather than by each register's 64-bit key index.  Only where
    the accumulators leave room: at D + BN <= 256 (S and O take D / 2 + BN / 2 <= 128 registers
    a thread) it is fewer instructions and no spill; above (d128 x 176 keys, d192 x 112, d256 x
    80 or 64), ptxas spilled 24-40 bytes in the causal variants with the limits live across the
    tile, so those keep the per-register compare (test_assembles_without_spills_or_serialised_wgmma)."""
    return D + BN <= 256


def kernel_source(cfg: Sm90AttnConfig, var: AttnVariant) -> str:
    """Python source of a cp.async configuration's kernel for one variant (a TMA
    configuration's kernel is code: numbatc.kernels.sm90_attention_tma.make_kernel)."""
    if cfg.tma:
        raise ValueError(f"{cfg.name} is a TMA configuration: its kernel is code "
                         "(numbatc.kernels.sm90_attention_tma.make_kernel), not generated")
    D = var.head_dim
    if D not in HEAD_DIMS:
        raise ValueError(f"sm90_attention implements head_dim {HEAD_DIMS}, got {D}")
    if var.dtype not in _PTX_TYPE:
        raise ValueError(f"sm90_attention takes bfloat16 or float16, got {var.dtype!r}")
    check_fits(cfg, D)
    BN, S = cfg.block_n, cfg.stages
    SW = swizzle_for(D)
    A = SW // 16  # 16-byte chunks of one swizzle row
    ptx = _PTX_TYPE[var.dtype]
    pack = "nt.pack_bf16x2" if var.dtype == "bfloat16" else "nt.pack_f16x2"
    q_lay, k_lay, v_lay, QPB = _layouts(cfg, D)  # QPB: consumer 1's Q rows start here
    QB = BLOCK_M * D * 2
    KB = k_lay.nbytes  # one K (or V) stage
    VB0 = QB + S * KB  # first V stage
    NS, NO, KK = BN // 2, D // 2, BN // 16  # S registers, O registers, k16 steps of P V
    # barrier indices: q_full, k_full[s], v_full[s], k_empty[s], v_empty[s]
    KF, VF, KE, VE = 1, 1 + S, 1 + 2 * S, 1 + 3 * S
    if var.kv_cache:
        raise ValueError("sm90_attention has no KV-cache variant (sm80_attention's)")
    assert not var.tma_store, "TMA stores of O: TMA configurations only"
    rb = sm80_attention.row_bases(var)  # the element offset of row 0 of the block's sequence
    lines = []
    w = lines.append
    w(f'''"""Generated by numbatc.kernels.sm90_attention for {cfg.name}, {var}. Do not edit."""
import math
import numpy as np
from numba import cuda
import intrinsics as nt

QK = nt.wgmma_mma_async({BN}, "{ptx}", acc="f32", trans_a=0, trans_b=0)
PV = nt.wgmma_mma_async({D}, "{ptx}", acc="f32", a_from="reg", trans_b=1)
CP = nt.cp_async_op(16, zfill=True)
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
LN2 = np.float32({math.log(2.0)!r})


{sm80_attention.row_helpers(var)}

{sm80_attention.store_pair_source(var, pack)}''')
    # Loaders.  Q part p = row // 64 of the block, row % 64 within it; K rows SW bytes apart
    # inside each part of SW / 2 columns; V: 8-key atoms of D * 16 bytes.  The parts (above
    # head_dim 128: 64-column halves; at 96 three of 32 columns): Q's and K's K-major ones 64 *
    # SW and BN * SW bytes apart, V's 8 * SW (MN-major: its atoms stack along D).
    _loader(w, "q", BLOCK_M, D, lambda r: (r // 64) * QPB + (r % 64) * SW, 64 * SW)
    _loader(w, "k", BN, D, lambda r: r * SW, BN * SW)
    _loader(w, "v", BN, D, lambda r: (r // 8) * D * 16, 8 * SW)

    def softmax(ind, masked_cond, pack_p=True):
        """Source: mask S (when masked_cond holds), update the running max and sum, P (p_<v>,
        fp32) and, with pack_p, P as RS A fragments pa_0..; leaves alpha_0, alpha_1 (O's
        rescale factors for rows g, g + 8)."""
        out = []
        o = out.append
        o(f"{ind}if {masked_cond}:")
        if column_limit_mask(D, BN):
            # the thread's S register v is key n0 + tq + c(v), c a constant: FA3's column limit
            # per row (sm80_attention.column_limit)
            for h in range(2):
                o(f"{ind}    lim_{h} = "
                  + sm80_attention.column_limit(var, f"(row0 + {8 * h})", "n0", "tq", BN))
            # (nt.frag_mask_cols: keep_below per register, in one call)
            o(f"{ind}    sacc = nt.frag_mask_cols(sacc, lim_0, lim_1)")
        else:
            cols = [f"n0 + tq + {8 * (v // 4) + v % 2}" for v in range(NS)]
            o(f"{ind}    sacc = " + _tup([f"keep(sacc[{v}], {cols[v]}, row0 + {8 * ((v // 2) % 2)}, "
                                          "Sk, off)" for v in range(NS)]))
        # each row half's max over the thread's registers (as _tree('max', ...) in one call)
        o(f"{ind}rm_0, rm_1 = nt.frag_row_maxes(sacc)")
        for h in range(2):
            o(f"{ind}mx = quad_max(rm_{h}) * scale_log2")
            o(f"{ind}m_new = max(m_{h}, mx)")
            o(f"{ind}base_{h} = m_new if m_new != NEG_INF else ZERO  # a row with no key yet")
            if cfg.fast_exp:
                o(f"{ind}alpha_{h} = nt.ex2_approx(m_{h} - base_{h})")
                o(f"{ind}nbase_{h} = -base_{h}")
            else:
                o(f"{ind}alpha_{h} = math.exp2(m_{h} - base_{h})")
            o(f"{ind}m_{h} = m_new")
        if cfg.fast_exp:
            # NOTE: whole-fragment intrinsics (intrinsics.fastmath): the same instructions as
            # the per-register expressions, in one numba statement each instead of ~5 per
            # register (0.6 s of a 2.3 s first compile; docs/PERFORMANCE.md, ninth session)
            o(f"{ind}p = nt.frag_exp2_fma(sacc, scale_log2, nbase_0, nbase_1)")
            o(f"{ind}rs_0, rs_1 = nt.frag_row_sums(p)")
            for h in range(2):
                o(f"{ind}l_{h} = l_{h} * alpha_{h} + rs_{h}")
        else:
            for v in range(NS):
                o(f"{ind}p_{v} = math.exp2(sacc[{v}] * scale_log2 - base_{(v // 2) % 2})")
            o(f"{ind}p = " + _tup([f"p_{v}" for v in range(NS)]))
            for h in range(2):
                terms = [f"p_{v}" for v in range(NS) if (v // 2) % 2 == h]
                o(f"{ind}l_{h} = l_{h} * alpha_{h} + {_tree('+', terms)}")
        if pack_p:
            out.append(pack_p_source(ind))
        return "\n".join(out)

    def pack_p_source(ind):
        """Source: P (the tuple ``p`` softmax_tile returns) as RS A fragments pa_0.. (S registers
        8c..8c+7 are keys 16c..16c+15), packed by intrinsics.convert's frag_pack_*x2 in one call
        (the same cvt's as a pack per register pair)."""
        names = ", ".join(f"pa_{c}" for c in range(KK))
        return f"{ind}{names}, = {pack.replace('nt.pack_', 'nt.frag_pack_')}(p)"

    def softmax_call(ind, masked_cond, pack_p=True):
        """Source: one tile's softmax through the device function softmax_tile (written once
        into the module: :func:`softmax_tile_source`, which tests ``masked_cond`` itself), S
        as masked back in ``sacc``, P in the tuple ``p`` and, with pack_p, as RS A fragments
        pa_0..; leaves alpha_0, alpha_1 (O's rescale factors for rows g, g + 8).

        NOTE: the overlapped schedule runs softmax twice (its first tile is peeled); one
        function instead of two pasted copies halves what numba types and lowers for it (the
        kernel's first compile).  It returns S as masked and tests the mask condition inside,
        as the pasted code did: with S left unmasked at the call site, or the condition passed
        in as a bool, ptxas wrote different SASS.  np.int64(n0): the peeled tile's n0 is the
        literal 0, which numba would type as Literal[int](0) and compile the function for a
        second time."""
        call = (f"{ind}sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1 = softmax_tile(sacc, "
                f"np.int64(n0), tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, scale_log2)")
        return call + ("\n" + pack_p_source(ind) if pack_p else "")

    def softmax_tile_source():
        """Source: the device function softmax_tile (see :func:`softmax_call`)."""
        return (
            "@cuda.jit(device=True, forceinline=True)\n"
            "def softmax_tile(sacc, n0, tq, row0, wrow0, Sk, off, m_0, m_1, l_0, l_1, "
            "scale_log2):\n"
            '    """Mask S where the tile crosses the last key (or, causal, the diagonal),\n'
            '    update the running max and sum of rows g, g + 8; returns (S as masked, P,\n'
            '    m_0, m_1, l_0, l_1, alpha_0, alpha_1)."""\n'
            + softmax("    ", mask_cond, pack_p=False)
            + "\n    return sacc, p, m_0, m_1, l_0, l_1, alpha_0, alpha_1\n")

    def pin(ind, names):
        """Source: pin registers that ordinary code wrote above the next wgmma_fence.  NOTE:
        wgmma.fence is a volatile asm, but plain arithmetic (O's rescale, P's conversions, S's
        mask) is free to sink below it, next to the wgmma that reads it; ptxas then serialises
        the wgmma (C7513, with C7519 "warpgroup.arrive is injected").  An operand fence is
        volatile too, so the values are computed above it."""
        return "\n".join(f"{ind}{x} = nt.wgmma_fence_operand({x})" for x in names)

    P_REGS = [f"pa_{c}" for c in range(KK)]

    def wait_full(ind, ring, stage, parity, fence=True):
        """Source: wait until K or V (``ring`` 'k' or 'v') of ``stage`` has landed (and, with
        ``fence``, make it visible to wgmma's async proxy)."""
        bar = KF if ring == "k" else VF
        text = f"{ind}nt.mbarrier_wait_parity(bars, {bar} + {stage}, {parity})"
        if fence:
            text += f"\n{ind}nt.fence_proxy_async_shared()  # cp.async (generic proxy) -> wgmma (async)"
        return text

    def st(n):
        """Source: the stage of the warpgroup's key tile ``n``."""
        return f"{n} % {S}"

    def par(n):
        """Source: the full barriers' parity for key tile ``n``."""
        return f"({n} // {S}) & 1"

    def release(ind, rings, stage):
        """Source: lane 0 of each consumer warp gives K and/or V (``rings``: 'k', 'v', 'kv') of
        ``stage`` back to the producer (its warp's wgmma group that read it has retired)."""
        out = [f"{ind}if lane == 0:"]
        for ring in rings:
            bar = KE if ring == "k" else VE
            index = bar if stage == "0" else f"{bar} + {stage}"
            out.append(f"{ind}    nt.mbarrier_arrive(bars, {index})")
        return "\n".join(out)

    def qk_mmas(ind):
        """Source: the wgmmas of S = Q K(n)^T on K stage s (scale-d 0 first: S starts at 0)."""
        out = [f"{ind}kst = np.uint64(s * {KB // 16})"]
        for kk in range(D // 16):
            qo, ko = q_lay.k_offset(16 * kk) // 16, k_lay.k_offset(16 * kk) // 16
            out.append(f"{ind}sacc = QK(sacc, dq + np.uint64({qo}), dk + kst + np.uint64({ko}), "
                       f"{0 if kk == 0 else 1})")
        return "\n".join(out)

    def pv_mmas(ind, stage):
        """Source: the wgmmas of O += P V on V stage ``stage`` (P: the RS A fragments pa_c)."""
        out = [f"{ind}vst = np.uint64({stage} * {KB // 16})"]
        for c in range(KK):
            vo = v_lay.k_offset(16 * c) // 16
            out.append(f"{ind}o = PV(o, pa_{c}, dv + vst + np.uint64({vo}), 1)")
        return "\n".join(out)

    def group(ind, *parts):
        return "\n".join([*parts, f"{ind}nt.wgmma_commit_group()"])

    def fenced(ind, names):
        return pin(ind, names) + f"\n{ind}nt.wgmma_fence()"

    def fence_p(ind):
        # P(n-1)'s registers stay live (unreused) until its wgmma group retired
        return "\n".join(f"{ind}pa_{c} = nt.wgmma_fence_operand(pa_{c})" for c in range(KK))

    def turn(ind, op, own):
        """Source (pingpong): ``op`` ("sync" or "arrive") on this consumer's own named barrier
        (own=True: id 1 + cw) or the other's (id 2 - cw); "" without pingpong.  The id is a
        literal in the PTX, hence the branch."""
        if not cfg.pingpong:
            return ""
        ids = (1, 2) if own else (2, 1)
        return (f"\n{ind}if cw == 0:\n{ind}    nt.named_barrier_{op}({ids[0]}, 256)"
                f"\n{ind}else:\n{ind}    nt.named_barrier_{op}({ids[1]}, 256)")

    rescale = "o = nt.frag_scale_rows(o, alpha_0, alpha_1)"  # o[v] * alpha of v's row
    mask_cond = f"n0 + {BN} > Sk"
    if var.causal:
        mask_cond += f" or n0 + {BN - 1} > wrow0 + off"
    zeros_s = _tup(["z"] * NS)
    zeros_o = _tup(["z"] * NO)
    zeros_p = "(np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))"

    w("\n" + softmax_tile_source())
    # varlen: (total_q, total_k) in place of (Sq, Sk), and the prefix sums cu_q, cu_k last
    sizes = "total_q, total_k" if var.varlen else "Sq, Sk"
    extra = ", cu_q, cu_k" if var.varlen else ""
    w(f'''

@cuda.jit(cache=True, launch_bounds=({cfg.threads}, 1))
def attention_kernel(q, k, v, out, lse, {sizes}, Hq, group, m_blocks, q_sb, q_ss, q_sh, k_sb,
                     k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh, scale_log2{extra}):
    # Q ({BLOCK_M}, {D}) as 2 parts of {QPB} bytes | K {S} x ({BN}, {D}) | V {S} x ({BN}, {D}): {shared_bytes(cfg, D)} bytes
    smem = cuda.shared.array(0, np.uint8, alignment=1024)
    # q_full = bars[0], k_full[s] = bars[{KF} + s], v_full[s] = bars[{VF} + s]: the producer's 128
    # cp.async arrivals (.noinc); k_empty[s] = bars[{KE} + s], v_empty[s] = bars[{VE} + s]: one
    # arrival per consumer warp (8), by lane 0 after its warp's wgmma.wait_group retired the reads
    bars = cuda.shared.array({1 + 4 * S}, np.uint64, alignment=8)''')
    w('''    t = cuda.threadIdx.x
    wg = t // 128''')
    w(f'''
    # Blocks of one (batch, head) are neighbours (they share K and V in L2); the last query
    # blocks, which see the most keys under a causal mask, start first.
    # NOTE: 32-bit unsigned arithmetic: a 64-bit division by a run-time value is a subroutine
    # call in SASS, and a call anywhere in the kernel makes ptxas serialize every wgmma (C7509).
    pid = np.uint32(cuda.blockIdx.x)
    mb = np.uint32(m_blocks)
    bh = np.uint32(pid // mb)
    m0 = np.int64(np.uint32(np.uint32(mb - np.uint32(1)) - np.uint32(pid % mb))) * {BLOCK_M}
    b = np.int64(np.uint32(bh // np.uint32(Hq)))
    h = np.int64(np.uint32(bh % np.uint32(Hq)))
    hk = np.int64(np.uint32(np.uint32(h) // np.uint32(group)))''')
    if var.varlen:
        w(sm80_attention.sequence_bounds_source("    "))
    w(f'''    off = Sk - Sq  # causal: query i sees keys j <= i + off
    n_tiles = {div_bn(f'(Sk + {BN - 1})', BN)}''')
    if var.causal:
        w(f'''    last = m0 + {BLOCK_M - 1} + off  # the last key the block's last query sees
    if last < 0:
        n_tiles = 0
    else:
        n_tiles = min(n_tiles, {div_bn('last', BN)} + 1)''')
    w(f'''
    if t == 0:
        nt.mbarrier_init(bars, 0, 128)
        for s in range({S}):
            nt.mbarrier_init(bars, {KF} + s, 128)
            nt.mbarrier_init(bars, {VF} + s, 128)
            nt.mbarrier_init(bars, {KE} + s, 8)
            nt.mbarrier_init(bars, {VE} + s, 8)
        nt.fence_mbarrier_init()
    cuda.syncthreads()

    # Phase bookkeeping (as sm90_gemm): tile n uses stage s = n % {S} in round r = n // {S};
    # consumers wait for a full barrier with parity r & 1, the producer for an empty one with
    # parity (r + 1) & 1 (on a fresh barrier parity 1 reads as complete).
    if wg == 0:
        # ---- producer warpgroup --------------------------------------------------------------
        nt.setmaxnreg_dec({cfg.producer_regs})
        j = t % {_chunks_per_row(D)}
        r0 = t // {_chunks_per_row(D)}
        swz = ((j % {A}) ^ {"(r0 % 8)" if SW == 128 else "((r0 % 8) // 2)"}) * 16  # {SW}B swizzle
        q_d = (j // {A}) * {64 * SW} + r0 * {SW} + swz
        k_d = {QB} + (j // {A}) * {BN * SW} + r0 * {SW} + swz
        v_d = {VB0} + (r0 // 8) * {D * 16} + (j // {A}) * {8 * SW} + (r0 % 8) * {SW} + swz
        load_q(smem, q_d, q, {rb["q"]} + h * q_sh + (m0 + r0) * q_ss + j * 8, q_ss, Sq - m0 - r0)
        nt.cp_async_mbarrier_arrive_noinc(bars, 0)
        # this thread's first copy of key tile n: k_g, v_g; rows of the tile left: left
        k_g = {rb["k"]} + hk * k_sh + r0 * k_ss + j * 8
        v_g = {rb["v"]} + hk * v_sh + r0 * v_ss + j * 8
        left = Sk - r0
        for n in range(n_tiles):
            s = n % {S}
            ph = ((n // {S}) + 1) & 1
            nt.mbarrier_wait_parity(bars, {KE} + s, ph)
            load_k(smem, k_d + s * {KB}, k, k_g, k_ss, left)
            nt.cp_async_mbarrier_arrive_noinc(bars, {KF} + s)
            nt.mbarrier_wait_parity(bars, {VE} + s, ph)
            load_v(smem, v_d + s * {KB}, v, v_g, v_ss, left)
            nt.cp_async_mbarrier_arrive_noinc(bars, {VF} + s)
            k_g += {BN} * k_ss
            v_g += {BN} * v_ss
            left -= {BN}
        nt.cp_async_wait_all()''')
    w(f'''    else:
        # ---- consumer warpgroups ---------------------------------------------------------------
        nt.setmaxnreg_inc({cfg.consumer_regs})
        cw = wg - 1
        lane = t % 32
        tq = (lane % 4) * 2''')
    w('''        wrow0 = m0 + cw * 64  # the warpgroup's first query row
        row0 = wrow0 + ((t % 128) // 32) * 16 + lane // 4  # this thread's rows: row0, row0 + 8
        # the key tiles this warpgroup's rows see (the block loads those of its last row)
        n_wg = n_tiles''')
    if var.causal:
        w(f'''        wlast = wrow0 + 63 + off
        if wlast < 0:
            n_wg = 0
        else:
            n_wg = min(n_tiles, {div_bn('wlast', BN)} + 1)''')
    w(f'''        # descriptors: this warpgroup's Q part; K and V stage 0 (stage s: + s * {KB} bytes)
        dq = nt.smem_desc(smem, cw * {QPB}, {q_lay.lbo}, {q_lay.sbo}, {SW})
        dk = nt.smem_desc(smem, {QB}, {k_lay.lbo}, {k_lay.sbo}, {SW})
        dv = nt.smem_desc(smem, {VB0}, {v_lay.lbo}, {v_lay.sbo}, {SW})
        z = ZERO
        m_0 = NEG_INF
        m_1 = NEG_INF
        l_0 = ZERO
        l_1 = ZERO
        sacc = nt.wgmma_fence_operand({zeros_s})
        o = nt.wgmma_fence_operand({zeros_o})''')
    for c in range(KK):
        w(f"        pa_{c} = {zeros_p}")
    w("        nt.mbarrier_wait_parity(bars, 0, 0)  # Q landed")
    if cfg.pingpong:
        w("""        # ping-pong: consumer 0 takes the first turn (consumer 1 arrives on its barrier once;
        # consumer 0's last bar.sync, after the key loop, consumes this extra arrival)
        if cw == 1:
            nt.named_barrier_arrive(1, 256)""")
    I = " " * 12
    if not cfg.overlap:
        w(f'''
        # ---- main loop: S = Q K^T, softmax, O += P V, in order ----
        for n in range(n_wg):
            s = {st("n")}
            ph = {par("n")}
            n0 = n * {BN}
{wait_full(I, "k", "s", "ph")}
{group(I, fenced(I, ["sacc"]), qk_mmas(I))}
            nt.wgmma_wait_group(0)
            sacc = nt.wgmma_fence_operand(sacc)
{release(I, "k", "s")}
{softmax_call(I, mask_cond)}
            {rescale}
{wait_full(I, "v", "s", "ph")}
{group(I, fenced(I, ["o"] + P_REGS), pv_mmas(I, "s"))}
            nt.wgmma_wait_group(0)
            o = nt.wgmma_fence_operand(o)
{release(I, "v", "s")}''')
    else:
        w(f'''
        # ---- main loop, FA3's intra-warpgroup overlap: S(n) and P(n-1) V(n-1) issued back to
        # back; softmax(S(n)) runs while P(n-1) V(n-1) is on the tensor core ----
        if n_wg > 0:
            s = 0
            ph = 0
            n0 = 0
{wait_full(I, "k", "s", "ph")}{turn(I, "sync", True)}
{group(I, fenced(I, ["sacc"]), qk_mmas(I))}{turn(I, "arrive", False)}
            nt.wgmma_wait_group(0)
            sacc = nt.wgmma_fence_operand(sacc)
{release(I, "k", "0")}
{softmax_call(I, mask_cond)}
        for n in range(1, n_wg):
            s = {st("n")}
            ph = {par("n")}
            sp = {st("(n - 1)")}  # the previous tile's stage and parity
            n0 = n * {BN}
            # NOTE: both waits before the first wgmma: a wait (a branch loop) between the two
            # groups made ptxas serialise every wgmma of the kernel (C7513).  V(n-1) has been
            # in flight a whole tile longer than K(n), so waiting for it early costs nothing.
{wait_full(I, "k", "s", "ph")}
{wait_full(I, "v", "sp", par("(n - 1)"))}{turn(I, "sync", True)}
{fenced(I, ["sacc", "o"] + P_REGS)}
{group(I, qk_mmas(I))}
{group(I, pv_mmas(I, "sp"))}{turn(I, "arrive", False)}
            nt.wgmma_wait_group(1)  # S(n) done; P(n-1) V(n-1) may still run
            sacc = nt.wgmma_fence_operand(sacc)
{release(I, "k", "s")}
{softmax_call(I, mask_cond, pack_p=False)}
            nt.wgmma_wait_group(0)
            o = nt.wgmma_fence_operand(o)
{fence_p(I)}
{release(I, "v", "sp")}
            {rescale}
            # NOTE: P(n) is converted into the A registers only now that P(n-1) V(n-1) retired
            # (as FA3 does): converting during that wgmma made ptxas serialise every wgmma of
            # the kernel (C7513, "non wgmma instructions defining input registers of a wgmma
            # between start and end of the pipeline stage").
{pack_p_source(I)}
        if n_wg > 0:
            sp = {st("(n_wg - 1)")}
{wait_full(I, "v", "sp", par("(n_wg - 1)"))}
{group(I, fenced(I, ["o"] + P_REGS), pv_mmas(I, "sp"))}
            nt.wgmma_wait_group(0)
            o = nt.wgmma_fence_operand(o)
{release(I, "v", "sp")}''')
    w(f'''
        # tiles the block loaded that this warpgroup's rows do not see (causal): wait, release
        for n in range(n_wg, n_tiles):
            s = {st("n")}
            ph = {par("n")}
{wait_full(I, "k", "s", "ph", fence=False)}
{wait_full(I, "v", "s", "ph", fence=False)}
{release(I, "kv", "s")}{turn(I, "sync", True)}{turn(I, "arrive", False)}''')
    if cfg.pingpong:
        w("""        # ping-pong: consume consumer 1's last arrival (one more than consumer 0's turns)
        if cw == 0:
            nt.named_barrier_sync(1, 256)""")
    w(f'''
        # ---- epilogue: O / l per row (0 for a row that saw no key), stored as {var.dtype} ----''')
    if D > 128:
        # NOTE: above head_dim 128 (O: 96 or 128 registers a thread) ptxas spilled b and h (20-44
        # bytes), live from the kernel's start to here across the key loop; they are computed
        # again from blockIdx.x, which the opaque operand fence keeps LLVM from reusing.
        w('''        pid = np.uint32(nt.wgmma_fence_operand(np.int32(cuda.blockIdx.x)))
        bh = np.uint32(pid // np.uint32(m_blocks))
        b = np.int64(np.uint32(bh // np.uint32(Hq)))
        h = np.int64(np.uint32(bh % np.uint32(Hq)))''')
        if var.varlen:  # q0 and Sq too (the sequence's rows), read again
            w(sm80_attention.sequence_bounds_source("        ", keys=False))
    w(f"        o_start = {rb['o']} + h * o_sh")
    for hh in range(2):
        w(f"        l = quad_sum(l_{hh})")
        w(f"        inv_{hh} = np.float32(1) / l if l > ZERO else ZERO")
        if var.with_lse:
            w(f"        row = row0 + {8 * hh}")
            w("        if tq == 0 and row < Sq:")
            at = "h * total_q + q0 + row" if var.varlen else "np.int64(bh) * Sq + row"
            w(f"            lse[{at}] = (m_{hh} + math.log2(l)) * LN2 if l > ZERO else NEG_INF")
    # NOTE (sm80_attention): scaled in place before any store, so that LLVM cannot hoist the
    # scaled values above the row checks and double O's registers.
    w("        o = nt.frag_scale_rows(o, inv_0, inv_1)  # o[v] * inv of v's row")
    sm80_attention.store_o_rows(w, "        ", D, lambda hh: f"row0 + {8 * hh}",
                                lambda hh, jj, c: f"o[{4 * jj + 2 * hh + c}]")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


@functools.cache
def kernel_for(cfg: Sm90AttnConfig, var: AttnVariant):
    """The compiled-on-demand kernel for (cfg, var), cached on disk: a TMA configuration's is
    code (sm90_attention_tma.make_kernel, build.cache_kernel), a cp.async one's generated text
    (build.load_generated)."""
    if cfg.tma:
        from numbatc.kernels import sm90_attention_tma

        return sm90_attention_tma.make_kernel(cfg, var)
    return load_generated("sm90_attention", kernel_source(cfg, var), entry="attention_kernel")


def signature(var: AttnVariant, cfg: Sm90AttnConfig = None):
    """The kernel's argument types on the GPU: sm80_attention's (typed device pointers, int64
    sizes and strides, the float32 scale); for a TMA ``cfg`` sm90_attention_tma's (the tensor
    maps in place of q, k, v and their strides)."""
    if cfg is not None and cfg.tma:
        from numbatc.kernels import sm90_attention_tma

        return sm90_attention_tma.signature(var)
    return sm80_attention.signature(var)


def grid_for(batch, heads_q, seqlen_q):
    return (-(-seqlen_q // BLOCK_M)) * heads_q * batch


def launch_flat(cfg: Sm90AttnConfig, var: AttnVariant, q, k, v, out, lse, batch, seqlen_q,
                seqlen_k, heads_q, group, q_strides, k_strides, v_strides, o_strides, scale,
                stream=0, varlen=None):
    """Launch the kernel (arguments as sm80_attention.launch_flat).  q, k, v, out, lse are
    flat: device pointers (ints) on the GPU, 1-d arrays in the emulation; strides (batch, seq,
    head) in elements, multiples of 8 for q, k, v, whose starts are 16-byte aligned; 16 * seq
    stride must fit in int32 (see :func:`unsupported`).  The kernel uses setmaxnreg, so
    intrinsics.launch loads it through the driver's whole-program JIT.  A varlen variant takes
    ``varlen=(cu_q, cu_k, max_seqlen_q)`` as sm80_attention.launch_flat does."""
    from numba import config

    from intrinsics.launch import launch as launch_kernel

    rows, cu = sm80_attention.varlen_launch(var, varlen, seqlen_q)
    kernel = kernel_for(cfg, var)
    m_blocks = -(-rows // BLOCK_M)
    args = (q, k, v, out, lse, seqlen_q, seqlen_k, heads_q, group, m_blocks, *q_strides,
            *k_strides, *v_strides, *o_strides, np.float32(scale * LOG2E), *cu)
    sig = None if config.ENABLE_CUDASIM else signature(var)
    launch_kernel(kernel, grid_for(batch, heads_q, rows), cfg.threads, args,
                  shared_bytes=shared_bytes(cfg, var.head_dim), stream=stream, signature=sig)


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (see numbatc.kernels.dispatch): from a
# numbatc.attention_api.AttentionProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute problem ``p`` (a numbatc.attention_api.AttentionProblem), or
    None."""
    if p.kv_cache:
        return ("KV-cache problems (numbatc.attention_with_kvcache) run on sm80_decode_attention "
                "or sm80_attention")
    if p.head_dim not in HEAD_DIMS:
        return f"head_dim {p.head_dim} is not one of {HEAD_DIMS}"
    if p.dtype not in _PTX_TYPE:
        return f"dtype {p.dtype}"
    # the loaders step 16 rows (head_dim 64, 192, 256) or 8 (128) at a time with an int32 increment
    seq = 0 if p.varlen else 1  # the sequence axis: varlen's tensors are (rows, head, dim)
    for name, ca in (("q", p.q), ("k", p.k), ("v", p.v)):
        if ca.shape[seq] > 1 and 16 * abs(ca.strides[seq]) >= 2**31:
            return f"{name}'s sequence stride {ca.strides[seq]} is too large for 32-bit steps"
    if p.seqlen_k >= 2**31 or p.seqlen_q >= 2**31:
        return "a sequence of 2**31 or more rows (key tiles are counted in 32 bits)"
    if p.batch * p.heads_q * (-(-p.seqlen_q // BLOCK_M)) >= 2**31:
        return "more than 2**31 blocks"
    return None


def declines(p):
    """Why numbatc.attention's default walk does not send problem ``p`` here although this
    kernel computes it (a head dim outside :data:`DEFAULT_HEAD_DIMS`), or None;
    ``NUMBATC_ATTN_KERNEL=sm90[:<config>]`` overrides it."""
    if p.head_dim in HEAD_DIMS and p.head_dim not in DEFAULT_HEAD_DIMS:
        return (f"head_dim {p.head_dim} is not in sm90_attention.DEFAULT_HEAD_DIMS "
                f"{DEFAULT_HEAD_DIMS} (NUMBATC_ATTN_KERNEL=sm90 forces it)")
    return None


def why_chosen(p, cfg: Sm90AttnConfig) -> str:
    """NUMBATC_PRINT_CONFIG's reason for ``cfg`` (as :func:`choose` returned it) for ``p``."""
    import os

    if os.environ.get("NUMBATC_ATTN_KERNEL", "").partition(":")[2] == cfg.name:
        return "named by NUMBATC_ATTN_KERNEL"
    which = "DEFAULT_TMA" if TMA_BY_DEFAULT else "DEFAULT"
    forced = p.head_dim not in DEFAULT_HEAD_DIMS
    return (f"{which}[{p.head_dim}]: {cfg.block_m} x {cfg.block_n} tiles, {cfg.stages} stages"
            + (", head_dim forced by NUMBATC_ATTN_KERNEL (not in DEFAULT_HEAD_DIMS)" if forced
               else ""))


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced; else
    :data:`LONG_KEY_TILES`' where the head dim has them, the problem is not causal and
    seqlen_k reaches theirs, else :func:`choose_config`'s for its head dim).  A TMA one runs as
    its cp.async twin where no tensor map describes the operands: :func:`compiled` names the
    configuration that runs, and :func:`launch` says why under NUMBATC_PRINT_CONFIG
    (:func:`resolve`)."""
    if name is not None and name not in CONFIGS:
        raise ValueError(f"no sm90 attention config {name!r}; choose from {sorted(CONFIGS)}")
    if name and p.head_dim not in CONFIGS[name].head_dims:
        fits = sorted(n for n, c in CONFIGS.items() if p.head_dim in c.head_dims)
        raise ValueError(f"sm90 attention config {name!r} is for head_dim "
                         f"{CONFIGS[name].head_dims}, not {p.head_dim}; choose from {fits}")
    if name and p.varlen and CONFIGS[name].persistent:
        raise ValueError(f"sm90 attention config {name!r} is persistent, which has no varlen "
                         "variant; choose a configuration without _pt")
    if name:
        return CONFIGS[name]
    long_tiles = LONG_KEY_TILES.get(p.head_dim)
    if (TMA_BY_DEFAULT and long_tiles and not p.causal and not p.varlen and not p.kv_cache
            and p.seqlen_k >= long_tiles[1]):
        return CONFIGS[long_tiles[0]]
    return choose_config(p.head_dim)


def compiled(p, cfg: Sm90AttnConfig):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments; signature(var, cfg) its argument types)."""
    run = resolve(p, cfg)[0]
    # varlen: no TMA store (a box of O would write the next sequence's rows)
    tma_store = run.tma and p.head_dim in TMA_STORE_HEAD_DIMS and not p.varlen
    if tma_store:
        from numbatc.kernels import sm90_attention_tma

        tma_store = sm90_attention_tma.out_fits(p.out)
    return run, AttnVariant(p.head_dim, p.dtype, p.causal, p.lse is not None, p.varlen,
                            pair_stores=sm80_attention.pair_stores_fit(p.out),
                            tma_store=tma_store)


def launch(p, cfg: Sm90AttnConfig):
    """Launch ``cfg`` for a :class:`numbatc.attention_api.AttentionProblem` on its stream (the
    caller checked :func:`unsupported`); a TMA configuration whose operands no tensor map
    describes runs its twin (:func:`resolve`; NUMBATC_PRINT_CONFIG prints the configuration
    that runs and why it is not ``cfg``).  Returns the warm calls' pointer relaunch
    (sm80_attention.pointer_relaunch's; sm90_attention_tma.launch_attention's) or None."""
    import os

    why = why_chosen(p, cfg) if os.environ.get("NUMBATC_PRINT_CONFIG") else None
    cfg, fallback = resolve(p, cfg)
    _, var = compiled(p, cfg)
    if why is not None:
        import sys

        shape = (f"varlen sequences={p.batch} max_seqlen_q={p.seqlen_q} max_seqlen_k="
                 f"{p.seqlen_k}" if p.varlen else f"B={p.batch} Sq={p.seqlen_q} Sk={p.seqlen_k}")
        print(f"numbatc.attention {shape} Hq={p.heads_q} "
              f"Hkv={p.heads_kv} D={p.head_dim}{' causal' if p.causal else ''}: sm90_attention "
              f"{cfg.name} {p.dtype}{' +lse' if p.lse is not None else ''}"
              f"{f' ({fallback})' if fallback else ''} [{why}]", file=sys.stderr)
    if cfg.tma:
        from numbatc.kernels import sm90_attention_tma

        return sm90_attention_tma.launch_attention(p, cfg, var)
    keep = []
    args, stream = sm80_attention.kernel_arguments(p, keep)
    launch_flat(cfg, var, *args, stream=stream,
                varlen=sm80_attention.varlen_arguments(p, keep))
    if keep or os.environ.get("NUMBATC_PRINT_CONFIG"):
        return None  # q, k or v packed (a later call decides again), or no warm calls
    return sm80_attention.pointer_relaunch(
        kernel_for(cfg, var), grid_for(p.batch, p.heads_q, p.seqlen_q), cfg.threads,
        signature(var), shared_bytes(cfg, var.head_dim), args, BLOCK_M,
        out_align=4 if var.pair_stores else 1, problem=p)
