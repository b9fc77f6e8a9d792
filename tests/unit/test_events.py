"""Device events between full passes (issue 26): which udev events count, storms
coalesced into one batch, and the loop's schedule."""

from __future__ import annotations

import os
import queue
import shutil
import threading
from pathlib import Path

import pytest

from agent.config import load_config
from agent.daemon import Agent, Schedule
from agent.events import BATCH_KEEP, Batch, Batcher, DeviceEvent, classify
from agent.health.notify import Notifier
from agent.health.snapshot import Snapshot
from agent.result import RunResult
from tests.unit.fakerunner import FakeRunner
from tests.unit.test_daemon import free_port, write_config


@pytest.mark.parametrize(("subsystem", "action", "name", "props", "expected"), [
    ("nvme", "add", "nvme3", {}, DeviceEvent("controller", "add", "nvme3")),
    ("nvme", "remove", "nvme3", {}, DeviceEvent("controller", "remove", "nvme3")),
    ("nvme", "change", "nvme3", {"NVME_EVENT": "connected"},
     DeviceEvent("controller", "change", "nvme3")),
    ("nvme", "change", "nvme0", {"NVME_AEN": "0x70f002"}, DeviceEvent("aen", "change", "nvme0")),
    ("block", "add", "nvme3n1", {}, DeviceEvent("namespace", "add", "nvme3n1")),
    ("block", "change", "nvme3n1", {}, DeviceEvent("namespace", "change", "nvme3n1")),
    ("block", "change", "nvme3n1", {"RESIZE": "1"}, DeviceEvent("namespace", "resize", "nvme3n1")),
    ("block", "remove", "nvme3n2", {}, DeviceEvent("namespace", "remove", "nvme3n2")),
    ("block", "add", "loop0", {}, None),
    ("block", "add", "dm-3", {}, None),
    ("block", "bind", "nvme3n1", {}, None),
    ("nvme-subsystem", "add", "nvme-subsys3", {}, None),
    ("misc", "change", "nvme-fabrics", {}, None),
    ("nvme", "add", "nvme-fabrics", {}, None),
])
def test_classify(subsystem: str, action: str, name: str, props: dict[str, str],
                  expected: DeviceEvent | None) -> None:
    assert classify(subsystem, action, name, props) == expected


def test_a_storm_of_256_events_is_one_batch() -> None:
    events: queue.SimpleQueue = queue.SimpleQueue()
    storm = [DeviceEvent("namespace", "add", f"nvme{i // 16}n{i % 16 + 1}") for i in range(256)]
    for e in storm[1:]:
        events.put(e)
    batch = Batcher(events, quiet=0.05).gather(storm[0])
    assert batch.count == 256
    assert batch.events == storm[:BATCH_KEEP] and batch.dropped == 256 - BATCH_KEEP
    assert batch.summary() == {"namespace": BATCH_KEEP}
    assert events.empty()


def test_a_reload_ends_the_batch_and_is_handled_next() -> None:
    events: queue.SimpleQueue = queue.SimpleQueue()
    first = DeviceEvent("controller", "remove", "nvme1")
    events.put(DeviceEvent("controller", "add", "nvme2"))
    events.put("reload")
    events.put(DeviceEvent("controller", "add", "nvme4"))
    batch = Batcher(events, quiet=0.05).gather(first)
    assert [e.name for e in batch.events] == ["nvme1", "nvme2"]
    assert batch.next == "reload"
    assert events.get_nowait() == DeviceEvent("controller", "add", "nvme4")


def test_a_batch_ends_at_its_longest_even_while_events_keep_coming() -> None:
    """An endless trickle (one event per tick of a fake clock) still ends the batch."""
    ticks = [0]

    class Trickle(queue.SimpleQueue):
        def get(self, block: bool = True, timeout: float | None = None):  # type: ignore[override]
            ticks[0] += 1
            return DeviceEvent("namespace", "change", "nvme0n1")

    batch = Batcher(Trickle(), clock=lambda: ticks[0] * 0.1, quiet=0.2, longest=1.0).gather(
        DeviceEvent("namespace", "change", "nvme0n1"))
    assert batch.count == 11  # the first, then one per 0.1 s for 1 s


def test_a_lone_event_is_acted_on_at_once_and_a_storm_still_gathers() -> None:
    """After a batch's first event the Batcher waits FIRST_QUIET for another (a namespace
    added alone is attached 0.15 s sooner); once a second came, QUIET each (a storm's
    events, closer together than that, still make one batch)."""
    from agent.events import FIRST_QUIET, QUIET

    timeouts: list[float | None] = []

    class Queue(queue.SimpleQueue):
        def __init__(self, items: list[DeviceEvent]) -> None:
            super().__init__()
            self.items = items

        def get(self, block: bool = True, timeout: float | None = None):  # type: ignore[override]
            timeouts.append(timeout)
            if not self.items:
                raise queue.Empty
            return self.items.pop(0)

    first = DeviceEvent("namespace", "add", "nvme1n3")
    assert Batcher(Queue([]), clock=lambda: 0.0).gather(first).count == 1
    assert timeouts == [FIRST_QUIET]
    timeouts.clear()
    more = [DeviceEvent("namespace", "add", f"nvme1n{i}") for i in (4, 5)]
    assert Batcher(Queue(more), clock=lambda: 0.0).gather(first).count == 3
    assert timeouts == [FIRST_QUIET, QUIET, QUIET]


def test_schedule_full_passes_collects_and_retries(tmp_path: Path) -> None:
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port(), interval="30s", full_interval="5m")
    cfg = load_config(config)
    s = Schedule(1000.0, cfg)
    assert (s.full, s.collect, s.retry, s.next_due()) == (1300.0, 1030.0, None, 1030.0)
    s.collected(1030.0, cfg)
    assert s.next_due() == 1060.0
    s.passed(1100.0, cfg, full=False, ok=False)  # a failed attach pass: retry in 30 s
    assert (s.full, s.retry, s.next_due()) == (1300.0, 1130.0, 1130.0)
    s.passed(1120.0, cfg, full=False, ok=False)  # failing again: the retry stays due
    s.passed(1125.0, cfg, full=False, ok=True)  # an attach pass that worked: still due
    assert s.retry == 1130.0 and not s.due(1129.0) and s.due(1130.0)
    s.passed(1130.0, cfg, full=True, ok=True)
    assert (s.full, s.retry, s.next_due()) == (1430.0, None, 1160.0)


def gpu_config(tmp_path: Path) -> Path:
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    config.write_text(config.read_text() + f"""
initiator:
  pools:
    - {{name: kv, target: {{transport: tcp, address: 192.0.2.1}}, mount: {tmp_path}/mnt/kv}}
    - {{name: kv2, target: {{transport: tcp, address: 192.0.2.2}}, mount: {tmp_path}/mnt/kv2}}
""")
    return config


def test_a_storm_makes_one_collect_and_one_attach_pass(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """256 udev events: one collect and one attach pass over the initiator pools (no
    detach, no storage side), counted in the metrics' counters."""
    config = gpu_config(tmp_path)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    passes: list[tuple[str, ...] | None] = []
    collects: list[float] = []
    done = threading.Event()

    def reconcile(**kw):  # type: ignore[no-untyped-def]
        passes.append(kw.get("attach_only"))
        if kw.get("attach_only"):
            done.set()
        return RunResult(dry_run=False)

    real_collect = agent.collect
    monkeypatch.setattr(agent, "reconcile", reconcile)
    monkeypatch.setattr(agent, "collect", lambda: (collects.append(1), real_collect())[1])
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        for i in range(256):
            agent.events.put(DeviceEvent("namespace", "add", f"nvme{i // 16}n{i % 16 + 1}"))
        assert done.wait(30)
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)
    assert passes == [None, ("kv", "kv2")]  # the first (full) pass, then one attach pass
    # Events past BATCH_KEEP are only counted (what they were is not known): one collect
    # before the pass, in case something went away.
    assert len(collects) == 1
    assert (agent.counters.device_events, agent.counters.device_batches) == (256, 1)


def test_a_batch_of_nothing_that_moved_reads_nothing(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """udev's own change after kvagent's mkfs wrote a device (and a controller's own change)
    neither collects nor attaches: each came a second after every attach pass and made a
    whole collect, delaying the next namespace's attach."""
    config = gpu_config(tmp_path)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    work: list[str] = []
    monkeypatch.setattr(agent, "reconcile", lambda **kw: (work.append("pass"),
                                                          RunResult(dry_run=False))[1])
    monkeypatch.setattr(agent, "collect", lambda **kw: work.append("collect"))
    agent.store.set(Snapshot(0.0, 0.0, "gpu"))
    schedule = Schedule(0.0, agent.cfg)
    agent._on_devices(Batch([DeviceEvent("namespace", "change", "nvme1n3"),
                             DeviceEvent("controller", "change", "nvme1")]), schedule)
    assert work == [] and agent.counters.device_events == 2
    assert agent.store.get().counters.device_events == 2, "the metrics count them"
    agent._on_devices(Batch([DeviceEvent("namespace", "remove", "nvme1n3")]), schedule)
    assert work == ["collect"]


@pytest.mark.parametrize(("events", "collects_first"), [
    ([DeviceEvent("namespace", "add", "nvme1n3")], False),
    ([DeviceEvent("namespace", "add", "nvme1n3"), DeviceEvent("namespace", "remove",
                                                             "nvme1n2")], True),
    ([DeviceEvent("aen", "change", "nvme3"),
      DeviceEvent("controller", "state connecting", "nvme1")], True),
])
def test_an_attach_pass_collects_after_not_before_unless_something_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: list[DeviceEvent],
        collects_first: bool) -> None:
    """A namespace added: the attach pass runs at once (its own collect afterwards shows
    it); a collect before it only when something went away, which must show now."""
    config = gpu_config(tmp_path)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    order: list[str] = []
    done = threading.Event()

    def reconcile(**kw):  # type: ignore[no-untyped-def]
        order.append("pass" if kw.get("attach_only") else "first pass")
        if kw.get("attach_only"):
            done.set()
        return RunResult(dry_run=False)

    real_collect = agent.collect
    monkeypatch.setattr(agent, "reconcile", reconcile)
    monkeypatch.setattr(agent, "collect", lambda **kw: (order.append("collect"),
                                                        real_collect(**kw))[1])
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        for event in events:
            agent.events.put(event)
        assert done.wait(30)
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)
    assert order == ["first pass", *(["collect"] if collects_first else []), "pass"]


def test_device_events_without_initiator_pools_only_collect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port())
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    passes: list[object] = []
    collected = threading.Event()
    monkeypatch.setattr(agent, "reconcile",
                        lambda **kw: passes.append(kw) or RunResult(dry_run=False))
    real_collect = agent.collect
    monkeypatch.setattr(agent, "collect", lambda: (collected.set(), real_collect())[1])
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        agent.events.put(DeviceEvent("controller", "remove", "nvme0"))
        assert collected.wait(30)
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)
    assert passes == [{}]  # only the first pass
    assert agent.counters.device_batches == 1


def test_the_watch_sees_a_controller_lose_its_connection(tmp_path: Path) -> None:
    """The kernel sends no uevent when a connection drops: the watch reads the states."""
    from agent.events import ControllerWatch

    base = tmp_path / "class" / "nvme"
    for name, state in (("nvme0", "live"), ("nvme1", "live")):
        (base / name).mkdir(parents=True)
        (base / name / "state").write_text(state + "\n")
    (base / "nvme-fabrics").mkdir()  # not a controller
    (base / "nvme9").mkdir()  # a discovery controller (nvme discover): not watched
    (base / "nvme9" / "subsysnqn").write_text("nqn.2014-08.org.nvmexpress.discovery\n")
    (base / "nvme9" / "state").write_text("live\n")
    events: queue.SimpleQueue = queue.SimpleQueue()
    watch = ControllerWatch(events, tmp_path)
    last = watch.states()
    assert last == {"nvme0": "live", "nvme1": "live"}
    assert watch.check(last) == last and events.empty()  # nothing changed: no event
    (base / "nvme1" / "state").write_text("connecting\n")
    (base / "nvme2").mkdir()
    (base / "nvme2" / "state").write_text("new\n")  # a new one has its own udev event
    last = watch.check(last)
    assert events.get_nowait() == DeviceEvent("controller", "state connecting", "nvme1")
    assert events.empty()
    (base / "nvme1" / "state").write_text("live\n")
    watch.check(last)
    assert events.get_nowait() == DeviceEvent("controller", "state live", "nvme1")
    watch.close()


def test_the_watch_keeps_each_state_file_open(tmp_path: Path, monkeypatch) -> None:
    """A look is one pread per controller: no open, no subsysnqn read, after the first."""
    import agent.events
    from agent.events import ControllerWatch

    base = tmp_path / "class" / "nvme"
    for i in range(3):
        (base / f"nvme{i}").mkdir(parents=True)
        (base / f"nvme{i}" / "state").write_text("live\n")
    watch = ControllerWatch(queue.SimpleQueue(), tmp_path)
    assert watch.states() == {f"nvme{i}": "live" for i in range(3)}
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(agent.events.os, "open",
                        lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    (base / "nvme1" / "state").write_text("connecting\n")
    assert watch.states() == {"nvme0": "live", "nvme1": "connecting", "nvme2": "live"}
    assert opened == []
    shutil.rmtree(base / "nvme2")  # removed (its udev event relists): its file is closed
    watch.relist()
    assert watch.states() == {"nvme0": "live", "nvme1": "connecting"}
    assert set(watch._open) == {"nvme0", "nvme1"}
    watch.close()


def test_the_watch_lists_the_controllers_when_told_or_at_its_bound(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """A look is no listing of class/nvme: a controller's add or remove event asks for
    one (the udev feed calls relist), and every RELIST_EVERY looks there is one anyway."""
    import agent.events
    from agent.events import RELIST_EVERY, ControllerWatch, UdevFeed

    base = tmp_path / "class" / "nvme"
    (base / "nvme0").mkdir(parents=True)
    (base / "nvme0" / "state").write_text("live\n")
    watch = ControllerWatch(queue.SimpleQueue(), tmp_path)
    listed: list[str] = []
    real_listdir = os.listdir
    monkeypatch.setattr(agent.events.os, "listdir",
                        lambda path: listed.append(path) or real_listdir(path))
    assert watch.states() == {"nvme0": "live"} and len(listed) == 1  # the first look
    (base / "nvme1").mkdir()
    (base / "nvme1" / "state").write_text("live\n")
    for _ in range(RELIST_EVERY - 1):
        assert watch.states() == {"nvme0": "live"}
    assert len(listed) == 1
    assert watch.states() == {"nvme0": "live", "nvme1": "live"}  # the bound
    assert len(listed) == 2

    class Device:
        subsystem, action, sys_name, properties = "nvme", "add", "nvme2", {}

    (base / "nvme2").mkdir()
    (base / "nvme2" / "state").write_text("connecting\n")
    feed = UdevFeed(queue.SimpleQueue(), on_controller=watch.relist)
    feed._on_device(Device())
    assert feed.events.get_nowait() == DeviceEvent("controller", "add", "nvme2")
    assert watch.states() == {"nvme0": "live", "nvme1": "live", "nvme2": "connecting"}
    assert len(listed) == 3
    Device.action = "change"  # a change is no new controller: no listing
    feed._on_device(Device())
    watch.states()
    assert len(listed) == 3
    watch.close()


def test_a_name_taken_by_a_new_controller_is_looked_at_again(tmp_path: Path,
                                                            monkeypatch) -> None:
    """sysfs fails a read of a removed controller's file (ENODEV): when its name is a new
    controller's by the next look, the new one's files are opened (here the name goes
    from a discovery controller, not watched, to a pool's, watched)."""
    import errno

    import agent.events
    from agent.events import ControllerWatch

    ctrl = tmp_path / "class" / "nvme" / "nvme4"
    ctrl.mkdir(parents=True)
    (ctrl / "subsysnqn").write_text("nqn.2014-08.org.nvmexpress.discovery\n")
    (ctrl / "state").write_text("live\n")
    watch = ControllerWatch(queue.SimpleQueue(), tmp_path)
    assert watch.states() == {}
    stale = watch._open["nvme4"][0]
    (ctrl / "state").unlink()
    (ctrl / "subsysnqn").write_text("nqn.2026-11.io.kvagent:pool\n")
    (ctrl / "state").write_text("connecting\n")
    real_pread, failed = os.pread, []

    def pread(fd: int, n: int, offset: int) -> bytes:
        if fd == stale and not failed:  # (the new file may get the same fd number)
            failed.append(fd)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(agent.events.os, "pread", pread)
    assert watch.states() == {"nvme4": "connecting"}
    assert failed == [stale]
    watch.close()


@pytest.mark.parametrize(("events", "dropped", "expected"), [
    ([DeviceEvent("namespace", "add", "nvme0n2")], 0, True),
    ([DeviceEvent("namespace", "resize", "nvme0n1")], 0, True),
    # udev's own change after a program wrote the device (kvagent's mkfs): no new pass
    ([DeviceEvent("namespace", "change", "nvme0n1")], 0, False),
    ([DeviceEvent("aen", "change", "nvme0")], 0, True),
    # A controller's own add/change/remove: every nvme discover makes and removes one
    # (a pass per discovery would start the next for ever, as seen on the real kernel).
    ([DeviceEvent("controller", "add", "nvme3")], 0, False),
    ([DeviceEvent("controller", "change", "nvme3")], 0, False),
    ([DeviceEvent("controller", "state live", "nvme3")], 0, True),
    ([DeviceEvent("controller", "state connecting", "nvme3")], 0, False),
    ([DeviceEvent("controller", "remove", "nvme3"),
      DeviceEvent("namespace", "remove", "nvme3n1")], 0, False),
    ([DeviceEvent("controller", "state connecting", "nvme3")], 5, True),  # some not kept
])
def test_an_attach_pass_only_when_something_appeared(events: list[DeviceEvent], dropped: int,
                                                     expected: bool) -> None:
    from agent.events import Batch

    assert Batch(events, dropped).something_appeared is expected


def test_a_dropped_connection_collects_without_an_attach_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = gpu_config(tmp_path)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    passes: list[object] = []
    collected = threading.Event()
    monkeypatch.setattr(agent, "reconcile",
                        lambda **kw: passes.append(kw) or RunResult(dry_run=False))
    real_collect = agent.collect
    monkeypatch.setattr(agent, "collect", lambda: (collected.set(), real_collect())[1])
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        agent.events.put(DeviceEvent("controller", "state connecting", "nvme0"))
        assert collected.wait(30)
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)
    assert passes == [{}]  # the first pass only


def test_device_events_never_hold_the_full_pass_back(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Attach passes whose own work brings the next event (so the queue is never empty
    when the loop looks) and a full pass due every 1 s: the full passes still run. On the
    real kernel, attach passes fed each other and the full pass that would have healed
    a port never came."""
    config = gpu_config(tmp_path)
    config.write_text(config.read_text().replace("full_interval: 5m", "full_interval: 1s"))
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    full_passes = threading.Semaphore(0)

    def reconcile(**kw):  # type: ignore[no-untyped-def]
        if kw.get("attach_only"):
            agent.events.put(DeviceEvent("namespace", "change", "nvme0n1"))  # its mkfs
        else:
            full_passes.release()
        return RunResult(dry_run=False)

    monkeypatch.setattr(agent, "reconcile", reconcile)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        assert full_passes.acquire(timeout=30)  # the first pass
        agent.events.put(DeviceEvent("namespace", "add", "nvme0n1"))
        for _ in range(2):  # two more, while attach passes feed each other
            assert full_passes.acquire(timeout=30)
    finally:
        agent.events.put("stop")
        thread.join(timeout=30)


def test_every_pass_keeps_the_discovery_controllers(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After each pass the agent keeps a discovery controller to each port its pools
    discover at, as this host (its NQN from the identity the pass made); a failure there
    never fails the pass or the loop (the passes still discover)."""
    import nvmet.ids
    from agent import daemon
    from agent.fabrics import FabricsAddress
    from agent.initiator.discovery_controllers import DiscoveryControllers, Wanted

    config = gpu_config(tmp_path)
    agent = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}))
    monkeypatch.setattr(daemon, "run_pass", lambda cfg, **kw: RunResult(dry_run=False))
    monkeypatch.setattr(nvmet.ids, "read_host_identity",
                        lambda nvme_dir: nvmet.ids.HostIdentity("nqn.2014-08.org.x:h", "id"))
    synced: list[list[Wanted]] = []
    monkeypatch.setattr(DiscoveryControllers, "sync",
                        lambda self, wants: synced.append(list(wants)) or [])
    assert isinstance(agent.reconcile(attach_only=("kv",)), RunResult)
    assert synced == [[Wanted(FabricsAddress("tcp", f"192.0.2.{i}", "4420"),
                              "nqn.2014-08.org.x:h", "id") for i in (1, 2)]]

    def broken(self, wants):  # type: ignore[no-untyped-def]
        raise OSError("no /dev/nvme-fabrics")

    monkeypatch.setattr(DiscoveryControllers, "sync", broken)
    assert agent.reconcile().ok  # type: ignore[union-attr]


def test_the_discovery_controllers_follow_the_ports_the_records_were_referred_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's record lists the ports its last discovery found by referral: the agent
    keeps a discovery controller there too (a storage host added to the mesh later is
    heard of by its AEN)."""
    import nvmet.ids
    from agent import daemon
    from agent.fabrics import FabricsAddress
    from agent.initiator.discovery_controllers import DiscoveryControllers
    from agent.records import InitiatorRecords, PoolAttachment

    config = gpu_config(tmp_path)
    cfg = load_config(config)
    agent = Agent(str(config), cfg, runner=FakeRunner(), notifier=Notifier(env={}))
    monkeypatch.setattr(daemon, "run_pass", lambda cfg, **kw: RunResult(dry_run=False))
    monkeypatch.setattr(nvmet.ids, "read_host_identity",
                        lambda nvme_dir: nvmet.ids.HostIdentity("nqn.2014-08.org.x:h", "id"))
    synced: list[list[str]] = []
    monkeypatch.setattr(DiscoveryControllers, "sync", lambda self, wants: synced.append(
        [w.address.traddr or "" for w in wants]) or [])
    Path(cfg.node.state_dir).mkdir(parents=True, exist_ok=True)
    InitiatorRecords.save(cfg.node.state_dir, {"kv": PoolAttachment(
        "nqn.2014-08.org.x:h", discovery=[FabricsAddress("tcp", "192.0.2.9", "4420")])})
    assert isinstance(agent.reconcile(attach_only=("kv",)), RunResult)
    assert synced == [["192.0.2.1", "192.0.2.9", "192.0.2.2"]]


def test_the_periodic_collect_reads_no_topology_between_events(tmp_path: Path,
                                                             monkeypatch) -> None:
    """Controllers, namespaces and nvmet change only with an event, a pass or by hand (in
    configfs: bounded by health.full_interval): the periodic collect reuses the topology
    the last fresh collect read, and reads it again once it is full_interval old."""
    from agent import daemon

    config = tmp_path / "kvagent.yaml"
    write_config(config, tmp_path, free_port(), interval="30s", full_interval="5m")
    now = [1000.0]
    loop = Agent(str(config), load_config(config), runner=FakeRunner(),
                  notifier=Notifier(env={}), clock=lambda: now[0])
    reads: list[float] = []
    real = daemon.read_topology
    monkeypatch.setattr(daemon, "read_topology",
                        lambda cfg: (reads.append(now[0]), real(cfg))[1])
    loop.collect()  # after a pass, on an event: fresh
    for _ in range(9):  # 9 intervals of 30 s: the topology is 270 s old
        now[0] += 30
        loop.collect(fresh=False)
    assert reads == [1000.0]
    loop.collect()  # a device event
    assert reads == [1000.0, 1270.0]
    now[0] += 300
    loop.collect(fresh=False)
    assert reads == [1000.0, 1270.0, 1570.0]
    assert loop.store.get() is not None


@pytest.mark.parametrize(("events", "dropped", "expected"), [
    ([DeviceEvent("namespace", "add", "nvme1n3")], 0, False),
    ([DeviceEvent("controller", "state live", "nvme1")], 0, False),
    ([DeviceEvent("aen", "change", "nvme3"), DeviceEvent("namespace", "add", "nvme1n3")], 0,
     True),
    ([DeviceEvent("namespace", "add", "nvme1n3")], 3, True),
])
def test_only_an_aen_can_bring_new_subsystems(events: list[DeviceEvent], dropped: int,
                                              expected: bool) -> None:
    """A discovery log change comes as an AEN: only then (or with events not kept) does
    the attach pass ask the storage hosts again which subsystems a pool has."""
    from agent.events import Batch

    assert Batch(events, dropped).rediscover is expected


class _Monitor:
    """A udev monitor's socket (a real NETLINK_KOBJECT_UEVENT socket, not bound) whose
    SO_RCVBUFFORCE request fails as it does without CAP_NET_ADMIN, or succeeds."""

    def __init__(self, forced: bool):
        import socket

        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15)
        self.forced = forced

    def fileno(self) -> int:
        return self.sock.fileno()

    def set_receive_buffer_size(self, size: int) -> None:
        if not self.forced:
            raise PermissionError(1, "Operation not permitted")


def test_without_cap_net_admin_the_udev_buffer_grows_to_rmem_max() -> None:
    """Under the shipped unit (no CAP_NET_ADMIN) libudev's SO_RCVBUFFORCE fails: the
    buffer is then asked with SO_RCVBUF, which the kernel caps at rmem_max (doubled)."""
    import socket

    from agent.events import grow_receive_buffer

    rmem_max = int(Path("/proc/sys/net/core/rmem_max").read_text())
    monitor = _Monitor(forced=False)
    default = monitor.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    got = grow_receive_buffer(monitor, size=16 << 20)
    assert got == monitor.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert got == 2 * min(16 << 20, rmem_max) and got > default, (got, default, rmem_max)
    monitor.sock.getsockname()  # the monitor's socket is still open (detached, not closed)

    forced = _Monitor(forced=True)  # SO_RCVBUFFORCE worked: nothing more is asked
    assert grow_receive_buffer(forced, size=16 << 20) == forced.sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_RCVBUF) == default


def test_a_discovery_port_out_of_reach_is_retried_backing_off_and_attached_once_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A storage host referred to before it is up: no discovery controller can be made
    there, so no AEN will tell of it. The agent tries the port again (2 s, then doubling
    up to health.interval) and, once a controller connects, runs an attach pass that
    rediscovers; then it stops trying."""
    import nvmet.ids
    from agent import daemon
    from agent.daemon import Schedule
    from agent.initiator.discovery_controllers import DiscoveryControllers

    config = gpu_config(tmp_path)
    cfg = load_config(config)
    now = [1000.0]
    agent = Agent(str(config), cfg, runner=FakeRunner(), notifier=Notifier(env={}),
                  clock=lambda: now[0])
    passes: list[dict] = []
    monkeypatch.setattr(daemon, "run_pass", lambda cfg, **kw: passes.append(kw) or RunResult(
        dry_run=False))
    monkeypatch.setattr(nvmet.ids, "read_host_identity",
                        lambda nvme_dir: nvmet.ids.HostIdentity("nqn.2014-08.org.x:h", "id"))
    up = {"192.0.2.2": False}

    def sync(self: DiscoveryControllers, wants: list) -> list[str]:
        self.unreached = [w for w in wants if up.get(w.address.traddr) is False]
        self.connected = [w for w in wants if up.get(w.address.traddr) is True]
        for w in self.connected:
            up[w.address.traddr] = None  # (connected: the next sync finds it present)
        return []

    monkeypatch.setattr(DiscoveryControllers, "sync", sync)
    assert agent.reconcile().ok  # type: ignore[union-attr]
    schedule = Schedule(now[0], cfg)
    agent._schedule_discovery(schedule)
    assert schedule.discovery == now[0] + daemon.DISCOVERY_RETRY
    waits = []
    for _ in range(3):  # still down: each try waits twice as long
        now[0] = schedule.discovery
        agent._retry_discovery(schedule)
        waits.append(schedule.discovery - now[0])
    assert waits == [4.0, 8.0, 16.0]
    assert len(passes) == 1  # no pass for a port still down
    up["192.0.2.2"] = True
    now[0] = schedule.discovery
    agent._retry_discovery(schedule)
    assert len(passes) == 2 and passes[1]["rediscover"] is True
    assert schedule.discovery is None and agent.discovery_wait == daemon.DISCOVERY_RETRY
