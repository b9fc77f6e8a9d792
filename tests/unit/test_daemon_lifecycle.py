"""The agent's lifecycle: an unexpected error fails one pass (counted), SIGTERM ends a pass."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent import daemon, progress
from agent.config import load_config
from agent.daemon import Agent
from agent.errors import KvagentError
from agent.health.metrics import render_metrics
from agent.health.notify import Notifier
from agent.health.snapshot import ApplySummary, Snapshot, host_problems
from agent.health.status import to_status_json
from agent.result import RunResult
from tests.unit.fakerunner import FakeRunner
from tests.unit.test_daemon import free_port, write_config


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Agent:
    monkeypatch.setattr(progress, "tracker", progress.Tracker())
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    return Agent(str(config), load_config(config), runner=FakeRunner(),
                 notifier=Notifier(env={}))


def counter(snap: Snapshot | None, name: str) -> float:
    for family in text_string_to_metric_families(render_metrics(snap).decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not exported")


def test_an_unexpected_error_escaping_a_pass_fails_that_pass_and_the_next_recovers(
        agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    real = daemon.run_pass
    calls: list[int] = []

    def buggy_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise LookupError("a bug outside KvagentError and OSError")
        return real(*args, **kwargs)

    monkeypatch.setattr(daemon, "run_pass", buggy_once)
    with capture_logs() as logs:
        outcome = agent.reconcile()
    assert isinstance(outcome, KvagentError) and "unexpected error: LookupError" in outcome.message
    assert agent.counters.unexpected_errors == 1 and agent.counters.apply_failures == 1
    snap = agent.store.get()
    assert snap is not None and snap.last_apply is not None and not snap.last_apply.ok
    assert counter(snap, "kvagent_apply_unexpected_errors_total") == 1
    assert to_status_json(snap)["counters"]["unexpected_errors"] == 1
    assert any("unexpected error(s)" in p for p in host_problems(snap))
    (entry,) = [e for e in logs if e["event"] == "unexpected error in the apply pass"]
    assert entry["log_level"] == "error" and isinstance(entry["exc_info"], LookupError), \
        "logged at error level with the exception (format_exc_info renders its traceback)"

    assert isinstance(agent.reconcile(), RunResult), "the next pass runs"
    snap = agent.store.get()
    assert snap is not None and snap.last_apply is not None and snap.last_apply.ok
    assert agent.counters.unexpected_errors == 1, "a counter: it stays"


def test_the_agents_passes_do_not_wait_for_reconnecting_controllers(
        agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass the agent runs (full, attach, heal) fails a reconnecting pool at once
    rather than holding the loop for initiator.device_wait."""
    seen: list[bool] = []

    def recording(*_args, **kwargs) -> RunResult:  # type: ignore[no-untyped-def]
        seen.append(kwargs["wait_reconnects"])
        return RunResult(dry_run=False)

    monkeypatch.setattr(daemon, "run_pass", recording)
    agent.reconcile()
    agent.reconcile(attach_only=("kv",), rediscover=False)
    agent.reconcile(target_only=True)
    assert seen == [False, False, False]


def test_contained_unexpected_errors_are_counted(agent: Agent,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def contained(*_args, **_kwargs) -> RunResult:  # type: ignore[no-untyped-def]
        result = RunResult(dry_run=False)
        result.unexpected("target", "kv", ZeroDivisionError("a bug"))
        result.error("initiator", "other", "an expected failure")
        return result

    monkeypatch.setattr(daemon, "run_pass", contained)
    agent.reconcile()
    assert agent.counters.unexpected_errors == 1
    snap = agent.store.get()
    assert snap is not None and snap.last_apply is not None and snap.last_apply.unexpected == 1
    assert to_status_json(snap)["last_apply"]["unexpected_errors"] == 1


def test_sigterm_during_a_pass_stops_it_and_the_loop(agent: Agent,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler sets the stop flag: the pass ends at its next step boundary (Stopping,
    not a pool failure), nothing else runs, and run() returns 0."""
    entered = threading.Event()

    def long_pass(*_args, **_kwargs) -> RunResult:  # type: ignore[no-untyped-def]
        entered.set()
        with progress.step("command lvcreate", bound=120):
            progress.sleep(60)  # a long step; SIGTERM ends it
        raise AssertionError("the pass went on after SIGTERM")

    monkeypatch.setattr(daemon, "run_pass", long_pass)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    thread.start()
    assert entered.wait(20)
    agent._stop_requested()  # what the SIGTERM handler calls
    thread.join(20)
    assert not thread.is_alive() and codes == [0]
    assert agent.counters.apply_runs == 0 and agent.counters.apply_failures == 0, \
        "a stopped pass is not a failed pass"


def test_host_problems_show_errors_of_pools_not_listed() -> None:
    """A pool the config dropped whose detach was refused has no pool line: say it anyway."""
    apply = ApplySummary(0.0, False, 0, 1, 1.0, (
        ("initiator", "gone", "not unmounting /mnt/gone/ns1 of pool gone: no controller of "
         "the pool is live"),))
    problems = host_problems(Snapshot(0.0, 0.0, "n", last_apply=apply))
    assert any(p.startswith("apply: initiator pool gone: not unmounting") for p in problems)


def test_a_real_agent_pings_through_a_long_step_and_stops_within_its_bound(
        tmp_path: Path) -> None:
    """``kvagent run`` as a process, with real signals: an apply request that waits for a
    held lock is a step longer than the watchdog (pings go on), and SIGTERM during it
    ends the agent within the stop bound (exit 0). No roles: nothing touches the host."""
    import itertools
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from agent import daemonfiles
    from agent.lock import apply_lock
    from agent.progress import EXIT_BOUND, STOP_POLL
    from agent.system.run import KILL_GRACE

    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    sock_path = tmp_path / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(60)
    watchdog = 2.0
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path),
           "WATCHDOG_USEC": str(int(watchdog * 1e6))}
    env.pop("KVAGENT_FAILPOINTS", None)
    proc = subprocess.Popen([sys.executable, "-m", "agent", "-c", str(config), "run"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pings: list[float] = []

    def receive_until(field: str) -> None:
        while True:
            message = sock.recv(4096).decode().split("\n")
            if "WATCHDOG=1" in message:
                pings.append(time.monotonic())
            if field in message:
                return

    try:
        receive_until("READY=1")
        run_dir = tmp_path / "run"
        with apply_lock(run_dir):  # held: the agent's pass waits for it (a bounded step)
            daemonfiles.new_request(run_dir, wait=True)
            proc.send_signal(signal.SIGHUP)
            receive_until("RELOADING=1")
            waiting = time.monotonic()
            while time.monotonic() - waiting < 3 * watchdog:  # a step past the watchdog
                receive_until("WATCHDOG=1")
            gaps = [b - a for a, b in itertools.pairwise(pings)]
            assert max(gaps) < watchdog, f"gaps between pings: {gaps}"
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            took = time.monotonic() - stopped
        assert took <= STOP_POLL + KILL_GRACE + EXIT_BOUND, f"stopped after {took:.1f}s"
        assert b"pass stopped at a step boundary" in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
