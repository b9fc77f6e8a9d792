"""The kernel log lines a fabrics command made (``/dev/kmsg``, host-side NVMe lines only).

A failed connect's reason is often only in the kernel's log (``Connect ... is not
allowed``, the NVMe status): :func:`agent.initiator.nvme.failures.run_fabrics` marks the
log before a command and reads what came after it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Protocol


class KernelLogReader(Protocol):
    """What a fabrics command run needs of a kernel log (tests give their own)."""

    def mark(self) -> Any:
        """A position to read from, taken before a command."""
        ...

    def since(self, mark: Any) -> list[str]:
        """The lines logged after ``mark`` (and the mark given up)."""
        ...


class KernelLog:
    """Reads new kernel log records from ``/dev/kmsg`` (host-side NVMe lines only).

    ``mark()`` before a command, ``since(mark)`` after it. Without access to
    the kernel log it returns nothing (the errors then carry nvme-cli's text only).
    """

    _KEEP = re.compile(r"^(nvme |nvme_fabrics|nvme_tcp|nvme_rdma|nvme_fc|nvme_core)")

    def __init__(self, path: str = "/dev/kmsg"):
        self.path = path

    def mark(self) -> int | None:
        """An open descriptor at the log's end (None: no access to the kernel log)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            os.lseek(fd, 0, os.SEEK_END)
            # The sequence number of the next record is what we want; /dev/kmsg
            # cannot tell it without reading, so remember the fd position instead.
            return fd
        except OSError:
            os.close(fd)
            return None

    def since(self, mark: int | None) -> list[str]:
        """The NVMe lines logged since ``mark`` (which is closed)."""
        if mark is None:
            return []
        lines: list[str] = []
        try:
            while True:
                try:
                    record = os.read(mark, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:
                    continue  # records were overwritten; keep reading
                if not record:
                    break
                text = record.decode(errors="replace")
                _, _, message = text.partition(";")
                message = message.split("\n", 1)[0].strip()
                if self._KEEP.match(message):
                    lines.append(message)
        except OSError:
            pass
        finally:
            os.close(mark)
        return lines


class NoKernelLog:
    """A kernel log that shows nothing (tests, or hosts without /dev/kmsg access)."""

    def mark(self) -> None:
        """Nothing to mark."""
        return None

    def since(self, mark: object) -> list[str]:
        """No lines."""
        return []

