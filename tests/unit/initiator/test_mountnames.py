"""Mount directories named by identity (storage node + nsid), never by position."""

from __future__ import annotations

import pytest

from agent.errors import KvagentError
from agent.initiator.devices import NamespaceDevice
from agent.initiator.mountnames import assign_mounts, hashed_label, storage_label
from agent.records import AttachedDevice, PoolAttachment

PREFIX = "nqn.2026-11.io.kvagent"
S0, S1 = f"{PREFIX}:store0:kv:gpu0", f"{PREFIX}:store1:kv:gpu0"


def dev(nqn: str, nsid: int, uuid: str | None = None) -> NamespaceDevice:
    return NamespaceDevice(nqn, nsid, uuid or f"{nsid:08x}-0000-4000-8000-{hash(nqn) & 0xfff:012x}",
                           f"/dev/nvme9n{nsid}", f"nvme9n{nsid}", 1 << 30, 512, ())


def test_labels() -> None:
    assert storage_label(PREFIX, S0) == "store0"
    assert storage_label(PREFIX, f"{PREFIX}:store0:kv") == "store0"  # shared
    foreign = "nqn.2014-08.org.example:array7"
    assert storage_label(PREFIX, foreign) == hashed_label(foreign)
    assert hashed_label(foreign) == hashed_label(foreign) != hashed_label(foreign + "x")
    assert len(hashed_label(foreign)) == 9 and hashed_label(foreign)[0] == "s"


def test_order_of_subsystems_does_not_change_names() -> None:
    a = [dev(S0, 1), dev(S0, 2), dev(S1, 1)]
    names = dict(zip(((d.subsysnqn, d.nsid) for d in a),
                     assign_mounts("/srv/kv", PREFIX, a, None), strict=True))
    b = list(reversed(a))
    again = dict(zip(((d.subsysnqn, d.nsid) for d in b),
                     assign_mounts("/srv/kv", PREFIX, b, None), strict=True))
    assert names == again == {(S0, 1): "/srv/kv/store0-ns1", (S0, 2): "/srv/kv/store0-ns2",
                              (S1, 1): "/srv/kv/store1-ns1"}


def test_a_recorded_mount_is_kept_by_uuid() -> None:
    d = dev(S1, 1, "aaaaaaaa-0000-4000-8000-000000000001")
    old = PoolAttachment("h", devices=[AttachedDevice(S1, 1, d.uuid.upper(), d.device,
                                                      "/srv/kv/ns2")])
    assert assign_mounts("/srv/kv", PREFIX, [dev(S0, 1), d], old) == [
        "/srv/kv/store0-ns1", "/srv/kv/ns2"]
    # under another mount root (the config moved the pool): named afresh
    assert assign_mounts("/srv/other", PREFIX, [d], old) == ["/srv/other/store1-ns1"]


def test_a_device_mounted_on_an_old_mount_keeps_it() -> None:
    d = dev(S0, 1)
    old = PoolAttachment("h", mounts=["/srv/kv/ns1"])
    assert assign_mounts("/srv/kv", PREFIX, [d], old,
                         lambda x: "/srv/kv/ns1" if x is d else None) == ["/srv/kv/ns1"]


def test_two_subsystems_of_one_node_never_share_a_directory() -> None:
    other = f"{PREFIX}:store0:kv"
    got = assign_mounts("/srv/kv", PREFIX, [dev(S0, 1), dev(other, 1)], None)
    assert got == ["/srv/kv/store0-ns1", f"/srv/kv/{hashed_label(other)}-ns1"]


def test_no_free_directory_is_an_error() -> None:
    d = dev(S0, 1)
    taken = [AttachedDevice(S1, 1, "u1", "/dev/x", "/srv/kv/store0-ns1"),
             AttachedDevice(S1, 2, "u2", "/dev/y", f"/srv/kv/{hashed_label(S0)}-ns1")]
    with pytest.raises(KvagentError, match="no free mount directory"):
        assign_mounts("/srv/kv", PREFIX, [dev(S1, 1, "u1"), dev(S1, 2, "u2"), d],
                      PoolAttachment("h", devices=taken))
