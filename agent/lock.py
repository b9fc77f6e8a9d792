"""One apply at a time per host: an exclusive lock on a file under the run directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import KvagentError


class Busy(KvagentError):
    """Another kvagent apply holds the lock."""


@contextlib.contextmanager
def apply_lock(run_dir: str | os.PathLike[str], *, wait: bool = False,
               timeout: float = 600.0) -> Iterator[None]:
    """Hold ``<run_dir>/apply.lock`` exclusively; raise :class:`Busy` or wait with ``wait``."""
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "apply.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(path)
                if not wait:
                    raise Busy(f"another kvagent apply is running{holder} (lock {path})",
                               "wait for it, or pass --wait to queue behind it") from None
                if time.monotonic() > deadline:
                    raise Busy(f"gave up after {timeout:g}s waiting for the apply lock {path}"
                               f"{holder}") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid else ""
