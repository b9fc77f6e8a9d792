"""The agent runs its passes whether or not it can listen on health.listen (issue 35, F1).

A local user listening on the health port before the agent started stopped every pass
(``passes run: 0``), and a SIGHUP to a taken ``health.listen`` closed the old endpoint
and ended the agent. Ports here are held by the test itself, on loopback.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from agent.cli.main import main
from agent.config import load_config
from agent.daemon import Agent
from agent.health.notify import Notifier
from agent.health.snapshot import host_problems, overall_state
from tests.unit.fakerunner import FakeRunner
from tests.unit.test_daemon import free_port, get

#: How long a test waits for the loop to get somewhere (a bound, not a figure measured).
WAIT = 60.0


def write_config(path: Path, tmp: Path, port: int, *, interval: str = "1s") -> None:
    path.write_text(f"""
version: 1
node: {{name: unit, state_dir: {tmp}/state, run_dir: {tmp}/run, sysfs: {tmp}/sys,
        configfs: {tmp}/configfs}}
health: {{listen: "127.0.0.1:{port}", interval: {interval}, full_interval: 5m,
          textfile: {tmp}/kvagent.prom}}
""")


@pytest.fixture
def held() -> Iterator[Callable[[], tuple[int, socket.socket]]]:
    """Listening sockets on loopback that another process might hold."""
    sockets: list[socket.socket] = []

    def hold() -> tuple[int, socket.socket]:
        s = socket.create_server(("127.0.0.1", 0))
        sockets.append(s)
        return s.getsockname()[1], s

    yield hold
    for s in sockets:
        s.close()


def until(what: str, done: Callable[[], bool], thread: threading.Thread) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert thread.is_alive(), f"the agent ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT:g}s"
        thread.join(0.05)


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def start(config: Path) -> tuple[Agent, threading.Thread]:
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return agent, thread


def stop(agent: Agent, thread: threading.Thread) -> None:
    agent.events.put("stop")
    thread.join(WAIT)
    assert not thread.is_alive()


def test_a_taken_health_port_stops_no_pass_and_is_bound_once_free(
        tmp_path: Path, held: Callable[[], tuple[int, socket.socket]]) -> None:
    port, holder = held()
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, port)
    with capture_logs() as logs:
        agent, thread = start(config)
        try:
            until("first pass", lambda: agent.counters.apply_runs >= 1
                  and agent.store.get() is not None, thread)
            snap = agent.store.get()
            assert snap is not None and snap.health_error is not None
            assert f"cannot listen on 127.0.0.1:{port}" in snap.health_error
            assert "retried every 1s" in snap.health_error
            assert overall_state(snap) == "degraded"
            assert any(p.startswith(f"health endpoint: cannot listen on 127.0.0.1:{port}")
                       for p in host_problems(snap))
            prom = (tmp_path / "kvagent.prom").read_text()
            assert "kvagent_health_endpoint_listening 0.0" in prom
            # kvagent status, from the agent's status socket: the problem, exit 1
            res = CliRunner().invoke(main, ["-c", str(config), "-o", "json", "status"])
            doc = json.loads(res.stdout)
            assert res.exit_code == 1 and doc["collected"]["source"] == "agent"
            assert f"127.0.0.1:{port}" in doc["health_endpoint_error"]

            holder.close()  # the other process lets go: the next collect binds it
            until("health endpoint", lambda: agent.server is not None, thread)
            assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            until("cleared problem", lambda: agent.store.get().health_error is None, thread)
            assert "kvagent_health_endpoint_listening 1.0" in \
                (tmp_path / "kvagent.prom").read_text()
        finally:
            stop(agent, thread)
    errors = [e for e in logs if e["event"].startswith("health endpoint not listening")]
    assert len(errors) == 1 and errors[0]["log_level"] == "error", \
        "logged at error level, once for the same failure"
    assert agent.counters.apply_runs >= 1


def test_a_reload_to_a_taken_address_keeps_the_old_endpoint(
        tmp_path: Path, held: Callable[[], tuple[int, socket.socket]]) -> None:
    old = free_port()
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, old)
    agent, thread = start(config)
    try:
        until("health endpoint", lambda: agent.store.get() is not None
              and get(f"http://127.0.0.1:{old}/healthz")[0] == 200, thread)
        new, holder = held()
        write_config(config, tmp_path, new)
        runs = agent.counters.apply_runs
        agent.events.put("reload")
        until("reload's pass", lambda: agent.counters.apply_runs > runs, thread)
        assert str(agent.cfg.health.listen) == f"127.0.0.1:{new}", "the new config runs"
        assert get(f"http://127.0.0.1:{old}/healthz")[0] == 200, "the old endpoint serves"
        snap = agent.store.get()
        assert f"cannot listen on 127.0.0.1:{new}" in snap.health_error
        assert f"still serving on 127.0.0.1:{old}" in snap.health_error

        holder.close()
        until("the new endpoint", lambda: agent.server is not None
              and agent.server.port == new, thread)
        assert get(f"http://127.0.0.1:{new}/healthz")[0] == 200
        assert refused(old), "the old endpoint is closed once the new one listens"
    finally:
        stop(agent, thread)


def test_a_reload_to_another_free_address_moves_the_endpoint(tmp_path: Path) -> None:
    old, new = free_port(), free_port()
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, old)
    agent, thread = start(config)
    try:
        until("first pass", lambda: agent.store.get() is not None, thread)
        write_config(config, tmp_path, new)
        agent.events.put("reload")
        until("the new endpoint", lambda: agent.server is not None
              and agent.server.port == new, thread)
        assert get(f"http://127.0.0.1:{new}/healthz")[0] == 200
        assert refused(old) and agent.endpoint.error is None
    finally:
        stop(agent, thread)
