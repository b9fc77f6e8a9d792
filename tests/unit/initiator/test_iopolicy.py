"""A pool's multipath I/O policy (``initiator.pools[].iopolicy``) on its subsystems: read,
compared, written only when different; a converged pass writes nothing and runs nothing;
a kernel without the policy (queue-depth before 6.11: EINVAL) is the pool's clear error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.engines.handoff import hand_off
from agent.initiator import iopolicy
from agent.initiator.reconcile import InitiatorPass
from agent.initiator.sysfs import Sysfs
from agent.result import RunResult

from .attach_fakes import PREFIX, Export, FakeHost

NQN = f"{PREFIX}:store1:kv:gpu0"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = FakeHost(tmp_path, exports=[Export(NQN, [1, 2]), Export(NQN, [1, 2], traddr="10.0.0.2")])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    for module in ("nvme_fabrics", "nvme_tcp"):  # loaded: no modprobe
        (tmp_path / "sys/module" / module).mkdir(parents=True)
    return h


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every iopolicy write (subsystem, policy), through to the fake sysfs."""
    seen: list[tuple[str, str]] = []
    real = Sysfs.set_iopolicy

    def record(self: Sysfs, subsystem: str, policy: str) -> None:
        seen.append((subsystem, policy))
        real(self, subsystem, policy)

    monkeypatch.setattr(Sysfs, "set_iopolicy", record)
    return seen


def pool(policy: str | None) -> str:
    line = f"\n      iopolicy: {policy}" if policy else ""
    return f"""
    - name: kv
      targets: [{{transport: tcp, address: 10.0.0.1, subsystem: '{NQN}'}},
                {{transport: tcp, address: 10.0.0.2, subsystem: '{NQN}'}}]
      mount: MOUNT{line}
"""


def run(host: FakeHost, policy: str | None, *, dry_run: bool = False) -> RunResult:
    body = ("initiator:\n  device_wait: 5s\n  pools:\n"
            + pool(policy).replace("MOUNT", str(host.root / "mnt/kv")))
    cfg = host.config(body)
    result = RunResult(dry_run=dry_run)
    initiator = InitiatorPass(cfg, host.runner, result, dry_run=dry_run, sysfs=host.sysfs,
                              cli=host.cli, seams=host.seams())
    for m in initiator.attach_configured():
        hand_off(cfg, m.pool, m.mounts, m.transport, m.remounted, result, probe=host.probe)
    return result


def policy_of(host: FakeHost) -> str:
    (sub,) = host.sysfs.subsystems_of(NQN)
    assert sub.iopolicy is not None
    return sub.iopolicy


def test_set_once_on_the_pools_subsystem_then_a_converged_pass_writes_and_runs_nothing(
        host: FakeHost, writes: list[tuple[str, str]]) -> None:
    first = run(host, "round-robin")
    assert first.ok, first.errors
    # Two paths, one subsystem: one multipath head per namespace, one write.
    (sub,) = host.sysfs.subsystems_of(NQN)
    assert len(sub.heads) == 2
    assert [c.subsysnqn for c in host.sysfs.controllers()] == [NQN, NQN]
    assert writes == [(sub.name, "round-robin")] and policy_of(host) == "round-robin"
    assert [(a.kind, a.subject, a.detail) for a in first.actions if a.kind == "iopolicy"] == [
        ("iopolicy", sub.name, "numa -> round-robin")]
    calls = len(host.runner.calls)
    again = run(host, "round-robin")
    assert again.ok and not again.changed, again.actions
    assert writes == [(sub.name, "round-robin")], "the converged pass wrote the policy"
    assert host.runner.calls[calls:] == []
    # Changed behind kvagent's back (or a subsystem that came back with the default).
    host.sys.set(f"class/nvme-subsystem/{sub.name}/iopolicy", "numa")
    fixed = run(host, "round-robin")
    assert fixed.changed and policy_of(host) == "round-robin"


def test_without_iopolicy_the_kernels_stays(host: FakeHost,
                                            writes: list[tuple[str, str]]) -> None:
    assert run(host, None).ok
    (sub,) = host.sysfs.subsystems_of(NQN)
    host.sys.set(f"class/nvme-subsystem/{sub.name}/iopolicy", "round-robin")
    assert run(host, None).ok and writes == []
    assert policy_of(host) == "round-robin"


def test_plan_shows_the_change_and_writes_nothing(host: FakeHost,
                                                  writes: list[tuple[str, str]]) -> None:
    assert run(host, None).ok
    planned = run(host, "round-robin", dry_run=True)
    assert [(a.kind, a.status, a.detail) for a in planned.actions] == [
        ("iopolicy", "planned", "numa -> round-robin")]
    assert writes == [] and policy_of(host) == "numa"


def test_a_kernel_without_the_policy_is_the_pools_error_and_the_pool_still_attaches(
        host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """6.1 refuses queue-depth with EINVAL (shown in tests/kernel/test_cache_multipath.py)."""
    def refuse(self: Sysfs, subsystem: str, policy: str) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(Sysfs, "set_iopolicy", refuse)
    monkeypatch.setattr(iopolicy.os, "uname", lambda: os.uname_result(
        ("Linux", "gpu0", "6.1.0-57-amd64", "#1", "x86_64")))
    result = run(host, "queue-depth")
    (error,) = result.errors
    assert error.pool == "kv"
    assert error.message == (
        f"pool kv: the kernel refused iopolicy 'queue-depth' for nvme-subsys2 ({NQN}) "
        "(EINVAL): queue-depth needs Linux 6.11 or later, and this host runs 6.1.0-57-amd64")
    assert error.hint and "numa or round-robin" in error.hint
    assert policy_of(host) == "numa"
    assert sorted(host.mounts()) == [str(host.root / f"mnt/kv/store1-ns{i}") for i in (1, 2)]


def test_a_kernel_without_native_multipath_says_so(host: FakeHost) -> None:
    assert run(host, None).ok
    (sub,) = host.sysfs.subsystems_of(NQN)
    (host.root / "sys/class/nvme-subsystem" / sub.name / "iopolicy").unlink()
    (error,) = run(host, "numa").errors
    assert "has no iopolicy: this kernel has no native NVMe multipath" in error.message


def test_other_refusals_keep_the_kernels_words() -> None:
    exc = OSError(errno.EACCES, "Permission denied")
    err = iopolicy.refusal("kv", "nvme-subsys3", NQN, "numa", exc)
    assert err.message == (f"pool kv: cannot set iopolicy 'numa' for nvme-subsys3 ({NQN}): "
                           "Permission denied (EACCES)")
