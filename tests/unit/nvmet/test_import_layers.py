"""The nvmet package's modules import one way: no import cycle among them.

Every import counts, wherever it is written: at module level, under ``TYPE_CHECKING``
and lazily inside a function (a lazy import hides a cycle; it does not remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "nvmet"


def module_name(root: Path, path: Path) -> str:
    """The dotted name of ``path`` in the package at ``root``."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports."""
    paths = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # ``from . import x``: the submodule x, or a name of the package itself
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                             for a in node.names)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_nvmet_has_no_import_cycle() -> None:
    graph = imports(PACKAGE)
    assert "nvmet.reader" in graph and "nvmet.model" in graph["nvmet.reader"]
    assert cycles(graph) == [], {m: sorted(graph[m]) for c in cycles(graph) for m in c}


def test_a_lazy_or_type_checking_import_is_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g()\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import pkg.c\nfrom .a import f as h\n")
    (pkg / "e.py").write_text("from pkg import f\n")
    graph = imports(pkg)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"},
                     "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.a", "pkg.c"}, "pkg.e": {"pkg"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
