"""File backing: preallocated image files in a directory, one per namespace.

Layout: ``<directory>/<pool>/<host>/ns<N>.img`` (``shared`` for a shared pool).
``<directory>/<pool>/.kvagent-pool.json`` lists the files kvagent created:
that manifest is the proof of ownership; a file not in it is never touched.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

from ..config.model import FileBacking, TargetPool
from ..errors import KvagentError
from ..log import get_logger
from ..state import read_json, write_json
from .steps import BackingPlan, Step, Volume

log = get_logger("file-backing")
MANIFEST = ".kvagent-pool.json"


class FileBackingError(KvagentError):
    """A file backing cannot be used as configured."""


def pool_dir(backing: FileBacking, pool: str) -> Path:
    return Path(backing.directory) / pool


def file_path(backing: FileBacking, pool: str, host: str | None, nsid: int) -> Path:
    return pool_dir(backing, pool) / (host or "shared") / f"ns{nsid}.img"


def read_manifest(directory: Path) -> dict:
    """The pool directory's manifest (``{"pool": ..., "files": {relpath: size}}``)."""
    return read_json(directory / MANIFEST, {"files": {}})


#: Filesystems whose files nvmet cannot export: on overlayfs the inode's block size
#: is 0, so nvmet reports 1-byte blocks and the host sees a 0-sized device (seen on 6.1).
UNUSABLE_FILESYSTEMS = {"overlay": "nvmet reports a 1-byte block size for files on overlayfs, "
                                   "so hosts see an empty device"}


def filesystem_type(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """Type of the filesystem holding ``path`` (the longest mount point that contains it)."""
    from ..initiator.mounts import read_mounts

    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for m in read_mounts(mountinfo):
        mp = m.mount_point.rstrip("/") or "/"
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (
                best is None or len(mp) >= best[0]):
            best = (len(mp), m.fstype)
    return best[1] if best else None


def supports_odirect(directory: Path) -> tuple[bool, str]:
    """Whether files in ``directory`` accept an aligned O_DIRECT write (and why not)."""
    probe = directory / ".kvagent-odirect-probe"
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT | os.O_TRUNC, 0o600)
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


def _create_file(path: Path, size: int, directory: Path, rel: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        _allocate(fd, size, path)
    finally:
        os.close(fd)
    _record(directory, rel, size)


def _grow_file(path: Path, size: int, directory: Path, rel: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        _allocate(fd, size, path)
    finally:
        os.close(fd)
    _record(directory, rel, size)


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


def _record(directory: Path, rel: str, size: int) -> None:
    manifest = read_manifest(directory)
    manifest.setdefault("files", {})[rel] = size
    manifest["pool"] = directory.name
    write_json(directory / MANIFEST, manifest)


def plan_file(pool: TargetPool, hosts: list[str | None]) -> BackingPlan:
    """Volumes and steps for a file-backed pool (create or grow owned files only)."""
    backing = pool.backing
    assert isinstance(backing, FileBacking) and pool.namespaces is not None
    plan = BackingPlan()
    directory = pool_dir(backing, pool.name)
    # Probe the nearest existing directory: planning creates nothing.
    probe_dir = next(p for p in (directory, *directory.parents) if p.is_dir())
    fstype = filesystem_type(probe_dir)
    if fstype in UNUSABLE_FILESYSTEMS:
        plan.errors.append(f"pool {pool.name}: {probe_dir} is on {fstype}: "
                           f"{UNUSABLE_FILESYSTEMS[fstype]}; put the pool's files on a "
                           "local filesystem (xfs, ext4) or tmpfs")
        return plan
    manifest = read_manifest(directory)
    owned = manifest.get("files", {})
    size = pool.namespaces.size
    for host in hosts:
        for nsid in range(1, pool.namespaces.count + 1):
            path = file_path(backing, pool.name, host, nsid)
            rel = str(path.relative_to(directory))
            plan.volumes.append(Volume(pool.name, host, nsid, str(path), size,
                                       buffered_io=backing.buffered_io))
            if rel not in owned:
                if path.exists():
                    plan.errors.append(
                        f"pool {pool.name}: {path} exists but kvagent did not create it (not "
                        f"in {directory / MANIFEST}); refusing to use or overwrite it")
                    continue
                plan.steps.append(Step(
                    "file.create", pool.name, str(path), f"{int(size)} bytes",
                    lambda p=path, r=rel: _create_file(p, size, directory, r)))
            else:
                current = path.stat().st_size if path.exists() else None
                if current is None:
                    plan.errors.append(f"pool {pool.name}: {path} is recorded as kvagent's "
                                       "but is missing; kvagent will not recreate it silently")
                elif current < size:
                    plan.steps.append(Step(
                        "file.grow", pool.name, str(path), f"{current} -> {int(size)} bytes",
                        lambda p=path, r=rel: _grow_file(p, size, directory, r),
                        grown=str(path)))
    # Only a pool that gets new files needs the O_DIRECT probe (it writes a file):
    # a converged pass stays free of writes.
    if not backing.buffered_io and any(st.kind == "file.create" for st in plan.steps):
        ok, why = supports_odirect(probe_dir)
        if not ok:
            plan.steps = []
            plan.errors.append(
                f"pool {pool.name}: {probe_dir} does not support O_DIRECT ({why}); the kernel "
                "target cannot enable namespaces there with direct I/O. Use a filesystem "
                "with O_DIRECT (xfs, ext4) or set backing.buffered_io: true (page cache: "
                "slower, uses RAM)")
    return plan


def destroy_files(directory: Path) -> list[str]:
    """Delete the files the manifest lists, then the manifest and empty dirs. Returns paths."""
    manifest = read_manifest(directory)
    removed = []
    for rel in sorted(manifest.get("files", {})):
        path = directory / rel
        if path.exists():
            path.unlink()
            removed.append(str(path))
    (directory / MANIFEST).unlink(missing_ok=True)
    for sub in sorted((p for p in directory.glob("*") if p.is_dir()), reverse=True):
        try:
            sub.rmdir()
        except OSError:
            log.info("kept non-empty directory", directory=str(sub))
    try:
        directory.rmdir()
    except OSError:
        log.info("kept non-empty directory", directory=str(directory))
    return removed
