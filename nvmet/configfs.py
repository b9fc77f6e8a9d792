"""The filesystem seam: a small interface to the nvmet configfs tree.

Paths are relative to the nvmet root (``subsystems/<nqn>/attr_model``); ``""`` is the
root itself. Errors are :class:`OSError` carrying the kernel's errno. Every mutating
call (write, mkdir, rmdir, symlink, unlink), successful or not, adds one to ``writes``
so callers can prove that a converged apply performs no configfs writes.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

EntryKind = Literal["dir", "file", "link"]


@dataclass(frozen=True)
class Entry:
    """One name in a configfs directory."""

    name: str
    kind: EntryKind
    readable: bool = True
    writable: bool = True


@runtime_checkable
class ConfigFS(Protocol):
    """What the reader and the applier need from configfs (real or fake)."""

    writes: int

    def read(self, path: str) -> str:
        """The attribute's value without the trailing newline."""
        ...

    def write(self, path: str, value: str) -> None:
        """Store ``value`` into an attribute (one write call)."""
        ...

    def mkdir(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def symlink(self, target: str, path: str) -> None:
        """Create link ``path`` pointing at ``target`` (both relative to the root)."""
        ...

    def unlink(self, path: str) -> None: ...

    def list(self, path: str) -> list[Entry]:
        """Entries of a directory, sorted by name."""
        ...

    def exists(self, path: str) -> bool: ...

    def is_link(self, path: str) -> bool: ...

    def readlink(self, path: str) -> str:
        """Target of a link, relative to the root."""
        ...


def join(*parts: str) -> str:
    """Join path parts relative to the nvmet root."""
    return "/".join(p.strip("/") for p in parts if p)


class RealConfigFS:
    """The kernel's configfs under ``root`` (usually ``/sys/kernel/config/nvmet``)."""

    def __init__(self, root: str | os.PathLike[str] = "/sys/kernel/config/nvmet"):
        self.root = Path(root)
        self.writes = 0

    def __repr__(self) -> str:
        return f"RealConfigFS({str(self.root)!r})"

    def _abs(self, path: str) -> str:
        if path.startswith("/") or ".." in path.split("/"):
            raise OSError(errno.EINVAL, f"path must be relative to the nvmet root: {path!r}")
        return str(self.root / path) if path else str(self.root)

    def read(self, path: str) -> str:
        # configfs fills the whole value (at most one page) on the first read: one call.
        fd = os.open(self._abs(path), os.O_RDONLY)
        try:
            data = os.read(fd, 65536)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace").rstrip("\n")

    def write(self, path: str, value: str) -> None:
        self.writes += 1
        data = value.encode("utf-8")
        fd = os.open(self._abs(path), os.O_WRONLY)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise OSError(errno.EIO, f"short write to {path}: {written} of {len(data)} bytes")

    def mkdir(self, path: str) -> None:
        self.writes += 1
        os.mkdir(self._abs(path))

    def rmdir(self, path: str) -> None:
        self.writes += 1
        os.rmdir(self._abs(path))

    def symlink(self, target: str, path: str) -> None:
        self.writes += 1
        os.symlink(self._abs(target), self._abs(path))

    def unlink(self, path: str) -> None:
        self.writes += 1
        os.unlink(self._abs(path))

    def list(self, path: str) -> list[Entry]:
        out = []
        with os.scandir(self._abs(path)) as it:
            for d in it:
                if d.is_symlink():
                    out.append(Entry(d.name, "link"))
                elif d.is_dir(follow_symlinks=False):
                    out.append(Entry(d.name, "dir"))
                else:
                    mode = d.stat(follow_symlinks=False).st_mode
                    out.append(Entry(d.name, "file", readable=bool(mode & stat.S_IRUSR),
                                     writable=bool(mode & stat.S_IWUSR)))
        return sorted(out, key=lambda e: e.name)

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._abs(path))

    def is_link(self, path: str) -> bool:
        return os.path.islink(self._abs(path))

    def readlink(self, path: str) -> str:
        link = self._abs(path)
        target = os.readlink(link)
        full = os.path.normpath(os.path.join(os.path.dirname(link), target))
        return os.path.relpath(full, str(self.root))
