"""One source of truth: health expects exactly the namespaces the export creates.

For every example config and for configs hypothesis makes up, each pool is planned by
its backing driver (storage faked), exported, and the resulting tree is handed to the
health collector as if it were live: the collector's expected counts must equal what
the export made, and the pool must be healthy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import ConfigError, load_config, parse_config
from agent.config.model import Config
from agent.health.collect import _target_pool
from agent.records import TargetRecords
from agent.target.backings import device, driver_for, file, lvm
from agent.target.desired import expected_namespaces, pool_layout
from agent.target.export import desired_port, export_pool
from agent.target.identity import DeviceIdentity
from nvmet.model import Tree
from tests.unit.fakerunner import FakeRunner

from .helpers import context, empty_pvs

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
HOSTS = [f"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000{i}"
         for i in range(4)]


@pytest.fixture(autouse=True)
def fake_storage(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """Every device is blank and unique; volume groups exist with room to spare."""
    monkeypatch.setattr(device, "device_identity", lambda path, sysfs: DeviceIdentity(
        "/dev/" + path.rsplit("/", 1)[1], 1 << 40, "wwid-" + path, None))
    monkeypatch.setattr(device, "resolve_block_device", lambda p: ("/dev/x" + p, 1))
    monkeypatch.setattr(device, "ensure_blank", lambda p, purpose, runner: p)
    monkeypatch.setattr(lvm, "ensure_blank", lambda p, purpose, runner: p)
    monkeypatch.setattr(file, "supports_odirect", lambda d: (True, ""))
    monkeypatch.setattr(file, "filesystem_type", lambda p, mounts=None: "xfs")


def runner(cfg: Config) -> FakeRunner:
    vgs = {p.backing.volume_group for p in (cfg.target.pools if cfg.target else ())
           if p.backing.kind == "lvm"}
    rows = [{"vg_name": vg, "vg_size": str(1 << 60), "vg_free": str(1 << 59),
             "vg_extent_size": str(4 << 20), "vg_tags": ""} for vg in sorted(vgs)]
    return (FakeRunner().on(["vgs"], stdout=json.dumps({"report": [{"vg": rows}]}))
            .on(["lvs"], stdout=json.dumps({"report": [{"lv": []}]}))
            .on(["pvs"], stdout=empty_pvs(*sorted(vgs))))


def check(cfg: Config) -> None:
    if cfg.target is None:
        return
    ctx = context(cfg, runner(cfg))
    records = TargetRecords()
    exported: dict[str, int] = {}
    subsystems, links = [], set()
    for pool in cfg.target.pools:
        plan = driver_for(pool).plan(ctx, pool)
        assert not plan.errors, plan.errors
        hosts = driver_for(pool).layout(pool, records).keys()
        export = export_pool(cfg, pool, hosts, plan.volumes, frozenset())
        subsystems += export.subsystems
        links |= {sub.nqn for sub in export.subsystems}
        exported[pool.name] = sum(len(s.namespaces) for s in export.subsystems)
        assert {s.nqn: tuple(s.namespaces) for s in export.subsystems} == \
            pool_layout(cfg, pool, records)
    ports = [desired_port(p, links) for p in cfg.target.ports]
    live = Tree(hosts=[], subsystems=subsystems, ports=ports)
    for pool in cfg.target.pools:
        health = _target_pool(cfg, pool, live, records)
        assert health.target is not None
        assert health.target.namespaces_expected == exported[pool.name] == \
            expected_namespaces(cfg, pool, records)
        assert health.state == "ok", health.problems


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples(path: Path) -> None:
    check(load_config(path))


def test_a_shared_pool_without_hosts_expects_nothing() -> None:
    """Issue 12, item 9: health said "0 of 1 namespaces enabled" for such a pool."""
    cfg = parse_config(yaml.safe_dump({"version": 1, "node": {"name": "s"}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "10.0.0.1"}],
        "pools": [{"name": "raw", "shared": True, "ports": ["p"], "hosts": [],
                   "backing": {"kind": "lvm", "volume_group": "vg"},
                   "namespaces": {"count": 1, "size": "1GiB"}}]}}))
    health = _target_pool(cfg, cfg.target.pools[0], Tree(), TargetRecords())
    assert health.target is not None and health.target.namespaces_expected == 0
    assert (health.state, health.problems) == ("ok", ())
    check(cfg)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    pools = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["lvm", "file", "device"]))
        shared = draw(st.booleans())
        hosts = [{"name": f"g{j}", "nqn": HOSTS[j]} for j in range(draw(st.integers(0, 3)))]
        pool: dict = {"name": f"p{i}", "ports": ["t"], "hosts": hosts, "shared": shared}
        if shared and not hosts:
            pool["allow_any_host"] = draw(st.booleans())
        if kind == "device":
            n = draw(st.integers(1, 4))
            if shared:
                devs = [{"path": f"/dev/disk/by-id/p{i}-d{k}"} for k in range(n)]
            elif hosts:
                devs = [{"path": f"/dev/disk/by-id/p{i}-d{k}",
                         "host": draw(st.sampled_from([h["name"] for h in hosts]))}
                        for k in range(n)]
            else:
                devs = [{"path": f"/dev/disk/by-id/p{i}-d0", "host": "nobody"}]
            pool["backing"] = {"kind": "device", "devices": devs}
        else:
            pool["backing"] = ({"kind": "lvm", "volume_group": f"vg{i}"} if kind == "lvm"
                               else {"kind": "file", "directory": f"/nonexistent/kv{i}"})
            pool["namespaces"] = {"count": draw(st.integers(1, 4)), "size": "8MiB"}
        pools.append(pool)
    data = {"version": 1, "node": {"name": "s"}, "target": {
        "ports": [{"name": "t", "id": 1, "transport": "tcp", "address": "10.0.0.1"}],
        "pools": pools}}
    try:
        return parse_config(yaml.safe_dump(data))
    except ConfigError:
        return parse_config(yaml.safe_dump({"version": 1}))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs())
def test_made_up_configs(cfg: Config) -> None:
    check(cfg)
