#!/usr/bin/env bash
# The Hopper GEMM's TMA producer (numbatc/kernels/sm90_gemm_tma.py, issue 21) on the H200, in
# under 8 minutes.  Each block writes its own file under $OUT as it finishes:
#   sass.txt      per config (the cp.async default for comparison, then TMA ones): ptxas -v's
#                 registers and spills (whole program, as the driver builds it), SASS counts of
#                 UTMALDG / HGMMA / QGMMA / LDGSTS / LDL / STL / SYNCS / USETMAXREG
#   tests.txt     tests/gpu/test_sm90_gemm_gpu.py in parallel shards (cp.async and TMA configs);
#                 testlogs.txt the shards' logs (and the benchmark kernels' warm-up)
#   bench.txt     python -m numbatc.bench gemm, cp.async against TMA configs, one process each:
#                 bf16 quick+llama8b (4096^3, 8192^3, then Llama-3-8B qkv / o / gate_up / down
#                 at M = 4096; b row-major as in every bench gemm run), then fp8 e4m3 quick
# Usage on the device machine, from the repo root:
#   source .gpu/env.sh && bash scripts/gpu_gemm_tma.sh [sass|tests|bench|all]
source "$(dirname "$0")/gpu_common.sh"
what=${1:-all}
BF16_CONFIGS=${BF16_CONFIGS:-"128x256x64_4s_pt 128x256x64_4s_pt_tma 128x256x64_4s_w1_pt_tma 128x256x64_4s_tma"}
FP8_CONFIGS=${FP8_CONFIGS:-"fp8_128x256x128_4s_w1 fp8_128x256x128_4s_w1_tma fp8_128x256x128_4s_pt_tma"}
deadline=${DEADLINE:-440}  # seconds: no benchmark process starts after this

cat > /tmp/sass_counts.py <<'EOF'
import pathlib, re, shutil, subprocess, tempfile
from intrinsics.toolchain import compile_ptx
from numbatc.kernels import sm90_gemm as g

ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
dump = next(([x, *a] for x, a in ((shutil.which("cuobjdump"), ["-sass"]),
                                   (shutil.which("nvdisasm"), [])) if x), None)
bf16 = g.Sm90Variant("row", "row", "bfloat16", "bfloat16", None, None, None, out_pairs=True)
bf16_kk = g.Sm90Variant("row", "col", "bfloat16", "bfloat16", None, None, None, out_pairs=True)
fp8 = g.Sm90Fp8Variant("row", "col", "float8_e4m3fn", "bfloat16", None, None, None,
                       b_dtype="float8_e4m3fn", out_pairs=True)
cases = [("128x256x64_4s_pt", bf16), ("128x256x64_4s_pt_tma", bf16),
         ("128x256x64_4s_pt_tma", bf16_kk), ("128x256x64_4s_w1_pt_tma", bf16),
         ("fp8_128x256x128_4s_w1_tma", fp8)]
tmp = pathlib.Path(tempfile.mkdtemp())
for name, var in cases:
    cfg = g.CONFIGS.get(name) or g.FP8_CONFIGS[name]
    ptx = compile_ptx(g.kernel_for(cfg, var), g.kernel_signature(cfg, var), "sm_90a",
                      launch_bounds=(cfg.threads, 1))
    for _ in range(2):  # an older ptxas gets the PTX with its own .version (tests do the same)
        (tmp / "k.ptx").write_text(ptx)
        run = subprocess.run([ptxas, "-v", "-arch=sm_90a", str(tmp / "k.ptx"), "-o",
                              str(tmp / "k.cubin")], capture_output=True, text=True)
        log = run.stdout + run.stderr
        newest = re.search(r"Unsupported \.version \S+; current version is '([\d.]+)'", log)
        if run.returncode == 0 or newest is None:
            break
        ptx = re.sub(r"^\.version \S+", f".version {newest.group(1)}", ptx, flags=re.M)
    notes = re.findall(r"Used \d+ registers[^\n]*|\d+ bytes spill stores, \d+ bytes spill loads"
                       r"|C75\d\d[^\n]*", log)
    sass = "" if dump is None else subprocess.run([*dump, str(tmp / "k.cubin")],
                                                  capture_output=True, text=True).stdout
    counts = {op: len(re.findall(rf"\b{op}\b", sass)) for op in
              ("UTMALDG", "HGMMA", "QGMMA", "LDGSTS", "LDL", "STL", "SYNCS", "USETMAXREG")}
    print(f"{name} a={var.a_layout} b={var.b_layout} {var.in_dtype}: {counts}; "
          f"{'; '.join(notes) or log[-300:]}", flush=True)
EOF

if [[ $what == sass || $what == all ]]; then
  ( t 150 $py /tmp/sass_counts.py > "$out/sass.txt" 2>&1 ) &
  sass_pid=$!
fi

if [[ $what == tests || $what == all ]]; then
  # Meanwhile compile the benchmarks' kernels into the disk cache (bench gemm's variants: a, b
  # row-major -- b = w.T for fp8 --, bf16 out with pair stores), so the timed processes load them.
  (
    for cfg in $BF16_CONFIGS; do
      NUMBATC_GEMM_KERNEL=sm90:$cfg $py -c "import torch, numbatc
a = torch.randn(256, 256, device='cuda', dtype=torch.bfloat16)
numbatc.gemm(a, a, out=torch.empty_like(a)); torch.cuda.synchronize()" &
    done
    for cfg in $FP8_CONFIGS; do
      NUMBATC_GEMM_KERNEL=sm90:$cfg $py -c "import torch, numbatc
a = torch.randn(256, 256, device='cuda').to(torch.float8_e4m3fn)
out = torch.empty(256, 256, device='cuda', dtype=torch.bfloat16)
numbatc.gemm(a, a.T, out=out, scale_a=1.0, scale_b=1.0); torch.cuda.synchronize()" &
    done
    wait
  ) > /tmp/warm.txt 2>&1 &
  warm_pid=$!
  t 245 $py scripts/pytest_shards.py --shards 14 --timeout 230 --out /tmp/shards_tma \
    tests/gpu/test_sm90_gemm_gpu.py -- --tb=short > "$out/tests.txt"
  for f in /tmp/shards_tma/*.log; do echo "=== $f"; cat "$f"; done > "$out/testlogs.txt"
  wait "$warm_pid"
  { echo "=== benchmark kernels' warm-up"; cat /tmp/warm.txt; } >> "$out/testlogs.txt"
  echo "[tests done at $((SECONDS - start)) s]" >> "$out/tests.txt"
fi
if [[ -n ${sass_pid:-} ]]; then wait "$sass_pid"; fi

bench() {  # bench CONFIG ARGS...: one bench process, unless the deadline has passed
  local cfg=$1; shift
  if (( SECONDS - start > deadline )); then echo "skipped sm90:$cfg $*: past ${deadline} s"; return; fi
  echo "== sm90:$cfg $*"
  NUMBATC_GEMM_KERNEL=sm90:$cfg t 60 $py -m numbatc.bench gemm "$@" | grep -E "^ +[0-9]|rror| M +N|exit"
}

if [[ $what == bench || $what == all ]]; then
  {
    for cfg in $BF16_CONFIGS; do bench "$cfg" --shapes quick+llama8b; done
    for cfg in $FP8_CONFIGS; do bench "$cfg" --shapes quick --dtype float8_e4m3; done
    echo "[bench done at $((SECONDS - start)) s]"
  } > "$out/bench.txt"
fi
