"""The GPU pass reads as stages: agent/initiator/reconcile.py is the short orchestration,
and the stage modules (agent/initiator/stages/) never reach back up into it nor into
each other (what two stages share lives below them: context, tlskeys)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
INITIATOR = REPO / "agent/initiator"
STAGES = INITIATOR / "stages"
ORCHESTRATION = "agent.initiator.reconcile"
#: The modules of agent/initiator/stages/ that are not stages: what the stages share.
SHARED = frozenset({"agent.initiator.stages", "agent.initiator.stages.context",
                    "agent.initiator.stages.tlskeys"})
MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module the file ``path`` imports."""
    package = module_name(path) if path.name == "__init__.py" else \
        module_name(path).rpartition(".")[0]
    return imports_of(path.read_text(), package)


def imports_of(source: str, package: str) -> set[str]:
    """Every module ``source``, a module of ``package``, imports (relative imports
    resolved; ``from X import y`` counts as X and as X.y, since y may be a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return out


STAGE_FILES = sorted(STAGES.glob("*.py"))


def test_the_orchestration_stays_short() -> None:
    lines = len((INITIATOR / "reconcile.py").read_text().splitlines())
    assert lines < MAX_LINES, (f"agent/initiator/reconcile.py has {lines} lines: move the "
                               "work into a stage (agent/initiator/stages/)")


def test_there_are_stages() -> None:
    names = {module_name(p) for p in STAGE_FILES} - SHARED
    assert {f"agent.initiator.stages.{s}" for s in (
        "discover", "connect", "find", "layout", "filesystem", "mount", "handoff")} <= names


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: p.name)
def test_no_stage_imports_the_orchestration(path: Path) -> None:
    bad = {m for m in imported(path)
           if m == ORCHESTRATION or m.startswith(ORCHESTRATION + ".")}
    assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: p.name)
def test_no_stage_imports_another(path: Path) -> None:
    me = module_name(path)
    stages = {module_name(p) for p in STAGE_FILES} - SHARED
    bad = {m for m in imported(path) if m in stages and m != me}
    if me in SHARED:  # what the stages share imports none of them either
        bad |= {m for m in imported(path) if m in stages}
    assert not bad, (f"{path.relative_to(REPO)} imports {sorted(bad)}: move what two "
                     "stages share into a module below them")


def test_the_check_sees_each_form_of_import() -> None:
    """The resolver finds the orchestration and a sibling stage however they are named."""
    package = "agent.initiator.stages"
    for source in ("from ..reconcile import InitiatorPass", "from .. import reconcile",
                   "import agent.initiator.reconcile",
                   "from agent.initiator.reconcile import load_state"):
        assert ORCHESTRATION in imports_of(source, package), source
    for source in ("from .mount import mount_volume", "from . import mount",
                   "from agent.initiator.stages import mount"):
        assert f"{package}.mount" in imports_of(source, package), source
    assert imports_of("from .context import StageContext", package) >= {
        f"{package}.context", f"{package}.context.StageContext"}
