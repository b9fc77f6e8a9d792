"""dm-log-writes on the real kernel: the log tests/kernel/logwrites.py reads is the kernel's,
and replaying it to a point keeps exactly what a drive losing its cache would keep.

A 16 MiB data device under ``log-writes``: one write made durable (fsync), one O_DIRECT
write that reached the device but was never flushed, a mark; then a flush and another
mark. Replayed onto the starting image up to the first mark, the durable write is there
and the unflushed one is not — while the data device itself (what a drive with a cache
that never loses anything shows, as the test VM's ``cache=unsafe`` drives do) has both.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from . import kit
from .logwrites import read_log, replay

pytestmark = pytest.mark.kernel(group="hostile")
MIB = 1 << 20


def _loop(img: Path, size: int) -> str:
    with open(img, "wb") as f:
        f.truncate(size)
    return kit.sh("losetup", "--show", "-f", str(img)).stdout.strip()


def _direct_write(dev: str, offset: int, byte: int, sync: bool) -> None:
    buf = mmap.mmap(-1, 4096)
    buf.write(bytes([byte]) * 4096)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        os.pwrite(fd, buf, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _at(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(4096)


def test_a_replay_to_a_mark_keeps_flushed_writes_and_loses_unflushed_ones(
        tmp_path: Path) -> None:
    kit.modprobe("loop", "dm-log-writes")
    data = _loop(tmp_path / "data.img", 16 * MIB)
    logdev = _loop(tmp_path / "log.img", 16 * MIB)
    name = "kvlw-proof"
    try:
        kit.sh("dmsetup", "create", name, "--table",
               f"0 {16 * MIB // 512} log-writes {data} {logdev}")
        dev = f"/dev/mapper/{name}"
        _direct_write(dev, 0, 0xA1, sync=True)          # durable
        _direct_write(dev, 4 * MIB, 0xB2, sync=False)   # reached the drive, never flushed
        kit.sh("dmsetup", "message", name, "0", "mark", "cut")
        _direct_write(dev, 8 * MIB, 0xC3, sync=True)    # its flush makes B durable too
        kit.sh("dmsetup", "message", name, "0", "mark", "after")
    finally:
        kit.sh("dmsetup", "remove", name, check=False)  # logs what is left, then the end mark
    try:
        log = read_log(logdev)
        assert log.marks()[:2] == ["cut", "after"], log.marks()
        assert log.flush_points(), "the fsyncs logged flushes"
        # the data device kept everything (no cache was ever lost)
        assert _at(data, 4 * MIB) == bytes([0xB2]) * 4096
        start = tmp_path / "start.img"
        with open(start, "wb") as f:
            f.truncate(16 * MIB)
        replay(log, str(start), log.mark("cut"))
        assert _at(str(start), 0) == bytes([0xA1]) * 4096, "a flushed write is kept"
        assert _at(str(start), 4 * MIB) == bytes(4096), "an unflushed write is lost"
        replay(log, str(start), log.mark("after"), start=log.mark("cut") + 1)
        assert _at(str(start), 4 * MIB) == bytes([0xB2]) * 4096
        assert _at(str(start), 8 * MIB) == bytes([0xC3]) * 4096
    finally:
        kit.sh("losetup", "-d", data, check=False)
        kit.sh("losetup", "-d", logdev, check=False)
