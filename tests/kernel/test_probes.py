"""Mount probes on a real kernel: xfs on null_blk takes O_DIRECT and fallocate; tmpfs refuses
O_DIRECT (Linux 6.1) and the engine renders switch to their fallbacks."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from agent.config.model import EngineConfig
from agent.config.types import FileMode
from agent.engines import EngineContext, render
from agent.engines.dirs import prepare
from agent.system.probes import probe_mount

from . import kit

pytestmark = pytest.mark.kernel


def mount(args: list[str], prefix: str) -> Path:
    mnt = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        kit.sh("mount", *args, str(mnt))
    except BaseException:
        mnt.rmdir()
        raise
    return mnt


def unmount(mnt: Path) -> None:
    kit.sh("umount", str(mnt))
    mnt.rmdir()


def env_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line
                and not line.startswith("#"))


def test_xfs_on_null_blk_takes_odirect_and_fallocate(nullb) -> None:
    dev = nullb(320)  # mkfs.xfs needs at least 300 MB
    kit.sh("mkfs.xfs", "-f", "-q", dev, timeout=120)
    mnt = mount(["-t", "xfs", dev], "kvt-probe-xfs-")
    try:
        result = probe_mount(str(mnt), "tcp")
        assert result.odirect_ok, result.odirect
        assert result.fallocate_ok, result.fallocate
        assert result.fallocate.reserved_bytes >= result.fallocate.requested_bytes
        assert result.dio_align.mem_align and result.dio_align.offset_align, result.dio_align
        rdev = os.stat(dev).st_rdev
        assert result.device == f"{os.major(rdev)}:{os.minor(rdev)}"
        name = os.path.basename(os.path.realpath(dev))
        assert result.logical_block_size == int(
            kit.read(f"/sys/block/{name}/queue/logical_block_size")) == 512
        assert result.transport == "tcp"
        assert 0 < result.free_bytes <= result.total_bytes
        assert os.listdir(mnt) == [], "probe left files on the filesystem"

        (prepared,) = prepare([str(mnt)], EngineConfig(kind="dynamo", mode=FileMode(0o750)))
        st = os.stat(prepared.path)
        assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_dev == os.stat(mnt).st_dev
        ctx = EngineContext("p1", "dynamo", (prepared.path,), 2 * 10**9, (result,))
        env = env_lines(render("dynamo", ctx).files["dynamo-kvbm.env"])
        # 2e9 bytes less 3% headroom (engine_bytes), in whole decimal GB
        assert env == {"DYN_KVBM_DISK_CACHE_DIR": prepared.path, "DYN_KVBM_DISK_CACHE_GB": "1"}
    finally:
        unmount(mnt)


def test_tmpfs_refuses_odirect_and_renders_fall_back() -> None:
    mnt = mount(["-t", "tmpfs", "-o", "size=160m", "tmpfs"], "kvt-probe-tmpfs-")
    try:
        result = probe_mount(str(mnt), "rdma")
        assert not result.odirect_ok
        assert result.odirect.failure.step == "open"
        assert result.odirect.failure.errno == errno.EINVAL
        assert result.fallocate_ok, result.fallocate  # tmpfs does reserve with fallocate
        assert result.logical_block_size is None  # no block device behind tmpfs
        assert result.dio_align.mem_align is None
        assert os.listdir(mnt) == [], "probe left files on the filesystem"

        lm_dir, dyn_dir = str(mnt / "lmcache"), str(mnt / "dynamo")
        lm = render("lmcache", EngineContext("p1", "lmcache", (lm_dir,), 10**8, (result,)))
        assert "use_odirect: false" in lm.files["lmcache.yaml"]
        assert any("EINVAL" in n for n in lm.notes)
        # 2e9 bytes: KVBM needs a whole decimal GB once the headroom is off (below it
        # the disk tier is off and the render is refused).
        dyn = render("dynamo", EngineContext("p1", "dynamo", (dyn_dir,), 2 * 10**9, (result,)))
        env = env_lines(dyn.files["dynamo-kvbm.env"])
        assert env["DYN_KVBM_DISK_DISABLE_O_DIRECT"] == "true"
        assert "DYN_KVBM_DISK_ZEROFILL_FALLBACK" not in env
    finally:
        unmount(mnt)
