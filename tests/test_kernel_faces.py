"""Every kernel module in numbatc/kernels has the same face (STYLE.md): ``CONFIGS``,
``unsupported(problem)`` (a reason, str, or None), ``choose(problem)`` (one of its
configurations), ``launch(problem, config)``, and ``compiled(problem, config)`` (the
configuration and variant a launch compiles); numbatc.kernels.dispatch's table holds exactly the
GEMM and attention ones.  CPU only: stand-in problems (GEMM, attention, softmax, GEMM + softmax), nothing is
launched."""

import importlib
import pkgutil

import pytest

import numbatc.kernels
from numbatc.gemm_api import BLOCK_SCALED
from numbatc.kernels import dispatch
from tests.helpers.problems import (
    attention_backward_problem,
    attention_problem,
    gemm_problem,
    gemm_softmax_problem,
    softmax_problem,
)

#: modules of numbatc/kernels that are no kernel of their own: the shared machinery (gpus: the
#: per-compute-capability limits; tensor_maps: the TMA kernels' map cache), and the TMA producer halves of sm90_gemm and sm90_attention
#: (their configurations are those modules' _tma ones, chosen there)
SHARED = {"build", "dispatch", "epilogue", "gpus", "operands", "pipeline", "split_k",
          "tensor_maps", "tiles", "sm90_gemm_tma", "sm90_attention_tma"}
FACE = ("CONFIGS", "unsupported", "choose", "launch", "compiled")


def _kernel_modules():
    names = sorted(m.name for m in pkgutil.iter_modules(numbatc.kernels.__path__))
    return [n for n in names if n not in SHARED]


def _problems(name):
    if name == "row_softmax":
        return [softmax_problem(4096, 4096), softmax_problem(7, 7, "float16", "float32"),
                softmax_problem(3, 40000, "float32"), softmax_problem(2, 64, ld=66),
                softmax_problem(5, 100, "float64"), softmax_problem(2, 8, "bfloat16", "int8")]
    if name == "sm80_gemm_softmax":
        return [gemm_softmax_problem(100, 256, 64, bias_dtype="float32"),
                gemm_softmax_problem(5, 7, 20, dtype="bfloat16", a_layout="col", b_layout="col"),
                gemm_softmax_problem(64, 64, 0), gemm_softmax_problem(10, 257, 64),
                gemm_softmax_problem(8, 16, 16, dtype="float32")]
    if "backward" in name:
        return [attention_backward_problem(), attention_backward_problem(head_dim=128, causal=True),
                attention_backward_problem(head_dim=96, seqlen_k=300, heads_kv=2),
                attention_backward_problem(head_dim=12), attention_backward_problem(dtype="float32"),
                attention_backward_problem(cc=(8, 0))]
    if "attention" in name:
        return [attention_problem(), attention_problem(head_dim=128, causal=True),
                attention_problem(head_dim=32, seqlen_k=0), attention_problem(head_dim=256),
                attention_problem(head_dim=12), attention_problem(dtype="float32")]
    return [gemm_problem(4096, 4096, 4096), gemm_problem(8, 4096, 4096, alignment=8),
            gemm_problem(300, 300, 301, a_layout="col", b_layout="row", dtype="float16"),
            gemm_problem(64, 64, 0), gemm_problem(20, 16, 24, cc=(10, 0)),
            gemm_problem(70, 24, 256, dtype="float8_e4m3fn", fp8_scales=(0.5, 2.0)),
            gemm_problem(150, 40, 256, cc=(10, 0), dtype="float8_e4m3fn",
                         block_scaled=BLOCK_SCALED["mxfp8"])]


def _configs(module):
    return {**module.CONFIGS, **getattr(module, "FP8_CONFIGS", {})}


@pytest.mark.parametrize("name", _kernel_modules())
def test_kernel_module_has_the_face(name, monkeypatch):
    for var in ("NUMBATC_GEMM_KERNEL", "NUMBATC_SM80_CONFIG", "NUMBATC_SPLIT_K",
                "NUMBATC_ATTN_CONFIG", "NUMBATC_PRINT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    module = importlib.import_module(f"numbatc.kernels.{name}")
    assert all(callable(getattr(module, f)) for f in FACE[1:]), name
    assert module.CONFIGS and all(c.name == key for key, c in module.CONFIGS.items())
    verdicts = []
    for p in _problems(name):
        why = module.unsupported(p)
        assert why is None or (isinstance(why, str) and why), (name, p, why)
        verdicts.append(why is None)
        if why is None:
            cfg = module.choose(p)
            assert _configs(module).get(cfg.name) == cfg, (name, cfg)
            run, _variant = module.compiled(p, cfg)
            assert _configs(module).get(run.name) == run, (name, run)
    # each kernel takes some of the problems and refuses others, each with its reason
    assert any(verdicts) and not all(verdicts), (name, verdicts)


def test_the_dispatch_table_holds_the_gemm_and_attention_kernel_modules():
    """Every family in the table has the face; the GEMM kinds hold every GEMM kernel module and
    the attention kind every attention forward one (the softmax ones are numbatc.softmax's to
    walk, sm80_attention_backward numbatc.attention_backward's), each walk closed by a portable
    kernel."""
    def tabled(*kinds):
        return {f.module.__name__.rsplit(".", 1)[1] for kind in kinds
                for f in dispatch.FAMILIES[kind]}

    assert set(dispatch.FAMILIES) == {"dense", "fp8", "block_scaled", "attention"}
    assert tabled("dense", "fp8", "block_scaled") == {
        n for n in _kernel_modules() if "attention" not in n and "softmax" not in n}
    assert tabled("attention") == {n for n in _kernel_modules()
                                   if "attention" in n and "backward" not in n}
    assert dispatch.FAMILIES["dense"][-1].cc == () and dispatch.FAMILIES["attention"][-1].cc == ()
