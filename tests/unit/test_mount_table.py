"""The kernel's mount table is parsed once per change (agent.system.mounts.KernelMountTable):
a pass asks it once per mount and engine, and reading it each time was most of a new
namespace's mount and hand-off under TCG. The real kernel's poll mark is proven in
tests/kernel/test_initiator_plumbing.py."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from agent.system.mounts import KernelMountTable, parse_mountinfo

LINE = "36 35 98:0 / /mnt/{name} rw,noatime - xfs /dev/{name} rw,prjquota\n"


class FakePoll:
    """The kernel's poll of mountinfo: POLLPRI once after each change, then nothing."""

    def __init__(self) -> None:
        self.marked = False
        self.fd: int | None = None

    def register(self, fd: int, _mask: int) -> None:
        self.fd = fd

    def poll(self, _timeout: int) -> list[tuple[int, int]]:
        if not self.marked:
            return []
        self.marked = False
        return [(self.fd or 0, select.POLLPRI)]


def test_the_table_is_read_again_only_after_the_kernel_marks_a_change(tmp_path: Path) -> None:
    table_file = tmp_path / "mountinfo"
    table_file.write_text(LINE.format(name="a"))
    poll = FakePoll()
    table = KernelMountTable(table_file, poller=lambda: poll)
    assert [e.mount_point for e in table.entries()] == ["/mnt/a"]
    table_file.write_text(LINE.format(name="a") + LINE.format(name="b"))
    assert [e.mount_point for e in table.entries()] == ["/mnt/a"], "no mark: no read"
    assert table.reads == 1
    poll.marked = True  # a mount
    assert [e.mount_point for e in table.entries()] == ["/mnt/a", "/mnt/b"]
    assert [e.mount_point for e in table.entries()] == ["/mnt/a", "/mnt/b"]
    assert table.reads == 2


def test_entries_are_a_copy_the_caller_may_change(tmp_path: Path) -> None:
    table_file = tmp_path / "mountinfo"
    table_file.write_text(LINE.format(name="a"))
    table = KernelMountTable(table_file, poller=FakePoll)
    table.entries().clear()
    assert len(table.entries()) == 1


def test_this_processes_own_table_reads_once_until_it_changes() -> None:
    """The real /proc/self/mountinfo on this machine (nothing is mounted here: the mark
    itself is proven in the VM)."""
    table = KernelMountTable()
    first = table.entries()
    assert any(e.mount_point == "/" for e in first)
    assert table.entries() == first and table.reads == 1
    assert os.path.exists("/proc/self/mountinfo")


def test_a_mount_point_is_looked_up_in_the_table_as_last_read(tmp_path: Path) -> None:
    """``at`` answers from the parsed table (the last mount on a point wins) and reads the
    table again only after a change, like ``entries``."""
    table_file = tmp_path / "mountinfo"
    table_file.write_text(LINE.format(name="a") + LINE.format(name="a").replace("98:0", "98:1"))
    poll = FakePoll()
    table = KernelMountTable(table_file, poller=lambda: poll)
    entry = table.at("/mnt/a/")
    assert entry is not None and entry.device == "98:1"
    assert table.at("/mnt/b") is None and table.reads == 1
    table_file.write_text(LINE.format(name="b"))
    poll.marked = True
    assert table.at("/mnt/a") is None and table.at("/mnt/b") is not None
    assert table.reads == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_reads_the_table_afresh(tmp_path: Path) -> None:
    """A child forked after the parent read the table shares the parent's open file and
    with it the kernel's mark, which another child may already have consumed: it must
    not trust the parent's table (a pass in a forked child found its pool unmounted)."""
    table_file = tmp_path / "mountinfo"
    table_file.write_text(LINE.format(name="a"))
    poll = FakePoll()
    opened: list[str] = []

    def open_(path: str) -> int:
        opened.append(path)
        return os.open(path, os.O_RDONLY)

    table = KernelMountTable(table_file, open_=open_, poller=lambda: poll)
    assert [e.mount_point for e in table.entries()] == ["/mnt/a"]
    table_file.write_text(LINE.format(name="a") + LINE.format(name="b"))  # no mark left
    pid = os.fork()
    if pid == 0:  # the child: 0 when it saw the table as it is now, on its own descriptor
        ok = ([e.mount_point for e in table.entries()] == ["/mnt/a", "/mnt/b"]
              and len(opened) == 2 and table.at("/mnt/b") is not None)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child kept the parent's table"
    assert [e.mount_point for e in table.entries()] == ["/mnt/a"], "the parent is unchanged"


def test_a_mounts_optional_fields_are_its_propagation() -> None:
    """The fields between the mount options and ' - ' (shared:N, master:N), kept as they
    are: the fleet's pod tests read a mount's propagation from them."""
    shared, slave, private = parse_mountinfo(
        "36 35 98:0 / /var/lib/kvcache rw shared:1 - xfs /dev/nvme0n1 rw\n"
        "40 39 98:0 / /var/lib/kvcache rw master:1 - xfs /dev/nvme0n1 rw\n"
        "41 39 0:5 / /dev rw - devtmpfs udev rw\n")
    assert (shared.optional, slave.optional, private.optional) == (("shared:1",),
                                                                  ("master:1",), ())
    assert shared.mount_point == "/var/lib/kvcache" and shared.fstype == "xfs"
