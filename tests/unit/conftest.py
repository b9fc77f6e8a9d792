"""The unit tier's time limit per test: one that loops or waits for ever fails after
:data:`UNIT_TIMEOUT` seconds (pytest-timeout) instead of hanging the tier.

Only the tests below this directory get it, however pytest is started (scripts/test,
one file, xdist): the real-kernel tier's tests run far longer in their VMs and have
limits of their own (tests/vmplugin.py). A test marked ``@pytest.mark.timeout(...)``
keeps its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Seconds a unit test may take (KVAGENT_UNIT_TIMEOUT changes it). The slowest unit test
#: took 68 s (the Ansible role's venv install) in a tier of 818 s on a busy 2-core machine.
UNIT_TIMEOUT = float(os.environ.get("KVAGENT_UNIT_TIMEOUT", "300"))
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        if not any(item.get_closest_marker(m) for m in ("timeout", "kernel", "vmhost")):
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT))
