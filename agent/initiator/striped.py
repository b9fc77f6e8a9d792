"""Striped layout: one LVM striped volume across a pool's namespaces (aggregate bandwidth).

The volume group ``kvs_<pool>`` carries the tags ``kvagent``,
``kvagent_pool=<pool>`` and ``kvagent_role=initiator``; a namespace device
that is an LVM PV is accepted only when it belongs to that group. kvagent
never removes the group on detach (it only deactivates it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import KvagentError
from ..log import get_logger
from ..naming import LVM_OWNER_TAG
from ..system.run import Runner
from .filesystem import ForeignFilesystem, probe_content

log = get_logger("striped")
LVM_TIMEOUT = 120.0
STRIPE_SIZE = "1m"
LV_NAME = "data"


def vg_name(pool: str) -> str:
    return f"kvs_{pool}"


def vg_tags(pool: str) -> tuple[str, ...]:
    return (LVM_OWNER_TAG, f"kvagent_pool={pool}", "kvagent_role=initiator")


def volume_path(pool: str) -> str:
    return f"/dev/{vg_name(pool)}/{LV_NAME}"


@dataclass(frozen=True)
class PhysicalVolume:
    """A PV as ``pvs`` reports it."""

    device: str
    vg: str
    vg_tags: frozenset[str]


def volume_slaves(pool: str) -> frozenset[str] | None:
    """Block devices under the pool's active volume (sysfs ``slaves``); None if not active."""
    path = volume_path(pool)
    if not os.path.exists(path):
        return None
    dm = os.path.basename(os.path.realpath(path))
    try:
        return frozenset(os.listdir(f"/sys/block/{dm}/slaves"))
    except OSError:
        return None


def list_pvs(runner: Runner, devices: list[str]) -> dict[str, PhysicalVolume]:
    """PV facts for the given devices (those that are PVs)."""
    result = runner(["pvs", "--reportformat", "json", "-o", "pv_name,vg_name,vg_tags",
                     *devices], timeout=LVM_TIMEOUT, check=False)
    if result.returncode not in (0, 5):  # 5: some devices are not PVs
        raise KvagentError(f"pvs failed: {result.stderr.strip()}")
    try:
        rows = [r for rep in json.loads(result.stdout or '{"report": []}')["report"]
                for r in rep.get("pv", [])]
    except (json.JSONDecodeError, KeyError) as exc:
        raise KvagentError(f"cannot parse pvs output: {exc}") from None
    return {r["pv_name"]: PhysicalVolume(r["pv_name"], r["vg_name"],
                                         frozenset(t for t in r["vg_tags"].split(",") if t))
            for r in rows}


def ensure_striped_volume(pool: str, devices: list[str], runner: Runner, *,
                          exists: Callable[[str], bool] = os.path.exists,
                          slaves: Callable[[str], frozenset[str] | None] = volume_slaves,
                          ) -> tuple[str, bool]:
    """Create or activate the pool's striped LV; returns (device path, created now).

    Each device must be blank or already a PV of this pool's tagged VG. A tagged VG
    without its LV (an attach interrupted between vgcreate and lvcreate) gets the LV.
    The volume active over exactly these devices (a converged pass) runs no command.
    """
    vg = vg_name(pool)
    if slaves(pool) == frozenset(os.path.basename(os.path.realpath(d)) for d in devices):
        return volume_path(pool), False
    pvs = list_pvs(runner, devices)
    blank, ours = [], []
    for dev in devices:
        pv = pvs.get(dev)
        if pv is not None:
            if pv.vg != vg or not set(vg_tags(pool)) <= pv.vg_tags:
                raise ForeignFilesystem(
                    f"refusing {dev}: it is an LVM physical volume of {pv.vg or 'no group'!r}, "
                    f"not of kvagent's {vg}", "kvagent never reuses LVM it did not create")
            ours.append(dev)
            continue
        content = probe_content(dev, runner, exists=exists)
        if not content.blank:
            what = content.type or "a partition table"
            raise ForeignFilesystem(f"refusing {dev}: it holds {what}, which this host did "
                                    "not write")
        blank.append(dev)
    if ours and blank:
        raise KvagentError(
            f"pool {pool}: the striped volume spans {len(ours)} namespaces and {len(blank)} "
            "new ones appeared; a striped volume cannot grow in place",
            "detach the pool, remove the volume group and attach again (the cache is rebuilt)")
    if blank:
        tags = [a for t in vg_tags(pool) for a in ("--addtag", t)]
        runner(["vgcreate", "-y", *tags, vg, *blank], timeout=LVM_TIMEOUT)
        _lvcreate(runner, vg, len(blank))
        log.info("made striped volume", pool=pool, stripes=len(blank))
        return volume_path(pool), True
    if exists(volume_path(pool)):  # active already (udev makes /dev/VG/LV on activation)
        return volume_path(pool), False
    runner(["vgchange", "-ay", vg], timeout=LVM_TIMEOUT)
    lvs = runner(["lvs", "--noheadings", "-o", "lv_name", vg], timeout=LVM_TIMEOUT)
    if LV_NAME not in lvs.stdout.split():
        log.warning("finishing a striped volume whose creation was interrupted", pool=pool)
        _lvcreate(runner, vg, len(ours))
        return volume_path(pool), True
    return volume_path(pool), False


def _lvcreate(runner: Runner, vg: str, stripes: int) -> None:
    runner(["lvcreate", "-y", "-Wy", "-Zy", "-i", str(stripes), "-I", STRIPE_SIZE,
            "-l", "100%FREE", "-n", LV_NAME, "--addtag", LVM_OWNER_TAG, vg],
           timeout=LVM_TIMEOUT)


def dm_name(pool: str) -> str:
    """The device-mapper name of the pool's striped volume (LVM doubles every '-')."""
    return f"{vg_name(pool).replace('-', '--')}-{LV_NAME}"


def deactivate(pool: str, runner: Runner) -> bool:
    """Deactivate the pool's volume group (before disconnecting); data stays.

    Returns False when there was no such group. A group that cannot be
    deactivated (its volume is still open) raises: disconnecting under an
    active volume would leave a device-mapper device over vanished disks.
    """
    result = runner(["vgchange", "-an", vg_name(pool)], timeout=LVM_TIMEOUT, check=False)
    if result.returncode == 0:
        log.info("deactivated striped volume", pool=pool)
        return True
    text = f"{result.stderr}\n{result.stdout}"
    if "not found" in text.lower():
        return False
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raise KvagentError(
        f"cannot deactivate volume group {vg_name(pool)}: "
        f"{lines[-1] if lines else 'vgchange exit ' + str(result.returncode)}",
        f"something still holds /dev/{vg_name(pool)}/{LV_NAME} open (dmsetup info -c "
        f"{dm_name(pool)}); kvagent does not disconnect under an active volume")
