"""Nothing in agent/initiator/nvme/ is kept for the tests alone (issue 35: the
``nvme list``/``list-subsys`` parsers were used only by their own tests).

Every public function, class and method there must be reachable from kvagent's own code
outside the package: referenced by name from another module of agent/, or from
something in the package that is. Names are matched as names (a method called
``list_ns`` anywhere keeps every ``list_ns``): loose, but it cannot call used code
unused.
"""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[3] / "agent"
PACKAGE = AGENT / "initiator" / "nvme"
#: Seams kept in the package for the tests by design (the fakes they plug in).
SEAMS = {"NoKernelLog"}


def names_used(node: ast.AST) -> set[str]:
    """Names and attributes ``node`` refers to (imports are not uses)."""
    used: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            used.add(sub.attr)
    return used


def definitions() -> dict[str, list[tuple[str, ast.AST]]]:
    """Public top-level functions and classes, and public methods, of the package:
    name -> [(where, node)]."""
    found: dict[str, list[tuple[str, ast.AST]]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if not node.name.startswith("_"):
                found.setdefault(node.name, []).append((f"{path.name}:{node.name}", node))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                        found.setdefault(item.name, []).append(
                            (f"{path.name}:{node.name}.{item.name}", item))
    return found


def test_every_public_name_of_the_nvme_package_is_used_by_kvagent() -> None:
    defined = definitions()
    roots: set[str] = set()
    for path in AGENT.rglob("*.py"):
        if path.parent != PACKAGE:
            roots |= names_used(ast.parse(path.read_text()))
    # A module's own top-level statements other than definitions and imports use names too.
    for path in PACKAGE.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Import,
                                     ast.ImportFrom)):
                roots |= names_used(node)
    reached: set[str] = set()
    todo = [n for n in defined if n in roots | SEAMS]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for _, node in defined[name]:
            # A class brings its bases, decorators, fields and private methods (__init__
            # runs when it is made); its public methods count on their own.
            body = ([*node.bases, *node.decorator_list,
                     *(item for item in node.body if not (
                         isinstance(item, ast.FunctionDef) and not item.name.startswith("_")))]
                    if isinstance(node, ast.ClassDef) else [node])
            for part in body:
                todo += [n for n in names_used(part) if n in defined and n not in reached]
    unused = sorted(where for name, places in defined.items() if name not in reached
                    for where, _ in places)
    assert unused == []
