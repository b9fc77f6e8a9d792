"""What lets a server thread sleep in ``select`` until there is something to do: a pipe
another thread writes to (a stop), and the wait until the oldest connection's deadline
(no deadline, no timeout). An idle agent's server threads wake for nothing."""

from __future__ import annotations

import contextlib
import os
import selectors
from collections.abc import Mapping
from typing import Any


class Waker:
    """A pipe registered in ``selector``: :meth:`wake` (any thread) ends its ``select``."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        selector.register(self._read, selectors.EVENT_READ, self)

    def wake(self) -> None:
        """Make the selector's next (or current) ``select`` return (closed: nothing)."""
        if self._write >= 0:
            with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                os.write(self._write, b"\0")

    def drain(self) -> None:
        """Take the wake-ups written so far."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass

    def close(self) -> None:
        """Close both ends (the selector must not select on it any more); twice is
        harmless, and a closed waker never writes to a descriptor number reused since."""
        for fd in (self._read, self._write):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1


def until_oldest_deadline(waiting: Mapping[Any, Any], deadline: float,
                          now: float) -> float | None:
    """Seconds until the oldest of ``waiting`` (oldest first; each with ``began``) is due
    at ``began + deadline``, at least 0; None when nothing waits."""
    for item in waiting.values():
        return max(0.0, item.began + deadline - now)
    return None
