"""tests/kernel/logwrites.py: the dm-log-writes reader and replayer, on logs written in the
kernel's layout (the real-kernel check: tests/kernel/test_flush_points.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel.logwrites import (
    DISCARD,
    FLUSH,
    FUA,
    MARK,
    LogError,
    read_log,
    replay,
    write_log,
)

SS = 512


def block(byte: int, n: int = 1) -> bytes:
    return bytes([byte]) * (SS * n)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "log.img"
    write_log(str(path), SS, [
        (0, 1, 0, block(1)),          # 0: write A at 0
        (2, 2, 0, block(2, 2)),       # 1: write B at 2-3
        (0, 0, FLUSH, b""),           # 2: flush
        (0, 0, MARK, "step-1"),       # 3: mark
        (2, 1, DISCARD, b""),         # 4: discard 2
        (5, 1, FUA, block(5)),        # 5: FUA write at 5
        (0, 1, 0, block(9)),          # 6: overwrite 0
        (0, 0, MARK, "end"),          # 7
    ])
    return path


def image(tmp_path: Path, fill: int = 0xEE) -> Path:
    path = tmp_path / "dev.img"
    path.write_bytes(bytes([fill]) * (SS * 8))
    return path


def sectors(path: Path) -> list[int]:
    data = path.read_bytes()
    return [data[i * SS] for i in range(len(data) // SS)]


def test_entries_flush_points_and_marks_are_read(log: Path) -> None:
    parsed = read_log(str(log))
    assert parsed.sectorsize == SS and len(parsed.entries) == 8
    assert parsed.flush_points() == [2, 5]
    assert parsed.marks() == ["step-1", "end"] and parsed.mark("step-1") == 3
    with pytest.raises(LogError, match="no mark 'nope'"):
        parsed.mark("nope")


def test_replay_up_to_a_point_keeps_exactly_the_entries_before_it(log: Path,
                                                                  tmp_path: Path) -> None:
    parsed = read_log(str(log))
    dev = image(tmp_path)
    assert replay(parsed, str(dev), parsed.mark("step-1")) == 2
    assert sectors(dev) == [1, 0xEE, 2, 2, 0xEE, 0xEE, 0xEE, 0xEE]
    # on from there: the discard zeroes, the FUA write lands; the last write not yet
    assert replay(parsed, str(dev), 5, start=parsed.mark("step-1") + 1) == 2
    assert sectors(dev) == [1, 0xEE, 0, 2, 0xEE, 5, 0xEE, 0xEE]
    replay(parsed, str(dev), 7, start=6)
    assert sectors(dev)[0] == 9


def test_the_data_follows_a_bigger_sector_size(tmp_path: Path) -> None:
    path = tmp_path / "log4k.img"
    write_log(str(path), 4096, [(1, 1, 0, bytes([7]) * 4096), (0, 0, FLUSH, b"")])
    dev = tmp_path / "dev4k.img"
    dev.write_bytes(bytes(3 * 4096))
    parsed = read_log(str(path))
    replay(parsed, str(dev), parsed.flush_points()[-1])
    assert dev.read_bytes()[4096:8192] == bytes([7]) * 4096
    assert dev.read_bytes()[:4096] == bytes(4096)


def test_what_is_not_a_log_or_is_cut_short_is_refused(log: Path, tmp_path: Path) -> None:
    other = tmp_path / "zeros.img"
    other.write_bytes(bytes(4096))
    with pytest.raises(LogError, match="not a dm-log-writes log"):
        read_log(str(other))
    short = tmp_path / "short.img"
    short.write_bytes(log.read_bytes()[:SS * 4])
    with pytest.raises(LogError, match="past the log's end"):
        read_log(str(short))


def test_distinct_points_drop_flushes_with_no_write_since_the_last_kept(tmp_path: Path) -> None:
    path = tmp_path / "points.img"
    write_log(str(path), SS, [
        (0, 0, MARK, "start"),        # 0
        (0, 1, 0, block(1)),          # 1: write
        (0, 0, FLUSH, b""),           # 2: flush (kept)
        (0, 0, FLUSH, b""),           # 3: flush, nothing written since 2: same image
        (0, 0, MARK, "between"),      # 4: a mark is no write
        (0, 0, FLUSH, b""),           # 5: same image again
        (3, 1, FUA, block(3)),        # 6: a FUA write is a point and a write (kept)
        (4, 1, DISCARD, b""),         # 7: a discard changes the image
        (0, 0, FLUSH, b""),           # 8: kept
        (0, 0, MARK, "end"),          # 9
        (0, 0, FLUSH, b""),           # 10: outside the range
    ])
    log = read_log(str(path))
    assert log.distinct_points(log.mark("start"), log.mark("end")) == ([2, 6, 8], 5)
    assert log.distinct_points() == ([2, 6, 8], 6)
    assert log.distinct_points(3, 5) == ([3], 2)
