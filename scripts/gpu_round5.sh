#!/usr/bin/env bash
# H200 round five (third session, the last few minutes of device time): what limits the Hopper
# attention kernel (Nsight Compute at head_dim 128, seqlen 4096), memcheck on the FP8 GEMM, and
# the attention quick benchmark with head_dim 128 on the ping-pong default.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round5.sh
source "$(dirname "$0")/gpu_common.sh"
{
  t 70 ncu --clock-control none -k regex:attention -c 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    $py -c "
import torch, numbatc
q, k, v = (torch.randn(4, 4096, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
numbatc.attention(q, k, v); torch.cuda.synchronize()" | grep -vE "^==PROF==|^\s*$" | head -110
} > "$out/ncu_attention.txt"
{
  t 50 compute-sanitizer --tool memcheck --report-api-errors no $py scripts/sanitize_cases.py \
    gemm_fp8 | grep -E "rel err|WRONG|SUMMARY|Invalid|done"
  t 60 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror"
} > "$out/misc.txt"
