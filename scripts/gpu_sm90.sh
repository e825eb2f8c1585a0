#!/usr/bin/env bash
# The Hopper-GEMM round on the lent H200: the sm90 kernel's correctness tests, every sm90
# configuration (and the sm80 heuristic, and cuBLAS) on the benchmark's quick shapes, the SASS
# report of one sm90 kernel, and the rest of the GEMM suite.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_sm90.sh [config ...]
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=($(python3 -c "from numbatc.kernels.sm90_gemm import CONFIGS; print(*CONFIGS)"))
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rf -x tests/gpu/test_sm90_gemm_gpu.py 2>&1 | tail -15
  for cfg in "${configs[@]}"; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg timeout 90 python3 -m numbatc.bench gemm --shapes quick 2>&1 | grep -vE "^gemm \[" | tail -4
  done
  echo "== sm80 heuristic"
  timeout 90 python3 -m numbatc.bench gemm --shapes quick 2>&1 | tail -3
} 2>&1 | tee "$out/sm90.txt"
