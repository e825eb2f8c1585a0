"""Named barriers left part-full at a kernel's exit, in the CPU emulation: the emulation reports
such a barrier only where a thread waits on it, so the kernels' tests record every barrier
touched and check that none still holds arrivals (a ping-pong's last hand-over must be taken)."""


def record_named_barriers(monkeypatch):
    """Record every named barrier the emulated kernels touch from now on; returns a function
    giving those that still hold arrivals."""
    from intrinsics.emulate import barrier as emulated_barrier

    touched = []
    real_arrive = emulated_barrier._arrive

    def arrive(thread, op, barrier_id, nthreads):
        result = real_arrive(thread, op, barrier_id, nthreads)
        touched.append(result[1])
        return result

    monkeypatch.setattr(emulated_barrier, "_arrive", arrive)
    left = lambda: [bar for bar in touched if bar["arrived"] != 0]  # noqa: E731
    left.touched = touched
    return left
