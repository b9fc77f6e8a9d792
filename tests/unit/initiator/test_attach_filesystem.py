"""xfs only on blank devices or this host's own; everything else refused untouched."""

from __future__ import annotations

import pytest

from agent.errors import KvagentError
from agent.initiator.filesystem import (
    ForeignFilesystem,
    XfsSuperblock,
    ensure_filesystem,
    needs_filesystem,
    probe_content,
    read_xfs_superblock,
    xfs_label,
)
from tests.unit.fakerunner import FakeRunner

DEV = "/dev/nvme2n1"
UUID = "3b73d893-f7d2-5425-b65f-15a1c24d4bf5"


def ensure(r: FakeRunner, sb: XfsSuperblock | None = None) -> bool:
    return ensure_filesystem(DEV, UUID, "kv-1", r, superblock=lambda d: sb,
                             exists=lambda d: d == DEV)


def blkid(stdout: str = "", rc: int = 0) -> FakeRunner:
    return FakeRunner().on(["blkid"], stdout, rc).on(["mkfs.xfs"])


def test_blank_device_gets_xfs_with_the_deterministic_uuid() -> None:
    r = blkid(rc=2)
    assert ensure(r) is True
    assert r.ran("blkid") == [("blkid", "-p", "-o", "export", DEV)]
    assert r.ran("mkfs.xfs") == [("mkfs.xfs", "-q", "-m", f"uuid={UUID}", "-L", "kv-1", DEV)]
    assert not any("-f" in c for c in r.ran("mkfs.xfs"))


@pytest.mark.parametrize("uuid", [UUID, UUID.upper()])
def test_own_xfs_is_accepted_without_mkfs(uuid: str) -> None:
    r = blkid(f"DEVNAME={DEV}\nUUID={uuid}\nTYPE=xfs\nUSAGE=filesystem\n")
    assert ensure(r) is False
    assert r.ran("mkfs.xfs") == []


@pytest.mark.parametrize(("stdout", "what"), [
    ("UUID=9d0c3a47-7e5c-4f4b-9a51-0b3b8c1d2e3f\nTYPE=ext4\n", "ext4 with uuid 9d0c"),
    (f"UUID={UUID[:-1]}6\nTYPE=xfs\n", "xfs with uuid"),
    ("PTUUID=1234\nPTTYPE=gpt\n", "gpt partition table"),
    ("UUID=abc\nTYPE=LVM2_member\n", "LVM2_member"),
    ("TYPE=swap\n", "swap"),
])
def test_anything_else_is_refused_and_left_alone(stdout: str, what: str) -> None:
    r = blkid(stdout)
    with pytest.raises(ForeignFilesystem, match="refusing to format") as exc:
        ensure(r)
    assert what in exc.value.message and UUID in exc.value.message
    assert "wipefs -a" in exc.value.hint
    assert r.ran("mkfs.xfs") == []


def test_a_failed_probe_is_never_blank() -> None:
    r = FakeRunner().on(["blkid"], "", 4, "blkid: error: permission denied").on(["mkfs.xfs"])
    with pytest.raises(KvagentError, match="cannot probe /dev/nvme2n1: blkid exit 4"):
        ensure(r)
    assert r.ran("mkfs.xfs") == []


def test_probe_content_parses_export_output() -> None:
    c = probe_content(DEV, blkid("DEVNAME=/dev/nvme2n1\nLABEL=kv-1\nUUID=u\nTYPE=xfs\n"),
                      exists=lambda d: True)
    assert (c.type, c.uuid, c.label, c.partition_table, c.blank) == ("xfs", "u", "kv-1", None,
                                                                     False)
    assert probe_content(DEV, blkid(rc=2), exists=lambda d: True).blank


def test_needs_filesystem_names_the_device() -> None:
    c = probe_content(DEV, blkid("TYPE=ext4\n"), exists=lambda d: True)
    with pytest.raises(ForeignFilesystem, match=f"refusing to format {DEV}: it holds ext4"):
        needs_filesystem(c, UUID)


@pytest.mark.parametrize(("pool", "index", "label"), [
    ("kv", 1, "kv-1"), ("a-very-long-pool-name", 12, "a-very-lo-12"), ("Odd_Name", 3, "ddame-3"),
])
def test_labels_fit_xfs(pool: str, index: int, label: str) -> None:
    assert xfs_label(pool, index) == label and len(label) <= 12


def test_own_xfs_whose_mkfs_never_finished_is_made_again() -> None:
    """mkfs killed (or the power cut) after it wrote the superblock: own and unfinished."""
    r = blkid(f"UUID={UUID}\nTYPE=xfs\n")
    assert ensure(r, XfsSuperblock(UUID, inprogress=True)) is True
    assert r.ran("mkfs.xfs") == [("mkfs.xfs", "-q", "-f", "-m", f"uuid={UUID}", "-L", "kv-1",
                                  DEV)]
    # blkid may not report an unfinished xfs at all: the superblock still proves it is ours.
    r = blkid(rc=2)
    assert ensure(r, XfsSuperblock(UUID.upper(), inprogress=True)) is True
    assert "-f" in r.ran("mkfs.xfs")[0]


def test_an_unfinished_xfs_of_someone_else_is_refused() -> None:
    other = f"{UUID[:-1]}6"
    r = blkid(f"UUID={other}\nTYPE=xfs\n")
    with pytest.raises(ForeignFilesystem):
        ensure(r, XfsSuperblock(other, inprogress=True))
    assert r.ran("mkfs.xfs") == []


def test_a_missing_device_is_never_blank() -> None:
    r = blkid(rc=2)
    with pytest.raises(KvagentError, match="does not exist"):
        probe_content("/dev/kvagent-missing", r, exists=lambda d: False)
    assert r.ran("blkid") == []


def test_superblock_reader(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import uuid

    image = tmp_path / "dev"
    sb = bytearray(4096)
    sb[:4] = b"XFSB"
    sb[32:48] = uuid.UUID(UUID).bytes
    sb[126] = 1
    image.write_bytes(bytes(sb))
    assert read_xfs_superblock(str(image)) == XfsSuperblock(UUID, True)
    sb[126] = 0
    image.write_bytes(bytes(sb))
    assert read_xfs_superblock(str(image)) == XfsSuperblock(UUID, False)
    image.write_bytes(b"\0" * 4096)
    assert read_xfs_superblock(str(image)) is None


def test_own_finished_xfs_is_accepted_from_its_superblock_without_blkid() -> None:
    """A converged pass reads the superblock (a pread) and runs no blkid."""
    r = FakeRunner()
    assert ensure(r, XfsSuperblock(UUID.upper(), inprogress=False)) is False
    assert r.calls == []


def test_the_superblock_is_read_inside_a_bounded_step() -> None:
    """A stalled device read counts against a step's bound (the kernel's I/O timeouts),
    not against the watchdog's 30 s between steps."""
    from agent import progress

    seen: list[progress.Step | None] = []

    def superblock(device: str) -> XfsSuperblock:
        seen.append(progress.tracker.current())
        return XfsSuperblock(UUID, False)

    assert ensure_filesystem(DEV, UUID, "kv-1", FakeRunner(), superblock=superblock,
                             exists=lambda d: True) is False
    (step,) = seen
    assert step is not None and step.bound == progress.DEVICE_IO_BOUND
    assert step.what == f"reading the superblock of {DEV}"
    assert progress.tracker.current() is None
