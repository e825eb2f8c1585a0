"""The layers of numbatc, drawn from the code: every import between the modules of ``numbatc``
(and the ``intrinsics`` packages they reach), read from the source with ``ast`` (nothing is
imported), grouped by layer, as a Mermaid graph.

    python scripts/import_graph.py            # print the graph
    python scripts/import_graph.py --write    # rewrite the graph block of docs/ARCHITECTURE.md
    python scripts/import_graph.py --check    # exit 1 if docs/ARCHITECTURE.md is not current

Also lists the private names (``from numbatc.kernels.x import _y``, or ``x._y`` read through an
imported module) that cross from one kernel module to another (tests/test_architecture.py
asserts there are none).

Layers (top to bottom): the front ends (numbatc.gemm_api / softmax_api / attention_api /
torch ...), numbatc.kernels' dispatch, the kernel modules, the kernel framework (build,
epilogue, gpus, operands, split_k, pipeline, tiles), numbatc.interop, and the intrinsics packages.
Intrinsics are drawn as packages (``intrinsics``, ``intrinsics.layout``,
``intrinsics.emulate``), not module by module, to keep the picture readable.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- import-graph: begin -->", "<!-- import-graph: end -->"

FRAMEWORK = {"build", "epilogue", "gpus", "operands", "split_k", "pipeline", "tiles"}


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for pkg in ("numbatc", "intrinsics"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[module_name(path)] = path
    return found


def node(name: str) -> str:
    """The drawn node of module ``name``: numbatc modules as they are, intrinsics by package."""
    if name.startswith("intrinsics"):
        parts = name.split(".")
        if len(parts) > 1 and parts[1] in ("layout", "emulate"):
            return ".".join(parts[:2])
        return "intrinsics"
    if name.startswith("numbatc.interop"):
        return "numbatc.interop"
    if name.startswith("numbatc.torch"):
        return "numbatc.torch"
    return name


def imports(known: dict[str, pathlib.Path]):
    """(importer, imported module, names) for every import of a known module; a module bound
    to a local name (``import a.b as m``, ``from a import b``) also yields the underscored
    attributes read through that name (``m._helper``, in f-strings too) as names it uses."""
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        bound = {}  # local name -> the known module it holds
        for stmt in ast.walk(tree):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name in known:
                        yield name, alias.name, ()
                        if alias.asname:
                            bound[alias.asname] = alias.name
            elif isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    up = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [a.name for a in stmt.names]
                subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
                for sub in subs:
                    yield name, sub, ()
                for a in stmt.names:
                    if f"{base}.{a.name}" in known:
                        bound[a.asname or a.name] = f"{base}.{a.name}"
                rest = tuple(n for n in names if f"{base}.{n}" not in known)
                if base in known and rest:
                    yield name, base, rest
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                yield name, bound[node.value.id], (node.attr,)


def layer(name: str) -> str:
    if name.startswith("intrinsics"):
        return "intrinsics"
    if name == "numbatc.interop":
        return "interop"
    if name.startswith("numbatc.kernels"):
        leaf = name.rpartition(".")[2]
        if leaf == "dispatch":
            return "dispatch"
        if leaf in FRAMEWORK:
            return "framework"
        return "kernels"
    return "front ends"


LAYERS = ("front ends", "dispatch", "kernels", "framework", "interop", "intrinsics")


def graph() -> tuple[str, list[str]]:
    known = modules()
    edges, private = set(), []
    for src, dst, names in imports(known):
        a, b = node(src), node(dst)
        if a == b:
            continue
        if not a.startswith("numbatc"):
            continue  # intrinsics' own imports: one package
        if b == "numbatc":
            continue  # the package itself (lazy re-exports)
        edges.add((a, b))
        if (src.startswith("numbatc.kernels.") and dst.startswith("numbatc.kernels.")
                and layer(src) == layer(dst) == "kernels"):
            for n in names:
                if n.startswith("_"):
                    private.append(f"{src} imports {dst}.{n}")
    nodes = sorted({n for e in edges for n in e})
    ident = {n: n.replace(".", "_") for n in nodes}
    lines = ["```mermaid", "flowchart TB"]
    for lay in LAYERS:
        members = [n for n in nodes if layer(n) == lay]
        if not members:
            continue
        lines.append(f"  subgraph {lay.replace(' ', '_')}[\"{lay}\"]")
        lines += [f"    {ident[n]}[\"{n}\"]" for n in members]
        lines.append("  end")
    lines += [f"  {ident[a]} --> {ident[b]}" for a, b in sorted(edges)]
    lines.append("```")
    return "\n".join(lines), private


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite docs/ARCHITECTURE.md's graph")
    mode.add_argument("--check", action="store_true", help="exit 1 if the doc is not current")
    args = ap.parse_args(argv)
    text, private = graph()
    for line in private:
        print("private import across kernel modules:", line, file=sys.stderr)
    if not (args.write or args.check):
        print(text)
        return 1 if private else 0
    doc = DOC.read_text()
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{text}\n{END}{tail}"
    if args.check:
        if new != doc:
            print("docs/ARCHITECTURE.md's import graph is not current: "
                  "python scripts/import_graph.py --write", file=sys.stderr)
            return 1
        return 1 if private else 0
    DOC.write_text(new)
    return 1 if private else 0


if __name__ == "__main__":
    sys.exit(main())
