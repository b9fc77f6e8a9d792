"""The oldest-first cleaner (agent.engines.cleaner): which files it picks, in what order,
and that nothing outside the engine's own directory can ever be deleted."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config.model import EngineCleaner, EngineConfig
from agent.config.types import AccountName, Percent
from agent.engines import cleaner
from agent.engines.cleaner import (
    Candidate,
    clean,
    delete,
    read_stats,
    record_run,
    scan,
    select_oldest,
)

from .fakequota import FakeQuota

KIB = 1024


def cand(mtime: int, name: str, size: int = 4 * KIB) -> Candidate:
    return Candidate(mtime, (name,), hash(name) & 0xFFFF, size)


# ------------------------------------------------------------------- selection
def test_oldest_first_until_enough_is_freed() -> None:
    files = [cand(5, "e"), cand(1, "a"), cand(3, "c"), cand(2, "b"), cand(4, "d")]
    assert [c.rel[0] for c in select_oldest(files, 9 * KIB)] == ["a", "b", "c"]
    assert [c.rel[0] for c in select_oldest(files, 8 * KIB)] == ["a", "b"]
    assert select_oldest(files, 0) == []
    assert [c.rel[0] for c in select_oldest(files, 10**9)] == ["a", "b", "c", "d", "e"]


def test_ties_in_mtime_go_by_path_and_empty_files_are_never_picked() -> None:
    files = [cand(1, "b"), cand(1, "a"), cand(0, "empty", size=0)]
    assert [c.rel[0] for c in select_oldest(files, 4 * KIB)] == ["a"]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 64 * KIB)), max_size=60),
       st.integers(0, 2 * 1024 * KIB))
def test_selection_is_the_shortest_oldest_prefix(spec: list[tuple[int, int]], need: int) -> None:
    files = [Candidate(m, (f"f{i:03}",), i, s) for i, (m, s) in enumerate(spec)]
    useful = sorted(c for c in files if c.size > 0)
    want, total = [], 0
    for c in useful:
        if total >= need > 0:
            break
        if need > 0:
            want.append(c)
            total += c.size
    assert select_oldest(iter(files), need) == want


# ------------------------------------------------------------------ containment
@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """An engine directory with nested files, next to things it must never touch."""
    mount = tmp_path / "ns1"
    engine = mount / "vllm"
    (engine / "model/r0").mkdir(parents=True)
    other = mount / "lmcache"
    other.mkdir()
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    paths = {"mount": mount, "engine": engine, "other": other, "outside": outside}
    for i, rel in enumerate(["model/r0/a.bin", "model/b.bin", "c.bin", "model/r0/d.bin"]):
        p = engine / rel
        p.write_bytes(b"k" * (64 * KIB))
        os.utime(p, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    (other / "theirs.bin").write_bytes(b"o" * (64 * KIB))
    os.utime(other / "theirs.bin", ns=(1, 1))  # older than anything in vllm's directory
    (outside / "secret.bin").write_bytes(b"s" * (64 * KIB))
    (outside / "dir/deep.bin").write_bytes(b"s" * (64 * KIB))
    for p in (outside / "secret.bin", outside / "dir/deep.bin"):
        os.utime(p, ns=(1, 1))
    (engine / "to-outside").symlink_to(outside)
    (engine / "model/to-secret.bin").symlink_to(outside / "secret.bin")
    os.link(outside / "dir/deep.bin", engine / "hardlink.bin")  # a second name: frees nothing
    os.mkfifo(engine / "fifo")
    return paths


def test_scan_sees_only_the_engines_own_regular_files(tree: dict[str, Path]) -> None:
    found = sorted("/".join(c.rel) for c in scan(str(tree["engine"])))
    assert found == ["c.bin", "model/b.bin", "model/r0/a.bin", "model/r0/d.bin"]


def test_a_directory_swapped_for_a_symlink_after_the_scan_is_not_followed(
        tree: dict[str, Path]) -> None:
    engine, outside = tree["engine"], tree["outside"]
    victims = select_oldest(scan(str(engine)), 10**9)
    # Between the scan and the deletion the engine's user replaces model/r0 by a symlink to
    # a directory outside that holds files of the same names.
    (engine / "model/r0").rename(engine / "model/r0-moved")
    (outside / "r0").mkdir()
    for name in ("a.bin", "d.bin"):
        (outside / "r0" / name).write_bytes(b"z")
    (engine / "model/r0").symlink_to(outside / "r0")
    files, _ = delete(str(engine), victims)
    assert files == 2  # c.bin and model/b.bin only
    assert sorted(p.name for p in (outside / "r0").iterdir()) == ["a.bin", "d.bin"]
    assert sorted(p.name for p in (engine / "model/r0-moved").iterdir()) == ["a.bin", "d.bin"]


def test_a_file_replaced_after_the_scan_is_left(tree: dict[str, Path]) -> None:
    engine = tree["engine"]
    victims = select_oldest(scan(str(engine)), 10**9)
    (engine / "c.bin").unlink()
    (engine / "c.bin").write_bytes(b"new")  # another inode now
    (engine / "model/b.bin").unlink()
    (engine / "model/b.bin").symlink_to(tree["outside"] / "secret.bin")
    files, _ = delete(str(engine), victims)
    assert files == 2  # the two under model/r0
    assert (engine / "c.bin").read_bytes() == b"new"
    assert (engine / "model/b.bin").is_symlink() and (tree["outside"] / "secret.bin").exists()


# ------------------------------------------------------------------------ runs
def engine_config(high: float = 95, low: float = 85) -> EngineConfig:
    return EngineConfig(kind="vllm", owner=AccountName(str(os.getuid())),
                        group=AccountName(str(os.getgid())),
                        cleaner=EngineCleaner(enabled=True, high=Percent(high),
                                              low=Percent(low)))


def quota_for(tree: dict[str, Path], cap: int) -> FakeQuota:
    q = FakeQuota()
    q.tag(str(tree["engine"]), 1002, lambda: None)
    q.tag(str(tree["other"]), 1001, lambda: None)
    q.limits[(str(tree["mount"]), 1002)] = cap
    return q


def test_over_the_high_watermark_it_deletes_oldest_until_under_the_low(
        tree: dict[str, Path]) -> None:
    q = quota_for(tree, 0)
    used = q.get(str(tree["mount"]), 1002).used_bytes  # five 64 KiB files, the link's too
    cap = used * 100 // 96  # usage at 96% of the cap: over 95
    q.limits[(str(tree["mount"]), 1002)] = cap
    # Down to 60%: 40% of the cap (~2 files' worth) must go.
    run = clean(str(tree["engine"]), str(tree["mount"]), engine_config(95, 60), q,
                cap_bytes=1)
    assert run is not None
    assert run.used_before == used and run.used_after <= cap * 60 // 100
    left = sorted(p.name for p in tree["engine"].rglob("*.bin") if not p.is_symlink())
    # a (oldest) and b went; c and d (newest) stay; the hard link is never a candidate.
    assert left == ["c.bin", "d.bin", "hardlink.bin"]
    assert run.files == 2 and run.cap_bytes == cap
    assert (tree["outside"] / "secret.bin").exists() and (tree["outside"] / "dir/deep.bin").exists()
    assert (tree["other"] / "theirs.bin").exists()
    assert tree["engine"].is_dir() and (tree["engine"] / "model/r0").is_dir()
    assert (tree["engine"] / "fifo").exists()


def test_under_the_high_watermark_nothing_is_touched(tree: dict[str, Path]) -> None:
    q = quota_for(tree, 0)
    used = q.get(str(tree["mount"]), 1002).used_bytes
    q.limits[(str(tree["mount"]), 1002)] = used * 100 // 94  # 94%: under 95
    before = sorted(str(p) for p in tree["engine"].rglob("*"))
    assert clean(str(tree["engine"]), str(tree["mount"]), engine_config(), q, 1) is None
    assert sorted(str(p) for p in tree["engine"].rglob("*")) == before


def test_without_a_limit_the_computed_cap_is_the_reference(tree: dict[str, Path]) -> None:
    q = quota_for(tree, 0)
    used = q.get(str(tree["mount"]), 1002).used_bytes
    run = clean(str(tree["engine"]), str(tree["mount"]), engine_config(50, 25), q,
                cap_bytes=used)
    assert run is not None and run.cap_bytes == used and run.used_after <= used // 4


def test_runs_are_counted_in_the_pools_record(tmp_path: Path) -> None:
    run = cleaner.CleanRun("/srv/kv/ns1/vllm", 100, 99, 80, 3, 19)
    record_run(tmp_path, "kv", "vllm", run, now=1000.0)
    record_run(tmp_path, "kv", "vllm", run, now=2000.0)
    stats = read_stats(tmp_path, "kv")
    assert stats["vllm"] == cleaner.CleanerStats(runs=2, files=6, bytes=38, last_run=2000.0)
    assert read_stats(tmp_path, "other") == {}
    assert "deleted 3 oldest file(s), 19 bytes" in run.describe(engine_config())


def wide_tree(root: Path, width: int) -> Path:
    """``root`` with ``width`` subdirectories (a nested one every tenth), a file in each."""
    for i in range(width):
        d = root / f"d{i}" / ("n" if i % 10 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(b"x")
    return root


@contextlib.contextmanager
def low_fd_limit(spare: int):
    """The soft limit on open files set to what is open now plus ``spare``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + spare, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_scan_holds_no_fd_per_pending_directory(tmp_path: Path) -> None:
    """Issue 24, item 14: one fd per pending directory saw 1,018 of 1,500 files under a
    limit of 1,024; here 300 directories under a limit of what is open plus 40."""
    engine = wide_tree(tmp_path / "engine", 300)
    with low_fd_limit(40):
        found = list(scan(str(engine)))
    assert len(found) == 300
