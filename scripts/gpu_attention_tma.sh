#!/usr/bin/env bash
# The TMA attention round (issue 17) in under 7 minutes on the H200 (16 cores): the Hopper
# attention GPU tests in parallel shards, then `bench attention --shapes quick` for the default
# and each TMA configuration, one at a time (timings need the GPU to themselves). While the tests
# run, one process per benchmarked configuration compiles the benchmark's kernels (bf16, head_dim
# 64 and 128, causal or not, no lse) into the round's disk cache, so the benchmarks only time.
# Each block writes its own file under $OUT as it finishes, so a round cut short still returns
# what it did:
#   tests.txt        per-shard summaries and failing node ids (TMA tests; the others)
#   testlogs.txt     the shards' logs
#   warm.txt         the compile-ahead processes (the config each one ran, its time)
#   attention.txt    the benchmark tables: default, then each TMA config (NUMBATC_ATTN_KERNEL)
# Usage from the repo root:  source .gpu/env.sh && bash scripts/gpu_attention_tma.sh [tests|bench|all]
# TMA_CONFIGS overrides the configurations benchmarked; SM90_ATTN_K the second shard group's -k.
source "$(dirname "$0")/gpu_common.sh"
what=${1:-all}
: "${TMA_CONFIGS:=n128_2s_ov_pp_fx_tma n128_2s_ov_pp_fx_tma_pt n128_3s_ov_pp_fx_tma n128_2s_ov_fx_tma n128_2s_fx_tma}"
# the cp.async configurations' kernel sources are unchanged by the TMA work: their sweeps run
# for the default only (SM90_ATTN_K="not _tma and not timing" runs all of them)
: "${SM90_ATTN_K:=not _tma and not timing and (n128_2s_ov_pp_fx or not sweep)}"
tests=tests/gpu/test_sm90_attention_gpu.py
budget=400  # seconds for the whole round

warm() {  # warm CONFIG ("" = the default): compile the benchmark's four kernels
  local cfg=$1
  NUMBATC_ATTN_KERNEL=${cfg:+sm90:$cfg} NUMBATC_PRINT_CONFIG=1 timeout 250 $py -c "
import time, torch, numbatc
t0 = time.time()
for d in (64, 128):
    q = torch.randn(1, 200, 2, d, device='cuda', dtype=torch.bfloat16)
    for causal in (False, True):
        numbatc.attention(q, q, q, causal=causal)
torch.cuda.synchronize()
print('warm ${cfg:-default}: %.0f s' % (time.time() - t0))" 2>&1
}

if [[ $what == tests || $what == all ]]; then
  for cfg in "" $TMA_CONFIGS; do warm "$cfg" > "/tmp/warm_${cfg:-default}.txt" & done
  $py scripts/pytest_shards.py --shards 10 --timeout 250 --out /tmp/attn_tma_shards $tests -- \
    --tb=short -k "_tma and not timing" > /tmp/attn_tma_tests.txt 2>&1 &
  $py scripts/pytest_shards.py --shards 4 --timeout 250 --out /tmp/attn_rest_shards $tests -- \
    --tb=short -k "$SM90_ATTN_K" > /tmp/attn_rest_tests.txt 2>&1 &
  wait
  { echo "== TMA configurations (-k '_tma and not timing')"; cat /tmp/attn_tma_tests.txt
    echo "== the rest (-k '$SM90_ATTN_K')"; cat /tmp/attn_rest_tests.txt
    echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/attn_tma_shards/*.log /tmp/attn_rest_shards/*.log; do echo "=== $f"; cat "$f"; done \
    > "$out/testlogs.txt"
  cat /tmp/warm_*.txt > "$out/warm.txt"
fi

if [[ $what == bench || $what == all ]]; then
  {
    for cfg in "" $TMA_CONFIGS; do
      left=$((budget - (SECONDS - start)))
      if (( left < 15 )); then echo "== ${cfg:-default}: skipped, no time left"; continue; fi
      echo "== ${cfg:+sm90:}${cfg:-default (sm90_attention.choose_config)}"
      NUMBATC_ATTN_KERNEL=${cfg:+sm90:$cfg} t $((left < 70 ? left : 70)) \
        $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror|config"
    done
    echo "[attention bench done at $((SECONDS - start)) s]"
  } > "$out/attention.txt"
fi
