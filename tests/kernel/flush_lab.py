"""A lab for power cuts that lose the drive's volatile cache (tests/kernel/test_flush_points.py).

Everything kvagent keeps durably lives on ONE small ext4 filesystem made on a dm
``log-writes`` device (data and log: loop devices over sparse files) and mounted at a
fixed path: the state dir and a file-backed pool's directory. The GPU side attaches that
pool over NVMe/TCP on 127.0.0.1; nvmet's file backend (O_DIRECT) turns its flushes into
fsyncs of the pool file, so the GPU side's xfs goes through the log too.

A power cut at a point: the pass is SIGKILLed (or ends), the kernel is "rebooted" (every
mount under the lab goes, kvagent's controllers and nvmet objects go, the log-writes
device is removed, the run dir is emptied), and the filesystem is rebuilt from the
image saved right after its mkfs with the log replayed up to that point
(tests/kernel/logwrites.py) and mounted again at the same path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agent.config import Config, load_config

from . import kit
from .crash import Outcome, child_pass
from .logwrites import Log, read_log, replay
from .pools import Lab, umount_all_under

PREFIX = "nqn.2026-11.io.kvagent"
FOREIGN_NQN = "nqn.2014-08.org.example:flush-foreign"
MIB = 1 << 20
FS_SIZE = 640 * MIB
LOG_SIZE = 2048 * MIB
DM = "kvflush"
SNAP = "kvflush-snap"
#: A pass that takes longer than this is wedged.
PASS_TIMEOUT = 300


def timed_pass(config: Config, spec: str = "", timeout: int = PASS_TIMEOUT) -> Outcome:
    """crash.child_pass with a deadline: the child dies of SIGALRM when wedged."""
    return child_pass(config, spec, timeout)


def side_effects(outcome: Outcome) -> list[str]:
    """Steps other than the report every apply writes (last-apply.json)."""
    return [s for s in outcome.steps if not s.endswith("last-apply.json")]


def named(step: str) -> str:
    """A step by its kind and what it is (a command's program; not device names)."""
    kind, _, subject = step.partition("\t")
    if kind == "command":
        words = subject.split()
        return f"{kind} {' '.join(words[:2] if words[:1] == ['nvme'] else words[:1])}"
    return f"{kind} {os.path.basename(subject)}" if kind == "record" else kind


def _loop(path: Path, readonly: bool = False) -> str:
    return kit.sh("losetup", *(["-r"] if readonly else []), "--show", "-f",
                  str(path)).stdout.strip()


def _sparse(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _copy(src: Path, dst: Path) -> None:
    kit.sh("cp", "--sparse=always", str(src), str(dst), timeout=300)


def write_synced(path: Path, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return kit.digest(data)


class Foreign:
    """A foreign nvmet subsystem and port, and a foreign file on the logged filesystem."""

    def __init__(self, nullb) -> None:  # type: ignore[no-untyped-def]
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
        self.files: dict[Path, str] = {}

    def check(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        assert kit.read(sub / "namespaces/1/enable") == "1"
        assert kit.read(sub / "namespaces/1/device_path") == self.backing
        assert (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).is_symlink()
        assert kit.read(kit.NVMET / "ports/9/addr_trsvcid") == "4429"
        for path, digest in self.files.items():
            assert kit.digest_of(str(path)) == digest, f"foreign {path} changed or lost"

    def remove(self) -> None:
        sub = kit.NVMET / "subsystems" / FOREIGN_NQN
        (kit.NVMET / "ports/9/subsystems" / FOREIGN_NQN).unlink(missing_ok=True)
        if (kit.NVMET / "ports/9").exists():
            (kit.NVMET / "ports/9").rmdir()
        if sub.exists():
            kit.write(sub / "namespaces/1/enable", "0")
            (sub / "namespaces/1").rmdir()
            sub.rmdir()


def clear_our_nvmet() -> None:
    """Remove kvagent's nvmet objects (a reboot would); the foreign ones stay."""
    for port in (kit.NVMET / "ports").iterdir():
        if port.name == "9":
            continue
        for link in (port / "subsystems").iterdir():
            link.unlink()
        port.rmdir()
    for sub in (kit.NVMET / "subsystems").iterdir():
        if not sub.name.startswith(f"{PREFIX}:"):
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
    return [c for c in Path("/sys/class/nvme").glob("nvme*")
            if kit.read(c / "transport") == "tcp"]


class LoggedLab:
    """The lab: configs, the logged filesystem at ``fs`` and its images."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.root = lab.root
        self.fs = lab.root / "fs"
        self.img = lab.root / "img"
        self.img.mkdir(exist_ok=True)
        self.start = self.img / "start.img"
        self.data = self.img / "data.img"
        self.log_img = self.img / "log.img"
        self.loops: list[str] = []
        self.snap = False
        self.fs.mkdir(exist_ok=True)
        kit.modprobe("loop", "dm-log-writes", "dm-snapshot")

    # ------------------------------------------------------------------ configs
    def config(self, storage: bool = True, gpu: bool = True) -> Config:
        hosts = f'[{{name: lab, nqn: "{self.lab.hostnqn}"}}]'
        target = "{transport: tcp, address: 127.0.0.1, service: 4420}"
        text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {self.fs}/state, run_dir: {self.root}/run}}
target:
  ports: {"[{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}]"
          if storage else "[]"}
  pools: {f'''
    - {{name: fl, ports: [p], hosts: {hosts}, namespaces: {{count: 1, size: 320MiB}},
       backing: {{kind: file, directory: {self.fs}/files}}}}''' if storage else "[]"}
"""
        text += f"""
initiator:
  device_wait: 60s
  pools: {f'''
    - {{name: fl, target: {target}, mount: {self.root}/mnt/fl, engines: [{{kind: lmcache}}]}}'''
          if gpu else "[]"}
"""
        return load_config(self.lab.write(text))

    @property
    def mount(self) -> Path:
        return self.root / "mnt/fl/lab-ns1"

    def pool_files(self) -> list[tuple[str, int]]:
        """The pool's namespace files (name, size) on the logged filesystem."""
        return sorted((str(p.relative_to(self.fs)), p.stat().st_size)
                      for p in (self.fs / "files").rglob("ns*.img"))

    # ------------------------------------------------------------------ images
    def make_start(self, foreign: Foreign) -> None:
        """mkfs the logged filesystem, put the foreign file on it, save the image."""
        _sparse(self.data, FS_SIZE)
        loop = _loop(self.data)
        try:
            kit.sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                   loop, timeout=300)
            kit.sh("mount", loop, str(self.fs))
            try:
                foreign.files[self.fs / "foreign/keep.bin"] = write_synced(
                    self.fs / "foreign/keep.bin", MIB)
            finally:
                kit.sh("umount", str(self.fs))
        finally:
            kit.sh("losetup", "-d", loop, check=False)
        _copy(self.data, self.start)

    def start_logging(self) -> None:
        """The data device as the starting image, a fresh log, mounted at ``fs``."""
        _copy(self.start, self.data)
        _sparse(self.log_img, LOG_SIZE)
        self.loops = [_loop(self.data), _loop(self.log_img)]
        kit.sh("dmsetup", "create", DM, "--table",
               f"0 {FS_SIZE // 512} log-writes {self.loops[0]} {self.loops[1]}")
        kit.sh("mount", f"/dev/mapper/{DM}", str(self.fs))

    def mark(self, name: str) -> None:
        kit.sh("dmsetup", "message", DM, "0", "mark", name)

    def reboot(self) -> Log | None:
        """What a power cut leaves of the kernel's state: nothing of kvagent's.
        Returns the log when the logged device was up."""
        umount_all_under(self.root / "mnt")
        if fabrics():
            kit.sh("nvme", "disconnect-all", check=False)
            kit.wait_for(lambda: not fabrics(), 60, what="fabrics controllers to go")
        clear_our_nvmet()
        if os.path.ismount(self.fs):
            kit.sh("umount", str(self.fs))
        log = None
        if Path(f"/dev/mapper/{DM}").exists():
            kit.sh("dmsetup", "remove", DM)
            log = read_log(str(self.log_img))
        if Path(f"/dev/mapper/{SNAP}").exists():
            kit.sh("dmsetup", "remove", SNAP)
        for loop in self.loops:
            kit.sh("losetup", "-d", loop, check=False)
        self.loops = []
        # The mount points go too, as on the first boot: every pass then starts alike.
        for path in ("run", "mnt"):
            kit.remove_tree(self.root / path, "--one-file-system")
        return log

    def mount_copy(self, log: Log, upto: int) -> None:
        """A copy of the starting image with the log replayed up to ``upto``, mounted."""
        cut = self.img / "cut.img"
        _copy(self.start, cut)
        replay(log, str(cut), upto)
        self.loops = [_loop(cut)]
        kit.sh("mount", self.loops[0], str(self.fs))

    def mount_snapshot(self, base: Path) -> None:
        """``base`` (read-only) under a throwaway copy-on-write snapshot, mounted."""
        cow = self.img / "cow.img"
        _sparse(cow, 512 * MIB)
        self.loops = [_loop(base, readonly=True), _loop(cow)]
        kit.sh("dmsetup", "create", SNAP, "--table",
               f"0 {FS_SIZE // 512} snapshot {self.loops[0]} {self.loops[1]} N 8")
        kit.sh("mount", f"/dev/mapper/{SNAP}", str(self.fs))

    def cleanup(self) -> None:
        self.reboot()
        for name in ("cut.img", "cow.img", "base.img", "data.img", "log.img"):
            (self.img / name).unlink(missing_ok=True)


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:.1f}s"
