"""A binding's JSON is exactly ``dataclasses.asdict`` (written out for speed), and
``initiator.json``'s subsystem paths are the flat objects they always were: the records
files stay the same."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.fabrics import FabricsAddress
from agent.records import Binding, PoolAttachment, Storage

text = st.text(max_size=12)
#: What a binding's storage path may be (records refuse '..' components and NUL).
paths = st.from_regex(r"/[a-z0-9/._-]{0,11}", fullmatch=True).filter(
    lambda p: ".." not in p.split("/"))


@given(st.builds(Binding, text, st.integers(1, 1024), text, text, text, st.none() | text,
                 st.builds(Storage, text, paths, text), st.none() | st.integers(0, 1 << 50)))
def test_binding_to_json_is_asdict(binding: Binding) -> None:
    assert binding.to_json() == asdict(binding)
    assert list(binding.to_json()) == [f.name for f in fields(Binding)]  # same key order
    assert Binding.from_json(binding.to_json()) == binding


def test_every_field_is_written() -> None:
    """A field added to Binding or Storage must be added to to_json too."""
    assert [f.name for f in fields(Storage)] == ["kind", "path", "detail"]
    assert len(fields(Binding)) == 8


def test_an_attachment_from_before_devices_named_their_mount() -> None:
    """initiator.json of an older kvagent: namespace i was mounted on mounts[i]."""
    from agent.records import PoolAttachment

    dev = {"subsysnqn": "n", "device": "/dev/nvme2n1", "uuid": "u1", "nsid": 1}
    old = {"hostnqn": "h", "layout": "per-namespace", "complete": True,
           "devices": [dev, {**dev, "nsid": 2, "uuid": "u2"}],
           "mounts": ["/srv/kv/ns1", "/srv/kv/ns2"]}
    rec = PoolAttachment.from_json(old)
    assert [(d.nsid, d.mount) for d in rec.devices] == [(1, "/srv/kv/ns1"), (2, "/srv/kv/ns2")]
    assert rec.device_mount("U2") == "/srv/kv/ns2" and rec.recoveries == []
    # devices and mounts that do not pair up (an attach cut short) are not guessed at
    half = PoolAttachment.from_json({**old, "mounts": ["/srv/kv/ns1"], "complete": False})
    assert [d.mount for d in half.devices] == [None, None]
    # a striped pool's devices have no mount of their own
    striped = PoolAttachment.from_json({**old, "layout": "striped", "mounts": ["/srv/kv"]})
    assert [d.mount for d in striped.devices] == [None, None]


def test_an_attachment_round_trips_with_its_recoveries(tmp_path) -> None:
    from agent.records import InitiatorRecords, PoolAttachment

    rec = PoolAttachment("h", mounts=["/srv/kv/a-ns1", "/srv/kv/b-ns1"])
    rec.recovered("/srv/kv/b-ns1", 100.0)
    rec.recovered("/srv/kv/a-ns1", 200.0)
    rec.recovered("/srv/kv/b-ns1", 300.0)
    assert [(r.mount, r.count, r.last_at) for r in rec.recoveries] == [
        ("/srv/kv/a-ns1", 1, 200.0), ("/srv/kv/b-ns1", 2, 300.0)]
    InitiatorRecords.save(tmp_path, {"kv": rec})
    assert InitiatorRecords.load(tmp_path) == {"kv": rec}


# ------------------------------------------------------------ initiator.json subsystems
FIXTURES = Path(__file__).parent / "fixtures"


def test_initiator_json_reads_and_writes_back_byte_for_byte(tmp_path: Path) -> None:
    """``initiator-schema2.json`` was written by ``InitiatorRecords.save`` before the
    subsystem paths held a FabricsAddress (main at e6e8304): the same file comes back."""
    from agent.records import InitiatorRecords

    original = (FIXTURES / "initiator-schema2.json").read_bytes()
    (tmp_path / "initiator.json").write_bytes(original)
    pools = InitiatorRecords.load(tmp_path)
    [first, *_] = pools["kv"].subsystems
    assert first.address == FabricsAddress("rdma", "fd00:10::1", "4420")
    out = tmp_path / "out"
    InitiatorRecords.save(out, pools)
    assert (out / "initiator.json").read_bytes() == original
    assert InitiatorRecords.load(out) == pools


nqns = st.from_regex(r"nqn\.2026-11\.io\.kvagent:[a-z0-9-]{1,8}:[a-z0-9]{1,6}(:[a-z0-9]{1,6})?",
                     fullmatch=True)
endpoints = st.builds(FabricsAddress, st.sampled_from(["tcp", "rdma"]),
                      st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str),
                      st.integers(1, 65535).map(str))


@given(nqns, endpoints)
def test_a_subsystem_path_is_flat_json_as_it_always_was(nqn: str, a: FabricsAddress) -> None:
    from agent.records import SubsystemPath

    path = SubsystemPath(nqn, a)
    assert path.to_json() == {"subsysnqn": nqn, "transport": a.transport, "traddr": a.traddr,
                              "trsvcid": a.trsvcid}
    assert SubsystemPath.from_json(path.to_json()) == path


def test_a_subsystem_path_records_no_host_side() -> None:
    from agent.records import SubsystemPath

    with pytest.raises(ValueError, match="no host side"):
        SubsystemPath("nqn.x", FabricsAddress("tcp", "10.0.0.1", "4420", host_iface="eth1"))


def test_a_subsystem_path_with_unknown_fields_is_malformed(tmp_path: Path) -> None:
    from agent.records import INITIATOR_FILE, InitiatorRecords, RecordError

    sub = {"subsysnqn": "n", "transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420",
           "host_iface": "eth1"}
    (tmp_path / INITIATOR_FILE).write_text(json.dumps(
        {"schema": 2, "pools": {"kv": {"hostnqn": "h", "subsystems": [sub]}}}))
    with pytest.raises(RecordError, match="malformed"):
        InitiatorRecords.load(tmp_path)


# ------------------------------------------------------- initiator.json, saved often
def attachment(i: int, devices: int = 3) -> PoolAttachment:
    from agent.records import AttachedDevice, SubsystemPath

    nqn = f"nqn.2026-11.io.kvagent:store:p{i}"
    return PoolAttachment(
        "h", subsystems=[SubsystemPath(nqn, FabricsAddress("tcp", "10.0.0.1", "4420"))],
        devices=[AttachedDevice(nqn, n, f"uuid-{i}-{n}", f"/dev/nvme{i}n{n}",
                                f"/srv/kv/p{i}-ns{n}") for n in range(1, devices + 1)],
        mounts=[f"/srv/kv/p{i}-ns{n}" for n in range(1, devices + 1)], complete=True)


@pytest.mark.parametrize("count", [0, 1, 5])
def test_initiator_records_are_the_documents_json_text(tmp_path, count: int) -> None:
    """The records file, put together pool by pool, is byte for byte what write_json of
    the whole document writes, and loads back."""
    from agent.records import INITIATOR_FILE, SCHEMA, InitiatorRecords
    from agent.state import write_json

    pools = {f"p{i:02d}": attachment(i) for i in range(count)}
    InitiatorRecords.save(tmp_path, pools, {})
    whole = tmp_path / "whole.json"
    write_json(whole, {"schema": SCHEMA, "pools": {n: p.to_json() for n, p in pools.items()}})
    assert (tmp_path / INITIATOR_FILE).read_bytes() == whole.read_bytes()
    assert InitiatorRecords.load(tmp_path) == pools


def test_a_save_formats_only_the_records_that_changed(tmp_path, monkeypatch) -> None:
    """A pass saves after each step of each pool: the records it saved before, the same
    objects, are not formatted again (that grew each save with the pools attached)."""
    from agent.records import InitiatorRecords

    pools = {f"p{i:02d}": attachment(i) for i in range(20)}
    texts: dict = {}
    InitiatorRecords.save(tmp_path, pools, texts)
    formatted: list[str] = []
    real = PoolAttachment.to_json
    monkeypatch.setattr(PoolAttachment, "to_json",
                        lambda self: formatted.append(self.hostnqn) or real(self))
    pools["p07"] = dataclasses.replace(pools["p07"], hostnqn="changed", complete=False)
    InitiatorRecords.save(tmp_path, pools, texts)
    assert formatted == ["changed"]
    assert InitiatorRecords.load(tmp_path) == pools


# ------------------------------------------------- initiator.json referred ports
def test_the_ports_found_by_referral_are_recorded_flat_and_load_back(tmp_path: Path) -> None:
    from agent.records import INITIATOR_FILE, InitiatorRecords

    rec = dataclasses.replace(attachment(1), discovery=[
        FabricsAddress("tcp", "10.0.0.2", "4420"), FabricsAddress("rdma", "FD00::3", "04420")])
    InitiatorRecords.save(tmp_path, {"kv": rec})
    saved = json.loads((tmp_path / INITIATOR_FILE).read_text())["pools"]["kv"]
    assert saved["discovery"] == [
        {"transport": "tcp", "traddr": "10.0.0.2", "trsvcid": "4420"},
        {"transport": "rdma", "traddr": "fd00::3", "trsvcid": "4420"}]
    assert InitiatorRecords.load(tmp_path) == {"kv": rec}


def test_a_record_without_referred_ports_has_no_key_and_an_old_one_loads(
        tmp_path: Path) -> None:
    """Written before the field existed (no key) it loads with none; none is written as
    no key, so such a record's text stays what it was."""
    from agent.records import INITIATOR_FILE, InitiatorRecords

    rec = attachment(1)
    assert "discovery" not in rec.to_json()
    InitiatorRecords.save(tmp_path, {"kv": rec})
    assert "discovery" not in (tmp_path / INITIATOR_FILE).read_text()
    assert InitiatorRecords.load(tmp_path)["kv"].discovery == []


@pytest.mark.parametrize("port", [
    {"transport": "tcp", "traddr": "10.0.0.2"},
    {"transport": "tcp", "traddr": "10.0.0.2", "trsvcid": "4420", "host_iface": "eth1"},
    {"transport": "tcp", "traddr": None, "trsvcid": "4420"},
    "tcp 10.0.0.2:4420",
])
def test_a_referred_port_out_of_shape_is_malformed(tmp_path: Path, port: object) -> None:
    from agent.records import INITIATOR_FILE, InitiatorRecords, RecordError

    (tmp_path / INITIATOR_FILE).write_text(json.dumps(
        {"schema": 2, "pools": {"kv": {"hostnqn": "h", "discovery": [port]}}}))
    with pytest.raises(RecordError, match="malformed"):
        InitiatorRecords.load(tmp_path)
