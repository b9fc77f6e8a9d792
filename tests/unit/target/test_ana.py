"""ANA states per port (``target.ports[].ana_state``), on the kernel-like fake configfs:
the desired tree, the plan, a converged pass, a drift, and ports kvagent did not create."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, parse_config
from agent.target.export import desired_port
from nvmet.fake import FakeConfigFS
from nvmet.model import Port, Tree
from nvmet.planner import Scope, plan

from .helpers import H1, Target, config, file_pool

RDMA = {"name": "rd", "id": 2, "transport": "rdma", "address": "10.99.0.1"}


@pytest.fixture
def target(tmp_path: Path) -> Target:
    """The fake kernel with soft-RoCE on 10.99.0.1 (the kernel tier's rxe address)."""
    t = Target(tmp_path)
    t.fs.local_addresses.add("10.99.0.1")
    t.fs.rdma_addresses.add("10.99.0.1")
    return t


def two_transports(tmp_path: Path, tcp_state: str | None = "non-optimized"):  # type: ignore[no-untyped-def]
    """One pool on a TCP port and an RDMA port: RDMA optimized (the default), TCP as given."""
    cfg = config(tmp_path, [file_pool(tmp_path, ports=("lo", "rd"), hosts=(("gpu-1", H1),))],
                 extra_ports=(RDMA,))
    if tcp_state is None:
        return cfg
    ports = tuple(dataclasses.replace(p, ana_state=tcp_state) if p.name == "lo" else p
                  for p in cfg.target.ports)
    return dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, ports=ports))


def test_the_desired_port_carries_its_state_in_group_1(tmp_path: Path) -> None:
    cfg = two_transports(tmp_path)
    tcp, rdma = cfg.target.ports
    assert desired_port(tcp, ()).ana_groups == {1: "non-optimized"}
    assert desired_port(rdma, ()).ana_groups == {1: "optimized"}


def test_rdma_optimized_tcp_non_optimized_is_written_once_then_converged(
        target: Target, tmp_path: Path) -> None:
    cfg = two_transports(tmp_path)
    first = target.run(cfg)
    assert first.ok, first.errors
    fs = target.fs
    assert fs.read("ports/1/ana_groups/1/ana_state") == "non-optimized"
    assert fs.read("ports/2/ana_groups/1/ana_state") == "optimized"
    # A new port comes optimized: only the TCP port's state is written.
    writes = [p for op, p in target.ops("write") if "ana_state" in p]
    assert writes == ["ports/1/ana_groups/1/ana_state"]
    again = target.run(cfg)
    assert again.ok and not again.changed and again.configfs_writes == 0
    # Someone flips it behind kvagent's back: the next pass puts it back, alone.
    fs.poke("ports/2/ana_groups/1/ana_state", "inaccessible")
    fixed = target.run(cfg)
    assert fixed.ok and fs.read("ports/2/ana_groups/1/ana_state") == "optimized"
    assert [p for op, p in target.ops() if op != "read"] == ["ports/2/ana_groups/1/ana_state"]
    # The config drops the preference: back to the default, one write, links untouched.
    target.fs.ops.clear()
    plain = target.run(two_transports(tmp_path, tcp_state=None))
    assert plain.ok and fs.read("ports/1/ana_groups/1/ana_state") == "optimized"
    assert [p for op, p in target.ops() if op != "read"] == ["ports/1/ana_groups/1/ana_state"]


def test_a_port_kvagent_did_not_create_keeps_its_ana_state(target: Target,
                                                          tmp_path: Path) -> None:
    fs = target.fs
    fs.mkdir("ports/1")
    for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                 ("trsvcid", "4420")):
        fs.write(f"ports/1/addr_{k}", v)
    fs.write("ports/1/ana_groups/1/ana_state", "inaccessible")
    result = target.run(two_transports(tmp_path))
    assert any("kvagent did not create it" in e.message for e in result.errors)
    assert fs.read("ports/1/ana_groups/1/ana_state") == "inaccessible"
    assert not [p for op, p in target.ops() if op != "read" and p.startswith("ports/1")]


def test_the_planner_knows_a_new_ports_group_1_is_optimized() -> None:
    """No write for the kernel's default on a new port; a write for anything else; and the
    fake agrees with the kernel about the default."""
    addr = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "4420"}
    scope = Scope.owned(subsystem_prefix="nqn.x", port_ids={1})
    default = plan(Tree(ports=[Port(1, addr=addr, ana_groups={1: "optimized"})]), Tree(), scope)
    assert not [a for a in default if "ana" in a.path]
    other = plan(Tree(ports=[Port(1, addr=addr, ana_groups={1: "inaccessible"})]), Tree(),
                 scope)
    assert [(a.op, a.path, a.value) for a in other if "ana" in a.path] == [
        ("write", "ports/1/ana_groups/1/ana_state", "inaccessible")]
    fs = FakeConfigFS()
    fs.mkdir("ports/1")
    assert fs.read("ports/1/ana_groups/1/ana_state") == "optimized"


@pytest.mark.parametrize("state", ["optimised", "persistent-loss", "change"])
def test_only_states_a_port_can_hold_by_choice_are_accepted(state: str) -> None:
    data = {"version": 1, "node": {"name": "stor"}, "target": {"ports": [
        {"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1", "ana_state": state}]}}
    with pytest.raises(ConfigError, match=r"target.ports\[0\].ana_state: .*is not one of: "
                                          "optimized, non-optimized, inaccessible"):
        parse_config(yaml.safe_dump(data))
