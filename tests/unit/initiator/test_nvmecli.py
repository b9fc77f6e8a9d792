"""nvme-cli (agent/initiator/nvme/): parsers over recorded output of several releases,
connect error classes, the commands through the NvmeCli facade."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from agent.initiator.nvme import discovery, kmsg
from agent.initiator.nvme.cli import NvmeCli, parse_version
from agent.initiator.nvme.failures import (
    AlreadyConnected,
    PermanentConnectError,
    TransientConnectError,
    classify_connect_failure,
)
from agent.initiator.nvme.options import FabricsOptions, check_fabrics_values
from agent.initiator.nvme.output import NvmeCliError
from agent.system.run import CommandResult
from tests.unit.fakerunner import FakeRunner

FIX = Path(__file__).parent / "fixtures"
V23 = FIX / "nvme-2.3"
OTHER = FIX / "other-versions"
POOL_NQN = "nqn.2026-11.io.kvagent:gpu0-store:pool0:gpu0"


def text(path: Path) -> str:
    return path.read_text()


def case(name: str) -> dict:
    return json.loads((V23 / "cases" / f"{name}.json").read_text())


def result_of(c: dict) -> CommandResult:
    return CommandResult(tuple(c["argv"]), c["returncode"], c["stdout"], c["stderr"])


def host_lines(c: dict) -> list[str]:
    """What KernelLog keeps from the recorded kernel lines (host side only)."""
    return [ln for ln in c["kernel"] if kmsg.KernelLog._KEEP.match(ln)]


# ------------------------------------------------------------------ parsers

def test_version_2_3() -> None:
    v = parse_version(text(V23 / "version.txt"))
    assert v.version == (2, 3)
    assert v.libnvme == (1, 3)
    assert v.text == "2.3"


def test_version_garbage_is_an_error() -> None:
    with pytest.raises(NvmeCliError):
        parse_version("command not found")


@pytest.mark.parametrize("name", ["discover-ref.json", "discover-local.json"])
def test_discover_2_3(name: str) -> None:
    entries = discovery.parse_discover(text(V23 / name))
    assert len(entries) == 2
    disc, nvm = entries
    assert not disc.is_nvm_subsystem and disc.subnqn == discovery.DISCOVERY_NQN
    assert nvm.is_nvm_subsystem
    assert (nvm.address.transport, nvm.address.traddr, nvm.address.trsvcid, nvm.portid,
            nvm.eflags) == (
        "tcp", "127.0.0.1", "4420", 1, "none")


def test_discover_lists_only_what_the_host_may_use() -> None:
    local = [e.subnqn for e in discovery.parse_discover(text(V23 / "discover-local.json"))
             if e.is_nvm_subsystem]
    other = [e.subnqn for e in discovery.parse_discover(text(V23 / "discover-other-host.json"))
             if e.is_nvm_subsystem]
    assert local == [POOL_NQN]
    assert other == ["nqn.2026-11.io.kvagent:gpu0-store:pool0:gpu1"]


def test_discover_older_layout_with_device_and_spacing() -> None:
    entries = discovery.parse_discover(text(OTHER / "nvme-1.14-discover-device.json"))
    assert [(e.subnqn, e.address.trsvcid, e.eflags) for e in entries] == [
        ("storage1", "8009", None), ("storage2", "8009", None)]
    assert all(e.is_nvm_subsystem for e in entries)


def test_discover_tells_referrals_from_subsystems_and_the_port_itself() -> None:
    """A port with nvmet referrals to two other storage hosts (composed in nvme-cli 2.3's
    shape: fixtures/README.md): the current discovery subsystem is the port read, no
    referral; each referral's address is the port to read next."""
    entries = discovery.parse_discover(text(FIX / "composed" / "discover-referrals.json"))
    current, nvm, *referrals = entries
    assert not current.is_referral and not current.is_nvm_subsystem
    assert nvm.is_nvm_subsystem and not nvm.is_referral
    assert all(r.is_referral and not r.is_nvm_subsystem for r in referrals)
    assert [(r.address.transport, r.address.traddr, r.address.trsvcid, r.subnqn)
            for r in referrals] == [
        ("tcp", "10.0.0.2", "4420", discovery.DISCOVERY_NQN),
        ("tcp", "fd00:10::3", "8009", discovery.DISCOVERY_NQN)]


@pytest.mark.parametrize(("subtype", "referral"), [
    ("discovery subsystem referral", True),  # libnvme (nvme-cli 2.x)
    ("Discovery Subsystem  Referral", True),
    ("referral", True),
    ("discovery subsystem", True),  # nvme-cli 1.x's text for subtype 1
    ("current discovery subsystem", False),
    ("unrecognized", False),  # nvme-cli 1.x for subtype 3: the port read itself
    ("nvme subsystem", False),
])
def test_a_referral_by_its_subtype_text(subtype: str, referral: bool) -> None:
    [entry] = discovery.parse_discover(json.dumps({"records": [{
        "trtype": "tcp", "traddr": "10.0.0.2", "trsvcid": "4420", "subtype": subtype,
        "subnqn": discovery.DISCOVERY_NQN}]}))
    assert entry.is_referral is referral
    assert not entry.is_nvm_subsystem


def test_discover_skips_records_without_address_and_tolerates_noise() -> None:
    noisy = "warning: something\n" + json.dumps(
        {"records": [{"subnqn": "nqn.x:y"}, {"traddr": "::1", "subnqn": "nqn.2026-11.a:b",
                                               "trtype": "TCP", "new_field": 3}]})
    [entry] = discovery.parse_discover(noisy)
    assert (entry.address.traddr, entry.address.transport, entry.address.trsvcid) == (
        "::1", "tcp", "")


def test_no_json_is_a_clear_error() -> None:
    with pytest.raises(NvmeCliError, match="no JSON"):
        discovery.parse_discover("Failed to add controller, error connection refused")


# ------------------------------------------------------------ classification

@pytest.mark.parametrize("name", ["connect-not-allowed", "connect-bad-hostnqn",
                                  "connect-hostid-clash"])
def test_host_not_allowed_is_permanent_with_the_kernels_reason(name: str) -> None:
    c = case(name)
    err = classify_connect_failure(result_of(c), host_lines(c))
    assert isinstance(err, PermanentConnectError)
    assert err.status == 0x4184
    assert "is not allowed" in err.message
    assert "allowed_hosts" in (err.hint or "")


def test_unknown_subsystem_is_permanent() -> None:
    c = case("connect-no-subsys")
    err = classify_connect_failure(result_of(c), host_lines(c))
    assert isinstance(err, PermanentConnectError)
    assert err.status == 0x4182 and "Invalid Data Parameter" in err.message


def test_eio_without_kernel_log_is_still_permanent() -> None:
    err = classify_connect_failure(result_of(case("connect-not-allowed")), [])
    assert isinstance(err, PermanentConnectError) and err.errno_name == "EIO"


@pytest.mark.parametrize("name", ["connect-refused", "connect-not-linked",
                                  "connect-unreachable", "discover-refused",
                                  "discover-not-linked"])
def test_nothing_listening_is_transient(name: str) -> None:
    c = case(name)
    err = classify_connect_failure(result_of(c), host_lines(c))
    assert isinstance(err, TransientConnectError)
    assert "failed to connect socket" in err.message


@pytest.mark.parametrize("name", ["connect-again", "connect-other-host-while-connected",
                                  "connect-other-host-duplicate"])
def test_already_connected(name: str) -> None:
    c = case(name)
    assert isinstance(classify_connect_failure(result_of(c), host_lines(c)), AlreadyConnected)


def test_ealready_exit_status_of_newer_releases() -> None:
    res = CommandResult(("nvme", "connect"), 114, "", "")
    assert isinstance(classify_connect_failure(res), AlreadyConnected)


def test_controller_busy_status_without_dnr_is_transient() -> None:
    res = CommandResult(("nvme", "connect"), 1, "",
                        "Failed to write to /dev/nvme-fabrics: Input/output error\n")
    err = classify_connect_failure(res, ["nvme nvme3: failed to connect queue: 0 ret=385"])
    assert isinstance(err, TransientConnectError) and err.status == 0x181


def test_missing_transport_module_is_permanent_with_hint() -> None:
    res = CommandResult(("nvme", "connect"), 1, "",
                        "Failed to write to /dev/nvme-fabrics: Invalid argument\n")
    err = classify_connect_failure(res, ["nvme_fabrics: no handler found for transport rdma."])
    assert isinstance(err, PermanentConnectError)
    assert "no handler found" in err.message


# ------------------------------------------------------------- the wrapper

class ListKernelLog:
    def __init__(self, lines: list[str]):
        self.lines = lines
        self.marks = 0

    def mark(self) -> int:
        self.marks += 1
        return 0

    def since(self, mark: object) -> list[str]:
        return list(self.lines)


def test_connect_request_and_options() -> None:
    """A connect is one request to /dev/nvme-fabrics: every option as the kernel's token,
    duplicate_connect only for a further controller."""
    written: list[str] = []
    cli = NvmeCli(FakeRunner(), kernel_log=ListKernelLog([]),
                  fabrics_write=lambda text, _t: written.append(text) or "instance=4,cntlid=1")
    opts = FabricsOptions(ctrl_loss_tmo=-1, reconnect_delay=2, keep_alive_tmo=7,
                          nr_io_queues=2, queue_size=64)
    name = cli.add_controller("tcp", "10.0.0.1", 4420, POOL_NQN, hostnqn="nqn.h", hostid="id",
                              host_iface="eth1", host_traddr="10.0.0.2", options=opts,
                              duplicate=False)
    assert name == "nvme4"
    assert written == [
        f"transport=tcp,traddr=10.0.0.1,trsvcid=4420,nqn={POOL_NQN},hostnqn=nqn.h,hostid=id,"
        "ctrl_loss_tmo=-1,reconnect_delay=2,keep_alive_tmo=7,nr_io_queues=2,queue_size=64,"
        "host_iface=eth1,host_traddr=10.0.0.2"]
    cli.add_controller("tcp", "10.0.0.1", 4420, POOL_NQN, hostnqn="nqn.h")
    assert written[-1].endswith(",duplicate_connect")


def test_connect_failure_carries_kernel_lines() -> None:
    """The kernel's errno for the write, and its lines, as a recorded refusal had them."""
    c = case("connect-not-allowed")

    def refuse(_text: str, _t: float) -> str:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    cli = NvmeCli(FakeRunner(), kernel_log=ListKernelLog(host_lines(c)), fabrics_write=refuse)
    with pytest.raises(PermanentConnectError) as info:
        cli.add_controller("tcp", "127.0.0.1", 4420, POOL_NQN, hostnqn="nqn.h")
    assert info.value.kernel == tuple(host_lines(c))


def _hang(_text: str, timeout: float) -> str:
    raise TimeoutError(f"no answer within {timeout}")


def test_connect_timeout_is_transient() -> None:
    cli = NvmeCli(FakeRunner(), kernel_log=ListKernelLog([]), fabrics_write=_hang)
    with pytest.raises(TransientConnectError, match="timed out"):
        cli.add_controller("tcp", "127.0.0.1", 4420, POOL_NQN, hostnqn="nqn.h")


def _timeout_hint(cli: NvmeCli, **options: str) -> str:
    with pytest.raises(TransientConnectError, match="timed out") as info:
        cli.add_controller("tcp", "127.0.0.1", 4420, POOL_NQN, hostnqn="nqn.h",
                           options=FabricsOptions(**options))
    return info.value.hint or ""


def test_connect_timeout_with_a_secret_names_the_secret() -> None:
    """A rejected secret can end in a wait (the target dropped the connection before
    the host read its verdict): the timeout's hint says which file to check."""
    cli = NvmeCli(FakeRunner(), kernel_log=ListKernelLog([]), fabrics_write=_hang)
    secret = "DHHC-1:00:" + "A" * 48 + ":"
    hint = _timeout_hint(cli, dhchap_secret=secret)
    assert "must hold the secret" in hint and "auth.key_file" in hint
    assert secret not in hint
    both = _timeout_hint(cli, dhchap_secret=secret, dhchap_ctrl_secret=secret)
    assert "auth.ctrl_key_file" in both
    assert "DH-HMAC-CHAP" not in _timeout_hint(cli)


def test_options_from_config() -> None:
    from agent.config.model import ConnectOptions
    from agent.config.types import Duration
    opts = FabricsOptions.from_config(ConnectOptions())
    assert (opts.ctrl_loss_tmo, opts.reconnect_delay, opts.keep_alive_tmo) == (-1, 2, None)
    finite = FabricsOptions.from_config(ConnectOptions(ctrl_loss_tmo=Duration(600),
                                                       reconnect_delay=Duration(0.25)))
    assert (finite.ctrl_loss_tmo, finite.reconnect_delay) == (600, 1)


@pytest.mark.parametrize(("name", "expect"), [("disconnect-device", 1),
                                              ("disconnect-device-gone", 0)])
def test_disconnect_device(name: str, expect: int) -> None:
    c = case(name)
    runner = FakeRunner().on(["nvme", "disconnect"], returncode=c["returncode"],
                             stdout=c["stdout"], stderr=c["stderr"])
    assert NvmeCli(runner).disconnect(device="nvme2") == expect
    assert runner.calls == [("nvme", "disconnect", "--device", "nvme2")]


def test_disconnect_by_nqn_counts() -> None:
    c = case("disconnect-nqn-none")
    runner = FakeRunner().on(["nvme", "disconnect"], stdout=c["stdout"])
    assert NvmeCli(runner).disconnect(nqn="nqn.2026-11.io.kvagent:nope:none") == 0


def test_disconnect_failure_despite_exit_0() -> None:
    runner = FakeRunner().on(["nvme", "disconnect"],
                             stderr="Failed to disconnect nvme3: Device or resource busy\n")
    with pytest.raises(NvmeCliError, match="busy"):
        NvmeCli(runner).disconnect(device="nvme3")


def test_version_and_list_ns_commands() -> None:
    runner = (FakeRunner()
              .on(["nvme", "version"], stdout=text(V23 / "version.txt"))
              .on(["nvme", "list-ns"], stdout="[   0]:0x1\n[   1]:0x3\n"))
    cli = NvmeCli(runner)
    assert cli.version().version == (2, 3)
    assert cli.list_ns("nvme2") == [1, 3]
    assert runner.calls[-1] == ("nvme", "list-ns", "/dev/nvme2")


# ------------------------------------------------ option injection (issue 24, item 7)
class _NoKernelLog:
    def mark(self) -> int:
        return 0

    def since(self, _: int) -> list[str]:
        return []


INJECTED = "nqn.2026-11.io.kvagent:s:kv:gpu0,traddr=203.0.113.9"


def test_a_value_with_a_separator_never_reaches_nvme_cli_or_the_fabrics_device() -> None:
    runner, written = FakeRunner(), []
    cli = NvmeCli(runner, kernel_log=_NoKernelLog(),
                          fabrics_write=lambda text, _t: written.append(text) or "instance=9")
    with pytest.raises(PermanentConnectError, match=r"nqn .*traddr=203\.0\.113\.9.* contains"):
        cli.add_controller("tcp", "10.0.0.1", 4420, INJECTED, hostnqn="nqn.2014-08.org.x:h")
    with pytest.raises(PermanentConnectError, match="host_iface"):
        cli.discover("tcp", "10.0.0.1", 4420, host_iface="eth0,traddr=203.0.113.9")
    with pytest.raises(PermanentConnectError, match="host_iface 'eth0=1'"):  # '=' alone
        cli.discover("tcp", "10.0.0.1", 4420, host_iface="eth0=1")
    with pytest.raises(PermanentConnectError, match="traddr"):
        cli.add_controller("tcp", "10.0.0.1\ntraddr=203.0.113.9", 4420, "nqn.2014-08.org.x:s",
                           hostnqn="nqn.2014-08.org.x:h")
    assert runner.calls == [] and written == []


def test_a_secret_is_named_never_shown_and_its_base64_padding_is_fine() -> None:
    runner = FakeRunner()
    cli = NvmeCli(runner, kernel_log=_NoKernelLog())
    bad = FabricsOptions(dhchap_secret="DHHC-1:00:abc=,traddr=203.0.113.9:")
    with pytest.raises(PermanentConnectError) as err:
        cli.add_controller("tcp", "10.0.0.1", 4420, "nqn.2014-08.org.x:s",
                           hostnqn="nqn.2014-08.org.x:h", options=bad)
    assert "(a secret)" in err.value.message and "abc" not in err.value.message
    check_fabrics_values(dhchap_secret="DHHC-1:00:YWJjZA==:")  # padding is allowed
