"""A controller's TLS state is part of "ours as wanted" (issue 24, item 6): a plaintext
controller of a pool that now wants TLS (and a TLS controller of a pool that no longer
does) is replaced, make before break, and plan/apply say so. The kernel's side:
tests/kernel/test_hostile_initiator.py."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest

from agent.dhchap import write_secret
from agent.fabrics import FabricsAddress
from agent.initiator.connect import Target, connect
from agent.initiator.nvme.options import FabricsOptions
from agent.initiator.stages import tlskeys
from agent.initiator.sysfs import Sysfs
from agent.tlspsk import generate_psk

from .attach_fakes import PREFIX, Export, FakeHost, fabrics_host
from .fakesysfs import FakeSysfs
from .test_attach_reconcile import pool_yaml, run
from .test_connect import HOST, HOSTID, NQN, FakeKernel

UUID = "0b8f6a5e-0000-4000-8000-000000000001"


def tls_target(tls: bool) -> Target:
    return Target(FabricsAddress("tcp", "10.0.0.1", "4420"), NQN, HOST, HOSTID,
                  FabricsOptions(tls=tls))


def one_controller_host(tmp_path: Path, tls_key: str | None, *, since_612: bool = True
                        ) -> tuple[FakeSysfs, FakeKernel, Sysfs]:
    """nvme2 live, the path to namespace 1 of nvme-subsys0 (native multipath), with the
    given ``tls_key`` attribute (None: none), read as a 6.12 kernel shows it (or as
    6.7-6.11 do); a controller added through /dev/nvme-fabrics gets a path to the
    namespace too."""
    fake = FakeSysfs(tmp_path)
    kernel_ = FakeKernel(fake)
    fake.add_controller(2, subsysnqn=NQN, hostnqn=HOST, hostid=HOSTID,
                        address="traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.7",
                        tls_key=tls_key)
    fake.add_subsystem(0, NQN, controllers=(2,))
    fake.add_namespace(0, 1, UUID, paths=((2, "optimized"),))
    real = kernel_.fabrics_write

    def add_with_path(options: str, timeout: float) -> str:
        answer = real(options, timeout)
        inst = int(answer.split(",")[0].split("=")[1])
        fake.add_subsystem(0, NQN, controllers=(2, inst))
        fake.add_namespace(0, 1, UUID, paths=((2, "optimized"), (inst, "optimized")))
        return answer
    kernel_.cli.fabrics_write = add_with_path
    sysfs = Sysfs(tmp_path)
    sysfs.tls_key_exact = since_612  # what Sysfs(kernel=...) derives from the release
    return fake, kernel_, sysfs


def test_a_plaintext_controller_of_a_tls_pool_is_replaced_by_a_tls_one(
        tmp_path: Path) -> None:
    fake, kernel, sysfs = one_controller_host(tmp_path, tls_key=None)
    result = connect(tls_target(True), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert result.changed and not result.refused
    [opts] = kernel.fabrics_writes
    assert "tls" in opts and "duplicate_connect" in opts and opts["nqn"] == NQN
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme2")]
    [new] = result.controllers
    assert new.name == "nvme5" and new.tls is True
    assert not (fake.root / "class/nvme/nvme2").exists()
    [replaced] = result.replaced
    assert (replaced.reason.kind, replaced.old, replaced.new) == ("nvme.tls", "nvme2",
                                                                  "nvme5")
    assert replaced.describe() == ("plaintext controller, the pool wants TLS: nvme5 "
                                   "connected (a new controller with TLS), nvme2 disconnected")
    # The next pass: the TLS controller is ours as wanted, nothing runs.
    again = connect(tls_target(True), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert not again.changed and [c.name for c in again.controllers] == ["nvme5"]
    assert len(kernel.fabrics_writes) == 1


def test_a_tls_controller_of_a_pool_without_tls_is_replaced_by_a_plaintext_one(
        tmp_path: Path) -> None:
    """Also between handshakes (the port no longer speaks TLS: it retries for ever), when
    6.12 shows the attribute empty."""
    for i, key in enumerate(("0d1e2f3a", "")):
        _, kernel, sysfs = one_controller_host(tmp_path / str(i), tls_key=key)
        result = connect(tls_target(False), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
        [opts] = kernel.fabrics_writes
        assert "tls" not in opts
        assert [(r.reason.what, r.old) for r in result.replaced] == [
            ("TLS controller, the pool no longer wants TLS", "nvme2")]
        assert [c.name for c in result.controllers] == ["nvme5"]


def test_a_controller_whose_tls_state_sysfs_cannot_tell_is_kept(tmp_path: Path) -> None:
    """6.7-6.11 show an empty tls_key for every TCP controller without a negotiated PSK:
    replacing it could loop for ever, so it is kept whatever the pool wants."""
    for tls in (False, True):
        _, kernel, sysfs = one_controller_host(tmp_path / str(tls), tls_key="",
                                               since_612=False)
        result = connect(tls_target(tls), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
        assert not result.changed and not result.replaced and kernel.fabrics_writes == []
        assert [c.name for c in result.controllers] == ["nvme2"]


def test_without_native_multipath_the_plaintext_controller_stays_and_it_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, kernel, sysfs = one_controller_host(tmp_path, tls_key=None)
    [head] = sysfs.subsystem_namespaces(NQN).values()
    monkeypatch.setattr(sysfs, "subsystem_namespaces",
                        lambda nqn: {1: dataclasses.replace(head, subsystem=None)})
    result = connect(tls_target(True), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    [refusal] = result.refused
    assert refusal.message.startswith("nvme2 (" + NQN + "): plaintext controller, the pool "
                                      "wants TLS; this host has no native NVMe multipath")
    assert "nvme_core.multipath=Y" in (refusal.hint or "")
    assert kernel.fabrics_writes == [] and kernel.runner.ran("nvme", "disconnect") == []
    assert not result.changed and [c.name for c in result.controllers] == ["nvme2"]


def test_a_dead_plaintext_controller_whose_id_the_target_reused_goes_first(
        tmp_path: Path) -> None:
    """The storage host re-created its port for TLS: the plaintext controller retries for
    ever (connecting), and the target gives the new controller its controller id, so the
    kernel refuses a second one next to it (EINVAL, "Duplicate cntlid", seen on 6.12). It
    is disconnected first (nothing flows through it), then the TLS one connects."""
    fake, kernel, sysfs = one_controller_host(tmp_path, tls_key=None)
    fake.set("class/nvme/nvme2/state", "connecting")
    kernel.fabrics_errors.append(OSError(errno.EINVAL, "Invalid argument"))
    real = kernel.fabrics_write

    def add_alone(options: str, timeout: float) -> str:
        answer = real(options, timeout)
        inst = int(answer.split(",")[0].split("=")[1])
        fake.add_subsystem(0, NQN, controllers=(inst,))
        fake.add_namespace(0, 1, UUID, paths=((inst, "optimized"),))
        return answer
    kernel.cli.fabrics_write = add_alone
    result = connect(tls_target(True), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    assert not result.refused and result.changed
    assert len(kernel.fabrics_writes) == 2 and all("tls" in o for o in kernel.fabrics_writes)
    assert kernel.runner.ran("nvme", "disconnect") == [
        ("nvme", "disconnect", "--device", "nvme2")]
    [replaced] = result.replaced
    assert replaced.describe() == ("plaintext controller, the pool wants TLS: nvme2 (not "
                                   "live) disconnected, then nvme5 connected (a new "
                                   "controller with TLS)")
    assert [c.name for c in result.controllers] == ["nvme5"]


@pytest.mark.parametrize(("state", "err"), [("live", errno.EINVAL),
                                            ("connecting", errno.ECONNRESET)])
def test_otherwise_a_refused_new_controller_leaves_the_old_one(tmp_path: Path, state: str,
                                                               err: int) -> None:
    """A live controller is never disconnected for a new one that cannot connect, and one
    that is not live only for the kernel's EINVAL (its id taken): any other refusal (the
    port does not speak TLS yet) leaves it to reconnect."""
    fake, kernel, sysfs = one_controller_host(tmp_path, tls_key=None)
    fake.set("class/nvme/nvme2/state", state)
    kernel.fabrics_errors.append(OSError(err, "refused"))
    result = connect(tls_target(True), cli=kernel.cli, sysfs=sysfs, sleep=lambda s: None)
    [refusal] = result.refused
    assert "a new controller could not connect, so nvme2 stays as it is" in refusal.message
    assert kernel.runner.ran("nvme", "disconnect") == [] and len(kernel.fabrics_writes) == 1
    assert [c.name for c in result.controllers] == ["nvme2"] and not result.replaced


# ------------------------------------------------------------------ the GPU host's pass

SUB = f"{PREFIX}:store1:kv:gpu0"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = fabrics_host(tmp_path, monkeypatch, [Export(SUB, [1])])
    monkeypatch.setattr(tlskeys, "tlshd_running", lambda: True)
    monkeypatch.setattr(tlskeys.PskKeyring, "missing", lambda self, *args: False)
    return h


def test_plan_and_apply_report_the_plaintext_controller_replaced(host: FakeHost,
                                                                 tmp_path: Path) -> None:
    """A pool attached in plaintext, then given tls: the plan shows the replacement, the
    apply makes it (the mount stays on its multipath head) and says so, the next pass is
    converged."""
    plain = pool_yaml(host, subsystem=SUB)
    assert run(host, plain).ok
    mounts = host.mounts()
    assert list(mounts.values()) == ["/dev/nvme2n1"]
    [plaintext] = host.fabrics_writes
    assert "tls" not in plaintext
    del host.fabrics_writes[:]
    psk = str(tmp_path / "pool.psk")
    write_secret(psk, generate_psk())
    with_tls = plain.replace("      engines:", f"      tls: {{key_file: {psk}}}\n      engines:")

    plan = run(host, with_tls, dry_run=True)
    assert [(a.kind, a.subject, a.detail) for a in plan.actions if a.status == "planned"] == [
        ("nvme.tls", "nvme2", "plaintext controller, the pool wants TLS: a new controller "
                              "with TLS, then this one disconnected")]
    assert host.fabrics_writes == [] and host.runner.ran("nvme", "disconnect") == []

    done = run(host, with_tls)
    assert done.ok, done.errors
    assert ("nvme.tls", "nvme2", "plaintext controller, the pool wants TLS: nvme3 connected "
            "(a new controller with TLS), nvme2 disconnected") in [
        (a.kind, a.subject, a.detail) for a in done.actions if a.status == "done"]
    [opts] = host.fabrics_writes
    assert "tls" in opts
    assert [c.name for c in host.sysfs.controllers()] == ["nvme3"]
    assert host.sysfs.controller("nvme3").tls is True  # type: ignore[union-attr]
    assert host.mounts() == mounts  # the multipath head, and its mount, stayed

    again = run(host, with_tls)
    assert again.ok and not again.changed, again.actions
