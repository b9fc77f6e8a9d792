"""nvmetcli JSON: export shape, import of a saved file, round trip, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvmet.errors import PlanError
from nvmet.model import Namespace, Port, Subsystem, Tree
from nvmet.nvmetcli import FormatError, dumps, from_nvmetcli, loads, to_nvmetcli
from nvmet.planner import Scope, plan
from nvmet.reader import read

from .capture import capture_fake

SAMPLE = Path(__file__).parent / "fixtures" / "nvmetcli" / "tcp-any-host.json"
POOL0 = "nqn.2026-11.io.kvagent:pool0"


def test_export_of_the_captured_tree_has_nvmetcli_shape() -> None:
    data = json.loads(dumps(read(capture_fake())))
    assert set(data) == {"hosts", "ports", "subsystems"}
    port = next(p for p in data["ports"] if p["portid"] == 1)
    assert port["addr"] == {"adrfam": "ipv4", "traddr": "127.0.0.1", "treq": "not specified",
                            "trsvcid": "4420", "trtype": "tcp"}
    assert port["param"] == {"inline_data_size": "16384", "pi_enable": "0"}
    assert port["ana_groups"] == [{"ana": {"state": "optimized"}, "grpid": 1}]
    assert port["referrals"] == [] and port["subsystems"] == [POOL0]
    sub = next(s for s in data["subsystems"] if s["nqn"] == POOL0)
    assert sub["attr"]["serial"] == "96029581a21342812a2a"
    ns1 = sub["namespaces"][0]
    assert ns1["device"] == {"path": "/dev/nullb0", "nguid": "00000000-0000-0000-0000-000000000000",
                             "uuid": "777c9365-0b21-4484-b476-bfe48dabf593"}
    assert (ns1["nsid"], ns1["enable"], ns1["ana_grpid"]) == (1, 1, 1)
    assert data["hosts"] == [{"nqn": sub["allowed_hosts"][0]}]
    assert dumps(read(capture_fake())).endswith("}\n")


def test_round_trip_of_the_captured_tree() -> None:
    live = read(capture_fake())
    assert loads(dumps(live)) == live


def test_import_a_saved_nvmetcli_file() -> None:
    tree = loads(SAMPLE.read_text())
    sub = tree.subsystems["testnqn"]
    assert sub.attrs["allow_any_host"] == "1" and sub.allowed_hosts == frozenset()
    assert sub.namespaces[1] == Namespace(
        1, device_path="/dev/nvme0n1", device_uuid="5e0f7f0e-3c5a-4f7d-9a43-0c2d1b8e6f11",
        device_nguid="00000000-0000-0000-0000-000000000000", enable=True, ana_grpid=1)
    port = tree.ports[1]
    assert port.addr["traddr"] == "192.168.10.20" and port.subsystems == {"testnqn"}
    assert port.ana_groups == {1: "optimized"} and port.referrals == {}
    with pytest.raises(PlanError, match="'testnqn'"):
        plan(tree, Tree(), Scope.everything())


def test_hosts_named_only_in_allowed_hosts_are_added() -> None:
    h = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"
    tree = from_nvmetcli({"subsystems": [{"nqn": POOL0, "allowed_hosts": [h]}]})
    assert set(tree.hosts) == {h}


def test_extra_namespace_fields_survive() -> None:
    tree = Tree(subsystems=[Subsystem(POOL0, namespaces=[
        Namespace(3, device_path="/tmp/f", buffered_io=True, enable=False,
                  attrs={"resv_enable": "1", "p2pmem": "auto"})])],
        ports=[Port(2, addr={"trtype": "tcp"}, ana_groups={1: "optimized"}, referrals=[])])
    data = to_nvmetcli(tree)
    ns = data["subsystems"][0]["namespaces"][0]
    assert ns["resv"] == {"enable": "1"} and ns["buffered_io"] == 1 and ns["p2pmem"] == "auto"
    assert from_nvmetcli(data) == tree


@pytest.mark.parametrize(("data", "message"), [
    ([], r"\(top level\): expected an object"),
    ({"subsystems": [{"nqn": POOL0, "namespaces": [{"enable": 1}]}]},
     r"subsystems\[0\]\.namespaces\[0\]: 'nsid' is missing"),
    ({"subsystems": [{"nqn": POOL0, "namespaces": [{"nsid": 1, "enable": 2}]}]},
     r"subsystems\[0\]\.namespaces\[0\]\.enable: expected 0 or 1"),
    ({"subsystems": [{"attr": {}}]}, r"subsystems\[0\]: 'nqn' is missing"),
    ({"subsystems": [{"nqn": POOL0, "passthru": [{"device": {}}]}]}, "passthru"),
    ({"ports": [{"portid": "x"}]}, r"ports\[0\]\.portid: expected a number"),
    ({"ports": [{"portid": 1, "addr": {"trtype": ["tcp"]}}]}, r"ports\[0\]\.addr\.trtype"),
    ({"ports": [{"portid": 1, "ana_groups": [{"grpid": 2, "ana": {}}]}]}, "'state' is missing"),
    ({"ports": [{"portid": 1}, {"portid": 1}]}, "given twice"),
    ({"subsystems": [{"nqn": POOL0, "namespaces": [{"nsid": 1}, {"nsid": 1}]}]},
     "nsid 1 given twice"),
])
def test_malformed_files_name_the_json_path(data, message) -> None:
    with pytest.raises(FormatError, match=message):
        from_nvmetcli(data)


def test_not_json_at_all() -> None:
    with pytest.raises(FormatError, match="not valid JSON"):
        loads("{nope")
