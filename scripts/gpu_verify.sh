#!/usr/bin/env bash
# The next H200 round: everything written since the last one, most important first (each block
# writes its own file under $OUT as it finishes, so a round cut short still returns results).
#   launch.txt    the >48 KB dynamic+static shared memory regression, clusters, DSMEM bulk copy,
#                 named barriers
#   softmax.txt   softmax / gemm_softmax GPU tests (the two H200 failures were fixed blind), ex05
#   sm90.txt      sm90_gemm with the producer-side proxy fence (_pf) against _w1, its tests, FP8
#                 with per-tensor scales, and user epilogues on the Hopper path (test_gemm_gpu -k
#                 epilogue, bench epilogue)
#   attention.txt every attention GPU test (portable; the Hopper kernel forced), bench both
#   host.txt      warm-call host overhead (gemm, softmax), benchmarks of softmax
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_verify.sh
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
py="python3 -W ignore"
t() { local limit=$1; shift; timeout "$limit" "$@" 2>&1; echo "[exit $? after limit ${limit}s: $*]"; }
{
  t 60 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_launch_gpu.py tests/gpu/test_cluster_gpu.py tests/gpu/test_barrier_gpu.py | tail -4
} > "$out/launch.txt"
{
  t 150 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_softmax_gpu.py | tail -8
  t 60 $py examples/ex05_fused_softmax.py | tail -3
} > "$out/softmax.txt"
{
  for cfg in 128x256x64_4s_w1_pf 128x256x64_4s_w1 128x128x64_4s_w1_pf; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg t 60 $py -m numbatc.bench gemm --shapes quick | grep -E "^ +[0-9]" | tail -2
  done
  t 240 $py -m pytest -q -m gpu -p no:cacheprovider -rf -x tests/gpu/test_sm90_gemm_gpu.py | tail -4
  t 120 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_gemm_fp8_gpu.py | tail -4
  t 120 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_gemm_gpu.py -k "epilogue" | tail -4
  t 60 $py -m numbatc.bench epilogue --shapes quick | tail -6
} > "$out/sm90.txt"
{
  t 300 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_attention_gpu.py | tail -8
  t 60 $py -m pytest -q -m gpu -p no:cacheprovider -rf -x tests/gpu/test_sm90_attention_gpu.py -k small_cases_first | tail -4
  t 200 $py -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_sm90_attention_gpu.py -k "not timing" | tail -8
  t 100 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]"
  NUMBATC_ATTN_KERNEL=sm90 t 100 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]"
} > "$out/attention.txt"
{
  t 60 $py scripts/host_overhead.py --shape 1024,1024,1024 | tail -30
  t 60 $py -m numbatc.bench softmax --shapes quick | tail -8
} > "$out/host.txt"
