"""Failpoints: off by default, a step for every side effect when on, kill/raise/sleep."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agent import failpoints
from agent.state import write_json
from agent.system.run import SubprocessRunner
from nvmet.fake import FakeConfigFS


@pytest.fixture(autouse=True)
def _off():
    yield
    failpoints.configure(None)


def test_off_by_default_and_nothing_wrapped() -> None:
    assert failpoints.step is failpoints._noop and failpoints.point is failpoints._noop
    fs = FakeConfigFS()
    assert failpoints.wrap_configfs(fs) is fs


def test_every_side_effect_through_a_seam_is_a_step(tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    failpoints.configure(f"log={log}")
    runner = SubprocessRunner()
    runner(["true"])  # read-only: not a step
    runner(["touch", str(tmp_path / "x")])
    write_json(tmp_path / "rec.json", {"a": 1})
    fs = failpoints.wrap_configfs(FakeConfigFS())
    fs.mkdir("hosts/nqn.2014-08.org.example:h")
    fs.list("hosts")  # a read: not a step
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert [(n, kind) for n, kind, _ in rows] == [
        ("1", "command"), ("2", "record"), ("3", "configfs.mkdir")]
    assert rows[0][2] == f"touch {tmp_path / 'x'}"
    assert rows[2][2] == "hosts/nqn.2014-08.org.example:h"


@pytest.mark.parametrize(("argv", "changes"), [
    (["blkid", "-p", "/dev/x"], False), (["wipefs", "--no-act", "--json", "/dev/x"], False),
    (["wipefs", "-a", "/dev/x"], True), (["nvme", "list-subsys", "-o", "json"], False),
    (["nvme", "connect", "-t", "tcp"], True), (["lvcreate", "-n", "x"], True),
    (["/usr/sbin/mkfs.xfs", "/dev/x"], True), (["lvs"], False)])
def test_which_commands_are_steps(argv: list[str], changes: bool) -> None:
    assert failpoints.changes_something(argv) is changes


def test_kill_after_the_nth_step(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:  # the child: a process that gets killed at its 2nd step
        try:
            failpoints.configure("kill-after=2")
            for i in range(5):
                write_json(tmp_path / f"r{i}.json", i)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert sorted(p.name for p in tmp_path.glob("r*.json")) == ["r0.json", "r1.json"]


def test_named_points_raise_or_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(failpoints.progress, "sleep", slept.append)  # SIGTERM ends it
    failpoints.configure("target.plan=raise;command.lvcreate=sleep(2.5)")
    with pytest.raises(failpoints.FailpointError):
        failpoints.point("target.plan")
    failpoints.point("command.lvcreate")
    failpoints.point("somewhere.else")
    assert slept == [2.5]


def test_raise_once_raises_the_first_time_only() -> None:
    failpoints.configure("target.plan=raise-once")
    with pytest.raises(failpoints.FailpointError, match="once"):
        failpoints.point("target.plan")
    failpoints.point("target.plan")  # the next pass goes through
    failpoints.point("target.plan")


def test_a_trigger_can_count_one_kind_of_step(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            failpoints.configure("kill-after=record#2")
            fs = failpoints.wrap_configfs(FakeConfigFS())
            fs.mkdir("hosts/nqn.2014-08.org.example:a")  # a step, not a record
            write_json(tmp_path / "a.json", 1)
            fs.mkdir("hosts/nqn.2014-08.org.example:b")
            write_json(tmp_path / "b.json", 2)
            write_json(tmp_path / "c.json", 3)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["a.json", "b.json"]
