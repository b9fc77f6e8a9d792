"""DH-HMAC-CHAP on the GPU host: secrets passed to nvme connect (never logged), given to
live controllers when the file changes (re-auth, no disconnect), refusals explained."""

from __future__ import annotations

import dataclasses
import errno
import io
import os
from pathlib import Path

import pytest

from agent.fabrics import FabricsAddress
from agent.initiator.connect import Target, connect
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.failures import (
    PermanentConnectError,
    TransientConnectError,
    classify_connect_failure,
)
from agent.initiator.nvme.options import FabricsOptions
from agent.initiator.sysfs import Sysfs
from agent.log import configure_logging
from agent.system.run import CommandResult, SubprocessRunner, shown

from .fakesysfs import FakeSysfs
from .test_connect import HOST, HOSTID, NQN, FakeKernel, ReplayLog

K1 = "DHHC-1:00:o71XL3dXa/kKh0AzaxNiDhEfzBRkl6AMyDu8pVg7SgIOxh5C:"
K2 = "DHHC-1:00:SuvWukyCd00qGeccPkVGoCnGeIK7jfky06avdi1PUit8gdjB:"


def auth_target(secret: str, ctrl: str | None = None) -> Target:
    return Target(FabricsAddress("tcp", "10.0.0.1", "4420"), NQN, HOST, HOSTID,
                  FabricsOptions(dhchap_secret=secret, dhchap_ctrl_secret=ctrl))


def test_connect_passes_the_secrets_and_repr_hides_them(tmp_path: Path) -> None:
    kernel = FakeKernel(FakeSysfs(tmp_path))
    t = auth_target(K1, K2)
    connect(t, cli=kernel.cli, sysfs=Sysfs(tmp_path), sleep=lambda s: None)
    [opts] = kernel.fabrics_writes
    assert (opts["dhchap_secret"], opts["dhchap_ctrl_secret"]) == (K1, K2)
    assert K1 not in repr(t) and K2 not in repr(t.options)


def test_a_new_secret_reaches_live_controllers_without_a_reconnect(tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    kernel = FakeKernel(fake)
    fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, hostid=HOSTID,
                        address="traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.7",
                        dhchap_secret=K1, dhchap_ctrl_secret="none")
    sysfs = Sysfs(tmp_path)
    same = connect(auth_target(K1), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert not same.changed
    rotated = connect(auth_target(K2), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert rotated.changed and kernel.fabrics_writes == []
    assert sysfs.controller_secret("nvme2", "dhchap_secret") == K2
    assert sysfs.controller_secret("nvme2", "dhchap_ctrl_secret") is None


K3 = "DHHC-1:00:3b3wpeqC0k5hSDWVXjA6/cPe1ekOE6iDMgEeYRJZrEC6Ox7x:"


def _recording(sysfs: Sysfs) -> list[list[str]]:
    """Record the attributes of every secret write, one list per call (the files of one
    call are written back to back; the kernel re-authenticates on each write)."""
    writes: list[list[str]] = []
    real = sysfs.set_controller_secrets

    def record(name: str, secrets: list[tuple[str, str]]) -> None:
        writes.append([attr for attr, _ in secrets])
        real(name, secrets)
    sysfs.set_controller_secrets = record  # type: ignore[method-assign]
    return writes


def _two_secret_host(tmp_path: Path) -> tuple[FakeSysfs, FakeKernel, Sysfs]:
    """nvme2 live with secrets K1/K2, the path to namespace 1 of nvme-subsys0 (native
    multipath); a controller added through /dev/nvme-fabrics gets a path to it too."""
    fake = FakeSysfs(tmp_path)
    kernel = FakeKernel(fake)
    fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, hostid=HOSTID,
                        address="traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.7",
                        dhchap_secret=K1, dhchap_ctrl_secret=K2)
    fake.add_subsystem(0, NQN, controllers=(2,))
    fake.add_namespace(0, 1, UUID, paths=((2, "optimized"),))
    real = kernel.fabrics_write

    def add_with_path(options: str, timeout: float) -> str:
        answer = real(options, timeout)
        inst = int(answer.split(",")[0].split("=")[1])
        fake.add_subsystem(0, NQN, controllers=(2, inst))
        fake.add_namespace(0, 1, UUID, paths=((2, "optimized"), (inst, "optimized")))
        return answer
    kernel.cli.fabrics_write = add_with_path
    return fake, kernel, Sysfs(tmp_path)


UUID = "0b8f6a5e-0000-4000-8000-000000000001"


def test_one_new_secret_is_written_to_the_live_controller(tmp_path: Path) -> None:
    _, kernel, sysfs = _two_secret_host(tmp_path)
    writes = _recording(sysfs)
    result = connect(auth_target(K3, K2), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert result.changed and not result.refused
    assert writes == [["dhchap_secret"]] and [c.name for c in result.controllers] == ["nvme2"]
    assert kernel.runner.ran("nvme", "connect") == [] and kernel.fabrics_writes == []


def test_both_new_secrets_move_to_a_new_controller_before_the_old_one_goes(
        tmp_path: Path) -> None:
    """Never both written to a live controller (on 6.12 the re-authentication that pairs
    a new secret with an old one can hang it): a second controller is added with the new
    secrets, and only once it is live with a path to the namespace is the old one
    disconnected."""
    fake, kernel, sysfs = _two_secret_host(tmp_path)
    writes = _recording(sysfs)
    out = io.StringIO()
    configure_logging(0, stream=out)
    try:
        result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs,
                         sleep=lambda s: None)
    finally:
        configure_logging()
    assert result.changed and not result.refused and writes == []
    [opts] = kernel.fabrics_writes
    assert "duplicate_connect" in opts and opts["nqn"] == NQN and opts["hostnqn"] == HOST
    assert opts["dhchap_secret"] == K3 and opts["dhchap_ctrl_secret"] == K1
    assert opts["hostid"] == HOSTID and opts["ctrl_loss_tmo"] == "-1"
    assert kernel.runner.ran("nvme", "connect") == []
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme2")]
    assert [c.name for c in result.controllers] == ["nvme5"]
    assert not (fake.root / "class/nvme/nvme2").exists()
    assert '"old": "nvme2", "new": "nvme5"' in out.getvalue()
    assert K1 not in out.getvalue() and K3 not in out.getvalue()


def test_both_new_secrets_are_refused_where_no_second_controller_can_take_over(
        tmp_path: Path) -> None:
    # The kernel refuses the new controller (a secret the storage host does not have).
    _, kernel, sysfs = _two_secret_host(tmp_path)
    kernel.fabrics_errors.append(OSError(errno.EKEYREJECTED, "Key was rejected by service"))
    writes = _recording(sysfs)
    result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    [refusal] = result.refused
    assert "both DH-HMAC-CHAP secrets changed at once" in refusal.message
    assert "could not connect, so nvme2 stays as it is" in refusal.message
    assert "must hold the secret" in (refusal.hint or "")
    assert writes == [] and kernel.runner.ran("nvme", "disconnect") == []
    assert [c.name for c in result.controllers] == ["nvme2"] and not result.changed
    assert sysfs.controller_secret("nvme2", "dhchap_secret") == K1

    # A new controller that never gets a path to the namespace: disconnected again.
    fake, kernel, sysfs = _two_secret_host(tmp_path / "nopath")
    kernel.cli.fabrics_write = kernel.fabrics_write  # no path added
    result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None,
                     replace_bound=0.05)
    [refusal] = result.refused
    assert "was not live with a path" in refusal.message
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme5")]
    assert [c.name for c in result.controllers] == ["nvme2"]
    assert (fake.root / "class/nvme/nvme2").exists()


def test_both_new_secrets_are_refused_without_native_multipath(tmp_path: Path,
                                                               monkeypatch) -> None:
    _, kernel, sysfs = _two_secret_host(tmp_path)
    [head] = sysfs.subsystem_namespaces(NQN).values()
    monkeypatch.setattr(sysfs, "subsystem_namespaces",
                        lambda nqn: {1: dataclasses.replace(head, subsystem=None)})
    result = connect(auth_target(K3, K1), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    [refusal] = result.refused
    assert "no native NVMe multipath" in refusal.message
    assert kernel.fabrics_writes == [] and not result.changed


def test_the_fabrics_device_answer_and_its_errors() -> None:
    """What /dev/nvme-fabrics answers, and its errno, as add_controller reports them."""
    seen: list[str] = []

    def answer(options: str, timeout: float) -> str:
        seen.append(options)
        return "instance=7,cntlid=3\n"
    cli = NvmeCli(kernel_log=ReplayLog(), fabrics_write=answer)
    assert cli.add_controller("tcp", "10.0.0.1", 4420, NQN, hostnqn=HOST,
                              options=FabricsOptions(tls=True)) == "nvme7"
    assert seen[0].split(",") == ["transport=tcp", "traddr=10.0.0.1", "trsvcid=4420",
                                  f"nqn={NQN}", f"hostnqn={HOST}", "ctrl_loss_tmo=-1", "tls",
                                  "duplicate_connect"]

    def fail(options: str, timeout: float) -> str:
        raise OSError(errno.ENOKEY, os.strerror(errno.ENOKEY))
    cli.fabrics_write = fail
    with pytest.raises(PermanentConnectError) as refused:
        cli.add_controller("tcp", "10.0.0.1", 4420, NQN, hostnqn=HOST)
    assert "requires DH-HMAC-CHAP" in (refused.value.hint or "")

    def hang(options: str, timeout: float) -> str:
        raise TimeoutError
    cli.fabrics_write = hang
    with pytest.raises(TransientConnectError, match="timed out"):
        cli.add_controller("tcp", "10.0.0.1", 4420, NQN, hostnqn=HOST,
                           options=FabricsOptions(dhchap_secret=K1))


def test_runner_logs_never_show_secrets() -> None:
    assert shown(["nvme", "connect", "--dhchap-secret", K1, f"--dhchap-ctrl-secret={K2}",
                  "--nqn", NQN]) == ["nvme", "connect", "--dhchap-secret", "<secret>",
                                     "--dhchap-ctrl-secret=<secret>", "--nqn", NQN]
    out = io.StringIO()
    configure_logging(1, stream=out)
    try:
        SubprocessRunner()(["sh", "-c", "exit 3", "--dhchap-secret", K1], check=False,
                           timeout=10)
    finally:
        configure_logging()
    assert "--dhchap-secret" in out.getvalue() and K1 not in out.getvalue()


def test_refused_secrets_are_explained() -> None:
    for err, words in ((errno.EKEYREJECTED, "auth.key_file must hold the secret"),
                       (errno.ENOKEY, "requires DH-HMAC-CHAP")):
        stderr = (f"Failed to write to /dev/nvme-fabrics: {os.strerror(err)}\n"
                  "could not add new controller: failed to write to nvme-fabrics device\n")
        result = CommandResult(("nvme", "connect"), 1, "", stderr)
        exc = classify_connect_failure(result)
        assert exc.errno_name == errno.errorcode[err], exc
        assert words in (exc.hint or "")


def test_a_rejected_secret_reported_as_eio_is_still_explained() -> None:
    """On 6.12 under load the target may drop the connection before the host reads its
    verdict: nvme-cli then says EIO, and only the kernel log says authentication failed."""
    stderr = ("Failed to write to /dev/nvme-fabrics: Input/output error\n"
              "could not add new controller: failed to write to nvme-fabrics device\n")
    result = CommandResult(("nvme", "connect"), 1, "", stderr)
    exc = classify_connect_failure(result, ["nvme nvme3: qid 0: authentication failed"])
    assert "must hold the secret" in (exc.hint or "")
    plain = classify_connect_failure(result, ["nvme nvme3: failed to connect queue: 0"])
    assert "must hold the secret" not in (plain.hint or "")


def test_a_connection_dropped_during_the_connect_is_retried_and_said_so() -> None:
    """Seen on 6.12 under load (CI): a connect without a secret to a target that requires one
    ended with host path error 0x370 (the connection went down before the target's answer
    was read), not ENOKEY: worth a retry, and the error says what happened rather than that
    the target asked for a retry."""
    result = CommandResult(("nvme", "connect"), 1, "",
                           "failed to lookup subsystem for controller nvme2\n")
    exc = classify_connect_failure(result, ["nvme nvme2: failed to connect queue: 0 ret=880"])
    assert isinstance(exc, TransientConnectError) and exc.status == 0x370
    assert "host path error" in exc.message
    assert "dropped during the connect" in (exc.hint or "")
    busy = classify_connect_failure(result, ["nvme nvme2: failed to connect queue: 0 ret=385"])
    assert isinstance(busy, TransientConnectError)
    assert busy.hint == "the target asked us to retry later"


def test_tls_options_and_tls_refusals_are_explained() -> None:
    assert FabricsOptions(tls=True).kernel_options()[-1] == "tls"
    assert "tls" not in FabricsOptions().kernel_options()
    old = CommandResult(("nvme", "connect", "--tls"), 1, "",
                        "connect: unrecognized option '--tls'\nUsage: nvme connect\n")
    exc = classify_connect_failure(old)
    assert "no --tls" in exc.message and "2.4" in (exc.hint or "")
    nokey = CommandResult(("nvme", "connect", "--tls"), 1, "",
                          "Failed to write to /dev/nvme-fabrics: Required key not available\n"
                          "could not add new controller: pre-shared TLS key is missing\n")
    exc = classify_connect_failure(nokey)
    assert exc.errno_name == "ENOKEY" and ".nvme keyring" in (exc.hint or "")
    reset = CommandResult(("nvme", "connect"), 1, "",
                          "Failed to write to /dev/nvme-fabrics: Connection reset by peer\n")
    assert "TLS" in (classify_connect_failure(reset).hint or "")
