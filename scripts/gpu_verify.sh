#!/usr/bin/env bash
# One H200 round, a section per call (each well under the device tool's 10 minutes). The GPU
# tests run in parallel pytest shards (compilation is most of their time and the machine has 16
# cores), the benchmarks one at a time (timings need the GPU to themselves), compute-sanitizer on
# small shapes. Each block writes its own files under $OUT as it finishes, so a round cut short
# still returns what it did (at most 8 files come back per call).
#   tma        scripts/tma_rules.py (every probe in its own process) and tests/gpu/test_tma_gpu.py
#   gemm       the Hopper GEMM: scripts/gpu_gemm_tma.sh (SASS counts, the sm90 suite, cp.async
#              against TMA benchmarks)
#   attention  the Hopper attention: scripts/gpu_attention_tma.sh (suite, benchmarks)
#   api        numbatc.gemm / attention / softmax suites on the default paths, CUDA graphs,
#              torch ops and torch.compile, the transformers example, compute-sanitizer on the
#              default Hopper GEMM, and the default against the cp.async producer (bench.txt)
#   store      issue 21's TMA store epilogue: its GPU tests, then sweep_gemm.py of the _ts configs
#              against their direct-store twins and cuBLAS (bf16 and FP8)
#   sweep      scripts/sweep_gemm.py: SWEEP_SHAPES at SWEEP_M, candidates SWEEP_ONLY
#   fp8block   issue 21's FP8 blockwise scales: their GPU tests, bench --fp8-scales block on the
#              DeepSeek-V3 shapes, and the quick rows of the defaults
#   table      the GEMM shape table (bench gemm --shapes table, b col): text, CSV, heatmap PNG
#   sanitize   compute-sanitizer memcheck / racecheck / synccheck on scripts/sanitize_cases.py
#              (SANITIZE_KINDS: which of its kinds; default the GEMMs, attention and softmax)
#   profile    one Nsight Compute report of a Hopper GEMM (PROFILE_CODE picks the problem,
#              PROFILE_TAG suffixes its files)
#   attntests  issues 17 / 20: the attention suites on the default walk (decode, sm90 TMA), their
#              graph and torch-op tests, the TMA default's sweep (tests.txt, testlogs.txt)
#   attnbench  scripts/diag/attn_host.py, bench attention quick (default and cp.async), decode
#   sm80       issue 22's portable kernels forced on the H200: bench gemm --configs (every sm80
#              tile) and bench attention with NUMBATC_ATTN_KERNEL=sm80
#   serving    issue 20's backward and KV-cache attention and issue 17's Hopper head dims: their
#              GPU suites with the attention suites they share kernels with (tests.txt,
#              testlogs.txt) beside compute-sanitizer on their cases (sanitize.txt) and the
#              benchmarks' first compiles, then the benchmarks (bench.txt): attention at head_dim
#              192 / 256, attention-backward, decode (paged and not). SERVING_TESTS / SERVING_K,
#              SERVING_SANITIZE_CASES (tool:kind words), SERVING_BENCHES ('|'-separated bench
#              arguments, optionally led by one VAR=value), SERVING_BENCH=0 / SERVING_SANITIZE=0
#   firstcall  issue 18: first calls per shape, cold, with intrinsics.compile_passes on and off
#              (first_call.txt); then FIRSTCALL_TESTS in shards (tests.txt, testlogs.txt)
#   gridconst  tensor maps passed by value (intrinsics.grid_constant): GC_TESTS in shards (the
#              TMA lanes, the Hopper GEMM and attention, graphs; tests.txt, testlogs.txt), what a
#              captured call records (graph_nodes.txt), the warm host path (host_overhead.txt)
#              and the graph-timed GEMM rows GC_BENCH (bench.txt)
#   hd96       issue 17's head_dim 96 (64B swizzle): its GPU tests in shards (tests.txt,
#              testlogs.txt) beside compute-sanitizer memcheck on attention_sm90_large
#              (sanitize.txt), then bench attention --shapes hd96 for the default and the
#              portable kernel, or HD96_CFGS (NUMBATC_ATTN_KERNEL values; bench.txt)
#   m192       issue 17's head_dim 64 on three consumers (m192_* configurations): their GPU tests
#              and the default's hd64 sweep in shards (tests.txt, testlogs.txt) beside memcheck /
#              racecheck / synccheck of attention_sm90_m192 (sanitize.txt); then bench attention
#              --shapes hd64 (M192_SHAPES) for the default and each of M192_CFGS (bench.txt).
#              M192_TESTS=0 / M192_BENCH=0 skip a part
#   stores     sm90_attention's 32-bit pair stores of O: the attention suites' cases that run
#              the default kernels and the pair / misaligned-out tests in shards (tests.txt,
#              testlogs.txt), scripts/diag/attn_store_ab.py (aligned against offset out, same
#              run, with SDPA; store_ab.txt), then bench attention quick (bench.txt)
#   stores80   the portable kernel's pair stores (branch sm80-pair-stores): the varlen, KV-cache
#              and attention suites on the default walk in shards (tests.txt,
#              testlogs.txt), then bench varlen quick and bench attention quick with the portable
#              kernel forced (bench.txt)
#   tmastore   sm90_attention's TMA stores of O (the persistent configuration's staging tile
#              included) and the 176-key tiles: the sm90 attention suite's default-kernel, store,
#              n176 and persistent cases in shards (tests.txt, testlogs.txt),
#              memcheck / racecheck of attention_sm90 and attention_sm90_large (sanitize.txt), then
#              bench attention quick and hd96 (bench.txt)
#   mask32     the column-limit mask (branch attn-mask32, both forward kernels): the sm90
#              attention suite's default-kernel cases, the attention, varlen and KV-cache suites
#              in shards (tests.txt, testlogs.txt), memcheck of attention_sm90 / attention_sm80
#              (sanitize.txt), then bench attention quick and hd64, and varlen quick (bench.txt)
#   varlen90   numbatc.attention_varlen on sm90_attention (TMA and cp.async): the varlen suite and
#              the sm90 suite's causal head-dim 192 / 256 cases (the column limit's fallback) in
#              shards (tests.txt, testlogs.txt), memcheck of the varlen kind (sanitize.txt), then
#              bench varlen quick: the default (sm90), the portable kernel forced, and the
#              portable kernel of .gpu/base (an older checkout's numbatc and intrinsics, if
#              there) in the same run (bench.txt)
#   kvwarm     warm calls of attention_with_kvcache (and of attention_varlen on the portable
#              kernel): the KV-cache, varlen and decode suites in shards (tests.txt, testlogs.txt)
#              beside memcheck of the kvcache kind (sanitize.txt), then scripts/diag/kv_host.py
#              and bench varlen quick with the portable kernel forced (bench.txt)
#   code90     sm90_gemm_tma written as code (make_kernel) against the generated kernel it
#              replaced (.gpu/base: git archive of the older commit's numbatc and intrinsics).
#              CODE90_PART=tests: the GEMM GPU suites in shards (tests.txt, testlogs.txt) beside
#              compute-sanitizer on the Hopper GEMM cases (sanitize.txt); CODE90_PART=bench:
#              both trees in the same run, gemm quick+llama8b (b col), fp8 quick, the user
#              epilogue's cost (bench.txt); CODE90_PART=attn: sm90 attention's softmax through
#              the whole-fragment intrinsics (intrinsics.fastmath.frag_*): the attention suites
#              in shards beside memcheck / racecheck of attention_sm90, then bench attention
#              quick of both trees (bench.txt)
#   hopper     the three Hopper paths the H200 had not run before 2026-12-05: sm90_gemm_tma as code
#              (the GEMM default), sm90 attention's softmax through the fragment intrinsics (the
#              attention default) and the opt-in Hopper backward -- their GPU suites in one set of
#              shards (tests.txt, testlogs.txt) beside compute-sanitizer on their cases
#              (sanitize.txt); HOPPER_PART=gemm (default) | attn splits them over two calls;
#              HOPPER_SANITIZE: tool:kind words
#   hopperbench  bench attention-backward quick --kernel all; gemm quick (b col) on .gpu/base
#              (the generated kernels) and this tree back to back; the ping-pong GEMM configs
#              (HOPPER_PP) forced on the same shapes; attention quick (bench.txt)
#   bwd90      the Hopper attention backward (sm90_attention_backward, opt-in): its GPU suite
#              and the portable backward's in shards (tests.txt, testlogs.txt) beside memcheck,
#              racecheck and synccheck of attention_backward_sm90 (sanitize.txt), then bench
#              attention-backward quick with --kernel all (bench.txt: sm80, sm90, sm90 with
#              deterministic=False; SDPA timed in each sweep)
#   sm80bench  the portable GEMM forced (issue 22): SM80_CFG (default 128x128x64_4w_3s) on
#              .gpu/$SM80_BASE (default base_gemm, an older checkout) and this tree, alternating,
#              SM80_ROUNDS rounds (default 2), gemm quick (b col); then every sm80 configuration
#              of this tree (--configs); then the decode shapes (b col, the dispatch's own
#              choice, whose M <= 64 runs sm80_gemm) with NUMBATC_SM80_CONFIG set to each of
#              SM80_SMALL (default: the small-M tiles and their prefetching twins) (bench80.txt)
#   sm80attn   the portable attention forced (issue 22): bench attention --shapes portable (head
#              dim 64 / 128 / 256) with NUMBATC_ATTN_KERNEL=sm80; its ratio column is against
#              SDPA's fastest backend, x flash against the flash backend alone (bench80attn.txt)
#   sm80stage  the fifteenth session's untimed portable GEMM configurations: the staging
#              intrinsics' GPU test and test_every_sm80_config in shards (tests.txt,
#              testlogs.txt), then 128x256x64_8w_3s_fp (the default), _fps (the staged
#              epilogue) and _fpr (the late refill) forced in turn, SM80_ROUNDS rounds (default
#              2, the order rotated each round), gemm quick, b col (bench80.txt)
#   host       issue 18's first call per configuration (cold, numbatc's disk cache, a cache that
#              precompile filled without a GPU) and the warm host path against torch.matmul
#   pending    what the fifteenth session committed after its last GPU call (136e58c..30e9ff1):
#              the staging intrinsics' test and every sm80 configuration (6 shards) beside the
#              Hopper and portable backward suites (the new sm90 default), the graph and torch
#              suites (the decode tiles, autograd on the new default; 10 shards) (tests.txt,
#              testlogs.txt), the attention backward's first calls, compiled together and
#              one after another (first_call.txt), then one round of sm80stage's three
#              configurations (bench80.txt); PENDING_ROUNDS (default 1)
#   survey     the twenty-first session's round (SURVEY_PART, default one = firstcall + ab):
#              firstcall: flash-decoding's cold first calls (first_call.txt, one under cProfile:
#              first_call_profile/) and the warm GEMM's host path against torch.matmul
#              (host_overhead.txt); ab: scripts/diag/attn_cfg_ab.py of the persistent, 176-key
#              and 3-stage configurations on short and causal shapes (ab.txt) and one Nsight
#              Compute report of head_dim 128's default (profile_attn128*); attn: bench attention
#              --shapes hd128 and large (attn_all.txt); table: the bf16 GEMM shape table
#   round23    the twenty-third session's round, a call per ROUND23_PART: tests, the
#              rescale_before_pv (_rb) configurations' GPU tests in shards (tests.txt,
#              testlogs.txt) beside compute-sanitizer memcheck / racecheck / synccheck of them
#              (sanitize.txt); ab, attn_cfg_ab.py of them against the defaults at head_dim 256,
#              192, 128 and 64 (ab.txt); l2, attn_cfg_ab.py of the persistent kernel's causal
#              order in L2 sections (_pt_l2) against _pt and the default (ab_l2.txt); profile,
#              Nsight Compute on the Hopper backward (profile_bwd128*)
# Usage on the device machine:  source .gpu/env.sh && bash scripts/gpu_verify.sh SECTION
source "$(dirname "$0")/gpu_common.sh"
what=${1:-api}
here=$(dirname "$0")

# shards_and_sanitizer NAME "TESTS" [tool:kind ...]: shards of GPU tests (SHARDS_K: a pytest
# -k expression; SHARDS, SHARDS_TIMEOUT) beside compute-sanitizer on the tool:kind cases, into
# tests.txt, testlogs.txt and sanitize.txt
shards_and_sanitizer() { local name=$1 tests=$2; shift 2
  $py scripts/pytest_shards.py --shards ${SHARDS:-12} --timeout ${SHARDS_TIMEOUT:-300} \
    --out /tmp/shards_$name $tests -- --tb=short ${SHARDS_K:+-k "$SHARDS_K"} \
    > /tmp/${name}_tests.txt 2>&1 &
  { for case in "$@"; do
      set -- ${case/:/ }
      echo "== $1 $2"
      t ${SANITIZE_LIMIT:-120} compute-sanitizer --tool $1 --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py $2 | grep -vE "^\s*$" | tail -8
    done; } > "$out/sanitize.txt" 2>&1 &
  wait
  { cat /tmp/${name}_tests.txt; echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/shards_$name/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
}

# staged_rounds N: the portable GEMM's default large tile and its two untimed twins (the staged
# epilogue, the late refill) forced in turn, N rounds, the order rotated each round
staged_rounds() {
  local cfgs=(128x256x64_8w_3s_fp 128x256x64_8w_3s_fps 128x256x64_8w_3s_fpr) r i cfg
  for ((r = 0; r < $1; r++)); do
    for ((i = 0; i < 3; i++)); do
      cfg=${cfgs[$(((i + r) % 3))]}
      echo "== round $((r + 1)), sm80:$cfg"
      NUMBATC_GEMM_KERNEL=sm80:$cfg t 60 $py -m numbatc.bench gemm --shapes quick \
        --b-layout col | grep -E "^ +[0-9]|rror| M +N"
    done
  done
}

if [[ $what == tma ]]; then
  t 130 $py scripts/tma_rules.py --jobs 14 --timeout 40 --budget 80 > "$out/tma_rules.log"
  t 100 $py scripts/pytest_shards.py --shards 4 --timeout 90 --out /tmp/tma_shards \
    tests/gpu/test_tma_gpu.py -- --tb=short > "$out/tma_tests.txt"
  for f in /tmp/tma_shards/shard*.log; do echo "===== $f"; cat "$f"; done > "$out/tma_tests_logs.txt"
fi

if [[ $what == gemm ]]; then bash "$here/gpu_gemm_tma.sh" all; fi
if [[ $what == attention ]]; then bash "$here/gpu_attention_tma.sh" all; fi

if [[ $what == api ]]; then
  : "${API_TESTS:=tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_fp8_gpu.py tests/gpu/test_gemm_interop_gpu.py tests/gpu/test_graphs_gpu.py tests/gpu/test_torch_gpu.py tests/gpu/test_transformers_gpu.py tests/gpu/test_softmax_gpu.py}"
  $py scripts/pytest_shards.py --shards ${API_SHARDS:-14} --timeout ${API_TIMEOUT:-250} ${API_SHARD_ARGS:-} \
    --out /tmp/shards_api $API_TESTS \
    -- --tb=short > /tmp/api_tests.txt 2>&1 &
  ( t 200 $py examples/ex07_transformers.py | tail -6 ) > /tmp/ex07.txt 2>&1 &
  wait
  { cat /tmp/api_tests.txt; echo "== ex07"; cat /tmp/ex07.txt; } > "$out/tests.txt"
  for f in /tmp/shards_api/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
  [[ ${API_SANITIZE:-1} == 0 ]] || { {
    # --report-api-errors no: the driver's cuGetProcAddress probes return errors by design
    for case in "memcheck gemm_sm90" "racecheck gemm_sm90" "synccheck gemm_sm90" \
                "memcheck gemm_fp8" "memcheck gemm_sm90_split" "memcheck gemm_sm90_persistent" \
                ${API_SANITIZE_MORE:-}; do  # more cases as tool:kind words
      set -- ${case/:/ }
      echo "== $1 $2 (the default: TMA producer)"
      t 60 compute-sanitizer --tool $1 --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py $2 | grep -vE "^\s*$" | tail -6
    done
  } > "$out/sanitize.txt"; }
  [[ ${API_BENCH:-1} == 0 ]] || {
    for layout in col row; do
      echo "== default (TMA producer), b $layout"
      t 60 $py -m numbatc.bench gemm --shapes quick+llama8b --b-layout $layout | grep -E "^ +[0-9]|rror| M +N"
      echo "== sm90:128x256x64_4s_pt (cp.async producer), b $layout"
      NUMBATC_GEMM_KERNEL=sm90:128x256x64_4s_pt t 60 $py -m numbatc.bench gemm --shapes quick+llama8b \
        --b-layout $layout | grep -E "^ +[0-9]|rror"
    done
    echo "== fp8 default"
    t 40 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
    echo "[bench done at $((SECONDS - start)) s]"
  } > "$out/bench.txt"
fi

if [[ $what == store ]]; then
  # issue 21's TMA store epilogue (the _ts configs): its GPU tests in shards while the sweep's
  # kernels compile into the disk cache, then scripts/sweep_gemm.py (one process: cuBLAS and
  # every candidate timed in the same run, each result checked) on the quick, Llama-3-8B and
  # hidden-1024 shapes at M = 4096, bf16 then FP8
  bf=${STORE_BF16:-default,128x256x64_4s_pt_tma_s1,128x256x64_3s_pt_tma_s1,128x256x64_3s_pt_tma_ts_s1,128x256x64_3s_w1_pt_tma_ts_s1,128x128x64_4s_w1_pt_tma_s1,128x128x64_4s_w1_pt_tma_ts_s1}
  f8=${STORE_FP8:-default,fp8_128x256x128_4s_pt_tma_s1,fp8_128x256x128_3s_pt_tma_s1,fp8_128x256x128_3s_pt_tma_ts_s1}
  $py scripts/pytest_shards.py --shards 4 --timeout 240 --out /tmp/shards_store \
    tests/gpu/test_sm90_gemm_gpu.py -- -k "tma_store" --tb=short > /tmp/store_tests.txt 2>&1 &
  ( t 200 $py scripts/sweep_gemm.py --shapes quick --m 4096 --reps 3 --only $bf > /dev/null
    t 100 $py scripts/sweep_gemm.py --shapes quick --m 4096 --reps 3 --dtype float8_e4m3 \
      --only $f8 > /dev/null ) > /tmp/store_warm.txt 2>&1 &
  wait
  { cat /tmp/store_tests.txt; for f in /tmp/shards_store/*.log; do echo "=== $f"; tail -30 "$f"; done
    cat /tmp/store_warm.txt; } > "$out/store_tests.txt"
  {
    for shapes in quick llama8b table-small; do
      t 150 $py scripts/sweep_gemm.py --shapes $shapes --m 4096,8192 --only $bf
    done
    t 100 $py scripts/sweep_gemm.py --shapes quick --m 4096,8192 --dtype float8_e4m3 --only $f8
  } > "$out/store_sweep.txt"
fi

if [[ $what == sweep ]]; then
  # scripts/sweep_gemm.py over SWEEP_SHAPES at SWEEP_M with the candidates SWEEP_ONLY, their
  # kernels compiled in parallel first (one process each)
  : "${SWEEP_SHAPES:=table}" "${SWEEP_M:=256,512,1024}" "${SWEEP_ONLY:=default}"
  for c in ${SWEEP_ONLY//,/ }; do
    t 150 $py scripts/sweep_gemm.py --shapes quick --m 4096 --reps 1 --only $c > /dev/null &
  done > /tmp/sweep_warm.txt 2>&1
  wait
  t ${SWEEP_LIMIT:-400} $py scripts/sweep_gemm.py --shapes $SWEEP_SHAPES --m $SWEEP_M \
    --only $SWEEP_ONLY > "$out/sweep.txt"
fi

if [[ $what == fp8block ]]; then
  # issue 21's FP8 blockwise scales (DeepGEMM's recipe): its GPU tests in shards, then the
  # DeepSeek-V3 shapes against the per-tensor torch._scaled_mm, and the new defaults' quick rows
  $py scripts/pytest_shards.py --shards 3 --timeout 200 --out /tmp/shards_bw \
    tests/gpu/test_sm90_gemm_gpu.py -- -k "blockwise" --tb=short > /tmp/bw_tests.txt 2>&1
  { cat /tmp/bw_tests.txt; for f in /tmp/shards_bw/*.log; do echo "=== $f"; tail -30 "$f"; done
  } > "$out/fp8block_tests.txt"
  {
    t 200 $py -m numbatc.bench gemm --dtype float8_e4m3 --fp8-scales block --shapes deepseek
    t 100 $py -m numbatc.bench gemm --dtype float8_e4m3 --shapes quick
    t 100 $py -m numbatc.bench gemm --shapes quick+llama8b --b-layout col
  } 2>&1 | grep -vE "^gemm \[" > "$out/fp8block_bench.txt"
fi

if [[ $what == table ]]; then
  # issue 16's shape table: M in {1 .. 4096} x the model layers, x @ W.T (b col), TABLE_DTYPE
  dt=${TABLE_DTYPE:-bfloat16}
  t ${TABLE_LIMIT:-400} $py -m numbatc.bench gemm --shapes ${TABLE_SHAPES:-table} --b-layout col \
    --dtype $dt --csv "$out/table_$dt.csv" --png "$out/table_$dt.png" > "$out/table_$dt.txt"
fi

if [[ $what == gridconst ]]; then
  : "${GC_TESTS:=tests/gpu/test_tma_gpu.py tests/gpu/test_sm90_gemm_gpu.py tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_graphs_gpu.py}"
  t ${GC_LIMIT:-420} $py scripts/pytest_shards.py --shards ${GC_SHARDS:-15} --timeout ${GC_TIMEOUT:-400} \
    --out /tmp/shards_gc $GC_TESTS -- --tb=short > "$out/tests.txt" 2>&1
  for f in /tmp/shards_gc/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  [[ ${GC_EXTRA:-1} == 0 ]] || {
    t 90 $py scripts/diag/graph_nodes.py 16x6144x4096 128x8192x8192 4096x1024x1024 > "$out/graph_nodes.txt"
    for shape in 64,2048,2048 16,4096,4096; do
      t 100 $py scripts/host_overhead.py --shape $shape --libs torch
    done > "$out/host_overhead.txt"
    t 200 $py -m numbatc.bench gemm --shapes ${GC_BENCH:-quick+llama8b} --b-layout col --timing graph \
      > "$out/bench.txt"
  }
fi

if [[ $what == hd96 ]]; then
  ( t ${HD96_SANITIZE_LIMIT:-280} compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
      $py scripts/sanitize_cases.py attention_sm90_large | grep -vE "^\s*$" | tail -10 ) \
    > "$out/sanitize.txt" 2>&1 &
  t ${HD96_LIMIT:-300} $py scripts/pytest_shards.py --shards ${HD96_SHARDS:-13} \
    --timeout ${HD96_TIMEOUT:-280} --out /tmp/shards_96 tests/gpu/test_sm90_attention_gpu.py \
    tests/gpu/test_attention_gpu.py -- --tb=short -k "${HD96_K:-96 and not timing}" \
    > "$out/tests.txt" 2>&1
  for f in /tmp/shards_96/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait
  echo "[tests and sanitizer done at $((SECONDS - start)) s]" >> "$out/tests.txt"
  [[ ${HD96_BENCH:-1} == 0 ]] || for cfg in ${HD96_CFGS:-"" sm80}; do
    echo "== ${cfg:-default}"
    NUMBATC_ATTN_KERNEL=$cfg t 90 $py -m numbatc.bench attention --shapes hd96 | grep -E "^ +[0-9]|rror|ratio"
  done > "$out/bench.txt" 2>&1
fi

if [[ $what == m192 ]]; then
  [[ ${M192_TESTS:-1} == 0 ]] || {
    ( for tool in memcheck racecheck synccheck; do
        echo "== $tool"
        t ${M192_SANITIZE_LIMIT:-150} compute-sanitizer --tool $tool --report-api-errors no \
          --error-exitcode 1 $py scripts/sanitize_cases.py attention_sm90_m192 \
          | grep -vE "^\s*$" | tail -10
      done ) > "$out/sanitize.txt" 2>&1 &
    t ${M192_LIMIT:-330} $py scripts/pytest_shards.py --shards ${M192_SHARDS:-12} \
      --timeout ${M192_TIMEOUT:-300} --out /tmp/shards_m192 tests/gpu/test_sm90_attention_gpu.py \
      -- --tb=short -k "${M192_K:-m192 or three or (sweep and n128_2s_ov_pp_fx_tma-64)}" \
      > "$out/tests.txt" 2>&1
    for f in /tmp/shards_m192/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
    wait
    echo "[tests and sanitizer done at $((SECONDS - start)) s]" >> "$out/tests.txt"
  }
  [[ ${M192_BENCH:-1} == 0 ]] || for cfg in ${M192_CFGS:-"" sm90:m192_n128_2s_ov_pp_fx_tma sm90:m192_n128_3s_ov_pp_fx_tma}; do
    echo "== ${cfg:-default}"
    NUMBATC_ATTN_KERNEL=$cfg t ${M192_BENCH_LIMIT:-150} $py -m numbatc.bench attention \
      --shapes ${M192_SHAPES:-hd64} | grep -E "^ +[0-9]|rror|ratio"
  done > "$out/bench.txt" 2>&1
fi

if [[ $what == stores ]]; then
  : "${STORES_K:=pair or small_cases or (sweep and n128_2s_ov_pp_fx_tma-) or misaligned or full-128 or causal-128 or full-64 or causal-64 or full-96 or causal-96}"
  t ${STORES_LIMIT:-220} $py scripts/pytest_shards.py --shards 15 --timeout ${STORES_TIMEOUT:-200} \
    --out /tmp/shards_st tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_attention_gpu.py \
    -- --tb=short -k "$STORES_K" > "$out/tests.txt" 2>&1
  for f in /tmp/shards_st/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  t 150 $py scripts/diag/attn_store_ab.py ${STORES_AB:-} > "$out/store_ab.txt"
  t 100 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror" > "$out/bench.txt"
fi

if [[ $what == stores80 ]]; then
  # (varlen and prefill over a KV cache run the portable kernel on the default walk, as do
  # test_attention_gpu's head dims outside sm90_attention's)
  t ${STORES80_LIMIT:-300} $py scripts/pytest_shards.py --shards 15 \
    --timeout ${STORES80_TIMEOUT:-280} --out /tmp/shards_s80 tests/gpu/test_attention_varlen_gpu.py \
    tests/gpu/test_attention_kvcache_gpu.py tests/gpu/test_attention_gpu.py -- --tb=short \
    > "$out/tests.txt" 2>&1
  for f in /tmp/shards_s80/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  {
    t 100 $py -m numbatc.bench varlen --shapes quick | grep -E "^ +[0-9]|rror"
    NUMBATC_ATTN_KERNEL=sm80 t 100 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror"
  } > "$out/bench.txt" 2>&1
fi

if [[ $what == tmastore ]]; then
  : "${TMASTORE_K:=tma_store or pair or n176 or tma_pt or small_cases or (sweep and n128_2s_ov_pp_fx_tma-) or (sweep and n112_2s_ov_pp_fx_tma) or misaligned or views or full-128 or causal-128 or full-96 or causal-96}"
  ( for tool in memcheck racecheck; do for kind in attention_sm90 attention_sm90_large; do
      echo "== $tool $kind"
      t 120 compute-sanitizer --tool $tool --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py $kind | grep -vE "^\s*$" | tail -6
    done; done ) > "$out/sanitize.txt" 2>&1 &
  t ${TMASTORE_LIMIT:-330} $py scripts/pytest_shards.py --shards 14 --timeout ${TMASTORE_TIMEOUT:-310} \
    --out /tmp/shards_ts tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_attention_gpu.py \
    -- --tb=short -k "$TMASTORE_K" > "$out/tests.txt" 2>&1
  for f in /tmp/shards_ts/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait
  for shapes in quick hd96; do
    t 100 $py -m numbatc.bench attention --shapes $shapes | grep -E "^ +[0-9]|rror"
  done > "$out/bench.txt" 2>&1
fi

if [[ $what == mask32 ]]; then
  : "${MASK32_K:=small_cases or n176 or tma_pt or misaligned or full-128 or causal-128 or full-64 or causal-64 or causal-96 or causal-256 or causal-192}"
  ( for kind in attention_sm90 attention_sm80; do
      echo "== memcheck $kind"
      t 120 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py $kind | grep -vE "^\s*$" | tail -6
    done ) > "$out/sanitize.txt" 2>&1 &
  t ${MASK32_LIMIT:-330} $py scripts/pytest_shards.py --shards 14 --timeout ${MASK32_TIMEOUT:-310} \
    --out /tmp/shards_m32 tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_attention_gpu.py \
    tests/gpu/test_attention_varlen_gpu.py tests/gpu/test_attention_kvcache_gpu.py \
    -- --tb=short -k "$MASK32_K or varlen or kvcache or cache" > "$out/tests.txt" 2>&1
  for f in /tmp/shards_m32/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait
  {
    for shapes in quick hd64; do
      t 100 $py -m numbatc.bench attention --shapes $shapes | grep -E "^ +[0-9]|rror"
    done
    t 100 $py -m numbatc.bench varlen --shapes quick | grep -E "^ +[0-9]|rror"
  } > "$out/bench.txt" 2>&1
fi

if [[ $what == varlen90 ]]; then
  ( echo "== memcheck varlen"
    t 200 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 5 \
      $py scripts/sanitize_cases.py varlen | grep -vE "^\s*$" | tail -14 ) > "$out/sanitize.txt" 2>&1 &
  t ${VARLEN90_LIMIT:-330} $py scripts/pytest_shards.py --shards 14 --timeout ${VARLEN90_TIMEOUT:-310} \
    --out /tmp/shards_v90 tests/gpu/test_attention_varlen_gpu.py tests/gpu/test_sm90_attention_gpu.py \
    -- --tb=short -k "varlen or sequences or lengths or cu_seqlens or walk or sm90_configurations or views or head_dims or (causal and (192 or 256)) or small_cases_first" \
    > "$out/tests.txt" 2>&1
  for f in /tmp/shards_v90/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait
  {
    echo "== default walk"
    t 100 $py -m numbatc.bench varlen --shapes quick | grep -E "^ +[0-9]|rror"
    echo "== sm80 forced"
    NUMBATC_ATTN_KERNEL=sm80 t 100 $py -m numbatc.bench varlen --shapes quick | grep -E "^ +[0-9]|rror"
    if [[ -d .gpu/base/numbatc ]]; then
      echo "== .gpu/base, sm80 forced"
      PYTHONPATH=$PWD/.gpu/base:$PYTHONPATH NUMBATC_ATTN_KERNEL=sm80 t 100 $py -m numbatc.bench varlen \
        --shapes quick | grep -E "^ +[0-9]|rror"
    fi
  } > "$out/bench.txt" 2>&1
fi

if [[ $what == kvwarm ]]; then
  ( echo "== memcheck kvcache"
    t 240 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 5 \
      $py scripts/sanitize_cases.py kvcache | grep -vE "^\s*$" | tail -14 ) > "$out/sanitize.txt" 2>&1 &
  t ${KVWARM_LIMIT:-400} $py scripts/pytest_shards.py --shards 15 --timeout ${KVWARM_TIMEOUT:-380} \
    --out /tmp/shards_kvw tests/gpu/test_attention_kvcache_gpu.py tests/gpu/test_attention_varlen_gpu.py \
    tests/gpu/test_decode_attention_gpu.py -- --tb=short -k "${KVWARM_K:-not timing}" > "$out/tests.txt" 2>&1
  for f in /tmp/shards_kvw/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait
  {
    t 150 $py scripts/diag/kv_host.py
    echo "== bench varlen quick, sm80 forced"
    NUMBATC_ATTN_KERNEL=sm80 t 100 $py -m numbatc.bench varlen --shapes quick | grep -E "^ +[0-9]|rror"
  } > "$out/bench.txt" 2>&1
fi

if [[ $what == host ]]; then
  shapes=${FIRST_CALL_SHAPES:-"128x8192x8192 4096x4096x4096 16x4096x14336 4096x1024x1024"}
  {
    echo "== cold: empty kernel cache, CUDA_CACHE_DISABLE=1"
    NUMBATC_CACHE_DIR=/tmp/fc-cold CUDA_CACHE_DISABLE=1 t 200 $py scripts/diag/first_call.py $shapes
    echo "== a fresh process on the disk cache the run above filled"
    NUMBATC_CACHE_DIR=/tmp/fc-cold CUDA_CACHE_DISABLE=1 t 60 $py scripts/diag/first_call.py $shapes
    echo "== precompile with no GPU visible (a CPU host's path), then a fresh process on it"
    CUDA_VISIBLE_DEVICES= NUMBATC_CACHE_DIR=/tmp/fc-pre t 200 $py -m numbatc precompile --quiet \
      --shapes "$(echo $shapes | tr ' ' ,)" --cc 9.0a
    NUMBATC_CACHE_DIR=/tmp/fc-pre CUDA_CACHE_DISABLE=1 t 60 $py scripts/diag/first_call.py $shapes
  } > "$out/first_call.txt"
  for shape in 64,2048,2048 16,4096,4096; do
    t 100 $py scripts/host_overhead.py --shape $shape --libs torch
  done > "$out/host_overhead.txt"
fi

if [[ $what == firstcall ]]; then
  # issue 18: each shape's first call in a fresh process on a cold cache (nothing else running,
  # so the compile times are the machine's), with intrinsics.compile_passes on and off; then the
  # GPU suites of the launch path (FIRSTCALL_TESTS) in shards
  shapes=${FIRST_CALL_SHAPES:-"4096x4096x4096 16x4096x4096 4096x1024x1024 attn:2x1024x1024x16x4x128c attn:1x1x8192x32x8x128 attn:1x2048x2048x8x8x256"}
  {
    for mode in on off; do
      echo "== cold, one process per shape, CUDA_CACHE_DISABLE=1, compile passes $mode"
      for s in $shapes; do
        if [[ $mode == off ]]; then export NUMBATC_NUMBA_SSA=1 NUMBATC_NUMBA_MEMO=1; fi
        NUMBATC_CACHE_DIR=/tmp/fc-$mode-$s CUDA_CACHE_DISABLE=1 t 120 $py scripts/diag/first_call.py $s
        unset NUMBATC_NUMBA_SSA NUMBATC_NUMBA_MEMO
      done
    done
    echo "== all shapes in one process (compile passes on): later configurations reuse device functions"
    NUMBATC_CACHE_DIR=/tmp/fc-one CUDA_CACHE_DISABLE=1 t 200 $py scripts/diag/first_call.py $shapes
  } > "$out/first_call.txt"
  [[ -z ${FIRSTCALL_TESTS-x} ]] || {
    $py scripts/pytest_shards.py --shards ${FIRSTCALL_SHARDS:-14} --timeout ${FIRSTCALL_TIMEOUT:-300} \
      --out /tmp/shards_fc ${FIRSTCALL_TESTS:-tests/gpu/test_launch_gpu.py tests/gpu/test_setmaxnreg_gpu.py tests/gpu/test_gemm_gpu.py tests/gpu/test_graphs_gpu.py tests/gpu/test_attention_kvcache_gpu.py} \
      -- --tb=short ${FIRSTCALL_K:+-k "$FIRSTCALL_K"} > "$out/tests.txt" 2>&1
    for f in /tmp/shards_fc/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  }
fi

if [[ $what == attntests ]]; then
  # issues 17 / 20: numbatc.attention's suites on the default walk (decode kernel, sm90 with
  # TMA_BY_DEFAULT's choice, sm80), CUDA graphs and torch ops of attention, the TMA default's
  # own sweep; the benchmarks' kernels compile into the round's cache meanwhile (attnbench)
  ( for cfg in "" sm90:n128_2s_ov_pp_fx; do
      NUMBATC_ATTN_KERNEL=$cfg t 250 $py -m numbatc.bench attention --shapes quick --reps 1 &
    done
    t 250 $py -m numbatc.bench decode --shapes quick --reps 1 & wait ) > /tmp/attn_warm.txt 2>&1 &
  $py scripts/pytest_shards.py --shards ${ATTN_SHARDS:-10} --timeout ${ATTN_TIMEOUT:-330} \
    --out /tmp/shards_attn tests/gpu/test_decode_attention_gpu.py tests/gpu/test_attention_gpu.py \
    tests/gpu/test_graphs_gpu.py tests/gpu/test_torch_gpu.py -- -k "attention or decode" \
    --tb=short > /tmp/attn_tests.txt 2>&1 &
  $py scripts/pytest_shards.py --shards 3 --timeout ${ATTN_TIMEOUT:-330} --out /tmp/shards_tma \
    tests/gpu/test_sm90_attention_gpu.py -- --tb=short \
    -k "${ATTN_TMA_K:-n128_2s_ov_pp_fx_tma and not _pt and not timing}" > /tmp/tma_tests.txt 2>&1 &
  wait
  { cat /tmp/attn_tests.txt; echo "== sm90 TMA default's own tests"; cat /tmp/tma_tests.txt
    echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/shards_attn/*.log /tmp/shards_tma/*.log; do echo "=== $f"; cat "$f"; done \
    > "$out/testlogs.txt"
  grep -E "rror|exit" /tmp/attn_warm.txt > "$out/warm.txt"
fi

if [[ $what == attnbench ]]; then
  # the warm host path and graph replay against back-to-back (scripts/diag/attn_host.py), then
  # bench attention quick for the default and the cp.async twin, and bench decode
  t 150 $py scripts/diag/attn_host.py > "$out/attn_host.txt"
  {
    for cfg in "" sm90:n128_2s_ov_pp_fx; do
      echo "== ${cfg:-default}"
      NUMBATC_ATTN_KERNEL=$cfg t 80 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror"
    done
    echo "== decode"
    t 120 $py -m numbatc.bench decode ${DECODE_ARGS:-}
    echo "[bench done at $((SECONDS - start)) s]"
  } > "$out/bench_attn.txt" 2>&1
fi

if [[ $what == serving ]]; then
  # three things at once: the suites in contiguous shards, compute-sanitizer on the new kernels'
  # cases, and the benchmarks' kernels compiling into the round's cache (SERVING_WARM, one
  # process each, --reps 1); then the benchmarks one at a time on a quiet GPU
  : "${SERVING_TESTS:=tests/gpu/test_attention_backward_gpu.py tests/gpu/test_attention_kvcache_gpu.py tests/gpu/test_attention_gpu.py tests/gpu/test_decode_attention_gpu.py tests/gpu/test_attention_varlen_gpu.py tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_torch_gpu.py}"
  : "${SERVING_BENCHES:=attention --shapes large|attention-backward --shapes quick|decode --shapes quick --paged 16|decode --shapes quick}"
  IFS='|' read -ra benches <<< "$SERVING_BENCHES"
  bench() {  # bench LIMIT ARGS...: python -m numbatc.bench ARGS, a leading VAR=value its env
    local limit=$1; shift
    [[ $1 == *=* ]] && { local e=$1; shift; t $limit env $e $py -m numbatc.bench "$@"; } \
      || t $limit $py -m numbatc.bench "$@"
  }
  for b in "${benches[@]}"; do
    [[ ${SERVING_BENCH:-1} == 0 ]] || bench ${SERVING_WARM_LIMIT:-250} $b --reps 1 > /dev/null &
  done
  $py scripts/pytest_shards.py --shards ${SERVING_SHARDS:-15} --timeout ${SERVING_TIMEOUT:-300} \
    --contiguous --out /tmp/shards_serving $SERVING_TESTS -- -k "${SERVING_K:-not timing}" \
    --tb=short -rs > /tmp/serving_tests.txt 2>&1 &
  [[ ${SERVING_SANITIZE:-1} == 0 ]] || {
    for case in ${SERVING_SANITIZE_CASES:-memcheck:attention_backward racecheck:attention_backward memcheck:kvcache racecheck:kvcache}; do
      set -- ${case/:/ }
      echo "== $1 $2"
      t 90 compute-sanitizer --tool $1 --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py $2 | grep -vE "^\s*$" | tail -8
    done > "$out/sanitize.txt"; } &
  wait
  { cat /tmp/serving_tests.txt; echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/shards_serving/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  [[ ${SERVING_BENCH:-1} == 0 ]] || {
    for b in "${benches[@]}"; do
      echo "== bench $b"
      bench ${SERVING_BENCH_LIMIT:-120} $b
    done
    echo "[bench done at $((SECONDS - start)) s]"
  } 2>&1 | grep -vE "\[#* *\] [0-9]+/[0-9]+ " > "$out/bench.txt"
fi

if [[ $what == sm80 ]]; then
  {
    NUMBATC_GEMM_KERNEL=sm80 t ${SM80_GEMM_LIMIT:-170} $py -m numbatc.bench gemm --shapes quick --configs
    NUMBATC_ATTN_KERNEL=sm80 t ${SM80_ATTN_LIMIT:-120} $py -m numbatc.bench attention --shapes quick
  } 2>&1 | grep -vE "^gemm \[" > "$out/sm80_bench.txt"
fi

if [[ $what == sanitize ]]; then
  {
    for tool in memcheck racecheck synccheck; do
      for kind in ${SANITIZE_KINDS:-gemm_sm90 gemm_sm90_split gemm_fp8 gemm_sm80 attention_sm80 attention_sm90 softmax}; do
        left=$((570 - (SECONDS - start)))
        if (( left < 20 )); then echo "skipped $tool $kind: no time left"; continue; fi
        echo "== $tool $kind"
        # NOTE: without --report-api-errors no, memcheck counts 34 host-API "errors" in every
        # case: cuGetProcAddress_v2 probes (CUDA_ERROR_INVALID_VALUE) while numba's driver binding
        # initialises (H200, 2026-12-03), none of them a kernel's access
        t $((left < 60 ? left : 60)) compute-sanitizer --tool $tool --report-api-errors no --print-limit 5 \
          $py scripts/sanitize_cases.py $kind | grep -vE "^\s*$" | tail -8
      done
    done
  } > "$out/sanitize.txt"
fi

if [[ $what == profile ]]; then
  tag=${PROFILE_TAG:-}  # a suffix for the two files, so that one call can profile several problems
  : "${PROFILE_CODE:=a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); numbatc.gemm(a, a)}"
  t ${PROFILE_LIMIT:-200} ncu --clock-control none -k regex:"${PROFILE_KERNELS:-gemm_kernel|attention_kernel}" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --import-source no -o /tmp/prof -f \
    $py -c "import torch, numbatc; $PROFILE_CODE; torch.cuda.synchronize()" | tail -5 > "$out/profile$tag.txt"
  t 60 ncu -i /tmp/prof.ncu-rep --print-details all | grep -vE "^\s*$" | head -250 >> "$out/profile$tag.txt"
  t 60 ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > "$out/profile_sass$tag.csv"
fi

if [[ $what == code90 ]]; then
  # each benchmark on both trees back to back, so that both see the same GPU state
  run() { local tree=$1 limit=$2; shift 2
    if [[ $tree == base ]]; then PYTHONPATH=$PWD/.gpu/base:$PYTHONPATH t $limit "$@"; else t $limit "$@"; fi; }
  part=${CODE90_PART:-tests}
  SHARDS=${CODE90_SHARDS:-12} SHARDS_TIMEOUT=${CODE90_TIMEOUT:-300}
  if [[ $part == attn ]]; then
    shards_and_sanitizer attn "tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_attention_gpu.py" \
      memcheck:attention_sm90 racecheck:attention_sm90
    { echo "(base: $(cat .gpu/base/COMMIT 2>/dev/null || echo '?'))"
      for tree in base new; do
        echo "== $tree: attention quick"
        run $tree 150 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror"
      done; } > "$out/bench.txt" 2>&1
  elif [[ $part == tests ]]; then
    : "${CODE90_TESTS:=tests/gpu/test_sm90_gemm_gpu.py tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_fp8_gpu.py tests/gpu/test_graphs_gpu.py}"
    shards_and_sanitizer code90 "$CODE90_TESTS" memcheck:gemm_sm90 racecheck:gemm_sm90 \
      synccheck:gemm_sm90 memcheck:gemm_sm90_ts racecheck:gemm_sm90_ts memcheck:gemm_fp8 \
      memcheck:gemm_sm90_split memcheck:gemm_sm90_persistent memcheck:gemm_fp8_block \
      ${CODE90_SANITIZE_MORE:-}
  else
    { echo "(base: $(cat .gpu/base/COMMIT 2>/dev/null || echo '?'))"
      for tree in base new; do
        echo "== $tree: gemm quick+llama8b, b col"
        run $tree 120 $py -m numbatc.bench gemm --shapes quick+llama8b --b-layout col | grep -E "^ +[0-9]|rror| M +N"
      done
      for tree in base new; do
        echo "== $tree: fp8 quick"
        run $tree 60 $py -m numbatc.bench gemm --shapes quick --dtype float8_e4m3 | grep -E "^ +[0-9]|rror"
      done
      for tree in base new; do
        echo "== $tree: epilogue"
        run $tree 90 $py -m numbatc.bench epilogue | tail -8
      done
      echo "[bench done at $((SECONDS - start)) s]"
    } > "$out/bench.txt" 2>&1
  fi
fi

if [[ $what == hopper ]]; then
  # HOPPER_PART=gemm (default) or attn: all eight suites did not fit one call (236 of ~520
  # tests in 380 s on 14 shards, 2026-12-05)
  if [[ ${HOPPER_PART:-gemm} == gemm ]]; then
    suites="tests/gpu/test_sm90_gemm_gpu.py tests/gpu/test_gemm_gpu.py tests/gpu/test_gemm_fp8_gpu.py tests/gpu/test_graphs_gpu.py"
    cases="memcheck:gemm_sm90 racecheck:gemm_sm90 synccheck:gemm_sm90 memcheck:gemm_sm90_split"
  else
    suites="tests/gpu/test_sm90_attention_backward_gpu.py tests/gpu/test_sm90_attention_gpu.py tests/gpu/test_attention_backward_gpu.py tests/gpu/test_attention_gpu.py"
    cases="memcheck:attention_backward_sm90 racecheck:attention_backward_sm90 synccheck:attention_backward_sm90 memcheck:attention_sm90 racecheck:attention_sm90"
  fi
  $py scripts/pytest_shards.py --shards ${HOPPER_SHARDS:-14} --timeout ${HOPPER_TIMEOUT:-400} \
    --out /tmp/shards_hopper ${HOPPER_SUITES:-$suites} -- --tb=short > /tmp/hopper_tests.txt 2>&1 &
  { for case in ${HOPPER_SANITIZE:-$cases}; do
      set -- ${case/:/ }
      echo "== $1 $2"
      t 90 compute-sanitizer --tool $1 --report-api-errors no --print-limit 8 \
        $py scripts/sanitize_cases.py $2 | grep -vE "^\s*$" | tail -${HOPPER_SANITIZE_LINES:-40}
    done; } > "$out/sanitize.txt" 2>&1 &
  wait
  { cat /tmp/hopper_tests.txt; echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/shards_hopper/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
fi

if [[ $what == hopperbench ]]; then
  { echo "(base: $(cat .gpu/base/COMMIT 2>/dev/null || echo '?'))"
    echo "== attention-backward quick, --kernel all"
    t 150 $py -m numbatc.bench attention-backward --shapes quick --kernel all
    for tree in base new; do
      echo "== $tree: gemm quick, b col"
      pre=; [[ $tree == base ]] && pre="env PYTHONPATH=$PWD/.gpu/base:${PYTHONPATH:-}"
      t 70 $pre $py -m numbatc.bench gemm --shapes quick --b-layout col | grep -E "^ +[0-9]|rror| M +N"
    done
    for cfg in ${HOPPER_PP:-128x128x64_5s_pp_tma 128x128x64_4s_w1_pp_tma_ts}; do
      echo "== new: gemm quick, b col, the ping-pong $cfg forced"
      NUMBATC_GEMM_KERNEL=sm90:$cfg t 70 $py -m numbatc.bench gemm --shapes quick --b-layout col \
        | grep -E "^ +[0-9]|rror| M +N"
    done
    echo "== new: attention quick"
    t 90 $py -m numbatc.bench attention --shapes quick | grep -E "^ +[0-9]|rror| B +S"
    echo "[bench done at $((SECONDS - start)) s]"; } > "$out/bench.txt" 2>&1
fi

if [[ $what == sm80bench ]]; then
  { NUMBATC_GEMM_KERNEL=sm80:${SM80_CFG:-128x128x64_4w_3s} t 300 bash "$here/bench_ab.sh" \
      ".gpu/${SM80_BASE:-base_gemm}" "${SM80_ROUNDS:-2}" gemm --shapes quick --b-layout col
    echo "== new: every sm80 configuration (--configs), gemm quick, b col"
    NUMBATC_GEMM_KERNEL=sm80 t ${SM80_CONFIGS_LIMIT:-200} $py -m numbatc.bench gemm --shapes quick \
      --b-layout col --configs | grep -E "^ +[0-9]|rror| M +N"
    for cfg in ${SM80_SMALL:-16x128x64_4w_6s 16x128x64_4w_6s_fp 64x128x64_4w_4s 64x128x64_4w_4s_fp}; do
      echo "== decode shapes, b col, NUMBATC_SM80_CONFIG=$cfg"
      NUMBATC_SM80_CONFIG=$cfg t 90 $py -m numbatc.bench gemm --shapes decode --b-layout col \
        | grep -E "^ +[0-9]|rror| M +N"
    done
    echo "[bench done at $((SECONDS - start)) s]"; } > "$out/bench80.txt" 2>&1
fi

if [[ $what == sm80attn ]]; then
  NUMBATC_ATTN_KERNEL=sm80 t ${SM80ATTN_LIMIT:-300} $py -m numbatc.bench attention \
    --shapes portable > "$out/bench80attn.txt" 2>&1
fi
if [[ $what == sm80stage ]]; then
  $py scripts/pytest_shards.py --shards 9 --timeout ${SM80STAGE_TIMEOUT:-200} --out /tmp/sh80s \
    tests/gpu/test_staging_gpu.py tests/gpu/test_gemm_gpu.py -- -k "staged or every_sm80" \
    --tb=short > "$out/tests.txt" 2>&1
  for f in /tmp/sh80s/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  staged_rounds ${SM80_ROUNDS:-2} > "$out/bench80.txt" 2>&1
fi
if [[ $what == bwd90 ]]; then
  $py scripts/pytest_shards.py --shards ${BWD90_SHARDS:-10} --timeout ${BWD90_TIMEOUT:-300} \
    --out /tmp/shards_bwd90 tests/gpu/test_sm90_attention_backward_gpu.py \
    tests/gpu/test_attention_backward_gpu.py -- --tb=short > /tmp/bwd90_tests.txt 2>&1 &
  { for tool in memcheck racecheck synccheck; do
      echo "== $tool attention_backward_sm90"
      t 150 compute-sanitizer --tool $tool --report-api-errors no --print-limit 5 \
        $py scripts/sanitize_cases.py attention_backward_sm90 | grep -vE "^\s*$" | tail -6
    done; } > "$out/sanitize.txt" 2>&1 &
  wait
  { cat /tmp/bwd90_tests.txt; echo "[tests done at $((SECONDS - start)) s]"; } > "$out/tests.txt"
  for f in /tmp/shards_bwd90/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  t ${BWD90_BENCH_LIMIT:-360} $py -m numbatc.bench attention-backward --shapes quick --kernel all \
    > "$out/bench.txt" 2>&1
fi
if [[ $what == pending ]]; then
  $py scripts/pytest_shards.py --shards 6 --timeout ${PENDING_TIMEOUT:-270} --out /tmp/shp80 \
    tests/gpu/test_staging_gpu.py tests/gpu/test_gemm_gpu.py -- -k "staged or every_sm80" \
    --tb=short > /tmp/pending80.txt 2>&1 &
  $py scripts/pytest_shards.py --shards 10 --timeout ${PENDING_TIMEOUT:-270} --out /tmp/shp90 \
    tests/gpu/test_sm90_attention_backward_gpu.py tests/gpu/test_attention_backward_gpu.py \
    tests/gpu/test_graphs_gpu.py tests/gpu/test_torch_gpu.py -- --tb=short > /tmp/pending90.txt 2>&1 &
  wait
  { cat /tmp/pending80.txt /tmp/pending90.txt; echo "[tests done at $((SECONDS - start)) s]"; } \
    > "$out/tests.txt"
  for f in /tmp/shp80/*.log /tmp/shp90/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  # issue 18: the backward's first calls, cold (fresh process and kernel cache, no driver
  # cache), the kernels compiled together (the default) and one after another with numba's
  # eager PTX (the old order), alternating
  { for spec in bwd:2x1024x1024x16x16x64c bwd:2x1024x1024x16x16x128c bwd:2x1024x1024x16x16x64cn; do
      for mode in together serial together; do
        s=; [[ $mode == serial ]] && s=1
        echo "== $mode, $spec"
        rm -rf /tmp/fc_cache
        NUMBATC_SERIAL_LINK=$s NUMBATC_EAGER_PTX=$s NUMBATC_CACHE_DIR=/tmp/fc_cache \
          CUDA_CACHE_DISABLE=1 t 60 $py scripts/diag/first_call.py $spec | grep -E 'shape|rror'
      done
    done; } > "$out/first_call.txt" 2>&1
  { staged_rounds ${PENDING_ROUNDS:-1}; echo "[bench done at $((SECONDS - start)) s]"; } \
    > "$out/bench80.txt" 2>&1
fi

if [[ $what == survey ]]; then
  part=${SURVEY_PART:-one}
  if [[ $part == attn ]]; then
    for shapes in hd128 large; do
      t 200 $py -m numbatc.bench attention --shapes $shapes
    done > "$out/attn_all.txt"
  fi
  if [[ $part == table ]]; then TABLE_LIMIT=400 bash "$0" table; fi
  if [[ $part == one || $part == firstcall ]]; then
    ( for i in 1 2; do
        NUMBATC_CACHE_DIR=/tmp/fc-decode-$i CUDA_CACHE_DISABLE=1 t 60 $py scripts/diag/first_call.py \
          attn:1x1x8192x32x8x128
      done
      echo "== profiled (cProfile: slower; first_call_profile/)"
      FIRST_CALL_PROFILE="$out/first_call_profile" NUMBATC_CACHE_DIR=/tmp/fc-decode-p \
        CUDA_CACHE_DISABLE=1 t 90 $py scripts/diag/first_call.py attn:1x1x8192x32x8x128
      echo "== compile_time.py decode:128 on this host"
      t 60 $py scripts/diag/compile_time.py decode:128 --repeat 2
    ) > "$out/first_call.txt" 2>&1
    for shape in 64,2048,2048 16,4096,4096 1,8192,8192; do
      t 40 $py scripts/host_overhead.py --shape $shape --libs torch
    done > "$out/host_overhead.txt"
  fi
  if [[ $part == one || $part == ab ]]; then
    ( echo "== hd64: the persistent configuration on short and causal shapes"
      t 110 $py scripts/diag/attn_cfg_ab.py --cfgs default,n128_2s_ov_pp_fx_tma,n128_2s_ov_pp_fx_tma_pt \
        16x1024x1024x32x32x64c 32x512x512x32x32x64c 8x2048x2048x32x32x64c 16x1024x1024x32x32x64 \
        64x256x256x32x32x64 2x1024x1024x16x16x64c
      echo "== hd128"
      t 130 $py scripts/diag/attn_cfg_ab.py --cfgs default,n176_2s_ov_pp_fx_tma,n128_3s_ov_pp_fx_tma,n128_2s_ov_pp_fx_tma_pt \
        16x1024x1024x16x16x128c 16x1024x1024x16x16x128 4x4096x4096x16x16x128c 4x4096x4096x16x16x128 \
        32x512x512x16x16x128c 1x16384x16384x16x16x128c
    ) > "$out/ab.txt" 2>&1
    PROFILE_TAG=_attn128 PROFILE_LIMIT=100 PROFILE_CODE="q = torch.randn(4, 4096, 16, 128, device='cuda', dtype=torch.bfloat16); numbatc.attention(q, q, q)" \
      bash "$0" profile
  fi
  echo "[survey $part done at $((SECONDS - start)) s]" >> "$out/first_call.txt"
fi

if [[ $what == round23 ]]; then
  # ROUND23_PART=tests: the rescale_before_pv configurations (and head_dim 192's overlap without
  # the ping-pong, and the persistent order in L2 sections): their GPU tests in shards beside compute-sanitizer on them (tests.txt,
  # testlogs.txt, sanitize.txt); ab: each against the defaults in one process, SDPA in the same
  # run, at head_dim 256, 192, 128 and 64 (ab.txt); l2: the persistent causal order in L2
  # sections (ab_l2.txt); profile: one Nsight Compute report of the
  # Hopper backward's main kernel (head_dim 128, deterministic=False; profile_bwd128*)
  part=${ROUND23_PART:-tests}
  if [[ $part == tests ]]; then
    SHARDS=8 SHARDS_TIMEOUT=250 SHARDS_K="rb_fx or n112_2s_ov_fx_tma or pt_l2 or l2_sections" SANITIZE_LIMIT=150 \
      shards_and_sanitizer rb tests/gpu/test_sm90_attention_gpu.py memcheck:attention_sm90_rb \
      racecheck:attention_sm90_rb synccheck:attention_sm90_rb
  elif [[ $part == ab ]]; then
    ( echo "== hd256"
      t 170 $py scripts/diag/attn_cfg_ab.py --cfgs default,n80_2s_ov_fx_tma,n80_2s_ov_rb_fx_tma,n80_2s_ov_pp_rb_fx_tma \
        16x1024x1024x8x8x256 16x1024x1024x8x8x256c 4x4096x4096x8x8x256 4x4096x4096x8x8x256c \
        1x16384x16384x8x8x256c
      echo "== hd192"
      t 170 $py scripts/diag/attn_cfg_ab.py --cfgs default,n112_2s_ov_fx_tma,n112_2s_ov_rb_fx_tma,n112_2s_ov_pp_rb_fx_tma \
        16x1024x1024x10x10x192 16x1024x1024x10x10x192c 4x4096x4096x10x10x192 4x4096x4096x10x10x192c \
        1x16384x16384x10x10x192c
      echo "== hd128 and hd64"
      t 150 $py scripts/diag/attn_cfg_ab.py --cfgs default,n128_2s_ov_pp_fx_tma,n128_2s_ov_pp_rb_fx_tma \
        16x1024x1024x16x16x128 16x1024x1024x16x16x128c 4x4096x4096x16x16x128c 32x512x512x16x16x128c \
        16x1024x1024x32x32x64c 64x256x256x32x32x64
    ) > "$out/ab.txt" 2>&1
  elif [[ $part == l2 ]]; then
    # the persistent kernel's causal order in L2 sections against the old order and the
    # default, where the old one lost 25 % (head_dim 128: 132 heads' K and V at once)
    t 200 $py scripts/diag/attn_cfg_ab.py --cfgs default,n128_2s_ov_pp_fx_tma_pt,n128_2s_ov_pp_fx_tma_pt_l2 \
      16x1024x1024x16x16x128c 32x512x512x16x16x128c 4x4096x4096x16x16x128c 1x16384x16384x16x16x128c \
      16x1024x1024x32x32x64c 8x2048x2048x32x32x64c 16x1024x1024x16x16x96c > "$out/ab_l2.txt" 2>&1
  else
    PROFILE_TAG=_bwd128 PROFILE_LIMIT=200 PROFILE_KERNELS=bwd_kernel PROFILE_CODE="q, k, v, do = (torch.randn(4, 4096, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(4)); o, lse = numbatc.attention(q, k, v, return_lse=True); numbatc.attention_backward(q, k, v, o, lse, do, deterministic=False)" \
      bash "$0" profile
  fi
fi
