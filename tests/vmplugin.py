"""Pytest integration of the real-kernel tier.

Tests marked ``kernel`` never run on the host's own kernel. When the host
session reaches the first kernel test of a group, it boots one VM
(``scripts/vm``) that runs every kernel test of that group inside the guest
with this same plugin, which writes a JSON report. The host then reports
each test with its guest outcome and output, so a kernel test passes or fails
on the host exactly as it did in the guest; a VM that cannot boot fails them
all. A skip inside the guest is a failure: this tier never silently skips, and a
test whose guest report lacks a phase (the guest session was cut short) fails too.

``KVAGENT_TIER_SUMMARY=PATH`` makes the host session write which groups it booted
and which kernel/vmhost tests -m/-k left out (read by ``tests/tiersummary.py``).

``KVAGENT_REAL_HOST=1`` (opt-in, root) runs kernel tests directly on this
machine instead (the real-host tier).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _pytest.reports import TestReport

REPO = Path(__file__).resolve().parent.parent
IN_GUEST = os.environ.get("KVAGENT_IN_VM") == "1" or os.environ.get("KVAGENT_REAL_HOST") == "1"
DEFAULT_GROUP = "main"
#: A kernel test's weight (minutes in a VM under TCG) when its marker names none.
DEFAULT_WEIGHT = 0.1
GUEST_TIMEOUT = int(os.environ.get("KVAGENT_VM_TIMEOUT", "2400"))
#: VMs (or fleets) that run at once (KVAGENT_VM_PARALLEL). A TCG guest keeps a host core
#: busy about 60 % of the time on average, but three at once on a 2-core machine gained
#: nothing: each group then ran 1.6-1.8x longer than with two (crash-storage's tests
#: 1565 s against 996 s, lifecycle's 1256 s against 713 s), the machine was as busy and
#: the timing-sensitive tests had less slack.
PARALLEL = max(1, int(os.environ.get("KVAGENT_VM_PARALLEL", "2")))
#: vCPUs of each VM (KVAGENT_VM_CPUS; scripts/vm's own default is 2). One: a guest runs
#: one thing at a time, and under TCG a second vCPU cost the same group 1.2-2x the host
#: CPU time (multi-threaded TCG's cross-vCPU work; on a busy host a vCPU spins waiting
#: for the other's acknowledgement while that one waits for a core), which on a 2-core
#: machine running two VMs is time taken from the other VM.
GUEST_CPUS = max(1, int(os.environ.get("KVAGENT_VM_CPUS", "1")))
#: The host's variables a guest's tests read: the long runs' extent (the kill matrices
#: kill after every step, not a sample: tests/kernel/test_crash.py) and the sample's
#: offset, to replay a run's.
GUEST_ENV = ("KVAGENT_LONG", "KVAGENT_CRASH_OFFSET")
#: Seconds one guest test may run before its threads' stacks are dumped.
FAULTHANDLER_TIMEOUT = int(os.environ.get("KVAGENT_VM_FAULTHANDLER", "900"))


class Slots:
    """PARALLEL slots for VMs, handed out by weight: the kernel tier's groups and the
    host-side tests that boot VMs themselves (``vm_slot``) share them, so that no more than
    PARALLEL VMs run at once and a free slot goes to the heaviest request waiting (groups
    queue their requests when the tier starts, before any host-side test asks)."""

    def __init__(self, count: int):
        self.free = count
        self.cond = threading.Condition()
        self.waiting: list[tuple[float, int]] = []
        self.seq = itertools.count()

    def request(self, weight: float) -> tuple[float, int]:
        with self.cond:
            ticket = (-weight, next(self.seq))
            heapq.heappush(self.waiting, ticket)
            return ticket

    def wait(self, ticket: tuple[float, int]) -> None:
        with self.cond:
            while not (self.free > 0 and self.waiting[0] == ticket):
                self.cond.wait()
            heapq.heappop(self.waiting)
            self.free -= 1
            self.cond.notify_all()

    def release(self) -> None:
        with self.cond:
            self.free += 1
            self.cond.notify_all()

    @contextlib.contextmanager
    def held(self, ticket: tuple[float, int]) -> Iterator[None]:
        self.wait(ticket)
        try:
            yield
        finally:
            self.release()


SLOTS = Slots(PARALLEL)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kv-guest-report", default=None,
                     help="(internal) where the guest session writes its JSON report")


def group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("kernel")
    return (marker.kwargs.get("group") if marker else None) or DEFAULT_GROUP


def kernel_of(items: list[pytest.Item]) -> str | None:
    """The kernel image a group's VM boots: ``kernel=VERSION`` on its tests' marker (one
    that ``scripts/fetch-kernel`` unpacked under build/kernels/), else the default."""
    versions = {m.kwargs["kernel"] for i in items
                if (m := i.get_closest_marker("kernel")) and m.kwargs.get("kernel")}
    if len(versions) > 1:
        raise pytest.UsageError(f"one group, several kernels: {sorted(versions)}")
    if not versions:
        return None
    version = versions.pop()
    return str(REPO / "build/kernels" / version / "boot" / f"vmlinuz-{version}")


def weight_of(item: pytest.Item) -> float:
    """How long a test runs: roughly its minutes in a VM of its own under TCG (``weight=``
    on the marker; 0.1 by default, what most take: 3-10 s each). Groups (and host-side
    tests that boot VMs, see :func:`vm_slot`) get VM slots in order of their summed
    weights, longest first, so that the parallel VMs finish together."""
    marker = item.get_closest_marker("kernel")
    return float(marker.kwargs.get("weight", DEFAULT_WEIGHT)) if marker else DEFAULT_WEIGHT


# ---------------------------------------------------------------- guest side

class GuestRecorder:
    """Collects every phase report in the guest and writes them as JSON at the end."""

    def __init__(self, path: str):
        self.path = path
        self.results: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        entry = self.results.setdefault(report.nodeid, {})
        if report.skipped and isinstance(report.longrepr, tuple):
            text = report.longrepr[2]
        else:
            text = report.longreprtext
        entry[report.when] = {
            "outcome": report.outcome,
            "text": text,
            "duration": report.duration,
            "sections": [list(s) for s in report.sections],
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        Path(self.path).write_text(json.dumps(self.results))


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--kv-guest-report")
    if path:
        config.pluginmanager.register(GuestRecorder(path), "kv-guest-recorder")
    if not IN_GUEST:
        config.pluginmanager.register(HostSideLog(config), "kv-host-side-log")


# ----------------------------------------------------------------- host side

CI_LOG = "KVAGENT-CI-LOG: "


class HostSideLog:
    """Shows the lines the host-side VM tests (``vmhost``: the fleets) mark for the CI
    log, as the kernel tier shows its groups' (pytest keeps a passing test's output to
    itself): each line once, when the phase that printed it ends."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.shown: set[tuple[str, str]] = set()

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        if "vmhost" not in report.keywords:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for _, text in report.sections:
            for line in text.splitlines():
                if line.startswith(CI_LOG) and (report.nodeid, line) not in self.shown:
                    self.shown.add((report.nodeid, line))
                    if reporter:
                        reporter.write_line(f"[vm host side] {line[len(CI_LOG):]}")


class KernelTier:
    """Boots one VM per group of kernel tests (``PARALLEL`` at a time) and hands out the
    guest's results."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.groups: dict[str, list[pytest.Item]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, str] = {}
        self.futures: dict[str, Future[list[str]]] = {}
        self.pool: ThreadPoolExecutor | None = None

    def results_for(self, item: pytest.Item) -> tuple[dict[str, Any] | None, str | None]:
        group = group_of(item)
        if self.pool is None:
            self._start_all()
        future = self.futures.pop(group, None)
        if future is not None:
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            try:
                lines = future.result()
            except Exception as exc:  # becomes every test's failure
                lines = []
                self.failures[group] = f"running kernel group {group!r} raised {exc!r}"
            for line in lines:  # report in the main thread, group by group
                if reporter:
                    reporter.write_line(line)
        if group in self.failures:
            return None, self.failures[group]
        if group not in self.results:
            return None, f"kernel group {group!r} has no guest report"
        return self.results[group].get(item.nodeid), None

    def _start_all(self) -> None:
        warm_bytecode([i.nodeid for items in self.groups.values() for i in items])
        self.pool = ThreadPoolExecutor(max_workers=len(self.groups) or 1,
                                       thread_name_prefix="kv-vm")
        weights = {g: sum(weight_of(i) for i in items) for g, items in self.groups.items()}
        for group in sorted(self.groups, key=lambda g: -weights[g]):
            ticket = SLOTS.request(weights[group])
            self.futures[group] = self.pool.submit(self._run_group, group, ticket)

    def _run_group(self, group: str, ticket: tuple[float, int]) -> list[str]:
        items = self.groups[group]
        out = Path(tempfile.mkdtemp(prefix=f"kvagent-kernel-{group}-"))
        report = out / "report.json"
        log = out / "guest.log"
        python = str(REPO / ".venv/bin/python") if (REPO / ".venv/bin/python").exists() \
            else sys.executable
        # A test that hangs dumps every thread's stack to the console log (once; it
        # goes on running until the group's timeout).
        # (the guest's environment is its own: what selects a test's extent goes in)
        passed = [f"{k}={os.environ[k]}" for k in GUEST_ENV if k in os.environ]
        inner = ["env", *passed, python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                 "-o", f"faulthandler_timeout={FAULTHANDLER_TIMEOUT}",
                 "--kv-guest-report", str(report), *[i.nodeid for i in items]]
        kernel = kernel_of(items)
        lines = [f"[kernel tier] group {group!r} ({len(items)} tests); guest log: {log}"]
        if kernel is not None and not os.path.exists(kernel):
            with SLOTS.held(ticket):  # (gives its turn back at once)
                self.failures[group] = (
                    f"kernel group {group!r} boots {kernel}, which is not there: run "
                    "scripts/setup (it runs scripts/fetch-kernel)")
            return lines
        argv = [sys.executable, str(REPO / "scripts/vm"), "--out", str(out), "--quiet",
                "--log", str(log), "--timeout", str(GUEST_TIMEOUT), "--cpus", str(GUEST_CPUS),
                *(["--kernel", kernel] if kernel else []), "--", *inner]
        with SLOTS.held(ticket):
            proc = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  check=False)
        lines.append(f"[kernel tier] group {group!r}: {proc.stdout.strip()}")
        # Lines a kernel test marks for the CI log (e.g. the Ansible recaps, the kill
        # matrices' per-step results): from the tests' captured output in the report (the
        # console log can lose output under load), else from the console log; each once.
        texts = [log.read_text(errors="replace")] if log.exists() else []
        if report.exists():
            self.results[group] = json.loads(report.read_text())
            texts = [text for phases in self.results[group].values()
                     for phase in phases.values() for _, text in phase.get("sections", [])
                     ] or texts
        marked = [line for text in texts for line in text.splitlines()
                  if line.startswith(CI_LOG)]
        lines += [f"[kernel tier] {line[len(CI_LOG):]}"
                  for line in dict.fromkeys(marked)]
        if not report.exists():
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            self.failures[group] = (
                f"the VM for kernel group {group!r} produced no report "
                f"(scripts/vm exit {proc.returncode}):\n{proc.stdout}\n--- guest log tail ---\n"
                f"{tail}"
            )
        return lines


def _slot_weight(node: pytest.Item | pytest.Collector) -> float:
    marker = node.get_closest_marker("vmhost")
    return float(marker.kwargs.get("weight", 1)) if marker else 1.0


@pytest.fixture
def vm_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold one of the kernel tier's VM slots while a host-side test boots VMs itself
    (its ``vmhost(weight=...)`` marker ranks it among the groups)."""
    with SLOTS.held(SLOTS.request(_slot_weight(request.node))):
        yield


@pytest.fixture(scope="module")
def fleet_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hold one VM slot for a whole module whose tests share machines booted once (a
    fleet): from before the boot until after the teardown. A per-test slot let a group
    take the slot between two of the module's tests, and the fleet, booted outside any
    slot, sat idle for a whole group's run with its machines up (more VMs than slots)."""
    asked = time.monotonic()
    with SLOTS.held(SLOTS.request(_slot_weight(request.node))):
        got = time.monotonic()
        yield
        print(f"{CI_LOG}{request.node.nodeid}: its machines held a VM slot for "
              f"{time.monotonic() - got:.0f}s (after waiting {got - asked:.0f}s for it)")


def warm_bytecode(nodeids: list[str]) -> None:
    """pytest's assertion-rewriting caches for what the guests collect, written on the host.

    The guest sees this checkout read-only and cannot write them; without them every
    guest session rewrites and compiles the test modules and the test plugins' modules
    (hypothesis) from source, which under TCG costs minutes per group. The host session
    does not write them when ``PYTHONDONTWRITEBYTECODE`` is set (some CI environments),
    so a collect-only run writes them on purpose. (scripts/vm compiles the plain modules.)
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    python = str(REPO / ".venv/bin/python") if (REPO / ".venv/bin/python").exists() \
        else sys.executable
    subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                    *nodeids], cwd=REPO, env={**env, "KVAGENT_IN_VM": "1"},
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: no VM for deselected groups
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    if IN_GUEST:
        return
    kernel = [i for i in items if i.get_closest_marker("kernel")]
    if not kernel:
        return
    tier = KernelTier(config)
    for item in kernel:
        tier.groups.setdefault(group_of(item), []).append(item)
    config.stash[_TIER] = tier
    # The VMs start now, in the background: host-side tests (power cuts) run meanwhile.
    if not config.option.collectonly:
        tier._start_all()
    # Keep each group contiguous so its VM's results are used while fresh.
    order = {g: n for n, g in enumerate(tier.groups)}
    others = [i for i in items if not i.get_closest_marker("kernel")]
    items[:] = others + sorted(kernel, key=lambda i: order[group_of(i)])


_TIER = pytest.StashKey[KernelTier]()
_LEFT_OUT = pytest.StashKey[list[pytest.Item]]()


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("kernel") or item.get_closest_marker("vmhost"):
            item.config.stash.setdefault(_LEFT_OUT, []).append(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    path = os.environ.get("KVAGENT_TIER_SUMMARY")
    if path and not IN_GUEST:
        tier = session.config.stash.get(_TIER, None)
        booted = tier.groups if tier is not None and tier.pool is not None else {}
        Path(path).write_text(json.dumps(tier_summary(
            booted, session.items, session.config.stash.get(_LEFT_OUT, []))))


def tier_summary(booted: dict[str, list[pytest.Item]], selected: list[pytest.Item],
                 left_out: list[pytest.Item]) -> dict[str, Any]:
    """The groups booted (tests in each), the vmhost tests selected, and each
    kernel/vmhost test deselected (its group, None for vmhost; second_kernel, long)."""
    return {
        "booted": {group: len(items) for group, items in booted.items()},
        "vmhost": sum(1 for i in selected if i.get_closest_marker("vmhost")),
        "left_out": [{"nodeid": i.nodeid,
                      "group": group_of(i) if i.get_closest_marker("kernel") else None,
                      "second_kernel": i.get_closest_marker("second_kernel") is not None,
                      "long": i.get_closest_marker("long") is not None}
                     for i in left_out],
    }


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if IN_GUEST or not item.get_closest_marker("kernel"):
        return None
    tier = item.config.stash[_TIER]
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    result, failure = tier.results_for(item)
    for when, outcome, text, sections, duration in _phases(result, failure):
        longrepr: Any = None
        if outcome == "skipped":
            path, lineno, _ = item.location
            longrepr = (str(path), (lineno or 0) + 1, text)
        elif outcome == "failed":
            longrepr = text
        report = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords},
                            outcome, longrepr, when, sections=sections, duration=duration)
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


PHASES = ("setup", "call", "teardown")


def _phases(result: dict[str, Any] | None, failure: str | None):
    """The phases to report for one test: its guest phases, a guest skip as a failure,
    and a failure for the first phase missing from the guest's report (none is expected
    after a setup that did not pass)."""
    if failure is not None:
        yield "setup", "failed", failure, [], 0.0
        return
    if result is None:
        yield "setup", "failed", "the guest session did not report this test (it crashed, " \
            "timed out or was not collected in the guest)", [], 0.0
        return
    for when in PHASES:
        phase = result.get(when)
        if phase is None:
            if when != "setup" and result["setup"]["outcome"] != "passed":
                continue
            missing = " or ".join(w for w in PHASES if w not in result)
            yield when, "failed", (
                f"the guest's report has no {missing} result for this test: the guest "
                "session was likely cut short (interrupted, crashed or timed out in it)"
            ), [], 0.0
            return
        outcome, text = phase["outcome"], phase["text"]
        if outcome == "skipped":
            outcome, text = "failed", f"kernel tests must not skip; the guest said: {text}"
        yield (when, outcome, text, [tuple(s) for s in phase.get("sections", [])],
               phase.get("duration", 0.0))
