"""The GPU-host pass of plan/apply: connect, find, filesystem, mount.

Per pool: discover (or use the configured subsystem; a per-host subsystem the
storage host offers this host NQN under another host name is attached with a
warning), connect idempotently, keep the controllers' timeouts (fast_io_fail_tmo:
:mod:`.timeouts`), wait for a live controller, wait for each namespace's device (by
subsystem and nsid; its uuid is the storage's identity), make xfs only on a blank
device (or accept this host's own: its uuid derives from the namespace's), mount one
directory per namespace, named by storage node and nsid (:mod:`.mountnames`), or one
striped volume; a mounted xfs that shut down in an outage is mounted again, one
whose namespace grew is grown (:mod:`.xfsmount`). Handing the mounted pool to its
engines is the next step (:mod:`agent.engines.handoff`), run by the caller.

kvagent's record of what it attached (:class:`agent.records.PoolAttachment` in
``<state_dir>/initiator.json``) is written even when an attach fails half-way, so
a later detach still finds the controllers it connected. Pools removed from the
config are detached: unmounted (never lazily; only filesystems on the pool's own
devices) and disconnected (only this host identity's controllers of the recorded
subsystems); mount directories kvagent created are removed when empty.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nvmet.ids import read_host_identity

from .. import progress
from ..config.model import XFS_MIN_BYTES, Config, InitiatorPool
from ..dhchap import read_secret
from ..errors import KvagentError
from ..fabrics import FabricsAddress
from ..log import get_logger
from ..naming import filesystem_uuid, parse_subsystem_nqn
from ..records import AttachedDevice, InitiatorRecords, PoolAttachment, SubsystemPath
from ..result import ActionRecord, RunResult
from ..system.keyring import DISCOVERY_NQN, TLSHD_HINT, PskKeyring, tlshd_running
from ..system.modules import ensure_modules
from ..system.mountusers import MountUser, mount_users
from ..system.run import Runner
from ..system.xfsquota import project_quota_mode, wants_project_quota, with_project_quota
from ..tlspsk import read_psk
from .connect import (
    ConnectResult,
    Target,
    connect,
    disconnect_controllers,
    find_controllers,
    pool_entries,
    replacement_reason,
    stale_secrets,
)
from .devices import NamespaceDevice, wait_for_namespaces
from .filesystem import (
    XfsSuperblock,
    ensure_filesystem,
    needs_filesystem,
    probe_content,
    read_xfs_superblock,
    xfs_label,
)
from .identity import ensure_host_identity
from .iopolicy import ensure_iopolicy
from .kernel_quirks import loopback_tcp_warning, thp_mode
from .mountnames import assign_mounts
from .mounts import (
    MOUNTINFO,
    QUOTACHECK_TIMEOUT,
    MountBusy,
    MountEntry,
    create_mount_point,
    device_number,
    ensure_mounted,
    missing_dirs,
    mounted_at,
    remove_mount_points,
    unmount,
)
from .nvme.cli import NvmeCli
from .nvme.failures import ConnectError
from .nvme.options import FabricsOptions
from .striped import deactivate, dm_name, ensure_striped_volume, volume_path, volume_slaves
from .sysfs import Controller, NamespaceHead, Sysfs, read_attr
from .timeouts import Timeouts, drift, fix, unsupported
from .xfsmount import Geometry, geometry, grow, is_shut_down, needs_growth

log = get_logger("initiator")
#: What this pass did to a mount that makes the recorded probes (and the engines'
#: capacity caps, sized from them) stale: the engines' hand-off probes again.
REMOUNT_KINDS = frozenset({"mkfs.xfs", "mount", "lvm.striped", "xfs.grow", "xfs.recover"})


@dataclass(frozen=True)
class HostSeams:
    """The GPU host's external effects that are not commands (tests replace them)."""

    mountinfo: Path = MOUNTINFO
    devnum: Callable[[str], str] = device_number
    exists: Callable[[str], bool] = os.path.exists
    superblock: Callable[[str], XfsSuperblock | None] = read_xfs_superblock
    volume_slaves: Callable[[str], frozenset[str] | None] = volume_slaves
    sleep: Callable[[float], None] = progress.sleep  # ends early on SIGTERM
    clock: Callable[[], float] = time.monotonic
    wallclock: Callable[[], float] = time.time
    shut_down: Callable[[str], bool] = is_shut_down
    geometry: Callable[[str], Geometry] = geometry
    users: Callable[[str], list[MountUser]] = mount_users


class Volume(NamedTuple):
    """A block device of a pool that gets an xfs, and the directory it is mounted on."""

    device: str
    fs_uuid: str
    mount: str
    index: int  # its xfs label's number
    size: int | None  # the namespace's bytes (None: a striped volume, never grown)


@dataclass(frozen=True)
class MountedPool:
    """A pool this pass attached and mounted: what the engines' hand-off needs."""

    pool: InitiatorPool
    mounts: tuple[str, ...]
    transport: str | None
    remounted: bool  # something was made or (re)mounted in this pass


def with_secrets(options: FabricsOptions, pool: InitiatorPool) -> FabricsOptions:
    """``options`` with the DH-HMAC-CHAP secrets of ``pool.auth`` (read from their files
    on every pass: a rotated file is given to live controllers)."""
    if pool.auth is None:
        return options
    ctrl = pool.auth.ctrl_key_file
    return dataclasses.replace(
        options, dhchap_secret=read_secret(pool.auth.key_file).text,
        dhchap_ctrl_secret=read_secret(ctrl).text if ctrl else None)


def load_state(state_dir: Path) -> dict[str, PoolAttachment]:
    """Every pool an apply attached (fully or in part), from ``initiator.json``."""
    return InitiatorRecords.load(state_dir)


def save_state(state_dir: Path, pools: dict[str, PoolAttachment]) -> None:
    InitiatorRecords.save(state_dir, pools)


def _union(*lists: list) -> list:
    """The items of ``lists`` in order, each once (they are hashable records and paths)."""
    return list(dict.fromkeys(item for items in lists for item in items))


def merge_record(old: PoolAttachment | None, new: PoolAttachment) -> PoolAttachment:
    """The record after an attach: ``new`` when it completed, else old and new together.

    A failed attach may have connected or mounted part of the pool; keeping the
    union means a later detach still undoes all of it.
    """
    if old is None:
        return new
    merged = dataclasses.replace(new, created_dirs=_union(old.created_dirs, new.created_dirs))
    if not new.complete:
        merged.subsystems = _union(old.subsystems, new.subsystems)
        merged.devices = _union(old.devices, new.devices)
        merged.mounts = _union(old.mounts, new.mounts)
        if dataclasses.replace(merged, complete=old.complete) == old:
            return old  # a re-attach that has found nothing new so far: the record stands
    return merged


class InitiatorPass:
    """One reconcile of the GPU-host role."""

    def __init__(self, cfg: Config, runner: Runner, result: RunResult, *,
                 dry_run: bool = False, sysfs: Sysfs | None = None,
                 cli: NvmeCli | None = None, seams: HostSeams | None = None):
        self.cfg, self.runner, self.result, self.dry_run = cfg, runner, result, dry_run
        self.sysfs = sysfs or Sysfs(cfg.node.sysfs)
        self.cli = cli or NvmeCli(runner)
        self.seams = seams or HostSeams()
        self.state_dir = Path(cfg.node.state_dir)
        self._checkpoint: Callable[[], None] = lambda: None

    def _act(self, pool: str | None, kind: str, subject: str, detail: str = "",
             status: str | None = None) -> None:
        self.result.actions.append(ActionRecord(
            "initiator", pool, kind, subject, detail,
            status or ("planned" if self.dry_run else "done")))

    def _fail(self, pool: str | None, exc: Exception) -> None:
        if isinstance(exc, KvagentError):
            self.result.error("initiator", pool, exc.message, exc.hint)
        elif isinstance(exc, OSError):
            self.result.error("initiator", pool, f"{type(exc).__name__}: {exc}")
        else:  # a bug or an unforeseen error: this pool fails alone
            log.error("unexpected error", pool=pool, exc_info=exc)
            self.result.unexpected("initiator", pool, exc)

    def run(self) -> list[MountedPool]:
        """Detach the pools the config dropped, then attach the configured ones."""
        self.detach_removed()
        return self.attach_configured()

    def detach_removed(self) -> list[str]:
        """Unmount and disconnect every pool an earlier apply attached that the config dropped.

        Runs before the target pass: on a host that is both roles, unexporting first would
        leave a mounted filesystem on a controller retrying forever, and umount would hang.
        Returns the pools detached.
        """
        state = load_state(self.state_dir)
        configured = {p.name for p in self.cfg.initiator.pools} if self.cfg.initiator else set()
        detached = []
        for name in sorted(set(state) - configured):
            try:
                self._detach(name, state[name])
            except Exception as exc:  # expected or not, it fails this pool alone
                self._fail(name, exc)
                continue
            detached.append(name)
            if not self.dry_run:
                del state[name]
                save_state(self.state_dir, state)
        return detached

    def attach_configured(self) -> list[MountedPool]:
        """Connect, find, format (blank devices only) and mount every pool.

        Returns the pools attached and mounted in full (apply only), for the engines'
        hand-off.
        """
        pools = list(self.cfg.initiator.pools) if self.cfg.initiator else []
        if not pools:
            return []
        state = load_state(self.state_dir)
        if self.dry_run:
            ident = read_host_identity(self.cfg.node.nvme_dir)
            if not ident.hostnqn or not ident.hostid:
                self._act(None, "identity.create", self.cfg.node.nvme_dir)
            hostnqn, hostid = ident.hostnqn or "(to be created)", ident.hostid
        else:
            try:
                ident = ensure_host_identity(self.cfg.node.nvme_dir)
            except KvagentError as exc:
                self.result.error("initiator", None, exc.message, exc.hint)
                return []
            for path in ident.created:
                self._act(None, "identity.create", path)
            hostnqn, hostid = ident.hostnqn, ident.hostid
            self._load_modules(pools)
        mounted: list[MountedPool] = []
        for pool in pools:
            box: list[PoolAttachment] = []
            old = state.get(pool.name)

            def checkpoint(name: str = pool.name, old: PoolAttachment | None = old,
                           box: list[PoolAttachment] = box) -> None:
                """Record what this attach has done (or is about to do) so far."""
                if self.dry_run or not box:
                    return
                merged = merge_record(old, box[0])
                if not merged.subsystems:  # nothing connected, nothing to undo later
                    if state.pop(name, None) is not None:
                        save_state(self.state_dir, state)
                elif state.get(name) != merged:
                    state[name] = copy.deepcopy(merged)
                    save_state(self.state_dir, state)

            self._checkpoint = checkpoint
            try:
                done = self._attach(pool, hostnqn, hostid, box, old)
                if done is not None:
                    mounted.append(done)
            except Exception as exc:  # one pool's failure, expected or not, is its own
                self._fail(pool.name, exc)
            finally:
                checkpoint()
        return mounted

    def _load_modules(self, pools: list[InitiatorPool]) -> None:
        transports = sorted({t.transport for p in pools for t in p.targets})
        ensure_modules(["nvme-fabrics", *(f"nvme-{t}" for t in transports)], self.runner,
                       self.cfg.node.sysfs)

    # ------------------------------------------------------------------ attach
    def _discover(self, pool: InitiatorPool, hostnqn: str,
                  hostid: str | None) -> list[SubsystemPath]:
        """The pool's subsystems, each at the target it was configured or discovered at."""
        found: list[SubsystemPath] = []
        for t in pool.targets:
            address = FabricsAddress.from_config(t)
            if t.subsystem:
                found.append(SubsystemPath(t.subsystem, address))
                continue
            if pool.tls is not None:
                self._tls_psk(pool, hostnqn, DISCOVERY_NQN)
            entries = self.cli.discover(t.transport, t.address, str(t.service),
                                        hostnqn=hostnqn, hostid=hostid,
                                        tls=pool.tls is not None)
            # The log lists only what the storage host's ACL lets this host NQN use: a
            # per-host subsystem there is this host's, whatever name it carries.
            mine = pool_entries(entries, self.cfg.node.nqn_prefix, pool.name)
            if not mine:
                raise KvagentError(
                    f"the storage host at {address.describe()} offers no "
                    f"subsystem of pool {pool.name!r} to this host ({hostnqn})",
                    f"list this host (name {self.cfg.node.name}, NQN {hostnqn}) in the pool's "
                    "hosts on the storage host and apply there; check node.nqn_prefix matches")
            for e in sorted(mine, key=lambda e: e.subnqn):
                self._check_host_name(pool, e.subnqn, hostnqn)
                found.append(SubsystemPath(e.subnqn, address))
        return found

    def _check_host_name(self, pool: InitiatorPool, subsysnqn: str, hostnqn: str) -> None:
        """A per-host subsystem named for another host than ``node.name``: attached (the
        storage host admits this NQN to it), with a warning."""
        parsed = parse_subsystem_nqn(self.cfg.node.nqn_prefix, subsysnqn)
        if parsed is None or parsed[2] is None or parsed[2] == self.cfg.node.name:
            return
        message = (f"{subsysnqn} is named for host {parsed[2]!r}, but this host's node.name "
                   f"is {self.cfg.node.name!r}: attached by this host's NQN ({hostnqn}), "
                   "which the storage host admits to it; rename the pool's host entry on "
                   f"storage node {parsed[0]!r} or set node.name here to match")
        log.warning(message, pool=pool.name)
        self.result.warn("initiator", pool.name, message)

    def _tls_psk(self, pool: InitiatorPool, hostnqn: str, subsysnqn: str) -> None:
        """The pool's TLS PSK in the ``.nvme`` keyring for ``subsysnqn`` (inserted where
        missing or rotated); tlshd must run for the handshake."""
        assert pool.tls is not None
        if not tlshd_running():
            raise KvagentError(f"pool {pool.name} connects with TLS, but tlshd (the TLS "
                               "handshake daemon) is not running", TLSHD_HINT)
        psk = read_psk(pool.tls.key_file)
        keyring = PskKeyring(self.runner, self.cfg.node.state_dir)
        if keyring.missing(psk, hostnqn, subsysnqn):
            if not self.dry_run:
                keyring.insert(psk, hostnqn, subsysnqn)
            self._act(pool.name, "tls-psk", f"{hostnqn} {subsysnqn}",
                      f"TLS PSK {psk.fingerprint} into the .nvme keyring")

    def _check_shared(self, pool: InitiatorPool, paths: list[SubsystemPath]) -> None:
        for a in paths:
            parsed = parse_subsystem_nqn(self.cfg.node.nqn_prefix, a.subsysnqn)
            if parsed is not None and parsed[2] is None and not pool.shared:
                raise KvagentError(
                    f"{a.subsysnqn} is a shared subsystem (several hosts use it): kvagent "
                    "never puts a filesystem on it, since two hosts mounting one filesystem "
                    "destroy it",
                    "set shared: true on this initiator pool to attach it as raw block devices")

    def _attach(self, pool: InitiatorPool, hostnqn: str, hostid: str | None,
                box: list[PoolAttachment], old: PoolAttachment | None) -> MountedPool | None:
        """Attach ``pool``: connect, find its namespaces, make their filesystems (blank
        devices only) and mount them. Its record (put in ``box``) is filled as things are
        done and kept even on failure."""
        try:
            paths = self._discover(pool, hostnqn, hostid)
        except KvagentError as exc:
            if not self.dry_run:
                raise
            # Planning: the target may only come up with this very apply (converged host).
            self._act(pool.name, "nvme.connect", pool.name,
                      f"after discovery; not possible to check now: {exc.message}")
            return None
        self._check_shared(pool, paths)
        thp = thp_mode()
        for a in paths:
            warning = loopback_tcp_warning(a.address.transport, a.address.traddr, thp)
            if warning:
                log.warning(warning, pool=pool.name)
        record = PoolAttachment(hostnqn, pool.layout, pool.shared,
                                recoveries=list(old.recoveries) if old is not None else [])
        box.append(record)
        connected = self._connect(pool, paths, hostnqn, hostid, record)
        if connected is None:
            return None  # planning: what follows needs the connect first
        devices = self._find(pool, connected, record, old)
        mounted = None
        if not pool.shared:
            volumes = self._volumes(pool, hostnqn, devices, record)
            for volume in volumes:
                self._filesystem(pool, volume)
                self._mount(pool, volume, record)
            if not self.dry_run:
                remounted = any(
                    a.pool == pool.name and a.status == "done" and a.kind in REMOUNT_KINDS
                    for a in self.result.actions)
                mounted = MountedPool(pool, tuple(v.mount for v in volumes),
                                      paths[0].address.transport, remounted)
        if old is not None:
            self._drop_stale(pool.name, old, record)
        record.complete = True
        return mounted

    def _connect(self, pool: InitiatorPool, paths: list[SubsystemPath], hostnqn: str,
                 hostid: str | None, record: PoolAttachment
                 ) -> dict[str, list[Controller]] | None:
        """Connect every path of the pool (each recorded first) and keep the controllers'
        timeouts and the pool's I/O policy: the controllers of each subsystem reached.
        A path that fails is the pool's error when another reaches its subsystem, else the
        attach's. Planning returns None at the first path not connected yet."""
        options = dataclasses.replace(
            with_secrets(FabricsOptions.from_config(pool.connect), pool),
            tls=pool.tls is not None)
        timeouts = Timeouts.from_options(options)
        connected: dict[str, list[Controller]] = {}
        path_errors: list[tuple[str, ConnectError]] = []
        for a in paths:
            target = Target(a.address.with_host(pool.connect.host_iface,
                                                pool.connect.host_traddr),
                            a.subsysnqn, hostnqn, hostid, options)
            if self.dry_run and not find_controllers(target, self.sysfs):
                self._act(pool.name, "nvme.connect", a.subsysnqn, a.address.describe())
                self._act(pool.name, "attach", pool.mount,
                          "find namespaces, make xfs if blank, mount, probe, engines")
                return None
            if pool.tls is not None:
                self._tls_psk(pool, hostnqn, a.subsysnqn)
            # Recorded before connecting: a kill right after the connect must not leave a
            # controller that a later detach cannot find.
            record.subsystems.append(a)
            self._checkpoint()
            try:
                res = (self._planned_refresh(pool.name, target) if self.dry_run else
                       connect(target, cli=self.cli, sysfs=self.sysfs, sleep=self.seams.sleep,
                               clock=self.seams.clock))
            except ConnectError as exc:
                # Nothing connected on this path; another path to the same subsystem (target
                # address) may still work.
                record.subsystems.remove(a)
                path_errors.append((a.subsysnqn, exc))
                continue
            connected.setdefault(a.subsysnqn, []).extend(res.controllers)
            for refusal in res.refused:
                self.result.error("initiator", pool.name, refusal.message, refusal.hint)
            for r in res.replaced:
                self._act(pool.name, r.reason.kind, r.old, r.describe())
            if res.changed:
                self._act(pool.name, "nvme.connect", a.subsysnqn, a.address.describe())
            self._keep_timeouts(pool, res.controllers, timeouts)
        for nqn, exc in path_errors:
            if nqn not in connected:
                raise exc
        for _, exc in path_errors:  # degraded: the subsystem is reached by another path
            self.result.error("initiator", pool.name, exc.message, exc.hint)
        if pool.iopolicy is not None:
            self._iopolicy(pool, pool.iopolicy, list(connected))
        return connected

    def _planned_refresh(self, pool: str, target: Target) -> ConnectResult:
        """Planning: the target's controllers; each one to replace (TLS state, both
        DH-HMAC-CHAP secrets) and each new secret an action."""
        existing = find_controllers(target, self.sysfs)
        for ctrl in existing:
            reason = replacement_reason(target, ctrl, self.sysfs)
            if reason is not None:
                self._act(pool, reason.kind, ctrl.name, f"{reason.what}: {reason.brings}, "
                          "then this one disconnected")
            elif stale_secrets(target, ctrl, self.sysfs):
                self._act(pool, "nvme.auth", ctrl.name,
                          "new DH-HMAC-CHAP secret: re-authenticate")
        return ConnectResult(tuple(existing), changed=False)

    def _find(self, pool: InitiatorPool, connected: dict[str, list[Controller]],
              record: PoolAttachment, old: PoolAttachment | None) -> list[NamespaceDevice]:
        """Each connected subsystem's namespaces, once a controller is live and their block
        devices are there (recorded, each with the directory it is mounted on)."""
        wait = self.cfg.initiator.device_wait if self.cfg.initiator else 30.0
        devices: list[NamespaceDevice] = []
        for nqn, controllers in connected.items():
            ctrl = self._live_controller(nqn, controllers, wait)
            # list-ns, and what sysfs has already (nvme-cli 2.3 was seen leaving out a
            # namespace the kernel had added after the connect).
            heads: dict[int, NamespaceHead] = {}
            nsids = self._known_nsids(nqn, old, heads) or sorted(
                {*self.cli.list_ns(ctrl.name), *self.sysfs.subsystem_namespaces(nqn)})
            if not nsids:
                raise KvagentError(f"{nqn} has no namespaces for this host",
                                   "check the pool on the storage host (kvagent status there)")
            with progress.step(f"waiting for the namespaces of {nqn}", wait):
                found = wait_for_namespaces(self.sysfs, nqn, nsids, timeout=wait,
                                            heads=heads or None)
            record.devices += [AttachedDevice(d.subsysnqn, d.nsid, d.uuid, d.device)
                               for d in found]
            devices += found
        if not pool.shared and pool.layout == "per-namespace":
            mounts = assign_mounts(pool.mount, self.cfg.node.nqn_prefix, devices, old,
                                   self._mounted_on(old))
            record.devices = [dataclasses.replace(a, mount=m)
                              for a, m in zip(record.devices, mounts, strict=True)]
        self._checkpoint()
        return devices

    def _iopolicy(self, pool: InitiatorPool, policy: str, nqns: list[str]) -> None:
        """The pool's multipath I/O policy on each of its subsystems (sysfs: read, compare,
        write only when different); a refusal is the pool's error, and the attach goes on
        with the kernel's policy."""
        for nqn in nqns:
            try:
                changes = ensure_iopolicy(self.sysfs, pool.name, nqn, policy,
                                          dry_run=self.dry_run)
            except KvagentError as exc:
                self.result.error("initiator", pool.name, exc.message, exc.hint)
                continue
            for c in changes:
                self._act(pool.name, "iopolicy", c.subsystem, f"{c.old} -> {c.new}")

    def _keep_timeouts(self, pool: InitiatorPool, controllers: tuple[Controller, ...],
                       want: Timeouts) -> None:
        """Give the pool's controllers its timeouts where theirs differ (a new controller:
        fast_io_fail_tmo, which nvme connect cannot set; drift on an existing one)."""
        for ctrl in dict.fromkeys(controllers):
            drifts = drift(ctrl, want)
            missing = unsupported(drifts)
            for d in missing:
                self.result.warn("initiator", pool.name,
                                 f"controller {ctrl.name} has no {d.attr} attribute (a kernel "
                                 f"without it): {d.attr} {d.expected} is not in effect")
            drifts = [d for d in drifts if d not in missing]
            if not drifts:
                continue
            if not self.dry_run:
                fix(self.sysfs, drifts)
            for d in drifts:
                log.info("controller timeout set", pool=pool.name, controller=ctrl.name,
                         attribute=d.attr, old=d.current, new=d.expected)
            self._act(pool.name, "nvme.timeout", ctrl.name,
                      ", ".join(d.describe() for d in drifts))

    def _known_nsids(self, nqn: str, old: PoolAttachment | None,
                     seen: dict[int, NamespaceHead] | None = None) -> list[int]:
        """The namespaces of ``nqn`` from sysfs, when sysfs already answers: the pool was
        attached in full before and every namespace recorded then still has its block
        device with the same identity (``[]`` otherwise: ``nvme list-ns`` asks the
        controller). Namespaces the kernel added since are included. ``seen`` gets what
        sysfs showed (the first look of the wait for the namespaces that follows)."""
        if old is None or not old.complete:
            return []
        recorded = {d.nsid: d.uuid.lower() for d in old.devices if d.subsysnqn == nqn}
        if not recorded:
            return []
        heads = self.sysfs.subsystem_namespaces(nqn)
        if seen is not None:
            seen.update(heads)
        if any((heads[n].uuid or "").lower() != u if n in heads else True
               for n, u in recorded.items()):
            return []
        return sorted(heads)

    def _live_controller(self, nqn: str, controllers: list[Controller],
                         wait: float) -> Controller:
        """A live controller among ``controllers``, waiting up to ``wait`` s for a reconnect."""
        with progress.step(f"waiting for a live controller of {nqn}", wait):
            return self._wait_live(nqn, controllers, wait)

    def _wait_live(self, nqn: str, controllers: list[Controller], wait: float) -> Controller:
        deadline = self.seams.clock() + wait
        names = list(dict.fromkeys(c.name for c in controllers))
        current = controllers  # read from sysfs by the connect step just now
        while True:
            live = [c for c in current if c.state == "live"]
            if live:
                return live[0]
            if self.seams.clock() >= deadline:
                states = ", ".join(f"{c.name} {c.state} ({c.address.transport} "
                                   f"{c.address.traddr})"
                                   for c in current) or "gone"
                raise KvagentError(
                    f"no live controller for {nqn} after {wait:g}s: {states}",
                    "the storage host is unreachable or its port is down; the kernel keeps "
                    "reconnecting (I/O waits meanwhile); apply again once it is back")
            self.seams.sleep(0.2)
            current = [c for n in names if (c := self.sysfs.controller(n)) is not None]

    def _volumes(self, pool: InitiatorPool, hostnqn: str, devices: list[NamespaceDevice],
                 record: PoolAttachment) -> list[Volume]:
        """What gets a filesystem and where it is mounted: each namespace on its recorded
        directory, or the striped volume (made here) on the pool's mount. The mounts are
        recorded first."""
        if pool.layout == "striped":
            total = sum(d.size_bytes or 0 for d in devices)
            uuids = ",".join(sorted(d.uuid for d in devices))
            fs_uuid = str(filesystem_uuid(hostnqn, f"striped:{pool.name}:{uuids}"))
            self._check_size(pool, "the striped volume", total)
            record.mounts = [pool.mount]
            self._checkpoint()
            return [Volume(self._striped(pool, devices), fs_uuid, pool.mount, 1, None)]
        for d in devices:
            self._check_size(pool, f"{d.device} (nsid {d.nsid})", d.size_bytes)
        where = {(a.subsysnqn, a.nsid): a.mount for a in record.devices}
        mounts = [str(where[(d.subsysnqn, d.nsid)]) for d in devices]
        record.mounts = list(mounts)
        self._checkpoint()
        return [Volume(d.device, str(filesystem_uuid(hostnqn, d.uuid)), m, i, d.size_bytes)
                for i, (d, m) in enumerate(zip(devices, mounts, strict=True), 1)]

    def _filesystem(self, pool: InitiatorPool, v: Volume) -> None:
        """xfs on a blank device (a device with this host's own xfs is kept as it is)."""
        if self.dry_run:
            fresh = pool.layout == "striped" and not self.seams.exists(v.device)
            if fresh or needs_filesystem(probe_content(v.device, self.runner,
                                                       exists=self.seams.exists), v.fs_uuid):
                self._act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")
            return
        if ensure_filesystem(v.device, v.fs_uuid, xfs_label(pool.name, v.index), self.runner,
                             superblock=self.seams.superblock, exists=self.seams.exists):
            self._act(pool.name, "mkfs.xfs", v.device, f"uuid {v.fs_uuid}")

    def _mount(self, pool: InitiatorPool, v: Volume, record: PoolAttachment) -> None:
        """``v`` mounted on its directory (made and recorded when missing); a mounted one
        recovered or grown where needed (:meth:`_mounted`)."""
        if self.dry_run:
            if mounted_at(v.mount, self.seams.mountinfo) is None:
                self._act(pool.name, "mount", v.mount, v.device)
            else:
                self._mounted(pool, v.device, v.mount, v.size, record)
            return
        if mounted_at(v.mount, self.seams.mountinfo) is None:
            missing = missing_dirs(v.mount)
            if missing:
                record.created_dirs += missing  # recorded before they are made
                self._checkpoint()
            create_mount_point(v.mount)
        options = with_project_quota(pool.mount_options)
        if ensure_mounted(v.device, v.mount, options, self.runner, self.seams.mountinfo,
                          self.seams.devnum, timeout=QUOTACHECK_TIMEOUT
                          if wants_project_quota(options) else 120):
            self._act(pool.name, "mount", v.mount, v.device)
        self._mounted(pool, v.device, v.mount, v.size, record)

    def _remount_for_quota(self, pool: InitiatorPool, device: str, mount: str) -> None:
        """A pool mounted without project quotas (by an older kvagent) is unmounted and
        mounted again with them: xfs turns quota accounting on only at mount time.
        Never lazily: while anything holds the mount it is left as it is (logged; health
        reports the caps advisory) and the next pass tries again."""
        options = with_project_quota(pool.mount_options)
        entry = mounted_at(mount, self.seams.mountinfo)
        if entry is None or not wants_project_quota(options) or \
                project_quota_mode(entry) != "off":
            return
        detail = f"{device} again with {','.join(options)} (project quotas: hard engine caps)"
        if self.dry_run:
            self._act(pool.name, "mount", mount, detail)
            return
        try:
            unmount(mount, self.runner, self.seams.mountinfo)
        except MountBusy as exc:
            log.warning("mounted without project quotas and busy: engine caps stay advisory "
                        "until nothing holds it", pool=pool.name, mount=mount)
            self._act(pool.name, "mount", mount, f"{detail}: {exc.message}", status="skipped")
            return
        self._act(pool.name, "umount", mount, "to mount it again with project quotas")
        ensure_mounted(device, mount, options, self.runner, self.seams.mountinfo,
                       self.seams.devnum, timeout=QUOTACHECK_TIMEOUT)
        self._act(pool.name, "mount", mount, detail)

    def _mounted_on(self, old: PoolAttachment | None) -> Callable[[NamespaceDevice], str | None]:
        """Which of the old record's mounts a device is mounted on now (for records from
        before devices named their mount)."""
        def find(d: NamespaceDevice) -> str | None:
            if old is None:
                return None
            try:
                number = self.seams.devnum(d.device)
            except OSError:
                return None
            for m in old.mounts:
                entry = mounted_at(m, self.seams.mountinfo)
                if entry is not None and entry.device == number:
                    return m
            return None
        return find

    def _mounted(self, pool: InitiatorPool, device: str, mount: str, size: int | None,
                 record: PoolAttachment) -> None:
        """A mounted pool filesystem: mounted again if it shut down in an outage (once a
        controller is live again: the caller made sure), grown if its namespace grew."""
        if self.seams.shut_down(mount):
            self._recover(pool, device, mount, record)
            if self.dry_run:
                return  # nothing more to ask of it until it is mounted again
        else:
            self._remount_for_quota(pool, device, mount)
        if size is None or pool.layout == "striped":
            return
        fs = self.seams.geometry(mount)
        if not needs_growth(size, fs):
            return
        if not self.dry_run:
            grow(mount, self.runner)
        self._act(pool.name, "xfs.grow", mount, f"{fs.data_bytes} -> {size} bytes ({device})")

    def _recover(self, pool: InitiatorPool, device: str, mount: str,
                 record: PoolAttachment) -> None:
        """Unmount (never lazily) and mount again an xfs that shut down: its log is
        replayed, the engines' directories and data fsynced before the outage are back."""
        log.warning("filesystem shut down after I/O errors; mounting it again", pool=pool.name,
                    mount=mount, device=device)
        if self.dry_run:
            self._act(pool.name, "xfs.recover", mount, f"{device}: unmount, mount (log "
                      "recovery)")
            return
        try:
            unmount(mount, self.runner, self.seams.mountinfo)
        except MountBusy:
            users = self.seams.users(mount)
            who = ", ".join(u.describe() for u in users) or "a process kvagent cannot see"
            raise KvagentError(
                f"the xfs on {mount} shut down after I/O errors (a storage outage) and cannot "
                f"be mounted again while it is in use: {who}",
                "every call on it fails with EIO until then; stop or restart what uses it "
                "(the engine recomputes meanwhile); kvagent mounts it again at its next pass, "
                "never lazily") from None
        options = with_project_quota(pool.mount_options)
        ensure_mounted(device, mount, options, self.runner, self.seams.mountinfo,
                       self.seams.devnum, timeout=QUOTACHECK_TIMEOUT
                       if wants_project_quota(options) else 120)
        record.recovered(mount, self.seams.wallclock())
        self._checkpoint()
        self._act(pool.name, "xfs.recover", mount, f"{device}: unmounted, mounted again "
                  "(log recovery)")

    @staticmethod
    def _check_size(pool: InitiatorPool, what: str, size: int | None) -> None:
        if size is not None and size < XFS_MIN_BYTES:
            raise KvagentError(
                f"pool {pool.name}: {what} has {size} bytes; xfs needs at least "
                f"{XFS_MIN_BYTES} bytes (300 MB)",
                "make the pool's namespaces bigger on the storage host (namespaces.size)")

    def _striped(self, pool: InitiatorPool, devices: list[NamespaceDevice]) -> str:
        if self.dry_run:
            return volume_path(pool.name)
        path, created = ensure_striped_volume(pool.name, [d.device for d in devices],
                                              self.runner, exists=self.seams.exists,
                                              slaves=self.seams.volume_slaves)
        if created:
            self._act(pool.name, "lvm.striped", path, f"{len(devices)} stripes")
        return path

    def _drop_stale(self, name: str, old: PoolAttachment, new: PoolAttachment) -> None:
        """Undo what an earlier attach did that the config no longer asks for."""
        stale_mounts = [m for m in old.mounts if m not in new.mounts]
        self._unmount_all(name, stale_mounts, old)
        keep = {s.subsysnqn for s in new.subsystems}
        stale = [s for s in old.subsystems if s.subsysnqn not in keep]
        self._disconnect_all(name, stale, old.hostnqn)

    # ------------------------------------------------------------------ detach
    def _detach(self, name: str, record: PoolAttachment) -> None:
        self._unmount_all(name, record.mounts, record)
        striped = record.layout == "striped"
        if striped and (self.dry_run or deactivate(name, self.runner)):
            self._act(name, "lvm.deactivate", volume_path(name))
        self._disconnect_all(name, record.subsystems, record.hostnqn)
        if self.dry_run:
            return
        removable = record.removable_dirs()
        for d in sorted(set(record.created_dirs) - set(removable)):
            log.warning("kept a recorded directory that is no mount of the pool",
                        pool=name, directory=d)
        removed = remove_mount_points(removable, self.seams.mountinfo)
        for d in removed:
            self._act(name, "rmdir", d, "mount directory kvagent created")

    def _unmount_all(self, name: str, mounts: list[str], record: PoolAttachment) -> None:
        for mount in reversed(mounts):
            entry = mounted_at(mount, self.seams.mountinfo)
            if entry is None:
                continue
            if not self._is_pool_mount(name, entry, record):
                raise KvagentError(
                    f"not unmounting {mount}: {entry.source} ({entry.fstype}) is mounted there, "
                    f"which is not a device of pool {name}",
                    "kvagent only unmounts what it mounted; unmount it yourself if it should go")
            self._check_reachable(name, mount, record)
            if self.dry_run or unmount(mount, self.runner, self.seams.mountinfo):
                self._act(name, "umount", mount)

    def _check_reachable(self, name: str, mount: str, record: PoolAttachment) -> None:
        """Refuse to unmount a pool none of whose controllers is live.

        Unmounting flushes the filesystem; with the storage host gone and the kernel
        still reconnecting (``ctrl_loss_tmo``), that I/O waits — umount would hang in
        the kernel, beyond any timeout. The pool is reported instead.
        """
        subs = {s.subsysnqn for s in record.subsystems}
        ctrls = [c for c in self.sysfs.controllers()
                 if c.subsysnqn in subs and c.hostnqn == record.hostnqn]
        if not ctrls or any(c.state == "live" for c in ctrls):
            return
        states = ", ".join(f"{c.name} {c.state}" for c in ctrls)
        raise KvagentError(
            f"not unmounting {mount} of pool {name}: no controller of the pool is live "
            f"({states}); unmounting would wait for storage that does not answer",
            "kvagent detaches once the storage host answers again; to give up on its data "
            "now, disconnect the pool's controllers (nvme disconnect -n NQN: pending I/O "
            "fails) and apply again")

    def _is_pool_mount(self, name: str, entry: MountEntry, record: PoolAttachment) -> bool:
        dev = Path(self.cfg.node.sysfs) / "dev/block" / entry.device
        uuid = read_attr(dev / "uuid")
        if uuid is not None and uuid.lower() in {d.uuid.lower() for d in record.devices}:
            return True
        if record.layout == "striped" and read_attr(dev / "dm/name") == dm_name(name):
            return True
        known = {d.device for d in record.devices} | {
            volume_path(name), f"/dev/mapper/{dm_name(name)}"}
        return entry.source in known

    def _disconnect_all(self, name: str, subsystems: list[SubsystemPath], hostnqn: str) -> None:
        for sub in subsystems:
            if self.dry_run:
                self._act(name, "nvme.disconnect", sub.subsysnqn)
                continue
            gone = disconnect_controllers(sub.subsysnqn, hostnqn, cli=self.cli,
                                          sysfs=self.sysfs)
            if gone:
                self._act(name, "nvme.disconnect", sub.subsysnqn, ", ".join(gone))
