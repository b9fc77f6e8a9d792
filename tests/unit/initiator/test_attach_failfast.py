"""Fail fast, recover by itself: a pool's controller timeouts kept in sysfs, and an xfs
that shut down in an outage mounted again once a controller is live (fake host:
tests/unit/initiator/attach_fakes.py; the real kernel: tests/kernel/test_cache_failfast.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.system.mountusers import MountUser

from .attach_fakes import PREFIX, Export, FakeHost, fabrics_host
from .test_attach_reconcile import kinds, ns_mounts, pool_yaml, run, state

NQN = f"{PREFIX}:store1:kv:gpu0"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return fabrics_host(tmp_path, monkeypatch, [Export(NQN, [1, 2])])


def with_connect(host: FakeHost, connect: str, **kw: object) -> str:
    """The pool (configured subsystem: no discovery) with ``connect: {...}``."""
    return pool_yaml(host, subsystem=NQN, **kw).replace(  # type: ignore[arg-type]
        "      engines:", f"      connect: {{{connect}}}\n      engines:")


def attr(host: FakeHost, name: str) -> str:
    return (host.root / "sys/class/nvme/nvme2" / name).read_text().strip()


# ------------------------------------------------------------------ timeouts

def test_a_new_controller_gets_fast_io_fail_tmo_which_nvme_connect_cannot_set(
        host: FakeHost) -> None:
    result = run(host, pool_yaml(host, subsystem=NQN))
    assert result.ok, result.errors
    [connect] = host.fabrics_writes
    assert not any("fast" in a for a in connect)  # (nvme-cli 2.3 has no such option)
    assert connect["ctrl_loss_tmo"] == "-1"
    # Default: 5 s; ctrl_loss_tmo (forever) and reconnect_delay came with the connect.
    assert host.sysfs_writes == [("nvme2", "fast_io_fail_tmo", "5")]
    assert (attr(host, "fast_io_fail_tmo"), attr(host, "ctrl_loss_tmo"),
            attr(host, "reconnect_delay")) == ("5", "off", "2")
    [act] = [a for a in result.actions if a.kind == "nvme.timeout"]
    assert (act.subject, act.detail) == ("nvme2", "fast_io_fail_tmo off -> 5")


def test_a_converged_pass_writes_no_sysfs_attribute_and_runs_no_command(
        host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    calls, writes = len(host.runner.calls), len(host.sysfs_writes)
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions
    assert host.runner.calls[calls:] == [] and host.sysfs_writes[writes:] == []


def test_drift_in_fast_io_fail_tmo_is_put_back(host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    host.sys.set("class/nvme/nvme2/fast_io_fail_tmo", "off")  # an operator's write
    writes = len(host.sysfs_writes)
    fixed = run(host, pools)
    assert fixed.ok and kinds(fixed) == ["nvme.timeout"], fixed.actions
    assert host.sysfs_writes[writes:] == [("nvme2", "fast_io_fail_tmo", "5")]
    assert attr(host, "fast_io_fail_tmo") == "5"
    assert host.runner.ran("nvme", "connect")[1:] == [], "fixed in place, not reconnected"


def test_plan_shows_the_drift_and_writes_nothing(host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    host.sys.set("class/nvme/nvme2/fast_io_fail_tmo", "30")
    writes = len(host.sysfs_writes)
    plan = run(host, pools, dry_run=True)
    assert [(a.kind, a.detail) for a in plan.actions if a.status == "planned"] == [
        ("nvme.timeout", "fast_io_fail_tmo 30 -> 5")]
    assert host.sysfs_writes[writes:] == [] and attr(host, "fast_io_fail_tmo") == "30"


def test_off_is_written_as_minus_one_and_reads_back_off(host: FakeHost) -> None:
    pools = with_connect(host, "fast_io_fail_tmo: 'off'")
    result = run(host, pools)
    assert result.ok, result.errors
    # A new controller already has it off: nothing to write.
    assert host.sysfs_writes == [] and attr(host, "fast_io_fail_tmo") == "off"
    host.sys.set("class/nvme/nvme2/fast_io_fail_tmo", "5")
    assert run(host, pools).ok
    assert host.sysfs_writes == [("nvme2", "fast_io_fail_tmo", "-1")]
    assert attr(host, "fast_io_fail_tmo") == "off"


def test_ctrl_loss_tmo_is_compared_as_the_kernel_rounds_it(host: FakeHost) -> None:
    """5 s with a 2 s delay reads back 6 (whole reconnects): no write on every pass."""
    pools = with_connect(host, "ctrl_loss_tmo: 5s, fast_io_fail_tmo: 3s")
    assert run(host, pools).ok
    assert attr(host, "ctrl_loss_tmo") == "6"
    writes = len(host.sysfs_writes)
    again = run(host, pools)
    assert again.ok and not again.changed and host.sysfs_writes[writes:] == []


def test_a_new_reconnect_delay_rewrites_ctrl_loss_tmo_after_it(host: FakeHost) -> None:
    assert run(host, with_connect(host, "ctrl_loss_tmo: 60s")).ok
    writes = len(host.sysfs_writes)
    result = run(host, with_connect(host, "ctrl_loss_tmo: 60s, reconnect_delay: 7s"))
    assert result.ok, result.errors
    assert host.sysfs_writes[writes:] == [("nvme2", "reconnect_delay", "7"),
                                          ("nvme2", "ctrl_loss_tmo", "60")]
    assert (attr(host, "reconnect_delay"), attr(host, "ctrl_loss_tmo")) == ("7", "63")


def test_a_kernel_without_the_attribute_is_a_warning(host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    (host.root / "sys/class/nvme/nvme2/fast_io_fail_tmo").unlink()
    result = run(host, pools)
    assert result.ok and not result.changed
    [warning] = result.warnings
    assert "nvme2 has no fast_io_fail_tmo attribute" in warning.message


def test_every_path_of_a_multipath_pool_gets_the_timeouts(host: FakeHost) -> None:
    host.exports = [Export(NQN, [1, 2]), Export(NQN, [1, 2], traddr="10.0.0.2")]
    pools = pool_yaml(host).replace(
        "target: {transport: tcp, address: 10.0.0.1}",
        "targets: [{transport: tcp, address: 10.0.0.1}, {transport: tcp, address: 10.0.0.2}]")
    assert run(host, pools).ok
    assert sorted(host.sysfs_writes) == [("nvme2", "fast_io_fail_tmo", "5"),
                                         ("nvme3", "fast_io_fail_tmo", "5")]


# ------------------------------------------------------------------ recovery

def test_a_shut_down_xfs_is_mounted_again_and_counted(host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    mount = ns_mounts(host)[0]
    (Path(mount) / "lmcache" / "chunk").write_text("fsynced before the outage")
    probed = len(host.probed)
    host.shutdown.add(mount)
    calls = len(host.runner.calls)
    result = run(host, pools)
    assert result.ok, result.errors
    assert [c[0] for c in host.runner.calls[calls:]] == ["umount", "mount"]
    assert all("-l" not in c for c in host.runner.ran("umount")), "never lazily"
    [act] = [a for a in result.actions if a.kind == "xfs.recover"]
    assert act.subject == mount and "/dev/nvme2n1" in act.detail
    assert mount not in host.shutdown and mount in host.mounts()
    assert (Path(mount) / "lmcache" / "chunk").read_text() == "fsynced before the outage"
    # The engines' hand-off probes the mounts again (their probes are stale).
    assert len(host.probed) > probed
    [rec] = state(host)["kv"].recoveries
    assert (rec.mount, rec.count) == (mount, 1) and rec.last_at >= 1e9
    # The count survives: a later recovery of the same mount adds to it.
    host.shutdown.add(mount)
    assert run(host, pools).ok
    assert [r.count for r in state(host)["kv"].recoveries] == [2]
    converged = run(host, pools)
    assert converged.ok and not converged.changed


def test_a_held_shut_down_xfs_is_reported_with_who_holds_it_and_retried(
        host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    mount = ns_mounts(host)[1]
    host.shutdown.add(mount)
    host.busy.add(mount)
    host.users[mount] = [MountUser(4242, "vllm", "open file")]
    result = run(host, pools)
    [error] = result.errors
    assert f"the xfs on {mount} shut down" in error.message
    assert "vllm (pid 4242, open file)" in error.message
    assert "never lazily" in (error.hint or "")
    assert mount in host.mounts() and mount in host.shutdown
    assert state(host)["kv"].recoveries == []
    host.busy.clear()
    retried = run(host, pools)
    assert retried.ok and [a.subject for a in retried.actions if a.kind == "xfs.recover"] == [
        mount]


def test_an_orphaned_xfs_is_mounted_again_from_the_namespaces_new_device(
        host: FakeHost) -> None:
    """Drift (issue 35): the namespace went away while mounted (disabled on the storage
    host, or its last controller disconnected) and came back as a new block device; the
    xfs is still mounted from the old one, which is gone. Seen on the real kernel
    (tests/kernel/test_drift.py): every pass failed with "already has ... mounted"."""
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    mount = ns_mounts(host)[1]
    old = host.numbers["/dev/nvme2n2"]
    (host.root / "sys/dev/block" / old).unlink()  # the old head is gone...
    new = "259:99"  # ...and the namespace is back under a new device number
    host.numbers["/dev/nvme2n2"] = new
    (host.root / "sys/dev/block" / new).symlink_to(host.root / "sys/block/nvme2n2")
    calls = len(host.runner.calls)
    plan = run(host, pools, dry_run=True)
    assert [(a.kind, a.subject) for a in plan.actions if a.status == "planned"] == [
        ("xfs.recover", mount)]
    result = run(host, pools)
    assert result.ok, result.errors
    ran = [c[0] for c in host.runner.calls[calls:]]
    assert ran[-2:] == ["umount", "mount"] and "mkfs.xfs" not in ran, ran
    assert all("-l" not in c for c in host.runner.ran("umount")), "never lazily"
    [act] = [a for a in result.actions if a.kind == "xfs.recover"]
    assert act.subject == mount and "/dev/nvme2n2" in act.detail
    assert [(r.mount, r.count) for r in state(host)["kv"].recoveries] == [(mount, 1)]
    assert run(host, pools).changed is False


def test_no_recovery_while_no_controller_is_live(host: FakeHost) -> None:
    """Unmounting needs the storage: while the kernel reconnects, nothing is touched."""
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    host.shutdown.add(ns_mounts(host)[0])
    host.set_state("nvme2", "connecting")
    calls = len(host.runner.calls)
    result = run(host, pools)
    [error] = result.errors
    assert "no live controller" in error.message
    assert host.runner.calls[calls:] == [] and ns_mounts(host)[0] in host.shutdown
    host.set_state("nvme2", "live")
    assert "xfs.recover" in kinds(run(host, pools))


def test_plan_shows_a_recovery_and_changes_nothing(host: FakeHost) -> None:
    pools = pool_yaml(host, subsystem=NQN)
    assert run(host, pools).ok
    mount = ns_mounts(host)[0]
    host.shutdown.add(mount)
    calls = len(host.runner.calls)
    plan = run(host, pools, dry_run=True)
    assert plan.ok, plan.errors
    assert [a.kind for a in plan.actions if a.status == "planned"] == ["xfs.recover"]
    assert [c for c in host.runner.calls[calls:] if c[0] in ("umount", "mount")] == []
    assert mount in host.shutdown
