#!/usr/bin/env bash
# H200 round eight (fourth session, the last ~5 minutes of device time): the persistent sm90
# configurations (_pt: one block per SM walking tiles, the stage counter running on across
# tiles) -- their GPU suite incl. a 306-tile problem, their benchmark against the default, and
# compute-sanitizer on a many-tile problem.
#   tests.txt  test_sm90_gemm_gpu.py (every forced config; parallel shards)
#   bench.txt  gemm quick: default (128x256x64_4s), 128x256x64_4s_pt, 128x256x64_4s_w1_pt
#   sanitize.txt  memcheck + racecheck on gemm_sm90_persistent
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round8.sh
source "$(dirname "$0")/gpu_common.sh"
$py scripts/pytest_shards.py --shards 12 --timeout 130 --out /tmp/shards tests/gpu/test_sm90_gemm_gpu.py \
  -- --tb=short > "$out/tests.txt" 2>&1
{
  echo "== default"
  t 50 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  for cfg in 128x256x64_4s_pt 128x256x64_4s_w1_pt; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg t 45 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  done
  echo "[bench done at $((SECONDS - start)) s]"
} > "$out/bench.txt"
{
  for tool in memcheck racecheck; do
    left=$((290 - (SECONDS - start)))
    if (( left < 15 )); then echo "skipped $tool: no time left"; continue; fi
    echo "== $tool gemm_sm90_persistent"
    t $((left < 50 ? left : 50)) compute-sanitizer --tool $tool --report-api-errors no --print-limit 5 \
      $py scripts/sanitize_cases.py gemm_sm90_persistent | grep -vE "^\s*$" | tail -7
  done
} > "$out/sanitize.txt"
