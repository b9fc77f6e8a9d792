"""sd_notify messages, received on AF_UNIX datagram sockets the tests bind themselves."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

from agent.health import notify
from agent.health.notify import Notifier, socket_address


@pytest.fixture(params=["path", "abstract"])
def listener(request, tmp_path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket like systemd's, and the NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        path = str(tmp_path / "notify.sock")
        sock.bind(path)
        value = path
    else:
        name = f"kvagent-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        value = "@" + name
    sock.settimeout(5)
    try:
        yield sock, value
    finally:
        sock.close()


def receive(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_messages(listener, monkeypatch) -> None:
    sock, value = listener
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert notify.ready() is True
    assert receive(sock) == "READY=1"
    assert notify.status("2 pools ok\nnext pass in 30s") is True
    assert receive(sock) == "STATUS=2 pools ok next pass in 30s"
    assert notify.watchdog() is True
    assert receive(sock) == "WATCHDOG=1"
    assert notify.stopping() is True
    assert receive(sock) == "STOPPING=1"


def test_reloading_carries_monotonic_usec(listener) -> None:
    sock, value = listener
    n = Notifier(env={"NOTIFY_SOCKET": value}, clock_usec=lambda: 123456789)
    assert n.reloading() is True
    assert receive(sock) == "RELOADING=1\nMONOTONIC_USEC=123456789"
    assert n.ready("reloaded") is True
    assert receive(sock) == "READY=1\nSTATUS=reloaded"


def test_real_monotonic_usec_is_clock_monotonic(listener, monkeypatch) -> None:
    import time

    sock, value = listener
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notify.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = receive(sock).split("\n")
    assert first == "RELOADING=1"
    key, usec = second.split("=")
    assert key == "MONOTONIC_USEC" and before <= int(usec) <= after


def test_no_socket_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.ready() is False
    assert notify.watchdog() is False
    assert Notifier(env={}).enabled is False


def test_unreachable_socket_is_reported_not_raised(tmp_path) -> None:
    n = Notifier(env={"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert n.ready() is False
    assert Notifier(env={"NOTIFY_SOCKET": "vsock:2:1234"}).ready() is False


def test_socket_address_forms() -> None:
    assert socket_address("@abc") == "\0abc"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("relative") is None
    assert socket_address("@") is None


def test_watchdog_interval() -> None:
    pid = os.getpid()
    assert Notifier(env={}).watchdog_interval() is None
    assert Notifier(env={"WATCHDOG_USEC": "120000000"}).watchdog_interval() == 120.0
    assert Notifier(env={"WATCHDOG_USEC": "5000000",
                         "WATCHDOG_PID": str(pid)}).watchdog_interval() == 5.0
    # Meant for another process (e.g. a parent that exec'd us without unsetting it).
    assert Notifier(env={"WATCHDOG_USEC": "5000000",
                         "WATCHDOG_PID": str(pid + 1)}).watchdog_interval() is None
    assert Notifier(env={"WATCHDOG_USEC": "soon"}).watchdog_interval() is None
    assert Notifier(env={"WATCHDOG_USEC": "0"}).watchdog_interval() is None


def test_module_watchdog_interval_reads_environment(monkeypatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2500000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert notify.watchdog_interval() == 2.5
