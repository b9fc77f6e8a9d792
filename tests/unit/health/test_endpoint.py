"""The health endpoint's moves (agent.health.endpoint): the new address is bound before
the old one is closed; the old one keeps serving when the new one cannot be bound; the
same port on another address is handed over (the old socket holds it) and given back
when the new bind fails.

The servers here are real (HealthServer on loopback) where the kernel can show it; the
hand-over needs the wildcard address, which a fake of the kernel's rule plays (0.0.0.0
takes a port from every address), so nothing listens beyond loopback.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from agent.config.types import ListenAddress
from agent.health.endpoint import Endpoint
from agent.health.server import HealthEndpointError, HealthServer, SnapshotStore
from tests.unit.test_daemon import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_new_address_is_bound_before_the_old_one_is_closed() -> None:
    events: list[str] = []

    def serve(store: SnapshotStore, listen: ListenAddress, **kw: Any) -> HealthServer:
        events.append(f"bind {listen}")
        server = HealthServer.from_listen(store, listen, **kw)
        real = server.shutdown

        def shutdown() -> None:
            events.append(f"close {listen}")
            real()

        server.shutdown = shutdown  # type: ignore[method-assign]
        return server

    endpoint = Endpoint(SnapshotStore(), serve=serve)
    a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    endpoint.want(a, 30)
    endpoint.want(b, 30)
    endpoint.want(b, 30)  # unchanged: nothing to do
    endpoint.shutdown()
    assert events == [f"bind {a}", f"bind {b}", f"close {a}", f"close {b}"]


def test_a_taken_address_is_retried_every_interval_and_the_old_one_serves_meanwhile() -> None:
    clock = Clock()
    endpoint = Endpoint(SnapshotStore(), clock=clock)
    old = free_port()
    endpoint.want(f"127.0.0.1:{old}", 30)
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        endpoint.want(f"127.0.0.1:{taken}", 30)
        assert endpoint.server is not None and endpoint.server.port == old
        assert endpoint.error is not None and endpoint.error.endswith(
            f"retried every 30s; still serving on 127.0.0.1:{old}")
        clock.now = 29.9
        endpoint.retry()
        assert endpoint.server.port == old
    endpoint.retry()  # freed, but not due yet
    assert endpoint.server.port == old
    clock.now = 30.0
    endpoint.retry()
    assert endpoint.server.port == taken and endpoint.error is None
    endpoint.shutdown()


class Kernel:
    """Which (host, port) pairs are bound; 0.0.0.0 conflicts with any host on its port."""

    def __init__(self) -> None:
        self.bound: set[tuple[str, int]] = set()
        self.blocked: set[tuple[str, int]] = set()  # taken by another process
        self.events: list[str] = []

    def serve(self, store: SnapshotStore, listen: ListenAddress, **_: Any) -> Any:
        kernel = self
        pair = (listen.host, listen.port)
        if any((port == listen.port and "0.0.0.0" in (host, listen.host)) or (host, port) == pair
               for host, port in self.bound | self.blocked):
            self.events.append(f"refused {listen}")
            raise HealthEndpointError(f"cannot listen on {listen}", None, errno.EADDRINUSE)
        self.bound.add(pair)
        self.events.append(f"bind {listen}")

        class Server:
            host, port = pair

            def start(self) -> Server:
                return self

            def shutdown(self) -> None:
                kernel.bound.discard(pair)
                kernel.events.append(f"close {listen}")

        return Server()


def test_the_same_port_on_another_address_is_handed_over() -> None:
    kernel = Kernel()
    endpoint = Endpoint(SnapshotStore(), serve=kernel.serve)
    endpoint.want("127.0.0.1:9808", 30)
    endpoint.want("0.0.0.0:9808", 30)
    assert kernel.events == ["bind 127.0.0.1:9808", "refused 0.0.0.0:9808",
                             "close 127.0.0.1:9808", "bind 0.0.0.0:9808"]
    assert endpoint.error is None and kernel.bound == {("0.0.0.0", 9808)}


def test_a_hand_over_that_fails_binds_the_old_address_again() -> None:
    kernel = Kernel()
    endpoint = Endpoint(SnapshotStore(), serve=kernel.serve)
    endpoint.want("127.0.0.1:9808", 30)
    kernel.blocked.add(("127.0.0.2", 9808))  # another process: on 127.0.0.2 only
    endpoint.want("0.0.0.0:9808", 30)
    assert kernel.events == ["bind 127.0.0.1:9808", "refused 0.0.0.0:9808",
                             "close 127.0.0.1:9808", "refused 0.0.0.0:9808",
                             "bind 127.0.0.1:9808"]
    assert kernel.bound == {("127.0.0.1", 9808)}
    assert endpoint.error is not None and "still serving on 127.0.0.1:9808" in endpoint.error
