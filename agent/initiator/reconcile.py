"""The GPU-host pass of plan/apply: connect, find, format, mount, probe, hand to engines.

Per pool: discover (or use the configured subsystem), connect idempotently,
wait for a live controller, wait for each namespace's device by its
deterministic uuid, make xfs only on a blank device (or accept this host's
own), mount one directory per namespace (or one striped volume), probe,
prepare engine directories and render engine configs into
``<state_dir>/engines/<pool>/<kind>/``.

kvagent's record of what it attached is ``<state_dir>/initiator.json``; it is
written even when an attach fails half-way, so a later detach still finds
the controllers it connected. Pools removed from the config are detached:
unmounted (never lazily; only filesystems on the pool's own devices) and
disconnected (only this host identity's controllers of the recorded
subsystems); mount directories kvagent created are removed when empty.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvmet.ids import read_host_identity

from ..config.model import XFS_MIN_BYTES, Config, InitiatorPool
from ..engines import EngineContext, Rendered, render
from ..engines.dirs import engine_capacities, engine_dir, prepare
from ..errors import KvagentError, UsageError
from ..log import get_logger
from ..naming import filesystem_uuid, parse_subsystem_nqn
from ..result import ActionRecord, RunResult
from ..state import read_json, write_json
from ..system.modules import ensure_modules
from ..system.run import Runner
from .connect import Target, connect, disconnect_controllers, find_controllers, pool_entries
from .devices import NamespaceDevice, wait_for_namespaces
from .filesystem import ensure_filesystem, needs_filesystem, probe_content, xfs_label
from .identity import ensure_host_identity
from .kernel_quirks import loopback_tcp_warning, thp_mode
from .mounts import (
    MOUNTINFO,
    MountEntry,
    create_mount_point,
    device_number,
    ensure_mounted,
    mounted_at,
    remove_mount_points,
    unmount,
)
from .nvmecli import ConnectError, FabricsOptions, NvmeCli
from .probes import (
    DioAlign,
    FallocateResult,
    ODirectResult,
    ProbeResult,
    StepFailure,
    probe_mount,
)
from .striped import deactivate, dm_name, ensure_striped_volume, volume_path
from .sysfs import Controller, Sysfs, read_attr

log = get_logger("initiator")
STATE_FILE = "initiator.json"


@dataclass(frozen=True)
class Attachment:
    """A subsystem of a pool as this host reaches it."""

    subsysnqn: str
    transport: str
    traddr: str
    trsvcid: str


@dataclass(frozen=True)
class HostSeams:
    """The GPU host's external effects that are not commands (tests replace them)."""

    mountinfo: Path = MOUNTINFO
    devnum: Callable[[str], str] = device_number
    probe: Callable[..., ProbeResult] = probe_mount
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def load_state(state_dir: Path) -> dict[str, dict[str, Any]]:
    """``{pool: {"hostnqn", "layout", "shared", "subsystems", "devices", "mounts",
    "created_dirs", "complete"}}``."""
    return read_json(state_dir / STATE_FILE, {}).get("pools", {})


def save_state(state_dir: Path, pools: dict[str, dict[str, Any]]) -> None:
    write_json(state_dir / STATE_FILE, {"pools": pools})


def namespace_mounts(pool: InitiatorPool, count: int) -> list[str]:
    """Mount points: ``<mount>/ns1..nsN`` (per-namespace) or ``<mount>`` (striped)."""
    if pool.layout == "striped":
        return [pool.mount]
    return [os.path.join(pool.mount, f"ns{i}") for i in range(1, count + 1)]


def _union(*lists: list[Any]) -> list[Any]:
    out: list[Any] = []
    for items in lists:
        for item in items:
            if item not in out:
                out.append(item)
    return out


def merge_record(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The record after an attach: ``new`` when it completed, else old and new together.

    A failed attach may have connected or mounted part of the pool; keeping the
    union means a later detach still undoes all of it.
    """
    if old is None:
        return new
    merged = dict(new)
    merged["created_dirs"] = _union(old.get("created_dirs", []), new.get("created_dirs", []))
    if not new.get("complete"):
        for key in ("subsystems", "devices", "mounts"):
            merged[key] = _union(old.get(key, []), new.get(key, []))
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

    def _act(self, pool: str | None, kind: str, subject: str, detail: str = "",
             status: str | None = None) -> None:
        self.result.actions.append(ActionRecord(
            "initiator", pool, kind, subject, detail,
            status or ("planned" if self.dry_run else "done")))

    def _fail(self, pool: str | None, exc: BaseException) -> None:
        if isinstance(exc, KvagentError):
            self.result.error("initiator", pool, exc.message, exc.hint)
        else:
            self.result.error("initiator", pool, f"{type(exc).__name__}: {exc}")

    def run(self) -> None:
        """Detach the pools the config dropped, then attach the configured ones."""
        self.detach_removed()
        self.attach_configured()

    def detach_removed(self) -> None:
        """Unmount and disconnect every pool an earlier apply attached that the config dropped.

        Runs before the target pass: on a host that is both roles, unexporting first would
        leave a mounted filesystem on a controller retrying forever, and umount would hang.
        """
        state = load_state(self.state_dir)
        configured = {p.name for p in self.cfg.initiator.pools} if self.cfg.initiator else set()
        for name in sorted(set(state) - configured):
            try:
                self._detach(name, state[name])
            except (KvagentError, OSError) as exc:
                self._fail(name, exc)
                continue
            if not self.dry_run:
                del state[name]
                save_state(self.state_dir, state)

    def attach_configured(self) -> None:
        """Connect, find, format (blank devices only), mount, probe and render every pool."""
        pools = list(self.cfg.initiator.pools) if self.cfg.initiator else []
        if not pools:
            return
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
                return
            for path in ident.created:
                self._act(None, "identity.create", path)
            hostnqn, hostid = ident.hostnqn, ident.hostid
            self._load_modules(pools)
        for pool in pools:
            record: dict[str, Any] = {}
            try:
                self._attach(pool, hostnqn, hostid, record, state.get(pool.name))
            except (KvagentError, OSError) as exc:
                self._fail(pool.name, exc)
            finally:
                if not self.dry_run and record.get("subsystems"):
                    state[pool.name] = merge_record(state.get(pool.name), record)
                    save_state(self.state_dir, state)

    def _load_modules(self, pools: list[InitiatorPool]) -> None:
        transports = sorted({t.transport for p in pools for t in p.targets})
        ensure_modules(["nvme-fabrics", *(f"nvme-{t}" for t in transports)], self.runner,
                       self.cfg.node.sysfs)

    # ------------------------------------------------------------------ attach
    def _discover(self, pool: InitiatorPool, hostnqn: str,
                  hostid: str | None) -> list[Attachment]:
        found: list[Attachment] = []
        for t in pool.targets:
            if t.subsystem:
                found.append(Attachment(t.subsystem, t.transport, t.address, str(t.service)))
                continue
            entries = self.cli.discover(t.transport, t.address, str(t.service),
                                        hostnqn=hostnqn, hostid=hostid)
            mine = pool_entries(entries, self.cfg.node.nqn_prefix, pool.name,
                                host=self.cfg.node.name)
            if not mine:
                raise KvagentError(
                    f"the storage host at {t.transport} {t.address}:{t.service} offers no "
                    f"subsystem of pool {pool.name!r} to this host ({hostnqn})",
                    f"list this host (name {self.cfg.node.name}, NQN {hostnqn}) in the pool's "
                    "hosts on the storage host and apply there; check node.nqn_prefix matches")
            # Sorted, so namespace i lands on mount ns<i> the same way on every apply.
            for e in sorted(mine, key=lambda e: e.subnqn):
                found.append(Attachment(e.subnqn, t.transport, t.address, str(t.service)))
        return found

    def _check_shared(self, pool: InitiatorPool, attachments: list[Attachment]) -> None:
        for a in attachments:
            parsed = parse_subsystem_nqn(self.cfg.node.nqn_prefix, a.subsysnqn)
            if parsed is not None and parsed[2] is None and not pool.shared:
                raise KvagentError(
                    f"{a.subsysnqn} is a shared subsystem (several hosts use it): kvagent "
                    "never puts a filesystem on it, since two hosts mounting one filesystem "
                    "destroy it",
                    "set shared: true on this initiator pool to attach it as raw block devices")

    def _attach(self, pool: InitiatorPool, hostnqn: str, hostid: str | None,
                record: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Attach ``pool``, filling ``record`` as things are done (kept even on failure)."""
        try:
            attachments = self._discover(pool, hostnqn, hostid)
        except KvagentError as exc:
            if not self.dry_run:
                raise
            # Planning: the target may only come up with this very apply (converged host).
            self._act(pool.name, "nvme.connect", pool.name,
                      f"after discovery; not possible to check now: {exc.message}")
            return
        self._check_shared(pool, attachments)
        thp = thp_mode()
        for a in attachments:
            warning = loopback_tcp_warning(a.transport, a.traddr, thp)
            if warning:
                log.warning(warning, pool=pool.name)
        record.update({"hostnqn": hostnqn, "layout": pool.layout, "shared": pool.shared,
                       "subsystems": [], "devices": [], "mounts": [], "created_dirs": [],
                       "complete": False})
        options = FabricsOptions.from_config(pool.connect)
        wait = self.cfg.initiator.device_wait if self.cfg.initiator else 30.0
        connected: dict[str, list[Controller]] = {}
        path_errors: list[tuple[str, ConnectError]] = []
        for a in attachments:
            target = Target(a.transport, a.traddr, a.trsvcid, a.subsysnqn, hostnqn, hostid,
                            options)
            if self.dry_run and not find_controllers(target, self.sysfs):
                self._act(pool.name, "nvme.connect", a.subsysnqn,
                          f"{a.transport} {a.traddr}:{a.trsvcid}")
                self._act(pool.name, "attach", pool.mount,
                          "find namespaces, make xfs if blank, mount, probe, engines")
                return
            try:
                res = connect(target, cli=self.cli, sysfs=self.sysfs, sleep=self.seams.sleep)
            except ConnectError as exc:
                # Another path (target address) to the same subsystem may still work.
                path_errors.append((a.subsysnqn, exc))
                continue
            record["subsystems"].append(dataclasses.asdict(a))
            connected.setdefault(a.subsysnqn, []).extend(res.controllers)
            if res.changed:
                self._act(pool.name, "nvme.connect", a.subsysnqn,
                          f"{a.transport} {a.traddr}:{a.trsvcid}")
        for nqn, exc in path_errors:
            if nqn not in connected:
                raise exc
        for _, exc in path_errors:  # degraded: the subsystem is reached by another path
            self.result.error("initiator", pool.name, exc.message, exc.hint)
        devices: list[NamespaceDevice] = []
        for nqn, controllers in connected.items():
            ctrl = self._live_controller(nqn, controllers, wait)
            nsids = self.cli.list_ns(ctrl.name)
            if not nsids:
                raise KvagentError(f"{nqn} has no namespaces for this host",
                                   "check the pool on the storage host (kvagent status there)")
            found = wait_for_namespaces(self.sysfs, nqn, nsids, timeout=wait)
            record["devices"] += [{"subsysnqn": d.subsysnqn, "nsid": d.nsid, "uuid": d.uuid,
                                   "device": d.device} for d in found]
            devices += found
        if not pool.shared:
            mounts = self._filesystems(pool, hostnqn, devices, record)
            if not self.dry_run:
                self._engines(pool, mounts, attachments[0].transport)
        if old is not None:
            self._drop_stale(pool.name, old, record)
        record["complete"] = True

    def _live_controller(self, nqn: str, controllers: list[Controller],
                         wait: float) -> Controller:
        """A live controller among ``controllers``, waiting up to ``wait`` s for a reconnect."""
        deadline = self.seams.clock() + wait
        names = list(dict.fromkeys(c.name for c in controllers))
        while True:
            current = [c for n in names if (c := self.sysfs.controller(n)) is not None]
            live = [c for c in current if c.state == "live"]
            if live:
                return live[0]
            if self.seams.clock() >= deadline:
                states = ", ".join(f"{c.name} {c.state} ({c.transport} {c.address.traddr})"
                                   for c in current) or "gone"
                raise KvagentError(
                    f"no live controller for {nqn} after {wait:g}s: {states}",
                    "the storage host is unreachable or its port is down; the kernel keeps "
                    "reconnecting (I/O waits meanwhile); apply again once it is back")
            self.seams.sleep(0.2)

    def _filesystems(self, pool: InitiatorPool, hostnqn: str,
                     devices: list[NamespaceDevice], record: dict[str, Any]) -> list[str]:
        mounts = namespace_mounts(pool, len(devices))
        if pool.layout == "striped":
            total = sum(d.size_bytes or 0 for d in devices)
            uuids = ",".join(sorted(d.uuid for d in devices))
            fs_uuid = str(filesystem_uuid(hostnqn, f"striped:{pool.name}:{uuids}"))
            self._check_size(pool, "the striped volume", total)
            record["mounts"] = list(mounts)
            pairs = [(self._striped(pool, devices), fs_uuid, mounts[0], 1)]
        else:
            for d in devices:
                self._check_size(pool, f"{d.device} (nsid {d.nsid})", d.size_bytes)
            record["mounts"] = list(mounts)
            pairs = [(d.device, str(filesystem_uuid(hostnqn, d.uuid)), m, i)
                     for i, (d, m) in enumerate(zip(devices, mounts, strict=True), 1)]
        for device, fs_uuid, mount, index in pairs:
            if self.dry_run:
                fresh = pool.layout == "striped" and not os.path.exists(device)
                if fresh or needs_filesystem(probe_content(device, self.runner), fs_uuid):
                    self._act(pool.name, "mkfs.xfs", device, f"uuid {fs_uuid}")
                if mounted_at(mount, self.seams.mountinfo) is None:
                    self._act(pool.name, "mount", mount, device)
                continue
            if ensure_filesystem(device, fs_uuid, xfs_label(pool.name, index), self.runner):
                self._act(pool.name, "mkfs.xfs", device, f"uuid {fs_uuid}")
            if mounted_at(mount, self.seams.mountinfo) is None:
                record["created_dirs"] += create_mount_point(mount)
            if ensure_mounted(device, mount, pool.mount_options, self.runner,
                              self.seams.mountinfo, self.seams.devnum):
                self._act(pool.name, "mount", mount, device)
        return mounts

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
                                              self.runner)
        if created:
            self._act(pool.name, "lvm.striped", path, f"{len(devices)} stripes")
        return path

    def _probes(self, pool: InitiatorPool, mounts: list[str],
                transport: str) -> list[ProbeResult]:
        """The mounts' probe results: recorded ones while nothing was (re)mounted.

        Probing writes and preallocates real data: a converged pass (every
        ``kvagent run`` interval) reuses the record instead of probing again.
        """
        remounted = any(a.pool == pool.name and a.kind in ("mkfs.xfs", "mount", "lvm.striped")
                        and a.status == "done" for a in self.result.actions)
        record = probes_file(self.state_dir, pool.name)
        if not remounted:
            try:
                recorded = [probe_from_json(p) for p in read_json(record, [])]
            except (KvagentError, KeyError, TypeError, ValueError):
                recorded = []
            if [p.path for p in recorded] == list(mounts) and all(p.transport == transport
                                                                  for p in recorded):
                return recorded
        probes = [self.seams.probe(m, transport, sysfs=self.cfg.node.sysfs) for m in mounts]
        write_json(record, [dataclasses.asdict(p) for p in probes])
        return probes

    def _engines(self, pool: InitiatorPool, mounts: list[str], transport: str) -> None:
        probes = self._probes(pool, mounts, transport)
        out_root = self.state_dir / "engines" / pool.name
        kinds = {e.kind for e in pool.engines}
        if out_root.is_dir():
            for stale in sorted(p for p in out_root.iterdir() if p.name not in kinds):
                shutil.rmtree(stale)
                self._act(pool.name, "engine.unrender", str(stale))
        if not pool.engines:
            return
        total = sum(p.total_bytes or 0 for p in probes)
        caps = engine_capacities(total, pool.engines)
        for engine in pool.engines:
            for prepared in prepare(mounts, engine):
                if prepared.changes:
                    self._act(pool.name, "engine.dir", prepared.path, ", ".join(prepared.changes))
            rendered = render_engine(pool, engine.kind, mounts, caps[engine.kind], probes)
            out_dir = out_root / engine.kind
            for name, text in rendered.files.items():
                path = out_dir / name
                if not path.exists() or path.read_text() != text:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    self._act(pool.name, "engine.render", str(path), engine.kind)
            if out_dir.is_dir():
                for stale in sorted(p for p in out_dir.iterdir() if p.name not in rendered.files):
                    stale.unlink()
                    self._act(pool.name, "engine.unrender", str(stale), engine.kind)

    def _drop_stale(self, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Undo what an earlier attach did that the config no longer asks for."""
        stale_mounts = [m for m in old.get("mounts", []) if m not in new["mounts"]]
        self._unmount_all(name, stale_mounts, old)
        keep = {s["subsysnqn"] for s in new["subsystems"]}
        stale = [s for s in old.get("subsystems", []) if s["subsysnqn"] not in keep]
        self._disconnect_all(name, stale, old["hostnqn"])

    # ------------------------------------------------------------------ detach
    def _detach(self, name: str, record: dict[str, Any]) -> None:
        self._unmount_all(name, record.get("mounts", []), record)
        striped = record.get("layout") == "striped"
        if striped and (self.dry_run or deactivate(name, self.runner)):
            self._act(name, "lvm.deactivate", volume_path(name))
        self._disconnect_all(name, record.get("subsystems", []), record["hostnqn"])
        if self.dry_run:
            return
        removed = remove_mount_points(record.get("created_dirs", []), self.seams.mountinfo)
        for d in removed:
            self._act(name, "rmdir", d, "mount directory kvagent created")
        probes_file(self.state_dir, name).unlink(missing_ok=True)
        renders = self.state_dir / "engines" / name
        if renders.is_dir():
            shutil.rmtree(renders)
            self._act(name, "engine.unrender", str(renders))

    def _unmount_all(self, name: str, mounts: list[str], record: dict[str, Any]) -> None:
        for mount in reversed(mounts):
            entry = mounted_at(mount, self.seams.mountinfo)
            if entry is None:
                continue
            if not self._is_pool_mount(name, entry, record):
                raise KvagentError(
                    f"not unmounting {mount}: {entry.source} ({entry.fstype}) is mounted there, "
                    f"which is not a device of pool {name}",
                    "kvagent only unmounts what it mounted; unmount it yourself if it should go")
            if self.dry_run or unmount(mount, self.runner, self.seams.mountinfo):
                self._act(name, "umount", mount)

    def _is_pool_mount(self, name: str, entry: MountEntry, record: dict[str, Any]) -> bool:
        dev = Path(self.cfg.node.sysfs) / "dev/block" / entry.device
        uuid = read_attr(dev / "uuid")
        if uuid is not None and uuid in {d.get("uuid") for d in record.get("devices", [])}:
            return True
        if record.get("layout") == "striped" and read_attr(dev / "dm/name") == dm_name(name):
            return True
        known = {d.get("device") for d in record.get("devices", [])} | {
            volume_path(name), f"/dev/mapper/{dm_name(name)}"}
        return entry.source in known

    def _disconnect_all(self, name: str, subsystems: list[dict[str, Any]], hostnqn: str) -> None:
        for sub in subsystems:
            if self.dry_run:
                self._act(name, "nvme.disconnect", sub["subsysnqn"])
                continue
            gone = disconnect_controllers(sub["subsysnqn"], hostnqn, cli=self.cli,
                                          sysfs=self.sysfs)
            if gone:
                self._act(name, "nvme.disconnect", sub["subsysnqn"], ", ".join(gone))


def probes_file(state_dir: Path, pool: str) -> Path:
    """Where apply records the probe results of a pool's mounts."""
    return state_dir / "probes" / f"{pool}.json"


def render_engine(pool: InitiatorPool, kind: str, mounts: list[str], capacity: int,
                  probes: list[ProbeResult]) -> Rendered:
    """Render one engine's config for a mounted pool."""
    ctx = EngineContext(pool=pool.name, kind=kind,  # type: ignore[arg-type]
                        directories=tuple(engine_dir(m, kind) for m in mounts),
                        capacity_bytes=capacity, probes=tuple(probes))
    return render(kind, ctx)


# ------------------------------------------------------------- engines render
def probe_from_json(data: dict[str, Any]) -> ProbeResult:
    """A :class:`ProbeResult` back from its recorded JSON (``dataclasses.asdict``)."""
    def failure(d: dict[str, Any] | None) -> StepFailure | None:
        return None if d is None else StepFailure(d["step"], d.get("errno"), d["error"])

    od, fa, dio = data["odirect"], data["fallocate"], data["dio_align"]
    return ProbeResult(
        path=data["path"], transport=data.get("transport"), started_at=data["started_at"],
        finished_at=data["finished_at"], odirect_ok=data["odirect_ok"],
        fallocate_ok=data["fallocate_ok"],
        odirect=ODirectResult(od["ok"], od["size_bytes"], od["alignment"],
                              failure(od.get("failure")), od.get("sha256")),
        fallocate=FallocateResult(fa["ok"], fa["requested_bytes"], fa.get("reserved_bytes"),
                                  fa.get("method"), failure(fa.get("failure"))),
        dio_align=DioAlign(dio.get("mem_align"), dio.get("offset_align"), dio.get("error")),
        device=data.get("device"), logical_block_size=data.get("logical_block_size"),
        total_bytes=data.get("total_bytes"), free_bytes=data.get("free_bytes"),
        errors=tuple(data.get("errors", ())))


@dataclass(frozen=True)
class AttachedRender:
    """One engine's config for an attached pool, as ``kvagent engines render`` shows it."""

    pool: str
    engine: str
    mounts: tuple[str, ...]
    directories: tuple[str, ...]
    capacity_bytes: int
    probes_from: str  # "record" (apply's probes) or "now"
    rendered: Rendered


def render_attached(cfg: Config, pool_name: str, kind: str, *, probe_now: bool = False,
                    seams: HostSeams | None = None) -> AttachedRender:
    """Render engine ``kind`` for the attached initiator pool ``pool_name``.

    UsageError (exit 2) for a pool or engine the config does not have;
    KvagentError (exit 1) when the pool is not attached or not mounted.
    Probes come from apply's record unless ``probe_now`` (or no usable record).
    """
    seams = seams or HostSeams()
    pools = {p.name: p for p in (cfg.initiator.pools if cfg.initiator else ())}
    pool = pools.get(pool_name)
    if pool is None:
        raise UsageError(f"unknown initiator pool {pool_name!r}; this host's config has "
                         f"{', '.join(sorted(pools)) or 'no initiator pools'}")
    engines = [e.kind for e in pool.engines]
    if kind not in engines:
        raise UsageError(f"engine {kind!r} is not configured for pool {pool_name!r} (it has "
                         f"{', '.join(engines) or 'no engines'})",
                         f"add {{kind: {kind}}} to the pool's engines and run kvagent apply")
    state_dir = Path(cfg.node.state_dir)
    record = load_state(state_dir).get(pool_name)
    if record is None or not record.get("mounts"):
        raise KvagentError(f"pool {pool_name!r} is not attached on this host",
                           "run kvagent apply (kvagent plan shows what it would do)")
    mounts = list(record["mounts"])
    missing = [m for m in mounts if mounted_at(m, seams.mountinfo) is None]
    if missing:
        raise KvagentError(f"pool {pool_name!r} is not mounted at {', '.join(missing)}",
                           "run kvagent apply to mount it again")
    dirs = [engine_dir(m, kind) for m in mounts]
    absent = [d for d in dirs if not os.path.isdir(d)]
    if absent:
        raise KvagentError(f"engine directory {', '.join(absent)} does not exist",
                           "run kvagent apply to prepare the engine's directories")
    probes, source = None, "now"
    if not probe_now:
        recorded = read_json(probes_file(state_dir, pool_name), None)
        if recorded is not None:
            loaded = [probe_from_json(p) for p in recorded]
            if [p.path for p in loaded] == mounts:
                probes, source = loaded, "record"
    if probes is None:
        transport = (record.get("subsystems") or [{}])[0].get("transport")
        probes = [seams.probe(m, transport, sysfs=cfg.node.sysfs) for m in mounts]
    caps = engine_capacities(sum(p.total_bytes or 0 for p in probes), pool.engines)
    rendered = render_engine(pool, kind, mounts, caps[kind], probes)
    return AttachedRender(pool_name, kind, tuple(mounts), tuple(dirs), caps[kind], source,
                          rendered)
