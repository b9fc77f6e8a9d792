"""The storage-host pass of plan/apply: backings, then the nvmet tree, idempotently.

Order: read kvagent's records and the live nvmet tree (a failed read aborts: never
"empty"); check that this host still exports under the name its records say (a
renamed node would export the same storage twice); plan each pool's backing with its
driver; check each namespace's identity against its binding — storage never changes
under a known uuid, and no storage is exported twice — keeping a refused namespace
exactly as it is live; run the backing steps (apply only); build the desired nvmet
tree — a pool whose backing failed keeps exactly its live objects, so it degrades
alone and nothing of it is torn down — and plan it against the live tree within
kvagent's scope (its own subsystems, the ports and hosts it created); record intent
(bindings, ports and hosts about to be created); apply; retry links whose address is
not configured yet (EADDRNOTAVAIL) until ``target.address_wait`` runs out; record the
outcome.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

import nvmet
from nvmet.errors import AddressNotAvailable, NvmetError, NvmetUnavailable, PlanError
from nvmet.model import Host, Namespace, Port, Subsystem, Tree, canonical
from nvmet.planner import Action

from .. import failpoints, progress
from ..config.model import Config, TargetPool
from ..errors import KvagentError
from ..fabrics import DISCOVERY_NQN
from ..log import get_logger
from ..naming import parse_subsystem_nqn
from ..records import SCHEMA, Binding, Storage, TargetRecords
from ..result import ActionRecord, RunResult
from ..system.keyring import PskKeyring
from ..system.modules import ensure_modules
from ..system.run import Runner
from ..tlspsk import read_psk
from .auth import HOST_FILES, SECRET_FILES, plan_host_auth, wants_auth
from .backings import driver_for
from .backings.base import BackingPlan, PassContext, Volume
from .desired import pool_layout, pool_nqn
from .export import desired_hosts, desired_port, export_pool
from .tls import on_tls_port, tls_errors, wants_tls
from .usage import device_usage

#: What one round of configfs writes may take, on top of ``target.address_wait``.
APPLY_ROUND_BOUND = 30.0

log = get_logger("target")
Key = tuple[str | None, int]


#: What the records need after an apply: names, links and which namespaces are enabled.
OUTCOME_SPEC = nvmet.ReadSpec(namespaces=frozenset({"enable"}))
_TEMPLATE_ID = "00000000-0000-4000-8000-000000000000"
_TEMPLATE_NQN = "nqn.2014-08.invalid.kvagent:read-spec"


def base_spec(cfg: Config, feats: nvmet.Features | None) -> nvmet.ReadSpec:
    """The files the pass reads before it builds its desired tree.

    What the pass itself needs of every live namespace (its device and identity, for
    the refusals), plus what kvagent's desired tree mentions for this config: the
    attributes :func:`~agent.target.export.export_pool` and
    :func:`~agent.target.export.desired_port` set. Whatever the desired tree then
    mentions beyond these is read with :func:`nvmet.read_more` before planning, so a
    wrong guess costs reads, never a missed drift.
    """
    template_ns = Namespace(nsid=1, device_path="/", device_uuid=_TEMPLATE_ID,
                            device_nguid=_TEMPLATE_ID, enable=True, buffered_io=False)
    sub = Subsystem(nqn=_TEMPLATE_NQN, attrs={"allow_any_host": False},
                    namespaces=[template_ns])
    tsas = bool(feats is not None and feats.tsas)
    ports = [desired_port(pc, (), tsas) for pc in cfg.target.ports] if cfg.target else []
    # Every host's secrets (are they set?) where the kernel has them (features drop them
    # elsewhere): turning auth off is refused, not silently ignored.
    host = Host(nqn=_TEMPLATE_NQN, attrs=dict.fromkeys(HOST_FILES, ""))
    return nvmet.read_spec(Tree(hosts=[host], subsystems=[sub], ports=ports), feats)


def nvmet_fs(cfg: Config) -> nvmet.RealConfigFS:
    """The real configfs seam under the configured mount point."""
    return failpoints.wrap_configfs(nvmet.RealConfigFS(os.path.join(cfg.node.configfs, "nvmet")))


def node_identity_problem(cfg: Config, records: TargetRecords,
                          live: Tree) -> tuple[str, str] | None:
    """Why this host may not export under its configured name now (None: it may).

    kvagent records the node name and NQN prefix it exports under. Exporting under
    another name while the old one still has subsystems or bound namespaces would
    export the same storage twice, under new identities: refused. Records from before
    names were recorded are checked against the live tree.
    """
    node, prefix = cfg.node.name, cfg.node.nqn_prefix
    if records.node is None:
        owners = sorted({p[0] for nqn in live.subsystems
                         if (p := parse_subsystem_nqn(prefix, nqn)) and p[1] in records.pools})
        if not owners or node in owners:
            return None
        old, old_prefix = owners[0], prefix
    elif (records.node, records.nqn_prefix) == (node, prefix):
        return None
    else:
        old, old_prefix = records.node, records.nqn_prefix or prefix
        still = [nqn for nqn in live.subsystems if nqn.startswith(f"{old_prefix}:{old}:")]
        if not still and not records.bindings:
            return None
    return (f"this host exports its pools as node {old!r} (NQN prefix {old_prefix}) and the "
            f"config now says node {node!r} (NQN prefix {prefix}); exporting the same storage "
            "under new subsystem names would export it twice and change the identity GPU "
            "hosts trust, so kvagent changes nothing on the storage side",
            f"set node.name: {old} (and node.nqn_prefix: {old_prefix}) in the config — the "
            "default name is the hostname, which may have changed; to really rename, remove "
            "every pool from target.pools and apply (that unexports them and keeps their "
            "data), then set the new name and add the pools back")


class TargetPass:
    """One reconcile of the storage-host role.

    ``rebind`` names pools whose namespaces may be re-pointed to other storage
    (``kvagent apply --rebind POOL``): such a namespace takes the identity of its new
    storage, so GPU hosts see a different namespace rather than other bytes under
    the identity they know.
    """

    def __init__(self, cfg: Config, runner: Runner, result: RunResult, *,
                 fs: nvmet.ConfigFS | None = None, dry_run: bool = False,
                 rebind: Iterable[str] = ()):
        self.cfg, self.runner, self.result, self.dry_run = cfg, runner, result, dry_run
        self.fs = fs if fs is not None else nvmet_fs(cfg)
        self.state_dir = Path(cfg.node.state_dir)
        self.prefix = f"{cfg.node.nqn_prefix}:{cfg.node.name}"
        self.rebind = frozenset(rebind)
        self._realpaths: dict[str, str] = {}
        self._keys: dict[str, tuple[object, ...]] = {}
        self.feats: nvmet.Features | None = None

    # ------------------------------------------------------------------ helpers
    def _real(self, path: str) -> str:
        """``os.path.realpath``, once per path in this pass (the pass resolves every live
        namespace's device twice; a new pass resolves them again)."""
        real = self._realpaths.get(path)
        if real is None:
            real = self._realpaths[path] = os.path.realpath(path)
        return real

    def _storage_key(self, path: str) -> tuple[object, ...]:
        """What ``path`` is, for the export-twice rule: a block device by its device
        number, any other file by its device and inode (one ``stat``, following links:
        every name of the same storage — a symlink, a by-id link, a hard link — gives
        the same key), a path that does not exist by its ``realpath``. Once per path in
        this pass; a new pass looks again."""
        key = self._keys.get(path)
        if key is None:
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                key = ("path", self._real(path))
            else:
                key = (("block", st.st_rdev) if stat.S_ISBLK(st.st_mode)
                       else ("inode", st.st_dev, st.st_ino))
            self._keys[path] = key
        return key

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
        detail = action.value if action.op == "write" else str(action)
        if action.op == "write" and action.path.rsplit("/", 1)[-1] in SECRET_FILES:
            detail = "<secret>"
        self.result.actions.append(ActionRecord(
            "target", pool, f"nvmet.{action.op}", action.path, detail, status, error))

    def _act(self, pool: str | None, kind: str, subject: str, detail: str = "",
             status: str | None = None, error: str | None = None) -> None:
        self.result.actions.append(ActionRecord(
            "target", pool, kind, subject, detail,
            status or ("planned" if self.dry_run else "done"), error))

    def _load_modules(self) -> None:
        modules = ["nvmet"]
        transports = {p.transport for p in self.cfg.target.ports} if self.cfg.target else set()
        modules += [f"nvmet-{t}" for t in sorted(transports)]
        ensure_modules(modules, self.runner, self.cfg.node.sysfs)

    # -------------------------------------------------------------------- pass
    def run(self) -> None:
        cfg = self.cfg
        try:
            records = TargetRecords.load(self.state_dir)
        except KvagentError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        if cfg.target is None and records.empty:
            return
        if not self.dry_run:
            self._load_modules()
        feats: nvmet.Features | None
        have: nvmet.ReadSpec | None
        try:
            feats = nvmet.features(self.fs)
            # No host (port) exists yet to show whether this kernel has target auth
            # (TLS): look with throw-away objects, so that a kernel without it is said
            # so now.
            probe = {kind for kind, unknown, wanted in (
                ("host", feats.dhchap is None, wants_auth(cfg)),
                ("port", feats.tsas is None, wants_tls(cfg))) if unknown and wanted}
            if probe and not self.dry_run:
                feats = nvmet.features(self.fs, probe=frozenset(probe))
            self.feats = feats
            have = base_spec(cfg, feats)
            live = nvmet.read(self.fs, spec=have)
        except NvmetUnavailable as exc:
            if not self.dry_run:
                self.result.error("target", None, exc.message, exc.hint)
                return
            # Planning on a host where nvmet is not loaded yet: apply loads it, then
            # everything is created from an empty tree.
            self._act(None, "modprobe", "nvmet", "the kernel target is not loaded yet")
            live, feats, have = Tree(), None, None
        except NvmetError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        problem = node_identity_problem(cfg, records, live)
        if problem is not None:
            self.result.error("target", None, *problem)
            return
        failpoints.point("target.plan")
        pools = list(cfg.target.pools) if cfg.target else []
        ctx = self._context(pools, records, live)
        plans = self._plan_backings(ctx, pools)
        failed = {name for name, p in plans.items() if p.errors}
        auth = plan_host_auth(pools, live, feats, owned_hosts=records.hosts,
                              subsystem_prefix=self.prefix)
        for name, problems in auth.errors.items():
            for message, hint in problems:
                self.result.error("target", name, message, hint)
            failed.add(name)
        for name, problems in tls_errors(cfg, pools, feats).items():
            for message, hint in problems:
                self.result.error("target", name, message, hint)
            failed.add(name)
        kept = self._check_identities(ctx, pools, plans, failed)
        skip = {(name, key) for name, keys in kept.items() for key in keys}
        skip |= {(name, (w.host, w.nsid)) for name, p in plans.items() for w in p.withheld}
        if not self.dry_run:
            failed |= self._run_steps(plans, failed, skip)
        else:
            for name, plan in plans.items():
                for step in plan.steps:
                    if (name, step.volume) not in skip:
                        self._act(step.pool, step.kind, step.subject, step.detail)
        desired, port_ids = self._desired(ctx, pools, plans, failed, kept, auth.attrs)
        scope = nvmet.Scope.owned(subsystem_prefix=self.prefix,
                                  port_ids=records.ports | port_ids,
                                  hosts=records.hosts | set(desired.hosts))
        revalidate = self._revalidate(ctx, plans, failed, skip, desired)
        spec = nvmet.read_spec(desired, feats)
        try:
            if have is not None and not have.covers(spec):
                # The desired tree mentions a file the first read left out: read just those.
                live = nvmet.read_more(self.fs, live, have, spec)
            actions = nvmet.plan(desired, live, scope, feats, revalidate)
        except PlanError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        except NvmetError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return
        if self.dry_run:
            for a in actions:
                self._record_nvmet(a, "planned")
            self._insert_psks(pools, failed, desired)
            return
        assert feats is not None
        self._record_intent(records, live, desired, port_ids, plans, failed, skip)
        self._apply(actions, desired, scope, feats, spec)
        self._insert_psks(pools, failed, desired)
        self._record_outcome(records, live, pools, failed, plans, skip)

    def _insert_psks(self, pools: list[TargetPool], failed: set[str], desired: Tree) -> None:
        """Each host of a pool on a TLS port: its PSK in the ``.nvme`` keyring for the
        pool's subsystems that allow it and for discovery (where missing or rotated)."""
        keyring = PskKeyring(self.runner, str(self.state_dir))
        for pool in pools:
            if pool.name in failed or not on_tls_port(self.cfg, pool):
                continue
            subs = [s for s in desired.subsystems.values() if self._pool_of(s.nqn) == pool.name]
            for host in pool.hosts:
                if host.tls is None:
                    continue
                allowing = sorted(s.nqn for s in subs
                                  if pool.allow_any_host or host.nqn in s.allowed_hosts)
                nqns = [DISCOVERY_NQN, *allowing]
                try:
                    psk = read_psk(host.tls.key_file)
                    for nqn in nqns:
                        if keyring.missing(psk, host.nqn, nqn):
                            if not self.dry_run:
                                keyring.insert(psk, host.nqn, nqn)
                            self._act(pool.name, "tls-psk", f"{host.nqn} {nqn}",
                                      f"TLS PSK {psk.fingerprint} into the .nvme keyring")
                except KvagentError as exc:
                    self.result.error("target", pool.name,
                                      f"pool {pool.name}: host {host.name}: {exc.message}",
                                      exc.hint)

    def _context(self, pools: list[TargetPool], records: TargetRecords,
                 live: Tree) -> PassContext:
        exported = {self._real(ns.device_path): sub.nqn
                    for sub in live.subsystems.values() for ns in sub.namespaces.values()
                    if ns.device_path and ns.device_path.startswith("/dev/")}
        listed = [use for pool in pools for use in driver_for(pool).devices(pool)]
        usage = device_usage(listed, records.claims, exported,
                             {nqn: self._pool_of(nqn) for nqn in exported.values()})
        return PassContext(self.cfg, self.runner, records, live, usage, self.dry_run)

    def _plan_backings(self, ctx: PassContext, pools: list[TargetPool]) -> dict[str, BackingPlan]:
        plans: dict[str, BackingPlan] = {}
        for pool in pools:
            try:
                with progress.working_on(pool.name):
                    plan = driver_for(pool).plan(ctx, pool)
            except KvagentError as exc:
                plan = BackingPlan(errors=[f"pool {pool.name}: {exc}"])
            except Exception as exc:  # a bug or an unforeseen error: this pool fails alone
                log.error("unexpected error planning a pool", pool=pool.name, exc_info=exc)
                self.result.unexpected("target", pool.name, exc, f"pool {pool.name}: ")
                plans[pool.name] = BackingPlan(errors=[self.result.errors[-1].message])
                continue
            for message in plan.errors:
                self.result.error("target", pool.name, message)
            for w in plan.withheld:
                self.result.error("target", pool.name, w.reason)
            plans[pool.name] = plan
        return plans

    # --------------------------------------------------------------- identity
    def _check_identities(self, ctx: PassContext, pools: list[TargetPool],
                          plans: dict[str, BackingPlan],
                          failed: set[str]) -> dict[str, dict[Key, Namespace | None]]:
        """Refuse every volume that would move a namespace's identity or export storage twice.

        Returns, per pool, the refused namespaces and the live namespace to keep in
        their place (None when there is none live).
        """
        live = ctx.live
        exported: dict[tuple[object, ...], tuple[str, int]] = {}
        for sub in live.subsystems.values():
            for ns in sub.namespaces.values():
                if ns.device_path:
                    exported[self._storage_key(ns.device_path)] = (sub.nqn, ns.nsid)
        kept: dict[str, dict[Key, Namespace | None]] = {}
        for pool in pools:
            if pool.name in failed:
                continue
            for vol in plans[pool.name].volumes:
                nqn = ctx.nqn(pool.name, vol.host)
                sub = live.subsystems.get(nqn)
                live_ns = sub.namespaces.get(vol.nsid) if sub else None
                reason = self._refusal(ctx, pool, vol, nqn, live_ns, exported)
                if reason is None:
                    continue
                kept.setdefault(pool.name, {})[vol.key] = live_ns
                self.result.error("target", pool.name, *reason)
        return kept

    def _refusal(self, ctx: PassContext, pool: TargetPool, vol: Volume, nqn: str,
                 live_ns: Namespace | None,
                 exported: dict[tuple[object, ...], tuple[str, int]]
                 ) -> tuple[str, str] | None:
        where = exported.get(self._storage_key(vol.path))
        if where is not None and where != (nqn, vol.nsid):
            return (f"pool {pool.name}: namespace {vol.nsid} of {nqn} would export "
                    f"{vol.storage.describe()}, which nvmet already exports as namespace "
                    f"{where[1]} of {where[0]}; kvagent never exports storage twice",
                    "if the other subsystem is an old name of this host (node.name changed), "
                    "set node.name back; otherwise remove that export first")
        bound = ctx.records.bindings.get((nqn, vol.nsid))
        if bound is None and live_ns is not None and live_ns.enable and live_ns.device_uuid:
            bound = Binding(nqn, vol.nsid, live_ns.device_uuid, live_ns.device_nguid or "",
                            pool.name, vol.host,
                            Storage(vol.storage.kind, live_ns.device_path or "?",
                                    "exported now"))
        if bound is None or _same_id(bound.uuid, vol.uuid):
            return None
        if pool.name in self.rebind:
            log.warning("re-pointing a namespace to other storage (--rebind)", pool=pool.name,
                        nqn=nqn, nsid=vol.nsid, old=bound.storage.describe(),
                        new=vol.storage.describe())
            self._act(pool.name, "identity.rebind", f"{nqn} namespace {vol.nsid}",
                      f"{bound.storage.describe()} -> {vol.storage.describe()}; new uuid "
                      f"{vol.uuid}")
            return None
        return (f"pool {pool.name}: refusing to move namespace {vol.nsid} of {nqn} (uuid "
                f"{bound.uuid}) from {bound.storage.describe()} to {vol.storage.describe()}: "
                "a GPU host that knows this namespace would read and write other storage; "
                "the namespace is left as it is",
                "to move a pool to other storage, give it a new pool name (a new pool), or "
                "remove it from the config and apply first (unexport), then add it back; "
                f"`kvagent apply --rebind {pool.name}` re-points it with a new identity "
                "(GPU hosts then see a new, different namespace)")

    # ------------------------------------------------------------------ steps
    def _run_steps(self, plans: dict[str, BackingPlan], failed: set[str],
                   skip: set[tuple[str, Key]]) -> set[str]:
        newly_failed: set[str] = set()
        for name, plan in plans.items():
            if name in failed:
                continue
            for step in plan.steps:
                if (name, step.volume) in skip:
                    continue
                try:
                    with progress.working_on(name):
                        step.run()
                except Exception as exc:  # expected or not, it fails this pool alone
                    expected = isinstance(exc, (KvagentError, OSError))
                    message = str(exc) if expected else \
                        f"unexpected error: {type(exc).__name__}: {exc}"
                    self._act(name, step.kind, step.subject, step.detail, "failed", message)
                    if expected:
                        self.result.error("target", name,
                                          f"{step.kind} {step.subject}: {message}")
                    else:
                        log.error("unexpected error in a step", pool=name, step=step.kind,
                                  exc_info=exc)
                        self.result.unexpected("target", name, exc,
                                               f"{step.kind} {step.subject}: ")
                    newly_failed.add(name)
                    break
                self._act(name, step.kind, step.subject, step.detail, "done")
        return newly_failed

    # ---------------------------------------------------------------- desired
    def _desired(self, ctx: PassContext, pools: list[TargetPool], plans: dict[str, BackingPlan],
                 failed: set[str], kept: dict[str, dict[Key, Namespace | None]],
                 host_attrs: dict[str, dict[str, str]]) -> tuple[Tree, set[int]]:
        cfg, live, records = self.cfg, ctx.live, ctx.records
        subsystems: dict[str, Subsystem] = {}
        links: dict[int, set[str]] = {}
        # Model and serial may be fixed only on subsystems a host could have identified.
        fixed_nqns = frozenset(n for port in live.ports.values() for n in port.subsystems)
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
            refused = kept.get(pool.name, {})
            volumes = [v for v in plans[pool.name].volumes if v.key not in refused]
            keep = {k: ns for k, ns in refused.items() if ns is not None}
            hosts = driver_for(pool).layout(pool, records).keys()
            export = export_pool(cfg, pool, hosts, volumes, fixed_nqns, keep)
            if pool.allow_any_host and export.subsystems:
                log.warning("pool lets any host connect (allow_any_host)", pool=pool.name)
            for sub in export.subsystems:
                subsystems[sub.nqn] = sub
                for pid in export.ports:
                    links.setdefault(pid, set()).add(sub.nqn)
        ports: dict[int, Port] = {}
        accepted: set[int] = set()
        for pc in cfg.target.ports if cfg.target else ():
            lport = live.ports.get(pc.id)
            if lport is not None and pc.id not in records.ports:
                linked = sorted(lport.subsystems)
                what = (f"it exports {', '.join(linked)}" if linked
                        else "no subsystem is linked to it")
                self.result.error(
                    "target", None,
                    f"port {pc.name}: nvmet port {pc.id} exists and kvagent did not create it "
                    f"({what}); kvagent never modifies or deletes a port it did not create",
                    f"choose another id for port {pc.name} in target.ports, or remove nvmet "
                    f"port {pc.id} yourself if nothing needs it")
                continue
            tsas = self.feats is not None and self.feats.tsas
            if pc.tls != "none" and tsas is False:
                continue  # its pools failed: never a port without the TLS it asks for
            ports[pc.id] = desired_port(pc, links.get(pc.id, set()), bool(tsas))
            accepted.add(pc.id)
        # Links of errored pools on ports no longer configured stay as they are.
        for pid, nqns in links.items():
            if pid not in ports and pid in live.ports and pid in records.ports:
                old = live.ports[pid]
                ports[pid] = Port(id=pid, addr=old.addr, params=old.params,
                                  subsystems=frozenset(nqns))
                accepted.add(pid)
        hosts = {h for sub in subsystems.values() for h in sub.allowed_hosts}
        tree = Tree(hosts=desired_hosts(hosts, host_attrs), subsystems=list(subsystems.values()),
                    ports=list(ports.values()))
        return tree, accepted

    def _revalidate(self, ctx: PassContext, plans: dict[str, BackingPlan], failed: set[str],
                    skip: set[tuple[str, Key]], desired: Tree) -> list[tuple[str, int]]:
        """Namespaces whose volume grew: by a step now, or past the size nvmet last read
        (a pass killed between growing a volume and telling nvmet)."""
        grown = {s.grown for name, p in plans.items() if name not in failed
                 for s in p.steps if s.grown and (name, s.volume) not in skip}
        for name, plan in plans.items():
            for vol in plan.volumes:
                bound = ctx.records.bindings.get((pool_nqn(self.cfg, name, vol.host), vol.nsid))
                if (name not in failed and (name, vol.key) not in skip and vol.size
                        and bound and bound.size is not None and bound.size < vol.size):
                    grown.add(vol.path)
        live = {(sub.nqn, nsid) for sub in ctx.live.subsystems.values()
                for nsid in sub.namespaces}
        return [(sub.nqn, ns.nsid) for sub in desired.subsystems.values()
                for ns in sub.namespaces.values()
                if ns.device_path in grown and (sub.nqn, ns.nsid) in live]

    # ------------------------------------------------------------------ apply
    def _apply(self, actions: list[Action], desired: Tree, scope: nvmet.Scope,
               feats: nvmet.Features, spec: nvmet.ReadSpec) -> None:
        wait = self.cfg.target.address_wait if self.cfg.target else 0
        rounds: list[nvmet.ApplyResult] = []

        def one_round() -> nvmet.ApplyResult:
            todo = actions if not rounds else nvmet.plan(
                desired, nvmet.read(self.fs, spec=spec), scope, feats)
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
        # One bounded step for the watchdog: the rounds of configfs writes (each well
        # under APPLY_ROUND_BOUND) and the wait for addresses between them.
        with progress.step("nvmet apply and target.address_wait", wait + APPLY_ROUND_BOUND):
            final = Retrying(retry=retry_if_result(address_missing),
                             stop=stop_after_delay(wait), wait=wait_fixed(1),
                             sleep=progress.sleep, before_sleep=before_sleep,
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

    # ---------------------------------------------------------------- records
    def _record_intent(self, records: TargetRecords, live: Tree, desired: Tree,
                       port_ids: set[int], plans: dict[str, BackingPlan], failed: set[str],
                       skip: set[tuple[str, Key]]) -> None:
        """Before touching nvmet: the ports and hosts about to be created, the bindings.

        Recorded first, so that a kill between creating an object and recording it
        never leaves one that kvagent would then refuse as not its own.
        """
        snapshot = records.snapshot()
        records.node, records.nqn_prefix = self.cfg.node.name, self.cfg.node.nqn_prefix
        records.ports |= {pid for pid in port_ids if pid not in live.ports}
        records.hosts |= {h for h in desired.hosts if h not in live.hosts}
        for name, plan in plans.items():
            if name in failed:
                continue
            for vol in plan.volumes:
                if (name, vol.key) in skip:
                    continue
                nqn = pool_nqn(self.cfg, name, vol.host)
                old = records.bindings.get((nqn, vol.nsid))
                # The storage by kind and path only: its description changes once it exists
                # (a new LV gets an LVM uuid), its identity (vol.uuid) does not.
                records.bindings[(nqn, vol.nsid)] = Binding(
                    nqn, vol.nsid, vol.uuid, vol.nguid, name, vol.host,
                    Storage(vol.storage.kind, vol.storage.path),
                    old.size if old is not None and _same_id(old.uuid, vol.uuid) else None)
        if records != snapshot or records.read_schema != SCHEMA:
            records.save(self.state_dir)

    def _record_outcome(self, records: TargetRecords, before: Tree, pools: list[TargetPool],
                        failed: set[str], plans: dict[str, BackingPlan],
                        skip: set[tuple[str, Key]]) -> None:
        """After apply: forget ports and hosts that are gone, and the bindings of namespaces
        the config no longer exports (their identity is free again); record the pools."""
        if self.result.configfs_writes == 0:
            after = before  # nothing was written: no need to read the tree again
        else:
            try:
                after = nvmet.read(self.fs, spec=OUTCOME_SPEC)
            except NvmetError as exc:
                log.warning("cannot re-read nvmet after apply; records keep the intent",
                            error=str(exc))
                return
        snapshot = records.snapshot()
        records.ports &= set(after.ports)
        records.hosts &= set(after.hosts)
        wanted = {(nqn, nsid) for pool in pools
                  for nqn, nsids in pool_layout(self.cfg, pool, records).items()
                  for nsid in nsids}
        live_keys = {(sub.nqn, nsid) for sub in after.subsystems.values()
                     for nsid in sub.namespaces}
        for key in [k for k in records.bindings if k not in wanted and k not in live_keys]:
            del records.bindings[key]
        enabled = {(sub.nqn, nsid) for sub in after.subsystems.values()
                   for nsid, ns in sub.namespaces.items() if ns.enable}
        failed_paths = {a.subject for a in self.result.actions if a.status == "failed"}
        for name, plan in plans.items():
            for vol in plan.volumes:
                key = (pool_nqn(self.cfg, name, vol.host), vol.nsid)
                bound = records.bindings.get(key)
                ns_path = f"subsystems/{key[0]}/namespaces/{key[1]}"
                if (bound is not None and vol.size is not None and bound.size != vol.size
                        and key in enabled
                        and (name, vol.key) not in skip and name not in failed
                        and not any(p.startswith(ns_path) for p in failed_paths)
                        and _same_id(bound.uuid, vol.uuid)):
                    records.bindings[key] = dataclasses.replace(bound, size=vol.size)
        for pool in pools:
            if pool.name not in failed:
                records.pools[pool.name] = driver_for(pool).record(pool)
        if records != snapshot:
            records.save(self.state_dir)


def _same_id(a: str, b: str) -> bool:
    return a == b or canonical("device_uuid", a) == canonical("device_uuid", b)


