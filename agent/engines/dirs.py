"""Per-engine directories on a pool's mounts, their capacity caps and their usage.

``prepare(mounts, engine)`` makes ``<mount>/<kind>`` on each namespace mount with
the owner, group and mode from the config, fixing drift and reporting what it
changed. ``engine_capacities`` splits the pool: explicit percentages as given,
the rest of 90% evenly among engines without one. ``usage`` is what an engine's
directory holds on disk.
"""

from __future__ import annotations

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
    return tuple(_prepare_one(engine_dir(m, engine.kind), uid, gid, mode) for m in mounts)


def prepare_subdirectories(paths: Sequence[str], mounts: Sequence[str], engine: EngineConfig,
                           ) -> tuple[PreparedDir, ...]:
    """Create or fix directories an engine needs inside its own (one per rank, say),
    with the engine's owner, group and mode; idempotent. Each path must lie inside the
    engine's directory on one of ``mounts`` (so inside its cap), one level or more down;
    a symlink or non-directory anywhere on the way is refused, never replaced."""
    uid = resolve_user(engine.owner)
    gid = resolve_group(engine.group)
    roots = [engine_dir(m, engine.kind) for m in mounts]
    done: list[PreparedDir] = []
    for path in paths:
        root = next((r for r in roots if os.path.normpath(path).startswith(r + "/")), None)
        if root is None or os.path.normpath(path) != path:
            raise KvagentError(f"{path} is not inside the {engine.kind} engine's directories",
                               hint="a renderer bug: kvagent makes directories only inside "
                                    "the engine's own")
        parts = os.path.relpath(path, root).split(os.sep)
        for depth in range(1, len(parts) + 1):
            done.append(_prepare_one(os.path.join(root, *parts[:depth]), uid, gid,
                                     int(engine.mode)))
    return tuple(done)


def _prepare_one(path: str, uid: int, gid: int, mode: int) -> PreparedDir:
    changes: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        effects.mkdir(path, 0o700)
        changes.append("created")
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise KvagentError(f"{path} exists and is {kind}",
                           hint="kvagent does not replace what it did not create; move it away")
    if (st.st_uid, st.st_gid) != (uid, gid):
        effects.chown(path, uid, gid)
        if "created" not in changes:
            changes.append(f"owner {st.st_uid}:{st.st_gid} -> {uid}:{gid}")
    if stat.S_IMODE(st.st_mode) != mode:
        effects.chmod(path, mode)
        if "created" not in changes:
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
