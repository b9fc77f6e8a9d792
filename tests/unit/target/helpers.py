"""Shared pieces for the storage-side unit tests: configs and a driver's pass context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.config.model import Config, TargetPool
from agent.records import TargetRecords
from agent.result import RunResult
from agent.target import reconcile
from agent.target.backings import driver_for
from agent.target.backings.base import BackingPlan, PassContext
from agent.target.reconcile import TargetPass
from agent.target.usage import device_usage
from nvmet.fake import FakeConfigFS
from nvmet.model import Tree
from tests.unit.fakerunner import FakeRunner


def one_pool_config(backing: dict[str, Any], state_dir: Path | None = None,
                    **extra: Any) -> Config:
    """A storage host with one pool ``kv`` for gpu-1 on one loopback port."""
    node: dict[str, Any] = {"name": "stor"}
    if state_dir is not None:
        node.update(state_dir=str(state_dir), run_dir=str(state_dir.parent / "run"),
                    sysfs=str(state_dir.parent / "sys"))
    data = {"version": 1, "node": node, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"name": "kv", "backing": backing, "ports": ["p"],
                   "hosts": [{"name": "gpu-1", "nqn": H1}], **extra}]}}
    return parse_config(yaml.safe_dump(data))


def context(cfg: Config, runner: FakeRunner | None = None, *,
            records: TargetRecords | None = None, live: Tree | None = None,
            dry_run: bool = False) -> PassContext:
    """What the target pass gives a driver: records, the live tree and device uses."""
    records = records if records is not None else TargetRecords()
    pools = list(cfg.target.pools) if cfg.target else []
    listed = [use for p in pools for use in driver_for(p).devices(p)]
    usage = device_usage(listed, records.claims, {}, {})
    return PassContext(cfg, runner or FakeRunner(), records, live or Tree(), usage, dry_run)


def plan_of(cfg: Config, ctx: PassContext, pool: TargetPool | None = None) -> BackingPlan:
    pool = pool or cfg.target.pools[0]
    return driver_for(pool).plan(ctx, pool)


# ------------------------------------------------------------- a fake kernel
H1 = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
H2 = "nqn.2014-08.org.nvmexpress:uuid:6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"
PREFIX = "nqn.2026-11.io.kvagent:stor"
MIB = 1 << 20


def file_pool(root: Path, name: str = "kv", count: int = 2, size: str = "4MiB",
              ports: tuple[str, ...] = ("lo",), hosts: tuple[tuple[str, str], ...] = (
                  ("gpu-1", H1), ("gpu-2", H2))) -> dict[str, Any]:
    return {"name": name, "ports": list(ports),
            "backing": {"kind": "file", "directory": str(root / "files")},
            "namespaces": {"count": count, "size": size},
            "hosts": [{"name": n, "nqn": q} for n, q in hosts]}


def config(root: Path, pools: list[dict[str, Any]], *, wait: str = "0s",
           extra_ports: tuple[dict[str, Any], ...] = (),
           peers: tuple[dict[str, Any], ...] = ()) -> Config:
    data = {"version": 1, "node": {"name": "stor", "state_dir": str(root / "state"),
                                   "run_dir": str(root / "run")},
            "target": {"address_wait": wait, "pools": pools, "peers": list(peers), "ports": [
                {"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1"},
                *extra_ports]}}
    return parse_config(yaml.safe_dump(data))


class Target:
    """A fake kernel that knows every file a pass creates (as nvmet would open them)."""

    def __init__(self, root: Path):
        self.root = root
        self.fs = FakeConfigFS(check_order=True)
        self.runner = FakeRunner().on(["modprobe"])

    def run(self, cfg: Config, dry_run: bool = False, rebind: tuple[str, ...] = ()) -> RunResult:
        for path in self.root.rglob("*.img"):
            self.fs.add_device(str(path), "file")
        # Files created during this pass: register them as the applier would meet them.
        original = reconcile.TargetPass._run_steps

        def run_steps(pass_: TargetPass, state):  # type: ignore[no-untyped-def]
            original(pass_, state)
            for path in self.root.rglob("*.img"):
                self.fs.add_device(str(path), "file")

        result = RunResult(dry_run=dry_run)
        self.fs.start_session()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reconcile.TargetPass, "_run_steps", run_steps)
            TargetPass(cfg, self.runner, result, fs=self.fs, dry_run=dry_run,
                       rebind=rebind).run()
        result.finished_at = 0.0
        return result

    def ops(self, op: str | None = None, contains: str = "") -> list[tuple[str, str]]:
        return [(o.op, o.path) for o in self.fs.ops
                if (op is None or o.op == op) and contains in o.path]


def nqn(host: str | None, pool: str = "kv") -> str:
    return f"{PREFIX}:{pool}" + (f":{host}" if host else "")




def pvs_json(*rows: tuple[str, str, int, str, str]) -> str:
    """``pvs --segments`` JSON: (pv, vg, pv_free, lv_uuid, lv_tags) per segment (``""`` lv:
    free space)."""
    return json.dumps({"report": [{"pvseg": [
        {"pv_name": pv, "vg_name": vg, "pv_free": str(free), "pv_attr": "a--",
         "lv_uuid": lv, "lv_tags": tags} for pv, vg, free, lv, tags in rows]}]})


def empty_pvs(*vgs: str, count: int = 2, free: int = 1 << 50) -> str:
    """``count`` empty PVs per volume group, each with ``free`` bytes."""
    return pvs_json(*[(f"/dev/{vg}-pv{i}", vg, free, "", "") for vg in vgs
                      for i in range(count)])
