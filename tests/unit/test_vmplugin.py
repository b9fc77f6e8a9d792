"""The kernel tier's plugin boots VMs only for kernel tests that are selected, fails
every kernel test the guest did not report in full (the harness cannot lose a test), and
says which groups it left out."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

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


def run_sample(tmp_path: Path, *args: str, tests: str = TESTS, more: str = "",
               **extra: str) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin on the sample ``tests`` (and ``more``, a second module);
    the groups it boots are noted in ``tmp_path``/boots.txt."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(tests)
    if more:
        (tmp_path / "test_more.py").write_text(more)
    (tmp_path / "boots.txt").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVAGENT_")}
    env.update(PYTHONPATH=str(REPO), BOOTS=str(tmp_path / "boots.txt"), **extra)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.vmplugin", "-p",
                           "no:cacheprovider", "-q", "-o", "markers=kernel", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def boots(tmp_path: Path, *args: str, tests: str = TESTS, more: str = "",
          **extra: str) -> list[str]:
    run_sample(tmp_path, *args, tests=tests, more=more, **extra)
    record = tmp_path / "boots.txt"
    return record.read_text().split() if record.exists() else []


@pytest.mark.parametrize("selection", [["-m", "not kernel"], ["-k", "on_the_host"]])
def test_deselected_kernel_groups_boot_no_vm(tmp_path: Path, selection: list[str]) -> None:
    assert boots(tmp_path, *selection) == []


def test_selected_kernel_groups_boot_their_vm(tmp_path: Path) -> None:
    """Not vacuous: the same sample with the kernel test selected boots its group."""
    assert boots(tmp_path, "-m", "kernel") == ["heavy"]


GROUPS = '''
import pytest


@pytest.mark.kernel(group="short-but-heavy", weight=0.25)
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


TWO_GROUPS = '''
import pytest


@pytest.mark.kernel(group="long", weight=5)
def test_long():
    pass


@pytest.mark.kernel(group="short", weight=1)
def test_short():
    pass
'''

FLEET = '''
import os

import pytest

pytestmark = pytest.mark.vmhost(weight=3)


def note(what):
    with open(os.environ["BOOTS"], "a") as f:
        f.write(what + "\\n")


@pytest.fixture(scope="module")
def machines(fleet_slot):
    note("boot")
    yield
    note("down")


def test_first(machines):
    note("first")
    print("KVAGENT-CI-LOG: the first test's line")


def test_second(machines):
    note("second")
'''


def test_a_fleet_holds_its_slot_from_boot_to_teardown(tmp_path: Path) -> None:
    """One slot: a module's machines boot only once the slot is theirs, and keep it
    across the module's tests (a waiting group does not take it between two of them)."""
    order = boots(tmp_path, "-m", "kernel or vmhost", "-o", "markers=vmhost", tests=FLEET,
                  more=TWO_GROUPS, KVAGENT_VM_PARALLEL="1", HOLD_UNTIL_QUEUED="long",
                  QUEUED="2")
    assert order == ["long", "boot", "first", "second", "down", "short"]


def test_a_fleets_lines_for_the_ci_log_are_shown_once_with_its_slot_time(
        tmp_path: Path) -> None:
    """pytest keeps a passing test's output: the plugin shows the lines a host-side VM
    test marks for the CI log, each once, and how long the fleet held its slot."""
    done = run_sample(tmp_path, "-m", "kernel or vmhost", "-o", "markers=vmhost",
                      tests=FLEET, more=TWO_GROUPS, KVAGENT_VM_PARALLEL="1")
    shown = [line for line in done.stdout.splitlines() if "[vm host side]" in line]
    assert len(shown) == 2, done.stdout
    assert shown[0].endswith("[vm host side] the first test's line"), shown
    assert re.search(r"\[vm host side\] test_sample.py: its machines held a VM slot for "
                     r"\d+s \(after waiting \d+s for it\)$", shown[1]), shown


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


# ------------------------------------------- the guest's report, replayed on the host

FAKE_VM = '''
import os
import subprocess
import tempfile

import tests.vmplugin as plugin

_mkdtemp = tempfile.mkdtemp


def fake_run(argv, **kwargs):  # scripts/vm: writes the guest report it is given, exits
    if "REPORT" in os.environ:
        with open(argv[argv.index("--kv-guest-report") + 1], "w") as f:
            f.write(os.environ["REPORT"])
    return subprocess.CompletedProcess(argv, int(os.environ["VM_EXIT"]), "vm: gone", None)


plugin.warm_bytecode = lambda nodeids: None
plugin.subprocess.run = fake_run
plugin.tempfile.mkdtemp = lambda prefix: _mkdtemp(prefix=prefix, dir=".")
'''

GUEST = '''
import pytest


@pytest.mark.kernel(group="g")
def test_a():
    pass


@pytest.mark.kernel(group="g")
def test_b():
    pass
'''

A, B = "test_sample.py::test_a", "test_sample.py::test_b"


def phase(outcome: str = "passed", text: str = "") -> dict[str, Any]:
    return {"outcome": outcome, "text": text, "duration": 0.5, "sections": []}


PASSED = {when: phase() for when in ("setup", "call", "teardown")}


def replay(tmp_path: Path, report: dict[str, Any] | str | None,
           vm_exit: int = 0) -> tuple[int, dict[str, str]]:
    """The sample's kernel tests on the host, their group's scripts/vm faked (it leaves
    ``report`` as the guest's report and exits with ``vm_exit``): the host pytest's exit
    code and each test's JUnit result ("" when it passed, else each failure's/error's
    tag, message and text)."""
    (tmp_path / "conftest.py").write_text(FAKE_VM)
    (tmp_path / "test_sample.py").write_text(GUEST)
    junit = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVAGENT_")}
    env.update(PYTHONPATH=str(REPO), VM_EXIT=str(vm_exit))
    if report is not None:
        env["REPORT"] = report if isinstance(report, str) else json.dumps(report)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.vmplugin", "-p",
                           "no:cacheprovider", "-q", "-rA", "-o", "markers=kernel",
                           f"--junitxml={junit}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert junit.exists(), proc.stdout + proc.stderr
    results = {case.get("name", ""): " ".join(
        f"{child.tag}: {child.get('message')} {child.text}" for child in case
        if child.tag in ("failure", "error", "skipped"))
        for case in ET.parse(junit).getroot().iter("testcase")}
    return proc.returncode, results


def test_a_full_guest_report_passes_on_the_host(tmp_path: Path) -> None:
    """Not vacuous: what the guest reported in full replays as it was."""
    assert replay(tmp_path, {A: PASSED, B: PASSED}) == (0, {"test_a": "", "test_b": ""})


def test_a_guest_skip_fails_on_the_host(tmp_path: Path) -> None:
    rc, results = replay(tmp_path, {A: {**PASSED, "call": phase("skipped", "no nvme-tcp")},
                                    B: PASSED})
    assert rc == 1 and results["test_b"] == ""
    assert results["test_a"].startswith("failure:")
    assert "kernel tests must not skip; the guest said: no nvme-tcp" in results["test_a"]


@pytest.mark.parametrize("phases, kind, missing", [
    (["setup"], "failure", "no call or teardown result"),
    (["setup", "teardown"], "failure", "no call result"),
    (["setup", "call"], "error", "no teardown result"),
    (["call", "teardown"], "error", "no setup result"),
])
def test_a_guest_test_with_a_phase_missing_fails_on_the_host(
        tmp_path: Path, phases: list[str], kind: str, missing: str) -> None:
    """The guest session was cut short in the test (setup passed, then nothing), or ended
    before its teardown: the host fails the test and says what was missing."""
    rc, results = replay(tmp_path, {A: {when: PASSED[when] for when in phases}, B: PASSED})
    assert rc == 1 and results["test_b"] == ""
    assert results["test_a"].startswith(f"{kind}:")
    assert f"the guest's report has {missing} for this test" in results["test_a"]
    assert "the guest session was likely cut short" in results["test_a"]


def test_a_failed_guest_setup_is_reported_as_it_was(tmp_path: Path) -> None:
    """No call is expected after a setup that failed: its failure is the test's only one."""
    rc, results = replay(tmp_path, {A: {"setup": phase("failed", "fixture broke"),
                                        "teardown": phase()}, B: PASSED})
    assert rc == 1 and results["test_b"] == ""
    assert results["test_a"].startswith("error:") and "fixture broke" in results["test_a"]
    assert "cut short" not in results["test_a"]


def test_a_test_missing_from_the_guest_report_fails_on_the_host(tmp_path: Path) -> None:
    rc, results = replay(tmp_path, {B: PASSED})
    assert rc == 1 and results["test_b"] == ""
    assert "the guest session did not report this test" in results["test_a"]


@pytest.mark.parametrize("vm_exit", [0, 125])
def test_a_group_without_a_report_fails_every_test_naming_the_vms_exit(
        tmp_path: Path, vm_exit: int) -> None:
    """The VM died (or its guest wrote nothing): every test of the group fails, and the
    failure names scripts/vm's exit."""
    rc, results = replay(tmp_path, None, vm_exit=vm_exit)
    assert rc == 1
    for name in ("test_a", "test_b"):
        assert results[name].startswith("error:")
        assert (f"the VM for kernel group 'g' produced no report (scripts/vm exit {vm_exit})"
                in results[name])


def test_a_truncated_guest_report_fails_every_test(tmp_path: Path) -> None:
    """A report cut off mid-write fails the group's tests; the host session goes on."""
    rc, results = replay(tmp_path, json.dumps({A: PASSED, B: PASSED})[:40])
    assert rc == 1
    for name in ("test_a", "test_b"):
        assert results[name].startswith("error:")
        assert "running kernel group 'g' raised JSONDecodeError" in results[name]


# ------------------------------------------------ what the kernel tier left out
# (scripts/test's last line: what it left out first, then what passed; issue 35: it
# began "all passed" while it left groups out)

LEFT_OUT = '''
import pytest


@pytest.mark.kernel(group="main")
def test_main_one():
    pass


@pytest.mark.kernel(group="main")
def test_main_two():
    pass


@pytest.mark.kernel(group="tls-612")
@pytest.mark.second_kernel
def test_tls():
    pass


@pytest.mark.kernel(group="hostile-612")
@pytest.mark.second_kernel
def test_hostile():
    pass


@pytest.mark.vmhost
def test_power_cut():
    pass


def test_unit():
    pass
'''


def summary_of(tmp_path: Path, *args: str) -> dict[str, Any]:
    summary = tmp_path / "summary.json"
    summary.unlink(missing_ok=True)
    boots(tmp_path, "-o", "markers=vmhost", *args, tests=LEFT_OUT,
          KVAGENT_TIER_SUMMARY=str(summary))
    return json.loads(summary.read_text())


def tiersummary(*argv: str) -> str:
    """The helper as scripts/test runs it."""
    return subprocess.run([sys.executable, "-m", "tests.tiersummary", *argv], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_summary_names_the_booted_groups_and_the_left_out_tests(tmp_path: Path) -> None:
    summary = summary_of(tmp_path, "-m", "(kernel or vmhost) and not second_kernel",
                         "-k", "not main_two")
    assert summary["booted"] == {"main": 1} and summary["vmhost"] == 1
    assert sorted(summary["left_out"], key=lambda t: t["nodeid"]) == [
        {"nodeid": "test_sample.py::test_hostile", "group": "hostile-612",
         "second_kernel": True, "long": False},
        {"nodeid": "test_sample.py::test_main_two", "group": "main", "second_kernel": False,
         "long": False},
        {"nodeid": "test_sample.py::test_tls", "group": "tls-612", "second_kernel": True,
         "long": False},
    ]
    path = str(tmp_path / "summary.json")
    assert tiersummary(path, "--second-kernel-off", "--", "-k", "not main_two") == (
        "left out: groups 'hostile-612', 'tls-612' (KVAGENT_SECOND_KERNEL=0), "
        "1 of 2 tests of group 'main' (arguments: -k 'not main_two'); "
        "passed: lint, unit tier (arguments: -k 'not main_two'), "
        "kernel tier (1 group, 1 test, 1 host-side vmhost test)")


def test_the_summary_says_none_when_nothing_was_left_out(tmp_path: Path) -> None:
    summary = summary_of(tmp_path, "-m", "kernel or vmhost")
    assert summary == {"booted": {"main": 2, "tls-612": 1, "hostile-612": 1}, "vmhost": 1,
                       "left_out": []}
    assert tiersummary(str(tmp_path / "summary.json")) == (
        "all passed: lint, unit tier, kernel tier (3 groups, 4 tests, 1 host-side vmhost test)")


def test_the_left_out_line_names_vmhost_tests_and_a_missing_summary(tmp_path: Path) -> None:
    summary = summary_of(tmp_path, "-m", "kernel and not second_kernel")
    assert summary["vmhost"] == 0
    path = str(tmp_path / "summary.json")
    assert tiersummary(path, "--second-kernel-off", "--", "-x") == (
        "left out: groups 'hostile-612', 'tls-612' (KVAGENT_SECOND_KERNEL=0), "
        "1 of 1 host-side vmhost tests (arguments: -x); "
        "passed: lint, unit tier (arguments: -x), kernel tier (1 group, 2 tests)")
    assert tiersummary(path) == (
        "left out: groups 'hostile-612', 'tls-612', 1 of 1 host-side vmhost tests (-m/-k); "
        "passed: lint, unit tier, kernel tier (1 group, 2 tests)")
    assert tiersummary(str(tmp_path / "none.json")) == (
        "left out: unknown (the kernel tier wrote no summary); "
        "passed: lint, unit tier, kernel tier (what it ran is unknown)")


def last_line_of_scripts_test(summary: Path, *flags: str) -> str:
    """scripts/test's own last lines (from its verdict on), run with the timings set and
    the summary and flags it would pass."""
    script = (REPO / "scripts/test").read_text()
    tail = script[script.index("verdict=$("):]
    setup = (f"summary={shlex.quote(str(summary))}; summary_flags=({shlex.join(flags)}); "
             "start=0; t0=1; t1=8; t2=10; units_s=400; set --\n")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", setup + tail], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_scripts_test_names_what_it_left_out_first(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"booted": {"main": 3}, "vmhost": 0, "left_out": [
        {"nodeid": "t.py::test_long", "group": "flush-gpu", "second_kernel": False,
         "long": True}]}))
    assert last_line_of_scripts_test(summary, "--long-off") == (
        "== scripts/test: left out: group 'flush-gpu' (long: KVAGENT_LONG=1 runs them); "
        "passed: lint, unit tier, kernel tier (1 group, 3 tests); kernel tier 7s, "
        "the unit tiers 400s beside it, total 10s")
    summary.write_text(json.dumps({"booted": {"main": 3}, "vmhost": 0, "left_out": []}))
    assert last_line_of_scripts_test(summary).startswith(
        "== scripts/test: all passed: lint, unit tier, kernel tier (1 group, 3 tests); ")


def run_scripts_test_from_the_unit_tiers(tmp_path: Path, units_rc: int,
                                         kernel_rc: int) -> subprocess.CompletedProcess[str]:
    """scripts/test from the unit tiers' start on, in ``tmp_path`` with stand-ins for
    scripts/test-unit (exit ``units_rc``), the kernel tier's pytest (``kernel_rc``) and
    the tier summary; each stand-in notes when it ran, the unit tiers their nice value."""
    script = (REPO / "scripts/test").read_text()
    tail = script[script.index("units_log=$(mktemp)"):]
    said = ("== unit tiers: passed in 400s (...)" if units_rc == 0 else
            f"== unit tiers: FAILED: the unit tier against the dependency floors (exit {units_rc})")
    stubs = {"scripts/test-unit": f"sleep 1; echo unit tiers at nice $(nice) >> order; "
                                  f"echo unit tiers output; echo '{said}'; exit {units_rc}",
             ".venv/bin/pytest": f"echo kernel tier >> order; exit {kernel_rc}",
             ".venv/bin/python": "echo 'all passed: stand-ins'"}
    for path, body in stubs.items():
        stub = tmp_path / path
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text(f"#!/bin/sh\n{body}\n")
        stub.chmod(0o755)
    setup = "start=0; kernel_tests=kernel; summary_flags=(); set --\n"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", setup + tail], cwd=tmp_path,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("units_rc", "kernel_rc", "rc"), [(0, 0, 0), (3, 0, 3), (0, 1, 1),
                                                           (3, 1, 3)])
def test_the_unit_tiers_run_beside_the_kernel_tier_and_decide_the_exit(
        tmp_path: Path, units_rc: int, kernel_rc: int, rc: int) -> None:
    """The unit tiers run at nice 19 while the kernel tier runs, their output comes after
    the kernel tier's, and either one failing fails scripts/test."""
    done = run_scripts_test_from_the_unit_tiers(tmp_path, units_rc, kernel_rc)
    assert done.returncode == rc, done.stdout + done.stderr
    assert (tmp_path / "order").read_text().splitlines() == ["kernel tier",
                                                             "unit tiers at nice 19"]
    assert "unit tiers output" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    if rc == 0:
        assert last.startswith("== scripts/test: all passed: stand-ins; kernel tier "), last
        assert "the unit tiers 400s beside it" in last
    elif units_rc:
        assert last == "== scripts/test: FAILED: the unit tier against the dependency " \
                       f"floors (exit {units_rc})"


def test_scripts_test_unit_runs_both_tiers_and_names_the_one_that_failed(
        tmp_path: Path) -> None:
    """scripts/test-unit runs the floors even after the unit tier failed, and its last
    line names the first failure (scripts/test repeats it)."""
    script = (REPO / "scripts/test-unit").read_text()
    for failing, expected in (("", "== unit tiers: passed in "),
                              ("unit", "== unit tiers: FAILED: the unit tier (exit 5)"),
                              ("floors", "== unit tiers: FAILED: the unit tier against the "
                                         "dependency floors (exit 5)")):
        where = tmp_path / (failing or "none")
        (where / "scripts").mkdir(parents=True)
        (where / ".venv/bin").mkdir(parents=True)
        for path, name in ((".venv/bin/pytest", "unit"), ("scripts/test-floors", "floors")):
            stub = where / path
            stub.write_text(f"#!/bin/sh\necho {name} $* >> order\n"
                            f"exit {5 if name == failing else 0}\n")
            stub.chmod(0o755)
        (where / "scripts/test-unit").write_text(script)
        done = subprocess.run(["bash", str(where / "scripts/test-unit"), "-x"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == (5 if failing else 0), done.stdout + done.stderr
        assert done.stdout.strip().splitlines()[-1].startswith(expected), done.stdout
        assert (where / "order").read_text().splitlines() == [
            "unit -m not kernel and not vmhost -q -n auto -x", "floors -x"]


LONG = '''
import pytest


@pytest.mark.kernel(group="main")
def test_short():
    pass


@pytest.mark.kernel(group="flush-gpu")
@pytest.mark.long
def test_replay_every_point():
    pass


@pytest.mark.vmhost
@pytest.mark.long
def test_role_twice():
    pass
'''


def test_the_long_tests_left_out_are_named_with_how_to_run_them(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    assert boots(tmp_path, "-o", "markers=vmhost", "-m", "(kernel or vmhost) and not long",
                 tests=LONG, KVAGENT_TIER_SUMMARY=str(summary)) == ["main"]
    data = json.loads(summary.read_text())
    assert sorted((t["nodeid"], t["long"]) for t in data["left_out"]) == [
        ("test_sample.py::test_replay_every_point", True),
        ("test_sample.py::test_role_twice", True)]
    # scripts/test's default: never "all passed" while it leaves the long tests out
    assert tiersummary(str(summary), "--long-off") == (
        "left out: group 'flush-gpu', 1 of 1 host-side vmhost tests "
        "(long: KVAGENT_LONG=1 runs them); passed: lint, unit tier, kernel tier "
        "(1 group, 1 test)")
    # without --long-off (someone's own -m), the arguments are the reason
    assert tiersummary(str(summary)) == (
        "left out: group 'flush-gpu', 1 of 1 host-side vmhost tests (-m/-k); "
        "passed: lint, unit tier, kernel tier (1 group, 1 test)")
