#!/usr/bin/env bash
# The GEMM round on the lent H200: correctness subset, examples, benchmark (heuristic on every
# shape, then every tile configuration on the two squares), and one Nsight Compute profile.
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_final.sh
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_gemm_gpu.py \
  -k "epilogue or misaligned or torch or float32_output or rr-float16" 2>&1 | tee "$out/gemm-tests.txt" | tail -6
timeout 60 python3 -m numbatc 2>&1 | grep -E "PASS|FAIL|ERROR|OK" | tee "$out/demo.txt"
timeout 150 python3 -m numbatc.bench gemm --shapes all --csv "$out/bench.csv" --png "$out/bench.png" 2>/dev/null | tee "$out/bench.txt"
timeout 80 python3 -m numbatc.bench gemm --shapes quick --configs --csv "$out/configs.csv" 2>/dev/null | tail -12
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
  timeout 60 "$ncu" --clock-control none -k regex:gemm_kernel -c 1 --section SpeedOfLight \
    --section Occupancy --section WarpStateStats python3 -c "
import torch, numbatc
a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); b = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)
numbatc.gemm(a, b); torch.cuda.synchronize()" > "$out/ncu.txt" 2>&1
  grep -E "Throughput|Occupancy|Registers|Stall|Warp Cycles|Issued" "$out/ncu.txt" | head -30
fi
