"""LVM backing: one tagged logical volume per namespace in a volume group.

kvagent's LVs carry the tags ``kvagent``, ``kvagent_pool=<pool>``,
``kvagent_host=<host>``, ``kvagent_ns=<n>`` and the namespace's identity
``kvagent_uuid=<uuid>``, ``kvagent_nguid=<nguid>``: ownership and identity are
written on the storage itself, never guessed from names. A volume group kvagent
creates on blank devices carries the ``kvagent`` tag too. LVs from before identities
were recorded get their (legacy) identity tagged on the next apply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ...config.model import LvmBacking, TargetPool
from ...errors import KvagentError
from ...log import get_logger
from ...naming import LVM_OWNER_TAG, lv_name, lv_tags
from ...records import PoolRecord, Storage, TargetRecords
from ...system.run import Runner
from ..identity import fresh_ids, legacy_ids
from ..safety import ensure_blank
from ..usage import DeviceUse
from .base import BackingPlan, Doomed, PassContext, Step, Volume, grantees

log = get_logger("lvm")
LVM_TIMEOUT = 120.0
UUID_TAG = "kvagent_uuid"
NGUID_TAG = "kvagent_nguid"


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
    lv_uuid: str = ""

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
    return owned_volumes_and_groups(runner)[0]


def owned_volumes_and_groups(runner: Runner) -> tuple[list[LogicalVolume],
                                                      dict[str, VolumeGroup]]:
    """kvagent's LVs and the volume groups that hold them, from one ``lvs`` (one device
    scan: a converged pass needs no ``vgs``)."""
    rows = _report(runner, ["lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                            "-o", "lv_name,vg_name,lv_path,lv_size,lv_tags,lv_uuid,vg_size,"
                            "vg_free,vg_extent_size,vg_tags", f"@{LVM_OWNER_TAG}"], "lv")
    vols = [LogicalVolume(r["lv_name"], r["vg_name"], r["lv_path"] or
                          f"/dev/{r['vg_name']}/{r['lv_name']}", int(r["lv_size"]),
                          _tags(r["lv_tags"]), r.get("lv_uuid", "")) for r in rows]
    groups = {r["vg_name"]: VolumeGroup(r["vg_name"], int(r["vg_size"]), int(r["vg_free"]),
                                        int(r["vg_extent_size"]), _tags(r["vg_tags"]))
              for r in rows if r.get("vg_size") and r.get("vg_extent_size")}
    return [v for v in vols if v.owned], groups


def _round_up(size: int, extent: int) -> int:
    return -(-size // extent) * extent


def remove_volume(runner: Runner, volume: LogicalVolume, pool: str) -> None:
    """Delete one LV, only if its tags prove it belongs to ``pool``."""
    if not volume.owned or volume.tag_value("kvagent_pool") != pool:
        raise LvmError(f"refusing to remove {volume.path}: its tags do not show it belongs "
                       f"to kvagent pool {pool!r}")
    runner(["lvremove", "-y", f"{volume.vg}/{volume.name}"], timeout=LVM_TIMEOUT)


def _call(runner: Runner, argv: list[str]):
    return lambda: runner(argv, timeout=LVM_TIMEOUT)


class LvmDriver:
    """Logical volumes in a volume group (kind: lvm)."""

    kind = "lvm"

    def layout(self, pool: TargetPool,
               records: TargetRecords) -> Mapping[str | None, tuple[int, ...]]:
        assert pool.namespaces is not None
        return {h: tuple(range(1, pool.namespaces.count + 1)) for h in grantees(pool)}

    def record(self, pool: TargetPool) -> PoolRecord:
        assert isinstance(pool.backing, LvmBacking)
        return PoolRecord("lvm", {"volume_group": pool.backing.volume_group})

    def devices(self, pool: TargetPool) -> list[tuple[str, DeviceUse]]:
        b = pool.backing
        assert isinstance(b, LvmBacking)
        return [(dev, DeviceUse(pool.name, f"vg:{b.volume_group}",
                                f"listed by pool {pool.name} as {dev} for volume group "
                                f"{b.volume_group}")) for dev in b.devices]

    def where(self, record: PoolRecord) -> str:
        return str(record.params.get("volume_group", "?"))

    def _lvm(self, ctx: PassContext,
             vg: str | None = None) -> tuple[dict[str, VolumeGroup], list[LogicalVolume]]:
        """kvagent's LVs and the groups that hold them (once per pass); every group only
        when ``vg`` is not among those (``vgs`` is then asked once)."""
        if "lvm" not in ctx.cache:
            owned, groups = owned_volumes_and_groups(ctx.runner)
            ctx.cache["lvm"] = (groups, owned, False)
        groups, owned, complete = ctx.cache["lvm"]
        if vg is not None and vg not in groups and not complete:
            groups = {**list_volume_groups(ctx.runner), **groups}
            ctx.cache["lvm"] = (groups, owned, True)
        return groups, owned

    def plan(self, ctx: PassContext, pool: TargetPool) -> BackingPlan:
        """Volumes and steps (create the VG on blank devices, create/extend/tag LVs).

        A device another pool uses is refused; a volume group that an earlier pool of
        this pass creates is not created again (``ctx.cache["lvm.creating"]``).
        """
        backing = pool.backing
        assert isinstance(backing, LvmBacking) and pool.namespaces is not None
        runner = ctx.runner
        plan = BackingPlan()
        vgs, owned = self._lvm(ctx, backing.volume_group)
        creating: dict[str, tuple[str, tuple[str, ...]]] = ctx.cache.setdefault(
            "lvm.creating", {})
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
                others = ctx.usage.conflicts(dev, pool.name, role)
                if others:
                    plan.errors.append(
                        f"pool {pool.name}: refusing to create volume group on {dev} "
                        f"({os.path.realpath(dev)}): it is {'; '.join(others)}. A device "
                        "serves one pool only: remove it from one of them")
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
                _call(runner, ["vgcreate", "-y", "--addtag", LVM_OWNER_TAG,
                               backing.volume_group, *blank])))
        by_key = {(v.vg, v.tag_value("kvagent_pool"), v.tag_value("kvagent_host"),
                   v.tag_value("kvagent_ns")): v for v in owned}
        size = _round_up(pool.namespaces.size, extent)
        needed = 0
        for host, nsids in self.layout(pool, ctx.records).items():
            for nsid in nsids:
                name = lv_name(pool.name, host, nsid)
                path = f"/dev/{backing.volume_group}/{name}"
                subject = f"{backing.volume_group}/{name}"
                existing = by_key.get((backing.volume_group, pool.name, host or "-", str(nsid)))
                if existing is None:
                    uuid, nguid = fresh_ids()
                    needed += size
                    tags = [*lv_tags(pool.name, host, nsid), f"{UUID_TAG}={uuid}",
                            f"{NGUID_TAG}={nguid}"]
                    plan.steps.append(Step(
                        "lvm.lvcreate", pool.name, subject, f"{size} bytes",
                        _call(runner, ["lvcreate", "-y", "-Wy", "-Zy", "-n", name,
                                       "-L", f"{size}b",
                                       *[a for t in tags for a in ("--addtag", t)],
                                       backing.volume_group]),
                        volume=(host, nsid)))
                    storage = Storage("lvm", path, f"LV {subject}, to be created")
                else:
                    uuid = existing.tag_value(UUID_TAG) or ""
                    nguid = existing.tag_value(NGUID_TAG) or ""
                    if not uuid or not nguid:
                        uuid, nguid = legacy_ids(ctx.nqn(pool.name, host), nsid)
                        plan.steps.append(Step(
                            "lvm.tag", pool.name, subject, f"namespace identity {uuid}",
                            _call(runner, ["lvchange", "--addtag", f"{UUID_TAG}={uuid}",
                                           "--addtag", f"{NGUID_TAG}={nguid}", existing.path]),
                            volume=(host, nsid)))
                    storage = Storage("lvm", path, f"LV {subject}, lv uuid {existing.lv_uuid}")
                    if existing.size < size:
                        needed += size - existing.size
                        plan.steps.append(Step(
                            "lvm.lvextend", pool.name, subject, f"{existing.size} -> {size} bytes",
                            _call(runner, ["lvextend", "-L", f"{size}b", existing.path]),
                            grown=path, volume=(host, nsid)))
                    elif existing.size > size:
                        log.warning("volume is larger than configured; kvagent never shrinks",
                                    volume=existing.path, size=existing.size, configured=size)
                plan.volumes.append(Volume(pool.name, host, nsid, path, size, uuid, nguid,
                                           storage))
        if vg is not None and needed > vg.free:
            plan.errors.append(
                f"pool {pool.name}: volume group {vg.name} has {vg.free} bytes free, "
                f"the pool needs {needed} more")
            plan.steps = []
        return plan

    def doomed(self, ctx: PassContext, name: str, record: PoolRecord | None) -> list[Doomed]:
        if record is not None and record.kind != self.kind:
            return []
        _, owned = self._lvm(ctx)
        return [Doomed("logical_volume", v.path,
                       lambda v=v: remove_volume(ctx.runner, v, name))
                for v in owned if v.tag_value("kvagent_pool") == name]
