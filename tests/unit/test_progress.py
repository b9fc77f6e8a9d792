"""Progress and stop: the bounds the watchdog supervisor reads, SIGTERM at step boundaries."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from agent import progress
from agent.health.watchdog import WatchdogSupervisor
from agent.progress import GRACE, IDLE_BOUND, Stopping, Tracker
from agent.system import run
from agent.system.run import SubprocessRunner


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeNotifier:
    def __init__(self) -> None:
        self.pings = 0

    def watchdog_interval(self) -> float:
        return 20.0

    def watchdog(self) -> bool:
        self.pings += 1
        return True


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> Tracker:
    """A fresh process tracker (the stop flag must not leak between tests)."""
    fresh = Tracker()
    monkeypatch.setattr(progress, "tracker", fresh)
    return fresh


def test_a_step_is_progress_until_its_bound_plus_grace() -> None:
    clock = FakeClock()
    t = Tracker(clock)
    with t.step("command mkfs.xfs", bound=600):
        clock.now += 600 + GRACE - 1
        assert t.wedged() is None, "a long but bounded step is not a hang"
        clock.now += 2
        why = t.wedged()
        assert why is not None and "command mkfs.xfs" in why and "600s" in why
    assert t.wedged() is None, "ending the step is progress"


def test_the_innermost_step_sets_the_deadline() -> None:
    clock = FakeClock()
    t = Tracker(clock)
    with t.step("waiting for the apply lock", bound=600), t.step("command lvs", bound=10):
        clock.now += 10 + GRACE + 1
        assert "command lvs" in (t.wedged() or "")


def test_between_steps_the_idle_bound_applies_and_a_beat_resets_it() -> None:
    clock = FakeClock()
    t = Tracker(clock)
    clock.now += IDLE_BOUND - 1
    assert t.wedged() is None
    clock.now += 2
    assert "no step started or ended" in (t.wedged() or "")
    t.beat()
    assert t.wedged() is None


def test_the_supervisor_pings_while_progressing_stops_when_wedged_and_resumes() -> None:
    clock = FakeClock()
    t = Tracker(clock)
    notifier = FakeNotifier()
    sup = WatchdogSupervisor(notifier, t)  # type: ignore[arg-type]
    assert sup.period == 5.0, "four pings per WatchdogSec"
    with t.step("command lvcreate", bound=125):
        for _ in range(int((125 + GRACE) / 5) - 1):  # a step longer than WatchdogSec
            clock.now += 5
            assert sup.tick()
        assert notifier.pings == int((125 + GRACE) / 5) - 1
        clock.now += 10
        assert not sup.tick() and not sup.tick()
        assert sup.wedged and "command lvcreate" in sup.wedged
    assert sup.tick() and sup.wedged is None
    assert notifier.pings == int((125 + GRACE) / 5)


def test_without_a_watchdog_the_supervisor_does_not_run() -> None:
    class NoWatchdog(FakeNotifier):
        def watchdog_interval(self) -> None:  # type: ignore[override]
            return None

    sup = WatchdogSupervisor(NoWatchdog()).start()  # type: ignore[arg-type]
    assert sup.period is None and sup._thread is None
    sup.stop()


def test_stop_makes_the_next_step_boundary_raise_stopping(tracker: Tracker) -> None:
    with progress.step("command true", bound=1):
        pass
    progress.request_stop()
    assert progress.stop_requested()
    with pytest.raises(Stopping), progress.step("command lvcreate", bound=120):
        raise AssertionError("a step must not start once stopping")
    with pytest.raises(Stopping):
        progress.checkpoint()
    assert not isinstance(Stopping(), Exception), "per-pool except Exception must not catch it"


def test_sleep_ends_early_on_stop(tracker: Tracker) -> None:
    threading.Timer(0.3, progress.request_stop).start()
    started = time.monotonic()
    with pytest.raises(Stopping):
        progress.sleep(30)
    assert time.monotonic() - started < 10, "a 30 s sleep was not cut short by the stop"


def test_the_runner_registers_its_command_as_a_bounded_step(tracker: Tracker) -> None:
    seen: list[progress.Step | None] = []
    timer = threading.Timer(0.5, lambda: seen.append(tracker.current()))
    timer.start()
    SubprocessRunner()(["sleep", "1"], timeout=7)
    timer.join()
    (step,) = seen
    assert step is not None and step.what == "command sleep"
    assert step.bound == 7 + run.KILL_GRACE
    assert tracker.current() is None


def test_stop_kills_the_command_in_flight(tracker: Tracker) -> None:
    """SIGTERM during a long command: the runner kills it and the pass stops there."""
    threading.Timer(0.3, progress.request_stop).start()
    started = time.monotonic()
    with pytest.raises(Stopping):
        SubprocessRunner()(["sleep", "30"], timeout=60)
    assert time.monotonic() - started < 10, "the runner waited for the command to finish"
    ps = subprocess.run(["pgrep", "-f", "-x", "-P", str(os.getpid()), "sleep 30"],
                        capture_output=True, text=True)
    assert ps.stdout.strip() == "", "the killed command is reaped"
    with pytest.raises(Stopping):
        SubprocessRunner()(["true"])  # no new command once stopping


def test_a_command_killed_because_the_agent_stops_is_no_warning(
        tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kill is what a stop asks for (a collect's ``nvme smart-log`` in flight when
    systemd restarts the agent): logged at info; a pass cut short says so itself."""
    levels: list[tuple[str, str]] = []

    class Log:
        def __getattr__(self, level: str):  # type: ignore[no-untyped-def]
            return lambda event, **kw: levels.append((level, event))

    monkeypatch.setattr(run, "log", Log())
    threading.Timer(0.3, progress.request_stop).start()
    with pytest.raises(Stopping):
        SubprocessRunner()(["sleep", "30"], timeout=60)
    assert ("info", "command killed: the agent is stopping") in levels
    assert not [e for level, e in levels if level in ("warning", "error")], levels


def test_stop_leaves_a_command_stuck_after_the_kill_behind(
        tracker: Tracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that does not go when killed (uninterruptible I/O) delays a stop only by
    KILL_GRACE (a grandchild holding the output pipe plays the stuck process)."""
    monkeypatch.setattr(run, "KILL_GRACE", 0.3)
    threading.Timer(0.3, progress.request_stop).start()
    started = time.monotonic()
    with pytest.raises(Stopping):
        SubprocessRunner()(["sh", "-c", "sleep 20 & sleep 20"], timeout=60)
    assert time.monotonic() - started < 10, "the stop waited for a command stuck after a kill"
