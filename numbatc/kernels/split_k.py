"""Split-K's host side, for the GEMM kernels that split (sm80_gemm, sm90_gemm): how many K
slices a small-M problem gets, and the float32 workspace and tile counters the slices meet in
(the kernel side -- each slice's partial tile, the last block's ordered sum -- is
numbatc.kernels.epilogue's split-K source).

A split launch gives one block per (tile, K slice): blockIdx.y picks a slice of ``k_chunk``
values (whole k tiles); each block writes its float32 partial tile to its slice of the
workspace, and the last block of a tile to arrive (its counter) sums the slices in order and
runs the epilogue, so results do not depend on the block schedule.
"""

import os
import threading

import numpy as np
from numba import config, cuda

from numbatc import _capture

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["NUM_SMS_GUESS", "choose_split", "release_captured", "slices", "split_workspace"]

#: SMs of the GPU the heuristics assume (H100/H200); shapes the choices, never correctness.
NUM_SMS_GUESS = 132


def slices(cfg, k, splits):
    """(slices, k_chunk): K cut into at most ``splits`` slices of whole k tiles (``cfg.bk``
    values each), none left empty; (1, k) where that leaves one slice."""
    k_tiles = -(-k // cfg.bk)
    if splits < 2 or k_tiles < 2:
        return 1, k
    per = -(-k_tiles // splits)  # k tiles per slice
    return -(-k_tiles // per), per * cfg.bk


def choose_split(cfg, m, k, tiles, blocks_per_sm=2, max_m=64, sms=None):
    """(slices, k_chunk) for a problem of ``tiles`` output tiles of ``cfg``: small-M problems
    whose tiles cannot fill the GPU (M <= 64 gives one tile row; N = 8192 gives 64 tiles for 132
    SMs; ``sms``: the GPU's SMs, NUM_SMS_GUESS by default) split K so that about
    ``blocks_per_sm`` blocks per SM stream B at once; each slice
    keeps >= 4 k tiles, at most 16 slices; only for M <= ``max_m``.  (1, k): no split.
    ``NUMBATC_SPLIT_K=<n>`` forces n slices (1: none), for benchmarks."""
    forced = os.environ.get("NUMBATC_SPLIT_K")
    if forced:
        splits = int(forced) if forced.strip().isdigit() else 0
        if splits < 1:
            raise ValueError(f"NUMBATC_SPLIT_K={forced!r}: a positive number of K slices")
    elif m > max_m:
        splits = 1
    else:
        k_tiles = -(-k // cfg.bk)
        sms = NUM_SMS_GUESS if sms is None else sms
        splits = min(blocks_per_sm * sms // max(1, tiles), k_tiles // 4, 16)
    return slices(cfg, k, splits)


#: (device, stream handle) -> [workspace, counters, retired buffers] for split-K launches.
_WORKSPACES: dict = {}
_WORKSPACE_LOCK = threading.Lock()


def split_workspace(device, floats, counters, library=None):
    """``fn(stream) -> (workspace, counters, ...)`` pointers for split-K launches of one problem
    size on ``device``: per stream (launches on one stream run one after another, so each
    stream's buffers are used by one launch at a time), grown when a problem needs more and kept
    (split-K kernels leave the counters zero, so they are zeroed once, when allocated).  Buffers
    outgrown are kept alive too: a kernel queued before the growth may still use them.

    While ``stream`` captures a CUDA graph the buffers are new ones from torch's allocator for
    ``library == "torch"`` (see :func:`_captured_buffers`), else a numbatc.CaptureError."""

    def get(stream):
        if not _EMULATED and _capture.is_capturing(stream):
            return _captured_buffers(device, floats, counters, library, stream)
        handle = stream if isinstance(stream, int) else id(stream)
        # NOTE: handle 2 is CU_STREAM_PER_THREAD, a different stream in every host thread: two
        # threads' split-K launches on it may run at once, so each thread gets its own buffers
        key = (device, handle, threading.get_ident() if handle == 2 else None)
        entry = _WORKSPACES.get(key)
        if entry is None or entry[0].size < floats or entry[1].size < counters:
            with _WORKSPACE_LOCK:  # two threads growing one stream's buffers: one allocates
                return _grow(key, floats, counters)
        return entry[3], entry[4]

    return get


#: the captured split-K launch's buffers, per thread, until the numbatc call that queued it
#: returns (see _captured_buffers and release_captured)
_CAPTURED = threading.local()


def release_captured():
    """Drop the buffers a call took from torch's allocator while capturing (its launches are
    queued by now).  Holding them longer would leave tensors in the graph's pool that are not the
    graph's outputs, which torch.compile's CUDA-graph trees refuse ("Detected 2 tensor(s) in the
    cudagraph pool not tracked as outputs")."""
    if _CAPTURED.__dict__:
        _CAPTURED.__dict__.clear()


def _captured_buffers(device, floats, counters, library, stream):
    """Split-K buffers for a launch recorded into a CUDA graph: numbatc's per-stream cache
    cannot serve it (a replay may run beside eager launches that use the cached buffers, and
    cuMemAlloc invalidates the capture), so for torch inputs they come from torch's allocator on
    the capturing stream, which is torch's current one: the graph's private pool, the counters
    zeroed by a memset the graph records.  They stay referenced until the numbatc call returns
    (:func:`release_captured`), its launch queued; stream order makes a later reuse of their
    memory inside the same graph safe."""
    if library != "torch":
        _capture.refuse_if_capturing(
            stream, "allocate a split-K workspace",
            "graphs of split-K launches take their workspace from torch's allocator (torch "
            "inputs); for other libraries set NUMBATC_SPLIT_K=1 while capturing")
    import torch

    where = torch.device("cuda", device)
    ws = torch.empty(floats, dtype=torch.float32, device=where)
    cnt = torch.zeros(counters, dtype=torch.int32, device=where)
    _CAPTURED.keep = (ws, cnt)
    return ws.data_ptr(), cnt.data_ptr()


def _grow(key, floats, counters):
    """split_workspace's allocation (under _WORKSPACE_LOCK): buffers of at least the sizes asked
    for the key, the outgrown ones kept alive."""
    from numbatc.kernels.operands import flat

    old = _WORKSPACES.get(key)
    if old is not None and old[0].size >= floats and old[1].size >= counters:
        return old[3], old[4]  # another thread grew them meanwhile
    ws = cuda.device_array(max(floats, old[0].size if old else 0), np.float32)
    cnt = cuda.to_device(np.zeros(max(counters, old[1].size if old else 0), np.int32))
    entry = [ws, cnt, (old[2] + [old[0], old[1]]) if old else []]
    if _EMULATED:
        entry += [flat(ws, []), flat(cnt, [])]
    else:
        entry += [ws.device_ctypes_pointer.value, cnt.device_ctypes_pointer.value]
    _WORKSPACES[key] = entry
    return entry[3], entry[4]
