"""Blank-device checks over a fake sysfs/proc and canned wipefs/blkid output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.target import safety
from agent.target.safety import ForeignData, SystemView, ensure_blank, inspect_device
from tests.unit.fakerunner import FakeRunner

DEV = "/dev/disk/by-id/nvme-TEST"
REAL = "/dev/nvme9n1"
RDEV = os.makedev(259, 9)


@pytest.fixture
def view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SystemView:
    monkeypatch.setattr(safety, "resolve_block_device", lambda path: (REAL, RDEV))
    (tmp_path / "sys/class/block/nvme9n1/holders").mkdir(parents=True)
    (tmp_path / "mountinfo").write_text(
        "22 1 0:21 / /proc rw - proc proc rw\n")
    (tmp_path / "swaps").write_text("Filename Type Size Used Priority\n")
    return SystemView(tmp_path / "sys", tmp_path / "mountinfo", tmp_path / "swaps")


def blank_runner() -> FakeRunner:
    return (FakeRunner().on(["wipefs"], stdout="")
            .on(["blkid"], returncode=2))


def test_blank_device_passes(view: SystemView) -> None:
    assert ensure_blank(DEV, "export", blank_runner(), view) == REAL


def test_wipefs_signatures_are_reported(view: SystemView) -> None:
    out = json.dumps({"signatures": [
        {"device": "nvme9n1", "offset": "0x438", "type": "ext4", "uuid": "x", "label": "data"}]})
    runner = FakeRunner().on(["wipefs"], stdout=out).on(["blkid"], stdout="TYPE=ext4\n")
    found = inspect_device(DEV, runner, view)
    assert found.findings == ("ext4 signature at offset 0x438 label 'data'",)
    with pytest.raises(ForeignData, match=r"refusing to export .*ext4.*wipefs -a"):
        ensure_blank(DEV, "export", runner, view)


def test_blkid_finding_not_seen_by_wipefs_is_reported(view: SystemView) -> None:
    runner = FakeRunner().on(["wipefs"], stdout="").on(["blkid"], stdout="PTTYPE=gpt\n")
    assert inspect_device(DEV, runner, view).findings == ("gpt detected by blkid",)


def test_partitions_holders_and_mounts(view: SystemView, tmp_path: Path) -> None:
    part = tmp_path / "sys/class/block/nvme9n1/nvme9n1p1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    (part / "dev").write_text("259:10\n")
    (tmp_path / "sys/class/block/nvme9n1/holders/dm-0").mkdir()
    (tmp_path / "mountinfo").write_text("40 1 259:10 / /data rw - xfs /dev/nvme9n1p1 rw\n")
    found = inspect_device(DEV, blank_runner(), view).findings
    assert found == ("partitions: nvme9n1p1", "held by: dm-0 (device-mapper, md or similar)",
                     "mounted on /data")


def test_swap_is_reported(view: SystemView, tmp_path: Path) -> None:
    (tmp_path / "swaps").write_text(f"Filename Type Size Used Priority\n{REAL} partition 1 0 -2\n")
    assert "used as swap" in inspect_device(DEV, blank_runner(), view).findings[0]


def test_unreadable_device_is_refused_not_assumed_blank(view: SystemView) -> None:
    runner = FakeRunner().on(["wipefs"], returncode=1, stderr="wipefs: cannot open")
    with pytest.raises(ForeignData, match="cannot prove"):
        inspect_device(DEV, runner, view)
    runner = FakeRunner().on(["wipefs"], stdout="").on(["blkid"], returncode=4, stderr="io")
    with pytest.raises(ForeignData, match="cannot prove"):
        inspect_device(DEV, runner, view)


def test_missing_device_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ForeignData, match="does not exist"):
        safety.resolve_block_device(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ForeignData, match="not a block device"):
        safety.resolve_block_device(str(tmp_path / "file"))
