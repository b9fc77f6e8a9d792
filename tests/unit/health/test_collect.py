"""The collector over a kernel-like fake configfs: healthy, degraded and failed target pools."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from agent.config import parse_config
from agent.health.collect import collect
from agent.health.snapshot import exit_code
from agent.health.status import load_status_schema, to_status_json
from agent.result import RunResult
from agent.target.reconcile import TargetPass
from nvmet.fake import FakeConfigFS
from tests.unit.fakerunner import FakeRunner

HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def make_config(tmp: Path):
    return parse_config(yaml.safe_dump({
        "version": 1,
        "node": {"name": "stor", "state_dir": str(tmp / "state"), "run_dir": str(tmp / "run"),
                 "sysfs": str(tmp / "sys")},
        "target": {
            "ports": [{"name": "lo", "id": 3, "transport": "tcp", "address": "127.0.0.1"}],
            "pools": [{"name": "kv", "backing": {"kind": "file", "directory": str(tmp / "f")},
                       "namespaces": {"count": 2, "size": "4MiB"}, "ports": ["lo"],
                       "hosts": [{"name": "gpu", "nqn": HOST}]}]}}))


def applied(tmp: Path):
    cfg = make_config(tmp)
    fs = FakeConfigFS()
    for i in (1, 2):
        fs.add_device(str(tmp / f"f/kv/gpu/ns{i}.img"), "file")
    result = RunResult(dry_run=False)
    TargetPass(cfg, FakeRunner().on(["modprobe"]), result, fs=fs).run()
    assert result.ok, result.errors
    return cfg, fs


def test_exported_pool_is_ok(tmp_path: Path) -> None:
    cfg, fs = applied(tmp_path)
    fs.files_read.clear()
    snap = collect(cfg, FakeRunner(), fs=fs, drives=False)
    # Every collect reads nvmet: only the namespaces' enable and the subsystems'
    # attr_allow_any_host (names and links are listings; agent.health.drift).
    assert {p.rsplit("/", 1)[1] for p in fs.files_read} == {"enable", "attr_allow_any_host"}
    assert len(fs.files_read) == 3 and max(fs.files_read.values()) == 1
    (pool,) = snap.pools
    assert (pool.state, pool.ready, pool.problems) == ("ok", True, ())
    t = pool.target
    assert (t.subsystems_present, t.namespaces_enabled, t.ports_linked) == (1, 2, 1)
    assert t.hosts_connected is None  # nvmet on this kernel does not show connected hosts
    jsonschema.validate(to_status_json(snap), load_status_schema())
    assert exit_code(snap) == 0


def test_unlinked_port_fails_and_disabled_namespace_degrades(tmp_path: Path) -> None:
    cfg, fs = applied(tmp_path)
    nqn = "nqn.2026-11.io.kvagent:stor:kv:gpu"
    fs.write(f"subsystems/{nqn}/namespaces/2/enable", "0")
    (pool,) = collect(cfg, FakeRunner(), fs=fs, drives=False).pools
    assert pool.state == "degraded" and not pool.ready
    assert pool.problems == ("1 of 2 namespaces enabled",)
    fs.unlink(f"ports/3/subsystems/{nqn}")
    snap = collect(cfg, FakeRunner(), fs=fs, drives=False)
    (pool,) = snap.pools
    assert pool.state == "failed"
    assert any("not exported" in p and "port 3" in p for p in pool.problems)
    assert exit_code(snap) == 1


def test_initiator_pool_never_attached_is_failed(tmp_path: Path) -> None:
    cfg = parse_config(yaml.safe_dump({
        "version": 1, "node": {"name": "gpu", "state_dir": str(tmp_path / "state"),
                               "sysfs": str(tmp_path / "sys")},
        "initiator": {"pools": [{"name": "kv", "mount": str(tmp_path / "mnt"),
                                 "target": {"transport": "tcp", "address": "10.0.0.1"}}]}}))
    (tmp_path / "sys/class/nvme").mkdir(parents=True)
    (pool,) = collect(cfg, FakeRunner(), drives=False).pools
    assert (pool.role, pool.state, pool.ready) == ("initiator", "failed", False)
    assert "not attached" in pool.problems[0]


def test_a_pools_errors_in_the_last_apply_degrade_it(tmp_path: Path) -> None:
    """A namespace withheld or refused by the last apply shows in the pool's health."""
    from agent.records import write_last_apply

    cfg, fs = applied(tmp_path)
    result = RunResult(dry_run=False)
    result.error("target", "kv", "pool kv: /dev/disk/by-id/x now leads to another device")
    result.error("target", "other", "not this pool")
    write_last_apply(cfg.node.state_dir, result.to_json())
    (pool,) = collect(cfg, FakeRunner(), fs=fs, drives=False).pools
    assert (pool.state, pool.ready) == ("degraded", False)
    assert pool.problems == ("last apply: pool kv: /dev/disk/by-id/x now leads to another "
                             "device",)


def test_a_shut_down_xfs_is_a_problem_and_recoveries_come_from_the_records(
        tmp_path: Path) -> None:
    from agent.fabrics import FabricsAddress
    from agent.records import (
        AttachedDevice,
        InitiatorRecords,
        MountRecovery,
        PoolAttachment,
        SubsystemPath,
    )
    from tests.unit.initiator.fakesysfs import FakeSysfs

    nqn = "nqn.2026-11.io.kvagent:stor:kv:gpu"
    mounts = [str(tmp_path / "mnt/kv" / f"stor-ns{i}") for i in (1, 2)]
    for m in mounts:
        Path(m).mkdir(parents=True)
    cfg = parse_config(yaml.safe_dump({
        "version": 1, "node": {"name": "gpu", "state_dir": str(tmp_path / "state"),
                               "sysfs": str(tmp_path / "sys")},
        "initiator": {"pools": [{"name": "kv", "mount": str(tmp_path / "mnt/kv"),
                                 "target": {"transport": "tcp", "address": "10.0.0.1"}}]}}))
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_controller(2, subsysnqn=nqn, hostnqn=HOST)
    fake.add_subsystem(2, nqn, controllers=(2,))
    for i in (1, 2):
        fake.add_namespace(2, i, f"0000000{i}-0000-4000-8000-000000000000",
                           paths=((2, "optimized"),))
    InitiatorRecords.save(cfg.node.state_dir, {"kv": PoolAttachment(
        HOST, subsystems=[SubsystemPath(nqn, FabricsAddress("tcp", "10.0.0.1", "4420"))],
        devices=[AttachedDevice(nqn, i, f"0000000{i}-0000-4000-8000-000000000000",
                                f"/dev/nvme2n{i}", mounts[i - 1]) for i in (1, 2)],
        mounts=mounts, complete=True,
        recoveries=[MountRecovery(mounts[0], 2, 1_767_000_000.0),
                    MountRecovery(mounts[1], 1, 1_767_100_000.0)])})
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("".join(f"9{i} 1 259:{i} / {m} rw - xfs /dev/nvme2n{i} rw,prjquota\n"
                                 for i, m in enumerate(mounts, 1)))
    for i in (1, 2):  # the namespaces' block devices
        (tmp_path / "sys/dev/block" / f"259:{i}").mkdir(parents=True)
    dead: set[str] = set()

    def snap():
        return collect(cfg, FakeRunner(), drives=False, mountinfo=mountinfo,
                       shut_down=lambda m: m in dead)

    (pool,) = snap().pools
    assert (pool.state, pool.problems) == ("ok", ())
    assert pool.initiator.recoveries == 3 and pool.initiator.last_recovery_at == 1_767_100_000.0
    dead.add(mounts[0])
    s = snap()
    (pool,) = s.pools
    assert pool.state == "degraded" and not pool.ready
    assert pool.initiator.mounts_shut_down == (mounts[0],)
    [problem] = pool.problems
    assert problem.startswith(f"filesystem shut down after I/O errors (a storage outage): "
                              f"{mounts[0]}")
    jsonschema.validate(to_status_json(s), load_status_schema())
    dead.add(mounts[1])
    (pool,) = snap().pools
    assert pool.state == "failed", "every mount of the pool is unusable"
    dead.clear()
    # A mount whose block device is gone (the namespace went away while it was mounted):
    # unusable, said so, and no longer a mount of the pool for drift.
    (tmp_path / "sys/dev/block/259:2").rmdir()
    s = snap()
    (pool,) = s.pools
    assert pool.state == "degraded" and pool.initiator.mounts_shut_down == (mounts[1],)
    [problem] = pool.problems
    assert problem.startswith("filesystem on a namespace that went away while it was "
                              f"mounted: {mounts[1]}")
    assert {s for k, s, _v in s.facts[("initiator", "kv")] if k == "mount"} == {mounts[0]}
