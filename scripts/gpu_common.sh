# Sourced by the GPU round scripts: strict mode, $out (the device tool's $OUT), one kernel cache
# for the round, and t LIMIT CMD... (run with a time limit, then say how it ended).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
export NUMBATC_CACHE_DIR=${NUMBATC_CACHE_DIR:-/tmp/numbatc-cache}
py="python3 -W ignore"
t() { local limit=$1; shift; timeout "$limit" "$@" 2>&1; echo "[exit $? after limit ${limit}s: $*]"; }
start=$SECONDS
