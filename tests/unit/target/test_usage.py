"""No device serves two pools: config listings, claims and live exports, by real node."""

from __future__ import annotations

import json

import pytest
import yaml

from agent.config import parse_config
from agent.records import DeviceClaim
from agent.target.backings import driver_for, lvm
from agent.target.usage import device_usage
from tests.unit.fakerunner import FakeRunner

from .helpers import context

H1 = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def config(*specs: dict):
    data = {"version": 1, "node": {"name": "stor"}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"ports": ["p"], "hosts": [{"name": "gpu-1", "nqn": H1}], **s}
                  for s in specs]}}
    return parse_config(yaml.safe_dump(data))


def pools(*specs: dict) -> list:
    return list(config(*specs).target.pools)


def listed(*specs: dict) -> list:
    return [use for p in pools(*specs) for use in driver_for(p).devices(p)]


def lvm_spec(name: str, vg: str, *devices: str) -> dict:
    return {"name": name, "backing": {"kind": "lvm", "volume_group": vg, "devices": list(devices)},
            "namespaces": {"count": 1, "size": "4MiB"}}


def device(name: str, *paths: str) -> dict:
    return {"name": name, "backing": {"kind": "device", "devices": [
        {"path": p, "host": "gpu-1"} for p in paths]}}


#: by-id links and the device nodes they point to (a resolver stands in for realpath)
LINKS = {"/dev/disk/by-id/a": "/dev/nvme1n1", "/dev/disk/by-id/b": "/dev/nvme1n1",
         "/dev/disk/by-id/c": "/dev/nvme2n1"}


def resolve(path: str) -> str:
    return LINKS.get(path, path)


@pytest.fixture
def nodes() -> dict[str, str]:
    return {"id-a": "/dev/disk/by-id/a", "id-b": "/dev/disk/by-id/b",
            "id-c": "/dev/disk/by-id/c", "nvme1n1": "/dev/nvme1n1", "nvme2n1": "/dev/nvme2n1"}


def test_aliases_of_one_node_are_one_device(nodes: dict[str, str]) -> None:
    usage = device_usage([], {}, {}, {}, resolve=resolve)
    usage.add(nodes["id-a"], usage_of("x", "device"))
    assert usage.conflicts(nodes["id-b"], "y", "device") == ["use by x"]
    assert usage.conflicts(nodes["nvme1n1"], "y", "vg:g") == ["use by x"]
    assert usage.conflicts(nodes["id-c"], "y", "device") == []


def usage_of(pool: str, role: str):  # type: ignore[no-untyped-def]
    from agent.target.usage import DeviceUse

    return DeviceUse(pool, role, f"use by {pool}")


def test_roles_that_may_share_and_those_that_may_not(nodes: dict[str, str]) -> None:
    a, c = nodes["id-a"], nodes["id-c"]
    # The config refuses one path in two pools; two names of one node get past it.
    configured = listed(lvm_spec("l1", "vgk", a), lvm_spec("l3", "other", nodes["nvme2n1"]),
                        device("d1", c))
    usage = device_usage(configured, {}, {}, {}, resolve=resolve)
    assert usage.conflicts(a, "l1", "vg:vgk") == []
    # Another pool carving the same volume group from the same device: fine.
    assert usage.conflicts(nodes["id-b"], "l2", "vg:vgk") == []
    # A device pool and another volume group on one device: both refused.
    assert usage.conflicts(nodes["nvme2n1"], "l3", "vg:other") == [
        f"listed by pool d1 (kind: device) as {c}"]
    assert usage.conflicts(c, "d1", "device") == [
        f"listed by pool l3 as {nodes['nvme2n1']} for volume group other"]
    # A device pool and another device pool.
    assert usage.conflicts(c, "d2", "device") == [
        f"listed by pool l3 as {nodes['nvme2n1']} for volume group other",
        f"listed by pool d1 (kind: device) as {c}"]


def test_claims_and_exports(nodes: dict[str, str]) -> None:
    a, b, c = nodes["id-a"], nodes["id-b"], nodes["id-c"]
    usage = device_usage(listed(device("d1", a)), {b: DeviceClaim(b, "d1", "gpu-1", "/dev/x")},
                         {nodes["nvme1n1"]: "nqn.x:stor:d1:gpu-1", c: "nqn.foreign:thing"},
                         {"nqn.x:stor:d1:gpu-1": "d1", "nqn.foreign:thing": None},
                         resolve=resolve)
    # The pool's own listing, claim (under another alias) and export are its own use.
    assert usage.conflicts(a, "d1", "device") == []
    # Anyone else: refused, with every reason.
    found = usage.conflicts(a, "d2", "device")
    assert found == [f"listed by pool d1 (kind: device) as {a}",
                     f"claimed by pool d1 as {b} (kvagent exports it whole; kvagent pool "
                     "destroy releases it)",
                     "exported by nvmet subsystem nqn.x:stor:d1:gpu-1"]
    assert len(usage.conflicts(a, "l1", "vg:vgk")) == 3
    # A device exported by a subsystem kvagent does not own is nobody's to take.
    assert usage.conflicts(c, "d1", "device") == ["exported by nvmet subsystem nqn.foreign:thing"]
    # A claim made under a pool's name is not an LVM pool's of the same name.
    assert usage.conflicts(b, "d1", "vg:vgk") != []


def lvm_runner() -> FakeRunner:
    return (FakeRunner().on(["vgs"], stdout=json.dumps({"report": [{"vg": []}]}))
            .on(["lvs"], stdout=json.dumps({"report": [{"lv": []}]}))
            .on(["vgcreate"]).on(["lvcreate"]))


def test_a_volume_group_two_pools_share_is_created_once(nodes: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    a, c = nodes["id-a"], nodes["id-c"]
    monkeypatch.setattr(lvm, "ensure_blank", lambda dev, purpose, runner: dev + "!")
    monkeypatch.setattr(lvm, "device_bytes", lambda dev, sysfs: 1 << 40)
    # One at a time: the config refuses these together; the plan must be safe anyway.
    cfg = config(lvm_spec("l1", "vgk", a))
    ctx = context(cfg, lvm_runner())
    (p1,), (p2,), (p3,) = (pools(lvm_spec("l1", "vgk", a)), pools(lvm_spec("l2", "vgk")),
                           pools(lvm_spec("l3", "vgk", c)))
    one, two, three = (driver_for(p).plan(ctx, p) for p in (p1, p2, p3))
    assert [s.kind for s in one.steps] == ["lvm.intent", "lvm.pvcreate", "lvm.vgcreate",
                                           "lvm.lvcreate"]
    assert [s.kind for s in two.steps] == ["lvm.lvcreate"] and not two.errors
    assert three.steps == []
    assert three.errors == [f"pool l3: volume group vgk is created by pool l1 on {a}; list "
                            "the same devices (or none) here"]
