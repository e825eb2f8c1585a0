"""Measure where TMA tensor copies may start: one probe per process, a markdown table of results.

    python scripts/tma_rules.py                 # every probe, 12 children at a time
    python scripts/tma_rules.py --list          # the probes, without running them
    python scripts/tma_rules.py --only followup # the follow-up of the first H200 run
    python scripts/tma_rules.py --only multicast --jobs 4 --timeout 60 --budget 180
    python scripts/tma_rules.py --one '<json spec>'   # one probe (what the parent runs)

``--only`` is a regex searched in each probe's tag, what, op and spec text.  The probes tagged
``followup`` chase the first run's disagreements (rank-1 encodings, where narrow swizzled rows
land, stores at negative starts) and start before the others, so a --budget cuts known ones.

Each probe is one tensor copy issued with numbatc's own intrinsics (``tma_load``,
``tma_load_multicast``, ``tma_store``, ``tma_load_im2col``, ``tma_prefetch``,
``tma_prefetch_descriptor``) through an ``intrinsics.tensormap.TensorMap``, in a child process of
its own: a faulting copy (CUDA_ERROR_ILLEGAL_INSTRUCTION) poisons the CUDA context, so no probe
may share one.  The child checks every element it received (loads, im2col, multicast: the
shared-memory image, unswizzled; stores: the whole target tensor) against NumPy models
(tests/helpers/tma.py) and prints one ``RESULT {json}`` line; the parent records

    exact       the copy ran and every element is right (fill included)
    ran         the copy ran (prefetches: nothing to compare)
    wrong       it ran and some elements differ (the first is named)
    mapped      a footprint probe ran: where the box's elements landed in a generous,
                poisoned region, and how many fit each row-pitch model
                (``intrinsics.tensormap.smem_row_pitch``: 'dense' or 'span')
    fault       the CUDA error the child saw (CUDA_ERROR_ILLEGAL_INSTRUCTION ...)
    refused     the CPU emulation refused it (NUMBA_ENABLE_CUDASIM=1: the dry run)
    map refused the driver or numbatc's host checks refused the tensor map
    stuck       the mbarrier never completed within the kernel's bounded wait
    hang        the child did not finish within --timeout seconds and was killed
    error       anything else (the child's last error line)
    not run     --budget seconds had passed before its turn

and beside each the start rule's verdict (``intrinsics.tensormap.start_problem``: the 16-byte
rule; stores also no negative coordinate; the emulation enforces it) and whether the two agree.
The table goes to stdout and to ``$OUT/tma_rules.md`` (``$OUT`` defaults to ./tma_rules_out),
one JSON line per probe to ``$OUT/tma_rules.jsonl``, the output of every child that did not end
'exact' or 'ran', and of every tagged one (a footprint probe prints its landing map, one line
per box row), to the one file ``$OUT/tma_rules_logs.txt``.  Under ``NUMBA_ENABLE_CUDASIM=1`` the
children run in the CPU emulation: every probe the rule calls legal must be exact (footprint
probes: mapped) there and every other one refused.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from math import prod

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
ESIZE = {"u8": 1, "f16": 2, "bf16": 2, "f32": 4}
NUMPY = {"u8": "uint8", "f16": "float16", "bf16": "uint16", "f32": "float32"}


# ---------------------------------------------------------------------------------------------
# The probes
# ---------------------------------------------------------------------------------------------


def _tile(what, op, dtype, shape, box, coords, swizzle=0, fill="zero", **extra):
    """A tiled probe: ``shape`` / ``box`` natural order, ``coords`` innermost first."""
    return dict(what=what, op=op, dtype=dtype, shape=list(shape), box=list(box),
                coords=list(coords), swizzle=swizzle, fill=fill, **extra)


def _elements(dtype, nbytes):
    return nbytes // ESIZE[dtype]


def probes():
    """Every probe, in table order."""
    out = []

    # The measured baseline: 48x96 float32, box 16x16, no swizzle (issue 15's table).
    for inner in (0, 4, 8, -4, 3, 1, 90):
        out.append(_tile("baseline (issue 15)", "load", "f32", (48, 96), (16, 16), (inner, 5)))

    # Element sizes 1/2/4: innermost byte offsets, box 32 bytes wide, no swizzle.
    for dtype, offsets in (("u8", (1, 2, 4, 8, 16, 32, 48)), ("f16", (2, 4, 8, 16, 24, 32)),
                           ("f32", (4, 8, 12, 16, 32, 48))):
        for off in offsets:
            out.append(_tile(f"element size {ESIZE[dtype]} B", "load", dtype,
                             (24, _elements(dtype, 256)), (8, _elements(dtype, 32)),
                             (_elements(dtype, off), 3)))

    # Every swizzle, box inner extent = the swizzle span (and narrower for 128B).
    for swizzle in (32, 64, 128):
        for dtype in ("u8", "f16", "f32"):
            for off in (0, 16, 8, 32) if swizzle > 32 else (0, 16, 8):
                out.append(_tile(f"swizzle {swizzle}B", "load", dtype,
                                 (24, _elements(dtype, 512)), (8, _elements(dtype, swizzle)),
                                 (_elements(dtype, off), 2), swizzle=swizzle))
    for inner_bytes in (32, 64):
        for off in (0, 16, 48):
            out.append(_tile("swizzle 128B, narrow box", "load", "f32", (24, 128),
                             (8, inner_bytes // 4), (off // 4, 2), swizzle=128))

    # Box widths (innermost extent) without swizzle.
    for width_bytes, dtype in ((16, "f32"), (64, "f32"), (256, "f32"), (256, "u8"), (512, "f16")):
        for off in (0, 16, 4 if dtype != "u8" else 1):
            out.append(_tile(f"box width {width_bytes} B", "load", dtype,
                             (16, _elements(dtype, 1024)), (4, _elements(dtype, width_bytes)),
                             (_elements(dtype, off), 1)))

    # Ranks 1-5.
    rank_shapes = {1: ((256,), (16,)), 2: ((24, 64), (4, 16)), 3: ((5, 6, 64), (2, 3, 16)),
                   4: ((3, 4, 5, 64), (2, 2, 2, 16)), 5: ((2, 3, 4, 5, 64), (1, 2, 2, 2, 16))}
    for rank, (shape, box) in rank_shapes.items():
        for dtype, offsets in (("f32", (16, 4, 12)), ("u8", (16, 1))):
            scale = 4 // ESIZE[dtype]
            shape_ = shape[:-1] + (shape[-1] * scale,)
            box_ = box[:-1] + (box[-1] * scale,)
            for off in offsets:
                coords = (_elements(dtype, off),) + tuple(1 for _ in shape[:-1])
                out.append(_tile(f"rank {rank}", "load", dtype, shape_, box_, coords))

    # Out of bounds: innermost and outer, negative and past the end, zero and NaN fill.
    for fill in ("zero", "nan"):
        for inner, outer, why in (
            (-4, 3, "innermost -16 B"), (-1, 3, "innermost -4 B"), (-16, 3, "innermost -64 B"),
            (-8, -4, "innermost -32 B, outer -4"), (88, 3, "innermost past the end, aligned"),
            (90, 3, "innermost past the end, unaligned"), (96, 3, "innermost at the end"),
            (104, 3, "innermost beyond the end"), (0, -5, "outer -5"), (4, 40, "outer past"),
            (0, 48, "outer at the end"), (-20, 3, "innermost fully before"),
        ):
            out.append(_tile(f"out of bounds, {fill} fill: {why}", "load", "f32", (48, 96),
                             (16, 16), (inner, outer), fill=fill))
    out.append(_tile("out of bounds, 128B swizzle", "load", "f16", (32, 80), (8, 64), (-8, -3),
                     swizzle=128, fill="nan"))
    out.append(_tile("out of bounds, 128B swizzle", "load", "f16", (32, 80), (8, 64), (-4, -3),
                     swizzle=128, fill="nan"))

    # Stores.
    for inner, outer, swizzle in ((0, 3, 0), (4, 3, 0), (-4, -5, 0), (88, 40, 0), (3, 3, 0),
                                  (1, 3, 0), (-3, -5, 0), (90, 40, 0), (8, 2, 128), (2, 2, 128)):
        out.append(_tile("tile store" + (", 128B swizzle" if swizzle else ""), "store", "f32",
                         (48, 96), (16, 32 if swizzle else 16), (inner, outer), swizzle=swizzle))
    out.append(_tile("tile store, rank 3", "store", "u8", (3, 5, 64), (2, 2, 32), (16, 1, 1)))
    out.append(_tile("tile store, rank 3", "store", "u8", (3, 5, 64), (2, 2, 32), (5, 1, 1)))

    # Multicast across clusters of 2 and 4 CTAs (CTA r adds 16 r to the row coordinate).
    for ctas in (2, 4):
        for inner in (0, 4, 2, 1):
            out.append(_tile(f"multicast, {ctas}-CTA cluster", "multicast", "f32",
                             (16 * ctas + 5, 40), (16, 32), (inner, 0), swizzle=128, ctas=ctas,
                             axis=1, step=16))

    # im2col (rank 3, 4, 5; the channel coordinate is the innermost start).
    conv = [
        ("f16", (2, 8, 8, 32), (-1, -1), (-1, -1), 32, 32, (0, 0)),
        ("f32", (2, 40, 16), (-2,), (-2,), 16, 64, (3,)),
        ("f32", (1, 4, 4, 4, 16), (-1, -1, -1), (-1, -1, -1), 16, 16, (1, 1, 1)),
    ]
    for dtype, shape, lower, upper, channels, pixels, offsets in conv:
        spatial = tuple(lower)[::-1]
        for channel in (0, _elements(dtype, 16), _elements(dtype, 8) or 1, 1):
            coords = (channel,) + spatial + (0,)
            out.append(dict(what=f"im2col, rank {len(shape)}", op="im2col", dtype=dtype,
                            shape=list(shape), lower=list(lower), upper=list(upper),
                            channels=channels, pixels=pixels, coords=list(coords),
                            offsets=list(offsets), swizzle=0, fill="zero"))

    # Prefetch: the tensor prefetch alone, then followed by a load of the same box; the
    # descriptor prefetch of a map in global memory.
    for inner, outer in ((0, 5), (4, 5), (1, 5), (3, 5), (-4, -3), (90, 40)):
        out.append(_tile("tensor prefetch (L2)", "prefetch", "f32", (48, 96), (16, 16),
                         (inner, outer)))
    for inner in (4, 3):
        out.append(_tile("tensor prefetch, then load", "prefetch_load", "f32", (48, 96),
                         (16, 16), (inner, 5)))
    out.append(_tile("descriptor prefetch (prefetch.tensormap)", "descriptor_prefetch", "f32",
                     (48, 96), (16, 16), (0, 0)))
    return out + followup()


def followup():
    """The follow-up of the first H200 run's three disagreements (tag 'followup'; run first)."""
    out = []
    f = dict(tag="followup")

    # (a) Rank 1: every map was refused (CUDA_ERROR_INVALID_VALUE) when cuda.bindings got no
    # globalStrides (it passes NULL).  The candidate arrays (intrinsics.tensormap.rank1_strides).
    for how in ("none", "size", "zero", "sixteen"):
        out.append(_tile(f"rank-1 encoding: strides {how}", "load", "f32", (256,), (16,), (4,),
                         rank1_strides=how, **f))
        out.append(_tile(f"rank-1 encoding: strides {how}", "load", "u8", (1000,), (64,), (16,),
                         rank1_strides=how, **f))
    for coords in ((248,), (-4,), (1,)):  # past the end, negative, unaligned (must fault)
        out.append(_tile("rank-1 encoding: strides size", "load", "f32", (250,), (16,), coords,
                         rank1_strides="size", **f))
    out.append(_tile("rank-1 encoding: strides size", "store", "f32", (64,), (32,), (48,),
                     rank1_strides="size", **f))
    out.append(_tile("rank-1 encoding: strides size", "prefetch", "f32", (256,), (16,), (4,),
                     rank1_strides="size", **f))
    out.append(_tile("rank 1 as rank 2 (1, n)", "load", "f32", (1, 256), (1, 16), (4, 0), **f))

    # (b) Narrow rows under a swizzle: 128B swizzle with 32- and 64-byte rows faulted
    # (CUDA_ERROR_ILLEGAL_ADDRESS) in an allocation of box_bytes + 1024.  These allocate
    # rows * 256 + 1024 bytes, poison them, load, and report where every element landed.
    for swizzle, inner_bytes, rows, offsets in (
        (128, 16, 8, (0,)), (128, 32, 8, (0, 16)), (128, 32, 16, (0,)), (128, 64, 8, (0, 16)),
        (128, 128, 8, (0,)), (64, 16, 8, (0,)), (64, 32, 8, (0, 16)), (64, 64, 8, (0,)),
        (32, 16, 8, (0,)), (32, 32, 8, (0,)),
    ):
        for off in offsets:
            out.append(_tile(f"swizzle footprint: {swizzle}B, {inner_bytes} B rows", "footprint",
                             "f32", (24, 128), (rows, inner_bytes // 4), (off // 4, 2),
                             swizzle=swizzle, **f))
    # the GPU test's im2col case with 64-byte rows under 128B swizzle, and a 64B-swizzle control
    for swizzle in (128, 64):
        out.append(dict(what=f"im2col, 64 B rows, {swizzle}B swizzle", op="im2col", dtype="f16",
                        shape=[2, 8, 8, 32], lower=[-1, -1], upper=[-1, -1], channels=32,
                        pixels=32, coords=[0, 3, 5, 1], offsets=[2, 1], swizzle=swizzle,
                        fill="zero", **f))

    # (c) Stores at negative starts: (-4, -5) faulted, (88, 40) ran.  Innermost and outer apart.
    for inner, outer, why in (
        (-4, 3, "innermost -16 B"), (-16, 3, "innermost -64 B"), (-20, 3, "innermost fully before"),
        (0, -5, "outer -5"), (4, -1, "outer -1"), (0, -16, "outer fully before"),
        (-4, -5, "both"), (-16, -1, "both"),
    ):
        out.append(_tile(f"tile store, negative start: {why}", "store", "f32", (48, 96),
                         (16, 16), (inner, outer), **f))
    for inner, outer in ((-8, 2), (0, -3), (-8, -3)):
        out.append(_tile("tile store, negative start, 128B swizzle", "store", "f32", (48, 96),
                         (16, 32), (inner, outer), swizzle=128, **f))
    # the GPU tests' negative-start stores, moved here (tests/gpu/test_tma_gpu.py STORE_CASES)
    for shape, box, coords, swizzle in (
        ((40, 48), (16, 8), (-4, -5), 0), ((40, 48), (16, 32), (-4, -5), 128),
        ((3, 20, 40), (2, 8, 16), (28, -3, 2), 64),
        ((2, 3, 4, 5, 12), (2, 2, 2, 2, 8), (8, 0, 3, -1, 1), 32),
    ):
        out.append(_tile(f"tile store, negative start, rank {len(shape)} (was a GPU test)",
                         "store", "f32", shape, box, coords, swizzle=swizzle, **f))
    return out


def spec_text(spec):
    """One cell: the tensor, the box and the start, compactly."""
    parts = [spec["dtype"], "x".join(map(str, spec["shape"]))]
    if spec["op"] == "im2col":
        parts.append(f"{spec['pixels']} px x {spec['channels']} ch, corners "
                     f"{tuple(spec['lower'])}/{tuple(spec['upper'])}, offsets "
                     f"{tuple(spec['offsets'])}")
    else:
        parts.append("box " + "x".join(map(str, spec["box"])))
    if spec.get("swizzle"):
        parts.append(f"sw{spec['swizzle']}")
    if spec.get("fill") == "nan":
        parts.append("NaN fill")
    if spec["op"] == "multicast":
        parts.append(f"{spec['ctas']} CTAs")
    if spec.get("rank1_strides"):
        parts.append(f"rank-1 strides {spec['rank1_strides']}")
    inner = spec["coords"][0]
    parts.append(f"coords {tuple(spec['coords'])} (innermost {inner * ESIZE[spec['dtype']]} B)")
    return ", ".join(parts)


def rule_verdict(spec):
    """'legal' or 'illegal' by the 16-byte rule (the emulation's), for the table."""
    if spec["op"] == "descriptor_prefetch":
        return "legal"
    from intrinsics.tensormap import start_problem

    mode = "im2col" if spec["op"] == "im2col" else "tiled"
    kind = "store" if spec["op"] == "store" else "load"
    problem = start_problem(spec["dtype"], spec["coords"], mode, kind)
    return "legal" if problem is None else "illegal"


# ---------------------------------------------------------------------------------------------
# The child: one probe
# ---------------------------------------------------------------------------------------------


def run_one(spec):
    """Run one probe in this process; returns (result, detail)."""
    import numpy as np
    from numba import cuda

    import intrinsics.tensormap as tensormap
    from intrinsics.launch import launch
    from intrinsics.tensormap import TensorMap
    from tests.helpers import tma as h

    if spec.get("rank1_strides"):
        tensormap.RANK1_STRIDES = spec["rank1_strides"]

    gen = np.random.default_rng()
    dtype, op = spec["dtype"], spec["op"]
    bf16 = dtype == "bf16"
    tensor = h.random_tensor(gen, tuple(spec["shape"]), "bf16" if bf16 else NUMPY[dtype])
    coords = np.array(spec["coords"], np.int32)
    status = cuda.to_device(np.zeros(spec.get("ctas", 1), np.int32))

    def tiled(source):
        return TensorMap.tiled(source, tuple(spec["box"]), dtype="bf16" if bf16 else None,
                               swizzle=spec["swizzle"], oob_fill=spec["fill"])

    def stuck():
        got = status.copy_to_host()
        return ("stuck", f"CTA(s) {np.flatnonzero(got).tolist()} waited in vain") if got.any() \
            else None

    def check_load(image, tmap, start):
        got = h.unswizzle_bytes(image, tmap.swizzle).view(tensor.dtype).reshape(tmap.box)
        want = h.box_model(tensor, start, tmap.box, 0)
        inside = h.inside_mask(tensor.shape, start, tmap.box)
        return h.compare_box(got, want, inside, tmap.oob_fill, "bf16" if bf16 else tensor.dtype)

    start = tuple(int(c) for c in spec["coords"][::-1])  # natural order
    if op in ("load", "prefetch_load"):
        tmap = tiled(cuda.to_device(tensor))
        out = cuda.to_device(np.full(tmap.box_bytes, h.POISON, np.uint8))
        launch(h.load_kernel(tmap.rank, op == "prefetch_load"), 1, h.THREADS,
               (tmap.device, cuda.to_device(coords), tmap.box_bytes, out, status),
               shared_bytes=tmap.box_bytes + h.ALIGN)
        cuda.synchronize()
        problem = stuck() or check_load(out.copy_to_host(), tmap, start)
    elif op == "footprint":
        # every element's bits name its flat index: 1.0f + index, never the poison
        tensor = (FOOTPRINT_BASE + np.arange(tensor.size, dtype=np.uint32)).view(
            np.float32).reshape(tensor.shape)
        tmap = tiled(cuda.to_device(tensor))
        region = prod(tmap.smem_box[:-1]) * 256 + 1024
        out = cuda.to_device(np.full(region, h.POISON, np.uint8))
        launch(h.footprint_kernel(tmap.rank), 1, h.THREADS,
               (tmap.device, cuda.to_device(coords), tmap.box_bytes, region, out, status),
               shared_bytes=region + h.ALIGN)
        cuda.synchronize()
        return footprint_report(out.copy_to_host(), tensor, tmap, start, stuck())
    elif op == "multicast":
        tmap = tiled(cuda.to_device(tensor))
        ctas, box = spec["ctas"], tmap.box_bytes
        out = cuda.to_device(np.full((ctas, ctas * box), h.POISON, np.uint8))
        launch(h.multicast_kernel(tmap.rank), ctas, h.THREADS,
               (tmap.device, cuda.to_device(coords), spec["axis"], spec["step"], box, out, status),
               shared_bytes=ctas * box + h.ALIGN, cluster=(ctas, 1, 1))
        cuda.synchronize()
        problem = stuck()
        got = out.copy_to_host()
        axis = tmap.rank - 1 - spec["axis"]  # natural order
        for cta in range(ctas):
            for r in range(ctas):
                if problem is None:
                    at = list(start)
                    at[axis] += r * spec["step"]
                    why = check_load(got[cta, r * box:(r + 1) * box], tmap, tuple(at))
                    problem = why and f"CTA {cta}, box of CTA {r}: {why}"
    elif op == "store":
        poison = np.full(tensor.shape, 0x5A, np.uint8).view(tensor.dtype) if tensor.itemsize == 1 \
            else np.full(tensor.shape, -7.25, tensor.dtype)
        target = cuda.to_device(poison)
        tmap = tiled(target)
        tile = h.random_tensor(gen, tmap.box, tensor.dtype)
        image = h.swizzle_bytes(tile, tmap.swizzle)
        launch(h.store_kernel(tmap.rank), 1, h.THREADS,
               (tmap.device, cuda.to_device(coords), cuda.to_device(image), image.size),
               shared_bytes=image.size + h.ALIGN)
        cuda.synchronize()
        want = poison.copy()
        at = np.nonzero(h.inside_mask(tensor.shape, start, tmap.box))
        want[tuple(i + s for i, s in zip(at, start))] = tile[at]
        got = target.copy_to_host()
        bad = got.view(f"u{got.itemsize}") != want.view(f"u{want.itemsize}")
        problem = None if not bad.any() else (
            f"{int(bad.sum())} of {bad.size} target elements wrong; first at "
            f"{tuple(int(i) for i in np.argwhere(bad)[0])}")
    elif op == "im2col":
        tmap = TensorMap.im2col(cuda.to_device(tensor), channels_per_pixel=spec["channels"],
                                pixels_per_column=spec["pixels"], lower_corner=spec["lower"],
                                upper_corner=spec["upper"], swizzle=spec["swizzle"],
                                oob_fill=spec["fill"])
        out = cuda.to_device(np.full(tmap.box_bytes, h.POISON, np.uint8))
        launch(h.im2col_kernel(tmap.rank), 1, h.THREADS,
               (tmap.device, cuda.to_device(coords),
                cuda.to_device(np.array(spec["offsets"], np.int32)), tmap.box_bytes, out, status),
               shared_bytes=tmap.box_bytes + h.ALIGN)
        cuda.synchronize()
        rows, chans = spec["pixels"], spec["channels"]
        got = h.unswizzle_bytes(out.copy_to_host(), tmap.swizzle).view(tensor.dtype)
        want, inside = h.im2col_model(tensor, spec["coords"], spec["offsets"], spec["lower"],
                                      spec["upper"], rows, chans, 0)
        problem = stuck() or h.compare_box(got.reshape(rows, chans), want, inside, tmap.oob_fill,
                                           tensor.dtype)
    elif op in ("prefetch", "descriptor_prefetch"):
        tmap = tiled(cuda.to_device(tensor))
        flag = cuda.to_device(np.zeros(1, np.int32))
        if op == "prefetch":
            launch(h.prefetch_kernel(tmap.rank), 1, 32, (tmap.device, cuda.to_device(coords), flag))
        else:
            launch(h.descriptor_prefetch_kernel, 1, 32, (tmap.device, flag))
        cuda.synchronize()
        ok = flag.copy_to_host()[0] == 1
        return ("ran", "") if ok else ("wrong", "the kernel did not reach its end")
    else:
        raise ValueError(f"unknown probe op {op!r}")
    return ("exact", "") if problem is None else ("wrong", problem)


FOOTPRINT_BASE = np.uint32(0x3F800000)


def footprint_report(got, tensor, tmap, start, stuck):
    """('mapped', one line) for a footprint probe: how many of the box's elements were found
    in the dumped region, the bytes spanned, and how many landed where each row-pitch model of
    ``intrinsics.tensormap.smem_row_pitch`` puts them; the landing map of every row (the byte
    offset of each 16-byte chunk) is printed for the log."""
    from intrinsics.layout import swizzle_offset_host
    from intrinsics.tensormap import smem_row_pitch

    words = np.frombuffer(got.tobytes(), np.uint32)
    poison = np.uint32(int.from_bytes(bytes([0xA5] * 4), "little"))
    index = words.astype(np.int64) - int(FOOTPRINT_BASE)
    valid = (words != poison) & (index >= 0) & (index < tensor.size)
    other = (words != poison) & ~valid
    at = np.flatnonzero(valid)  # word offsets in the region
    element = np.unravel_index(index[at], tensor.shape)
    rel = [e - s for e, s in zip(element, start)]
    box = tmap.box
    inside = np.all([(r >= 0) & (r < b) for r, b in zip(rel, box)], axis=0)
    row = np.ravel_multi_index([r[inside] for r in rel[:-1]], box[:-1]) if len(box) > 1 else (
        np.zeros(int(inside.sum()), np.int64))
    col_bytes = rel[-1][inside] * 4
    landed = at[inside] * 4
    inner = tmap.smem_row_bytes
    fits = {}
    for model in ("dense", "span"):
        pitch = smem_row_pitch(inner, tmap.swizzle, model)
        want = swizzle_offset_host(row * pitch + col_bytes, tmap.swizzle)
        fits[model] = int((want == landed).sum())
    n = prod(box)
    span = int(landed.max()) + 4 if landed.size else 0
    rows = {}
    for r, c, b in zip(row.tolist(), col_bytes.tolist(), landed.tolist()):
        if c % 16 == 0:
            rows.setdefault(r, []).append(b)
    for r in sorted(rows):
        print(f"row {r}: 16-byte chunks at {sorted(rows[r])}")
    detail = (f"{int(inside.sum())}/{n} elements found, spanning {span} B (dense box "
              f"{tmap.box_bytes} B); fit dense {fits['dense']}/{n}, span {fits['span']}/{n}; "
              f"row starts {[min(rows[r]) for r in sorted(rows)][:8]}; other words written "
              f"{int(other.sum())}" + (f" (first at byte {int(np.flatnonzero(other)[0]) * 4})"
                                       if other.any() else "")
              + (f"; {stuck[1]}" if stuck else ""))
    return "mapped", detail


def child(spec_json):
    sys.path.insert(0, str(ROOT))
    spec = json.loads(spec_json)
    try:
        result, detail = run_one(spec)
    except Exception as exc:  # the parent classifies: fault, refused, map refused, error
        text = f"{type(exc).__name__}: {exc}"
        print(text, file=sys.stderr)
        result, detail = _classify_exception(exc, text)
    print("RESULT " + json.dumps(dict(result=result, detail=detail)), flush=True)
    # os._exit: a poisoned context can make interpreter teardown hang or abort
    os._exit(0)


def _classify_exception(exc, text):
    cuda_error = re.search(r"CUDA_ERROR_[A-Z_]+", text)
    name = type(exc).__name__
    if name == "EmulationError":
        rule = re.search(r"byte offset -?[\d.]+, not a multiple of 16", text)
        store = re.search(r"coordinate\(s\) \[[\d, ]+\] \(innermost first\) of .* are negative",
                          text)
        why = rule or store
        return "refused", f"EmulationError: {why.group(0)}" if why else text.splitlines()[0][:300]
    if name == "TensorMapError" or (name in ("ValueError", "TypeError") and "TensorMap" in text):
        return "map refused", text.splitlines()[0][:300]
    if cuda_error:
        return "fault", cuda_error.group(0)
    return "error", text.splitlines()[0][:300]


# ---------------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------------


RAN = ("exact", "ran", "mapped")  # the copy ran (the rest: it did not, or it was wrong)


def run_child(index, spec, timeout, logs, deadline=None):
    """Run one probe's child; returns the row dict and puts the child's output in
    ``logs[index]`` (a dict) unless the probe ended 'exact' or 'ran' untagged.  Past
    ``deadline`` (time.monotonic()) the probe is not started and reported as 'not run'."""
    if deadline is not None and time.monotonic() > deadline:
        return dict(result="not run", detail="past --budget", index=index, seconds=0, spec=spec,
                    rule=rule_verdict(spec), agrees=False)
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--one", json.dumps(spec)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                        if env.get("PYTHONPATH") else []))
    begin = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        found = re.findall(r"^RESULT (\{.*\})$", output, flags=re.M)
        if found:
            row = json.loads(found[-1])
        else:  # died without a verdict (an abort in the driver, a segfault)
            cuda_error = re.search(r"CUDA_ERROR_[A-Z_]+", output)
            row = dict(result="fault" if cuda_error else "error",
                       detail=cuda_error.group(0) if cuda_error else
                       f"exit {proc.returncode}: " + (output.strip().splitlines() or ["?"])[-1][:300])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and nothing else
        output, _ = proc.communicate()
        row = dict(result="hang", detail=f"killed after {timeout} s")
    row.update(index=index, seconds=round(time.perf_counter() - begin, 1), spec=spec,
               rule=rule_verdict(spec))
    row["agrees"] = (row["rule"] == "legal") == (row["result"] in RAN)
    if row["result"] not in ("exact", "ran") or spec.get("tag"):
        logs[index] = json.dumps(spec) + "\n\n" + (output or "").strip()
    return row


def table(rows, emulated):
    lines = [
        f"Probes: {len(rows)}; back end: {'CPU emulation (NUMBA_ENABLE_CUDASIM=1)' if emulated else 'GPU'}.",
        "`rule`: the start rule's verdict (intrinsics.tensormap.start_problem: the 16-byte "
        "rule; stores: no negative coordinate); `agrees`: the result matches it (legal and ran, "
        "or illegal and did not).",
        "",
        "| # | what | op | spec | rule | result | agrees |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        result = r["result"] + (f": {r['detail']}" if r.get("detail") else "")
        result = result.replace("|", "\\|")
        tag = f" [{r['spec']['tag']}]" if r["spec"].get("tag") else ""
        lines.append(f"| {r['index']} | {r['spec']['what']}{tag} | {r['spec']['op']} | "
                     f"{spec_text(r['spec'])} | {r['rule']} | {result} | "
                     f"{'yes' if r['agrees'] else '**no**'} |")
    counts = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    disagree = [r["index"] for r in rows if not r["agrees"]]
    lines += ["", "Results: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "; "
              + (f"{len(disagree)} disagree with the rule: {disagree}" if disagree
                 else "all agree with the rule")]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", help="run one probe (a JSON spec) in this process")
    parser.add_argument("--list", action="store_true", help="print the probes and stop")
    parser.add_argument("--only", help="run the probes whose what/op/spec matches this regex")
    parser.add_argument("--jobs", type=int, default=12, help="children at a time (default 12)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per child (120)")
    parser.add_argument("--out", help="output folder (default $OUT, else ./tma_rules_out)")
    parser.add_argument("--budget", type=float,
                        help="seconds after which no new child starts (the rest: 'not run')")
    args = parser.parse_args()
    if args.one:
        child(args.one)
        return
    sys.path.insert(0, str(ROOT))
    specs = list(enumerate(probes(), 1))
    if args.only:
        pattern = re.compile(args.only)
        specs = [(i, s) for i, s in specs
                 if pattern.search(f"{s.get('tag', '')} {s['what']} {s['op']} {spec_text(s)}")]
    if args.list:
        for i, s in specs:
            print(f"{i:3d} {rule_verdict(s):7s} {s['what']} | {s['op']} | {spec_text(s)}")
        return
    out = pathlib.Path(args.out or os.environ.get("OUT") or "tma_rules_out")
    out.mkdir(parents=True, exist_ok=True)
    logs = {}
    emulated = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    begin = time.perf_counter()
    deadline = None if args.budget is None else time.monotonic() + args.budget
    rows = []
    # Tagged (follow-up) probes start first, so that --budget cuts the known ones.
    order = sorted(specs, key=lambda item: not item[1].get("tag"))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_child, i, s, args.timeout, logs, deadline) for i, s in order]
        for future in futures:
            row = future.result()
            rows.append(row)
            print(f"[{len(rows)}/{len(specs)}] #{row['index']} {row['spec']['what']}: "
                  f"{row['result']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: r["index"])
    (out / "tma_rules_logs.txt").write_text("".join(
        f"===== #{i}\n{logs[i]}\n\n" for i in sorted(logs)))
    text = table(rows, emulated)
    text += f"\n\nWall time {time.perf_counter() - begin:.0f} s with {args.jobs} children at a time."
    print(text)
    (out / "tma_rules.md").write_text(text + "\n")
    with open(out / "tma_rules.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"\nwritten: {out / 'tma_rules.md'}, {out / 'tma_rules.jsonl'}, "
          f"{out / 'tma_rules_logs.txt'}", file=sys.stderr)
    if emulated and any(not r["agrees"] for r in rows):
        raise SystemExit("the emulation disagrees with its own rule: see the table")


if __name__ == "__main__":
    main()
