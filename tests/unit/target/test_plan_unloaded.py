"""Planning on a host where the kernel target is not loaded yet."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent.config import parse_config
from agent.result import RunResult
from agent.target.reconcile import TargetPass
from nvmet.configfs import RealConfigFS
from tests.unit.fakerunner import FakeRunner

HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def cfg(tmp: Path):
    return parse_config(yaml.safe_dump({
        "version": 1, "node": {"name": "stor", "state_dir": str(tmp / "state")},
        "target": {
            "ports": [{"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
            "pools": [{"name": "kv", "backing": {"kind": "file", "directory": str(tmp / "f")},
                       "namespaces": {"count": 1, "size": "4MiB"}, "ports": ["lo"],
                       "hosts": [{"name": "gpu", "nqn": HOST}]}]}}))


def test_plan_without_nvmet_shows_everything_from_an_empty_tree(tmp_path: Path) -> None:
    result = RunResult(dry_run=True)
    runner = FakeRunner()  # planning runs nothing
    TargetPass(cfg(tmp_path), runner, result, fs=RealConfigFS(tmp_path / "no-nvmet"),
               dry_run=True).run()
    assert result.ok, result.errors
    kinds = [(a.kind, a.subject) for a in result.actions]
    assert kinds[0] == ("modprobe", "nvmet")
    assert ("nvmet.mkdir", "subsystems/nqn.2026-11.io.kvagent:stor:kv:gpu") in kinds
    assert ("nvmet.symlink", "ports/1/subsystems/nqn.2026-11.io.kvagent:stor:kv:gpu") in kinds
    assert runner.calls == [] and not (tmp_path / "f").exists()


def test_apply_without_nvmet_is_an_error_with_the_fix(tmp_path: Path) -> None:
    result = RunResult(dry_run=False)
    TargetPass(cfg(tmp_path), FakeRunner().on(["modprobe"]), result,
               fs=RealConfigFS(tmp_path / "no-nvmet")).run()
    (error,) = result.errors
    assert "not available" in error.message and "modprobe nvmet" in error.hint
