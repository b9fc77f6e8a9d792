"""Applier: errno-typed errors with hints, benign errnos, skipping only dependants."""

from __future__ import annotations

import errno as E

import pytest

from nvmet import errors
from nvmet.applier import apply
from nvmet.errors import from_oserror
from nvmet.fake import FakeConfigFS
from nvmet.model import Host, Namespace, Port, Subsystem, Tree
from nvmet.planner import Action, Scope, plan
from nvmet.reader import read

from .errno_table import CASES, run_case
from .fakeenv import FakeEnv

S1 = "nqn.2026-11.io.kvagent:n:a"
S2 = "nqn.2026-11.io.kvagent:n:b"
H = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555"
TCP = {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "4420"}

EXPECTED_CLASS = {
    E.EBUSY: errors.Busy, E.EACCES: errors.AccessDenied, E.EEXIST: errors.Exists,
    E.ENOENT: errors.NotFound, E.ENOTEMPTY: errors.NotEmpty, E.EINVAL: errors.InvalidValue,
    E.EADDRINUSE: errors.AddressInUse, E.EADDRNOTAVAIL: errors.AddressNotAvailable,
    E.ENODEV: errors.NoDevice, E.EPERM: errors.NotPermitted, E.EFAULT: errors.InvalidValue,
    E.EISDIR: errors.NotADirectory,
}


@pytest.mark.parametrize("case", [c for c in CASES if c.expect is not None
                                  and not c.name.startswith("read_")],
                         ids=lambda c: c.name)
def test_every_table_errno_maps_to_a_typed_error_with_a_hint(case) -> None:
    env = FakeEnv()
    op = case.setup(env)
    with pytest.raises(OSError) as info:
        op()
    last = env.fs.ops[-1]
    err = from_oserror(info.value, last.op, last.path)
    assert isinstance(err, EXPECTED_CLASS[case.expect])
    assert err.errno == case.expect and err.path == last.path
    assert err.errno_name == E.errorcode[case.expect]
    assert err.hint, f"no operator hint for {case.name}"


def test_address_not_available_hint_names_the_port_and_address() -> None:
    exc = OSError(E.EADDRNOTAVAIL, "Cannot assign requested address")
    err = from_oserror(exc, "symlink", f"ports/1/subsystems/{S1}",
                       {"traddr": "10.0.0.11", "trsvcid": "4420", "trtype": "tcp"})
    assert isinstance(err, errors.AddressNotAvailable)
    assert err.hint.startswith("port 1 address 10.0.0.11 is not configured on this host yet "
                               "(EADDRNOTAVAIL)")


def test_benign_errnos_count_as_success() -> None:
    fs = FakeConfigFS()
    fs.mkdir(f"subsystems/{S1}")
    actions = [Action("mkdir", f"subsystems/{S1}"),
               Action("rmdir", "ports/4"),
               Action("unlink", f"subsystems/{S1}/allowed_hosts/{H}"),
               Action("write", f"subsystems/{S2}/namespaces/1/enable", "0", missing_ok=True)]
    result = apply(actions, fs)
    assert result.ok and len(result.done) == 4 and result.writes == 4


def test_enoent_on_a_write_is_a_failure() -> None:
    fs = FakeConfigFS()
    fs.mkdir(f"hosts/{H}")
    result = apply([Action("write", f"hosts/{H}/dhchap_key", "x")], fs, {"kernel": "6.1.0"})
    [(_action, err)] = result.failed
    assert isinstance(err, errors.NotFound) and "kernel 6.1.0" in err.hint


class FailOn(FakeConfigFS):
    """Fail the first mutating call on one path with an errno."""

    def __init__(self, path: str, code: int, **kw):
        super().__init__(**kw)
        self.fail_path, self.code = path, code

    def _mutate(self, op, path, value, fn):
        if path == self.fail_path:
            self.writes += 1
            raise OSError(self.code, "injected", path)
        return super()._mutate(op, path, value, fn)


def two_pools() -> Tree:
    return Tree(
        hosts=[Host(H)],
        subsystems=[Subsystem(s, namespaces=[Namespace(1, "/dev/nullb0", enable=True)],
                              allowed_hosts={H}) for s in (S1, S2)],
        ports=[Port(1, addr=TCP, subsystems={S1}),
               Port(2, addr={**TCP, "trsvcid": "4421"}, subsystems={S2})])


def test_a_failed_subsystem_skips_only_its_branch() -> None:
    fs = FailOn(f"subsystems/{S1}", E.ENOMEM, devices={"/dev/nullb0": "block"})
    result = apply(plan(two_pools(), read(fs), Scope.everything()), fs)
    assert [a.path for a, _ in result.failed] == [f"subsystems/{S1}"]
    skipped = {a.path for a in result.skipped}
    assert skipped == {f"subsystems/{S1}/namespaces/1",
                       f"subsystems/{S1}/namespaces/1/device_path",
                       f"subsystems/{S1}/namespaces/1/enable",
                       f"subsystems/{S1}/allowed_hosts/{H}",
                       f"ports/1/subsystems/{S1}"}
    live = read(fs)
    assert set(live.subsystems) == {S2} and live.ports[2].subsystems == {S2}
    assert live.ports[1].subsystems == frozenset()  # port 1 made, its link skipped


def test_a_failed_address_write_skips_that_ports_link_only() -> None:
    fs = FailOn("ports/1/addr_traddr", E.EINVAL, devices={"/dev/nullb0": "block"})
    result = apply(plan(two_pools(), read(fs), Scope.everything()), fs)
    assert [a.path for a, _ in result.failed] == ["ports/1/addr_traddr"]
    assert [a.path for a in result.skipped] == [f"ports/1/subsystems/{S1}"]
    assert read(fs).ports[2].subsystems == {S2}


def test_a_failed_unlink_keeps_the_port_and_its_recreation_back() -> None:
    fs = FakeConfigFS(devices={"/dev/nullb0": "block"})
    assert apply(plan(two_pools(), read(fs), Scope.everything()), fs).ok
    fs.__class__ = FailOn  # now fail the unlink of port 1's link
    fs.fail_path, fs.code = f"ports/1/subsystems/{S1}", E.EIO
    moved = Tree(hosts=two_pools().hosts, subsystems=two_pools().subsystems,
                 ports=[Port(1, addr={**TCP, "trsvcid": "4430"}, subsystems={S1}),
                        two_pools().ports[2]])
    result = apply(plan(moved, read(fs), Scope.everything()), fs)
    assert len(result.failed) == 1
    assert [(a.op, a.path) for a in result.skipped] == [
        ("rmdir", "ports/1"), ("mkdir", "ports/1"), ("write", "ports/1/addr_trtype"),
        ("write", "ports/1/addr_adrfam"), ("write", "ports/1/addr_traddr"),
        ("write", "ports/1/addr_trsvcid"), ("symlink", f"ports/1/subsystems/{S1}")]
    assert result.done == ()
    assert read(fs).ports[1].addr["trsvcid"] == "4420"


def test_failed_enable_does_not_stop_other_namespaces() -> None:
    fs = FakeConfigFS(devices={"/dev/nullb0": "block"})
    desired = Tree(subsystems=[Subsystem(S1, namespaces=[
        Namespace(1, "/dev/missing", enable=True), Namespace(2, "/dev/nullb0", enable=True)])])
    result = apply(plan(desired, read(fs), Scope.everything()), fs)
    [(action, err)] = result.failed
    assert action.path.endswith("namespaces/1/enable") and isinstance(err, errors.NotFound)
    assert "/dev/missing does not exist" in err.hint
    assert read(fs).subsystems[S1].namespaces[2].enable is True


def test_the_applier_never_deletes_recursively() -> None:
    fs = FakeConfigFS(devices={"/dev/nullb0": "block"})
    assert apply(plan(two_pools(), read(fs), Scope.everything()), fs).ok
    with pytest.raises(OSError) as info:
        fs.rmdir(f"subsystems/{S1}")
    assert info.value.errno == E.EBUSY
    result = apply([Action("rmdir", f"subsystems/{S2}")], fs)
    assert isinstance(result.errors[0], errors.Busy)
    assert S2 in read(fs).subsystems


def test_run_case_helper_sees_success() -> None:
    ok = next(c for c in CASES if c.name == "enable_block_device")
    assert run_case(ok, FakeEnv()) is None
