"""Hostile inputs on the real kernel (issue 24, items 1, 3, 5 and 7): nothing kvagent reads
from a pool directory, nvmet, a discovery log or a config makes it move, truncate, export
or overwrite what it does not own, or add options to a connect request.

- Item 1: a file pool's manifest whose ``creating`` entry names ``../../victim.conf`` (or
  an absolute path), and links planted where the pool's files and directories are: the
  pool is refused naming the entry or the link; the victim keeps its bytes, inode and
  mtime; nvmet exports nothing of it.
- Item 3: links named like the O_DIRECT probe (its old fixed name, guesses of the random
  one) in the directory it probes, pointing at a file and at a block device: ``kvagent
  plan`` and ``apply`` probe under a name of their own and never open the victims
  (inotify on the victims, checksums).
- Item 5 (6.12: DH-HMAC-CHAP target): a host entry an admin made, with a secret of their
  own and allowed by their own subsystem, whose NQN a kvagent pool lists with auth: the
  pool is refused naming the subsystem; the admin's secret, hash and group stay, and their
  host still connects with it.
- Item 7: NQNs with ',' or '=' (config, hostnqn file, a real nvmet discovery log) and a
  host_iface that is not an interface name: refused before /dev/nvme-fabrics is written
  (no controller, no ``nvme connect``), the field named; config errors exit 2.
- The test switch: inside the VM, failpoints answer (marker file) and a power cut is
  allowed (the CPU shows the ``hypervisor`` flag, under TCG too).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
from pathlib import Path

import pytest

from agent import failpoints
from agent.dhchap import generate, read_secret, write_secret
from agent.naming import subsystem_nqn
from agent.records import FileManifest, ManifestEntry

from . import kit
from .pools import (
    MIB,
    Lab,
    RecordingRunner,
    assert_ok,
    device_digest,
    fabrics_controllers,
    mount_tmpfs,
    umount_all_under,
)

pytestmark = pytest.mark.kernel
PREFIX = "nqn.2026-11.io.kvagent"
UUID = "5f0c7a2e-9b1d-4e3f-8a6c-2d4b6e8f0a1c"
NGUID = "5f0c7a2e9b1d4e3f8a6c2d4b6e8f0a1c"
SIZE = 16 * MIB


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


# --------------------------------------------------------------------------- helpers

class Inotify:
    """inotify(7) through libc: which names were made in a directory, and whether a file
    (whatever name reached it, a link included) was opened or changed."""

    OPEN, MODIFY, ATTRIB, CLOSE_WRITE, CREATE, DELETE = 0x20, 0x2, 0x4, 0x8, 0x100, 0x200

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.paths: dict[int, str] = {}

    def watch(self, path: Path | str, mask: int) -> None:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(str(path)), mask)
        assert wd >= 0, f"inotify_add_watch {path}: {os.strerror(ctypes.get_errno())}"
        self.paths[wd] = str(path)

    def events(self) -> list[tuple[str, int, str]]:
        """(watched path, mask, name) of every event since the last call."""
        out = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            i = 0
            while i < len(buf):
                wd, mask, _cookie, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
                out.append((self.paths.get(wd, "?"), mask, name))
                i += 16 + n

    def close(self) -> None:
        os.close(self.fd)


def fingerprint(path: Path) -> tuple[str, int, int, int]:
    """(digest, size, inode, mtime) of a file: where it is, what it holds, never touched."""
    st = os.stat(path, follow_symlinks=False)
    return kit.digest_of(str(path)), st.st_size, st.st_ino, st.st_mtime_ns


def exported_paths() -> dict[str, str]:
    """Every namespace nvmet has now: ``<subsystem>/<nsid>`` -> device_path."""
    out = {}
    for ns in (kit.NVMET / "subsystems").glob("*/namespaces/*"):
        out[f"{ns.parent.parent.name}/{ns.name}"] = kit.read(ns / "device_path")
    return out


def file_pool_config(lab: Lab, directory: Path, *, count: int = 1, buffered: bool = True,
                     service: int = 4420) -> str:
    return f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: {service}}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {directory}, buffered_io: {str(buffered).lower()}}}
      namespaces: {{count: {count}, size: {SIZE // MIB}MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""


# ------------------------------------------------------------------ the test switch

def test_failpoints_answer_inside_the_test_vm() -> None:
    """scripts/vm's guest has the root-owned marker, and the TCG CPU model shows the
    ``hypervisor`` flag: failpoints and power cuts work in this tier (and only here)."""
    st = os.lstat(failpoints.MARKER)
    assert st.st_uid == 0 and not st.st_mode & 0o022, oct(st.st_mode)
    assert failpoints.test_switch_on()
    assert failpoints.in_virtual_machine(), "no 'hypervisor' cpu flag in the guest"


# ------------------------------------------------------------------------- item 1

#: How each case plants its bait: what is named in the refusal.
MANIFEST_CASES = ("temp ../../victim.conf", "temp absolute", "ns1.img a link, creating",
                  "ns1.img swapped for a link", "host directory a link")


@pytest.mark.parametrize("case", MANIFEST_CASES)
def test_a_hostile_manifest_moves_exports_and_writes_nothing(lab: Lab, case: str) -> None:
    files = lab.root / "files"
    mount_tmpfs(files, "96m")
    pool_dir = files / "kv"
    victim = lab.root / "victim.conf"  # ../../victim.conf from the pool directory
    # A root file bigger than the namespace: a link to it needs no growing to be exported.
    victim.write_bytes(b"root:$6$kvtest$precious:19000:0:99999:7:::\n" * (SIZE // 40))
    elsewhere = lab.root / "elsewhere"
    elsewhere.mkdir()
    lab.write(file_pool_config(lab, files))
    creating = ManifestEntry(SIZE, UUID, NGUID, "creating", "lab/.ns1.img.creating")

    if case == "ns1.img swapped for a link":
        # kvagent made and exported the file; it was replaced by a link; nvmet was emptied
        # (a reboot): the next apply would re-export whatever the link leads to.
        assert_ok(lab.apply())
        assert exported_paths() == {f"{subsystem_nqn(PREFIX, 'lab', 'kv', 'lab')}/1":
                                    str(pool_dir / "lab/ns1.img")}
        kit.force_clean()
        (pool_dir / "lab/ns1.img").unlink()
        (pool_dir / "lab/ns1.img").symlink_to(victim)
        named = f"{pool_dir}/lab/ns1.img is a symbolic link"
    else:
        pool_dir.mkdir(mode=0o700)
        if case == "host directory a link":
            # The link leads to a directory holding a root file under the temp name: the
            # old code moved it to .../ns1.img, grew it and exported it.
            (pool_dir / "lab").symlink_to(elsewhere)
            victim = elsewhere / ".ns1.img.creating"
            victim.write_bytes(b"root:$6$kvtest$precious\n" * 1000)
            named = f"{pool_dir}/lab is a symbolic link"
        else:
            (pool_dir / "lab").mkdir(mode=0o700)
        if case.startswith("temp"):
            temp = "../../victim.conf" if case.endswith("victim.conf") else str(victim)
            creating = ManifestEntry(SIZE, UUID, NGUID, "creating", temp)
            named = repr(temp)
        elif case == "ns1.img a link, creating":
            (pool_dir / "lab/ns1.img").symlink_to(victim)
            named = f"{pool_dir}/lab/ns1.img is a symbolic link"
        FileManifest("kv", {"lab/ns1.img": creating}).save(pool_dir)
    manifest = (pool_dir / ".kvagent-pool.json").read_bytes()
    before = fingerprint(victim)
    listing = sorted(p.name for p in elsewhere.iterdir())

    if case == "temp ../../victim.conf":
        plan = lab.cli("plan")
        assert plan.returncode == 1, plan.stdout + plan.stderr
        assert "'../../victim.conf'" in plan.stdout + plan.stderr
        assert "not the names kvagent creates" in plan.stdout + plan.stderr
    result = lab.apply()

    (error,) = result.errors
    assert error.pool == "kv" and named in error.message, error
    assert not [a for a in result.actions if a.kind.startswith("file.")], result.actions
    assert fingerprint(victim) == before, "the victim was moved, grown or written"
    assert sorted(p.name for p in elsewhere.iterdir()) == listing, "a file made outside"
    assert (pool_dir / ".kvagent-pool.json").read_bytes() == manifest
    if case.startswith("temp"):
        assert not os.path.lexists(pool_dir / "lab/ns1.img")
    elif case.startswith("ns1.img"):
        assert (pool_dir / "lab/ns1.img").readlink() == victim, "the planted link was moved"
    assert exported_paths() == {}, "nothing of the refused pool is exported"
    assert not list((kit.NVMET / "subsystems").iterdir())
    assert not list((kit.NVMET / "hosts").iterdir())


# ------------------------------------------------------------------------- item 3

#: Links an attacker would plant for the probe: its old fixed name and guesses of the
#: random one (all zeros, all f, a counter, this pid).
PROBE_BAIT = (".kvagent-odirect-probe", ".kvagent-odirect-probe.0000000000000000",
              ".kvagent-odirect-probe.ffffffffffffffff", ".kvagent-odirect-probe.1",
              f".kvagent-odirect-probe.{os.getpid()}", ".kvagent-odirect-probe.tmp")
PROBE_NAME = re.compile(r"\.kvagent-odirect-probe\.[0-9a-f]{16}")


def plant(directory: Path, victim: Path, device: str) -> None:
    """The old fixed name leads to the victim file, every guess to the block device."""
    (directory / PROBE_BAIT[0]).symlink_to(victim)
    for name in PROBE_BAIT[1:]:
        (directory / name).symlink_to(device)


def probed(events: list[tuple[str, int, str]], directory: Path) -> list[str]:
    """Probe names made (and removed) in ``directory``; fails on a probe left behind."""
    made = [n for w, m, n in events if w == str(directory) and m & Inotify.CREATE
            and n.startswith(".kvagent-odirect-probe")]
    gone = [n for w, m, n in events if w == str(directory) and m & Inotify.DELETE
            and n.startswith(".kvagent-odirect-probe")]
    assert sorted(made) == sorted(gone), (made, gone)
    return made


def test_links_planted_for_the_odirect_probe_are_never_opened(nullb, lab: Lab) -> None:
    """(``nullb`` first: its devices go after the lab's mounts.)"""
    disk, bait_device = nullb(128), nullb(16)
    data = lab.root / "data"
    data.mkdir()
    kit.sh("mkfs.ext4", "-F", "-q", "-E", "nodiscard", disk, timeout=120)
    kit.sh("mount", disk, str(data))
    pools = data / "pools"
    pools.mkdir(mode=0o700)
    victim = data / "victim.conf"  # on the same O_DIRECT-capable filesystem
    victim.write_bytes(os.urandom(256 << 10))
    os.chmod(victim, 0o600)
    kit.sh("dd", "if=/dev/urandom", f"of={bait_device}", "bs=1M", "count=16", "oflag=direct")
    plant(pools, victim, bait_device)
    lab.write(file_pool_config(lab, pools, buffered=False))
    notify = Inotify()
    try:
        notify.watch(victim, Inotify.OPEN | Inotify.MODIFY | Inotify.ATTRIB
                     | Inotify.CLOSE_WRITE)
        # A device may be opened to be read (blkid, say); written, never.
        notify.watch(bait_device, Inotify.MODIFY | Inotify.CLOSE_WRITE)
        notify.watch(pools, Inotify.CREATE | Inotify.DELETE)

        def run(what: str, directory: Path) -> None:
            before = (fingerprint(victim), device_digest(bait_device))
            notify.events()  # our own reads
            if what == "plan":
                proc = lab.cli("-o", "json", "plan")
                assert proc.returncode == 0, proc.stdout + proc.stderr
                kinds = [a["kind"] for a in json.loads(proc.stdout)["actions"]]
                assert "file.create" in kinds, kinds
            else:
                assert_ok(lab.apply())
            events = notify.events()
            touched = [e for e in events if e[0] in (str(victim), bait_device)]
            assert touched == [], f"{what} opened a victim through a planted link: {touched}"
            names = probed(events, directory)
            assert names and all(PROBE_NAME.fullmatch(n) for n in names), names
            assert not set(names) & set(PROBE_BAIT), names
            assert (fingerprint(victim), device_digest(bait_device)) == before
            for name in PROBE_BAIT:
                assert (directory / name).is_symlink(), f"{name} was replaced"

        # A new pool: the probe runs in the nearest existing directory (``pools``).
        run("plan", pools)
        assert sorted(p.name for p in pools.iterdir()) == sorted(PROBE_BAIT)
        run("apply", pools)
        nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
        ns1 = kit.NVMET / "subsystems" / nqn / "namespaces/1"
        assert kit.read(ns1 / "device_path") == str(pools / "kv/lab/ns1.img")
        assert kit.read(ns1 / "buffered_io") == "0" and kit.read(ns1 / "enable") == "1"

        # A namespace added to the pool: the probe runs in the pool's own directory.
        plant(pools / "kv", victim, bait_device)
        notify.watch(pools / "kv", Inotify.CREATE | Inotify.DELETE)
        lab.write(file_pool_config(lab, pools, count=2, buffered=False))
        run("plan", pools / "kv")
        run("apply", pools / "kv")
        assert kit.read(ns1.parent / "2/device_path") == str(pools / "kv/lab/ns2.img")
    finally:
        notify.close()
    lab.write_empty(PREFIX)
    assert_ok(lab.apply())


# ------------------------------------------------------------------------- item 5

ADMIN_HOST = "nqn.2014-08.org.nvmexpress:uuid:3e8d1c5a-7f2b-4a9e-b6c0-1d5e9a3f7b2c"
ADMIN_SUBSYS = "nqn.2014-08.org.example:admin-made"


def host_attrs(nqn: str) -> dict[str, str]:
    d = kit.NVMET / "hosts" / nqn
    return {f: kit.read(d / f) for f in ("dhchap_key", "dhchap_ctrl_key", "dhchap_hash",
                                         "dhchap_dhgroup")}


def subsystem_state(nqn: str) -> dict[str, object]:
    d = kit.NVMET / "subsystems" / nqn
    attrs = {}
    for p in sorted(d.glob("attr_*")):
        try:
            attrs[p.name] = kit.read(p)
        except OSError as exc:  # some attributes cannot be read on some kernels
            attrs[p.name] = f"errno {exc.errno}"
    return {"attrs": attrs, "hosts": sorted(p.name for p in (d / "allowed_hosts").iterdir()),
            "namespaces": sorted(p.name for p in (d / "namespaces").iterdir()),
            "ports": sorted(p.name for p in (kit.NVMET / "ports").iterdir()
                            if (p / "subsystems" / nqn).exists())}


@pytest.mark.kernel(group="kernel-6.12", kernel="6.12.117+deb13-amd64")
@pytest.mark.second_kernel
def test_a_hand_made_host_entry_keeps_its_admins_secret(lab: Lab) -> None:
    assert kit.read("/proc/sys/kernel/osrelease").startswith("6.12")
    mount_tmpfs(lab.root / "files", "64m")
    keys = lab.root / "keys"
    keys.mkdir(mode=0o700)
    kv_key, kv_ctrl = keys / "kv.key", keys / "kv-ctrl.key"
    write_secret(str(kv_key), generate())
    write_secret(str(kv_ctrl), generate())
    admin_key, admin_ctrl = generate().text, generate().text

    # The admin's own: a host entry with their secrets, their subsystem allowing it, on
    # their port (127.0.0.1:4420, where kit.fabrics_connect goes).
    host = kit.NVMET / "hosts" / ADMIN_HOST
    host.mkdir()
    for attr, value in (("dhchap_key", admin_key), ("dhchap_ctrl_key", admin_ctrl),
                        ("dhchap_hash", "hmac(sha512)"), ("dhchap_dhgroup", "ffdhe3072")):
        kit.write(host / attr, value)
    sub = kit.NVMET / "subsystems" / ADMIN_SUBSYS
    sub.mkdir()
    kit.write(sub / "attr_allow_any_host", "0")
    (sub / "allowed_hosts" / ADMIN_HOST).symlink_to(host)
    port = kit.NVMET / "ports/9"
    port.mkdir()
    for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                 ("trsvcid", "4420")):
        kit.write(port / f"addr_{k}", v)
    (port / "subsystems" / ADMIN_SUBSYS).symlink_to(sub)
    admin = host_attrs(ADMIN_HOST)
    assert admin["dhchap_key"] == admin_key and admin["dhchap_hash"] == "hmac(sha512)"
    theirs = subsystem_state(ADMIN_SUBSYS)

    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4421}}]
  pools:
    - name: sec
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [p]
      hosts: [{{name: gpu, nqn: "{ADMIN_HOST}", auth: {{key_file: {kv_key},
                                                       ctrl_key_file: {kv_ctrl}}}}}]
""")
    kv_secret = read_secret(str(kv_key)).text
    cli = lab.cli("-o", "json", "apply")
    assert cli.returncode == 1, cli.stdout + cli.stderr
    for secret in (kv_secret, admin_key, admin_ctrl):
        assert secret not in cli.stdout + cli.stderr
    result = lab.apply()
    (error,) = result.errors
    assert error.pool == "sec", error
    assert f"nvmet's host entry {ADMIN_HOST} was not made by kvagent" in error.message
    assert f"subsystem(s) {ADMIN_SUBSYS} of someone else allow it" in error.message
    assert "its own host NQN" in (error.hint or "")
    assert host_attrs(ADMIN_HOST) == admin, "the admin's DH-HMAC-CHAP settings changed"
    assert subsystem_state(ADMIN_SUBSYS) == theirs
    assert not (kit.NVMET / "subsystems" / subsystem_nqn(PREFIX, "lab", "sec", "gpu")).exists()
    assert sorted(p.name for p in (kit.NVMET / "subsystems").iterdir()) == [ADMIN_SUBSYS]

    # What the admin's secret is for still works: their host connects to their subsystem.
    assert kit.fabrics_connect(ADMIN_HOST, ADMIN_SUBSYS, admin_key) == 0
    [ctrl] = kit.wait_for(lambda: kit.controllers_for(ADMIN_SUBSYS), 30, what="a controller")
    kit.wait_for(lambda: kit.read(ctrl / "state") == "live", 30, what="live")
    kit.sh("nvme", "disconnect", "-n", ADMIN_SUBSYS)
    kit.wait_for(lambda: not kit.controllers_for(ADMIN_SUBSYS), 30, what="disconnect")

    # The way out the hint gives: the admin's subsystem lets the host go and the admin
    # removes the entry (its secrets are theirs); then kvagent makes its own.
    (sub / "allowed_hosts" / ADMIN_HOST).unlink()
    host.rmdir()
    taken = lab.apply()
    assert_ok(taken)
    assert kit.read(host / "dhchap_key") == kv_secret
    assert kit.read(host / "dhchap_ctrl_key") == read_secret(str(kv_ctrl)).text
    assert subsystem_state(ADMIN_SUBSYS) == {**theirs, "hosts": []}
    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert port.exists() and (port / "subsystems" / ADMIN_SUBSYS).exists()


# ------------------------------------------------------------------------- item 7

EVIL_NQNS = (f"{PREFIX}:lab:kv:lab,traddr=203.0.113.9", f"{PREFIX}:lab:kv:lab=1")


def initiator_config(lab: Lab, *, subsystem: str | None = None, host_iface: str | None = None,
                     nvme_dir: Path | None = None, target_nqn: str | None = None) -> str:
    node = f"name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run"
    if nvme_dir:
        node += f", nvme_dir: {nvme_dir}"
    text = f"\nversion: 1\nnode: {{{node}}}\n"
    if target_nqn:
        text += f"""target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{target_nqn}"}}]
"""
    target = "transport: tcp, address: 127.0.0.1, service: 4420"
    if subsystem:
        target += f', subsystem: "{subsystem}"'
    text += f"""initiator:
  device_wait: 10s
  pools:
    - name: kv
      target: {{{target}}}
      mount: {lab.root}/mnt/kv
"""
    if host_iface:
        text += f'      connect: {{host_iface: "{host_iface}"}}\n'
    return text


def nvme_class() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/nvme").iterdir())


def connects(runner: RecordingRunner) -> list[tuple[str, ...]]:
    """Commands that would write /dev/nvme-fabrics for an I/O controller."""
    return [c for c in runner.calls if (len(c) > 1 and c[1] == "connect")
            or any("fabrics_writer" in a for a in c)]


def test_option_injection_in_a_config_is_refused_at_load(lab: Lab) -> None:
    before = nvme_class()
    cases = (
        (initiator_config(lab, subsystem=EVIL_NQNS[0]),
         "initiator.pools[0].target[0].subsystem", "must not contain ',' or '='"),
        (initiator_config(lab, host_iface="lo,traddr=1.2.3.4"),
         "initiator.pools[0].connect.host_iface", "is not a network interface name"),
        (initiator_config(lab, target_nqn=f"{lab.hostnqn},hostnqn=x"),
         "target.pools[0].hosts[0].nqn", "must not contain ',' or '='"),
    )
    for text, field, words in cases:
        lab.write(text)
        proc = lab.cli("apply")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if field in ln]
        assert line.startswith(f"kvagent: config error: {lab.config}:"), line
        assert re.search(rf"{re.escape(str(lab.config))}:\d+: ", line), line
        assert words in line, line
    assert nvme_class() == before
    assert kit.nvmet_is_empty()
    assert not lab.state.exists(), "a refused config changed nothing, records included"


def test_a_hostnqn_file_with_options_is_refused_before_any_connect(lab: Lab) -> None:
    nvme_dir = lab.root / "nvme"
    nvme_dir.mkdir()
    evil = f"nqn.2014-08.org.nvmexpress:uuid:{UUID},traddr=203.0.113.9"
    (nvme_dir / "hostnqn").write_text(evil + "\n")
    (nvme_dir / "hostid").write_text(UUID + "\n")
    lab.write(initiator_config(lab, nvme_dir=nvme_dir))
    before = nvme_class()
    runner = RecordingRunner()
    result = lab.apply(runner=runner)
    (error,) = result.errors
    assert f"{nvme_dir}/hostnqn" in error.message and repr(evil) in error.message, error
    assert "must not contain ',' or '='" in error.message
    assert not [c for c in runner.calls if c[0].endswith("nvme")], runner.calls
    assert nvme_class() == before


def test_a_discovery_record_with_options_is_refused_before_the_connect(lab: Lab) -> None:
    """The storage side made by hand, as a hostile or broken target would serve it: nvmet
    takes ',' and '=' in a subsystem NQN, and its discovery log shows them as they are."""
    port = kit.NVMET / "ports/1"
    port.mkdir()
    for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                 ("trsvcid", "4420")):
        kit.write(port / f"addr_{k}", v)
    lab.write(initiator_config(lab))
    for evil in EVIL_NQNS:
        sub = kit.NVMET / "subsystems" / evil
        sub.mkdir()  # nvmet allows it: only the length and the discovery NQN are checked
        kit.write(sub / "attr_allow_any_host", "1")
        (port / "subsystems" / evil).symlink_to(sub)
        before = fabrics_controllers()
        listing = nvme_class()
        runner = RecordingRunner()
        result = lab.apply(runner=runner)
        assert [c for c in runner.calls if len(c) > 1 and c[1] == "discover"], runner.calls
        assert connects(runner) == [], "a connect request was made"
        messages = [e.message for e in result.errors]
        assert any(f"refusing to connect: nqn {evil!r} contains ','" in m for m in messages), \
            messages
        assert fabrics_controllers() == before and nvme_class() == listing
        assert not kit.controllers_for(evil)
        assert not os.path.ismount(lab.root / "mnt/kv/lab-ns1")
        (port / "subsystems" / evil).unlink()
        sub.rmdir()
