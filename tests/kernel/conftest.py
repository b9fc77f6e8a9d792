"""Fixtures for the real-kernel tier (inside the VM, or on a real host when opted in)."""

from __future__ import annotations

import itertools

import pytest

from . import kit

_names = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _kernel_modules() -> None:
    kit.modprobe("nvmet", "nvmet-tcp", "nvme-tcp", "nvme-fabrics")
    kit.sh("modprobe", "null_blk", "nr_devices=0")


@pytest.fixture
def nullb():
    """Factory for memory-backed null_blk devices, removed after the test."""
    made: list[str] = []

    def factory(size_mb: int = 256) -> str:
        name = f"kvt{next(_names)}"
        dev = kit.make_nullb(name, size_mb)
        made.append(name)
        return dev

    yield factory
    for name in made:
        kit.remove_nullb(name)


@pytest.fixture
def rxe():
    """Soft-RoCE on a veth pair (10.99.0.1), torn down after the test."""
    link = kit.Rxe().up()
    yield link
    link.down()


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Every kernel test must leave the guest kernel as it found it (they share one VM)."""
    before = kit.leftovers()
    if before:
        kit.force_clean()
    yield
    after = kit.leftovers()
    if after:
        kit.force_clean()
        pytest.fail("test left these behind (cleaned up now): " + "; ".join(after))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed phase's report carries the guest kernel's state (kit.stuck_report): a
    command that hung in the kernel is otherwise a bare timeout in CI's log."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.insert(0, ("the guest kernel at the failure", kit.stuck_report()))
