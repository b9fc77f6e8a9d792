"""Growth on the GPU host: namespaces added by a storage host are mounted by identity
(storage node + nsid) beside the others, never by position; a grown namespace gets
xfs_growfs; host entries are matched by NQN, a differing name is a warning (fake host:
tests/unit/initiator/attach_fakes.py; the real kernel: tests/kernel/test_cache_failfast.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.cli.apply_cmd import _text
from agent.naming import filesystem_uuid
from nvmet.ids import namespace_uuid

from .attach_fakes import GIB, HOST, PREFIX, Export, FakeHost
from .test_attach_reconcile import kinds, pool_yaml, run, state

STORE0 = f"{PREFIX}:store0:kv:gpu0"
STORE1 = f"{PREFIX}:store1:kv:gpu0"
MIB = 1 << 20


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = FakeHost(tmp_path, exports=[Export(STORE0, [1]), Export(STORE1, [1])])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    return h


def mount(host: FakeHost, node: str, nsid: int) -> str:
    return str(host.root / "mnt/kv" / f"{node}-ns{nsid}")


def fs_uuid(nqn: str, nsid: int) -> str:
    return str(filesystem_uuid(HOST, namespace_uuid(nqn, nsid)))


def mounted_uuids(host: FakeHost) -> dict[str, str]:
    return {m: host.content[src]["UUID"] for m, src in host.mounts().items()}


# ------------------------------------------------------- more namespaces, by identity

def test_one_storage_host_adding_a_namespace_moves_no_mount(host: FakeHost) -> None:
    """The issue's bug: with mounts by position (ns1..nsN across subsystems), store0's
    second namespace took ns2, which store1's namespace held ("ns2 already has
    /dev/nvme3n1 mounted"), and every later apply failed."""
    pools = pool_yaml(host, engines="lmcache")
    assert run(host, pools).ok
    before = mounted_uuids(host)
    host.add_namespaces(STORE0, 2)  # store0 grows its namespace count
    grown = run(host, pools)
    assert grown.ok, grown.errors  # by position: ".../ns2 already has /dev/nvme3n1 mounted"
    after = mounted_uuids(host)
    assert {m: after[m] for m in before} == before, "a mount moved"
    assert before == {mount(host, "store0", 1): fs_uuid(STORE0, 1),
                      mount(host, "store1", 1): fs_uuid(STORE1, 1)}
    assert [a.subject for a in grown.actions if a.kind == "mount"] == [mount(host, "store0", 2)]
    assert after == {**before, mount(host, "store0", 2): fs_uuid(STORE0, 2)}
    rec = state(host)["kv"]
    assert [(d.subsysnqn, d.nsid, d.mount) for d in rec.devices] == [
        (STORE0, 1, mount(host, "store0", 1)), (STORE0, 2, mount(host, "store0", 2)),
        (STORE1, 1, mount(host, "store1", 1))]
    assert os.path.isdir(os.path.join(mount(host, "store0", 2), "lmcache"))
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions


def old_format(host: FakeHost) -> None:
    """Rewrite the record and the mounts as an older kvagent left them: devices without
    their mount, mounts <mount>/ns1..nsN by position."""
    path = host.root / "state/initiator.json"
    data = json.loads(path.read_text())
    pool = data["pools"]["kv"]
    renamed = {}
    for i, dev in enumerate(pool["devices"], 1):
        renamed[dev.pop("mount")] = str(host.root / "mnt/kv" / f"ns{i}")
    for old, new in renamed.items():
        device = host.mounts()[old]
        host.runner(["umount", old])
        os.rmdir(old)
        os.makedirs(new)
        host.runner(["mount", "-t", "xfs", "-o", "noatime,prjquota", device, new])
    pool["mounts"] = [renamed[m] for m in pool["mounts"]]
    pool["created_dirs"] = [d for d in pool["created_dirs"] if d not in renamed]
    path.write_text(json.dumps(data))


def test_a_pool_attached_by_an_older_version_keeps_its_mounts(host: FakeHost) -> None:
    pools = pool_yaml(host, engines="")
    assert run(host, pools).ok
    old_format(host)
    ns1, ns2 = (str(host.root / "mnt/kv" / f"ns{i}") for i in (1, 2))
    assert mounted_uuids(host) == {ns1: fs_uuid(STORE0, 1), ns2: fs_uuid(STORE1, 1)}
    upgraded = run(host, pools)
    assert upgraded.ok and not [a for a in upgraded.actions if a.status == "done"], \
        upgraded.actions
    assert [d.mount for d in state(host)["kv"].devices] == [ns1, ns2]  # recorded now
    host.add_namespaces(STORE0, 2)
    grown = run(host, pools)
    assert grown.ok, grown.errors
    assert mounted_uuids(host) == {ns1: fs_uuid(STORE0, 1), ns2: fs_uuid(STORE1, 1),
                                   mount(host, "store0", 2): fs_uuid(STORE0, 2)}


def test_an_old_record_left_half_done_finds_its_mounts_in_the_mount_table(
        host: FakeHost) -> None:
    """A record whose devices and mounts do not pair up (an interrupted attach) is not
    paired by position: each device keeps the recorded mount it is mounted on."""
    pools = pool_yaml(host, engines="")
    assert run(host, pools).ok
    old_format(host)
    path = host.root / "state/initiator.json"
    data = json.loads(path.read_text())
    data["pools"]["kv"]["mounts"].insert(0, str(host.root / "mnt/kv/ns9"))
    data["pools"]["kv"]["complete"] = False
    path.write_text(json.dumps(data))
    result = run(host, pools)
    assert result.ok and "mount" not in kinds(result), result.actions
    assert [d.mount for d in state(host)["kv"].devices] == [
        str(host.root / "mnt/kv/ns1"), str(host.root / "mnt/kv/ns2")]


def test_a_subsystem_outside_the_prefix_is_named_by_a_hash(host: FakeHost) -> None:
    foreign = "nqn.2014-08.org.example:array7"
    host.exports = [Export(foreign, [3])]
    result = run(host, pool_yaml(host, engines="", subsystem=foreign))
    assert result.ok, result.errors
    [where] = host.mounts()
    name = os.path.basename(where)
    assert name.startswith("s") and name.endswith("-ns3") and len(name) == len("s12345678-ns3")


# ---------------------------------------------------------------- bigger namespaces

def test_a_grown_namespace_gets_xfs_growfs_and_the_engines_probe_again(
        host: FakeHost) -> None:
    pools = pool_yaml(host, engines="lmcache")
    assert run(host, pools).ok
    probed = len(host.probed)
    host.resize(STORE1, 1, 2 * GIB)
    grown = run(host, pools)
    assert grown.ok, grown.errors
    [growfs] = host.runner.ran("xfs_growfs")
    assert growfs == ("xfs_growfs", "-d", mount(host, "store1", 1))
    [act] = [a for a in grown.actions if a.kind == "xfs.grow"]
    assert act.subject == mount(host, "store1", 1) and f"-> {2 * GIB} bytes" in act.detail
    assert len(host.probed) > probed, "the hand-off re-probes: engine caps follow the size"
    calls = len(host.runner.calls)
    again = run(host, pools)
    assert again.ok and not again.changed
    assert [c for c in host.runner.calls[calls:] if c[0] != "nvme"] == []  # discovery only


def test_a_few_mebibytes_more_are_not_worth_a_grow(host: FakeHost) -> None:
    """mkfs.xfs leaves up to 16 MiB unused and growfs a tail under 64 blocks: below
    16 MiB more than the filesystem, a converged pass runs no xfs_growfs."""
    pools = pool_yaml(host, engines="")
    assert run(host, pools).ok
    host.resize(STORE1, 1, GIB + 15 * MIB)
    assert not run(host, pools).changed
    host.resize(STORE1, 1, GIB + 16 * MIB)
    assert "xfs.grow" in kinds(run(host, pools))


def test_plan_shows_a_grow_and_runs_none(host: FakeHost) -> None:
    pools = pool_yaml(host, engines="")
    assert run(host, pools).ok
    host.resize(STORE0, 1, 3 * GIB)
    plan = run(host, pools, dry_run=True)
    assert [a.kind for a in plan.actions if a.status == "planned"] == ["xfs.grow"]
    assert host.runner.ran("xfs_growfs") == []


def test_a_striped_volume_is_not_grown(host: FakeHost) -> None:
    pools = pool_yaml(host, engines="", layout="striped")
    assert run(host, pools).ok
    host.resize(STORE0, 1, 3 * GIB)
    again = run(host, pools)
    assert again.ok and not again.changed and host.runner.ran("xfs_growfs") == []


# ------------------------------------------------------------- host entry by NQN

def test_a_host_entry_named_differently_attaches_with_a_warning(host: FakeHost) -> None:
    """The storage host lists this host's NQN under another name: its discovery log
    offers that subsystem to this NQN only, so it is this host's."""
    renamed = f"{PREFIX}:store1:kv:gpu-old"
    host.exports = [Export(renamed, [1])]
    result = run(host, pool_yaml(host, engines=""))
    assert result.ok, result.errors
    assert host.mounts() == {mount(host, "store1", 1): "/dev/nvme2n1"}
    [warning] = result.warnings
    assert warning.pool == "kv" and renamed in warning.message
    assert "'gpu-old'" in warning.message and "'gpu0'" in warning.message
    assert f"warning: [initiator/kv] {renamed} is named for host 'gpu-old'" in _text(result)
    assert result.to_json()["warnings"] == [
        {"role": "initiator", "pool": "kv", "message": warning.message}]
    assert not run(host, pool_yaml(host, engines="")).changed


def test_the_matching_name_gives_no_warning(host: FakeHost) -> None:
    result = run(host, pool_yaml(host, engines=""))
    assert result.ok and result.warnings == []
