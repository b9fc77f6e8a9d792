"""The immutable attribute of a directory (``FS_IMMUTABLE_FL``, what ``chattr +i`` sets).

kvagent seals each mount point of a GPU host's pool (the directory on the host's own
filesystem that a namespace is mounted on) while nothing is mounted on it: nothing can
then be created in it, not even by root, so an engine that starts before its pool is
mounted, or writes while it is unmounted, gets EPERM instead of filling the root
filesystem. Mounting on a sealed directory works, and what is mounted hides the seal;
the seal stays on the directory across unmounts and reboots. kvagent clears it before
it removes a mount point. Setting or clearing the flag takes CAP_LINUX_IMMUTABLE.

Only the directory itself is ever touched, never what is mounted on it: the directory is
opened without following links and refused when it is on another filesystem than its
parent (something is mounted on it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

# linux/fs.h: _IOR('f', 1, long) / _IOW('f', 2, long); the kernel reads and writes an int.
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010
#: The system calls these make (the unit's SystemCallFilter must allow them).
SYSCALLS = ("ioctl",)
#: What a filesystem without the attribute answers.
UNSUPPORTED = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})


class MountedOn(OSError):
    """The directory has something mounted on it: its own attribute is out of reach."""


def _open(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parent = os.stat(os.path.dirname(os.path.abspath(path)) or "/")
        if os.fstat(fd).st_dev != parent.st_dev:
            raise MountedOn(errno.EBUSY, "something is mounted on it", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flags(fd: int) -> int:
    buf = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
    return struct.unpack_from("i", buf)[0]


def is_immutable(path: str) -> bool | None:
    """Whether directory ``path`` has the immutable attribute; None when its filesystem
    has no such attribute or something is mounted on it."""
    try:
        fd = _open(path)
    except MountedOn:
        return None
    try:
        return bool(_flags(fd) & FS_IMMUTABLE_FL)
    except OSError as exc:
        if exc.errno in UNSUPPORTED:
            return None
        raise
    finally:
        os.close(fd)


def set_immutable(path: str, on: bool) -> None:
    """Set (``on``) or clear the immutable attribute of directory ``path``; OSError when
    the filesystem has none, the process lacks CAP_LINUX_IMMUTABLE (EPERM), or something
    is mounted on it (:class:`MountedOn`)."""
    fd = _open(path)
    try:
        flags = _flags(fd)
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags) + bytes(4))
    finally:
        os.close(fd)
