"""The Hopper GEMM (sm_90a): warp-specialised, a cp.async producer warpgroup feeding two wgmma
consumer warpgroups through an mbarrier pipeline, fp32 accumulation in registers, and the same
fused epilogue as every GEMM kernel (numbatc.kernels.epilogue: alpha, beta * C, bias,
activation).

This module holds the configurations, the heuristic and the launch; the kernel is Python code,
numbatc.kernels.sm90_gemm_tma.make_kernel, for both producers.  The ``_tma`` configurations
(``producer="tma"``): one thread issues the stage's tensor copies with expect_tx over
numbatc.kernels.pipeline's ring.  The others (``producer="cp.async"``): the producer
warpgroup's 128 threads issue 16-byte ``cp.async`` copies straight into their 128B-swizzled
places and signal the stage's *full* mbarrier with ``cp.async.mbarrier.arrive.noinc`` (the
arrive-on fires once all of the thread's earlier copies have landed); written when TMA tensor
copies were believed to fault on the H200 (they fault only for a box whose innermost start is
not a multiple of 16 bytes), they now run operands a tensor map cannot describe.  Both have the
same consumers, epilogue, split-K, FP8 and persistent tiles.  :data:`DEFAULT_PRODUCER` says
which one numbatc.gemm's heuristic picks.

    block = 384 threads = 3 warpgroups, launch_bounds (384, 1)
      WG0  producer   setmaxnreg.dec 40    wait empty[s] -> cp.async A, B tiles -> arrive full[s]
      WG1  consumer   setmaxnreg.inc 232   wait full[s] -> 4 x wgmma m64nBNk16 -> release empty[s]
      WG2  consumer                        (WG1 rows 0..63 of the tile, WG2 rows 64..127)

Shared memory, per stage (dynamic, 1024-byte aligned; every tile starts on a 1024-byte boundary,
the 128B swizzle's repeat, so the descriptor base offset is 0):

    A K-major  ('row' A):  (BM=128, BK=64) bf16/f16, 128-byte rows, 128B swizzle      16 KB
    A MN-major ('col' A):  (BK=64, BM=128): 8-k atoms of 8 x 128 B along M, 128B swizzle
    B K-major  ('col' B):  (BN, BK=64), 128-byte rows, 128B swizzle                    BN/8 KB
    B MN-major ('row' B):  (BK=64, BN): 8-k atoms of 8 x 128 B along N, 128B swizzle (trans-b 1)

The byte layouts are intrinsics.layout.SmemLayout's (the descriptors' LBO/SBO and the K step come
from it); a chunk of 8 elements along the contiguous direction stays one 16-byte unit under the
swizzle, which is what lets a 16-byte cp.async place it.

Edges: as in sm80_gemm, every copy is a cp.async with a source byte count -- 0 outside the
matrix, the remaining bytes at a ragged edge -- so any M, N, K >= 1 works; the operands' start and
leading dimension must be 16-byte aligned (:func:`launch` packs operands that are not).

``inflight=0`` configurations wait for each tile's wgmma group before releasing its stage;
``inflight=1`` ones (the ``_w1`` names) keep one group in flight (``wgmma_wait_group(1)``) and
release the previous tile's stage.  ``persistent`` ones (``_pt``, the default) launch one block
per SM that walks tiles blockIdx.x, + gridDim.x, ...; the stage counter runs on across tiles,
so the producer fills the next tile's stages while the consumers store this one.

Where the time goes (Nsight Compute on the H200, docs/PERFORMANCE.md): the producer's copies
must be cheap -- tiles wholly inside the operands take unchecked copies (``load_*_inside``,
~2.5 SASS instructions per 16-byte copy: byte-addressed operands, 128-byte column steps as
immediate offsets), only edge tiles the checked ones (~17); the epilogue stores straight from
registers, a bf16/f16 column pair as one 32-bit store where out allows it
(``GemmVariant.out_pairs``); the TMA configurations also have a TMA store epilogue and a
ping-pong schedule (sm90_gemm_tma's docstring).  Written and measured slower, then removed (see
docs/PERFORMANCE.md, 2026-11-30): two-CTA clusters sharing B through DSMEM, and the proxy fence
on the producer side.

FP8 (:data:`FP8_CONFIGS`, :class:`Sm90Fp8Variant`): a float8_e4m3fn or float8_e5m2, b either
(they mix), both K-major -- wgmma's 8-bit forms have no transposes: a row-major (M, K), b
column-major (K, N).  The same pipeline with 1-byte elements: BK = 128 fp8 values (one 128-byte
swizzle row, the same stage bytes as bf16's BK = 64), 16 values per cp.async, 4 x wgmma
m64nBNk32 (e4m3/e5m2 -> f32) per k tile.  Per-tensor scales cost nothing in the kernel:
:func:`launch` folds scale_a * scale_b into alpha.
"""

import functools
import os
import sys
from dataclasses import dataclass

from intrinsics.setmaxnreg import register_pool
from numbatc.kernels import epilogue, operands, split_k

__all__ = ["Sm90Config", "Sm90Variant", "Sm90Fp8Variant", "CONFIGS", "FP8_CONFIGS",
           "FP8_DTYPES", "DEFAULT_PRODUCER", "SMALL_TILES", "MID_TILES", "SPLIT_TWIN", "unsupported",
           "choose", "compiled", "split", "launch", "small_tile", "fp8_small_tile",
           "small_tiles_skip", "small_split", "tensor_maps_unsupported", "kernel_for", "mma_for",
           "kernel_signature", "launch_flat", "signature", "grid_for", "with_producer",
           "with_store", "tma_store_unsupported", "TMA_STORE_FORM",
           "BLOCKWISE_CONFIGS", "blockwise_config",
           "tma_unsupported"]

# The variant (layouts, dtypes, epilogue) is every GEMM kernel's: the same problem description,
# and the same kernel arguments (epilogue.signature).
Sm90Variant = epilogue.GemmVariant

#: fp8 dtype name -> wgmma's PTX type.
FP8_DTYPES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


@dataclass(frozen=True)
class Sm90Fp8Variant(epilogue.GemmVariant):
    """An fp8 problem: ``in_dtype`` is a's dtype and ``b_dtype`` b's (float8_e4m3fn or
    float8_e5m2 each); a_layout must be 'row' and b_layout 'col' (both K-major).

    ``blockwise``: DeepGEMM's fine-grained scaling -- float32 scales of a per (row, 128 values
    of K) and of b per (128 columns, 128 values of K), applied to each k tile's partial product
    as it is added into the float32 accumulator (:data:`BLOCKWISE_CONFIGS`; the kernel takes
    the two scale arrays and their element strides after ``group_m``)."""

    b_dtype: str = "float8_e4m3fn"
    blockwise: bool = False


def signature(var):
    """The kernel's argument types: epilogue.signature's, with a and b as uint8 pointers for
    every input dtype -- the producer addresses its copies in bytes, so that a copy's address
    is one multiply-add from its row's (a GEP on a 2-byte type adds a scaling per copy)."""
    return _byte_signature(var)


@functools.cache
def _byte_signature(var):
    from dataclasses import replace

    from numba import types

    u8 = types.CPointer(types.uint8)
    as_bf16 = replace(var, in_dtype="bfloat16") if var.in_dtype in FP8_DTYPES else var
    sig = (u8, u8) + tuple(epilogue.signature(as_bf16)[2:])
    if getattr(var, "blockwise", False):
        # after group_m (epilogue.signature's 15th argument): the scales and their strides
        f32 = types.CPointer(types.float32)
        sig = sig[:15] + (f32, f32) + (types.int64,) * 4 + sig[15:]
    return sig

_THREADS_PER_WG = 128
_SWIZZLE = 128  # bytes: BK = 64 two-byte elements fill one 128-byte swizzle row
# NOTE: ptxas puts the 1024-aligned dynamic window after the static mbarriers, at 1024 ("1024
# bytes smem" in its report): that much static shared memory comes on top of the stages.
_STATIC_SHARED = 1024


@dataclass(frozen=True)
class Sm90Config:
    """Tile shape (BM x BN x BK), pipeline depth and the warp-specialised split: one producer
    warpgroup and ``consumers`` math warpgroups, each owning BM / consumers rows (64: one wgmma
    m64 row block), with the setmaxnreg register counts of each role."""

    name: str
    bn: int
    stages: int
    bm: int = 128
    bk: int = 64
    consumers: int = 2
    producer_regs: int = 40
    consumer_regs: int = 232
    inflight: int = 0  # wgmma groups left in flight when a stage is released (0 or 1)
    elem_bytes: int = 2  # 2: bf16/f16 (bk = 64); 1: fp8 (bk = 128)
    # One block per SM walking tiles (blockIdx.x, + gridDim.x, ...): the producer fills the next
    # tile's stages while the consumers store this one, and no block launches per tile.
    # Split-K variants ignore it (one block per tile and K slice).
    persistent: bool = False
    # "cp.async": the producer warpgroup's 128 threads copy 16 bytes each (this module);
    # "tma": one thread issues tensor copies (numbatc.kernels.sm90_gemm_tma, the _tma names)
    producer: str = "cp.async"
    # How the epilogue writes out: "direct", each thread stores its values from registers
    # (st.global, bounds-checked on edge tiles); "tma" (the ``_ts`` names, TMA producer only):
    # on tiles inside the matrix each consumer warpgroup writes its bf16 / f16 values into a
    # staging tile of shared memory (stmatrix, 128B swizzle) and one thread stores it with TMA
    # stores, which drain while the consumers run the next tile's main loop (see
    # sm90_gemm_tma's docstring); edge tiles store directly.
    store: str = "direct"
    # CUTLASS's ping-pong schedule (the ``_pp`` names; TMA producer, persistent): each consumer
    # warpgroup takes whole tiles of its own, the block's tiles alternating between the two,
    # and the warpgroups take turns at the main loop (named barriers 4 and 5), so that one's
    # epilogue runs under the other's wgmma (sm90_gemm_tma's docstring).
    pingpong: bool = False

    def __post_init__(self):
        problems = []
        if self.pingpong and not (self.producer == "tma" and self.persistent
                                  and self.consumers == 2 and self.bn <= 128):
            # a warpgroup holds the whole tile: 2 x BN / 2 accumulator registers a thread
            problems.append("pingpong needs the TMA producer, persistent tiles, 2 consumer "
                            "warpgroups and bn <= 128")
        if self.producer not in ("cp.async", "tma"):
            problems.append(f"producer must be 'cp.async' or 'tma', got {self.producer!r}")
        if self.store not in ("direct", "tma"):
            problems.append(f"store must be 'direct' or 'tma', got {self.store!r}")
        elif self.store == "tma" and self.producer != "tma":
            problems.append("the TMA store epilogue is implemented with the TMA producer only")
        if self.elem_bytes not in (1, 2):
            problems.append(f"elem_bytes must be 2 (bf16/f16) or 1 (fp8), got {self.elem_bytes}")
        elif self.bk * self.elem_bytes != _SWIZZLE:
            what = "bf16/f16" if self.elem_bytes == 2 else "fp8"
            problems.append(f"bk must be {_SWIZZLE // self.elem_bytes} (one 128-byte swizzle row "
                            f"of {what}), got {self.bk}")
        if self.bn not in (64, 128, 192, 256):
            problems.append(f"bn must be 64, 128, 192 or 256 (wgmma N, whole 128-byte atoms), "
                            f"got {self.bn}")
        if self.consumers not in (1, 2) or self.bm != 64 * self.consumers:
            problems.append(f"bm must be 64 x consumers (1 or 2 consumer warpgroups), got "
                            f"bm={self.bm}, consumers={self.consumers}")
        if self.inflight not in (0, 1):
            problems.append(f"inflight must be 0 or 1, got {self.inflight}")
        if self.stages < 2:
            problems.append(f"stages must be >= 2, got {self.stages}")
        regs = (self.producer_regs * _THREADS_PER_WG
                + self.consumer_regs * _THREADS_PER_WG * self.consumers)
        # NOTE: setmaxnreg redistributes what the block was given at launch: with launch_bounds
        # (threads, 1) that is 65536 / threads per thread, rounded down to a multiple of 8 (168
        # for 384 threads: 64512, not 65536); asking for more makes setmaxnreg.inc wait forever.
        pool = register_pool(self.threads)
        if regs > pool:
            problems.append(f"setmaxnreg {self.producer_regs}/{self.consumer_regs} needs {regs} "
                            f"registers, more than the {pool} a block of {self.threads} threads "
                            "gets at launch")
        if self.shared_bytes + _STATIC_SHARED > 227 * 1024:
            problems.append(f"{self.shared_bytes} bytes of shared memory (+ {_STATIC_SHARED} "
                            "static) exceed 227 KB")
        if problems:
            raise ValueError(f"invalid sm90 GEMM config {self.name}: " + "; ".join(problems))

    @property
    def threads(self):
        return _THREADS_PER_WG * (1 + self.consumers)

    @property
    def a_bytes(self):
        return self.bm * self.bk * self.elem_bytes

    @property
    def stage_bytes(self):
        return (self.bm + self.bn) * self.bk * self.elem_bytes

    @property
    def staging_bytes(self):
        """The TMA store's staging tile (BM x BN two-byte values; one per consumer warpgroup
        under pingpong), 0 for direct stores."""
        tiles = 2 if self.pingpong else 1
        return tiles * self.bm * self.bn * 2 if self.store == "tma" else 0

    @property
    def shared_bytes(self):
        """Dynamic shared memory: the stages, then the TMA store's staging tile (1024-byte
        aligned: every stage is a multiple of 1024 bytes); the mbarriers are a small static
        array."""
        return self.stages * self.stage_bytes + self.staging_bytes


#: setmaxnreg of the TMA configurations: 24 x 128 + 240 x 256 = 64512, the whole pool.
_TMA_REGS = dict(producer_regs=24, consumer_regs=240)

#: Which producer numbatc.gemm's heuristic picks on sm_90a: "cp.async" or "tma" (then each
#: chosen configuration runs as its ``_tma`` twin, see :func:`with_producer`, and operands that a
#: tensor map cannot describe run the cp.async one).  Forced names (NUMBATC_GEMM_KERNEL) are
#: used as they are.  TMA: measured on the H200 (docs/PERFORMANCE.md, 2026-12-01), the
#: persistent TMA form against the persistent cp.async one in the same runs: bf16 within run
#: noise of it (0.88 / 0.95x against 0.88 / 0.91x of cuBLAS at 4096^3 / 8192^3), FP8 ahead
#: (0.91 / 0.94x against 0.79 / 0.74x of torch._scaled_mm), with one thread issuing instead of
#: a warpgroup of cp.async copies.
DEFAULT_PRODUCER = "tma"

CONFIGS = {
    c.name: c
    for c in (
        Sm90Config("128x256x64_3s", 256, 3),
        Sm90Config("128x256x64_4s", 256, 4),
        Sm90Config("128x128x64_4s", 128, 4),
        # one wgmma group kept in flight across the next stage's wait
        Sm90Config("128x256x64_4s_w1", 256, 4, inflight=1),
        Sm90Config("128x128x64_4s_w1", 128, 4, inflight=1),
        Sm90Config("128x128x64_6s_w1", 128, 6, inflight=1),
        # one block per SM walking the tiles (the tile loop's state needs more than 40 producer
        # registers; the consumers use 168)
        Sm90Config("128x256x64_4s_pt", 256, 4, persistent=True, producer_regs=56,
                   consumer_regs=224),
        Sm90Config("128x256x64_4s_w1_pt", 256, 4, inflight=1, persistent=True, producer_regs=56,
                   consumer_regs=224),
        # the TMA producer (sm90_gemm_tma): one thread issues the stage's tensor copies; the
        # producer warpgroup gives 16 more registers per thread to the consumers
        Sm90Config("128x256x64_4s_tma", 256, 4, producer="tma", **_TMA_REGS),
        Sm90Config("128x128x64_4s_w1_tma", 128, 4, inflight=1, producer="tma", **_TMA_REGS),
        Sm90Config("128x256x64_4s_w1_tma", 256, 4, inflight=1, producer="tma", **_TMA_REGS),
        Sm90Config("128x256x64_4s_pt_tma", 256, 4, persistent=True, producer="tma", **_TMA_REGS),
        Sm90Config("128x256x64_4s_w1_pt_tma", 256, 4, inflight=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        # one consumer warpgroup, 64-row tiles: twice the CTAs of the 128-row ones at small M
        # (256 threads: 256 registers each at launch, so the producer need not go down to 24)
        Sm90Config("64x256x64_4s_w1_tma", 256, 4, bm=64, consumers=1, inflight=1,
                   producer="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("64x128x64_6s_w1_tma", 128, 6, bm=64, consumers=1, inflight=1,
                   producer="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("128x128x64_6s_w1_tma", 128, 6, inflight=1, producer="tma", **_TMA_REGS),
        # the TMA store epilogue (store="tma"): its 64 KB staging tile leaves room for 3 stages
        # of 48 KB (3 x 48 + 64 + 1 static = 209 KB of 227); the 3-stage direct-store twin
        # measures what the stage costs alone
        Sm90Config("128x256x64_3s_pt_tma", 256, 3, persistent=True, producer="tma", **_TMA_REGS),
        Sm90Config("128x256x64_3s_pt_tma_ts", 256, 3, persistent=True, producer="tma",
                   store="tma", **_TMA_REGS),
        Sm90Config("128x256x64_3s_w1_pt_tma", 256, 3, inflight=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        Sm90Config("128x256x64_3s_w1_pt_tma_ts", 256, 3, inflight=1, persistent=True,
                   producer="tma", store="tma", **_TMA_REGS),
        Sm90Config("128x128x64_4s_w1_pt_tma", 128, 4, inflight=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        # CUTLASS's ping-pong schedule (issue 21: the epilogue under the other warpgroup's
        # main loop): 128 x 128 tiles, one per consumer warpgroup at a time; opt-in (forced by
        # name) until the H200 has measured it.  32 KB stages: 5 of them, or 4 beside the TMA
        # store's two 32 KB staging tiles (4 x 32 + 64 + 1 static = 193 KB)
        Sm90Config("128x128x64_5s_pp_tma", 128, 5, persistent=True, producer="tma",
                   pingpong=True, **_TMA_REGS),
        Sm90Config("128x128x64_5s_w1_pp_tma", 128, 5, inflight=1, persistent=True,
                   producer="tma", pingpong=True, **_TMA_REGS),
        Sm90Config("128x128x64_4s_w1_pp_tma", 128, 4, inflight=1, persistent=True,
                   producer="tma", pingpong=True, **_TMA_REGS),
        Sm90Config("128x128x64_4s_w1_pp_tma_ts", 128, 4, inflight=1, persistent=True,
                   producer="tma", store="tma", pingpong=True, **_TMA_REGS),
        # ... and the small tiles' TMA store forms (sm90_gemm.small_split splits them as their
        # direct-store twins, whose split form runs: SPLIT_TWIN)
        Sm90Config("64x128x64_6s_w1_tma_ts", 128, 6, bm=64, consumers=1, inflight=1,
                   producer="tma", store="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("64x256x64_4s_w1_tma_ts", 256, 4, bm=64, consumers=1, inflight=1,
                   producer="tma", store="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("128x128x64_6s_w1_tma_ts", 128, 6, inflight=1, producer="tma", store="tma",
                   **_TMA_REGS),
        Sm90Config("128x128x64_4s_w1_pt_tma_ts", 128, 4, inflight=1, persistent=True,
                   producer="tma", store="tma", **_TMA_REGS),
    )
}

#: fp8 configurations (K-major a and b only): the bf16 defaults' shapes with BK = 128 fp8 values,
#: the same bytes per stage.
FP8_CONFIGS = {
    c.name: c
    for c in (
        Sm90Config("fp8_128x256x128_4s_w1", 256, 4, bk=128, inflight=1, elem_bytes=1),
        Sm90Config("fp8_128x128x128_4s_w1", 128, 4, bk=128, inflight=1, elem_bytes=1),
        Sm90Config("fp8_128x256x128_3s", 256, 3, bk=128, elem_bytes=1),
        # opt-in, not yet run on a GPU: the persistent form (bf16's _pt is the default there)
        Sm90Config("fp8_128x256x128_4s_pt", 256, 4, bk=128, elem_bytes=1, persistent=True,
                   producer_regs=56, consumer_regs=224),
        # the TMA producer (sm90_gemm_tma)
        Sm90Config("fp8_128x256x128_4s_w1_tma", 256, 4, bk=128, inflight=1, elem_bytes=1,
                   producer="tma", **_TMA_REGS),
        Sm90Config("fp8_128x128x128_4s_w1_tma", 128, 4, bk=128, inflight=1, elem_bytes=1,
                   producer="tma", **_TMA_REGS),
        Sm90Config("fp8_128x256x128_4s_pt_tma", 256, 4, bk=128, elem_bytes=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        # the bf16 small tiles' FP8 forms (64-row tiles, one consumer warpgroup; TMA only)
        Sm90Config("fp8_64x128x128_6s_w1_tma", 128, 6, bm=64, consumers=1, bk=128, inflight=1,
                   elem_bytes=1, producer="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("fp8_64x256x128_4s_w1_tma", 256, 4, bm=64, consumers=1, bk=128, inflight=1,
                   elem_bytes=1, producer="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("fp8_128x128x128_6s_w1_tma", 128, 6, bk=128, inflight=1, elem_bytes=1,
                   producer="tma", **_TMA_REGS),
        # the TMA store epilogue (bf16 / f16 out), as bf16's _3s_pt_tma_ts
        Sm90Config("fp8_128x256x128_3s_pt_tma", 256, 3, bk=128, elem_bytes=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        # blockwise scaling (Sm90Fp8Variant.blockwise): 128-column tiles (the scaled partial
        # sum needs a second accumulator: 64 + 64 registers a thread), no group in flight
        Sm90Config("fp8_128x128x128_6s_pt_tma", 128, 6, bk=128, elem_bytes=1, persistent=True,
                   producer="tma", **_TMA_REGS),
        Sm90Config("fp8_128x128x128_6s_pt_tma_ts", 128, 6, bk=128, elem_bytes=1,
                   persistent=True, producer="tma", store="tma", **_TMA_REGS),
        Sm90Config("fp8_64x128x128_8s_pt_tma", 128, 8, bm=64, consumers=1, bk=128, elem_bytes=1,
                   persistent=True, producer="tma", producer_regs=56, consumer_regs=240),
        Sm90Config("fp8_128x256x128_3s_pt_tma_ts", 256, 3, bk=128, elem_bytes=1,
                   persistent=True, producer="tma", store="tma", **_TMA_REGS),
    )
}


def with_producer(cfg: Sm90Config, producer: str) -> Sm90Config:
    """The configuration with the same tile, stages and schedule and the given producer
    ("cp.async" or "tma"): the ``_tma`` name's twin and back; ``cfg`` itself where it has no
    twin (the TMA store epilogue, the TMA-only tiles)."""
    if cfg.producer == producer:
        return cfg
    table = FP8_CONFIGS if cfg.elem_bytes == 1 else CONFIGS
    name = cfg.name + "_tma" if producer == "tma" else cfg.name.removesuffix("_tma")
    return table.get(name, cfg)


def with_store(cfg: Sm90Config, store: str) -> Sm90Config:
    """The configuration with the same tile, stages, schedule and producer and the given
    epilogue store ("direct" or "tma"): the ``_ts`` name's twin and back; ``cfg`` itself where
    it has none."""
    if cfg.store == store:
        return cfg
    table = FP8_CONFIGS if cfg.elem_bytes == 1 else CONFIGS
    name = cfg.name + "_ts" if store == "tma" else cfg.name.removesuffix("_ts")
    return table.get(name, cfg)


def tma_store_unsupported(p):
    """Why the TMA store epilogue cannot write problem ``p``'s out, or None: it stores bf16 /
    f16 row-major tiles through a tensor map of out (16-byte aligned start and row pitch)."""
    if p.out_dtype not in ("bfloat16", "float16"):
        return f"out is {p.out_dtype} (the TMA store epilogue writes bf16 / f16)"
    if p.out.layout != "row":
        return "out is column-major (the TMA store epilogue writes row-major tiles)"
    return tma_unsupported((("out", p.out.alignment),))


def tma_unsupported(operands):
    """Why a tensor map cannot describe the operands, or None: ``operands`` are (name,
    alignment) pairs, alignment the largest power of two <= 16 dividing both the start
    address and the leading dimension in bytes (numbatc.gemm's Operand.alignment); a tensor map
    needs 16 for both (cuTensorMapEncodeTiled: globalAddress and globalStrides)."""
    bad = [name for name, alignment in operands if alignment != 16]
    if not bad:
        return None
    return (f"{' and '.join(bad)} not 16-byte aligned (start or leading dimension): a tensor "
            "map cannot describe it")


def check_variant(var: Sm90Variant):
    """ValueError naming the valid values for a variant this kernel does not implement."""
    if var.in_dtype in FP8_DTYPES:
        b_dtype = getattr(var, "b_dtype", None)
        if b_dtype not in FP8_DTYPES:
            raise ValueError(f"sm90_gemm's fp8 form takes b float8_e4m3fn or float8_e5m2 "
                             f"(an Sm90Fp8Variant's b_dtype), got {b_dtype!r}")
        if (var.a_layout, var.b_layout) != ("row", "col"):
            raise ValueError("sm90_gemm's fp8 form needs both operands K-major (wgmma's 8-bit "
                             "forms have no transposes): a_layout 'row' and b_layout 'col', got "
                             f"{var.a_layout!r}, {var.b_layout!r}")
        return
    if var.in_dtype not in ("bfloat16", "float16"):
        raise ValueError(f"sm90_gemm takes bfloat16 or float16 inputs (or float8_e4m3fn / "
                         f"float8_e5m2 in an Sm90Fp8Variant), got {var.in_dtype!r}")
    for name, layout in (("a_layout", var.a_layout), ("b_layout", var.b_layout)):
        if layout not in ("row", "col"):
            raise ValueError(f"sm90_gemm {name} must be 'row' or 'col', got {layout!r}")


# ---------------------------------------------------------------------------------------------
# The wgmma of a configuration
# ---------------------------------------------------------------------------------------------

_PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}


def mma_for(bn, var, a_kmajor, b_kmajor):
    """The wgmma intrinsic of a tile BN wide: bf16/f16 with the layouts' transposes, or fp8
    (e4m3/e5m2, K-major, no transpose immediates)."""
    import intrinsics as nt

    if var.in_dtype in FP8_DTYPES:
        return nt.wgmma_mma_async(bn, FP8_DTYPES[var.in_dtype], FP8_DTYPES[var.b_dtype],
                                  acc="f32")
    return nt.wgmma_mma_async(bn, _PTX_TYPE[var.in_dtype], acc="f32",
                              trans_a=0 if a_kmajor else 1, trans_b=0 if b_kmajor else 1)


# ---------------------------------------------------------------------------------------------
# Compilation and caching (numbatc.kernels.build)
# ---------------------------------------------------------------------------------------------

@functools.cache
def kernel_for(cfg: Sm90Config, var: Sm90Variant):
    """The kernel for (cfg, var): numbatc.kernels.sm90_gemm_tma.make_kernel's (both producers
    are code; cached on disk but for a variant with a user epilogue, compiled in this process
    only); a ValueError naming the valid values for a variant or configuration it does not
    implement."""
    from numbatc.kernels import sm90_gemm_tma

    check_variant(var)
    fp8 = var.in_dtype in FP8_DTYPES
    if cfg.elem_bytes != (1 if fp8 else 2):
        raise ValueError(f"sm90 config {cfg.name} is for "
                         f"{'fp8' if cfg.elem_bytes == 1 else 'bf16/f16'} inputs, the variant's "
                         f"are {var.in_dtype}: use {'FP8_CONFIGS' if fp8 else 'CONFIGS'}")
    return sm90_gemm_tma.make_kernel(cfg, var)


def grid_for(cfg: Sm90Config, m: int, n: int):
    """Blocks: one per BM x BN tile (a persistent launch takes fewer: :func:`launch_flat`)."""
    return ((m + cfg.bm - 1) // cfg.bm) * ((n + cfg.bn - 1) // cfg.bn)


def kernel_signature(cfg: Sm90Config, var: Sm90Variant):
    """The argument types of (cfg, var)'s kernel (sm90_gemm_tma.signature): tensor maps of a and
    b under the TMA producer, byte pointers under the cp.async one."""
    from numbatc.kernels import sm90_gemm_tma

    return sm90_gemm_tma.signature(var, tma_store=cfg.store == "tma",
                                   cp_async=cfg.producer == "cp.async")


def launch_flat(cfg: Sm90Config, var: Sm90Variant, a, b, c, bias, out, m, n, k, lda, ldb, ldc,
                ldo, alpha, beta, stream=0, group_m=8, epilogue_args=(), prepare=False,
                split=None, block_scales=()):
    """Launch the kernel (arguments as sm80_gemm.launch_flat, ``prepare`` too).  Operands are
    flat: device pointers (ints) on the GPU, 1-d arrays in the emulation; A's and B's start and
    leading dimension must be 16-byte aligned (a TMA configuration builds their tensor maps,
    see sm90_gemm_tma).  The kernel uses setmaxnreg, so intrinsics.launch loads it through the
    driver's whole-program JIT (nvJitLink's relocatable compilation would drop the
    instruction).  ``block_scales``: a blockwise variant's (scale_a, scale_b, their row and
    column element strides) -- flat as the operands; such a launch is never prepared (the
    relaunch contract has no place for the scales)."""
    from numbatc.kernels import sm90_gemm_tma

    grid = grid_for(cfg, m, n)
    if cfg.persistent and split is None:
        grid = min(grid, persistent_blocks())
    if split is not None:  # split-K (sm80_gemm.launch_flat's ``split``)
        grid = (grid, split(stream)[3])
    return sm90_gemm_tma.launch(cfg, var, kernel_for(cfg, var), grid, a, b, c, bias, out, m, n,
                                k, lda, ldb, ldc, ldo, alpha, beta, stream, group_m,
                                epilogue_args, prepare and not block_scales, split, block_scales)


def persistent_blocks():
    """Blocks of a persistent launch: one per SM of the current device (its multiprocessor
    count, cached per device); 2 in the emulation, so that each block walks several tiles."""
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return 2
    return _sm_count(cuda.get_current_device().id)


@functools.cache
def _sm_count(device_id):
    from numba import cuda

    return cuda.get_current_device().MULTIPROCESSOR_COUNT


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (numbatc.kernels.dispatch walks them): from a
# numbatc.gemm_api.GemmProblem -- bf16 / f16, or FP8 with per-tensor scales -- to a configuration
# and a launch
# ---------------------------------------------------------------------------------------------

#: Tiles for problems whose 128 x 256 tiles do not fill the GPU twice, with the time per wave of
#: tiles in seconds per (BM x BN x K) multiply-add, fitted (median) to the H200 sweep of
#: 2026-12-01 (scripts/sweep_gemm.py, docs/PERFORMANCE.md): M in {8 .. 512} x the shape table's
#: layers, each tile without split-K.  The heuristic takes the tile whose waves x BM x BN x K x
#: that figure is least: 0.84 (geometric mean) of cuBLAS over the 78 shapes where the persistent
#: 128 x 256 tiles gave 0.67 and the best of the candidates per shape 0.90.
SMALL_TILES = (("64x128x64_6s_w1_tma", 7.44e-10),
               ("64x256x64_4s_w1_tma", 4.87e-10),
               ("128x128x64_6s_w1_tma", 5.32e-10),
               ("128x256x64_4s_w1_tma", 3.92e-10))

#: The same for M >= 256 with the TMA store epilogue (out bf16 / f16, row-major, 16-byte
#: aligned), in seconds per wave per (BM x BN x K), fitted (median) to the H200 sweep of
#: 2026-12-02 (M in {256, 512, 1024} x the 13 layers, each candidate without split-K): over those
#: 39 shapes 0.916x (geometric mean, in-sample) of cuBLAS against 0.863x for SMALL_TILES, the
#: worst shape 0.79x against 0.65x; the best candidate per shape gave 0.94x.  Each TMA store form
#: measured ahead of its direct twin there (geometric means 0.77 / 0.83 / 0.87 against 0.75 /
#: 0.79 / 0.83 for the 64x128 / 64x256 / 128x128 tiles).
MID_TILES = (("64x128x64_6s_w1_tma_ts", 5.41e-13),
             ("64x256x64_4s_w1_tma_ts", 4.43e-13),
             ("128x128x64_6s_w1_tma_ts", 4.12e-13),
             ("128x256x64_3s_pt_tma_ts", 3.73e-13))

#: FP8's small tiles, fitted the same way to the H200 FP8 sweep of 2026-12-02 (M in {8, 64, 256}
#: x the 13 layers, against torch._scaled_mm): M <= 64 takes the least cost of the 64-row tiles
#: (2 K slices where the tiles fill at most half the GPU and K >= 96 tiles of 128), larger M the
#: 128 x 128 tiles while the 128 x 256 ones fill less than one wave.  Over the sweep's 39 shapes
#: 1.01x (geometric mean) of torch._scaled_mm where fp8_128x256x128_4s_pt_tma alone gave 0.80x
#: (M = 8 / 64 at N = 4096, K = 14336: 0.43 / 0.31x to 1.12 / 0.76x).
FP8_SMALL_TILES = (("fp8_64x128x128_6s_w1_tma", 6.05e-13),
                   ("fp8_64x256x128_4s_w1_tma", 3.17e-13))
FP8_MID_TILE = "fp8_128x128x128_6s_w1_tma"

#: A split-K launch gives one block per tile and K slice, so a persistent configuration would
#: run as its non-persistent form; a persistent choice runs split-K as the configuration whose
#: split form was measured and tested on the H200 instead (the same tile and stages; 40
#: producer registers, where the persistent ones take 56).
SPLIT_TWIN = {"128x256x64_4s_pt": "128x256x64_4s_w1", "128x256x64_4s_w1_pt": "128x256x64_4s_w1",
              "128x256x64_4s_pt_tma": "128x256x64_4s_w1_tma",
              "128x256x64_4s_w1_pt_tma": "128x256x64_4s_w1_tma",
              "fp8_128x256x128_4s_pt": "fp8_128x256x128_4s_w1",
              "fp8_128x256x128_4s_pt_tma": "fp8_128x256x128_4s_w1_tma",
              # the TMA store epilogue stores whole tiles: a K slice's partial sums run direct
              "128x256x64_3s_pt_tma": "128x256x64_4s_w1_tma",
              "128x256x64_3s_pt_tma_ts": "128x256x64_4s_w1_tma",
              "128x256x64_3s_w1_pt_tma": "128x256x64_4s_w1_tma",
              "128x256x64_3s_w1_pt_tma_ts": "128x256x64_4s_w1_tma",
              "128x128x64_4s_w1_pt_tma": "128x128x64_4s_w1_tma",
              # ping-pong's tiles are whole K: a K slice runs one block per tile
              "128x128x64_5s_pp_tma": "128x128x64_4s_w1_tma",
              "128x128x64_5s_w1_pp_tma": "128x128x64_4s_w1_tma",
              "128x128x64_4s_w1_pp_tma": "128x128x64_4s_w1_tma",
              "128x128x64_4s_w1_pp_tma_ts": "128x128x64_4s_w1_tma",
              "128x128x64_4s_w1_pt_tma_ts": "128x128x64_4s_w1_tma",
              "64x128x64_6s_w1_tma_ts": "64x128x64_6s_w1_tma",
              "64x256x64_4s_w1_tma_ts": "64x256x64_4s_w1_tma",
              "128x128x64_6s_w1_tma_ts": "128x128x64_6s_w1_tma",
              "fp8_128x256x128_3s_pt_tma": "fp8_128x256x128_4s_w1_tma",
              "fp8_128x256x128_3s_pt_tma_ts": "fp8_128x256x128_4s_w1_tma",
              # blockwise scaling: split K as the configuration itself (no group in flight)
              "fp8_128x128x128_6s_pt_tma": "fp8_128x128x128_6s_pt_tma",
              "fp8_128x128x128_6s_pt_tma_ts": "fp8_128x128x128_6s_pt_tma",
              "fp8_64x128x128_8s_pt_tma": "fp8_64x128x128_8s_pt_tma",}


def unsupported(p):
    """Why this kernel cannot compute GEMM problem ``p``, or None: it runs bf16 / f16 (any
    layouts) and FP8 with per-tensor scales (K-major operands)."""
    if p.block_scaled is not None:
        return "block-scaled operands run on sm100_scaled_gemm"
    try:
        check_variant(_problem_variant(p))
    except ValueError as exc:
        return str(exc)
    if p.k == 0 and p.tensor_scales is None:
        # no product: sm80_gemm runs the epilogue alone (FP8 has no other kernel: it runs here)
        return "K == 0"
    return None


def tensor_maps_unsupported(p):
    """Why tensor maps cannot describe problem ``p``'s a and b (what the TMA producer loads),
    or None: K == 0 (nothing to load), or an operand whose start or leading dimension is not
    16-byte aligned (:func:`tma_unsupported`)."""
    if p.k == 0:
        return "K == 0"
    return tma_unsupported((("a", p.a.alignment), ("b", p.b.alignment)))


def _tma_only_skip(p):
    """Why TMA-only tiles (the bf16 and FP8 small tiles: no cp.async twin) cannot take problem
    ``p``, or None."""
    if DEFAULT_PRODUCER != "tma":
        return "the small tiles load by TMA, which is not the default producer"
    reason = tensor_maps_unsupported(p)
    if reason is not None:
        return f"{reason} (the small tiles load by TMA only)"
    return None


def small_tiles_skip(p):
    """Why the :data:`SMALL_TILES` do not take bf16 / f16 problem ``p``, or None."""
    reason = _tma_only_skip(p)
    if reason is not None:
        return reason
    # NOTE: M <= 16 keeps sm80_gemm's 16-row tiles with split-K (0.84-0.87x against 0.76x for
    # the 64-row TMA tiles at M = 8 and K = 8192 / 14336).  M > 512 takes them too under two
    # waves of 128 x 256 tiles: the H200 sweep of 2026-12-02 at M = 1024 / 4096 (the persistent
    # tiles against each small one) gave 1024 x 1024 x 2816 0.52 -> 1.42x, 4096 x 256 x 1024
    # 0.69 -> 1.06x, 1024 x 1024 x 1024 0.64 -> 0.96x, 1024 x 6144 x 4096 0.66 -> 0.81x, and
    # within 0.03x of the persistent tiles where those fill a wave (4096 x 1024 x 1024: the cost
    # takes 128 x 256 tiles there).
    if p.m <= 16:
        return f"M = {p.m} <= 16 runs sm80_gemm's 16-row tiles"
    if grid_for(CONFIGS["128x256x64_4s_pt_tma"], p.m, p.n) >= 2 * split_k.NUM_SMS_GUESS:
        return "the 128 x 256 tiles fill the GPU twice"
    return None


def _least_cost(p, tiles, table):
    """The name among ``tiles`` ((name, seconds per wave per BM x BN x K), configurations of
    ``table``) whose waves on 132 SMs x BM x BN x K x that figure is least for ``p``."""
    cost = []
    for name, per in tiles:
        cfg = table[name]
        waves = -(-grid_for(cfg, p.m, p.n) // split_k.NUM_SMS_GUESS)
        cost.append((waves * cfg.bm * cfg.bn * p.k * per, name))
    return min(cost)[1]


def small_tile(p):
    """The name of the :data:`SMALL_TILES` configuration for bf16 / f16 problem ``p`` (the least
    fitted cost), or None where they do not take it (:func:`small_tiles_skip`)."""
    if small_tiles_skip(p) is not None:
        return None
    if p.m >= 256 and tma_store_unsupported(p) is None:
        return _least_cost(p, MID_TILES, CONFIGS)
    return _least_cost(p, SMALL_TILES, CONFIGS)


def fp8_small_tile(p):
    """The FP8 small tile (:data:`FP8_SMALL_TILES`, :data:`FP8_MID_TILE`) for FP8 problem ``p``,
    or None: the persistent 128 x 256 tiles fill the GPU (one wave for M > 64, two for
    M <= 64), or a tensor map cannot describe the operands (these tiles load by TMA only)."""
    if _tma_only_skip(p) is not None:
        return None
    wide = grid_for(FP8_CONFIGS["fp8_128x256x128_4s_pt_tma"], p.m, p.n)
    if p.m > 64:
        return FP8_MID_TILE if wide < split_k.NUM_SMS_GUESS else None
    if wide >= 2 * split_k.NUM_SMS_GUESS:
        return None
    return _least_cost(p, FP8_SMALL_TILES, FP8_CONFIGS)


def small_split(p, cfg: Sm90Config):
    """Split-K for the small tiles, or None for another configuration: 2 slices where the tiles
    fill at most half the GPU and K is long (measured on the H200: M = 8 .. 128 at N = 4096,
    K = 14336 from 0.56-0.72x to 0.76-0.83x of cuBLAS with 2 slices, M = 64 at N = 8192,
    K = 28672 1.00 to 1.02x; more slices, or K = 4096, lose: each slice writes and reads its
    float32 partial tile)."""
    name = cfg.name.removesuffix("_ts")  # a TMA store form splits as its direct twin
    if name in dict(FP8_SMALL_TILES):  # 8 x 4096 x 14336: 0.97 -> 1.12x with 2 slices
        long_k = 96
    elif name in dict(SMALL_TILES):
        long_k = 128
    else:
        return None
    if grid_for(cfg, p.m, p.n) * 2 <= split_k.NUM_SMS_GUESS and -(-p.k // cfg.bk) >= long_k:
        return split_k.slices(cfg, p.k, 2)
    return 1, p.k


def split(p, cfg: Sm90Config):
    """(K slices, k_chunk) of ``cfg``'s launch for ``p``: the small tiles' own rule
    (:func:`small_split`), else split_k.choose_split for one 384-thread block per SM and
    M <= 256 (M = 128 / 256 at N = 8192 give 32 / 64 tiles); (1, K): none."""
    forced = os.environ.get("NUMBATC_SPLIT_K")
    # NOTE: FP8 splits where NUMBATC_SPLIT_K asks and on its small tiles' own rule (the split
    # form ran on the H200 in the FP8 sweep of 2026-12-02, 1 to 8 slices, every result checked);
    # the other FP8 configurations do not split by themselves.
    if not forced:
        small = small_split(p, cfg)
        if small is not None:
            return small
        if p.tensor_scales is not None:
            return 1, p.k
    return split_k.choose_split(cfg, p.m, p.k, grid_for(cfg, p.m, p.n), blocks_per_sm=1,
                                max_m=256)


def choose(p, name=None):
    """The configuration for problem ``p``: the heuristic's, or ``name``'s (one of CONFIGS,
    FP8_CONFIGS for FP8, forced); a TMA configuration whose operands a tensor map cannot
    describe runs as its cp.async twin (NUMBATC_PRINT_CONFIG says so: never a silent copy), a
    TMA-only one (no twin) is a ValueError.  (A split launch runs a persistent configuration as
    its :data:`SPLIT_TWIN`: see :func:`compiled`.)

    The heuristic, on :data:`DEFAULT_PRODUCER`: bf16 / f16 the :data:`SMALL_TILES` where they
    take the problem, else the persistent 128 x 256 tiles for N > 128 (with the TMA store
    epilogue where out allows it: :data:`TMA_STORE_FORM`) and 128 x 128 ones (one wgmma group in
    flight) for the rest; FP8 the same without small tiles."""
    fp8 = p.tensor_scales is not None
    table = FP8_CONFIGS if fp8 else CONFIGS
    if name is not None:
        if name not in table:
            raise ValueError(f"no sm90 {'FP8 ' if fp8 else ''}config {name!r}; choose from "
                             f"{sorted(table)}")
        if getattr(p, "blockwise", False) and name not in BLOCKWISE_CONFIGS:
            raise ValueError(f"sm90 config {name} does not take blockwise FP8 scales; choose "
                             f"from {list(BLOCKWISE_CONFIGS)}")
        return _producer_for(p, table[name])
    if fp8 and getattr(p, "blockwise", False):
        return blockwise_config(p)
    if fp8:
        # persistent for N > 128: with the TMA producer 1156 / 1342 TFLOP/s at 4096^3 / 8192^3
        # against 1087 / 1159 for _w1 (H200, docs/PERFORMANCE.md)
        name = fp8_small_tile(p) or (
            "fp8_128x256x128_4s_pt" if p.n > 128 else "fp8_128x128x128_4s_w1")
    else:
        # NOTE: measured on the H200 (docs/PERFORMANCE.md, 2026-11-30), same runs: the
        # persistent 128x256x64_4s_pt 668 / 617 TFLOP/s at 4096^3 / 8192^3 against 638 / 581
        # for one block per tile (128x256x64_4s), itself 1-4 % ahead of _w1; the two-CTA
        # cluster form (half of B's L2 traffic, since removed) 378 / 435: L2 is not the limit.
        name = small_tile(p) or ("128x256x64_4s_pt" if p.n > 128 else "128x128x64_4s_w1")
    cfg = _producer_for(p, with_producer(table[name], DEFAULT_PRODUCER))
    store = TMA_STORE_FORM.get(cfg.name)
    if store is not None and tma_store_unsupported(p) is None:
        return table[store]
    return cfg


#: The persistent 128 x 256 TMA tiles' TMA store epilogue form, which the heuristic takes where
#: out allows it (bf16 / f16, row-major, 16-byte aligned; else it keeps the 4-stage direct-store
#: form, which measured 1-2 % ahead of the 3-stage one).  Measured on the H200 (sweep_gemm.py,
#: 2026-12-02, same-run ratios to cuBLAS / torch._scaled_mm, b = w.T): bf16 4096^3 0.90 ->
#: 0.98x, Llama-3-8B qkv / gate_up / down at M = 4096 0.86 / 0.90 / 0.95 -> 0.95 / 0.99 / 0.96x,
#: the hidden-1024 up and lm_head layers (4096 x 2816 / 32000 x 1024) 0.63 / 0.76 -> 0.87 /
#: 0.99x; FP8 4096^3 / 8192^3 0.98 / 0.94 -> 1.15 / 0.98x.  The epilogue's global stores, from
#: registers, stalled the consumers (LG throttle) before the next tile's main loop; the TMA
#: stores drain under it.
TMA_STORE_FORM = {"128x256x64_4s_pt_tma": "128x256x64_3s_pt_tma_ts",
                  "fp8_128x256x128_4s_pt_tma": "fp8_128x256x128_3s_pt_tma_ts"}


#: The configurations that run FP8 with blockwise scales (Sm90Fp8Variant.blockwise): 128-column
#: tiles, no wgmma group in flight, TMA only.
BLOCKWISE_CONFIGS = ("fp8_128x128x128_6s_pt_tma_ts", "fp8_128x128x128_6s_pt_tma",
                     "fp8_64x128x128_8s_pt_tma")


def blockwise_config(p):
    """The configuration for FP8 problem ``p`` with blockwise scales: the 64-row tiles where the
    128-row ones would leave more than half the SMs idle, else the 128-row ones, with the TMA
    store epilogue where out allows it.  (Not yet tuned on a GPU.)"""
    reason = tensor_maps_unsupported(p)
    if reason is not None:
        raise ValueError(f"FP8 with blockwise scales loads a and b by TMA only, and {reason}")
    if grid_for(FP8_CONFIGS["fp8_128x128x128_6s_pt_tma"], p.m, p.n) * 2 < split_k.NUM_SMS_GUESS:
        return FP8_CONFIGS["fp8_64x128x128_8s_pt_tma"]
    if tma_store_unsupported(p) is None:
        return FP8_CONFIGS["fp8_128x128x128_6s_pt_tma_ts"]
    return FP8_CONFIGS["fp8_128x128x128_6s_pt_tma"]


def _producer_for(p, cfg: Sm90Config) -> Sm90Config:
    """``cfg``, or where it loads by TMA and a tensor map cannot describe ``p``'s operands its
    cp.async twin, where it stores by TMA and a tensor map cannot describe ``p``'s out its
    direct-store twin (each printed under NUMBATC_PRINT_CONFIG); a ValueError for a TMA-only
    one."""
    if cfg.producer != "tma":
        return cfg
    if cfg.store == "tma":
        reason = tma_store_unsupported(p)
        if reason is not None:
            twin = with_store(cfg, "direct")
            if os.environ.get("NUMBATC_PRINT_CONFIG"):
                print(f"numbatc.gemm: sm90_gemm {twin.name}, not {cfg.name}: {reason}",
                      file=sys.stderr)
            cfg = twin
    reason = tensor_maps_unsupported(p)
    if reason is None:
        return cfg
    twin = with_producer(with_store(cfg, "direct"), "cp.async")
    if twin.producer == "tma":  # a forced TMA-only configuration
        raise ValueError(f"sm90 config {cfg.name} loads by TMA only, and {reason}; force "
                         "another configuration or pass operands a tensor map can describe")
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.gemm: sm90_gemm {twin.name}, not {cfg.name}: {reason}", file=sys.stderr)
    return twin


def _problem_variant(p, **fields):
    if p.tensor_scales is not None:
        return epilogue.variant_for(p, Sm90Fp8Variant, b_dtype=p.b_dtype,
                                    blockwise=getattr(p, "blockwise", False), **fields)
    return epilogue.variant_for(p, **fields)


def _split_form(p, cfg: Sm90Config):
    """(the configuration a launch of ``cfg`` for ``p`` runs, its (K slices, k_chunk)): split
    as :func:`split` says for ``cfg``, and then run as its :data:`SPLIT_TWIN`."""
    slices = split(p, cfg)
    if slices[0] > 1 and cfg.name in SPLIT_TWIN:
        cfg = (FP8_CONFIGS if cfg.elem_bytes == 1 else CONFIGS)[SPLIT_TWIN[cfg.name]]
    return cfg, slices


def compiled(p, cfg: Sm90Config):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments): cfg, or its :data:`SPLIT_TWIN` where K is split; :class:`Sm90Fp8Variant` for
    FP8, else the GemmVariant, split-K where :func:`split` splits."""
    run, slices = _split_form(p, cfg)
    return run, _problem_variant(p, split_k=slices[0] > 1)


def launch(p, cfg: Sm90Config):
    """Launch ``cfg`` for problem ``p`` on its stream (as sm80_gemm.launch; split, as its
    :data:`SPLIT_TWIN`); FP8 folds alpha * scale_a * scale_b into the kernel's alpha, which the
    relaunch function then takes as alpha."""
    run, slices = _split_form(p, cfg)
    alpha = p.alpha
    if p.tensor_scales is not None:
        alpha = p.alpha * p.tensor_scales[0] * p.tensor_scales[1]
    var = _problem_variant(p, split_k=slices[0] > 1)
    return operands.launch_gemm(launch_flat, p, run, var, slices, grid_for(run, p.m, p.n), alpha)
