"""A few small shapes of each numbatc kernel, checked against torch, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python3 scripts/sanitize_cases.py gemm_sm90
    compute-sanitizer --tool racecheck python3 scripts/sanitize_cases.py attention_sm80 ...

Kinds: gemm_sm80, gemm_sm90, gemm_sm90_split (split-K forced), gemm_sm90_persistent, gemm_sm90_ts
(the TMA store epilogue), gemm_fp8, gemm_fp8_block (blockwise scales), attention_sm80, attention_sm90,
attention_sm90_large (head_dim 96 / 192 / 256 on the Hopper kernel), attention_sm90_m192 (the
three-consumer configurations forced), attention_sm90_rb (O's rescale under the next Q K^T,
forced),
attention_warm (the default kernel's warm call: the pointer relaunch, new pointers each call),
decode (flash-decoding's split kernel and combine, splits forced), kvcache
(numbatc.attention_with_kvcache: paged and contiguous, decode and prefill, then garbage lengths
and block tables with the host checks off: memcheck must find no access outside the arrays),
attention_backward (dQ, dK, dV of the three backward kernels against torch autograd), varlen
(numbatc.attention_varlen on sm90_attention's TMA and cp.async forms and the portable kernel, then
garbage prefix sums with the host checks off), softmax,
gemm_softmax.
Each case prints one line with its max error; a wrong result exits 1 (the sanitizer's own report
decides the rest). Small shapes keep the sanitizer's slowdown (10-100x) within seconds, and
ragged ones exercise the edge paths.
"""

import itertools
import os
import sys

import torch

import numbatc
from numbatc.kernels import sm90_attention

GEMM = [(128, 256, 64), (200, 264, 136), (77, 1000, 520), (3, 300, 1500)]  # last: split-K
ATTN = [(1, 113, 2, 1, 64, False), (1, 200, 2, 2, 128, True)]
#: the Hopper kernel's large head dims (its 128 x 112 and 128 x 80 tiles, two stages) and
#: head_dim 96 (the 64B swizzle)
# head_dim 64 on three consumers (192-row blocks): causal diagonal, seqlen_q > seqlen_k, ragged
ATTN_M192 = [(1, 250, 2, 1, 64, True, 300), (2, 200, 3, 1, 64, False), (1, 400, 1, 1, 64, True, 150)]
ATTN_LARGE = [(1, 113, 2, 1, 192, True, 203), (2, 200, 2, 2, 256, True), (1, 239, 2, 1, 256, False, 1),
              (1, 113, 2, 1, 96, True, 203), (2, 300, 3, 1, 96, False)]


def check(name, got, ref, tol):
    err = (got.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1e-30)
    print(f"{name}: max rel err {err:.2e}", flush=True)
    if not err <= tol:
        print(f"{name}: WRONG (tolerance {tol})", flush=True)
        sys.exit(1)


def gemm(kernel):
    os.environ["NUMBATC_GEMM_KERNEL"] = kernel
    for m, n, k in GEMM:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.float32)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        numbatc.gemm(a, b, bias=bias, activation="relu", out=out)
        check(f"gemm {kernel} {m}x{n}x{k}", out, torch.relu(a.float() @ b.float() + bias), 2e-2)


def gemm_fp8():
    for m, n, k in GEMM:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).T
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        numbatc.gemm(a, b, scale_a=0.5, scale_b=2.0, out=out)
        check(f"gemm fp8 {m}x{n}x{k}", out, a.float() @ b.float(), 2e-2)


def attention(kernel, cases=ATTN, repeat=1):
    if kernel is not None:
        os.environ["NUMBATC_ATTN_KERNEL"] = kernel
    for b, sq, hq, hkv, d, causal, *sk in cases:
        if kernel == "sm90" and d not in sm90_attention.HEAD_DIMS:
            continue
        for _ in range(repeat):  # fresh tensors each time: a warm call on new pointers
            attention_case(kernel, b, sq, sk[0] if sk else sq, hq, hkv, d, causal)


def attention_case(kernel, b, sq, s, hq, hkv, d, causal):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    numbatc.attention(q, k, v, causal=causal, out=out)
    rep = hq // hkv
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k.repeat_interleave(rep, 2),
                                                       v.repeat_interleave(rep, 2)))
    # the reference by hand: torch's SDPA kernels would be sanitized too (its memory-efficient
    # kernel reports shared-memory hazards under racecheck)
    scores = (qt @ kt.transpose(-1, -2)) / d**0.5
    if causal:  # bottom-right aligned
        mask = torch.ones(sq, s, device="cuda").triu(s - sq + 1).bool()
        scores = scores.masked_fill(mask, float("-inf"))
    # a query that sees no key (causal, seqlen_q > seqlen_k) gets 0, as flash-attn's: its softmax
    # row is all NaN here
    ref = torch.softmax(scores, -1).nan_to_num(0.0) @ vt
    check(f"attention {kernel or 'default'} sq={sq} sk={s} d={d} causal={causal}", out,
          ref.transpose(1, 2), 2e-2)


def decode():
    # seqlen_k >= 1024 takes the flash-decoding kernel; forced splits exercise the combine
    for splits in ("3", "8"):
        os.environ["NUMBATC_DECODE_SPLITS"] = splits
        attention(None, [(2, 1, 8, 2, 128, False, 3001), (1, 4, 8, 2, 64, True, 1500)])
    os.environ.pop("NUMBATC_DECODE_SPLITS")


def attention_backward(cases=((1, 113, 203, 4, 2, 64, True), (2, 77, 40, 2, 1, 128, True),
                              (1, 65, 65, 2, 2, 256, False))):
    # the three backward kernels (D, dK/dV, dQ) against torch autograd of a float32 reference;
    # ragged tiles, GQA, causal both ways, and head_dim 256 (dK and dV as two launches)
    for b, sq, sk, hq, hkv, d, causal in cases:
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        out, lse = numbatc.attention(q, k, v, causal=causal, return_lse=True)
        dq, dk, dv = numbatc.attention_backward(q, k, v, out, lse, do, causal=causal)
        qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
        rep = hq // hkv
        qt, kt, vt = (x.transpose(1, 2) for x in (qf, kf.repeat_interleave(rep, 2),
                                                   vf.repeat_interleave(rep, 2)))
        scores = (qt @ kt.transpose(-1, -2)) / d**0.5
        if causal:  # bottom-right aligned
            mask = torch.ones(sq, sk, device="cuda").triu(sk - sq + 1).bool()
            scores = scores.masked_fill(mask, float("-inf"))
        ref = torch.nan_to_num(torch.softmax(scores, -1)) @ vt
        ref.transpose(1, 2).backward(do.float())
        for name, got, want in (("dq", dq, qf.grad), ("dk", dk, kf.grad), ("dv", dv, vf.grad)):
            check(f"attention_backward {name} {b}x{sq}x{sk} h{hq}/{hkv} d={d} causal={causal}",
                  got, want, 3e-2)


def attention_backward_sm90():
    # the Hopper backward (sm90_attention_backward, forced): ragged both ways, GQA, 3 key
    # blocks whose dQ adds take turns, seqlen_q > seqlen_k
    os.environ["NUMBATC_ATTN_BWD_KERNEL"] = "sm90"
    attention_backward(((1, 113, 300, 4, 2, 64, True), (2, 77, 40, 2, 1, 128, True),
                        (1, 200, 260, 2, 2, 128, False)))
    os.environ.pop("NUMBATC_ATTN_BWD_KERNEL")


def kvcache():
    from numbatc import attention_api

    os.environ["NUMBATC_DECODE_SPLITS"] = "3"
    for sq, lens, page_size, causal in ((1, [1, 300, 77], 16, False), (4, [0, 130, 33], 64, True),
                                        (1, [5, 200, 1], None, True), (20, [20, 150, 3], 16, True)):
        kvcache_case(sq, lens, page_size, causal)
    os.environ.pop("NUMBATC_DECODE_SPLITS")
    checks = attention_api._check_cache
    attention_api._check_cache = lambda *a: None  # garbage the kernels must clamp
    for sq in (1, 20):
        q = torch.randn(3, sq, 8, 64, device="cuda", dtype=torch.bfloat16)
        kp = torch.randn(4, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
        table = torch.tensor([[3, 10**9, -7], [-1, 0, 2**31 - 1], [1, 1, 1]], device="cuda",
                             dtype=torch.int32)
        seqlens = torch.tensor([10**9, -5, 40], device="cuda", dtype=torch.int32)
        numbatc.attention_with_kvcache(q, kp, kp, seqlens, block_table=table, causal=True)
        torch.cuda.synchronize()
        print(f"kvcache garbage lengths and block table sq={sq}: ran", flush=True)
    attention_api._check_cache = checks


def kvcache_case(sq, lens, page_size, causal, hq=8, hkv=2, d=64):
    b = len(lens)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    if page_size is None:
        kc, vc = (torch.randn(b, max(lens) + 5, hkv, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2))
        table, keys = None, [(kc[i, :n], vc[i, :n]) for i, n in enumerate(lens)]
    else:
        blocks = max(-(-n // page_size) for n in lens) + 1
        kc, vc = (torch.randn(b * blocks, page_size, hkv, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2))
        table = torch.randperm(b * blocks, device="cuda").to(torch.int32).view(b, blocks)
        keys = [tuple(x[table[i].long()].reshape(-1, hkv, d)[:n] for x in (kc, vc))
                for i, n in enumerate(lens)]
    seqlens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    numbatc.attention_with_kvcache(q, kc, vc, seqlens, block_table=table, causal=causal, out=out)
    ref = torch.zeros(b, sq, hq, d, device="cuda")
    for i, (k, v) in enumerate(keys):
        n = lens[i]
        kt, vt = (x.repeat_interleave(hq // hkv, 1).transpose(0, 1).float() for x in (k, v))
        scores = (q[i].transpose(0, 1).float() @ kt.transpose(-1, -2)) / d**0.5
        if causal:  # bottom-right aligned
            mask = torch.ones(sq, n, device="cuda").triu(n - sq + 1).bool()
            scores = scores.masked_fill(mask, float("-inf"))
        p = torch.softmax(scores, -1).nan_to_num(0.0)  # rows that see no key: 0
        ref[i] = (p @ vt).transpose(0, 1)
    check(f"kvcache sq={sq} lens={lens} page_size={page_size} causal={causal}", out, ref, 2e-2)


def varlen():
    """numbatc.attention_varlen on sm90_attention's TMA default, its cp.async twin and the
    portable kernel (per-sequence reference); then garbage prefix sums with the host checks off,
    which every kernel must clamp (memcheck: nothing outside the arrays)."""
    from numbatc import attention_api

    lens_q, lens_k = [113, 1, 0, 40], [203, 239, 5, 0]
    for kernel, d, causal in (("sm90:n128_2s_ov_pp_fx_tma", 64, True), ("sm90:n128_2s_ov_pp_fx", 128, False),
                              ("sm90:n80_2s_ov_pp_fx_tma", 256, True), ("sm80", 64, True)):
        os.environ["NUMBATC_ATTN_KERNEL"] = kernel
        q = torch.randn(sum(lens_q), 4, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(sum(lens_k), 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cq, ck = (torch.tensor([0] + list(itertools.accumulate(x)), device="cuda", dtype=torch.int32)
                  for x in (lens_q, lens_k))
        out = torch.full_like(q, float("nan"))
        numbatc.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, out=out)
        ref = torch.zeros_like(q, dtype=torch.float32)
        for i, (nq, nk) in enumerate(zip(lens_q, lens_k)):
            qi, ki, vi = q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
            kt, vt = (x.repeat_interleave(2, 1).transpose(0, 1).float() for x in (ki, vi))
            scores = (qi.transpose(0, 1).float() @ kt.transpose(-1, -2)) / d**0.5
            if causal:
                mask = torch.ones(nq, nk, device="cuda").triu(nk - nq + 1).bool()
                scores = scores.masked_fill(mask, float("-inf"))
            p = torch.softmax(scores, -1).nan_to_num(0.0)
            ref[cq[i]:cq[i + 1]] = (p @ vt).transpose(0, 1)
        check(f"varlen {kernel} d={d} causal={causal}", out, ref, 2e-2)
    checks = attention_api._check_prefix_sums
    attention_api._check_prefix_sums = lambda *a: None
    for kernel in ("sm90:n128_2s_ov_pp_fx_tma", "sm90:n128_2s_ov_pp_fx", "sm80"):
        os.environ["NUMBATC_ATTN_KERNEL"] = kernel
        q = torch.randn(12, 2, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16)
        cq = torch.tensor([0, 9, 3, 1000, -5, 12], device="cuda", dtype=torch.int32)
        ck = torch.tensor([-7, 4, 2000, 6, 6, 3], device="cuda", dtype=torch.int32)
        numbatc.attention_varlen(q, k, k, cq, ck, 300, 300, causal=True)
        torch.cuda.synchronize()
        print(f"varlen garbage prefix sums {kernel}: ran", flush=True)
    attention_api._check_prefix_sums = checks
    os.environ.pop("NUMBATC_ATTN_KERNEL")


def softmax():
    for rows, n in ((37, 1000), (64, 4096)):
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        check(f"softmax {rows}x{n}", numbatc.softmax(x), torch.softmax(x.float(), -1), 2e-2)


def gemm_softmax():
    for m, k, n in ((100, 64, 128), (64, 200, 256)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        got = numbatc.gemm_softmax(a, b, scale=0.1)
        check(f"gemm_softmax {m}x{k}x{n}", got, torch.softmax(0.1 * (a.float() @ b.float()), -1), 2e-2)


def gemm_sm90_persistent():
    # more tiles than SMs: each block of the persistent configuration walks several
    GEMM.append((2056, 4360, 136))
    gemm("sm90:128x256x64_4s_pt_tma")


def gemm_sm90_cp():
    # the cp.async producer (operands a tensor map cannot describe run it), persistent or not
    GEMM.append((2056, 4360, 136))
    gemm("sm90:128x256x64_4s_pt")
    gemm("sm90:128x128x64_4s_w1")


def gemm_sm90_ts():
    # the TMA store epilogue, persistent: each block reuses its staging tile for several tiles
    # (shapes whose operands and out a tensor map describes: the config loads by TMA only)
    GEMM[:] = [(128, 256, 64), (200, 264, 136), (77, 1000, 520), (2056, 4360, 136)]
    gemm("sm90:128x256x64_3s_pt_tma_ts")


def gemm_fp8_block():
    # FP8 with blockwise scales (DeepGEMM's recipe), the default choice and the 128-row form
    for kernel in ("", "sm90:fp8_128x128x128_6s_pt_tma_ts"):
        os.environ["NUMBATC_GEMM_KERNEL"] = kernel
        for m, n, k in ((64, 256, 256), (300, 520, 272)):
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
            sa = torch.rand(m, -(-k // 128), device="cuda") + 0.5
            sb = torch.rand(-(-n // 128), -(-k // 128), device="cuda") + 0.5
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            numbatc.gemm(a, w.T, scale_a=sa, scale_b=sb, out=out)
            fa = sa.repeat_interleave(128, 1)[:, :k]
            fb = sb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            check(f"gemm fp8 blockwise {kernel or 'default'} {m}x{n}x{k}", out,
                  (a.float() * fa) @ (w.float() * fb).T, 2e-2)
    os.environ.pop("NUMBATC_GEMM_KERNEL")


def gemm_sm90_split():
    os.environ["NUMBATC_SPLIT_K"] = "3"
    gemm("sm90")
    os.environ.pop("NUMBATC_SPLIT_K")


KINDS = {
    "gemm_sm80": lambda: gemm("sm80"), "gemm_sm90": lambda: gemm("sm90"), "gemm_fp8": gemm_fp8,
    "gemm_sm90_split": gemm_sm90_split, "gemm_sm90_persistent": gemm_sm90_persistent,
    "gemm_sm90_ts": gemm_sm90_ts, "gemm_sm90_cp": gemm_sm90_cp, "gemm_fp8_block": gemm_fp8_block,
    "attention_sm80": lambda: attention("sm80"), "attention_sm90": lambda: attention("sm90"),
    "attention_sm90_large": lambda: attention("sm90", ATTN_LARGE),
    "attention_sm90_m192": lambda: [attention(f"sm90:{n}", ATTN_M192) for n in
                                    ("m192_n128_2s_ov_pp_fx_tma", "m192_n128_3s_ov_pp_fx_tma")],
    # O rescaled under the next Q K^T (rescale_before_pv), each forced on cases of its head dims
    "attention_sm90_rb": lambda: [attention(f"sm90:{n}", cases) for n, cases in (
        ("n128_2s_ov_pp_rb_fx_tma", ATTN), ("n112_2s_ov_pp_rb_fx_tma", ATTN_LARGE[:1]),
        ("n80_2s_ov_rb_fx_tma", ATTN_LARGE[1:3]))],
    "attention_warm": lambda: attention(None, ATTN, repeat=3), "decode": decode,
    "kvcache": kvcache, "attention_backward": attention_backward, "varlen": varlen,
    "attention_backward_sm90": attention_backward_sm90,
    "softmax": softmax, "gemm_softmax": gemm_softmax,
}

if __name__ == "__main__":
    for kind in sys.argv[1:] or sorted(KINDS):
        torch.manual_seed(0)
        KINDS[kind]()
    torch.cuda.synchronize()
    print("done", flush=True)
