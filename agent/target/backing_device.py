"""Whole-device backing: one namespace per block device, named by a stable id.

The first time kvagent exports a device it must be blank (see safety.py);
kvagent then records a claim (``<state_dir>/device-claims.json``) with the
device's identity. Later the GPU host's filesystem is on it, and the claim —
written by kvagent itself — is what makes it still kvagent's to export.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..config.model import DeviceBacking, TargetPool
from ..errors import KvagentError
from ..state import read_json, write_json
from ..system.run import Runner
from .safety import ensure_blank, resolve_block_device
from .steps import BackingPlan, Step, Volume
from .usage import DeviceUsage

CLAIMS = "device-claims.json"


def read_claims(state_dir: Path) -> dict[str, dict]:
    """``{by-id path: {"pool", "host", "device", "size"}}``."""
    return read_json(state_dir / CLAIMS, {})


def _claim(state_dir: Path, path: str, pool: str, host: str | None, device: str) -> None:
    claims = read_claims(state_dir)
    claims[path] = {"pool": pool, "host": host, "device": device,
                    "size": _device_size(device)}
    write_json(state_dir / CLAIMS, claims)


def release_claims(state_dir: Path, pool: str) -> list[str]:
    """Forget every claim of ``pool`` (the devices are not touched). Returns the paths."""
    claims = read_claims(state_dir)
    released = sorted(p for p, c in claims.items() if c.get("pool") == pool)
    for p in released:
        del claims[p]
    write_json(state_dir / CLAIMS, claims)
    return released


def _device_size(device: str) -> int:
    fd = os.open(device, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def plan_device(pool: TargetPool, runner: Runner, state_dir: Path,
                exported: dict[str, str], usage: DeviceUsage | None = None) -> BackingPlan:
    """Volumes and steps for a whole-device pool.

    ``exported`` maps real device nodes to the NQN of the subsystem that
    exports them now (from the live nvmet tree): a device exported by one of
    this pool's own subsystems is already in use by this pool. ``usage`` knows
    every other pool's devices: a device another pool uses is refused.
    """
    backing = pool.backing
    assert isinstance(backing, DeviceBacking)
    plan = BackingPlan()
    claims = read_claims(state_dir)
    per_host: dict[str | None, int] = {}
    seen: dict[str, str] = {}
    for entry in backing.devices:
        host = None if pool.shared else entry.host
        nsid = per_host[host] = per_host.get(host, 0) + 1
        plan.volumes.append(Volume(pool.name, host, nsid, entry.path, None))
        real_now = os.path.realpath(entry.path)
        if real_now in seen:
            plan.errors.append(f"pool {pool.name}: {entry.path} is the same device as "
                               f"{seen[real_now]} ({real_now}); list each device once")
            continue
        seen[real_now] = entry.path
        claim = claims.get(entry.path)
        if claim is not None:
            if claim.get("pool") != pool.name or claim.get("host") != host:
                plan.errors.append(
                    f"pool {pool.name}: {entry.path} is claimed by pool {claim.get('pool')!r} "
                    f"(host {claim.get('host')!r}); destroy that pool first or use another")
            continue
        others = usage.conflicts(entry.path, pool.name, "device") if usage else []
        if others:
            plan.errors.append(
                f"pool {pool.name}: refusing to export {entry.path} ({real_now}): it is "
                f"{'; '.join(others)}. A device serves one pool only: remove it from one "
                "of them")
            continue
        try:
            real, _ = resolve_block_device(entry.path)
            if real in exported:
                plan.errors.append(
                    f"pool {pool.name}: {entry.path} ({real}) is already exported by "
                    f"{exported[real]} and kvagent has no claim on it")
                continue
            real = ensure_blank(entry.path, "export", runner)
        except KvagentError as exc:
            plan.errors.append(f"pool {pool.name}: {exc}")
            continue
        plan.steps.append(Step(
            "device.claim", pool.name, entry.path, f"{real}, host {host or 'shared'}",
            lambda p=entry.path, h=host, r=real: _claim(state_dir, p, pool.name, h, r)))
    return plan
