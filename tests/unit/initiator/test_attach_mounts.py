"""Mounts: never stacked, never over files, never lazily unmounted; mount dirs made and removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import KvagentError
from agent.initiator.mounts import (
    MountBusy,
    create_mount_point,
    ensure_mounted,
    mounted_at,
    read_mounts,
    remove_mount_points,
    unmount,
)
from agent.system.run import CommandError
from tests.unit.fakerunner import FakeRunner

ROOT = "21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"


def table(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(ROOT + "".join(lines))
    return path


def line(mount: str, number: str = "259:1", source: str = "/dev/nvme2n1") -> str:
    return f"99 21 {number} / {mount} rw,noatime shared:9 - xfs {source} rw,attr2\n"


def devnum(mapping: dict[str, str]):
    return lambda device: mapping[device]


def test_mountinfo_escapes_and_last_mount_wins(tmp_path: Path) -> None:
    info = table(tmp_path, line("/mnt/a\\040b", "259:1"), line("/mnt/x", "259:2"),
                 line("/mnt/x", "259:3", "/dev/nvme3n1"))
    assert [m.mount_point for m in read_mounts(info)] == ["/", "/mnt/a b", "/mnt/x", "/mnt/x"]
    entry = mounted_at("/mnt/x/", info)
    assert entry is not None and (entry.device, entry.source) == ("259:3", "/dev/nvme3n1")
    assert mounted_at("/mnt", info) is None


def test_mount_creates_the_directory_and_mounts_once(tmp_path: Path) -> None:
    info = table(tmp_path)
    path = str(tmp_path / "mnt/kv/ns1")
    r = FakeRunner().on(["mount"])
    assert ensure_mounted("/dev/nvme2n1", path, ("noatime", "inode64"), r, info,
                          devnum({"/dev/nvme2n1": "259:1"})) is True
    assert r.ran("mount") == [("mount", "-t", "xfs", "-o", "noatime,inode64", "/dev/nvme2n1",
                               path)]
    info.write_text(ROOT + line(path))
    assert ensure_mounted("/dev/nvme2n1", path, (), r, info,
                          devnum({"/dev/nvme2n1": "259:1"})) is False
    assert len(r.ran("mount")) == 1


def test_another_device_mounted_there_is_an_error(tmp_path: Path) -> None:
    path = str(tmp_path / "ns1")
    info = table(tmp_path, line(path, "8:17", "/dev/sdb1"))
    r = FakeRunner()
    with pytest.raises(KvagentError, match="already has /dev/sdb1"):
        ensure_mounted("/dev/nvme2n1", path, (), r, info, devnum({"/dev/nvme2n1": "259:1"}))
    assert r.calls == []


def test_files_in_the_directory_are_not_hidden(tmp_path: Path) -> None:
    path = tmp_path / "ns1"
    path.mkdir()
    (path / "leftover").write_text("x")
    r = FakeRunner()
    with pytest.raises(KvagentError, match="would hide them"):
        ensure_mounted("/dev/nvme2n1", str(path), (), r, table(tmp_path), devnum({}))
    assert r.calls == []


def test_busy_unmount_is_reported_never_lazy(tmp_path: Path) -> None:
    info = table(tmp_path, line("/mnt/kv/ns1"))
    r = FakeRunner().on(["umount"], "", 32, "umount: /mnt/kv/ns1: target is busy.")
    with pytest.raises(MountBusy, match="is busy") as exc:
        unmount("/mnt/kv/ns1", r, info)
    assert "fuser -vm /mnt/kv/ns1" in exc.value.hint
    assert r.calls == [("umount", "/mnt/kv/ns1")]


def test_other_unmount_failures_are_raised(tmp_path: Path) -> None:
    info = table(tmp_path, line("/mnt/kv/ns1"))
    r = FakeRunner().on(["umount"], "", 1, "umount: /mnt/kv/ns1: must be superuser")
    with pytest.raises(CommandError, match="must be superuser"):
        unmount("/mnt/kv/ns1", r, info)


def test_unmount_of_what_is_not_mounted_does_nothing(tmp_path: Path) -> None:
    r = FakeRunner()
    assert unmount("/mnt/kv/ns1", r, table(tmp_path)) is False and r.calls == []


def test_mount_points_made_are_reported_and_removed_only_when_empty(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    made = create_mount_point(str(tmp_path / "mnt/kv/ns1"))
    made += create_mount_point(str(tmp_path / "mnt/kv/ns2"))
    assert made == [str(tmp_path / "mnt/kv"), str(tmp_path / "mnt/kv/ns1"),
                    str(tmp_path / "mnt/kv/ns2")]
    assert create_mount_point(str(tmp_path / "mnt/kv/ns1")) == []
    (tmp_path / "mnt/kv/ns2/keep").write_text("data")
    info = table(tmp_path)
    assert remove_mount_points(made, info) == [str(tmp_path / "mnt/kv/ns1")]
    assert (tmp_path / "mnt/kv/ns2/keep").exists() and (tmp_path / "mnt").is_dir()


def test_a_mounted_directory_is_never_removed(tmp_path: Path) -> None:
    made = create_mount_point(str(tmp_path / "m/ns1"))
    info = table(tmp_path, line(str(tmp_path / "m/ns1")))
    assert remove_mount_points(made, info) == []
    assert (tmp_path / "m/ns1").is_dir()
