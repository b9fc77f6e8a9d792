"""``kvagent pool list`` and ``kvagent pool destroy``: what pools exist, and deleting one's data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nvmet
from nvmet.errors import NvmetError

from ..config.model import Config
from ..errors import KvagentError, UsageError
from ..naming import parse_subsystem_nqn
from ..system.run import Runner
from .backing_device import release_claims
from .backing_file import destroy_files
from .backing_lvm import list_owned_volumes, remove_volume
from .reconcile import TargetState, _backing_record, nvmet_fs


def _live_tree(cfg: Config, fs: nvmet.ConfigFS | None) -> nvmet.Tree | None:
    try:
        return nvmet.read(fs if fs is not None else nvmet_fs(cfg))
    except NvmetError:
        return None


def list_pools(cfg: Config, fs: nvmet.ConfigFS | None = None) -> list[dict[str, Any]]:
    """Every target pool known from the config or kvagent's records, with its live export."""
    state = TargetState.load(Path(cfg.node.state_dir))
    live = _live_tree(cfg, fs)
    configured = {p.name: p for p in (cfg.target.pools if cfg.target else ())}
    out = []
    for name in sorted(set(configured) | set(state.pools)):
        pool = configured.get(name)
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
        out.append({
            "name": name,
            "configured": pool is not None,
            "backing": _backing_record(pool) if pool else state.pools.get(name),
            "shared": pool.shared if pool else None,
            "hosts": [h.name for h in pool.hosts] if pool else [],
            "exported": bool(subs),
            "subsystems": subs,
            "nvmet_readable": live is not None,
        })
    return out


def destroy_pool(cfg: Config, name: str, runner: Runner, *, yes: bool,
                 fs: nvmet.ConfigFS | None = None) -> dict[str, Any]:
    """Delete the data of a pool that is no longer configured nor exported.

    Only what kvagent provably owns goes: LVs tagged with the pool, files in the
    pool's manifest. Whole devices are released from kvagent's claims, never wiped.
    Without ``yes`` nothing is deleted and the plan is returned.
    """
    if cfg.target and any(p.name == name for p in cfg.target.pools):
        raise UsageError(f"pool {name!r} is still in the config",
                         "remove it from target.pools and run kvagent apply (that unexports "
                         "it and keeps its data), then destroy it")
    state = TargetState.load(Path(cfg.node.state_dir))
    record = state.pools.get(name)
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
    volumes = [v for v in list_owned_volumes(runner) if v.tag_value("kvagent_pool") == name] \
        if (record is None or record.get("kind") == "lvm") else []
    files_dir = (Path(record["directory"]) / name
                 if record and record.get("kind") == "file" else None)
    files = sorted((files_dir / rel).as_posix() for rel in _manifest_files(files_dir))
    if record is None and not volumes:
        raise UsageError(f"kvagent knows no pool named {name!r}",
                         "see kvagent pool list")
    plan = {"pool": name, "logical_volumes": [v.path for v in volumes], "files": files,
            "device_claims": [] if not record or record.get("kind") != "device"
            else record.get("devices", []), "destroyed": False}
    if not yes:
        return plan
    for v in volumes:
        remove_volume(runner, v, name)
    if files_dir is not None:
        destroy_files(files_dir)
    release_claims(Path(cfg.node.state_dir), name)
    state.pools.pop(name, None)
    state.save(Path(cfg.node.state_dir))
    plan["destroyed"] = True
    return plan


def _manifest_files(directory: Path | None) -> list[str]:
    if directory is None:
        return []
    from .backing_file import read_manifest

    return list(read_manifest(directory).get("files", {}))
