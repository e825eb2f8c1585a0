"""The layers of numbatc as docs/ARCHITECTURE.md draws them (issue 19): its import graph is the
one the code has now (scripts/import_graph.py reads the imports with ast), and no kernel module
in numbatc/kernels imports another kernel module's private names."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_draws_the_current_imports():
    graph = _graph_module()
    text, _ = graph.graph()
    doc = graph.DOC.read_text()
    assert f"{graph.BEGIN}\n{text}\n{graph.END}" in doc, (
        "docs/ARCHITECTURE.md is not current: python scripts/import_graph.py --write")


def test_no_kernel_module_imports_another_ones_private_names():
    _, private = _graph_module().graph()
    assert private == []


def test_the_graph_sees_the_layers():
    # a check that the reader finds imports at all (relative and absolute): the front end
    # reaches dispatch, dispatch the kernel modules, a kernel the framework, and interop
    text, _ = _graph_module().graph()
    for edge in ("numbatc_gemm_api --> numbatc_kernels_dispatch",
                 "numbatc_kernels_dispatch --> numbatc_kernels_sm90_gemm",
                 "numbatc_kernels_sm90_gemm --> numbatc_kernels_epilogue",
                 "numbatc_gemm_api --> numbatc_interop"):
        assert edge in text, edge
