"""A pool that grows with the fleet: discovery referrals followed from one seed, and a
storage host that cannot be read taken as unknown, never as empty (fake host:
tests/unit/initiator/attach_fakes.py, whose storage hosts list the referrals in
``FakeHost.referrals``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.fabrics import FabricsAddress
from agent.initiator.reconcile import InitiatorPass, load_state
from agent.initiator.stages import discover as discover_stage
from agent.records import PoolAttachment
from agent.result import RunResult

from .attach_fakes import PREFIX, Export, FakeHost


def nqn(store: int) -> str:
    return f"{PREFIX}:store{store}:kv:gpu0"


def addr(store: int) -> str:
    return f"10.0.0.{store}"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    """Storage hosts store1..store3 at 10.0.0.1..3, one namespace each; store1 refers to
    store2 and store3 (the seed of the pools below is store1 alone)."""
    h = FakeHost(tmp_path, exports=[Export(nqn(i), [1], traddr=addr(i)) for i in (1, 2, 3)])
    h.referrals = {addr(1): [addr(2), addr(3)]}
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    return h


def pool_yaml(host: FakeHost, *, seeds: tuple[int, ...] = (1,), referrals: str = "follow",
              layout: str = "per-namespace") -> str:
    targets = ", ".join(f"{{transport: tcp, address: {addr(i)}}}" for i in seeds)
    return f"""
    - name: kv
      targets: [{targets}]
      mount: {host.root / 'mnt' / 'kv'}
      layout: {layout}
      referrals: {referrals}
"""


def attach(host: FakeHost, pools: str, *, rediscover: bool = True,
           ) -> tuple[RunResult, list[str]]:
    """One pass over ``pools``: its result and the pools handed to their engines."""
    cfg = host.config(f"initiator:\n  device_wait: 5s\n  pools:\n{pools}")
    result = RunResult(dry_run=False)
    initiator = InitiatorPass(cfg, host.runner, result, sysfs=host.sysfs, cli=host.cli,
                              seams=host.seams(), rediscover=rediscover,
                              wait_reconnects=False)
    initiator.detach_removed()
    return result, [m.pool.name for m in initiator.attach_configured()]


def record(host: FakeHost) -> PoolAttachment:
    return load_state(host.root / "state")["kv"]


def read(host: FakeHost) -> list[str]:
    """The ports whose discovery log was read, in order."""
    return [c[c.index("--traddr") + 1] for c in host.runner.calls
            if c[:2] == ("nvme", "discover")]


def mounted(host: FakeHost) -> list[str]:
    return sorted(Path(m).name for m in host.mounts())


def port(store: int) -> FabricsAddress:
    return FabricsAddress("tcp", addr(store), "4420")


def steps(host: FakeHost, since: int, *what: str) -> list[tuple[str, ...]]:
    return [c for c in host.runner.calls[since:] if c[:len(what)] == what]


# ------------------------------------------------------------------ the walk

def test_one_seed_attaches_every_storage_host_it_refers_to(host: FakeHost) -> None:
    result, handed = attach(host, pool_yaml(host))
    assert result.ok and not result.warnings, (result.errors, result.warnings)
    assert read(host) == [addr(1), addr(2), addr(3)]
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]
    rec = record(host)
    assert rec.complete and handed == ["kv"]
    assert [(s.subsysnqn, s.address) for s in rec.subsystems] == [
        (nqn(i), port(i)) for i in (1, 2, 3)]
    assert rec.discovery == [port(2), port(3)]


def test_a_loop_of_referrals_reads_each_port_once(host: FakeHost) -> None:
    """store1 refers to store2, which refers back to store1 and to itself."""
    host.referrals = {addr(1): [addr(2)], addr(2): [addr(1), addr(2)]}
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert read(host) == [addr(1), addr(2)]
    assert mounted(host) == ["store1-ns1", "store2-ns1"]
    assert record(host).discovery == [port(2)]


def test_two_seeds_referring_to_each_other_are_read_once_each(host: FakeHost) -> None:
    host.referrals = {addr(1): [addr(2)], addr(2): [addr(1), addr(3)]}
    result, _ = attach(host, pool_yaml(host, seeds=(1, 2)))
    assert result.ok, result.errors
    assert read(host) == [addr(1), addr(2), addr(3)]
    assert record(host).discovery == [port(3)], "a seed is not a referred port"


def test_the_walk_stops_three_referrals_deep_and_says_so(host: FakeHost) -> None:
    host.exports = [Export(nqn(i), [1], traddr=addr(i)) for i in range(1, 6)]
    host.referrals = {addr(i): [addr(i + 1)] for i in range(1, 5)}  # a chain 1 -> 5
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert read(host) == [addr(i) for i in (1, 2, 3, 4)]
    assert mounted(host) == [f"store{i}-ns1" for i in (1, 2, 3, 4)]
    [warning] = result.warnings
    assert "bounds" in warning.message and addr(5) in warning.message


def test_the_walk_reads_at_most_the_bound_of_ports(host: FakeHost,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discover_stage, "MAX_DISCOVERY_PORTS", 2)
    result, _ = attach(host, pool_yaml(host))
    assert read(host) == [addr(1), addr(2)]
    assert mounted(host) == ["store1-ns1", "store2-ns1"]
    [warning] = result.warnings
    assert "bounds" in warning.message and addr(3) in warning.message


def test_referrals_ignore_reads_only_the_seeds(host: FakeHost) -> None:
    result, _ = attach(host, pool_yaml(host, referrals="ignore"))
    assert result.ok, result.errors
    assert read(host) == [addr(1)]
    assert mounted(host) == ["store1-ns1"]
    assert record(host).discovery == []


def test_a_storage_host_added_to_the_mesh_later_is_attached_without_a_config_change(
        host: FakeHost) -> None:
    host.referrals = {addr(1): [addr(2)]}
    attach(host, pool_yaml(host))
    assert mounted(host) == ["store1-ns1", "store2-ns1"]
    host.referrals = {addr(1): [addr(2)], addr(2): [addr(3)]}  # store3 joins via store2
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]
    assert record(host).discovery == [port(2), port(3)]


def test_a_referred_host_offering_nothing_is_no_error(host: FakeHost) -> None:
    host.exports = [Export(nqn(1), [1], traddr=addr(1))]  # store2, store3 offer nothing
    result, _ = attach(host, pool_yaml(host))
    assert result.ok and not result.warnings, (result.errors, result.warnings)
    assert mounted(host) == ["store1-ns1"]


def test_a_seed_that_offers_nothing_but_refers_is_no_error(host: FakeHost) -> None:
    host.exports = [Export(nqn(2), [1], traddr=addr(2))]
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert mounted(host) == ["store2-ns1"]


def test_a_mesh_that_offers_nothing_at_all_is_the_pools_error(host: FakeHost) -> None:
    host.exports = []
    result, _ = attach(host, pool_yaml(host))
    [error] = result.errors
    assert "offers a subsystem of pool 'kv'" in error.message
    assert addr(2) in error.message and addr(3) in error.message


def test_an_attach_pass_that_does_not_rediscover_keeps_the_referred_hosts(
        host: FakeHost) -> None:
    """Events that bring no new subsystem: the record's subsystems stand for discovery,
    those at referred ports too (none read, none dropped)."""
    attach(host, pool_yaml(host))
    calls = len(host.runner.calls)
    result, _ = attach(host, pool_yaml(host), rediscover=False)
    assert result.ok and not result.changed, (result.errors, result.actions)
    assert steps(host, calls, "nvme", "discover") == []
    assert steps(host, calls, "nvme", "disconnect") == []
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]


def test_a_host_no_seed_refers_to_any_more_leaves_the_pool(host: FakeHost) -> None:
    """Every port answered and none refers to store3 now: it left the mesh (as a target
    dropped from the config), its namespace is unmounted and disconnected."""
    attach(host, pool_yaml(host))
    host.referrals = {addr(1): [addr(2)]}
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert mounted(host) == ["store1-ns1", "store2-ns1"]
    assert {s.subsysnqn for s in record(host).subsystems} == {nqn(1), nqn(2)}
    assert record(host).discovery == [port(2)]


def test_a_leaving_mount_an_engine_still_uses_is_kept_and_let_go_once_free(
        host: FakeHost) -> None:
    """store3 left the mesh while an engine still has files open on its mount: the
    engines get the pool without it, the pass says which process holds it (the pool's
    error: /readyz and status show it), and nothing of store3 is unmounted or
    disconnected; the first pass after the engine let go detaches it."""
    from agent.system.mountusers import MountUser

    attach(host, pool_yaml(host))
    leaving = next(m for m in host.mounts() if m.endswith("store3-ns1"))
    host.users[leaving] = [MountUser(4242, "python3 -m lmcache", "open file")]
    host.referrals = {addr(1): [addr(2)]}
    calls = len(host.runner.calls)
    cfg = host.config(f"initiator:\n  device_wait: 5s\n  pools:\n{pool_yaml(host)}")
    result = RunResult(dry_run=False)
    [handed] = InitiatorPass(cfg, host.runner, result, sysfs=host.sysfs, cli=host.cli,
                             seams=host.seams(), wait_reconnects=False).attach_configured()
    [error] = result.errors
    assert leaving in error.message and "python3 -m lmcache (pid 4242" in error.message
    # The engines' configs are rendered from the two mounts that stay.
    assert sorted(Path(m).name for m in handed.mounts) == ["store1-ns1", "store2-ns1"]
    assert steps(host, calls, "umount") == [] and steps(host, calls, "nvme", "disconnect") == []
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]
    assert nqn(3) in {s.subsysnqn for s in record(host).subsystems}
    assert leaving in record(host).mounts

    host.users.clear()  # the engine restarted
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert mounted(host) == ["store1-ns1", "store2-ns1"]
    assert {s.subsysnqn for s in record(host).subsystems} == {nqn(1), nqn(2)}
    assert steps(host, calls, "nvme", "disconnect")


# -------------------------------------------------- unreachable is unknown

def down(host: FakeHost, store: int) -> None:
    """Storage host ``store`` is gone: its discovery port refuses, connects are refused
    and the kernel keeps reconnecting its controllers."""
    host.discovery_down.add(addr(store))
    host.unreachable.add(addr(store))
    for c in host.sysfs.controllers():
        if c.address.traddr == addr(store):
            host.set_state(c.name, "connecting")


def test_a_referred_host_down_keeps_its_subsystems_and_the_others_attached(
        host: FakeHost) -> None:
    attach(host, pool_yaml(host))
    before = record(host)
    down(host, 3)
    calls = len(host.runner.calls)
    result, handed = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    [warning] = result.warnings
    assert addr(3) in warning.message and nqn(3) in warning.message
    assert steps(host, calls, "nvme", "disconnect") == []
    assert steps(host, calls, "umount") == []
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]
    after = record(host)
    assert after.complete
    assert after.subsystems == before.subsystems and after.devices == before.devices
    assert after.mounts == before.mounts and after.discovery == before.discovery
    assert handed == [], "the engines keep what they have until every host answers"


def test_a_new_host_is_attached_while_another_is_down(host: FakeHost) -> None:
    host.exports.append(Export(nqn(4), [1], traddr=addr(4)))
    attach(host, pool_yaml(host))
    down(host, 3)
    host.referrals[addr(1)].append(addr(4))  # store4 joins while store3 is away
    result, _ = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert mounted(host) == [f"store{i}-ns1" for i in (1, 2, 3, 4)]
    assert {s.subsysnqn for s in record(host).subsystems} == {nqn(i) for i in (1, 2, 3, 4)}
    host.discovery_down.clear()  # store3 is back: the pool is whole, and handed off
    host.unreachable.clear()
    for c in host.sysfs.controllers():
        host.set_state(c.name, "live")
    result, handed = attach(host, pool_yaml(host))
    assert result.ok and not result.warnings and handed == ["kv"]


def test_the_seed_down_keeps_the_hosts_it_referred_to(host: FakeHost) -> None:
    """The seed cannot be read, a second seed can: what the first referred to last time
    is unknown now, never gone."""
    host.referrals = {addr(1): [addr(2)]}
    attach(host, pool_yaml(host, seeds=(1, 3)))
    down(host, 1)
    calls = len(host.runner.calls)
    result, _ = attach(host, pool_yaml(host, seeds=(1, 3)))
    assert result.ok, result.errors
    assert steps(host, calls, "nvme", "disconnect") == [] and steps(host, calls, "umount") == []
    assert mounted(host) == ["store1-ns1", "store2-ns1", "store3-ns1"]
    assert {s.subsysnqn for s in record(host).subsystems} == {nqn(1), nqn(2), nqn(3)}
    assert record(host).discovery == [port(2)]
    assert any(addr(1) in w.message for w in result.warnings)


def test_every_port_down_fails_the_pool_and_detaches_nothing(host: FakeHost) -> None:
    attach(host, pool_yaml(host))
    before = record(host)
    for store in (1, 2, 3):
        down(host, store)
    calls = len(host.runner.calls)
    result, _ = attach(host, pool_yaml(host))
    [error] = result.errors
    assert "Connection refused" in error.message
    assert steps(host, calls, "nvme", "disconnect") == [] and steps(host, calls, "umount") == []
    assert record(host) == before


def test_a_striped_pool_with_a_host_down_fails_and_detaches_nothing(host: FakeHost) -> None:
    assert attach(host, pool_yaml(host, layout="striped"))[0].ok
    before = record(host)
    down(host, 2)
    calls = len(host.runner.calls)
    result, _ = attach(host, pool_yaml(host, layout="striped"))
    [error] = result.errors
    assert "striped" in error.message and addr(2) in error.message
    assert steps(host, calls, "nvme", "disconnect") == [] and steps(host, calls, "umount") == []
    assert steps(host, calls, "vgcreate") == [] and record(host) == before


def test_the_only_seed_down_reads_the_hosts_it_referred_to_last_time(host: FakeHost) -> None:
    """The one seed cannot be read: the ports it referred to last time are read instead
    (a host one of them refers to now is attached), the seed's own subsystems kept."""
    host.exports.append(Export(nqn(4), [1], traddr=addr(4)))
    attach(host, pool_yaml(host))
    down(host, 1)
    host.referrals[addr(2)] = [addr(4)]
    calls = len(host.runner.calls)
    result, handed = attach(host, pool_yaml(host))
    assert result.ok, result.errors
    assert read(host)[-4:] == [addr(1), addr(2), addr(3), addr(4)]
    assert steps(host, calls, "nvme", "disconnect") == [] and steps(host, calls, "umount") == []
    assert mounted(host) == [f"store{i}-ns1" for i in (1, 2, 3, 4)]
    assert {s.subsysnqn for s in record(host).subsystems} == {nqn(i) for i in (1, 2, 3, 4)}
    assert record(host).discovery == [port(2), port(3), port(4)]
    assert handed == [] and any(addr(1) in w.message for w in result.warnings)


def test_drop_stale_keeps_what_is_recorded_at_a_port_not_read(host: FakeHost) -> None:
    """The guard of its own: even a new record that lacks them (a bug in what carries
    them forward) drops nothing recorded at a port not read."""
    from agent.initiator.stages.context import StageContext
    from agent.initiator.stages.detach import drop_stale

    attach(host, pool_yaml(host))
    old = record(host)
    new = PoolAttachment(old.hostnqn, subsystems=old.subsystems[:1],
                         devices=old.devices[:1], mounts=old.mounts[:1], complete=True)
    cfg = host.config(f"initiator:\n  pools:\n{pool_yaml(host)}")
    ctx = StageContext(cfg, host.runner, RunResult(dry_run=False), False, host.sysfs,
                       host.cli, host.seams())
    calls = len(host.runner.calls)
    drop_stale(ctx, "kv", old, new, frozenset({port(3)}))
    assert [Path(c[-1]).name for c in steps(host, calls, "umount")] == ["store2-ns1"]
    assert mounted(host) == ["store1-ns1", "store3-ns1"]
    left = {c.subsysnqn for c in host.sysfs.controllers()}
    assert left == {nqn(1), nqn(3)}


def test_a_failed_attach_keeps_the_ports_both_records_were_referred_to() -> None:
    """The discovery controllers keep following what an earlier pass found while an
    attach fails half-way; a complete one's walk replaces it."""
    from agent.initiator.reconcile import merge_record

    old = PoolAttachment("h", discovery=[port(2)], complete=True)
    new = PoolAttachment("h", discovery=[port(3)])
    assert merge_record(old, new).discovery == [port(2), port(3)]
    done = PoolAttachment("h", discovery=[port(3)], complete=True)
    assert merge_record(old, done).discovery == [port(3)]
