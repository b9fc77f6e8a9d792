"""The GPU host as a cache tier on the real 6.1 kernel: fail fast, recover by itself, grow.

- A storage outage under fio and under our own O_DIRECT reads and fsynced writes, on a
  pool with two paths (two target ports, native multipath): the first port going away
  costs nothing (0 errors for longer than ``fast_io_fail_tmo``: I/O moves to the other
  path); once the second goes, the first I/O error comes within ``fast_io_fail_tmo`` +
  2 s (the default 5 s, written to each controller's sysfs attribute: nvme-cli 2.3 has
  no option for it), not later and not at once: the head fails I/O only when the timer
  has expired on every path. The xfs shuts down (its log could not be written);
  ``kvagent status`` and the metrics show it; once the ports are back, an apply pass
  (which relinks them) refuses to unmount while a process holds the mount, naming it,
  and the next mounts it again (log recovery): the data fsynced before the outage
  verifies.
- Two storage hosts (two configs with their own node names, state and target ports)
  serve one pool; one lists this host under another name (attached by its NQN, with a
  warning). One adds a namespace: the GPU host mounts it at ``store0-ns2`` and leaves
  the other mounts alone. The other grows its namespace: xfs_growfs runs and the free
  space grows; the next pass runs nothing but discovery and writes no sysfs attribute.

File pools sit on a tmpfs (buffered_io); the grown pool is LVM on an emulated drive.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli.main import main
from agent.config import load_config
from agent.health.collect import collect
from agent.health.metrics import render_metrics
from agent.initiator.sysfs import Sysfs
from agent.naming import subsystem_nqn
from agent.records import InitiatorRecords

from . import kit
from .pools import (
    DRIVES,
    Lab,
    RecordingRunner,
    assert_ok,
    mount_tmpfs,
    remove_volume_group,
    umount_all_under,
    write_file,
)
from .test_attach_pools import write_sectors

pytestmark = pytest.mark.kernel(group="cache", weight=1)
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20
FAST_IO_FAIL_TMO = 5  # the default (agent.config.model.FAST_IO_FAIL_TMO)
VG = "kvcfvg"


@pytest.fixture
def root(tmp_path: Path):
    mount_tmpfs(tmp_path / "files", "700m")
    yield tmp_path
    umount_all_under(tmp_path)
    kit.force_clean()


@pytest.fixture
def sysfs_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every controller attribute kvagent writes in this process."""
    writes: list[tuple[str, str, str]] = []
    real = Sysfs.set_controller_attr

    def recording(self: Sysfs, name: str, attr: str, value: str) -> None:
        writes.append((name, attr, value))
        real(self, name, attr, value)

    monkeypatch.setattr(Sysfs, "set_controller_attr", recording)
    return writes


def done(result) -> list[str]:
    return [a.kind for a in result.actions if a.status == "done"]


def status_json(lab: Lab) -> tuple[int, dict]:
    """``kvagent status -o json``, in-process (a Python start costs tens of seconds here)."""
    out = CliRunner().invoke(main, ["-c", str(lab.config), "-o", "json", "status"])
    return out.exit_code, json.loads(out.stdout)


def mount_ids(mounts: list[Path]) -> dict[str, str]:
    """Mount ID and device of each mount point (a remount gets a new ID)."""
    wanted = {str(m) for m in mounts}
    out = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] in wanted:
            out[fields[4]] = f"{fields[0]} {fields[2]}"
    return out


class FirstError:
    """Runs I/O in a thread until the first error; remembers when and which errno."""

    def __init__(self, name: str, step) -> None:  # type: ignore[no-untyped-def]
        self.name, self.step = name, step
        self.at: float | None = None
        self.errno: int | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except OSError as exc:
                self.at, self.errno = time.monotonic(), exc.errno
                return
            time.sleep(0.05)


# ---------------------------------------------------------------------- fail fast

def outage_config(lab: Lab, nqn: str, target: bool = True, initiator: bool = True) -> None:
    text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
"""
    if target:
        text += f"""
target:
  ports: [{{name: p, id: 41, transport: tcp, address: 127.0.0.1, service: 4420}},
          {{name: q, id: 44, transport: tcp, address: 127.0.0.1, service: 4421}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 300MiB}}
      ports: [p, q]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""
    if initiator:  # connect options left at their defaults: fast_io_fail_tmo 5 s
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - name: kv
      targets: [{{transport: tcp, address: 127.0.0.1, service: 4420, subsystem: "{nqn}"}},
                {{transport: tcp, address: 127.0.0.1, service: 4421, subsystem: "{nqn}"}}]
      mount: {lab.root}/mnt/kv
"""
    lab.write(text)


def test_outage_fails_fast_and_the_agent_recovers_the_shut_down_xfs(
        root: Path, sysfs_writes: list) -> None:
    lab = Lab(root)
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    outage_config(lab, nqn)
    mount = root / "mnt/kv/lab-ns1"
    lap = kit.Laps()
    first = lab.apply()
    lap("first apply")
    assert_ok(first)
    assert os.path.ismount(mount), "mounted at <mount>/<storage node>-ns<nsid>"
    ctrls = sorted(kit.controllers_for(nqn), key=lambda c: kit.read(c / "address"))
    assert len(ctrls) == 2 and "trsvcid=4420" in kit.read(ctrls[0] / "address")
    ctrl, other = ctrls  # the paths through ports p (4420) and q (4421)
    attrs = ("fast_io_fail_tmo", "ctrl_loss_tmo", "reconnect_delay")
    assert [[kit.read(c / a) for a in attrs] for c in ctrls] == [["5", "off", "2"]] * 2
    assert sorted(sysfs_writes) == sorted((c.name, "fast_io_fail_tmo", "5") for c in ctrls)
    assert "nvme.timeout" in done(first)

    # Drift (an operator, another tool): put back; the pass runs no command for it.
    kit.write(ctrl / "fast_io_fail_tmo", "-1")
    assert kit.read(ctrl / "fast_io_fail_tmo") == "off"
    runner = RecordingRunner()
    fixed = lab.apply(runner=runner)
    assert_ok(fixed)
    assert done(fixed) == ["nvme.timeout"], fixed.actions
    assert kit.read(ctrl / "fast_io_fail_tmo") == "5" and runner.calls == []
    writes = len(sysfs_writes)
    runner = RecordingRunner()
    converged = lab.apply(runner=runner)
    lap("drift fixed, converged pass")
    assert_ok(converged)
    assert not converged.changed and runner.calls == [] and sysfs_writes[writes:] == []

    digest = write_file(mount / "keep.bin", 8 * MIB)
    write_file(mount / "read.bin", 8 * MIB)
    holder = subprocess.Popen(["sleep", "600"], cwd=mount)  # an engine with its cwd there
    fio = subprocess.Popen(
        ["fio", "--name=outage", f"--filename={mount}/fio.dat", "--size=32m", "--bs=64k",
         "--rw=randrw", "--ioengine=psync", "--direct=1", "--time_based", "--runtime=300",
         "--output-format=json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    buf = mmap.mmap(-1, MIB)
    rfd = os.open(mount / "read.bin", os.O_RDONLY | os.O_DIRECT)
    offset = [0]

    def read_step() -> None:
        os.preadv(rfd, [buf], offset[0])
        offset[0] = (offset[0] + MIB) % (8 * MIB)

    counter = [0]

    def write_step() -> None:  # a new file, fsynced: data and log writes
        counter[0] += 1
        with open(mount / f"w{counter[0] % 50}", "wb") as f:
            f.write(b"k" * 4096)
            os.fsync(f.fileno())

    reader, writer = FirstError("O_DIRECT read", read_step), FirstError("fsync", write_step)
    link, link2 = (kit.NVMET / f"ports/{p}/subsystems" / nqn for p in (41, 44))
    fio_exit: float | None = None
    try:
        dev = kit.block_by_uuid(kit.exported_uuid(nqn, 1))
        assert dev
        start = write_sectors(dev)
        kit.wait_for(lambda: write_sectors(dev) - start >= 4 * MIB // 512, 120, interval=0.1,
                     what="fio to be writing")
        reader.thread.start()
        writer.thread.start()
        time.sleep(0.5)
        assert fio.poll() is None and reader.at is None and writer.at is None
        # One path goes: I/O moves to the other, nothing fails, well past the timeout.
        link.unlink()
        kit.wait_for(lambda: kit.read(ctrl / "state") != "live", 30, interval=0.05,
                     what="the first path to go down")
        moved = write_sectors(dev)
        time.sleep(FAST_IO_FAIL_TMO + 3)
        assert fio.poll() is None and reader.at is None and writer.at is None, \
            "I/O failed while another path was live"
        assert kit.read(other / "state") == "live" and write_sectors(dev) > moved
        assert kit.read(ctrl / "state") in ("connecting", "resetting")
        lap(f"one path down for {FAST_IO_FAIL_TMO + 3}s: 0 errors")
        outage = time.monotonic()  # the last path goes
        link2.unlink()
        while time.monotonic() - outage < 60:
            if fio_exit is None and fio.poll() is not None:
                fio_exit = time.monotonic()
            if fio_exit is not None and reader.at is not None and writer.at is not None:
                break
            time.sleep(0.05)
        lap("outage until every I/O failed")
    finally:
        for t in (reader, writer):
            t.stop.set()
            if t.thread.is_alive():
                t.thread.join(timeout=60)
        os.close(rfd)
        if fio.poll() is None:
            fio.kill()
        out, _ = fio.communicate(timeout=120)
    assert reader.errno == errno.EIO and writer.errno == errno.EIO, (reader.errno,
                                                                    writer.errno)
    assert fio.returncode != 0 and fio_exit is not None, "fio went on through the outage"
    (job,) = json.loads(out[out.index("{"):])["jobs"]
    assert job["error"] == errno.EIO, job["error"]
    figures = {"O_DIRECT read": reader.at - outage, "fsync write": writer.at - outage,
               "fio exit": fio_exit - outage}
    first_error = min(figures["O_DIRECT read"], figures["fsync write"])
    print(f"[figure] fast_io_fail_tmo {FAST_IO_FAIL_TMO}s: first I/O error "
          f"{first_error:.2f}s after the outage; " +
          ", ".join(f"{k} {v:.2f}s" for k, v in figures.items()))
    # Not at once (I/O waited for the path), and not later than the timeout allows.
    assert FAST_IO_FAIL_TMO - 1 <= first_error <= FAST_IO_FAIL_TMO + 2, figures
    assert figures["fio exit"] <= FAST_IO_FAIL_TMO + 4, figures
    assert all(kit.read(c / "state") in ("connecting", "resetting") for c in ctrls)

    # The xfs has shut down: its log could not be written (the writes above forced it;
    # a directory fsync makes sure of it).
    try:
        os.mkdir(mount / "after-outage")
        dfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
    with pytest.raises(OSError) as shut:
        os.stat(mount)
    assert shut.value.errno == errno.EIO
    assert "Filesystem has been shut down" in kit.sh("dmesg").stdout

    code, doc = status_json(lab)
    (pool,) = [p for p in doc["pools"] if p["role"] == "initiator"]
    assert code == 1 and pool["state"] in ("degraded", "failed"), pool
    assert pool["initiator"]["mount"]["shut_down"] == [str(mount)]
    assert any("filesystem shut down" in p for p in pool["problems"]), pool["problems"]
    assert all(any(f"controller {c.name}" in p for p in pool["problems"]) for c in ctrls), \
        pool["problems"]
    metrics = render_metrics(collect(load_config(lab.config), RecordingRunner(),
                                     drives=False)).decode()
    assert 'kvagent_initiator_mounts_shut_down{pool="kv"} 1.0' in metrics
    assert 'kvagent_initiator_fs_recoveries_total{pool="kv"} 0.0' in metrics
    lap("status during the outage")

    # The storage comes back (the apply relinks the port); a process holds the mount:
    # reported by name, never lazily unmounted.
    try:
        held = lab.apply()
        lap("apply with the port back, mount held")
        assert link.is_symlink() and link2.is_symlink()
        assert any(kit.read(c / "state") == "live" for c in ctrls)
        [error] = [e for e in held.errors if e.role == "initiator"]
        assert f"the xfs on {mount} shut down" in error.message
        assert f"sleep (pid {holder.pid}, cwd)" in error.message, error.message
        assert mount_ids([mount]), "still mounted (os.path.ismount cannot tell: EIO)"
        with pytest.raises(OSError):
            os.stat(mount)
    finally:
        holder.kill()
        holder.wait()

    recovered = lab.apply()
    lap("apply: recovery")
    assert_ok(recovered)
    [act] = [a for a in recovered.actions if a.kind == "xfs.recover"]
    assert act.subject == str(mount) and act.status == "done"
    assert os.path.ismount(mount) and os.path.isdir(mount)
    assert kit.digest_of(str(mount / "keep.bin")) == digest, "data fsynced before the outage"
    [rec] = InitiatorRecords.load(lab.state)["kv"].recoveries
    assert (rec.mount, rec.count) == (str(mount), 1)
    # The recovery needs one live path; status is ok once both have reconnected (each
    # retries every reconnect_delay: under TCG the second can come seconds later).
    kit.wait_for(lambda: all(kit.read(c / "state") == "live" for c in ctrls), 60,
                 what="both paths live again")
    code, doc = status_json(lab)
    (pool,) = [p for p in doc["pools"] if p["role"] == "initiator"]
    assert pool["state"] == "ok" and pool["initiator"]["mount"]["shut_down"] == [], \
        pool["problems"]
    assert pool["initiator"]["recoveries"]["count"] == 1
    metrics = render_metrics(collect(load_config(lab.config), RecordingRunner(),
                                     drives=False)).decode()
    assert 'kvagent_initiator_fs_recoveries_total{pool="kv"} 1.0' in metrics
    assert 'kvagent_initiator_mounts_shut_down{pool="kv"} 0.0' in metrics
    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    assert_ok(again)
    assert not again.changed and runner.calls == []
    lap("status after, converged")

    outage_config(lab, nqn, initiator=False)
    assert_ok(lab.apply())
    assert not os.path.ismount(mount) and not kit.controllers_for(nqn)
    outage_config(lab, nqn, target=False, initiator=False)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()


# ------------------------------------------------- two storage hosts, growth, naming

def storage_config(lab: Lab, node: str, port: int, service: int, pool: str | None) -> None:
    """A storage host's config: its port and the pool, or neither (``pool`` None)."""
    ports = (f"[{{name: p, id: {port}, transport: tcp, address: 127.0.0.1, "
             f"service: {service}}}]" if pool else "[]")
    text = f"""
version: 1
node: {{name: {node}, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: {ports}
  pools:{pool or " []"}
"""
    lab.write(text)


def file_pool(lab: Lab, count: int, host: str) -> str:
    return f"""
    - name: kv
      backing: {{kind: file, directory: {lab.root.parent}/files, buffered_io: true}}
      namespaces: {{count: {count}, size: 300MiB}}
      ports: [p]
      hosts: [{{name: {host}, nqn: "{lab.hostnqn}"}}]"""


def lvm_pool(lab: Lab, size: str, host: str) -> str:
    return f"""
    - name: kv
      backing: {{kind: lvm, volume_group: {VG}, devices: [{DRIVES[0]}]}}
      namespaces: {{count: 1, size: {size}}}
      ports: [p]
      hosts: [{{name: {host}, nqn: "{lab.hostnqn}"}}]"""


def gpu_config(lab: Lab, attach: bool = True) -> None:
    text = f"""
version: 1
node: {{name: gpu, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
"""
    if attach:
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - name: kv
      targets: [{{transport: tcp, address: 127.0.0.1, service: 4420}},
                {{transport: tcp, address: 127.0.0.1, service: 4421}}]
      mount: {lab.root}/mnt/kv
      engines: [{{kind: lmcache}}]
"""
    lab.write(text)


def lmcache_size(gpu: Lab) -> float:
    """The disk size kvagent gave LMCache (its max_local_disk_size)."""
    text = (gpu.state / "engines/kv/lmcache/lmcache.yaml").read_text()
    return float(yaml.safe_load(text)["max_local_disk_size"])


def test_two_storage_hosts_one_grows_and_a_host_entry_named_differently(
        root: Path, sysfs_writes: list) -> None:
    labs = {}
    for name in ("store0", "store1", "gpu"):
        (root / name).mkdir()
        labs[name] = Lab(root / name)
    store0, store1, gpu = labs["store0"], labs["store1"], labs["gpu"]
    nqn0 = subsystem_nqn(PREFIX, "store0", "kv", "gpu")
    nqn1 = subsystem_nqn(PREFIX, "store1", "kv", "gpu-old")  # this host, named otherwise
    lap = kit.Laps()
    try:
        storage_config(store0, "store0", 42, 4420, file_pool(store0, 1, "gpu"))
        storage_config(store1, "store1", 43, 4421, lvm_pool(store1, "300MiB", "gpu-old"))
        assert_ok(store0.apply())
        assert_ok(store1.apply())
        lap("two storage hosts export")
        gpu_config(gpu)
        first = gpu.apply()
        lap("GPU attach")
        assert_ok(first)
        m01, m11 = gpu.root / "mnt/kv/store0-ns1", gpu.root / "mnt/kv/store1-ns1"
        assert os.path.ismount(m01) and os.path.ismount(m11)
        assert [w.message.split(" ")[0] for w in first.warnings] == [nqn1], first.warnings
        assert "'gpu-old'" in first.warnings[0].message
        assert len(kit.controllers_for(nqn0)) == len(kit.controllers_for(nqn1)) == 1
        digests = {m: write_file(m / "lmcache/keep.bin", 2 * MIB) for m in (m01, m11)}
        before = mount_ids([m01, m11])

        # store0 adds a namespace: mounted beside the others, nothing else moves.
        storage_config(store0, "store0", 42, 4420, file_pool(store0, 2, "gpu"))
        assert_ok(store0.apply())
        m02 = gpu.root / "mnt/kv/store0-ns2"
        kit.wait_for(lambda: kit.block_by_uuid(kit.exported_uuid(nqn0, 2)), 30,
                     what="the new namespace on the GPU host (the kernel rescans by itself)")
        grown = gpu.apply()
        lap("store0 adds a namespace; GPU pass")
        assert_ok(grown)
        assert [a.subject for a in grown.actions if a.kind == "mount"] == [str(m02)]
        assert os.path.ismount(m02) and mount_ids([m01, m11]) == before
        assert all(kit.digest_of(str(m / "lmcache/keep.bin")) == d for m, d in digests.items())
        assert os.path.isdir(m02 / "lmcache")

        # store1 grows its namespace: the GPU host sees the size, xfs_growfs runs.
        cap_before, free_before = lmcache_size(gpu), os.statvfs(m11)
        storage_config(store1, "store1", 43, 4421, lvm_pool(store1, "400MiB", "gpu-old"))
        assert_ok(store1.apply())
        dev = kit.block_by_uuid(kit.exported_uuid(nqn1, 1))
        assert dev
        size = Path(f"/sys/block/{os.path.basename(dev)}/size")
        kit.wait_for(lambda: int(kit.read(size)) * 512 == 400 * MIB, 30,
                     what="the grown namespace's size on the GPU host")
        runner = RecordingRunner()
        bigger = gpu.apply(runner=runner)
        lap("store1 grows its namespace; GPU pass")
        assert_ok(bigger)
        assert ("xfs_growfs", "-d", str(m11)) in runner.calls, runner.calls
        assert [a.subject for a in bigger.actions if a.kind == "xfs.grow"] == [str(m11)]
        free_after = os.statvfs(m11)
        grew = (free_after.f_bavail - free_before.f_bavail) * free_after.f_frsize
        print(f"[figure] xfs_growfs: free space of {m11.name} grew by {grew / MIB:.0f} MiB "
              f"(namespace 300 -> 400 MiB)")
        assert grew >= 90 * MIB
        assert ("engine.quota.limit", str(m11 / "lmcache")) in {
            (a.kind, a.subject) for a in bigger.actions}, "the engine's cap follows the new size"
        # LMCache's size is per worker, set by the smallest directory (store0's, unchanged)
        assert lmcache_size(gpu) >= cap_before
        assert mount_ids([m01, m11]) == before

        # Converged: discovery on both ports, nothing else; no sysfs attribute written.
        writes = len(sysfs_writes)
        runner = RecordingRunner()
        again = gpu.apply(runner=runner)
        lap("converged GPU pass")
        assert_ok(again)
        assert not again.changed, [a for a in again.actions if a.status == "done"]
        assert [c[:2] for c in runner.calls] == [("nvme", "discover")] * 2, runner.calls
        assert sysfs_writes[writes:] == []

        gpu_config(gpu, attach=False)
        assert_ok(gpu.apply())
        assert not any(os.path.ismount(m) for m in (m01, m02, m11))
        storage_config(store1, "store1", 43, 4421, None)
        assert_ok(store1.apply())
        storage_config(store0, "store0", 42, 4420, None)
        assert_ok(store0.apply())
        assert kit.nvmet_is_empty(), kit.nvmet_tree()
        lap("teardown")
    finally:
        kit.force_clean()
        remove_volume_group(VG, DRIVES[0])
        kit.sh("wipefs", "-a", DRIVES[0], check=False)
