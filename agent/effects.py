"""The seam for kvagent's writes outside configfs, commands and records.

Every function here makes one change and then counts it as a failpoint *step*
(:func:`agent.failpoints.step`) with a stable kind, so the crash tests can kill a pass
right after it and a pass that makes it every time does not look converged:

``sysfs.write``    an attribute written under ``/sys`` (controller timeouts, DH-HMAC-CHAP
                   secrets, a subsystem's iopolicy)
``file.write``     a file written whole (engine configs): atomic, via a temp file
``file.create``    a file created only if absent (identity files)
``secret.write``   a secret written 0600 (``kvagent keys generate``)
``file.remove``    a file removed (pool files, stale renders)
``record.remove``  a record removed (a forgotten pool's, a destroyed pool's manifest)
``tree.remove``    a directory removed with all it holds (a pool's rendered configs)
``dir.make``       a directory made (engine dirs, mount points, pool directories)
``dir.owner``      an open directory's owner changed
``dir.mode``       an open directory's mode changed
``dir.remove``     an empty directory removed (mount points, pool directories)
``dir.seal``       a directory's immutable attribute set (a GPU pool's mount point)
``dir.unseal``     a directory's immutable attribute cleared (before its removal)
``file.rename``    a file renamed into place (pool files)

The subject of a step is a path, never what was written (secrets go through here).
Callers read first and call these only for a change: a converged pass makes none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import failpoints

StrPath = str | os.PathLike[str]


def _data(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def fsync_dir(directory: StrPath) -> None:
    """fsync a directory (a rename or create in it is durable after this)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sysfs_write(path: StrPath, data: str | bytes, *, truncate: bool = False) -> None:
    """Write one sysfs attribute (one ``write``; the kernel's refusal is an OSError)."""
    sysfs_write_all([(path, data)], truncate=truncate)


def sysfs_write_all(writes: Sequence[tuple[StrPath, str | bytes]], *,
                    truncate: bool = False) -> None:
    """Write several attributes in order, all opened before any is written (nothing is
    written when one cannot be opened); each write is a step."""
    flags = os.O_WRONLY | (os.O_TRUNC if truncate else 0)
    fds: list[int] = []
    try:
        for path, _ in writes:
            fds.append(os.open(path, flags))
        for fd, (path, data) in zip(fds, writes, strict=True):
            os.write(fd, _data(data))
            failpoints.step("sysfs.write", os.fspath(path))
    finally:
        for fd in fds:
            os.close(fd)


def write_file(path: StrPath, data: str | bytes, mode: int = 0o644, *,
               kind: str = "file.write") -> None:
    """Write ``path`` whole and atomically: a temp file next to it (``O_EXCL |
    O_NOFOLLOW``, mode set with fchmod before the data), fsynced and renamed over it,
    then the directory fsynced. A link at the temp name is never followed; one at
    ``path`` is replaced, not written through."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path)) or "/"
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, mode)
        view = memoryview(_data(data))
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise
    fsync_dir(directory)
    failpoints.step(kind, path)


def create_file(path: StrPath, data: str | bytes, mode: int, *,
                kind: str = "file.create") -> bool:
    """Create ``path`` with ``data`` unless it exists, atomically (a temp file, fsynced,
    then linked into place: the link fails if someone made ``path`` meanwhile). False
    when it appeared (nothing was changed: no step)."""
    path = Path(path)
    tfd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(tfd, "wb") as f:
            f.write(_data(data))
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    failpoints.step(kind, str(path))
    return True


def rename(src: StrPath, dst: StrPath, *, kind: str = "file.rename") -> None:
    """Rename ``src`` to ``dst`` and fsync ``dst``'s directory."""
    os.rename(src, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)) or "/")
    failpoints.step(kind, os.fspath(dst))


def unlink(path: StrPath, *, dir_fd: int | None = None, missing_ok: bool = False,
           subject: str | None = None, kind: str = "file.remove") -> bool:
    """Remove a file (``path`` relative to ``dir_fd`` when given; ``subject``: the path
    the step names then). Whether it was removed (False: it was not there and
    ``missing_ok``; no step)."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    failpoints.step(kind, subject or os.fspath(path))
    return True


def remove_tree(path: StrPath) -> None:
    """Remove a directory and everything in it (links inside are removed, never
    followed: :func:`shutil.rmtree`)."""
    shutil.rmtree(path)
    failpoints.step("tree.remove", os.fspath(path))


def mkdir(path: StrPath, mode: int = 0o777, *, dir_fd: int | None = None,
          exist_ok: bool = False, subject: str | None = None) -> bool:
    """Make one directory (``mode`` less the umask); whether it was made (False: a
    directory was there and ``exist_ok``; no step). Something else there raises
    FileExistsError, as ``Path.mkdir`` does."""
    try:
        os.mkdir(path, mode, dir_fd=dir_fd)
    except FileExistsError:
        if exist_ok and (dir_fd is not None or os.path.isdir(path)):
            return False
        raise
    failpoints.step("dir.make", subject or os.fspath(path))
    return True


def make_dirs(path: StrPath, mode: int = 0o777, *, parents_mode: int = 0o777) -> list[str]:
    """Make ``path`` and its missing parents (as ``Path.mkdir(parents=True,
    exist_ok=True)``: the parents get ``parents_mode``); the directories made, top
    first. An existing non-directory raises FileExistsError."""
    missing = missing_dirs(path)
    return [d for d in missing
            if mkdir(d, mode if d == missing[-1] else parents_mode, exist_ok=True)]


def missing_dirs(path: StrPath) -> list[str]:
    """The directories :func:`make_dirs` would make for ``path``, top first (reads only)."""
    missing: list[str] = []
    current = os.path.normpath(os.path.abspath(path))
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return list(reversed(missing))


def fchown(fd: int, uid: int, gid: int, *, subject: str) -> None:
    """Give the open directory ``fd`` another owner and group (``subject``: its path, for
    the step): the directory opened and checked is the one changed, whatever its path
    leads to now."""
    os.fchown(fd, uid, gid)
    failpoints.step("dir.owner", subject)


def fchmod(fd: int, mode: int, *, subject: str) -> None:
    """Give the open directory ``fd`` another mode (see :func:`fchown`)."""
    os.fchmod(fd, mode)
    failpoints.step("dir.mode", subject)


def seal_dir(path: str, on: bool) -> None:
    """Set (``on``) or clear a directory's immutable attribute
    (:mod:`agent.immutable`: the directory itself, never what is mounted on it)."""
    from .immutable import set_immutable

    set_immutable(path, on)
    if on:
        failpoints.step("dir.seal", path)
    else:
        failpoints.step("dir.unseal", path)


def rmdir(path: StrPath) -> None:
    """Remove an empty directory (OSError when it is not empty)."""
    os.rmdir(path)
    failpoints.step("dir.remove", os.fspath(path))
