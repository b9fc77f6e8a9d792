"""``kvagent pool list`` and ``kvagent pool destroy``: what pools exist, and deleting one's data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nvmet
from nvmet.errors import NvmetError

from ..config.model import Config
from ..errors import KvagentError, UsageError
from ..lock import LockHolder, apply_lock
from ..log import get_logger
from ..naming import parse_subsystem_nqn
from ..records import PoolRecord, TargetRecords
from ..system.run import Runner, default_runner
from .backings import DRIVERS, driver_for, driver_of_kind
from .backings.base import Doomed, PassContext
from .reconcile import nvmet_fs
from .usage import DeviceUsage

log = get_logger("inventory")

#: How long ``pool destroy`` waits for a running apply (or the agent's pass) to finish.
DESTROY_LOCK_WAIT = 120.0


def _live_tree(cfg: Config, fs: nvmet.ConfigFS | None) -> nvmet.Tree | None:
    try:
        return nvmet.read(fs if fs is not None else nvmet_fs(cfg))
    except NvmetError:
        return None


def _devices_behind(records: TargetRecords, runner: Runner) -> dict[str, list[str] | None]:
    """The devices behind every bound namespace's storage, by storage path (None where
    they could not be read: the lookup failed)."""
    by_kind: dict[str, list[str]] = {}
    for b in records.bindings.values():
        by_kind.setdefault(b.storage.kind, []).append(b.storage.path)
    out: dict[str, list[str] | None] = {}
    for kind, paths in by_kind.items():
        try:
            found = driver_of_kind(kind).block_devices(runner, sorted(set(paths)))
        except KvagentError as exc:
            log.warning("cannot tell the devices behind the pools' storage", kind=kind,
                        error=exc.message)
            out.update(dict.fromkeys(paths))
            continue
        out.update({p: list(devs) for p, devs in found.items()})
    return out


def list_pools(cfg: Config, fs: nvmet.ConfigFS | None = None,
               runner: Runner | None = None) -> list[dict[str, Any]]:
    """Every target pool known from the config or kvagent's records, with its live export
    and the devices behind each namespace (an LV's PVs, a file's filesystem's device, a
    whole device)."""
    records = TargetRecords.load(cfg.node.state_dir)
    live = _live_tree(cfg, fs)
    behind = _devices_behind(records, runner or default_runner())
    configured = {p.name: p for p in (cfg.target.pools if cfg.target else ())}
    out = []
    for name in sorted(set(configured) | set(records.pools)):
        pool = configured.get(name)
        record: PoolRecord | None = driver_for(pool).record(pool) if pool else \
            records.pools.get(name)
        subs = []
        if live is not None:
            for nqn, sub in live.subsystems.items():
                parsed = parse_subsystem_nqn(cfg.node.nqn_prefix, nqn)
                if parsed and parsed[0] == cfg.node.name and parsed[1] == name:
                    ports = sorted(pid for pid, p in live.ports.items() if nqn in p.subsystems)
                    subs.append({
                        "nqn": nqn, "host": parsed[2],
                        "namespaces": len(sub.namespaces),
                        "enabled": sum(1 for ns in sub.namespaces.values() if ns.enable),
                        "allowed_hosts": sorted(sub.allowed_hosts), "ports": ports})
        bound = sorted(records.pool_bindings(name), key=lambda b: (b.nqn, b.nsid))
        out.append({
            "name": name,
            "configured": pool is not None,
            "backing": record.to_json() if record else None,
            "where": driver_of_kind(record.kind).where(record) if record else "?",
            "shared": pool.shared if pool else None,
            "hosts": [h.name for h in pool.hosts] if pool else [],
            "exported": bool(subs),
            "subsystems": subs,
            "namespaces": [{"nqn": b.nqn, "nsid": b.nsid, "host": b.host, "uuid": b.uuid,
                            "storage": b.storage.path, "storage_kind": b.storage.kind,
                            "storage_detail": b.storage.detail,
                            "devices": behind.get(b.storage.path)} for b in bound],
            "nvmet_readable": live is not None,
        })
    return out


def destroy_pool(cfg: Config, name: str, runner: Runner, *, yes: bool,
                 fs: nvmet.ConfigFS | None = None,
                 on_wait: Callable[[LockHolder | None], None] | None = None) -> dict[str, Any]:
    """Delete the data of a pool that is no longer configured nor exported.

    Only what kvagent provably owns goes: LVs tagged with the pool, files in the
    pool's manifest (only names kvagent creates, inside the pool's directory). Whole
    devices are released from kvagent's claims, never wiped. Nothing is deleted that
    any nvmet namespace — kvagent's or not — still exports. Holds the apply lock
    (waiting up to DESTROY_LOCK_WAIT; ``on_wait`` is told who holds it), so no apply or
    agent pass runs meanwhile. Without ``yes`` nothing is deleted and the plan is
    returned.
    """
    if cfg.target and any(p.name == name for p in cfg.target.pools):
        raise UsageError(f"pool {name!r} is still in the config",
                         "remove it from target.pools and run kvagent apply (that unexports "
                         "it and keeps its data), then destroy it")
    with apply_lock(cfg.node.run_dir, wait=True, timeout=DESTROY_LOCK_WAIT, on_wait=on_wait):
        return _destroy(cfg, name, runner, yes=yes, fs=fs)


def _destroy(cfg: Config, name: str, runner: Runner, *, yes: bool,
             fs: nvmet.ConfigFS | None) -> dict[str, Any]:
    state_dir = Path(cfg.node.state_dir)
    records = TargetRecords.load(state_dir)
    record = records.pools.get(name)
    live = _live_tree(cfg, fs)
    if live is None:
        raise KvagentError("cannot read the nvmet tree to prove the pool is not exported",
                           "load nvmet (modprobe nvmet) and retry; kvagent will not delete "
                           "data of a pool it cannot show to be unexported")
    exported = [nqn for nqn in live.subsystems
                if (p := parse_subsystem_nqn(cfg.node.nqn_prefix, nqn))
                and p[0] == cfg.node.name and p[1] == name]
    if exported:
        raise KvagentError(f"pool {name!r} is still exported ({', '.join(exported)})",
                           "run kvagent apply first (the pool is no longer configured)")
    ctx = PassContext(cfg, runner, records, live, DeviceUsage())
    drivers = [driver_of_kind(record.kind)] if record else list(DRIVERS.values())
    doomed: list[Doomed] = [d for drv in drivers for d in drv.doomed(ctx, name, record)]
    data = [d for d in doomed if d.kind != "manifest"]
    if record is None and not data:
        raise UsageError(f"kvagent knows no pool named {name!r}", "see kvagent pool list")
    in_use = _still_exported(live, data)
    if in_use:
        raise KvagentError(
            f"refusing to destroy pool {name!r}: " + "; ".join(in_use),
            "something still exports this data (an export under an old node name, or a "
            "hand-made one); remove that export first — kvagent never deletes exported data")
    plan = {"pool": name,
            "logical_volumes": [d.path for d in data if d.kind == "logical_volume"],
            "files": [d.path for d in data if d.kind == "file"],
            "device_claims": [d.path for d in data if d.kind == "device_claim"],
            "destroyed": False}
    if not yes:
        return plan
    for d in doomed:
        d.delete()
    records.pools.pop(name, None)
    for b in records.pool_bindings(name):
        del records.bindings[b.key]
    records.save(state_dir)
    plan["destroyed"] = True
    return plan


def _still_exported(live: nvmet.Tree, doomed: list[Doomed]) -> list[str]:
    exported = {}
    for sub in live.subsystems.values():
        for ns in sub.namespaces.values():
            if ns.device_path:
                exported[os.path.realpath(ns.device_path)] = f"namespace {ns.nsid} of {sub.nqn}"
    return [f"{d.path} is exported by {exported[real]}" for d in doomed
            if (real := os.path.realpath(d.path)) in exported]
