"""The systemd notify protocol (sd_notify) over ``$NOTIFY_SOCKET``, standard library only.

Each message is one datagram of newline-separated ``KEY=value`` lines sent to
the AF_UNIX socket systemd names in ``$NOTIFY_SOCKET`` (a path, or ``@name``
for the abstract namespace). Without ``$NOTIFY_SOCKET`` (not started by
systemd, or Type= is not notify) every call is a no-op that returns False.

Sequence the agent uses (see systemd/kvagent.service):
``READY=1`` after the first pass; ``STATUS=...`` after each; ``WATCHDOG=1`` from a
supervisor thread while the agent makes progress (:mod:`agent.health.watchdog`: a
wedged step stops the pings and systemd restarts it);
``RELOADING=1`` + ``MONOTONIC_USEC`` when a SIGHUP reload starts and ``READY=1``
when it ends; ``STOPPING=1`` on SIGTERM.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

from ..log import get_logger

log = get_logger("health.notify")


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def socket_address(raw: str) -> str | None:
    """The AF_UNIX address for a ``$NOTIFY_SOCKET`` value (``@x`` → abstract ``\\0x``).

    None for forms this module does not speak (e.g. ``vsock:...`` of systemd ≥ 254).
    """
    if raw.startswith("@") and len(raw) > 1:
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None


class Notifier:
    """Sends sd_notify messages; ``env`` defaults to ``os.environ`` (read at each call)."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 clock_usec: Callable[[], int] = monotonic_usec,
                 pid: Callable[[], int] = os.getpid):
        self._env = env
        self._clock_usec = clock_usec
        self._pid = pid

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    @property
    def enabled(self) -> bool:
        return bool(self.env.get("NOTIFY_SOCKET"))

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``KEY=value`` each) as one datagram; True if it was sent."""
        raw = self.env.get("NOTIFY_SOCKET")
        if not raw:
            return False
        address = socket_address(raw)
        if address is None:
            log.warning("NOTIFY_SOCKET has a form kvagent does not support; not notifying",
                        notify_socket=raw)
            return False
        message = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, address)
        except OSError as exc:
            log.warning("could not notify systemd", notify_socket=raw,
                        error=exc.strerror or str(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup (or a reload) finished: ``READY=1`` (and ``STATUS=`` if given)."""
        return self.notify("READY=1", *(() if status is None else (_status(status),)))

    def status(self, text: str) -> bool:
        """A one-line status that ``systemctl status`` shows."""
        return self.notify(_status(text))

    def watchdog(self) -> bool:
        """Keep-alive ping: ``WATCHDOG=1``."""
        return self.notify("WATCHDOG=1")

    def reloading(self) -> bool:
        """A reload starts: ``RELOADING=1`` with ``MONOTONIC_USEC`` (systemd ≥ 253 wants it)."""
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={self._clock_usec()}")

    def stopping(self) -> bool:
        """Shutdown starts: ``STOPPING=1``."""
        return self.notify("STOPPING=1")

    def watchdog_interval(self) -> float | None:
        """Seconds systemd waits for a ``WATCHDOG=1`` (``$WATCHDOG_USEC``), or None.

        None when no watchdog is set, or ``$WATCHDOG_PID`` names another process.
        Ping at half this interval or more often.
        """
        usec = self.env.get("WATCHDOG_USEC")
        if not usec:
            return None
        pid = self.env.get("WATCHDOG_PID")
        try:
            if pid and int(pid) != self._pid():
                return None
            value = int(usec)
        except ValueError:
            log.warning("ignoring malformed watchdog settings", watchdog_usec=usec,
                        watchdog_pid=pid)
            return None
        return value / 1_000_000 if value > 0 else None


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())  # one line: a newline would end the field


_default = Notifier()


def ready(status: str | None = None) -> bool:
    """``READY=1`` to ``$NOTIFY_SOCKET``."""
    return _default.ready(status)


def status(text: str) -> bool:
    """``STATUS=text`` to ``$NOTIFY_SOCKET``."""
    return _default.status(text)


def watchdog() -> bool:
    """``WATCHDOG=1`` to ``$NOTIFY_SOCKET``."""
    return _default.watchdog()


def reloading() -> bool:
    """``RELOADING=1`` + ``MONOTONIC_USEC`` to ``$NOTIFY_SOCKET``."""
    return _default.reloading()


def stopping() -> bool:
    """``STOPPING=1`` to ``$NOTIFY_SOCKET``."""
    return _default.stopping()


def watchdog_interval() -> float | None:
    """``$WATCHDOG_USEC`` in seconds when the watchdog applies to this process, else None."""
    return _default.watchdog_interval()
