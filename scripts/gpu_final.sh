#!/usr/bin/env bash
# One closing round on the lent H200, most important first, every result written to $OUT as it
# comes (a round cut short by the device budget still returns what finished):
#   gemm.txt/.csv/.png   python -m numbatc.bench gemm --shapes all (the heuristic: sm90_gemm on
#                        cc 9.0 for M > 64)
#   attention.txt        the attention GPU tests, then python -m numbatc.bench attention --shapes quick
#   fused.txt            softmax GPU tests, examples 04-06, bench epilogue and softmax (quick)
#   extra.txt            the DSMEM lane test, an extra sm90 configuration, host overhead per stage
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_final.sh
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
py="python3 -W ignore"  # (timeout runs programs, not shell functions)
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader)"
  timeout 180 $py -m numbatc.bench gemm --shapes all --csv "$out/gemm.csv" --png "$out/gemm.png" 2>/dev/null
} > "$out/gemm.txt" 2>&1
{
  timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_attention_gpu.py 2>&1 | tail -12
  timeout 80 $py -m numbatc.bench attention --shapes quick --csv "$out/attention.csv" 2>/dev/null
} > "$out/attention.txt" 2>&1
{
  timeout 70 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_softmax_gpu.py 2>&1 | tail -8
  for ex in examples/ex04_*.py examples/ex05_*.py examples/ex06_*.py; do
    echo "== $ex"; timeout 60 $py "$ex" 2>&1 | tail -2
  done
  timeout 60 $py -m numbatc.bench epilogue --shapes quick 2>/dev/null
  timeout 50 $py -m numbatc.bench softmax --shapes quick 2>/dev/null
} > "$out/fused.txt" 2>&1
{
  timeout 40 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_cluster_gpu.py 2>&1 | tail -2
  for cfg in 128x128x64_6s_w1; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg timeout 50 $py -m numbatc.bench gemm --shapes quick 2>/dev/null | tail -2
  done
  timeout 60 $py scripts/host_overhead.py --shape 1024,1024,1024 2>&1 | tail -30
} > "$out/extra.txt" 2>&1
