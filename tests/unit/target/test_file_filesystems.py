"""The file backing checks the filesystem under the pool directory before planning."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.config import parse_config
from agent.config.model import TargetPool
from agent.system.mounts import filesystem_type
from agent.target.backings import driver_for
from agent.target.backings import file as backing_file

from .helpers import config, context, file_pool

HOST = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"


def mountinfo(tmp_path: Path, *mounts: tuple[str, str]) -> Path:
    lines = [f"{20 + i} 1 0:{30 + i} / {mp} rw,relatime shared:1 - {fstype} src{i} rw"
             for i, (mp, fstype) in enumerate(mounts)]
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_longest_containing_mount_point_wins(tmp_path: Path) -> None:
    info = mountinfo(tmp_path, ("/", "ext4"), ("/srv", "overlay"), ("/srv/kv", "xfs"),
                     ("/srv/kvx", "tmpfs"))
    assert filesystem_type(Path("/srv/kv/pool"), info) == "xfs"
    assert filesystem_type(Path("/srv/kv"), info) == "xfs"
    assert filesystem_type(Path("/srv/kvother"), info) == "overlay", \
        "/srv/kvx must not match /srv/kvother"
    assert filesystem_type(Path("/srv/kvx/a"), info) == "tmpfs"
    assert filesystem_type(Path("/var/lib"), info) == "ext4"


def test_a_later_mount_on_the_same_point_hides_the_earlier(tmp_path: Path) -> None:
    info = mountinfo(tmp_path, ("/", "ext4"), ("/tmp", "overlay"), ("/tmp", "tmpfs"))
    assert filesystem_type(Path("/tmp/files"), info) == "tmpfs"


def plan_file(p: TargetPool, _hosts: list[str]):
    cfg = parse_config(yaml.safe_dump({"version": 1, "node": {"name": "stor"}}))
    return backing_file.FileDriver().plan(context(cfg), p)


def pool(directory: Path, buffered: bool) -> TargetPool:
    data = {"version": 1, "node": {"name": "stor"}, "target": {
        "ports": [{"name": "p", "id": 1, "transport": "tcp", "address": "127.0.0.1"}],
        "pools": [{"name": "kv", "ports": ["p"], "hosts": [{"name": "gpu-1", "nqn": HOST}],
                   "backing": {"kind": "file", "directory": str(directory),
                               "buffered_io": buffered},
                   "namespaces": {"count": 1, "size": "4MiB"}}]}}
    return parse_config(yaml.safe_dump(data)).target.pools[0]


@pytest.mark.parametrize("buffered", [False, True])
def test_overlay_is_refused_even_with_buffered_io(tmp_path: Path, buffered: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmet exports overlayfs files with 1-byte blocks (seen on 6.1): no opt-in helps."""
    seen: list[Path] = []

    def on_overlay(path: Path, mounts: object = None) -> str:
        seen.append(path)
        return "overlay"

    monkeypatch.setattr(backing_file, "filesystem_type", on_overlay)
    monkeypatch.setattr(backing_file, "supports_odirect",
                        lambda d: pytest.fail("no O_DIRECT probe on a refused filesystem"))
    plan = plan_file(pool(tmp_path / "missing/files", buffered), ["gpu-1"])
    assert plan.steps == [] and plan.volumes == []
    (error,) = plan.errors
    assert f"pool kv: {tmp_path} is on overlay" in error
    assert "1-byte block size" in error and "tmpfs" in error
    # The probe went to the nearest existing directory; nothing was created.
    assert seen == [tmp_path] and not (tmp_path / "missing").exists()


def test_tmpfs_without_odirect_is_refused_unless_buffered(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backing_file, "filesystem_type", lambda path, mounts=None: "tmpfs")
    monkeypatch.setattr(backing_file, "supports_odirect",
                        lambda d: (False, "open with O_DIRECT failed: Invalid argument"))
    refused = plan_file(pool(tmp_path, False), ["gpu-1"])
    assert "does not support O_DIRECT" in refused.errors[0]
    assert "backing.buffered_io: true" in refused.errors[0]
    allowed = plan_file(pool(tmp_path, True), ["gpu-1"])
    assert not allowed.errors and [s.kind for s in allowed.steps] == ["file.create"]


def test_odirect_probe_on_a_real_directory(tmp_path: Path) -> None:
    ok, why = backing_file.supports_odirect(tmp_path)
    if ok:
        assert why == ""
    else:
        assert why.startswith(("open with O_DIRECT failed", "an aligned O_DIRECT write failed"))
    assert list(tmp_path.iterdir()) == [], "the probe file must be removed"


def test_the_odirect_probe_never_opens_what_was_planted(tmp_path: Path) -> None:
    """Issue 24, item 3: a link at the probe's old fixed name truncated its target to zeros
    (in a dry run too). Links planted at the old name and a glob of likely names stay
    links, their targets untouched."""
    victim = tmp_path / "victim.conf"
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    pool_dir = tmp_path / "pool"
    pool_dir.mkdir()
    planted = [pool_dir / ".kvagent-odirect-probe"]
    planted += [pool_dir / f".kvagent-odirect-probe.{i:016x}" for i in range(4)]
    for link in planted:
        link.symlink_to(victim)
    backing_file.supports_odirect(pool_dir)
    assert victim.read_text() == "root:$6$secret:19000:0:99999:7:::\n"
    assert sorted(pool_dir.iterdir()) == sorted(planted)
    assert all(p.is_symlink() for p in planted)


def test_a_pass_reads_the_mount_table_once_for_every_file_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 file pools: one read of /proc/self/mountinfo per pass, not one per pool."""
    reads: list[int] = []
    real = backing_file.read_mounts
    monkeypatch.setattr(backing_file, "read_mounts", lambda: reads.append(1) or real())
    cfg = config(tmp_path, [file_pool(tmp_path, name=f"p{i}", count=1) for i in range(8)])
    ctx = context(cfg)
    for p in cfg.target.pools:
        assert not driver_for(p).plan(ctx, p).errors
    assert reads == [1]
    ctx = context(cfg)  # a new pass reads it again
    driver_for(cfg.target.pools[0]).plan(ctx, cfg.target.pools[0])
    assert reads == [1, 1]
