"""Who keeps a mount busy, from a /proc-like tree (links' text only, no stat)."""

from __future__ import annotations

import os
from pathlib import Path

from agent.system.mountusers import MountUser, mount_users


def proc(root: Path, pid: int, comm: str, *, cwd: str = "/", fds: tuple[str, ...] = (),
         maps: str = "") -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    os.symlink(cwd, d / "cwd")
    os.symlink("/", d / "root")
    os.symlink("/usr/bin/" + comm, d / "exe")
    for i, target in enumerate(fds):
        os.symlink(target, d / "fd" / str(i))
    (d / "maps").write_text(maps)


def test_cwd_open_files_and_mapped_files_are_found(tmp_path: Path) -> None:
    mount = "/srv/kv/store0-ns1"
    proc(tmp_path, 10, "bash", cwd=f"{mount}/vllm")
    proc(tmp_path, 11, "vllm", fds=("/dev/null", f"{mount}/vllm/blk.bin (deleted)"))
    proc(tmp_path, 12, "python3", maps=f"7f00-7f10 r--s 00000000 103:02 77 {mount}/lmcache/x\n")
    proc(tmp_path, 13, "idle", cwd="/srv/kv/store0-ns10", fds=("/srv/kv/store0-ns1x",))
    (tmp_path / "self").mkdir()
    assert mount_users(mount, proc=tmp_path) == [
        MountUser(10, "bash", "cwd"), MountUser(11, "vllm", "open file"),
        MountUser(12, "python3", "mapped file")]
    assert MountUser(11, "vllm", "open file").describe() == "vllm (pid 11, open file)"


def test_the_list_is_bounded_and_a_vanished_process_is_skipped(tmp_path: Path) -> None:
    for pid in range(20, 40):
        proc(tmp_path, pid, "w", cwd="/srv/kv")
    (tmp_path / "99").mkdir()  # gone while we looked: no links, no comm
    assert len(mount_users("/srv/kv", proc=tmp_path, limit=3)) == 3
    assert mount_users("/nowhere", proc=tmp_path) == []
