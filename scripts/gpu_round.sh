#!/usr/bin/env bash
# One round on the lent H200: environment report, the GPU test suite, then (when asked) the
# benchmarks and sanitizer passes. Logs and JUnit XML go to $OUT (or ./out).
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_round.sh [test files...]
# $OUT gets env.txt, gpu-tests.log (one summary line per file) and gpu-logs.tgz (every pytest log
# and JUnit file): the device tool brings back at most 8 files.
set -uo pipefail
out=${OUT:-out}
logs=$(mktemp -d)
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
# One pytest process per test file: a kernel fault (illegal instruction, misaligned address)
# poisons its CUDA context, and must not take the other files' results with it.
start=$(date +%s)
status=0
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_*.py)
: > "$out/gpu-tests.log"
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  python3 -m pytest -m gpu -q -p no:cacheprovider -rf --junitxml="$logs/junit-$name.xml" "$f" > "$logs/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$name: exit $rc, $(tail -1 "$logs/$name.log")" | tee -a "$out/gpu-tests.log"
  grep -E "^(FAILED|ERROR) " "$logs/$name.log" | cut -c1-200 | head -20 | tee -a "$out/gpu-tests.log"
done
echo "gpu tests: exit $status in $(( $(date +%s) - start )) s" | tee -a "$out/gpu-tests.log"
tar czf "$out/gpu-logs.tgz" -C "$logs" .
exit $status
