"""Health of attached GPU pools (``agent.health.collect``) over the fake host: what each
pool shows, and that a collect reads each pool's subsystems once and the host's
controllers once, however many pools there are (it runs after every pass and on udev
events)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.health import collect as collect_mod
from agent.health.collect import collect
from agent.initiator.sysfs import Sysfs
from tests.unit.fakerunner import FakeRunner

from .attach_fakes import PREFIX, Export, FakeHost
from .test_attach_reconcile import pool_yaml, run

POOLS = [f"kv{i}" for i in range(4)]


def nqn(pool: str) -> str:
    return f"{PREFIX}:store1:{pool}"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path, exports=[Export(nqn(p), [1, 2, 3]) for p in POOLS])


def attached(host: FakeHost) -> str:
    pools = "".join(pool_yaml(host, name=p, shared=True, engines="", subsystem=nqn(p))
                    for p in POOLS)
    assert run(host, pools).ok
    return pools


def test_attached_pools_are_ok_and_a_lost_namespace_degrades_its_pool_alone(
        host: FakeHost) -> None:
    cfg = host.config(f"initiator:\n  pools:\n{attached(host)}")
    snap = collect(cfg, FakeRunner(), drives=False)
    assert [(p.name, p.state) for p in snap.pools] == [(p, "ok") for p in POOLS]
    side = snap.pools[0].initiator
    assert side is not None
    assert (side.namespaces_expected, side.namespaces_found, side.controllers_live) == (3, 3, 1)
    assert len(snap.controllers) == len(POOLS)
    assert all(len(c.paths) == 3 for c in snap.controllers)
    # The kernel drops one namespace of kv2: that pool alone is degraded.
    head = Sysfs(host.root / "sys").subsystem_namespaces(nqn("kv2"))[2].name
    (host.root / "sys/block" / head).unlink()
    snap = collect(cfg, FakeRunner(), drives=False)
    assert [(p.name, p.state) for p in snap.pools] == [
        (p, "degraded" if p == "kv2" else "ok") for p in POOLS]
    assert snap.pools[2].problems == ("1 of 3 namespaces missing",)


def test_a_collect_reads_each_subsystem_once_and_the_controllers_once(
        host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = host.config(f"initiator:\n  pools:\n{attached(host)}")
    calls: list[str] = []
    for name in ("subsystem_namespaces", "namespaces", "controllers"):
        real = getattr(Sysfs, name)
        monkeypatch.setattr(Sysfs, name, lambda self, *a, _n=name, _r=real: (
            calls.append(_n), _r(self, *a))[1])
    tables: list[int] = []
    real_table = collect_mod.read_mounts
    monkeypatch.setattr(collect_mod, "read_mounts", lambda *a: tables.append(1) or real_table(*a))
    snap = collect(cfg, FakeRunner(), drives=False)
    assert all(p.state == "ok" for p in snap.pools)
    assert sorted(calls) == ["controllers"] + ["subsystem_namespaces"] * len(POOLS)
    assert tables == [1]
