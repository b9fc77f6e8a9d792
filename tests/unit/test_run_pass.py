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

        def records(self) -> dict:
            return {}

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


def test_a_pass_forgets_what_a_killed_detach_left_of_a_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed right after recording a pool's detach, a pass left the pool's rendered
    engine configs and records; the next pass no longer knows the pool and must still
    remove them (the crash matrix's teardown found a vLLM config left behind). What is
    configured, still recorded as attached, or not named like a pool stays."""
    class Initiator:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def detach_removed(self) -> list[str]:
            return []

        def records(self) -> dict:
            return {"kept": object()}

        def attach_configured(self) -> list:
            return []

    class Target:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def run(self) -> None:
            pass

    monkeypatch.setattr(target_reconcile, "TargetPass", Target)
    state = tmp_path / "state"
    for pool in ("gone", "kept", "Not_A_Pool"):
        (state / "engines" / pool / "vllm").mkdir(parents=True)
        (state / "engines" / pool / "vllm" / "vllm-kv-transfer-config.json").write_text("{}")
        for sub in ("probes", "quota", "cleaner"):
            (state / sub).mkdir(exist_ok=True)
            (state / sub / f"{pool}.json").write_text("[]")
    monkeypatch.setattr(initiator_reconcile, "InitiatorPass", Initiator)
    cfg = parse_config(f"version: 1\nnode: {{name: n, state_dir: {state}, "
                       f"run_dir: {tmp_path}/run}}\n", "test.yaml")
    planned = reconcile.run_pass(cfg, dry_run=True)
    assert (state / "engines/gone").exists(), "plan changes nothing"
    assert planned.ok
    result = reconcile.run_pass(cfg, dry_run=False)
    assert result.ok, result.errors
    assert not (state / "engines/gone").exists()
    assert not [p for p in state.rglob("gone.json")]
    for pool in ("kept", "Not_A_Pool"):
        assert (state / "engines" / pool / "vllm").is_dir()
        for sub in ("probes", "quota", "cleaner"):
            assert (state / sub / f"{pool}.json").exists()
    assert [a.subject for a in result.actions if a.kind == "engine.unrender"] == [
        str(state / "engines/gone")]


def test_an_attach_pass_attaches_the_named_pools_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What kvagent run does on device events: the named initiator pools are attached;
    nothing is detached or forgotten and the storage side is not touched."""
    calls: list[object] = []

    class Initiator:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def detach_removed(self) -> list[str]:
            calls.append("initiator.detach")
            return []

        def attach(self, pools) -> list:  # type: ignore[no-untyped-def]
            calls.append(("initiator.attach", [p.name for p in pools]))
            return []

        def attach_configured(self) -> list:
            calls.append("initiator.attach_configured")
            return []

    class Target:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def run(self) -> None:
            calls.append("target")

    monkeypatch.setattr(initiator_reconcile, "InitiatorPass", Initiator)
    monkeypatch.setattr(target_reconcile, "TargetPass", Target)
    cfg = parse_config(f"""version: 1
node: {{name: n, state_dir: {tmp_path}/state, run_dir: {tmp_path}/run}}
initiator:
  pools:
    - {{name: a, target: {{transport: tcp, address: 192.0.2.1}}, mount: {tmp_path}/a}}
    - {{name: b, target: {{transport: tcp, address: 192.0.2.2}}, mount: {tmp_path}/b}}
""", "test.yaml")
    result = reconcile.run_pass(cfg, dry_run=False, attach_only=("b",))
    assert result.ok
    assert calls == [("initiator.attach", ["b"])]
