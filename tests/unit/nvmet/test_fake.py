"""The fake's own behaviour: recorded operations, ordering checks, counters."""

from __future__ import annotations

import errno as E

import pytest

from nvmet.fake import FakeConfigFS, Op, OrderingViolation

S = "nqn.2026-11.io.kvagent:x"


def exported() -> FakeConfigFS:
    fs = FakeConfigFS(devices={"/dev/b": "block"})
    fs.mkdir(f"subsystems/{S}")
    fs.mkdir("ports/1")
    for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                 ("trsvcid", "4420")):
        fs.write(f"ports/1/addr_{k}", v)
    return fs


def test_ops_are_recorded_in_order_with_their_errno() -> None:
    fs = FakeConfigFS()
    fs.mkdir(f"subsystems/{S}")
    with pytest.raises(OSError):
        fs.mkdir(f"subsystems/{S}")
    fs.write(f"subsystems/{S}/attr_model", "m")
    assert fs.ops == [Op("mkdir", f"subsystems/{S}"),
                      Op("mkdir", f"subsystems/{S}", errno=E.EEXIST),
                      Op("write", f"subsystems/{S}/attr_model", "m", changed=True)]
    assert fs.writes == 3
    fs.read(f"subsystems/{S}/attr_model")
    assert fs.writes == 3 and fs.reads == 1


def test_configuring_a_subsystem_after_linking_it_is_an_ordering_violation() -> None:
    fs = exported()
    fs.check_order = True
    fs.start_session()
    fs.symlink(f"subsystems/{S}", f"ports/1/subsystems/{S}")
    with pytest.raises(OrderingViolation, match="port links must come last"):
        fs.mkdir(f"subsystems/{S}/namespaces/1")


def test_a_delete_after_a_create_is_an_ordering_violation() -> None:
    fs = FakeConfigFS(check_order=True)
    fs.mkdir("ports/2")
    with pytest.raises(OrderingViolation, match="deletes must all come before creates"):
        fs.rmdir("ports/2")


def test_without_check_order_the_same_sequences_pass() -> None:
    fs = exported()
    fs.symlink(f"subsystems/{S}", f"ports/1/subsystems/{S}")
    fs.mkdir(f"subsystems/{S}/namespaces/1")
    fs.unlink(f"ports/1/subsystems/{S}")


def test_clone_is_independent() -> None:
    fs = exported()
    twin = fs.clone()
    twin.rmdir(f"subsystems/{S}")
    assert fs.exists(f"subsystems/{S}") and not twin.exists(f"subsystems/{S}")
    assert twin.writes == 1


def test_random_identities_are_deterministic_per_seed() -> None:
    a, b = FakeConfigFS(seed=1), FakeConfigFS(seed=1)
    for fs in (a, b):
        fs.mkdir(f"subsystems/{S}")
    assert a.read(f"subsystems/{S}/attr_serial") == b.read(f"subsystems/{S}/attr_serial")
    assert len(a.read(f"subsystems/{S}/attr_serial")) == 20
