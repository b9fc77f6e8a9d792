"""Idempotent connect, retries and targeted disconnect, with a fake kernel over a fake sysfs.

A connect is a write to /dev/nvme-fabrics: the fake kernel creates a controller in sysfs
and answers ``instance=N``; a repeat connect of the same host identity to the same
subsystem and port is refused with EALREADY (without ``duplicate_connect``). Failures
replay the recorded ones (fixtures/nvme-2.3/cases): the kernel's lines, and the errno
nvme-cli reported for its own write.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from agent.fabrics import FabricsAddress
from agent.initiator import sysfs as sysfs_mod
from agent.initiator.connect import (
    Target,
    connect,
    disconnect_controllers,
    find_controllers,
    pool_entries,
)
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.discovery import parse_discover
from agent.initiator.nvme.failures import PermanentConnectError, TransientConnectError
from agent.initiator.nvme.options import FabricsOptions
from agent.initiator.sysfs import Sysfs
from agent.system.run import CommandResult
from tests.unit.fakerunner import FakeRunner

from .fakesysfs import FakeSysfs

FIX = Path(__file__).parent / "fixtures" / "nvme-2.3"
NQN = "nqn.2026-11.io.kvagent:store1:pool0:gpu0"
HOST = "nqn.2014-08.org.nvmexpress:uuid:11e85052-8716-44d9-b10e-1c51bae17688"
HOSTID = "11e85052-8716-44d9-b10e-1c51bae17688"
OTHER = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-4908-8706-050403020100"


def recorded(name: str) -> dict:
    return json.loads((FIX / "cases" / f"{name}.json").read_text())


class ReplayLog:
    """Kernel log stand-in: returns the lines of the recorded case being replayed."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def mark(self) -> None:
        return None

    def since(self, mark: object) -> list[str]:
        return list(self.lines)


class FakeKernel:
    """nvme connect/disconnect acting on a FakeSysfs like nvme-cli 2.3 + the kernel."""

    def __init__(self, fake: FakeSysfs):
        self.fake = fake
        self.next = 5
        self.failures: list[dict] = []  # recorded cases to answer with, in order
        self.kernel_lines: list[str] = []
        self.runner = (FakeRunner().on_call(["nvme", "connect"], self.connect)
                       .on_call(["nvme", "disconnect"], self.disconnect))
        self.log = ReplayLog()
        #: options written to /dev/nvme-fabrics (as dicts); errors to raise, in order
        self.fabrics_writes: list[dict[str, str]] = []
        self.fabrics_errors: list[OSError] = []
        self.cli = NvmeCli(self.runner, kernel_log=self.log, fabrics_write=self.fabrics_write)

    @staticmethod
    def opt(argv: tuple[str, ...], flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    def connect(self, argv: tuple[str, ...], _input: str | None) -> CommandResult:
        if self.failures:
            case = self.failures.pop(0)
            self.log.lines = [ln for ln in case["kernel"] if ln.startswith("nvme ")]
            return CommandResult(argv, case["returncode"], case["stdout"], case["stderr"])
        traddr, svc, nqn = (self.opt(argv, "--traddr"), self.opt(argv, "--trsvcid"),
                            self.opt(argv, "--nqn"))
        for c in Sysfs(self.fake.root).controllers():
            if (c.address.traddr, c.address.trsvcid, c.subsysnqn) == (traddr, svc, nqn):
                return CommandResult(argv, 1, "", "already connected\n")
        inst = self.next
        self.next += 1
        self.fake.add_controller(inst, subsysnqn=nqn, hostnqn=self.opt(argv, "--hostnqn"),
                                 hostid=self.opt(argv, "--hostid"),
                                 address=f"traddr={traddr},trsvcid={svc},src_addr=10.9.9.9",
                                 transport=self.opt(argv, "--transport"))
        return CommandResult(argv, 0, json.dumps({"device": f"nvme{inst}"}), "")

    def fabrics_write(self, options: str, _timeout: float) -> str:
        """/dev/nvme-fabrics: the kernel adds a controller (EALREADY for this host
        identity's second one to a subsystem and port, unless duplicate_connect)."""
        opts = dict(t.split("=", 1) if "=" in t else (t, "") for t in options.split(","))
        self.fabrics_writes.append(opts)
        if self.fabrics_errors:
            raise self.fabrics_errors.pop(0)
        if self.failures:
            case = self.failures.pop(0)
            self.log.lines = [ln for ln in case["kernel"] if ln.startswith("nvme ")]
            err = errno.ECONNREFUSED if "Connection refused" in case["stderr"] else errno.EIO
            raise OSError(err, os.strerror(err))
        if "duplicate_connect" not in opts and any(
                (c.address.traddr, c.address.trsvcid, c.subsysnqn, c.hostnqn)
                == (opts["traddr"], opts["trsvcid"], opts["nqn"], opts.get("hostnqn"))
                for c in Sysfs(self.fake.root).controllers()):
            raise OSError(errno.EALREADY, os.strerror(errno.EALREADY))
        inst = self.next
        self.next += 1
        self.fake.add_controller(inst, subsysnqn=opts["nqn"], hostnqn=opts.get("hostnqn"),
                                 hostid=opts.get("hostid"), transport=opts["transport"],
                                 address=f"traddr={opts['traddr']},trsvcid={opts['trsvcid']},"
                                         "src_addr=10.9.9.9",
                                 # 6.12: tls_key only on a controller connected with TLS
                                 tls_key="0d1e2f3b" if "tls" in opts else None,
                                 dhchap_secret=opts.get("dhchap_secret"),
                                 dhchap_ctrl_secret=opts.get("dhchap_ctrl_secret"))
        return f"instance={inst},cntlid=1\n"

    def disconnect(self, argv: tuple[str, ...], _input: str | None) -> CommandResult:
        name = self.opt(argv, "--device")
        if name and (self.fake.root / "class/nvme" / name).exists():
            self.fake.remove_controller(int(name[4:]))
            return CommandResult(argv, 0, "", "")
        return CommandResult(argv, 0, "", f"Did not find device {name}\n")


@pytest.fixture
def kernel(tmp_path: Path) -> FakeKernel:
    return FakeKernel(FakeSysfs(tmp_path))


def target(traddr: str = "10.0.0.1", hostnqn: str = HOST, **kw) -> Target:
    address = FabricsAddress("tcp", traddr, kw.pop("trsvcid", "4420"),
                             host_iface=kw.pop("host_iface", None),
                             host_traddr=kw.pop("host_traddr", None))
    return Target(address, kw.pop("subsysnqn", NQN), hostnqn, kw.pop("hostid", HOSTID), **kw)


def run_connect(kernel: FakeKernel, t: Target, **kw):
    sleeps: list[float] = []
    result = connect(t, cli=kernel.cli, sysfs=Sysfs(kernel.fake.root), sleep=sleeps.append,
                     **kw)
    return result, sleeps


def connects(kernel: FakeKernel) -> list[dict[str, str]]:
    """The connect requests written to /dev/nvme-fabrics."""
    return kernel.fabrics_writes


# --------------------------------------------------------------- idempotency

def test_connects_when_nothing_matches(kernel: FakeKernel) -> None:
    result, _ = run_connect(kernel, target())
    assert result.changed
    [ctrl] = result.controllers
    assert (ctrl.name, ctrl.hostnqn, ctrl.state) == ("nvme5", HOST, "live")
    [opts] = connects(kernel)
    assert "duplicate_connect" not in opts
    assert (opts["hostnqn"], opts["hostid"]) == (HOST, HOSTID)
    assert kernel.runner.ran("nvme", "connect") == []  # (nvme-cli reads every controller)


def test_existing_matching_controller_is_reused_without_nvme_connect(kernel: FakeKernel) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST,
                               address="traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.7")
    result, _ = run_connect(kernel, target())
    assert not result.changed
    assert [c.name for c in result.controllers] == ["nvme2"]
    assert connects(kernel) == []


def test_second_connect_is_a_no_op(kernel: FakeKernel) -> None:
    first, _ = run_connect(kernel, target())
    second, _ = run_connect(kernel, target())
    assert first.changed and not second.changed
    assert second.controllers[0].name == first.controllers[0].name
    assert len(connects(kernel)) == 1


def test_src_addr_difference_is_ignored(kernel: FakeKernel) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST,
                               address="traddr=10.0.0.1,trsvcid=4420,src_addr=192.168.7.7")
    result, _ = run_connect(kernel, target())
    assert not result.changed and connects(kernel) == []


@pytest.mark.parametrize(("sysfs_addr", "config_addr"), [
    ("fd00:0:0:0::1", "fd00::1"),
    ("FD00::1", "fd00::1"),
    ("fd00::1", "fd00:0000:0000:0000:0000:0000:0000:0001"),
])
def test_ipv6_forms_are_normalised(kernel: FakeKernel, sysfs_addr: str,
                                   config_addr: str) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST,
                               address=f"traddr={sysfs_addr},trsvcid=4420,src_addr=fd00::9")
    result, _ = run_connect(kernel, target(config_addr))
    assert not result.changed and connects(kernel) == []


def test_service_compared_as_a_number(kernel: FakeKernel) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST,
                               address="traddr=10.0.0.1,trsvcid=04420")
    result, _ = run_connect(kernel, target(trsvcid=4420))
    assert not result.changed


@pytest.mark.parametrize("state", ["connecting", "resetting"])
def test_reconnecting_controller_is_reused(kernel: FakeKernel, state: str) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, state=state,
                               address="traddr=10.0.0.1,trsvcid=4420")
    result, _ = run_connect(kernel, target())
    assert not result.changed and connects(kernel) == []


@pytest.mark.parametrize("state", ["deleting", "dead", "new"])
def test_unusable_controller_is_not_reused(kernel: FakeKernel, state: str) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, state=state,
                               address="traddr=10.0.0.1,trsvcid=4420")
    assert find_controllers(target(), Sysfs(kernel.fake.root)) == []


@pytest.mark.parametrize("field", ["traddr", "trsvcid", "subsysnqn", "transport"])
def test_other_target_is_not_a_match(kernel: FakeKernel, field: str) -> None:
    values = {"traddr": "10.0.0.2", "trsvcid": "4421", "subsysnqn": NQN + "x",
              "transport": "rdma"}
    addr = (f"traddr={values['traddr'] if field == 'traddr' else '10.0.0.1'},"
            f"trsvcid={values['trsvcid'] if field == 'trsvcid' else '4420'}")
    kernel.fake.add_controller(2, subsysnqn=values["subsysnqn"] if field == "subsysnqn" else NQN,
                               hostnqn=HOST, address=addr,
                               transport=values["transport"] if field == "transport" else "tcp")
    assert find_controllers(target(), Sysfs(kernel.fake.root)) == []


def test_host_traddr_and_iface_must_match_when_configured(kernel: FakeKernel) -> None:
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST,
                               address="traddr=10.0.0.1,trsvcid=4420,host_traddr=10.0.0.5,"
                                       "host_iface=eth1")
    s = Sysfs(kernel.fake.root)
    assert find_controllers(target(host_traddr="10.0.0.5", host_iface="eth1"), s)
    assert not find_controllers(target(host_traddr="10.0.0.6"), s)
    assert not find_controllers(target(host_iface="eth2"), s)
    assert find_controllers(target(), s)  # not configured: not compared


def test_other_host_nqn_is_not_ours_and_gets_its_own_connect(kernel: FakeKernel) -> None:
    """hostnqn mismatch -> a new connect, without duplicate_connect: the kernel compares
    the host identity (nvme-cli 2.3 did not, and refused even with --duplicate-connect)."""
    kernel.fake.add_controller(2, subsysnqn=NQN, hostnqn=OTHER,
                               address="traddr=10.0.0.1,trsvcid=4420")
    result, _ = run_connect(kernel, target())
    assert result.changed and [c.hostnqn for c in result.controllers] == [HOST]
    [opts] = connects(kernel)
    assert "duplicate_connect" not in opts and opts["hostnqn"] == HOST


def test_already_connected_then_sysfs_shows_ours(kernel: FakeKernel) -> None:
    """A controller that appears between our check and the connect is reused (the
    kernel refused the connect with EALREADY)."""
    def racing(options: str, _timeout: float) -> str:
        kernel.fake.add_controller(7, subsysnqn=NQN, hostnqn=HOST,
                                   address="traddr=10.0.0.1,trsvcid=4420")
        return kernel.fabrics_write(options, _timeout)
    kernel.cli.fabrics_write = racing
    result, _ = run_connect(kernel, target())
    assert [c.name for c in result.controllers] == ["nvme7"]
    assert len(connects(kernel)) == 1


# ------------------------------------------------------------------- retries

def test_transient_then_success(kernel: FakeKernel) -> None:
    kernel.failures = [recorded("connect-not-linked"), recorded("connect-refused")]
    result, sleeps = run_connect(kernel, target(), attempts=5, wait_initial=1, wait_max=10)
    assert result.changed and len(result.controllers) == 1
    assert len(connects(kernel)) == 3
    assert len(sleeps) >= 2 and sleeps[:2] == sorted(sleeps[:2])  # backed off


def test_transient_gives_up_after_the_attempts(kernel: FakeKernel) -> None:
    kernel.failures = [recorded("connect-refused")] * 10
    with pytest.raises(TransientConnectError, match="Connection refused"):
        run_connect(kernel, target(), attempts=3)
    assert len(connects(kernel)) == 3


@pytest.mark.parametrize("name", ["connect-not-allowed", "connect-no-subsys"])
def test_permanent_fails_at_once_with_the_kernels_reason(kernel: FakeKernel, name: str) -> None:
    kernel.failures = [recorded(name)] * 3
    with pytest.raises(PermanentConnectError) as info:
        run_connect(kernel, target(), attempts=5)
    assert len(connects(kernel)) == 1
    assert info.value.kernel and "nvme nvme2:" in info.value.message


# ---------------------------------------------------------------- disconnect

def test_disconnect_only_controllers_of_this_host_and_subsystem(kernel: FakeKernel) -> None:
    f = kernel.fake
    f.add_controller(2, subsysnqn=NQN, hostnqn=HOST, address="traddr=10.0.0.1,trsvcid=4420")
    f.add_controller(3, subsysnqn=NQN, hostnqn=HOST, address="traddr=10.0.1.1,trsvcid=4420")
    f.add_controller(4, subsysnqn=NQN, hostnqn=OTHER, address="traddr=10.0.0.1,trsvcid=4420")
    f.add_controller(6, subsysnqn=NQN + "x", hostnqn=HOST, address="traddr=10.0.0.1,trsvcid=4420")
    f.add_controller(8, subsysnqn=NQN, hostnqn=HOST, transport="pcie", address="0000:00:0b.0")
    gone = disconnect_controllers(NQN, HOST, cli=kernel.cli, sysfs=Sysfs(f.root),
                                  sleep=lambda s: None)
    assert gone == ["nvme2", "nvme3"]
    left = sorted(c.name for c in Sysfs(f.root).controllers())
    assert left == ["nvme4", "nvme6", "nvme8"]
    assert [a[a.index("--device") + 1] for a in kernel.runner.ran("nvme", "disconnect")] == [
        "nvme2", "nvme3"]


def test_disconnect_nothing_to_do(kernel: FakeKernel) -> None:
    assert disconnect_controllers(NQN, HOST, cli=kernel.cli,
                                  sysfs=Sysfs(kernel.fake.root)) == []
    assert kernel.runner.calls == []


# ----------------------------------------------------------------- discovery

def entry(subnqn: str, traddr: str = "10.0.0.1", trsvcid: str = "4420",
          subtype: str = "nvme subsystem"):
    from agent.initiator.nvme.discovery import DiscoveryEntry
    return DiscoveryEntry(FabricsAddress("tcp", traddr, trsvcid), "ipv4", subtype, subnqn, 1)


PREFIX = "nqn.2026-11.io.kvagent"


def test_pool_entries_picks_this_pools_subsystems() -> None:
    entries = [
        entry("nqn.2014-08.org.nvmexpress.discovery", subtype="current discovery subsystem"),
        entry(f"{PREFIX}:store1:pool0:gpu0"),
        entry(f"{PREFIX}:store1:pool0:gpu0", trsvcid="04420"),  # same, other spelling
        entry(f"{PREFIX}:store1:pool1:gpu0"),
        entry(f"{PREFIX}:store2:pool0"),  # shared
        entry(f"{PREFIX}:store1:pool0:gpu1"),
        entry("nqn.2026-11.io.other:store1:pool0:gpu0"),
        entry(f"{PREFIX}:store1:pool0:gpu0:extra"),
    ]
    picked = [e.subnqn for e in pool_entries(entries, PREFIX, "pool0", host="gpu0")]
    assert picked == [f"{PREFIX}:store1:pool0:gpu0", f"{PREFIX}:store2:pool0"]
    only_store2 = pool_entries(entries, PREFIX, "pool0", host="gpu0", node="store2")
    assert [e.subnqn for e in only_store2] == [f"{PREFIX}:store2:pool0"]


def test_pool_entries_without_a_host_keep_whatever_name_the_acl_offers() -> None:
    """The attach pass asks without ``host``: the log lists only what this host NQN may
    use, so a per-host subsystem named for another name is still this host's."""
    entries = [entry(f"{PREFIX}:store1:pool0:gpu-old"), entry(f"{PREFIX}:store1:pool1:gpu0")]
    assert [e.subnqn for e in pool_entries(entries, PREFIX, "pool0")] == [
        f"{PREFIX}:store1:pool0:gpu-old"]


def test_pool_entries_over_a_recorded_discovery_log() -> None:
    log = parse_discover((FIX / "discover-local.json").read_text())
    [e] = pool_entries(log, PREFIX, "pool0", host="gpu0")
    assert (e.subnqn, e.address.traddr, e.address.trsvcid) == (
        f"{PREFIX}:gpu0-store:pool0:gpu0", "127.0.0.1", "4420")
    assert pool_entries(log, PREFIX, "pool0", host="gpu1") == []


def test_target_matches_uses_parsed_address() -> None:
    from agent.initiator.sysfs import Controller
    ctrl = Controller("nvme1", FabricsAddress.from_sysfs("TCP", "traddr=10.0.0.1,trsvcid=4420"),
                      "live", NQN, HOST)
    assert target().matches(ctrl)


def test_controllers_are_found_by_subsystem_and_a_reused_name_is_seen(tmp_path: Path) -> None:
    """One reader (one pass) looks at each other controller's subsystem once, reads every
    controller it returns live, and finds a controller whose name was reused by another
    subsystem since it last looked (a fresh look when it finds none of its own)."""
    other = NQN.replace("pool0", "pool1")
    fake = FakeSysfs(tmp_path)
    fake.add_controller(3, subsysnqn=NQN, hostnqn=HOST)
    fake.add_controller(4, subsysnqn=other, hostnqn=HOST)
    reads: list[str] = []
    s = Sysfs(tmp_path)
    real = sysfs_mod.read_attr
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sysfs_mod, "read_attr", lambda p: reads.append(str(p)) or real(p))
        mine = Target(FabricsAddress("tcp", "127.0.0.1", "4420"), NQN, HOST, None,
                      FabricsOptions())
        theirs = Target(FabricsAddress("tcp", "127.0.0.1", "4420"), other, HOST, None,
                        FabricsOptions())
        assert [c.name for c in find_controllers(mine, s)] == ["nvme3"]
        assert [c.name for c in find_controllers(theirs, s)] == ["nvme4"]
    # nvme4's subsystem was read once (by the first look), then nvme4 in full
    assert sum(p.endswith("nvme4/subsysnqn") for p in reads) == 2
    assert sum(p.endswith("nvme3/subsysnqn") for p in reads) == 2  # the hint, then in full
    # nvme4 goes away and its name comes back for our subsystem (a reconnect)
    fake.remove_controller(4)
    fake.remove_controller(3)
    fake.add_controller(4, subsysnqn=NQN, hostnqn=HOST)
    assert [c.name for c in find_controllers(mine, s)] == ["nvme4"]
    assert find_controllers(theirs, s) == []
