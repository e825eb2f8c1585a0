#!/usr/bin/env bash
# H200 round three (third session): the two-pass full-tile epilogue (values, then stores) of
# sm80_gemm and sm90_gemm -- every GEMM GPU test, the user epilogue's overhead -- and split-K
# slice counts and the portable split-K form for M = 128 / 256 against the heuristic.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round3.sh
source "$(dirname "$0")/gpu_common.sh"
$py scripts/pytest_shards.py --shards 14 --timeout 240 --out /tmp/shards1 \
  tests/gpu/test_gemm_gpu.py tests/gpu/test_sm90_gemm_gpu.py tests/gpu/test_gemm_fp8_gpu.py \
  tests/gpu/test_gemm_interop_gpu.py -- --tb=short > "$out/tests.txt" 2>&1
echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
for f in /tmp/shards1/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
{
  t 60 $py -m numbatc.bench epilogue --shapes all | tail -10
  t 60 $py examples/ex04_*.py | tail -2
  echo "== heuristic"
  t 60 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]|copy"
  for s in 2 8; do
    echo "== NUMBATC_SPLIT_K=$s"
    NUMBATC_SPLIT_K=$s t 60 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]"
  done
  echo "== sm80, NUMBATC_SPLIT_K=4 (M = 128 / 256 rows are the point)"
  NUMBATC_GEMM_KERNEL=sm80 NUMBATC_SPLIT_K=4 t 60 $py -m numbatc.bench gemm --shapes decode | grep -E "^ +[0-9]"
  echo "== quick"
  t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]"
  echo "[bench done at $((SECONDS - start)) s]"
} > "$out/bench.txt"
