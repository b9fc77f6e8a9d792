"""The real runner: argv only, a timeout always, and never an unbounded wait after a kill."""

from __future__ import annotations

import threading

import pytest

from agent.system import run
from agent.system.run import CommandError, CommandNotFound, CommandTimeout, SubprocessRunner


def test_output_exit_code_and_input() -> None:
    runner = SubprocessRunner()
    res = runner(["sh", "-c", "read x; echo out $x; echo err >&2; exit 3"], input="in\n",
                 check=False)
    assert (res.returncode, res.stdout, res.stderr) == (3, "out in\n", "err\n")
    with pytest.raises(CommandError, match=r"sh failed \(exit 3\): err"):
        runner(["sh", "-c", "echo err >&2; exit 3"])
    with pytest.raises(CommandNotFound):
        runner(["kvagent-no-such-program"])
    with pytest.raises(TypeError):
        runner("echo shell string")  # type: ignore[arg-type]


def test_a_command_past_its_timeout_is_killed() -> None:
    with pytest.raises(CommandTimeout) as err:
        SubprocessRunner()(["sleep", "30"], timeout=0.3)
    assert not err.value.stuck


def test_a_command_that_does_not_go_when_killed_is_left_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Like a umount stuck on dead storage: the wait after the kill is bounded too.

    Here a grandchild keeps the output pipe open after the command itself is killed,
    so reading its output would block as long as a process in uninterruptible sleep."""
    monkeypatch.setattr(run, "KILL_GRACE", 0.3)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            SubprocessRunner()(["sh", "-c", "sleep 20 & sleep 20"], timeout=0.3)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive(), "the runner waited without limit after killing the command"
    (exc,) = outcome
    assert isinstance(exc, CommandTimeout) and exc.stuck
    assert "stuck in the kernel" in exc.message
