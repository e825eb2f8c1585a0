#!/usr/bin/env bash
# One round on the lent H200: environment report, the GPU test suite, then (when asked) the
# benchmarks and sanitizer passes. Logs and JUnit XML go to $OUT (or ./out).
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round.sh [pytest args...]
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
{
  echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 - <<'PY'
import importlib
for name in ["numpy", "numba", "numba_cuda", "llvmlite", "cuda.core", "cuda.bindings", "ml_dtypes", "torch", "cupy"]:
    try:
        m = importlib.import_module(name)
        print(f"{name:14s} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"{name:14s} missing ({type(e).__name__})")
PY
} 2>&1 | tee "$out/env.txt"
start=$(date +%s)
python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$out/gpu-junit.xml" "${@:-tests}" 2>&1 | tee "$out/gpu-tests.log"
status=${PIPESTATUS[0]}
echo "gpu tests: exit $status in $(( $(date +%s) - start )) s" | tee -a "$out/gpu-tests.log"
exit $status
