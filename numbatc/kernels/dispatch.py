"""Which kernel runs a :class:`numbatc.gemm_api.GemmProblem` or a
:class:`numbatc.attention_api.AttentionProblem`, and its launch: a table over the kernel modules.

Every kernel module has the same face (see STYLE.md): ``CONFIGS``; ``unsupported(problem)``, why
it cannot compute the problem, or None; ``choose(problem, name=None)``, its configuration for
the problem (``name`` forces one); ``launch(problem, config)``; and ``compiled(problem,
config)``, the configuration and variant that launch compiles (what numbatc.precompile
compiles).  The heuristics live with their kernels (sm90_gemm.choose ...); this module holds
only the order of the families per problem kind, the GPU each runs on, the environment's
forcing and what the default choice passes over:

    kind            families, in the order tried
    dense           sm100_gemm (10.x), sm90_gemm (9.0), sm80_gemm (any: the portable kernel)
    fp8             sm90_gemm (9.0)                      FP8 with per-tensor scales
    block_scaled    sm100_scaled_gemm (10.x)             MXFP8, NVFP4
    attention       sm80_decode_attention (any: decode shapes), sm90_attention (9.0),
                    sm80_attention (any: the portable kernel)

The first family that runs on the GPU, computes the problem and is not passed over
(:func:`_passed_over`) gets ``choose`` then ``launch``.
``NUMBATC_GEMM_KERNEL=<family>[:<config>]`` (sm80, sm90, sm100) tries that family only (and a
configuration), falling back to the portable kernel where it cannot compute the problem; on a
GPU of another architecture it is an error (the CPU emulation, which stands in for an sm_90a
GPU, runs any family it is told to).  ``NUMBATC_SM80_CONFIG=<name>`` forces sm80_gemm's
configuration wherever it runs.  ``NUMBATC_PRINT_CONFIG=1`` prints the choice to stderr, with
the reason each family for this GPU tried before it was skipped.

Attention (:func:`choose_attention`, :func:`launch_attention`) walks its families the same way
with its own variable, ``NUMBATC_ATTN_KERNEL=<family>[:<config>]`` (sm80, or decode or sm90 and
one of its configurations): forcing sm90 falls back to the portable kernel where sm90_attention
cannot compute the problem or the GPU is not 9.0 (no error); the CPU emulation runs
sm80_attention unless told sm90 (or the problem is decode-shaped).  The flash-decoding kernel
(``decode``) takes what ``sm80_decode_attention.declines`` does not decline (seqlen_q <= 16 and
seqlen_k >= 1024) unless another family is forced; forced, it takes any problem it computes.
sm90_attention declines the head dims outside its ``DEFAULT_HEAD_DIMS`` unless forced.
``NUMBATC_ATTN_CONFIG=<name>`` forces sm80_attention's configuration.
"""

import os
import sys
from typing import NamedTuple

from numba import config

from numbatc.kernels import (
    sm80_attention,
    sm80_decode_attention,
    sm80_gemm,
    sm90_attention,
    sm90_gemm,
    sm100_gemm,
    sm100_scaled_gemm,
)
from numbatc.kernels.split_k import release_captured

_EMULATED = bool(config.ENABLE_CUDASIM)

__all__ = ["AttentionRelaunch", "FAMILIES", "Family", "attention_env_key", "choose",
           "choose_attention", "env_key", "launch_attention", "launch_gemm", "plan",
           "release_captured"]

#: The environment variables that steer the choice of kernel and configuration.
_ENV_VARS = ("NUMBATC_SM80_CONFIG", "NUMBATC_GEMM_KERNEL", "NUMBATC_PRINT_CONFIG",
             "NUMBATC_SPLIT_K")
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_BYTES = [os.environ.encodekey(v) for v in _ENV_VARS] if _ENV_DATA is not None else None


def env_key():
    """The values of the variables that steer dispatch (see _ENV_VARS), as a cheap tuple: part of
    numbatc.gemm's fast-path key, so that a relaunch function is never used after one changes.
    NOTE: ``os.environ.get`` costs ~0.4 us per missing name (a KeyError inside); os.environ's own
    dict (kept in step by os.environ's setters) costs ~40 ns."""
    if _ENV_BYTES is not None:
        get = _ENV_DATA.get
        return (get(_ENV_BYTES[0]), get(_ENV_BYTES[1]), get(_ENV_BYTES[2]), get(_ENV_BYTES[3]))
    return tuple(os.environ.get(v) for v in _ENV_VARS)


#: The environment variables that steer numbatc.attention's walk.
_ATTN_ENV_VARS = ("NUMBATC_ATTN_KERNEL", "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG",
                  "NUMBATC_DECODE_SPLITS")
_ATTN_ENV_BYTES = ([os.environ.encodekey(v) for v in _ATTN_ENV_VARS] if _ENV_DATA is not None
                   else None)


def attention_env_key():
    """The values of the variables that steer the attention walk (_ATTN_ENV_VARS), as cheaply as
    :func:`env_key`: part of numbatc.attention's warm-call key."""
    if _ATTN_ENV_BYTES is not None:
        get = _ENV_DATA.get
        return (get(_ATTN_ENV_BYTES[0]), get(_ATTN_ENV_BYTES[1]), get(_ATTN_ENV_BYTES[2]),
                get(_ATTN_ENV_BYTES[3]))
    return tuple(os.environ.get(v) for v in _ATTN_ENV_VARS)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


class Family(NamedTuple):
    """A kernel module as dispatch tries it: ``name`` is NUMBATC_GEMM_KERNEL's (or
    NUMBATC_ATTN_KERNEL's) for it, ``cc`` the leading part of the compute capabilities it runs on
    ((10,): 10.x, (9, 0): 9.0, (): any)."""

    name: str
    module: object
    cc: tuple


#: Per problem kind, the families in the order tried.
FAMILIES = {
    "dense": (Family("sm100", sm100_gemm, (10,)), Family("sm90", sm90_gemm, (9, 0)),
              Family("sm80", sm80_gemm, ())),
    "fp8": (Family("sm90", sm90_gemm, (9, 0)),),
    "block_scaled": (Family("sm100", sm100_scaled_gemm, (10,)),),
    "attention": (Family("decode", sm80_decode_attention, ()),
                  Family("sm90", sm90_attention, (9, 0)), Family("sm80", sm80_attention, ())),
}


def _kind(p):
    if p.block_scaled is not None:
        return "block_scaled"
    return "fp8" if p.tensor_scales is not None else "dense"


def _runs_on(family, cc):
    return not family.cc or (cc is not None and tuple(cc)[:len(family.cc)] == family.cc)


def _module_name(family):
    return family.module.__name__.rsplit(".", 1)[1]


def _cc_name(family):
    """The compute capabilities a family runs on, as a message names them ('9.0', '10.x')."""
    return ".".join(map(str, family.cc)) + (".x" if len(family.cc) == 1 else "")


def _passed_over(kind, family, p):
    """Why the default choice (no NUMBATC_GEMM_KERNEL) passes over a family that can compute
    ``p`` for the next one, or None."""
    if kind != "dense" or family.name != "sm90":
        return None
    if _EMULATED:
        # 384 Python threads per block: tests/emulation runs sm90_gemm directly, at tiny sizes
        return "the CPU emulation runs sm80_gemm unless NUMBATC_GEMM_KERNEL=sm90"
    # NOTE: measured on the H200 (docs/PERFORMANCE.md, the shape table): at M = 8 and K = 8192 /
    # 14336 sm80_gemm's 16-row split-K tiles ran at 0.84-0.87x of cuBLAS against 0.76x for the
    # 64-row Hopper tiles; where those cannot run, sm80_gemm's 64-row tiles take M <= 64.
    if p.m <= 16:
        return "M <= 16: sm80_gemm's 16-row tiles"
    if p.m <= 64:
        why = sm90_gemm.small_tiles_skip(p)
        if why is not None:
            return f"M <= 64 and {why}: sm80_gemm's 64-row tiles"
    return None


def _refused(kind, choice, p):
    """The error for NUMBATC_GEMM_KERNEL naming a family that the problem's kind has not."""
    if kind == "fp8":
        return f"NUMBATC_GEMM_KERNEL={choice!r}: FP8 with per-tensor scales runs on sm90 only"
    if kind == "block_scaled":
        return (f"NUMBATC_GEMM_KERNEL={choice!r}: block-scaled "
                f"({p.block_scaled.name.upper()}) GEMM runs on sm100 only")
    return f"NUMBATC_GEMM_KERNEL={choice!r}: choose sm80, sm90[:<config>] or sm100[:<config>]"


def _needs(kind, family, choice, p):
    """The error for a problem whose families run on other GPUs (or a family forced there)."""
    gpu = f"sm_{p.cc[0]}{p.cc[1]}" if p.cc else "unknown"
    if kind == "fp8":
        return ("FP8 with per-tensor scales needs compute capability 9.0 (sm_90a); this GPU is "
                f"{gpu}")
    if kind == "block_scaled":
        return (f"block-scaled GEMM ({p.block_scaled.name.upper()}) needs sm_100 (Blackwell); "
                f"this GPU is {gpu}")
    cc = _cc_name(family)
    return (f"NUMBATC_GEMM_KERNEL={choice!r} needs compute capability {cc}, this GPU has "
            f"{tuple(p.cc) if p.cc else '?'}")


def _forced_config(family, forced, name, choice):
    """(configuration name, the setting that names it) the environment forces on ``family``, or
    (None, None)."""
    if family.name == forced and name:
        return name, f"NUMBATC_GEMM_KERNEL={choice!r}"
    sm80 = os.environ.get("NUMBATC_SM80_CONFIG") if family.name == "sm80" else None
    if sm80:
        return sm80, f"NUMBATC_SM80_CONFIG={sm80!r}"
    return None, None


# ---------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------


def choose(p):
    """(kernel module, configuration) that runs problem ``p``: the walk over its kind's
    families described in the module docstring."""
    kind = _kind(p)
    families = FAMILIES[kind]
    choice = os.environ.get("NUMBATC_GEMM_KERNEL", "")
    forced, _, name = choice.partition(":")
    if forced and forced not in {f.name for f in families}:
        if not any(_runs_on(f, p.cc) for f in families):
            raise ValueError(_needs(kind, families[0], choice, p))
        raise ValueError(_refused(kind, choice, p))
    skipped = []
    for f in families:
        if not (_runs_on(f, p.cc) or (_EMULATED and f.name == forced)):
            if f.name == forced:
                raise ValueError(_needs(kind, f, choice, p))
            continue  # a kernel for another GPU: not worth a word
        if forced and f.name != forced and f.cc:  # forcing leaves the portable kernel
            why = f"NUMBATC_GEMM_KERNEL={choice}"
        else:
            why = f.module.unsupported(p)
            if why is None and not forced:
                why = _passed_over(kind, f, p)
        if why is not None:
            skipped.append((f, why))
            continue
        if os.environ.get("NUMBATC_PRINT_CONFIG"):
            for other, reason in skipped:
                print(f"numbatc.gemm: {_module_name(f)}, not {_module_name(other)}: {reason}",
                      file=sys.stderr)
        config_name, source = _forced_config(f, forced, name, choice)
        try:
            return f.module, f.module.choose(p, config_name)
        except ValueError as exc:
            if source is None:
                raise
            raise ValueError(f"{source}: {exc}") from None
    if not skipped:
        raise ValueError(_needs(kind, families[0], choice, p))
    raise NotImplementedError("numbatc.gemm: no kernel computes this problem: " + "; ".join(
        f"{_module_name(f)}: {why}" for f, why in skipped))


def plan(p):
    """(kernel module, configuration, variant) that :func:`launch_gemm` launches for ``p``: what
    compiles (numbatc.precompile compiles these)."""
    module, cfg = choose(p)
    return (module, *module.compiled(p, cfg))


def _config_line(p, module, cfg):
    """NUMBATC_PRINT_CONFIG's line for the choice."""
    head = f"numbatc.gemm M={p.m} N={p.n} K={p.k}: {module.__name__.rsplit('.', 1)[1]} {cfg.name}"
    tail = (f"{' +c' if p.c is not None else ''}{' +bias' if p.bias_dtype else ''}"
            f"{' ' + p.activation if p.activation else ''}")
    if p.block_scaled is not None:
        return (f"{head} {p.in_dtype} x {p.b_dtype} ({p.block_scaled.name}) -> {p.out_dtype}"
                f"{tail}")
    packed = " (packed: not 16-byte aligned)"
    return (f"{head} a={p.a.layout}{'' if p.a.alignment == 16 else packed} "
            f"b={p.b.layout}{'' if p.b.alignment == 16 else packed} "
            f"{p.in_dtype}{' x ' + p.b_dtype if p.tensor_scales else ''}->{p.out_dtype}{tail}")


def launch_gemm(p):
    """Launch the GEMM for problem ``p`` (m, n >= 1; k >= 1, or 0 with a user epilogue: the
    kernel's main loop then runs no k tile) on its stream.

    Returns a relaunch function ``fn(a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, alpha, beta,
    stream_handle)`` that launches the same kernel for another problem with everything but
    those equal (shapes, strides, dtypes, layouts, flags, device; c_ptr and bias_ptr are out_ptr
    when absent; with a user epilogue a ninth argument, its arguments' kernel parameters, see
    epilogue.flat_epilogue_args), or None where there is none: the emulation, K == 0, an
    operand that had to be packed (not 16-byte aligned), ``NUMBATC_PRINT_CONFIG`` set (each call
    prints), the sm100 kernels.  numbatc.gemm keeps it for its warm calls, which relaunch it
    directly: this runs on a call's checked path only.  Block-scaled problems run
    sm100_scaled_gemm (compute capability 10.x only).  FP8 with per-tensor scales
    (``p.tensor_scales``) runs sm90_gemm's fp8 form (compute capability 9.0 only) with
    alpha * scale_a * scale_b as its alpha; the relaunch function then takes that product as
    alpha."""
    module, cfg = choose(p)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        print(_config_line(p, module, cfg), file=sys.stderr)
    return module.launch(p, cfg)


# ---------------------------------------------------------------------------------------------
# Attention: numbatc.attention's walk
# ---------------------------------------------------------------------------------------------


def _takes_config(family):
    """Whether NUMBATC_ATTN_KERNEL may name a configuration of ``family``: every attention
    family but the portable kernel (whose configuration is NUMBATC_ATTN_CONFIG's)."""
    return family.module is not sm80_attention


def _attention_passed_over(family, forced, choice, p):
    """Why the attention walk passes over ``family`` without asking it (NUMBATC_ATTN_KERNEL
    naming another, the emulation, another GPU, a problem the family ``declines`` unless
    forced), or None."""
    if forced and family.name != forced and _takes_config(family):
        return f"NUMBATC_ATTN_KERNEL={choice}"  # forcing leaves the portable kernel
    if not forced and hasattr(family.module, "declines"):
        # problems a family computes but the default walk does not send it (decode-shaped ones
        # only to flash-decoding; sm90_attention's DEFAULT_HEAD_DIMS)
        why = family.module.declines(p)
        if why is not None:
            return why
    if _EMULATED and family.cc and family.name != forced:
        # 384 Python threads per block are slow: the emulation runs sm90 only when told
        portable = _module_name(FAMILIES["attention"][-1])
        return f"the CPU emulation runs {portable} unless NUMBATC_ATTN_KERNEL={family.name}"
    if not _runs_on(family, p.cc) and not (_EMULATED and family.name == forced):
        return f"compute capability {tuple(p.cc) if p.cc else '?'} is not {_cc_name(family)}"
    return None


def choose_attention(p):
    """(kernel module, configuration) that runs attention problem ``p``: the first of
    FAMILIES["attention"] that is not passed over (:func:`_attention_passed_over`) and whose
    ``unsupported(p)`` is None, with its ``choose(p, name)`` (``name``: NUMBATC_ATTN_KERNEL's
    configuration).  NUMBATC_PRINT_CONFIG prints why each family for this GPU was skipped.

    NOTE: sm90_attention is the default on 9.0 since it passed its GPU tests on the H200 and
    measured 0.44-0.64x of torch SDPA against the portable kernel's 0.31-0.42x
    (docs/PERFORMANCE.md)."""
    families = FAMILIES["attention"]
    by_name = {f.name: f for f in families}
    choice = os.environ.get("NUMBATC_ATTN_KERNEL", "")
    forced, _, name = choice.partition(":")
    if choice and (forced not in by_name or (name and not _takes_config(by_name[forced]))):
        # the portable kernel's configuration is NUMBATC_ATTN_CONFIG's
        named = " or ".join(f.name + ("[:<config>]" if _takes_config(f) else "")
                            for f in sorted(families, key=lambda f: f.name))
        raise ValueError(f"NUMBATC_ATTN_KERNEL={choice!r}: choose {named}")
    if name and name not in by_name[forced].module.CONFIGS:
        raise ValueError(f"NUMBATC_ATTN_KERNEL={choice!r}: no {forced} config {name!r}; choose "
                         f"from {sorted(by_name[forced].module.CONFIGS)}")
    skipped = []
    for f in families:
        why = _attention_passed_over(f, forced, choice, p)
        if why is None:
            why = f.module.unsupported(p)
        if why is not None:
            skipped.append((f, why))
            continue
        if os.environ.get("NUMBATC_PRINT_CONFIG"):
            for other, reason in skipped:
                if _runs_on(other, p.cc):  # a kernel for another GPU: not worth a word
                    print(f"numbatc.attention: {_module_name(f)}, not {_module_name(other)}: "
                          f"{reason}", file=sys.stderr)
        return f.module, f.module.choose(p, name if f.name == forced and name else None)
    raise NotImplementedError("numbatc.attention: no kernel computes this problem: " + "; ".join(
        f"{_module_name(f)}: {why}" for f, why in skipped))


def launch_attention(p):
    """Launch the attention kernel for problem ``p`` (batch, seqlen_q, heads_q >= 1; seqlen_k
    may be 0) on its stream: :func:`choose_attention`'s module and configuration; the module's
    launch prints the choice under NUMBATC_PRINT_CONFIG.

    Returns a relaunch function ``fn(problem)`` (an :class:`AttentionRelaunch`, whose ``fast``
    takes pointers where the module made one): the same module's launch of the same
    configuration for a problem equal to ``p`` but in its arrays' pointers, its scale and its
    stream (what the walk reads is then the same; the launch itself still decides what depends
    on pointers: packing q, k, v and a TMA configuration's cp.async twin), or None with
    ``NUMBATC_PRINT_CONFIG`` set (each call prints).  numbatc.attention keeps it for its warm
    calls."""
    module, cfg = choose_attention(p)
    fast = module.launch(p, cfg)
    if os.environ.get("NUMBATC_PRINT_CONFIG"):
        return None
    return AttentionRelaunch(module, cfg, fast if callable(fast) else None)


class AttentionRelaunch:
    """launch_attention's relaunch function: ``self(problem)`` launches ``cfg`` of ``module``
    for an AttentionProblem; ``fast`` is the module's pointer relaunch where its launch made one
    (``fast(q, k, v, out, lse, scale, stream_handle)`` -> False where those pointers need the
    problem path; see sm80_attention.pointer_relaunch), else None."""

    __slots__ = ("module", "cfg", "fast")

    def __init__(self, module, cfg, fast):
        self.module, self.cfg, self.fast = module, cfg, fast

    def __call__(self, problem):
        self.module.launch(problem, self.cfg)
