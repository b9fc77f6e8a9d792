"""LVM backing: one tagged logical volume per namespace in a volume group.

kvagent's LVs carry the tags ``kvagent``, ``kvagent_pool=<pool>``,
``kvagent_host=<host>``, ``kvagent_ns=<n>`` and the namespace's identity
``kvagent_uuid=<uuid>``, ``kvagent_nguid=<nguid>``: ownership and identity are
written on the storage itself, never guessed from names. A volume group kvagent
creates on blank devices carries the ``kvagent`` tag too. LVs from before identities
were recorded get their (legacy) identity tagged on the next apply.

A namespace is the one LV whose tags name it: its identity *and* the path nvmet exports
come from that LV (a renamed one is exported by its new path). An LV kvagent did not
tag that has the name kvagent would give a new namespace is never exported, tagged or
given an identity: the pool fails with an error naming it.

A volume group is made on blank devices with an intent record first
(:mod:`.lvm_intent`): a pass killed between ``pvcreate`` and ``vgcreate`` is finished
by the next one, on labels with exactly the PV uuids recorded, and on nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...config.model import Config, LvmBacking, TargetPool
from ...errors import KvagentError
from ...log import get_logger
from ...naming import LVM_OWNER_TAG, lv_name, lv_tags
from ...records import PoolRecord, Storage, TargetRecords
from ...system.run import Runner
from ..identity import fresh_ids
from ..safety import ensure_blank, inspect_device, refusal
from ..usage import DeviceUse
from .base import BackingPlan, Doomed, PassContext, Step, Volume, grantees
from .lvm_intent import (
    PvIntent,
    VgIntent,
    has_intent,
    intent_path,
    new_intent,
    read_intent,
    remove_intent,
    write_intent,
)
from .placement import PlacementError, PvState, check_striped, choose_spread, new_pv_state
from .volumes import Refused, VolumePlanner

log = get_logger("lvm")
LVM_TIMEOUT = 120.0
UUID_TAG = "kvagent_uuid"
NGUID_TAG = "kvagent_nguid"
#: The extent size a group made by kvagent gets (LVM's default), planned with before it exists.
NEW_GROUP_EXTENT = 4 * 1024 * 1024


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


def physical_volumes(runner: Runner) -> tuple[dict[str, list[PvState]],
                                                dict[str, tuple[str, ...]]]:
    """Every group's PVs (free bytes, whose kvagent LVs are on each) and the PVs each LV
    uses (by LV uuid), from one ``pvs --segments`` (asked only when a new LV is placed or
    a spread LV grows: a converged pass never runs it)."""
    rows = _report(runner, ["pvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                            "--segments", "-o",
                            "pv_name,vg_name,pv_free,pv_attr,lv_uuid,lv_tags"], "pvseg")
    groups: dict[str, dict[str, PvState]] = {}
    used: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for r in rows:
        attr, vg = r.get("pv_attr", "a--"), r.get("vg_name", "")
        if not vg or not attr.startswith("a") or attr[2:3] == "m":
            continue  # not in a group, not allocatable, or missing
        pv = groups.setdefault(vg, {}).setdefault(
            r["pv_name"], PvState(r["pv_name"], int(r["pv_free"])))
        lv = r.get("lv_uuid", "")
        if not lv or (r["pv_name"], lv) in seen:
            continue
        seen.add((r["pv_name"], lv))
        used.setdefault(lv, []).append(r["pv_name"])
        tags = _tags(r.get("lv_tags", ""))
        if LVM_OWNER_TAG in tags:
            probe = LogicalVolume("", vg, "", 0, tags)
            pv.owners.append((probe.tag_value("kvagent_pool"), probe.tag_value("kvagent_host")))
        else:
            pv.owners.append((None, None))
    return ({vg: list(pvs.values()) for vg, pvs in groups.items()},
            {lv: tuple(pvs) for lv, pvs in used.items()})


def segment_devices(runner: Runner) -> dict[str, tuple[str, ...]]:
    """The devices under each of kvagent's LVs, by LV path, from ``lvs -o devices`` (one
    row per segment; ``/dev/sdb(0),/dev/sdc(0)`` for a striped one)."""
    rows = _report(runner, ["lvs", "--reportformat", "json", "-o",
                            "lv_path,lv_name,vg_name,devices", f"@{LVM_OWNER_TAG}"], "lv")
    out: dict[str, list[str]] = {}
    for r in rows:
        path = r.get("lv_path") or f"/dev/{r['vg_name']}/{r['lv_name']}"
        devs = out.setdefault(path, [])
        for part in (r.get("devices") or "").split(","):
            dev = part.split("(", 1)[0].strip()
            if dev and dev not in devs:
                devs.append(dev)
    return {path: tuple(devs) for path, devs in out.items()}


def volume_names(runner: Runner, vg: str) -> frozenset[str]:
    """The names of every LV in ``vg``, kvagent's or not (``lvs <vg>``: asked only when
    an LV is to be created there, to find an LV of that name kvagent did not tag)."""
    rows = _report(runner, ["lvs", "--reportformat", "json", "-o", "lv_name,vg_name", vg],
                   "lv")
    return frozenset(r["lv_name"] for r in rows if r.get("vg_name", vg) == vg)


NamespaceKey = tuple[str, str | None, str | None, str | None]


def owned_by_namespace(owned: list[LogicalVolume]) -> dict[NamespaceKey,
                                                           list[LogicalVolume]]:
    """kvagent's LVs by the namespace their tags name: (vg, pool, host, nsid)."""
    out: dict[NamespaceKey, list[LogicalVolume]] = {}
    for v in owned:
        key = (v.vg, v.tag_value("kvagent_pool"), v.tag_value("kvagent_host"),
               v.tag_value("kvagent_ns"))
        out.setdefault(key, []).append(v)
    return out


def device_bytes(device: str, sysfs: str) -> int | None:
    """Size of a block device from sysfs (``<sysfs>/class/block/<name>/size``), or None."""
    try:
        sectors = (Path(sysfs) / "class/block" / os.path.basename(device) / "size").read_text()
        return int(sectors) * 512
    except (OSError, ValueError):
        return None


def spread_pools(cfg: Config) -> frozenset[str]:
    """The configured LVM pools placed with ``spread``."""
    return frozenset(p.name for p in (cfg.target.pools if cfg.target else ())
                     if isinstance(p.backing, LvmBacking) and p.backing.placement == "spread")


def _round_up(size: int, extent: int) -> int:
    return -(-size // extent) * extent


def remove_volume(runner: Runner, volume: LogicalVolume, pool: str) -> None:
    """Delete one LV, only if its tags prove it belongs to ``pool``."""
    if not volume.owned or volume.tag_value("kvagent_pool") != pool:
        raise LvmError(f"refusing to remove {volume.path}: its tags do not show it belongs "
                       f"to kvagent pool {pool!r}")
    runner(["lvremove", "-y", f"{volume.vg}/{volume.name}"], timeout=LVM_TIMEOUT)


def pv_labels(runner: Runner) -> dict[str, tuple[str, str]]:
    """Every PV label LVM sees: ``{real device node: (PV uuid, its group or "")}``
    (``pvs``; asked only to finish a group an intent record names)."""
    rows = _report(runner, ["pvs", "--reportformat", "json", "-o", "pv_name,pv_uuid,vg_name"],
                   "pv")
    return {os.path.realpath(r["pv_name"]): (r.get("pv_uuid", ""), r.get("vg_name", ""))
            for r in rows if r.get("pv_name")}


def _other_intent(pool: str, backing: LvmBacking, intent: VgIntent, state_dir: Path) -> str:
    """The plan error for an intent record of this group made for other devices or pool."""
    where = intent_path(state_dir, backing.volume_group)
    return (f"pool {pool}: kvagent's intent record {where} says it was making volume group "
            f"{backing.volume_group} for pool {intent.pool} on {', '.join(intent.paths)} "
            "(a pass killed before vgcreate); the config now says pool "
            f"{pool} on {', '.join(backing.devices)}, and kvagent finishes it only as "
            "recorded: list those devices again to finish it, or, if that group is not "
            f"wanted, remove the labels kvagent wrote (pvremove on those devices) and {where}")


def _twice_tagged(pool: str, host: str | None, nsid: int,
                  volumes: list[LogicalVolume]) -> str:
    """The plan error for two or more LVs whose tags name the same namespace."""
    names = ", ".join(sorted(f"{v.vg}/{v.name}" for v in volumes))
    return (f"pool {pool}: LVs {names} all carry kvagent's tags for namespace {nsid} "
            f"(host {host or 'shared'}); a namespace is one LV and kvagent will not guess "
            "which: remove kvagent's tags (lvchange --deltag kvagent ...) from every LV "
            "that is not this namespace's, then apply again")


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
        this pass creates is not created again (``ctx.cache["lvm.creating"]``). New LVs
        follow the pool's placement (:mod:`.placement`); existing ones stay where they are.
        """
        backing = pool.backing
        assert isinstance(backing, LvmBacking) and pool.namespaces is not None
        plan = BackingPlan()
        groups, owned = self._lvm(ctx, backing.volume_group)
        group = self._group(ctx, pool, groups.get(backing.volume_group), plan)
        if group is None:
            return plan
        stripes_too_big = _stripe_size_error(pool.name, backing, group.extent)
        if stripes_too_big:
            plan.errors.append(stripes_too_big)
            return plan
        lvs = _LvPlanner(ctx, pool, plan, group, owned_by_namespace(owned))
        lvs.plan_volumes(self.layout(pool, ctx.records))
        if group.vg is not None and lvs.needed > group.vg.free:
            plan.errors.append(
                f"pool {pool.name}: volume group {group.vg.name} has {group.vg.free} bytes "
                f"free, the pool needs {lvs.needed} more")
        if plan.errors:
            plan.steps = []  # nothing half-made: not even the group
            creating = ctx.cache["lvm.creating"]
            if creating.get(backing.volume_group, ("",))[0] == pool.name:
                del creating[backing.volume_group]  # another pool may create it instead
        return plan

    def _group(self, ctx: PassContext, pool: TargetPool, vg: VolumeGroup | None,
               plan: BackingPlan) -> _Group | None:
        """The pool's volume group as this pass has it: ``vg`` as it is (forgetting an
        intent record a killed pass left), the one an earlier pool of this pass creates,
        or one made now on the pool's blank devices (:meth:`_new_group`). None, with
        plan errors, when there is none to use."""
        b = pool.backing
        assert isinstance(b, LvmBacking)
        creating: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = ctx.cache.setdefault(
            "lvm.creating", {})
        if vg is not None:
            if LVM_OWNER_TAG in vg.tags and has_intent(ctx.state_dir, vg.name):
                # Made, but the pass that made it was killed before it forgot its intent.
                plan.steps.append(Step("lvm.intent", pool.name, vg.name,
                                       "volume group made: intent record removed",
                                       lambda name=vg.name: remove_intent(ctx.state_dir, name)))
            return _Group(vg, vg.extent_size, None)
        if b.volume_group in creating:
            first, devices, new_devices = creating[b.volume_group]
            if b.devices and tuple(b.devices) != devices:
                plan.errors.append(
                    f"pool {pool.name}: volume group {b.volume_group} is created by pool "
                    f"{first} on {', '.join(devices)}; list the same devices (or none) here")
                return None
            return _Group(None, NEW_GROUP_EXTENT, new_devices)
        if not b.devices:
            plan.errors.append(
                f"pool {pool.name}: volume group {b.volume_group!r} does not exist; "
                "create it, or list blank devices under backing.devices for kvagent to use")
            return None
        new_devices = self._new_group(ctx, pool, plan)
        if new_devices is None:
            return None
        creating[b.volume_group] = (pool.name, tuple(b.devices), new_devices)
        return _Group(None, NEW_GROUP_EXTENT, new_devices)

    def _new_group(self, ctx: PassContext, pool: TargetPool,
                   plan: BackingPlan) -> tuple[str, ...] | None:
        """Steps that make the pool's volume group on its listed devices: record the
        intent (:mod:`.lvm_intent`), label each device with the PV uuid recorded, create
        the group, forget the intent. Each device must be blank; with kvagent's intent
        record for this group (a pass killed before ``vgcreate``), a device may instead
        carry exactly the label that record names, and the group is finished. Returns
        the devices' nodes, or None with plan errors (nothing is done)."""
        b = pool.backing
        assert isinstance(b, LvmBacking)
        try:
            found = read_intent(ctx.state_dir, b.volume_group)
        except KvagentError as exc:
            plan.errors.append(f"pool {pool.name}: {exc}")
            return None
        if found is not None and (found.pool, found.paths) != (pool.name, tuple(b.devices)):
            plan.errors.append(_other_intent(pool.name, b, found, ctx.state_dir))
            return None
        intent = found or new_intent(b.volume_group, pool.name, b.devices)
        nodes: list[str] = []
        unlabelled: list[tuple[PvIntent, str]] = []
        for pv in intent.pvs:
            others = ctx.usage.conflicts(pv.path, pool.name, f"vg:{b.volume_group}")
            if others:
                plan.errors.append(
                    f"pool {pool.name}: refusing to create volume group on {pv.path} "
                    f"({os.path.realpath(pv.path)}): it is {'; '.join(others)}. A device "
                    "serves one pool only: remove it from one of them")
                continue
            try:
                node, labelled = (self._labelled_by_us(ctx, pv) if found is not None else
                                  (ensure_blank(pv.path, "create volume group on", ctx.runner),
                                   False))
            except KvagentError as exc:
                plan.errors.append(f"pool {pool.name}: {exc}")
                continue
            nodes.append(node)
            if not labelled:
                unlabelled.append((pv, node))
        if plan.errors:
            return None
        self._group_steps(ctx, pool.name, intent, found is not None, unlabelled, nodes, plan)
        return tuple(nodes)

    @staticmethod
    def _group_steps(ctx: PassContext, pool: str, intent: VgIntent, resumed: bool,
                     unlabelled: list[tuple[PvIntent, str]], nodes: list[str],
                     plan: BackingPlan) -> None:
        """The intent record (unless resumed), one pvcreate per unlabelled device, and the
        vgcreate that also forgets the record."""
        vg, runner, state = intent.volume_group, ctx.runner, ctx.state_dir
        if not resumed:
            plan.steps.append(Step("lvm.intent", pool, vg,
                                   f"record: volume group {vg} to be made on "
                                   f"{', '.join(intent.paths)}",
                                   lambda: write_intent(state, intent)))
        for pv, node in unlabelled:
            plan.steps.append(Step(
                "lvm.pvcreate", pool, pv.path, f"{node}, PV uuid {pv.pv_uuid}",
                _call(runner, ["pvcreate", "-y", "--uuid", pv.pv_uuid, "--norestorefile",
                               node])))

        def vgcreate() -> None:
            runner(["vgcreate", "-y", "--addtag", LVM_OWNER_TAG, vg, *nodes],
                   timeout=LVM_TIMEOUT)
            remove_intent(state, vg)

        plan.steps.append(Step(
            "lvm.vgcreate", pool, vg,
            f"on {', '.join(intent.paths)}" + (" (finishing an interrupted create)"
                                               if resumed else ""), vgcreate))

    def _labelled_by_us(self, ctx: PassContext, pv: PvIntent) -> tuple[str, bool]:
        """(node, labelled) of a device of a group kvagent's intent record names: blank
        (not labelled yet), or carrying only the LVM label of the PV uuid recorded, in no
        group. Anything else is refused as foreign data."""
        found = inspect_device(pv.path, ctx.runner)
        if found.blank:
            return found.device, False
        if "lvm.labels" not in ctx.cache:
            ctx.cache["lvm.labels"] = pv_labels(ctx.runner)
        labels: dict[str, tuple[str, str]] = ctx.cache["lvm.labels"]
        uuid, group = labels.get(os.path.realpath(found.device), ("", ""))
        if (all(f.startswith("LVM2_member ") for f in found.findings)
                and (uuid, group) == (pv.pv_uuid, "")):
            return found.device, True
        what = (f"its LVM label is PV {uuid} in volume group {group!r}" if group else
                f"its LVM label is PV {uuid}" if uuid else
                "LVM shows no PV label on it")
        raise refusal(found, "create volume group on",
                      f"kvagent's intent record names PV {pv.pv_uuid} in no group for it, "
                      f"but {what}: not the label kvagent wrote")

    def doomed(self, ctx: PassContext, name: str, record: PoolRecord | None) -> list[Doomed]:
        if record is not None and record.kind != self.kind:
            return []
        _, owned = self._lvm(ctx)
        return [Doomed("logical_volume", v.path,
                       lambda v=v: remove_volume(ctx.runner, v, name))
                for v in owned if v.tag_value("kvagent_pool") == name]

    def block_devices(self, runner: Runner, paths: list[str]) -> dict[str, tuple[str, ...]]:
        """Each LV's PVs, from its segments (``lvs -o devices``; one run for all)."""
        if not paths:
            return {}
        segments = segment_devices(runner)
        return {p: segments.get(p, ()) for p in paths}


def _planned_pvs(ctx: PassContext, vg: str, new_devices: tuple[str, ...] | None,
                 extent: int) -> list[PvState]:
    """The PVs of ``vg`` as this pass has planned them so far (one ``pvs`` per pass);
    for a group this pass creates, its blank devices as they will be."""
    groups: dict[str, list[PvState]] = ctx.cache.setdefault("lvm.pvs", {})
    if vg not in groups:
        if new_devices is not None:
            groups[vg] = [new_pv_state(d, device_bytes(d, str(ctx.sysfs)) or 0, extent)
                          for d in new_devices]
        else:
            if "lvm.lvpvs" not in ctx.cache:
                found, used = physical_volumes(ctx.runner)
                ctx.cache["lvm.lvpvs"] = used
                for name, pvs in found.items():
                    groups.setdefault(name, pvs)
            groups.setdefault(vg, [])
    return groups[vg]


def _lv_pvs(ctx: PassContext, vg: str, lv_uuid: str) -> tuple[str, ...]:
    """The PVs an LV of ``vg`` is on (from the pass's one ``pvs``)."""
    _planned_pvs(ctx, vg, None, 0)
    return ctx.cache.get("lvm.lvpvs", {}).get(lv_uuid, ())


def _stripe_size_error(pool: str, backing: LvmBacking, extent: int) -> str | None:
    """The plan error when a striped pool's stripe does not fit in an extent."""
    if backing.placement != "striped" or backing.stripe_size <= extent:
        return None
    return (f"pool {pool}: stripe_size {backing.stripe_size} is larger than the extent size "
            f"of volume group {backing.volume_group} ({extent} bytes); LVM stripes within "
            "extents: choose a stripe_size up to the extent size")


@dataclass(frozen=True)
class _Group:
    """A pool's volume group as one pass plans it."""

    vg: VolumeGroup | None  # None: made by this pass
    extent: int
    new_devices: tuple[str, ...] | None  # the PVs of a group made by this pass


class _LvPlanner(VolumePlanner):
    """The LVs of one LVM pool in one pass. A namespace is the one LV kvagent's tags
    give it: kept (its tags' identity, recorded now if it has none) and grown when
    smaller; with none, a new LV is placed by the pool's placement. ``needed``: the
    bytes they take from the group."""

    def __init__(self, ctx: PassContext, pool: TargetPool, plan: BackingPlan, group: _Group,
                 tagged: dict[NamespaceKey, list[LogicalVolume]]) -> None:
        super().__init__(ctx, pool, plan)
        backing = pool.backing
        assert isinstance(backing, LvmBacking) and pool.namespaces is not None
        self.backing = backing
        self.group = group
        self.tagged = tagged
        self.size = _round_up(pool.namespaces.size, group.extent)
        self.needed = 0

    def volume(self, host: str | None, nsid: int) -> Volume:
        """The namespace's LV: the one its tags name, kept, or a new one."""
        name = lv_name(self.pool.name, host, nsid)
        lv = self._tagged_lv(host, nsid, name)
        if lv is None:
            return self._create(host, nsid, name)
        return self._keep(host, nsid, name, lv)

    def _tagged_lv(self, host: str | None, nsid: int, name: str) -> LogicalVolume | None:
        """The LV kvagent's tags give the namespace, or None; refused when two LVs carry
        its tags, or when there is none and an LV kvagent did not tag has its ``name``."""
        vg = self.backing.volume_group
        tagged = self.tagged.get((vg, self.pool.name, host or "-", str(nsid)), [])
        if len(tagged) > 1:
            raise Refused(_twice_tagged(self.pool.name, host, nsid, tagged))
        if tagged:
            return tagged[0]
        if self.group.vg is not None:
            taken = self._name_taken(host, nsid, self.group.vg.name, name)
            if taken is not None:
                raise Refused(taken)
        return None

    def _create(self, host: str | None, nsid: int, name: str) -> Volume:
        """A new LV ``name`` with a fresh identity in its tags, where the placement puts it."""
        vg = self.backing.volume_group
        path, subject = f"/dev/{vg}/{name}", f"{vg}/{name}"
        uuid, nguid = fresh_ids()
        tags = [*lv_tags(self.pool.name, host, nsid), f"{UUID_TAG}={uuid}",
                f"{NGUID_TAG}={nguid}"]
        try:
            where, before, after, taken = self._place(host, subject)
        except PlacementError as exc:
            raise Refused(f"pool {self.pool.name}: {exc}") from None
        self.needed += taken
        self.step("lvm.lvcreate", subject, f"{self.size} bytes{where}",
                  _call(self.ctx.runner, ["lvcreate", "-y", "-Wy", "-Zy", "-n", name,
                                          "-L", f"{self.size}b", *before,
                                          *[a for t in tags for a in ("--addtag", t)],
                                          vg, *after]), host, nsid)
        storage = Storage("lvm", path, f"LV {subject}, to be created{where}")
        return Volume(self.pool.name, host, nsid, path, self.size, uuid, nguid, storage)

    def _keep(self, host: str | None, nsid: int, name: str, lv: LogicalVolume) -> Volume:
        """The namespace's LV, whatever it is called now: its identity and its path both
        come from that one LV. Grown when smaller than configured, never shrunk."""
        path, subject = lv.path, f"{lv.vg}/{lv.name}"
        if lv.name != name:
            log.warning("kvagent's LV was renamed; exported by its own path",
                        volume=path, name=name, pool=self.pool.name, nsid=nsid)
        runner = self.ctx.runner
        uuid, nguid = self.identity(
            host, nsid, (lv.tag_value(UUID_TAG), lv.tag_value(NGUID_TAG)), "lvm.tag", subject,
            lambda u, g: _call(runner, ["lvchange", "--addtag", f"{UUID_TAG}={u}",
                                        "--addtag", f"{NGUID_TAG}={g}", lv.path]))
        storage = Storage("lvm", path, f"LV {subject}, lv uuid {lv.lv_uuid}")
        if lv.size < self.size:
            self._grow(host, nsid, lv, subject)
        elif lv.size > self.size:
            log.warning("volume is larger than configured; kvagent never shrinks",
                        volume=lv.path, size=lv.size, configured=self.size)
        return Volume(self.pool.name, host, nsid, path, self.size, uuid, nguid, storage)

    def _grow(self, host: str | None, nsid: int, lv: LogicalVolume, subject: str) -> None:
        """The lvextend of an LV smaller than configured (on its own device, for spread)."""
        self.needed += self.size - lv.size
        try:
            on = self._grow_on(lv, self.size - lv.size, subject)
        except PlacementError as exc:
            raise Refused(f"pool {self.pool.name}: {exc}") from None
        self.step("lvm.lvextend", subject,
                  f"{lv.size} -> {self.size} bytes" + (f" on {on[0]}" if on else ""),
                  _call(self.ctx.runner, ["lvextend", "-L", f"{self.size}b", lv.path, *on]),
                  host, nsid, grown=lv.path)

    def _name_taken(self, host: str | None, nsid: int, vg: str, name: str) -> str | None:
        """The plan error when ``vg`` already holds an LV called ``name`` that kvagent's
        tags do not give to this namespace (None when the name is free). Such an LV is
        never exported, tagged or given the namespace's identity."""
        pool = self.pool.name
        names: dict[str, frozenset[str]] = self.ctx.cache.setdefault("lvm.names", {})
        if vg not in names:
            names[vg] = volume_names(self.ctx.runner, vg)
        if name not in names[vg]:
            return None
        return (f"pool {pool}: volume group {vg} already has an LV named {name} "
                f"(/dev/{vg}/{name}) that does not carry kvagent's tags for namespace "
                f"{nsid} of pool {pool} (host {host or 'shared'}); kvagent never exports, "
                "tags or takes over an LV it did not create, and does not create the "
                f"namespace beside it. Rename that LV (lvrename {vg} {name} NEW-NAME) or "
                "remove it if nothing needs it, then apply again")

    def _place(self, host: str | None, subject: str) -> tuple[str, list[str], list[str], int]:
        """Where a new LV goes: (a description, lvcreate arguments before and after the
        group's name, the bytes it takes)."""
        b, size, extent = self.backing, self.size, self.group.extent
        if b.placement == "linear":
            return "", [], [], size
        pvs = _planned_pvs(self.ctx, b.volume_group, self.group.new_devices, extent)
        if b.placement == "spread":
            pv = choose_spread(pvs, self.pool.name, host, size, spread_pools(self.ctx.cfg),
                               subject)
            return f" on {pv.name}", [], [pv.name], size
        if len(pvs) < 2:
            names = ", ".join(p.name for p in pvs) or "no devices"
            raise PlacementError(
                f"placement striped needs a volume group of at least 2 devices; "
                f"{b.volume_group} has {len(pvs)} ({names}): add devices to it (vgextend), or "
                "use placement: spread or linear")
        stripes = b.stripes or len(pvs)
        total = _round_up(size, extent * stripes)
        check_striped(pvs, stripes, total, subject)
        return (f" in {stripes} stripes of {b.stripe_size}",
                ["-i", str(stripes), "-I", f"{b.stripe_size // 1024}k"], [], total)

    def _grow_on(self, lv: LogicalVolume, more: int, subject: str) -> list[str]:
        """The PV a spread LV grows on: the one it is on (``[]``: LVM chooses; an LV of
        another placement, or one already on several PVs)."""
        if self.backing.placement != "spread":
            return []
        on = _lv_pvs(self.ctx, lv.vg, lv.lv_uuid)
        if len(on) != 1:
            return []
        pv = next((p for p in _planned_pvs(self.ctx, lv.vg, None, 0) if p.name == on[0]), None)
        if pv is None or pv.free < more:
            free = "unknown" if pv is None else f"{pv.free} bytes"
            raise PlacementError(
                f"{subject} grows by {more} bytes on its device {on[0]} (placement spread "
                f"keeps a namespace on one device), which has {free} free: free space there, "
                "or set placement: linear to let it span devices")
        pv.free -= more
        return [pv.name]
