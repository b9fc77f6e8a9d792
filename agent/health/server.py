"""The health HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

Every request reads the snapshot the loop last stored (:class:`SnapshotStore`);
nothing here runs a command or touches the kernel, so a scrape storm cannot
slow the loop down or stall on a stuck device.

- ``/metrics``: Prometheus exposition (OpenMetrics when the scraper asks for it), made
  once per snapshot and format and gzip-compressed once for scrapers that accept it
  (:mod:`agent.health.exposition`).
- ``/healthz``: 200 while the loop ticked within ``stale_after`` seconds (default
  3x the interval), else 503; the body says how long ago it ticked.
- ``/readyz``: 200 when every pool is ready and the apply lock is not stuck (see
  :class:`~agent.health.snapshot.ApplyBusy`), else 503 saying why.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client.exposition import choose_encoder

from ..config.types import ListenAddress
from ..errors import KvagentError
from ..log import get_logger
from .exposition import MetricsBody
from .snapshot import Snapshot
from .wakeup import Waker, until_oldest_deadline

log = get_logger("health.server")

#: /healthz fails when the last tick is older than this many loop intervals.
STALE_INTERVALS = 3.0
#: Connections whose request is still arriving, at once (a local user opening thousands
#: must not take the agent's file descriptors: the unit's LimitNOFILE is far above this);
#: a new one evicts the one that has waited longest. Also the most complete requests that
#: may wait for a worker (more are closed unanswered).
MAX_CONNECTIONS = 64
#: Seconds a request may take to arrive, from its connection being accepted (a slow
#: sender is cut then, whatever its pace).
REQUEST_DEADLINE = 10.0
#: Bytes of request line and headers one request may send (the endpoint takes no body).
MAX_HEADER_BYTES = 16 << 10
#: Threads that answer complete requests, and seconds each may spend writing one answer.
WORKERS = 4
WRITE_TIMEOUT = 2.0
#: Connections the kernel holds for the loop to accept.
LISTEN_BACKLOG = 128


class HealthEndpointError(KvagentError):
    """The health endpoint could not be started (``errno``: why the bind failed)."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None):
        super().__init__(message, hint)
        self.errno = errno


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


def accepts_gzip(values: list[str]) -> bool:
    """Whether ``Accept-Encoding`` header values admit gzip (RFC 9110, 12.5.3): ``gzip`` or
    ``x-gzip`` with a weight above 0, else ``*`` with one; absent or ``identity``: no."""
    weights: dict[str, float] = {}
    for item in ",".join(values).split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0  # unreadable: not accepted
        weights[coding] = weight
    for coding in ("gzip", "x-gzip", "*"):
        if coding in weights:
            return weights[coding] > 0
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
    """Answers the request(s) in ``head``, the bytes the server's loop already read, on a
    worker thread; writes are bounded by ``WRITE_TIMEOUT``; the connection is closed after."""

    server: _Server  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    timeout = None

    def __init__(self, request: socket.socket, client_address: Any, server: _Server,
                 head: bytes, oversized: bool):
        self.head = head
        self.oversized = oversized
        super().__init__(request, client_address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(WRITE_TIMEOUT)
        self.rfile = io.BytesIO(self.head)  # type: ignore[assignment]

    def handle(self) -> None:
        if self.oversized:
            self.close_connection = True
            self.command, self.requestline, self.request_version = "GET", "", "HTTP/1.1"
            self.send_error(431, "request header fields too large")
            return
        super().handle()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.headers.get("Content-Length", "0").strip() not in ("", "0") or \
                "Transfer-Encoding" in self.headers:
            self.send_error(413, "this endpoint takes no request body")
            return False
        return True

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
                gzipped = accepts_gzip(self.headers.get_all("Accept-Encoding") or [])
                body = (health.metrics.gzipped(encoder, content_type) if gzipped
                        else health.metrics.render(encoder, content_type))
                self._send(200, body, content_type, send_body,
                           encoding="gzip" if gzipped else None, vary=True)
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
        except OSError:  # the client went away, or its connection was cut: nobody to answer
            self.close_connection = True
        except Exception as exc:  # a bug must not kill the serving thread silently
            log.error("health endpoint failed", path=path, error=f"{type(exc).__name__}: {exc}")
            self._send(500, b"internal error\n", "text/plain; charset=utf-8", send_body)

    def _send(self, status: int, body: bytes, content_type: str, send_body: bool,
              encoding: str | None = None, vary: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        if vary:  # the body depends on Accept-Encoding (caches must not mix them up)
            self.send_header("Vary", "Accept-Encoding")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", client=self.client_address[0], request=format % args)


class _Pending:
    """A connection whose request is still arriving."""

    __slots__ = ("addr", "began", "buf")

    def __init__(self, addr: Any, began: float):
        self.addr = addr
        self.began = began
        self.buf = bytearray()


class _Server:
    """One thread reads every request (non-blocking sockets, one selector), a few workers
    answer them. A connection costs a file descriptor until its request is complete, and no
    thread: at most ``max_connections`` wait at once (a new one evicts the oldest), each for
    at most ``request_deadline`` seconds, with at most ``MAX_HEADER_BYTES`` of request; at
    most ``max_connections`` complete requests wait for a worker (more are closed at once).
    A /healthz among thousands of slow or junk connections is read as soon as it arrives and
    answered by the next free worker."""

    def __init__(self, address: tuple[str, int], health: HealthServer, *,
                 max_connections: int = MAX_CONNECTIONS,
                 request_deadline: float = REQUEST_DEADLINE):
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.health = health
        self.max_connections = max_connections
        self.request_deadline = request_deadline
        #: Connections cut while still sending their request to make room for a newer one
        #: or at the deadline, and complete requests closed unanswered (every worker busy).
        self.evicted = 0
        self.refused = 0
        self.socket = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._pending: dict[socket.socket, _Pending] = {}  # oldest first
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._waker = Waker(self._selector)
        self._workers = ThreadPoolExecutor(max_workers=WORKERS,
                                           thread_name_prefix="kvagent-health")
        self._queued = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    def serve_forever(self) -> None:
        """Accept, read and dispatch until :meth:`shutdown`; asleep while nothing comes
        and no request is due."""
        self._stopped.clear()
        try:
            while not self._stop.is_set():
                wait = until_oldest_deadline(self._pending, self.request_deadline,
                                             time.monotonic())
                for key, _ in self._selector.select(timeout=wait):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.data is self._waker:
                        self._waker.drain()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._reap(time.monotonic())
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it."""
        self._stop.set()
        self._waker.wake()
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and every connection still arriving."""
        for conn in list(self._pending):
            self._drop(conn)
        self._selector.close()
        self._waker.close()
        self.socket.close()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        for _ in range(LISTEN_BACKLOG):
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the next loop tries again
                log.warning("health endpoint cannot accept", error=str(exc))
                return
            conn.setblocking(False)
            while len(self._pending) >= self.max_connections:
                self._drop(next(iter(self._pending)))
                self.evicted += 1
            self._pending[conn] = _Pending(addr, time.monotonic())
            self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        pending = self._pending.get(conn)
        if pending is None:
            return
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        pending.buf += data
        oversized = len(pending.buf) > MAX_HEADER_BYTES
        if oversized or b"\r\n\r\n" in pending.buf or b"\n\n" in pending.buf:
            self._dispatch(conn, pending, oversized)

    def _dispatch(self, conn: socket.socket, pending: _Pending, oversized: bool) -> None:
        self._selector.unregister(conn)
        del self._pending[conn]
        if not self._queued.acquire(blocking=False):
            self.refused += 1
            conn.close()
            return
        conn.setblocking(True)
        try:
            self._workers.submit(self._answer, conn, pending.addr, bytes(pending.buf),
                                 oversized)
        except RuntimeError:  # shut down meanwhile
            self._queued.release()
            conn.close()

    def _answer(self, conn: socket.socket, addr: Any, head: bytes, oversized: bool) -> None:
        try:
            _Handler(conn, addr, self, head, oversized)
        except OSError:  # the client went away, or would not read its answer in time
            log.debug("health connection failed", client=str(addr))
        except Exception as exc:  # a bug must not kill the worker silently
            log.error("health endpoint failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            self._queued.release()

    def _reap(self, now: float) -> None:
        for conn, pending in list(self._pending.items()):
            if now - pending.began <= self.request_deadline:
                break  # oldest first: the rest are younger
            self._drop(conn)
            self.evicted += 1

    def _drop(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()


class HealthServer:
    """The HTTP server, in a daemon thread. ``port=0`` picks a free port (see ``port``)."""

    def __init__(self, store: SnapshotStore, *, host: str = "127.0.0.1", port: int = 9808,
                 interval: float = 30.0, stale_after: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_connections: int = MAX_CONNECTIONS,
                 request_deadline: float = REQUEST_DEADLINE):
        self.store = store
        self.clock = clock
        self.stale_after = stale_after if stale_after is not None else STALE_INTERVALS * interval
        #: The body of /metrics, made once per snapshot and format (gzip: once more).
        self.metrics = MetricsBody(store.get)
        if not is_loopback(host):
            log.warning("health endpoint listens beyond loopback: /metrics, /healthz and "
                        "/readyz are reachable from the network", host=host, port=port)
        try:
            self._httpd = _Server((host, port), self, max_connections=max_connections,
                                  request_deadline=request_deadline)
        except OSError as exc:
            raise HealthEndpointError(
                f"cannot listen on {host}:{port} for the health endpoint: "
                f"{exc.strerror or exc}",
                "another process may hold the port, or the address is not on this host; "
                "change health.listen",
                exc.errno,
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

    @property
    def refused(self) -> int:
        """Complete requests closed unanswered because every worker and queue slot was
        taken."""
        return self._httpd.refused

    @property
    def evicted(self) -> int:
        """Connections cut while sending their request, at the deadline or to make room
        for newer ones."""
        return self._httpd.evicted

    def start(self) -> HealthServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever,
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
