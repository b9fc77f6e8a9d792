"""The runtime directory (``node.run_dir``, default ``/run/kvagent``), kept private.

It holds the apply lock (:mod:`agent.lock`) and the records the daemon and the
CLI exchange (:mod:`agent.daemonfiles`). Anyone who can create files in it could
take the lock or fake a record, so kvagent only uses it when it is a real
directory (not a symlink) owned by the user kvagent runs as, and makes it 0700
when it is too open (systemd/tmpfiles.d/kvagent.conf creates it 0700; earlier
versions made it 0755 and the lock file 0644).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

from .errors import KvagentError
from .log import get_logger

log = get_logger("rundir")

#: The run directory's mode: the owner only.
DIR_MODE = 0o700
#: Mode of every file kvagent keeps in it.
FILE_MODE = 0o600


class RunDirError(KvagentError):
    """The run directory (or a file in it) is not private to kvagent's user: refused."""


def user_name(uid: int) -> str:
    """The account name of ``uid``, or the number when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def open_private_dir(run_dir: str | os.PathLike[str], *, readonly: bool = False) -> int:
    """An ``O_DIRECTORY`` fd of ``run_dir`` once it is proven ours; the caller closes it.

    Refuses a symlink or a directory owned by another user. Unless ``readonly``, creates
    it 0700 when missing and tightens our own directory's mode to 0700.
    """
    path = Path(run_dir)
    if not readonly:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=DIR_MODE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and path.is_symlink():
            raise RunDirError(
                f"the run directory {path} is a symlink (to {os.readlink(path)}); kvagent "
                "keeps its apply lock only in a real directory",
                f"remove the link and let kvagent create {path}, or set node.run_dir "
                "to a directory of its own") from None
        if exc.errno == errno.ENOTDIR:
            raise RunDirError(f"the run directory {path} is not a directory",
                              "remove it, or set node.run_dir to another path") from None
        raise RunDirError(f"cannot open the run directory {path}: {exc.strerror or exc}",
                          "run kvagent as root, or set node.run_dir") from None
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        if st.st_uid != me:
            raise RunDirError(
                f"the run directory {path} is owned by {user_name(st.st_uid)} (uid "
                f"{st.st_uid}), not by {user_name(me)} who runs kvagent: another user "
                "could take or fake kvagent's apply lock there",
                f"remove {path} (kvagent recreates it 0700), or chown it to "
                f"{user_name(me)}, or set node.run_dir")
        if stat.S_IMODE(st.st_mode) != DIR_MODE and not readonly:
            os.fchmod(fd, DIR_MODE)
            log.warning("run directory was too open; made it private", path=str(path),
                        was=oct(stat.S_IMODE(st.st_mode)), now=oct(DIR_MODE))
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def private_dir(run_dir: str | os.PathLike[str], *, readonly: bool = False) -> Iterator[int]:
    """:func:`open_private_dir` as a context manager (closes the fd)."""
    fd = open_private_dir(run_dir, readonly=readonly)
    try:
        yield fd
    finally:
        os.close(fd)


def open_private_file(dir_fd: int, name: str, display: Path, flags: int) -> int:
    """Open ``name`` in a private directory: no symlink, a regular file of ours, mode 0600.

    ``flags`` are ``os.O_RDONLY`` or ``os.O_RDWR`` (with ``os.O_CREAT`` to create it);
    a file that is ours but too open is tightened to 0600 (not when opened read-only).
    """
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RunDirError(f"{display} is a symlink; kvagent does not follow links there",
                              f"remove {display}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunDirError(f"{display} is not a regular file", f"remove {display}")
        if st.st_uid != os.geteuid():
            raise RunDirError(
                f"{display} is owned by {user_name(st.st_uid)} (uid {st.st_uid}), not by "
                f"{user_name(os.geteuid())} who runs kvagent", f"remove {display}")
        if stat.S_IMODE(st.st_mode) != FILE_MODE and flags & os.O_ACCMODE != os.O_RDONLY:
            os.fchmod(fd, FILE_MODE)
            log.warning("file in the run directory was too open; made it private",
                        path=str(display), was=oct(stat.S_IMODE(st.st_mode)),
                        now=oct(FILE_MODE))
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------- processes
def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # comm (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    return text[text.rfind(")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None when it does not exist.

    A pid plus its start time names one process: a reused pid has another start time.
    """
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22, starttime
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: int | None) -> bool:
    """Whether ``pid`` still runs (not a zombie) and is the one started at ``start_time``."""
    fields = _stat_fields(pid) if pid > 0 else None
    if not fields or fields[0] in ("Z", "X"):
        return False
    return start_time is None or process_start_time(pid) == start_time


def process_uid(pid: int) -> int | None:
    """The effective uid of ``pid`` from ``/proc/<pid>/status``."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_command(pid: int, limit: int = 160) -> str | None:
    """The command line of ``pid`` (arguments joined by spaces), shortened to ``limit``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        raw = b""
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if not text:
        try:
            text = f"[{Path(f'/proc/{pid}/comm').read_text().strip()}]"
        except OSError:
            return None
    return text if len(text) <= limit else text[:limit - 3] + "..."
