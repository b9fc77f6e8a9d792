"""A mounted xfs: shut down (stat answers EIO), geometry (one ioctl), growth threshold."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from agent.initiator import xfsmount
from agent.initiator.xfsmount import GROW_MIN_BYTES, Geometry, geometry, is_shut_down, needs_growth


def test_eio_from_stat_is_a_shutdown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert is_shut_down(str(tmp_path)) is False

    def eio(path: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(xfsmount.os, "stat", eio)
    assert is_shut_down(str(tmp_path)) is True


def test_other_errors_are_not_a_shutdown(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        is_shut_down(str(tmp_path / "missing"))


def test_geometry_reads_block_size_and_data_blocks(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    asked = []

    def ioctl(fd: int, request: int, buf: bytearray) -> int:
        asked.append(request)
        struct.pack_into("=I", buf, 0, 4096)
        struct.pack_into("=Q", buf, 32, 179200)  # xfs_fsop_geom_v1.datablocks
        return 0

    monkeypatch.setattr(xfsmount.fcntl, "ioctl", ioctl)
    assert geometry(str(tmp_path)) == Geometry(4096, 179200)
    assert asked == [0x80705864]  # _IOR('X', 100, 112 bytes)
    assert Geometry(4096, 179200).data_bytes == 734003200


def test_growth_threshold() -> None:
    fs = Geometry(4096, 1000)
    assert not needs_growth(None, fs)
    assert not needs_growth(fs.data_bytes + GROW_MIN_BYTES - 4096, fs)
    assert needs_growth(fs.data_bytes + GROW_MIN_BYTES, fs)
