"""Kill kvagent right after every step: the next apply finishes the job by itself.

One config with every backing kind (lvm, file, device) on the storage side and a
per-namespace and a striped pool with engines on the GPU side. For each case — a cold
apply of the storage side, a cold attach of the GPU side, and a full teardown (detach
and unexport) — the pass runs in a child process that is SIGKILLed right after its
k-th side effect, for every k; then a plain apply must exit 0, the apply after it must
change nothing (not one configfs write, command or record but the last-apply report),
data written to the mounts before the teardown must read back unchanged, and foreign
objects (an nvmet subsystem and port, an LV, an ext4 filesystem) stay untouched.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from agent.config import Config, load_config

from . import kit
from .crash import Outcome, child_pass, ci_log
from .pools import DRIVES, MIB, Lab, mount_tmpfs, umount_all_under, write_file

#: Three cases, three VMs (they run in parallel with the rest of the kernel tier), all
#: in every scripts/test: the storage side's cold apply, the GPU side's cold attach and a
#: teardown (each 4-8 minutes in a VM of its own under TCG).


PREFIX = "nqn.2026-11.io.kvagent"
FOREIGN_NQN = "nqn.2014-08.org.example:foreign"
VG = "kvcrash"


def config(lab: Lab, *, storage: bool = True, gpu: bool = True) -> Config:
    hosts = f'[{{name: lab, nqn: "{lab.hostnqn}"}}]'
    pools = f"""
    - {{name: lv, ports: [p], hosts: {hosts}, namespaces: {{count: 1, size: 320MiB}},
       backing: {{kind: lvm, volume_group: {VG}, devices: [{DRIVES[0]}]}}}}
    - {{name: fl, ports: [p], hosts: {hosts}, namespaces: {{count: 2, size: 160MiB}},
       backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}}}
    - {{name: dv, ports: [p], hosts: {hosts},
       backing: {{kind: device, devices: [{{path: {DRIVES[1]}, host: lab}}]}}}}""" \
        if storage else ""
    text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: {"[{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}]"
          if storage else "[]"}
  pools: {pools or "[]"}
"""
    if gpu:
        target = "{transport: tcp, address: 127.0.0.1, service: 4420}"
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - {{name: lv, target: {target}, mount: {lab.root}/mnt/lv, engines: [{{kind: lmcache}}]}}
    - {{name: fl, target: {target}, mount: {lab.root}/mnt/fl, layout: striped,
       engines: [{{kind: vllm, cpu_cache: 1GiB}}]}}
"""
    return load_config(lab.write(text))


# ------------------------------------------------------------ foreign objects
class Foreign:
    """Objects kvagent does not own, next to everything it does; checked after each run."""

    def __init__(self, root: Path, nullb):  # type: ignore[no-untyped-def]
        self.root = root
        self.backing = nullb(16)
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        sub.mkdir()
        kit.write(sub / "attr_allow_any_host", "1")
        (sub / "namespaces/1").mkdir()
        kit.write(sub / "namespaces/1/device_path", self.backing)
        kit.write(sub / "namespaces/1/enable", "1")
        port = kit.NVMET / "ports/9"
        port.mkdir()
        for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                     ("trsvcid", "4429")):
            kit.write(port / f"addr_{k}", v)
        os.symlink(sub, port / "subsystems" / FOREIGN_NQN)
        kit.modprobe("loop")
        self.loops = []
        for name in ("lvm", "ext4"):
            img = root / f"foreign-{name}.img"
            with open(img, "wb") as f:
                f.truncate(64 * MIB)
            self.loops.append(kit.sh("losetup", "--show", "-f", str(img)).stdout.strip())
        kit.sh("vgcreate", "-y", "kvforeign", self.loops[0], timeout=120)
        kit.sh("lvcreate", "-y", "-n", "keep", "-L", "8m", "kvforeign", timeout=120)
        kit.sh("mkfs.ext4", "-q", self.loops[1])
        self.lv_digest = self._write("/dev/kvforeign/keep")
        self.ext4 = kit.digest_of(self.loops[1], MIB)

    @staticmethod
    def _write(dev: str) -> str:
        data = os.urandom(MIB)
        with open(dev, "r+b") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return kit.digest(data)

    def check(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        assert kit.read(sub / "namespaces/1/enable") == "1"
        assert kit.read(sub / "namespaces/1/device_path") == self.backing
        assert (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).is_symlink()
        assert kit.read(kit.NVMET / "ports/9/addr_trsvcid") == "4429"
        assert kit.digest_of("/dev/kvforeign/keep", MIB) == self.lv_digest
        assert kit.digest_of(self.loops[1], MIB) == self.ext4

    def remove(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).unlink(missing_ok=True)
        if (kit.NVMET / "ports/9").exists():
            (kit.NVMET / "ports/9").rmdir()
        if sub.exists():
            kit.write(sub / "namespaces/1/enable", "0")
            (sub / "namespaces/1").rmdir()
            sub.rmdir()
        kit.sh("vgremove", "-ff", "-y", "kvforeign", check=False, timeout=120)
        for loop in self.loops:
            kit.sh("losetup", "-d", loop, check=False)


# ---------------------------------------------------------------------- resets
def ours(name: str) -> bool:
    return name.startswith(f"{PREFIX}:")


def clear_our_nvmet() -> None:
    """Remove kvagent's nvmet objects (a reboot would); the foreign ones stay."""
    for port in (kit.NVMET / "ports").iterdir():
        if port.name == "9":
            continue
        for link in (port / "subsystems").iterdir():
            link.unlink()
        port.rmdir()
    for sub in (kit.NVMET / "subsystems").iterdir():
        if not ours(sub.name):
            continue
        for link in (sub / "allowed_hosts").iterdir():
            link.unlink()
        for ns in (sub / "namespaces").iterdir():
            kit.write(ns / "enable", "0")
            ns.rmdir()
        sub.rmdir()
    for host in (kit.NVMET / "hosts").iterdir():
        host.rmdir()


def fabrics() -> list[Path]:
    return [c for c in Path("/sys/class/nvme").glob("nvme*") if kit.read(c / "transport") == "tcp"]


def detach_gpu(lab: Lab) -> None:
    """The GPU side back to nothing: unmounted, deactivated, disconnected, forgotten."""
    if fabrics() or Path("/dev/mapper/kvs_fl-data").exists():
        umount_all_under(lab.root / "mnt")
        kit.sh("vgchange", "-an", "kvs_fl", check=False, timeout=120)
        kit.sh("nvme", "disconnect-all", check=False)
        kit.wait_for(lambda: not fabrics(), 30, what="fabrics controllers to go")
    for p in ("initiator.json", "probes", "engines"):
        kit.sh("rm", "-rf", str(lab.state / p))
    kit.sh("rm", "-rf", str(lab.root / "mnt"))


def blank_namespaces(lab: Lab) -> None:
    """What the GPU side wrote on the storage goes: its namespaces are blank again."""
    for path in [f"/dev/{VG}/kv_lv_lab_1", *(str(p) for p in
                                             (lab.root / "files/fl").rglob("ns*.img"))]:
        with open(path, "r+b") as f:
            f.write(b"\0" * (4 * MIB))
            f.flush()
            os.fsync(f.fileno())


def reset_storage(lab: Lab) -> None:
    """Nothing of kvagent's on the storage side (and no records)."""
    detach_gpu(lab)
    clear_our_nvmet()
    if Path(f"/dev/{VG}").exists():
        kit.sh("vgremove", "-ff", "-y", VG, check=False, timeout=120)
    # The LVM label and metadata go with the first MiBs (the device pool's drive is
    # never written: claimed, not attached).
    kit.sh("blkdiscard", "-z", "-o", "0", "-l", str(4 * MIB), DRIVES[0], timeout=120)
    for child in (lab.root / "files").iterdir():
        kit.sh("rm", "-rf", str(child))
    kit.sh("rm", "-rf", str(lab.state))


# ----------------------------------------------------------------- the matrix
def side_effects(outcome: Outcome) -> list[str]:
    """Steps other than the report every apply writes (last-apply.json)."""
    return [s for s in outcome.steps if not s.endswith("last-apply.json")]


class Snapshot:
    """The state after the storage steps of a cold apply, restored in a moment.

    After the backings are made (volume group, LV, files, claim and their records) a
    cold apply only writes configfs and records. A pass from this state therefore takes
    exactly the cold pass's remaining steps (checked), so killing it after its j-th step
    is killing the cold pass after step ``first + j``; restoring it is clearing
    kvagent's nvmet objects and putting the records back — no LVM or mkfs per kill.
    """

    def __init__(self, lab: Lab, first: int):
        self.lab, self.first = lab, first
        self.saved = lab.root / "snapshot-state"
        kit.sh("rm", "-rf", str(self.saved))
        kit.sh("cp", "-a", str(lab.state), str(self.saved))

    def restore(self) -> None:
        clear_our_nvmet()
        kit.sh("rm", "-rf", str(self.lab.state))
        kit.sh("cp", "-a", str(self.saved), str(self.lab.state))


def first_configfs_step(steps: tuple[str, ...]) -> int:
    """How many steps come before the first configfs change (the storage steps)."""
    return next(i for i, s in enumerate(steps) if s.startswith("configfs."))


def run_case(name: str, lab: Lab, cfg: Config, reset, check, foreign: Foreign,  # type: ignore[no-untyped-def]
             snapshot_after_storage: bool = False) -> int:
    """Kill after step k for every k of ``cfg``'s pass from the state ``reset`` makes."""
    reset()
    full = child_pass(cfg)
    assert full.exit_code == 0, f"{name}: the pass itself failed"
    steps = full.steps
    n = len(steps)
    ci_log(f"crash matrix {name}: {n} steps")
    snapshot: Snapshot | None = None
    # The storage steps end with the record of intent written just before configfs.
    first = first_configfs_step(steps) - 1 if snapshot_after_storage else n
    if snapshot_after_storage:
        reset()
        assert child_pass(cfg, f"kill-after={first}").killed
        snapshot = Snapshot(lab, first)
        rest = child_pass(cfg)
        assert rest.steps == steps[first:], (
            f"{name}: from the snapshot the pass takes other steps than the cold pass:\n"
            f"{rest.steps}\n{steps[first:]}")
    started = time.monotonic()
    for k in range(1, n + 1):
        t0 = time.monotonic()
        spec = f"kill-after={k}"
        if snapshot is not None and k > first:
            snapshot.restore()
            spec = f"kill-after={k - first}"
        else:
            reset()
        t1 = time.monotonic()
        killed = child_pass(cfg, spec)
        assert killed.killed, f"{name} k={k}: the pass ended before step {k}"
        t2 = time.monotonic()
        recovered = child_pass(cfg)
        assert recovered.exit_code == 0, f"{name} k={k} ({steps[k - 1]}): recovery failed"
        t3 = time.monotonic()
        again = child_pass(cfg)
        assert again.exit_code == 0 and side_effects(again) == [], (
            f"{name} k={k} ({steps[k - 1]}): not converged: {side_effects(again)}")
        t4 = time.monotonic()
        check()
        foreign.check()
        ci_log(f"crash matrix {name} k={k}/{n} after {steps[k - 1]}: killed; recovered with "
               f"{len(side_effects(recovered))} step(s); then converged "
               f"[reset {t1 - t0:.1f}s killed {t2 - t1:.1f}s recovery {t3 - t2:.1f}s "
               f"again {t4 - t3:.1f}s checks {time.monotonic() - t4:.1f}s]")
    ci_log(f"crash matrix {name}: {n} kills in {time.monotonic() - started:.0f}s")
    return n


@contextlib.contextmanager
def foreign_objects(lab: Lab, nullb):  # type: ignore[no-untyped-def]
    foreign = Foreign(lab.root, nullb)
    try:
        yield foreign
    finally:
        reset_storage(lab)
        foreign.remove()


@pytest.mark.kernel(group="crash-storage", weight=9)
def test_kill_after_every_step_of_a_cold_apply_storage_side(lab: Lab, nullb) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        n = run_case("storage cold apply", lab, config(lab, gpu=False),
                     lambda: reset_storage(lab), lambda: None, foreign,
                     snapshot_after_storage=True)
        ci_log(f"crash matrix size: storage cold apply {n} kills")


@pytest.mark.kernel(group="crash-gpu", weight=15)
def test_kill_after_every_step_of_a_cold_attach_gpu_side(lab: Lab, nullb) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        storage_only = config(lab, gpu=False)

        def gpu_empty() -> None:
            detach_gpu(lab)
            assert child_pass(storage_only).exit_code == 0
            blank_namespaces(lab)

        def mounted() -> None:
            for pool in ("lv/lab-ns1", "fl"):
                assert os.path.ismount(lab.root / "mnt" / pool)

        n = run_case("gpu cold attach", lab, config(lab), gpu_empty, mounted, foreign)
        ci_log(f"crash matrix size: gpu cold attach {n} kills")


@pytest.mark.kernel(group="crash-teardown", weight=18)
def test_kill_after_every_step_of_a_teardown(lab: Lab, nullb) -> None:  # type: ignore[no-untyped-def]
    with foreign_objects(lab, nullb) as foreign:
        full = config(lab)
        digests: dict[Path, str] = {}
        assert child_pass(full).exit_code == 0
        for pool in ("lv/lab-ns1", "fl"):
            f = lab.root / "mnt" / pool / "kept.bin"
            digests[f] = write_file(f, 4 * MIB)
        teardown = config(lab, storage=False, gpu=False)

        def attached() -> None:
            assert child_pass(full).exit_code == 0
            kit.write("/proc/sys/vm/drop_caches", "3")
            for f, digest in digests.items():
                assert kit.digest_of(str(f)) == digest, f"{f} changed"

        def nothing_left() -> None:
            assert not (lab.root / "mnt").exists() or not any(
                os.path.ismount(p) for p in (lab.root / "mnt").rglob("*"))
            assert not [s for s in (kit.NVMET / "subsystems").iterdir() if ours(s.name)]

        n = run_case("teardown", lab, teardown, attached, nothing_left, foreign)
        attached()  # the data survived every killed teardown
        ci_log(f"crash matrix size: teardown {n} kills")


@pytest.fixture
def lab(tmp_path: Path):
    # Loopback NVMe/TCP with transparent huge pages 'always' trips a 6.1 kernel bug that
    # leaves I/O hanging (docs/operations.md, troubleshooting): what the lab does too.
    kit.write("/sys/kernel/mm/transparent_hugepage/enabled", "madvise")
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "512m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()
