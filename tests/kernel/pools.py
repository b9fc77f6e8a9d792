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
from agent.system.run import Runner, default_runner

from . import kit

KVAGENT = [sys.executable, "-m", "agent"]


class RecordingRunner:
    """kvagent's real runner, recording every command it runs."""

    def __init__(self) -> None:
        self.inner = default_runner()
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(argv))
        return self.inner(argv, **kwargs)


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

    def write_empty(self, nqn_prefix: str) -> Path:
        """A config with no ports and no pools on either side: the next apply detaches
        and unexports everything this lab made."""
        return self.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {nqn_prefix}, state_dir: {self.state}, run_dir: {self.root}/run}}
target: {{ports: [], pools: []}}
initiator: {{pools: []}}
""")

    def apply(self, dry_run: bool = False, runner: Runner | None = None) -> RunResult:
        """One in-process pass (no Python start-up: the VM is slow)."""
        return run_pass(load_config(self.config), dry_run=dry_run, runner=runner)

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
    """Write ``size`` random bytes to ``path`` (fsync) and return their digest."""
    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return kit.digest(data)


# ------------------------------------------------------------ storage-host helpers

#: The VM's emulated NVMe drives (2 GiB each; data lives for one boot).
DRIVES = ("/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVTEST0",
          "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVTEST1")
MIB = 1 << 20


def timed_apply(lab: Lab, dry_run: bool = False) -> tuple[RunResult, float]:
    """One in-process pass and its wall time in seconds."""
    started = time.monotonic()
    result = lab.apply(dry_run=dry_run)
    return result, time.monotonic() - started


def assert_converged(result: RunResult) -> None:
    """A pass that found nothing to do: ok, unchanged, not one configfs write."""
    assert_ok(result)
    done = [a for a in result.actions if a.status == "done"]
    assert not result.changed and result.configfs_writes == 0, done


def discovered(transport: str, address: str, hostnqn: str | None = None,
               hostid: str | None = None) -> set[str]:
    """NVM subsystem NQNs the discovery log at ``address:4420`` shows this host identity."""
    import json

    ident = ["--hostnqn", hostnqn, "--hostid", hostid] if hostnqn and hostid else []
    out = kit.sh("nvme", "discover", "-t", transport, "-a", address, "-s", "4420", *ident,
                 "-o", "json").stdout
    records = json.loads(out).get("records", []) if out.strip() else []
    return {r["subnqn"] for r in records if r.get("subtype") == "nvme subsystem"}


def nvme_connect(transport: str, address: str, nqn: str, hostnqn: str | None = None,
                 hostid: str | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    """Raw ``nvme connect`` (this host's identity unless ``hostnqn``/``hostid`` are given)."""
    ident = ["--hostnqn", hostnqn, "--hostid", hostid] if hostnqn and hostid else []
    proc = kit.sh("nvme", "connect", "-t", transport, "-a", address, "-s", "4420", "-n", nqn,
                  *ident, check=check)
    if check:
        kit.wait_for(lambda: any(kit.read(c / "state") == "live"
                                 for c in kit.controllers_for(nqn)), 30,
                     what=f"a live controller for {nqn}")
    return proc


def nvme_disconnect(*nqns: str) -> None:
    for nqn in nqns:
        kit.sh("nvme", "disconnect", "-n", nqn, check=False)
    kit.wait_for(lambda: not any(kit.controllers_for(n) for n in nqns), 30,
                 what="controllers to go away")


def namespace_device(nqn: str, nsid: int, timeout: float = 30) -> str:
    """The host block device of namespace ``nsid`` of ``nqn``, found by the uuid the target
    gave it (read from nvmet: the storage's identity)."""
    uuid = kit.exported_uuid(nqn, nsid)
    dev = kit.wait_for(lambda: kit.block_by_uuid(uuid), timeout,
                       what=f"namespace {nsid} of {nqn} (uuid {uuid})")
    name = os.path.basename(dev)
    assert kit.read(f"/sys/block/{name}/nsid") == str(nsid), f"{dev} is not nsid {nsid}"
    return dev


def block_size_bytes(dev: str) -> int:
    return int(kit.read(f"/sys/block/{os.path.basename(dev)}/size")) * 512


def digest_buffered(path: str, offset: int, size: int) -> str:
    """Digest of ``size`` bytes at ``offset`` through the page cache (tmpfs has no O_DIRECT)."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    assert len(data) == size
    return kit.digest(data)


def device_digest(dev: str, *ranges: tuple[int, int]) -> str:
    """Digest over byte ranges ``(offset, size)`` of a block device (the whole device if none),
    read with O_DIRECT in 4 MiB chunks; a negative offset counts from the end."""
    import mmap

    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        total = os.lseek(fd, 0, os.SEEK_END)
        spans = [(o if o >= 0 else total + o, s) for o, s in ranges] or [(0, total)]
        h = kit.new_digest()
        buf = mmap.mmap(-1, 4 * MIB)
        for offset, size in spans:
            done = 0
            while done < size:
                n = os.preadv(fd, [buf], offset + done)
                assert n > 0, f"short read of {dev} at {offset + done}"
                n = min(n, size - done)
                h.update(buf[:n])
                done += n
        return h.hexdigest()
    finally:
        os.close(fd)


def drive_digest(dev: str) -> str:
    """Digest of where signatures, labels and partition tables live on an emulated drive
    (primary superblocks, LVM label and metadata area, MBR/GPT and the GPT backup at the
    end): its first 16 MiB and last 4 MiB (all of 2 GiB is too slow to read under TCG)."""
    return device_digest(dev, (0, 16 * MIB), (-4 * MIB, 4 * MIB))


def remove_volume_group(vg: str, *devices: str) -> None:
    """Remove a test's volume group and the LVM labels on its devices (VM only)."""
    kit.sh("vgremove", "-ff", "-y", vg, check=False, timeout=120)
    for dev in devices:
        kit.sh("pvremove", "-ff", "-y", dev, check=False, timeout=120)


def zero(dev: str, length: int) -> None:
    """Zero the first ``length`` bytes of ``dev`` (a test's own writes on an emulated drive)."""
    kit.sh("blkdiscard", "-z", "-o", "0", "-l", str(length), dev, timeout=300)
