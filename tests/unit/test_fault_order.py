"""The order tests/vmhost/conftest.py gives test_fleet_faults.py's faults: drawn from a
seed, each test's parameters together and in order, the soak last, other tests' places
kept."""

from __future__ import annotations

import types

import pytest

from tests.vmhost import conftest


def item(module: types.ModuleType, name: str, param: str = "") -> types.SimpleNamespace:
    return types.SimpleNamespace(module=module, originalname=name, nodeid=f"{name}{param}")


def order(seed: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], types.ModuleType]:
    faults = types.ModuleType("tests.vmhost.test_fleet_faults")
    faults.SOAK = "soak"
    other = types.ModuleType("tests.vmhost.test_fleet_unit")
    items = [item(other, "before"), item(faults, "restart", "[a]"),
             item(faults, "restart", "[b]"), item(faults, "partition"),
             item(faults, "storage", "[power]"), item(faults, "gpu"), item(faults, "soak"),
             item(other, "after")]
    monkeypatch.setenv("KVAGENT_SOAK_SEED", seed)
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    return [i.nodeid for i in items], faults


def test_the_faults_run_in_the_order_their_seed_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    orders = set()
    for seed in map(str, range(12)):
        ids, module = order(seed, monkeypatch)
        assert int(seed) == module.SEED
        assert ids[0] == "before" and ids[-2:] == ["soak", "after"], ids
        assert ids.index("restart[a]") + 1 == ids.index("restart[b]"), ids
        assert sorted(ids) == sorted(["before", "restart[a]", "restart[b]", "partition",
                                      "storage[power]", "gpu", "soak", "after"])
        drawn = [i.split("[")[0] for i in ids[1:-2] if not i.endswith("[b]")]
        assert drawn == module.ORDER
        assert order(seed, monkeypatch)[0] == ids  # the same seed, the same order
        orders.add(tuple(ids))
    assert len(orders) > 1, "every seed drew the same order"
