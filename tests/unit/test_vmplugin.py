"""The kernel tier's plugin boots VMs only for kernel tests that are selected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''
import os
import time
from pathlib import Path

import tests.vmplugin as plugin


def _run_group(self, group, ticket):  # records the boot instead of booting
    with plugin.SLOTS.held(ticket):
        if group == os.environ.get("HOLD_UNTIL_QUEUED"):
            # hold the slot until every other request is queued (the host test's too)
            deadline = time.monotonic() + 60
            while len(plugin.SLOTS.waiting) < int(os.environ["QUEUED"]):
                assert time.monotonic() < deadline
                time.sleep(0.01)
        with open(os.environ["BOOTS"], "a") as f:
            f.write(group + "\\n")
    self.results[group] = {}
    return []


plugin.KernelTier._run_group = _run_group
'''

TESTS = '''
import pytest


@pytest.mark.kernel(group="heavy")
def test_in_the_vm():
    pass


def test_on_the_host():
    pass
'''


def boots(tmp_path: Path, *args: str, tests: str = TESTS, **extra: str) -> list[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(tests)
    record = tmp_path / "boots.txt"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVAGENT_")}
    env.update(PYTHONPATH=str(REPO), BOOTS=str(record), **extra)
    subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.vmplugin", "-p",
                    "no:cacheprovider", "-q", "-o", "markers=kernel", *args],
                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                   check=False)
    return record.read_text().split() if record.exists() else []


@pytest.mark.parametrize("selection", [["-m", "not kernel"], ["-k", "on_the_host"]])
def test_deselected_kernel_groups_boot_no_vm(tmp_path: Path, selection: list[str]) -> None:
    assert boots(tmp_path, *selection) == []


def test_selected_kernel_groups_boot_their_vm(tmp_path: Path) -> None:
    """Not vacuous: the same sample with the kernel test selected boots its group."""
    assert boots(tmp_path, "-m", "kernel") == ["heavy"]


GROUPS = '''
import pytest


@pytest.mark.kernel(group="short-but-heavy", weight=2)
def test_one():
    pass


@pytest.mark.kernel(group="many")
@pytest.mark.parametrize("n", range(3))
def test_many(n):
    pass


@pytest.mark.kernel(group="single")
def test_single():
    pass
'''


def test_groups_boot_longest_first_by_their_summed_weights(tmp_path: Path) -> None:
    """A group of many tests runs longer than one heavy test: it starts first."""
    order = boots(tmp_path, "-m", "kernel", tests=GROUPS, KVAGENT_VM_PARALLEL="1")
    assert order == ["many", "short-but-heavy", "single"]


HOST_SIDE = '''
import os

import pytest


@pytest.mark.kernel(group="long", weight=5)
def test_long():
    pass


@pytest.mark.kernel(group="short", weight=1)
def test_short():
    pass


@pytest.mark.vmhost(weight=3)
@pytest.mark.usefixtures("vm_slot")
def test_boots_vms_itself():
    with open(os.environ["BOOTS"], "a") as f:
        f.write("host\\n")
'''


def test_host_side_vm_tests_take_a_slot_by_weight(tmp_path: Path) -> None:
    """One slot: the host-side test (weight 3) waits for the long group (5) and goes
    before the short one (1), so no more VMs run than there are slots."""
    order = boots(tmp_path, "-m", "kernel or vmhost", "-o", "markers=vmhost", tests=HOST_SIDE,
                  KVAGENT_VM_PARALLEL="1", HOLD_UNTIL_QUEUED="long", QUEUED="2")
    assert order == ["long", "host", "short"]


def test_group_vms_get_one_vcpu_unless_told(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One vCPU per VM (a second one costs TCG more host CPU than it gives back), unless
    KVAGENT_VM_CPUS says otherwise; the group's scripts/vm is asked for it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVAGENT_")}
    probe = [sys.executable, "-c", "import tests.vmplugin as p; print(p.GUEST_CPUS)"]
    run = dict(cwd=REPO, capture_output=True, text=True, check=True)
    assert subprocess.run(probe, env=env, **run).stdout.strip() == "1"
    assert subprocess.run(probe, env={**env, "KVAGENT_VM_CPUS": "2"},
                          **run).stdout.strip() == "2"

    import tests.vmplugin as plugin

    booted: list[list[str]] = []

    def fake_run(argv, **kwargs):  # type: ignore[no-untyped-def]
        booted.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    class Item:
        nodeid = "tests/kernel/test_x.py::test_x"

        def get_closest_marker(self, name: str) -> None:
            return None

    monkeypatch.setattr(plugin, "GUEST_CPUS", 1)
    monkeypatch.setattr(plugin.subprocess, "run", fake_run)
    monkeypatch.setattr(plugin.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    tier = plugin.KernelTier(config=None)  # type: ignore[arg-type]
    tier.groups["g"] = [Item()]  # type: ignore[list-item]
    tier._run_group("g", plugin.SLOTS.request(1.0))
    (argv,) = booted
    assert argv[1].endswith("scripts/vm") and argv[argv.index("--cpus") + 1] == "1"
