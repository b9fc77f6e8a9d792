"""LVM backing: one tagged logical volume per namespace in a volume group.

kvagent's LVs carry the tags ``kvagent``, ``kvagent_pool=<pool>``,
``kvagent_host=<host>`` and ``kvagent_ns=<n>``: ownership is provable from the
tags, never guessed from names. A volume group kvagent creates on blank devices
carries the ``kvagent`` tag too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..config.model import LvmBacking, TargetPool
from ..errors import KvagentError
from ..log import get_logger
from ..naming import LVM_OWNER_TAG, lv_name, lv_tags
from ..system.run import Runner
from .safety import ensure_blank
from .steps import BackingPlan, Step, Volume
from .usage import DeviceUsage

log = get_logger("lvm")
LVM_TIMEOUT = 120.0


class LvmError(KvagentError):
    """An LVM query or change failed."""


@dataclass(frozen=True)
class LogicalVolume:
    """An LV as ``lvs`` reports it."""

    name: str
    vg: str
    path: str
    size: int
    tags: frozenset[str]

    def tag_value(self, key: str) -> str | None:
        prefix = f"{key}="
        return next((t[len(prefix):] for t in self.tags if t.startswith(prefix)), None)

    @property
    def owned(self) -> bool:
        return LVM_OWNER_TAG in self.tags


@dataclass(frozen=True)
class VolumeGroup:
    """A VG as ``vgs`` reports it."""

    name: str
    size: int
    free: int
    extent_size: int
    tags: frozenset[str]


def _report(runner: Runner, argv: list[str], key: str) -> list[dict[str, str]]:
    result = runner(argv, timeout=LVM_TIMEOUT)
    try:
        data = json.loads(result.stdout)
        return [row for rep in data["report"] for row in rep.get(key, [])]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise LvmError(f"cannot parse {argv[0]} output: {exc}") from None


def _tags(text: str) -> frozenset[str]:
    return frozenset(t for t in text.split(",") if t)


def list_volume_groups(runner: Runner) -> dict[str, VolumeGroup]:
    """All volume groups on this host."""
    rows = _report(runner, ["vgs", "--reportformat", "json", "--units", "b", "--nosuffix",
                            "-o", "vg_name,vg_size,vg_free,vg_extent_size,vg_tags"], "vg")
    return {r["vg_name"]: VolumeGroup(r["vg_name"], int(r["vg_size"]), int(r["vg_free"]),
                                      int(r["vg_extent_size"]), _tags(r["vg_tags"]))
            for r in rows}


def list_owned_volumes(runner: Runner) -> list[LogicalVolume]:
    """Every LV carrying kvagent's owner tag, in any volume group."""
    rows = _report(runner, ["lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                            "-o", "lv_name,vg_name,lv_path,lv_size,lv_tags",
                            f"@{LVM_OWNER_TAG}"], "lv")
    vols = [LogicalVolume(r["lv_name"], r["vg_name"], r["lv_path"] or
                          f"/dev/{r['vg_name']}/{r['lv_name']}", int(r["lv_size"]),
                          _tags(r["lv_tags"])) for r in rows]
    return [v for v in vols if v.owned]


def _round_up(size: int, extent: int) -> int:
    return -(-size // extent) * extent


def plan_lvm(pool: TargetPool, hosts: list[str | None], runner: Runner,
             vgs: dict[str, VolumeGroup], owned: list[LogicalVolume], *,
             usage: DeviceUsage | None = None,
             creating: dict[str, tuple[str, tuple[str, ...]]] | None = None) -> BackingPlan:
    """Volumes and steps for an LVM-backed pool (creates VG, creates/extends LVs).

    ``usage`` knows the devices of every pool: a device another pool uses is
    refused. ``creating`` maps volume groups that an earlier pool of this pass
    creates to (that pool, its devices); this pool then does not create it again.
    """
    backing = pool.backing
    assert isinstance(backing, LvmBacking) and pool.namespaces is not None
    plan = BackingPlan()
    creating = {} if creating is None else creating
    vg = vgs.get(backing.volume_group)
    extent = vg.extent_size if vg else 4 * 1024 * 1024
    if vg is None and backing.volume_group in creating:
        first, devices = creating[backing.volume_group]
        if backing.devices and tuple(backing.devices) != devices:
            plan.errors.append(
                f"pool {pool.name}: volume group {backing.volume_group} is created by pool "
                f"{first} on {', '.join(devices)}; list the same devices (or none) here")
            return plan
    elif vg is None:
        if not backing.devices:
            plan.errors.append(
                f"pool {pool.name}: volume group {backing.volume_group!r} does not exist; "
                "create it, or list blank devices under backing.devices for kvagent to use")
            return plan
        blank = []
        role = f"vg:{backing.volume_group}"
        for dev in backing.devices:
            others = usage.conflicts(dev, pool.name, role) if usage else []
            if others:
                plan.errors.append(
                    f"pool {pool.name}: refusing to create volume group on {dev} "
                    f"({os.path.realpath(dev)}): it is {'; '.join(others)}. A device serves "
                    "one pool only: remove it from one of them")
                continue
            try:
                blank.append(ensure_blank(dev, "create volume group on", runner))
            except KvagentError as exc:
                plan.errors.append(f"pool {pool.name}: {exc}")
        if plan.errors:
            return plan
        creating[backing.volume_group] = (pool.name, tuple(backing.devices))
        plan.steps.append(Step(
            "lvm.vgcreate", pool.name, backing.volume_group,
            f"on {', '.join(backing.devices)}",
            lambda: runner(["vgcreate", "-y", "--addtag", LVM_OWNER_TAG,
                            backing.volume_group, *blank], timeout=LVM_TIMEOUT)))
    by_key = {(v.vg, v.tag_value("kvagent_pool"), v.tag_value("kvagent_host"),
               v.tag_value("kvagent_ns")): v for v in owned}
    size = _round_up(pool.namespaces.size, extent)
    needed = 0
    for host in hosts:
        for nsid in range(1, pool.namespaces.count + 1):
            name = lv_name(pool.name, host, nsid)
            path = f"/dev/{backing.volume_group}/{name}"
            plan.volumes.append(Volume(pool.name, host, nsid, path, size))
            existing = by_key.get((backing.volume_group, pool.name, host or "-", str(nsid)))
            if existing is None:
                needed += size
                tags = [a for t in lv_tags(pool.name, host, nsid) for a in ("--addtag", t)]
                plan.steps.append(Step(
                    "lvm.lvcreate", pool.name, f"{backing.volume_group}/{name}",
                    f"{size} bytes",
                    _runner_call(runner, ["lvcreate", "-y", "-Wy", "-Zy", "-n", name,
                                          "-L", f"{size}b", *tags, backing.volume_group])))
            elif existing.size < size:
                needed += size - existing.size
                plan.steps.append(Step(
                    "lvm.lvextend", pool.name, f"{backing.volume_group}/{name}",
                    f"{existing.size} -> {size} bytes",
                    _runner_call(runner, ["lvextend", "-L", f"{size}b", existing.path]),
                    grown=path))
            elif existing.size > size:
                log.warning("volume is larger than configured; kvagent never shrinks",
                            volume=existing.path, size=existing.size, configured=size)
    if vg is not None and needed > vg.free:
        plan.errors.append(
            f"pool {pool.name}: volume group {vg.name} has {vg.free} bytes free, "
            f"the pool needs {needed} more")
        plan.steps = []
    return plan


def _runner_call(runner: Runner, argv: list[str]):
    return lambda: runner(argv, timeout=LVM_TIMEOUT)


def remove_volume(runner: Runner, volume: LogicalVolume, pool: str) -> None:
    """Delete one LV, only if its tags prove it belongs to ``pool``."""
    if not volume.owned or volume.tag_value("kvagent_pool") != pool:
        raise LvmError(f"refusing to remove {volume.path}: its tags do not show it belongs "
                       f"to kvagent pool {pool!r}")
    runner(["lvremove", "-y", f"{volume.vg}/{volume.name}"], timeout=LVM_TIMEOUT)
