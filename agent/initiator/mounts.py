"""Mounting pool filesystems, and unmounting them without ever hiding data loss.

Every function takes the mount table (``mountinfo``) as a parameter, so tests
can give a file of their own; ``devnum`` (device path -> ``major:minor``) is a
parameter for the same reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from .. import effects
from ..errors import KvagentError
from ..immutable import is_immutable
from ..log import get_logger
from ..system.mounts import MOUNTINFO, MountEntry, mounted_at, read_mounts
from ..system.run import CommandError, Runner

__all__ = ["MOUNTINFO", "QUOTACHECK_TIMEOUT", "MountBusy", "MountEntry", "create_mount_point",
           "device_number",
           "ensure_mounted", "missing_dirs", "mounted_at", "read_mounts", "remove_mount_points",
           "unmount"]

log = get_logger("mounts")


class MountBusy(KvagentError):
    """A mount is in use; kvagent does not lazy-unmount (that would hide data loss)."""


def device_number(device: str) -> str:
    """``major:minor`` of a block device node."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def device_gone(devnum: str, sysfs: str = "/sys") -> bool:
    """Whether no block device has ``major:minor`` now: a filesystem still mounted from it
    is orphaned (its namespace went away while it was mounted: disabled on the storage
    host, its last controller disconnected), and every call on it fails once it does
    I/O."""
    return not os.path.exists(os.path.join(sysfs, "dev", "block", devnum))


def missing_dirs(path: str) -> list[str]:
    """The directories :func:`create_mount_point` would make for ``path`` (top first)."""
    return effects.missing_dirs(path)


def create_mount_point(path: str) -> list[str]:
    """Create ``path`` and any missing parents; returns the directories made now (top first)."""
    return effects.make_dirs(path)


def remove_mount_points(dirs: list[str], mountinfo: Path = MOUNTINFO, *,
                        sealed: Callable[[str], bool | None] = is_immutable,
                        seal: Callable[[str, bool], None] = effects.seal_dir) -> list[str]:
    """Remove the given directories (deepest first) when empty and not mounted on; a
    sealed one (immutable: :mod:`agent.immutable`) is unsealed first.

    Only empty directories are removed (``rmdir``), never their contents; the
    rest are kept and logged. Returns the directories removed.
    """
    removed = []
    mounted = {e.mount_point for e in read_mounts(mountinfo)}
    for d in sorted(set(dirs), key=lambda p: p.count("/"), reverse=True):
        if os.path.normpath(d) in mounted or not os.path.isdir(d):
            continue
        try:
            if not os.listdir(d) and sealed(d):
                seal(d, False)
            effects.rmdir(d)
        except OSError as exc:
            log.info("kept mount directory", directory=d, reason=os.strerror(exc.errno or 0))
            continue
        removed.append(d)
    return removed


#: The first mount of an xfs with project quotas runs a quotacheck (a scan of every
#: inode): a pool remounted with them after an upgrade may take minutes.
QUOTACHECK_TIMEOUT = 1800
#: The system calls mount(8) and umount(8), which this module runs, make for it:
#: mount/umount2 (util-linux 2.38, Debian 12), the new mount API (util-linux 2.39 and
#: later). The unit's SystemCallFilter must allow them (@mount;
#: tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("mount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
            "open_tree", "mount_setattr")


def ensure_mounted(device: str, path: str, options: tuple[str, ...], runner: Runner,
                   mountinfo: Path = MOUNTINFO,
                   devnum: Callable[[str], str] = device_number, *,
                   timeout: float = 120) -> bool:
    """Mount ``device`` (xfs) on ``path``; True if mounted now, False if it already was.

    A different device already mounted there is an error, never stacked over;
    so is a non-empty directory (mounting would hide its files).
    """
    current = mounted_at(path, mountinfo)
    if current is not None:
        if current.device == devnum(device):
            return False
        raise KvagentError(f"{path} already has {current.source} ({current.fstype}) mounted",
                           "unmount it or choose another mount path for the pool")
    create_mount_point(path)
    if os.listdir(path):
        raise KvagentError(f"{path} is not mounted but holds files; mounting the pool there "
                           "would hide them",
                           "something wrote there while the pool was not mounted: move the "
                           "files away (or delete them), then apply again")
    argv = ["mount", "-t", "xfs"]
    if options:
        argv += ["-o", ",".join(options)]
    runner([*argv, device, path], timeout=timeout)
    log.info("mounted", device=device, path=path)
    return True


def unmount(path: str, runner: Runner, mountinfo: Path = MOUNTINFO) -> bool:
    """Unmount ``path`` if mounted; busy → :class:`MountBusy`. True if it was unmounted now."""
    if mounted_at(path, mountinfo) is None:
        return False
    try:
        runner(["umount", path], timeout=120)
    except CommandError as exc:
        text = (exc.result.stderr + exc.result.stdout).lower()
        if "busy" in text:
            raise MountBusy(f"{path} is busy: processes still use it",
                            f"stop the engine using it (`fuser -vm {path}` lists them), then "
                            "apply again; kvagent never lazy-unmounts") from None
        raise
    log.info("unmounted", path=path)
    return True
