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


def _query(handle: int) -> str:
    """'none', 'active', 'invalidated', or 'implicit' (the legacy default stream while another
    stream captures in global mode) for a raw CUstream handle."""
    try:
        from cuda.bindings import driver

        err, status = driver.cuStreamIsCapturing(driver.CUstream(handle))
    except (ImportError, RuntimeError, OSError):  # no driver library: no GPU, nothing captures
        return "none"
    if err == driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
        return "implicit"
    if err != driver.CUresult.CUDA_SUCCESS:
        return "none"  # no context yet, a stream of another context: nothing is capturing here
    if status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return "active"
    if status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED:
        return "invalidated"
    return "none"


def stream_handle(stream) -> int:
    """A raw CUstream handle from an int or a Numba stream object."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", stream)  # numba's Stream: a CUstream
    return 0 if handle is None else int(handle)


def capture_status(stream) -> str:
    """The capture status of ``stream`` (a raw handle or a Numba stream): 'none' outside
    capture and in the CPU emulation, else see :func:`_query`."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return "none"
    return _query(stream_handle(stream))


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
