"""Issue 24, item 1 (the class, not just ``../../victim.conf``): a link planted in a file
pool's directory is never followed. A namespace file, its ``.creating`` name, a host
directory or the pool directory that is a symbolic link: the pool is refused with the
path named, nothing is exported, grown, moved or created through it (before, a link at
``<host>/ns1.img`` to a root file was exported to the GPU host, and a link at
``<host>/`` had kvagent create and export files outside the pool)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.records import FileManifest, ManifestEntry
from agent.target.backings import file

from .helpers import H1, Target, config, file_pool

MIB = 1 << 20
UUID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
NGUID = "0b1c2d3e4f504a6b8c7d9e0f1a2b3c4d"
SECRET = b"root:$6$secret:19000:0:99999:7:::\n" * 200_000  # > the namespace's 4 MiB


def snapshot(path: Path) -> tuple[bytes, int, int]:
    st = os.stat(path)
    return path.read_bytes(), st.st_ino, st.st_mtime_ns


@pytest.mark.parametrize("case", ["file, creating", "file, created", "temp", "host dir",
                                  "pool dir"])
def test_a_link_in_a_file_pool_is_never_followed(tmp_path: Path, case: str) -> None:
    target = Target(tmp_path)
    cfg = config(tmp_path, [file_pool(tmp_path, count=1, hosts=(("gpu-1", H1),))])
    pool_dir = tmp_path / "files/kv"
    victim = tmp_path / "victim.conf"
    victim.write_bytes(SECRET)
    target.fs.add_device(str(victim), "file")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    creating = ManifestEntry(4 * MIB, UUID, NGUID, "creating", "gpu-1/.ns1.img.creating")
    if case == "file, created":  # made by kvagent, then swapped for a link; nvmet emptied
        assert target.run(cfg).ok
        target = Target(tmp_path)
        target.fs.add_device(str(victim), "file")
        (pool_dir / "gpu-1/ns1.img").unlink()
        (pool_dir / "gpu-1/ns1.img").symlink_to(victim)
        named = pool_dir / "gpu-1/ns1.img"
    elif case == "pool dir":
        (tmp_path / "files").mkdir()
        pool_dir.symlink_to(elsewhere)
        (elsewhere / "gpu-1").mkdir()
        FileManifest("kv", {"gpu-1/ns1.img": creating}).save(elsewhere)
        named = pool_dir
    else:
        pool_dir.mkdir(parents=True)
        if case == "host dir":
            (pool_dir / "gpu-1").symlink_to(elsewhere)
            named = pool_dir / "gpu-1"
        else:
            (pool_dir / "gpu-1").mkdir()
            named = pool_dir / ("gpu-1/ns1.img" if case == "file, creating"
                                else "gpu-1/.ns1.img.creating")
            named.symlink_to(victim)
        FileManifest("kv", {"gpu-1/ns1.img": creating}).save(pool_dir)
    before = snapshot(victim)
    outside = sorted(elsewhere.rglob("*"))

    result = target.run(cfg)

    (error,) = result.errors
    assert error.pool == "kv" and f"{named} is a symbolic link" in error.message, error
    assert "never follows a link out of a pool directory" in error.message
    assert not target.fs.exists("subsystems/nqn.2026-11.io.kvagent:stor:kv:gpu-1")
    assert not [o for o in target.fs.ops if o.path.endswith("device_path")]
    assert snapshot(victim) == before
    assert sorted(elsewhere.rglob("*")) == outside, "nothing made outside the pool"
    assert not [a for a in result.actions if a.kind.startswith("file.")]


def test_the_steps_refuse_a_link_too(tmp_path: Path) -> None:
    """Were a step run from a plan made before the link appeared, it refuses as well."""
    pool_dir = tmp_path / "kv"
    (pool_dir / "gpu-1").mkdir(parents=True)
    victim = tmp_path / "victim.conf"
    victim.write_bytes(SECRET)
    before = snapshot(victim)
    (pool_dir / "gpu-1/ns1.img").symlink_to(victim)
    entry = ManifestEntry(4 * MIB, UUID, NGUID, "creating", "gpu-1/.ns1.img.creating")
    with pytest.raises(file.FileBackingError, match="is a symbolic link"):
        file.finish_file(pool_dir, "gpu-1/ns1.img", entry)
    (pool_dir / "gpu-1/ns1.img").unlink()
    (pool_dir / "gpu-2").symlink_to(tmp_path)
    with pytest.raises(file.FileBackingError, match="gpu-2 is a symbolic link"):
        file.create_file(pool_dir, "gpu-2/ns1.img", 4 * MIB, UUID, NGUID)
    assert "gpu-2/ns1.img" not in FileManifest.load(pool_dir).files
    assert snapshot(victim) == before
    assert not (tmp_path / "ns1.img").exists() and not (tmp_path / ".ns1.img.creating").exists()
