"""Choose a kernel and configuration for a :class:`numbatc.gemm.GemmProblem` and launch it.

The choice is a heuristic on the problem's shape; ``NUMBATC_PRINT_CONFIG=1`` prints it (with the
reason for any fallback) to stderr.
"""

import os
import sys

from numba import config

from numbatc.kernels import operands, sm80_gemm
from numbatc.kernels.epilogue import GemmVariant
from numbatc.kernels.split_k import release_captured, split_workspace

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["choose_sm80", "launch_gemm", "env_key", "release_captured"]

#: The environment variables that steer the choice of kernel and configuration.
_ENV_VARS = ("NUMBATC_SM80_CONFIG", "NUMBATC_GEMM_KERNEL", "NUMBATC_PRINT_CONFIG",
             "NUMBATC_SPLIT_K")
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_BYTES = [os.environ.encodekey(v) for v in _ENV_VARS] if _ENV_DATA is not None else None


def env_key():
    """The values of the variables that steer dispatch (see _ENV_VARS), as a cheap tuple: part of
    numbatc.gemm's fast-path key, so that a relaunch function is never used after one changes.
    NOTE: ``os.environ.get`` costs ~0.4 us per missing name (a KeyError inside); os.environ's own
    dict (kept in step by os.environ's setters) costs ~40 ns."""
    if _ENV_BYTES is not None:
        get = _ENV_DATA.get
        return (get(_ENV_BYTES[0]), get(_ENV_BYTES[1]), get(_ENV_BYTES[2]), get(_ENV_BYTES[3]))
    return tuple(os.environ.get(v) for v in _ENV_VARS)

_NUM_SMS_GUESS = 132  # H100/H200; only shapes the heuristic, never correctness


def choose_sm80(m, n, k):
    """Tile configuration for an (m, n, k) problem: small M gets short tiles, problems that fill
    the GPU with 128x256 tiles get those, the rest 128x128.  ``NUMBATC_SM80_CONFIG=<name>``
    forces one of sm80_gemm.CONFIGS (for benchmarks and experiments)."""
    forced = os.environ.get("NUMBATC_SM80_CONFIG")
    if forced:
        if forced not in sm80_gemm.CONFIGS:
            raise ValueError(f"NUMBATC_SM80_CONFIG={forced!r} is not one of {sorted(sm80_gemm.CONFIGS)}")
        return sm80_gemm.CONFIGS[forced]
    if m <= 16:
        return sm80_gemm.CONFIGS["16x128x64_4w_6s"]
    if m <= 64:
        return sm80_gemm.CONFIGS["64x128x64_4w_4s"]
    big = sm80_gemm.CONFIGS["128x256x64_8w_3s"]
    if sm80_gemm.grid_for(big, m, n) >= _NUM_SMS_GUESS:
        return big
    return sm80_gemm.CONFIGS["128x128x64_4w_4s"]


def choose_split(cfg, m, n, k, family=sm80_gemm, blocks_per_sm=2, max_m=64):
    """(splits, k_chunk) for a split-K launch of ``family`` (sm80_gemm, sm90_gemm): small-M
    problems whose tiles cannot fill the GPU (M <= 64 gives one tile row; N = 8192 gives 64
    tiles for 132 SMs) split K into ``splits`` slices of ``k_chunk`` values (a multiple of BK)
    so that about ``blocks_per_sm`` blocks per SM stream B at once; each slice keeps >= 4 k
    tiles, at most 16 slices; only for M <= ``max_m``.  (1, k): no split.
    ``NUMBATC_SPLIT_K=<n>`` forces n slices (1: none), for benchmarks."""
    k_tiles = -(-k // cfg.bk)
    forced = os.environ.get("NUMBATC_SPLIT_K")
    if forced:
        splits = int(forced) if forced.strip().isdigit() else 0
        if splits < 1:
            raise ValueError(f"NUMBATC_SPLIT_K={forced!r}: a positive number of K slices")
    elif m > max_m:
        splits = 1
    else:
        tiles = max(1, family.grid_for(cfg, m, n))
        splits = min(blocks_per_sm * _NUM_SMS_GUESS // tiles, k_tiles // 4, 16)
    if splits < 2 or k_tiles < 2:
        return 1, k
    per = -(-k_tiles // splits)  # k tiles per slice; no slice left empty
    return -(-k_tiles // per), per * cfg.bk


# A split-K launch gives one block per tile and K slice, so a persistent configuration would
# run as its non-persistent form; the heuristic's persistent choice runs split-K as the
# configuration whose split form was measured and tested on the H200 instead (the same tile and
# stages; 40 producer registers, where the persistent ones take 56).
_SPLIT_TWIN = {"128x256x64_4s_pt": "128x256x64_4s_w1", "128x256x64_4s_w1_pt": "128x256x64_4s_w1",
               "128x256x64_4s_pt_tma": "128x256x64_4s_w1_tma",
               "128x256x64_4s_w1_pt_tma": "128x256x64_4s_w1_tma",
               "fp8_128x256x128_4s_pt": "fp8_128x256x128_4s_w1",
               "fp8_128x256x128_4s_pt_tma": "fp8_128x256x128_4s_w1_tma"}


def _sm90_producer(p, cfg, forced):
    """``cfg`` with the producer it runs with: the heuristic's choice (``forced`` False) as
    sm90_gemm.DEFAULT_PRODUCER's twin; a TMA configuration whose operands a tensor map cannot
    describe (or K == 0: nothing is read) as its cp.async twin, printed under
    NUMBATC_PRINT_CONFIG -- never a silent copy."""
    from numbatc.kernels import sm90_gemm

    if not forced:
        cfg = sm90_gemm.with_producer(cfg, sm90_gemm.DEFAULT_PRODUCER)
    if cfg.producer != "tma":
        return cfg
    reason = "K == 0" if p.k == 0 else sm90_gemm.tma_unsupported(
        (("a", p.a.alignment), ("b", p.b.alignment)))
    if reason is None:
        return cfg
    twin = sm90_gemm.with_producer(cfg, "cp.async")
    if twin.producer == "tma":  # a forced TMA-only configuration
        raise ValueError(f"sm90 config {cfg.name} loads by TMA only, and {reason}; force "
                         "another configuration or pass operands a tensor map can describe")
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.gemm: sm90_gemm {twin.name}, not {cfg.name}: {reason}", file=sys.stderr)
    return twin


def _variant(p):
    # a row-major 16-bit out whose start and rows are 4-byte aligned takes a column pair in one
    # 32-bit store (GemmVariant.out_pairs)
    out_pairs = (p.out.layout == "row" and p.out_dtype in ("bfloat16", "float16")
                 and p.out.alignment >= 4)
    if getattr(p, "tensor_scales", None) is not None:  # FP8, per-tensor scales: sm90_gemm
        from numbatc.kernels import sm90_gemm

        return sm90_gemm.Sm90Fp8Variant(
            a_layout=p.a.layout, b_layout=p.b.layout, in_dtype=p.in_dtype,
            out_dtype=p.out_dtype, c_dtype=p.c.dtype if p.c is not None else None,
            bias_dtype=p.bias_dtype, activation=p.activation, out_layout=p.out.layout,
            c_layout=p.c.layout if p.c is not None else "row", epilogue=p.epilogue,
            epilogue_args=len(p.epilogue_args), b_dtype=p.b_dtype, out_pairs=out_pairs)
    return GemmVariant(
        a_layout=p.a.layout,
        b_layout=p.b.layout,
        in_dtype=p.in_dtype,
        out_dtype=p.out_dtype,
        c_dtype=p.c.dtype if p.c is not None else None,
        bias_dtype=p.bias_dtype,
        activation=p.activation,
        out_layout=p.out.layout,
        c_layout=p.c.layout if p.c is not None else "row",
        epilogue=p.epilogue,
        epilogue_args=len(p.epilogue_args),
        out_pairs=out_pairs,
    )


# numbatc.softmax imports these under their old names; they go when it imports
# numbatc.kernels.operands.flat and .operand instead.
_flat, _operand = operands.flat, operands.operand


#: Hopper tiles for problems whose 128 x 256 tiles do not fill the GPU twice, with the time
#: per wave of tiles in seconds per (BM x BN x K) multiply-add, fitted (median) to the H200
#: sweep of 2026-12-01 (scripts/sweep_gemm.py, docs/PERFORMANCE.md): M in {8 .. 512} x the
#: shape table's layers, each tile without split-K.  The heuristic takes the tile whose waves x
#: BM x BN x K x that figure is least: 0.84 (geometric mean) of cuBLAS over the 78 shapes where
#: the persistent 128 x 256 tiles gave 0.67 and the best of the candidates per shape 0.90.
_SMALL_TILES = (("64x128x64_6s_w1_tma", 64, 128, 7.44e-10),
                ("64x256x64_4s_w1_tma", 64, 256, 4.87e-10),
                ("128x128x64_6s_w1_tma", 128, 128, 5.32e-10),
                ("128x256x64_4s_w1_tma", 128, 256, 3.92e-10))


def _small_tile(p):
    """The Hopper configuration for a problem too small for the persistent 128 x 256 tiles
    (fewer than two waves of them on 132 SMs, 16 < M <= 512), or None: other problems, and
    operands that a tensor map cannot describe (these tiles load by TMA only)."""
    from numbatc.kernels import sm90_gemm

    if sm90_gemm.DEFAULT_PRODUCER != "tma" or p.k == 0 or sm90_gemm.tma_unsupported(
            (("a", p.a.alignment), ("b", p.b.alignment))) is not None:
        return None

    def tiles(bm, bn):
        return -(-p.m // bm) * -(-p.n // bn)

    # NOTE: M <= 16 keeps sm80_gemm's 16-row tiles with split-K (0.84-0.87x against 0.76x for
    # the 64-row TMA tiles at M = 8 and K = 8192 / 14336), and M > 512 the persistent 128 x 256
    # tiles (the fit covers M = 8 .. 512: at M = 4096, N = K = 1024 it chose 64 x 128 tiles at
    # 0.71x where the persistent ones ran at 0.87x).
    if p.m <= 16 or p.m > 512 or tiles(128, 256) >= 2 * _NUM_SMS_GUESS:
        return None
    cost = [(-(-tiles(bm, bn) // _NUM_SMS_GUESS) * bm * bn * p.k * per, name)
            for name, bm, bn, per in _SMALL_TILES]
    return min(cost)[1]


def _small_split(cfg, p):
    """Split-K for the small tiles: 2 slices where the tiles fill at most half the GPU and K is
    long (measured on the H200: M = 8 .. 128 at N = 4096, K = 14336 from 0.56-0.72x to
    0.76-0.83x of cuBLAS with 2 slices, M = 64 at N = 8192, K = 28672 1.00 to 1.02x; more
    slices, or K = 4096, lose: each slice writes and reads its float32 partial tile)."""
    if cfg.name not in {name for name, *_ in _SMALL_TILES}:
        return None
    tiles = -(-p.m // cfg.bm) * -(-p.n // cfg.bn)
    k_tiles = -(-p.k // cfg.bk)
    if tiles * 2 <= _NUM_SMS_GUESS and k_tiles >= 128:
        per = -(-k_tiles // 2)
        return 2, per * cfg.bk
    return 1, p.k


def _kernel_family(p):
    """(module, config) for the problem.

    On compute capability 9.0 (sm_90a: wgmma, setmaxnreg) the Hopper kernel (sm90_gemm) runs
    when it implements the problem; otherwise, and on every other GPU, the portable mma.sync
    kernel (sm80_gemm).  ``NUMBATC_GEMM_KERNEL=sm80`` or ``=sm90[:<config name>]`` forces a
    family (and config); ``NUMBATC_PRINT_CONFIG=1`` prints why the Hopper kernel was not used."""
    from numbatc.kernels import sm90_gemm

    choice = os.environ.get("NUMBATC_GEMM_KERNEL", "")
    if choice and choice.partition(":")[0] not in ("sm80", "sm90", "sm100"):
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: choose sm80, sm90[:<config>] or "
                         "sm100[:<config>]")
    blackwell = p.cc is not None and tuple(p.cc)[0] == 10
    if choice.startswith("sm100") or (blackwell and not choice):
        found = _sm100_family(p, choice)
        if found is not None:
            return found
    hopper = p.cc is not None and tuple(p.cc)[:2] == (9, 0)
    reason = None
    if choice == "sm80":
        reason = "NUMBATC_GEMM_KERNEL=sm80"
    elif not hopper:
        reason = f"compute capability {tuple(p.cc) if p.cc else '?'} is not 9.0"
    elif p.k == 0:
        reason = "K == 0"
    elif _EMULATED and not choice:
        # 384 Python threads per block: tests/emulation runs sm90_gemm directly, at tiny sizes
        reason = "the CPU emulation runs sm80_gemm unless NUMBATC_GEMM_KERNEL=sm90"
    elif p.m <= 64 and not choice and _small_tile(p) is None:
        # M <= 16, or an operand that a tensor map cannot describe (the 64-row Hopper tiles
        # load by TMA only): the 16- and 64-row mma.sync tiles
        reason = ("M <= 64 and M <= 16 or an operand a tensor map cannot describe: sm80_gemm's "
                  "16- / 64-row tiles")
    if reason is None:
        name = choice.partition(":")[2]
        if not name:
            name = _small_tile(p)
        if not name:
            # NOTE: measured on the H200 (docs/PERFORMANCE.md, fourth session), same runs: the
            # persistent 128x256x64_4s_pt 668 / 617 TFLOP/s at 4096^3 / 8192^3 against 638 / 581
            # for one block per tile (128x256x64_4s), itself 1-4 % ahead of _w1; the two-CTA
            # cluster form (_c2, half of B's L2 traffic) 378 / 435: L2 is not the limit.
            name = "128x256x64_4s_pt" if p.n > 128 else "128x128x64_4s_w1"
        if name not in sm90_gemm.CONFIGS:
            raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: no sm90 config {name!r}; choose "
                             f"from {sorted(sm90_gemm.CONFIGS)}")
        forced = bool(choice.partition(":")[2])
        return sm90_gemm, _sm90_producer(p, sm90_gemm.CONFIGS[name], forced)
    if choice.startswith("sm90") and not hopper:
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r} needs compute capability 9.0, this GPU "
                         f"has {tuple(p.cc) if p.cc else '?'}")
    if os.environ.get("NUMBATC_PRINT_CONFIG") and hopper:
        print(f"numbatc.gemm: sm80_gemm, not sm90_gemm: {reason}", file=sys.stderr)
    return sm80_gemm, choose_sm80(p.m, p.n, p.k)


def _fp8_family(p, choice):
    """(sm90_gemm, config) for FP8 with per-tensor scales: sm90_gemm's fp8 form is the only
    kernel, on compute capability 9.0 (and in the emulation, which stands in for one).
    ``NUMBATC_GEMM_KERNEL=sm90:<name>`` picks one of sm90_gemm.FP8_CONFIGS; sm80 or sm100 is
    refused."""
    from numbatc.kernels import sm90_gemm

    family, _, name = choice.partition(":")
    if p.cc is None or tuple(p.cc)[:2] != (9, 0):
        cc = f"sm_{p.cc[0]}{p.cc[1]}" if p.cc else "unknown"
        raise ValueError("FP8 with per-tensor scales needs compute capability 9.0 (sm_90a); "
                         f"this GPU is {cc}")
    if family and family != "sm90":
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: FP8 with per-tensor scales runs on "
                         "sm90 only")
    forced = bool(name)
    # persistent for N > 128: with the TMA producer 1156 / 1342 TFLOP/s at 4096^3 / 8192^3
    # against 1087 / 1159 for _w1 (H200, docs/PERFORMANCE.md)
    name = name or ("fp8_128x256x128_4s_pt" if p.n > 128 else "fp8_128x128x128_4s_w1")
    if name not in sm90_gemm.FP8_CONFIGS:
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: no sm90 FP8 config {name!r}; choose "
                         f"from {sorted(sm90_gemm.FP8_CONFIGS)}")
    sm90_gemm.check_variant(_variant(p))
    return sm90_gemm, _sm90_producer(p, sm90_gemm.FP8_CONFIGS[name], forced)


def _sm100_family(p, choice):
    """(sm100_gemm, config) where the Blackwell kernel implements the problem, else None (the
    reason printed under NUMBATC_PRINT_CONFIG).  NOTE: never run on Blackwell hardware; see
    sm100_gemm."""
    from numbatc.kernels import sm100_gemm

    if choice.startswith("sm100") and not _EMULATED and (p.cc is None or tuple(p.cc)[0] != 10):
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r} needs compute capability 10.x, this "
                         f"GPU has {tuple(p.cc) if p.cc else '?'}")
    reason = None
    try:
        sm100_gemm.check_variant(_variant(p))
    except ValueError as exc:
        reason = str(exc)
    if reason is None and p.k == 0:
        reason = "K == 0"
    if reason is not None:
        if os.environ.get("NUMBATC_PRINT_CONFIG"):
            print(f"numbatc.gemm: sm80_gemm, not sm100_gemm: {reason}", file=sys.stderr)
        return None
    name = choice.partition(":")[2] or ("128x256x64_4s" if p.n > 128 else "128x128x64_4s")
    if name not in sm100_gemm.CONFIGS:
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: no sm100 config {name!r}; choose "
                         f"from {sorted(sm100_gemm.CONFIGS)}")
    return sm100_gemm, sm100_gemm.CONFIGS[name]


def _launch_sm100(p, cfg, var):
    """sm100_gemm's launch: tensor maps of A and B (packed first where not 16-byte aligned),
    c, bias and out as for the other kernels.  No warm relaunch yet (the maps hold pointers)."""
    from numbatc.kernels import sm100_gemm

    keep = []
    out = operands.pointer(p.out, keep)
    a_view, _ = operands.aligned_view(p.a, p.stream)
    b_view, _ = operands.aligned_view(p.b, p.stream)
    ta, tb = sm100_gemm.tensor_maps(cfg, var, a_view, b_view)
    keep += [ta, tb, a_view, b_view]
    c = operands.pointer(p.c, keep) if p.c is not None else out
    bias = operands.pointer(p.bias, keep) if p.bias is not None else out
    extra = operands.epilogue_args(p)
    sm100_gemm.launch(cfg, var, ta.device, tb.device, c, bias, out, p.m, p.n, p.k,
                      p.c.ld if p.c is not None else 0, p.out.ld, p.alpha, p.beta,
                      stream=p.stream if _EMULATED else p.stream_handle, **extra)
    return None


def _scaled_config(p, choice):
    """The sm100_scaled_gemm config for a block-scaled problem: ``NUMBATC_GEMM_KERNEL=sm100:<name>``
    or 128x256 tiles when N > 128, else 128x128.  Block-scaled problems have no other kernel:
    anything but compute capability 10.x (or the emulation forced with =sm100) is refused."""
    from numbatc.kernels import sm100_scaled_gemm

    fmt = p.block_scaled.name
    family, _, name = choice.partition(":")
    blackwell = p.cc is not None and tuple(p.cc)[0] == 10
    if not blackwell and not (_EMULATED and family == "sm100"):
        cc = f"sm_{p.cc[0]}{p.cc[1]}" if p.cc else "unknown"
        raise ValueError(f"block-scaled GEMM ({fmt.upper()}) needs sm_100 (Blackwell); this GPU "
                         f"is {cc}")
    if family and family != "sm100":
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: block-scaled ({fmt.upper()}) GEMM runs "
                         "on sm100 only")
    names = sorted(n for n, c in sm100_scaled_gemm.CONFIGS.items() if c.fmt == fmt)
    name = name or f"{fmt}_128x{256 if p.n > 128 else 128}_{4 if p.n > 128 else 6}s"
    if name not in names:
        raise ValueError(f"NUMBATC_GEMM_KERNEL={choice!r}: no sm100 {fmt.upper()} config {name!r}; "
                         f"choose from {names}")
    return sm100_scaled_gemm.CONFIGS[name]


def _launch_block_scaled(p):
    """sm100_scaled_gemm's launch (NOTE: never run on Blackwell hardware): tensor maps of A and
    B (packed first where not 16-byte aligned), the scales rearranged into their chunk buffers,
    c, bias and out as for the other kernels.  No warm relaunch."""
    from numbatc.kernels import sm100_scaled_gemm as sg

    cfg = _scaled_config(p, os.environ.get("NUMBATC_GEMM_KERNEL", ""))
    fmt = p.block_scaled
    if p.k == 0:
        raise NotImplementedError("block-scaled GEMM with K == 0 and a user epilogue")
    var = sg.ScaledVariant(
        fmt.name, fmt.element_type(p.in_dtype), fmt.element_type(p.b_dtype), p.out_dtype,
        p.c.dtype if p.c is not None else None, p.bias_dtype, p.activation, p.out.layout,
        p.c.layout if p.c is not None else "row", p.epilogue, len(p.epilogue_args))
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(f"numbatc.gemm M={p.m} N={p.n} K={p.k}: sm100_scaled_gemm {cfg.name} "
              f"{p.in_dtype} x {p.b_dtype} ({fmt.name}) -> {p.out_dtype}"
              f"{' +c' if var.c_dtype else ''}{' +bias' if var.bias_dtype else ''}"
              f"{' ' + var.activation if var.activation else ''}", file=sys.stderr)
    keep = []
    out = operands.pointer(p.out, keep)
    a_view, _ = operands.aligned_view(p.a, p.stream)
    b_view, _ = operands.aligned_view(p.b, p.stream)
    ta, tb = sg.tensor_maps(cfg, a_view, b_view)
    groups_a, groups_b = sg.chunk_groups(cfg, p.m, p.n)
    k_tiles = (p.k + cfg.bk - 1) // cfg.bk
    sfa = sg.scale_chunks(p.scale_a.view, groups_a, k_tiles, cfg.chunks, stream=p.stream)
    sfb = sg.scale_chunks(p.scale_b.view, groups_b, k_tiles, cfg.chunks, stream=p.stream)
    keep += [ta, tb, a_view, b_view, sfa, sfb]
    c = operands.pointer(p.c, keep) if p.c is not None else out
    bias = operands.pointer(p.bias, keep) if p.bias is not None else out
    extra = operands.epilogue_args(p)
    sg.launch(cfg, var, ta.device, tb.device, sfa, sfb, c, bias, out, p.m, p.n, p.k,
              p.c.ld if p.c is not None else 0, p.out.ld, p.alpha, p.beta,
              stream=p.stream if _EMULATED else p.stream_handle, **extra)
    return None


def launch_gemm(p):
    """Launch the GEMM for problem ``p`` (m, n >= 1; k >= 1, or 0 with a user epilogue: the
    kernel's main loop then runs no k tile) on its stream.

    Returns a relaunch function ``fn(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, alpha, beta,
    stream_handle)`` that launches the same kernel for another problem with everything but
    those equal (shapes, strides, dtypes, layouts, flags, device; c_ptr and bias_ptr are out_ptr
    when absent; with a user epilogue a ninth argument, its arguments' kernel parameters, see
    epilogue.flat_epilogue_args), or None where there is none: the emulation, K == 0, an
    operand that had to be packed (not 16-byte aligned), ``NUMBATC_PRINT_CONFIG`` set (each call
    prints).  numbatc.gemm caches it (see gemm._FAST).  Block-scaled problems run
    sm100_scaled_gemm (compute capability 10.x only) and return None.  FP8 with per-tensor scales
    (``p.tensor_scales``) runs sm90_gemm's fp8 form (compute capability 9.0 only) with
    alpha * scale_a * scale_b as its alpha; the relaunch function then takes that product as
    alpha."""
    if p.block_scaled is not None:
        return _launch_block_scaled(p)
    scales = getattr(p, "tensor_scales", None)
    alpha = p.alpha
    if scales is not None:
        family, cfg = _fp8_family(p, os.environ.get("NUMBATC_GEMM_KERNEL", ""))
        alpha = p.alpha * scales[0] * scales[1]
    else:
        family, cfg = _kernel_family(p)
    var = _variant(p)
    printing = bool(os.environ.get("NUMBATC_PRINT_CONFIG"))
    fast = (not _EMULATED and not printing and p.k >= 1
            and p.a.alignment == 16 and p.b.alignment == 16)
    if printing:
        print(f"numbatc.gemm M={p.m} N={p.n} K={p.k}: {family.__name__.rsplit('.', 1)[1]} "
              f"{cfg.name} a={var.a_layout}"
              f"{'' if p.a.alignment == 16 else ' (packed: not 16-byte aligned)'} b={var.b_layout}"
              f"{'' if p.b.alignment == 16 else ' (packed: not 16-byte aligned)'} "
              f"{var.in_dtype}{' x ' + p.b_dtype if scales else ''}->{var.out_dtype}"
              f"{' +c' if var.c_dtype else ''}{' +bias' if var.bias_dtype else ''}"
              f"{' ' + var.activation if var.activation else ''}", file=sys.stderr)
    if family.__name__.endswith("sm100_gemm"):
        return _launch_sm100(p, cfg, var)
    keep = []
    out = operands.pointer(p.out, keep)
    if p.k == 0:  # a and b are never read
        a, lda, b, ldb = out, 1, out, 1
    else:
        a, lda = operands.operand(p.a, p.stream if p.a.alignment != 16 else 0, keep)
        b, ldb = operands.operand(p.b, p.stream if p.b.alignment != 16 else 0, keep)
    c = operands.pointer(p.c, keep) if p.c is not None else out
    bias = operands.pointer(p.bias, keep) if p.bias is not None else out
    ldc = p.c.ld if p.c is not None else 0
    # The raw stream handle: intrinsics.launch caches its stream object, so a warm call builds
    # no Numba array or stream objects at all.
    extra = operands.epilogue_args(p)
    if fast:
        extra["prepare"] = True
    splits = 1
    if family is sm80_gemm:
        splits, k_chunk = choose_split(cfg, p.m, p.n, p.k)
    elif (family.__name__.endswith("sm90_gemm") and getattr(cfg, "cluster_m", 1) == 1
          and (scales is None or os.environ.get("NUMBATC_SPLIT_K"))):
        # one 384-thread block per SM; M = 128 / 256 at N = 8192 give 32 / 64 tiles.
        # NOTE: FP8 splits only when NUMBATC_SPLIT_K asks: its split form is emulation- and
        # assembly-verified but has not run on a GPU yet (the bf16 one has).
        small = None if os.environ.get("NUMBATC_SPLIT_K") else _small_split(cfg, p)
        if small is not None:
            splits, k_chunk = small
        else:
            splits, k_chunk = choose_split(cfg, p.m, p.n, p.k, family, blocks_per_sm=1,
                                           max_m=256)
        if splits > 1 and cfg.name in _SPLIT_TWIN:
            twin = _SPLIT_TWIN[cfg.name]
            cfg = family.CONFIGS.get(twin) or family.FP8_CONFIGS[twin]
    if splits > 1:
        import dataclasses

        var = dataclasses.replace(var, split_k=True)
        buffers = split_workspace(p.device, splits * p.m * p.n, family.grid_for(cfg, p.m, p.n),
                                  p.a.array.library)

        def split(stream):
            ws, cnt = buffers(stream)
            return ws, cnt, k_chunk, splits

        extra["split"] = split
        if printing:
            print(f"numbatc.gemm: split-K, {splits} slices of {k_chunk} ({cfg.name})",
                  file=sys.stderr)
    return family.launch(cfg, var, a, b, c, bias, out, p.m, p.n, p.k, lda, ldb, ldc, p.out.ld,
                         alpha, p.beta, stream=p.stream if _EMULATED else p.stream_handle,
                         **extra)
