"""sysfs readers over a fake tree rebuilt from the 6.1 capture, including races."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from agent.fabrics import FabricsAddress, canonical_traddr
from agent.initiator import sysfs as sysfs_mod
from agent.initiator.sysfs import Sysfs

from .fakesysfs import FakeSysfs

NQN = "nqn.2026-11.io.kvagent:gpu0-store:pool0:gpu0"
UUID = "3f1c2d3e-4b5a-5c6d-8e7f-a1b2c3d4e5f6"
CAPTURE = Path(__file__).parent / "fixtures" / "sysfs-6.1"


@pytest.fixture
def tree(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs(tmp_path).load_dump()


def recorded(name: str) -> dict[str, str]:
    """attribute -> value from the reference capture file (sysfs-ctrl.txt style)."""
    out = {}
    for line in (CAPTURE / name).read_text().splitlines():
        key, sep, value = line.partition("\t")
        if sep and not value.startswith("cat:"):
            out[key] = value.strip()
    return out


def test_controller_from_the_capture(tree: FakeSysfs) -> None:
    ctrl = Sysfs(tree.root).controller("nvme2")
    assert ctrl is not None
    assert (ctrl.address.transport, ctrl.state, ctrl.subsysnqn) == ("tcp", "live", NQN)
    assert ctrl.address == FabricsAddress("tcp", "127.0.0.1", "4420", src_addr="127.0.0.1")
    assert ctrl.address.src_addr == "127.0.0.1"
    # connected with --ctrl-loss-tmo -1 --reconnect-delay 2 --keep-alive-tmo 7 --queue-size 64
    assert (ctrl.ctrl_loss_tmo, ctrl.reconnect_delay, ctrl.kato, ctrl.sqsize) == (
        "off", "2", "7", 63)
    assert ctrl.hostnqn and ctrl.hostnqn.startswith("nqn.2014-08.org.nvmexpress:uuid:")
    assert ctrl.cntlid == 1 and ctrl.is_fabrics and ctrl.usable


def test_reference_capture_attributes_parse(tmp_path: Path) -> None:
    """The reference capture's controller, written into the fake layout, reads back the same."""
    attrs = {k.rsplit("/", 1)[1]: v for k, v in recorded("sysfs-ctrl.txt").items()}
    fake = FakeSysfs(tmp_path)
    fake.add_controller(0, **{k: v for k, v in attrs.items() if k != "cntlid"},
                        cntlid=attrs["cntlid"])
    ctrl = Sysfs(tmp_path).controller("nvme0")
    assert ctrl is not None
    assert ctrl.address.traddr == "127.0.0.1" and ctrl.address.src_addr == "127.0.0.1"
    assert (ctrl.ctrl_loss_tmo, ctrl.reconnect_delay, ctrl.fast_io_fail_tmo) == (
        "600", "10", "off")
    assert ctrl.hostid == attrs["hostid"] and ctrl.subsysnqn == attrs["subsysnqn"]


def test_controllers_lists_only_complete_ones(tree: FakeSysfs) -> None:
    names = [c.name for c in Sysfs(tree.root).controllers()]
    # nvme0/nvme1 (PCIe) were not dumped: their class entries do not exist in the fake.
    assert names == ["nvme2"]


def test_subsystem_from_the_capture(tree: FakeSysfs) -> None:
    [sub] = Sysfs(tree.root).subsystems()
    assert (sub.name, sub.nqn, sub.iopolicy, sub.subsystype) == (
        "nvme-subsys2", NQN, "numa", "nvm")
    assert sub.controllers == ("nvme2",) and sub.heads == ("nvme2n1",)


def test_multipath_head_and_path_from_the_capture(tree: FakeSysfs) -> None:
    s = Sysfs(tree.root)
    head = s.namespace_by_uuid(UUID.upper())
    assert head is not None
    assert (head.name, head.device, head.nsid, head.subsystem, head.subsysnqn) == (
        "nvme2n1", "/dev/nvme2n1", 1, "nvme-subsys2", NQN)
    assert head.size_bytes == 131072 * 512 and head.logical_block_size == 512
    assert head.nguid is None  # 6.1 has no nguid file when it is zero
    assert head.wwid == f"uuid.{UUID}"
    [path] = head.paths
    assert (path.name, path.controller, path.controller_state, path.ana_state,
            path.ana_grpid) == ("nvme2c2n1", "nvme2", "live", "optimized", 1)


def test_hidden_path_nodes_are_not_namespaces(tree: FakeSysfs) -> None:
    names = sorted(h.name for h in Sysfs(tree.root).namespaces())
    assert names == ["nvme0n1", "nvme1n1", "nvme2n1"]
    assert Sysfs(tree.root).namespace("nvme2c2n1") is None


def test_non_multipath_device_hangs_off_its_controller(tree: FakeSysfs) -> None:
    head = Sysfs(tree.root).namespace("nvme0n1")
    assert head is not None and head.subsystem is None
    assert [p.controller for p in head.paths] == ["nvme0"]
    assert head.uuid is None and head.wwid.startswith("nvme.1b36-")


def test_two_paths_with_ana_states(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    fake.add_controller(3, subsysnqn=NQN, address="traddr=10.0.0.1,trsvcid=4420")
    fake.add_controller(4, subsysnqn=NQN, address="traddr=10.0.1.1,trsvcid=4420",
                        state="connecting")
    fake.add_subsystem(3, NQN, (3, 4))
    fake.add_namespace(3, 1, UUID, paths=((3, "optimized"), (4, "inaccessible")))
    head = Sysfs(tmp_path).namespace("nvme3n1")
    assert head is not None
    assert [(p.controller, p.controller_state, p.ana_state) for p in head.paths] == [
        ("nvme3", "live", "optimized"), ("nvme4", "connecting", "inaccessible")]


# ------------------------------------------------------------------- races

def test_controller_vanished_entirely(tree: FakeSysfs) -> None:
    shutil.rmtree(tree.root / "devices/virtual/nvme-fabrics/ctl/nvme2")
    s = Sysfs(tree.root)
    assert s.controller("nvme2") is None  # dangling class symlink
    assert s.controllers() == []
    head = s.namespace("nvme2n1")  # the head outlives its path (ctrl_loss_tmo)
    assert head is not None and head.paths == ()


def test_attribute_vanishes_mid_read(tree: FakeSysfs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's state file opens, and its read fails (ENODEV: being torn down)."""
    real_open, real_read = os.open, os.read
    torn: set[int] = set()

    def opening(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        fd = real_open(path, flags, *args, **kwargs)
        if str(path).endswith("/state") and "nvme2" in str(path):
            torn.add(fd)
        else:
            torn.discard(fd)
        return fd

    def reading(fd: int, n: int) -> bytes:
        if fd in torn:
            raise OSError(errno.ENODEV, "No such device")
        return real_read(fd, n)

    monkeypatch.setattr(sysfs_mod.os, "open", opening)
    monkeypatch.setattr(sysfs_mod.os, "read", reading)
    s = Sysfs(tree.root)
    assert s.controller("nvme2") is None
    head = s.namespace("nvme2n1")
    assert head is not None and head.paths[0].controller_state is None


def test_namespace_removed_between_listing_and_reading(
        tree: FakeSysfs, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Sysfs(tree.root)
    names = s.namespace_names()
    (tree.root / "block/nvme2n1").unlink()
    monkeypatch.setattr(Sysfs, "namespace_names", lambda self: names)
    assert s.namespace_by_uuid(UUID) is None
    assert "nvme2n1" not in [h.name for h in s.namespaces()]


def test_missing_roots_read_as_empty(tmp_path: Path) -> None:
    s = Sysfs(tmp_path / "nothing")
    assert (s.controllers(), s.subsystems(), s.namespaces()) == ([], [], [])


def test_read_attr_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "reset_controller"
    f.write_text("")

    def denied(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(sysfs_mod.os, "open", denied)  # a write-only attribute, as root
    assert sysfs_mod.read_attr(f) is None


# ------------------------------------------------------------------ address

@pytest.mark.parametrize(("raw", "expect"), [
    ("traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1", ("127.0.0.1", "4420", "127.0.0.1")),
    ("traddr=10.0.0.1 trsvcid=4420", ("10.0.0.1", "4420", None)),
    ("traddr=fe80::1,trsvcid=4420,host_traddr=fe80::2,host_iface=eth0",
     ("fe80::1", "4420", None)),
    ("0000:00:0b.0", (None, None, None)),
])
def test_address_parse(raw: str, expect: tuple) -> None:
    a = FabricsAddress.from_sysfs("tcp", raw)
    assert (a.traddr, a.trsvcid, a.src_addr) == expect


def test_address_host_fields() -> None:
    a = FabricsAddress.from_sysfs(
        "tcp", "traddr=fe80::1,trsvcid=4420,host_traddr=fe80::2,host_iface=eth0")
    assert (a.host_traddr, a.host_iface) == ("fe80::2", "eth0")


@pytest.mark.parametrize(("given", "canonical"), [
    ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
    ("[2001:db8::1]", "2001:db8::1"),
    ("::ffff:10.0.0.1", "::ffff:a00:1"),
    ("010.000.000.001", "010.000.000.001"),  # not an IPv4 literal Python accepts: kept
    ("10.0.0.1", "10.0.0.1"),
    ("nn-0x20000090FA:pn-0x10", "nn-0x20000090fa:pn-0x10"),
])
def test_normalize_traddr(given: str, canonical: str) -> None:
    assert canonical_traddr(given) == canonical


def test_subsystems_of_reads_each_other_subsystem_once_per_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU host has a subsystem per pool and every pool asks for its own (iopolicy,
    health): one NQN file of each other subsystem per reader, not per pool; a reused name
    is still found (read live)."""
    tree = FakeSysfs(tmp_path / "sys")
    nqns = [f"nqn.2026-11.io.kvagent:stor:kv{i}:gpu" for i in range(8)]
    for i, nqn in enumerate(nqns):
        tree.add_subsystem(i, nqn, iopolicy="round-robin" if i % 2 else "numa")
    reads: list[str] = []
    real = sysfs_mod.read_attr
    monkeypatch.setattr(sysfs_mod, "read_attr", lambda p: (
        reads.append(str(p)) if str(p).endswith("/subsysnqn") else None, real(p))[1])
    reader = Sysfs(tmp_path / "sys")
    for i, nqn in enumerate(nqns):
        (sub,) = reader.subsystems_of(nqn)
        assert (sub.name, sub.iopolicy) == (f"nvme-subsys{i}",
                                            "round-robin" if i % 2 else "numa")
    # 8 on the first look, then each subsystem of its own pool once more (read live)
    assert len(reads) == 8 + 8, reads
    # nvme-subsys0 now shows another NQN: found where it is now, not where it was
    (tmp_path / "sys/devices/virtual/nvme-subsystem/nvme-subsys0/subsysnqn").write_text(
        nqns[1] + "\n")
    assert [s.name for s in reader.subsystems_of(nqns[0])] == []
    assert sorted(s.name for s in reader.subsystems_of(nqns[1])) == [
        "nvme-subsys0", "nvme-subsys1"]


def test_secrets_are_written_back_to_back_after_every_file_is_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both secrets: every file opened first, then the writes one right after the other
    (the second cancels the first one's re-authentication if it has not begun); a file
    that cannot be opened means nothing is written."""
    ctl = tmp_path / "class/nvme/nvme2"
    ctl.mkdir(parents=True)
    for attr in ("dhchap_secret", "dhchap_ctrl_secret"):
        (ctl / attr).write_text("none\n")
    calls: list[str] = []
    real_open, real_write = sysfs_mod.os.open, sysfs_mod.os.write
    names: dict[int, str] = {}

    def opened(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        fd = real_open(path, flags, *args, **kwargs)
        names[fd] = Path(path).name
        calls.append(f"open {names[fd]}")
        return fd

    def written(fd: int, data: bytes) -> int:
        calls.append(f"write {names[fd]}")
        return real_write(fd, data)

    monkeypatch.setattr(sysfs_mod.os, "open", opened)
    monkeypatch.setattr(sysfs_mod.os, "write", written)
    s = Sysfs(tmp_path)
    s.set_controller_secrets("nvme2", [("dhchap_ctrl_secret", "C"), ("dhchap_secret", "H")])
    assert calls == ["open dhchap_ctrl_secret", "open dhchap_secret",
                     "write dhchap_ctrl_secret", "write dhchap_secret"]
    assert (ctl / "dhchap_ctrl_secret").read_text() == "C\n"
    assert (ctl / "dhchap_secret").read_text() == "H\n"
    calls.clear()
    with pytest.raises(FileNotFoundError):
        s.set_controller_secrets("nvme2", [("dhchap_secret", "X"), ("missing", "Y")])
    assert not [c for c in calls if c.startswith("write")]


def test_the_tls_state_as_sysfs_shows_it_on_each_kernel(tmp_path: Path) -> None:
    """6.12 shows tls_key only for a controller connected with TLS (empty between
    handshakes); 6.7-6.11 for every TCP controller (empty without TLS: cannot tell);
    a kernel without TLS support never (issue 24, item 6)."""
    from agent.initiator.sysfs import kernel_version, tls_state
    assert kernel_version("6.12.117+deb13-amd64") == (6, 12) and kernel_version("x") == (0, 0)
    assert tls_state("tcp", "0d1e2f3a", exact=False) is True
    assert tls_state("tcp", None, exact=True) is False
    assert tls_state("tcp", "", exact=True) is True
    assert tls_state("tcp", "", exact=False) is None
    assert tls_state("rdma", "0d1e2f3a", exact=True) is False
    fake = FakeSysfs(tmp_path)
    fake.add_controller(2, subsysnqn=NQN, tls_key="0d1e2f3a")
    fake.add_controller(3, subsysnqn=NQN)
    fake.add_controller(4, subsysnqn=NQN, tls_key="")
    on_612 = {c.name: c.tls for c in Sysfs(tmp_path, kernel="6.12.117+deb13-amd64")
              .controllers()}
    on_68 = {c.name: c.tls for c in Sysfs(tmp_path, kernel="6.8.0-49-generic").controllers()}
    assert on_612 == {"nvme2": True, "nvme3": False, "nvme4": True}
    assert on_68 == {"nvme2": True, "nvme3": False, "nvme4": None}


@pytest.mark.parametrize("pools", [4, 40])
def test_a_pass_lists_the_controllers_and_subsystems_once_whatever_the_pools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pools: int) -> None:
    """Each pool's attach looks for its own controllers and namespaces: one reader lists
    class/nvme and class/nvme-subsystem once, not once per pool (that made a pass of 640
    pools quadratic: 640 listings of 640 entries each, twice)."""
    fake = FakeSysfs(tmp_path)
    for i in range(pools):
        nqn = f"nqn.2026-11.io.kvagent:s:p{i}"
        fake.add_controller(i, subsysnqn=nqn, hostnqn="h")
        fake.add_subsystem(i, nqn, controllers=(i,))
        fake.add_namespace(i, 1, f"00000000-0000-4000-8000-{i:012d}", paths=((i, "optimized"),))
    listed: list[str] = []
    real = os.listdir
    monkeypatch.setattr(sysfs_mod.os, "listdir",
                        lambda p=".": listed.append(str(p)) or real(p))
    reader = Sysfs(tmp_path)
    for i in range(pools):
        nqn = f"nqn.2026-11.io.kvagent:s:p{i}"
        assert [c.name for c in reader.controllers(nqn)] == [f"nvme{i}"]
        assert list(reader.subsystem_namespaces(nqn)) == [1]
        assert [s.name for s in reader.subsystems_of(nqn)] == [f"nvme-subsys{i}"]
    assert listed.count(str(tmp_path / "class/nvme")) == 1
    assert listed.count(f"{tmp_path}/class/nvme-subsystem") == 1


def test_a_controller_made_after_the_listing_is_found(tmp_path: Path) -> None:
    """Made by this pass (learnt by name), or by anyone (a fresh look finds it); a name
    reused by another subsystem's controller is not taken for the old one."""
    fake = FakeSysfs(tmp_path)
    fake.add_controller(1, subsysnqn="nqn.2026-11.io.kvagent:s:a", hostnqn="h")
    reader = Sysfs(tmp_path)
    assert [c.name for c in reader.controllers("nqn.2026-11.io.kvagent:s:a")] == ["nvme1"]
    fake.add_controller(2, subsysnqn="nqn.2026-11.io.kvagent:s:b", hostnqn="h")
    assert reader.controllers("nqn.2026-11.io.kvagent:s:b") == []  # not listed since
    reader.learn("nvme2")
    assert [c.name for c in reader.controllers("nqn.2026-11.io.kvagent:s:b")] == ["nvme2"]
    fake.add_controller(3, subsysnqn="nqn.2026-11.io.kvagent:s:c", hostnqn="h")
    assert [c.name for c in reader.controllers("nqn.2026-11.io.kvagent:s:c",
                                               fresh=True)] == ["nvme3"]
    fake.remove_controller(1)
    fake.add_controller(1, subsysnqn="nqn.2026-11.io.kvagent:s:d", hostnqn="h")
    assert reader.controllers("nqn.2026-11.io.kvagent:s:a") == []
    assert [c.name for c in reader.controllers("nqn.2026-11.io.kvagent:s:d",
                                               fresh=True)] == ["nvme1"]
