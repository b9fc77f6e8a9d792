"""Waiting for a pool's namespaces by subsystem and nsid (fake sysfs, fake waiter)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.initiator.devices import (
    DeviceNotFound,
    UdevWaiter,
    find_namespace,
    wait_for_namespaces,
)
from agent.initiator.sysfs import Sysfs

from .fakesysfs import FakeSysfs

NQN = "nqn.2026-11.io.kvagent:store1:pool0:gpu0"
#: Namespace uuids are whatever the storage host bound to the storage (random here).
U1, U2 = "0b8a5e7c-3f1d-4c2a-9e6b-1d2c3b4a5f60", "7e6d5c4b-3a29-4817-a6f5-e4d3c2b1a098"


class StepWaiter:
    """Each wait() advances a fake clock and runs the next scripted kernel action."""

    def __init__(self, clock: list[float], actions: list[Callable[[], None]] | None = None):
        self.clock = clock
        self.actions = list(actions or [])
        self.waits: list[float] = []
        self.entered = self.exited = False

    def __enter__(self) -> StepWaiter:
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited = True

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        self.clock[0] += min(timeout, 1.0)
        if self.actions:
            self.actions.pop(0)()


def setup(tmp_path: Path) -> FakeSysfs:
    fake = FakeSysfs(tmp_path)
    fake.add_controller(3, subsysnqn=NQN, hostnqn="h", address="traddr=10.0.0.1,trsvcid=4420")
    fake.add_controller(4, subsysnqn=NQN, hostnqn="h", address="traddr=10.0.1.1,trsvcid=4420")
    fake.add_subsystem(3, NQN, (3, 4))
    return fake


def test_found_at_once_with_paths_and_ana(tmp_path: Path) -> None:
    fake = setup(tmp_path)
    fake.add_namespace(3, 1, U1, paths=((3, "optimized"),
                                                             (4, "non-optimized")))
    clock = [0.0]
    waiter = StepWaiter(clock)
    [dev] = wait_for_namespaces(Sysfs(tmp_path), NQN, [1], timeout=5, waiter=waiter,
                                clock=lambda: clock[0])
    assert (dev.device, dev.nsid, dev.uuid) == ("/dev/nvme3n1", 1, U1)
    assert [(p.controller, p.ana_state) for p in dev.paths] == [
        ("nvme3", "optimized"), ("nvme4", "non-optimized")]
    assert len(dev.live_paths) == 2
    # everything was there at the first look: no udev monitor was set up, no wait
    assert waiter.waits == [] and not waiter.entered


def test_the_callers_first_look_is_used(tmp_path: Path) -> None:
    """A caller that has just read the subsystem's namespaces hands them in: they are not
    read again; a namespace missing from them is waited for (and read) as usual."""
    fake = setup(tmp_path)
    fake.add_namespace(3, 1, U1, paths=((3, "optimized"),))
    heads = Sysfs(tmp_path).subsystem_namespaces(NQN)
    fake.add_namespace(3, 2, U2, paths=((3, "optimized"),))
    reads: list[str] = []

    class Counting(Sysfs):
        def subsystem_namespaces(self, subsysnqn: str):  # type: ignore[no-untyped-def]
            reads.append(subsysnqn)
            return super().subsystem_namespaces(subsysnqn)

    clock = [0.0]
    [dev] = wait_for_namespaces(Counting(tmp_path), NQN, [1], timeout=5,
                                waiter=StepWaiter(clock), clock=lambda: clock[0], heads=heads)
    assert dev.uuid == U1 and reads == []
    waiter = StepWaiter(clock)
    devs = wait_for_namespaces(Counting(tmp_path), NQN, [1, 2], timeout=5, waiter=waiter,
                               clock=lambda: clock[0], heads=heads)
    assert [d.uuid for d in devs] == [U1, U2] and reads == [NQN] and waiter.entered


def test_waits_until_the_kernel_adds_them(tmp_path: Path) -> None:
    fake = setup(tmp_path)
    clock = [0.0]
    actions = [
        lambda: None,
        lambda: fake.add_namespace(3, 2, U2, paths=((3, "optimized"),)),
        lambda: fake.add_namespace(3, 1, U1, paths=((3, "optimized"),)),
    ]
    waiter = StepWaiter(clock, actions)
    devs = wait_for_namespaces(Sysfs(tmp_path), NQN, [1, 2], timeout=30, waiter=waiter,
                               clock=lambda: clock[0])
    assert [d.device for d in devs] == ["/dev/nvme3n1", "/dev/nvme3n2"]
    assert len(waiter.waits) == 3


def test_timeout_names_the_missing_nsid_and_subsystem(tmp_path: Path) -> None:
    fake = setup(tmp_path)
    fake.add_namespace(3, 1, U1, paths=((3, "optimized"),))
    clock = [0.0]
    waiter = StepWaiter(clock)
    with pytest.raises(DeviceNotFound) as info:
        wait_for_namespaces(Sysfs(tmp_path), NQN, [1, 2], timeout=3, waiter=waiter,
                            clock=lambda: clock[0])
    err = info.value
    assert "nsid 2 of" in err.message and NQN in err.message
    assert "nsid 1" not in err.message
    assert err.missing == (2,)
    assert clock[0] == pytest.approx(3.0)  # bounded: gave up when the time was up


def test_same_nsid_under_another_subsystem_is_not_taken(tmp_path: Path) -> None:
    fake = setup(tmp_path)
    other = NQN + "-impostor"
    fake.add_controller(6, subsysnqn=other, hostnqn="h", address="traddr=10.0.2.1,trsvcid=4420")
    fake.add_subsystem(6, other, (6,))
    fake.add_namespace(6, 1, U1, paths=((6, "optimized"),))
    assert find_namespace(Sysfs(tmp_path), NQN, 1) is None
    fake.add_namespace(3, 1, U2, paths=((3, "optimized"),))
    found = find_namespace(Sysfs(tmp_path), NQN, 1)
    assert found is not None and (found.device, found.uuid) == ("/dev/nvme3n1", U2)


def test_head_without_live_path_is_still_returned(tmp_path: Path) -> None:
    """During an outage (ctrl_loss_tmo forever) the head stays; callers see the path state."""
    fake = setup(tmp_path)
    fake.add_namespace(3, 1, U1, paths=((3, "optimized"),))
    fake.set("class/nvme/nvme3/state", "connecting")
    dev = find_namespace(Sysfs(tmp_path), NQN, 1)
    assert dev is not None and dev.live_paths == ()
    assert dev.paths[0].controller_state == "connecting"


def test_udev_waiter_falls_back_to_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyudev

    def no_netlink(*a, **k):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(pyudev.Monitor, "from_netlink", no_netlink)
    slept: list[float] = []
    with UdevWaiter(sleep=slept.append, poll=0.5) as w:
        w.wait(10)
        w.wait(0.2)
    assert slept == [0.5, 0.2]


def test_a_subsystem_is_found_by_its_nqn_once_per_reader_and_a_reused_name_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One reader (one pass) reads each other subsystem's NQN once, what it returns is
    read live, and a subsystem directory whose name now belongs to another NQN (the
    kernel reuses instance numbers) is not taken: every subsystem is looked at again."""
    from agent.initiator import sysfs as sysfs_mod

    fake = setup(tmp_path)
    fake.add_namespace(3, 1, U1, paths=((3, "optimized"),))
    other = NQN + "-other"
    fake.add_controller(6, subsysnqn=other, hostnqn="h")
    fake.add_subsystem(6, other, (6,))
    fake.add_namespace(6, 1, U2, paths=((6, "optimized"),))
    reads: list[str] = []
    real = sysfs_mod.read_attr
    monkeypatch.setattr(sysfs_mod, "read_attr", lambda p: reads.append(str(p)) or real(p))
    s = Sysfs(tmp_path)
    for _ in range(3):
        assert s.subsystem_namespaces(NQN)[1].uuid == U1
    # nvme-subsys3's NQN: the first look, then live each time it was returned; the other
    # subsystem's: only the first look (not once per call)
    assert sum(p.endswith("nvme-subsys3/subsysnqn") for p in reads) == 1 + 3
    assert sum(p.endswith("nvme-subsys6/subsysnqn") for p in reads) == 1
    assert s.subsystem_namespaces(other)[1].uuid == U2
    # nvme-subsys3 now holds the other NQN's namespaces and nvme-subsys6 is gone
    fake.set("class/nvme-subsystem/nvme-subsys3/subsysnqn", other)
    (tmp_path / "class/nvme-subsystem/nvme-subsys6").unlink()
    assert s.subsystem_namespaces(NQN) == {}
    assert s.subsystem_namespaces(other)[1].name == "nvme3n1"
