"""kvagent apply while the agent runs: the agent reloads and applies, the CLI reports it.

Before: apply ran beside the agent, which re-applied its old config at its next
pass. These tests start a real ``kvagent run`` (a config without roles needs no
kernel) or drive the agent in-process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import daemonfiles
from agent.cli import delegate
from agent.cli.main import main
from agent.config import load_config
from agent.daemon import Agent
from agent.daemonfiles import DAEMON_RECORD, STATUS_SOCKET, live_daemon, register_daemon
from agent.health.notify import Notifier
from agent.lock import apply_lock
from agent.rundir import process_start_time
from tests.unit.fakerunner import FakeRunner

ROOT = Path(__file__).resolve().parents[2]
HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_text(tmp: Path, port: int, *, name: str = "unit", run_dir: Path | None = None,
                interval: str = "1s") -> str:
    return f"""
version: 1
node: {{name: {name}, state_dir: {tmp}/state, run_dir: {run_dir or tmp / "run"},
        sysfs: {tmp}/sys, configfs: {tmp}/configfs}}
health: {{listen: "127.0.0.1:{port}", interval: {interval}, full_interval: {interval}}}
"""


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metric_line(port: int, prefix: str) -> str | None:
    text = get(f"http://127.0.0.1:{port}/metrics")[1]
    return next((ln for ln in text.splitlines() if ln.startswith(prefix)), None)


def kvagent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, check=False, env=env)


class RunningAgent:
    """A ``kvagent run`` subprocess with its own config and health port."""

    def __init__(self, tmp: Path, config: Path, port: int):
        self.tmp, self.config, self.port = tmp, config, port
        self.log = open(tmp / "agent.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "agent", "-c", str(config), "run"],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_for(lambda: self.proc.poll() is not None or
                 get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "the agent to be ready")
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        return (self.tmp / "agent.log").read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.log.close()
        return code


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningAgent]:
    port = free_port()
    config = tmp_path / "kvagent.yaml"
    config.write_text(config_text(tmp_path, port))
    agent = RunningAgent(tmp_path, config, port)
    try:
        yield agent
    finally:
        agent.stop()
        print(agent.output()[-3000:])


def test_apply_makes_the_running_agent_reload_and_reports_its_pass(
        running: RunningAgent) -> None:
    record = json.loads((running.tmp / "run" / DAEMON_RECORD).read_text())
    assert record["pid"] == running.proc.pid and record["config"] == str(running.config)
    assert oct((running.tmp / "run" / DAEMON_RECORD).stat().st_mode & 0o777) == "0o600"
    assert metric_line(running.port, 'kvagent_node_info{node="unit"}')

    running.config.write_text(config_text(running.tmp, running.port, name="edited"))
    done = kvagent("-c", str(running.config), "-o", "json", "apply")
    assert done.returncode == 0, done.stderr
    assert f"the agent (pid {running.proc.pid}) runs with {running.config}" in done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"changed", "ok", "dry_run", "actions", "errors", "warnings",
                           "configfs_writes", "started_at", "finished_at"}
    assert result["ok"] is True and result["dry_run"] is False
    # The agent runs the new config now, and keeps it across its next passes (1s interval).
    assert metric_line(running.port, 'kvagent_node_info{node="edited"}')
    assert metric_line(running.port, "kvagent_config_reloads_total 1.0")
    runs = float(metric_line(running.port, "kvagent_apply_runs_total").split()[1])
    wait_for(lambda: float(metric_line(running.port, "kvagent_apply_runs_total").split()[1])
             >= runs + 2, 30, "two more passes")
    assert metric_line(running.port, 'kvagent_node_info{node="edited"}')
    assert not list((running.tmp / "run").glob("apply-re*")), "requests and results cleaned"

    text = kvagent("-c", str(running.config), "apply")
    assert text.returncode == 0 and text.stdout.startswith("nothing changed: converged")


def test_invalid_config_is_refused_before_the_agent_is_asked(running: RunningAgent) -> None:
    running.config.write_text(config_text(running.tmp, running.port, name="NOT VALID"))
    done = kvagent("-c", str(running.config), "apply")
    assert done.returncode == 2
    assert "kvagent: config error:" in done.stderr and "node.name" in done.stderr
    time.sleep(0.5)
    assert metric_line(running.port, "kvagent_config_reloads_total 0.0"), "not signalled"
    assert metric_line(running.port, 'kvagent_node_info{node="unit"}')


def test_apply_of_another_config_file_is_refused(running: RunningAgent) -> None:
    other = running.tmp / "other.yaml"
    other.write_text(config_text(running.tmp, running.port, name="other"))
    done = kvagent("-c", str(other), "apply")
    assert done.returncode == 2
    assert (f"the agent (kvagent run, pid {running.proc.pid}) runs with the config "
            f"{running.config}, not {other}") in done.stderr
    assert "Traceback" not in done.stderr
    assert metric_line(running.port, "kvagent_config_reloads_total 0.0")
    assert metric_line(running.port, "kvagent_apply_runs_total")
    # --dry-run never involves the agent, whatever the file.
    assert kvagent("-c", str(other), "apply", "--dry-run").returncode == 0


def test_busy_answer_and_wait_through_the_agent(running: RunningAgent) -> None:
    """The agent's pass meets a held lock: apply fails as busy; --wait queues behind it."""
    run = running.tmp / "run"
    with apply_lock(run):
        busy = kvagent("-c", str(running.config), "apply")
    assert busy.returncode == 1
    assert f"another kvagent apply is running (pid {os.getpid()}, " in busy.stderr

    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with apply_lock(run):
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    threading.Timer(1.5, release.set).start()
    waited = kvagent("-c", str(running.config), "-o", "json", "apply", "--wait")
    t.join(30)
    assert not t.is_alive(), "the lock holder's thread did not end"
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["ok"] is True


def test_agent_record_removed_on_clean_exit_and_one_agent_per_run_dir(
        running: RunningAgent) -> None:
    second = kvagent("-c", str(running.config), "run")
    assert second.returncode == 1
    assert f"another kvagent run (pid {running.proc.pid}" in second.stderr
    assert running.stop() == 0
    assert not (running.tmp / "run" / DAEMON_RECORD).exists()


def test_stale_agent_record_is_ignored(tmp_path: Path) -> None:
    config = tmp_path / "kvagent.yaml"
    config.write_text(config_text(tmp_path, free_port()))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid, start in ((dead.pid, None), (os.getpid(), 1)):  # gone; pid reused by another
        (run / DAEMON_RECORD).write_text(json.dumps(
            {"pid": pid, "start_time": start, "config": str(config), "started_at": 0}))
        (run / DAEMON_RECORD).chmod(0o600)
        assert live_daemon(run) is None
        done = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "apply"])
        assert done.exit_code == 0, done.output
        assert "asked it to reload" not in done.output
        assert json.loads(done.stdout)["ok"] is True


# ------------------------------------------------------- in-process agent
def in_process(tmp: Path, monkeypatch: pytest.MonkeyPatch,
               before_reload=None) -> Agent:  # type: ignore[no-untyped-def]
    """An agent in this process; the CLI's SIGHUP runs its reload synchronously."""
    config = tmp / "kvagent.yaml"
    config.write_text(config_text(tmp, free_port()))
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    register_daemon(agent.run_dir, str(config))

    def kill(pid: int, sig: int) -> None:
        assert (pid, sig) == (os.getpid(), signal.SIGHUP)
        if before_reload:
            before_reload()
        agent.reload()

    monkeypatch.setattr(delegate.os, "kill", kill)
    return agent


def test_reload_answers_with_the_pass_result_tagged_by_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = in_process(tmp_path, monkeypatch)
    config = tmp_path / "kvagent.yaml"
    config.write_text(config_text(tmp_path, free_port(), name="second"))
    done = CliRunner().invoke(main, ["-c", str(config), "apply"])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("nothing changed: converged")
    assert agent.cfg.node.name == "second" and agent.counters.apply_runs == 1


def test_config_broken_after_the_check_gets_the_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "kvagent.yaml"
    agent = in_process(tmp_path, monkeypatch, before_reload=lambda: config.write_text(
        config_text(tmp_path, 9, name="BROKEN NAME")))
    done = CliRunner().invoke(main, ["-c", str(config), "apply"])
    assert done.exit_code == 2
    assert "kvagent: config error:" in done.stderr and "node.name" in done.stderr
    assert "the agent keeps running its previous config" in done.stderr
    assert agent.cfg.node.name == "unit" and agent.config_error


def test_wait_is_bounded_and_notices_a_dead_agent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ignoring = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                 "signal.signal(signal.SIGHUP, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE, text=True)
    # SIGHUP's default action set explicitly: a test run under nohup passes SIG_IGN down.
    dying = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                              "print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        for proc in (ignoring, dying):
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        config = tmp_path / "kvagent.yaml"
        config.write_text(config_text(tmp_path, free_port()))
        cfg = load_config(config)
        for proc, words in ((ignoring, "has not answered apply request"),
                            (dying, "exited before it answered")):
            daemonfiles._write(run, DAEMON_RECORD, {
                "pid": proc.pid, "start_time": process_start_time(proc.pid),
                "config": str(config), "started_at": 0})
            with pytest.raises(Exception) as err:
                delegate.delegate_apply(cfg, config, wait=False, timeout=1.0)
            assert words in str(err.value)
    finally:
        for proc in (ignoring, dying):
            proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()


def test_pool_destroy_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "kvagent.yaml"
    config.write_text(config_text(tmp_path, free_port()))
    calls: list[bool] = []

    def destroy(cfg, name, runner, *, yes, fs):  # type: ignore[no-untyped-def]
        try:
            with apply_lock(cfg.node.run_dir):
                calls.append(False)
        except Exception:
            calls.append(True)  # Busy: the command holds the lock around the deletion
        return {"pool": name, "destroyed": yes, "logical_volumes": [], "files": [],
                "device_claims": []}

    from agent.target import inventory

    monkeypatch.setattr(inventory, "_destroy", destroy)
    monkeypatch.setattr(inventory, "DESTROY_LOCK_WAIT", 0.5)
    done = CliRunner().invoke(main, ["-c", str(config), "pool", "destroy", "kv", "--yes"])
    assert done.exit_code == 0, done.output
    assert calls == [True]
    with apply_lock(tmp_path / "run"):
        busy = CliRunner().invoke(main, ["-c", str(config), "pool", "destroy", "kv", "--yes"])
    assert busy.exit_code == 1 and calls == [True], "nothing destroyed while busy"
    assert "kvagent: pool destroy waits for the apply lock (held by pid" in busy.stderr
    assert "gave up after 0.5s waiting for the apply lock" in busy.stderr


def test_rebind_and_wait_travel_with_the_request(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """apply --rebind POOL --wait through the agent: its pass gets both, that pass only."""
    agent = in_process(tmp_path, monkeypatch)
    config = tmp_path / "kvagent.yaml"
    config.write_text(config_text(tmp_path, free_port()) + f"""
target:
  ports: [{{name: lo, id: 1, transport: tcp, address: 127.0.0.1}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {tmp_path}/files}}
      namespaces: {{count: 1, size: 64MiB}}
      ports: [lo]
      hosts: [{{name: h1, nqn: "{HOST}"}}]
""")
    seen: list[dict] = []

    def fake_pass(cfg, **kwargs):  # type: ignore[no-untyped-def]
        from agent.result import RunResult

        seen.append({k: kwargs[k] for k in ("wait_for_lock", "rebind")})
        result = RunResult(dry_run=False)
        result.finished_at = time.time()
        return result

    monkeypatch.setattr("agent.daemon.run_pass", fake_pass)
    done = CliRunner().invoke(main, ["-c", str(config), "apply", "--rebind", "kv", "--wait"])
    assert done.exit_code == 0, done.output
    assert seen == [{"wait_for_lock": True, "rebind": ("kv",)}]
    agent.reconcile()  # the agent's next pass on its own: neither
    assert seen[-1] == {"wait_for_lock": False, "rebind": ()}


def test_agent_record_follows_a_reloaded_run_dir(tmp_path: Path) -> None:
    config = tmp_path / "kvagent.yaml"
    port = free_port()
    config.write_text(config_text(tmp_path, port, interval="1h"))
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    wait_for(lambda: live_daemon(tmp_path / "run"), 30, "the agent's record")
    config.write_text(config_text(tmp_path, port, interval="1h", run_dir=tmp_path / "run2"))
    agent.events.put("reload")
    wait_for(lambda: live_daemon(tmp_path / "run2"), 30, "the record in the new run dir")
    assert live_daemon(tmp_path / "run") is None
    assert not (tmp_path / "run" / DAEMON_RECORD).exists()
    # the status socket moves with it
    wait_for(lambda: (tmp_path / "run2" / STATUS_SOCKET).exists(), 30, "the new socket")
    assert not (tmp_path / "run" / STATUS_SOCKET).exists()
    served = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "status"])
    assert json.loads(served.stdout)["collected"]["source"] == "agent", served.output
    agent.events.put("stop")
    thread.join(timeout=30)
    assert not (tmp_path / "run2" / DAEMON_RECORD).exists()
    assert not (tmp_path / "run2" / STATUS_SOCKET).exists()
