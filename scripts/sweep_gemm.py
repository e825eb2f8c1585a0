"""Time numbatc.gemm's candidate kernels on a set of shapes, to tune dispatch's heuristic: each
candidate is a forced kernel (NUMBATC_GEMM_KERNEL) and split count (NUMBATC_SPLIT_K), timed
like the benchmark (numbatc.bench._time_gpu), with cuBLAS (torch.matmul) in the same run and each
candidate's result checked against a float32 product (a broken candidate shows as an error, not
a time).  b is w.T of a row-major (n, k) weight, as in a Linear layer.

    python3 scripts/sweep_gemm.py [--shapes table-small] [--m 64,128] [--only LABEL,...]
                                  [--dtype float8_e4m3] > sweep.txt

``--dtype float8_e4m3``: e4m3 operands with unit per-tensor scales, the FP8 candidates, against
torch._scaled_mm.

``--only`` keeps the candidates of those labels (as printed, e.g. default,64x128x64_6s_w1_tma_s1).
"""
import argparse
import os
import sys

import torch

import numbatc
from numbatc.bench import SHAPES, _time_gpu

CANDIDATES = [("default", None, None), ("sm80", "sm80", None)] + [
    (f"{name} s{s}", f"sm90:{name}", str(s))
    for name, splits in (("128x256x64_4s_w1_tma", (1, 2, 4, 8)),
                         ("128x128x64_6s_w1_tma", (1, 2, 4, 8)),
                         ("64x256x64_4s_w1_tma", (1, 2, 4, 8)),
                         ("64x128x64_6s_w1_tma", (1, 2, 4, 8, 16)),
                         ("128x256x64_4s_pt_tma", (1,)), ("128x256x64_4s_w1_pt_tma", (1,)),
                         ("128x256x64_4s_tma", (1,)),
                         # the TMA store epilogue (_ts) and its 3-stage direct-store twins
                         ("128x256x64_3s_pt_tma", (1,)), ("128x256x64_3s_pt_tma_ts", (1,)),
                         ("128x256x64_3s_w1_pt_tma", (1,)), ("128x256x64_3s_w1_pt_tma_ts", (1,)),
                         ("128x128x64_4s_w1_pt_tma", (1,)), ("128x128x64_4s_w1_pt_tma_ts", (1,)),
                         ("64x128x64_6s_w1_tma_ts", (1,)), ("64x256x64_4s_w1_tma_ts", (1,)),
                         ("128x128x64_6s_w1_tma_ts", (1,)))
    for s in splits]

#: FP8 (e4m3, per-tensor scales) candidates, against torch._scaled_mm
FP8_CANDIDATES = [("default", None, None)] + [
    (f"{name} s{s}", f"sm90:{name}", str(s))
    for name, splits in (("fp8_128x256x128_4s_pt_tma", (1,)),
                         ("fp8_128x128x128_4s_w1_tma", (1, 2, 4)),
                         ("fp8_128x128x128_6s_w1_tma", (1, 2, 4)),
                         ("fp8_64x256x128_4s_w1_tma", (1, 2, 4)),
                         ("fp8_64x128x128_6s_w1_tma", (1, 2, 4, 8)),
                         ("fp8_128x256x128_3s_pt_tma", (1,)), ("fp8_128x256x128_3s_pt_tma_ts", (1,)))
    for s in splits]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="table")
    ap.add_argument("--m", default="8,32,64,128,256,512")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float8_e4m3"))
    ap.add_argument("--only", default=None, help="comma-separated candidate labels to keep")
    args = ap.parse_args()
    keep = None if args.only is None else set(args.only.split(","))
    fp8 = args.dtype == "float8_e4m3"
    candidates = [c for c in (FP8_CANDIDATES if fp8 else CANDIDATES) if keep is None or c[0].replace(" ", "_") in keep]
    ms = {int(x) for x in args.m.split(",")}
    shapes = sorted({s for s in SHAPES[args.shapes] if s[0] in ms}, key=lambda s: (s[1], s[2], s[0]))
    print("m n k candidate ms ratio_to_cublas max_rel_err", flush=True)
    for m, n, k in shapes:
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        if fp8:
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).T
            one = torch.ones((), device="cuda")
            kw = dict(scale_a=1.0, scale_b=1.0)
            cublas = _time_gpu(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                        out_dtype=torch.bfloat16, out=out),
                               torch, args.reps)
        else:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).T
            kw = {}
            cublas = _time_gpu(lambda: torch.matmul(a, b, out=out), torch, args.reps)
        ref = a.float() @ b.float()
        best = (float("inf"), "")
        for label, kernel, split in candidates:
            for var, val in (("NUMBATC_GEMM_KERNEL", kernel), ("NUMBATC_SPLIT_K", split)):
                if val is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = val
            try:
                out.fill_(float("nan"))
                numbatc.gemm(a, b, out=out, **kw)
                torch.cuda.synchronize()
                err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                t = _time_gpu(lambda: numbatc.gemm(a, b, out=out, **kw), torch, args.reps)
            except Exception as exc:  # noqa: BLE001 -- a candidate that cannot run says why
                print(f"{m} {n} {k} {label.replace(' ', '_')} error {type(exc).__name__}: "
                      f"{str(exc)[:100]}", flush=True)
                continue
            ok = err < 2e-2
            print(f"{m} {n} {k} {label.replace(' ', '_')} {t:.4f} {cublas / t:.3f} {err:.1e}"
                  f"{'' if ok else ' WRONG'}", flush=True)
            if ok and t < best[0]:
                best = (t, label)
        print(f"# best {m}x{n}x{k}: {best[1]} {cublas / best[0]:.3f}x cuBLAS", flush=True)
    for var in ("NUMBATC_GEMM_KERNEL", "NUMBATC_SPLIT_K"):
        os.environ.pop(var, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
