"""The import-linter contracts in pyproject.toml hold, and they do catch a violation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, check=False)


def test_contracts_are_kept() -> None:
    proc = lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_them(tmp_path: Path) -> None:
    for name in ("agent", "nvmet"):
        shutil.copytree(REPO / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    mounts = tmp_path / "agent/initiator/mounts.py"
    mounts.write_text(mounts.read_text() + "\nfrom ..engines import dirs  # noqa\n")
    ids = tmp_path / "nvmet/ids.py"
    ids.write_text(ids.read_text() + "\nimport agent.errors  # noqa\n")
    stage = tmp_path / "agent/initiator/stages/find.py"
    stage.write_text(stage.read_text() + "\nfrom ..reconcile import load_state  # noqa\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert "0 kept, 3 broken" in proc.stdout, proc.stdout
    assert "agent.initiator.stages.find -> agent.initiator.reconcile" in proc.stdout
    assert "agent.initiator.mounts -> agent.engines" in proc.stdout
