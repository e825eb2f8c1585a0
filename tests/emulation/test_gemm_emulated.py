"""numbatc.gemm end to end in the CPU emulation (the same kernel source as on the GPU): layouts,
packing of misaligned operands, the fused epilogue, f16/bf16 in, f16/bf16/f32 out.  Small
shapes: every thread of every block is a Python thread here."""

import math

import numpy as np
import pytest
from numba import config, cuda

import numbatc

pytestmark = [pytest.mark.emulation,
              pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="needs NUMBA_ENABLE_CUDASIM=1")]
ml_dtypes = pytest.importorskip("ml_dtypes")


def _values(gen, shape, dtype):
    x = gen.standard_normal(shape)
    return x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)


def _device(x, layout):
    host = x if layout == "row" else np.ascontiguousarray(x.T)
    d = cuda.to_device(host.view(np.uint16) if host.dtype == ml_dtypes.bfloat16 else host)
    if layout == "col":
        from numbatc.interop import transpose_view

        d = transpose_view(d)
    return numbatc.bfloat16(d) if x.dtype == ml_dtypes.bfloat16 else d


@pytest.mark.parametrize("m, n, k, dtype, layouts, out_dtype, epilogue", [
    (40, 24, 33, "float16", ("row", "row"), "float32", None),           # B packed (ld 24 ok, K odd)
    (20, 70, 48, "bfloat16", ("col", "col"), "bfloat16", "gelu"),       # both transposed, +c +bias
    (65, 16, 16, "float16", ("row", "col"), "float16", "silu"),         # two row tiles
])
def test_gemm_in_the_emulation(m, n, k, dtype, layouts, out_dtype, epilogue):
    gen = np.random.default_rng()
    a, b = _values(gen, (m, k), dtype), _values(gen, (k, n), dtype)
    kw = dict(out_dtype=out_dtype)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if epilogue:
        c = _values(gen, (m, n), out_dtype)
        bias = _values(gen, (n,), dtype)
        kw.update(c=_device(c, "row"), bias=_device(bias[None, :], "row")[0], beta=0.5,
                  activation=epilogue, alpha=1.5)
        ref = 1.5 * ref + 0.5 * c.astype(np.float64) + bias.astype(np.float64)
        if epilogue == "gelu":
            ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        else:
            ref = ref / (1 + np.exp(-ref))
    out = numbatc.gemm(_device(a, layouts[0]), _device(b, layouts[1]), **kw)
    from numbatc.interop import DTypeView

    host = (out.data if isinstance(out, DTypeView) else out).copy_to_host()
    got = (host.view(ml_dtypes.bfloat16) if out_dtype == "bfloat16" else host).astype(np.float64)
    rounding = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-20}[out_dtype]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    assert np.all(np.abs(got - ref) <= rounding * np.abs(ref) + 1e-5 * scale), np.max(np.abs(got - ref))


@pytest.mark.parametrize("name, m, n, k, layouts", [
    ("64x128x64_4w_4s", 70, 200, 150, ("row", "row")),     # tile (0, 0) inside, K ragged
    ("128x128x64_4w_4s", 130, 136, 136, ("col", "col")),   # a M-major, b K-major
    ("16x128x64_4w_6s", 17, 130, 200, ("row", "col")),     # 16-row tiles, 2 of 4 inside
    ("128x256x64_8w_3s", 129, 257, 72, ("col", "row")),    # 8 warps, K one whole tile + 8
    ("128x128x32_4w_4s", 130, 129, 70, ("row", "col")),    # BK = 32: 64-byte K-major rows
    ("128x128x32_4w_3s", 131, 130, 100, ("col", "row")),   # 3 stages of BK = 32, MN-major
    ("16x128x64_4w_4s", 17, 129, 300, ("row", "row")),     # 4-stage decode tiles (99 KB GPUs)
    # the prefetching k loop: more k tiles than stages (the ring wraps), one k tile
    ("128x128x32_4w_4s_fp", 131, 129, 330, ("row", "row")),
    ("128x128x32_4w_4s_fp", 129, 140, 20, ("col", "col")),
    ("128x256x64_8w_3s_fp", 129, 257, 200, ("row", "col")),
    ("16x128x64_4w_6s_fp", 17, 130, 520, ("col", "row")),
    ("64x128x64_4w_4s_fp", 70, 200, 150, ("row", "row")),
])
def test_inside_and_edge_tiles_in_the_emulation(name, m, n, k, layouts, monkeypatch):
    """Tiles wholly inside a and b take the unchecked copies (sm80_gemm's load_*_inside) on
    their whole k tiles, edge tiles and the ragged last k tile the checked ones: shapes where
    both meet, for each operand layout, forced onto each configuration (NUMBATC_SM80_CONFIG)."""
    monkeypatch.setenv("NUMBATC_SM80_CONFIG", name)
    monkeypatch.setenv("NUMBATC_SPLIT_K", "1")
    gen = np.random.default_rng()
    a, b = _values(gen, (m, k), "bfloat16"), _values(gen, (k, n), "bfloat16")
    out = cuda.to_device(np.full((m, n), np.nan, np.float32))
    numbatc.gemm(_device(a, layouts[0]), _device(b, layouts[1]), out=out)
    got = out.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    assert np.all(np.abs(got - ref) <= 2.0**-20 * np.abs(ref) + 1e-5 * scale), np.nanmax(np.abs(got - ref))


@pytest.mark.parametrize("name, m, n, k, epilogue", [
    ("16x128x64_4w_6s_fp", 17, 264, 100, None),       # 4 chunks a warp row; 2 of 6 tiles inside
    ("16x128x64_4w_6s_fp", 16, 136, 70, "gelu"),      # +c +bias: the values-first order
    ("128x128x32_4w_4s_fp", 130, 136, 40, None),      # 8 chunks a warp row, one tile inside
    ("128x128x32_4w_4s_fp", 129, 264, 33, "silu"),
])
def test_staged_epilogue_in_the_emulation(name, m, n, k, epilogue, monkeypatch):
    """A 16-bit out whose rows are 16-byte aligned (N a multiple of 8): tiles inside the matrix
    stage their values through shared memory and store 16-byte chunks (sm80_gemm's
    staged_epilogue), edge tiles store per fragment; the output poisoned (NaN) first.  The
    configurations made staged here (Sm80Config.staged): warp rows of 4 and of 8 chunks."""
    import dataclasses

    from numbatc.kernels import sm80_gemm

    staged = dataclasses.replace(sm80_gemm.CONFIGS[name], staged=True)
    monkeypatch.setitem(sm80_gemm.CONFIGS, name, staged)
    monkeypatch.setenv("NUMBATC_SM80_CONFIG", name)
    monkeypatch.setenv("NUMBATC_SPLIT_K", "1")
    calls = []
    real = sm80_gemm.staged_epilogue
    monkeypatch.setattr(sm80_gemm, "staged_epilogue", lambda *a: calls.append(1) or real(*a))
    sm80_gemm.kernel_for.cache_clear()
    gen = np.random.default_rng()
    a, b = _values(gen, (m, k), "bfloat16"), _values(gen, (k, n), "bfloat16")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    kw = {}
    if epilogue:
        c = _values(gen, (m, n), "bfloat16")
        bias = _values(gen, (n,), "bfloat16")
        kw.update(c=_device(c, "row"), bias=_device(bias[None, :], "row")[0], beta=-0.5,
                  activation=epilogue, alpha=0.75)
        ref = 0.75 * ref - 0.5 * c.astype(np.float64) + bias.astype(np.float64)
        if epilogue == "gelu":
            ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        else:
            ref = ref / (1 + np.exp(-ref))
    out = cuda.to_device(np.full((m, n), 0x7FC0, np.uint16))  # bf16 NaN
    numbatc.gemm(_device(a, "row"), _device(b, "col"), out=numbatc.bfloat16(out), **kw)
    got = out.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    assert calls, "the staged epilogue was not generated"
    bad = ~(np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * scale)  # NaN: never written
    assert not bad.any(), np.nanmax(np.abs(got - ref))


@pytest.mark.parametrize("m, n, k, splits, layouts, epilogue", [
    (1, 136, 600, 3, ("row", "row"), None),       # decode: 16-row tiles, ragged last K slice
    (13, 40, 256, 4, ("row", "col"), "gelu"),     # +c +bias, b K-major
    (70, 24, 200, 2, ("col", "row"), None),       # two row tiles, 64-row tiles, a M-major
])
def test_split_k_in_the_emulation(m, n, k, splits, layouts, epilogue, monkeypatch, capfd):
    """Split-K (NUMBATC_SPLIT_K forces the slice count): each K slice's partial tile goes to the
    workspace and the last block of a tile sums them and runs the epilogue; a second call on the
    same workspace checks that the counters were left at zero."""
    monkeypatch.setenv("NUMBATC_SPLIT_K", str(splits))
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    gen = np.random.default_rng()
    for _ in range(2):
        a, b = _values(gen, (m, k), "bfloat16"), _values(gen, (k, n), "bfloat16")
        ref = a.astype(np.float64) @ b.astype(np.float64)
        kw = {}
        if epilogue:
            c = gen.standard_normal((m, n)).astype(np.float32)
            kw.update(c=cuda.to_device(c), beta=0.5, activation=epilogue)
            ref = ref + 0.5 * c.astype(np.float64)
            ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref**3)))
        out = cuda.to_device(np.full((m, n), np.nan, np.float32))
        numbatc.gemm(_device(a, layouts[0]), _device(b, layouts[1]), out=out, **kw)
        got = out.copy_to_host()
        scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
        assert np.all(np.abs(got - ref) <= 2.0**-20 * np.abs(ref) + 1e-5 * scale), np.nanmax(np.abs(got - ref))
    assert f"split-K, {splits} slices" in capfd.readouterr().err


def test_split_workspace_per_stream_and_per_thread_default_stream():
    """Launches on one stream run one after another, so one stream's split-K launches share
    buffers; the per-thread default stream (handle 2) is a different stream in every thread, so
    each thread gets its own."""
    import threading

    from numbatc.kernels import split_k

    get = split_k.split_workspace(0, 64, 4)
    seen = {}
    alive = threading.Barrier(4)  # all four threads at once (a finished thread's id is reused)

    def run(name, stream):
        alive.wait()
        seen[name] = get(stream)[0]
        alive.wait()

    threads = [threading.Thread(target=run, args=args)
               for args in (("a5", 5), ("b5", 5), ("a2", 2), ("b2", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["a5"] is seen["b5"]
    assert seen["a2"] is not seen["b2"]
    assert get(7)[0] is not seen["a5"]


@pytest.mark.parametrize("m, k, want", [
    (260, 136, "K=136: sm90_gemm 128x256x64_3s_pt_tma_ts"),                  # persistent, 6 tiles
    (130, 512, "split-K, 2 slices of 256 (128x256x64_4s_w1_tma)"),          # its split-K twin
])
def test_hopper_heuristic_in_the_emulation(m, k, want, monkeypatch, capsys):
    """The Hopper family's own choice (NUMBATC_GEMM_KERNEL=sm90 without a configuration): the
    persistent configuration on the TMA producer (sm90_gemm.DEFAULT_PRODUCER) with the TMA store
    epilogue (sm90_gemm.TMA_STORE_FORM), whose 2 emulated
    blocks walk the tiles; split-K (M <= 256) runs as
    the configuration whose split form was measured on the H200 (sm90_gemm.SPLIT_TWIN).  These
    shapes are small enough for the small-M tiles (sm90_gemm.small_tile, run in
    test_sm90_gemm_emulated's 64-row cases), which are switched off here to reach the others."""
    from numbatc.kernels import sm90_gemm

    monkeypatch.setattr(sm90_gemm, "small_tile", lambda p: None)
    monkeypatch.setenv("NUMBATC_GEMM_KERNEL", "sm90")
    monkeypatch.setenv("NUMBATC_PRINT_CONFIG", "1")
    monkeypatch.delenv("NUMBATC_SPLIT_K", raising=False)
    gen = np.random.default_rng()
    n = 264
    a, b = _values(gen, (m, k), "bfloat16"), _values(gen, (k, n), "bfloat16")
    out = numbatc.gemm(_device(a, "row"), _device(b, "row"))
    assert want in capsys.readouterr().err
    got = out.data.copy_to_host().view(ml_dtypes.bfloat16).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) + 1
    assert np.all(np.abs(got - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * scale)
