"""``kvagent engines check`` runs the engine's Python boxed (issue 35, F3): as the owner of
its environment with a minimal environment, its output read as it comes and capped, and
every process it started killed when its time is up.

The "Pythons" here are shell scripts that play a misbehaving engine; they ignore the
checker script they are given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.engines import EngineContext, Rendered
from agent.engines.interpreter import interpreter
from agent.engines.verdict import judge
from agent.errors import KvagentError, UsageError

CTX = EngineContext("kv", "lmcache", ("/mnt/kv/n1-ns1/lmcache",), 10 << 30)
RENDERED = Rendered({"lmcache.yaml": "chunk_size: 256\n"}, "yaml")
ACCEPTED = '{"verdict": "accepted", "engine_version": "0", "method": "fake"}'
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def fake_python(path: Path, body: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid: int) -> bool:
    """Whether ``pid`` is dead within a few seconds of its SIGKILL (a bound, not a figure)."""
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_timeout_kills_the_checker_and_every_process_it_started(tmp_path: Path) -> None:
    """The time box used to kill the checker only: its children ran on."""
    pids = tmp_path / "pids"
    python = fake_python(tmp_path / "python", f"""\
        sleep 1000 &
        echo $! > {pids}
        exec sleep 1000
        """)
    with pytest.raises(KvagentError, match="did not answer within 2s"):
        judge(CTX, RENDERED, python, timeout=2)
    assert gone(int(pids.read_text())), "the checker's child outlived the time box"


def test_a_child_left_holding_the_output_does_not_hold_the_verdict(tmp_path: Path) -> None:
    """The checker answers and exits; a child it left behind keeps its stdout open: the
    verdict is read at once (not at the time box) and the child is killed."""
    pids = tmp_path / "pids"
    python = fake_python(tmp_path / "python", f"""\
        sleep 1000 &
        echo $! > {pids}
        echo '{ACCEPTED}'
        """)
    verdict = judge(CTX, RENDERED, python, timeout=120)
    assert verdict.accepted and verdict.method == "fake"
    assert gone(int(pids.read_text()))


PEAK = """
import resource, sys
from agent.engines.verdict import judge
from tests.unit.engines.test_verdict_boxed import CTX, RENDERED
v = judge(CTX, RENDERED, sys.argv[1])
assert v.accepted, v
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB
"""


def peak_kib(python: str) -> int:
    proc = subprocess.run([sys.executable, "-c", PEAK, python], capture_output=True,
                          text=True, timeout=300, check=False,
                          cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


def test_a_checker_that_prints_without_end_costs_no_more_memory(tmp_path: Path) -> None:
    """Its output was read whole before the 1 MiB cap was applied (400 MB of output: 1.1
    GiB of memory). 256 MiB of output before the verdict now costs what none does (the
    same run's baseline), give or take the kept tail."""
    quiet = fake_python(tmp_path / "quiet", f"echo '{ACCEPTED}'\n")
    loud = fake_python(tmp_path / "loud",
                       f"head -c {256 << 20} /dev/zero | tr '\\0' x\necho\necho '{ACCEPTED}'\n")
    base, big = peak_kib(quiet), peak_kib(loud)
    assert big - base < 16 << 10, f"peak RSS {base} KiB quiet, {big} KiB after 256 MiB"


def test_the_checker_gets_a_minimal_environment(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's environment (here: a token and a PYTHONPATH) stays with root."""
    monkeypatch.setenv("KVAGENT_TEST_TOKEN", "secret")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    python = fake_python(tmp_path / "python", """\
        env | cut -d= -f1 | sort | tr '\\n' ' ' > "$0.env"
        echo '{"verdict": "accepted", "method": "fake"}'
        """)
    assert judge(CTX, RENDERED, python).accepted
    names = set(Path(python + ".env").read_text().split())
    assert {"PATH", "HOME", "USER", "LOGNAME", "LANG"} <= names
    # (sh adds PWD, SHLVL and _ of its own)
    assert names - {"PWD", "SHLVL", "_", "PYTHONDONTWRITEBYTECODE"} == {
        "PATH", "HOME", "USER", "LOGNAME", "LANG"}, names


@pytest.fixture
def reachable(tmp_path: Path) -> Iterator[Path]:
    """A directory another user can reach (pytest's are root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="kvagent-engine-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@needs_root
def test_a_users_venv_runs_as_that_user(reachable: Path) -> None:
    """Root ran a user-owned interpreter, as root."""
    venv = reachable / "venv"
    python = fake_python(venv / "bin" / "python", """\
        echo "{\\"verdict\\": \\"accepted\\", \\"method\\": \\"$(id -u) $(id -g) $(id -G)\\"}"
        """)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    subprocess.run(["chown", "-R", "1000:1000", str(venv)], check=True)
    verdict = judge(CTX, RENDERED, python)
    assert verdict.method.split()[:2] == ["1000", "1000"], verdict.method
    assert "0" not in verdict.method.split()[2:], "none of root's groups"
    assert verdict.user == interpreter(python).account.name


@needs_root
def test_whose_python_it_is(tmp_path: Path) -> None:
    """The venv's owner; else the owner of its bin or site-packages, of the interpreter or
    of a directory above them when that is not root; root only when root owns it all and
    nobody else may write it."""
    venv = tmp_path / "venv"
    python = fake_python(venv / "bin" / "python", "true\n")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    assert interpreter(python).account.uid == 0 and interpreter(python).environment == \
        str(venv)
    for path in (site, venv / "bin", tmp_path):  # each of them could swap the code
        os.chown(path, 1000, 1000)
        assert interpreter(python).account.uid == 1000, path
        os.chown(path, 0, 0)
    site.chmod(0o777)
    with pytest.raises(UsageError, match=f"--python {python}: {site} is root's but writable"):
        interpreter(python)
    site.chmod(0o755)
    bare = fake_python(tmp_path / "bin" / "python3", "true\n")  # no venv: the file itself
    os.chown(bare, 1000, 1000)
    assert (interpreter(bare).account.uid, interpreter(bare).environment) == (1000, bare)
    link = venv / "bin" / "python3"
    link.symlink_to(bare)  # a root venv's python linking to a user's interpreter
    assert interpreter(str(link)).account.uid == 1000
    below_tmp = Path(tempfile.mkdtemp(dir="/tmp")) / "python"  # root's, below /tmp
    try:
        with pytest.raises(UsageError, match="/tmp is root's but writable by others"):
            interpreter(fake_python(below_tmp, "true\n"))
    finally:
        shutil.rmtree(below_tmp.parent)


def test_a_python_that_is_not_there_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--python no-such-python-here: no such program"):
        interpreter("no-such-python-here")
    with pytest.raises(UsageError, match=f"--python {tmp_path}/none: .* is not a file"):
        interpreter(str(tmp_path / "none"))


def test_the_verdict_still_reads_the_last_line_of_a_chatty_checker(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python", f"""\
        i=0; while [ $i -lt 2000 ]; do echo "engine says $i"; echo "err $i" >&2; i=$((i+1)); done
        echo '{json.dumps({"verdict": "refused", "problems": ["too big"]})}'
        """)
    verdict = judge(CTX, RENDERED, python)
    assert (verdict.verdict, verdict.problems) == ("refused", ("too big",))


def test_a_child_that_goes_on_writing_does_not_hold_the_verdict(tmp_path: Path) -> None:
    """What the pipes held when the checker exited is read, not what a child it left
    behind goes on writing."""
    python = fake_python(tmp_path / "python", f"""\
        yes >&2 &
        echo $! > {tmp_path}/pid
        sleep 0.2
        echo '{ACCEPTED}'
        """)
    verdict = judge(CTX, RENDERED, python, timeout=120)
    assert verdict.accepted
    assert gone(int((tmp_path / "pid").read_text()))
