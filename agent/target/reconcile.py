"""The storage-host pass of plan/apply: backings, then the nvmet tree, idempotently.

:meth:`TargetPass.run` reads kvagent's records and the live nvmet tree (a failed read
aborts: never "empty") and checks that this host still exports under the name its
records say (a renamed node would export the same storage twice). Then one
:class:`~agent.target.work.PoolWork` per pool travels through the stages, each of which
may fail a pool (it then degrades alone: it keeps exactly its live objects, nothing of
it is torn down):

1. plan each pool's backing with its driver (reads storage only);
2. the hosts' DH-HMAC-CHAP, then 3. TLS: a pool this host cannot serve so fails;
4. check each namespace's identity against its binding — storage never changes under a
   known uuid, and no storage is exported twice — keeping a refused namespace exactly
   as it is live;
5. run the backing steps (apply only);
6. build the desired nvmet tree;
7. refer GPU hosts to the peers on every port (:mod:`agent.target.referrals`).

The desired tree is planned against the live one within kvagent's scope (its own
subsystems, the ports and hosts it created); apply records intent (bindings, ports and
hosts about to be created), applies, retries links whose address is not configured yet
(EADDRNOTAVAIL) until ``target.address_wait`` runs out, and records the outcome.
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
from .backings.base import BackingPlan, PassContext, Step, Volume
from .desired import pool_layout, pool_nqn
from .export import desired_hosts, desired_port, export_pool
from .referrals import PREFIX, port_referrals, referred_peers
from .tls import on_tls_port, tls_errors, wants_tls
from .usage import device_usage
from .work import PoolWork, StoragePass

#: What one round of configfs writes may take, on top of ``target.address_wait``.
APPLY_ROUND_BOUND = 30.0

log = get_logger("target")


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
        """Read, then the stages in order, then plan nvmet; apply and record (not when
        planning). Every stage sees the same :class:`StoragePass`."""
        state = self._read()
        if state is None:
            return
        failpoints.point("target.plan")
        for stage in (self._plan_backings, self._check_auth, self._check_tls,
                      self._check_identities, self._run_steps, self._build_desired,
                      self._refer_peers):
            stage(state)
        actions = self._plan_nvmet(state)
        if actions is None:
            return
        if self.dry_run:
            for a in actions:
                self._record_nvmet(a, "planned")
            self._insert_psks(state)
            return
        self._record_intent(state)
        self._apply(actions, state)
        self._insert_psks(state)
        self._record_outcome(state)

    def _read(self) -> StoragePass | None:
        """kvagent's records and the live nvmet tree, with this host's identity checked
        (None: nothing to do, or a failure already reported: a failed read is never
        "empty")."""
        cfg = self.cfg
        try:
            records = TargetRecords.load(self.state_dir)
        except KvagentError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return None
        if cfg.target is None and records.empty:
            return None
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
                return None
            # Planning on a host where nvmet is not loaded yet: apply loads it, then
            # everything is created from an empty tree.
            self._act(None, "modprobe", "nvmet", "the kernel target is not loaded yet")
            live, feats, have = Tree(), None, None
        except NvmetError as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return None
        problem = node_identity_problem(cfg, records, live)
        if problem is not None:
            self.result.error("target", None, *problem)
            return None
        pools = list(cfg.target.pools) if cfg.target else []
        return StoragePass(records, live, feats, have, self._context(pools, records, live),
                           [PoolWork(pool) for pool in pools])

    def _insert_psks(self, state: StoragePass) -> None:
        """Each host of a pool on a TLS port: its PSK in the ``.nvme`` keyring for the
        pool's subsystems that allow it and for discovery (where missing or rotated)."""
        keyring = PskKeyring(self.runner, str(self.state_dir))
        for work in state.alive():
            pool = work.pool
            if not on_tls_port(self.cfg, pool):
                continue
            subs = [s for s in state.desired.subsystems.values()
                    if self._pool_of(s.nqn) == pool.name]
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

    # ------------------------------------------------------------------ stages
    def _plan_backings(self, state: StoragePass) -> None:
        """Stage: each pool's backing planned by its driver (reads storage only)."""
        for work in state.works:
            pool = work.pool
            try:
                with progress.working_on(pool.name):
                    work.plan = driver_for(pool).plan(state.ctx, pool)
            except KvagentError as exc:
                work.plan = BackingPlan(errors=[f"pool {pool.name}: {exc}"])
            except Exception as exc:  # a bug or an unforeseen error: this pool fails alone
                log.error("unexpected error planning a pool", pool=pool.name, exc_info=exc)
                self.result.unexpected("target", pool.name, exc, f"pool {pool.name}: ")
                work.plan = BackingPlan(errors=[self.result.errors[-1].message])
                work.failed = True
                continue
            for message in work.plan.errors:
                self.result.error("target", pool.name, message)
            for w in work.plan.withheld:
                self.result.error("target", pool.name, w.reason)
            work.failed = bool(work.plan.errors)

    def _check_auth(self, state: StoragePass) -> None:
        """Stage: the hosts' DH-HMAC-CHAP attributes; a pool whose hosts' auth cannot be
        served (or would be turned off) fails."""
        auth = plan_host_auth(state.pools, state.live, state.feats,
                              owned_hosts=state.records.hosts, subsystem_prefix=self.prefix)
        state.host_attrs = auth.attrs
        self._fail_pools(state, auth.errors)

    def _check_tls(self, state: StoragePass) -> None:
        """Stage: a pool on a TLS port this host cannot serve with TLS fails."""
        self._fail_pools(state, tls_errors(self.cfg, state.pools, state.feats))

    def _fail_pools(self, state: StoragePass,
                    problems: dict[str, list[tuple[str, str | None]]]) -> None:
        for work in state.works:
            for message, hint in problems.get(work.name, ()):
                self.result.error("target", work.name, message, hint)
                work.failed = True

    def _check_identities(self, state: StoragePass) -> None:
        """Stage: refuse every volume that would move a namespace's identity or export
        storage twice; the live namespace (if any) is kept in its place."""
        exported: dict[tuple[object, ...], tuple[str, int]] = {}
        for sub in state.live.subsystems.values():
            for ns in sub.namespaces.values():
                if ns.device_path:
                    exported[self._storage_key(ns.device_path)] = (sub.nqn, ns.nsid)
        for work in state.alive():
            for vol in work.plan.volumes:
                nqn = state.ctx.nqn(work.name, vol.host)
                sub = state.live.subsystems.get(nqn)
                live_ns = sub.namespaces.get(vol.nsid) if sub else None
                reason = self._refusal(state.ctx, work.pool, vol, nqn, live_ns, exported)
                if reason is None:
                    continue
                work.refused[vol.key] = live_ns
                self.result.error("target", work.name, *reason)

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

    def _run_steps(self, state: StoragePass) -> None:
        """Stage: each pool's backing steps (apply), or reported as planned (dry run). A
        step that fails fails its pool alone, and that pool's later steps are not run."""
        for work in state.alive():
            for step in work.plan.steps:
                if work.skips(step.volume):
                    continue
                if self.dry_run:
                    self._act(step.pool, step.kind, step.subject, step.detail)
                    continue
                try:
                    with progress.working_on(work.name):
                        step.run()
                except Exception as exc:  # expected or not, it fails this pool alone
                    self._step_failed(work, step, exc)
                    break
                self._act(work.name, step.kind, step.subject, step.detail, "done")

    def _step_failed(self, work: PoolWork, step: Step, exc: Exception) -> None:
        expected = isinstance(exc, (KvagentError, OSError))
        message = str(exc) if expected else f"unexpected error: {type(exc).__name__}: {exc}"
        self._act(work.name, step.kind, step.subject, step.detail, "failed", message)
        if expected:
            self.result.error("target", work.name, f"{step.kind} {step.subject}: {message}")
        else:
            log.error("unexpected error in a step", pool=work.name, step=step.kind,
                      exc_info=exc)
            self.result.unexpected("target", work.name, exc, f"{step.kind} {step.subject}: ")
        work.failed = True

    def _build_desired(self, state: StoragePass) -> None:
        """Stage: the desired nvmet tree. A failed pool keeps exactly its live objects
        (it degrades alone); every other exports its volumes, and the refused namespaces
        as they are live."""
        cfg, live = self.cfg, state.live
        subsystems: dict[str, Subsystem] = {}
        links: dict[int, set[str]] = {}
        # Model and serial may be fixed only on subsystems a host could have identified.
        fixed_nqns = frozenset(n for port in live.ports.values() for n in port.subsystems)
        for work in state.works:
            pool = work.pool
            if work.failed:
                for nqn, sub in live.subsystems.items():
                    if self._pool_of(nqn) == pool.name:
                        subsystems[nqn] = sub
                        for pid, port in live.ports.items():
                            if nqn in port.subsystems:
                                links.setdefault(pid, set()).add(nqn)
                continue
            keep = {k: ns for k, ns in work.refused.items() if ns is not None}
            hosts = driver_for(pool).layout(pool, state.records).keys()
            export = export_pool(cfg, pool, hosts, work.volumes(), fixed_nqns, keep)
            if pool.allow_any_host and export.subsystems:
                log.warning("pool lets any host connect (allow_any_host)", pool=pool.name)
            for sub in export.subsystems:
                subsystems[sub.nqn] = sub
                for pid in export.ports:
                    links.setdefault(pid, set()).add(sub.nqn)
        ports = self._desired_ports(state, links)
        hosts = {h for sub in subsystems.values() for h in sub.allowed_hosts}
        state.desired = Tree(hosts=desired_hosts(hosts, state.host_attrs),
                             subsystems=list(subsystems.values()), ports=list(ports.values()))
        state.port_ids = set(ports)

    def _desired_ports(self, state: StoragePass, links: dict[int, set[str]]) -> dict[int, Port]:
        """The configured ports kvagent may have (never one it did not create), linking
        ``links``; a port no longer configured stays while a failed pool is linked to it."""
        live, records = state.live, state.records
        ports: dict[int, Port] = {}
        for pc in self.cfg.target.ports if self.cfg.target else ():
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
        # Links of errored pools on ports no longer configured stay as they are.
        for pid, nqns in links.items():
            if pid not in ports and pid in live.ports and pid in records.ports:
                old = live.ports[pid]
                ports[pid] = Port(id=pid, addr=old.addr, params=old.params,
                                  subsystems=frozenset(nqns))
        return ports

    def _refer_peers(self, state: StoragePass) -> None:
        """Stage: each configured port of the desired tree refers GPU hosts to every peer
        (:mod:`agent.target.referrals`); referrals kvagent did not make stay as they are."""
        peers = referred_peers(self.cfg)
        configured = {pc.id for pc in self.cfg.target.ports} if self.cfg.target else set()
        ports = []
        for port in state.desired.ports.values():
            refs, taken = (port_referrals(port.id, peers, state.live.ports.get(port.id),
                                          state.records.referrals)
                           if port.id in configured else (None, []))
            for name in taken:
                self.result.error(
                    "target", None,
                    f"nvmet port {port.id}: referral {name} exists and kvagent did not make "
                    "it; kvagent never changes a referral it did not make, so this port does "
                    f"not refer to peer {name.removeprefix(PREFIX)}",
                    f"remove ports/{port.id}/referrals/{name} yourself if nothing needs it, "
                    "or rename the peer in target.peers")
            ports.append(dataclasses.replace(port, referrals=refs) if refs is not None
                         else port)
        state.desired = dataclasses.replace(state.desired, ports=ports)

    def _plan_nvmet(self, state: StoragePass) -> list[Action] | None:
        """The nvmet actions from the live tree to the desired one, within kvagent's scope
        (its own subsystems, the ports and hosts it created); None: planning failed
        (reported)."""
        desired, records = state.desired, state.records
        state.scope = nvmet.Scope.owned(subsystem_prefix=self.prefix,
                                       port_ids=records.ports | state.port_ids,
                                       hosts=records.hosts | set(desired.hosts))
        revalidate = self._revalidate(state)
        state.spec = nvmet.read_spec(desired, state.feats)
        try:
            if state.have is not None and not state.have.covers(state.spec):
                # The desired tree mentions a file the first read left out: read just those.
                state.live = nvmet.read_more(self.fs, state.live, state.have, state.spec)
            return nvmet.plan(desired, state.live, state.scope, state.feats, revalidate)
        except (PlanError, NvmetError) as exc:
            self.result.error("target", None, exc.message, exc.hint)
            return None

    def _revalidate(self, state: StoragePass) -> list[tuple[str, int]]:
        """Namespaces whose volume grew: by a step now, or past the size nvmet last read
        (a pass killed between growing a volume and telling nvmet)."""
        grown = {s.grown for w in state.alive() for s in w.plan.steps
                 if s.grown and not w.skips(s.volume)}
        for work in state.alive():
            for vol in work.volumes():
                bound = state.records.bindings.get(
                    (pool_nqn(self.cfg, work.name, vol.host), vol.nsid))
                if vol.size and bound and bound.size is not None and bound.size < vol.size:
                    grown.add(vol.path)
        live = {(sub.nqn, nsid) for sub in state.live.subsystems.values()
                for nsid in sub.namespaces}
        return [(sub.nqn, ns.nsid) for sub in state.desired.subsystems.values()
                for ns in sub.namespaces.values()
                if ns.device_path in grown and (sub.nqn, ns.nsid) in live]

    # ------------------------------------------------------------------ apply
    def _apply(self, actions: list[Action], state: StoragePass) -> None:
        wait = self.cfg.target.address_wait if self.cfg.target else 0
        rounds: list[nvmet.ApplyResult] = []
        feats, desired, scope, spec = state.feats, state.desired, state.scope, state.spec
        assert feats is not None and scope is not None and spec is not None

        def one_round() -> nvmet.ApplyResult:
            todo = actions if not rounds else nvmet.plan(
                desired, nvmet.read(self.fs, spec=spec), scope, feats)
            res = nvmet.apply(todo, self.fs)
            rounds.append(res)
            return res

        def address_missing(res: nvmet.ApplyResult) -> bool:
            return any(isinstance(e, AddressNotAvailable) for e in res.errors)

        def before_sleep(retry: RetryCallState) -> None:
            res = retry.outcome.result() if retry.outcome else None
            ports = sorted({e.path.split("/")[1] for e in (res.errors if res else [])
                            if isinstance(e, AddressNotAvailable) and e.path})
            log.info("waiting for port addresses to appear", ports=ports,
                     waited=round(retry.seconds_since_start, 1), limit=wait)

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
    def _record_intent(self, state: StoragePass) -> None:
        """Before touching nvmet: the ports and hosts about to be created, the bindings.

        Recorded first, so that a kill between creating an object and recording it
        never leaves one that kvagent would then refuse as not its own.
        """
        records, live = state.records, state.live
        snapshot = records.snapshot()
        records.node, records.nqn_prefix = self.cfg.node.name, self.cfg.node.nqn_prefix
        records.ports |= {pid for pid in state.port_ids if pid not in live.ports}
        records.hosts |= {h for h in state.desired.hosts if h not in live.hosts}
        records.referrals |= _referrals(state.desired) - _referrals(live)
        for work in state.works:
            for vol in work.volumes():
                nqn = pool_nqn(self.cfg, work.name, vol.host)
                old = records.bindings.get((nqn, vol.nsid))
                # The storage by kind and path only: its description changes once it exists
                # (a new LV gets an LVM uuid), its identity (vol.uuid) does not.
                records.bindings[(nqn, vol.nsid)] = Binding(
                    nqn, vol.nsid, vol.uuid, vol.nguid, work.name, vol.host,
                    Storage(vol.storage.kind, vol.storage.path),
                    old.size if old is not None and _same_id(old.uuid, vol.uuid) else None)
        if records != snapshot or records.read_schema != SCHEMA:
            records.save(self.state_dir)

    def _record_outcome(self, state: StoragePass) -> None:
        """After apply: forget ports and hosts that are gone, and the bindings of namespaces
        the config no longer exports (their identity is free again); record the pools."""
        records = state.records
        if self.result.configfs_writes == 0:
            after = state.live  # nothing was written: no need to read the tree again
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
        records.referrals &= _referrals(after)
        wanted = {(nqn, nsid) for pool in state.pools
                  for nqn, nsids in pool_layout(self.cfg, pool, records).items()
                  for nsid in nsids}
        live_keys = {(sub.nqn, nsid) for sub in after.subsystems.values()
                     for nsid in sub.namespaces}
        for key in [k for k in records.bindings if k not in wanted and k not in live_keys]:
            del records.bindings[key]
        enabled = {(sub.nqn, nsid) for sub in after.subsystems.values()
                   for nsid, ns in sub.namespaces.items() if ns.enable}
        failed_paths = {a.subject for a in self.result.actions if a.status == "failed"}
        for work in state.works:
            for vol in work.volumes():
                key = (pool_nqn(self.cfg, work.name, vol.host), vol.nsid)
                bound = records.bindings.get(key)
                ns_path = f"subsystems/{key[0]}/namespaces/{key[1]}"
                if (bound is not None and vol.size is not None and bound.size != vol.size
                        and key in enabled
                        and not any(p.startswith(ns_path) for p in failed_paths)
                        and _same_id(bound.uuid, vol.uuid)):
                    records.bindings[key] = dataclasses.replace(bound, size=vol.size)
        for work in state.alive():
            records.pools[work.name] = driver_for(work.pool).record(work.pool)
        if records != snapshot:
            records.save(self.state_dir)


def _referrals(tree: Tree) -> set[tuple[int, str]]:
    """Every referral of ``tree`` whose name kvagent gives, as (port id, name)."""
    return {(pid, name) for pid, port in tree.ports.items() for name in port.referrals or {}
            if name.startswith(PREFIX)}


def _same_id(a: str, b: str) -> bool:
    return a == b or canonical("device_uuid", a) == canonical("device_uuid", b)


