"""Referrals to the peers: every kvagent port refers GPU hosts to the other storage hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError
from agent.records import TargetRecords

from .helpers import Target, config, file_pool

PORT2 = {"name": "lo2", "id": 2, "transport": "tcp", "address": "127.0.0.1", "service": 4421}
PEER_A = {"name": "stor-a", "transport": "tcp", "address": "10.0.0.11"}
PEER_B = {"name": "stor-b", "transport": "rdma", "address": "10.0.1.12", "service": 4421}
#: This host's own port in the shared list: never referred to.
SELF = {"name": "stor", "transport": "tcp", "address": "127.0.0.1"}


def referrals(target: Target, port: int = 1) -> dict[str, dict[str, str]]:
    """Each referral of ``port`` with its address and enable flag, as the kernel has it."""
    out = {}
    for e in target.fs.list(f"ports/{port}/referrals"):
        path = f"ports/{port}/referrals/{e.name}"
        out[e.name] = {f: target.fs.read(f"{path}/{f}") for f in (
            "addr_trtype", "addr_adrfam", "addr_traddr", "addr_trsvcid", "enable")}
    return out


def test_every_port_refers_to_every_peer_but_itself_and_a_second_pass_changes_nothing(
        target: Target, tmp_path: Path) -> None:
    cfg = config(tmp_path, [file_pool(tmp_path, ports=("lo", "lo2"))], extra_ports=(PORT2,),
                 peers=(SELF, PEER_A, PEER_B))
    first = target.run(cfg)
    assert first.ok, first.errors
    for port in (1, 2):
        assert referrals(target, port) == {
            "kvagent-stor-a": {"addr_trtype": "tcp", "addr_adrfam": "ipv4",
                               "addr_traddr": "10.0.0.11", "addr_trsvcid": "4420",
                               "enable": "1"},
            "kvagent-stor-b": {"addr_trtype": "rdma", "addr_adrfam": "ipv4",
                               "addr_traddr": "10.0.1.12", "addr_trsvcid": "4421",
                               "enable": "1"}}
    assert TargetRecords.load(tmp_path / "state").referrals == {
        (p, f"kvagent-{n}") for p in (1, 2) for n in ("stor-a", "stor-b")}
    again = target.run(cfg)
    assert again.ok and not again.changed and again.configfs_writes == 0


def test_planning_shows_the_referrals_and_changes_nothing(target: Target,
                                                         tmp_path: Path) -> None:
    assert target.run(config(tmp_path, [file_pool(tmp_path)])).ok
    writes = target.fs.writes
    planned = target.run(config(tmp_path, [file_pool(tmp_path)], peers=(PEER_A,)),
                         dry_run=True)
    assert planned.ok
    assert any(a.kind == "nvmet.mkdir" and a.subject == "ports/1/referrals/kvagent-stor-a"
               for a in planned.actions)
    assert target.fs.writes == writes and referrals(target) == {}


def test_a_peer_moved_draining_or_removed_changes_only_kvagents_referrals(target: Target,
                                                                tmp_path: Path) -> None:
    pools = [file_pool(tmp_path)]
    assert target.run(config(tmp_path, pools, peers=(PEER_A, PEER_B))).ok
    # An admin's own referral on kvagent's port.
    target.fs.mkdir("ports/1/referrals/by-hand")
    for f, v in (("addr_trtype", "tcp"), ("addr_adrfam", "ipv4"),
                 ("addr_traddr", "10.9.9.9"), ("addr_trsvcid", "4420"), ("enable", "1")):
        target.fs.write(f"ports/1/referrals/by-hand/{f}", v)
    hand = referrals(target)["by-hand"]

    moved = dict(PEER_A, address="10.0.0.99")
    assert target.run(config(tmp_path, pools, peers=(moved, PEER_B))).ok
    assert referrals(target)["kvagent-stor-a"]["addr_traddr"] == "10.0.0.99"
    assert referrals(target)["kvagent-stor-a"]["enable"] == "1"

    draining = dict(PEER_A, address="10.0.0.99", draining=True)
    assert target.run(config(tmp_path, pools, peers=(draining, PEER_B))).ok
    assert sorted(referrals(target)) == ["by-hand", "kvagent-stor-b"]
    assert target.run(config(tmp_path, pools, peers=(PEER_B,))).ok
    assert sorted(referrals(target)) == ["by-hand", "kvagent-stor-b"]
    assert referrals(target)["by-hand"] == hand
    assert TargetRecords.load(tmp_path / "state").referrals == {(1, "kvagent-stor-b")}

    assert target.run(config(tmp_path, pools)).ok  # no peers any more
    assert referrals(target) == {"by-hand": hand}
    assert TargetRecords.load(tmp_path / "state").referrals == set()


def test_a_referral_kvagent_did_not_make_is_never_taken_over(target: Target,
                                                            tmp_path: Path) -> None:
    pools = [file_pool(tmp_path)]
    assert target.run(config(tmp_path, pools)).ok
    target.fs.mkdir("ports/1/referrals/kvagent-stor-a")
    target.fs.write("ports/1/referrals/kvagent-stor-a/addr_traddr", "10.7.7.7")
    result = target.run(config(tmp_path, pools, peers=(PEER_A, PEER_B)))
    assert not result.ok
    (error,) = result.errors
    assert "referral kvagent-stor-a exists and kvagent did not make it" in error.message
    assert referrals(target)["kvagent-stor-a"]["addr_traddr"] == "10.7.7.7"
    assert referrals(target)["kvagent-stor-b"]["enable"] == "1"  # the other peer still
    assert TargetRecords.load(tmp_path / "state").referrals == {(1, "kvagent-stor-b")}


def test_without_peers_the_referrals_of_a_port_are_left_alone(target: Target,
                                                             tmp_path: Path) -> None:
    pools = [file_pool(tmp_path)]
    assert target.run(config(tmp_path, pools)).ok
    target.fs.mkdir("ports/1/referrals/by-hand")
    again = target.run(config(tmp_path, pools))
    assert again.ok and not again.changed
    assert list(referrals(target)) == ["by-hand"]


@pytest.mark.parametrize("peers, field, why", [
    ((PEER_A, dict(PEER_B, name="stor-a")), "target.peers[1].name", "used twice"),
    ((PEER_A, dict(PEER_A, name="other")), "target.peers[1]", "listed twice"),
    (({"name": "x", "transport": "tcp", "address": "stor-a.example"},),
     "target.peers[0].address", "not an IPv4 or IPv6 address"),
])
def test_bad_peers_are_refused_naming_the_field(tmp_path: Path, peers: tuple, field: str,
                                                why: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(tmp_path, [file_pool(tmp_path)], peers=peers)
    assert any(p.field == field and why in p.message for p in err.value.problems), \
        err.value.problems
