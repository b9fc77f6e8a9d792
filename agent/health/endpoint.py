"""The agent's health endpoint as the config wants it, kept without ever stopping the agent.

The agent's passes never depend on the endpoint: when ``health.listen`` cannot be bound
(another process holds the port, the address is not on this host) the failure is logged
at error level, shown by ``kvagent status`` and the metrics
(``kvagent_health_endpoint_listening``), and the bind is tried again every
``health.interval``. A reload to another address binds it before the old one is closed
and keeps the old one serving when it cannot (the same port on another address: the old
socket is closed first and bound again should the new bind fail).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable

from ..config.types import ListenAddress
from ..log import get_logger
from .server import HealthEndpointError, HealthServer, SnapshotStore

log = get_logger("health.endpoint")

Serve = Callable[..., HealthServer]


class Endpoint:
    """Which server serves, which address is wanted, and why it is not served if not."""

    def __init__(self, store: SnapshotStore, *, clock: Callable[[], float] = time.monotonic,
                 serve: Serve = HealthServer.from_listen):
        self.store = store
        self.clock = clock
        self._serve = serve
        #: The server answering now (None: none could be started yet).
        self.server: HealthServer | None = None
        #: The address the config asks for, and the loop interval (retries, staleness).
        self.listen: ListenAddress | None = None
        self.interval = 30.0
        #: Why ``listen`` is not served (None: it is).
        self.error: str | None = None
        self._retry_at: float | None = None
        self._bound: ListenAddress | None = None  # what ``server`` was bound to

    def want(self, listen: ListenAddress | str, interval: float) -> None:
        """Serve on ``listen``: bind it now (never raises). The server serving another
        address is closed once the new one listens, and keeps serving if it cannot."""
        address = listen if isinstance(listen, ListenAddress) else ListenAddress.parse(listen)
        self.listen, self.interval = address, interval
        if self.server is not None and self._bound == address:
            self.error = self._retry_at = None
            return
        self._bind()

    def retry(self) -> None:
        """Bind ``listen`` again when it is not served and its retry is due."""
        if self.error is not None and self._retry_at is not None \
                and self.clock() >= self._retry_at:
            self._bind()

    def shutdown(self) -> None:
        """Close the server answering now (the agent stops)."""
        if self.server is not None:
            self.server.shutdown()
            self.server = None

    def _start(self, address: ListenAddress) -> HealthServer:
        return self._serve(self.store, address, interval=self.interval).start()

    def _bind(self) -> None:
        assert self.listen is not None
        old = self.server
        try:
            new = self._start(self.listen)
        except HealthEndpointError as exc:
            if old is not None and exc.errno == errno.EADDRINUSE \
                    and old.port == self.listen.port:
                new = self._swap(old, exc)  # the old socket may be what holds the port
                if new is None:
                    return
            else:
                self._failed(exc)
                return
        else:
            if old is not None:
                old.shutdown()
        self.server, self._bound = new, self.listen
        if self.error is not None:
            log.info("health endpoint listening again", listen=str(self.listen))
        self.error = self._retry_at = None

    def _swap(self, old: HealthServer, refused: HealthEndpointError) -> HealthServer | None:
        """The new address on the old one's port: close the old one, bind the new one;
        should that fail, bind the old address again."""
        assert self.listen is not None and self._bound is not None
        old.shutdown()
        self.server = None
        try:
            return self._start(self.listen)
        except HealthEndpointError as exc:
            refused = exc
        try:
            self.server = self._start(self._bound)
        except HealthEndpointError as exc:
            log.error("health endpoint: the old address cannot be bound again either",
                      listen=str(self._bound), error=exc.message)
        self._failed(refused)
        return None

    def _failed(self, exc: HealthEndpointError) -> None:
        still = (f"; still serving on {self.server.host}:{self.server.port}"
                 if self.server is not None else "")
        error = f"{exc.message}; retried every {self.interval:g}s{still}"
        if error != self.error:
            log.error("health endpoint not listening; the agent runs its passes without it",
                      listen=str(self.listen), error=exc.message, hint=exc.hint,
                      retry_seconds=self.interval,
                      serving=f"{self.server.host}:{self.server.port}" if self.server else None)
        self.error = error
        self._retry_at = self.clock() + self.interval
