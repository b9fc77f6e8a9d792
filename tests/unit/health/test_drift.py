"""Drift: kvagent's own objects changed behind its back are seen by a collect and healed by a
targeted pass at once; a fight with another writer is bounded (agent.health.drift).

The storage side runs over the kernel-like fake configfs (its real-kernel proof is
tests/kernel/test_drift.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.daemon import Agent, Schedule
from agent.health import collect as collect_module
from agent.health.drift import DriftTracker, changes, initiator_facts, target_facts
from agent.health.notify import Notifier
from agent.health.snapshot import FIGHT_HEALS, exit_code, host_problems, overall_state
from agent.health.status import to_status_json
from agent.target import reconcile as target_reconcile
from nvmet import Tree
from nvmet.fake import FakeConfigFS
from nvmet.model import Host, Namespace, Port, Subsystem
from tests.unit.fakerunner import FakeRunner
from tests.unit.health.test_collect import HOST, make_config

NQN = "nqn.2024-01.io.kvagent:stor:kv:gpu"


def tree(*, enable: bool = True, hosts: frozenset[str] = frozenset({HOST}),
         links: frozenset[str] = frozenset({NQN}), port: bool = True, key: str = "k1",
         allow_any: str = "0", nsids: tuple[int, ...] = (1, 2)) -> Tree:
    sub = Subsystem(NQN, attrs={"allow_any_host": allow_any},
                    namespaces={n: Namespace(n, enable=enable) for n in nsids},
                    allowed_hosts=hosts)
    return Tree(hosts=[Host(HOST, attrs={"dhchap_key": key})], subsystems=[sub],
                ports=[Port(3, subsystems=links)] if port else [])


def facts_of(t: Tree) -> dict:
    return {("target", "kv"): target_facts(t, [NQN], [3], [HOST])}


@pytest.mark.parametrize(("changed", "kind", "before", "after"), [
    (tree(links=frozenset()), "port link", "", None),
    (tree(enable=False), "namespace", "enabled", "disabled"),
    (tree(hosts=frozenset()), "allowed host", "", None),
    (tree(port=False), "port", "", None),
    (tree(key="k2"), "host key", None, None),
    (tree(allow_any="1"), "allow any host", "0", "1"),
    (tree(nsids=(1, 2, 3)), "namespace", None, "enabled"),
])
def test_each_kind_of_storage_drift_is_seen(changed: Tree, kind: str, before, after) -> None:
    found = changes(facts_of(tree()), facts_of(changed))
    assert found, "a change to kvagent's own nvmet objects is drift"
    assert {d.kind for d in found} >= {kind}
    d = next(d for d in found if d.kind == kind)
    assert (d.role, d.pool) == ("target", "kv")
    if kind != "host key":  # (digests, never the key)
        assert (d.before, d.after) == (before, after)
    else:
        assert d.before and d.after and "k1" not in d.before + d.after


def test_no_change_is_no_drift_and_the_key_is_never_in_the_facts() -> None:
    assert changes(facts_of(tree()), facts_of(tree())) == []
    assert not any("k1" in v for _k, _s, v in facts_of(tree())[("target", "kv")])


def test_gpu_side_drift_is_what_went_away_only() -> None:
    before = {("initiator", "kv"): initiator_facts(["nvme1"], ["/mnt/kv/a"])}
    more = {("initiator", "kv"): initiator_facts(["nvme1", "nvme2"], ["/mnt/kv/a", "/b"])}
    assert changes(before, more) == []
    gone = {("initiator", "kv"): initiator_facts([], ["/mnt/kv/a"])}
    (d,) = changes(before, gone)
    assert (d.kind, d.subject, d.after) == ("controller", "nvme1", None)
    unmounted = {("initiator", "kv"): initiator_facts(["nvme1"], [])}
    assert [d.kind for d in changes(before, unmounted)] == ["mount"]


def test_a_pool_only_one_side_knows_is_not_drift() -> None:
    assert changes(facts_of(tree()), {}) == []
    assert changes({}, facts_of(tree())) == []


def test_tracker_heals_at_once_then_backs_off_and_names_a_fight() -> None:
    tracker = DriftTracker(interval=30, full_interval=300)
    tracker.passed(facts_of(tree()), None)
    drifted = facts_of(tree(links=frozenset()))
    t = 1000.0
    waits = []
    for heal in range(1, 6):
        due = tracker.due(tracker.observe(drifted), now=t, wall=t)
        assert len(due) == 1, f"heal {heal} is due once its back-off passed"
        tracker.healing(due, now=t)
        tracker.passed(facts_of(tree()), None)  # the targeted pass healed it
        # The writer undoes it again at once: held back until the back-off passed.
        held = tracker.observe(drifted)
        assert held and tracker.due(held, now=t + 1, wall=t + 1) == []
        nxt = tracker.next_heal()
        assert nxt is not None
        waits.append(nxt - t)
        t = nxt
    assert waits == [30, 60, 120, 240, 300], "doubling from health.interval, at most full"
    (subject,) = tracker.lately()
    assert subject.heals == 5 and subject.detected == 6 and subject.fighting
    assert subject.kind == "port link" and subject.pending


def test_a_subject_left_alone_is_forgotten_and_starts_afresh() -> None:
    tracker = DriftTracker(interval=30, full_interval=300)
    tracker.passed(facts_of(tree()), None)
    drifted = facts_of(tree(enable=False))
    due = tracker.due(tracker.observe(drifted), now=0, wall=0)
    tracker.healing(due, now=0)
    tracker.passed(facts_of(tree()), None)
    assert tracker.due(tracker.observe(facts_of(tree())), now=301, wall=301) == []
    assert tracker.lately() == (), "as kvagent left it for full_interval: forgotten"
    due = tracker.due(tracker.observe(drifted), now=302, wall=302)
    assert [d.subject[-6:] for d in due] == ["nsid 1", "nsid 2"], "new drift, healed at once"
    assert all(s.detected == 1 and s.heals == 0 for s in tracker.lately())


def test_a_pass_covering_a_pool_makes_its_baseline_and_clears_what_was_pending() -> None:
    tracker = DriftTracker(interval=30, full_interval=300)
    tracker.passed(facts_of(tree()), None)
    drifted = facts_of(tree(hosts=frozenset()))
    tracker.due(tracker.observe(drifted), now=0, wall=0)
    assert tracker.lately()[0].pending
    # A pass that covered only another pool compares this one: still drift.
    assert tracker.passed(drifted, {("initiator", "x")})
    # A pass over it takes what it left as the baseline: nothing pending any more.
    assert tracker.passed(facts_of(tree()), {("target", "kv")}) == []
    assert tracker.due([], now=1, wall=1) == []
    assert not tracker.lately()[0].pending


# ------------------------------------------------------------- the agent heals it
@pytest.fixture
def storage_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An agent over a file pool exported into the fake configfs, its first pass run."""
    cfg = make_config(tmp_path)
    fs = FakeConfigFS()
    for i in (1, 2):
        fs.add_device(str(tmp_path / f"f/kv/gpu/ns{i}.img"), "file")
    monkeypatch.setattr(target_reconcile, "nvmet_fs", lambda _cfg: fs)
    monkeypatch.setattr(collect_module, "nvmet_fs", lambda _cfg: fs)
    clock = [1000.0]
    agent = Agent(None, cfg, runner=FakeRunner().on(["modprobe"]),
                  notifier=Notifier(env={}), clock=lambda: clock[0])
    monkeypatch.setattr(Agent, "_keep_discovery_controllers", lambda self: None)
    outcome = agent.reconcile()
    assert outcome.ok, outcome.errors
    schedule = Schedule(clock[0], cfg)
    return agent, fs, clock, schedule


def nqn_of(fs: FakeConfigFS) -> str:
    (nqn,) = [e.name for e in fs.list("subsystems")]
    return nqn


def _allow_any(fs: FakeConfigFS, nqn: str) -> None:
    for host in fs.list(f"subsystems/{nqn}/allowed_hosts"):
        fs.unlink(f"subsystems/{nqn}/allowed_hosts/{host.name}")
    fs.write(f"subsystems/{nqn}/attr_allow_any_host", "1")


@pytest.mark.parametrize(("change", "kinds"), [
    (lambda fs, nqn: fs.write(f"subsystems/{nqn}/namespaces/2/enable", "0"), {"namespace"}),
    (lambda fs, nqn: fs.unlink(f"subsystems/{nqn}/allowed_hosts/{HOST}"), {"allowed host"}),
    (_allow_any, {"allowed host", "allow any host"}),
    (lambda fs, nqn: (fs.unlink(f"ports/3/subsystems/{nqn}"), fs.rmdir("ports/3")),
     {"port", "port link"}),
], ids=["namespace disabled", "host removed", "any host allowed", "port removed"])
def test_the_agent_heals_each_kind_through_the_nvmet_reader(storage_agent, change,
                                                            kinds) -> None:
    agent, fs, _clock, schedule = storage_agent
    nqn = nqn_of(fs)
    change(fs, nqn)
    agent.collect(fresh=False)
    assert {d.kind for d in agent.heal_next} == kinds
    agent._heal(schedule)
    agent.collect(fresh=False)
    assert agent.heal_next == [] and agent.store.get().pools[0].state == "ok"
    assert fs.read(f"subsystems/{nqn}/attr_allow_any_host") == "0"
    assert fs.read(f"subsystems/{nqn}/namespaces/2/enable") == "1"
    assert [e.name for e in fs.list(f"subsystems/{nqn}/allowed_hosts")] == [HOST]
    assert fs.exists(f"ports/3/subsystems/{nqn}")


def test_the_agent_heals_an_unlinked_port_at_the_next_collect(storage_agent) -> None:
    agent, fs, _clock, schedule = storage_agent
    nqn = nqn_of(fs)
    link = f"ports/3/subsystems/{nqn}"
    assert fs.exists(link)
    agent.collect(fresh=False)
    assert agent.heal_next == [], "nothing changed: nothing to heal"
    fs.unlink(link)
    # A periodic collect (not fresh: the GPU side's topology is reused) reads nvmet.
    snap = agent.collect(fresh=False)
    assert [(d.kind, d.after) for d in agent.heal_next] == [("port link", None)]
    assert snap.pools[0].state != "ok", "the collect shows the outage before it is healed"
    agent._heal(schedule)
    assert fs.exists(link), "the targeted pass linked it again"
    assert agent.counters.drift_heals == 1
    assert agent.counters.drift_detected == (("target", "port link", 1),)
    assert agent.store.get().pools[0].state == "ok"
    agent.collect(fresh=False)
    assert agent.heal_next == [], "healed: the baseline is what the pass left"


def test_the_served_counters_show_a_heal_before_its_pass_writes_anything(
        storage_agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI race of issue 35's kernel test: the key was back before /metrics counted the
    heal, since only the pass's own collect (seconds later) published the counter."""
    agent, fs, _clock, schedule = storage_agent
    fs.unlink(f"ports/3/subsystems/{nqn_of(fs)}")
    agent.collect(fresh=False)
    seen: list[int] = []
    real = agent.reconcile

    def watched(**kwargs):
        seen.append(agent.store.get().counters.drift_heals)  # what /metrics serves now
        return real(**kwargs)

    monkeypatch.setattr(agent, "reconcile", watched)
    agent._heal(schedule)
    assert seen == [1]


def test_the_agent_bounds_a_fight_and_says_what_keeps_changing(storage_agent) -> None:
    agent, fs, clock, schedule = storage_agent
    ns = f"subsystems/{nqn_of(fs)}/namespaces/1/enable"
    heals = 0
    for _ in range(40):
        fs.write(ns, "0")  # another writer disables it whenever it is enabled
        agent.collect(fresh=False)
        if agent.heal_next:
            agent._heal(schedule)
            heals += 1
        clock[0] += 30  # one health.interval per collect
    # Back-off: the k-th heal's next waits 30 x 2^(k-1) s, at most 300 (full_interval):
    # heals at 0, 30, 90, 210, 450, 750, 1050 s; 40 collects over 1,170 s heal 7 times.
    assert heals == agent.counters.drift_heals == 7
    snap = agent.store.get()
    (subject,) = snap.drift
    assert subject.fighting and subject.heals >= FIGHT_HEALS and subject.kind == "namespace"
    assert overall_state(snap) == "degraded" and exit_code(snap) == 1
    assert any("namespace" in p and "keeps changing" in p for p in host_problems(snap))
    doc = to_status_json(snap)
    assert doc["drift"][0]["fighting"] and doc["counters"]["drift_heals"] == 7


def test_a_full_pass_covers_everything_and_a_heal_counts_nothing_twice(storage_agent) -> None:
    agent, fs, _clock, _schedule = storage_agent
    fs.unlink(f"ports/3/subsystems/{nqn_of(fs)}")
    agent.collect(fresh=False)
    assert agent.heal_next
    agent.reconcile()  # the full pass came first and healed it
    assert agent.heal_next == []
    agent.collect(fresh=False)
    assert agent.heal_next == [] and agent.counters.drift_heals == 0
    assert agent.counters.drift_detected == (("target", "port link", 1),)
