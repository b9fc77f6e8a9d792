"""Striped layout: one tagged LVM striped volume; foreign PVs and data refused."""

from __future__ import annotations

import json

import pytest

from agent.errors import KvagentError
from agent.initiator import striped
from agent.initiator.filesystem import ForeignFilesystem
from agent.initiator.striped import (
    deactivate,
    dm_name,
    list_pvs,
    vg_tags,
    volume_path,
)
from tests.unit.fakerunner import FakeRunner

DEVS = ["/dev/nvme2n1", "/dev/nvme2n2"]
TAGS = "kvagent,kvagent_pool=kv,kvagent_role=initiator"


def pvs(rows: list[tuple[str, str, str]], rc: int = 0) -> str:
    return json.dumps({"report": [{"pv": [{"pv_name": d, "vg_name": vg, "vg_tags": t}
                                          for d, vg, t in rows]}]})


def runner(pv_rows: list[tuple[str, str, str]], rc: int = 0, blkid: str = "",
           blkid_rc: int = 2, lvs: str = "  data\n") -> FakeRunner:
    return (FakeRunner().on(["pvs"], pvs(pv_rows), rc).on(["blkid"], blkid, blkid_rc)
            .on(["vgcreate"]).on(["lvcreate"]).on(["vgchange"]).on(["lvs"], lvs))


def ensure_striped_volume(pool: str, devices: list[str], r: FakeRunner,  # type: ignore[no-untyped-def]
                          active: bool = False, over: list[str] | None = None):
    """``active``: the volume's /dev/VG/LV link exists (the namespaces always do);
    ``over``: the devices sysfs lists under the active volume (none: not active)."""
    under = None if over is None else frozenset(d.rsplit("/", 1)[1] for d in over)
    return striped.ensure_striped_volume(
        pool, devices, r, exists=lambda d: d in devices or (active and d == volume_path(pool)),
        slaves=lambda p: under if p == pool else None)


def test_blank_devices_become_one_tagged_striped_volume() -> None:
    r = runner([], rc=5)
    assert ensure_striped_volume("kv", DEVS, r) == ("/dev/kvs_kv/data", True)
    [vg] = r.ran("vgcreate")
    assert vg == ("vgcreate", "-y", "--addtag", "kvagent", "--addtag", "kvagent_pool=kv",
                  "--addtag", "kvagent_role=initiator", "kvs_kv", *DEVS)
    [lv] = r.ran("lvcreate")
    assert lv[lv.index("-i") + 1] == "2" and lv[lv.index("-l") + 1] == "100%FREE"
    assert lv[-1] == "kvs_kv" and lv[lv.index("-n") + 1] == "data"


def test_own_volume_group_is_activated_not_recreated() -> None:
    r = runner([(d, "kvs_kv", TAGS) for d in DEVS])
    assert ensure_striped_volume("kv", DEVS, r) == ("/dev/kvs_kv/data", False)
    assert r.ran("vgcreate") == [] and r.ran("vgchange") == [("vgchange", "-ay", "kvs_kv")]


def test_an_active_volume_is_left_as_it_is() -> None:
    """Active, but sysfs does not show it over these devices: checked, nothing changed."""
    r = runner([(d, "kvs_kv", TAGS) for d in DEVS])
    assert ensure_striped_volume("kv", DEVS, r, active=True) == ("/dev/kvs_kv/data", False)
    assert r.ran("vgcreate") == r.ran("vgchange") == r.ran("lvcreate") == []
    assert r.ran("pvs")


def test_a_volume_active_over_exactly_its_devices_runs_no_command() -> None:
    """A converged pass: sysfs shows the volume over these namespaces; no LVM command."""
    r = runner([(d, "kvs_kv", TAGS) for d in DEVS])
    assert ensure_striped_volume("kv", DEVS, r, active=True, over=DEVS) == (
        "/dev/kvs_kv/data", False)
    assert r.calls == []


@pytest.mark.parametrize("over", [DEVS[:1], [DEVS[0], "/dev/nvme3n1"], [*DEVS, "/dev/sda"]])
def test_a_volume_over_other_devices_is_checked_with_lvm(over: list[str]) -> None:
    r = runner([(d, "kvs_kv", TAGS) for d in DEVS])
    ensure_striped_volume("kv", DEVS, r, active=True, over=over)
    assert r.ran("pvs")


@pytest.mark.parametrize(("vg", "tags"), [
    ("data", "kvagent"), ("kvs_kv", ""), ("kvs_kv", "kvagent,kvagent_pool=other"),
])
def test_a_pv_of_another_group_is_refused(vg: str, tags: str) -> None:
    r = runner([(DEVS[0], vg, tags)], rc=5)
    with pytest.raises(ForeignFilesystem, match="refusing /dev/nvme2n1: it is an LVM"):
        ensure_striped_volume("kv", DEVS, r)
    assert r.ran("vgcreate") == [] and r.ran("vgchange") == []


def test_data_on_a_device_is_refused() -> None:
    r = runner([], rc=5, blkid="TYPE=ext4\nUUID=x\n", blkid_rc=0)
    with pytest.raises(ForeignFilesystem, match="it holds ext4"):
        ensure_striped_volume("kv", DEVS, r)
    assert r.ran("vgcreate") == []


def test_new_namespaces_next_to_an_existing_volume_are_an_error() -> None:
    r = runner([(DEVS[0], "kvs_kv", TAGS)], rc=5)
    with pytest.raises(KvagentError, match="cannot grow in place"):
        ensure_striped_volume("kv", DEVS, r)
    assert r.ran("vgcreate") == [] and r.ran("vgchange") == []


def test_pvs_failure_is_not_an_empty_answer() -> None:
    r = FakeRunner().on(["pvs"], "", 3, "  Reading VG failed")
    with pytest.raises(KvagentError, match="pvs failed"):
        list_pvs(r, DEVS)


def test_deactivate_reports_what_happened() -> None:
    assert deactivate("kv", FakeRunner().on(["vgchange"])) is True
    gone = FakeRunner().on(["vgchange"], "", 5, '  Volume group "kvs_kv" not found')
    assert deactivate("kv", gone) is False
    busy = FakeRunner().on(["vgchange"], "", 5,
                           "  Logical volume kvs_kv/data in use.\n  Can't deactivate")
    with pytest.raises(KvagentError, match="cannot deactivate volume group kvs_kv") as exc:
        deactivate("kv", busy)
    assert "dmsetup info -c kvs_kv-data" in exc.value.hint


def test_names() -> None:
    assert volume_path("kv") == "/dev/kvs_kv/data"
    assert dm_name("my-pool") == "kvs_my--pool-data"
    assert vg_tags("kv") == ("kvagent", "kvagent_pool=kv", "kvagent_role=initiator")


def test_an_own_group_without_its_volume_gets_the_volume() -> None:
    """Killed between vgcreate and lvcreate: the next attach finishes the job."""
    r = runner([(d, "kvs_kv", TAGS) for d in DEVS], lvs="")
    assert ensure_striped_volume("kv", DEVS, r) == ("/dev/kvs_kv/data", True)
    [lv] = r.ran("lvcreate")
    assert lv[lv.index("-i") + 1] == "2" and r.ran("vgcreate") == []
