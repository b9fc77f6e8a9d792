"""Hard engine caps on the real kernel: xfs project quotas on a pool attached over NVMe/TCP
loopback (a file pool on a tmpfs, storage and GPU roles on one VM).

One pool, one namespace, engines vllm (20%: never evicts) and lmcache (40%), in one test
that shares the boot:

1. attached by "an older kvagent" (mount_options with noquota: no project quotas), the
   engines write files; then the default config: while a file is held open the mount is
   left alone (skipped, the pool degraded: caps advisory); once released the next pass
   unmounts and mounts it with prjquota, puts each engine directory and the files
   already in it in the engine's project, and sets the hard limits;
2. the usage health reports (and /metrics renders) is the kernel's figure, the one
   `xfs_quota -x -c 'report -p -b'` prints;
3. a converged pass runs no command and writes nothing (no record, no limit, no flag);
4. vllm writes until ENOSPC at its cap while the filesystem has room and lmcache keeps
   writing; health flags vllm at its cap;
5. vllm's cleaner turned on: one pass deletes its oldest files, only regular files in its
   own directory (symlinks to lmcache's files and directories stay, and their targets),
   until under the low watermark;
6. Dynamo added: refused (this VM has no GPUDirect Storage), the other engines unaffected;
7. the figure: usage read from the quota vs the tree walk on a directory of many files.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import load_config
from agent.engines.dirs import usage_sample
from agent.engines.quota import mount_caps, project_id
from agent.health.collect import collect
from agent.health.metrics import build_registry
from agent.naming import subsystem_nqn
from agent.system.run import default_runner
from agent.system.xfsquota import get_quota

from . import kit
from .pools import Lab, RecordingRunner, assert_ok, mount_tmpfs, umount_all_under, write_file

pytestmark = pytest.mark.kernel(group="cache", weight=0.4)
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20
VLLM, LMCACHE = project_id("vllm"), project_id("lmcache")



def write_config(lab: Lab, *, options: str | None = None, vllm_cleaner: bool = False,
                 dynamo: bool = False) -> None:
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    opts = f"\n      mount_options: [{options}]" if options else ""
    cleaner = ", cleaner: {enabled: true, high: 90%, low: 50%}" if vllm_cleaner else ""
    extra = "\n        - {kind: dynamo}" if dynamo else ""
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 31, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 1, size: 400MiB}}
      ports: [p]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
initiator:
  device_wait: 60s
  pools:
    - name: kv
      target: {{transport: tcp, address: 127.0.0.1, service: 4420, subsystem: "{nqn}"}}
      mount: {lab.root}/mnt/kv{opts}
      connect: {{ctrl_loss_tmo: forever, reconnect_delay: 2s}}
      engines:
        - {{kind: vllm, capacity: 20%, cpu_cache: 1GiB{cleaner}}}
        - {{kind: lmcache, capacity: 40%}}{extra}
""")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "600m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def xfs_quota_report(mount: Path) -> dict[int, tuple[int, int]]:
    """project id -> (used, hard limit) in bytes, as xfs_quota prints them."""
    out = kit.sh("xfs_quota", "-x", "-c", "report -p -b -n -N", str(mount)).stdout
    rows = {}
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0].startswith("#"):
            rows[int(fields[0][1:])] = (int(fields[1]) * 1024, int(fields[3]) * 1024)
    return rows


def lsproj(path: Path) -> int:
    out = kit.sh("xfs_io", "-r", "-c", "lsproj", str(path)).stdout  # "projid = 1002"
    return int(out.split("=")[1])


def super_options(mount: Path) -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == str(mount):
            return right.split()[2]
    raise AssertionError(f"{mount} is not mounted")


def engine_health(lab: Lab, kind: str):
    snap = collect(load_config(lab.config), default_runner(), drives=False)
    (pool,) = [p for p in snap.pools if p.role == "initiator"]
    return snap, pool, next(e for e in pool.initiator.engines if e.kind == kind)


def metric(snap, name: str, **labels: str) -> float:
    text = generate_latest(build_registry(lambda: snap)).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name}{labels}")


def fill(directory: Path, prefix: str, limit: int) -> tuple[int, int | None]:
    """Write 4 MiB files until ``limit`` files or an error: (bytes written, errno)."""
    block = os.urandom(MIB)
    written = 0
    for i in range(limit):
        fd = os.open(directory / f"{prefix}-{i:03}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for _ in range(4):
                written += os.write(fd, block)
            os.fsync(fd)
        except OSError as exc:
            return written, exc.errno
        finally:
            os.close(fd)
    return written, None


def state_files(lab: Lab) -> dict[str, tuple[int, int, int]]:
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
            for p in lab.state.rglob("*") if p.is_file()}


def test_hard_caps_cleaner_and_gds_on_one_pool(lab: Lab) -> None:
    lap = kit.Laps()
    mount = lab.root / "mnt/kv/lab-ns1"
    vllm, lmcache = mount / "vllm", mount / "lmcache"

    # 1. Attached without project quotas, as an older kvagent did; the engines write.
    write_config(lab, options="noatime, noquota")
    assert_ok(lab.apply())
    lap("first apply (no project quotas)")
    assert "quota" not in super_options(mount).replace("noquota", "")
    for i in range(3):
        write_file(vllm / f"pre-{i}.bin", 4 * MIB)
    lm_keep = write_file(lmcache / "keep.bin", 4 * MIB)
    assert lsproj(vllm) == 0 and lsproj(vllm / "pre-0.bin") == 0
    _, pool, eng = engine_health(lab, "vllm")
    assert (eng.source, eng.enforced, pool.state) == ("sample", False, "ok")

    # The default config wants prjquota; a file held open keeps the mount as it is.
    write_config(lab)
    held = os.open(vllm / "pre-0.bin", os.O_RDONLY)
    try:
        busy = lab.apply()
        assert_ok(busy)
        skipped = [a for a in busy.actions if a.status == "skipped"]
        assert [(a.kind, a.subject) for a in skipped] == [("mount", str(mount))], busy.actions
        assert "busy" in skipped[0].detail
        assert "prjquota" not in super_options(mount)
        _, pool, eng = engine_health(lab, "vllm")
        assert pool.state == "degraded" and eng.source == "sample"
        assert any("mounted without project quotas" in p and "advisory" in p
                   for p in pool.problems), pool.problems
    finally:
        os.close(held)
    lap("apply with the mount held")
    upgraded = lab.apply()
    assert_ok(upgraded)
    lap("apply: remount with prjquota")
    done = [(a.kind, a.subject) for a in upgraded.actions if a.status == "done"]
    assert ("umount", str(mount)) in done and ("mount", str(mount)) in done, done
    assert "prjquota" in super_options(mount).split(",")
    assert {s for k, s in done if k == "engine.quota.project"} == {str(vllm), str(lmcache)}
    assert {s for k, s in done if k == "engine.quota.limit"} == {str(vllm), str(lmcache)}
    # The files written before are in the project now, and counted.
    assert lsproj(vllm) == VLLM and lsproj(vllm / "pre-2.bin") == VLLM
    assert lsproj(lmcache / "keep.bin") == LMCACHE
    assert "P" in kit.sh("xfs_io", "-r", "-c", "lsattr", str(vllm)).stdout.split()[0]
    cfg = load_config(lab.config)
    size = os.statvfs(mount).f_blocks * os.statvfs(mount).f_frsize
    caps = mount_caps(size, cfg.initiator.pools[0].engines)
    report = xfs_quota_report(mount)
    assert report[VLLM][1] == caps["vllm"] and report[LMCACHE][1] == caps["lmcache"]
    assert report[VLLM][0] >= 12 * MIB and report[LMCACHE][0] >= 4 * MIB

    # 2. Health's usage is the kernel's figure, from one quotactl.
    kit.sh("sync")
    snap, pool, eng = engine_health(lab, "vllm")
    assert pool.state == "ok", pool.problems
    report = xfs_quota_report(mount)
    assert (eng.source, eng.enforced) == ("quota", True)
    assert (eng.used_bytes, eng.cap_bytes) == report[VLLM]
    assert metric(snap, "kvagent_engine_used_bytes", engine="vllm") == report[VLLM][0]
    assert metric(snap, "kvagent_engine_capacity_bytes", engine="lmcache") == report[LMCACHE][1]
    assert metric(snap, "kvagent_engine_usage_source", engine="vllm", source="quota") == 1
    print(f"[figure] vllm usage: health {eng.used_bytes} bytes, xfs_quota {report[VLLM][0]}")
    lap("health vs xfs_quota")

    # 3. Converged: no command, no change, not one file of the state rewritten.
    before, limits = state_files(lab), xfs_quota_report(mount)
    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    assert_ok(again)
    assert again.changed is False and again.configfs_writes == 0, again.actions
    assert runner.calls == [], runner.calls
    after = state_files(lab)
    assert {p: v for p, v in after.items() if not p.endswith("last-apply.json")} == \
        {p: v for p, v in before.items() if not p.endswith("last-apply.json")}
    assert xfs_quota_report(mount) == limits
    lap("converged apply")

    # 4. vllm past its cap: ENOSPC for vllm alone, with room left on the filesystem.
    cap = caps["vllm"]
    written, err = fill(vllm, "chunk", 64)
    assert err == errno.ENOSPC, f"vllm wrote {written} bytes without ENOSPC"
    vfs = os.statvfs(mount)
    assert vfs.f_bavail * vfs.f_frsize > 2 * cap, "the filesystem itself was not full"
    used = xfs_quota_report(mount)[VLLM][0]
    assert cap - 8 * MIB <= used <= cap, (used, cap)
    lm_more = write_file(lmcache / "after-vllm-full.bin", 8 * MIB)  # lmcache keeps writing
    assert kit.digest_of(str(lmcache / "after-vllm-full.bin")) == lm_more
    kit.sh("sync")
    snap, _, eng = engine_health(lab, "vllm")
    assert eng.at_cap and eng.used_bytes == xfs_quota_report(mount)[VLLM][0]
    assert metric(snap, "kvagent_engine_at_cap", engine="vllm") == 1
    print(f"[figure] vllm: ENOSPC after {written} bytes of this fill, usage {used} of cap "
          f"{cap}; free on the filesystem {vfs.f_bavail * vfs.f_frsize}")
    lap("fill to ENOSPC")

    # 5. The cleaner, turned on: oldest first, only regular files of vllm's directory.
    chunks = sorted(vllm.glob("chunk-*.bin"))
    files = [vllm / f"pre-{i}.bin" for i in range(3)] + chunks
    base = 1_700_000_000 * 10**9
    for i, f in enumerate(files):  # ascending age order: pre-0 oldest
        os.utime(f, ns=(base + i * 10**9, base + i * 10**9))
    (vllm / "old-link.bin").symlink_to(lmcache / "keep.bin")
    (vllm / "dir-link").symlink_to(lmcache)
    for link in (vllm / "old-link.bin", vllm / "dir-link"):
        os.utime(link, ns=(1, 1), follow_symlinks=False)
    os.utime(lmcache / "keep.bin", ns=(1, 1))  # older than anything of vllm's
    write_config(lab, vllm_cleaner=True)
    cleaned = lab.apply()
    assert_ok(cleaned)
    lap("apply with the cleaner on")
    (run,) = [a for a in cleaned.actions if a.kind == "engine.clean"]
    assert run.subject == str(vllm) and run.status == "done", run
    os.statvfs(mount)  # let xfs finish freeing the unlinked inodes (background inodegc)
    after_clean = xfs_quota_report(mount)[VLLM][0]
    assert after_clean <= cap * 50 // 100, (after_clean, cap)
    left = [f for f in files if f.exists()]
    gone = [f for f in files if not f.exists()]
    assert gone and left and gone == files[:len(gone)], "not oldest first"
    assert (vllm / "old-link.bin").is_symlink() and (vllm / "dir-link").is_symlink()
    assert kit.digest_of(str(lmcache / "keep.bin")) == lm_keep
    assert kit.digest_of(str(lmcache / "after-vllm-full.bin")) == lm_more
    assert vllm.is_dir()
    snap, _, eng = engine_health(lab, "vllm")
    assert eng.cleaner is not None and (eng.cleaner.runs, eng.cleaner.deleted_files) == (
        1, len(gone))
    assert metric(snap, "kvagent_engine_cleaner_runs_total", engine="vllm") == 1
    print(f"[figure] cleaner: {len(gone)} oldest of {len(files)} files deleted, usage "
          f"{used} -> {after_clean} of cap {cap} (high 90%, low 50%): {run.detail}")
    # Under its low watermark now: the next pass deletes nothing.
    assert not [a for a in lab.apply().actions if a.kind == "engine.clean"]

    # 6. Dynamo needs GPUDirect Storage, which this VM does not have: refused alone.
    write_config(lab, vllm_cleaner=True, dynamo=True)
    refused = lab.apply()
    (error,) = refused.errors
    assert "GPUDirect Storage" in error.message and "nvidia-fs" in error.message, error
    renders = lab.state / "engines/kv"
    assert not (renders / "dynamo").exists()
    assert (renders / "vllm").is_dir() and (renders / "lmcache").is_dir()
    assert lsproj(mount / "dynamo") == project_id("dynamo")  # its cap is set all the same
    lap("dynamo refused")

    # 7. The figure: the tree sample against the quota read on a directory of many files.
    many = lmcache / "many"
    many.mkdir()
    count = 10_000
    for i in range(count):
        os.close(os.open(many / f"{i:05}", os.O_WRONLY | os.O_CREAT, 0o644))
    kit.sh("sync")
    lap(f"{count} files made")
    t0 = time.perf_counter()
    walked, entries, complete = usage_sample(str(lmcache), None)
    walk_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, sample_entries, _ = usage_sample(str(lmcache), 4096)
    sample_s = time.perf_counter() - t0
    reads = 200
    t0 = time.perf_counter()
    for _ in range(reads):
        q = get_quota(str(mount), LMCACHE)
    quota_s = (time.perf_counter() - t0) / reads
    assert complete and entries >= count
    # The quota counts the engine directory itself too; the walk counts what is below it.
    assert q.used_bytes == walked + os.lstat(lmcache).st_blocks * 512, (q.used_bytes, walked)
    print(f"[figure] usage of {entries} entries: full walk {walk_s * 1e3:.1f} ms, bounded "
          f"sample ({sample_entries} entries, a lower bound) {sample_s * 1e3:.1f} ms, quota "
          f"read {quota_s * 1e6:.1f} us; walk/quota = {walk_s / quota_s:.0f}x, "
          f"sample/quota = {sample_s / quota_s:.0f}x")
    assert walk_s > quota_s and sample_s > quota_s
    lap("figure")

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    print(json.dumps({"cap": cap, "used_at_enospc": used, "after_clean": after_clean}))
