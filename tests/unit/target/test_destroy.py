"""``kvagent pool destroy``: only what kvagent made, never anything still exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import KvagentError
from agent.records import TargetRecords
from agent.target.backings.file import remove_owned
from agent.target.inventory import destroy_pool, list_pools
from tests.unit.fakerunner import FakeRunner

from .helpers import H1, Target, config, file_pool


def unexported(target: Target, tmp_path: Path) -> Path:
    """Pool kv exported, then removed from the config and unexported (data kept)."""
    assert target.run(config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])).ok
    assert target.run(config(tmp_path, [])).ok
    return tmp_path / "files/kv"


def destroy(target: Target, tmp_path: Path, yes: bool) -> dict:
    return destroy_pool(config(tmp_path, []), "kv", FakeRunner(), yes=yes, fs=target.fs)


def test_destroy_deletes_the_files_it_made_and_nothing_else(target: Target,
                                                            tmp_path: Path) -> None:
    pool_dir = unexported(target, tmp_path)
    keep = pool_dir / "gpu-1/notes.txt"
    keep.write_text("not kvagent's")
    plan = destroy(target, tmp_path, yes=False)
    assert plan["files"] == [str(pool_dir / "gpu-1/ns1.img"), str(pool_dir / "gpu-1/ns2.img")]
    assert (pool_dir / "gpu-1/ns1.img").exists()
    done = destroy(target, tmp_path, yes=True)
    assert done["destroyed"] and not (pool_dir / "gpu-1/ns1.img").exists()
    assert keep.read_text() == "not kvagent's"
    assert "kv" not in TargetRecords.load(tmp_path / "state").pools
    assert [p["name"] for p in list_pools(config(tmp_path, []), fs=target.fs)] == []


@pytest.mark.parametrize("entry", ["../outside.img", "/etc/passwd-kvtest",
                                   "gpu-1/../../outside.img", "gpu-1/notes.txt"])
def test_manifest_entries_kvagent_never_makes_are_refused(target: Target, tmp_path: Path,
                                                          entry: str) -> None:
    pool_dir = unexported(target, tmp_path)
    outside = tmp_path / "files/outside.img"
    outside.write_text("precious")
    manifest = json.loads((pool_dir / ".kvagent-pool.json").read_text())
    manifest["files"][entry] = {"size": 1}
    (pool_dir / ".kvagent-pool.json").write_text(json.dumps(manifest))
    with pytest.raises(KvagentError, match="not a name kvagent creates"):
        destroy(target, tmp_path, yes=True)
    assert outside.read_text() == "precious"
    assert (pool_dir / "gpu-1/ns1.img").exists(), "refused as a whole: nothing deleted"


def test_a_symlinked_host_directory_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "ns1.img").write_text("precious")
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    (pool_dir / "gpu-1").symlink_to(victim)
    with pytest.raises(OSError):
        remove_owned(pool_dir, "gpu-1/ns1.img")
    assert (victim / "ns1.img").read_text() == "precious"


def test_destroy_refuses_data_another_subsystem_still_exports(target: Target,
                                                              tmp_path: Path) -> None:
    """An export left under an old node name (or made by hand) keeps the data alive."""
    pool_dir = unexported(target, tmp_path)
    fs = target.fs
    orphan = "subsystems/nqn.2026-11.io.kvagent:old-name:kv:gpu-1"
    fs.mkdir(orphan)
    fs.mkdir(f"{orphan}/namespaces/1")
    fs.write(f"{orphan}/namespaces/1/device_path", str(pool_dir / "gpu-1/ns1.img"))
    with pytest.raises(KvagentError) as err:
        destroy(target, tmp_path, yes=True)
    assert f"is exported by namespace 1 of {orphan.split('/')[1]}" in err.value.message
    assert (pool_dir / "gpu-1/ns1.img").exists() and (pool_dir / "gpu-1/ns2.img").exists()


def test_destroy_still_exported_or_configured_is_refused(target: Target, tmp_path: Path) -> None:
    cfg = config(tmp_path, [file_pool(tmp_path, hosts=(("gpu-1", H1),))])
    assert target.run(cfg).ok
    with pytest.raises(KvagentError, match="still in the config"):
        destroy_pool(cfg, "kv", FakeRunner(), yes=True, fs=target.fs)
    with pytest.raises(KvagentError, match="still exported"):
        destroy(target, tmp_path, yes=True)


def test_destroy_waits_for_the_apply_lock(target: Target, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.lock import Busy, apply_lock
    from agent.target import inventory

    unexported(target, tmp_path)
    monkeypatch.setattr(inventory, "DESTROY_LOCK_WAIT", 0.3)
    with apply_lock(tmp_path / "run"), pytest.raises(Busy):
        destroy(target, tmp_path, yes=True)
    assert (tmp_path / "files/kv/gpu-1/ns1.img").exists()
