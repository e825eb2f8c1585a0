#!/usr/bin/env bash
# One H200 round in under 10 minutes: the GPU tests in parallel shards (compilation is most of
# their time and the machine has 16 cores), then the benchmarks one at a time (timings need the
# GPU to themselves), then compute-sanitizer on small shapes. Each block writes its own file under
# $OUT as it finishes, so a round cut short still returns what it did.
#   tests.txt      per-shard summaries and failing node ids; testlogs.txt the shards' logs
#   bench.txt      gemm quick, epilogue overhead (incl. tanh.approx), FP8 quick (heuristic and the
#                  persistent config), FP8 decode with and without split-K
#   attention.txt  bench attention, Hopper configs with and without the fast exponential
#   sanitize.txt   compute-sanitizer memcheck / racecheck / synccheck on scripts/sanitize_cases.py
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_verify.sh [tests|bench|all|profile]
source "$(dirname "$0")/gpu_common.sh"
what=${1:-all}
: "${GPU_TESTS:=tests/gpu/test_launch_gpu.py tests/gpu/test_cluster_gpu.py tests/gpu/test_barrier_gpu.py tests/gpu/test_softmax_gpu.py tests/gpu/test_sm90_gemm_gpu.py tests/gpu/test_gemm_fp8_gpu.py tests/gpu/test_gemm_gpu.py tests/gpu/test_attention_gpu.py}"
: "${SM90_ATTN_TESTS:=tests/gpu/test_sm90_attention_gpu.py}"

if [[ $what == tests || $what == all ]]; then
  # The Hopper attention kernel in its own shards: a hang there must not take other tests along.
  $py scripts/pytest_shards.py --shards 9 --timeout 280 --out /tmp/shards1 $GPU_TESTS -- --tb=short \
    > /tmp/tests1.txt 2>&1 &
  $py scripts/pytest_shards.py --shards 7 --timeout 280 --out /tmp/shards2 $SM90_ATTN_TESTS -- --tb=short \
    -k "not timing" > /tmp/tests2.txt 2>&1 &
  ( t 120 $py examples/ex05_fused_softmax.py | tail -3 ) > /tmp/ex05.txt 2>&1 &
  wait
  cat /tmp/tests1.txt /tmp/tests2.txt /tmp/ex05.txt > "$out/tests.txt"
  for f in /tmp/shards1/*.log /tmp/shards2/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
fi

if [[ $what == bench || $what == all ]]; then
  # What the third session wrote after its last GPU round (docs/PERFORMANCE.md says what each
  # predicts): the user epilogue with tanh.approx, FP8 split-K at decode sizes, the attention
  # configs with the two-instruction exponential.
  {
    t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]"
    t 60 $py -m numbatc.bench epilogue --shapes quick | tail -7
    echo "== fp8 e4m3 quick: heuristic, then the persistent fp8_128x256x128_4s_pt (not yet measured)"
    t 60 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
    NUMBATC_GEMM_KERNEL=sm90:fp8_128x256x128_4s_pt t 60 $py -m numbatc.bench gemm --shapes quick \
      --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
    echo "== fp8 e4m3 decode: heuristic (no split), then NUMBATC_SPLIT_K=4"
    t 70 $py -m numbatc.bench gemm --shapes decode --dtype float8_e4m3 | grep -E "^ +[0-9]|rror|copy"
    NUMBATC_SPLIT_K=4 t 70 $py -m numbatc.bench gemm --shapes decode --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
    echo "[bench done at $((SECONDS - start)) s]"
  } > "$out/bench.txt"
  {
    for cfg in n128_2s_ov_pp n128_2s_ov_pp_fx n128_2s_ov n128_2s_ov_fx; do
      echo "== sm90:$cfg"
      NUMBATC_ATTN_KERNEL=sm90:$cfg t 80 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror"
    done
    echo "[attention bench done at $((SECONDS - start)) s]"
  } > "$out/attention.txt"
fi

if [[ $what == profile ]]; then
  # Where the Hopper GEMM's warps stall, per SASS instruction: one Nsight Compute report with the
  # source counters, then its summary sections and its per-instruction source page (SASS with
  # the stall-sample columns) as CSV, for issue 5's next steps. PROFILE_CODE picks the problem.
  : "${PROFILE_CODE:=a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); numbatc.gemm(a, a)}"
  t 200 ncu --clock-control none -k regex:"gemm_kernel|attention_kernel" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --import-source no -o /tmp/prof -f \
    $py -c "import torch, numbatc; $PROFILE_CODE; torch.cuda.synchronize()" | tail -5 > "$out/profile.txt"
  t 60 ncu -i /tmp/prof.ncu-rep --print-details all | grep -vE "^\s*$" | head -250 >> "$out/profile.txt"
  t 60 ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > "$out/profile_sass.csv"
  echo "[profile done at $((SECONDS - start)) s]" >> "$out/profile.txt"
fi

if [[ $what == sanitize || $what == all ]]; then
  {
    for tool in memcheck racecheck synccheck; do
      for kind in gemm_sm90 gemm_sm80 attention_sm80 attention_sm90 softmax; do
        left=$((570 - (SECONDS - start)))
        if (( left < 20 )); then echo "skipped $tool $kind: no time left"; continue; fi
        echo "== $tool $kind"
        t $((left < 60 ? left : 60)) compute-sanitizer --tool $tool --print-limit 5 \
          $py scripts/sanitize_cases.py $kind | grep -vE "^\s*$" | tail -8
      done
    done
  } > "$out/sanitize.txt"
fi
