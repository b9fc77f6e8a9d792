"""agent.immutable on this machine's own filesystem (the immutable attribute of a
scratch directory: nothing is mounted, formatted or written outside tmp_path)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.immutable import MountedOn, is_immutable, set_immutable


@pytest.fixture
def scratch(tmp_path: Path):
    d = tmp_path / "mnt"
    d.mkdir()
    if is_immutable(str(d)) is None:
        pytest.skip("the filesystem under tmp_path has no immutable attribute")
    try:
        set_immutable(str(d), False)
    except PermissionError:
        pytest.skip("no CAP_LINUX_IMMUTABLE here")
    yield d
    set_immutable(str(d), False)


def test_a_sealed_directory_refuses_even_roots_writes_until_unsealed(scratch: Path) -> None:
    set_immutable(str(scratch), True)
    assert is_immutable(str(scratch)) is True
    for make in (lambda: (scratch / "cache.bin").write_bytes(b"x"),
                 lambda: (scratch / "lmcache").mkdir()):
        with pytest.raises(PermissionError):
            make()
    with pytest.raises(PermissionError):
        os.rmdir(scratch)
    set_immutable(str(scratch), False)
    assert is_immutable(str(scratch)) is False
    (scratch / "cache.bin").write_bytes(b"x")


def test_what_is_mounted_on_a_directory_is_never_touched() -> None:
    """/proc is a mount: its own directory on / is out of reach through the path."""
    assert is_immutable("/proc") is None
    with pytest.raises(MountedOn) as caught:
        set_immutable("/proc", True)
    assert caught.value.errno == errno.EBUSY


def test_a_link_is_not_followed(scratch: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(scratch)
    with pytest.raises(OSError) as caught:
        set_immutable(str(link), True)
    assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert is_immutable(str(scratch)) is False
