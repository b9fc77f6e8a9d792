"""The mount table (/proc/self/mountinfo), read by both roles.

Every function takes the mount table as a parameter, so tests can give a file of
their own. The kernel's own table is parsed once per change (:class:`KernelMountTable`):
a pass looks at it once per mount and per engine, and with many mounts (a pool of many
namespaces, a host running containers) reading and parsing it again each time was most
of a namespace's mount and hand-off under TCG.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo, the parts kvagent needs."""

    mount_point: str
    device: str  # major:minor
    fstype: str
    source: str
    options: str  # per-mount options (rw,noatime,...)
    super_options: str = ""  # the filesystem's own (for xfs: prjquota, ...)
    #: the optional fields: propagation (shared:N, master:N, unbindable)
    optional: tuple[str, ...] = ()


def _unescape(text: str) -> str:
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Parse mountinfo (fields after ' - ' are fstype, source, super options)."""
    entries = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        entries.append(MountEntry(_unescape(fields[4]), fields[2], tail[0], _unescape(tail[1]),
                                  fields[5], tail[2] if len(tail) > 2 else "",
                                  tuple(fields[6:])))
    return entries


class KernelMountTable:
    """This process's mount table, read and parsed again only when it changed.

    The kernel marks an open ``/proc/self/mountinfo`` for ``poll`` (``POLLPRI``) whenever
    a mount or unmount changed the table since the descriptor last saw it (proc(5)); the
    check consumes the mark, so each read first polls, then reads: a change during the
    read is seen at the next one. A forked child starts afresh (its own descriptor, its
    own read): it would otherwise share the parent's open file, whose mark one child can
    consume while another still holds the parent's stale table. ``open_`` and
    ``poller`` are seams for tests.
    """

    def __init__(self, path: Path = MOUNTINFO, *,
                 open_: Callable[[str], int] | None = None,
                 poller: Callable[[], select.poll] = select.poll):
        self.path = path
        self._open = open_ or (lambda p: os.open(p, os.O_RDONLY | os.O_CLOEXEC))
        self._poller = poller
        self._fd: int | None = None
        self._poll: select.poll | None = None
        self._entries: list[MountEntry] | None = None
        self._points: dict[str, MountEntry] = {}
        self._lock = threading.Lock()
        #: Times the table was read and parsed (tests and benchmarks look).
        self.reads = 0
        _TABLES.add(self)

    def _forget(self) -> None:
        """Drop the descriptor, its poll and the table (a forked child's first step)."""
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._poll, self._entries, self._points = None, None, None, {}

    def entries(self) -> list[MountEntry]:
        """The mount table now."""
        with self._lock:
            return list(self._fresh())

    def at(self, path: str) -> MountEntry | None:
        """The mount whose mount point is exactly ``path`` now (the last one wins)."""
        with self._lock:
            self._fresh()
            return self._points.get(os.path.normpath(path))

    def _fresh(self) -> list[MountEntry]:
        if self._fd is None:
            self._fd = self._open(str(self.path))
            self._poll = self._poller()
            self._poll.register(self._fd, select.POLLPRI | select.POLLERR)
        assert self._poll is not None
        if self._poll.poll(0) or self._entries is None:
            self._entries = parse_mountinfo(self._read())
            self._points = {e.mount_point: e for e in self._entries}
            self.reads += 1
        return self._entries

    def _read(self) -> str:
        assert self._fd is not None
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="surrogateescape")


def _forget_in_children() -> None:
    for table in list(_TABLES):
        table._forget()


#: Every table of this process: a forked child makes each start afresh (one hook for all).
_TABLES: weakref.WeakSet[KernelMountTable] = weakref.WeakSet()
os.register_at_fork(after_in_child=_forget_in_children)


#: The kernel's table of this process (the default of every function here).
KERNEL_TABLE = KernelMountTable()


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[MountEntry]:
    """The mount table: the kernel's (parsed once per change), or a file's (tests)."""
    if mountinfo == MOUNTINFO:
        return KERNEL_TABLE.entries()
    return parse_mountinfo(mountinfo.read_text())


def mounted_at(path: str, mountinfo: Path = MOUNTINFO) -> MountEntry | None:
    """The mount whose mount point is exactly ``path`` (the last one wins, as the kernel shows)."""
    if mountinfo == MOUNTINFO:
        return KERNEL_TABLE.at(path)
    found = None
    for entry in read_mounts(mountinfo):
        if entry.mount_point == os.path.normpath(path):
            found = entry
    return found


def filesystem_type(path: Path | str, mountinfo: Path = MOUNTINFO,
                    mounts: list[MountEntry] | None = None) -> str | None:
    """Type of the filesystem holding ``path`` (the longest mount point that contains it);
    ``mounts``: the mount table when already read (else read from ``mountinfo``)."""
    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for m in read_mounts(mountinfo) if mounts is None else mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (
                best is None or len(mp) >= best[0]):
            best = (len(mp), m.fstype)
    return best[1] if best else None


def filesystem_device(path: Path | str, mountinfo: Path = MOUNTINFO) -> str | None:
    """The source of the filesystem holding ``path`` (its device, e.g. ``/dev/nvme0n1p2``,
    or ``tmpfs`` for a filesystem without one), matched by the file's ``st_dev`` (the
    nearest existing parent's if ``path`` does not exist); None if not found."""
    probe = Path(path)
    while True:
        try:
            dev = os.stat(probe).st_dev
            break
        except OSError:
            if probe.parent == probe:
                return None
            probe = probe.parent
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    found = [m.source for m in read_mounts(mountinfo) if m.device == majmin]
    return found[-1] if found else None
