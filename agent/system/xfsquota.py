"""xfs project quotas: the inode flags and the quotactl calls, without running a command.

An xfs filesystem accounts blocks per *project* when it is mounted with ``prjquota``
(enforcing) or ``pqnoenforce`` (accounting only); xfs turns quota accounting on only
at mount time, never on a remount. A directory joins a project through its inode's
project id, and with the ``PROJINHERIT`` flag everything created below it inherits
the id; files that already exist keep theirs until set one by one. The kernel then
answers the project's usage and limits in O(1) (one ``quotactl``), and refuses
allocations past the hard block limit with ENOSPC.

- :func:`project_quota_mode`: ``enforced`` / ``accounted`` / ``off`` from the mount's
  superblock options (what ``/proc/self/mountinfo`` shows: ``prjquota`` or
  ``pqnoenforce``).
- :func:`read_project` / :func:`set_project`: ``FS_IOC_FSGETXATTR`` /
  ``FS_IOC_FSSETXATTR`` on an open file (the project id and ``PROJINHERIT``).
- :func:`tag_tree`: give a directory and everything below it (one filesystem, no
  symlinks followed) a project id.
- :func:`get_quota` / :func:`set_hard_limit`: ``quotactl_fd(2)`` (Linux 5.14+) with
  ``Q_XGETQUOTA`` / ``Q_XSETQLIM`` for ``PRJQUOTA``, through ctypes.

:class:`XfsQuota` bundles them as the seam the engines' hand-off and the health
collector take (unit tests give a fake); ``xfs_quota`` is never run.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from ..errors import KvagentError
from .dirfd import DIR_FLAGS, open_below
from .mounts import MountEntry

QuotaMode = Literal["enforced", "accounted", "off"]

#: Mount options that turn project quotas on (``pquota`` is shown as ``prjquota``).
ENFORCING_OPTIONS = ("prjquota", "pquota")
ACCOUNTING_OPTIONS = ("pqnoenforce",)
#: Mount options by which the operator chooses about quotas themselves.
QUOTA_OPTIONS = (*ENFORCING_OPTIONS, *ACCOUNTING_OPTIONS, "noquota")

# linux/fs.h: struct fsxattr and its ioctls (_IOR/_IOW('X', 31/32, struct fsxattr)).
_FSXATTR = struct.Struct("=IIIII8s")  # xflags, extsize, nextents, projid, cowextsize, pad
FS_IOC_FSGETXATTR = (2 << 30) | (_FSXATTR.size << 16) | (ord("X") << 8) | 31
FS_IOC_FSSETXATTR = (1 << 30) | (_FSXATTR.size << 16) | (ord("X") << 8) | 32
FS_XFLAG_PROJINHERIT = 0x00000200

# linux/quota.h, linux/dqblk_xfs.h
PRJQUOTA = 2
Q_XGETQUOTA = (ord("X") << 8) + 3
Q_XSETQLIM = (ord("X") << 8) + 4
FS_DQUOT_VERSION = 1
FS_PROJ_QUOTA = 2
FS_DQ_BSOFT = 1 << 2
FS_DQ_BHARD = 1 << 3
#: quotactl_fd(2): the same number on every architecture (asm-generic/unistd.h).
SYS_QUOTACTL_FD = 443
#: xfs quota figures are in 512-byte "basic blocks".
BASIC_BLOCK = 512
#: The system calls this module makes past Python's own wrappers: the inode flags'
#: ioctls and quotactl_fd (which systemd groups in @privileged only). The unit's
#: SystemCallFilter must allow them (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("ioctl", "quotactl_fd")


def qcmd(cmd: int, qtype: int) -> int:
    """``QCMD(cmd, type)`` of linux/quota.h."""
    return (cmd << 8) | (qtype & 0xFF)


class FsDiskQuota(ctypes.Structure):
    """``struct fs_disk_quota`` (linux/dqblk_xfs.h); block figures in 512-byte units."""

    _fields_ = [
        ("d_version", ctypes.c_int8), ("d_flags", ctypes.c_int8),
        ("d_fieldmask", ctypes.c_uint16), ("d_id", ctypes.c_uint32),
        ("d_blk_hardlimit", ctypes.c_uint64), ("d_blk_softlimit", ctypes.c_uint64),
        ("d_ino_hardlimit", ctypes.c_uint64), ("d_ino_softlimit", ctypes.c_uint64),
        ("d_bcount", ctypes.c_uint64), ("d_icount", ctypes.c_uint64),
        ("d_itimer", ctypes.c_int32), ("d_btimer", ctypes.c_int32),
        ("d_iwarns", ctypes.c_uint16), ("d_bwarns", ctypes.c_uint16),
        ("d_itimer_hi", ctypes.c_int8), ("d_btimer_hi", ctypes.c_int8),
        ("d_rtbtimer_hi", ctypes.c_int8), ("d_padding2", ctypes.c_int8),
        ("d_rtb_hardlimit", ctypes.c_uint64), ("d_rtb_softlimit", ctypes.c_uint64),
        ("d_rtbcount", ctypes.c_uint64), ("d_rtbtimer", ctypes.c_int32),
        ("d_rtbwarns", ctypes.c_uint16), ("d_padding3", ctypes.c_int16),
        ("d_padding4", ctypes.c_char * 8),
    ]


class QuotaUnavailable(KvagentError):
    """Project quotas cannot be read or set here (not xfs, not mounted with them, no
    permission, a kernel without quotactl_fd): callers fall back to advisory caps.
    ``errno`` is the kernel's answer (EPERM: not root, the caps may well be enforced)."""

    def __init__(self, message: str, hint: str | None = None, errno: int | None = None):
        super().__init__(message, hint)
        self.errno = errno


@dataclass(frozen=True)
class Project:
    """A file's project id and whether new entries below it inherit it."""

    projid: int
    inherit: bool


@dataclass(frozen=True)
class ProjectQuota:
    """One project's usage and block limits on one filesystem (bytes; 0 = no limit)."""

    projid: int
    used_bytes: int
    hard_limit_bytes: int
    soft_limit_bytes: int = 0
    inodes: int = 0


def project_quota_mode(entry: MountEntry) -> QuotaMode:
    """Whether the filesystem of a mount accounts (and enforces) project quotas.

    Read from the superblock options of its mountinfo line: xfs shows ``prjquota``
    when it accounts and enforces, ``pqnoenforce`` when it only accounts.
    """
    if entry.fstype != "xfs":
        return "off"
    options = set(entry.super_options.split(","))
    if options & set(ENFORCING_OPTIONS):
        return "enforced"
    if options & set(ACCOUNTING_OPTIONS):
        return "accounted"
    return "off"


def wanted_quota_mode(options: tuple[str, ...] | list[str]) -> QuotaMode:
    """The project quota mode that mounting with ``options`` gives an xfs."""
    if any(o in ENFORCING_OPTIONS for o in options):
        return "enforced"
    if any(o in ACCOUNTING_OPTIONS for o in options):
        return "accounted"
    return "off"


def wants_project_quota(options: tuple[str, ...] | list[str]) -> bool:
    """Whether mount options ask for project quota accounting (enforcing or not)."""
    return wanted_quota_mode(options) != "off"


def with_project_quota(options: tuple[str, ...]) -> tuple[str, ...]:
    """The mount options kvagent mounts a pool with: the operator's, plus ``prjquota``
    unless they chose about quotas themselves (``noquota``, ``pqnoenforce``, ...)."""
    if any(o in QUOTA_OPTIONS for o in options):
        return tuple(options)
    return (*options, "prjquota")


# ------------------------------------------------------------------ inode flags
def read_project(fd: int) -> Project:
    """The project id and PROJINHERIT flag of an open file or directory."""
    buf = bytearray(_FSXATTR.size)
    fcntl.ioctl(fd, FS_IOC_FSGETXATTR, buf, True)
    xflags, _, _, projid, _, _ = _FSXATTR.unpack(buf)
    return Project(projid, bool(xflags & FS_XFLAG_PROJINHERIT))


def set_project(fd: int, projid: int, *, inherit: bool) -> bool:
    """Give an open file project ``projid`` (and PROJINHERIT when ``inherit``); True if
    that changed anything. Needs CAP_FOWNER (root)."""
    buf = bytearray(_FSXATTR.size)
    fcntl.ioctl(fd, FS_IOC_FSGETXATTR, buf, True)
    xflags, extsize, nextents, current, cowextsize, pad = _FSXATTR.unpack(buf)
    wanted = (xflags | FS_XFLAG_PROJINHERIT) if inherit else xflags
    if current == projid and wanted == xflags:
        return False
    fcntl.ioctl(fd, FS_IOC_FSSETXATTR,
                bytearray(_FSXATTR.pack(wanted, extsize, nextents, projid, cowextsize, pad)))
    return True


def project_of(path: str) -> Project:
    """:func:`read_project` of a directory by path (not following a final symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return read_project(fd)
    finally:
        os.close(fd)


def tag_tree(root: str, projid: int, *, tick: Callable[[], None] = lambda: None) -> int:
    """Put ``root`` and every directory and regular file below it in project ``projid``.

    Directories get PROJINHERIT too. Each directory is tagged before it is read, so an
    entry created meanwhile inherits the id; the tree is walked through directory file
    descriptors opened with ``O_NOFOLLOW`` (a symlink is never followed, a directory
    on another filesystem is not entered); symlinks and special files are left as they
    are (they hold no data blocks worth counting). ``tick`` is called every 1,024
    entries (a progress beat; it may raise to stop). Returns the entries changed.
    """
    changed = 0
    top = os.open(root, DIR_FLAGS)
    dev = os.fstat(top).st_dev
    # Pending directories by name (and inode), not by open fd: fds stay O(1) on any tree.
    stack: list[tuple[tuple[str, ...], int | None]] = [((), None)]
    seen = 0
    try:
        changed += set_project(top, projid, inherit=True)
        while stack:
            rel, ino = stack.pop()
            dfd = open_below(top, rel, dev, ino)
            if dfd is None:
                continue  # gone, or swapped for a symlink or another directory meanwhile
            try:
                with os.scandir(dfd) as entries:
                    names = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
                for name, st in names:
                    seen += 1
                    if seen % 1024 == 0:
                        tick()
                    if st.st_dev != dev:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                    elif stat.S_ISREG(st.st_mode):
                        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                    else:
                        continue
                    try:
                        fd = os.open(name, flags, dir_fd=dfd)
                    except (FileNotFoundError, NotADirectoryError, OSError) as exc:
                        if isinstance(exc, (FileNotFoundError, NotADirectoryError)) or \
                                exc.errno == errno.ELOOP:
                            continue  # gone, or swapped for a symlink meanwhile
                        raise
                    try:
                        changed += set_project(fd, projid,
                                               inherit=stat.S_ISDIR(st.st_mode))
                    finally:
                        os.close(fd)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(((*rel, name), st.st_ino))
            finally:
                if dfd != top:
                    os.close(dfd)
    finally:
        os.close(top)
    return changed


# ------------------------------------------------------------------- quotactl
@functools.cache
def _syscall() -> Callable[..., int]:
    return ctypes.CDLL(None, use_errno=True).syscall


def _quotactl(mount: str, cmd: int, projid: int, dq: FsDiskQuota) -> None:
    """``quotactl_fd(fd of mount, QCMD(cmd, PRJQUOTA), projid, &dq)``; OSError on failure."""
    fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ctypes.set_errno(0)
        rc = _syscall()(ctypes.c_long(SYS_QUOTACTL_FD), ctypes.c_long(fd),
                        ctypes.c_long(qcmd(cmd, PRJQUOTA)), ctypes.c_long(projid),
                        ctypes.byref(dq))
        if rc != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), mount)
    finally:
        os.close(fd)


def _unavailable(exc: OSError, mount: str, what: str) -> QuotaUnavailable:
    reasons = {
        errno.ENOSYS: "this kernel has no quotactl_fd (Linux 5.14 or later has it)",
        errno.EPERM: "project quotas need root (CAP_SYS_ADMIN), and quotactl_fd allowed "
                     "by a system call filter (a unit's SystemCallFilter=; kvagent's "
                     "own unit allows it)",
        errno.ESRCH: "project quotas are not on for this filesystem (mount with prjquota)",
        errno.ENOTTY: "the filesystem has no project quotas (not xfs)",
        errno.EOPNOTSUPP: "the filesystem has no project quotas (not xfs)",
        errno.EINVAL: "the filesystem has no project quotas (not xfs)",
    }
    reason = reasons.get(exc.errno or 0, exc.strerror or str(exc))
    return QuotaUnavailable(f"cannot {what} the project quota on {mount}: {reason}",
                            "engine caps stay advisory there; to run without project "
                            "quotas on purpose, add noquota to the pool's mount_options",
                            errno=exc.errno)


def get_quota(mount: str, projid: int) -> ProjectQuota:
    """Usage and limits of project ``projid`` on the filesystem mounted at ``mount``.

    A project the filesystem has no record of yet (nothing allocated, no limit set)
    reads as zero. :class:`QuotaUnavailable` when quotas cannot be read there.
    """
    dq = FsDiskQuota()
    try:
        _quotactl(mount, Q_XGETQUOTA, projid, dq)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return ProjectQuota(projid, 0, 0)
        raise _unavailable(exc, mount, "read") from None
    return ProjectQuota(projid, dq.d_bcount * BASIC_BLOCK, dq.d_blk_hardlimit * BASIC_BLOCK,
                        dq.d_blk_softlimit * BASIC_BLOCK, dq.d_icount)


def set_hard_limit(mount: str, projid: int, hard_bytes: int) -> None:
    """Set project ``projid``'s hard block limit (and no soft limit) on ``mount``'s
    filesystem; ``hard_bytes`` should be a multiple of the filesystem block size (xfs
    keeps whole blocks, so another value reads back different)."""
    dq = FsDiskQuota(d_version=FS_DQUOT_VERSION, d_flags=FS_PROJ_QUOTA,
                     d_fieldmask=FS_DQ_BHARD | FS_DQ_BSOFT, d_id=projid,
                     d_blk_hardlimit=hard_bytes // BASIC_BLOCK, d_blk_softlimit=0)
    try:
        _quotactl(mount, Q_XSETQLIM, projid, dq)
    except OSError as exc:
        raise _unavailable(exc, mount, "set") from None


# ------------------------------------------------------------------------ seam
class QuotaOps(Protocol):
    """What kvagent does with project quotas (the real one is :class:`XfsQuota`)."""

    def project(self, directory: str) -> Project: ...

    def tag(self, directory: str, projid: int, tick: Callable[[], None]) -> int: ...

    def get(self, mount: str, projid: int) -> ProjectQuota: ...

    def set_limit(self, mount: str, projid: int, hard_bytes: int) -> None: ...


class XfsQuota:
    """Project quotas through the kernel's own interfaces (ioctl and quotactl_fd)."""

    def project(self, directory: str) -> Project:
        return project_of(directory)

    def tag(self, directory: str, projid: int, tick: Callable[[], None]) -> int:
        return tag_tree(directory, projid, tick=tick)

    def get(self, mount: str, projid: int) -> ProjectQuota:
        return get_quota(mount, projid)

    def set_limit(self, mount: str, projid: int, hard_bytes: int) -> None:
        set_hard_limit(mount, projid, hard_bytes)
