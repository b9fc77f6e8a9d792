"""Passes skipped because the apply lock is held: counted, logged, degraded, named.

Before: a held lock made every pass skip silently (logged at info, /healthz and
/readyz green, nothing in kvagent status).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import structlog
from click.testing import CliRunner
from prometheus_client import generate_latest

from agent.cli.main import main
from agent.config import load_config
from agent.daemon import Agent
from agent.daemonfiles import BUSY_RECORD, read_busy
from agent.health.metrics import build_registry
from agent.health.notify import Notifier
from agent.health.server import ready_check
from agent.health.snapshot import BUSY_PASSES_DEGRADED, host_problems, overall_state
from agent.health.status import load_status_schema, to_status_json
from tests.unit.fakerunner import FakeRunner

from .lockholders import NOBODY, holding, needs_root, old_layout, world_readable_dir


def write_config(path: Path, tmp: Path, run_dir: Path) -> Path:
    path.write_text(f"""
version: 1
node: {{name: unit, state_dir: {tmp}/state, run_dir: {run_dir}, sysfs: {tmp}/sys,
        configfs: {tmp}/configfs}}
health: {{listen: "127.0.0.1:9"}}
""")
    return path


def agent_for(tmp: Path, run_dir: Path | None = None) -> Agent:
    run_dir = run_dir or tmp / "run"
    config = write_config(tmp / "kvagent.yaml", tmp, run_dir)
    return Agent(str(config), load_config(config), runner=FakeRunner(),
                 notifier=Notifier(env={}))


def metric(name: str, agent: Agent) -> float:
    text = generate_latest(build_registry(agent.store.get)).decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


SKIPPED = "apply skipped: another process holds the apply lock"


def reconcile_logged(agent: Agent, levels: list[str]) -> None:
    """One pass; the levels of its "apply skipped" log entries are appended to ``levels``."""
    with structlog.testing.capture_logs() as entries:
        agent.reconcile()
    levels += [e["log_level"] for e in entries if e["event"] == SKIPPED]


def cli_status(config: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["-c", str(config), "status", "--no-drives", "-o", "json"])
    doc = json.loads(result.stdout)
    schema = load_status_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(doc)
    return result.exit_code, doc


def test_busy_passes_counted_degrade_after_n_and_clear(tmp_path: Path) -> None:
    agent = agent_for(tmp_path)
    run = tmp_path / "run"
    agent.reconcile()  # creates the run dir and the lock file
    assert agent.counters.apply_runs == 1
    levels: list[str] = []
    with holding(run / "apply.lock") as holder:
        for n in range(1, BUSY_PASSES_DEGRADED + 1):
            reconcile_logged(agent, levels)
            snap = agent.store.get()
            assert agent.counters.apply_busy == n and agent.counters.apply_busy_passes == n
            assert snap.apply_busy is not None and snap.apply_busy.passes == n
            assert snap.apply_busy.holder is not None and snap.apply_busy.holder.pid == holder.pid
            stuck = n >= BUSY_PASSES_DEGRADED
            assert (overall_state(snap) == "degraded") is stuck
            assert (ready_check(snap)[0] == 503) is stuck
        code, body = ready_check(agent.store.get())
        assert code == 503 and f"held by pid {holder.pid}, user root" in body
        problems = host_problems(agent.store.get())
        assert any(p.startswith(f"apply: {BUSY_PASSES_DEGRADED} pass(es) in a row skipped")
                   and f"pid {holder.pid}" in p for p in problems), problems
        assert metric("kvagent_apply_busy_total", agent) == BUSY_PASSES_DEGRADED
        assert metric("kvagent_apply_busy_passes", agent) == BUSY_PASSES_DEGRADED
        # kvagent status from the CLI (not the agent) reads the agent's record.
        record = read_busy(run)
        assert record is not None and record.passes == BUSY_PASSES_DEGRADED
        code, doc = cli_status(tmp_path / "kvagent.yaml")
        assert code == 1 and doc["state"] == "degraded"
        assert doc["apply_busy"]["passes"] == BUSY_PASSES_DEGRADED
        assert doc["apply_busy"]["holder"]["pid"] == holder.pid
        assert any(f"pid {holder.pid}" in p for p in doc["problems"])
    assert levels == ["info"] + ["warning"] * (BUSY_PASSES_DEGRADED - 1)

    agent.reconcile()  # the holder is gone: the pass runs
    snap = agent.store.get()
    assert agent.counters.apply_busy == BUSY_PASSES_DEGRADED
    assert agent.counters.apply_busy_passes == 0 and snap.apply_busy is None
    assert overall_state(snap) == "ok" and ready_check(snap)[0] == 200
    assert metric("kvagent_apply_busy_passes", agent) == 0
    assert not (run / BUSY_RECORD).exists()
    code, doc = cli_status(tmp_path / "kvagent.yaml")
    assert code == 0 and doc["apply_busy"] is None and doc["state"] == "ok"


def test_busy_record_of_a_dead_agent_is_ignored(tmp_path: Path) -> None:
    agent = agent_for(tmp_path)
    agent.reconcile()
    with holding(tmp_path / "run" / "apply.lock"):
        for _ in range(BUSY_PASSES_DEGRADED):
            agent.reconcile()
    record = json.loads((tmp_path / "run" / BUSY_RECORD).read_text())
    assert record["pid"] == os.getpid()
    record["pid"] = 2**22 + 1  # above pid_max's default: no such process
    (tmp_path / "run" / BUSY_RECORD).write_text(json.dumps(record))
    assert read_busy(tmp_path / "run") is None
    code, doc = cli_status(tmp_path / "kvagent.yaml")
    assert code == 0 and doc["apply_busy"] is None


def test_foreign_holder_degrades_at_once_in_agent_and_cli() -> None:
    """A holder that is not kvagent's user (nobody) is a problem from the first pass."""
    needs_root()
    with world_readable_dir() as root:
        run = root / "run"
        lock = old_layout(run)
        config = write_config(root / "kvagent.yaml", root, run)
        # Only the CLI, no agent: status probes the lock itself.
        with holding(lock, user=NOBODY) as holder:
            code, doc = cli_status(config)
            assert code == 1 and doc["state"] == "degraded"
            assert doc["apply_busy"]["passes"] == 0
            assert doc["apply_busy"]["holder"] == {
                "pid": holder.pid, "uid": NOBODY, "user": "nobody",
                "command": doc["apply_busy"]["holder"]["command"], "foreign": True}
            assert any(f"held by pid {holder.pid}, user nobody" in p and "not kvagent's user"
                       in p for p in doc["problems"]), doc["problems"]
            text = CliRunner().invoke(main, ["-c", str(config), "status", "--no-drives"])
            assert f"apply lock: held by pid {holder.pid}, user nobody" in text.stdout

            agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                          notifier=Notifier(env={}))
            levels: list[str] = []
            reconcile_logged(agent, levels)
            snap = agent.store.get()
            assert snap.apply_busy is not None and snap.apply_busy.passes == 1
            assert overall_state(snap) == "degraded" and ready_check(snap)[0] == 503
        assert levels == ["warning"]
        code, doc = cli_status(config)
        assert doc["apply_busy"]["passes"] == 1, "the agent's record until its next pass"
        agent.reconcile()
        assert agent.store.get().apply_busy is None
        code, doc = cli_status(config)
        assert code == 0 and doc["apply_busy"] is None


def test_kvagent_apply_holding_the_lock_is_not_a_problem_for_status(tmp_path: Path) -> None:
    """A root (kvagent) holder and no agent record: an apply is running, nothing wrong."""
    config = write_config(tmp_path / "kvagent.yaml", tmp_path, tmp_path / "run")
    CliRunner().invoke(main, ["-c", str(config), "apply"])
    with holding(tmp_path / "run" / "apply.lock"):
        code, doc = cli_status(config)
    assert code == 0 and doc["apply_busy"] is None


@pytest.mark.parametrize("passes", [1, BUSY_PASSES_DEGRADED])
def test_status_json_with_busy_matches_schema(tmp_path: Path, passes: int) -> None:
    agent = agent_for(tmp_path)
    agent.reconcile()
    with holding(tmp_path / "run" / "apply.lock"):
        for _ in range(passes):
            agent.reconcile()
    doc = to_status_json(agent.store.get())
    schema = load_status_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(doc)
    assert doc["counters"]["apply_busy"] == passes == doc["counters"]["apply_busy_passes"]
    assert doc["apply_busy"]["stuck"] is (passes >= BUSY_PASSES_DEGRADED)
