"""A/B of sm90_attention's O stores in one process: numbatc.attention into an output that starts
16-byte aligned (TMA stores where the configuration has them, else 32-bit pairs), one 4 bytes
past that (one st.global.b32 per column pair) and one 2 bytes past it (two 16-bit stores a
pair), same kernel otherwise, with torch SDPA (fastest backend) timed beside them; all replayed
from CUDA graphs (GPU time alone).

    python scripts/diag/attn_store_ab.py [D:S ...]      (default 64:1024 96:1024 128:1024 128:4096)
"""

import sys

import torch
import torch.nn.functional as F

import numbatc
from numbatc import bench


def main(cases):
    # replayed from CUDA graphs: the offset output's calls take the checked host path (the warm
    # relaunch refuses it), so back-to-back timing would compare host paths, not stores
    bench.TIMING = "graph"
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'a16 TF/s':>9} {'a4 TF/s':>8} {'a2 TF/s':>8} "
          f"{'a16/a4':>7} {'a4/a2':>6} {'SDPA TF/s':>9} {'a16/SDPA':>8}")
    for case in cases:
        d, s = (int(x) for x in case.split(":"))
        b, h = max(1, 16384 // s), max(1, 2048 // d)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        # a16: the allocator's 256-byte aligned start; a4 / a2: 4 and 2 bytes past one, each in
        # its own allocation (views of one buffer would overlap and overwrite each other)
        outs = {"a16": torch.empty_like(q)}
        for name, skip in (("a4", 2), ("a2", 1)):
            outs[name] = torch.empty(q.numel() + skip, device="cuda", dtype=q.dtype)[skip:].view(q.shape)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for causal in (False, True):
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
            reps = max(3, min(20, int(4e13 / flops)))
            ms = {}
            for name, out in outs.items():
                numbatc.attention(q, k, v, causal=causal, out=out)
                ms[name] = bench._time_gpu(lambda: numbatc.attention(q, k, v, causal=causal, out=out),
                                           torch, reps)
            err = max((outs["a16"].float() - o.float()).abs().max().item()
                      for o in outs.values())
            ref = float("inf")
            for _, context in bench._sdpa_backends(torch):
                try:
                    with context():
                        ref = min(ref, bench._time_gpu(lambda: F.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal), torch, reps))
                except RuntimeError:
                    continue
            tf = {n: flops / t / 1e9 for n, t in ms.items()}
            print(f"{d:>4} {s:>6} {str(causal):>6} {tf['a16']:>9.1f} {tf['a4']:>8.1f} "
                  f"{tf['a2']:>8.1f} {ms['a4'] / ms['a16']:>7.3f} {ms['a2'] / ms['a4']:>6.3f} "
                  f"{flops / ref / 1e9:>9.1f} {ref / ms['a16']:>8.2f}   (outputs differ by {err:.1e})",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["64:1024", "96:1024", "128:1024", "128:4096"])
