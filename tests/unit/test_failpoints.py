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


# ------------------------------------------ test-only switch (issue 24, item 8)
def test_the_environment_is_ignored_without_the_test_switch(monkeypatch, tmp_path: Path,
                                                            capsys) -> None:
    """A root process that inherits KVAGENT_FAILPOINTS (sudo, an Ansible environment) is
    neither killed nor made to write where it says: without the marker, nothing is on."""
    monkeypatch.setattr(failpoints, "MARKER", str(tmp_path / "kvagent-test-vm"))
    log = tmp_path / "steps.log"
    assert not failpoints.configure_from_environment(
        {failpoints.ENV: f"log={log};kill-after=1"})
    assert failpoints.step is failpoints._noop
    failpoints.step("record", "x")  # would be killed after it with the spec obeyed
    assert not log.exists()
    assert "ignoring $KVAGENT_FAILPOINTS" in capsys.readouterr().err


def test_only_a_root_regular_private_marker_turns_the_switch_on(monkeypatch,
                                                               tmp_path: Path) -> None:
    marker = tmp_path / "kvagent-test-vm"
    monkeypatch.setattr(failpoints, "MARKER", str(marker))
    target = tmp_path / "elsewhere"
    target.write_text("")
    marker.symlink_to(target)
    assert not failpoints.test_switch_on()  # a link, even to a good file
    marker.unlink()
    marker.write_text("")
    marker.chmod(0o666)
    assert not failpoints.test_switch_on()  # anyone could have written it
    marker.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(marker, 65534, 65534)
        assert not failpoints.test_switch_on()  # not root's
        os.chown(marker, 0, 0)
    assert failpoints.test_switch_on() == (os.geteuid() == 0)
    if os.geteuid() == 0:
        assert failpoints.configure_from_environment({failpoints.ENV: "target.plan=raise"})
        with pytest.raises(failpoints.FailpointError):
            failpoints.point("target.plan")


def test_cut_refuses_outside_a_test_vm(monkeypatch, tmp_path: Path) -> None:
    """Without the switch, or on bare metal, a power cut is refused before sysrq is opened."""
    sysrq = tmp_path / "sysrq-trigger"
    monkeypatch.setattr(failpoints, "SYSRQ", str(sysrq))
    monkeypatch.setattr(failpoints, "MARKER", str(tmp_path / "absent"))
    monkeypatch.setattr(failpoints.time, "sleep", lambda _s: None)
    with pytest.raises(failpoints.FailpointError, match="refusing to cut the power"):
        failpoints.cut_power()
    assert not sysrq.exists()
    (tmp_path / "marker").write_text("")
    (tmp_path / "marker").chmod(0o644)
    monkeypatch.setattr(failpoints, "MARKER", str(tmp_path / "marker"))
    monkeypatch.setattr(failpoints, "in_virtual_machine", lambda: False)
    with pytest.raises(failpoints.FailpointError):
        failpoints.cut_power()  # the switch alone is not enough on bare metal
    assert not sysrq.exists()


def test_in_virtual_machine_reads_the_hypervisor_flag(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme sse2\n")
    assert not failpoints.in_virtual_machine(str(cpuinfo))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n")
    assert failpoints.in_virtual_machine(str(cpuinfo))


def test_the_step_log_never_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "steps.log").symlink_to(victim)
    failpoints.configure(f"log={tmp_path / 'steps.log'}")
    with pytest.raises(OSError):
        failpoints.step("record", "x")
    assert victim.read_text() == "precious\n"
