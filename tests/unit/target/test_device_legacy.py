"""A device claim's identity never moves to another drive (issue 24, item 11).

Claims from before identities were recorded (schema 1) carry the identity of their
namespace id, and that id was taken from the device's place in today's list: a
shortened or reordered list gave one drive the identity of another.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.records import SCHEMA, Binding, DeviceClaim, Storage, TargetRecords
from agent.target.identity import legacy_ids
from nvmet.model import Namespace, Subsystem, Tree

from .helpers import context, plan_of
from .test_backings import NQN, Drives, claim_all, dev_cfg

A, B, C = "/dev/disk/by-id/a", "/dev/disk/by-id/b", "/dev/disk/by-id/c"
GPU2_NQN = "nqn.2026-11.io.kvagent:stor:kv:gpu-2"


@pytest.fixture
def drives(monkeypatch: pytest.MonkeyPatch) -> Drives:
    drives = Drives(monkeypatch)
    for path, node, wwid in ((A, "/dev/sda", "eui.0a"), (B, "/dev/sdb", "eui.0b"),
                             (C, "/dev/sdc", "eui.0c")):
        drives.add(path, node, wwid, size=123)
    return drives


def schema1(state: Path, claims: dict[str, str], recorded: list[str] | None) -> None:
    """What kvagent wrote before schema 2: ``device-claims.json`` ({path: host}, each with
    its node and size) and ``target.json`` recording the pool's device list (or none)."""
    state.mkdir(parents=True, exist_ok=True)
    nodes = {A: "/dev/sda", B: "/dev/sdb", C: "/dev/sdc"}
    (state / "device-claims.json").write_text(json.dumps({
        p: {"pool": "kv", "host": h, "device": nodes[p], "size": 123}
        for p, h in claims.items()}))
    pools = {} if recorded is None else {"kv": {"kind": "device", "devices": recorded}}
    (state / "target.json").write_text(json.dumps({"ports": [1], "hosts": [], "pools": pools}))


def ids(plan) -> dict[str, tuple[int, str]]:  # type: ignore[no-untyped-def]
    return {v.path: (v.nsid, v.uuid) for v in plan.volumes}


def test_a_shortened_list_keeps_each_legacy_identity_on_its_drive(tmp_path: Path,
                                                                  drives: Drives) -> None:
    """Exported as ns1=a, ns2=b by the older kvagent; the list is now [b] (after a
    reboot: nvmet exports nothing). b keeps namespace 2 and its identity, never a's."""
    state = tmp_path / "state"
    schema1(state, {A: "gpu-1", B: "gpu-1"}, [A, B])
    records = TargetRecords.load(state)
    cfg = dev_cfg(tmp_path, (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=records))
    assert not plan.errors and not plan.withheld
    assert ids(plan) == {B: (2, legacy_ids(NQN, 2)[0])}
    assert legacy_ids(NQN, 1)[0] not in {v.uuid for v in plan.volumes}
    claim_all(plan)
    # a's claim keeps namespace 1 in the schema-2 records, though a is not listed now:
    saved = TargetRecords.load(state)
    assert saved.read_schema == SCHEMA
    assert {p: c.nsid for p, c in saved.claims.items()} == {A: 1, B: 2}
    # ... so adding it back, anywhere in the list, gives it its own identity back.
    back = dev_cfg(tmp_path, (B, "gpu-1"), (A, "gpu-1"))
    again = plan_of(back, context(back, records=saved))
    assert ids(again) == {A: (1, legacy_ids(NQN, 1)[0]), B: (2, legacy_ids(NQN, 2)[0])}


def test_a_reordered_list_and_two_hosts_number_by_the_recorded_list(tmp_path: Path,
                                                                    drives: Drives) -> None:
    state = tmp_path / "state"
    schema1(state, {A: "gpu-1", C: "gpu-2", B: "gpu-1"}, [A, C, B])
    cfg = dev_cfg(tmp_path, (B, "gpu-1"), (C, "gpu-2"), (A, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords.load(state)))
    assert not plan.errors
    assert ids(plan) == {A: (1, legacy_ids(NQN, 1)[0]), B: (2, legacy_ids(NQN, 2)[0]),
                         C: (1, legacy_ids(GPU2_NQN, 1)[0])}


def test_without_any_proof_of_the_old_numbering_nothing_is_guessed(tmp_path: Path,
                                                                   drives: Drives) -> None:
    """No recorded list, nothing exported now: b's namespace id cannot be proven. The
    pool fails with the way out; a's identity is not handed to b."""
    state = tmp_path / "state"
    schema1(state, {A: "gpu-1", B: "gpu-1"}, None)
    cfg = dev_cfg(tmp_path, (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords.load(state)))
    assert plan.volumes == [] and plan.steps == []
    (error,) = plan.errors
    assert f"cannot tell which namespace id {B} was exported under" in error
    assert '"nsid": N' in error and str(state / "device-claims.json") in error
    assert "kvagent pool destroy kv" in error


def test_what_nvmet_exports_now_proves_a_legacy_nsid(tmp_path: Path, drives: Drives) -> None:
    state = tmp_path / "state"
    schema1(state, {A: "gpu-1", B: "gpu-1"}, None)
    live = Tree(subsystems=[Subsystem(NQN, namespaces={
        1: Namespace(1, A, *legacy_ids(NQN, 1), True),
        2: Namespace(2, B, *legacy_ids(NQN, 2), True)})])
    cfg = dev_cfg(tmp_path, (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords.load(state), live=live))
    assert not plan.errors and ids(plan) == {B: (2, legacy_ids(NQN, 2)[0])}


def test_the_only_claim_of_a_host_is_its_namespace_1(tmp_path: Path, drives: Drives) -> None:
    state = tmp_path / "state"
    schema1(state, {B: "gpu-1", C: "gpu-2"}, None)
    cfg = dev_cfg(tmp_path, (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords.load(state)))
    assert not plan.errors and ids(plan) == {B: (1, legacy_ids(NQN, 1)[0])}


def test_an_identity_shown_on_another_drive_is_never_given_to_this_one(
        tmp_path: Path, drives: Drives) -> None:
    """Whatever a claim says, an identity bound to (or exported on) another drive stays
    there: b's claim says namespace 1, and namespace 1's legacy identity is a's."""
    one = legacy_ids(NQN, 1)
    claims = {B: DeviceClaim(B, "kv", "gpu-1", "/dev/sdb", 123, nsid=1)}
    bound = {(NQN, 1): Binding(NQN, 1, *one, "kv", "gpu-1", Storage("device", A))}
    cfg = dev_cfg(tmp_path, (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords(claims=claims, bindings=bound)))
    assert plan.volumes == [] and plan.steps == []
    (w,) = plan.withheld
    assert (w.host, w.nsid) == ("gpu-1", 1)
    assert f"bound to device {A}" in w.reason and f"never gives it to {B}" in w.reason
    live = Tree(subsystems=[Subsystem(NQN, namespaces={1: Namespace(1, A, *one, True)})])
    plan = plan_of(cfg, context(cfg, records=TargetRecords(claims=dict(claims)), live=live))
    assert plan.volumes == [] and f"exported by nvmet on {A} now" in plan.withheld[0].reason


def test_two_claims_of_one_namespace_are_refused(tmp_path: Path, drives: Drives) -> None:
    claims = {p: DeviceClaim(p, "kv", "gpu-1", n, 123, nsid=1)
              for p, n in ((A, "/dev/sda"), (B, "/dev/sdb"))}
    cfg = dev_cfg(tmp_path, (A, "gpu-1"), (B, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=TargetRecords(claims=claims)))
    assert plan.volumes == [] and plan.steps == []
    (error,) = plan.errors
    assert f"{A} and {B} are both recorded as namespace 1 of host gpu-1" in error
