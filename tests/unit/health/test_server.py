"""The health HTTP server on 127.0.0.1, ephemeral port; the clock is injected (no sleeps)."""

from __future__ import annotations

import http.client
import re
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from agent.config.types import ListenAddress
from agent.health.server import HealthEndpointError, HealthServer, SnapshotStore
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
