"""Where a numbatc.attention_with_kvcache call's time goes: the benchmark's back-to-back figure
(bench._time_gpu), the same calls replayed from a CUDA graph (the kernels alone), the host time
per call (wall time over many calls, device cache_seqlens and block tables as a serving loop
passes them), and the top functions under cProfile.  A back-to-back figure above the replay
says the host path, not the kernel, sets the benchmark's number.  numbatc.attention on the
contiguous cache (the same kernel, with a warm path) and torch SDPA are timed beside it.

    python scripts/diag/kv_host.py [--profile] [--only I[,J..]]   (GPU only; I: SHAPES' index)
"""

import sys

import torch

import numbatc
from numbatc.bench import _time_gpu

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from attn_host import host_us, profile_top, replay_ms  # noqa: E402

# (batch, seqlen_q, seqlen_k, page_size or 0); 32 query / 8 KV heads, head_dim 128, bf16
SHAPES = [(1, 1, 32768, 0), (8, 1, 8192, 0), (32, 4, 4096, 0), (8, 1, 8192, 16),
          (32, 4, 4096, 16), (8, 1, 8192, 256)]


def problem(b, sq, sk, page):
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(b, sq, 32, 128, device=dev, dtype=dt)
    seqlens = torch.full((b,), sk, dtype=torch.int32, device=dev)
    if not page:
        k, v = (torch.randn(b, sk, 8, 128, device=dev, dtype=dt) for _ in range(2))
        return q, k, v, seqlens, None
    per = sk // page
    k, v = (torch.randn(b * per, page, 8, 128, device=dev, dtype=dt) for _ in range(2))
    table = torch.randperm(b * per, device=dev, dtype=torch.int32).reshape(b, per)
    return q, k, v, seqlens, table


def main():
    profile = "--profile" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    shapes = SHAPES if only is None else [SHAPES[int(i)] for i in only.split(",")]
    for b, sq, sk, page in shapes:
        q, k, v, seqlens, table = problem(b, sq, sk, page)
        out = torch.empty_like(q)

        def kv():
            numbatc.attention_with_kvcache(q, k, v, seqlens, block_table=table, out=out)

        name = f"{b}x{sq}x{sk}" + (f" paged {page}" if page else "")
        back, rep = _time_gpu(kv, torch, 15), replay_ms(kv)
        print(f"{name}: kvcache back-to-back {back * 1e3:7.1f} us, replay {rep * 1e3:7.1f} us, "
              f"host per call {host_us(kv):6.1f} us", flush=True)
        if not page:
            def plain():
                numbatc.attention(q, k, v, out=out)

            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def sdpa():
                torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

            print(f"{name}: attention back-to-back {_time_gpu(plain, torch, 15) * 1e3:7.1f} us, "
                  f"host per call {host_us(plain):6.1f} us; SDPA back-to-back "
                  f"{_time_gpu(sdpa, torch, 15) * 1e3:7.1f} us, host per call "
                  f"{host_us(sdpa):6.1f} us", flush=True)
        if profile:
            print(profile_top(kv, top=25))


if __name__ == "__main__":
    main()
