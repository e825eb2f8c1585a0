#!/usr/bin/env bash
# H200 round seven (fourth session): the epilogue's 32-bit pair stores (Sm80Variant.out_pairs:
# row-major 16-bit out with 4-byte aligned rows; round six's profile put 12.7 % of all warp
# samples in the per-element, bounds-checked epilogue of the plain GEMM) on top of round six's
# producer.  GEMM GPU suites, benchmarks, and compute-sanitizer on the GEMM kernels.
#   tests.txt     sm90 / FP8 / GEMM / interop GPU suites (parallel shards)
#   bench.txt     gemm quick (default, and 128x256x64_4s with no wgmma group in flight),
#                 epilogue quick, FP8 quick, decode
#   sanitize.txt  memcheck + racecheck on gemm_sm90 / gemm_fp8, memcheck on gemm_sm80
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round7.sh
source "$(dirname "$0")/gpu_common.sh"
$py scripts/pytest_shards.py --shards 12 --timeout 200 --out /tmp/shards tests/gpu/test_sm90_gemm_gpu.py \
  tests/gpu/test_gemm_fp8_gpu.py tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_interop_gpu.py \
  -- --tb=short > "$out/tests.txt" 2>&1
{
  echo "== default"
  t 90 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  echo "== sm90:128x256x64_4s"
  NUMBATC_GEMM_KERNEL=sm90:128x256x64_4s t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  echo "== epilogue"
  t 60 $py -m numbatc.bench epilogue --shapes quick | tail -6
  echo "== fp8 e4m3"
  t 60 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
  echo "== decode"
  t 80 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]|rror|copy"
  echo "[bench done at $((SECONDS - start)) s]"
} > "$out/bench.txt"
{
  for run in "memcheck gemm_sm90" "racecheck gemm_sm90" "memcheck gemm_fp8" "racecheck gemm_fp8" "memcheck gemm_sm80"; do
    set -- $run
    left=$((580 - (SECONDS - start)))
    if (( left < 20 )); then echo "skipped $run: no time left"; continue; fi
    echo "== $run"
    t $((left < 60 ? left : 60)) compute-sanitizer --tool $1 --report-api-errors no --print-limit 5 \
      $py scripts/sanitize_cases.py $2 | grep -vE "^\s*$" | tail -7
  done
} > "$out/sanitize.txt"
