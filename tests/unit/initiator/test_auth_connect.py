"""DH-HMAC-CHAP on the GPU host: secrets passed to nvme connect (never logged), given to
live controllers when the file changes (re-auth, no disconnect), refusals explained."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

from agent.fabrics import FabricsAddress
from agent.initiator.connect import Target, connect
from agent.initiator.nvmecli import (
    FabricsOptions,
    TransientConnectError,
    classify_connect_failure,
)
from agent.initiator.sysfs import Sysfs
from agent.log import configure_logging
from agent.system.run import CommandResult, SubprocessRunner, shown

from .fakesysfs import FakeSysfs
from .test_connect import HOST, HOSTID, NQN, FakeKernel

K1 = "DHHC-1:00:o71XL3dXa/kKh0AzaxNiDhEfzBRkl6AMyDu8pVg7SgIOxh5C:"
K2 = "DHHC-1:00:SuvWukyCd00qGeccPkVGoCnGeIK7jfky06avdi1PUit8gdjB:"


def auth_target(secret: str, ctrl: str | None = None) -> Target:
    return Target(FabricsAddress("tcp", "10.0.0.1", "4420"), NQN, HOST, HOSTID,
                  FabricsOptions(dhchap_secret=secret, dhchap_ctrl_secret=ctrl))


def test_connect_passes_the_secrets_and_repr_hides_them(tmp_path: Path) -> None:
    kernel = FakeKernel(FakeSysfs(tmp_path))
    t = auth_target(K1, K2)
    connect(t, cli=kernel.cli, sysfs=Sysfs(tmp_path), sleep=lambda s: None)
    [argv] = kernel.runner.ran("nvme", "connect")
    assert argv[argv.index("--dhchap-secret") + 1] == K1
    assert argv[argv.index("--dhchap-ctrl-secret") + 1] == K2
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
    assert rotated.changed and kernel.runner.ran("nvme", "connect") == []
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


def test_a_rotation_of_both_secrets_writes_them_back_to_back_and_warns(
        tmp_path: Path) -> None:
    fake = FakeSysfs(tmp_path)
    kernel = FakeKernel(fake)
    fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, hostid=HOSTID,
                        address="traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.7",
                        dhchap_secret=K1, dhchap_ctrl_secret=K2)
    sysfs = Sysfs(tmp_path)
    writes = _recording(sysfs)
    out = io.StringIO()
    configure_logging(0, stream=out)
    try:
        # One secret: one write, no warning (the kernel's re-auth keeps it live).
        assert connect(auth_target(K3, K2), cli=kernel.cli, sysfs=sysfs,
                       sleep=lambda s: None).changed
        assert writes == [["dhchap_secret"]] and "at once" not in out.getvalue()
        # Both: in one call, back to back (the second write cancels the first one's
        # re-authentication if it has not begun), the controller secret first (a
        # reconnect in between is refused at once, not left waiting), and the operator
        # is told the controller may reconnect.
        writes.clear()
        assert connect(auth_target(K1, K3), cli=kernel.cli, sysfs=sysfs,
                       sleep=lambda s: None).changed
    finally:
        configure_logging()
    assert writes == [["dhchap_ctrl_secret", "dhchap_secret"]]
    assert "both DH-HMAC-CHAP secrets changed at once" in out.getvalue()
    assert K1 not in out.getvalue() and K3 not in out.getvalue()
    assert sysfs.controller_secret("nvme2", "dhchap_secret") == K1
    assert sysfs.controller_secret("nvme2", "dhchap_ctrl_secret") == K3
    assert kernel.runner.ran("nvme", "connect") == []


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
    assert FabricsOptions(tls=True).argv()[-1] == "--tls"
    assert "--tls" not in FabricsOptions().argv()
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
