"""The mount table (/proc/self/mountinfo), read by both roles.

Every function takes the mount table as a parameter, so tests can give a file of
their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo, the parts kvagent needs."""

    mount_point: str
    device: str  # major:minor
    fstype: str
    source: str
    options: str  # per-mount options (rw,noatime,...)
    super_options: str = ""  # the filesystem's own (for xfs: prjquota, ...)


def _unescape(text: str) -> str:
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[MountEntry]:
    """Parse mountinfo (fields after ' - ' are fstype, source, super options)."""
    entries = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        entries.append(MountEntry(_unescape(fields[4]), fields[2], tail[0], _unescape(tail[1]),
                                  fields[5], tail[2] if len(tail) > 2 else ""))
    return entries


def mounted_at(path: str, mountinfo: Path = MOUNTINFO) -> MountEntry | None:
    """The mount whose mount point is exactly ``path`` (the last one wins, as the kernel shows)."""
    found = None
    for entry in read_mounts(mountinfo):
        if entry.mount_point == os.path.normpath(path):
            found = entry
    return found


def filesystem_type(path: Path | str, mountinfo: Path = MOUNTINFO,
                    mounts: list[MountEntry] | None = None) -> str | None:
    """Type of the filesystem holding ``path`` (the longest mount point that contains it);
    ``mounts``: the mount table when already read (else read from ``mountinfo``)."""
    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for m in read_mounts(mountinfo) if mounts is None else mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (
                best is None or len(mp) >= best[0]):
            best = (len(mp), m.fstype)
    return best[1] if best else None


def filesystem_device(path: Path | str, mountinfo: Path = MOUNTINFO) -> str | None:
    """The source of the filesystem holding ``path`` (its device, e.g. ``/dev/nvme0n1p2``,
    or ``tmpfs`` for a filesystem without one), matched by the file's ``st_dev`` (the
    nearest existing parent's if ``path`` does not exist); None if not found."""
    probe = Path(path)
    while True:
        try:
            dev = os.stat(probe).st_dev
            break
        except OSError:
            if probe.parent == probe:
                return None
            probe = probe.parent
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    found = [m.source for m in read_mounts(mountinfo) if m.device == majmin]
    return found[-1] if found else None
