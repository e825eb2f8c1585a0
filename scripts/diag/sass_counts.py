"""SASS instruction counts of Hopper kernels, for comparing two builds of one kernel (issue 19's
rule: a kernel moved from generated text to code keeps its instructions).

    PYTHONPATH=. python3 scripts/diag/sass_counts.py --out before.json [CASE ...]
    PYTHONPATH=. python3 scripts/diag/sass_counts.py --compare before.json after.json

A CASE is ``config:head_dim:flags`` for sm90_attention, flags from c (causal), l (lse), h
(float16; else bfloat16), v (varlen), t (TMA store of O), p (pair stores); or
``gemm:config[:flags]`` for sm90_gemm (bf16, row x col, bf16 out, out pairs), flags from c
(a bf16 c), b (a bf16 bias), g (GELU), s (split-K), a / n (A col-major, B row-major), f (FP8:
e4m3 a and b, an FP8_CONFIGS name).  Without
CASEs a default list of the attention TMA configurations.  Each kernel is compiled for sm_90a
as numbatc launches it, assembled whole-program with ptxas -v (as the driver JITs a setmaxnreg
kernel) and disassembled with nvdisasm; the record holds the opcode histogram (the mnemonic
with its modifiers), the registers and the spill bytes.  --compare prints, per case, the opcodes
whose counts differ and the register / spill change.  To compare with another tree, run it with
PYTHONPATH naming that tree (a git worktree).
"""

import argparse
import collections
import json
import pathlib
import re
import sys
import tempfile

DEFAULT_CASES = [
    "n128_2s_ov_pp_fx_tma:128:cl", "n128_2s_ov_pp_fx_tma:128:h", "n128_2s_ov_pp_fx_tma:64:cl",
    "n128_2s_ov_pp_fx_tma:96:cl", "n128_2s_ov_pp_fx_tma:128:clt", "n128_2s_ov_pp_fx_tma:64:ht",
    "n128_2s_ov_pp_fx_tma:128:clv", "n128_2s_ov_pp_fx_tma:128:lp",
    "n128_2s_fx_tma:128:cl", "n128_2s_fx_tma:64:h", "n128_2s_ov_fx_tma:128:cl",
    "n128_3s_ov_pp_fx_tma:128:cl", "n128_2s_ov_pp_fx_tma_pt:128:cl",
    "n128_2s_ov_pp_fx_tma_pt:64:hlt", "n176_2s_ov_pp_fx_tma:128:l", "n176_2s_ov_pp_fx_tma:64:c",
    "n112_2s_ov_pp_fx_tma:192:cl", "n112_2s_ov_pp_fx_tma:192:hv", "n80_2s_ov_pp_fx_tma:256:cl",
    "n80_2s_ov_fx_tma:256:h", "n64_2s_ov_pp_fx_tma:256:cl",
]


def _kernel(case):
    """(kernel, argument types, threads) of a CASE (see the module docstring)."""
    if case.startswith("gemm:"):
        from numbatc.kernels import sm90_gemm

        _, name, *rest = case.split(":")
        flags = rest[0] if rest else ""
        fp8 = "f" in flags
        cfg = (sm90_gemm.FP8_CONFIGS if fp8 else sm90_gemm.CONFIGS)[name]
        bf16 = "bfloat16"
        make = sm90_gemm.Sm90Fp8Variant if fp8 else sm90_gemm.Sm90Variant
        var = make("col" if "a" in flags else "row", "row" if "n" in flags else "col",
                   "float8_e4m3fn" if fp8 else bf16, bf16, bf16 if "c" in flags else None,
                   bf16 if "b" in flags else None, "gelu" if "g" in flags else None,
                   split_k="s" in flags, out_pairs=True)
        return (sm90_gemm.kernel_for(cfg, var), sm90_gemm.kernel_signature(cfg, var),
                cfg.threads)
    from numbatc.kernels import sm90_attention as attn

    name, d, flags = case.split(":")
    cfg = attn.CONFIGS[name]
    var = attn.AttnVariant(int(d), "float16" if "h" in flags else "bfloat16", "c" in flags,
                           "l" in flags, varlen="v" in flags, pair_stores="p" in flags,
                           tma_store="t" in flags)
    return attn.kernel_for(cfg, var), attn.signature(var, cfg), cfg.threads


def build(case):
    from intrinsics.toolchain import compile_ptx
    from tests.helpers.assemblers import disassemble, whole_program_ptxas

    kernel, sig, threads = _kernel(case)
    ptx = compile_ptx(kernel, sig, "sm_90a", launch_bounds=(threads, 1))
    with tempfile.TemporaryDirectory() as tmp:
        log = whole_program_ptxas(ptx, pathlib.Path(tmp))
        sass = disassemble(pathlib.Path(tmp, "kernel.cubin"))
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1)] += 1
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    return {"ops": dict(ops), "regs": regs, "spill": sum(spills), "total": sum(ops.values())}


def compare(before, after):
    a, b = json.loads(pathlib.Path(before).read_text()), json.loads(pathlib.Path(after).read_text())
    for case in a:
        if case not in b:
            print(f"{case}: only in {before}")
            continue
        x, y = a[case], b[case]
        diff = {op: (x["ops"].get(op, 0), y["ops"].get(op, 0))
                for op in sorted(set(x["ops"]) | set(y["ops"]))
                if x["ops"].get(op, 0) != y["ops"].get(op, 0)}
        print(f"{case}: {x['total']} -> {y['total']} instructions, registers {x['regs']} -> "
              f"{y['regs']}, spill {x['spill']} -> {y['spill']}")
        for op, (n0, n1) in diff.items():
            print(f"    {op}: {n0} -> {n1}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="config:head_dim:flags (see the docstring)")
    parser.add_argument("--out", help="write the records as JSON here")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two files --out wrote")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    records = {}
    for case in args.cases or DEFAULT_CASES:
        records[case] = build(case)
        r = records[case]
        print(f"{case}: {r['total']} instructions, {r['regs']} registers, spill {r['spill']}",
              file=sys.stderr, flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(records, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
