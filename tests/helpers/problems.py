"""Stand-in problems for the host code that chooses kernels (numbatc.kernels.dispatch and the
kernel modules' unsupported / choose / variant): real GemmProblem, AttentionProblem,
AttentionBackwardProblem, SoftmaxProblem and GemmSoftmaxProblem objects over arrays that hold no memory (the choice reads
shapes, layouts, alignments and dtypes, never the data)."""

from types import SimpleNamespace


def operand(name, layout, ld, alignment=16):
    from numbatc.gemm_api import Operand

    return Operand(name, None, layout, ld, alignment)


def gemm_problem(m, n, k, *, alignment=16, cc=(9, 0), dtype="bfloat16", a_layout="row",
                 b_layout="col", out_dtype=None, fp8_scales=None, block_scaled=None):
    """A numbatc.gemm_api.GemmProblem of a row-major (M, K) ``a`` and ``b`` as ``b_layout``, both of
    ``alignment`` (the largest power of two <= 16 dividing start and leading dimension in
    bytes), numbatc's own row-major output; ``fp8_scales`` = (scale_a, scale_b) makes it the
    per-tensor-scaled FP8 GEMM, ``block_scaled`` a numbatc.gemm_api.BLOCK_SCALED format."""
    from numbatc.gemm_api import GemmProblem

    out_dtype = out_dtype or ("bfloat16" if fp8_scales or block_scaled else dtype)
    a = operand("a", a_layout, k if a_layout == "row" else m, alignment)
    b = operand("b", b_layout, n if b_layout == "row" else k, alignment)
    return GemmProblem(
        m=m, n=n, k=k, a=a, b=b, c=None, bias=None, out=operand("out", "row", n), alpha=1.0,
        beta=0.0, activation=None, in_dtype=dtype, b_dtype=dtype, out_dtype=out_dtype,
        bias_dtype=None, acc_dtype="float32", device=None, cc=cc, stream_handle=0,
        tensor_scales=fp8_scales, block_scaled=block_scaled)


def attention_operand(shape, ptr=4096, strides=None):
    """A (batch, seq, heads, head_dim) array description: its pointer, shape and element
    strides (contiguous by default)."""
    if strides is None:
        b, s, h, d = shape
        strides = (s * h * d, h * d, d, 1)
    return SimpleNamespace(ptr=ptr, shape=shape, strides=strides)


def attention_problem(batch=2, seqlen_q=100, seqlen_k=100, heads_q=4, heads_kv=4, head_dim=64,
                      dtype="bfloat16", causal=False, cc=(9, 0)):
    """A numbatc.attention_api.AttentionProblem over contiguous q, k, v and out."""
    from numbatc.attention_api import AttentionProblem

    return AttentionProblem.contiguous(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim,
                                       causal=causal, dtype=dtype, cc=cc, scale=0.125)


def attention_backward_problem(batch=2, seqlen_q=100, seqlen_k=100, heads_q=4, heads_kv=4,
                               head_dim=64, dtype="bfloat16", causal=False, cc=(9, 0)):
    """A numbatc.attention_backward_api.AttentionBackwardProblem over contiguous operands, with
    sm90_attention_backward's workspace."""
    from numbatc.attention_backward_api import AttentionBackwardProblem

    return AttentionBackwardProblem.contiguous(batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                               head_dim, causal=causal, dtype=dtype, cc=cc)


def softmax_problem(rows, n, dtype="bfloat16", out_dtype=None, *, ptr=4096, ld=None, cc=(9, 0)):
    """A numbatc.softmax_api.SoftmaxProblem: ``rows`` rows of ``n`` elements ``ld`` apart (n by
    default) in x at ``ptr`` and out 1 MiB further."""
    from numbatc.softmax_api import SoftmaxProblem

    ld = n if ld is None else ld
    return SoftmaxProblem(
        x=SimpleNamespace(ptr=ptr), out=SimpleNamespace(ptr=ptr + 2**20), rows=rows, n=n, ldx=ld,
        ldo=ld, in_dtype=dtype, out_dtype=out_dtype or dtype, device=None, cc=cc, stream_handle=0)


def gemm_softmax_problem(m, n, k, *, dtype="float16", out_dtype=None, bias_dtype=None,
                         a_layout="row", b_layout="row", alignment=16, cc=(9, 0)):
    """A numbatc.softmax_api.GemmSoftmaxProblem of ``a`` (M, K) as ``a_layout`` and ``b``
    (K, N) as ``b_layout``, both of ``alignment``, a row-major out and a bias where
    ``bias_dtype``."""
    from numbatc.softmax_api import GemmSoftmaxProblem

    a = operand("a", a_layout, k if a_layout == "row" else m, alignment)
    b = operand("b", b_layout, n if b_layout == "row" else k, alignment)
    bias = operand("bias", "row", n) if bias_dtype else None
    return GemmSoftmaxProblem(
        m=m, n=n, k=k, a=a, b=b, bias=bias, out=operand("out", "row", n), scale=0.125,
        in_dtype=dtype, out_dtype=out_dtype or dtype, bias_dtype=bias_dtype, device=None, cc=cc,
        stream_handle=0)
