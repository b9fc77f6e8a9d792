"""Helpers for real-kernel tests of kvagent's plan/apply (storage and GPU roles on one VM)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from agent.config import load_config
from agent.reconcile import run_pass
from agent.result import RunResult

from . import kit

KVAGENT = [sys.executable, "-m", "agent"]


class Lab:
    """A working directory with a config file, state dir and mount roots for one test."""

    def __init__(self, root: Path):
        self.root = root
        self.config = root / "kvagent.yaml"
        self.state = root / "state"
        self.hostnqn = kit.local_hostnqn()

    def write(self, text: str) -> Path:
        self.config.write_text(text)
        return self.config

    def apply(self, dry_run: bool = False) -> RunResult:
        """One in-process pass (no Python start-up: the VM is slow)."""
        return run_pass(load_config(self.config), dry_run=dry_run)

    def cli(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*KVAGENT, "-c", str(self.config), *args], capture_output=True,
                              text=True, timeout=600, check=False,
                              cwd=Path(__file__).resolve().parents[2])
        if check and proc.returncode != 0:
            raise AssertionError(f"kvagent {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc


def assert_ok(result: RunResult) -> None:
    failed = [a for a in result.actions if a.status == "failed"]
    assert result.ok, f"errors: {result.errors}\nfailed: {failed}"


class StateWatcher:
    """Polls controller states in a thread; records every state seen per controller."""

    def __init__(self, names: list[str], interval: float = 0.05):
        self.names = names
        self.interval = interval
        self.seen: dict[str, set[str]] = {n: set() for n in names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for n in self.names:
                try:
                    self.seen[n].add(kit.read(f"/sys/class/nvme/{n}/state"))
                except OSError:
                    self.seen[n].add("(gone)")
            time.sleep(self.interval)

    def __enter__(self) -> StateWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    kit.sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))


def umount_all_under(root: Path) -> None:
    """Unmount everything mounted below ``root`` (deepest first)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mp in sorted((m for m in mounts if m.startswith(str(root) + "/")), key=len,
                     reverse=True):
        kit.sh("umount", mp, check=False)


def fabrics_controllers() -> list[str]:
    out = []
    for c in Path("/sys/class/nvme").glob("nvme*"):
        try:
            if kit.read(c / "transport") in ("tcp", "rdma"):
                out.append(c.name)
        except OSError:
            continue
    return sorted(out)


def write_file(path: Path, size: int) -> str:
    """Write ``size`` random bytes to ``path`` (fsync) and return their sha256."""
    import hashlib

    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()
