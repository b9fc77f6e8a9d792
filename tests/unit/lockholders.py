"""Helpers for tests of the apply lock: holders in other processes, as root or as nobody."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOBODY = 65534


def needs_root() -> None:
    """Tests that run a holder as another user need root (the unit tier runs as root)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")


@contextmanager
def world_readable_dir() -> Iterator[Path]:
    """A 0755 scratch directory that user nobody can reach (pytest's are 0700), in the
    tests' temporary root (tests/conftest.py: as root, not below /tmp, where a root
    kvagent refuses a config)."""
    path = Path(tempfile.mkdtemp(prefix="kvagent-lock-",
                                 dir=os.environ.get("PYTEST_DEBUG_TEMPROOT")))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def holding(lock: Path, *, user: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """Hold an exclusive flock on ``lock`` in another process (``flock(1)``), as ``user``.

    flock(1) opens an existing file read-only: a read-only open is all a flock needs,
    which is how any user could take a world-readable lock file.
    """
    flock = shutil.which("flock")
    assert flock, "flock(1) (util-linux) is not installed"
    ids = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    proc = subprocess.Popen([flock, "-x", str(lock), "sh", "-c", "echo locked; read x"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **ids)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "locked", (line, proc.stderr.read() if proc.stderr else "")
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def old_layout(run_dir: Path) -> Path:
    """The layout kvagent made before the lock was private: a 0755 dir, a 0644 lock file."""
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    run_dir.chmod(0o755)
    lock = run_dir / "apply.lock"
    lock.write_text("4242\n")  # a pid an old holder wrote: never to be trusted
    lock.chmod(0o644)
    return lock


def wait_for(predicate, timeout: float = 30.0, what: str = "a condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
