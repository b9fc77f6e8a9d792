"""agent.system.xfsquota without a kernel: the ABI it speaks, the mount options it reads,
how it maps the kernel's answers, and which entries tag_tree touches (the ioctl itself is
replaced; the kernel tier, tests/kernel/test_cache_quota.py, runs the real one on xfs)."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from agent.system import xfsquota
from agent.system.mounts import read_mounts
from agent.system.xfsquota import (
    FsDiskQuota,
    QuotaUnavailable,
    get_quota,
    project_quota_mode,
    set_hard_limit,
    tag_tree,
    wanted_quota_mode,
    with_project_quota,
)


# ------------------------------------------------------------------------- ABI
def test_the_structures_have_the_kernels_layout() -> None:
    # linux/dqblk_xfs.h: struct fs_disk_quota is 112 bytes, d_bcount at offset 40;
    # linux/fs.h: struct fsxattr is 28 bytes, FS_IOC_FSGETXATTR = _IOR('X', 31, ...).
    assert ctypes.sizeof(FsDiskQuota) == 112
    assert FsDiskQuota.d_bcount.offset == 40 and FsDiskQuota.d_blk_hardlimit.offset == 8
    assert FsDiskQuota.d_rtb_hardlimit.offset == 72
    assert xfsquota.FS_IOC_FSGETXATTR == 0x801C581F
    assert xfsquota.FS_IOC_FSSETXATTR == 0x401C5820
    assert xfsquota.qcmd(xfsquota.Q_XGETQUOTA, xfsquota.PRJQUOTA) == 0x580302
    assert xfsquota.qcmd(xfsquota.Q_XSETQLIM, xfsquota.PRJQUOTA) == 0x580402


# --------------------------------------------------------------- mount options
def mountinfo(tmp_path: Path, super_options: str, fstype: str = "xfs") -> Path:
    path = tmp_path / "mountinfo"
    path.write_text("21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                    f"99 21 259:1 / /srv/kv/ns1 rw,noatime - {fstype} /dev/nvme1n1 "
                    f"{super_options}\n")
    return path


@pytest.mark.parametrize(("options", "mode"), [
    ("rw,attr2,inode64,logbufs=8,logbsize=32k,prjquota", "enforced"),
    ("rw,attr2,inode64,logbufs=8,logbsize=32k,usrquota,prjquota", "enforced"),
    ("rw,attr2,inode64,pqnoenforce", "accounted"),
    ("rw,attr2,inode64,logbufs=8,logbsize=32k,noquota", "off"),
    ("rw,attr2,inode64,usrquota", "off"),
])
def test_quota_mode_is_read_from_the_superblock_options(tmp_path: Path, options: str,
                                                        mode: str) -> None:
    (_, entry) = read_mounts(mountinfo(tmp_path, options))
    assert entry.super_options == options
    assert project_quota_mode(entry) == mode


def test_a_filesystem_other_than_xfs_has_no_project_quota_here(tmp_path: Path) -> None:
    (_, entry) = read_mounts(mountinfo(tmp_path, "rw,prjquota", fstype="ext4"))
    assert project_quota_mode(entry) == "off"


@pytest.mark.parametrize(("given", "mounted_with", "mode"), [
    (("noatime",), ("noatime", "prjquota"), "enforced"),
    ((), ("prjquota",), "enforced"),
    (("noatime", "pquota"), ("noatime", "pquota"), "enforced"),
    (("noatime", "pqnoenforce"), ("noatime", "pqnoenforce"), "accounted"),
    (("noatime", "noquota"), ("noatime", "noquota"), "off"),
])
def test_kvagent_adds_prjquota_unless_the_operator_chose(given: tuple[str, ...],
                                                         mounted_with: tuple[str, ...],
                                                         mode: str) -> None:
    assert with_project_quota(given) == mounted_with
    assert wanted_quota_mode(mounted_with) == mode


# -------------------------------------------------------------------- quotactl
def fake_quotactl(monkeypatch: pytest.MonkeyPatch, *, fill: dict | None = None,
                  fail: int | None = None) -> list[tuple[int, int, FsDiskQuota]]:
    seen: list[tuple[int, int, FsDiskQuota]] = []

    def quotactl(mount: str, cmd: int, projid: int, dq: FsDiskQuota) -> None:
        seen.append((cmd, projid, dq))
        if fail is not None:
            raise OSError(fail, os.strerror(fail), mount)
        for name, value in (fill or {}).items():
            setattr(dq, name, value)

    monkeypatch.setattr(xfsquota, "_quotactl", quotactl)
    return seen


def test_usage_and_limits_come_back_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = fake_quotactl(monkeypatch, fill={"d_bcount": 2048, "d_blk_hardlimit": 4096,
                                            "d_blk_softlimit": 0, "d_icount": 7})
    q = get_quota("/srv/kv/ns1", 1002)
    assert (q.used_bytes, q.hard_limit_bytes, q.inodes) == (2048 * 512, 4096 * 512, 7)
    assert [(c, p) for c, p, _ in seen] == [(xfsquota.Q_XGETQUOTA, 1002)]


def test_a_project_without_a_record_reads_as_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_quotactl(monkeypatch, fail=errno.ENOENT)
    q = get_quota("/srv/kv/ns1", 1001)
    assert (q.used_bytes, q.hard_limit_bytes) == (0, 0)


@pytest.mark.parametrize(("code", "words"), [
    (errno.ENOSYS, "Linux 5.14"), (errno.EPERM, "SystemCallFilter="),
    (errno.ESRCH, "mount with prjquota"), (errno.ENOTTY, "not xfs"),
])
def test_a_refusal_is_explained(monkeypatch: pytest.MonkeyPatch, code: int, words: str) -> None:
    fake_quotactl(monkeypatch, fail=code)
    with pytest.raises(QuotaUnavailable) as info:
        get_quota("/srv/kv/ns1", 1001)
    assert words in info.value.message and info.value.errno == code


def test_a_hard_limit_is_written_in_basic_blocks_with_no_soft_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = fake_quotactl(monkeypatch)
    set_hard_limit("/srv/kv/ns1", 1003, 3 * 1024 * 1024)
    ((cmd, projid, dq),) = seen
    assert (cmd, projid, dq.d_id) == (xfsquota.Q_XSETQLIM, 1003, 1003)
    assert dq.d_blk_hardlimit == 3 * 1024 * 1024 // 512 and dq.d_blk_softlimit == 0
    assert dq.d_fieldmask == xfsquota.FS_DQ_BHARD | xfsquota.FS_DQ_BSOFT
    assert (dq.d_version, dq.d_flags) == (xfsquota.FS_DQUOT_VERSION, xfsquota.FS_PROJ_QUOTA)


# -------------------------------------------------------------------- tag_tree
def recording_set_project(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """set_project replaced by a recorder of the path each fd names."""
    done: list[tuple[str, int, bool]] = []

    def record(fd: int, projid: int, *, inherit: bool) -> bool:
        done.append((os.readlink(f"/proc/self/fd/{fd}"), projid, inherit))
        return True

    monkeypatch.setattr(xfsquota, "set_project", record)
    return done


def test_tag_tree_sets_every_directory_and_file_and_follows_no_symlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = tmp_path / "mnt/vllm"
    (engine / "model/r0").mkdir(parents=True)
    (engine / "model/r0/block.bin").write_bytes(b"x")
    (engine / "top.bin").write_bytes(b"y")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret").write_text("not the engine's")
    (engine / "link-dir").symlink_to(outside)
    (engine / "link-file").symlink_to(outside / "secret")
    os.mkfifo(engine / "fifo")
    done = recording_set_project(monkeypatch)
    ticks: list[int] = []
    n = tag_tree(str(engine), 1002, tick=lambda: ticks.append(1))
    touched = {p for p, _, _ in done}
    assert touched == {str(engine), str(engine / "model"), str(engine / "model/r0"),
                       str(engine / "model/r0/block.bin"), str(engine / "top.bin")}
    assert n == len(done) == 5
    assert done[0] == (str(engine), 1002, True), "the root is tagged before it is read"
    assert all(inherit == os.path.isdir(p) for p, _, inherit in done)
    assert not any(str(outside) in p for p in touched)


def test_tag_tree_refuses_a_symlinked_root(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "engine").symlink_to(real)
    done = recording_set_project(monkeypatch)
    with pytest.raises(OSError) as info:
        tag_tree(str(tmp_path / "engine"), 1001)
    assert info.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert done == []


def test_tag_tree_holds_no_fd_per_pending_directory(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, item 14: 1,500 pending directories under a limit of 1,024 fds."""
    from tests.unit.engines.test_cleaner import low_fd_limit, wide_tree

    engine = wide_tree(tmp_path / "engine", 300)
    done = recording_set_project(monkeypatch)
    with low_fd_limit(40):
        tag_tree(str(engine), 1002)
    files = {p for p, _, inherit in done if not inherit}
    assert len(files) == 300 and len(done) == 1 + 300 + 30 + 300  # root, dirs, nested, files
