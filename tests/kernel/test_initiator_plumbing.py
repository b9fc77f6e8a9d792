"""GPU-host plumbing on the real 6.1 kernel: discover, idempotent connect, find by uuid,
refused host identities, targeted disconnect; over NVMe/TCP and NVMe/RDMA (soft-RoCE).

The far end is set up with raw configfs writes (no kvagent target code), like
test_harness.py: two per-host subsystems of one pool, one allowing this host,
one allowing only another host NQN.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fabrics import FabricsAddress
from agent.initiator.connect import Target, connect, disconnect_controllers, pool_entries
from agent.initiator.devices import wait_for_namespaces
from agent.initiator.identity import UUID_NQN_PREFIX, ensure_host_identity
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.failures import PermanentConnectError, TransientConnectError
from agent.initiator.nvme.options import FabricsOptions
from agent.initiator.sysfs import Sysfs
from agent.system.run import SubprocessRunner
from nvmet.ids import namespace_uuid

from . import kit

pytestmark = pytest.mark.kernel

PREFIX = "nqn.2026-11.io.kvagent.test"
MINE = f"{PREFIX}:kt-store:kpool:gpu0"
THEIRS = f"{PREFIX}:kt-store:kpool:gpu1"
OTHER_HOST = UUID_NQN_PREFIX + "0f0e0d0c-0b0a-4908-8706-050403020100"


@contextlib.contextmanager
def far_end(transport: str, address: str, device: str, hostnqn: str,
            port_id: int) -> Iterator[None]:
    """Export MINE (ns 1 on ``device``, for ``hostnqn``) and THEIRS (for OTHER_HOST)."""
    c = kit.NVMET
    port = c / "ports" / str(port_id)
    made: list[Path] = []
    links: list[Path] = []
    try:
        for nqn, host in ((MINE, hostnqn), (THEIRS, OTHER_HOST)):
            sub = c / "subsystems" / nqn
            sub.mkdir()
            made.append(sub)
            h = c / "hosts" / host
            if not h.exists():
                h.mkdir()
                made.append(h)
            os.symlink(h, sub / "allowed_hosts" / host)
            links.append(sub / "allowed_hosts" / host)
        ns = c / "subsystems" / MINE / "namespaces/1"
        ns.mkdir()
        made.append(ns)
        kit.write(ns / "device_path", device)
        kit.write(ns / "device_uuid", namespace_uuid(MINE, 1))
        kit.write(ns / "enable", "1")
        port.mkdir()
        made.append(port)
        for attr, value in (("addr_trtype", transport), ("addr_adrfam", "ipv4"),
                            ("addr_traddr", address), ("addr_trsvcid", "4420")):
            kit.write(port / attr, value)
        for nqn in (MINE, THEIRS):
            os.symlink(c / "subsystems" / nqn, port / "subsystems" / nqn)
            links.append(port / "subsystems" / nqn)
        yield
    finally:
        for nqn in (MINE, THEIRS):
            kit.sh("nvme", "disconnect", "-n", nqn, check=False)
        kit.wait_for(lambda: not (kit.controllers_for(MINE) or kit.controllers_for(THEIRS)),
                     30, what="controllers to go away")
        for link in reversed(links):
            link.unlink()
        for d in reversed(made):
            if d.name == "1" and (d / "enable").exists():
                kit.write(d / "enable", "0")
            d.rmdir()


def setup_host() -> tuple[NvmeCli, Sysfs, str, str]:
    ident = ensure_host_identity("/etc/nvme")  # the VM's copy of this machine's files
    assert not ident.created, "the test VM should come with /etc/nvme/hostnqn and hostid"
    return NvmeCli(SubprocessRunner()), Sysfs("/sys"), ident.hostnqn, ident.hostid


def test_tcp_discover_connect_find_refuse_disconnect(nullb) -> None:
    cli, sysfs, hostnqn, hostid = setup_host()
    assert cli.version().version >= (2,)
    with far_end("tcp", "127.0.0.1", nullb(64), hostnqn, port_id=11):
        # The discovery log lists only what this host may use.
        log = cli.discover("tcp", "127.0.0.1", 4420, hostnqn=hostnqn, hostid=hostid)
        assert {e.subnqn for e in log if e.is_nvm_subsystem} == {MINE}
        [entry] = pool_entries(log, PREFIX, "kpool", host="gpu0")
        mine = Target(entry.address, entry.subnqn, hostnqn, hostid,
                      FabricsOptions(ctrl_loss_tmo=-1, reconnect_delay=2))

        # Another host identity, not in allowed_hosts: refused by the kernel, not retried.
        stranger = Target(FabricsAddress("tcp", "127.0.0.1", "4420"), MINE,
                          UUID_NQN_PREFIX + str(uuid.uuid4()), str(uuid.uuid4()))
        sleeps: list[float] = []
        with pytest.raises(PermanentConnectError) as refused:
            connect(stranger, cli=cli, sysfs=sysfs, attempts=3, sleep=sleeps.append)
        assert sleeps == []
        assert refused.value.status == 0x4184
        assert any("is not allowed" in line for line in refused.value.kernel), \
            refused.value.kernel
        assert not kit.controllers_for(MINE)

        # Nothing listening on that service: transient, retried, then given up.
        nowhere = Target(FabricsAddress("tcp", "127.0.0.1", "4999"), MINE, hostnqn, hostid)
        with pytest.raises(TransientConnectError, match="Connection refused"):
            connect(nowhere, cli=cli, sysfs=sysfs, attempts=2, wait_initial=0.1, wait_max=0.1)

        first = connect(mine, cli=cli, sysfs=sysfs)
        second = connect(Target(FabricsAddress("tcp", "127.0.0.1", "4420"), MINE, hostnqn,
                                hostid), cli=cli, sysfs=sysfs)
        assert first.changed and not second.changed
        [ctrl] = first.controllers
        assert [c.name for c in second.controllers] == [ctrl.name]
        assert [p.name for p in kit.controllers_for(MINE)] == [ctrl.name]
        live = sysfs.controller(ctrl.name)
        assert live is not None and live.hostnqn == hostnqn
        assert (live.ctrl_loss_tmo, live.reconnect_delay) == ("off", "2")

        [dev] = wait_for_namespaces(sysfs, MINE, [1], timeout=30)
        assert dev.device == kit.block_by_uuid(namespace_uuid(MINE, 1))
        assert dev.size_bytes == 64 << 20
        assert [(p.controller, p.controller_state, p.ana_state) for p in dev.paths] == [
            (ctrl.name, "live", "optimized")]
        assert os.path.exists(dev.device)

        # While this host holds the port, another identity's connect (through
        # /dev/nvme-fabrics, not nvme-cli's own duplicate check) gets the target's own
        # refusal, is not retried, and leaves this host's controller as it was.
        with pytest.raises(PermanentConnectError) as again:
            connect(stranger, cli=cli, sysfs=sysfs, attempts=3, sleep=sleeps.append)
        assert sleeps == [] and again.value.status == 0x4184, again.value
        assert [p.name for p in kit.controllers_for(MINE)] == [ctrl.name]
        assert kit.read(Path("/sys/class/nvme") / ctrl.name / "state") == "live"

        assert disconnect_controllers(MINE, OTHER_HOST, cli=cli, sysfs=sysfs) == []
        assert disconnect_controllers(MINE, hostnqn, cli=cli, sysfs=sysfs) == [ctrl.name]
        assert not kit.controllers_for(MINE)
        assert sysfs.namespace_by_uuid(namespace_uuid(MINE, 1)) is None


def test_rdma_connect_and_find(nullb, rxe) -> None:
    cli, sysfs, hostnqn, hostid = setup_host()
    with far_end("rdma", rxe.address, nullb(64), hostnqn, port_id=12):
        result = connect(Target(FabricsAddress("rdma", rxe.address, "4420"), MINE, hostnqn,
                                hostid), cli=cli, sysfs=sysfs)
        [ctrl] = result.controllers
        assert ctrl.address.transport == "rdma" and result.changed
        [dev] = wait_for_namespaces(sysfs, MINE, [1], timeout=30)
        assert dev.device == kit.block_by_uuid(namespace_uuid(MINE, 1))
        assert disconnect_controllers(MINE, hostnqn, cli=cli, sysfs=sysfs) == [ctrl.name]


def test_the_mount_table_is_read_again_exactly_when_a_mount_changed_it(tmp_path: Path) -> None:
    """agent.system.mounts parses /proc/self/mountinfo once per change, told by the
    kernel's poll mark: a mount and an unmount show at the next look, and looks in
    between read nothing."""
    from agent.system.mounts import KernelMountTable

    table = KernelMountTable()
    where = tmp_path / "m"
    where.mkdir()
    assert str(where) not in {e.mount_point for e in table.entries()}
    table.entries()
    assert table.reads == 1
    kit.sh("mount", "-t", "tmpfs", "kvtest", str(where))
    try:
        assert str(where) in {e.mount_point for e in table.entries()}
        assert table.reads == 2
        table.entries()
        assert table.reads == 2, "no change since: not read again"
    finally:
        kit.sh("umount", str(where))
    assert str(where) not in {e.mount_point for e in table.entries()}
    assert table.reads == 3


def test_a_forked_child_sees_the_mounts_its_sibling_made(tmp_path: Path) -> None:
    """Forked children share the parent's mountinfo descriptor and its poll mark: one
    child's mount, seen (and the mark consumed) by that child, must still show in the
    next child, which inherits the parent's table from before the mount."""
    from agent.system.mounts import KERNEL_TABLE

    where = tmp_path / "m"
    where.mkdir()
    assert KERNEL_TABLE.at(str(where)) is None  # the parent has read the table

    def in_child(step) -> int:  # type: ignore[no-untyped-def]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if step() else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def mount_and_look() -> bool:
        kit.sh("mount", "-t", "tmpfs", "kvtest", str(where))
        return KERNEL_TABLE.at(str(where)) is not None

    try:
        assert in_child(mount_and_look) == 0
        assert in_child(lambda: KERNEL_TABLE.at(str(where)) is not None) == 0, (
            "the second child trusted the parent's table from before the mount")
    finally:
        kit.sh("umount", str(where), check=False)
