"""The apply lock is private to kvagent's user, and Busy names the real holder.

Before: the run dir was 0755 and the lock file 0644, so any local user could open
it read-only and flock it, and Busy named whatever pid the file contained.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.lock import Busy, apply_lock, lock_holder
from agent.rundir import RunDirError

from .lockholders import NOBODY, holding, needs_root, old_layout, world_readable_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_fresh_run_dir_is_0700_and_lock_file_0600(tmp_path: Path) -> None:
    run = tmp_path / "deep" / "run"
    with apply_lock(run):
        assert mode(run) == 0o700
        assert mode(run / "apply.lock") == 0o600


def test_old_open_layout_is_tightened(tmp_path: Path) -> None:
    lock = old_layout(tmp_path / "run")
    with apply_lock(tmp_path / "run"):
        pass
    assert mode(tmp_path / "run") == 0o700
    assert mode(lock) == 0o600


def test_symlinked_run_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError) as err, apply_lock(tmp_path / "run"):
        pytest.fail("locked through a symlink")
    assert f"the run directory {tmp_path / 'run'} is a symlink" in err.value.message
    assert not (tmp_path / "elsewhere" / "apply.lock").exists()


def test_symlinked_lock_file_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("keep\n")
    target.chmod(0o644)
    (run / "apply.lock").symlink_to(target)
    with pytest.raises(RunDirError, match=r"apply\.lock is a symlink"), apply_lock(run):
        pytest.fail("locked through a symlink")
    assert target.read_text() == "keep\n" and mode(target) == 0o644


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    """A FIFO at the lock's name opens read-write without blocking and takes a flock: only
    the regular-file check refuses it (a directory there is refused by the open itself)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.mkfifo(run / "apply.lock", 0o600)
    with pytest.raises(RunDirError, match=r"apply\.lock is not a regular file"), \
            apply_lock(run):
        pytest.fail("locked a FIFO")
    assert stat.S_ISFIFO(os.lstat(run / "apply.lock").st_mode)


def test_run_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    needs_root()
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(RunDirError) as err, apply_lock(run):
        pytest.fail("locked in a directory another user owns")
    assert f"the run directory {run} is owned by nobody (uid {NOBODY})" in err.value.message
    assert not (run / "apply.lock").exists()
    assert mode(run) == 0o777, "kvagent does not touch a directory that is not its own"


def test_lock_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    needs_root()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "apply.lock").write_text("")
    os.chown(run / "apply.lock", NOBODY, NOBODY)
    with pytest.raises(RunDirError, match=r"apply\.lock is owned by nobody"), apply_lock(run):
        pytest.fail("locked a file another user owns")


def test_cli_names_the_run_dir_it_refuses(tmp_path: Path) -> None:
    needs_root()
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chown(run, NOBODY, NOBODY)
    cfg = tmp_path / "kvagent.yaml"
    cfg.write_text(f"version: 1\nnode: {{name: n1, state_dir: {tmp_path}/state, "
                   f"run_dir: {run}}}\n")
    result = CliRunner().invoke(main, ["-c", str(cfg), "apply"])
    assert result.exit_code == 1
    assert f"kvagent: error: the run directory {run} is owned by nobody" in result.output
    assert "Traceback" not in result.output


def test_holder_is_named_from_proc_locks_not_from_the_file(tmp_path: Path) -> None:
    """The file says 4242 (an old holder's pid); the kernel says who holds the lock."""
    run = tmp_path / "run"
    lock = old_layout(run)
    with holding(lock) as proc:
        holder = lock_holder(lock)
        assert holder is not None and holder.pid == proc.pid != 4242
        assert holder.uid == os.geteuid() and not holder.foreign
        with pytest.raises(Busy) as busy, apply_lock(run):
            pytest.fail("two holders")
    assert busy.value.holder is not None and busy.value.holder.pid == proc.pid
    assert busy.value.message.startswith(f"another kvagent apply is running (pid {proc.pid}, ")
    assert "flock -x" in busy.value.message
    assert lock_holder(lock) is None, "released when the holder exits"
    with apply_lock(run):
        pass


def test_lock_held_by_nobody_is_named_and_foreign_until_it_exits() -> None:
    """The situation main allowed: nobody opened the old 0644 lock read-only and flocked it.

    kvagent tightens the permissions at once (nobody cannot open it again), reports
    Busy naming pid and user nobody, and gets the lock once that process exits.
    """
    needs_root()
    with world_readable_dir() as root:
        run = root / "run"
        lock = old_layout(run)
        with holding(lock, user=NOBODY) as proc:
            with pytest.raises(Busy) as busy, apply_lock(run):
                pytest.fail("nobody's lock was ignored")
            holder = busy.value.holder
            assert holder is not None
            assert (holder.pid, holder.uid, holder.user, holder.foreign) == (
                proc.pid, NOBODY, "nobody", True)
            assert (f"held by a process of another user (pid {proc.pid}, user nobody"
                    in busy.value.message)
            assert f"kill {proc.pid}" in (busy.value.hint or "")
            assert mode(run) == 0o700 and mode(lock) == 0o600, "tightened while held"
            # A new open by nobody now fails: the lock cannot be taken again.
            again = os.system(f"runuser -u nobody -- flock -n -x {lock} true 2>/dev/null")
            assert again != 0
        with apply_lock(run):
            assert lock_holder(lock) is not None  # us


def test_wait_reports_the_holder_once(tmp_path: Path) -> None:
    seen: list[object] = []
    release = threading.Event()
    held = threading.Event()

    def first() -> None:
        with apply_lock(tmp_path / "run"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert held.wait(10)

    def on_wait(holder: object) -> None:  # the holder lets go once it has been reported
        seen.append(holder)
        release.set()

    with apply_lock(tmp_path / "run", wait=True, timeout=30, on_wait=on_wait):
        pass
    t.join(30)
    assert not t.is_alive(), "the lock holder's thread did not end"
    assert seen and all(h is not None and h.pid == os.getpid() for h in seen)


def test_holder_is_the_process_that_kept_the_lock_when_its_taker_exited(
        tmp_path: Path) -> None:
    """``flock FILE cmd &`` style: the locker exits, a child keeps the descriptor and lock.

    /proc/locks still names the exited locker; the holder is found by its fdinfo.
    """
    run = tmp_path / "run"
    with apply_lock(run):
        pass
    lock = run / "apply.lock"
    script = ("import fcntl, os, subprocess\n"
              f"fd = os.open({str(lock)!r}, os.O_RDONLY)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "child = subprocess.Popen(['sleep', '60'], pass_fds=[fd], stdin=subprocess.DEVNULL,\n"
              "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print(child.pid, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60)
    child = int(out.stdout)
    try:
        holder = lock_holder(lock)
        assert holder is not None and holder.pid == child
        assert holder.command == "sleep 60"
        with pytest.raises(Busy, match=f"pid {child}, "), apply_lock(run):
            pytest.fail("two holders")
    finally:
        os.kill(child, signal.SIGKILL)
