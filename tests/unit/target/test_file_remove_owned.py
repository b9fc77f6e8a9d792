"""``remove_owned`` on its own: the last check before a file of a pool is deleted.

Its callers check the manifest's names and the files' kinds first, so these tests call
it directly: a name kvagent never creates, or anything but a regular file under a name
it does create, is refused and nothing is deleted; no link is followed.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.target.backings.file import FileBackingError, remove_owned


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """A pool directory ``files/kv`` with a host directory ``gpu-1``."""
    directory = tmp_path / "files" / "kv"
    (directory / "gpu-1").mkdir(parents=True)
    return directory


def test_a_regular_file_kvagent_makes_is_deleted(pool: Path) -> None:
    (pool / "gpu-1/ns1.img").write_bytes(b"\0" * 4096)
    (pool / "gpu-1/ns2.img").write_text("kept")
    assert remove_owned(pool, "gpu-1/ns1.img") is True
    assert not (pool / "gpu-1/ns1.img").exists()
    assert (pool / "gpu-1/ns2.img").read_text() == "kept"


def test_a_half_created_file_and_a_shared_one_are_deleted(pool: Path) -> None:
    (pool / "gpu-1/.ns3.img.creating").write_text("partial")
    (pool / "shared").mkdir()
    (pool / "shared/ns12.img").write_text("data")
    assert remove_owned(pool, "gpu-1/.ns3.img.creating") is True
    assert remove_owned(pool, "shared/ns12.img") is True
    assert os.listdir(pool / "gpu-1") == [] and os.listdir(pool / "shared") == []


def test_missing_is_not_an_error(pool: Path) -> None:
    assert remove_owned(pool, "gpu-1/ns1.img") is False
    assert remove_owned(pool, "gpu-2/ns1.img") is False, "no host directory"
    assert os.listdir(pool) == ["gpu-1"]


NAME_REFUSED = "kvagent never creates a file of that name in a pool directory"


@pytest.mark.parametrize("rel", [
    "../outside.img",         # the pool's parent
    "../kv/gpu-1/ns1.img",    # back into the pool by another road
    "gpu-1/notes.txt",        # a file beside kvagent's
    "gpu-1/ns0.img",          # nsid 0 does not exist
    "gpu-1/ns1.img.bak",
    "gpu-1/.ns1.img",
    "GPU-1/ns1.img",          # not a host name kvagent writes
    "-x/ns1.img",
    "gpu-1/sub/ns1.img",      # one directory too deep
    "gpu-1",                  # the host directory itself
    "ns1.img",
    "/outside.img",           # absolute
    "/gpu-1/ns1.img",
])
def test_a_name_kvagent_never_creates_is_refused_and_nothing_deleted(
        pool: Path, rel: str) -> None:
    (pool / "gpu-1/ns1.img").write_text("kvagent's")
    (pool / "gpu-1/notes.txt").write_text("not kvagent's")
    (pool / "gpu-1/ns0.img").write_text("not kvagent's")
    (pool / "gpu-1/ns1.img.bak").write_text("not kvagent's")
    (pool / "gpu-1/.ns1.img").write_text("not kvagent's")
    (pool / "gpu-1/sub").mkdir()
    (pool / "gpu-1/sub/ns1.img").write_text("not kvagent's")
    (pool / "ns1.img").write_text("not kvagent's")
    for host in ("GPU-1", "-x"):
        (pool / host).mkdir()
        (pool / host / "ns1.img").write_text("not kvagent's")
    outside = pool.parent / "outside.img"
    outside.write_text("precious")
    before = {str(p): p.read_bytes() for p in pool.parent.rglob("*") if p.is_file()}

    with pytest.raises(FileBackingError) as err:
        remove_owned(pool, rel)
    assert err.value.message == f"refusing to delete {pool / rel}: {NAME_REFUSED}"
    after = {str(p): p.read_bytes() for p in pool.parent.rglob("*") if p.is_file()}
    assert after == before, "nothing deleted"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("kept")


@pytest.mark.parametrize("make", [_fifo, _directory], ids=["fifo", "directory"])
def test_not_a_regular_file_is_refused_and_kept(pool: Path,
                                                make: Callable[[Path], None]) -> None:
    target = pool / "gpu-1/ns1.img"
    make(target)
    kind = os.lstat(target).st_mode
    with pytest.raises(FileBackingError) as err:
        remove_owned(pool, "gpu-1/ns1.img")
    assert err.value.message == f"refusing to delete {target}: not a regular file"
    assert os.lstat(target).st_mode == kind, "still there, untouched"
    if target.is_dir():
        assert (target / "inside").read_text() == "kept"


@pytest.mark.parametrize("points_at", ["file", "dangling"])
def test_a_symlink_under_an_owned_name_is_refused_not_followed(pool: Path,
                                                               points_at: str) -> None:
    victim = pool.parent / "victim.img"
    if points_at == "file":
        victim.write_text("precious")
    link = pool / "gpu-1/ns1.img"
    link.symlink_to(victim)
    with pytest.raises(FileBackingError) as err:
        remove_owned(pool, "gpu-1/ns1.img")
    assert err.value.message == f"refusing to delete {link}: not a regular file"
    assert link.is_symlink() and os.readlink(link) == str(victim), "the link is kept"
    if points_at == "file":
        assert victim.read_text() == "precious"
    else:
        assert not victim.exists()


def test_a_linked_host_directory_is_not_followed(pool: Path) -> None:
    victim = pool.parent / "victim"
    victim.mkdir()
    (victim / "ns1.img").write_text("precious")
    (pool / "gpu-2").symlink_to(victim)
    with pytest.raises(OSError) as err:
        remove_owned(pool, "gpu-2/ns1.img")
    assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (victim / "ns1.img").read_text() == "precious"
    assert (pool / "gpu-2").is_symlink()


def test_a_linked_pool_directory_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "gpu-1").mkdir(parents=True)
    (victim / "gpu-1/ns1.img").write_text("precious")
    (tmp_path / "kv").symlink_to(victim)
    with pytest.raises(OSError) as err:
        remove_owned(tmp_path / "kv", "gpu-1/ns1.img")
    assert err.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (victim / "gpu-1/ns1.img").read_text() == "precious"
