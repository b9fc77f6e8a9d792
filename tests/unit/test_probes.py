"""probe_mount on this machine's real filesystem, and its recorded failure paths.

Failures the host cannot produce (tmpfs without O_DIRECT, a write-time
refusal, fallocate unsupported or not reserving) are simulated by
monkeypatching; the real-kernel tier shows the same on tmpfs and xfs.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from agent.system import probes
from agent.system.probes import logical_block_size, probe_mount

# Filesystems whose regular files take O_DIRECT, fallocate and report STATX_DIOALIGN
# (ext4 and xfs since Linux 6.1).
DIRECT_FS = {"ext4", "xfs"}


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (longest mount-point prefix)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mnt, fstype = line.split()[:3]
        mnt = mnt.replace("\\040", " ")
        if (str(path) == mnt or str(path).startswith(mnt.rstrip("/") + "/")) \
                and len(mnt) > len(best):
            best, kind = mnt, fstype
    return kind


def test_probe_real_directory(tmp_path: Path) -> None:
    result = probe_mount(tmp_path, "tcp", odirect_bytes=1 << 20, fallocate_bytes=8 << 20)
    assert result.path == str(tmp_path)
    assert result.transport == "tcp"
    assert os.listdir(tmp_path) == [], "probe left files behind"
    assert result.odirect.size_bytes >= 1 << 20
    assert result.odirect.size_bytes % result.odirect.alignment == 0
    vfs = os.statvfs(tmp_path)
    assert result.total_bytes == vfs.f_blocks * vfs.f_frsize
    st = os.stat(tmp_path)
    assert result.device == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    if fs_type(tmp_path) in DIRECT_FS:
        assert result.odirect_ok and result.odirect.failure is None
        assert result.fallocate_ok
        assert result.fallocate.reserved_bytes >= result.fallocate.requested_bytes
        assert result.dio_align.offset_align and result.dio_align.mem_align
    else:  # record, whatever it is, must be explained
        assert result.odirect_ok or result.odirect.failure is not None
        assert result.fallocate_ok or result.fallocate.failure is not None


def test_result_is_json_and_timestamped(tmp_path: Path) -> None:
    moments = iter([datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
                    datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc)])
    result = probe_mount(tmp_path, "rdma", clock=lambda: next(moments),
                         odirect_bytes=4096, fallocate_bytes=1 << 20)
    data = json.loads(json.dumps(dataclasses.asdict(result)))
    assert data["started_at"] == "2026-01-02T03:04:05Z"
    assert data["finished_at"] == "2026-01-02T03:04:06Z"
    assert data["transport"] == "rdma"
    assert set(data) >= {"odirect_ok", "fallocate_ok", "dio_align", "logical_block_size",
                         "free_bytes", "total_bytes"}


def test_odirect_refused_at_open_like_tmpfs(tmp_path: Path, monkeypatch) -> None:
    real_open = os.open

    def no_direct(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            # tmpfs before Linux 6.6 creates the file, then refuses O_DIRECT.
            real_open(path, flags & ~os.O_DIRECT, *args, **kwargs)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    result = probe_mount(tmp_path, odirect_bytes=4096, fallocate_bytes=1 << 20)
    assert not result.odirect_ok
    assert result.odirect.failure.step == "open"
    assert result.odirect.failure.errno == errno.EINVAL
    assert "EINVAL" in result.odirect.failure.error
    assert os.listdir(tmp_path) == [], "the file created before the refusal was left behind"


def test_odirect_accepted_at_open_refused_at_write(tmp_path: Path, monkeypatch) -> None:
    def refuse(fd, buffers, offset):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "pwritev", refuse)
    result = probe_mount(tmp_path, odirect_bytes=4096, fallocate_bytes=1 << 20)
    assert not result.odirect_ok
    assert (result.odirect.failure.step, result.odirect.failure.errno) == ("write", errno.EINVAL)
    assert os.listdir(tmp_path) == []


def test_data_that_does_not_come_back_fails_verify(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: len(buffers[0]))
    result = probe_mount(tmp_path, odirect_bytes=4096, fallocate_bytes=1 << 20)
    if fs_type(tmp_path) in DIRECT_FS:
        assert not result.odirect_ok
        assert result.odirect.failure.step == "verify"
    assert os.listdir(tmp_path) == []


def test_fallocate_unsupported_is_recorded(tmp_path: Path, monkeypatch) -> None:
    def unsupported(fd, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(probes, "_fallocate", unsupported)
    result = probe_mount(tmp_path, odirect_bytes=4096, fallocate_bytes=1 << 20)
    assert not result.fallocate_ok
    assert result.fallocate.failure.step == "fallocate"
    assert result.fallocate.failure.errno == errno.EOPNOTSUPP
    assert os.listdir(tmp_path) == []


def test_fallocate_that_reserves_nothing_is_caught(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(probes, "_fallocate", lambda fd, length: "fallocate")
    result = probe_mount(tmp_path, odirect_bytes=4096, fallocate_bytes=1 << 20)
    assert not result.fallocate_ok
    assert result.fallocate.failure.step == "reserve"
    assert result.fallocate.reserved_bytes == 0
    assert os.listdir(tmp_path) == []


def test_missing_directory_does_not_raise(tmp_path: Path) -> None:
    result = probe_mount(tmp_path / "gone", odirect_bytes=4096, fallocate_bytes=1 << 20)
    assert not result.odirect_ok and not result.fallocate_ok
    assert result.odirect.failure.errno == errno.ENOENT
    assert result.total_bytes is None and result.errors


def _fake_sysfs(root: Path) -> None:
    disk = root / "devices" / "virtual" / "block" / "nvme1n1"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue" / "logical_block_size").write_text("4096\n")
    part = disk / "nvme1n1p1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    links = root / "dev" / "block"
    links.mkdir(parents=True)
    os.symlink("../../devices/virtual/block/nvme1n1", links / "259:0")
    os.symlink("../../devices/virtual/block/nvme1n1/nvme1n1p1", links / "259:1")


def test_logical_block_size_from_sysfs(tmp_path: Path) -> None:
    _fake_sysfs(tmp_path)
    assert logical_block_size(os.makedev(259, 0), tmp_path) == 4096
    assert logical_block_size(os.makedev(259, 1), tmp_path) == 4096  # partition: parent's
    assert logical_block_size(os.makedev(0, 42), tmp_path) is None  # tmpfs-like, no device


def test_statx_errors_are_reported_not_raised(tmp_path: Path, monkeypatch) -> None:
    missing = probes.statx_dioalign(str(tmp_path / "missing"))
    assert (missing.mem_align, missing.offset_align) == (None, None)
    assert "No such file" in missing.error
    monkeypatch.setattr(probes.platform, "machine", lambda: "sparc64")
    other = probes.statx_dioalign(str(tmp_path))
    assert other.mem_align is None and "sparc64" in other.error


def test_statx_of_a_file_on_ext4_or_xfs(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    dio = probes.statx_dioalign(str(f))
    release = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
    if fs_type(tmp_path) in DIRECT_FS and release >= (6, 1):
        assert dio.mem_align and dio.offset_align and dio.error is None
    else:
        assert (dio.mem_align is None) == (dio.offset_align is None)


def test_the_pattern_tells_every_block_apart() -> None:
    """What the O_DIRECT probe writes: a block read back from the wrong offset, or a
    stale copy of another block, differs (a cheap pattern instead of 4 MiB of urandom
    and two sha256 digests, which were most of a probe under TCG)."""
    from agent.system.probes import _pattern

    data = _pattern(64 * 4096 + 100)
    assert len(data) == 64 * 4096 + 100
    blocks = {data[i:i + 4096] for i in range(0, 64 * 4096, 4096)}
    assert len(blocks) == 64
    assert _pattern(8192) != _pattern(8192), "a fresh random block per probe"
