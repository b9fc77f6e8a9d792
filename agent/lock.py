"""One apply at a time per host: an exclusive lock on a file under the run directory.

The lock file is ``<node.run_dir>/apply.lock``, mode 0600 in a 0700 directory
owned by kvagent's user (:mod:`agent.rundir`), so no other user can open it and
take the lock. Who holds it is read from ``/proc/locks`` (the kernel's list of
flock holders, matched on the file's device and inode), never from a pid the
holder wrote: a process that is not kvagent is named just as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import progress
from .errors import KvagentError
from .lockholder import LockHolder
from .rundir import (
    open_private_file,
    private_dir,
    process_alive,
    process_command,
    process_uid,
    user_name,
)

#: The lock file's name in node.run_dir.
LOCK_FILE = "apply.lock"
#: Users whose processes hold the lock legitimately (besides the lock file's owner).
KVAGENT_USERS = ("root", "kvagent")
#: The system calls this module makes past Python's own wrappers; the unit's
#: SystemCallFilter must allow them (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("flock",)


class Busy(KvagentError):
    """Another process holds the apply lock; ``holder`` names it when the kernel does."""

    def __init__(self, message: str, hint: str | None = None,
                 holder: LockHolder | None = None):
        super().__init__(message, hint)
        self.holder = holder


def lock_path(run_dir: str | os.PathLike[str]) -> Path:
    """``<run_dir>/apply.lock``."""
    return Path(run_dir) / LOCK_FILE


@contextlib.contextmanager
def apply_lock(run_dir: str | os.PathLike[str], *, wait: bool = False,
               timeout: float = 600.0,
               on_wait: Callable[[LockHolder | None], None] | None = None) -> Iterator[None]:
    """Hold ``<run_dir>/apply.lock`` exclusively; raise :class:`Busy`, or wait with ``wait``.

    While waiting, ``on_wait(holder)`` is called at every retry (a few times a second):
    the CLI prints a message once. The wait is a bounded step (``timeout``) for the
    daemon's watchdog supervisor (:mod:`agent.progress`).
    """
    path = lock_path(run_dir)
    with private_dir(run_dir) as dir_fd:
        fd = open_private_file(dir_fd, LOCK_FILE, path, os.O_RDWR | os.O_CREAT)
    try:
        with progress.step("waiting for the apply lock", timeout if wait else 0.0):
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = lock_holder(path)
                    if not wait:
                        raise Busy(*busy_message(path, holder), holder=holder) from None
                    if time.monotonic() > deadline:
                        held = f" (held by {holder.describe()})" if holder else ""
                        raise Busy(f"gave up after {timeout:g}s waiting for the apply lock "
                                   f"{path}{held}", busy_message(path, holder)[1],
                                   holder=holder) from None
                    if on_wait is not None:
                        on_wait(holder)
                    progress.sleep(0.2)  # a bounded step; SIGTERM ends the wait
        yield
    finally:
        os.close(fd)


def busy_message(path: Path, holder: LockHolder | None) -> tuple[str, str]:
    """(message, hint) for a lock that ``holder`` holds."""
    if holder is not None and holder.foreign:
        return (f"the apply lock {path} is held by a process of another user "
                f"({holder.describe()}), not by kvagent",
                f"it opened the lock before kvagent made it private (0600 in a 0700 "
                f"directory): stop that process (kill {holder.pid})")
    who = f" ({holder.describe()})" if holder else ""
    return (f"another kvagent apply is running{who} (lock {path})",
            "wait for it, or pass --wait to queue behind it")


def lock_holder(path: str | os.PathLike[str]) -> LockHolder | None:
    """Who holds a lock on ``path`` now, from ``/proc/locks``; None when nobody (or unknown).

    Reads only: it needs neither the lock file open nor the lock itself.
    """
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    same_inode: list[int] = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":  # "->": a waiter, not a holder
            continue
        try:
            pid = int(fields[4])
        except ValueError:
            continue
        if fields[5] == dev:
            return _describe(_living(pid, fields[5]), st.st_uid)
        if fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            same_inode.append(pid)
    # Stacked filesystems (overlayfs) may show another device than stat(): match the inode.
    if len(same_inode) != 1:
        return None
    return _describe(_living(same_inode[0], f":{st.st_ino}"), st.st_uid)


def _living(pid: int, key: str) -> int:
    """The process holding the lock now.

    /proc/locks names the process that took a flock; it may have exited while a child
    that inherited the descriptor keeps the lock (``flock FILE cmd &`` and the like).
    Then the holder is the process whose ``/proc/<pid>/fdinfo`` lists the lock.
    """
    if pid <= 0 or process_alive(pid, None):
        return pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for info in (entry / "fdinfo").iterdir():
                text = info.read_text()
                if "lock:" in text and any(
                        line.startswith("lock:") and line.split()[6].endswith(key)
                        for line in text.splitlines() if len(line.split()) > 6):
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    return pid


def _describe(pid: int, owner_uid: int) -> LockHolder:
    uid = process_uid(pid) if pid > 0 else None
    user = user_name(uid) if uid is not None else None
    foreign = uid is not None and uid not in (0, owner_uid) and user not in KVAGENT_USERS
    return LockHolder(pid=pid, uid=uid, user=user,
                      command=process_command(pid) if pid > 0 else None, foreign=foreign)
