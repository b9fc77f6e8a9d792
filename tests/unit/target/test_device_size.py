"""A device claim is matched by size as well as by WWID and serial (or node).

A drive that answers to the claimed by-id link with the claimed WWID and serial but
another size is not the claimed drive (another drive behind the same identifiers, or
the drive was resized under the GPU host's filesystem): its namespace is withheld,
never exported under the claimed namespace's identity, and the claim is not rewritten
to the new size. The same holds for a claim from before WWIDs were recorded (matched
by node and size).
"""

from __future__ import annotations

import pytest

from agent.records import DeviceClaim, TargetRecords
from agent.target.identity import DeviceIdentity, claim_matches

from .helpers import context, plan_of
from .test_backings import GIB, ID, Drives, claim_all, dev_cfg


def withheld_reason(claimed: str, now: str) -> str:
    """The reason :meth:`DeviceDriver._claimed` gives for a claimed link that leads to
    another device (pool kv, namespace 1)."""
    return (f"pool kv: {ID} now leads to another device: claimed {claimed}, now {now}; "
            "kvagent does not export it under namespace 1's identity. Put the claimed drive "
            "back (or fix the link); a new drive needs a new device entry after "
            "`kvagent pool destroy`")


@pytest.mark.parametrize("node", ["/dev/sda", "/dev/sdq"], ids=["same-node", "other-node"])
@pytest.mark.parametrize("size", [20 * GIB, 5 * GIB, 10 * GIB + 512],
                         ids=["bigger", "smaller", "one-sector-more"])
def test_same_wwid_and_serial_with_another_size_is_not_the_claimed_drive(
        tmp_path, monkeypatch: pytest.MonkeyPatch, node: str, size: int) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01")  # 10 GiB, serial S-eui.01
    drives.add("/dev/disk/by-id/b", "/dev/sdb", "eui.02")
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"), ("/dev/disk/by-id/b", "gpu-1"))
    records = TargetRecords()
    claim_all(plan_of(cfg, context(cfg, records=records)))
    claimed = records.claims[ID]
    assert (claimed.wwid, claimed.serial, claimed.size, claimed.nsid) == (
        "eui.01", "S-eui.01", 10 * GIB, 1)

    # The link now leads to a drive with the same WWID and serial, but another size.
    drives.add(ID, node, "eui.01", size=size)
    plan = plan_of(cfg, context(cfg, records=records))
    assert [v.path for v in plan.volumes] == ["/dev/disk/by-id/b"], "not exported"
    assert plan.steps == [], "the claim is not rewritten to the new size"
    assert not plan.errors
    (w,) = plan.withheld
    assert (w.host, w.nsid) == ("gpu-1", 1)
    assert w.reason == withheld_reason(
        f"/dev/sda, wwid eui.01, serial S-eui.01, {10 * GIB} bytes",
        f"{node}, wwid eui.01, serial S-eui.01, {size} bytes")
    assert records.claims[ID] == claimed, "the recorded claim is untouched"

    # The claimed drive (its size) is back: exported again under its own identity.
    drives.add(ID, node, "eui.01")
    back = plan_of(cfg, context(cfg, records=records))
    assert not back.withheld and not back.errors
    assert {v.path: (v.nsid, v.uuid) for v in back.volumes}[ID] == (1, claimed.uuid)


def test_a_legacy_claim_is_matched_by_node_and_size(tmp_path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim without WWID/serial (schema 1): same node, another size: withheld."""
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01", size=456)
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"))
    legacy = DeviceClaim(ID, "kv", "gpu-1", "/dev/sda", 123)
    records = TargetRecords(claims={ID: legacy})
    plan = plan_of(cfg, context(cfg, records=records))
    assert not plan.volumes and not plan.steps and not plan.errors
    (w,) = plan.withheld
    assert (w.host, w.nsid) == ("gpu-1", 1)
    assert w.reason == withheld_reason("/dev/sda, 123 bytes",
                                       "/dev/sda, wwid eui.01, serial S-eui.01, 456 bytes")
    assert records.claims[ID] is legacy

    # The size it was claimed with: the same device, exported, and its claim upgraded.
    drives.add(ID, "/dev/sda", "eui.01", size=123)
    same = plan_of(cfg, context(cfg, records=records))
    assert not same.withheld and [v.path for v in same.volumes] == [ID]
    assert [s.kind for s in same.steps] == ["device.record"]


def now(size: int | None = 10 * GIB, node: str = "/dev/sda", wwid: str | None = "eui.01",
        serial: str | None = "S1") -> DeviceIdentity:
    return DeviceIdentity(node, size, wwid, serial)


def claim(size: int | None, node: str = "/dev/sda", **ids: str) -> DeviceClaim:
    return DeviceClaim(ID, "kv", "gpu-1", node, size, **ids)


HW = {"wwid": "eui.01", "serial": "S1"}


@pytest.mark.parametrize(("claimed", "device", "matches"), [
    (claim(10 * GIB, **HW), now(), True),
    (claim(10 * GIB, "/dev/sdz", **HW), now(), True),
    (claim(20 * GIB, **HW), now(), False),
    (claim(10 * GIB - 512, **HW), now(), False),
    (claim(10 * GIB, **HW), now(size=None), False),
    (claim(10 * GIB, wwid="eui.01"), now(serial=None), True),
    (claim(20 * GIB, wwid="eui.01"), now(serial=None), False),
    (claim(10 * GIB, serial="S1"), now(wwid=None), True),
    (claim(20 * GIB, serial="S1"), now(wwid=None), False),
    (claim(10 * GIB, serial="S1"), now(wwid=None, serial="S2"), False),
    (claim(10 * GIB, "/dev/sdz", serial="S1"), now(wwid=None), True),
    (claim(10 * GIB), now(), True),
    (claim(20 * GIB), now(), False),
    (claim(10 * GIB), now(size=None), False),
    (claim(None), now(), True),
    (claim(10 * GIB, "/dev/sdz"), now(), False),
], ids=["hw-same", "hw-node-moved", "hw-bigger", "hw-smaller", "hw-size-unreadable-now",
        "wwid-only-same", "wwid-only-bigger", "serial-only-same", "serial-only-bigger",
        "serial-only-another-serial", "serial-only-node-moved",
        "legacy-same", "legacy-bigger", "legacy-size-unreadable-now", "legacy-size-unrecorded",
        "legacy-other-node"])
def test_claim_matches_takes_the_size_into_account(claimed: DeviceClaim,
                                                   device: DeviceIdentity,
                                                   matches: bool) -> None:
    assert claim_matches(claimed, device) is matches
