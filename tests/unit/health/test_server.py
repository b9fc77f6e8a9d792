"""The health HTTP server on 127.0.0.1, ephemeral port; the clock is injected (no sleeps)."""

from __future__ import annotations

import gzip
import http.client
import re
import socket
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent.config.types import ListenAddress
from agent.health import exposition
from agent.health.server import (
    MAX_CONNECTIONS,
    WORKERS,
    HealthEndpointError,
    HealthServer,
    SnapshotStore,
    accepts_gzip,
)
from tests.unit.health import samples


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def get(server: HealthServer, path: str, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), dict(resp.getheaders())
    finally:
        conn.close()


@pytest.fixture
def setup():
    store = SnapshotStore()
    clock = Clock(1000.0)
    server = HealthServer(store, host="127.0.0.1", port=0, interval=30, clock=clock).start()
    try:
        yield server, store, clock
    finally:
        server.shutdown()


def test_metrics_serves_the_stored_snapshot(setup) -> None:
    server, store, _ = setup
    store.set(samples.healthy())
    status, body, headers = get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["kvagent_node_info"].samples[0].labels == {"node": "stor1"}
    assert "process_resident_memory_bytes" in families

    store.set(samples.degraded())  # the next scrape sees the new snapshot
    _, body, _ = get(server, "/metrics")
    assert 'kvagent_node_info{node="gpu1"} 1.0' in body


def test_metrics_openmetrics_when_asked(setup) -> None:
    server, store, _ = setup
    store.set(samples.healthy())
    status, body, headers = get(server, "/metrics",
                                headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def fetch(server: HealthServer, method: str = "GET",
          headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """/metrics as bytes, not decoded (http.client never decompresses)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(method, "/metrics", headers=headers or {})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


ENCODINGS = {None: False, "gzip": True, "gzip;q=0": False, "identity": False,
             "br, gzip": True}


def test_metrics_gzip_when_accepted_and_the_same_bytes(setup) -> None:
    server, store, _ = setup
    store.set(samples.healthy())
    plain, headers = fetch(server)
    assert "Content-Encoding" not in headers and headers["Vary"] == "Accept-Encoding"
    for value, zipped in ENCODINGS.items():
        body, headers = fetch(server, headers={} if value is None
                              else {"Accept-Encoding": value})
        assert headers.get("Content-Encoding") == ("gzip" if zipped else None), value
        assert int(headers["Content-Length"]) == len(body)
        assert (gzip.decompress(body) if zipped else body) == plain, value
        if zipped:
            assert len(body) < len(plain) // 4
        head, head_headers = fetch(server, "HEAD", {} if value is None
                                   else {"Accept-Encoding": value})
        assert head == b"" and head_headers.get("Content-Encoding") == headers.get(
            "Content-Encoding")
        assert head_headers["Content-Length"] == headers["Content-Length"], value
    om, headers = fetch(server, headers={"Accept": "application/openmetrics-text; "
                                         "version=1.0.0", "Accept-Encoding": "gzip"})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert gzip.decompress(om).endswith(b"# EOF\n")


def test_many_scrapes_of_one_snapshot_make_one_body_and_one_gzip(setup, monkeypatch) -> None:
    server, store, _ = setup
    store.set(samples.healthy())
    made: list[str] = []
    real_body, real_member = exposition._Body, exposition.gzip_member
    monkeypatch.setattr(exposition, "_Body", lambda *a: made.append("body") or real_body(*a))
    monkeypatch.setattr(exposition, "gzip_member",
                        lambda parts: made.append("gzip") or real_member(parts))
    bodies = set()
    for n in range(60):
        value = list(ENCODINGS)[n % len(ENCODINGS)]
        body, _ = fetch(server, "HEAD" if n % 7 == 0 else "GET",
                        {} if value is None else {"Accept-Encoding": value})
        bodies.add(body)
    assert sorted(made) == ["body", "gzip"]
    assert len(bodies) == 3  # plain, gzip and HEAD's empty one
    store.set(samples.degraded())  # a new snapshot: made again, once
    for _ in range(5):
        fetch(server, headers={"Accept-Encoding": "gzip"})
    assert sorted(made) == ["body", "body", "gzip", "gzip"]


@pytest.mark.parametrize(("values", "wanted"), [
    ([], False), (["gzip"], True), (["GZIP"], True), (["x-gzip"], True),
    (["gzip;q=0"], False), (["gzip; q=0.0"], False), (["gzip;q=0.5"], True),
    (["identity"], False), (["br, gzip"], True), (["br", "gzip;q=1"], True), (["br"], False),
    (["*"], True), (["*;q=0"], False), (["gzip;q=0, *"], False), (["deflate, *;q=0.1"], True),
    (["gzip;q=junk"], False), ([""], False), ([" , ;q=1"], False)])
def test_accept_encoding(values: list[str], wanted: bool) -> None:
    assert accepts_gzip(values) is wanted


def test_healthz_fresh_and_stale(setup) -> None:
    server, store, clock = setup
    status, body, _ = get(server, "/healthz")
    assert (status, body) == (503, "unhealthy: the loop has not completed a tick yet\n")

    store.set(samples.healthy(tick_at=1000.0))
    clock.now = 1000.0 + 89.9  # within 3 x 30 s
    status, body, _ = get(server, "/healthz")
    assert status == 200
    assert body == "ok: last loop tick 89.9s ago (limit 90s)\n"

    clock.now = 1000.0 + 90.5
    status, body, _ = get(server, "/healthz")
    assert status == 503
    assert "last loop tick 90.5s ago, more than 90s" in body

    store.set(samples.healthy(tick_at=1090.0))  # the loop ticks again: healthy again
    status, _, _ = get(server, "/healthz")
    assert status == 200


def test_readyz(setup) -> None:
    server, store, _ = setup
    status, body, _ = get(server, "/readyz")
    assert status == 503 and "first pass has not finished" in body

    store.set(samples.healthy())
    assert get(server, "/readyz")[:2] == (200, "ready: 2 pool(s) ready\n")

    store.set(samples.degraded())
    status, body, _ = get(server, "/readyz")
    assert status == 503
    assert body.splitlines() == [
        "not ready: 2 of 2 pool(s) not ready",
        "target pool kv: port 1 not linked",
        "initiator pool kv: controller nvme1 is connecting",
    ]

    store.set(samples.empty())  # nothing configured: nothing to wait for
    assert get(server, "/readyz")[0] == 200


def test_not_found_and_head(setup) -> None:
    server, store, _ = setup
    store.set(samples.healthy())
    status, body, _ = get(server, "/nope")
    assert status == 404 and "/metrics" in body
    status, body, headers = get(server, "/readyz", method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 0
    assert get(server, "/readyz?verbose=1")[0] == 200


def test_shutdown_closes_the_port() -> None:
    server = HealthServer(SnapshotStore(), host="127.0.0.1", port=0).start()
    port = server.port
    assert get(server, "/healthz")[0] == 503
    server.shutdown()
    server.shutdown()  # twice is harmless
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_port_in_use_is_a_clear_error() -> None:
    first = HealthServer(SnapshotStore(), host="127.0.0.1", port=0).start()
    try:
        with pytest.raises(HealthEndpointError,
                           match=re.escape(f"cannot listen on 127.0.0.1:{first.port}")):
            HealthServer(SnapshotStore(), host="127.0.0.1", port=first.port)
    finally:
        first.shutdown()


def test_from_listen_address_and_ipv6_loopback() -> None:
    probe = socket.socket(socket.AF_INET6)
    try:
        probe.bind(("::1", 0))
    except OSError:
        pytest.fail("this machine has no IPv6 loopback; the test needs ::1")
    port = probe.getsockname()[1]
    probe.close()
    with HealthServer.from_listen(SnapshotStore(samples.healthy()),
                                  ListenAddress.parse(f"[::1]:{port}")) as server:
        assert server.host == "::1" and server.port == port
        assert get(server, "/readyz")[0] == 200


def test_non_loopback_bind_logs_a_warning() -> None:
    """192.0.2.1 (TEST-NET-1) is on no interface: the warning comes, then a clear bind error.

    Nothing is ever exposed beyond loopback by this test.
    """
    with capture_logs() as logs, pytest.raises(HealthEndpointError, match=re.escape("192.0.2.1")):
        HealthServer(SnapshotStore(), host="192.0.2.1", port=0)
    assert [e["log_level"] for e in logs if "beyond loopback" in e["event"]] == ["warning"]
    with capture_logs() as logs, HealthServer(SnapshotStore(), host="127.0.0.1", port=0):
        pass
    assert not [e for e in logs if "beyond loopback" in e["event"]]


# ------------------------------------------------ a hostile local user (issue 24, item 2)
def fresh(store: SnapshotStore, **kwargs) -> HealthServer:
    store.set(samples.healthy(tick_at=1000.0))
    return HealthServer(store, host="127.0.0.1", port=0, interval=30, clock=Clock(1000.0),
                        **kwargs).start()


def raw(server: HealthServer, data: bytes) -> socket.socket:
    s = socket.create_connection((server.host, server.port), timeout=10)
    if data:
        s.sendall(data)
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def cut(s: socket.socket, wait: float = 5.0) -> bool:
    """True when the server closed ``s`` (end of stream or reset) within ``wait`` s."""
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_slow_sender_is_cut_at_the_whole_request_deadline() -> None:
    """One byte at a time, each well within any per-read timeout: cut at the deadline."""
    server = fresh(SnapshotStore(), request_deadline=0.5)
    try:
        s = raw(server, b"GET /healthz HTTP/1.1\r\n")
        sent = 0
        with pytest.raises(OSError):  # EPIPE / ECONNRESET once the server cut it
            for _ in range(200):  # 200 x 0.05 s: 20 x the deadline, if never cut
                s.sendall(b"X")
                sent += 1
                s.settimeout(0.05)
                try:
                    if s.recv(1) == b"":
                        raise ConnectionResetError("closed by the server")
                except TimeoutError:
                    pass
        assert sent < 200
        s.close()
    finally:
        server.shutdown()


def test_oversized_headers_and_a_body_are_refused(setup) -> None:
    server, _, _ = setup
    s = raw(server, b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20000 + b"\r\n\r\n")
    assert read_all(s).startswith(b"HTTP/1.1 431")
    s = raw(server, b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
    assert read_all(s).startswith(b"HTTP/1.1 413")


def test_when_every_slot_is_taken_the_longest_waiting_connection_makes_room() -> None:
    server = fresh(SnapshotStore(), max_connections=4)
    try:
        idle = [raw(server, b"GET /heal") for _ in range(4)]  # half a request each
        status, _, _ = get(server, "/healthz")
        assert status == 200  # answered, not refused
        assert server.evicted >= 1
        assert cut(idle[0])  # the oldest was cut for it
        assert not cut(idle[-1], wait=0.2)  # the newest still waits for its request
        for s in idle:
            s.close()
    finally:
        server.shutdown()


LOAD = r"""
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: " if i % 2 else b"\x16\x03\x01junk")
        held.append(s)
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.read()  # hold them until the test is done
"""


def test_two_thousand_slow_connections_from_an_unprivileged_user(tmp_path) -> None:
    """2,000 connections that never finish a request (or send junk), from uid 65534, at a
    real agent loop (1 s interval, fake runner): its fds and threads stay bounded, it keeps
    passing and /healthz keeps answering (each get within a 1 s client timeout)."""
    import os
    import subprocess
    import threading

    from agent.config import load_config
    from agent.daemon import Agent
    from agent.health.notify import Notifier
    from tests.unit.fakerunner import FakeRunner
    from tests.unit.test_daemon import free_port, write_config

    if os.geteuid() != 0:
        pytest.skip("needs root to run the load as another user")
    config = tmp_path / "kvagent.yaml"
    port = free_port()
    write_config(config, tmp_path, port, interval="1s", full_interval="1s")
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    loop = threading.Thread(target=agent.run, daemon=True)
    fds_before = len(os.listdir("/proc/self/fd"))
    threads_before = threading.active_count()
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while agent.counters.apply_runs < 1:
            assert time.monotonic() < deadline and loop.is_alive(), "no first pass"
            loop.join(0.05)
        # Debian's python3 (scripts/setup installs it): uid 65534 cannot enter /root,
        # where this venv's interpreter lives; the load needs only the standard library.
        load = subprocess.Popen(["/usr/bin/python3", "-c", LOAD, "127.0.0.1", str(port),
                                 "2000"], user=65534, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            opened = int(load.stdout.readline())
            passes_before = agent.counters.apply_runs
            answers, latencies = [], []
            for _ in range(10):
                began = time.monotonic()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/healthz")
                answers.append(conn.getresponse().status)
                latencies.append(time.monotonic() - began)
                conn.close()
                time.sleep(0.3)
            passes = agent.counters.apply_runs - passes_before
            fds_during = len(os.listdir("/proc/self/fd"))
            threads = threading.active_count()
            evicted = getattr(agent.server, "evicted", None)
        finally:
            load.stdin.close()
            load.wait(timeout=30)
    finally:
        agent.events.put("stop")
        loop.join(timeout=30)
    print(f"[figure] {opened} hostile connections from uid 65534; /healthz {answers}, "
          f"slowest {max(latencies) * 1000:.0f} ms; {passes} passes meanwhile; "
          f"evicted {evicted}; fds +{fds_during - fds_before}, threads +"
          f"{threads - threads_before}")
    assert opened >= 1000
    assert answers == [200] * 10
    assert passes >= 1  # the loop went on passing under the load
    # the loop's own: up to MAX_CONNECTIONS waiting and as many queued for a worker
    assert fds_during - fds_before <= MAX_CONNECTIONS * 2 + 16
    assert threads - threads_before <= WORKERS + 4


def test_an_idle_server_thread_sleeps_until_a_connection_or_its_deadline() -> None:
    """No polling: an idle server's select does not return for a second; a connection that
    sends nothing wakes it at its deadline; a stop wakes it at once."""
    server = fresh(SnapshotStore(), request_deadline=0.3)
    returned = []
    real = server._httpd._selector.select

    def counting(timeout=None):
        found = real(timeout)
        returned.append((timeout, len(found)))
        return found

    server._httpd._selector.select = counting
    try:
        time.sleep(1.0)
        assert returned == []  # (it was asleep in select before the count began)
        s = raw(server, b"")
        s.settimeout(10)
        assert s.recv(1) == b""  # cut at the deadline, without a byte sent
        assert any(timeout is not None and timeout <= 0.3 for timeout, _ in returned)
        s.close()
    finally:
        server.shutdown()
    assert server._thread is None
