"""The optional oldest-first cleaner: the only place kvagent deletes engine data.

Off by default and turned on per engine (``engines[].cleaner``), for engines that never
evict on disk. On a mount where the engine's usage (from its project quota: O(1)) is
above ``high`` percent of its cap, it deletes the engine's oldest regular files by
modification time (pools are mounted ``noatime``) until the usage is at or under
``low`` percent. What it may delete, and nothing else:

- regular files with a single link, below the engine's own directory ``<mount>/<kind>``
  (which kvagent created), on that directory's filesystem;
- reached only through directory file descriptors opened with ``O_NOFOLLOW``, from the
  engine directory down, and re-checked (same inode, still a regular file) just before
  ``unlink``: a symlink is never followed, so nothing outside can be reached, and a
  file swapped or written meanwhile is left alone;
- never a directory (not even an empty one), never the engine directory itself.

Each run is an action of the pass and is counted in ``<state_dir>/cleaner/<pool>.json``
(health exports the counts as metrics).
"""

from __future__ import annotations

import heapq
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import effects, failpoints, progress
from ..config.model import EngineConfig
from ..errors import KvagentError
from ..log import get_logger
from ..records import cleaner_path
from ..state import read_json, write_json
from ..system.dirfd import open_below
from ..system.xfsquota import QuotaOps
from .quota import project_id

log = get_logger("engines.cleaner")

#: Bound of one cleaner run (a walk of the engine's tree and the deletions).
CLEAN_BOUND = 900.0
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass(frozen=True, order=True)
class Candidate:
    """A file the cleaner may delete: ordered oldest first (then by path)."""

    mtime_ns: int
    rel: tuple[str, ...]  # path below the engine directory, one part per level
    ino: int
    size: int  # bytes allocated (st_blocks * 512): what deleting it frees


class _Newest:
    """Heap entry ordering candidates newest first (heapq is a min-heap)."""

    __slots__ = ("c",)

    def __init__(self, c: Candidate):
        self.c = c

    def __lt__(self, other: _Newest) -> bool:
        return (self.c.mtime_ns, self.c.rel) > (other.c.mtime_ns, other.c.rel)


def select_oldest(candidates: Iterable[Candidate], need: int) -> list[Candidate]:
    """The oldest candidates whose sizes add up to at least ``need`` bytes (all of them
    when they add up to less), oldest first. Memory: only the files selected."""
    if need <= 0:
        return []
    heap: list[_Newest] = []
    total = 0
    for c in candidates:
        if c.size <= 0:
            continue  # deleting it frees nothing
        if total >= need and (c.mtime_ns, c.rel) >= (heap[0].c.mtime_ns, heap[0].c.rel):
            continue
        heapq.heappush(heap, _Newest(c))
        total += c.size
        while heap and total - heap[0].c.size >= need:
            total -= heapq.heappop(heap).c.size
    return sorted(e.c for e in heap)


def scan(root: str, tick: Callable[[], None] = lambda: None) -> Iterator[Candidate]:
    """Every regular single-link file below ``root`` on its filesystem, without following
    a symlink (directories are opened ``O_NOFOLLOW`` from ``root`` down)."""
    top = os.open(root, _DIR)
    dev = os.fstat(top).st_dev
    # Pending directories by name (and inode), not by open fd: fds stay O(1) on any tree.
    stack: list[tuple[tuple[str, ...], int | None]] = [((), None)]
    seen = 0
    try:
        while stack:
            rel, ino = stack.pop()
            dfd = open_below(top, rel, dev, ino)
            if dfd is None:
                continue  # gone, or swapped for a symlink or another directory
            try:
                entries = _entries(dfd)
            finally:
                if dfd != top:
                    os.close(dfd)
            for name, st in entries:
                seen += 1
                if seen % 1024 == 0:
                    tick()
                if st.st_dev != dev:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(((*rel, name), st.st_ino))
                elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    yield Candidate(st.st_mtime_ns, (*rel, name), st.st_ino,
                                    st.st_blocks * 512)
    finally:
        os.close(top)


def _entries(dfd: int) -> list[tuple[str, os.stat_result]]:
    out = []
    with os.scandir(dfd) as it:
        for entry in it:
            try:
                out.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue
    return out


def delete(root: str, victims: Iterable[Candidate],
           tick: Callable[[], None] = lambda: None) -> tuple[int, int]:
    """Unlink ``victims`` below ``root``: (files deleted, bytes they held).

    Each one's directory is reopened from ``root`` with ``O_NOFOLLOW`` at every level on
    ``root``'s filesystem, and the file is deleted only if it is still the same regular
    file, unmodified (inode and mtime as scanned); anything else is skipped.
    """
    top = os.open(root, _DIR)
    dev = os.fstat(top).st_dev
    files = freed = 0
    groups: dict[tuple[str, ...], list[Candidate]] = {}
    for v in victims:
        groups.setdefault(v.rel[:-1], []).append(v)
    try:
        for parts, group in groups.items():
            dfd = open_below(top, parts, dev)
            if dfd is None:
                continue
            try:
                for v in group:
                    tick()
                    name = v.rel[-1]
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if (not stat.S_ISREG(st.st_mode) or st.st_dev != dev
                            or (st.st_ino, st.st_mtime_ns) != (v.ino, v.mtime_ns)):
                        continue  # not the file scanned: replaced or written meanwhile
                    try:
                        os.unlink(name, dir_fd=dfd)
                    except FileNotFoundError:
                        continue
                    files += 1
                    freed += st.st_blocks * 512
            finally:
                if dfd != top:
                    os.close(dfd)
    finally:
        os.close(top)
    return files, freed


@dataclass(frozen=True)
class CleanRun:
    """One cleaner run on one engine directory."""

    directory: str
    cap_bytes: int
    used_before: int
    used_after: int
    files: int
    bytes: int

    def describe(self, engine: EngineConfig) -> str:
        c = engine.cleaner
        return (f"deleted {self.files} oldest file(s), {self.bytes} bytes: usage "
                f"{self.used_before} -> {self.used_after} bytes of cap {self.cap_bytes} "
                f"(high {c.high:g}%, low {c.low:g}%)")


def clean(directory: str, mount: str, engine: EngineConfig, quota: QuotaOps,
          cap_bytes: int) -> CleanRun | None:
    """Run the cleaner on one engine directory if its usage is over the high watermark of
    its cap (the project's hard limit, else ``cap_bytes``); None when under it."""
    projid = project_id(engine.kind)
    before = quota.get(mount, projid)
    cap = before.hard_limit_bytes or cap_bytes
    used = before.used_bytes
    if cap <= 0 or used * 100 <= cap * engine.cleaner.high:
        return None
    need = used - int(cap * engine.cleaner.low) // 100
    with progress.step(f"cleaning {directory}", CLEAN_BOUND):
        victims = select_oldest(scan(directory, progress.checkpoint), need)
        files, freed = delete(directory, victims, progress.checkpoint)
    failpoints.step("engine.clean", directory)
    os.statvfs(mount)  # xfs frees unlinked inodes in the background; statfs waits for it
    after = quota.get(mount, projid).used_bytes
    run = CleanRun(directory, cap, used, after, files, freed)
    log.info("engine cleaner ran", directory=directory, files=files, bytes=freed,
             used_before=used, used_after=after, cap=cap)
    return run


# ------------------------------------------------------------------------ stats
@dataclass(frozen=True)
class CleanerStats:
    """What an engine's cleaner has done on a pool, since its record began."""

    runs: int = 0
    files: int = 0
    bytes: int = 0
    last_run: float | None = None  # wall clock


def record_run(state_dir: Path | str, pool: str, kind: str, run: CleanRun,
               now: float | None = None) -> None:
    """Count one run in the pool's cleaner record."""
    path = cleaner_path(state_dir, pool)
    data: dict[str, Any] = read_json(path, {})
    old = data.get(kind, {})
    data[kind] = {"runs": int(old.get("runs", 0)) + 1,
                  "files": int(old.get("files", 0)) + run.files,
                  "bytes": int(old.get("bytes", 0)) + run.bytes,
                  "last_run": time.time() if now is None else now}
    write_json(path, data)


def read_stats(state_dir: Path | str, pool: str) -> dict[str, CleanerStats]:
    """Each engine's cleaner counts on a pool (empty when no cleaner ever ran)."""
    try:
        data = read_json(cleaner_path(state_dir, pool), {})
    except KvagentError as exc:
        log.warning("cannot read the cleaner record", pool=pool, error=exc.message)
        return {}
    out = {}
    for kind, d in data.items() if isinstance(data, dict) else ():
        try:
            out[kind] = CleanerStats(int(d["runs"]), int(d["files"]), int(d["bytes"]),
                                     float(d["last_run"]) if d.get("last_run") else None)
        except (KeyError, TypeError, ValueError):
            continue
    return out


def forget(state_dir: Path | str, pool: str) -> None:
    """Drop a detached pool's cleaner record."""
    effects.unlink(cleaner_path(state_dir, pool), missing_ok=True, kind="record.remove")
