"""A binding's JSON is exactly ``dataclasses.asdict`` (written out for speed): the records
file stays the same."""

from __future__ import annotations

from dataclasses import asdict, fields

from hypothesis import given
from hypothesis import strategies as st

from agent.records import Binding, Storage

text = st.text(max_size=12)


@given(st.builds(Binding, text, st.integers(1, 1024), text, text, text, st.none() | text,
                 st.builds(Storage, text, text, text), st.none() | st.integers(0, 1 << 50)))
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
