#!/usr/bin/env bash
# The same benchmark on an older tree and on this one, in alternating rounds on one GPU, so that
# a kernel's rewrite is measured against what it replaced in the same session:
#   bash scripts/bench_ab.sh BASE ROUNDS BENCH-ARGS...
# BASE is a folder holding an older checkout's numbatc and intrinsics (git archive REV numbatc
# intrinsics | tar -x -C BASE; its COMMIT file names REV); round r runs base then this tree, or
# this tree then base when r is even.  Environment variables (NUMBATC_GEMM_KERNEL ...) reach
# both.  Each tree compiles into its own cache entries (the cache keys hash the sources).
source "$(dirname "$0")/gpu_common.sh"
base=$1 rounds=$2
shift 2
echo "(base: $base, $(cat "$base/COMMIT" 2>/dev/null || echo '?'); bench $*)"
for ((r = 1; r <= rounds; r++)); do
  order="base new"
  ((r % 2 == 0)) && order="new base"
  for tree in $order; do
    echo "== round $r, $tree"
    if [[ $tree == base ]]; then
      PYTHONPATH="$base:${PYTHONPATH:-}" $py -m numbatc.bench "$@" 2>&1
    else
      $py -m numbatc.bench "$@" 2>&1
    fi | grep -E "^ +[0-9]|rror| M +N| B +S|ratio"
  done
done
