"""Namespace identities and the identity of block devices.

A namespace's uuid and nguid are bound to its storage: kvagent draws fresh ones when
it creates the storage (a logical volume, a file, a device claim) and records them
*with that storage* (LVM tags, the file manifest, the claim). The GPU host proves it
is looking at the namespace it formatted by that uuid, so the identity must never be
shown on other storage. Namespaces that kvagent exported before identities were
recorded carry the formula of that time, ``nvmet.ids.namespace_uuid(NQN, nsid)``, and
keep it (:func:`legacy_ids`).

A whole device is recognised by what the hardware says about itself (WWID, serial)
and its size, read from sysfs; devices without either (null_blk, some virtual disks)
fall back to the device node.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from nvmet.ids import namespace_nguid, namespace_uuid

from ..records import DeviceClaim


def fresh_ids() -> tuple[str, str]:
    """A new (uuid, nguid) for storage kvagent is about to create."""
    return str(uuid.uuid4()), str(uuid.uuid4())


def legacy_ids(nqn: str, nsid: int) -> tuple[str, str]:
    """The (uuid, nguid) kvagent gave namespaces before identities were recorded."""
    return namespace_uuid(nqn, nsid), namespace_nguid(nqn, nsid)


@dataclass(frozen=True)
class DeviceIdentity:
    """A block device as it is now: its node, size and hardware identifiers."""

    device: str
    size: int | None
    wwid: str | None
    serial: str | None

    def describe(self) -> str:
        parts = [self.device]
        if self.wwid:
            parts.append(f"wwid {self.wwid}")
        if self.serial:
            parts.append(f"serial {self.serial}")
        if self.size is not None:
            parts.append(f"{self.size} bytes")
        return ", ".join(parts)


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def device_identity(path: str, sysfs: Path | str = "/sys") -> DeviceIdentity | None:
    """What ``path`` (a by-id link) points at now; None when it does not exist."""
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return None
    name = os.path.basename(real)
    block = Path(sysfs) / "class" / "block" / name
    sectors = _read(block / "size")
    return DeviceIdentity(
        device=real,
        size=int(sectors) * 512 if sectors and sectors.isdigit() else None,
        wwid=_read(block / "wwid") or _read(block / "device" / "wwid"),
        serial=_read(block / "device" / "serial"))


def claim_matches(claim: DeviceClaim, now: DeviceIdentity) -> bool:
    """Whether the device ``now`` is the one that was claimed.

    With hardware identifiers recorded they and the size must match; a claim without
    them (from an older kvagent, or a device that has none) must match node and size.
    """
    if claim.wwid is not None or claim.serial is not None:
        return (claim.wwid, claim.serial, claim.size) == (now.wwid, now.serial, now.size)
    return claim.device == now.device and (claim.size is None or claim.size == now.size)


def describe_claim(claim: DeviceClaim) -> str:
    parts = [claim.device]
    if claim.wwid:
        parts.append(f"wwid {claim.wwid}")
    if claim.serial:
        parts.append(f"serial {claim.serial}")
    if claim.size is not None:
        parts.append(f"{claim.size} bytes")
    return ", ".join(parts)
