"""The GPU-host pass of plan/apply: the stages of :mod:`agent.initiator.stages`, per pool.

Pools removed from the config are detached first (:mod:`.stages.detach`). Then each
pool to attach runs the stages in order — discover, connect, find, layout, filesystem,
mount (one volume at a time: its xfs, then its mount), hand-off — and a pool's failure,
expected or not, is its own. :meth:`InitiatorPass.attach` runs them for any set of
configured pools; the full pass gives it every one. Handing the mounted pools to their
engines is the caller's (:mod:`agent.engines.handoff`, run by :mod:`agent.reconcile`).

Subsystems recorded at a storage host whose discovery log cannot be read now (the
discover stage carries them forward) go into the new record as they were, with their
devices and mounts; they are neither connected, waited for nor dropped, and while one
is reached by no other path the pool is not handed to its engines in that pass (what
they use stays as it is).

kvagent's record of what it attached (:class:`agent.records.PoolAttachment` in
``<state_dir>/initiator.json``) is written even when an attach fails half-way, so
a later detach still finds the controllers it connected: each stage fills its part of
the record and checkpoints it before the side effect it records.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from pathlib import Path

from nvmet.ids import read_host_identity

from .. import progress
from ..config.model import Config, InitiatorPool
from ..errors import KvagentError
from ..log import get_logger
from ..records import InitiatorRecords, PoolAttachment, SubsystemPath
from ..result import RunResult
from ..system.modules import ensure_modules
from ..system.run import Runner
from .identity import ensure_host_identity
from .nvme.cli import NvmeCli
from .stages.connect import connect_pool
from .stages.context import HostSeams, StageContext
from .stages.detach import detach_pool, drop_stale
from .stages.discover import pool_paths
from .stages.filesystem import make_filesystem
from .stages.find import find_devices
from .stages.handoff import MountedPool, mounted_pool
from .stages.layout import pool_volumes
from .stages.mount import mount_volume
from .sysfs import Sysfs

log = get_logger("initiator")


def load_state(state_dir: Path) -> dict[str, PoolAttachment]:
    """Every pool an apply attached (fully or in part), from ``initiator.json``."""
    return InitiatorRecords.load(state_dir)


def save_state(state_dir: Path, pools: dict[str, PoolAttachment],
               texts: dict[str, tuple[PoolAttachment, str]] | None = None) -> None:
    """Write ``initiator.json`` (the records of every attached pool; ``texts``: see
    :meth:`InitiatorRecords.save`)."""
    InitiatorRecords.save(state_dir, pools, texts)


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
        merged.discovery = _union(old.discovery, new.discovery)
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
                 cli: NvmeCli | None = None, seams: HostSeams | None = None,
                 rediscover: bool = True, wait_reconnects: bool = True):
        self.cfg, self.result, self.dry_run = cfg, result, dry_run
        #: False: a pool whose record is complete takes the subsystems it found as its
        #: discovery (an attach pass for events that bring no new subsystem).
        self.rediscover = rediscover
        self.ctx = StageContext(cfg, runner, result, dry_run, sysfs or Sysfs(cfg.node.sysfs),
                                cli or NvmeCli(runner), seams or HostSeams(),
                                wait_reconnects=wait_reconnects)
        self.state_dir = Path(cfg.node.state_dir)
        #: each pool's record text as this pass last saved it (records are replaced,
        #: never changed, once in the state this pass saves)
        self._texts: dict[str, tuple[PoolAttachment, str]] = {}
        self._records: dict[str, PoolAttachment] | None = None

    def records(self) -> dict[str, PoolAttachment]:
        """Every pool's attachment record: read from ``initiator.json`` once per pass (the
        pass holds the apply lock, and every later change of it is this pass's own save,
        made to this same dict first)."""
        if self._records is None:
            self._records = load_state(self.state_dir)
        return self._records

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
        state = self.records()
        configured = {p.name for p in self.cfg.initiator.pools} if self.cfg.initiator else set()
        detached = []
        for name in sorted(set(state) - configured):
            try:
                with progress.working_on(name):
                    detach_pool(self.ctx, name, state[name])
            except Exception as exc:  # expected or not, it fails this pool alone
                self._fail(name, exc)
                continue
            detached.append(name)
            if not self.dry_run:
                del state[name]
                save_state(self.state_dir, state, self._texts)
        return detached

    def attach_configured(self) -> list[MountedPool]:
        """:meth:`attach` every configured pool."""
        return self.attach(self.cfg.initiator.pools if self.cfg.initiator else ())

    def attach(self, pools: Iterable[InitiatorPool]) -> list[MountedPool]:
        """Connect, find, format (blank devices only) and mount each of ``pools`` (pools
        of this config: all of them, or some, e.g. those a device event concerns).

        Returns the pools attached and mounted in full (apply only), for the engines'
        hand-off.
        """
        pools = list(pools)
        if not pools:
            return []
        state = self.records()
        if self.dry_run:
            ident = read_host_identity(self.cfg.node.nvme_dir)
            if not ident.hostnqn or not ident.hostid:
                self.ctx.act(None, "identity.create", self.cfg.node.nvme_dir)
            hostnqn, hostid = ident.hostnqn or "(to be created)", ident.hostid
        else:
            try:
                ident = ensure_host_identity(self.cfg.node.nvme_dir)
            except KvagentError as exc:
                self.result.error("initiator", None, exc.message, exc.hint)
                return []
            for path in ident.created:
                self.ctx.act(None, "identity.create", path)
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
                        save_state(self.state_dir, state, self._texts)
                elif state.get(name) != merged:
                    state[name] = copy.deepcopy(merged)
                    save_state(self.state_dir, state, self._texts)

            self.ctx.checkpoint = checkpoint
            try:
                with progress.working_on(pool.name):
                    done = self._attach(pool, hostnqn, hostid, box, old)
                if done is not None:
                    mounted.append(done)
            except Exception as exc:  # one pool's failure, expected or not, is its own
                self._fail(pool.name, exc)
            finally:
                checkpoint()
        return mounted

    def _load_modules(self, pools: list[InitiatorPool]) -> None:
        """The fabrics modules of the pools' targets and of the discovery ports their
        records found by referral."""
        state = self.records()
        transports = sorted({t.transport for p in pools for t in p.targets} | {
            a.transport for p in pools if p.name in state and p.referrals == "follow"
            for a in state[p.name].discovery})
        ensure_modules(["nvme-fabrics", *(f"nvme-{t}" for t in transports)], self.ctx.runner,
                       self.cfg.node.sysfs)

    def _attach(self, pool: InitiatorPool, hostnqn: str, hostid: str | None,
                box: list[PoolAttachment], old: PoolAttachment | None) -> MountedPool | None:
        """Attach ``pool``: the stages, in order. Its record (put in ``box``) is filled as
        things are done and kept even on failure."""
        ctx = self.ctx
        known = None if self.rediscover or old is None or not old.complete \
            else old.subsystems
        found = pool_paths(ctx, pool, hostnqn, hostid, known, old)
        if found is None:
            return None  # planning: discovery is not possible now
        record = PoolAttachment(hostnqn, pool.layout, pool.shared,
                                recoveries=list(old.recoveries) if old is not None else [],
                                discovery=list(found.referred))
        box.append(record)
        connected = connect_pool(ctx, pool, found.paths, hostnqn, hostid, record)
        if connected is None:
            return None  # planning: what follows needs the connect first
        devices = find_devices(ctx, pool, connected, record, old)
        volumes = None
        if not pool.shared:
            volumes = pool_volumes(ctx, pool, hostnqn, devices, record)
            for volume in volumes:
                make_filesystem(ctx, pool, volume)
                mount_volume(ctx, pool, volume, record)
        away = _carry(record, old, found.carried, set(connected)) if old is not None else set()
        mounted = None
        if away:
            # What the engines use stays as it is until every storage host answers.
            log.info("pool not handed to its engines now: some of its storage hosts are "
                     "not reached", pool=pool.name, subsystems=sorted(away))
        elif volumes is not None:
            mounted = mounted_pool(ctx, pool, volumes, found.paths)
        if old is not None:
            busy = drop_stale(ctx, pool.name, old, record, found.unread)
            for mount, users in busy.items():
                ctx.result.error(
                    "initiator", pool.name,
                    f"{mount} left pool {pool.name} (its storage host is draining or no "
                    "longer offers it) and is out of the engines' configs, but "
                    f"{', '.join(u.describe() for u in users)} still use it: kvagent "
                    "unmounts and disconnects it once nothing holds it",
                    "restart those engines (they take the pool's config as rendered now)")
        record.complete = True
        return mounted


def _carry(record: PoolAttachment, old: PoolAttachment, carried: list[SubsystemPath],
           reached: set[str]) -> set[str]:
    """Put the subsystems carried forward from ports not read this pass (and, for those
    no other path reached, their recorded devices and mounts) into ``record`` as
    ``old`` has them: an unreachable storage host is unknown, never empty. Returns the
    subsystems no path reached."""
    if not carried:
        return set()
    record.subsystems = _union(record.subsystems, carried)
    away = {s.subsysnqn for s in carried} - reached
    devices = [d for d in old.devices if d.subsysnqn in away]
    record.devices = _union(record.devices, devices)
    mounts = {d.mount for d in devices if d.mount is not None}
    record.mounts = _union(record.mounts, [m for m in old.mounts if m in mounts])
    return away
