"""File backing: preallocated image files in a directory, one per namespace.

Layout: ``<directory>/<pool>/<host>/ns<N>.img`` (``shared`` for a shared pool).
``<directory>/<pool>/.kvagent-pool.json`` (:class:`agent.records.FileManifest`) lists
the files kvagent created and the namespace identity each carries: that manifest is
the proof of ownership; a file not in it is never touched.

A file is created under a temporary name (``<host>/.ns<N>.img.creating``), which is
recorded in the manifest *before* it exists; it is preallocated, synced and renamed
into place, then recorded as created. A create that failed (ENOSPC) is cleaned up at
once; one that was killed is found by the next apply through its record and
finished: nothing is left that kvagent would refuse as not its own.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from ... import effects, failpoints
from ...config.model import FileBacking, TargetPool
from ...errors import KvagentError
from ...log import get_logger
from ...records import (
    MANIFEST_FILE,
    FileManifest,
    ManifestEntry,
    PoolRecord,
    Storage,
    TargetRecords,
)
from ...system.mounts import filesystem_device, filesystem_type, read_mounts
from ...system.run import Runner
from ..identity import fresh_ids
from ..usage import DeviceUse
from .base import BackingPlan, Doomed, PassContext, Volume, grantees
from .volumes import Refused, VolumePlanner

log = get_logger("file-backing")
#: The system calls this module makes past Python's own wrappers (an anonymous mmap
#: buffer for the O_DIRECT probe); the unit's SystemCallFilter must allow them
#: (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("mmap", "munmap")
#: The only relative paths kvagent ever creates in a pool directory.
OWNED_NAME = re.compile(r"^(shared|[a-z0-9][a-z0-9-]{0,31})/(ns[1-9][0-9]{0,3}\.img|"
                        r"\.ns[1-9][0-9]{0,3}\.img\.creating)$")

#: Filesystems whose files nvmet cannot export: on overlayfs the inode's block size
#: is 0, so nvmet reports 1-byte blocks and the host sees a 0-sized device (seen on 6.1).
UNUSABLE_FILESYSTEMS = {"overlay": "nvmet reports a 1-byte block size for files on overlayfs, "
                                   "so hosts see an empty device"}


class FileBackingError(KvagentError):
    """A file backing cannot be used as configured."""


def pool_dir(backing: FileBacking, pool: str) -> Path:
    return Path(backing.directory) / pool


def relative_path(host: str | None, nsid: int) -> str:
    return f"{host or 'shared'}/ns{nsid}.img"


def temp_relative_path(host: str | None, nsid: int) -> str:
    return f"{host or 'shared'}/.ns{nsid}.img.creating"


def supports_odirect(directory: Path) -> tuple[bool, str]:
    """Whether files in ``directory`` accept an aligned O_DIRECT write (and why not).

    The probe file has a name of its own (``secrets.token_hex``) and is created with
    ``O_EXCL | O_NOFOLLOW``: whatever someone planted in the directory, a link included,
    is never opened, truncated or written (also in ``plan``, which probes too).
    """
    probe = directory / f".kvagent-odirect-probe.{secrets.token_hex(8)}"
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_DIRECT
                     | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return False, f"open with O_DIRECT failed: {os.strerror(exc.errno or 0)}"
    try:
        os.pwrite(fd, buf, 0)
    except OSError as exc:
        return False, f"an aligned O_DIRECT write failed: {os.strerror(exc.errno or 0)}"
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return True, ""


def _allocate(fd: int, size: int, path: Path) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise FileBackingError(f"cannot preallocate {size} bytes for {path}: "
                                   f"{os.strerror(exc.errno or 0)}") from None
        log.warning("filesystem cannot preallocate; file is sparse", file=str(path))
        os.ftruncate(fd, size)
    os.fsync(fd)


def _update(directory: Path, rel: str, entry: ManifestEntry | None) -> None:
    manifest = FileManifest.load(directory)
    manifest.pool = directory.name
    if entry is None:
        manifest.files.pop(rel, None)
    else:
        manifest.files[rel] = entry
    manifest.save(directory)


def create_file(directory: Path, rel: str, size: int, uuid: str, nguid: str) -> None:
    """Create one pool file: record the intent, preallocate a temp file, rename, record.

    On a failure (ENOSPC, say) the temp file and the intent are removed again; a
    kill leaves both for :func:`finish_file` on the next apply.
    """
    temp_rel = temp_of(rel)
    temp, final = directory / temp_rel, directory / rel
    effects.make_dirs(directory, 0o700)
    real_directories(directory, rel)
    _update(directory, rel, ManifestEntry(size, uuid, nguid, "creating", temp_rel))
    effects.mkdir(temp.parent, 0o700, exist_ok=True)
    real_directories(directory, rel)
    try:
        fd = os.open(temp, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            _allocate(fd, size, final)
        finally:
            os.close(fd)
    except (OSError, KvagentError):
        effects.unlink(temp, missing_ok=True)
        _update(directory, rel, None)
        raise
    failpoints.step("file.allocate", str(temp))
    _finish(directory, rel, temp, final, ManifestEntry(size, uuid, nguid))


def temp_of(rel: str) -> str:
    """The temporary name kvagent creates ``rel`` under (``<host>/.ns<N>.img.creating``)."""
    host, _, name = rel.partition("/")
    return f"{host}/.{name}.creating"


def check_intent(directory: Path, rel: str, entry: ManifestEntry) -> None:
    """Refuse a manifest entry naming anything but the files kvagent creates for ``rel``:
    a ``temp`` of ``../../etc/shadow`` would be moved into the pool and exported."""
    names = [rel] + ([entry.temp] if entry.temp else [])
    if not OWNED_NAME.match(rel) or rel.split("/")[1].startswith(".") or (
            entry.temp is not None and entry.temp != temp_of(rel)):
        raise FileBackingError(
            f"{directory / MANIFEST_FILE} lists {', '.join(map(repr, names))}: not the names "
            f"kvagent creates for a namespace file (<host>/ns<N>.img, and "
            f"{temp_of(rel)!r} while it is made); refusing to touch them",
            "the manifest was edited by someone else; fix or remove that entry")


def finish_file(directory: Path, rel: str, entry: ManifestEntry) -> None:
    """Finish a create that was interrupted (its intent is in the manifest)."""
    check_intent(directory, rel, entry)
    real_directories(directory, rel)
    temp = directory / (entry.temp or "")
    final = directory / rel
    for path in (final, temp) if entry.temp else (final,):
        problem = not_a_file(path)
        if problem:
            raise FileBackingError(f"{path} is {problem}, not a file kvagent made; refusing "
                                   "to finish a namespace file through it", LINK_HINT)
    done = ManifestEntry(entry.size, entry.uuid, entry.nguid)
    if final.exists() and not (entry.temp and temp.exists()):
        _update(directory, rel, done)  # renamed before the kill: only the record was left
        return
    if not (entry.temp and temp.exists()):
        _update(directory, rel, None)  # killed before the temp file existed: start over
        create_file(directory, rel, entry.size, entry.uuid or "", entry.nguid or "")
        return
    fd = os.open(temp, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        _allocate(fd, entry.size, final)
    finally:
        os.close(fd)
    _finish(directory, rel, temp, final, done)


def _finish(directory: Path, rel: str, temp: Path, final: Path, done: ManifestEntry) -> None:
    if os.path.lexists(final):
        raise FileBackingError(f"{final} appeared while kvagent was creating it; not "
                               "overwriting it")
    effects.rename(temp, final)
    _update(directory, rel, done)


def _recorder(directory: Path, rel: str, entry: ManifestEntry):
    return lambda: _update(directory, rel, entry)


def grow_file(directory: Path, rel: str, size: int) -> None:
    real_directories(directory, rel)
    path = directory / rel
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        _allocate(fd, size, path)
    finally:
        os.close(fd)
    entry = FileManifest.load(directory).files[rel]
    _update(directory, rel, ManifestEntry(size, entry.uuid, entry.nguid))


def remove_owned(directory: Path, rel: str) -> bool:
    """Delete ``directory/rel`` if it is a regular file kvagent could have made there.

    The name must be one kvagent creates (:data:`OWNED_NAME`) and no component may be
    a symlink: nothing outside the pool's directory can be reached. Returns whether a
    file was deleted.
    """
    if not OWNED_NAME.match(rel):
        raise FileBackingError(f"refusing to delete {directory / rel}: kvagent never "
                               "creates a file of that name in a pool directory",
                               "the manifest was edited; only <host>/ns<N>.img entries are "
                               "kvagent's")
    sub, name = rel.split("/")
    top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            subfd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        except FileNotFoundError:
            return False
        try:
            try:
                st = os.stat(name, dir_fd=subfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(st.st_mode):
                raise FileBackingError(f"refusing to delete {directory / rel}: not a regular "
                                       "file")
            effects.unlink(name, dir_fd=subfd, subject=str(directory / rel))
            return True
        finally:
            os.close(subfd)
    finally:
        os.close(top)


def file_storage(path: Path | str, detail: str = "",
                 st: os.stat_result | None = None) -> Storage:
    """The storage record of a pool file; ``st``: its ``lstat`` when already taken."""
    if not detail:
        try:
            st = st or os.stat(path, follow_symlinks=False)
            detail = f"inode {st.st_ino} on device {os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        except OSError:
            detail = "missing"
    return Storage("file", str(path), detail)


#: What to do about a link or other non-file where kvagent keeps a pool's files.
LINK_HINT = ("kvagent never follows a link out of a pool directory (it would export or "
             "overwrite what the link leads to); remove it and restore the file, or destroy "
             "the pool's data and apply again")


def _lstat(path: Path | str) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return "not a regular file"


def not_a_file(path: Path | str) -> str | None:
    """What is wrong with ``path`` as a pool file (a link, a directory, a device...), or
    None for a regular file or nothing at all."""
    st = _lstat(path)
    return None if st is None or stat.S_ISREG(st.st_mode) else _kind(st)


def not_a_directory(path: Path | str) -> str | None:
    """What is wrong with ``path`` as a directory kvagent made (a link, a file...), or None
    for a real directory or nothing at all."""
    st = _lstat(path)
    if st is None or stat.S_ISDIR(st.st_mode):
        return None
    return "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"


def real_directories(directory: Path, rel: str) -> None:
    """Refuse unless the pool directory and ``rel``'s host directory, where they exist, are
    directories and not links: a link there would put kvagent's files (and what it moves
    or grows) outside the pool."""
    for d in (directory, directory / rel.partition("/")[0]):
        problem = not_a_directory(d)
        if problem:
            raise FileBackingError(f"{d} is {problem}; kvagent creates it as a directory and "
                                   "works only inside the pool directory", LINK_HINT)


class FileDriver:
    """Preallocated files in a directory (kind: file)."""

    kind = "file"

    def layout(self, pool: TargetPool,
               records: TargetRecords) -> Mapping[str | None, tuple[int, ...]]:
        assert pool.namespaces is not None
        return {h: tuple(range(1, pool.namespaces.count + 1)) for h in grantees(pool)}

    def record(self, pool: TargetPool) -> PoolRecord:
        assert isinstance(pool.backing, FileBacking)
        return PoolRecord("file", {"directory": pool.backing.directory})

    def devices(self, pool: TargetPool) -> list[tuple[str, DeviceUse]]:
        return []

    def where(self, record: PoolRecord) -> str:
        return str(record.params.get("directory", "?"))

    def plan(self, ctx: PassContext, pool: TargetPool) -> BackingPlan:
        """Volumes and steps: create, finish or grow owned files; record legacy identities."""
        backing = pool.backing
        assert isinstance(backing, FileBacking) and pool.namespaces is not None
        plan = BackingPlan()
        directory = pool_dir(backing, pool.name)
        # Probe the nearest existing directory: planning creates nothing.
        probe_dir = next(p for p in (directory, *directory.parents) if p.is_dir())
        layout = self.layout(pool, ctx.records)
        unusable = (_unusable_filesystem(ctx, pool.name, probe_dir)
                    or _not_directories(pool.name, directory, layout))
        if unusable:
            plan.errors.append(unusable)
            return plan
        files = _FilePlanner(ctx, pool, plan, directory)
        files.plan_volumes(layout)
        # Only a pool that gets new files needs the O_DIRECT probe (it writes a file):
        # a converged pass stays free of writes.
        if not backing.buffered_io and files.creates:
            _require_odirect(pool.name, probe_dir, plan)
        return plan

    def doomed(self, ctx: PassContext, name: str, record: PoolRecord | None) -> list[Doomed]:
        if record is None or record.kind != self.kind:
            return []
        directory = Path(str(record.params["directory"])) / name
        manifest = FileManifest.load(directory)
        out = []
        for rel, entry in sorted(manifest.files.items()):
            for r in (rel, entry.temp):
                if r:
                    if not OWNED_NAME.match(r):
                        raise FileBackingError(
                            f"refusing to destroy pool {name}: its manifest "
                            f"{directory / MANIFEST_FILE} lists {r!r}, which is not a name "
                            "kvagent creates (<host>/ns<N>.img inside the pool directory)",
                            "the manifest was edited by hand; fix or remove that entry")
                    out.append(Doomed("file", str(directory / r),
                                      lambda r=r: remove_owned(directory, r)))
        out.append(Doomed("manifest", str(directory / MANIFEST_FILE),
                          lambda: _remove_manifest_and_dirs(directory)))
        return out

    def block_devices(self, runner: Runner, paths: list[str]) -> dict[str, tuple[str, ...]]:
        """The device of the filesystem each file is on (from the mount table)."""
        return {p: ((dev,) if (dev := filesystem_device(p)) else ()) for p in paths}


def _unusable_filesystem(ctx: PassContext, pool: str, probe_dir: Path) -> str | None:
    """The plan error when the pool's directory is on a filesystem nvmet cannot export
    files from (the mount table is read once per pass for every file pool)."""
    mounts = ctx.cache.get("mounts")
    if mounts is None:
        mounts = ctx.cache["mounts"] = read_mounts()
    fstype = filesystem_type(probe_dir, mounts=mounts)
    if fstype not in UNUSABLE_FILESYSTEMS:
        return None
    return (f"pool {pool}: {probe_dir} is on {fstype}: {UNUSABLE_FILESYSTEMS[fstype]}; put "
            "the pool's files on a local filesystem (xfs, ext4) or tmpfs")


def _not_directories(pool: str, directory: Path,
                     layout: Mapping[str | None, tuple[int, ...]]) -> str | None:
    """The plan error when the pool directory or a host directory in it is a link or
    anything else but a directory."""
    odd = [f"{d} is {problem}" for d in (directory, *(directory / (h or "shared")
                                                        for h in layout))
           if (problem := not_a_directory(d))]
    if not odd:
        return None
    return (f"pool {pool}: {'; '.join(odd)}: kvagent creates these as directories and works "
            f"only inside the pool directory. {LINK_HINT}")


def _require_odirect(pool: str, probe_dir: Path, plan: BackingPlan) -> None:
    """Refuse the whole plan (no steps, an error) when files in ``probe_dir`` do not take
    O_DIRECT, which nvmet enables a file namespace with unless it is buffered."""
    ok, why = supports_odirect(probe_dir)
    if not ok:
        plan.steps = []
        plan.errors.append(
            f"pool {pool}: {probe_dir} does not support O_DIRECT ({why}); the "
            "kernel target cannot enable namespaces there with direct I/O. Use a "
            "filesystem with O_DIRECT (xfs, ext4) or set backing.buffered_io: true "
            "(page cache: slower, uses RAM)")


class _FilePlanner(VolumePlanner):
    """The files of one file pool in one pass. The manifest says which are kvagent's: a
    file it does not list is new (created, unless something else has its name), one
    listed as being created is finished, one created is kept and grown when smaller.
    ``creates``: whether any file is new."""

    def __init__(self, ctx: PassContext, pool: TargetPool, plan: BackingPlan,
                 directory: Path) -> None:
        super().__init__(ctx, pool, plan)
        backing = pool.backing
        assert isinstance(backing, FileBacking) and pool.namespaces is not None
        self.directory = directory
        self.base = str(directory)
        self.owned = FileManifest.load(directory).files
        self.size = pool.namespaces.size
        self.buffered_io = backing.buffered_io
        self.creates = False

    def volume(self, host: str | None, nsid: int) -> Volume:
        """The namespace's file: new, being created or created, as the manifest says."""
        rel = relative_path(host, nsid)
        path = f"{self.base}/{rel}"  # str(directory / rel), without pathlib per file
        entry = self.owned.get(rel)
        if entry is None:
            return self._create(host, nsid, rel, path)
        if entry.state == "creating":
            return self._finish(host, nsid, rel, path, entry)
        return self._keep(host, nsid, rel, path, entry)

    def _volume(self, host: str | None, nsid: int, path: str, uuid: str, nguid: str,
                storage: Storage) -> Volume:
        return Volume(self.pool.name, host, nsid, path, self.size, uuid, nguid, storage,
                      buffered_io=self.buffered_io)

    def _create(self, host: str | None, nsid: int, rel: str, path: str) -> Volume:
        """A new file with a fresh identity; refused when something already has its name."""
        if os.path.lexists(path):
            raise Refused(f"pool {self.pool.name}: {path} exists but kvagent did not create "
                          f"it (not in {self.directory / MANIFEST_FILE}); refusing to use or "
                          "overwrite it")
        uuid, nguid = fresh_ids()
        self.creates = True
        directory, size = self.directory, self.size
        self.step("file.create", path, f"{int(size)} bytes",
                  lambda: create_file(directory, rel, size, uuid, nguid), host, nsid)
        return self._volume(host, nsid, path, uuid, nguid, file_storage(path, "to be created"))

    def _finish(self, host: str | None, nsid: int, rel: str, path: str,
                entry: ManifestEntry) -> Volume:
        """A file whose create was interrupted, finished with the identity its entry
        records; refused when the entry or what is at its names is not kvagent's."""
        try:
            check_intent(self.directory, rel, entry)
        except FileBackingError as exc:
            raise Refused(f"pool {self.pool.name}: {exc.message}") from None
        odd = [f"{p} is {problem}" for p in (path, f"{self.base}/{temp_of(rel)}")
               if (problem := not_a_file(p))]
        if odd:
            raise Refused(f"pool {self.pool.name}: {'; '.join(odd)}, not a file kvagent made; "
                          f"refusing to finish namespace {nsid} through it. {LINK_HINT}")
        directory = self.directory
        self.step("file.finish", path, f"an interrupted create of {entry.size} bytes",
                  lambda: finish_file(directory, rel, entry), host, nsid)
        return self._volume(host, nsid, path, entry.uuid or "", entry.nguid or "",
                            file_storage(path, "being created"))

    def _keep(self, host: str | None, nsid: int, rel: str, path: str,
              entry: ManifestEntry) -> Volume:
        """A file kvagent created: its identity recorded (or recorded now), grown when
        smaller; refused when it is missing or no longer a regular file."""
        st = _lstat(path)  # one system call per file: a converged pass
        if st is None:
            raise Refused(f"pool {self.pool.name}: {path} is recorded as kvagent's but is "
                          "missing; kvagent will not recreate it silently")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"pool {self.pool.name}: {path} is {_kind(st)}, not the file "
                          "kvagent created; refusing to export or grow what it leads to. "
                          f"{LINK_HINT}")
        directory, size = self.directory, self.size
        uuid, nguid = self.identity(
            host, nsid, (entry.uuid, entry.nguid), "file.record", path,
            lambda u, g: _recorder(directory, rel, ManifestEntry(entry.size, u, g)))
        if st.st_size < size:
            self.step("file.grow", path, f"{st.st_size} -> {int(size)} bytes",
                      lambda: grow_file(directory, rel, size), host, nsid, grown=path)
        return self._volume(host, nsid, path, uuid, nguid, file_storage(path, st=st))


def _remove_manifest_and_dirs(directory: Path) -> None:
    effects.unlink(directory / MANIFEST_FILE, missing_ok=True, kind="record.remove")
    for sub in sorted((p for p in directory.glob("*") if p.is_dir() and not p.is_symlink()),
                      reverse=True):
        try:
            effects.rmdir(sub)
        except OSError:
            log.info("kept non-empty directory", directory=str(sub))
    try:
        effects.rmdir(directory)
    except OSError:
        log.info("kept non-empty directory", directory=str(directory))
