"""Where ex07's prefill spends its time under numbatc: the 4-layer Llama of
examples/ex07_transformers.py (random weights, 2 x 256 tokens), timed against torch in the same
process, then one numbatc prefill under cProfile (the top functions by cumulative and own
time), and the numbatc calls that took the checked path (a warm-path miss costs ~150-250 us).

    python scripts/diag/prefill_profile.py
"""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def main():
    import torch

    import numbatc
    from ex07_transformers import _time_ms, build

    ref, ours, _ = build()
    ids = torch.randint(0, ref.config.vocab_size, (2, 256), device="cuda")
    with torch.no_grad():
        for _ in range(3):
            ref(ids), ours(ids)
        torch.cuda.synchronize()
        t_ref = _time_ms(lambda: ref(ids), torch, reps=20)
        t_ours = _time_ms(lambda: ours(ids), torch, reps=20)
        print(f"prefill {t_ours:.2f} ms (numbatc) vs {t_ref:.2f} ms (torch): "
              f"{t_ours / t_ref:.2f}x", flush=True)
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        start = time.perf_counter()
        prof.enable()
        ours(ids)
        torch.cuda.synchronize()
        prof.disable()
        print(f"one profiled prefill: {(time.perf_counter() - start) * 1e3:.2f} ms")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
