"""Whole-device backing: one namespace per block device, named by a stable id.

The first time kvagent exports a device it must be blank (see safety.py); kvagent
then records a claim (:class:`agent.records.DeviceClaim`) with the device's identity
(WWID, serial, size), the namespace id it gets and the namespace identity it carries.
Later the GPU host's filesystem is on it, and the claim — written by kvagent itself —
is what makes it still kvagent's to export.

Namespace ids follow the devices, not their place in the list: a claimed device keeps
its nsid, a new one takes the lowest free nsid of its host, so reordering the list
changes nothing and removing a device unexports only that device. Every pass checks
that each claimed by-id path still leads to the claimed device; one that does not
(a swapped drive, a re-pointed link, two drives sharing an id) is not exported.

A claim from before identities were recorded carries the identity of its namespace id
(:func:`~agent.target.identity.legacy_ids`), so that id must be the one the device had,
proven, never its place in today's list (a shortened or reordered list would give it
another drive's identity): the claim's recorded nsid (schema-1 records get it from the
device list they recorded, :meth:`agent.records.TargetRecords.load`), else the nsid
nvmet exports it under now, else its binding, else 1 when it is its host's only claim in
the pool. A claim with none of these is a plan error, and an identity that the records
or nvmet show on another device is never given to this one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ...config.model import DeviceBacking, TargetPool
from ...errors import KvagentError
from ...log import get_logger
from ...records import (
    TARGET_FILE,
    V1_CLAIMS_FILE,
    DeviceClaim,
    PoolRecord,
    Storage,
    TargetRecords,
)
from ...system.run import Runner
from ..identity import (
    DeviceIdentity,
    claim_matches,
    describe_claim,
    device_identity,
    fresh_ids,
    legacy_ids,
)
from ..safety import ensure_blank, resolve_block_device
from ..usage import DeviceUse
from .base import BackingPlan, Doomed, PassContext, Step, Volume, Withheld, grantees

log = get_logger("device-backing")


@dataclass
class Assignment:
    """The namespace id of each listed device of a pool, and the devices that get none."""

    #: ``{device path: (host, nsid)}``
    nsids: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    #: Listed devices whose claim (from an older kvagent) has no provable nsid.
    unproven: list[str] = field(default_factory=list)
    #: Listed devices whose claim gives an nsid another listed device's claim has.
    clashes: list[tuple[str, str, str | None, int]] = field(default_factory=list)


def legacy_nsid(claim: DeviceClaim, records: TargetRecords,
                live_nsids: Mapping[str, int]) -> int | None:
    """The nsid a claim without one was exported under, where that can be proven.

    Proof is, in turn: the nsid nvmet exports the device under now; the binding kvagent
    recorded for the device; being the only claim of its pool and host (kvagent of that
    time numbered a host's claimed devices from 1). Never its place in today's list.
    """
    if claim.nsid is not None:
        return claim.nsid
    if claim.path in live_nsids:
        return live_nsids[claim.path]
    bound = {b.nsid for b in records.bindings.values()
             if b.pool == claim.pool and b.host == claim.host and b.storage.kind == "device"
             and b.storage.path == claim.path}
    if len(bound) == 1:
        return bound.pop()
    peers = [c for c in records.claims.values() if (c.pool, c.host) == (claim.pool, claim.host)]
    return 1 if peers == [claim] else None


def plan_nsids(pool: TargetPool, records: TargetRecords,
               live_nsids: Mapping[str, int] | None = None) -> Assignment:
    """The namespace ids of the pool's listed devices (see :func:`assign_nsids`)."""
    backing = pool.backing
    assert isinstance(backing, DeviceBacking)
    claims = records.pool_claims(pool.name)
    live_nsids = live_nsids or {}
    hosts = set(grantees(pool))
    out = Assignment()
    used: dict[str | None, set[int]] = {}
    for claim in claims.values():
        nsid = legacy_nsid(claim, records, live_nsids)
        if nsid is not None:
            used.setdefault(claim.host, set()).add(nsid)
    holder: dict[tuple[str | None, int], str] = {}
    new: list[tuple[str, str | None]] = []
    for entry in backing.devices:
        host = None if pool.shared else entry.host
        if host not in hosts:
            continue
        claim = claims.get(entry.path)
        if claim is None or claim.host != host:
            new.append((entry.path, host))
            continue
        nsid = legacy_nsid(claim, records, live_nsids)
        if nsid is None:
            out.unproven.append(entry.path)
        elif (host, nsid) in holder:
            out.clashes.append((holder[(host, nsid)], entry.path, host, nsid))
        else:
            holder[(host, nsid)] = entry.path
            out.nsids[entry.path] = (host, nsid)
    for path, host in new:
        taken = used.setdefault(host, set())
        nsid = next(n for n in range(1, len(taken) + 2) if n not in taken)
        taken.add(nsid)
        out.nsids[path] = (host, nsid)
    return out


def assign_nsids(pool: TargetPool, records: TargetRecords,
                 live_nsids: Mapping[str, int] | None = None) -> dict[str, tuple[str | None, int]]:
    """``{device path: (host, nsid)}`` for the pool's listed devices.

    A claim's nsid is kept; a claim from an older kvagent (no nsid) keeps the nsid that
    can be proven for it (:func:`legacy_nsid`) and gets none (it is not exported) when
    none can. A new device takes the lowest nsid its host does not use, counting claims
    of devices no longer listed (re-adding one gives its nsid back).
    """
    return plan_nsids(pool, records, live_nsids).nsids


def identity_elsewhere(ctx: PassContext, nqn: str, nsid: int, uuid: str,
                       path: str) -> str | None:
    """Where the identity ``uuid`` of namespace ``nsid`` of ``nqn`` is shown on another
    device than ``path`` (kvagent's binding, or what nvmet exports now); None if nowhere."""
    same = uuid.lower()
    real = os.path.realpath(path)

    def other(device: str | None) -> bool:
        return bool(device) and device != path and os.path.realpath(device or "") != real

    bound = ctx.records.bindings.get((nqn, nsid))
    if (bound is not None and bound.storage.kind == "device" and bound.uuid.lower() == same
            and other(bound.storage.path)):
        return f"bound to device {bound.storage.path} in kvagent's records"
    sub = ctx.live.subsystems.get(nqn)
    ns = sub.namespaces.get(nsid) if sub else None
    if ns is not None and (ns.device_uuid or "").lower() == same and other(ns.device_path):
        return f"exported by nvmet on {ns.device_path} now"
    return None


class DeviceDriver:
    """Whole block devices, one namespace each (kind: device)."""

    kind = "device"

    def layout(self, pool: TargetPool,
               records: TargetRecords) -> Mapping[str | None, tuple[int, ...]]:
        per_host: dict[str | None, list[int]] = {}
        for host, nsid in assign_nsids(pool, records).values():
            per_host.setdefault(host, []).append(nsid)
        return {h: tuple(sorted(n)) for h, n in per_host.items()}

    def record(self, pool: TargetPool) -> PoolRecord:
        assert isinstance(pool.backing, DeviceBacking)
        return PoolRecord("device", {"devices": [d.path for d in pool.backing.devices]})

    def devices(self, pool: TargetPool) -> list[tuple[str, DeviceUse]]:
        b = pool.backing
        assert isinstance(b, DeviceBacking)
        return [(d.path, DeviceUse(pool.name, "device",
                                   f"listed by pool {pool.name} (kind: device) as {d.path}"))
                for d in b.devices]

    def where(self, record: PoolRecord) -> str:
        return ", ".join(record.params.get("devices", []))

    def plan(self, ctx: PassContext, pool: TargetPool) -> BackingPlan:
        """Volumes and steps: verify claimed devices, claim new blank ones."""
        backing = pool.backing
        assert isinstance(backing, DeviceBacking)
        plan = BackingPlan()
        claims = ctx.records.pool_claims(pool.name)
        all_claims = ctx.records.claims
        live_nsids = self._live_nsids(ctx, pool)
        seen: dict[str, str] = {}
        idle = [h.name for h in pool.hosts if not pool.shared
                and h.name not in {d.host for d in backing.devices}]
        if idle:
            log.warning("hosts of a device pool without a device get nothing", pool=pool.name,
                        hosts=idle)
        assignment = plan_nsids(pool, ctx.records, live_nsids)
        plan.errors += [self._unproven(ctx, pool.name, path) for path in assignment.unproven]
        plan.errors += [
            f"pool {pool.name}: {a} and {b} are both recorded as namespace {nsid} of host "
            f"{host or 'shared'}; kvagent never gives one drive's identity to another: fix "
            f"the nsid of the wrong claim in {self._claims_file(ctx)}"
            for a, b, host, nsid in assignment.clashes]
        if plan.errors:
            return plan
        for path, (host, nsid) in assignment.nsids.items():
            nqn = ctx.nqn(pool.name, host)
            real_now = os.path.realpath(path)
            if real_now in seen:
                plan.errors.append(f"pool {pool.name}: {path} is the same device as "
                                   f"{seen[real_now]} ({real_now}); list each device once")
                continue
            seen[real_now] = path
            other = all_claims.get(path)
            if other is not None and (other.pool != pool.name or other.host != host):
                plan.errors.append(
                    f"pool {pool.name}: {path} is claimed by pool {other.pool!r} "
                    f"(host {other.host!r}); destroy that pool first or use another")
                continue
            claim = claims.get(path)
            now = device_identity(path, ctx.sysfs)
            if claim is not None:
                self._claimed(ctx, plan, pool, claim, now, host, nsid, nqn)
                continue
            self._new(ctx, plan, pool, path, host, nsid)
        return plan

    @staticmethod
    def _claims_file(ctx: PassContext) -> str:
        """Where the claims are recorded now (schema 1: beside target.json)."""
        name = V1_CLAIMS_FILE if ctx.records.read_schema == 1 else TARGET_FILE
        return str(ctx.state_dir / name)

    def _unproven(self, ctx: PassContext, pool: str, path: str) -> str:
        """The plan error for a listed device whose claim has no provable nsid."""
        return (f"pool {pool}: cannot tell which namespace id {path} was exported under: "
                "its claim is from an older kvagent (no nsid recorded), and neither the "
                "device list it recorded nor nvmet nor a binding shows it. Numbering it by "
                "its place in today's list could give it another drive's identity, so the "
                f"pool is left as it is: add \"nsid\": N (the id GPU hosts know it by, "
                f"`nvme list` there) to its claim in {self._claims_file(ctx)}, or remove the "
                f"pool from the config, apply, `kvagent pool destroy {pool}` and add it back "
                "(new identities)")

    @staticmethod
    def _live_nsids(ctx: PassContext, pool: TargetPool) -> dict[str, int]:
        """Device paths exported now by this pool's subsystems, with their nsid."""
        out: dict[str, int] = {}
        for host in grantees(pool):
            sub = ctx.live.subsystems.get(ctx.nqn(pool.name, host))
            for ns in sub.namespaces.values() if sub else ():
                if ns.device_path:
                    out[ns.device_path] = ns.nsid
        return out

    def _claimed(self, ctx: PassContext, plan: BackingPlan, pool: TargetPool,
                 claim: DeviceClaim, now: DeviceIdentity | None, host: str | None, nsid: int,
                 nqn: str) -> None:
        if now is None:
            plan.withheld.append(Withheld(host, nsid, (
                f"pool {pool.name}: claimed device {claim.path} is gone (it was "
                f"{describe_claim(claim)}); its namespace {nsid} is not exported")))
            return
        if not claim_matches(claim, now):
            plan.withheld.append(Withheld(host, nsid, (
                f"pool {pool.name}: {claim.path} now leads to another device: claimed "
                f"{describe_claim(claim)}, now {now.describe()}; kvagent does not export it "
                f"under namespace {nsid}'s identity. Put the claimed drive back (or fix the "
                "link); a new drive needs a new device entry after `kvagent pool destroy`")))
            return
        uuid, nguid = claim.uuid, claim.nguid
        if not uuid or not nguid:
            uuid, nguid = legacy_ids(nqn, nsid)
        elsewhere = identity_elsewhere(ctx, nqn, nsid, uuid, claim.path)
        if elsewhere is not None:
            plan.withheld.append(Withheld(host, nsid, (
                f"pool {pool.name}: namespace {nsid} of {nqn} (uuid {uuid}) is {elsewhere}; "
                f"kvagent never gives it to {claim.path} (another drive). Put the devices "
                "back as they were, or see `kvagent pool list` for what is bound where")))
            return
        updated = replace(claim, nsid=nsid, uuid=uuid, nguid=nguid, device=now.device,
                          size=now.size, wwid=now.wwid, serial=now.serial)
        if updated != claim:
            plan.steps.append(Step(
                "device.record", pool.name, claim.path, f"identity {now.describe()}",
                lambda c=updated: self._save_claim(ctx, c), volume=(host, nsid)))
        plan.volumes.append(Volume(pool.name, host, nsid, claim.path, None, uuid, nguid,
                                   Storage("device", claim.path, now.describe())))

    def _new(self, ctx: PassContext, plan: BackingPlan, pool: TargetPool, path: str,
             host: str | None, nsid: int) -> None:
        real_now = os.path.realpath(path)
        others = ctx.usage.conflicts(path, pool.name, "device")
        if others:
            plan.errors.append(
                f"pool {pool.name}: refusing to export {path} ({real_now}): it is "
                f"{'; '.join(others)}. A device serves one pool only: remove it from one "
                "of them")
            return
        try:
            real, _ = resolve_block_device(path)
            real = ensure_blank(path, "export", ctx.runner)
        except KvagentError as exc:
            plan.errors.append(f"pool {pool.name}: {exc}")
            return
        now = device_identity(path, ctx.sysfs)
        uuid, nguid = fresh_ids()
        claim = DeviceClaim(path=path, pool=pool.name, host=host, device=real,
                            size=now.size if now else None, nsid=nsid, uuid=uuid, nguid=nguid,
                            wwid=now.wwid if now else None, serial=now.serial if now else None)
        plan.steps.append(Step(
            "device.claim", pool.name, path, f"{real}, host {host or 'shared'}",
            lambda c=claim: self._save_claim(ctx, c), volume=(host, nsid)))
        plan.volumes.append(Volume(pool.name, host, nsid, path, None, uuid, nguid,
                                   Storage("device", path, now.describe() if now else real)))

    @staticmethod
    def _save_claim(ctx: PassContext, claim: DeviceClaim) -> None:
        ctx.records.claims[claim.path] = claim
        ctx.records.save(ctx.state_dir)

    def doomed(self, ctx: PassContext, name: str, record: PoolRecord | None) -> list[Doomed]:
        def release(path: str) -> None:
            ctx.records.claims.pop(path, None)
            ctx.records.save(ctx.state_dir)

        return [Doomed("device_claim", path, lambda p=path: release(p))
                for path in sorted(ctx.records.pool_claims(name))]

    def block_devices(self, runner: Runner, paths: list[str]) -> dict[str, tuple[str, ...]]:
        """Each claimed device itself (its device node)."""
        return {p: (os.path.realpath(p),) for p in paths}
