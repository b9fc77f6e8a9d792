"""Host-side fleet tests: test_fleet_faults.py's faults run in an order drawn from a seed."""

from __future__ import annotations

import os
import random

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fault tests of test_fleet_faults.py in an order drawn from a seed
    (``KVAGENT_SOAK_SEED`` replays one; the module prints it), each test's parameters
    kept together and in order, its soak last: the module is a sequence of faults, and
    its soak checks what all of them left."""
    mine = [i for i in items if getattr(getattr(i, "module", None), "__name__", "")
            .endswith("test_fleet_faults")]
    if not mine:
        return
    module = mine[0].module  # type: ignore[attr-defined]
    seed = int(os.environ.get("KVAGENT_SOAK_SEED") or random.randrange(2**32))
    tests: dict[str, list[pytest.Item]] = {}
    for item in mine:
        tests.setdefault(item.originalname, []).append(item)  # type: ignore[attr-defined]
    soak = tests.pop(module.SOAK, [])
    names = sorted(tests)
    random.Random(seed).shuffle(names)
    module.SEED, module.ORDER = seed, names
    at = items.index(mine[0])
    rest = [i for i in items if i not in mine]
    items[:] = rest[:at] + [i for n in names for i in tests[n]] + soak + rest[at:]
