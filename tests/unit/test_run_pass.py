"""The order of one reconcile pass over both roles (agent.reconcile.run_pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import reconcile
from agent.config import parse_config
from agent.initiator import reconcile as initiator_reconcile
from agent.target import reconcile as target_reconcile


def test_detach_runs_before_the_target_unexports(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with both roles dropping a pool from both: unmount while the target answers.

    Unexporting first leaves the mount on a controller that retries forever (the default
    ctrl_loss_tmo for KV pools), and umount then hangs; the lab's teardown found it.
    """
    calls: list[str] = []

    class Initiator:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def detach_removed(self) -> list[str]:
            calls.append("initiator.detach")
            return []

        def attach_configured(self) -> list:
            calls.append("initiator.attach")
            return []

    class Target:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def run(self) -> None:
            calls.append("target")

    monkeypatch.setattr(initiator_reconcile, "InitiatorPass", Initiator)
    monkeypatch.setattr(target_reconcile, "TargetPass", Target)
    cfg = parse_config(f"version: 1\nnode: {{name: n, state_dir: {tmp_path}/state, "
                       f"run_dir: {tmp_path}/run}}\n", "test.yaml")
    for dry_run in (True, False):
        calls.clear()
        result = reconcile.run_pass(cfg, dry_run=dry_run)
        assert calls == ["initiator.detach", "target", "initiator.attach"]
        assert result.dry_run is dry_run
