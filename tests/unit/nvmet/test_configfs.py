"""RealConfigFS on a plain directory: paths relative to the root, errno, write counter."""

from __future__ import annotations

import errno as E

import pytest

from nvmet.configfs import ConfigFS, Entry, RealConfigFS
from nvmet.fake import FakeConfigFS


def test_both_backends_implement_the_interface(tmp_path) -> None:
    assert isinstance(RealConfigFS(tmp_path), ConfigFS)
    assert isinstance(FakeConfigFS(), ConfigFS)


def test_every_mutating_call_counts_even_when_it_fails(tmp_path) -> None:
    fs = RealConfigFS(tmp_path)
    fs.mkdir("hosts")
    fs.mkdir("hosts/h")
    (tmp_path / "hosts/h/attr").write_text("0\n")
    fs.write("hosts/h/attr", "1")
    assert fs.read("hosts/h/attr") == "1"
    with pytest.raises(OSError) as info:
        fs.write("hosts/h/missing", "1")  # no O_CREAT: like configfs, ENOENT
    assert info.value.errno == E.ENOENT
    fs.mkdir("links")
    fs.symlink("hosts/h", "links/h")
    assert fs.is_link("links/h") and fs.readlink("links/h") == "hosts/h"
    assert fs.list("links") == [Entry("h", "link")]
    fs.unlink("links/h")
    fs.rmdir("links")
    assert fs.writes == 8
    assert not fs.exists("links")


def test_paths_must_stay_under_the_root(tmp_path) -> None:
    fs = RealConfigFS(tmp_path)
    for bad in ("/etc/passwd", "../x", "hosts/../../x"):
        with pytest.raises(OSError) as info:
            fs.read(bad)
        assert info.value.errno == E.EINVAL
