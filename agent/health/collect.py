"""Build a health :class:`Snapshot` from the live system: nvmet, sysfs, mounts, kvagent's records.

Collecting reads configfs and sysfs and runs ``nvme smart-log`` on local
drives (bounded by timeouts); it changes nothing. ``kvagent status`` calls it
directly; ``kvagent run`` calls it from its loop and the HTTP endpoints only
read the stored result.

What a collect reads splits in two. The :class:`Topology` (nvmet's objects, the
controllers, each pool's namespaces and paths, kvagent's records) changes only with
something the agent hears of (a udev event, an AEN, a controller's state: see
:mod:`agent.events`), with the agent's own passes, or by hand in configfs, which has no
events; the rest (mounts, a shut-down filesystem, the engines' usage, drives, the last
apply) has no events at all. The agent reads the topology afresh on every event, after
every pass and at least every ``health.full_interval``, and in between its collects read
only the rest (:func:`collect` with ``topology``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nvmet
from nvmet.errors import NvmetError

from ..config.model import Config, InitiatorPool, TargetPool
from ..errors import KvagentError
from ..initiator.autoconnect import stray_cause, stray_controllers
from ..initiator.mounts import MOUNTINFO, MountEntry, device_gone, read_mounts
from ..initiator.sysfs import Controller, NamespaceHead, Sysfs
from ..initiator.xfsmount import is_shut_down
from ..log import get_logger
from ..records import (
    InitiatorRecords,
    PoolAttachment,
    TargetRecords,
    probes_path,
    read_last_apply,
)
from ..state import read_json
from ..system.run import Runner
from ..system.xfsquota import QuotaOps, XfsQuota
from ..target.auth import wants_auth
from ..target.desired import pool_layout
from ..target.reconcile import nvmet_fs
from .drift import Fact, PoolKey, initiator_facts, target_facts, target_spec
from .engineusage import engine_usages
from .smart import local_controllers, read_local_drives
from .snapshot import (
    ApplySummary,
    ControllerHealth,
    DriveHealth,
    InitiatorSide,
    LoopCounters,
    PathAna,
    PoolHealth,
    Snapshot,
    StrayController,
    TargetSide,
)

log = get_logger("health.collect")
NVMET_DEBUGFS = Path("/sys/kernel/debug/nvmet")


@dataclass(frozen=True)
class Topology:
    """What a collect reads that changes only with an event, a pass of the agent, or by
    hand in configfs (see the module's docstring): the target pools' health and drift
    facts (:mod:`agent.health.drift`; read again by every collect, since configfs has
    no events: :func:`refresh_target`), the initiator records, the controllers, each
    recorded subsystem's namespaces (by NQN) and I/O policy, each pool's probe summary;
    the local (PCIe) NVMe controllers, whose smart-logs a collect reads (None: not read
    with it)."""

    target: tuple[PoolHealth, ...] = ()
    local_drives: tuple[Path, ...] | None = None
    state: Mapping[str, PoolAttachment] = field(default_factory=dict)
    controllers: tuple[Controller, ...] = ()
    heads: Mapping[str, Mapping[int, NamespaceHead]] = field(default_factory=dict)
    policies: Mapping[str, str | None] = field(default_factory=dict)
    probes: Mapping[str, dict[str, bool] | None] = field(default_factory=dict)
    target_facts: Mapping[PoolKey, frozenset[Fact]] = field(default_factory=dict)


def refresh_target(cfg: Config, topology: Topology, *,
                   fs: nvmet.ConfigFS | None = None) -> Topology:
    """``topology`` with the storage side read now (configfs has no events: a hand-made
    change there shows at the next collect)."""
    target, facts = _target_side(cfg, fs)
    return dataclasses.replace(topology, target=target, target_facts=facts)


def _target_side(cfg: Config, fs: nvmet.ConfigFS | None,
                 ) -> tuple[tuple[PoolHealth, ...], dict[PoolKey, frozenset[Fact]]]:
    if cfg.target is None or not cfg.target.pools:
        return (), {}
    return _target_pools(cfg, fs)


def read_topology(cfg: Config, *, fs: nvmet.ConfigFS | None = None,
                  sysfs: Sysfs | None = None, drives: bool = True) -> Topology:
    """The host's :class:`Topology`, read now (the local drives' controllers too, unless
    ``drives`` is false)."""
    sysfs = sysfs or Sysfs(cfg.node.sysfs)
    target, facts = _target_side(cfg, fs)
    local = tuple(local_controllers(cfg.node.sysfs)) if drives else None
    if cfg.initiator is None:
        return Topology(target, local, target_facts=facts)
    state = _safe_initiator_state(cfg)
    nqns = {s.subsysnqn for r in state.values() for s in r.subsystems}
    # (every controller: those of no pool's record may be strays, :func:`_strays`)
    return Topology(
        target, local, state, tuple(sysfs.controllers()),
        {nqn: sysfs.subsystem_namespaces(nqn) for nqn in nqns},
        {sub.nqn: sub.iopolicy for nqn in nqns for sub in sysfs.subsystems_of(nqn)},
        {p.name: _probe_summary(cfg, p.name) for p in cfg.initiator.pools},
        target_facts=facts)


def collect(cfg: Config, runner: Runner, *, fs: nvmet.ConfigFS | None = None,
            sysfs: Sysfs | None = None, last_apply: ApplySummary | None = None,
            counters: LoopCounters | None = None, config_error: str | None = None,
            drives: bool = True, quota: QuotaOps | None = None,
            mountinfo: Path = MOUNTINFO,
            shut_down: Callable[[str], bool] = is_shut_down,
            topology: Topology | None = None,
            drive_health: tuple[DriveHealth, ...] | None = None) -> Snapshot:
    """A snapshot of every pool of this host, its controllers and its local drives.

    ``topology``: the one read last (:func:`read_topology`), when nothing the agent hears
    of has happened since; read now when None. ``quota``, ``mountinfo`` and
    ``shut_down`` (whether a mounted xfs shut down) are seams for tests: engines' usage
    comes from xfs project quotas where the mount table shows them on. ``drive_health``:
    the local drives as read lately (no smart-log now)."""
    topo = (topology if topology is not None
            else read_topology(cfg, fs=fs, sysfs=sysfs, drives=drives))
    quota = quota or XfsQuota()
    pools: list[PoolHealth] = list(topo.target)
    controllers: list[ControllerHealth] = []
    facts: dict[PoolKey, frozenset[Fact]] = dict(topo.target_facts)
    if cfg.initiator is not None:
        # Read once per collect for every pool: the mount table.
        table = _mount_table(mountinfo) if topo.state else {}
        for pool in cfg.initiator.pools:
            record = topo.state.get(pool.name)
            health, ctrls = _initiator_pool(cfg, pool, record, topo, quota, shut_down, table)
            pools.append(health)
            controllers += ctrls
            if record is not None:
                facts[("initiator", pool.name)] = initiator_facts(
                    (c.name for c in ctrls),
                    (m for m in record.mounts if (e := table.get(os.path.normpath(m)))
                     and not device_gone(e.device, cfg.node.sysfs)))
    found_drives = drive_health or ()
    if drives and drive_health is None:
        try:
            found_drives = tuple(read_local_drives(runner, sysfs=cfg.node.sysfs,
                                                   controllers=topo.local_drives))
        except (KvagentError, OSError) as exc:
            log.warning("cannot read local drives", error=str(exc))
    if last_apply is None:
        last_apply = last_apply_summary(cfg)
    if last_apply is not None:
        pools = [_with_apply_errors(p, last_apply) for p in pools]
    return Snapshot(taken_at=time.time(), tick_at=time.monotonic(), node=cfg.node.name,
                    pools=tuple(pools), controllers=tuple(controllers), drives=found_drives,
                    last_apply=last_apply, config_error=config_error,
                    counters=counters or LoopCounters(), facts=facts,
                    strays=_strays(cfg, topo.controllers))


def _strays(cfg: Config, found: Iterable[Controller]) -> tuple[StrayController, ...]:
    """Controllers to kvagent's subsystems that no initiator pool of this host attaches
    (:mod:`agent.initiator.autoconnect`); none on a host without initiator pools."""
    if cfg.initiator is None:
        return ()
    strays = stray_controllers(found, cfg.node.nqn_prefix,
                               (p.name for p in cfg.initiator.pools))
    if not strays:
        return ()
    cause = stray_cause()
    return tuple(StrayController(c.name, c.subsysnqn, c.address.traddr or "",
                                 c.address.trsvcid or "", c.state, cause) for c in strays)


def last_apply_summary(cfg: Config) -> ApplySummary | None:
    """The last apply's outcome from ``<state_dir>/last-apply.json`` (None if never)."""
    try:
        data = read_last_apply(cfg.node.state_dir)
    except KvagentError:
        return None
    if not data:
        return None
    started, finished = data.get("started_at"), data.get("finished_at") or time.time()
    return ApplySummary(
        finished_at=finished, ok=bool(data.get("ok")),
        changed=sum(1 for a in data.get("actions", []) if a.get("status") == "done"),
        failed=sum(1 for a in data.get("actions", []) if a.get("status") == "failed")
        + len(data.get("errors", [])),
        duration_seconds=(finished - started) if started else None,
        errors=tuple((e.get("role", ""), e.get("pool"), e.get("message", ""))
                     for e in data.get("errors", [])),
        unexpected=sum(1 for e in data.get("errors", []) if e.get("unexpected")))


def _with_apply_errors(pool: PoolHealth, last: ApplySummary) -> PoolHealth:
    """A pool the last apply reported errors for is at least degraded, and says why."""
    errors = last.pool_errors(pool.role, pool.name)
    if not errors:
        return pool
    problems = (*pool.problems, *(f"last apply: {m}" for m in errors))
    state = "degraded" if pool.state == "ok" else pool.state
    return dataclasses.replace(pool, state=state, ready=False, problems=problems)


# --------------------------------------------------------------------- target
def _connected_hosts(nqn: str) -> int | None:
    """Hosts connected to a subsystem, from nvmet's debugfs (kernel 6.9+); None if not shown."""
    d = NVMET_DEBUGFS / nqn
    if not d.is_dir():
        return None
    return sum(1 for p in d.iterdir() if p.name.startswith("ctrl"))


def _target_pools(cfg: Config, fs: nvmet.ConfigFS | None,
                  ) -> tuple[tuple[PoolHealth, ...], dict[PoolKey, frozenset[Fact]]]:
    """Each target pool's health and drift facts (none where nvmet or the records could
    not be read: unknown is not drift)."""
    assert cfg.target is not None
    try:
        records = TargetRecords.load(cfg.node.state_dir)
    except KvagentError as exc:
        return tuple(PoolHealth("target", p.name, "failed", False,
                                (f"records: {exc.message}",)) for p in cfg.target.pools), {}
    auth = wants_auth(cfg)
    try:
        live = nvmet.read(fs if fs is not None else nvmet_fs(cfg), spec=target_spec(auth))
    except NvmetError as exc:
        return tuple(PoolHealth("target", p.name, "failed", False,
                                (f"nvmet: {exc.message}",)) for p in cfg.target.pools), {}
    healths, facts = [], {}
    for pool in cfg.target.pools:
        layout = pool_layout(cfg, pool, records)
        healths.append(_target_pool(cfg, pool, live, records, layout))
        facts[("target", pool.name)] = target_facts(
            live, layout, _port_ids(cfg, pool),
            [h.nqn for h in pool.hosts if h.auth is not None] if auth else ())
    return tuple(healths), facts


def _port_ids(cfg: Config, pool: TargetPool) -> list[int]:
    return [p.id for p in cfg.target.ports if p.name in pool.ports] if cfg.target else []


def _target_pool(cfg: Config, pool: TargetPool, live: nvmet.Tree, records: TargetRecords,
                 layout: Mapping[str, Iterable[int]] | None = None) -> PoolHealth:
    """``layout``: the pool's :func:`pool_layout` (worked out here when not given)."""
    layout = pool_layout(cfg, pool, records) if layout is None else layout
    nqns = list(layout)
    port_ids = _port_ids(cfg, pool)
    present = [live.subsystems[n] for n in nqns if n in live.subsystems]
    expected = [(n, nsid) for n, nsids in layout.items() for nsid in nsids]
    namespaces = [live.subsystems[n].namespaces[nsid] for n, nsid in expected
                  if n in live.subsystems and nsid in live.subsystems[n].namespaces]
    linked = sum(1 for n in nqns for pid in port_ids
                 if pid in live.ports and n in live.ports[pid].subsystems)
    connected = [_connected_hosts(n) for n in nqns]
    side = TargetSide(
        subsystems_expected=len(nqns), subsystems_present=len(present),
        namespaces_expected=len(expected), namespaces_present=len(namespaces),
        namespaces_enabled=sum(1 for ns in namespaces if ns.enable),
        ports_expected=len(nqns) * len(port_ids), ports_linked=linked,
        hosts_connected=None if any(c is None for c in connected) else sum(
            c or 0 for c in connected))
    problems = []
    if side.subsystems_present < side.subsystems_expected:
        problems.append(f"{side.subsystems_expected - side.subsystems_present} of "
                        f"{side.subsystems_expected} subsystems missing (run kvagent apply)")
    if side.namespaces_enabled < side.namespaces_expected:
        problems.append(f"{side.namespaces_enabled} of {side.namespaces_expected} namespaces "
                        "enabled")
    if side.ports_linked < side.ports_expected:
        missing = [f"{n} on port {pid}" for n in nqns for pid in port_ids
                   if not (pid in live.ports and n in live.ports[pid].subsystems)]
        problems.append("not exported: " + ", ".join(missing))
    if not nqns:
        state = "ok"  # nothing to export (no hosts listed): not a fault
    elif side.subsystems_present == 0 or side.ports_linked == 0:
        state = "failed"
    else:
        state = "degraded" if problems else "ok"
    return PoolHealth("target", pool.name, state, state == "ok", tuple(problems), target=side)


# ------------------------------------------------------------------ initiator
def _safe_initiator_state(cfg: Config) -> dict[str, PoolAttachment]:
    try:
        return InitiatorRecords.load(cfg.node.state_dir)
    except KvagentError as exc:
        log.warning("cannot read initiator records", error=str(exc))
        return {}


def _probe_summary(cfg: Config, pool: str) -> dict[str, bool] | None:
    path = probes_path(cfg.node.state_dir, pool)
    try:
        probes = read_json(path, None)
    except KvagentError:
        return None
    if not isinstance(probes, list) or not all(isinstance(p, dict) for p in probes):
        return None
    return {"odirect": all(p.get("odirect_ok") for p in probes),
            "fallocate": all(p.get("fallocate_ok") for p in probes)}


def _shut_down(mounts: list[str], shut_down: Callable[[str], bool]) -> list[str]:
    """The mounts whose xfs shut down (one ``stat`` each, no I/O on a healthy one)."""
    out = []
    for m in mounts:
        try:
            if shut_down(m):
                out.append(m)
        except OSError as exc:
            log.warning("cannot stat a pool mount", mount=m, error=str(exc))
    return out


def _mount_table(mountinfo: Path = MOUNTINFO) -> dict[str, MountEntry]:
    """Mount points now (the last mount on a point wins, as :func:`mounted_at` says)."""
    try:
        return {e.mount_point: e for e in read_mounts(mountinfo)}
    except OSError:
        return {}


def _initiator_pool(cfg: Config, pool: InitiatorPool, record: PoolAttachment | None,
                    topo: Topology, quota: QuotaOps,
                    shut_down: Callable[[str], bool] = is_shut_down,
                    table: dict[str, MountEntry] | None = None,
                    ) -> tuple[PoolHealth, list[ControllerHealth]]:
    """``topo``: the host's controllers and the pool's subsystems' namespaces; ``table``:
    its mount points (read here when not given)."""
    if record is None:
        side = InitiatorSide(controllers_expected=len(pool.targets), controllers_live=0,
                             namespaces_expected=0, namespaces_found=0, mount_path=pool.mount)
        return PoolHealth("initiator", pool.name, "failed", False,
                          ("not attached (run kvagent apply; see its errors)",),
                          initiator=side), []
    hostnqn = record.hostnqn
    subs = {s.subsysnqn: s for s in record.subsystems}
    heads = {ns.name: ns for nqn in subs for ns in topo.heads.get(nqn, {}).values()}
    policies = topo.policies
    ctrls: list[ControllerHealth] = []
    for c in topo.controllers:
        if c.subsysnqn not in subs or c.hostnqn != hostnqn:
            continue
        paths = tuple(PathAna(p.name, p.ana_state or "unknown", h.nsid)
                      for h in heads.values() if h.subsysnqn == c.subsysnqn
                      for p in h.paths if p.controller == c.name)
        ctrls.append(ControllerHealth(c.name, pool.name, c.subsysnqn, c.address.transport,
                                      c.address.traddr or "", c.address.trsvcid or "",
                                      c.state, paths, policies.get(c.subsysnqn)))
    devices = record.devices
    uuids = {(h.uuid or "").lower() for h in heads.values()}
    found = sum(1 for d in devices if d.uuid.lower() in uuids)
    mounts = record.mounts
    if table is None:
        table = _mount_table()
    entries = {m: table.get(os.path.normpath(m)) for m in mounts}
    mounted = [m for m in mounts if entries[m] is not None]
    orphaned = [m for m in mounted if device_gone(entries[m].device, cfg.node.sysfs)]
    dead = [*orphaned, *_shut_down([m for m in mounted if m not in orphaned], shut_down)]
    size = free = 0
    for m in mounted:
        try:
            vfs = os.statvfs(m)
        except OSError:
            continue
        size += vfs.f_blocks * vfs.f_frsize
        free += vfs.f_bavail * vfs.f_frsize
    engines, engine_problems = engine_usages(
        cfg, pool, [(m, e) for m, e in entries.items() if e is not None and m not in dead],
        size, quota)
    side = InitiatorSide(
        controllers_expected=len(subs), controllers_live=sum(1 for c in ctrls
                                                             if c.state == "live"),
        namespaces_expected=len(devices), namespaces_found=found, mount_path=pool.mount,
        mounted=bool(mounts) and len(mounted) == len(mounts),
        size_bytes=size if mounted else None, free_bytes=free if mounted else None,
        engines=tuple(engines), mounts_shut_down=tuple(dead),
        recoveries=sum(r.count for r in record.recoveries),
        last_recovery_at=max((r.last_at for r in record.recoveries), default=None))
    problems = []
    for c in ctrls:
        if c.state != "live":
            problems.append(f"controller {c.name} ({c.traddr}:{c.trsvcid}) is {c.state}")
    if len(ctrls) < len(subs):
        missing = sorted(set(subs) - {c.subsysnqn for c in ctrls})
        problems.append(f"not connected: {', '.join(missing)}")
    if found < len(devices):
        problems.append(f"{len(devices) - found} of {len(devices)} namespaces missing")
    if len(mounted) < len(mounts):
        problems.append(f"not mounted: {', '.join(sorted(set(mounts) - set(mounted)))}")
    if orphaned:
        problems.append(f"filesystem on a namespace that went away while it was mounted: "
                        f"{', '.join(orphaned)}; kvagent mounts the namespace again once it "
                        "is back and nothing holds the mount")
    if len(dead) > len(orphaned):
        problems.append(f"filesystem shut down after I/O errors (a storage outage): "
                        f"{', '.join(dead[len(orphaned):])}; kvagent mounts it again once "
                        "a controller of the pool is live and nothing holds it")
    problems += engine_problems
    probe = topo.probes.get(pool.name)
    if probe and not probe["odirect"]:
        problems.append("O_DIRECT probe failed (engines use their buffered fallback)")
    # A controller that is reconnecting keeps the mount (I/O waits): degraded, not failed.
    if (not pool.shared and not mounted) or (subs and not ctrls) or (
            mounted and len(dead) == len(mounted)):
        state = "failed"
    else:
        state = "degraded" if problems else "ok"
    ready = state == "ok"
    return PoolHealth("initiator", pool.name, state, ready, tuple(problems), initiator=side,
                      probe=probe), ctrls
