"""The health HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

Every request reads the snapshot the loop last stored (:class:`SnapshotStore`);
nothing here runs a command or touches the kernel, so a scrape storm cannot
slow the loop down or stall on a stuck device.

- ``/metrics``: Prometheus exposition (OpenMetrics when the scraper asks for it).
- ``/healthz``: 200 while the loop ticked within ``stale_after`` seconds (default
  3x the interval), else 503; the body says how long ago it ticked.
- ``/readyz``: 200 when every pool is ready and the apply lock is not stuck (see
  :class:`~agent.health.snapshot.ApplyBusy`), else 503 saying why.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..config.types import ListenAddress
from ..errors import KvagentError
from ..log import get_logger
from .exposition import MetricsBody
from .metrics import build_registry
from .snapshot import Snapshot

log = get_logger("health.server")

#: /healthz fails when the last tick is older than this many loop intervals.
STALE_INTERVALS = 3.0


class HealthEndpointError(KvagentError):
    """The health endpoint could not be started."""


class SnapshotStore:
    """Holds the latest snapshot; the loop sets it, request threads get it."""

    def __init__(self, snapshot: Snapshot | None = None):
        self._lock = threading.Lock()
        self._snapshot = snapshot

    def set(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def get(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def health_check(snapshot: Snapshot | None, now: float, stale_after: float) -> tuple[int, str]:
    """(HTTP status, body) for /healthz; ``now`` is ``time.monotonic()``."""
    if snapshot is None:
        return 503, "unhealthy: the loop has not completed a tick yet\n"
    age = now - snapshot.tick_at
    if age > stale_after:
        return 503, (f"unhealthy: last loop tick {age:.1f}s ago, more than {stale_after:g}s "
                     "(the loop is stuck or too slow)\n")
    return 200, f"ok: last loop tick {age:.1f}s ago (limit {stale_after:g}s)\n"


def ready_check(snapshot: Snapshot | None) -> tuple[int, str]:
    """(HTTP status, body) for /readyz."""
    if snapshot is None:
        return 503, "not ready: the first pass has not finished\n"
    waiting = snapshot.pools_not_ready
    busy = snapshot.apply_busy if snapshot.apply_busy and snapshot.apply_busy.stuck else None
    if waiting or busy:
        lines = [f"not ready: {len(waiting)} of {len(snapshot.pools)} pool(s) not ready"
                 + ("; passes skipped: the apply lock is held" if busy else "")]
        for pool in waiting:
            why = "; ".join(pool.problems) or pool.state
            lines.append(f"{pool.role} pool {pool.name}: {why}")
        if busy:
            lines.append(busy.problem())
        return 503, "\n".join(lines) + "\n"
    return 200, f"ready: {len(snapshot.pools)} pool(s) ready\n"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 60  # seconds an idle keep-alive connection may hold its thread

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        health = self.server.health
        try:
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                body = (health.metrics.render(encoder) if health.metrics is not None
                        else encoder(health.registry))
                self._send(200, body, content_type, send_body)
            elif path == "/healthz":
                status, text = health_check(health.store.get(), health.clock(),
                                            health.stale_after)
                self._send(status, text.encode(), "text/plain; charset=utf-8", send_body)
            elif path == "/readyz":
                status, text = ready_check(health.store.get())
                self._send(status, text.encode(), "text/plain; charset=utf-8", send_body)
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n",
                           "text/plain; charset=utf-8", send_body)
        except Exception as exc:  # a bug must not kill the serving thread silently
            log.error("health endpoint failed", path=path, error=f"{type(exc).__name__}: {exc}")
            self._send(500, b"internal error\n", "text/plain; charset=utf-8", send_body)

    def _send(self, status: int, body: bytes, content_type: str, send_body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", client=self.client_address[0], request=format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    health: HealthServer

    def __init__(self, address: tuple[str, int], health: HealthServer):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.health = health
        super().__init__(address, _Handler)


class HealthServer:
    """The HTTP server, in a daemon thread. ``port=0`` picks a free port (see ``port``)."""

    def __init__(self, store: SnapshotStore, *, host: str = "127.0.0.1", port: int = 9808,
                 interval: float = 30.0, stale_after: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 registry: CollectorRegistry | None = None):
        self.store = store
        self.clock = clock
        self.stale_after = stale_after if stale_after is not None else STALE_INTERVALS * interval
        self.registry = registry if registry is not None else build_registry(store.get,
                                                                             process=True)
        #: The body of /metrics, formatted once per collected snapshot (None: a
        #: ``registry`` was given, which is encoded on every scrape).
        self.metrics = MetricsBody(store.get) if registry is None else None
        if not is_loopback(host):
            log.warning("health endpoint listens beyond loopback: /metrics, /healthz and "
                        "/readyz are reachable from the network", host=host, port=port)
        try:
            self._httpd = _Server((host, port), self)
        except OSError as exc:
            raise HealthEndpointError(
                f"cannot listen on {host}:{port} for the health endpoint: "
                f"{exc.strerror or exc}",
                "another process may hold the port, or the address is not on this host; "
                "change health.listen",
            ) from None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_listen(cls, store: SnapshotStore, listen: ListenAddress | str,
                    **kwargs: Any) -> HealthServer:
        """A server bound to a config ``health.listen`` address such as ``127.0.0.1:9808``."""
        address = listen if isinstance(listen, ListenAddress) else ListenAddress.parse(listen)
        return cls(store, host=address.host, port=address.port, **kwargs)

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> HealthServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever,
                                            kwargs={"poll_interval": 0.25},
                                            name="kvagent-health", daemon=True)
            self._thread.start()
            log.info("health endpoint listening", host=self.host, port=self.port)
        return self

    def shutdown(self) -> None:
        """Stop serving and close the socket (safe to call twice or before start)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
