"""Planning of LVM, file and device backings (no real storage touched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.config import parse_config
from agent.config.model import TargetPool
from agent.target import backing_device, backing_lvm
from agent.target.backing_file import MANIFEST, destroy_files, plan_file
from agent.target.backing_lvm import list_owned_volumes, list_volume_groups, plan_lvm
from tests.unit.fakerunner import FakeRunner

GIB = 1024**3
HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def pool(backing: dict, **extra) -> TargetPool:
    data = {"version": 1, "node": {"name": "stor"}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"name": "kv", "backing": backing, "ports": ["p"],
                   "hosts": [{"name": "gpu-1", "nqn": HOST}], **extra}]}}
    return parse_config(yaml.safe_dump(data)).target.pools[0]


def vgs_json(free: int = 100 * GIB, name: str = "vg0") -> str:
    return json.dumps({"report": [{"vg": [{"vg_name": name, "vg_size": str(200 * GIB),
                                           "vg_free": str(free),
                                           "vg_extent_size": str(4 * 2**20),
                                           "vg_tags": ""}]}]})


def lvs_json(*rows: tuple[str, int, str]) -> str:
    return json.dumps({"report": [{"lv": [
        {"lv_name": n, "vg_name": "vg0", "lv_path": f"/dev/vg0/{n}", "lv_size": str(size),
         "lv_tags": tags} for n, size, tags in rows]}]})


def lvm_runner(lvs: str = lvs_json(), free: int = 100 * GIB) -> FakeRunner:
    return (FakeRunner().on(["vgs"], stdout=vgs_json(free)).on(["lvs"], stdout=lvs)
            .on(["lvcreate"]).on(["lvextend"]).on(["vgcreate"]).on(["lvremove"]))


def lvm_plan(p: TargetPool, runner: FakeRunner):
    return plan_lvm(p, ["gpu-1"], runner, list_volume_groups(runner),
                    list_owned_volumes(runner))


def test_lvm_creates_tagged_volumes_per_host() -> None:
    p = pool({"kind": "lvm", "volume_group": "vg0"}, namespaces={"count": 2, "size": "1GiB"})
    runner = lvm_runner()
    plan = lvm_plan(p, runner)
    assert not plan.errors
    assert [v.path for v in plan.volumes] == ["/dev/vg0/kv_kv_gpu-1_1", "/dev/vg0/kv_kv_gpu-1_2"]
    assert [s.kind for s in plan.steps] == ["lvm.lvcreate", "lvm.lvcreate"]
    plan.steps[0].run()
    argv = runner.ran("lvcreate")[0]
    assert argv[argv.index("-L") + 1] == f"{GIB}b"
    tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--addtag"]
    assert tags == ["kvagent", "kvagent_pool=kv", "kvagent_host=gpu-1", "kvagent_ns=1"]


def test_lvm_converged_has_no_steps_and_grows_smaller_volumes() -> None:
    tags = "kvagent,kvagent_pool=kv,kvagent_host=gpu-1,kvagent_ns={}"
    p = pool({"kind": "lvm", "volume_group": "vg0"}, namespaces={"count": 2, "size": "1GiB"})
    same = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, tags.format(1)),
                               ("kv_kv_gpu-1_2", GIB, tags.format(2))))
    assert lvm_plan(p, same).steps == []
    smaller = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB // 2, tags.format(1)),
                                  ("kv_kv_gpu-1_2", GIB, tags.format(2))))
    (step,) = lvm_plan(p, smaller).steps
    assert (step.kind, step.grown) == ("lvm.lvextend", "/dev/vg0/kv_kv_gpu-1_1")


def test_lvm_untagged_volume_with_our_name_is_not_ours() -> None:
    """Ownership comes from tags: an LV named like ours but untagged is not reused."""
    runner = lvm_runner(lvs_json(("kv_kv_gpu-1_1", GIB, "")))
    assert list_owned_volumes(runner) == []


def test_lvm_sizes_round_up_to_extents_and_space_is_checked() -> None:
    p = pool({"kind": "lvm", "volume_group": "vg0"}, namespaces={"count": 3, "size": "5MiB"})
    plan = lvm_plan(p, lvm_runner())
    assert {v.size for v in plan.volumes} == {8 * 2**20}
    short = lvm_plan(p, lvm_runner(free=16 * 2**20))
    assert short.steps == [] and "needs" in short.errors[0]


def test_lvm_missing_vg_without_devices_is_an_error() -> None:
    p = pool({"kind": "lvm", "volume_group": "nope"}, namespaces={"count": 1, "size": "1GiB"})
    plan = lvm_plan(p, lvm_runner())
    assert "does not exist" in plan.errors[0] and not plan.steps


def test_lvm_vg_is_created_only_on_blank_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    p = pool({"kind": "lvm", "volume_group": "new",
              "devices": ["/dev/disk/by-id/a", "/dev/disk/by-id/b"]},
             namespaces={"count": 1, "size": "1GiB"})
    seen = []

    def blank(dev, purpose, runner):
        seen.append(dev)
        if dev.endswith("b"):
            raise backing_lvm.KvagentError("refusing: xfs signature")
        return "/dev/real-a"

    monkeypatch.setattr(backing_lvm, "ensure_blank", blank)
    plan = lvm_plan(p, lvm_runner())
    assert seen == ["/dev/disk/by-id/a", "/dev/disk/by-id/b"]
    assert plan.steps == [] and "xfs signature" in plan.errors[0]
    monkeypatch.setattr(backing_lvm, "ensure_blank", lambda dev, purpose, runner: dev + "-real")
    runner = lvm_runner()
    plan = lvm_plan(p, runner)
    assert [s.kind for s in plan.steps] == ["lvm.vgcreate", "lvm.lvcreate"]
    plan.steps[0].run()
    assert runner.ran("vgcreate")[0][-2:] == ("/dev/disk/by-id/a-real", "/dev/disk/by-id/b-real")


def test_lvm_remove_refuses_volumes_of_other_pools() -> None:
    runner = lvm_runner(lvs_json(("x", GIB, "kvagent,kvagent_pool=other")))
    (vol,) = list_owned_volumes(runner)
    with pytest.raises(backing_lvm.LvmError, match="refusing"):
        backing_lvm.remove_volume(runner, vol, "kv")
    backing_lvm.remove_volume(runner, vol, "other")
    assert runner.ran("lvremove") == [("lvremove", "-y", "vg0/x")]


def test_file_backing_creates_records_grows_and_destroys(tmp_path: Path) -> None:
    p = pool({"kind": "file", "directory": str(tmp_path / "kv")},
             namespaces={"count": 2, "size": "4MiB"})
    plan = plan_file(p, ["gpu-1"])
    assert not plan.errors and [s.kind for s in plan.steps] == ["file.create"] * 2
    assert not (tmp_path / "kv").exists(), "planning must not create anything"
    for step in plan.steps:
        step.run()
    f1 = tmp_path / "kv/kv/gpu-1/ns1.img"
    assert f1.stat().st_size == 4 * 2**20
    manifest = json.loads((tmp_path / "kv/kv" / MANIFEST).read_text())
    assert manifest["files"] == {"gpu-1/ns1.img": 4 * 2**20, "gpu-1/ns2.img": 4 * 2**20}
    assert plan_file(p, ["gpu-1"]).steps == []
    bigger = pool({"kind": "file", "directory": str(tmp_path / "kv")},
                  namespaces={"count": 2, "size": "8MiB"})
    grow = plan_file(bigger, ["gpu-1"])
    assert [s.kind for s in grow.steps] == ["file.grow"] * 2
    grow.steps[0].run()
    assert f1.stat().st_size == 8 * 2**20
    foreign = tmp_path / "kv/kv/gpu-1/keep.txt"
    foreign.write_text("not kvagent's")
    removed = destroy_files(tmp_path / "kv/kv")
    assert sorted(removed) == [str(f1), str(tmp_path / "kv/kv/gpu-1/ns2.img")]
    assert foreign.read_text() == "not kvagent's"


def test_file_backing_refuses_foreign_file_in_its_place(tmp_path: Path) -> None:
    p = pool({"kind": "file", "directory": str(tmp_path)}, namespaces={"count": 1, "size": "4MiB"})
    target = tmp_path / "kv/gpu-1/ns1.img"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"precious")
    plan = plan_file(p, ["gpu-1"])
    assert plan.steps == [] and "did not create it" in plan.errors[0]
    assert target.read_bytes() == b"precious"


def test_file_backing_without_odirect_needs_buffered_io(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.target import backing_file

    monkeypatch.setattr(backing_file, "supports_odirect",
                        lambda d: (False, "open with O_DIRECT failed: Invalid argument"))
    p = pool({"kind": "file", "directory": str(tmp_path)}, namespaces={"count": 1, "size": "4MiB"})
    plan = plan_file(p, ["gpu-1"])
    assert "buffered_io: true" in plan.errors[0] and "Invalid argument" in plan.errors[0]
    p2 = pool({"kind": "file", "directory": str(tmp_path), "buffered_io": True},
              namespaces={"count": 1, "size": "4MiB"})
    plan2 = plan_file(p2, ["gpu-1"])
    assert not plan2.errors and plan2.volumes[0].buffered_io


def test_device_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = pool({"kind": "device", "devices": [{"path": "/dev/disk/by-id/a", "host": "gpu-1"}]})
    monkeypatch.setattr(backing_device, "resolve_block_device", lambda path: ("/dev/sda", 1))
    monkeypatch.setattr(backing_device, "ensure_blank", lambda path, purpose, runner: "/dev/sda")
    monkeypatch.setattr(backing_device, "_device_size", lambda dev: 123)
    plan = backing_device.plan_device(p, FakeRunner(), tmp_path, {})
    (step,) = plan.steps
    step.run()
    claims = backing_device.read_claims(tmp_path)
    assert claims == {"/dev/disk/by-id/a": {"pool": "kv", "host": "gpu-1", "device": "/dev/sda",
                                            "size": 123}}

    # Claimed: no blank check any more (the GPU host's filesystem is on it now).
    def not_blank(path, purpose, runner):
        raise AssertionError("a claimed device must not be re-checked")

    monkeypatch.setattr(backing_device, "ensure_blank", not_blank)
    again = backing_device.plan_device(p, FakeRunner(), tmp_path, {})
    assert again.steps == [] and not again.errors
    other = pool({"kind": "device", "devices": [{"path": "/dev/disk/by-id/a", "host": "gpu-1"}]})
    object.__setattr__(other, "name", "other")
    clash = backing_device.plan_device(other, FakeRunner(), tmp_path, {})
    assert "claimed by pool 'kv'" in clash.errors[0]
    assert backing_device.release_claims(tmp_path, "kv") == ["/dev/disk/by-id/a"]


def test_device_exported_by_someone_else_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    p = pool({"kind": "device", "devices": [{"path": "/dev/disk/by-id/a", "host": "gpu-1"}]})
    monkeypatch.setattr(backing_device, "resolve_block_device", lambda path: ("/dev/sda", 1))
    plan = backing_device.plan_device(p, FakeRunner(), tmp_path, {"/dev/sda": "nqn.x:foreign"})
    assert "already exported by nqn.x:foreign" in plan.errors[0]
