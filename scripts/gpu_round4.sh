#!/usr/bin/env bash
# H200 round four (third session): sm90_gemm's split-K form for 64 < M <= 256 -- the GEMM GPU
# tests, compute-sanitizer on it, the decode benchmark with it (and sm90 forced for M <= 64);
# the Hopper attention kernel's configs on the quick shapes.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round4.sh
source "$(dirname "$0")/gpu_common.sh"
$py scripts/pytest_shards.py --shards 12 --timeout 200 --out /tmp/shards1 \
  tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_interop_gpu.py -- --tb=short > /tmp/tests.txt 2>&1 &
(
  for tool in memcheck racecheck synccheck; do
    echo "== $tool gemm_sm90_split"
    t 80 compute-sanitizer --tool $tool --report-api-errors no $py scripts/sanitize_cases.py \
      gemm_sm90_split | grep -E "rel err|WRONG|SUMMARY|Invalid|hazard|done" | head -10
  done
) > /tmp/sanitize.txt 2>&1 &
wait
cat /tmp/tests.txt /tmp/sanitize.txt > "$out/tests.txt"
echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
for f in /tmp/shards1/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
{
  echo "== heuristic"
  t 70 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]|copy"
  echo "== sm90 forced (split-K for M <= 256)"
  NUMBATC_GEMM_KERNEL=sm90 t 70 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]"
  echo "== quick"
  t 40 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]"
  echo "[gemm bench done at $((SECONDS - start)) s]"
} > "$out/bench.txt"
{
  for cfg in n128_2s_ov n128_2s_ov_pp n128_3s_ov n64_2s_ov_pp; do
    left=$((540 - (SECONDS - start)))
    if (( left < 40 )); then echo "skipped $cfg: no time left"; continue; fi
    echo "== sm90:$cfg"
    NUMBATC_ATTN_KERNEL=sm90:$cfg t $((left < 80 ? left : 80)) $py -m numbatc.bench attention --shapes quick \
      | grep -E "^ +[0-9]|rror"
  done
} > "$out/attention.txt"
