"""Planning of LVM, file and device backings (no real storage touched)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.records import SCHEMA, DeviceClaim, FileManifest, ManifestEntry, TargetRecords
from agent.target.backings import DRIVERS, device, file, lvm
from agent.target.backings.lvm import list_owned_volumes
from agent.target.identity import DeviceIdentity, legacy_ids
from tests.unit.fakerunner import FakeRunner

from .helpers import context, empty_pvs, one_pool_config, plan_of, pvs_json

GIB = 1024**3
NQN = "nqn.2026-11.io.kvagent:stor:kv:gpu-1"


def vgs_json(free: int = 100 * GIB, name: str = "vg0") -> str:
    return json.dumps({"report": [{"vg": [{"vg_name": name, "vg_size": str(200 * GIB),
                                           "vg_free": str(free),
                                           "vg_extent_size": str(4 * 2**20),
                                           "vg_tags": ""}]}]})


def lvs_json(*rows: tuple[str, int, str]) -> str:
    return json.dumps({"report": [{"lv": [
        {"lv_name": n, "vg_name": "vg0", "lv_path": f"/dev/vg0/{n}", "lv_size": str(size),
         "lv_tags": tags, "lv_uuid": f"LVUUID-{n}"} for n, size, tags in rows]}]})


def lvm_runner(lvs: str = lvs_json(), free: int = 100 * GIB,
               pvs: str = empty_pvs("vg0", free=50 * GIB)) -> FakeRunner:
    return (FakeRunner().on(["vgs"], stdout=vgs_json(free)).on(["lvs"], stdout=lvs)
            .on(["pvs"], stdout=pvs)
            .on(["lvcreate"]).on(["lvextend"]).on(["pvcreate"]).on(["vgcreate"]).on(["lvremove"])
            .on(["lvchange"]))


def lvm_cfg(count: int = 2, size: str = "1GiB", vg: str = "vg0", devices: tuple = ()):
    return one_pool_config({"kind": "lvm", "volume_group": vg, "devices": list(devices)},
                           namespaces={"count": count, "size": size})


def tags_of(argv: tuple[str, ...]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--addtag"]


def test_registry_has_one_driver_per_config_kind() -> None:
    import typing

    from agent.config.model import Backing

    kinds = {typing.get_args(typing.get_type_hints(t)["kind"])[0]  # Literal["lvm"] -> "lvm"
             for t in typing.get_args(Backing)}
    assert set(DRIVERS) == kinds
    assert all(d.kind == k for k, d in DRIVERS.items())


def test_lvm_creates_volumes_tagged_with_owner_and_identity() -> None:
    cfg = lvm_cfg()
    runner = lvm_runner()
    plan = plan_of(cfg, context(cfg, runner))
    assert not plan.errors
    assert [v.path for v in plan.volumes] == ["/dev/vg0/kv_kv_gpu-1_1", "/dev/vg0/kv_kv_gpu-1_2"]
    assert [s.kind for s in plan.steps] == ["lvm.lvcreate", "lvm.lvcreate"]
    assert [s.volume for s in plan.steps] == [("gpu-1", 1), ("gpu-1", 2)]
    # Fresh identities, different per volume, never the position formula.
    uuids = {v.uuid for v in plan.volumes}
    assert len(uuids) == 2 and legacy_ids(NQN, 1)[0] not in uuids
    plan.steps[0].run()
    argv = runner.ran("lvcreate")[0]
    assert argv[argv.index("-L") + 1] == f"{GIB}b"
    v1 = plan.volumes[0]
    assert tags_of(argv) == ["kvagent", "kvagent_pool=kv", "kvagent_host=gpu-1", "kvagent_ns=1",
                             f"kvagent_uuid={v1.uuid}", f"kvagent_nguid={v1.nguid}"]
    # spread (the default): each on a PV of its own, named after the group.
    plan.steps[1].run()
    assert [c[-2:] for c in runner.ran("lvcreate")] == [("vg0", "/dev/vg0-pv0"),
                                                        ("vg0", "/dev/vg0-pv1")]


def test_lvm_identity_comes_from_the_tags_and_legacy_volumes_get_tagged() -> None:
    base = "kvagent,kvagent_pool=kv,kvagent_host=gpu-1,kvagent_ns={}"
    tagged = base.format(1) + ",kvagent_uuid=aaaa,kvagent_nguid=bbbb"
    cfg = lvm_cfg()
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, tagged),
                                 ("kv_kv_gpu-1_2", GIB, base.format(2))))
    plan = plan_of(cfg, context(cfg, runner))
    one, two = plan.volumes
    assert (one.uuid, one.nguid) == ("aaaa", "bbbb")
    assert "lv uuid LVUUID-kv_kv_gpu-1_1" in one.storage.detail
    # A volume from before identities were recorded keeps the identity it was exported with.
    assert (two.uuid, two.nguid) == legacy_ids(NQN, 2)
    (step,) = plan.steps
    assert (step.kind, step.volume) == ("lvm.tag", ("gpu-1", 2))
    step.run()
    assert runner.ran("lvchange") == [("lvchange", "--addtag", f"kvagent_uuid={two.uuid}",
                                       "--addtag", f"kvagent_nguid={two.nguid}",
                                       "/dev/vg0/kv_kv_gpu-1_2")]


def test_lvm_converged_has_no_steps_and_grows_smaller_volumes() -> None:
    tags = "kvagent,kvagent_pool=kv,kvagent_host=gpu-1,kvagent_ns={},kvagent_uuid=u{},"\
           "kvagent_nguid=g{}"
    cfg = lvm_cfg()
    same = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, tags.format(1, 1, 1)),
                               ("kv_kv_gpu-1_2", GIB, tags.format(2, 2, 2))))
    assert plan_of(cfg, context(cfg, same)).steps == []
    assert not same.ran("pvs")  # converged: nothing placed, nothing asked about PVs
    # A spread LV grows on the PV it is on.
    on_pv1 = pvs_json(("/dev/vg0-pv0", "vg0", 50 * GIB, "", ""),
                      ("/dev/vg0-pv1", "vg0", 50 * GIB, "LVUUID-kv_kv_gpu-1_1", tags))
    smaller = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB // 2, tags.format(1, 1, 1)),
                                  ("kv_kv_gpu-1_2", GIB, tags.format(2, 2, 2))), pvs=on_pv1)
    (step,) = plan_of(cfg, context(cfg, smaller)).steps
    assert (step.kind, step.grown) == ("lvm.lvextend", "/dev/vg0/kv_kv_gpu-1_1")
    step.run()
    assert smaller.ran("lvextend") == [("lvextend", "-L", f"{GIB}b", "/dev/vg0/kv_kv_gpu-1_1",
                                        "/dev/vg0-pv1")]


def test_lvm_untagged_volume_with_our_name_is_not_ours() -> None:
    """Ownership comes from tags: an LV named like ours but untagged is not reused."""
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, "")))
    assert list_owned_volumes(runner) == []


def test_lvm_sizes_round_up_to_extents_and_space_is_checked() -> None:
    cfg = lvm_cfg(count=3, size="5MiB")
    plan = plan_of(cfg, context(cfg, lvm_runner()))
    assert {v.size for v in plan.volumes} == {8 * 2**20}
    short = plan_of(cfg, context(cfg, lvm_runner(free=16 * 2**20)))
    assert short.steps == [] and "needs" in short.errors[0]


def test_lvm_missing_vg_without_devices_is_an_error() -> None:
    cfg = lvm_cfg(count=1, vg="nope")
    plan = plan_of(cfg, context(cfg, lvm_runner()))
    assert "does not exist" in plan.errors[0] and not plan.steps


def test_lvm_vg_is_created_only_on_blank_devices(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    cfg = one_pool_config({"kind": "lvm", "volume_group": "new",
                           "devices": ["/dev/disk/by-id/a", "/dev/disk/by-id/b"]},
                          state_dir=tmp_path / "state", namespaces={"count": 1, "size": "1GiB"})
    seen = []

    def blank(dev, purpose, runner):
        seen.append(dev)
        if dev.endswith("b"):
            raise lvm.KvagentError("refusing: xfs signature")
        return "/dev/real-a"

    monkeypatch.setattr(lvm, "ensure_blank", blank)
    plan = plan_of(cfg, context(cfg, lvm_runner()))
    assert seen == ["/dev/disk/by-id/a", "/dev/disk/by-id/b"]
    assert plan.steps == [] and "xfs signature" in plan.errors[0]
    monkeypatch.setattr(lvm, "ensure_blank", lambda dev, purpose, runner: dev + "-real")
    monkeypatch.setattr(lvm, "device_bytes", lambda dev, sysfs: 10 * GIB)
    runner = lvm_runner()
    plan = plan_of(cfg, context(cfg, runner))
    assert [s.kind for s in plan.steps] == ["lvm.intent", "lvm.pvcreate", "lvm.pvcreate",
                                            "lvm.vgcreate", "lvm.lvcreate"]
    for step in plan.steps[:4]:
        step.run()
    assert [c[-1] for c in runner.ran("pvcreate")] == ["/dev/disk/by-id/a-real",
                                                       "/dev/disk/by-id/b-real"]
    assert runner.ran("vgcreate")[0][-2:] == ("/dev/disk/by-id/a-real", "/dev/disk/by-id/b-real")


def test_lvm_remove_refuses_volumes_of_other_pools() -> None:
    runner = lvm_runner(lvs_json(("x", GIB, "kvagent,kvagent_pool=other")))
    (vol,) = list_owned_volumes(runner)
    with pytest.raises(lvm.LvmError, match="refusing"):
        lvm.remove_volume(runner, vol, "kv")
    lvm.remove_volume(runner, vol, "other")
    assert runner.ran("lvremove") == [("lvremove", "-y", "vg0/x")]


# ---------------------------------------------------------------------- files
def file_cfg(directory: Path, count: int = 2, size: str = "4MiB", **backing):
    return one_pool_config({"kind": "file", "directory": str(directory), **backing},
                           namespaces={"count": count, "size": size})


def test_file_backing_creates_records_grows_and_converges(tmp_path: Path) -> None:
    cfg = file_cfg(tmp_path / "kv")
    plan = plan_of(cfg, context(cfg))
    assert not plan.errors and [s.kind for s in plan.steps] == ["file.create"] * 2
    assert not (tmp_path / "kv").exists(), "planning must not create anything"
    for step in plan.steps:
        step.run()
    pool_dir = tmp_path / "kv/kv"
    f1 = pool_dir / "gpu-1/ns1.img"
    assert f1.stat().st_size == 4 * 2**20
    manifest = FileManifest.load(pool_dir)
    assert manifest.files == {
        f"gpu-1/ns{n}.img": ManifestEntry(4 * 2**20, v.uuid, v.nguid)
        for n, v in zip((1, 2), plan.volumes, strict=True)}
    assert json.loads((pool_dir / ".kvagent-pool.json").read_text())["schema"] == SCHEMA
    assert not list(pool_dir.rglob("*.creating")), "temporary names are renamed away"
    again = plan_of(cfg, context(cfg))
    assert again.steps == [] and [v.uuid for v in again.volumes] == [
        v.uuid for v in plan.volumes]
    grow = plan_of(file_cfg(tmp_path / "kv", size="8MiB"), context(cfg))
    assert [s.kind for s in grow.steps] == ["file.grow"] * 2
    grow.steps[0].run()
    assert f1.stat().st_size == 8 * 2**20
    assert FileManifest.load(pool_dir).files["gpu-1/ns1.img"].size == 8 * 2**20


def test_file_backing_refuses_foreign_file_in_its_place(tmp_path: Path) -> None:
    cfg = file_cfg(tmp_path, count=1)
    target = tmp_path / "kv/gpu-1/ns1.img"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"precious")
    plan = plan_of(cfg, context(cfg))
    assert plan.steps == [] and "did not create it" in plan.errors[0]
    assert target.read_bytes() == b"precious"


def test_a_recorded_file_that_is_missing_is_refused_and_the_rest_is_planned(
        tmp_path: Path) -> None:
    cfg = file_cfg(tmp_path)
    first = plan_of(cfg, context(cfg))
    for step in first.steps:
        step.run()
    (tmp_path / "kv/gpu-1/ns1.img").unlink()
    plan = plan_of(cfg, context(cfg))
    assert plan.errors == [f"pool kv: {tmp_path}/kv/gpu-1/ns1.img is recorded as kvagent's but "
                           "is missing; kvagent will not recreate it silently"]
    assert plan.steps == [] and [v.nsid for v in plan.volumes] == [2]
    assert plan.volumes[0].uuid == first.volumes[1].uuid


def test_file_schema1_manifest_keeps_its_identity(tmp_path: Path) -> None:
    """Files made before identities were recorded: the legacy uuid, recorded on apply."""
    pool_dir = tmp_path / "kv"
    (pool_dir / "gpu-1").mkdir(parents=True)
    (pool_dir / "gpu-1/ns1.img").write_bytes(b"\0" * 4096)
    (pool_dir / ".kvagent-pool.json").write_text(json.dumps(
        {"pool": "kv", "files": {"gpu-1/ns1.img": 4096}}))
    cfg = file_cfg(tmp_path, count=1)
    plan = plan_of(cfg, context(cfg))
    (vol,) = plan.volumes
    assert (vol.uuid, vol.nguid) == legacy_ids(NQN, 1)
    assert [s.kind for s in plan.steps] == ["file.record", "file.grow"]
    plan.steps[0].run()
    entry = FileManifest.load(pool_dir).files["gpu-1/ns1.img"]
    assert (entry.uuid, entry.nguid, entry.state) == (*legacy_ids(NQN, 1), "created")


def test_failed_create_is_cleaned_up_and_retried(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC during preallocation: no temp file, no record left; the next plan retries."""
    cfg = file_cfg(tmp_path, count=1)
    plan = plan_of(cfg, context(cfg))

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file.os, "posix_fallocate", full)
    with pytest.raises(file.FileBackingError, match="No space left"):
        plan.steps[0].run()
    pool_dir = tmp_path / "kv"
    assert FileManifest.load(pool_dir).files == {}
    assert not [p for p in pool_dir.rglob("*") if p.is_file() and p.name != ".kvagent-pool.json"]
    monkeypatch.undo()
    retry = plan_of(cfg, context(cfg))
    assert [s.kind for s in retry.steps] == ["file.create"] and not retry.errors
    retry.steps[0].run()
    assert (pool_dir / "gpu-1/ns1.img").stat().st_size == 4 * 2**20


@pytest.mark.parametrize("stage", ["intent", "temp", "renamed"])
def test_killed_create_is_finished_by_the_next_apply(tmp_path: Path, stage: str) -> None:
    """A create killed after its intent was recorded is recognised and finished."""
    cfg = file_cfg(tmp_path, count=1)
    pool_dir = tmp_path / "kv"
    (pool_dir / "gpu-1").mkdir(parents=True)
    temp = "gpu-1/.ns1.img.creating"
    FileManifest("kv", {"gpu-1/ns1.img": ManifestEntry(4 * 2**20, "u1", "g1", "creating",
                                                        temp)}).save(pool_dir)
    if stage == "temp":
        (pool_dir / temp).write_bytes(b"\0" * 1024)  # preallocation cut short
    elif stage == "renamed":
        (pool_dir / "gpu-1/ns1.img").write_bytes(b"\0" * (4 * 2**20))
    plan = plan_of(cfg, context(cfg))
    assert not plan.errors, "an interrupted create of kvagent's own is never refused"
    assert [s.kind for s in plan.steps] == ["file.finish"]
    assert (plan.volumes[0].uuid, plan.volumes[0].nguid) == ("u1", "g1")
    plan.steps[0].run()
    assert (pool_dir / "gpu-1/ns1.img").stat().st_size == 4 * 2**20
    assert not (pool_dir / temp).exists()
    assert FileManifest.load(pool_dir).files["gpu-1/ns1.img"] == ManifestEntry(
        4 * 2**20, "u1", "g1")
    assert plan_of(cfg, context(cfg)).steps == []


@pytest.mark.parametrize("temp", ["../../victim.conf", "/etc/victim.conf",
                                  "gpu-1/.ns2.img.creating", "gpu-1/ns1.img", "gpu-1/link"])
def test_a_manifest_naming_anything_else_to_finish_moves_nothing(tmp_path: Path,
                                                                 temp: str) -> None:
    """Issue 24, item 1: a 'creating' entry's temp of ../../victim.conf moved a root file
    into the pool, grew it and exported it. Now the plan refuses the pool, and the step
    itself (were it run from an older plan) refuses too: nothing outside is touched."""
    cfg = file_cfg(tmp_path, count=1)
    pool_dir = tmp_path / "kv"
    (pool_dir / "gpu-1").mkdir(parents=True)
    victim = tmp_path / "victim.conf"
    victim.write_text("root:$6$secret\n")
    (pool_dir / "gpu-1/link").symlink_to(victim)
    entry = ManifestEntry(4 * 2**20, "u1", "g1", "creating", temp)
    FileManifest("kv", {"gpu-1/ns1.img": entry}).save(pool_dir)
    plan = plan_of(cfg, context(cfg))
    assert plan.steps == [] and len(plan.errors) == 1
    assert "not the names kvagent creates" in plan.errors[0] and repr(temp) in plan.errors[0]
    with pytest.raises(file.FileBackingError, match="refusing to touch them"):
        file.finish_file(pool_dir, "gpu-1/ns1.img", entry)
    assert victim.read_text() == "root:$6$secret\n"
    assert not (pool_dir / "gpu-1/ns1.img").exists()


def test_file_backing_without_odirect_needs_buffered_io(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file, "supports_odirect",
                        lambda d: (False, "open with O_DIRECT failed: Invalid argument"))
    cfg = file_cfg(tmp_path, count=1)
    plan = plan_of(cfg, context(cfg))
    assert "buffered_io: true" in plan.errors[0] and "Invalid argument" in plan.errors[0]
    cfg2 = file_cfg(tmp_path, count=1, buffered_io=True)
    plan2 = plan_of(cfg2, context(cfg2))
    assert not plan2.errors and plan2.volumes[0].buffered_io


# -------------------------------------------------------------------- devices
ID = "/dev/disk/by-id/a"


def dev_cfg(tmp_path: Path, *entries: tuple[str, str]):
    return one_pool_config({"kind": "device", "devices": [
        {"path": p, "host": h} for p, h in entries]}, state_dir=tmp_path / "state",
        hosts=[{"name": "gpu-1", "nqn": "nqn.2014-08.org.nvmexpress:uuid:"
                "2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"},
               {"name": "gpu-2", "nqn": "nqn.2014-08.org.nvmexpress:uuid:"
                "6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"}])


class Drives:
    """by-id links and what sysfs says about each device they point at."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.links: dict[str, str] = {}
        self.ident: dict[str, DeviceIdentity] = {}
        monkeypatch.setattr(device, "device_identity",
                            lambda path, sysfs: self.ident.get(self.links.get(path, "")))
        monkeypatch.setattr(device.os.path, "realpath", lambda p: self.links.get(p, p))
        monkeypatch.setattr(device, "resolve_block_device",
                            lambda p: (self.links[p], 1))
        monkeypatch.setattr(device, "ensure_blank", lambda p, purpose, runner: self.links[p])

    def add(self, path: str, node: str, wwid: str, size: int = 10 * GIB) -> None:
        self.links[path] = node
        self.ident[node] = DeviceIdentity(node, size, wwid, f"S-{wwid}")


def claim_all(plan) -> None:
    for step in plan.steps:
        step.run()


def test_device_claim_records_identity_and_nsid(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01")
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"))
    records = TargetRecords()
    plan = plan_of(cfg, context(cfg, records=records))
    (step,) = plan.steps
    step.run()
    (vol,) = plan.volumes
    claim = TargetRecords.load(tmp_path / "state").claims[ID]
    assert claim == DeviceClaim(ID, "kv", "gpu-1", "/dev/sda", 10 * GIB, 1, vol.uuid, vol.nguid,
                                "eui.01", "S-eui.01")

    # Claimed: no blank check any more (the GPU host's filesystem is on it now).
    monkeypatch.setattr(device, "ensure_blank",
                        lambda *a: pytest.fail("a claimed device must not be re-checked"))
    again = plan_of(cfg, context(cfg, records=records))
    assert again.steps == [] and not again.errors and again.volumes[0].uuid == vol.uuid


def test_reordering_or_removing_devices_keeps_every_namespace_on_its_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    ids = [f"/dev/disk/by-id/d{i}" for i in range(3)]
    for i, p in enumerate(ids):
        drives.add(p, f"/dev/sd{'abc'[i]}", f"eui.0{i}")
    records = TargetRecords()
    cfg = dev_cfg(tmp_path, *((p, "gpu-1") for p in ids))
    first = plan_of(cfg, context(cfg, records=records))
    claim_all(first)
    by_path = {v.path: (v.nsid, v.uuid) for v in first.volumes}
    assert [by_path[p][0] for p in ids] == [1, 2, 3]
    reordered = dev_cfg(tmp_path, *((p, "gpu-1") for p in reversed(ids)))
    again = plan_of(reordered, context(reordered, records=records))
    assert {v.path: (v.nsid, v.uuid) for v in again.volumes} == by_path and not again.steps
    removed = dev_cfg(tmp_path, (ids[0], "gpu-1"), (ids[2], "gpu-1"))
    rest = plan_of(removed, context(removed, records=records))
    assert {v.path: (v.nsid, v.uuid) for v in rest.volumes} == {
        ids[0]: by_path[ids[0]], ids[2]: by_path[ids[2]]}
    # A new device does not take the nsid of a removed one (whose claim stays).
    drives.add("/dev/disk/by-id/new", "/dev/sdz", "eui.99")
    added = dev_cfg(tmp_path, (ids[0], "gpu-1"), ("/dev/disk/by-id/new", "gpu-1"))
    plan = plan_of(added, context(added, records=records))
    assert {v.path: v.nsid for v in plan.volumes} == {ids[0]: 1, "/dev/disk/by-id/new": 4}


def test_a_claimed_link_that_leads_elsewhere_is_withheld(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01")
    drives.add("/dev/disk/by-id/b", "/dev/sdb", "eui.02")
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"), ("/dev/disk/by-id/b", "gpu-1"))
    records = TargetRecords()
    claim_all(plan_of(cfg, context(cfg, records=records)))
    drives.add(ID, "/dev/sdc", "eui.77")  # a swapped drive answers to the same link
    plan = plan_of(cfg, context(cfg, records=records))
    assert [v.path for v in plan.volumes] == ["/dev/disk/by-id/b"]
    (w,) = plan.withheld
    assert (w.host, w.nsid) == ("gpu-1", 1)
    assert "now leads to another device" in w.reason and "eui.01" in w.reason
    assert "eui.77" in w.reason and not plan.errors
    drives.ident.pop("/dev/sdc")
    gone = plan_of(cfg, context(cfg, records=records))
    assert "is gone" in gone.withheld[0].reason
    # The drive comes back: exported again under its own identity.
    drives.add(ID, "/dev/sda", "eui.01")
    back = plan_of(cfg, context(cfg, records=records))
    assert not back.withheld and len(back.volumes) == 2


def test_schema1_claim_is_checked_by_node_and_size_then_upgraded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01", size=123)
    state = tmp_path / "state"
    state.mkdir()
    (state / "device-claims.json").write_text(json.dumps(
        {ID: {"pool": "kv", "host": "gpu-1", "device": "/dev/sda", "size": 123}}))
    (state / "target.json").write_text(json.dumps({"ports": [1], "hosts": [], "pools": {}}))
    records = TargetRecords.load(state)
    assert records.read_schema == 1 and records.claims[ID].nsid is None
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"))
    plan = plan_of(cfg, context(cfg, records=records))
    (vol,) = plan.volumes
    assert (vol.nsid, vol.uuid) == (1, legacy_ids(NQN, 1)[0])
    (step,) = plan.steps
    assert step.kind == "device.record"
    step.run()
    upgraded = TargetRecords.load(state)
    assert upgraded.read_schema == SCHEMA and not (state / "device-claims.json").exists()
    assert upgraded.claims[ID].wwid == "eui.01" and upgraded.claims[ID].nsid == 1
    # The same link on another node is another device.
    drives.add(ID, "/dev/sdq", "eui.01", size=123)
    moved = plan_of(cfg, context(cfg, records=TargetRecords.load(state)))
    assert not moved.withheld, "with a WWID recorded, the node name may change"
    legacy = dev_cfg(tmp_path, (ID, "gpu-1"))
    stale = TargetRecords(claims={ID: DeviceClaim(ID, "kv", "gpu-1", "/dev/sda", 123)})
    assert plan_of(legacy, context(legacy, records=stale)).withheld


def test_device_claimed_by_another_pool_is_refused(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01")
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"))
    records = TargetRecords(claims={ID: DeviceClaim(ID, "other", "gpu-1", "/dev/sda")})
    plan = plan_of(cfg, context(cfg, records=records))
    assert "claimed by pool 'other'" in plan.errors[0] and not plan.volumes


def test_one_device_twice_in_a_device_pool_is_refused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    drives = Drives(monkeypatch)
    drives.add(ID, "/dev/sda", "eui.01")
    drives.links["/dev/disk/by-id/b"] = "/dev/sda"
    cfg = dev_cfg(tmp_path, (ID, "gpu-1"), ("/dev/disk/by-id/b", "gpu-1"))
    plan = plan_of(cfg, context(cfg))
    assert [s.subject for s in plan.steps] == [ID]
    assert plan.errors == ["pool kv: /dev/disk/by-id/b is the same device as "
                           f"{ID} (/dev/sda); list each device once"]


def test_device_pool_layout_is_per_host_and_pure(tmp_path: Path) -> None:
    cfg = dev_cfg(tmp_path, ("/dev/disk/by-id/x", "gpu-2"), ("/dev/disk/by-id/y", "gpu-2"))
    pool = cfg.target.pools[0]
    assert DRIVERS["device"].layout(pool, TargetRecords()) == {"gpu-2": (1, 2)}
    assert not os.path.exists("/dev/disk/by-id/x"), "layout touched no device"


def test_a_converged_lvm_pool_costs_one_lvm_command() -> None:
    """``lvs`` reports the groups of kvagent's LVs too: no ``vgs`` (one device scan less)."""
    tags = "kvagent,kvagent_pool=kv,kvagent_host=gpu-1,kvagent_ns=1,kvagent_uuid=u,kvagent_nguid=g"
    row = {"lv_name": "kv_kv_gpu-1_1", "vg_name": "vg0", "lv_path": "/dev/vg0/kv_kv_gpu-1_1",
           "lv_size": str(GIB), "lv_tags": tags, "lv_uuid": "x", "vg_size": str(200 * GIB),
           "vg_free": str(GIB), "vg_extent_size": str(4 << 20), "vg_tags": ""}
    runner = FakeRunner().on(["lvs"], stdout=json.dumps({"report": [{"lv": [row]}]}))
    cfg = lvm_cfg(count=1)
    plan = plan_of(cfg, context(cfg, runner))
    assert not plan.errors and not plan.steps
    assert [c[0] for c in runner.calls] == ["lvs"]
