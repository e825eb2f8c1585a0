"""examples/ex07_transformers.py on the GPU: a transformers Llama through numbatc (patched
nn.Linear modules, numbatc attention) against the same model in torch.  Skips where torch with
CUDA or transformers is absent."""

import importlib.util
import pathlib

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ex07_transformers.py"


def test_transformers_llama_matches_torch():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    spec = importlib.util.spec_from_file_location("ex07_transformers", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.run(verbose=True) is True
