"""The storage-host pass of plan/apply: backings, then the nvmet tree, idempotently.

Order: read the live nvmet tree (a failed read aborts: never "empty"); plan
each pool's backing (LVM, file, device); run the backing steps (apply only);
build the desired nvmet tree — a pool whose backing failed keeps exactly its
live objects, so it degrades alone and nothing of it is torn down — and plan
it against the live tree within kvagent's scope (its own subsystems, the ports
and hosts it created); apply; retry links whose address is not configured yet
(EADDRNOTAVAIL) until ``target.address_wait`` runs out.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

import nvmet
from nvmet.errors import AddressNotAvailable, NvmetError, NvmetUnavailable, PlanError
from nvmet.model import Port, Subsystem, Tree
from nvmet.planner import Action, revalidate_action

from ..config.model import Config, DeviceBacking, FileBacking, LvmBacking, TargetPool
from ..errors import KvagentError
from ..log import get_logger
from ..naming import parse_subsystem_nqn
from ..result import ActionRecord, RunResult
from ..state import read_json, write_json
from ..system.modules import ensure_modules
from ..system.run import Runner
from .backing_device import plan_device, read_claims
from .backing_file import plan_file
from .backing_lvm import list_owned_volumes, list_volume_groups, plan_lvm
from .export import desired_hosts, desired_port, export_pool, pool_hosts
from .steps import BackingPlan
from .usage import DeviceUsage, device_usage

log = get_logger("target")
STATE_FILE = "target.json"


@dataclass
class TargetState:
    """What kvagent created on the target: port ids, host NQNs, pool backings."""

    ports: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    pools: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def load(cls, state_dir: Path) -> TargetState:
        data = read_json(state_dir / STATE_FILE, {})
        return cls(set(data.get("ports", [])), set(data.get("hosts", [])),
                   dict(data.get("pools", {})))

    def save(self, state_dir: Path) -> None:
        write_json(state_dir / STATE_FILE, {"ports": sorted(self.ports),
                                             "hosts": sorted(self.hosts), "pools": self.pools})

    @property
    def empty(self) -> bool:
        return not (self.ports or self.hosts or self.pools)


def nvmet_fs(cfg: Config) -> nvmet.RealConfigFS:
    """The real configfs seam under the configured mount point."""
    return nvmet.RealConfigFS(os.path.join(cfg.node.configfs, "nvmet"))


def _backing_record(pool: TargetPool) -> dict:
    b = pool.backing
    if isinstance(b, LvmBacking):
        return {"kind": "lvm", "volume_group": b.volume_group}
    if isinstance(b, FileBacking):
        return {"kind": "file", "directory": b.directory}
    return {"kind": "device", "devices": [d.path for d in b.devices]}


class TargetPass:
    """One reconcile of the storage-host role."""

    def __init__(self, cfg: Config, runner: Runner, result: RunResult, *,
                 fs: nvmet.ConfigFS | None = None, dry_run: bool = False):
        self.cfg, self.runner, self.result, self.dry_run = cfg, runner, result, dry_run
        self.fs = fs if fs is not None else nvmet_fs(cfg)
        self.state_dir = Path(cfg.node.state_dir)
        self.prefix = f"{cfg.node.nqn_prefix}:{cfg.node.name}"

    # ------------------------------------------------------------------ helpers
    def _pool_of(self, nqn: str) -> str | None:
        parsed = parse_subsystem_nqn(self.cfg.node.nqn_prefix, nqn)
        return parsed[1] if parsed and parsed[0] == self.cfg.node.name else None

    def _action_pool(self, action: Action) -> str | None:
        """The pool an nvmet action belongs to (None for shared ports and hosts)."""
        parts = action.path.split("/")
        if parts[0] == "subsystems" and len(parts) > 1:
            return self._pool_of(parts[1])
        if parts[0] == "ports" and len(parts) > 3 and parts[2] == "subsystems":
            return self._pool_of(parts[3])
        return None

    def _record_nvmet(self, action: Action, status: str, error: str | None = None) -> None:
        pool = self._action_pool(action)
        self.result.actions.append(ActionRecord(
            "target", pool, f"nvmet.{action.op}", action.path,
            action.value if action.op == "write" else str(action), status, error))

    def _load_modules(self) -> None:
        modules = ["nvmet"]
        transports = {p.transport for p in self.cfg.target.ports} if self.cfg.target else set()
        modules += [f"nvmet-{t}" for t in sorted(transports)]
        ensure_modules(modules, self.runner, self.cfg.node.sysfs)

    # -------------------------------------------------------------------- pass
    def run(self) -> None:
        cfg = self.cfg
        state = TargetState.load(self.state_dir)
        if cfg.target is None and state.empty:
            return
        if not self.dry_run:
            self._load_modules()
        feats: nvmet.Features | None
        try:
            live = nvmet.read(self.fs)
            feats = nvmet.features(self.fs)
        except NvmetUnavailable as exc:
            if not self.dry_run:
                self.result.error("target", None, exc.message, exc.hint)
                return
            # Planning on a host where nvmet is not loaded yet: apply loads it, then
            # everything is created from an empty tree.
            self.result.actions.append(ActionRecord("target", None, "modprobe", "nvmet",
                                                    "the kernel target is not loaded yet"))
            live, feats = Tree(), None
        except NvmetError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        pools = list(cfg.target.pools) if cfg.target else []
        plans = self._plan_backings(pools, live)
        failed_pools = {name for name, p in plans.items() if p.errors}
        if not self.dry_run:
            failed_pools |= self._run_steps(plans, failed_pools)
        else:
            for plan in plans.values():
                for step in plan.steps:
                    self.result.actions.append(ActionRecord(
                        "target", step.pool, step.kind, step.subject, step.detail))
        desired, port_ids, errors = self._desired(pools, plans, failed_pools, live, state)
        for pool, message in errors:
            self.result.error("target", pool, message)
        scope = nvmet.Scope.owned(subsystem_prefix=self.prefix,
                                  port_ids=state.ports | port_ids,
                                  hosts=state.hosts | set(desired.hosts))
        revalidate = self._revalidate(plans, failed_pools, desired)
        try:
            actions = nvmet.plan(desired, live, scope, feats, revalidate)
        except PlanError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        if self.dry_run:
            for a in actions:
                self._record_nvmet(a, "planned")
            return
        self._apply(actions, desired, scope, feats)
        self._save_state(state, live, pools, failed_pools, port_ids)

    def _plan_backings(self, pools: list[TargetPool], live: Tree) -> dict[str, BackingPlan]:
        plans: dict[str, BackingPlan] = {}
        vgs = owned = None
        exported = {os.path.realpath(ns.device_path): sub.nqn
                    for sub in live.subsystems.values() for ns in sub.namespaces.values()
                    if ns.device_path and ns.device_path.startswith("/dev/")}
        usage: DeviceUsage | None = None
        creating: dict[str, tuple[str, tuple[str, ...]]] = {}
        for pool in pools:
            hosts = pool_hosts(pool)
            try:
                if usage is None and isinstance(pool.backing, (LvmBacking, DeviceBacking)):
                    usage = device_usage(pools, read_claims(self.state_dir), exported,
                                         {nqn: self._pool_of(nqn) for nqn in exported.values()})
                if isinstance(pool.backing, LvmBacking):
                    if vgs is None:
                        vgs, owned = list_volume_groups(self.runner), \
                            list_owned_volumes(self.runner)
                    plan = plan_lvm(pool, hosts, self.runner, vgs, owned or [], usage=usage,
                                    creating=creating)
                elif isinstance(pool.backing, FileBacking):
                    plan = plan_file(pool, hosts)
                else:
                    assert isinstance(pool.backing, DeviceBacking)
                    others = {dev: nqn for dev, nqn in exported.items()
                              if self._pool_of(nqn) != pool.name}
                    plan = plan_device(pool, self.runner, self.state_dir, others, usage)
                    idle = [h.name for h in pool.hosts if not pool.shared and h.name not in hosts]
                    if idle:
                        log.warning("hosts of a device pool without a device get nothing",
                                    pool=pool.name, hosts=idle)
                    if not hosts:
                        plan.steps, plan.volumes = [], []
            except KvagentError as exc:
                plan = BackingPlan(errors=[f"pool {pool.name}: {exc}"])
            for message in plan.errors:
                self.result.error("target", pool.name, message)
            plans[pool.name] = plan
        return plans

    def _run_steps(self, plans: dict[str, BackingPlan], failed: set[str]) -> set[str]:
        newly_failed: set[str] = set()
        for name, plan in plans.items():
            if name in failed:
                continue
            for step in plan.steps:
                try:
                    step.run()
                except (KvagentError, OSError) as exc:
                    message = str(exc)
                    self.result.actions.append(ActionRecord(
                        "target", name, step.kind, step.subject, step.detail, "failed", message))
                    self.result.error("target", name, f"{step.kind} {step.subject}: {message}")
                    newly_failed.add(name)
                    break
                self.result.actions.append(ActionRecord(
                    "target", name, step.kind, step.subject, step.detail, "done"))
        return newly_failed

    def _desired(self, pools: list[TargetPool], plans: dict[str, BackingPlan],
                 failed: set[str], live: Tree,
                 state: TargetState) -> tuple[Tree, set[int], list[tuple[str | None, str]]]:
        cfg = self.cfg
        errors: list[tuple[str | None, str]] = []
        subsystems: dict[str, Subsystem] = {}
        links: dict[int, set[str]] = {}
        live_nqns = frozenset(live.subsystems)
        for pool in pools:
            if pool.name in failed:
                # Degrade alone: keep exactly what is live for this pool.
                for nqn, sub in live.subsystems.items():
                    if self._pool_of(nqn) == pool.name:
                        subsystems[nqn] = sub
                        for pid, port in live.ports.items():
                            if nqn in port.subsystems:
                                links.setdefault(pid, set()).add(nqn)
                continue
            export = export_pool(cfg, pool, plans[pool.name].volumes, live_nqns)
            if pool.allow_any_host and export.subsystems:
                log.warning("pool lets any host connect (allow_any_host)", pool=pool.name)
            for sub in export.subsystems:
                subsystems[sub.nqn] = sub
                for pid in export.ports:
                    links.setdefault(pid, set()).add(sub.nqn)
        ports: dict[int, Port] = {}
        accepted: set[int] = set()
        for pc in cfg.target.ports if cfg.target else ():
            want = desired_port(pc, links.get(pc.id, set()))
            lport = live.ports.get(pc.id)
            if lport is not None and pc.id not in state.ports:
                foreign = {n for n in lport.subsystems if not n.startswith(self.prefix + ":")}
                same = all(lport.addr.get(k) == v for k, v in want.addr.items())
                if foreign or (not same and lport.subsystems):
                    errors.append((None, f"port {pc.name}: nvmet port id {pc.id} exists and was "
                                         "not created by kvagent; choose another id"))
                    # keep our pools' live links (if any) as they are
                    continue
            ports[pc.id] = want
            accepted.add(pc.id)
        # Links of errored pools on ports no longer configured stay as they are.
        for pid, nqns in links.items():
            if pid not in ports and pid in live.ports and pid in state.ports:
                kept = live.ports[pid]
                ports[pid] = Port(id=pid, addr=kept.addr, params=kept.params,
                                  subsystems=frozenset(nqns))
                accepted.add(pid)
        hosts = {h for sub in subsystems.values() for h in sub.allowed_hosts}
        tree = Tree(hosts=desired_hosts(hosts), subsystems=list(subsystems.values()),
                    ports=list(ports.values()))
        return tree, accepted, errors

    def _revalidate(self, plans: dict[str, BackingPlan], failed: set[str],
                    desired: Tree) -> list[tuple[str, int]]:
        grown = {s.grown for name, p in plans.items() if name not in failed
                 for s in p.steps if s.grown}
        return [(sub.nqn, ns.nsid) for sub in desired.subsystems.values()
                for ns in sub.namespaces.values() if ns.device_path in grown]

    def _apply(self, actions: list[Action], desired: Tree, scope: nvmet.Scope,
               feats: nvmet.Features) -> None:
        wait = self.cfg.target.address_wait if self.cfg.target else 0
        rounds: list[nvmet.ApplyResult] = []

        def one_round() -> nvmet.ApplyResult:
            todo = actions if not rounds else nvmet.plan(desired, nvmet.read(self.fs), scope,
                                                         feats)
            res = nvmet.apply(todo, self.fs)
            rounds.append(res)
            return res

        def address_missing(res: nvmet.ApplyResult) -> bool:
            return any(isinstance(e, AddressNotAvailable) for e in res.errors)

        def before_sleep(state: RetryCallState) -> None:
            res = state.outcome.result() if state.outcome else None
            ports = sorted({e.path.split("/")[1] for e in (res.errors if res else [])
                            if isinstance(e, AddressNotAvailable) and e.path})
            log.info("waiting for port addresses to appear", ports=ports,
                     waited=round(state.seconds_since_start, 1), limit=wait)

        started = time.monotonic()
        final = Retrying(retry=retry_if_result(address_missing), stop=stop_after_delay(wait),
                         wait=wait_fixed(1), before_sleep=before_sleep,
                         retry_error_callback=lambda s: s.outcome.result())(one_round)
        for res in rounds:
            for a in res.done:
                if a.key not in {f.key for f, _ in final.failed}:
                    self._record_nvmet(a, "done")
            self.result.configfs_writes += res.writes
        for a, err in final.failed:
            self._record_nvmet(a, "failed", str(err))
            msg = err.message
            if isinstance(err, AddressNotAvailable):
                msg = self._address_message(a, time.monotonic() - started, wait)
            self.result.error("target", self._action_pool(a), msg, err.hint)
        for a in final.skipped:
            self._record_nvmet(a, "skipped")

    def _address_message(self, action: Action, waited: float, wait: float) -> str:
        parts = action.path.split("/")
        pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        pc = next((p for p in self.cfg.target.ports if p.id == pid), None) \
            if self.cfg.target else None
        where = (f"port {pc.name} (nvmet port {pid}, {pc.transport} {pc.address}:{pc.service})"
                 if pc else f"nvmet port {pid}")
        what = f"; subsystem {parts[3]} is not exported on it" if len(parts) > 3 else ""
        return (f"{where}: the address is not configured on this host; gave up after "
                f"{waited:.0f}s (target.address_wait: {wait:g}s){what}")

    def _save_state(self, state: TargetState, before: Tree, pools: list[TargetPool],
                    failed: set[str], port_ids: set[int]) -> None:
        if self.result.configfs_writes == 0:
            after = before  # nothing was written: no need to read the tree again
        else:
            try:
                after = nvmet.read(self.fs)
            except NvmetError as exc:
                log.warning("cannot re-read nvmet after apply; state not updated",
                            error=str(exc))
                return
        created_ports = {pid for pid in after.ports if pid not in before.ports}
        state.ports = (state.ports | created_ports | (port_ids & set(after.ports))) & set(
            after.ports)
        created_hosts = {h for h in after.hosts if h not in before.hosts}
        state.hosts = (state.hosts | created_hosts) & set(after.hosts)
        for pool in pools:
            if pool.name not in failed:
                state.pools[pool.name] = _backing_record(pool)
        if state != TargetState.load(self.state_dir):
            state.save(self.state_dir)


def revalidate(nqn: str, nsid: int) -> Action:
    """Re-export of :func:`nvmet.planner.revalidate_action` for callers of this module."""
    return revalidate_action(nqn, nsid)
