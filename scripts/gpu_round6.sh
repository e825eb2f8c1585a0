#!/usr/bin/env bash
# H200 round six (fourth session): the Hopper GEMM's producer copies tiles that lie wholly inside
# the operands without bounds checks (load_*_inside: ~5 SASS instructions per 16-byte copy
# instead of ~17; the profile of round five's code put 34 % of all warp samples on the
# consumers' full-barrier wait and the producer never waiting for an empty stage).
#   tests.txt  sm90 GEMM and FP8 GPU suites (parallel shards)
#   bench.txt  gemm quick with the default and with other sm90 configs forced; FP8 quick
#   profile*   with PROFILE=1: scripts/gpu_verify.sh profile of the default (8192^3)
# Round 6b (same script): byte-addressed operands and the inside copies' thread mapping (rows
# p // 8 + 16 i, 128-byte steps as immediate offsets): ~2.5 SASS instructions per copy.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round6.sh
source "$(dirname "$0")/gpu_common.sh"
$py scripts/pytest_shards.py --shards 8 --timeout 230 --out /tmp/shards tests/gpu/test_sm90_gemm_gpu.py \
  tests/gpu/test_gemm_fp8_gpu.py -- --tb=short > "$out/tests.txt" 2>&1
for f in /tmp/shards/*.log; do echo "=== $f"; grep -vE "^\.+$" "$f" | tail -30; done >> "$out/tests.txt"
{
  echo "== default"
  t 90 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  for cfg in ${CONFIGS:-128x256x64_4s_w1_c2 128x128x64_6s_w1 128x256x64_4s}; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]|rror"
  done
  echo "== fp8 e4m3"
  t 60 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
  echo "== decode"
  t 80 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]|rror|copy"
  echo "[bench done at $((SECONDS - start)) s]"
} > "$out/bench.txt"
if [[ -n ${PROFILE:-} ]]; then bash "$(dirname "$0")/gpu_verify.sh" profile; fi
