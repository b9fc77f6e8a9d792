"""Filesystems on pool namespaces: made only on blank devices, accepted only when provably ours.

The xfs uuid kvagent writes is deterministic: uuid5(host NQN, namespace uuid)
(see agent.naming.filesystem_uuid). An existing filesystem is this host's own
exactly when its uuid is the one this host would have written; anything else
is foreign and is refused, never reformatted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


def probe_content(device: str, runner: Runner) -> DeviceContent:
    """Probe ``device`` with ``blkid -p`` (exit 2 = nothing found); errors are not 'blank'."""
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


def ensure_filesystem(device: str, fs_uuid: str, label: str, runner: Runner) -> bool:
    """Make sure ``device`` holds this host's xfs; True when one was made now.

    Blank → mkfs.xfs with the deterministic uuid. xfs with that uuid → accepted.
    Anything else → :class:`ForeignFilesystem` (the device is left untouched).
    """
    if not needs_filesystem(probe_content(device, runner), fs_uuid):
        return False
    # No -f: mkfs.xfs itself refuses a device with a signature it recognises.
    runner(["mkfs.xfs", "-q", "-m", f"uuid={fs_uuid}", "-L", label, device],
           timeout=MKFS_TIMEOUT)
    log.info("made xfs", device=device, uuid=fs_uuid, label=label)
    return True
