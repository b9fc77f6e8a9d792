"""Replacing a controller (both DH-HMAC-CHAP secrets rotated at once, TLS added or
removed) is one bounded step that SIGTERM ends at once, and the next pass finishes what a
stop cut short (issue 24, item 13). The kernel's side: tests/kernel/test_hostile_initiator.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import progress
from agent.initiator.connect import connect
from agent.initiator.nvme import options
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.sysfs import Sysfs
from agent.progress import Stopping, Tracker
from agent.system.run import KILL_GRACE, SubprocessRunner

from .test_auth_connect import K1, K3, UUID, _two_secret_host, auth_target
from .test_connect import NQN, ReplayLog

UNIT = Path(__file__).resolve().parents[3] / "systemd/kvagent.service"


class RecordingTracker(Tracker):
    """The process's tracker, recording every step started (what, bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def step(self, what: str, bound: float, label: str = "") -> Iterator[progress.Step]:
        self.started.append((what, bound))
        with super().step(what, bound, label) as current:
            yield current


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> RecordingTracker:
    """A fresh process tracker (the stop flag must not leak between tests)."""
    fresh = RecordingTracker()
    monkeypatch.setattr(progress, "tracker", fresh)
    return fresh


@pytest.fixture
def blocked_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """/dev/nvme-fabrics played by a full FIFO: a write to it blocks, as the kernel's
    does while it connects to a target that does not answer."""
    fifo = tmp_path / "nvme-fabrics"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"x" * 4096)
    monkeypatch.setattr(options, "FABRICS_DEV", str(fifo))
    yield str(fifo)
    with contextlib.suppress(BlockingIOError):  # let a write still blocked there end
        while os.read(fd, 65536):
            pass
    os.close(fd)


class WriterOnly:
    """A runner for the fabrics write alone (anything else, such as nvme disconnect,
    must not run on this machine)."""

    def __init__(self) -> None:
        self.real = SubprocessRunner()
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(argv))
        assert any(str(a).endswith("fabrics_writer.py") for a in argv), argv
        return self.real(argv, **kwargs)


def unit_stop_budget() -> float:
    """The unit's TimeoutStopSec, in seconds."""
    m = re.search(r"^TimeoutStopSec=(\d+)s$", UNIT.read_text(), re.MULTILINE)
    assert m, "TimeoutStopSec=<n>s in systemd/kvagent.service"
    return float(m.group(1))


def test_sigterm_ends_the_new_controllers_write_at_once(
        tmp_path: Path, tracker: RecordingTracker, blocked_device: str) -> None:
    """The /dev/nvme-fabrics write of the new controller is a command: SIGTERM kills it
    and the pass stops there, instead of waiting for the kernel's connect."""
    _, _, sysfs = _two_secret_host(tmp_path)
    runner = WriterOnly()
    cli = NvmeCli(runner, kernel_log=ReplayLog(), connect_timeout=3)
    seen: list[progress.Step | None] = []

    def sigterm() -> None:
        seen.append(tracker.current())
        progress.request_stop()
    timer = threading.Timer(0.5, sigterm)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Stopping):
        connect(auth_target(K3, K1), cli=cli, sysfs=sysfs, sleep=progress.sleep)
    took = time.monotonic() - started
    timer.join()
    assert took < 0.5 + progress.STOP_POLL + KILL_GRACE, took
    [step] = seen
    assert step is not None and step.what.startswith("command python"), step
    assert len(runner.calls) == 1 and (tmp_path / "class/nvme/nvme2").exists()


def test_the_whole_replacement_is_one_bounded_step(tmp_path: Path,
                                                   tracker: RecordingTracker) -> None:
    """A new controller that never gets its path: the write, the wait and the disconnect
    fit in the replacement's bound, far below the unit's stop budget, and the refusal
    says how long it waited."""
    _, kernel, sysfs = _two_secret_host(tmp_path)
    limits: list[float] = []

    def write(options: str, timeout: float) -> str:
        limits.append(timeout)
        return kernel.fabrics_write(options, timeout)  # no path to the namespace
    kernel.cli.fabrics_write = write
    now = [0.0]

    def sleep(seconds: float) -> None:
        progress.checkpoint()
        now[0] += seconds
    result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs, sleep=sleep,
                     clock=lambda: now[0])
    replacing = [(what, bound) for what, bound in tracker.started
                 if what.startswith("replacing controller nvme2")]
    assert replacing == [("replacing controller nvme2 (nvme.auth)", 30.0)], tracker.started
    assert replacing[0][1] * 1.5 <= unit_stop_budget()
    assert limits and max(limits) <= 15.0
    assert now[0] <= 30.0
    [refusal] = result.refused
    assert "was not live with a path to each of its namespaces within 30s" in refusal.message
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme5")]
    assert [c.name for c in result.controllers] == ["nvme2"]


def test_a_replacement_cut_short_is_finished_by_the_next_pass(
        tmp_path: Path, tracker: RecordingTracker) -> None:
    """SIGTERM after the new controller was made, before it had its paths: the pass stops
    with both controllers there; the next pass uses that new controller (no third one) and
    disconnects the old: nothing is left half-replaced."""
    fake, kernel, sysfs = _two_secret_host(tmp_path)

    def write_then_sigterm(options: str, timeout: float) -> str:
        answer = kernel.fabrics_write(options, timeout)  # nvme5, no path yet
        progress.request_stop()
        return answer
    kernel.cli.fabrics_write = write_then_sigterm
    with pytest.raises(Stopping):
        connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs,
                sleep=lambda s: progress.checkpoint())
    assert sorted(c.name for c in Sysfs(tmp_path).controllers()) == ["nvme2", "nvme5"]
    assert kernel.runner.ran("nvme", "disconnect") == []

    # The agent starts again; the kernel has given nvme5 its path meanwhile.
    tracker.stop_requested = False
    fake.add_subsystem(0, NQN, controllers=(2, 5))
    fake.add_namespace(0, 1, UUID, paths=((2, "optimized"), (5, "optimized")))
    result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=Sysfs(tmp_path),
                     sleep=lambda s: None)
    assert result.changed and not result.refused
    assert len(kernel.fabrics_writes) == 1, "the next pass added another controller"
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme2")]
    assert [c.name for c in result.controllers] == ["nvme5"]
    assert [(r.old, r.new) for r in result.replaced] == [("nvme2", "nvme5")]
    assert [c.name for c in Sysfs(tmp_path).controllers()] == ["nvme5"]


def test_the_write_command_reports_the_kernels_refusal_and_its_time_limit(
        tmp_path: Path, blocked_device: str, tracker: RecordingTracker,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's answer, errno and time limit, as add_controller sees them."""
    run = SubprocessRunner()
    with pytest.raises(TimeoutError):
        options.fabrics_write_command(run, "nqn=x", 0.5)
    device = tmp_path / "device"
    device.write_text("")
    monkeypatch.setattr(options, "FABRICS_DEV", str(device))
    assert options.fabrics_write_command(run, "instance=7,cntlid=1\n", 5) == ""
    assert device.read_text() == "instance=7,cntlid=1\n"  # the options went in on stdin
    monkeypatch.setattr(options, "FABRICS_DEV", str(tmp_path / "gone"))
    with pytest.raises(OSError) as refused:
        options.fabrics_write_command(run, "nqn=x", 5)
    assert refused.value.errno == errno.ENOENT
