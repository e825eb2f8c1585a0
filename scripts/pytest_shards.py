"""Run GPU test files as N parallel pytest processes (the device machine has 16 cores; most of a
GPU test's time is Numba compiling its kernels, so shards finish in a fraction of one process's
time). The GPU is shared by the shards: only for correctness tests, never for timings.

    python3 scripts/pytest_shards.py --shards 8 --timeout 300 --out $OUT/tests tests/gpu/a.py ...

Each shard writes shard<i>.log; the summary (passed/failed/errors per shard, the failing node ids)
goes to stdout. Extra pytest arguments after `--`.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def collect(files, extra):
    # (a -v among the extras would cancel -q and print the tree instead of node ids; the shards
    # run -v anyway)
    extra = [e for e in extra if e not in ("-v", "--verbose")]
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu",
           "-p", "no:cacheprovider", *extra, *files]
    text = subprocess.run(cmd, capture_output=True, text=True).stdout
    return [line.strip() for line in text.splitlines() if "::" in line and not line.startswith(" ")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="out/tests")
    parser.add_argument("--contiguous", action="store_true",
                        help="shard in contiguous runs of the collected order (one parametrised "
                             "test's cases, which share kernels, compile in one shard) instead "
                             "of round-robin")
    parser.add_argument("files", nargs="+")
    # everything after "--" is pytest's (argparse would take it as more files)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_known_args(argv[:cut])
    extra += argv[cut + 1:]
    os.makedirs(args.out, exist_ok=True)
    ids = collect(args.files, extra)
    print(f"{len(ids)} tests in {args.shards} shards", flush=True)
    # Round-robin by file keeps each file's tests spread (one file's kernels compile in parallel),
    # but cases that share a kernel then compile it in several shards at once (the disk cache is
    # filled by whichever finishes first): --contiguous keeps them together.
    if args.contiguous:
        size = -(-len(ids) // args.shards)
        shards = [ids[i * size:(i + 1) * size] for i in range(args.shards)]
    else:
        shards = [ids[i::args.shards] for i in range(args.shards)]
    procs = []
    start = time.time()
    for i, chunk in enumerate(shards):
        if not chunk:
            continue
        log = open(os.path.join(args.out, f"shard{i}.log"), "w")
        # -v and unbuffered: a shard killed at the limit still shows which of its tests ran
        cmd = [sys.executable, "-u", "-W", "ignore", "-m", "pytest", "-v", "-m", "gpu", "-rfE",
               "-p", "no:cacheprovider", *extra, *chunk]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        procs.append((i, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    for i, proc, log in procs:
        left = max(1.0, args.timeout - (time.time() - start))
        try:
            proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"shard {i}: KILLED at the {args.timeout:.0f} s limit", flush=True)
        log.close()
    totals = {}
    for i, _, _ in procs:
        text = open(os.path.join(args.out, f"shard{i}.log")).read()
        tail = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", line)]
        if tail:
            for count, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail[-1]):
                totals[what] = totals.get(what, 0) + int(count)
        else:  # killed: count the -v result lines it wrote
            ran = re.findall(r"::\S+ (PASSED|FAILED|ERROR|SKIPPED)", text)
            for what in ran:
                key = what.lower() if what != "ERROR" else "errors"
                totals["killed shards: " + key] = totals.get("killed shards: " + key, 0) + 1
            tail = [f"killed after {len(ran)} of {len(shards[i])} tests: "
                    + ", ".join(f"{ran.count(w)} {w.lower()}" for w in sorted(set(ran)))]
        for line in text.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print(f"shard {i}: {line[:300]}")
        print(f"shard {i}: {tail[-1].strip() if tail else 'no summary (killed or crashed)'}")
    print(f"total after {time.time() - start:.0f} s: {totals}", flush=True)


if __name__ == "__main__":
    main()
