"""GEMM with a row softmax fused into its epilogue (sm_80 and newer):
``out = softmax(scale * (a @ b) + bias)`` over each row, for N <= 256 (a row fits one tile).

One block owns BM full rows: its tile is BM x BN with BN >= N (64, 128 or 256), so no other
block touches its rows.  The main loop is sm80_gemm's (cp.async multistage pipeline into swizzled
shared tiles, ldmatrix, mma.sync m16n8k16, fp32 accumulators as named variables; the same loaders
and fragment offsets, imported from it).  The epilogue:

1. ``v = scale * acc + bias[col]``, and -inf for columns >= N (the zero-filled padding);
2. row maximum: each lane's maximum over its columns of each of its rows (lane l holds rows l/4
   and l/4 + 8 of every 16x8 tile, columns 2(l%4) and 2(l%4) + 1), then over the four lanes of
   the quad that share the row (butterfly shuffles 1 and 2), then over the WARPS_N warps that
   hold other columns of the row (a [WARPS_N][BM] float32 shared array);
3. ``e = exp2(v * log2 e - max * log2 e)``, row sums reduced the same way;
4. ``e / sum`` converted and stored (bounds-checked pairs of columns).

The face every kernel module has (``CONFIGS``, ``unsupported``, ``choose``, ``compiled``,
``launch``) takes a :class:`numbatc.softmax_api.GemmSoftmaxProblem`.
"""

import functools
import math

from numbatc.kernels import gpus
from numbatc.kernels.build import load_generated
from numbatc.kernels.epilogue import CONVERSIONS, QUAD_REDUCTIONS, GemmVariant, to_f32_expr
from numbatc.kernels.sm80_gemm import (  # the sm80 kernel's main loop, which this one runs
    Sm80Config,
    loader_source,
    mainloop_source,
    module_header,
    tile_row_bytes,
)

__all__ = ["CONFIGS", "MAX_N", "choose", "choose_config", "compiled", "kernel_for",
           "kernel_source", "launch", "launch_flat", "shared_total", "signature", "unsupported"]

#: The widest row the fused kernel holds in one tile.
MAX_N = 256

CONFIGS = {
    c.name: c
    for c in (
        Sm80Config("32x64x64_4w_4s", 32, 64, 64, 1, 4, 4),
        Sm80Config("64x64x64_4w_4s", 64, 64, 64, 2, 2, 4),
        Sm80Config("32x128x64_4w_4s", 32, 128, 64, 1, 4, 4),
        Sm80Config("64x128x64_4w_4s", 64, 128, 64, 2, 2, 4),
        Sm80Config("32x256x64_8w_4s", 32, 256, 64, 1, 8, 4),
        Sm80Config("64x256x64_8w_3s", 64, 256, 64, 2, 4, 3),
        # 80 KB: the 256-column rows where a block gets 99 KB (8.6, 8.9, 12.x), which the two
        # above (144 and 120 KB) exceed; reasoned from the limits, not measured
        Sm80Config("64x256x32_8w_4s", 64, 256, 32, 2, 4, 4),
    )
}

_NUM_SMS_GUESS = 132  # H100/H200: only shapes the choice, never correctness


def shared_total(cfg: Sm80Config) -> int:
    """Shared memory of one block: the main loop's stages (dynamic) and the [WARPS_N][BM]
    float32 row maxima and sums (static)."""
    return cfg.shared_bytes + 2 * 4 * cfg.warps_n * cfg.bm


def _check_fits(cfg: Sm80Config, cc):
    """A ValueError naming the limit where ``cfg`` cannot launch on a GPU of compute capability
    ``cc``."""
    lim = gpus.limits(cc)
    if not gpus.fits(lim, shared_total(cfg), cfg.threads):
        raise ValueError(
            f"sm80_gemm_softmax config {cfg.name} needs {gpus.kb(shared_total(cfg))} of shared "
            f"memory per block; compute capability {lim.name} allows "
            f"{gpus.kb(lim.shared_per_block)}")


def choose_config(m, n, cc=None):
    """The narrowest tile that holds a row (BN >= n); 64-row tiles when they still give every SM
    a block, else 32-row tiles (more blocks for the same M); of those, only the ones whose
    shared memory fits one block of a GPU of compute capability ``cc`` (None: the emulation's
    9.0; numbatc.kernels.gpus): where the preferred one does not, the first of its width that
    does."""
    if n > MAX_N:
        raise ValueError(f"the fused GEMM + softmax holds rows of at most {MAX_N} columns, got {n}")
    bn = 64 if n <= 64 else 128 if n <= 128 else 256
    bm = 64 if -(-m // 64) >= _NUM_SMS_GUESS else 32
    lim = gpus.limits(cc)
    wide = [c for c in CONFIGS.values()
            if c.bn == bn and gpus.fits(lim, shared_total(c), c.threads)]
    return next((c for c in wide if c.bm == bm), wide[0])


def kernel_source(cfg: Sm80Config, var: GemmVariant) -> str:
    """Python source of the kernel.  ``var``: operand layouts, in/out/bias dtypes (c and the
    activation unused)."""
    BM, BK = cfg.bm, cfg.bk
    WM, WN, WARPS_N = cfg.warp_m, cfg.warp_n, cfg.warps_n
    MI, NJ = WM // 16, WN // 8
    a_kmajor, b_kmajor = var.a_layout == "row", var.b_layout == "col"
    a_rowb, b_rowb = tile_row_bytes(cfg, var)
    a_elems = BM * BK
    lines = []
    w = lines.append
    module_header(w, "sm80_gemm_softmax", cfg, var,
                  constants=f"NEG = np.float32(-math.inf)\nL2E = np.float32({math.log2(math.e)!r})\n")
    w(QUAD_REDUCTIONS)
    w(CONVERSIONS)
    a_per_row = loader_source(w, cfg, "a", var.a_layout, a_rowb, 0)
    b_per_row = loader_source(w, cfg, "b", var.b_layout, b_rowb, a_elems)

    if var.bias_dtype is not None:
        w(f'''

@cuda.jit(device=True, forceinline=True)
def logit(bias, v, col, N, scale):
    """scale * v + bias[col]; -inf past the last column."""
    if col < N:
        x = bias[col]
        return scale * v + {to_f32_expr(var.bias_dtype)}
    return NEG''')
    else:
        w('''

@cuda.jit(device=True, forceinline=True)
def logit(bias, v, col, N, scale):
    """scale * v; -inf past the last column."""
    return scale * v if col < N else NEG''')
    if var.out_dtype == "float32":
        store = '''    out[o] = v0
    if both:
        out[o + 1] = v1'''
    else:
        pack = "nt.pack_bf16x2" if var.out_dtype == "bfloat16" else "nt.pack_f16x2"
        store = f'''    p = {pack}(v0, v1)
    out[o] = np.uint16(p & 0xFFFF)
    if both:
        out[o + 1] = np.uint16(p >> 16)'''
    w(f'''

@cuda.jit(device=True, forceinline=True)
def store_pair(out, r, col, v0, v1, M, N, ldo):
    if r >= M or col >= N:
        return
    both = col + 1 < N
    o = r * ldo + col
{store}''')

    a_start = "m0 * lda + a_c0 + a_r0 * lda" if a_kmajor else "a_r0 * lda + m0 + a_c0"
    b_start = "b_c0 + b_r0 * ldb" if b_kmajor else "b_r0 * ldb + b_c0"
    w(f'''

@cuda.jit(cache=True)
def gemm_kernel(a, b, bias, out, M, N, K, lda, ldb, ldo, scale):
    smem = cuda.shared.array(0, np.uint8, alignment=1024)  # sm80_gemm's main loop: bytes
    red_m = cuda.shared.array({WARPS_N * BM}, np.float32)  # [WARPS_N][BM] partial row maxima
    red_s = cuda.shared.array({WARPS_N * BM}, np.float32)  # [WARPS_N][BM] partial row sums
    t = cuda.threadIdx.x
    lane = t % 32
    warp = t // 32
    wm = warp // {WARPS_N}
    wn = warp % {WARPS_N}
    m0 = cuda.blockIdx.x * {BM}
    k_tiles = (K + {BK - 1}) // {BK}
    m_lim = M - m0
    n_lim = N

    a_r0 = t // {a_per_row}
    a_c0 = (t % {a_per_row}) * 8
    b_r0 = t // {b_per_row}
    b_c0 = (t % {b_per_row}) * 8
    a_start = {a_start}
    b_start = {b_start}
''')
    mainloop_source(w, cfg, var)  # sm80_gemm's: accumulators, prologue, k loop

    # --- epilogue: the fused softmax ----------------------------------------------------------
    w(f'''
    nt.cp_async_wait_all()

    # Epilogue 1: logits; lane l holds rows g, g + 8 and columns tq, tq + 1 of each 16x8 tile.
    g = lane // 4
    tq = (lane % 4) * 2
    col_base = wn * {WN} + tq''')
    # x_i_j_e: element e (0..3) of tile (i, j); rows h = e // 2
    for i in range(MI):
        for j in range(NJ):
            for e in range(4):
                w(f"    x_{i}_{j}_{e} = logit(bias, acc_{i}_{j}[{e}], col_base + {j * 8 + e % 2}, N, scale)")

    def across_warps(var_name, red, combine):
        """Emit the reduction of row values ``<var_name>_i_h`` over the WARPS_N warps that hold a
        row: one lane per quad writes its value to shared ``red``, then every lane combines the
        row's WARPS_N entries (``combine`` of their source texts)."""
        if WARPS_N == 1:
            return
        w("    if lane % 4 == 0:")
        for i, h in rows:
            w(f"        {red}[wn * {BM} + wm * {WM} + {i * 16 + h * 8} + g] = {var_name}_{i}_{h}")
        w("    cuda.syncthreads()")
        for i, h in rows:
            idx = f"wm * {WM} + {i * 16 + h * 8} + g"
            w(f"    {var_name}_{i}_{h} = "
              f"{combine([f'{red}[{q * BM} + {idx}]' for q in range(WARPS_N)])}")

    w("    # Epilogue 2: row maxima over the lane's columns, the quad, then the row's warps.")
    rows = [(i, h) for i in range(MI) for h in range(2)]
    for i, h in rows:
        vals = [f"x_{i}_{j}_{2 * h + c}" for j in range(NJ) for c in range(2)]
        w(f"    m_{i}_{h} = quad_max(max({', '.join(vals)}))")
    across_warps("m", "red_m", lambda terms: f"max({', '.join(terms)})")
    w("    # Epilogue 3: exponentials and row sums, reduced the same way.")
    for i, h in rows:
        w(f"    mb_{i}_{h} = m_{i}_{h} * L2E")
        w(f"    s_{i}_{h} = np.float32(0)")
    for i in range(MI):
        for j in range(NJ):
            for e in range(4):
                h = e // 2
                w(f"    x_{i}_{j}_{e} = math.exp2(x_{i}_{j}_{e} * L2E - mb_{i}_{h})")
                w(f"    s_{i}_{h} += x_{i}_{j}_{e}")
    for i, h in rows:
        w(f"    s_{i}_{h} = quad_sum(s_{i}_{h})")
    across_warps("s", "red_s", " + ".join)
    w("    # Epilogue 4: normalise, convert, store.")
    for i, h in rows:
        w(f"    inv_{i}_{h} = np.float32(1) / s_{i}_{h}")
    w(f"    row_base = m0 + wm * {WM} + g")
    for i in range(MI):
        for j in range(NJ):
            for h in range(2):
                w(f"    store_pair(out, row_base + {i * 16 + h * 8}, col_base + {j * 8}, "
                  f"x_{i}_{j}_{2 * h} * inv_{i}_{h}, x_{i}_{j}_{2 * h + 1} * inv_{i}_{h}, M, N, ldo)")
    return "\n".join(lines) + "\n"


@functools.cache
def kernel_for(cfg: Sm80Config, var: GemmVariant):
    return load_generated("sm80_gemm_softmax", kernel_source(cfg, var))


_STORAGE = {"bfloat16": "uint16", "float16": "uint16", "float32": "float32"}


@functools.cache
def signature(var: GemmVariant):
    from numba import types

    def ptr(dtype):
        return types.CPointer(getattr(types, _STORAGE[dtype]))

    i64 = types.int64
    return (ptr(var.in_dtype), ptr(var.in_dtype), ptr(var.bias_dtype or var.out_dtype),
            ptr(var.out_dtype), i64, i64, i64, i64, i64, i64, types.float32)


def launch_flat(cfg, var, a, b, bias, out, m, n, k, lda, ldb, ldo, scale, stream=0,
                prepare=False):
    """Operands flat (device pointers on the GPU, 1-d arrays in the emulation); a and b 16-byte
    aligned with 16-byte aligned leading dimensions (the caller packs them otherwise).

    ``prepare=True``: launch through an ``intrinsics.launch.PreparedLaunch`` and return a
    relaunch function ``fn(a, b, bias, out, scale, stream)`` for the same shapes and leading
    dimensions (numbatc.gemm_softmax's warm calls); None where there is none (the emulation)."""
    import numpy as np
    from numba import config

    from intrinsics import launch as launching

    grid = -(-m // cfg.bm)
    if prepare and not config.ENABLE_CUDASIM:
        prepared = launching.prepare(kernel_for(cfg, var), grid, cfg.threads, signature(var),
                                     shared_bytes=cfg.shared_bytes)
        if prepared is not None:
            def relaunch(a, b, bias, out, scale, stream):
                prepared(stream, a, b, bias, out, m, n, k, lda, ldb, ldo, scale)

            relaunch(a, b, bias, out, float(scale), stream)
            return relaunch
    sig = None if config.ENABLE_CUDASIM else signature(var)
    launching.launch(kernel_for(cfg, var), grid, cfg.threads,
                     (a, b, bias, out, m, n, k, lda, ldb, ldo, np.float32(scale)),
                     shared_bytes=cfg.shared_bytes, stream=stream, signature=sig)
    return None


# ---------------------------------------------------------------------------------------------
# The face every kernel module has (see numbatc.kernels.dispatch): from a
# numbatc.softmax_api.GemmSoftmaxProblem to a configuration and a launch
# ---------------------------------------------------------------------------------------------


def unsupported(p):
    """Why this kernel cannot compute GEMM + softmax problem ``p``, or None: bfloat16 or
    float16 inputs, rows that fit one tile (N <= MAX_N), a row-major out."""
    if p.in_dtype not in ("bfloat16", "float16"):
        return f"sm80_gemm_softmax takes bfloat16 or float16 inputs, not {p.in_dtype}"
    if p.n > MAX_N:
        return f"N > {MAX_N} does not fit the fused kernel's tile"
    if p.out.layout != "row" and p.n > 1:
        return "out is not row-major"
    return None


def choose(p, name=None):
    """The configuration for problem ``p`` (``name``: one of CONFIGS, forced, a ValueError where
    it does not fit the problem's GPU; else :func:`choose_config`'s for its shape and GPU)."""
    if name is None:
        return choose_config(p.m, p.n, p.cc)
    if name not in CONFIGS:
        raise ValueError(f"no sm80_gemm_softmax config {name!r}; choose from {sorted(CONFIGS)}")
    cfg = CONFIGS[name]
    _check_fits(cfg, p.cc)
    if cfg.bn < p.n:
        raise ValueError(f"sm80_gemm_softmax config {name!r} holds rows of {cfg.bn} columns, "
                         f"not {p.n}")
    return cfg


def compiled(p, cfg: Sm80Config):
    """(configuration, variant) that a launch of ``cfg`` for ``p`` compiles (kernel_for's
    arguments)."""
    return cfg, GemmVariant(a_layout=p.a.layout, b_layout=p.b.layout, in_dtype=p.in_dtype,
                            out_dtype=p.out_dtype, c_dtype=None, bias_dtype=p.bias_dtype,
                            activation=None)


def launch(p, cfg: Sm80Config):
    """Launch ``cfg`` for a :class:`numbatc.softmax_api.GemmSoftmaxProblem` on its stream (m,
    n >= 1; K == 0 reads neither a nor b): a and b packed where not 16-byte aligned.  Returns
    the relaunch function ``fn(a, b, bias, out, scale, stream)`` of :func:`launch_flat`
    (numbatc.gemm_softmax's warm calls) or None (the emulation, K == 0, a packed operand,
    ``NUMBATC_PRINT_CONFIG`` set)."""
    import os

    from numba import config

    from numbatc.interop import devices
    from numbatc.kernels import operands

    cfg, var = compiled(p, cfg)
    _check_fits(cfg, p.cc)
    emulated = bool(config.ENABLE_CUDASIM)
    keep = []
    with devices.device_scope(p.device):
        out = operands.flat_array(p.out.array, keep)
        if p.k == 0:  # a and b are never read
            a, lda, b, ldb = out, 1, out, 1
        else:
            a, lda = operands.operand(p.a, p.stream if p.a.alignment != 16 else 0, keep)
            b, ldb = operands.operand(p.b, p.stream if p.b.alignment != 16 else 0, keep)
        bias = operands.flat_array(p.bias.array, keep) if p.bias is not None else out
        warm = (not emulated and p.k > 0 and p.a.alignment == 16 and p.b.alignment == 16
                and not os.environ.get("NUMBATC_PRINT_CONFIG"))
        return launch_flat(cfg, var, a, b, bias, out, p.m, p.n, p.k, lda, ldb, p.out.ld,
                           p.scale, stream=p.stream if emulated else p.stream_handle,
                           prepare=warm)
