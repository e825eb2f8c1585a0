"""CUDA graph capture: is the caller's stream capturing, and what numbatc does then.

While a stream captures a graph (``torch.cuda.graph``, ``cudaStreamBeginCapture``) every
operation queued on it is recorded instead of run, and anything that allocates with
``cuMemAlloc``, synchronises or copies to the host invalidates the capture (in torch's default
"global" mode, a call on the legacy default stream from any thread does too).  A warm numbatc
call only launches kernels, so it is recorded; what a call would otherwise do, and what it does
while capturing:

- split-K workspaces (numbatc.gemm at small M): for torch inputs taken from torch's allocator
  on the capturing stream (the graph's private pool; the counters zeroed by a recorded memset),
  not from numbatc's per-stream cache; for other libraries a :class:`CaptureError`.
- packing an operand that is not 16-byte aligned (a copy numbatc allocates): CaptureError.
- K == 0 in numbatc.gemm (computed on the host): CaptureError.
- a result numbatc allocates for CuPy or Numba inputs: CaptureError (pass ``out=``); torch's
  ``torch.empty`` is capture-safe.
- the first call of a shape compiles and loads its kernel: make it once before capturing (the
  usual warm-up call).

``capture_status(handle)`` is the one driver query (``cuStreamIsCapturing``); CPU tests replace
``_query``.
"""

from __future__ import annotations

__all__ = ["CaptureError", "capture_status", "is_capturing", "refuse_if_capturing",
           "stream_handle"]


class CaptureError(RuntimeError):
    """A numbatc call that cannot be recorded into a CUDA graph, with the reason."""


#: (cuStreamIsCapturing, CUstream, CUDA_SUCCESS, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, ACTIVE,
#: INVALIDATED, {handle: CUstream}) bound on the first query, so that a warm split-K call's
#: check costs the driver call and a dict lookup (no import, no CUstream construction); False
#: where there is no driver library.
_DRIVER = None


def _bind():
    global _DRIVER
    try:
        from cuda.bindings import driver
    except (ImportError, RuntimeError, OSError):  # no driver library: no GPU, nothing captures
        _DRIVER = False
        return False
    status = driver.CUstreamCaptureStatus
    _DRIVER = (driver.cuStreamIsCapturing, driver.CUstream, driver.CUresult.CUDA_SUCCESS,
               driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
               status.CU_STREAM_CAPTURE_STATUS_ACTIVE, status.CU_STREAM_CAPTURE_STATUS_INVALIDATED,
               {})
    return _DRIVER


def _query(handle: int) -> str:
    """'none', 'active', 'invalidated', or 'implicit' (the legacy default stream while another
    stream captures in global mode) for a raw CUstream handle."""
    global _DRIVER
    bound = _DRIVER if _DRIVER is not None else _bind()
    if not bound:
        return "none"
    query, custream, success, implicit, active, invalidated, streams = bound
    stream = streams.get(handle)
    if stream is None:
        if len(streams) > 256:
            streams.clear()
        stream = streams[handle] = custream(handle)
    try:
        err, status = query(stream)
    except (RuntimeError, OSError):  # no driver library to load (a CPU host): never a capture
        _DRIVER = False
        return "none"
    if err == success:
        if status == active:
            return "active"
        return "invalidated" if status == invalidated else "none"
    if err == implicit:
        return "implicit"
    return "none"  # no context yet, a stream of another context: nothing is capturing here


_numba_config = None


def _bind_config():
    global _numba_config
    from numba import config  # not at import: ``import numbatc`` does not import numba

    _numba_config = config
    return config


def stream_handle(stream) -> int:
    """A raw CUstream handle from an int or a Numba stream object."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", stream)  # numba's Stream: a CUstream
    return 0 if handle is None else int(handle)


def capture_status(stream) -> str:
    """The capture status of ``stream`` (a raw handle or a Numba stream): 'none' outside
    capture and in the CPU emulation, else see :func:`_query`."""
    config = _numba_config or _bind_config()
    if config.ENABLE_CUDASIM:
        return "none"
    return _query(stream if type(stream) is int else stream_handle(stream))


def is_capturing(stream) -> bool:
    return capture_status(stream) != "none"


def refuse_if_capturing(stream, what: str, instead: str = "") -> None:
    """CaptureError naming ``what`` (the operation that cannot be recorded) when ``stream``
    captures a graph; ``instead`` says what the caller can do."""
    status = capture_status(stream)
    if status == "none":
        return
    where = {
        "active": "the stream is capturing a CUDA graph",
        "invalidated": "the stream's CUDA graph capture has already been invalidated",
        "implicit": "another stream is capturing a CUDA graph (global mode) and this call runs "
                    "on the legacy default stream",
    }[status]
    raise CaptureError(f"numbatc cannot {what} while {where}" + (f": {instead}" if instead else ""))
