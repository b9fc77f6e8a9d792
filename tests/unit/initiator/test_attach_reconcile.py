"""The GPU-host attach pass (InitiatorPass) over a fake host: nvme-cli, sysfs, blkid, mkfs,
mount, LVM (tests/unit/initiator/attach_fakes.py). The kernel tier proves the same flows
on a real 6.1 kernel (tests/kernel/test_attach_pools.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from agent import failpoints
from agent.engines.handoff import forget, hand_off
from agent.fabrics import FabricsAddress
from agent.initiator.devices import UdevWaiter
from agent.initiator.reconcile import InitiatorPass, load_state, merge_record
from agent.initiator.sysfs import Sysfs
from agent.naming import filesystem_uuid
from agent.records import InitiatorRecords, PoolAttachment, SubsystemPath
from agent.result import RunResult
from agent.system.run import CommandResult, CommandTimeout
from nvmet.ids import namespace_uuid

from .attach_fakes import HOST, PREFIX, Export, FakeHost

NQN = f"{PREFIX}:store1:kv:gpu0"
SHARED = f"{PREFIX}:store1:kv"
UID, GID = os.getuid(), os.getgid()


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = FakeHost(tmp_path, exports=[Export(NQN, [1, 2])])
    # prepare() insists on real mount points; the fake's mounts live in its mountinfo.
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    return h


def pool_yaml(host: FakeHost, *, name: str = "kv", layout: str = "per-namespace",
              shared: bool = False, engines: str = "lmcache, vllm", mount: str | None = None,
              subsystem: str | None = None) -> str:
    more = {"vllm": ", cpu_cache: 1GiB"}  # vLLM's renderer refuses without its CPU tier
    eng = ", ".join(f"{{kind: {k.strip()}, owner: '{UID}', group: '{GID}'"
                    f"{more.get(k.strip(), '')}}}"
                    for k in engines.split(",") if k.strip())
    sub = f", subsystem: '{subsystem}'" if subsystem else ""
    return f"""
    - name: {name}
      target: {{transport: tcp, address: 10.0.0.1{sub}}}
      mount: {mount or host.root / 'mnt' / name}
      layout: {layout}
      shared: {str(shared).lower()}
      engines: [{eng}]
"""


def run(host: FakeHost, pools: str = "", *, dry_run: bool = False,
        rediscover: bool = True, wait_reconnects: bool = True) -> RunResult:
    body = f"initiator:\n  device_wait: 5s\n  pools:\n{pools}" if pools else ""
    cfg = host.config(body)
    result = RunResult(dry_run=dry_run)
    # What agent.reconcile.run_pass does around the initiator: the engines' hand-off.
    initiator = InitiatorPass(cfg, host.runner, result, dry_run=dry_run, sysfs=host.sysfs,
                              cli=host.cli, seams=host.seams(), rediscover=rediscover,
                              wait_reconnects=wait_reconnects)
    for name in initiator.detach_removed():
        forget(cfg, name, result, dry_run=dry_run)
    for m in initiator.attach_configured():
        hand_off(cfg, m.pool, m.mounts, m.transport, m.remounted, result, probe=host.probe,
                 fresh=m.fresh)
    return result


def kinds(result: RunResult, status: str = "done") -> list[str]:
    return [a.kind for a in result.actions if a.status == status]


def state(host: FakeHost) -> dict:
    return load_state(host.root / "state")


def ns_mounts(host: FakeHost, n: int = 2, name: str = "kv", node: str = "store1") -> list[str]:
    """Where namespaces 1..n of storage node ``node`` are mounted: by identity."""
    return [str(host.root / "mnt" / name / f"{node}-ns{i}") for i in range(1, n + 1)]


# ------------------------------------------------------------------ attach

def test_one_apply_connects_formats_mounts_probes_and_renders(host: FakeHost) -> None:
    result = run(host, pool_yaml(host))
    assert result.ok, result.errors
    assert kinds(result).count("nvme.connect") == 1
    assert kinds(result).count("mkfs.xfs") == 2 and kinds(result).count("mount") == 2
    assert "engine.dir" in kinds(result) and "engine.render" in kinds(result)
    mounts = ns_mounts(host)
    assert host.mounts() == dict(zip(mounts, ["/dev/nvme2n1", "/dev/nvme2n2"], strict=True))
    for nsid in (1, 2):
        uuid = str(filesystem_uuid(HOST, namespace_uuid(NQN, nsid)))
        assert host.content[f"/dev/nvme2n{nsid}"]["UUID"] == uuid
    assert host.probed == mounts
    probes = json.loads((host.root / "state/probes/kv.json").read_text())
    assert [p["path"] for p in probes] == mounts
    renders = host.root / "state/engines/kv"
    assert sorted(p.name for p in renders.iterdir()) == ["lmcache", "vllm"]
    assert "file://" + mounts[0] + "/lmcache/" in (renders / "lmcache/lmcache.yaml").read_text()
    rec = state(host)["kv"]
    assert rec.complete and rec.mounts == mounts and rec.hostnqn == HOST
    assert [s.subsysnqn for s in rec.subsystems] == [NQN]
    assert str(host.root / "mnt") in rec.created_dirs


@pytest.mark.parametrize("layout", ["per-namespace", "striped"])
def test_second_apply_takes_no_step(host: FakeHost, layout: str) -> None:
    """A converged pass runs no command that changes anything and rewrites no record."""
    run(host, pool_yaml(host, layout=layout))
    calls = len(host.runner.calls)
    record = host.root / "state" / "initiator.json"
    before = record.stat()
    again = run(host, pool_yaml(host, layout=layout))
    assert again.ok and not again.changed, again.actions
    steps = [c for c in host.runner.calls[calls:] if failpoints.changes_something(c)]
    assert steps == []
    if layout == "striped":  # sysfs shows the volume over its namespaces: no LVM at all
        assert not [c for c in host.runner.calls[calls:] if c[0] in ("pvs", "lvs", "vgs")]
    after = record.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), \
        "the converged pass rewrote initiator.json"


def test_a_converged_pass_runs_no_command_when_sysfs_answers(host: FakeHost) -> None:
    """Connected, mounted, nothing changed: no nvme-cli, no blkid, no mount, no modprobe
    (the modules are loaded): controllers, namespaces and devices come from sysfs, the
    filesystems' identity from their superblocks."""
    for module in ("nvme_fabrics", "nvme_tcp"):
        (host.root / "sys/module" / module).mkdir(parents=True)
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    calls = len(host.runner.calls)
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions
    assert host.runner.calls[calls:] == []


def test_a_converged_pass_reads_each_subsystem_once_and_starts_no_process(
        host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """No process outside the runner either: the udev monitor (pyudev finds libudev by
    running ldconfig) is only set up to wait for a namespace that is missing; the
    subsystem's namespaces are read from sysfs once per pass."""
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    reads: list[str] = []
    real = Sysfs.subsystem_namespaces
    monkeypatch.setattr(Sysfs, "subsystem_namespaces",
                        lambda self, nqn: reads.append(nqn) or real(self, nqn))
    monkeypatch.setattr(UdevWaiter, "__enter__",
                        lambda self: pytest.fail("a udev monitor in a converged pass"))
    monkeypatch.setattr(subprocess.Popen, "__init__",
                        lambda *a, **k: pytest.fail(f"a process outside the runner: {a[1:]}"))
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions
    assert reads == [NQN]


def test_a_pass_reads_the_attachment_records_once(
        host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Detach and attach share one reading of ``initiator.json`` (the pass's own saves
    change that same copy): a pass that drops one pool and keeps another reads it once,
    and the record it leaves is what it did."""
    host.exports = [Export(NQN, [1]), Export(f"{PREFIX}:store1:kept:gpu0", [1], traddr="10.0.0.2")]
    kept = pool_yaml(host, name="kept", engines="").replace("10.0.0.1", "10.0.0.2")
    assert run(host, pool_yaml(host, name="kv", engines="") + kept).ok
    loads: list[object] = []
    real = InitiatorRecords.load
    monkeypatch.setattr(InitiatorRecords, "load",
                        staticmethod(lambda d: loads.append(d) or real(d)))
    result = run(host, kept)
    assert result.ok, result.errors
    assert len(loads) == 1
    assert kinds(result) == ["umount", "nvme.disconnect", "rmdir", "rmdir"]  # kv's only
    assert set(state(host)) == {"kept"}


def test_a_pass_reads_the_huge_page_mode_once(host: FakeHost) -> None:
    """The transparent-huge-page mode (for the loopback NVMe/TCP warning) is the host's:
    a pass of two pools reads it once, not once per pool."""
    host.exports = [Export(NQN, [1]), Export(f"{PREFIX}:store1:kept:gpu0", [1], traddr="10.0.0.2")]
    kept = pool_yaml(host, name="kept", engines="").replace("10.0.0.1", "10.0.0.2")
    pools = pool_yaml(host, name="kv", engines="") + kept
    for _ in range(2):  # the attaching pass and a converged one
        before = host.thp_reads
        assert run(host, pools).ok
        assert host.thp_reads - before == 1


def test_list_ns_asks_the_controller_when_sysfs_lacks_a_recorded_namespace(
        host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    head = host.root / "sys/block/nvme2n2"
    target = head.resolve()
    head.unlink()  # the kernel dropped the block device (e.g. the namespace went away)
    calls = len(host.runner.calls)
    result = run(host, pools)
    assert host.runner.ran("nvme", "list-ns")[-1:] == [("nvme", "list-ns", "/dev/nvme2")]
    assert ("nvme", "list-ns", "/dev/nvme2") in host.runner.calls[calls:]
    assert not result.ok  # its device is missing: waited for, then reported
    head.symlink_to(target)


def test_converged_apply_reuses_the_recorded_probes(host: FakeHost) -> None:
    """Probing writes real data: a pass that mounted nothing new does not probe again."""
    run(host, pool_yaml(host))
    first = list(host.probed)
    run(host, pool_yaml(host))
    assert host.probed == first


def test_plan_changes_nothing(host: FakeHost) -> None:
    plan = run(host, pool_yaml(host), dry_run=True)
    assert plan.ok and plan.changed
    assert kinds(plan, "planned") == ["nvme.connect", "attach"]
    assert host.runner.ran("nvme", "connect") == [] and host.runner.ran("mkfs.xfs") == []
    assert not (host.root / "state/initiator.json").exists()


def test_plan_of_an_attached_pool_is_empty(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    plan = run(host, pool_yaml(host), dry_run=True)
    assert plan.ok and not plan.changed, plan.actions


def test_own_filesystem_is_mounted_again_without_mkfs(host: FakeHost) -> None:
    """After a reboot: the xfs carries this host's deterministic uuid, so it is kept."""
    for nsid in (1, 2):
        host.content[f"/dev/nvme2n{nsid}"] = {
            "TYPE": "xfs", "UUID": str(filesystem_uuid(HOST, namespace_uuid(NQN, nsid))).upper()}
    result = run(host, pool_yaml(host))
    assert result.ok, result.errors
    assert host.runner.ran("mkfs.xfs") == [] and kinds(result).count("mount") == 2


@pytest.mark.parametrize("props", [
    {"TYPE": "ext4", "UUID": "3f1d2c4b-0000-4000-8000-000000000001"},
    {"TYPE": "xfs", "UUID": "3f1d2c4b-0000-4000-8000-000000000002"},
    {"PTTYPE": "gpt"},
])
def test_foreign_content_is_refused_and_the_connection_is_recorded(host: FakeHost,
                                                                   props: dict) -> None:
    host.content["/dev/nvme2n2"] = dict(props)
    result = run(host, pool_yaml(host))
    [error] = result.errors
    assert error.pool == "kv" and "refusing to format /dev/nvme2n2" in error.message
    assert error.hint and "never" in error.hint
    assert host.content["/dev/nvme2n2"] == props
    assert [c[-1] for c in host.runner.ran("mkfs.xfs")] == ["/dev/nvme2n1"]
    rec = state(host)["kv"]
    assert not rec.complete and [s.subsysnqn for s in rec.subsystems] == [NQN]

    # The pool leaves the config: what the failed attach did is undone.
    detached = run(host)
    assert detached.ok, detached.errors
    assert host.mounts() == {} and host.sysfs.controllers() == []
    assert state(host) == {}


def test_shared_subsystem_refused_for_a_per_host_pool(host: FakeHost) -> None:
    host.exports = [Export(SHARED, [1])]
    result = run(host, pool_yaml(host, engines=""))
    [error] = result.errors
    assert "shared subsystem" in error.message and "shared: true" in error.hint
    assert host.runner.ran("nvme", "connect") == [] and state(host) == {}
    plan = run(host, pool_yaml(host, engines=""), dry_run=True)
    assert [e.message for e in plan.errors] == [error.message]


def test_shared_pool_connects_only(host: FakeHost) -> None:
    host.exports = [Export(SHARED, [1])]
    result = run(host, pool_yaml(host, shared=True, engines=""))
    assert result.ok, result.errors
    assert kinds(result) == ["nvme.connect", "nvme.timeout"]
    assert host.runner.ran("blkid") == [] and host.runner.ran("mkfs.xfs") == []
    assert host.mounts() == {} and not (host.root / "mnt").exists()
    assert state(host)["kv"].mounts == []
    gone = run(host)
    assert kinds(gone) == ["nvme.disconnect"] and host.sysfs.controllers() == []


def test_small_namespace_gets_a_clear_error_not_mkfs(host: FakeHost) -> None:
    host.exports = [Export(NQN, [1], size=256 << 20)]
    result = run(host, pool_yaml(host))
    [error] = result.errors
    assert "xfs needs at least 300000000 bytes" in error.message
    assert "namespaces.size" in error.hint
    assert host.runner.ran("mkfs.xfs") == []


def test_files_in_an_unmounted_mount_directory_are_not_hidden(host: FakeHost) -> None:
    ns1 = Path(ns_mounts(host)[0])
    ns1.mkdir(parents=True)
    (ns1 / "cache.bin").write_text("written while the pool was not mounted")
    result = run(host, pool_yaml(host))
    assert any("would hide them" in e.message for e in result.errors), result.errors
    assert str(ns1) not in host.mounts() and (ns1 / "cache.bin").exists()


def test_waits_for_a_reconnecting_controller_before_listing_namespaces(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    host.set_state("nvme2", "connecting")
    host.on_sleep = lambda: host.now >= 1.0 and host.set_state("nvme2", "live")
    result = run(host, pool_yaml(host))
    assert result.ok and not result.changed, result.errors
    assert sum(host.sleeps) >= 1.0


def test_controller_that_stays_down_is_reported_without_touching_mounts(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    host.set_state("nvme2", "connecting")
    listed = len(host.runner.ran("nvme", "list-ns"))
    result = run(host, pool_yaml(host))
    [error] = result.errors
    assert "no live controller" in error.message and "nvme2 connecting" in error.message
    assert len(host.runner.ran("nvme", "list-ns")) == listed
    assert len(host.mounts()) == 2 and state(host)["kv"].mounts == ns_mounts(host)


def test_the_agent_does_not_wait_for_a_reconnecting_controller(host: FakeHost) -> None:
    """The agent's passes (wait_reconnects off): a pool whose controllers are all
    reconnecting fails at once, mounts untouched; a wait held up every other pool, the
    collects and the heals for initiator.device_wait (a kernel test saw a minute)."""
    run(host, pool_yaml(host))
    host.set_state("nvme2", "connecting")
    result = run(host, pool_yaml(host), wait_reconnects=False)
    [error] = result.errors
    assert "no live controller" in error.message and "nvme2 connecting" in error.message
    assert host.sleeps == [] and len(host.mounts()) == 2
    host.set_state("nvme2", "resetting")  # a reset is over in moments: waited for
    host.on_sleep = lambda: host.now >= 1.0 and host.set_state("nvme2", "live")
    result = run(host, pool_yaml(host), wait_reconnects=False)
    assert result.ok and not result.changed, result.errors
    assert sum(host.sleeps) >= 1.0


# ------------------------------------------------------------------ detach

def test_detach_unmounts_disconnects_and_removes_what_it_made(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    result = run(host)
    assert result.ok, result.errors
    assert kinds(result)[:3] == ["umount", "umount", "nvme.disconnect"]
    assert host.mounts() == {} and host.sysfs.controllers() == []
    assert not (host.root / "mnt").exists()
    assert not (host.root / "state/engines/kv").exists()
    assert not (host.root / "state/probes/kv.json").exists()
    assert state(host) == {}
    assert run(host).actions == []


def test_detach_keeps_a_directory_it_did_not_make(host: FakeHost) -> None:
    (host.root / "mnt").mkdir()
    run(host, pool_yaml(host))
    run(host)
    assert (host.root / "mnt").is_dir() and not (host.root / "mnt/kv").exists()


def test_busy_mount_is_an_error_and_nothing_is_disconnected(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    host.busy.add(ns_mounts(host)[0])
    result = run(host)
    [error] = result.errors
    assert "is busy" in error.message and "never lazy-unmounts" in error.hint
    assert all("-l" not in c for c in host.runner.ran("umount"))
    assert host.runner.ran("nvme", "disconnect") == [] and "kv" in state(host)
    host.busy.clear()
    assert run(host).ok and state(host) == {}


def test_detach_leaves_a_filesystem_that_is_not_the_pools(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    mount = ns_mounts(host)[0]
    host.runner(["umount", mount])
    host.mount_line("/dev/sdz1", mount, number="8:17")
    result = run(host)
    [error] = result.errors
    assert "not unmounting" in error.message and "/dev/sdz1" in error.message
    assert mount in host.mounts() and "kv" in state(host)


def test_changed_mount_path_moves_the_pool(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    new = str(host.root / "elsewhere")
    result = run(host, pool_yaml(host, mount=new))
    assert result.ok, result.errors
    moved = [f"{new}/store1-ns1", f"{new}/store1-ns2"]
    assert sorted(host.mounts()) == moved and state(host)["kv"].mounts == moved


def test_engine_removed_from_config_loses_its_renders(host: FakeHost) -> None:
    run(host, pool_yaml(host))
    result = run(host, pool_yaml(host, engines="lmcache"))
    assert result.ok
    assert "engine.unrender" in kinds(result)
    assert [p.name for p in (host.root / "state/engines/kv").iterdir()] == ["lmcache"]


# ----------------------------------------------------------------- striped

def test_striped_pool_makes_one_tagged_volume_and_detaches_it(host: FakeHost) -> None:
    result = run(host, pool_yaml(host, layout="striped"))
    assert result.ok, result.errors
    [vgcreate] = host.runner.ran("vgcreate")
    assert vgcreate[-3:] == ("kvs_kv", "/dev/nvme2n1", "/dev/nvme2n2")
    assert {"kvagent", "kvagent_pool=kv", "kvagent_role=initiator"} <= set(vgcreate)
    [lvcreate] = host.runner.ran("lvcreate")
    assert lvcreate[lvcreate.index("-i") + 1] == "2"
    assert host.mounts() == {str(host.root / "mnt/kv"): "/dev/kvs_kv/data"}
    assert host.content["/dev/kvs_kv/data"]["TYPE"] == "xfs"
    assert kinds(result)[:4] == ["nvme.connect", "nvme.timeout", "lvm.striped", "mkfs.xfs"]

    again = run(host, pool_yaml(host, layout="striped"))
    assert again.ok and not again.changed and len(host.runner.ran("vgcreate")) == 1

    gone = run(host)
    assert gone.ok, gone.errors
    assert kinds(gone)[:3] == ["umount", "lvm.deactivate", "nvme.disconnect"]
    assert host.vgs["kvs_kv"]["active"] is False


def test_striped_detach_stops_when_the_volume_stays_active(host: FakeHost) -> None:
    run(host, pool_yaml(host, layout="striped"))
    host.refuse_vgchange_an = True
    result = run(host)
    [error] = result.errors
    assert "cannot deactivate volume group kvs_kv" in error.message
    assert host.runner.ran("nvme", "disconnect") == [] and "kv" in state(host)


# ------------------------------------------------------------------ records

def test_merge_keeps_what_a_failed_attach_did() -> None:
    a, b = (SubsystemPath(n, FabricsAddress("tcp", "10.0.0.1", "4420")) for n in ("a", "b"))
    old = PoolAttachment(HOST, subsystems=[a], mounts=["/m/ns1"], created_dirs=["/m"],
                         complete=True)
    failed = PoolAttachment(HOST, subsystems=[b], mounts=["/n/ns1"], created_dirs=["/n"])
    merged = merge_record(old, failed)
    assert merged.subsystems == [a, b]
    assert merged.mounts == ["/m/ns1", "/n/ns1"] and merged.created_dirs == ["/m", "/n"]
    done = merge_record(old, dataclasses.replace(failed, complete=True))
    assert done.subsystems == [b] and done.created_dirs == ["/m", "/n"]


# ------------------------------------------------------- several subsystems

def test_two_paths_to_one_subsystem_mount_each_namespace_once(host: FakeHost) -> None:
    host.exports = [Export(NQN, [1, 2]), Export(NQN, [1, 2], traddr="10.0.0.2")]
    pool = pool_yaml(host).replace(
        "target: {transport: tcp, address: 10.0.0.1}",
        "targets: [{transport: tcp, address: 10.0.0.1}, {transport: tcp, address: 10.0.0.2}]")
    result = run(host, pool)
    assert result.ok, result.errors
    assert kinds(result).count("nvme.connect") == 2 and len(host.sysfs.controllers()) == 2
    assert sorted(host.mounts()) == ns_mounts(host)
    assert run(host).ok and host.sysfs.controllers() == []


def test_namespaces_of_several_storage_hosts_are_mounted_by_storage_node_and_nsid(
        host: FakeHost) -> None:
    other = f"{PREFIX}:store0:kv:gpu0"
    host.exports = [Export(NQN, [1]), Export(other, [1])]  # discovery lists store1 first
    result = run(host, pool_yaml(host, engines=""))
    assert result.ok, result.errors
    by_mount = {m: host.content[src]["UUID"] for m, src in host.mounts().items()}
    assert by_mount == {
        ns_mounts(host, 1, node="store0")[0]: str(filesystem_uuid(HOST, namespace_uuid(other,
                                                                                       1))),
        ns_mounts(host, 1)[0]: str(filesystem_uuid(HOST, namespace_uuid(NQN, 1)))}
    rec = state(host)["kv"]
    assert {(d.subsysnqn, d.mount) for d in rec.devices} == {
        (other, ns_mounts(host, 1, node="store0")[0]), (NQN, ns_mounts(host, 1)[0])}


def multipath_pool(host: FakeHost) -> str:
    return pool_yaml(host).replace(
        "target: {transport: tcp, address: 10.0.0.1}",
        "targets: [{transport: tcp, address: 10.0.0.1}, {transport: tcp, address: 10.0.0.2}]")


def test_one_path_down_of_two_is_reported_but_the_pool_is_attached(host: FakeHost) -> None:
    host.exports = [Export(NQN, [1, 2]), Export(NQN, [1, 2], traddr="10.0.0.2")]
    host.unreachable.add("10.0.0.1")
    result = run(host, multipath_pool(host))
    [error] = result.errors
    assert "Connection refused" in error.message
    assert sorted(host.mounts()) == ns_mounts(host)
    assert [s.address.traddr for s in state(host)["kv"].subsystems] == ["10.0.0.2"]
    assert len([w for w in host.fabrics_writes if w["traddr"] == "10.0.0.1"]) == 5
    # (transient: retried, then given up)


def test_a_reconnecting_path_does_not_hold_up_a_live_one(host: FakeHost) -> None:
    host.exports = [Export(NQN, [1, 2]), Export(NQN, [1, 2], traddr="10.0.0.2")]
    run(host, multipath_pool(host))
    host.set_state("nvme2", "connecting")
    calls = len(host.runner.calls)
    result = run(host, multipath_pool(host))
    assert result.ok and not result.changed, result.errors
    # No wait for the reconnecting path, and nothing asked of it (sysfs answers here).
    assert host.sleeps == []
    assert ("nvme", "list-ns", "/dev/nvme2") not in host.runner.calls[calls:]


def test_the_only_path_down_fails_the_pool_and_records_nothing(host: FakeHost) -> None:
    host.unreachable.add("10.0.0.1")
    host.exports = [Export(NQN, [1, 2])]
    result = run(host, pool_yaml(host).replace("address: 10.0.0.1}",
                                               "address: 10.0.0.1, subsystem: '" + NQN + "'}"))
    [error] = result.errors
    assert "Connection refused" in error.message and "port up" in error.hint
    assert host.mounts() == {} and state(host) == {}


# ------------------------------------------------------------ crash safety

def test_each_step_is_recorded_before_it_is_taken(host: FakeHost,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill right after a connect, a mkdir or a mount leaves a record that finds it."""
    from agent.initiator.stages import connect as connect_stage
    from agent.initiator.stages import mount as mount_stage

    seen: dict[str, object] = {}
    real_connect, real_mkdir = connect_stage.connect, mount_stage.create_mount_point

    def connect(target, **kw):  # type: ignore[no-untyped-def]
        rec = state(host).get("kv")
        seen["connect"] = [s.subsysnqn for s in rec.subsystems] if rec else None
        return real_connect(target, **kw)

    def mkdir(path: str) -> list[str]:
        seen.setdefault("mkdir", state(host)["kv"].created_dirs)
        seen.setdefault("mounts", state(host)["kv"].mounts)
        return real_mkdir(path)

    monkeypatch.setattr(connect_stage, "connect", connect)
    monkeypatch.setattr(mount_stage, "create_mount_point", mkdir)
    assert run(host, pool_yaml(host)).ok
    assert seen["connect"] == [NQN]
    assert str(host.root / "mnt") in seen["mkdir"]  # type: ignore[operator]
    assert seen["mounts"] == ns_mounts(host)


def test_an_unexpected_error_fails_that_pool_only(host: FakeHost,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.initiator.stages import find as find_stage

    calls: list[int] = []
    real = find_stage.wait_for_namespaces

    def boom_once(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("a bug")
        return real(*a, **k)

    monkeypatch.setattr(find_stage, "wait_for_namespaces", boom_once)
    result = run(host, pool_yaml(host, name="kv", layout="striped", engines="")
                 + pool_yaml(host, name="two", engines="", subsystem=NQN))
    assert [(e.pool, e.message, e.unexpected) for e in result.errors] == [
        ("kv", "unexpected error: ZeroDivisionError: a bug", True)]
    assert result.unexpected_errors == 1
    assert state(host)["kv"].subsystems, "what was connected is recorded for a detach"
    assert state(host)["two"].complete


def test_detach_never_unmounts_over_a_dead_controller(host: FakeHost) -> None:
    """Storage host gone, the kernel reconnecting: umount would hang; kvagent reports."""
    assert run(host, pool_yaml(host)).ok
    host.set_state("nvme2", "connecting")
    result = run(host)
    (error,) = result.errors
    assert "no controller of the pool is live (nvme2 connecting)" in error.message
    assert "nvme disconnect" in (error.hint or "")
    assert host.runner.ran("umount") == [] and len(host.mounts()) == 2
    assert "kv" in state(host), "still recorded: detached once the storage answers"
    host.set_state("nvme2", "live")
    assert run(host).ok and host.mounts() == {} and state(host) == {}


DISCOVERY = "nqn.2014-08.org.nvmexpress.discovery"


def discovers(host: FakeHost) -> list[tuple[str, ...]]:
    return [c for c in host.runner.calls if c[:2] == ("nvme", "discover")]


def test_discovery_reads_through_this_hosts_own_discovery_controller(host: FakeHost) -> None:
    """A live persistent discovery controller of this host NQN at the target (the agent
    keeps one) is read through (``--device``); another host NQN's at the same address
    never is: nvme-cli would reuse it and read the log another host sees (the real
    kernel showed it), so without one of this host's the read makes its own (--force)."""
    host.sys.add_controller(7, subsysnqn=DISCOVERY, hostnqn="nqn.2014-08.org.example:other",
                            address="traddr=10.0.0.1,trsvcid=4420")
    assert run(host, pool_yaml(host)).ok
    [argv] = discovers(host)
    assert "--force" in argv and "--device" not in argv
    host.sys.add_controller(8, subsysnqn=DISCOVERY, hostnqn=HOST,
                            address="traddr=10.0.0.1,trsvcid=4420")
    host.sys.add_controller(9, subsysnqn=DISCOVERY, hostnqn=HOST,
                            address="traddr=10.0.0.2,trsvcid=4420")  # another target
    host.runner.calls.clear()
    assert run(host, pool_yaml(host)).ok
    [argv] = discovers(host)
    assert argv[argv.index("--device") + 1] == "nvme8" and "--force" not in argv


def test_a_read_through_a_discovery_controller_acknowledges_its_aens_first(
        host: FakeHost) -> None:
    """Reading through the agent's discovery controller first reads the log's header with
    Retain Asynchronous Event clear (nvme-cli 2.3's discover retains it once the log
    passes 4 KiB, and nvmet then sends no further AEN: a referral removed went unheard on
    the real kernel); before the read, so a change between the two still sends one. A
    read that makes its own controller acknowledges nothing; a failed acknowledgement
    does not stop the read."""
    assert run(host, pool_yaml(host)).ok
    assert not host.runner.ran("nvme", "get-log")  # (--force: a controller of its own)
    host.sys.add_controller(8, subsysnqn=DISCOVERY, hostnqn=HOST,
                            address="traddr=10.0.0.1,trsvcid=4420")
    host.runner.calls.clear()
    assert run(host, pool_yaml(host)).ok
    nvme = [c[:3] for c in host.runner.calls if c[0] == "nvme"]
    assert nvme[:2] == [("nvme", "get-log", "/dev/nvme8"), ("nvme", "discover", "--transport")]
    [ack] = host.runner.ran("nvme", "get-log")
    assert "--log-id=0x70" in ack and not any(a.startswith("--rae") for a in ack)
    # (a longer prefix than the fake host's own answer, so it is this one that answers)
    host.runner.on(["nvme", "get-log", "/dev/nvme8"], returncode=1,
                   stderr="get-log: Input/output error")
    host.runner.calls.clear()
    assert run(host, pool_yaml(host)).ok
    assert len(discovers(host)) == 1
    # A controller that does not answer the acknowledgement is not read as well: the
    # port fails as a timed-out read does (its only port: the pool fails), and what is
    # attached there stays.
    def hangs(argv: tuple[str, ...], _: str | None) -> CommandResult:
        raise CommandTimeout(argv, 45)
    host.runner.on_call(["nvme", "get-log", "/dev/nvme8", "--log-id=0x70"], hangs)
    host.runner.calls.clear()
    result = run(host, pool_yaml(host))
    assert not result.ok and "nvme get-log timed out after 45s" in str(result.errors)
    assert host.runner.ran("nvme", "get-log") and not discovers(host)
    assert not host.runner.ran("umount")
    assert not host.runner.ran("nvme", "disconnect")


def test_a_namespace_added_is_probed_alone(host: FakeHost) -> None:
    """The pool's existing mounts keep their recorded probes when a namespace is added:
    only the new mount is probed (each probe writes and preallocates; under TCG the
    hand-off of the tenth namespace waited 5 s for the nine probes before it)."""
    assert run(host, pool_yaml(host)).ok
    assert len(host.probed) == 2
    host.probed.clear()
    host.add_namespaces(NQN, 3)
    result = run(host, pool_yaml(host))
    assert result.ok
    assert [Path(p).name for p in host.probed] == ["store1-ns3"]
    host.probed.clear()
    assert run(host, pool_yaml(host)).ok and host.probed == []  # converged: none


def test_an_attach_pass_for_a_namespace_added_asks_no_discovery(host: FakeHost) -> None:
    """Without ``rediscover`` (the agent's attach pass for events that bring no new
    subsystem: a namespace added, a controller back) a pool attached in full takes the
    subsystems its record found at each target: no ``nvme discover`` (a command, and the
    storage host asked, per pool per event). A pool not attached in full yet, or any
    pass that rediscovers, asks."""
    assert run(host, pool_yaml(host), rediscover=False).ok
    assert len(discovers(host)) == 1, "nothing recorded yet: discovered"
    host.runner.calls.clear()
    host.add_namespaces(NQN, 3)
    result = run(host, pool_yaml(host), rediscover=False)
    assert result.ok and discovers(host) == []
    assert "store1-ns3" in {Path(m).name for m in host.mounts()}
    assert run(host, pool_yaml(host)).ok and len(discovers(host)) == 1


def test_a_volume_mounted_on_its_directory_is_not_read_again(host: FakeHost,
                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A converged pass reads no superblock of a mounted volume (its xfs was found this
    host's before kvagent mounted it there): an attach pass for a namespace added read
    every other namespace's first, over the fabric."""
    assert run(host, pool_yaml(host)).ok
    reads: list[str] = []
    real = host.superblocks.get
    monkeypatch.setattr(host, "superblocks", type("Counting", (dict,), {
        "get": lambda self, d, default=None: (reads.append(d), real(d, default))[1]})(
            host.superblocks))
    host.add_namespaces(NQN, 3)
    result = run(host, pool_yaml(host))
    assert result.ok and "mkfs.xfs" in kinds(result)
    assert reads == ["/dev/nvme2n3"], "only the new namespace's device was read"
