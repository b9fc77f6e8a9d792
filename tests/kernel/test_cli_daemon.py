"""The CLI beside a running agent on a real kernel: apply reloads it; a foreign lock holder.

1. ``kvagent apply`` after a config edit while ``kvagent run`` runs: the agent
   reloads and keeps the new config (before: it re-applied its old config at its
   next pass and undid the edit).
2. The apply lock held by user ``nobody`` through the 0644 lock file an older
   kvagent left in a 0755 run directory: the agent's passes are skipped, and
   ``kvagent status`` / ``/readyz`` say so, naming the holder; the permissions are
   tightened; once the holder exits the next pass converges.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.naming import subsystem_nqn

from . import kit
from .pools import KVAGENT, Lab, assert_ok, mount_tmpfs, umount_all_under
from .test_daemon import free_port, get

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
NQN = subsystem_nqn("nqn.2026-11.io.kvagent", "lab", "kv", "lab")


def config(lab: Lab, port: int, run_dir: Path, *, count: int) -> str:
    return f"""
version: 1
node: {{name: lab, state_dir: {lab.state}, run_dir: {run_dir}}}
target:
  ports: [{{name: lo, id: 31, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: {count}, size: 64MiB}}
      ports: [lo]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
health: {{listen: "127.0.0.1:{port}", interval: 2s, full_interval: 2s}}
"""


def metric(port: int, name: str) -> float | None:
    for line in get(f"http://127.0.0.1:{port}/metrics")[1].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def enabled_namespaces() -> list[int]:
    base = kit.NVMET / "subsystems" / NQN / "namespaces"
    return sorted(int(p.name) for p in base.iterdir() if kit.read(p / "enable") == "1") \
        if base.is_dir() else []


def wait_until(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    return kit.wait_for(predicate, timeout, interval=0.3, what=what)


def cli(lab: Lab, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter start-up: the VM is slow); the agent is not."""
    result = CliRunner().invoke(main, ["-c", str(lab.config), *args])
    return result.exit_code, result.stdout, result.stderr


@contextmanager
def agent(lab: Lab) -> Iterator[subprocess.Popen[bytes]]:
    log = open(lab.root / "agent.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([*KVAGENT, "-c", str(lab.config), "run"], stdout=log,
                            stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        print((lab.root / "agent.log").read_text()[-4000:])


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "400m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def test_apply_while_the_agent_runs_keeps_the_new_config(lab: Lab) -> None:
    port = free_port()
    run_dir = lab.root / "run"
    lab.write(config(lab, port, run_dir, count=1))
    with agent(lab) as proc:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 240,
                   "the agent to export the pool")
        assert enabled_namespaces() == [1]

        lab.write(config(lab, port, run_dir, count=2))  # the operator's edit
        code, out, err = cli(lab, "-o", "json", "apply")
        assert code == 0, err
        result = json.loads(out)
        assert result["ok"] and result["changed"], result
        assert enabled_namespaces() == [1, 2]

        # Two more of the agent's passes (2 s interval): the new namespace stays.
        runs = metric(port, "kvagent_apply_runs_total") or 0
        wait_until(lambda: (metric(port, "kvagent_apply_runs_total") or 0) >= runs + 2, 60,
                   "two more passes of the agent")
        assert enabled_namespaces() == [1, 2], "the agent undid the apply"
        # It was the agent that applied: apply asked it to reload; it expects 2 now.
        assert f"the agent (pid {proc.pid}) runs with {lab.config}" in err
        assert metric(port, "kvagent_config_reloads_total") == 1
        assert metric(port, "kvagent_target_namespaces_expected") == 2
        assert metric(port, "kvagent_target_namespaces_enabled") == 2
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        assert proc.poll() is None


def nobody_holds(lock: Path) -> subprocess.Popen[str]:
    """User nobody opens the (world-readable) lock file read-only and flocks it."""
    proc = subprocess.Popen([shutil.which("flock") or "flock", "-x", str(lock), "sh", "-c",
                             "echo locked; read x"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, user=NOBODY, group=NOBODY,
                            extra_groups=[])
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    """The holder exits (its stdin closes), and with it the lock."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_lock_held_by_nobody_is_reported_then_cleared(lab: Lab) -> None:
    port = free_port()
    shared = Path(tempfile.mkdtemp(prefix="kvagent-run-"))  # nobody must reach the lock
    shared.chmod(0o755)
    run_dir = shared / "run"
    try:
        lab.write(config(lab, port, run_dir, count=1))
        assert_ok(lab.apply())  # exported; the agent will find nothing to change
        # What an older kvagent left (and main still makes): 0755 dir, 0644 lock file.
        run_dir.chmod(0o755)
        (run_dir / "apply.lock").chmod(0o644)
        holder = nobody_holds(run_dir / "apply.lock")
        try:
            with agent(lab) as proc:
                wait_until(lambda: (metric(port, "kvagent_apply_busy_total") or 0) >= 1, 120,
                           "a pass skipped because nobody holds the lock")
                assert mode(run_dir) == 0o700 and mode(run_dir / "apply.lock") == 0o600
                again = subprocess.run(["flock", "-n", "-x", str(run_dir / "apply.lock"),
                                        "true"], user=NOBODY, group=NOBODY, extra_groups=[],
                                       capture_output=True, check=False)
                assert again.returncode != 0 and b"Permission denied" in again.stderr, \
                    "nobody can no longer open the lock"

                code, body = get(f"http://127.0.0.1:{port}/readyz")
                assert code == 503 and f"held by pid {holder.pid}, user nobody" in body, body
                code, out, _ = cli(lab, "-o", "json", "status", "--no-drives")
                status = json.loads(out)
                assert code == 1 and status["state"] == "degraded", status
                assert status["apply_busy"]["holder"]["pid"] == holder.pid
                assert status["apply_busy"]["holder"]["user"] == "nobody"
                assert status["apply_busy"]["passes"] >= 1
                assert any(f"pid {holder.pid}, user nobody" in p for p in status["problems"])
                assert status["pools"][0]["state"] == "ok"  # the export itself is fine
                # The operator's apply goes to the agent, whose pass is refused as busy.
                code, _, err = cli(lab, "apply")
                assert code == 1 and f"(pid {holder.pid}, user nobody" in err, err

                release(holder)  # nobody's process exits: the agent's next pass runs
                wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60,
                           "/readyz to recover")
                assert metric(port, "kvagent_apply_busy_passes") == 0
                assert (metric(port, "kvagent_apply_busy_total") or 0) >= 1
                code, out, _ = cli(lab, "-o", "json", "status", "--no-drives")
                status = json.loads(out)
                assert code == 0 and status["state"] == "ok", status["problems"]
                assert status["apply_busy"] is None
                assert status["last_apply"]["ok"] and status["last_apply"]["changed"] == 0
                assert proc.poll() is None
        finally:
            release(holder)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
