#!/usr/bin/env bash
# The Hopper-GEMM round on the lent H200: the sm90 kernel's correctness tests and the DSMEM
# bulk-copy lane test, each named sm90 configuration (and cuBLAS) on the benchmark's quick shapes,
# then one Nsight Compute profile of the first configuration at 8192^3.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_sm90.sh [config ...]
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=($(python3 -c "from numbatc.kernels.sm90_gemm import CONFIGS; print(*CONFIGS)"))
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_cluster_gpu.py 2>&1 | tail -2
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf -x tests/gpu/test_sm90_gemm_gpu.py 2>&1 | tail -4
  for cfg in "${configs[@]}"; do
    echo "== sm90:$cfg"
    NUMBATC_GEMM_KERNEL=sm90:$cfg timeout 90 python3 -m numbatc.bench gemm --shapes quick 2>&1 | grep -vE "^gemm \[" | tail -3
  done
} 2>&1 | tee "$out/sm90.txt"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  NUMBATC_GEMM_KERNEL=sm90:${configs[0]} timeout 120 "$ncu" --clock-control none -k regex:gemm_kernel -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    python3 -c "
import torch, numbatc
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
numbatc.gemm(a, b); torch.cuda.synchronize()" > "$out/ncu.txt" 2>&1
  grep -E "Throughput|Busy|Bandwidth|Hit Rate|Stall|Warp Cycles|Issued|Eligible|Duration" "$out/ncu.txt" | head -40
fi
