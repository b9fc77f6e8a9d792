"""Model values: canonical forms, immutability, keyed collections."""

from __future__ import annotations

import dataclasses

import pytest

from nvmet.model import FrozenMap, Namespace, Port, Subsystem, Tree, as_dict, canonical


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("attr_allow_any_host", True, "1"), ("attr_allow_any_host", "Yes", "1"),
    ("attr_allow_any_host", "off", "0"), ("enable", 0, "0"),
    ("attr_qid_max", 64, "64"), ("attr_qid_max", "064", "64"),
    ("device_uuid", "AAAAAAAA-2222-3333-4444-555555555555",
     "aaaaaaaa-2222-3333-4444-555555555555"),
    ("device_nguid", "00112233445566778899AABBCCDDEEFF", "00112233-4455-6677-8899-aabbccddeeff"),
    ("attr_version", "1.3.0", "1.3"), ("attr_version", "2.0.1", "2.0.1"),
    ("addr_traddr", " 10.0.0.1\n", "10.0.0.1"), ("attr_model", "kvagent", "kvagent"),
])
def test_canonical_matches_what_the_kernel_shows(name, value, shown) -> None:
    assert canonical(name, value) == shown


def test_objects_are_frozen_and_hashable() -> None:
    sub = Subsystem("nqn.2026-11.io.kvagent:x", attrs={"model": "m"},
                    namespaces=[Namespace(2), Namespace(1)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.nqn = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        sub.attrs["model"] = "z"  # type: ignore[index]
    assert list(sub.namespaces) == [1, 2]
    assert hash(Tree(subsystems=[sub])) == hash(Tree(subsystems=[sub]))
    assert FrozenMap({"a": "1"}) == {"a": "1"}


def test_duplicates_and_bad_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        Tree(ports=[Port(1), Port(1)])
    with pytest.raises(TypeError, match="port id"):
        Port("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nsid"):
        Namespace(True)  # type: ignore[arg-type]


def test_namespace_files_lists_only_mentioned_attributes() -> None:
    assert Namespace(1).files() == {}
    assert Namespace(1, device_path="/dev/x", enable=True, buffered_io=False).files() == {
        "device_path": "/dev/x", "buffered_io": "0", "enable": "1"}


def test_as_dict_is_plain_data() -> None:
    import json

    tree = Tree(subsystems=[Subsystem("nqn.2026-11.io.kvagent:x", namespaces=[Namespace(1)])],
                ports=[Port(1, ana_groups={1: "optimized"})])
    data = as_dict(tree)
    assert json.loads(json.dumps(data)) == data
    assert data["ports"][0]["ana_groups"] == {"1": "optimized"}
