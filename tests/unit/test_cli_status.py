"""``kvagent status``: the running agent's snapshot with its age, ``--live`` read here,
and a silent live read (same exit code) when no agent answers as it should.

The "agent" is this process: its record in the run directory (daemon.json) and a status
socket serving a snapshot the config could not produce (node gpu1, degraded, exit 1),
while a live read of the config (no pools, node "unit") is healthy (exit 0): which one
kvagent status printed shows where it came from.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner, Result

from agent.cli.main import main
from agent.daemonfiles import DAEMON_RECORD, STATUS_SOCKET, register_daemon
from agent.health import statusclient
from agent.health.server import SnapshotStore
from agent.health.status import load_status_schema, to_status_json
from agent.health.statussock import StatusSocket
from agent.rundir import process_start_time
from tests.unit.health import samples
from tests.unit.lockholders import NOBODY, needs_root


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_config(tmp: Path, name: str = "kvagent.yaml") -> Path:
    path = tmp / name
    path.write_text(f"""
version: 1
node: {{name: unit, state_dir: {tmp}/state, run_dir: {tmp}/run, sysfs: {tmp}/sys,
        configfs: {tmp}/configfs}}
""")
    return path


def status(config: Path, *args: str, fmt: str = "json") -> Result:
    return CliRunner().invoke(main, ["-c", str(config), "-o", fmt, "status", *args])


def record(run: Path, pid: int, config: Path) -> None:
    """A daemon record naming ``pid`` (as kvagent run writes it)."""
    data = {"pid": pid, "start_time": process_start_time(pid), "config": str(config),
            "started_at": 0.0}
    (run / DAEMON_RECORD).write_text(json.dumps(data))
    (run / DAEMON_RECORD).chmod(0o600)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = write_config(tmp_path)
    (tmp_path / "run").mkdir(mode=0o700)
    return path


@pytest.fixture
def agent(config: Path) -> Iterator[tuple[StatusSocket, Clock]]:
    """This process as the agent of ``config``, serving the degraded sample."""
    run = config.parent / "run"
    register_daemon(run, str(config))
    clock = Clock(1004.5)
    server = StatusSocket(run, SnapshotStore(samples.degraded(tick_at=1000.0)),
                          clock=clock).start()
    try:
        yield server, clock
    finally:
        server.shutdown()


def validate(doc: dict) -> None:
    schema = load_status_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(doc)


def test_the_agents_snapshot_with_its_age(config: Path, agent) -> None:
    server, _ = agent
    res = status(config)
    assert res.exit_code == 1 and res.stderr == ""
    doc = json.loads(res.stdout)
    validate(doc)
    assert doc == to_status_json(samples.degraded(tick_at=1000.0), source="agent",
                                 pid=os.getpid(), age_seconds=4.5)
    res = status(config, fmt="text")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == "node gpu1: FAILED  (as of 2026-01-01T00:00:00Z)"
    assert lines[1] == f"collected 4.5 s ago by kvagent run (pid {os.getpid()})"
    assert "  - initiator pool kv: controller nvme1 is connecting" in lines
    assert server.served == 2


def test_live_reads_here(config: Path, agent) -> None:
    server, _ = agent
    for args in (("--live",), ("--no-drives",)):
        res = status(config, *args)
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        validate(doc)
        assert doc["node"] == "unit" and doc["pools"] == []
        assert doc["collected"]["source"] == "live" and doc["collected"]["pid"] == os.getpid()
        text = status(config, *args, fmt="text").stdout
        assert text.startswith("node unit: OK") and "collected" not in text
    assert server.served == 0


def live_exit_code(config: Path) -> int:
    res = status(config, "--live")
    assert json.loads(res.stdout)["collected"]["source"] == "live"
    return res.exit_code


def falls_back(config: Path) -> str:
    """kvagent status read live, said nothing about it, and exited as a live read does;
    with -v the reason is in the debug log (returned)."""
    res = status(config)
    doc = json.loads(res.stdout)
    assert doc["collected"]["source"] == "live" and doc["node"] == "unit", res.stdout
    assert res.exit_code == live_exit_code(config) == 0
    assert res.stderr == ""
    verbose = CliRunner().invoke(main, ["-c", str(config), "-v", "-o", "json", "status"])
    assert "reading the host here" in verbose.stderr, verbose.stderr
    return verbose.stderr


def test_no_agent(config: Path) -> None:
    falls_back(config)


def test_a_stale_record(config: Path) -> None:
    record(config.parent / "run", 2**22 + 1, config)  # above pid_max's default: no process
    falls_back(config)


def test_a_record_without_a_socket(config: Path) -> None:
    register_daemon(config.parent / "run", str(config))
    falls_back(config)


def test_an_agent_of_another_config(config: Path, agent) -> None:
    other = write_config(config.parent, "other.yaml")
    res = status(other)
    assert json.loads(res.stdout)["collected"]["source"] == "live" and res.exit_code == 0
    assert agent[0].served == 0


def test_a_socket_that_does_not_answer_in_time(config: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statusclient, "ASK_TIMEOUT", 0.3)
    run = config.parent / "run"
    register_daemon(run, str(config))
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    mute.bind(f"/proc/self/fd/{fd}/{STATUS_SOCKET}")
    os.close(fd)
    mute.listen(4)  # this process's, as recorded: it connects, and nothing comes
    try:
        falls_back(config)
    finally:
        mute.close()


def test_a_peer_that_is_not_the_recorded_agent(config: Path, agent) -> None:
    record(config.parent / "run", 1, config)  # init: alive, and not the socket's peer
    why = falls_back(config)
    assert f"the socket's peer is pid {os.getpid()}, not the agent (pid 1)" in why, why


IMPOSTOR = r"""
import json, os, socket, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(f"/proc/self/fd/{fd}/status.sock")
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[2]))  # listen as nobody: SO_PEERCRED is taken here
s.listen(4)
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    line = sys.stdin.readline().encode()
    try:  # the client may hang up first: it checks who we are before it reads
        conn.sendall(line)
    except OSError:
        pass
    conn.close()
"""


def test_a_peer_that_is_not_root(config: Path) -> None:
    """The recorded pid, but running as nobody: its answer is not believed."""
    needs_root()
    run = config.parent / "run"
    forged = to_status_json(samples.degraded(), source="agent")
    proc = subprocess.Popen([sys.executable, "-c", IMPOSTOR, str(run), str(NOBODY)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        forged["collected"]["pid"] = proc.pid
        for _ in range(2):  # falls_back asks twice
            proc.stdin.write(json.dumps(forged) + "\n")
        proc.stdin.flush()
        record(run, proc.pid, config)
        assert (run / STATUS_SOCKET).lstat().st_uid == 0
        why = falls_back(config)
        assert f"the socket's peer runs as uid {NOBODY}, not root" in why, why
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_cli_status_path_imports_no_collector() -> None:
    """Asking the agent imports what every command imports, the config model (it checks
    the config) and the status client; not the collector, the daemon, prometheus_client,
    the snapshot's classes (the agent sends a document), nvmet's planner or the effects
    seam (a live read imports what it uses when it runs)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "gpu-host.yaml"
    code = ("import sys\n"
            "import agent.cli.main, agent.config\n"
            "before = set(sys.modules)\n"
            "import agent.cli.status_cmd\n"
            f"agent.config.load_config({str(example)!r})\n"
            "print('\\n'.join(sorted(set(sys.modules) - before)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    added = proc.stdout.split()
    assert "agent.health.statusclient" in added
    heavy = ("agent.health.collect", "agent.daemon", "agent.reconcile", "agent.target",
             "agent.initiator", "agent.engines", "agent.system", "prometheus_client",
             "agent.health.metrics", "agent.health.server", "agent.health.statussock",
             "agent.health.snapshot", "nvmet.planner", "nvmet.applier", "nvmet.reader",
             "agent.effects", "agent.state", "agent.dhchap", "agent.result", "tempfile")
    assert "agent.config.model" in added
    assert [m for m in added if m in heavy or m.startswith(tuple(f"{h}." for h in heavy))] \
        == []
