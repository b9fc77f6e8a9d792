"""Read and replay a dm-log-writes log: what a drive that loses its volatile cache keeps.

dm-log-writes (drivers/md/dm-log-writes.c; QEMU's ``blklogwrites`` writes the same
format) logs a write only once a FLUSH has made it durable, or at once for a FUA write,
in the order the data reached stable media; ``dmsetup message DEV 0 mark NAME`` adds a
named mark. Replaying the log onto the device's starting image up to an entry gives the
device as it would be after a power cut at that point, the drive's unflushed cache lost.

The log device: the super block in its first 512 bytes (magic, version, entry count,
sector size); the entries from byte ``sectorsize`` on, each a ``sectorsize`` block (the
entry: sector, sector count, flags, data length; a mark's name follows it in the same
block) followed, unless it is a discard, by the written data. Sectors and counts are in
the data device's logical blocks. Standard library only (it runs in the test VM).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

MAGIC = 0x6A736677736872
VERSION = 1
FLUSH, FUA, DISCARD, MARK, METADATA = 1, 2, 4, 8, 16
_SUPER = struct.Struct("<QQQI")
_ENTRY = struct.Struct("<QQQQ")


class LogError(ValueError):
    """Not a dm-log-writes log, or a log cut short."""


@dataclass(frozen=True)
class Entry:
    """One logged event: a write (``data_at``: its bytes' offset in the log), a discard,
    a flush or a mark."""

    index: int
    sector: int
    count: int
    flags: int
    mark: str
    data_at: int

    @property
    def durable_point(self) -> bool:
        """A flush or FUA: a point a power cut may land after with this entry kept."""
        return bool(self.flags & (FLUSH | FUA))


@dataclass(frozen=True)
class Log:
    path: str
    sectorsize: int
    entries: tuple[Entry, ...]

    def flush_points(self) -> list[int]:
        """Indexes of every flush and FUA entry, in order."""
        return [e.index for e in self.entries if e.durable_point]

    def distinct_points(self, first: int = 0,
                        last: int | None = None) -> tuple[list[int], int]:
        """The flush and FUA entries in ``first`` .. ``last`` (inclusive) less those with
        no write or discard since the previous one kept (replayed, they give the same
        image); and how many flush and FUA entries there are in that range in all."""
        end = len(self.entries) - 1 if last is None else last
        points = [i for i in self.flush_points() if first <= i <= end]
        kept: list[int] = []
        for i in points:
            if kept and not any(e.count and not e.flags & MARK
                                for e in self.entries[kept[-1] + 1:i + 1]):
                continue
            kept.append(i)
        return kept, len(points)

    def mark(self, name: str) -> int:
        """The index of the (first) mark ``name``."""
        for e in self.entries:
            if e.flags & MARK and e.mark == name:
                return e.index
        raise LogError(f"{self.path}: no mark {name!r} (marks: {self.marks()})")

    def marks(self) -> list[str]:
        return [e.mark for e in self.entries if e.flags & MARK]


def read_log(path: str) -> Log:
    """The entries of the log on ``path`` (a log device or an image of one)."""
    with open(path, "rb") as f:
        head = f.read(512)
        if len(head) < _SUPER.size:
            raise LogError(f"{path}: too short for a log super block")
        magic, version, count, sectorsize = _SUPER.unpack_from(head)
        if magic != MAGIC or version != VERSION:
            raise LogError(f"{path}: not a dm-log-writes log (magic {magic:#x}, "
                           f"version {version})")
        if sectorsize < 512 or sectorsize & (sectorsize - 1):
            raise LogError(f"{path}: sector size {sectorsize}")
        size = os.fstat(f.fileno()).st_size or _device_size(f)
        entries, at = [], sectorsize
        for index in range(count):
            if at + sectorsize > size:
                raise LogError(f"{path}: entry {index} of {count} lies past the log's end")
            f.seek(at)
            block = f.read(sectorsize)
            sector, nr, flags, data_len = _ENTRY.unpack_from(block)
            mark = ""
            if flags & MARK:
                mark = block[_ENTRY.size:_ENTRY.size + data_len].decode(errors="replace")
            entries.append(Entry(index, sector, nr, flags, mark, at + sectorsize))
            at += sectorsize + (0 if flags & DISCARD else nr * sectorsize)
        if at > size:
            raise LogError(f"{path}: the last entry's data lies past the log's end")
    return Log(path, sectorsize, tuple(entries))


def _device_size(f) -> int:  # type: ignore[no-untyped-def]
    return f.seek(0, os.SEEK_END)


def replay(log: Log, target: str, upto: int, start: int = 0) -> int:
    """Apply entries ``start`` .. ``upto`` (inclusive) of ``log`` to ``target``; returns
    how many writes and discards were applied. Discards write zeros (what the replay
    must not rely on either way); flushes and marks change nothing."""
    applied = 0
    with open(log.path, "rb") as src, open(target, "r+b") as dst:
        for e in log.entries[start:upto + 1]:
            if e.flags & MARK or not e.count:
                continue
            dst.seek(e.sector * log.sectorsize)
            if e.flags & DISCARD:
                _zero(dst, e.count * log.sectorsize)
            else:
                src.seek(e.data_at)
                _copy(src, dst, e.count * log.sectorsize)
            applied += 1
        dst.flush()
        os.fsync(dst.fileno())
    return applied


def _copy(src, dst, n: int) -> None:  # type: ignore[no-untyped-def]
    while n:
        chunk = src.read(min(n, 1 << 20))
        if not chunk:
            raise LogError("the log ends inside an entry's data")
        dst.write(chunk)
        n -= len(chunk)


def _zero(dst, n: int) -> None:  # type: ignore[no-untyped-def]
    zeros = bytes(min(n, 1 << 20))
    while n:
        dst.write(zeros[:min(n, len(zeros))])
        n -= min(n, len(zeros))


# ------------------------------------------------------------ a writer, for tests
def write_log(path: str, sectorsize: int,
              events: Iterable[tuple[int, int, int, bytes | str]]) -> None:
    """Write a log in the kernel's layout: ``events`` are (sector, count, flags, data),
    ``data`` the written bytes, or a mark's name. (For unit tests of the reader.)"""
    body = bytearray()
    n = 0
    for sector, count, flags, data in events:
        name = data.encode() if isinstance(data, str) else b""
        block = bytearray(sectorsize)
        _ENTRY.pack_into(block, 0, sector, count, flags, len(name))
        block[_ENTRY.size:_ENTRY.size + len(name)] = name
        body += block
        if not flags & (DISCARD | MARK):
            assert isinstance(data, bytes) and len(data) == count * sectorsize
            body += data
        n += 1
    head = bytearray(sectorsize)
    _SUPER.pack_into(head, 0, MAGIC, VERSION, n, sectorsize)
    with open(path, "wb") as f:
        f.write(head + body)
