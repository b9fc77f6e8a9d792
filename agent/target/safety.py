"""Nothing lost: prove a device is blank before kvagent labels or exports it.

A device is refused when it is mounted or used as swap, has holders
(device-mapper, md, ...), has partitions, or carries any signature that
``wipefs`` or ``blkid`` can see (filesystem, RAID, LVM, partition table).
kvagent never wipes anything to make a device acceptable.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvagentError
from ..system.run import CommandError, Runner


class ForeignData(KvagentError):
    """The device carries data or is in use; kvagent refuses to touch it."""


@dataclass(frozen=True)
class DeviceInspection:
    """What was found on a device (empty ``findings`` = provably blank and unused)."""

    path: str
    device: str
    findings: tuple[str, ...]

    @property
    def blank(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class SystemView:
    """Roots for inspection, replaceable in tests."""

    sysfs: Path = Path("/sys")
    mountinfo: Path = Path("/proc/self/mountinfo")
    swaps: Path = Path("/proc/swaps")


def resolve_block_device(path: str) -> tuple[str, int]:
    """Real device node and its dev_t for ``path`` (by-id links are followed)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise ForeignData(f"{path} does not exist",
                          "check the device id (ls -l /dev/disk/by-id/)") from None
    if not stat.S_ISBLK(st.st_mode):
        raise ForeignData(f"{path} ({real}) is not a block device")
    return real, st.st_rdev


def inspect_device(path: str, runner: Runner, view: SystemView | None = None) -> DeviceInspection:
    """Everything that shows ``path`` is in use or holds data. Never modifies the device."""
    view = view or SystemView()
    real, rdev = resolve_block_device(path)
    name = os.path.basename(real)
    findings: list[str] = []
    sysdir = view.sysfs / "class" / "block" / name
    majmin = f"{os.major(rdev)}:{os.minor(rdev)}"

    partitions = sorted(p.name for p in _iterdir(sysdir) if (p / "partition").exists())
    if partitions:
        findings.append(f"partitions: {', '.join(partitions)}")
    holders = sorted(p.name for p in _iterdir(sysdir / "holders"))
    if holders:
        findings.append(f"held by: {', '.join(holders)} (device-mapper, md or similar)")
    devs = {majmin} | {_read(sysdir / p / "dev") for p in partitions}
    for line in _read(view.mountinfo).splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] in devs:
            findings.append(f"mounted on {fields[4]}")
    for line in _read(view.swaps).splitlines()[1:]:
        swapdev = line.split()[0] if line.split() else ""
        if swapdev and os.path.realpath(swapdev) in {real} | {f"/dev/{p}" for p in partitions}:
            findings.append(f"used as swap ({swapdev})")
    findings += _signatures(real, runner)
    return DeviceInspection(path, real, tuple(findings))


def _signatures(device: str, runner: Runner) -> list[str]:
    found: list[str] = []
    try:
        wipefs = runner(["wipefs", "--no-act", "--json", device], timeout=30)
    except CommandError as exc:
        raise ForeignData(f"cannot prove {device} is blank: {exc.message}",
                          "kvagent refuses devices it cannot inspect") from None
    if wipefs.stdout.strip():
        try:
            sigs = json.loads(wipefs.stdout).get("signatures", [])
        except json.JSONDecodeError:
            raise ForeignData(f"cannot parse wipefs output for {device}") from None
        for sig in sigs:
            label = f" label {sig['label']!r}" if sig.get("label") else ""
            found.append(f"{sig.get('type', 'unknown')} signature at offset "
                         f"{sig.get('offset', '?')}{label}")
    blkid = runner(["blkid", "-p", "-o", "export", device], timeout=30, check=False)
    # blkid exits 2 when it finds nothing, 0 with a signature, other codes on errors.
    if blkid.returncode == 0:
        props = dict(line.split("=", 1) for line in blkid.stdout.splitlines() if "=" in line)
        kind = props.get("TYPE") or props.get("PTTYPE")
        if kind and not any(kind in f for f in found):
            found.append(f"{kind} detected by blkid")
    elif blkid.returncode != 2:
        raise ForeignData(f"cannot prove {device} is blank: blkid exit {blkid.returncode}: "
                          f"{blkid.stderr.strip()}")
    return found


def ensure_blank(path: str, purpose: str, runner: Runner, view: SystemView | None = None) -> str:
    """Return the real device node if ``path`` is blank and unused, else raise ForeignData."""
    found = inspect_device(path, runner, view)
    if not found.blank:
        raise refusal(found, purpose)
    return found.device


def refusal(found: DeviceInspection, purpose: str, why: str = "") -> ForeignData:
    """The error for a device that is not blank: what was found, and what to do."""
    return ForeignData(
        f"refusing to {purpose} {found.path} ({found.device}): " + "; ".join(found.findings)
        + (f"; {why}" if why else ""),
        "kvagent only uses blank devices and never wipes data. If this data is not "
        f"needed, clear it yourself (e.g. `wipefs -a {found.device}` after unmounting), "
        "or pick another device",
    )


def _iterdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
