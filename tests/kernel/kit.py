"""Helpers for real-kernel tests (they run as root inside the VM)."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def new_digest():  # type: ignore[no-untyped-def]
    """The checksum the kernel tests compare data with: MD5, which under TCG hashes about
    11x faster than SHA-256 (1.7 s per 32 MiB for SHA-256 in the test VM). The tests look
    for accidental changes (a wrong device, a formatted drive), not for an attacker."""
    return hashlib.md5(usedforsecurity=False)


def digest(data: bytes) -> str:
    """Hex checksum of ``data`` (see :func:`new_digest`)."""
    h = new_digest()
    h.update(data)
    return h.hexdigest()
NVMET = Path("/sys/kernel/config/nvmet")
NULLB = Path("/sys/kernel/config/nullb")


def sh(*argv: str, check: bool = True, timeout: float = 60,
       input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv; raise with its output on failure when ``check``."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}"
                             f"{proc.stderr}")
    return proc


def remove_tree(path: str | Path, *extra: str) -> None:
    """``rm -rf`` of a tree that may hold mount points kvagent sealed (immutable while
    unmounted: agent/immutable.py): their attribute cleared first. ``extra``: more
    options for rm (e.g. --one-file-system)."""
    if os.path.lexists(path):
        sh("chattr", "-R", "-f", "-i", str(path), check=False, timeout=120)
    sh("rm", "-rf", *extra, str(path))


def prepare_apt() -> None:
    """apt's directories: virtme-ng mounts empty tmpfs on /var/cache and /var/lib/apt.

    man-db's trigger is turned off in the guest (Debian's ``man-db/auto-update``):
    ``mandb`` rescanning the host's /usr/share/man over 9p under TCG took longer than
    the package tests' whole time limit.
    """
    for d in ("/var/cache/apt/archives/partial", "/var/lib/apt/lists/partial"):
        Path(d).mkdir(parents=True, exist_ok=True)
    Path("/var/lib/man-db/auto-update").unlink(missing_ok=True)


def modprobe(*modules: str) -> None:
    for m in modules:
        sh("modprobe", m)


def wait_for(predicate: Callable[[], T], timeout: float = 30, interval: float = 0.2,
             what: str = "condition") -> T:
    """Poll until predicate returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read(path: Path | str) -> str:
    return Path(path).read_text().strip()


def write(path: Path | str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def exported_uuid(nqn: str, nsid: int) -> str:
    """The uuid nvmet gives namespace ``nsid`` of subsystem ``nqn`` (the storage's identity)."""
    return read(NVMET / "subsystems" / nqn / "namespaces" / str(nsid) / "device_uuid")


def block_by_uuid(uuid: str) -> str | None:
    """Visible block device (/dev/nvmeXnY) whose namespace uuid is ``uuid``."""
    for dev in Path("/sys/block").glob("nvme*n*"):
        if "c" in dev.name.split("nvme", 1)[1]:  # hidden per-path node nvmeXcYnZ
            continue
        try:
            if read(dev / "uuid") == uuid:
                return f"/dev/{dev.name}"
        except OSError:
            continue
    return None


def odirect_roundtrip(device: str, size: int = 4 << 20, offset: int = 0) -> str:
    """Write ``size`` random bytes with O_DIRECT, read them back, return their digest."""
    buf = mmap.mmap(-1, size)
    payload = os.urandom(size)
    buf.write(payload)
    fd = os.open(device, os.O_RDWR | os.O_DIRECT)
    try:
        assert os.pwritev(fd, [buf], offset) == size
        os.fsync(fd)
        back = mmap.mmap(-1, size)
        assert os.preadv(fd, [back], offset) == size
    finally:
        os.close(fd)
    written, read_back = digest(payload), digest(back[:])
    assert written == read_back, f"data read back from {device} differs from what was written"
    return written


def digest_of(path: str, size: int | None = None) -> str:
    h = new_digest()
    with open(path, "rb") as f:
        remaining = size
        while remaining is None or remaining > 0:
            chunk = f.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            h.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return h.hexdigest()


def digest_of_range(path: str, offset: int, size: int) -> str:
    """Digest of ``size`` bytes at ``offset``, read with O_DIRECT (no stale page cache)."""
    buf = mmap.mmap(-1, size)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], offset) == size
    finally:
        os.close(fd)
    return digest(buf[:])


def make_nullb(name: str, size_mb: int = 256) -> str:
    """A memory-backed null_blk device (data is kept) via configfs; returns /dev path."""
    d = NULLB / name
    d.mkdir()
    write(d / "size", str(size_mb))
    write(d / "memory_backed", "1")
    write(d / "blocksize", "512")
    write(d / "power", "1")
    index = read(d / "index")
    # Kernels since 5.19 name the disk after the configfs item; older ones nullb<index>.
    candidates = (f"/dev/{name}", f"/dev/nullb{index}")
    return wait_for(lambda: next((c for c in candidates if os.path.exists(c)), None), 10,
                    what=" or ".join(candidates))


def remove_nullb(name: str) -> None:
    d = NULLB / name
    if d.exists():
        write(d / "power", "0")
        d.rmdir()


def nvmet_tree() -> list[str]:
    """Every path under the nvmet configfs root (sorted), for 'empty again' checks."""
    return sorted(str(p.relative_to(NVMET)) for p in NVMET.rglob("*"))


def nvmet_is_empty() -> bool:
    return all(not any((NVMET / d).iterdir()) for d in ("hosts", "ports", "subsystems"))


def local_hostnqn() -> str:
    return read("/etc/nvme/hostnqn")


def local_hostid() -> str:
    return read("/etc/nvme/hostid")


def controllers_for(nqn: str) -> list[Path]:
    out = []
    for c in Path("/sys/class/nvme").glob("nvme*"):
        try:
            if read(c / "subsysnqn") == nqn:
                out.append(c)
        except OSError:
            continue
    return out


class Rxe:
    """A veth pair with a soft-RoCE device on one end: RDMA over an address of our own."""

    def __init__(self, address: str = "10.99.0.1", prefix: int = 24,
                 veth: str = "kvveth0", peer: str = "kvveth1", name: str = "kvrxe0"):
        self.address, self.prefix, self.veth, self.peer, self.name = (
            address, prefix, veth, peer, name)

    def up(self) -> Rxe:
        modprobe("rdma_rxe", "nvmet-rdma", "nvme-rdma")
        sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        sh("ip", "addr", "add", f"{self.address}/{self.prefix}", "dev", self.veth)
        sh("ip", "link", "set", self.veth, "up")
        sh("ip", "link", "set", self.peer, "up")
        sh("rdma", "link", "add", self.name, "type", "rxe", "netdev", self.veth)
        return self

    def down(self) -> None:
        sh("rdma", "link", "delete", self.name, check=False)
        sh("ip", "link", "del", self.veth, check=False)


@contextlib.contextmanager
def sparse_xfs(path: Path, size: int) -> Iterator[Path]:
    """An xfs of ``size`` bytes mounted at ``path``, on a loop device over a sparse image.

    Room for pool files larger than the VM's memory (the guest's /var is a tmpfs
    overlay): kvagent preallocates a file namespace, and on xfs that reserves
    unwritten extents, so only what is written takes memory."""
    modprobe("loop")
    image = path.with_name(path.name + ".img")
    with open(image, "wb") as f:
        f.truncate(size)
    loop = sh("losetup", "--show", "-f", str(image)).stdout.strip()
    try:
        sh("mkfs.xfs", "-q", loop, timeout=120)
        path.mkdir(exist_ok=True)
        sh("mount", loop, str(path))
        try:
            yield path
        finally:
            # Lazily when a failed test left a namespace open on a file there.
            if sh("umount", str(path), check=False).returncode:
                sh("umount", "-l", str(path), check=False)
    finally:
        sh("losetup", "-d", loop, check=False)
        image.unlink()


def leftovers() -> list[str]:
    """What a test left behind in the guest kernel: nvmet objects, controllers, mounts, DM."""
    found = []
    if NVMET.exists():
        for kind in ("subsystems", "ports", "hosts"):
            found += [f"nvmet {kind}/{p.name}" for p in (NVMET / kind).iterdir()]
    for c in Path("/sys/class/nvme").glob("nvme*"):
        try:
            if read(c / "transport") in ("tcp", "rdma", "loop"):
                found.append(f"fabrics controller {c.name} ({read(c / 'subsysnqn')})")
        except OSError:
            continue
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mnt = line.split()[:2]
        if dev.startswith(("/dev/nvme", "/dev/mapper", "/dev/nullb", "/dev/dm-")):
            found.append(f"mount {dev} on {mnt}")
    mapper = Path("/dev/mapper")
    if mapper.exists():
        found += [f"device-mapper {p.name}" for p in mapper.iterdir() if p.name != "control"]
    if NULLB.exists():
        found += [f"null_blk {p.name}" for p in NULLB.iterdir() if p.is_dir()]
    return found


def stuck_report(dmesg_lines: int = 40) -> str:
    """What a failed test's report needs when the guest kernel wedged: the processes in
    uninterruptible sleep (D) with their kernel stacks, and the end of the kernel log
    (an emulated drive's timeouts, hung-task warnings). Reads only /proc and the log."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "D":
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stack = (proc / "stack").read_text().strip()
        except (OSError, IndexError):
            continue
        out.append(f"pid {proc.name} (D) {cmd.strip()}\n{stack}")
    try:
        log = sh("dmesg", check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        log = f"(dmesg: {exc})"
    out = out or ["no process in uninterruptible sleep"]
    out.append("dmesg, its end:\n" + "\n".join(log.splitlines()[-dmesg_lines:]))
    return "\n".join(out)


def force_clean() -> None:
    """Best-effort teardown of everything :func:`leftovers` reports (test VM only)."""
    for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        dev, mnt = line.split()[:2]
        if dev.startswith(("/dev/nvme", "/dev/mapper", "/dev/nullb", "/dev/dm-")):
            sh("umount", mnt, check=False)
    # Volumes on fabrics namespaces go before their controllers: a disconnect first
    # would leave the device-mapper tables with no devices under them for good.
    sh("vgchange", "-an", check=False, timeout=120)
    sh("nvme", "disconnect-all", check=False)
    mapper = Path("/dev/mapper")
    for dm in (mapper.iterdir() if mapper.exists() else ()):
        if dm.name != "control":
            sh("dmsetup", "remove", "--force", dm.name, check=False)
    if NVMET.exists():
        for port in (NVMET / "ports").iterdir():
            for link in (port / "subsystems").iterdir():
                link.unlink()
            for ref in (port / "referrals").iterdir():
                ref.rmdir()
            for grp in (port / "ana_groups").iterdir():
                if grp.name != "1":
                    grp.rmdir()
            port.rmdir()
        for sub in (NVMET / "subsystems").iterdir():
            for link in (sub / "allowed_hosts").iterdir():
                link.unlink()
            for ns in (sub / "namespaces").iterdir():
                write(ns / "enable", "0")
                ns.rmdir()
            sub.rmdir()
        for host in (NVMET / "hosts").iterdir():
            host.rmdir()
    if NULLB.exists():
        for dev in NULLB.iterdir():
            if dev.is_dir():
                remove_nullb(dev.name)


def fabrics_connect(hostnqn: str, subnqn: str, secret: str | None) -> int:
    """Connect through /dev/nvme-fabrics as ``hostnqn`` (nvme-cli 2.3 turns a second
    identity on one subsystem and port away before the kernel sees it): 0 or the errno."""
    opts = (f"transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn={subnqn},hostnqn={hostnqn},"
            f"hostid={hostnqn.rsplit(':', 1)[1]}")  # the default hostid is another NQN's
    if secret:
        opts += f",dhchap_secret={secret}"
    fd = os.open("/dev/nvme-fabrics", os.O_RDWR)
    try:
        os.write(fd, opts.encode())
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)
    return 0


class Laps:
    """Prints the time each phase of a test took (the VM is slow; this shows where)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        print(f"[time] {what}: {now - self.last:.1f}s")
        self.last = now
