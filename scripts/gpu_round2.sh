#!/usr/bin/env bash
# H200 round two (third session): what changed after gpu_verify.sh's round --
#   tests   split-K for small M, user epilogues on the warm path (prepared launches with array
#           parameters), sm90_attention as the Hopper default (the whole attention suite), the
#           sm90_attention suite in more shards; compute-sanitizer (what memcheck's errors are,
#           racecheck with a hand-written attention reference) beside them.
#   bench   decode shapes against cuBLAS and the copy bandwidth, the default GEMM, FP8, the user
#           epilogue's overhead, attention on every shape, a profile of the Hopper GEMM's stalls.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round2.sh tests|bench
source "$(dirname "$0")/gpu_common.sh"
what=${1:-tests}

if [[ $what == tests ]]; then
  $py scripts/pytest_shards.py --shards 9 --timeout 300 --out /tmp/shards1 \
    tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_interop_gpu.py tests/gpu/test_attention_gpu.py \
    tests/gpu/test_launch_gpu.py -- --tb=short > /tmp/tests1.txt 2>&1 &
  $py scripts/pytest_shards.py --shards 5 --timeout 300 --out /tmp/shards2 \
    tests/gpu/test_sm90_attention_gpu.py -- --tb=short -k "not timing" > /tmp/tests2.txt 2>&1 &
  (
    for kind in gemm_sm80 gemm_sm90 attention_sm90 attention_sm80 softmax; do
      echo "== memcheck $kind"
      t 90 compute-sanitizer --tool memcheck --print-limit 3 $py scripts/sanitize_cases.py $kind \
        | grep -E "rel err|WRONG|ERROR SUMMARY|Program hit|Invalid|of size|at 0x|done" | head -14
    done
    for kind in attention_sm90 attention_sm80 gemm_sm80; do
      echo "== racecheck $kind"
      t 90 compute-sanitizer --tool racecheck --print-limit 3 $py scripts/sanitize_cases.py $kind \
        | grep -E "rel err|WRONG|SUMMARY|hazard|done" | head -8
    done
  ) > /tmp/sanitize.txt 2>&1 &
  wait
  cat /tmp/tests1.txt /tmp/tests2.txt > "$out/tests.txt"
  echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
  for f in /tmp/shards1/*.log /tmp/shards2/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  cp /tmp/sanitize.txt "$out/sanitize.txt"
fi

if [[ $what == bench ]]; then
  {
    t 150 $py -m numbatc.bench gemm --shapes decode --csv "$out/decode.csv" | grep -vE "^gemm \["
    t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]"
    t 60 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
    t 60 $py -m numbatc.bench epilogue --shapes quick | tail -6
    echo "[gemm done at $((SECONDS - start)) s]"
  } > "$out/bench.txt"
  {
    t 200 $py -m numbatc.bench attention --shapes all --csv "$out/attention.csv" | grep -vE "^attention \["
    echo "[attention done at $((SECONDS - start)) s]"
  } > "$out/attention.txt"
  {
    echo "== memcheck without API-error reports (the 34 are cuGetProcAddress probes)"
    t 60 compute-sanitizer --tool memcheck --report-api-errors no $py scripts/sanitize_cases.py \
      gemm_sm80 | grep -E "rel err|WRONG|ERROR SUMMARY|Invalid|done"
    left=$((560 - (SECONDS - start)))
    if (( left > 60 )); then
      NUMBATC_GEMM_KERNEL=sm90:128x256x64_4s_w1 t $((left - 10)) ncu --clock-control none \
        -k regex:gemm_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        $py -c "
import torch, numbatc
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
numbatc.gemm(a, b); torch.cuda.synchronize()" | grep -vE "^==PROF==|^\s*$" | head -120
    else
      echo "no time left for ncu"
    fi
  } > "$out/ncu.txt"
fi
