"""Filesystems on pool namespaces: made only on blank devices, accepted only when provably ours.

The xfs uuid kvagent writes is deterministic: uuid5(host NQN, namespace uuid)
(see agent.naming.filesystem_uuid). An existing filesystem is this host's own
exactly when its uuid is the one this host would have written; anything else
is foreign and is refused, never reformatted. One of this host's own whose mkfs
never finished (the superblock's in-progress flag) is made again.
"""

from __future__ import annotations

import os
import re
import uuid as uuid_mod
from collections.abc import Callable
from dataclasses import dataclass

from .. import progress
from ..errors import KvagentError
from ..log import get_logger
from ..system.run import Runner

log = get_logger("filesystem")
MKFS_TIMEOUT = 600.0


class ForeignFilesystem(KvagentError):
    """The device holds something kvagent did not write; it is refused."""


@dataclass(frozen=True)
class DeviceContent:
    """What blkid sees on a device (low-level probe, no cache)."""

    device: str
    type: str | None  # xfs, ext4, LVM2_member, ... or None when blank
    uuid: str | None
    label: str | None
    partition_table: str | None

    @property
    def blank(self) -> bool:
        return self.type is None and self.partition_table is None


def probe_content(device: str, runner: Runner, *,
                  exists: Callable[[str], bool] = os.path.exists) -> DeviceContent:
    """Probe ``device`` with ``blkid -p`` (exit 2 = nothing found); errors are not 'blank'.

    A device that does not exist is an error too (blkid says "nothing found" for it).
    """
    if not exists(device):
        raise KvagentError(f"cannot probe {device}: it does not exist",
                           "kvagent will not format a device it cannot inspect")
    result = runner(["blkid", "-p", "-o", "export", device], timeout=30, check=False)
    if result.returncode == 2:
        return DeviceContent(device, None, None, None, None)
    if result.returncode != 0:
        raise KvagentError(f"cannot probe {device}: blkid exit {result.returncode}: "
                           f"{result.stderr.strip()}", "kvagent will not format a device "
                           "it cannot inspect")
    props = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return DeviceContent(device, props.get("TYPE"), props.get("UUID"), props.get("LABEL"),
                         props.get("PTTYPE"))


def xfs_label(pool: str, index: int) -> str:
    """An xfs label (at most 12 characters) for humans; never used for ownership."""
    suffix = f"-{index}"
    return (re.sub(r"[^a-z0-9-]", "", pool)[: 12 - len(suffix)] + suffix)[:12]


def needs_filesystem(content: DeviceContent, fs_uuid: str) -> bool:
    """Whether a device with ``content`` needs mkfs: True when blank, False when it holds
    this host's xfs (uuid ``fs_uuid``); anything else raises :class:`ForeignFilesystem`."""
    if content.type == "xfs" and (content.uuid or "").lower() == fs_uuid.lower():
        return False
    if content.blank:
        return True
    what = content.type or f"{content.partition_table} partition table"
    detail = f" with uuid {content.uuid}" if content.uuid else ""
    raise ForeignFilesystem(
        f"refusing to format {content.device}: it holds {what}{detail}, which this host did "
        f"not write (kvagent's filesystem here would have uuid {fs_uuid})",
        "if the target exported the wrong device or another host used it, fix that first; "
        "if the data is not needed, clear it yourself (wipefs -a); kvagent never does")


@dataclass(frozen=True)
class XfsSuperblock:
    """The primary xfs superblock's identity and whether mkfs finished writing it."""

    uuid: str
    inprogress: bool


def read_xfs_superblock(device: str) -> XfsSuperblock | None:
    """The xfs superblock at the start of ``device`` (None when there is none).

    Layout (xfs_dsb, big-endian): magic ``XFSB`` at 0, uuid at 32, ``sb_inprogress``
    at 126 — mkfs.xfs sets it first and clears it when the filesystem is complete.
    """
    fd = os.open(device, os.O_RDONLY)
    try:
        head = os.pread(fd, 512, 0)
    finally:
        os.close(fd)
    if len(head) < 128 or head[:4] != b"XFSB":
        return None
    return XfsSuperblock(str(uuid_mod.UUID(bytes=head[32:48])), head[126] != 0)


def ensure_filesystem(device: str, fs_uuid: str, label: str, runner: Runner, *,
                      superblock: Callable[[str], XfsSuperblock | None] = read_xfs_superblock,
                      exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Make sure ``device`` holds this host's finished xfs; True when one was made now.

    Blank → mkfs.xfs with the deterministic uuid. A finished xfs with that uuid →
    accepted (read from its superblock, with no blkid process). An xfs with that uuid
    that mkfs never finished (killed, power cut: ``sb_inprogress`` still set) is this
    host's own unfinished work → made again
    (``-f``: the uuid proves it is ours). Anything else → :class:`ForeignFilesystem`
    (the device is left untouched).
    """
    with progress.step(f"reading the superblock of {device}", bound=progress.DEVICE_IO_BOUND):
        sb = superblock(device)
    if sb is not None and not sb.inprogress and sb.uuid.lower() == fs_uuid.lower():
        return False  # this host's finished xfs: nothing to probe (no blkid on a converged pass)
    content = probe_content(device, runner, exists=exists)
    unfinished = sb is not None and sb.inprogress and sb.uuid.lower() == fs_uuid.lower()
    if not unfinished and not needs_filesystem(content, fs_uuid):
        return False
    if unfinished:
        log.warning("redoing an xfs whose mkfs did not finish", device=device, uuid=fs_uuid)
    # No -f otherwise: mkfs.xfs itself refuses a device with a signature it recognises.
    runner(["mkfs.xfs", "-q", *(["-f"] if unfinished else []), "-m", f"uuid={fs_uuid}",
            "-L", label, device], timeout=MKFS_TIMEOUT)
    log.info("made xfs", device=device, uuid=fs_uuid, label=label)
    return True
