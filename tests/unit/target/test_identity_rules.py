"""A namespace's identity stays with its storage; nothing is taken over or exported twice.

Each test is a scenario of issue 12 on the kernel-like fake configfs (the real-kernel
tier repeats them with real storage in tests/kernel/test_ownership.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.records import TargetRecords
from nvmet.model import canonical

from .helpers import H1, PREFIX, Target, config, file_pool, nqn

NS1 = f"subsystems/{nqn('gpu-1')}/namespaces/1"


def moved(tmp_path: Path, directory: str = "elsewhere") -> dict:
    pool = file_pool(tmp_path, hosts=(("gpu-1", H1),))
    pool["backing"]["directory"] = str(tmp_path / directory)
    return pool


def uuid_of(target: Target, path: str = NS1) -> str:
    return canonical("device_uuid", target.fs.read(f"{path}/device_uuid"))


def test_changing_a_file_pools_directory_is_refused(target: Target, tmp_path: Path) -> None:
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    before = uuid_of(target)
    result = target.run(config(tmp_path, [moved(tmp_path)]))
    assert not result.ok
    assert target.ops() == []
    errors = [e for e in result.errors if "refusing to move namespace 1" in e.message]
    assert len(errors) == 1
    error = errors[0]
    assert error.pool == "kv" and nqn("gpu-1") in error.message and before in error.message
    assert str(tmp_path / "files/kv/gpu-1/ns1.img") in error.message
    assert str(tmp_path / "elsewhere/kv/gpu-1/ns1.img") in error.message
    assert "new pool name" in (error.hint or "") and "--rebind kv" in (error.hint or "")
    assert not (tmp_path / "elsewhere").exists(), "no storage made for a refused namespace"
    assert target.fs.read(f"{NS1}/device_path") == str(tmp_path / "files/kv/gpu-1/ns1.img")
    assert target.fs.read(f"{NS1}/enable") == "1" and uuid_of(target) == before


def test_refusal_holds_after_a_reboot(target: Target, tmp_path: Path) -> None:
    """configfs is empty after a reboot; the binding in the records still refuses."""
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    rebooted = Target(tmp_path)
    result = rebooted.run(config(tmp_path, [moved(tmp_path)]))
    assert any("refusing to move namespace 1" in e.message for e in result.errors)
    assert not rebooted.fs.exists(NS1) and not (tmp_path / "elsewhere").exists()
    # The records still bind the namespace: a second pass refuses again.
    again = rebooted.run(config(tmp_path, [moved(tmp_path)]))
    assert any("refusing to move namespace 1" in e.message for e in again.errors)


def test_rebind_moves_the_namespace_with_a_new_identity(target: Target, tmp_path: Path) -> None:
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    before = uuid_of(target)
    result = target.run(config(tmp_path, [moved(tmp_path)]), rebind=("kv",))
    assert result.ok, result.errors
    assert target.fs.read(f"{NS1}/device_path") == str(tmp_path / "elsewhere/kv/gpu-1/ns1.img")
    assert uuid_of(target) != before, "other storage never carries the old identity"
    assert "identity.rebind" in [a.kind for a in result.actions]
    assert target.run(config(tmp_path, [moved(tmp_path)])).ok, "bound to the new storage now"


def test_unexport_first_then_move(target: Target, tmp_path: Path) -> None:
    """The documented way to move a pool: remove it, apply, add it back elsewhere."""
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    before = uuid_of(target)
    assert target.run(config(tmp_path, [])).ok
    assert not target.fs.exists(NS1)
    back = target.run(config(tmp_path, [moved(tmp_path)]))
    assert back.ok, back.errors
    assert uuid_of(target) != before


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_storage_exported_by_another_subsystem_is_not_exported_again(target: Target,
                                                                      tmp_path: Path,
                                                                      link: str) -> None:
    elsewhere = tmp_path / "by-hand/data.img"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"\0" * (4 << 20))
    target.fs.add_device(str(elsewhere), "file")
    fs = target.fs
    hand = "subsystems/nqn.2014-08.org.example:by-hand"
    fs.mkdir(hand)
    fs.mkdir(f"{hand}/namespaces/7")
    fs.write(f"{hand}/namespaces/7/device_path", str(elsewhere))
    # A pool file that is (through a symlink, or a hard link: another name of the same
    # inode, which no path resolution shows) that very file.
    pool_dir = tmp_path / "files/kv"
    (pool_dir / "gpu-1").mkdir(parents=True)
    if link == "symlink":
        (pool_dir / "gpu-1/ns1.img").symlink_to(elsewhere)
    else:
        (pool_dir / "gpu-1/ns1.img").hardlink_to(elsewhere)
    (pool_dir / ".kvagent-pool.json").write_text(json.dumps(
        {"schema": 2, "pool": "kv", "files": {"gpu-1/ns1.img": {
            "size": 4 << 20, "uuid": "11111111-1111-4111-8111-111111111111",
            "nguid": "22222222-2222-4222-8222-222222222222"}}}))
    result = target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))]))
    if link == "symlink":  # never followed (issue 24): refused before the export-twice rule
        (error,) = result.errors
        assert "ns1.img is a symbolic link, not the file kvagent created" in error.message
        assert not target.fs.exists(NS1)
        assert fs.read(f"{hand}/namespaces/7/device_path") == str(elsewhere)
        return
    (error,) = [e for e in result.errors if "twice" in e.message]
    assert "namespace 7 of nqn.2014-08.org.example:by-hand" in error.message
    assert not target.fs.exists(NS1)
    assert target.fs.exists(f"subsystems/{nqn('gpu-1')}/namespaces/2"), "the rest exports"
    assert fs.read(f"{hand}/namespaces/7/device_path") == str(elsewhere)


def test_a_renamed_node_exports_nothing_twice(target: Target, tmp_path: Path) -> None:
    cfg = config(tmp_path, [file_pool(tmp_path)])
    assert target.run(cfg).ok
    renamed = json.loads(json.dumps(_raw(tmp_path, [file_pool(tmp_path)])))
    renamed["node"]["name"] = "stor-new"
    result = target.run(_parse(renamed))
    (error,) = result.errors
    assert "exports its pools as node 'stor'" in error.message
    assert "config now says node 'stor-new'" in error.message
    assert "set node.name: stor" in (error.hint or "")
    assert target.ops() == [], "no subsystem under the new name, nothing removed"
    assert not [e for e in target.fs.list("subsystems") if "stor-new" in e.name]
    # After unexporting everything under the old name, the rename is allowed.
    assert target.run(config(tmp_path, [])).ok
    emptied = json.loads(json.dumps(renamed))
    emptied["target"]["pools"] = []
    assert target.run(_parse(emptied)).ok
    assert target.run(_parse(renamed)).ok
    assert [e.name for e in target.fs.list("subsystems")] == [
        f"{PREFIX.rsplit(':', 1)[0]}:stor-new:kv:gpu-1",
        f"{PREFIX.rsplit(':', 1)[0]}:stor-new:kv:gpu-2"]


def test_schema1_records_catch_a_rename_from_the_live_tree(target: Target,
                                                          tmp_path: Path) -> None:
    assert target.run(config(tmp_path, [file_pool(tmp_path)])).ok
    state = tmp_path / "state"
    v1 = {"ports": [1], "hosts": [H1], "pools": {"kv": {"kind": "file",
                                                        "directory": str(tmp_path / "files")}}}
    (state / "target.json").write_text(json.dumps(v1))
    renamed = _raw(tmp_path, [file_pool(tmp_path)])
    renamed["node"]["name"] = "stor-new"
    result = target.run(_parse(renamed))
    assert "exports its pools as node 'stor'" in result.errors[0].message
    assert target.ops() == []


def test_a_hand_made_port_is_never_taken_over(target: Target, tmp_path: Path) -> None:
    fs = target.fs
    fs.mkdir("ports/1")
    for k, v in (("trtype", "tcp"), ("adrfam", "ipv4"), ("traddr", "127.0.0.1"),
                 ("trsvcid", "4420")):
        fs.write(f"ports/1/addr_{k}", v)
    result = target.run(config(tmp_path, [file_pool(tmp_path)]))
    (error,) = [e for e in result.errors if "port lo" in e.message]
    assert "nvmet port 1 exists and kvagent did not create it" in error.message
    assert "no subsystem is linked to it" in error.message
    assert fs.list("ports/1/subsystems") == [], "not linked into"
    assert 1 not in TargetRecords.load(tmp_path / "state").ports, "never recorded as ours"
    # The config moves to another id: the hand-made port stays.
    data = _raw(tmp_path, [file_pool(tmp_path, ports=("lo2",))])
    data["target"]["ports"] = [{"name": "lo2", "id": 2, "transport": "tcp",
                                "address": "127.0.0.1", "service": 4421}]
    assert target.run(_parse(data)).ok
    assert fs.exists("ports/1") and fs.read("ports/1/addr_trsvcid") == "4420"
    assert [e.name for e in fs.list("ports/2/subsystems")] == [nqn("gpu-1"), nqn("gpu-2")]


def test_ports_are_recorded_before_they_are_created(target: Target, tmp_path: Path) -> None:
    """A kill right after mkdir of a port must not leave a port kvagent calls foreign."""
    seen: list[set[int]] = []
    mkdir = target.fs.mkdir

    def spy(path: str) -> None:
        if path == "ports/1":
            seen.append(TargetRecords.load(tmp_path / "state").ports)
        mkdir(path)

    target.fs.mkdir = spy  # type: ignore[method-assign]
    assert target.run(config(tmp_path, [file_pool(tmp_path)])).ok
    assert seen == [{1}]


def _raw(tmp_path: Path, pools: list[dict]) -> dict:
    return {"version": 1, "node": {"name": "stor", "state_dir": str(tmp_path / "state"),
                                   "run_dir": str(tmp_path / "run")},
            "target": {"address_wait": "0s", "pools": pools, "ports": [
                {"name": "lo", "id": 1, "transport": "tcp", "address": "127.0.0.1"}]}}


def _parse(data: dict):
    import yaml

    from agent.config import parse_config

    return parse_config(yaml.safe_dump(data))
