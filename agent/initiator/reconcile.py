"""The GPU-host pass of plan/apply: connect, find, format, mount, probe, hand to engines.

Per pool: discover (or use the configured subsystem), connect idempotently,
wait for each namespace's device by its deterministic uuid, make xfs only on
a blank device (or accept this host's own), mount one directory per namespace
(or one striped volume), probe, prepare engine directories and render engine
configs. Pools removed from the config are detached: unmounted (never
lazily) and disconnected — only what kvagent itself attached (its record in
``<state_dir>/initiator.json``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvmet.ids import read_host_identity

from ..config.model import Config, InitiatorPool
from ..engines import EngineContext, render
from ..engines.dirs import engine_capacities, prepare
from ..errors import KvagentError
from ..log import get_logger
from ..naming import filesystem_uuid, parse_subsystem_nqn
from ..result import ActionRecord, RunResult
from ..state import read_json, write_json
from ..system.run import Runner
from .connect import Target, connect, disconnect_controllers, find_controllers, pool_entries
from .devices import NamespaceDevice, wait_for_namespaces
from .filesystem import ensure_filesystem, probe_content, xfs_label
from .identity import ensure_host_identity
from .mounts import ensure_mounted, mounted_at, unmount
from .nvmecli import FabricsOptions, NvmeCli
from .probes import ProbeResult, probe_mount
from .striped import deactivate, ensure_striped_volume
from .sysfs import Sysfs

log = get_logger("initiator")
STATE_FILE = "initiator.json"


@dataclass(frozen=True)
class Attachment:
    """A subsystem of a pool as this host reaches it."""

    subsysnqn: str
    transport: str
    traddr: str
    trsvcid: str


def load_state(state_dir: Path) -> dict[str, dict[str, Any]]:
    """``{pool: {"subsystems": [...], "mounts": [...], "layout", "hostnqn"}}``."""
    return read_json(state_dir / STATE_FILE, {}).get("pools", {})


def save_state(state_dir: Path, pools: dict[str, dict[str, Any]]) -> None:
    write_json(state_dir / STATE_FILE, {"pools": pools})


def namespace_mounts(pool: InitiatorPool, count: int) -> list[str]:
    """Mount points: ``<mount>/ns1..nsN`` (per-namespace) or ``<mount>`` (striped)."""
    if pool.layout == "striped":
        return [pool.mount]
    return [os.path.join(pool.mount, f"ns{i}") for i in range(1, count + 1)]


class InitiatorPass:
    """One reconcile of the GPU-host role."""

    def __init__(self, cfg: Config, runner: Runner, result: RunResult, *,
                 dry_run: bool = False, sysfs: Sysfs | None = None,
                 cli: NvmeCli | None = None):
        self.cfg, self.runner, self.result, self.dry_run = cfg, runner, result, dry_run
        self.sysfs = sysfs or Sysfs(cfg.node.sysfs)
        self.cli = cli or NvmeCli(runner)
        self.state_dir = Path(cfg.node.state_dir)

    def _act(self, pool: str | None, kind: str, subject: str, detail: str = "",
             status: str | None = None) -> None:
        self.result.actions.append(ActionRecord(
            "initiator", pool, kind, subject, detail,
            status or ("planned" if self.dry_run else "done")))

    def run(self) -> None:
        state = load_state(self.state_dir)
        pools = list(self.cfg.initiator.pools) if self.cfg.initiator else []
        if not pools and not state:
            return
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
            try:
                record = self._attach(pool, hostnqn, hostid)
            except KvagentError as exc:
                self.result.error("initiator", pool.name, exc.message, exc.hint)
                continue
            if record is not None and not self.dry_run:
                state[pool.name] = record
        for name in sorted(set(state) - {p.name for p in pools}):
            try:
                self._detach(name, state[name])
            except KvagentError as exc:
                self.result.error("initiator", name, exc.message, exc.hint)
                continue
            if not self.dry_run:
                del state[name]
        if not self.dry_run:
            save_state(self.state_dir, state)

    def _load_modules(self, pools: list[InitiatorPool]) -> None:
        transports = sorted({t.transport for p in pools for t in p.targets})
        for m in ["nvme-fabrics", *(f"nvme-{t}" for t in transports)]:
            res = self.runner(["modprobe", m], timeout=60, check=False)
            if not res.ok:
                log.warning("modprobe failed", module=m, error=res.stderr.strip())

    # ------------------------------------------------------------------ attach
    def _subsystems(self, pool: InitiatorPool, hostnqn: str,
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
            for e in mine:
                found.append(Attachment(e.subnqn, t.transport, t.address, str(t.service)))
        for a in found:
            parsed = parse_subsystem_nqn(self.cfg.node.nqn_prefix, a.subsysnqn)
            if parsed is not None and parsed[2] is None and not pool.shared:
                raise KvagentError(
                    f"{a.subsysnqn} is a shared subsystem (several hosts use it): kvagent "
                    "never puts a filesystem on it, since two hosts mounting one filesystem "
                    "destroy it",
                    "set shared: true on this initiator pool to attach it as raw block devices")
        return found

    def _attach(self, pool: InitiatorPool, hostnqn: str,
                hostid: str | None) -> dict[str, Any] | None:
        try:
            attachments = self._subsystems(pool, hostnqn, hostid)
        except KvagentError as exc:
            if not self.dry_run:
                raise
            # Planning: the target may only come up with this very apply (converged host).
            self._act(pool.name, "nvme.connect", pool.name,
                      f"after discovery; not possible to check now: {exc.message}")
            return None
        options = FabricsOptions.from_config(pool.connect)
        devices: list[NamespaceDevice] = []
        for a in attachments:
            target = Target(a.transport, a.traddr, a.trsvcid, a.subsysnqn, hostnqn, hostid,
                            options)
            if self.dry_run and not find_controllers(target, self.sysfs):
                self._act(pool.name, "nvme.connect", a.subsysnqn,
                          f"{a.transport} {a.traddr}:{a.trsvcid}")
                self._act(pool.name, "attach", pool.mount,
                          "find namespaces, make xfs if blank, mount, probe, engines")
                return None
            res = connect(target, cli=self.cli, sysfs=self.sysfs)
            if res.changed:
                self._act(pool.name, "nvme.connect", a.subsysnqn,
                          f"{a.transport} {a.traddr}:{a.trsvcid}")
            live = [c for c in res.controllers if c.state == "live"] or list(res.controllers)
            nsids = self.cli.list_ns(live[0].name)
            if not nsids:
                raise KvagentError(f"{a.subsysnqn} has no namespaces for this host",
                                   "check the pool on the storage host (kvagent status there)")
            wait = self.cfg.initiator.device_wait if self.cfg.initiator else 30.0
            devices += wait_for_namespaces(self.sysfs, a.subsysnqn, nsids, timeout=wait)
        record: dict[str, Any] = {
            "hostnqn": hostnqn, "layout": pool.layout, "shared": pool.shared,
            "subsystems": [dataclasses.asdict(a) for a in attachments],
            "devices": [{"subsysnqn": d.subsysnqn, "nsid": d.nsid, "uuid": d.uuid,
                         "device": d.device} for d in devices],
            "mounts": [],
        }
        if pool.shared:
            return record
        mounts = self._filesystems(pool, hostnqn, devices)
        record["mounts"] = mounts
        if self.dry_run:
            return record
        self._engines(pool, mounts, attachments[0].transport)
        return record

    def _filesystems(self, pool: InitiatorPool, hostnqn: str,
                     devices: list[NamespaceDevice]) -> list[str]:
        mounts = namespace_mounts(pool, len(devices))
        if pool.layout == "striped":
            uuids = ",".join(sorted(d.uuid for d in devices))
            pairs = [(self._striped(pool, devices), str(filesystem_uuid(
                hostnqn, f"striped:{pool.name}:{uuids}")), mounts[0], 1)]
        else:
            pairs = [(d.device, str(filesystem_uuid(hostnqn, d.uuid)), m, i)
                     for i, (d, m) in enumerate(zip(devices, mounts, strict=True), 1)]
        for device, fs_uuid, mount, index in pairs:
            if self.dry_run:
                content = probe_content(device, self.runner) if os.path.exists(device) else None
                if content is None or content.uuid != fs_uuid:
                    self._act(pool.name, "mkfs.xfs", device, f"uuid {fs_uuid}")
                if mounted_at(mount) is None:
                    self._act(pool.name, "mount", mount, device)
                continue
            if ensure_filesystem(device, fs_uuid, xfs_label(pool.name, index), self.runner):
                self._act(pool.name, "mkfs.xfs", device, f"uuid {fs_uuid}")
            if ensure_mounted(device, mount, pool.mount_options, self.runner):
                self._act(pool.name, "mount", mount, device)
        return mounts

    def _striped(self, pool: InitiatorPool, devices: list[NamespaceDevice]) -> str:
        if self.dry_run:
            return f"/dev/kvs_{pool.name}/data"
        path, created = ensure_striped_volume(pool.name, [d.device for d in devices],
                                              self.runner)
        if created:
            self._act(pool.name, "lvm.striped", path, f"{len(devices)} stripes")
        return path

    def _engines(self, pool: InitiatorPool, mounts: list[str], transport: str) -> None:
        probes_file = self.state_dir / "probes" / f"{pool.name}.json"
        probes = [probe_mount(m, transport, sysfs=self.cfg.node.sysfs) for m in mounts]
        write_json(probes_file, [dataclasses.asdict(p) for p in probes])
        if not pool.engines:
            return
        total = sum(p.total_bytes or 0 for p in probes)
        caps = engine_capacities(total, pool.engines)
        for engine in pool.engines:
            for prepared in prepare(mounts, engine):
                if prepared.changes:
                    self._act(pool.name, "engine.dir", prepared.path, ", ".join(prepared.changes))
            rendered = render_engine(pool, engine.kind, mounts, caps[engine.kind], probes)
            out_dir = self.state_dir / "engines" / pool.name / engine.kind
            for name, text in rendered.files.items():
                path = out_dir / name
                if not path.exists() or path.read_text() != text:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    self._act(pool.name, "engine.render", str(path), engine.kind)

    # ------------------------------------------------------------------ detach
    def _detach(self, name: str, record: dict[str, Any]) -> None:
        for mount in reversed(record.get("mounts", [])):
            if mounted_at(mount) is None:
                continue
            if self.dry_run or unmount(mount, self.runner):
                self._act(name, "umount", mount)
        if record.get("layout") == "striped" and not self.dry_run:
            deactivate(name, self.runner)
        for sub in record.get("subsystems", []):
            if self.dry_run:
                self._act(name, "nvme.disconnect", sub["subsysnqn"])
                continue
            gone = disconnect_controllers(sub["subsysnqn"], record["hostnqn"], cli=self.cli,
                                          sysfs=self.sysfs)
            if gone:
                self._act(name, "nvme.disconnect", sub["subsysnqn"], ", ".join(gone))


def render_engine(pool: InitiatorPool, kind: str, mounts: list[str], capacity: int,
                  probes: list[ProbeResult]):
    """Render one engine's config for a mounted pool."""
    from ..engines.dirs import engine_dir

    ctx = EngineContext(pool=pool.name, kind=kind,  # type: ignore[arg-type]
                        directories=tuple(engine_dir(m, kind) for m in mounts),
                        capacity_bytes=capacity, probes=tuple(probes))
    return render(kind, ctx)
