"""Port addresses on the real kernel: one that appears while apply waits comes up without a
rerun; one that never appears fails alone with a clear error; a second apply meanwhile is busy.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from agent.lock import Busy
from agent.naming import subsystem_nqn
from agent.result import RunResult

from . import kit
from .pools import Lab, discovered, mount_tmpfs, umount_all_under

pytestmark = pytest.mark.kernel

LATE, NEVER = "10.98.0.1", "10.97.0.1"


def config(lab: Lab) -> str:
    def pool(name: str, port: str) -> str:
        return f"""
    - name: {name}
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 4MiB}}
      ports: [{port}]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]"""

    return f"""
version: 1
node: {{name: lab, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  address_wait: 10s
  ports:
    - {{name: lo, id: 31, transport: tcp, address: 127.0.0.1, service: 4420}}
    - {{name: late, id: 32, transport: tcp, address: {LATE}, service: 4420}}
    - {{name: never, id: 33, transport: tcp, address: {NEVER}, service: 4420}}
  pools:{pool("early", "lo")}{pool("later", "late")}{pool("nope", "never")}
"""


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "64m")
    try:
        yield lab
    finally:
        kit.sh("ip", "link", "del", "kvdummy0", check=False)
        kit.force_clean()
        umount_all_under(tmp_path)


def test_late_address_comes_up_and_missing_one_fails_alone(lab: Lab) -> None:
    lab.write(config(lab))
    out: dict[str, RunResult | BaseException] = {}

    def apply() -> None:
        try:
            out["result"] = lab.apply()
        except BaseException as exc:
            out["result"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=apply)
    worker.start()
    # The first link attempt follows the port's creation at once (and fails: no address).
    kit.wait_for(lambda: (kit.NVMET / "ports/32/addr_traddr").exists()
                 and kit.read(kit.NVMET / "ports/32/addr_traddr") == LATE, 60,
                 what="apply to create port 32")

    # One apply at a time: a second one now is refused as busy, naming the lock.
    with pytest.raises(Busy, match="another kvagent apply is running"):
        lab.apply()

    time.sleep(max(0.0, 5 - (time.monotonic() - started)))
    assert worker.is_alive(), f"apply ended before the address appeared: {out}"
    assert not os.listdir(kit.NVMET / "ports/32/subsystems")
    kit.sh("ip", "link", "add", "kvdummy0", "type", "dummy")
    kit.sh("ip", "addr", "add", f"{LATE}/24", "dev", "kvdummy0")
    kit.sh("ip", "link", "set", "kvdummy0", "up")
    worker.join(120)
    assert not worker.is_alive()
    result = out["result"]
    assert isinstance(result, RunResult), result

    early, later, nope = (subsystem_nqn("nqn.2026-11.io.kvagent", "lab", p, "lab")
                          for p in ("early", "later", "nope"))
    assert os.listdir(kit.NVMET / "ports/31/subsystems") == [early]
    assert os.listdir(kit.NVMET / "ports/32/subsystems") == [later], "came up without a rerun"
    assert os.listdir(kit.NVMET / "ports/33/subsystems") == []
    assert discovered("tcp", LATE) == {later}
    assert discovered("tcp", "127.0.0.1") == {early}

    (error,) = result.errors
    assert error.pool == "nope"
    assert error.message.startswith(
        f"port never (nvmet port 33, tcp {NEVER}:4420): the address is not configured on "
        "this host; gave up after"), error.message
    assert "(target.address_wait: 10s)" in error.message
    assert f"subsystem {nope} is not exported on it" in error.message
    assert f"ip addr add {NEVER}/" in (error.hint or "")
    failed = [a for a in result.actions if a.status == "failed"]
    assert [(a.pool, a.subject) for a in failed] == [("nope", f"ports/33/subsystems/{nope}")]
    # The failed pool's namespace is ready; the next pass only has to link it.
    assert kit.read(kit.NVMET / "subsystems" / nope / "namespaces/1/enable") == "1"
