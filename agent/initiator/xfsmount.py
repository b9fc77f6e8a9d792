"""A mounted pool xfs: shut down by an outage? smaller than its grown namespace?

Both questions are answered without a command, so a converged pass can ask them of
every mount: one ``stat`` and one ioctl.

- **Shut down.** When fast-failed I/O hits xfs's log (or metadata it cannot retry),
  xfs shuts the filesystem down for good: every later call on it fails with EIO,
  also once the storage is back. On 6.1 ``stat`` of the mount root then fails with
  EIO (``xfs_vn_getattr``), while a healthy xfs answers it from the cached root
  inode without I/O, even while its device is unreachable. Unmounting and mounting
  again (log recovery) is the only way back (kvagent does it once a controller is
  live again).
- **Growth.** ``XFS_IOC_FSGEOMETRY`` gives the filesystem's data blocks; the block
  device's size comes from sysfs. ``xfs_growfs`` runs when the device is at least
  :data:`GROW_MIN_BYTES` bigger: mkfs.xfs leaves up to 16 MiB at the end unused (its
  smallest allocation group), and xfs_growfs leaves a tail shorter than 64 blocks, so
  a smaller difference is never worth (or able to take) a grow, and a converged pass
  runs none.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from ..log import get_logger
from ..system.run import Runner

log = get_logger("initiator.xfs")

#: ``_IOR('X', 100, struct xfs_fsop_geom_v1)``: the geometry every xfs kernel answers.
XFS_IOC_FSGEOMETRY_V1 = 0x80705864
_GEOM_V1_SIZE = 112
#: A device at least this much bigger than its filesystem gets ``xfs_growfs``.
GROW_MIN_BYTES = 16 << 20
GROWFS_TIMEOUT = 300.0
#: The system calls this module makes past Python's own wrappers (XFS_IOC_FSGEOMETRY);
#: the unit's SystemCallFilter must allow them (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("ioctl",)


@dataclass(frozen=True)
class Geometry:
    """An xfs's data section: block size and blocks (``xfs_fsop_geom``)."""

    block_size: int
    data_blocks: int

    @property
    def data_bytes(self) -> int:
        return self.block_size * self.data_blocks


def is_shut_down(path: str) -> bool:
    """Whether the filesystem mounted at ``path`` answers ``stat`` with EIO (an xfs that
    shut down). Other errors are raised: they are not a shutdown."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.EIO:
            return True
        raise
    return False


def geometry(path: str) -> Geometry:
    """The geometry of the xfs mounted at ``path`` (one ioctl on its root)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = bytearray(_GEOM_V1_SIZE)
        fcntl.ioctl(fd, XFS_IOC_FSGEOMETRY_V1, buf)
    finally:
        os.close(fd)
    (block_size,) = struct.unpack_from("=I", buf, 0)
    (data_blocks,) = struct.unpack_from("=Q", buf, 32)
    return Geometry(block_size, data_blocks)


def needs_growth(device_bytes: int | None, fs: Geometry) -> bool:
    """Whether ``xfs_growfs`` would give the filesystem a worthwhile part of its device."""
    return device_bytes is not None and device_bytes - fs.data_bytes >= GROW_MIN_BYTES


def grow(path: str, runner: Runner) -> None:
    """Grow the xfs mounted at ``path`` to its whole device (online, data section)."""
    runner(["xfs_growfs", "-d", path], timeout=GROWFS_TIMEOUT)
    log.info("grew xfs", path=path)
