"""kvagent's own records on disk (JSON files under node.state_dir), written atomically.

These records are how kvagent proves ownership of things it cannot tag
(whole devices it exported, nvmet ports and hosts it created, files it made).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from . import failpoints
from .effects import fsync_dir
from .errors import KvagentError


class StateError(KvagentError):
    """A state file exists but cannot be read: never treated as empty."""


#: The most bytes a record may have (the largest, target.json at 1024 namespaces, is a
#: few hundred KiB): anything bigger is not kvagent's.
MAX_RECORD_BYTES = 64 << 20


def trust_problem(st: os.stat_result) -> str | None:
    """Why a file or directory with ``st`` cannot hold kvagent's records (None: it can):
    it must be root's (or this process's user's) and writable by nobody else (its group
    may write only when that is root's group)."""
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0):
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}, "
                f"group {st.st_gid})")
    return None


def read_record(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> bytes | None:
    """The bytes of a record (None when it does not exist), read as hostile input: its
    directory must be trusted (:func:`trust_problem`), the file is opened below that
    directory's fd with ``O_NOFOLLOW`` (a link is refused, never followed) and must be a
    trusted regular file of at most ``max_bytes``. Anything else is a StateError naming
    the path and the fix."""
    path = Path(path)
    fix = (f"kvagent's records are root's alone: chown root:root {path.parent} {path}; "
           f"chmod go-w {path.parent} {path}; or restore them from backup")
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot open {path.parent}: {exc.strerror}", fix) from None
    try:
        problem = trust_problem(os.fstat(dfd))
        if problem:
            raise StateError(f"{path.parent} {problem}: kvagent will not trust the records "
                             "in it", fix)
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            what = ("is a symbolic link; kvagent does not follow links to its records"
                    if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}")
            raise StateError(f"{path} {what}", fix) from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
                   else trust_problem(st))
        if problem is None and st.st_size > max_bytes:
            problem = f"has {st.st_size} bytes, more than a record may ({max_bytes})"
        if problem:
            raise StateError(f"{path} {problem}: kvagent will not trust it", fix)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StateError(f"{path} grew past {max_bytes} bytes while read", fix)
    return data


def read_json(path: Path, default: Any) -> Any:
    """Read a JSON record (:func:`read_record`); ``default`` only when the file does not
    exist."""
    raw = read_record(path)
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StateError(f"{path} is corrupt ({exc}); kvagent will not guess what it owns",
                         "restore it from backup or inspect it; it is kvagent's record of "
                         "what it created") from None
    except RecursionError:
        raise StateError(f"{path} is corrupt (nested too deep); kvagent will not guess "
                         "what it owns", "restore it from backup or inspect it") from None


def json_text(data: Any) -> str:
    """A record's text as :func:`write_json` writes it (sorted keys, indented by 2)."""
    return json.dumps(data, indent=2, sort_keys=True)


def write_json(path: Path, data: Any) -> None:
    """Write a JSON record atomically (temp file in the same directory, fsync, rename,
    fsync of the directory)."""
    write_json_text(path, json_text(data))


def write_json_text(path: Path, text: str) -> None:
    """Write a record's JSON text (:func:`json_text`) as :func:`write_json` does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    failpoints.step("record", str(path))
