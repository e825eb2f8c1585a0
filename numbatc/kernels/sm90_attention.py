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
tensor core; O is rescaled once that group retired.  ``rescale_before_pv=True`` ones (``_rb``)
defer that rescale to the next tile: O *= alpha(n-1) between the issue of S(n) and that of
P(n-1) V(n-1), under the Q K^T (FA3's RescaleOBeforeGemm, its schedule above head_dim 128),
with a second wgmma.fence before the P V, whose accumulator the multiplies wrote.

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
GQA: query head h reads key/value head h // group.

The kernel is code: numbatc.kernels.sm90_attention_tma.make_kernel(cfg, var) makes it for
either producer, an ordinary ``@cuda.jit`` function whose constants are closure values, cached
on disk (numbatc.kernels.build.cache_kernel) and launched through intrinsics.launch
(setmaxnreg: whole-program JIT).  The ``_tma`` configurations replace the cp.async producer
with one thread issuing TMA tensor copies of Q, K and V (sm90_attention_tma: maps, boxes, byte
counts, barriers, persistent tiles, O's TMA stores).  :data:`TMA_BY_DEFAULT` switches the
default to them.
"""

import functools
from dataclasses import dataclass

import numpy as np

from intrinsics.setmaxnreg import register_pool
from numbatc.kernels import sm80_attention

__all__ = ["Sm90AttnConfig", "CONFIGS", "DEFAULT", "DEFAULT_HEAD_DIMS", "DEFAULT_TMA", "HEAD_DIMS",
           "TMA_BY_DEFAULT", "unsupported", "choose", "compiled", "declines", "launch",
           "choose_config", "kernel_for", "launch_flat", "resolve",
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
CONSUMERS = (2, 3)  # consumer warpgroups a block may have (64 query rows each)
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
    # O's rescale by tile n's factor in tile n + 1's turn, between the issue of S(n + 1) and that
    # of P(n) V(n) (FA3's RescaleOBeforeGemm, which it takes above head_dim 128), instead of
    # after P(n - 1) V(n - 1) retired: the multiplies run under the Q K^T (needs overlap)
    rescale_before_pv: bool = False
    # P = ex2.approx.ftz(fma(s, scale_log2, -max)): FFMA + MUFU.EX2 per score (intrinsics.
    # fastmath) instead of math.exp2's denormal-scaled ex2 after a separate multiply and subtract
    fast_exp: bool = False
    # "cp_async": 128 producer threads copy 16 bytes each (this module); "tma": one thread issues
    # tensor copies of whole boxes (numbatc.kernels.sm90_attention_tma)
    producer: str = "cp_async"
    # a persistent grid (one block per SM) walking the (batch, head, query block) tiles, longest
    # first under a causal mask (sm90_attention_tma.WORK_TILE); TMA producers only
    persistent: bool = False
    # persistent and causal: the bytes of K and V a section of the work may keep in L2 (FA3's
    # LPT scheduler: 32 MB of an H100's or H200's 50 MB).  The longest-first order runs over
    # sections of as many (batch, query head) pairs as fit, each section's tiles longest first,
    # so that the blocks at work share their keys and values in L2; 0: one section of all
    # pairs (sm90_attention_tma._coords)
    l2_budget: int = 0
    # the head dims it is meant for (tested, and chosen by name): its tiles fit shared memory
    head_dims: tuple = (64, 128)
    # consumer warpgroups, 64 query rows each: 3 is FA3's head_dim 64 tiling (192 x 128, 512
    # threads, setmaxnreg 32 / 160 = all 65536 registers); TMA producers only (the cp.async
    # loaders are written for 128 rows of Q)
    consumers: int = 2

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
        if self.l2_budget and not self.persistent:
            problems.append("l2_budget orders a persistent grid's work: it needs persistent=True")
        if self.block_n not in BLOCK_NS:
            problems.append(f"block_n must be one of {BLOCK_NS}, got {self.block_n}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        if self.pingpong and not self.overlap:
            problems.append("pingpong needs overlap=True (it is built on the _ov schedule)")
        if self.rescale_before_pv and not self.overlap:
            problems.append("rescale_before_pv needs overlap=True (the in-order schedule has "
                            "no Q K^T in flight to hide it under)")
        if self.consumers not in CONSUMERS:
            problems.append(f"consumers must be one of {CONSUMERS}, got {self.consumers}")
        elif self.consumers != 2 and self.producer != "tma":
            problems.append(f"consumers={self.consumers} needs producer='tma' (the cp.async "
                            "loaders copy 128 rows of Q)")
        # NOTE: the pool setmaxnreg redistributes is what the block was launched with: 65536 /
        # 384 rounded down to a multiple of 8 = 168 per thread, 64512 in all (not 65536; 512
        # threads: 128 each, all 65536); an .inc that asks for more than the pool holds waits
        # forever.
        pool = register_pool(self.threads)
        regs = (self.producer_regs + self.consumers * self.consumer_regs) * _THREADS_PER_WG
        if regs > pool:
            problems.append(f"setmaxnreg {self.producer_regs}/{self.consumer_regs} needs {regs} "
                            f"registers, more than the block's {pool} "
                            f"({pool // self.threads} per thread)")
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
        return (1 + self.consumers) * _THREADS_PER_WG

    @property
    def block_m(self):
        return 64 * self.consumers  # query rows per block (BLOCK_M with two consumers)

    @property
    def tma(self):
        return self.producer == "tma"


def shared_bytes(cfg: Sm90AttnConfig, head_dim: int) -> int:
    """Dynamic shared memory: Q, then K x stages, then V x stages; a persistent configuration
    then the (block_m, head_dim) staging tile of O's TMA stores (Q's buffer, where the other
    configurations stage O, holds the next work tile's Q by then)."""
    staging = cfg.block_m if cfg.persistent else 0
    return (cfg.block_m + 2 * cfg.stages * cfg.block_n + staging) * head_dim * 2


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
        # ... and its work in L2-sized sections under the causal mask (FA3's LPT scheduler)
        Sm90AttnConfig("n128_2s_ov_pp_fx_tma_pt_l2", 128, overlap=True, pingpong=True,
                       fast_exp=True, producer="tma", producer_regs=24, consumer_regs=240,
                       persistent=True, l2_budget=32 << 20, head_dims=(64, 96, 128)),
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
        # head_dim 64, FA3's tiling: three consumer warpgroups, 192 x 128 tiles, 512 threads,
        # setmaxnreg 32 / 160 (O 32 registers, S 64, P 32); 88 KB (2 stages), 120 KB (3)
        Sm90AttnConfig("m192_n128_2s_ov_pp_fx_tma", 128, overlap=True, pingpong=True,
                       fast_exp=True, producer="tma", producer_regs=32, consumer_regs=160,
                       consumers=3, head_dims=(64,)),
        Sm90AttnConfig("m192_n128_3s_ov_pp_fx_tma", 128, stages=3, overlap=True, pingpong=True,
                       fast_exp=True, producer="tma", producer_regs=32, consumer_regs=160,
                       consumers=3, head_dims=(64,)),
        # head_dim 192 (FA3's 128 x 112): O 96 registers, S 56, P 28; 216 KB
        Sm90AttnConfig("n112_2s_ov_pp_fx_tma", 112, overlap=True, pingpong=True, fast_exp=True,
                       producer="tma", producer_regs=24, consumer_regs=240, head_dims=(192,)),
        Sm90AttnConfig("n112_2s_ov_pp_fx", 112, overlap=True, pingpong=True, fast_exp=True,
                       head_dims=(192,)),
        # O's rescale under the next Q K^T (rescale_before_pv): FA3's schedule above head_dim
        # 128 is this without the ping-pong (it keeps its scheduler barriers to 128 and below);
        # both, with and without it, at 192 and 256, and head_dim 64-128's default with it
        Sm90AttnConfig("n80_2s_ov_rb_fx_tma", 80, overlap=True, rescale_before_pv=True,
                       fast_exp=True, producer="tma", producer_regs=24, consumer_regs=240,
                       head_dims=(256,)),
        Sm90AttnConfig("n80_2s_ov_pp_rb_fx_tma", 80, overlap=True, pingpong=True,
                       rescale_before_pv=True, fast_exp=True, producer="tma", producer_regs=24,
                       consumer_regs=240, head_dims=(256,)),
        Sm90AttnConfig("n112_2s_ov_fx_tma", 112, overlap=True, fast_exp=True, producer="tma",
                       producer_regs=24, consumer_regs=240, head_dims=(192,)),
        Sm90AttnConfig("n112_2s_ov_rb_fx_tma", 112, overlap=True, rescale_before_pv=True,
                       fast_exp=True, producer="tma", producer_regs=24, consumer_regs=240,
                       head_dims=(192,)),
        Sm90AttnConfig("n112_2s_ov_pp_rb_fx_tma", 112, overlap=True, pingpong=True,
                       rescale_before_pv=True, fast_exp=True, producer="tma", producer_regs=24,
                       consumer_regs=240, head_dims=(192,)),
        Sm90AttnConfig("n128_2s_ov_pp_rb_fx_tma", 128, overlap=True, pingpong=True,
                       rescale_before_pv=True, fast_exp=True, producer="tma", producer_regs=24,
                       consumer_regs=240, head_dims=(64, 96, 128)),
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


@dataclass(frozen=True)
class ThreeConsumers:
    """Where :func:`choose` takes three consumer warpgroups (192-row query tiles) for a head
    dim: seqlen_q and seqlen_k at least ``least_seqlen`` and at least ``waves`` x the GPU's SMs
    of 192-row tiles (batch x heads_q x ceil(seqlen_q / 192)); ``causal_*`` the same for the
    causal mask."""

    config: str
    least_seqlen: int
    waves: float
    causal_least_seqlen: int
    causal_waves: float


#: head_dim -> :class:`ThreeConsumers`: FA3's head_dim 64 tiling (192 x 128, three consumers)
#: over DEFAULT_TMA and LONG_KEY_TILES, on grids with enough tiles to fill the GPU.  Measured on
#: an H100 SXM (132 SMs; 2026-12-07, docs/PERFORMANCE.md), bf16, TFLOP/s m192_n128_2s_ov_pp_fx_tma
#: / the walk's choice before (n128, or n176 from seqlen_k 2048 without the mask): bench
#: attention --shapes hd64 (each configuration forced in its own process, one session) and
#: scripts/diag/attn_cfg_ab.py (both in one process):
#:
#:     not causal (B x S x H)  tiles / SMs
#:     16 x 1024 x 32          23.3         365.2 / 326.5   (bench hd64; SDPA 0.87 / 0.79)
#:     8 x 2048 x 32           21.3         434.0 / 378.1   (0.99 / 0.86)
#:     4 x 4096 x 32           21.3         478.1 / 417.5   (1.04 / 0.90)
#:     1 x 16384 x 32          20.8         510.1 / 454.2   (1.16 / 1.02)
#:     16 x 512 x 32           11.6         282.5 / 261.5   scripts/diag/attn_cfg_ab.py
#:     4 x 512 x 32 / 1 x 8192 x 8 / 2 x 2048 x 16   2.9 / 2.6 / 2.7   +6 / +11 / +9 %
#:     1 x 1024 x 32 / 1 x 4096 x 8 / 1 x 2048 x 8   1.5 / 1.3 / 0.7   -16 / -14 / -9 %
#:     32 x 256 x 32           15.5         157.8 / 189.1   (its second 192-row tile: a third full)
#:
#: Causal it gains less (its variant spills 52 bytes): +6 / +6 / +8 % on the bench's 8 x 2048,
#: 4 x 4096 and 1 x 16384 (21-23 tiles an SM), +5 / +3 % at 8 x 2048 x 32 / 4 x 4096 x 32
#: (attn_cfg_ab), a tie at 2.6-2.7 tiles an SM (1 x 8192 x 8, 2 x 2048 x 16), and -5 / -6 % at
#: 16 x 1024 x 32.  Three stages (m192_n128_3s) lost to two on all 20 shapes of attn_cfg_ab
#: (it won only the bench's 1 x 16384 without the mask, 528.5 / 510.1, in another process).
#: The thresholds lie between the losses and the wins: seqlen 512 (256 loses to the padding, 512
#: wins), 2.5 tiles an SM without the mask (1.5 loses, 2.6 wins); with it seqlen 2048 and 8
#: tiles an SM (between the tie at 2.7 and the wins at 21; nothing measured in between).  Not
#: taken for varlen and KV-cache problems (not measured there).
THREE_CONSUMERS = {64: ThreeConsumers("m192_n128_2s_ov_pp_fx_tma", 512, 2.5, 2048, 8.0)}


def three_consumers(p):
    """:data:`THREE_CONSUMERS`' configuration name for problem ``p`` where it applies, else
    None."""
    rule = THREE_CONSUMERS.get(p.head_dim)
    if rule is None or not TMA_BY_DEFAULT or p.varlen or p.kv_cache:
        return None
    least, waves = ((rule.causal_least_seqlen, rule.causal_waves) if p.causal
                    else (rule.least_seqlen, rule.waves))
    if min(p.seqlen_q, p.seqlen_k) < least:
        return None
    from numbatc.kernels import gpus

    tiles = p.batch * p.heads_q * -(-p.seqlen_q // CONFIGS[rule.config].block_m)
    return rule.config if tiles >= waves * gpus.sm_count(p.cc, p.device) else None


def long_key_tiles(p):
    """:data:`LONG_KEY_TILES`' configuration name for problem ``p`` where it applies (the head
    dim has one, no causal mask, varlen or KV cache, seqlen_k reaching its least), else None."""
    long_tiles = LONG_KEY_TILES.get(p.head_dim)
    if (TMA_BY_DEFAULT and long_tiles and not p.causal and not p.varlen and not p.kv_cache
            and p.seqlen_k >= long_tiles[1]):
        return long_tiles[0]
    return None


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
    name = cfg.name.removesuffix("_l2").removesuffix("_pt").removesuffix("_tma")
    return CONFIGS.get(name) or CONFIGS[DEFAULT[head_dim]]


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
# Tiles
# ---------------------------------------------------------------------------------------------


def swizzle_for(D):
    """Bytes of the tiles' shared-memory swizzle at head dim ``D``: 128 (swizzle rows of 64 bf16
    / f16 values) where D is a multiple of 64, else 64 (rows of 32: head_dim 96).  One mode for
    every tile of the kernel: P V's N is all of D, so V's MN-major atoms must tile D exactly (as
    FA3's shared-memory selector picks 64B atoms for head_dim 96)."""
    return 128 if D % 64 == 0 else 64


def column_limit_mask(D: int, BN: int) -> bool:
    """Whether the kernel masks S with FA3's per-row column limit (two int32 limits per thread,
    then one compare per register) rather than by each register's 64-bit key index.  Only where
    the accumulators leave room: at D + BN <= 256 (S and O take D / 2 + BN / 2 <= 128 registers
    a thread) it is fewer instructions and no spill; above (d128 x 176 keys, d192 x 112, d256 x
    80 or 64), ptxas spilled 24-40 bytes in the causal variants with the limits live across the
    tile, so those keep the per-register compare (test_assembles_without_spills_or_serialised_wgmma)."""
    return D + BN <= 256


# ---------------------------------------------------------------------------------------------
# Compilation and launch
# ---------------------------------------------------------------------------------------------


@functools.cache
def kernel_for(cfg: Sm90AttnConfig, var: AttnVariant):
    """The compiled-on-demand kernel for (cfg, var), cached on disk
    (sm90_attention_tma.make_kernel, build.cache_kernel)."""
    from numbatc.kernels import sm90_attention_tma

    return sm90_attention_tma.make_kernel(cfg, var)


def signature(var: AttnVariant, cfg: Sm90AttnConfig = None):
    """The kernel's argument types on the GPU: sm80_attention's (typed device pointers, int64
    sizes and strides, the float32 scale); for a TMA ``cfg`` sm90_attention_tma's (the tensor
    maps in place of q, k, v and their strides)."""
    from numbatc.kernels import sm90_attention_tma

    if cfg is not None and cfg.tma:
        return sm90_attention_tma.signature(var)
    return sm90_attention_tma.cp_async_signature(var)


def grid_for(batch, heads_q, seqlen_q, block_m=BLOCK_M):
    return (-(-seqlen_q // block_m)) * heads_q * batch


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
            *k_strides, *v_strides, *o_strides, np.float32(scale * LOG2E), tuple(cu))
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
    if p.dtype not in ("bfloat16", "float16"):
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
    if cfg.name == three_consumers(p):
        return (f"THREE_CONSUMERS[{p.head_dim}]: {cfg.block_m} x {cfg.block_n} tiles, enough "
                "of them to fill the GPU")
    if cfg.name == long_key_tiles(p):
        return (f"LONG_KEY_TILES[{p.head_dim}]: {cfg.block_m} x {cfg.block_n} tiles, not causal, "
                f"seqlen_k >= {LONG_KEY_TILES[p.head_dim][1]}")
    which = "DEFAULT_TMA" if TMA_BY_DEFAULT else "DEFAULT"
    forced = p.head_dim not in DEFAULT_HEAD_DIMS
    return (f"{which}[{p.head_dim}]: {cfg.block_m} x {cfg.block_n} tiles, {cfg.stages} stages"
            + (", head_dim forced by NUMBATC_ATTN_KERNEL (not in DEFAULT_HEAD_DIMS)" if forced
               else ""))


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced; else
    :func:`three_consumers`' where it applies, else :func:`long_key_tiles`', else
    :func:`choose_config`'s for its head dim).  A TMA one runs as
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
    rule = three_consumers(p) or long_key_tiles(p)
    return CONFIGS[rule] if rule else choose_config(p.head_dim)


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
