"""Per-engine directories on a pool's mounts, their capacity caps and their usage.

``prepare(mounts, engine)`` makes ``<mount>/<kind>`` on each namespace mount with
the owner, group and mode from the config, fixing drift and reporting what it
changed. ``engine_capacities`` splits the pool: explicit percentages as given,
the rest of 90% evenly among engines without one. ``usage`` is what an engine's
directory holds on disk.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from .. import effects
from ..config.model import EngineConfig
from ..errors import KvagentError, UsageError
from ..system.dirfd import DIR_FLAGS

#: Engines together never get more than this share of a pool: several engines
#: never evict on disk and leave files behind after a restart.
POOL_SHARE_PERCENT = 90


@dataclass(frozen=True)
class PreparedDir:
    """One engine directory after ``prepare``; ``changes`` says what was done (empty: nothing)."""

    path: str
    uid: int
    gid: int
    mode: int
    changes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def engine_dir(mount: str, kind: str) -> str:
    """The directory of engine ``kind`` on one namespace mount."""
    return os.path.join(mount, kind)


def resolve_user(name: str) -> int:
    """uid of a user name or numeric id; UsageError when the user does not exist."""
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise UsageError(f"engine owner {name!r}: no such user on this host") from None


def resolve_group(name: str) -> int:
    """gid of a group name or numeric id; UsageError when the group does not exist."""
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise UsageError(f"engine group {name!r}: no such group on this host") from None


def prepare(mounts: Sequence[str], engine: EngineConfig, *, require_mount: bool = True,
            ) -> tuple[PreparedDir, ...]:
    """Create or fix ``<mount>/<kind>`` on every mount; idempotent.

    With ``require_mount`` (the default) each mount must be a mount point, so a
    failed mount never sends an engine's data to the root filesystem. An
    existing symlink or non-directory at the engine's path is refused, never
    replaced.
    """
    uid = resolve_user(engine.owner)
    gid = resolve_group(engine.group)
    mode = int(engine.mode)
    for mount in mounts:
        if not os.path.isdir(mount):
            raise KvagentError(f"{mount} does not exist or is not a directory",
                               hint="attach the pool before preparing engine directories")
        if require_mount and not os.path.ismount(mount):
            raise KvagentError(f"{mount} is not a mount point",
                               hint="the pool's filesystem is not mounted; engine data would "
                                    "land on the parent filesystem")
    return tuple(d for m in mounts for d in _prepare_below(m, (engine.kind,), 0, uid, gid, mode))


def prepare_subdirectories(paths: Sequence[str], mounts: Sequence[str], engine: EngineConfig,
                           ) -> tuple[PreparedDir, ...]:
    """Create or fix directories an engine needs inside its own (one per rank, say),
    with the engine's owner, group and mode; idempotent. Each path must lie inside the
    engine's directory on one of ``mounts`` (so inside its cap), one level or more down;
    a symlink or non-directory anywhere on the way is refused, never replaced.

    The engine's user owns its directory and may swap what is in it at any time, so
    every component is opened from the mount down with ``O_NOFOLLOW``, and made and
    changed through the descriptors opened (never through a path a link could lead
    elsewhere)."""
    uid = resolve_user(engine.owner)
    gid = resolve_group(engine.group)
    done: list[PreparedDir] = []
    for path in paths:
        mount = next((m for m in mounts
                      if os.path.normpath(path).startswith(engine_dir(m, engine.kind) + "/")),
                     None)
        if mount is None or os.path.normpath(path) != path:
            raise KvagentError(f"{path} is not inside the {engine.kind} engine's directories",
                               hint="a renderer bug: kvagent makes directories only inside "
                                    "the engine's own")
        parts = tuple(os.path.relpath(path, mount).split(os.sep))
        done += _prepare_below(mount, parts, 1, uid, gid, int(engine.mode))
    return tuple(done)


def _prepare_below(mount: str, parts: tuple[str, ...], first: int, uid: int, gid: int,
                   mode: int) -> list[PreparedDir]:
    """Walk ``mount/parts[0]/parts[1]/...`` one directory descriptor at a time (each
    opened with ``O_NOFOLLOW`` in the one above, on the mount's filesystem); from
    ``parts[first]`` on, each component is made if missing and given ``uid``, ``gid`` and
    ``mode`` through its descriptor. The ones above ``first`` must exist."""
    fd = os.open(mount, DIR_FLAGS)
    done: list[PreparedDir] = []
    try:
        dev = os.fstat(fd).st_dev
        for depth, name in enumerate(parts):
            path = os.path.join(mount, *parts[:depth + 1])
            child, created = _open_dir(fd, name, path, dev, make=depth >= first)
            os.close(fd)
            fd = child
            if depth >= first:
                done.append(_fix(fd, path, uid, gid, mode, created))
    finally:
        os.close(fd)
    return done


def _open_dir(parent: int, name: str, path: str, dev: int, *, make: bool) -> tuple[int, bool]:
    """The directory ``name`` in the open directory ``parent``, opened without following
    a link (made first when missing and ``make``), on device ``dev``; whether it was made."""
    created = False
    try:
        fd = _open_nofollow(parent, name, path)
    except FileNotFoundError:
        if not make:
            raise KvagentError(f"{path} does not exist",
                               hint="kvagent prepares the engine's directory first") from None
        created = effects.mkdir(name, 0o700, dir_fd=parent, exist_ok=True, subject=path)
        try:
            fd = _open_nofollow(parent, name, path)
        except FileNotFoundError:
            raise KvagentError(f"{path} vanished while kvagent made it",
                               hint="something else changes the engine's directory; "
                                    "the next pass tries again") from None
    if os.fstat(fd).st_dev != dev:
        os.close(fd)
        raise KvagentError(f"{path} is on another filesystem than its pool's mount",
                           hint="kvagent makes an engine's directories only on its pool")
    return fd, created


def _open_nofollow(parent: int, name: str, path: str) -> int:
    """Open the directory ``name`` in ``parent`` with ``O_NOFOLLOW``: a symlink or
    anything but a directory there is a KvagentError naming ``path``."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
        except OSError:
            link = False
    raise KvagentError(f"{path} exists and is {'a symlink' if link else 'not a directory'}",
                       hint="kvagent does not replace what it did not create, nor follow "
                            "links inside an engine's directory; move it away")


def _fix(fd: int, path: str, uid: int, gid: int, mode: int, created: bool) -> PreparedDir:
    """Give the open directory ``fd`` ``uid``, ``gid`` and ``mode``; what changed."""
    changes: list[str] = ["created"] if created else []
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (uid, gid):
        effects.fchown(fd, uid, gid, subject=path)
        if not created:
            changes.append(f"owner {st.st_uid}:{st.st_gid} -> {uid}:{gid}")
    if stat.S_IMODE(st.st_mode) != mode:
        effects.fchmod(fd, mode, subject=path)
        if not created:
            changes.append(f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}")
    return PreparedDir(path, uid, gid, mode, tuple(changes))


def engine_capacities(pool_bytes: int, engines: Sequence[EngineConfig]) -> dict[str, int]:
    """Each engine's cap in bytes: explicit percentages of the pool, the rest of 90% split evenly.

    The total never exceeds 90% of ``pool_bytes`` (values are rounded down).
    """
    if pool_bytes < 0:
        raise UsageError(f"pool capacity must not be negative, got {pool_bytes}")
    explicit = {e.kind: e.capacity for e in engines if e.capacity is not None}
    total_pct = sum((Decimal(str(p)) for p in explicit.values()), Decimal(0))
    if total_pct > POOL_SHARE_PERCENT:
        raise UsageError(f"engine capacities add up to {total_pct}%; engines together may use "
                         f"at most {POOL_SHARE_PERCENT}% of the pool")
    caps = {kind: int(pool_bytes * Decimal(str(pct)) // 100) for kind, pct in explicit.items()}
    rest = [e.kind for e in engines if e.capacity is None]
    if rest:
        remaining = pool_bytes * POOL_SHARE_PERCENT // 100 - sum(caps.values())
        share = remaining // len(rest)
        if share <= 0:
            raise UsageError(f"engines {', '.join(rest)} have no capacity left: the others "
                             f"already take {total_pct}% of the pool")
        caps.update(dict.fromkeys(rest, share))
    return {e.kind: caps[e.kind] for e in engines}


def usage(directory: str, limit: int | None = None) -> int:
    """Bytes allocated on disk under ``directory`` (st_blocks; one filesystem; no symlinks).

    ``limit``: stat at most that many entries (a bounded sample: the result is then a
    lower bound; see :func:`usage_sample`). Files that vanish while walking (engines
    evict concurrently) are skipped. Unlinked-but-open files (Dynamo KVBM's cache file)
    are not visible here.
    """
    return usage_sample(directory, limit)[0]


def usage_sample(directory: str, limit: int | None = None) -> tuple[int, int, bool]:
    """(bytes, entries stat-ed, complete) under ``directory``, stopping after ``limit``
    entries: the cost of a health collect stays bounded whatever an engine stores."""
    root_dev = os.lstat(directory).st_dev
    total = seen = 0
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if limit is not None and seen >= limit:
                return total, seen, False
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if st.st_dev != root_dev:
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return total, seen, True
