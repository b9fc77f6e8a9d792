"""``kvagent apply`` (and ``plan``) on a terminal: one line with the step in flight, erased
at the end (issue 35: a direct apply showed nothing until it ended, minutes on a cold
pass). Nothing on a pipe or a file, nothing with ``-o json``.

The end-to-end tests run kvagent with stderr on a pseudo-terminal, its GPU-host pass
replaced by one that runs two harmless commands (through the real runner, so the steps
are the runner's own) and logs a warning between them.
"""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent import progress
from agent.cli.progress_line import CLEAR, ProgressLine
from agent.progress import Tracker

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-4908-8706-050403020100"

#: kvagent, with the pool's attach replaced: two commands and a warning, in the pool.
PROBE = """
import sys
from agent.initiator import reconcile as ir
from agent.log import get_logger

def attach(self, pool, *args):
    self.ctx.runner(["true", "--dhchap-secret", "DHHC-1:00:c2VjcmV0:"], check=False)
    get_logger("probe").warning("a warning in the middle")
    self.ctx.runner(["sleep", "0"])
    return None

ir.InitiatorPass._attach = attach
ir.InitiatorPass._load_modules = lambda self, pools: None
from agent.cli.main import main
sys.argv[0] = "kvagent"
main()
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    (nvme / "hostnqn").write_text(HOSTNQN + "\n")
    (nvme / "hostid").write_text(HOSTNQN.rsplit(":", 1)[1] + "\n")
    path = tmp_path / "kvagent.yaml"
    path.write_text(f"""
version: 1
node: {{name: gpu-01, state_dir: {tmp_path}/state, run_dir: {tmp_path}/run,
        nvme_dir: {nvme}, sysfs: {tmp_path}/sys, configfs: {tmp_path}/configfs}}
initiator:
  pools:
    - name: llama
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {tmp_path}/mnt/llama
""")
    path.chmod(0o600)
    return path


def run(config: Path, *argv: str, tty: bool) -> tuple[int, str, str]:
    """kvagent's exit status, stdout and stderr (stderr on a pseudo-terminal or a pipe)."""
    env = {**os.environ, "TERM": "xterm"}
    cmd = [sys.executable, "-c", PROBE, "-c", str(config), *argv]
    if not tty:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                              check=False)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=follower, env=env, text=True)
        os.close(follower)
        follower = -1
        err = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            err += chunk
        out = proc.stdout.read() if proc.stdout else ""
        return proc.wait(timeout=120), out, err.decode()
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


def screen(raw: str) -> list[str]:
    """What a terminal shows after ``raw``: lines, the current one erased by CLEAR."""
    lines = [""]
    for token in re.split(r"(\r\n|\n|\r\x1b\[K)", raw):
        if token in ("\r\n", "\n"):
            lines.append("")
        elif token == CLEAR:
            lines[-1] = ""
        else:
            lines[-1] += token
    return lines


@pytest.mark.parametrize("command", [["apply"], ["apply", "--dry-run"], ["plan"]])
def test_on_a_terminal_a_line_shows_each_step_and_is_erased(config: Path,
                                                            command: list[str]) -> None:
    code, out, err = run(config, *command, tty=True)
    assert code == 0, (out, err)
    drawn = [part for part in err.split(CLEAR) if part.startswith("[")]
    # the pool, the command line (its secret hidden), a count and the seconds so far
    assert any(re.fullmatch(r"\[\d+, \d+s\] llama: true --dhchap-secret <secret>", d)
               for d in drawn), drawn
    assert any(re.fullmatch(r"\[\d+, \d+s\] llama: sleep 0", d) for d in drawn), drawn
    counts = [int(d[1:].split(",")[0]) for d in drawn]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    assert "c2VjcmV0" not in err
    # the warning went above the line; at the end the line is gone
    shown = [line for line in screen(err) if line]
    assert len(shown) == 1 and "a warning in the middle" in shown[0], shown
    assert screen(err)[-1] == ""
    assert CLEAR not in out and "llama:" not in out  # stdout: the result only
    assert "converged" in out


@pytest.mark.parametrize("command", [["apply"], ["plan"]])
def test_no_line_on_a_pipe(config: Path, command: list[str]) -> None:
    code, out, err = run(config, *command, tty=False)
    assert code == 0, (out, err)
    assert "\x1b" not in err and "llama: true" not in err
    assert "a warning in the middle" in err


def test_no_line_with_json_output_even_on_a_terminal(config: Path) -> None:
    import json

    code, out, err = run(config, "-o", "json", "apply", tty=True)
    assert code == 0, (out, err)
    assert "\x1b" not in err and "llama: true" not in err
    assert json.loads(out)["ok"] is True


# ------------------------------------------------------------ the line itself
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_names_the_pool_the_step_and_a_count(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    tracker = Tracker()
    monkeypatch.setattr(progress, "tracker", tracker)
    term, clock = io.StringIO(), Clock()
    line = ProgressLine(term, clock)
    tracker.set_listener(line.on_step)
    with tracker.step("waiting for the apply lock", 0):
        pass
    with tracker.working_on("pool-a"):
        clock.now += 3
        with tracker.step("waiting for the namespaces of nqn.x", 30):
            with tracker.step("command mkfs.xfs", 60, label="mkfs.xfs -f /dev/nvme1n1"):
                assert line.text == "[3, 3s] pool-a: mkfs.xfs -f /dev/nvme1n1"
            # the inner step ended: the step around it shows again
            assert term.getvalue().endswith(
                "[3, 3s] pool-a: waiting for the namespaces of nqn.x")
    assert term.getvalue().split(CLEAR)[1:] == [
        "[1, 0s] waiting for the apply lock",
        "[2, 3s] pool-a: waiting for the namespaces of nqn.x",
        "[3, 3s] pool-a: mkfs.xfs -f /dev/nvme1n1",
        "[3, 3s] pool-a: waiting for the namespaces of nqn.x"]
    line.clear()
    assert term.getvalue().endswith(CLEAR)


def test_a_failing_listener_never_fails_the_step() -> None:
    tracker = Tracker()

    def broken(event: str, step: progress.Step) -> None:
        raise BrokenPipeError("the terminal went away")

    tracker.set_listener(broken)
    with tracker.step("command lvcreate", 10) as step:
        assert tracker.current() is step
    assert tracker.current() is None
