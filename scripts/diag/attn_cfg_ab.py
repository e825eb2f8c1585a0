"""sm90_attention's configurations side by side on any shape, in one process: each configuration
forced through NUMBATC_ATTN_KERNEL (``default``: none forced, choose()'s pick), with torch SDPA
(fastest backend) timed in the same run; TFLOP/s per configuration, the ratio of each to SDPA,
and the largest difference between the configurations' outputs.

    python scripts/diag/attn_cfg_ab.py [--cfgs default,m192_n128_2s_ov_pp_fx_tma] SPEC ...

``SPEC``: ``BxSQxSKxHQxHKVxD[c]`` as scripts/diag/first_call.py's ``attn:`` (bf16, ``c``:
causal).  Written for issue 17's head_dim 64 table (sm90_attention.THREE_CONSUMERS): the bench's
shapes all hold 16384 tokens x 2048 columns, so small grids (few heads, one sequence) and
seqlen_q != seqlen_k are measured here.
"""

import os
import sys

import torch
import torch.nn.functional as F

import numbatc
from numbatc import bench


def parse(spec):
    causal = spec.endswith("c")
    b, sq, sk, hq, hkv, d = (int(x) for x in spec.rstrip("c").split("x"))
    return b, sq, sk, hq, hkv, d, causal


def main(args):
    cfgs = ["default", "m192_n128_2s_ov_pp_fx_tma"]
    if args[:1] == ["--cfgs"]:
        cfgs, args = args[1].split(","), args[2:]
    print("spec".rjust(26) + "".join(f"{c[:24]:>26}" for c in cfgs) + f"{'SDPA':>8}  ratios to SDPA")
    for spec in args:
        b, sq, sk, hq, hkv, d, causal = parse(spec)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        # FLOPs of the unmasked part (bottom-right aligned causal mask)
        seen = sum(min(sk, max(0, i + 1 + sk - sq)) for i in range(sq)) if causal else sq * sk
        flops = 4.0 * b * hq * seen * d
        reps = max(5, min(50, int(4e13 / max(flops, 1.0))))
        tf, outs = {}, {}
        for cfg in cfgs:
            if cfg == "default":
                os.environ.pop("NUMBATC_ATTN_KERNEL", None)
            else:
                os.environ["NUMBATC_ATTN_KERNEL"] = f"sm90:{cfg}"
            out = torch.full_like(q, float("nan"))
            numbatc.attention(q, k, v, causal=causal, out=out)
            outs[cfg] = out
            ms = bench._time_gpu(lambda: numbatc.attention(q, k, v, causal=causal, out=out),
                                 torch, reps)
            tf[cfg] = flops / ms / 1e9
        os.environ.pop("NUMBATC_ATTN_KERNEL", None)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        ref = float("inf")
        for _, context in bench._sdpa_backends(torch):
            try:
                with context():
                    ref = min(ref, bench._time_gpu(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv), torch, reps))
            except RuntimeError:
                continue
        first = outs[cfgs[0]].float()
        diff = max((first - o.float()).abs().max().item() for o in outs.values())
        sdpa = flops / ref / 1e9
        print(f"{spec:>26}" + "".join(f"{tf[c]:>26.1f}" for c in cfgs) + f"{sdpa:>8.1f}  "
              + " ".join(f"{tf[c] / sdpa:.2f}" for c in cfgs)
              + f"  (outputs differ by {diff:.1e})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["1x1024x1024x8x8x64", "1x4096x4096x8x8x64", "4x2048x2048x16x16x64"])
