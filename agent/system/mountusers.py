"""Which processes keep a mount busy (what ``fuser -vm`` shows), read from ``/proc``.

Asked only when an unmount was refused (EBUSY), never on a converged pass: it reads
every process's ``cwd``, ``root``, ``exe``, open files and mapped files. Paths come
from the links' text (no ``stat``), so this also works on a filesystem that shut down
and answers EIO to everything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class MountUser:
    """A process that uses a mount, and how (``cwd``, ``open file``, ...)."""

    pid: int
    command: str
    how: str

    def describe(self) -> str:
        return f"{self.command} (pid {self.pid}, {self.how})"


def _under(target: str, mount: str) -> bool:
    target = target.removesuffix(" (deleted)")
    return target == mount or target.startswith(mount.rstrip("/") + "/")


def _link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _how(proc: Path, mount: str) -> str | None:
    for name, how in (("cwd", "cwd"), ("root", "root"), ("exe", "executable")):
        target = _link(proc / name)
        if target is not None and _under(target, mount):
            return how
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        fds = []
    for fd in fds:
        target = _link(proc / "fd" / fd)
        if target is not None and _under(target, mount):
            return "open file"
    try:
        maps = (proc / "maps").read_text(errors="replace")
    except OSError:
        maps = ""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and _under(parts[5], mount):
            return "mapped file"
    return None


def mount_users(mount: str, proc: Path = PROC, limit: int = 8) -> list[MountUser]:
    """Up to ``limit`` processes using ``mount`` (anything beneath it), by pid."""
    mount = os.path.normpath(mount)
    found: list[MountUser] = []
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        how = _how(proc / str(pid), mount)
        if how is None:
            continue
        try:
            command = (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            command = "?"
        found.append(MountUser(pid, command, how))
        if len(found) >= limit:
            break
    return found
