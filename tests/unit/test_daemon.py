"""The agent loop: notify messages, reload with a broken config, stop without teardown."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import load_config
from agent.daemon import Agent
from agent.health.notify import Notifier
from tests.unit.fakerunner import FakeRunner


def write_config(path: Path, tmp: Path, port: int, *, interval: str = "30s",
                 full_interval: str = "5m") -> None:
    path.write_text(f"""
version: 1
node: {{name: unit, state_dir: {tmp}/state, run_dir: {tmp}/run, sysfs: {tmp}/sys,
        configfs: {tmp}/configfs}}
health: {{listen: "127.0.0.1:{port}", interval: {interval}, full_interval: {full_interval}}}
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def notify_socket(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.settimeout(10)
    yield path, sock
    sock.close()


def receive_until(sock: socket.socket, wanted: str) -> list[str]:
    seen = []
    while True:
        message = sock.recv(4096).decode()
        seen.append(message)
        if wanted in message.split("\n"):
            return seen


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_loop_notifies_serves_refuses_broken_reload_and_stops(tmp_path: Path,
                                                              notify_socket) -> None:
    sock_path, sock = notify_socket
    config = tmp_path / "kvagent.yaml"
    port = free_port()
    write_config(config, tmp_path, port)
    runner = FakeRunner()  # no roles and no drives: the loop must not run any command
    agent = Agent(str(config), load_config(config), runner=runner,
                  notifier=Notifier(env={"NOTIFY_SOCKET": str(sock_path),
                                         "WATCHDOG_USEC": "2000000"}))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    first = receive_until(sock, "READY=1")
    assert any("WATCHDOG=1" in m for m in first), "the supervisor pings from the start"
    assert any(m.startswith("STATUS=ok") for m in first)

    status, _body = get(f"http://127.0.0.1:{port}/healthz")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(
        get(f"http://127.0.0.1:{port}/metrics")[1])}
    assert "kvagent_last_apply_success" in families

    config.write_text("version: 1\nnode: {name: BAD NAME}\n")
    agent.events.put("reload")
    reload_messages = receive_until(sock, "READY=1")
    assert any(m.startswith("RELOADING=1") and "MONOTONIC_USEC=" in m
               for m in reload_messages)
    assert agent.config_error and "node.name" in agent.config_error
    assert agent.cfg.node.name == "unit", "the old config keeps running"
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200, "still serving"
    families = {f.name: f for f in text_string_to_metric_families(
        get(f"http://127.0.0.1:{port}/metrics")[1])}
    failures = families["kvagent_config_reload_failures"].samples[0].value
    assert failures == 1

    agent.events.put("stop")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert "STOPPING=1" in receive_until(sock, "STOPPING=1")[-1]
    assert runner.calls == []


def test_good_reload_applies_new_config(tmp_path: Path) -> None:
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    write_config(config, tmp_path, free_port(), interval="45s")
    agent.events.put("reload")
    agent.events.put("stop")
    thread.join(timeout=30)
    assert agent.cfg.health.interval == 45 and agent.config_error is None
    assert agent.counters.config_reloads == 1 and agent.counters.apply_runs == 2


STORM = """
import os, queue, signal, sys, threading, time
from agent.config import parse_config
from agent.daemon import Agent
from agent.health.notify import Notifier

agent = Agent(None, parse_config("version: 1\\nnode: {name: n}\\n"), notifier=Notifier(env={}))
agent.install_signals()
stop = time.monotonic() + 3

def storm():
    while time.monotonic() < stop:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.0001)

threading.Thread(target=storm, daemon=True).start()
got = 0
while time.monotonic() < stop:  # the loop's get(), interrupted by the handlers' put()
    try:
        got += agent.events.get(timeout=0.0001) == "reload"
    except queue.Empty:
        pass
print("survived", got)
"""


def test_event_queue_survives_a_sighup_storm() -> None:
    """kvagent apply sends SIGHUP routinely: the handler's put() may interrupt the loop's get().

    With queue.Queue the handler blocks on the lock the interrupted get() holds (a deadlock,
    or a RecursionError as more signals arrive); SimpleQueue's put is reentrant.
    """
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", STORM], capture_output=True, text=True,
                          timeout=60, check=False, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("survived ") and int(proc.stdout.split()[1]) > 0


def test_status_from_the_running_agent_and_gzip_metrics(tmp_path: Path) -> None:
    """A real loop (fake runner): kvagent status shows the agent's snapshot with its age
    and pid, --live reads here, /metrics comes gzip-compressed when asked; after the
    stop the socket is gone and kvagent status reads live."""
    import gzip
    import json
    import os
    import stat
    import time

    from click.testing import CliRunner

    from agent.cli.main import main
    from agent.daemonfiles import STATUS_SOCKET
    from agent.health.status import to_status_json

    config = tmp_path / "kvagent.yaml"
    port = free_port()
    write_config(config, tmp_path, port)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while agent.status_socket is None or agent.store.get() is None:
            assert time.monotonic() < deadline and thread.is_alive(), "no first pass"
            thread.join(0.05)
        sock = tmp_path / "run" / STATUS_SOCKET
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
        res = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "status"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["collected"]["source"] == "agent" and doc["collected"]["pid"] == os.getpid()
        assert doc["collected"]["age_seconds"] >= 0
        want = to_status_json(agent.store.get())
        assert {k: v for k, v in doc.items() if k != "collected"} == {
            k: v for k, v in want.items() if k != "collected"}
        assert doc["counters"]["apply_runs"] == agent.counters.apply_runs >= 1
        text = CliRunner().invoke(main, ["-c", str(config), "status"]).stdout
        assert f"by kvagent run (pid {os.getpid()})" in text.splitlines()[1]
        live = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "status", "--live"])
        assert json.loads(live.stdout)["collected"]["source"] == "live"
        assert live.exit_code == res.exit_code
        served = agent.status_socket.served
        assert served == 2

        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(r.read()).decode()
        families = {f.name for f in text_string_to_metric_families(body)}
        assert {"kvagent_last_apply_success", "process_resident_memory_bytes"} <= families
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert not (tmp_path / "run" / STATUS_SOCKET).exists()
    after = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "status"])
    assert json.loads(after.stdout)["collected"]["source"] == "live"


def test_local_drives_are_read_at_most_once_an_interval(tmp_path: Path) -> None:
    """A collect after a pass or on a device event keeps the drives' health read within
    health.interval (a smart-log command per drive); the periodic collect reads them."""
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port(), interval="30s")
    ctrl = tmp_path / "sys/class/nvme/nvme0"
    ctrl.mkdir(parents=True)
    (ctrl / "transport").write_text("pcie\n")
    log = (Path(__file__).parent / "health/fixtures/smart/nvme-cli-2.3-qemu.json").read_text()
    runner = FakeRunner().on(["nvme", "smart-log"], stdout=log)
    now = [100.0]
    agent = Agent(str(config), load_config(config), runner=runner,
                  notifier=Notifier(env={}), clock=lambda: now[0])
    smart = lambda: len(runner.ran("nvme", "smart-log"))  # noqa: E731
    assert [d.device for d in agent.collect().drives] == ["/dev/nvme0"] and smart() == 1
    now[0] += 10
    assert [d.device for d in agent.collect().drives] == ["/dev/nvme0"] and smart() == 1
    now[0] += 25
    agent.collect(fresh=False)
    assert smart() == 2, "an interval after the last read: read again"
