"""The filesystem seam: a small interface to the nvmet configfs tree.

Paths are relative to the nvmet root (``subsystems/<nqn>/attr_model``); ``""`` is the
root itself. Errors are :class:`OSError` carrying the kernel's errno (and, from
``read_attrs``/``children``, the failing path relative to the root as ``filename``). Every mutating
call (write, mkdir, rmdir, symlink, unlink), successful or not, adds one to ``writes``
so callers can prove that a converged apply performs no configfs writes.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
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

    def read_attrs(self, path: str, names: Iterable[str]) -> dict[str, str]:
        """Values of the attribute files ``names`` of directory ``path``, one read each.

        A name the directory does not have is left out (an attribute this kernel lacks);
        ENOENT when ``path`` itself is gone.
        """
        ...

    def children(self, path: str) -> tuple[list[str], list[str], list[str]]:
        """Names of the sub-directories, links and files in ``path`` (one listing, no stat
        per entry)."""
        ...

    def read_each(self, path: str, children: Sequence[str],
                  names: Iterable[str]) -> list[dict[str, str]]:
        """:meth:`read_attrs` of every directory ``path/<child>``, in ``children``'s order
        (``children`` are names listed in ``path``: no ``/``, no ``..``)."""
        ...


#: Files :meth:`RealConfigFS.read_each` keeps open before closing them together.
CLOSE_BATCH = 64


def close_fds(fds: list[int]) -> None:
    """Close every fd in ``fds`` (and empty it): one ``close_range`` per run of
    consecutive numbers (``os.closerange``). Safe with other threads opening files: a run
    holds only fds that are open and ours, so no other thread's fd can be among them."""
    if not fds:
        return
    fds.sort()
    start = prev = fds[0]
    for fd in fds[1:]:
        if fd != prev + 1:
            os.closerange(start, prev + 1)
            start = fd
        prev = fd
    os.closerange(start, prev + 1)
    fds.clear()


def join(*parts: str) -> str:
    """Join path parts relative to the nvmet root."""
    return "/".join(p.strip("/") for p in parts if p)


class RealConfigFS:
    """The kernel's configfs under ``root`` (usually ``/sys/kernel/config/nvmet``)."""

    def __init__(self, root: str | os.PathLike[str] = "/sys/kernel/config/nvmet"):
        self.root = Path(root)
        self._root = str(self.root)
        self.writes = 0

    def __repr__(self) -> str:
        return f"RealConfigFS({str(self.root)!r})"

    def _abs(self, path: str) -> str:
        if path.startswith("/") or ".." in path.split("/"):
            raise OSError(errno.EINVAL, f"path must be relative to the nvmet root: {path!r}")
        return f"{self._root}/{path}" if path else self._root

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

    def read_attrs(self, path: str, names: Iterable[str]) -> dict[str, str]:
        # The hot loop of a converged pass: plain os calls, one open/read/close per file.
        base = self._abs(path)
        out = {}
        for name in names:
            full = f"{base}/{name}"
            try:
                fd = os.open(full, os.O_RDONLY)
            except FileNotFoundError:
                if os.path.isdir(base):
                    continue  # this kernel has no such attribute
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, join(path, name)) from None
            try:
                data = os.read(fd, 65536)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, join(path, name)) from None
            finally:
                os.close(fd)
            out[name] = data.decode("utf-8", "replace").rstrip("\n")
        return out

    def read_each(self, path: str, children: Sequence[str],
                  names: Iterable[str]) -> list[dict[str, str]]:
        # The hot loop of a converged pass (every namespace of a subsystem): one open of
        # the parent, then per file an openat() relative to it (a two-name path walk
        # instead of the whole path) and a read; the files are closed in batches, one
        # close_range() per run of consecutive fds (a system call per file less: 10-20 %
        # of the read under TCG); as little Python as possible per file (local names, no
        # per-file helper calls). Every file is opened and read on every call.
        names = tuple(names)
        base = self._abs(path)
        _open, _read, rdonly = os.open, os.read, os.O_RDONLY
        pfd = _open(base, rdonly | os.O_DIRECTORY)
        out: list[dict[str, str]] = []
        fds: list[int] = []
        try:
            for child in children:
                got: dict[str, str] = {}
                for name in names:
                    try:
                        fd = _open(f"{child}/{name}", rdonly, dir_fd=pfd)
                    except FileNotFoundError:
                        if os.path.isdir(f"{base}/{child}"):
                            continue  # this kernel has no such attribute
                        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT),
                                      f"{path}/{child}") from None
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror,
                                      f"{path}/{child}/{name}") from None
                    fds.append(fd)
                    try:
                        data = _read(fd, 65536)
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror,
                                      f"{path}/{child}/{name}") from None
                    try:
                        got[name] = data.decode().rstrip("\n")
                    except UnicodeDecodeError:
                        got[name] = data.decode("utf-8", "replace").rstrip("\n")
                out.append(got)
                if len(fds) >= CLOSE_BATCH:
                    close_fds(fds)
        finally:
            close_fds(fds)
            os.close(pfd)
        return out

    def children(self, path: str) -> tuple[list[str], list[str], list[str]]:
        dirs: list[str] = []
        links: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(self._abs(path)) as it:
                for d in it:  # the kind comes from the listing (d_type): no stat
                    if d.is_symlink():
                        links.append(d.name)
                    elif d.is_dir(follow_symlinks=False):
                        dirs.append(d.name)
                    else:
                        files.append(d.name)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        return dirs, links, files

    def readlink(self, path: str) -> str:
        link = self._abs(path)
        target = os.readlink(link)
        full = os.path.normpath(os.path.join(os.path.dirname(link), target))
        return os.path.relpath(full, str(self.root))
