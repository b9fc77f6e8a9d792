"""A pool's host side (connect.host_iface, connect.host_traddr) reaches nvme connect, and
the controller that shows it is recognised on the next pass (fake host:
tests/unit/initiator/attach_fakes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .attach_fakes import PREFIX, Export, FakeHost, fabrics_host
from .test_attach_failfast import with_connect
from .test_attach_reconcile import run

NQN = f"{PREFIX}:store1:kv:gpu0"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return fabrics_host(tmp_path, monkeypatch, [Export(NQN, [1])])


def test_the_host_side_is_connected_from_and_a_converged_pass_runs_nothing(
        host: FakeHost) -> None:
    pools = with_connect(host, "host_iface: eth1, host_traddr: '10.0.0.5'")
    assert run(host, pools).ok
    [connect] = host.fabrics_writes
    assert (connect["host_iface"], connect["host_traddr"]) == ("eth1", "10.0.0.5")
    calls = len(host.runner.calls)
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions
    assert host.runner.calls[calls:] == []


def test_a_controller_from_another_interface_is_not_the_pools(host: FakeHost) -> None:
    """The pool chooses eth2 now: the controller made through eth1 does not serve it, so
    the pass connects through eth2 (the kernel compares the host side: no EALREADY).
    (The eth1 controller is left as a second path of the subsystem: what an attach drops
    of an older one is by subsystem, not by address.)"""
    assert run(host, with_connect(host, "host_iface: eth1")).ok
    result = run(host, with_connect(host, "host_iface: eth2"))
    tries = host.fabrics_writes[1:]
    assert tries, "the eth1 controller was taken for the pool's"
    assert [t["host_iface"] for t in tries] == ["eth2"]
    assert result.ok, result.errors
    assert sorted(c.address.host_iface or "" for c in host.sysfs.controllers(NQN)) == [
        "eth1", "eth2"]
