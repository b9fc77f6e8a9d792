"""GPU-host attach on the real kernel, with a storage-host pool on the same VM as the far end.

- TCP, one xfs per namespace, every engine: one apply from empty to mounted, probed and
  rendered (renders parsed back and compared with the keys each engine documents); a
  second apply changes nothing; the target port goes away for 5 s under fio with crc32c
  verification; a "reboot" (unmount + disconnect behind kvagent's back) is undone by one
  apply with the same filesystems; detach returns the host to where it started.
- RDMA (soft-RoCE), one LVM striped volume across the namespaces: the same lifecycle.
- A namespace that already holds someone's ext4 is refused, byte for byte unchanged; a
  shared pool is never given a filesystem (connect only), and a per-host attach of it is
  refused before connecting.

File pools sit on a tmpfs (buffered_io): nvmet cannot export files on the guest's overlay.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli.main import main
from agent.engines import KINDS
from agent.naming import filesystem_uuid, subsystem_nqn
from tests.unit.engines.helpers import parse_env
from tests.unit.engines.test_render import SGLANG_ARGS, SGLANG_ENV_KEYS
from tests.unit.engines.test_render_dynamo import BASE_KEYS as DYNAMO_BASE_KEYS
from tests.unit.engines.test_render_lmcache import EXTRA_KEYS as LMCACHE_EXTRA_KEYS
from tests.unit.engines.test_render_lmcache import KNOWN_KEYS as LMCACHE_KNOWN_KEYS
from tests.unit.engines.test_render_mooncake import KEYS as MOONCAKE_KEYS
from tests.unit.engines.test_render_vllm import EXTRA_KEYS as VLLM_EXTRA_KEYS
from tests.unit.engines.test_render_vllm import FS_TIER_KEYS as VLLM_FS_TIER_KEYS
from tests.unit.engines.test_render_vllm import TOP_KEYS as VLLM_TOP_KEYS

from . import kit
from .pools import (
    Lab,
    RecordingRunner,
    StateWatcher,
    assert_ok,
    mount_tmpfs,
    umount_all_under,
    write_file,
)

pytestmark = pytest.mark.kernel
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20


def target_yaml(lab: Lab, transport: str, address: str, port_id: int, pools: str) -> str:
    return f"""
target:
  ports: [{{name: p, id: {port_id}, transport: {transport}, address: {address}, service: 4420}}]
  pools:
{pools}"""


def file_pool(lab: Lab, name: str, count: int, size: str, shared: bool = False) -> str:
    return f"""
    - name: {name}
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: {count}, size: {size}}}
      ports: [p]
      shared: {str(shared).lower()}
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""


#: Settings some engines need in the config (vllm's CPU tier; dynamo without GDS checks and
#: with a share of the pool that gives KVBM at least 1 GB per directory: below that KVBM's
#: disk tier is off and kvagent refuses the render).
EXTRA = {"dynamo": ", gds: trust, capacity: 45%", "vllm": ", cpu_cache: 1GiB"}


def initiator_pool(lab: Lab, name: str, transport: str, address: str, *,
                   layout: str = "per-namespace", shared: bool = False,
                   engines: tuple[str, ...] = ()) -> str:
    # The VM has no GPUDirect Storage: Dynamo's render is checked elsewhere
    # (test_cache_quota.py refuses it here); these tests render it unchecked.
    eng = ", ".join(f"{{kind: {k}{EXTRA.get(k, '')}}}" for k in engines)
    return f"""
    - name: {name}
      target: {{transport: {transport}, address: {address}, service: 4420}}
      mount: {lab.root}/mnt/{name}
      layout: {layout}
      shared: {str(shared).lower()}
      connect: {{ctrl_loss_tmo: forever, reconnect_delay: 2s, fast_io_fail_tmo: 'off'}}
      engines: [{eng}]
"""


def write_config(lab: Lab, target: str = "", initiator_pools: str = "") -> None:
    text = f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
{target}"""
    if initiator_pools:
        text += f"""
initiator:
  device_wait: 60s
  pools:
{initiator_pools}"""
    lab.write(text)


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "1400m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def host_snapshot() -> tuple[list[str], list[str]]:
    """Mounts and fabrics controllers now (to compare with after a detach)."""
    mounts = sorted(line.split()[1] for line in Path("/proc/self/mounts").read_text()
                    .splitlines())
    ctrls = sorted(f"{c.name} {kit.read(c / 'subsysnqn')}"
                   for c in Path("/sys/class/nvme").glob("nvme*")
                   if kit.read(c / "transport") in ("tcp", "rdma"))
    return mounts, ctrls


def kinds_done(result) -> list[str]:
    return [a.kind for a in result.actions if a.status == "done"]


def blkid(dev: str) -> dict[str, str]:
    out = kit.sh("blkid", "-p", "-o", "export", dev, check=False)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def on_pool(path: str, mount: Path) -> bool:
    """``path`` is a directory on the filesystem mounted at ``mount``."""
    return (os.path.ismount(mount) and os.path.isdir(path)
            and os.stat(path).st_dev == os.stat(mount).st_dev
            and Path(path).resolve().is_relative_to(mount))


def check_renders(lab: Lab, pool: str, mounts: list[Path], kinds: tuple[str, ...]) -> None:
    """Parse every render apply wrote and compare it with the engines' documented keys."""
    root = lab.state / "engines" / pool
    assert sorted(p.name for p in root.iterdir()) == sorted(kinds)
    want = {k: [str(m / k) for m in mounts] for k in kinds}
    for kind in kinds:
        for d in want[kind]:
            assert any(on_pool(d, m) for m in mounts), f"{d} is not on a mounted pool fs"
    files = {k: {p.name: p.read_text() for p in (root / k).iterdir()} for k in kinds}
    if "lmcache" in kinds:
        data = yaml.safe_load(files["lmcache"]["lmcache.yaml"])
        assert set(data) <= LMCACHE_KNOWN_KEYS and set(data["extra_config"]) == LMCACHE_EXTRA_KEYS
        dirs = [v.removeprefix("file://").rstrip("/") for v in data["local_disk"].split(",")]
        assert dirs == want["lmcache"]
        assert data["max_local_disk_size"] > 0
        assert data["extra_config"]["use_odirect"] is True  # xfs over NVMe-oF takes O_DIRECT
    if "vllm" in kinds:
        roots = []
        for text in files["vllm"].values():
            cfg = json.loads(text)
            assert set(cfg) == VLLM_TOP_KEYS and cfg["kv_connector"] == "OffloadingConnector"
            extra = cfg["kv_connector_extra_config"]
            assert set(extra) == VLLM_EXTRA_KEYS
            for tier in extra["secondary_tiers"]:
                assert set(tier) <= VLLM_FS_TIER_KEYS and tier["type"] == "fs"
                roots.append(tier["root_dir"])
        assert sorted(roots) == sorted(want["vllm"])
    env_dir_key = {"dynamo": ("DYN_KVBM_DISK_CACHE_DIR", DYNAMO_BASE_KEYS),
                   "sglang": ("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", SGLANG_ENV_KEYS),
                   "mooncake": ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", MOONCAKE_KEYS)}
    for kind, (key, documented) in env_dir_key.items():
        if kind not in kinds:
            continue
        envs = [parse_env(t) for n, t in files[kind].items() if n.endswith(".env")]
        for env in envs:
            assert set(env) <= documented | {"DYN_KVBM_DISK_DISABLE_O_DIRECT",
                                             "DYN_KVBM_DISK_ZEROFILL_FALLBACK"}, env
            assert documented - set(env) == set(), f"{kind}: missing {documented - set(env)}"
        assert sorted(e[key] for e in envs) == sorted(want[kind])
    if "sglang" in kinds:
        assert shlex.split(files["sglang"]["sglang.args"]) == SGLANG_ARGS



def write_sectors(device: str) -> int:
    """Sectors written so far to a namespace head and its hidden paths (stat field 7).

    The 6.1 kernel may not account I/O on the multipath head itself, so the
    per-path nodes (nvme<S>c<C>n<N>) are summed in.
    """
    m = re.fullmatch(r"nvme(\d+)n(\d+)", os.path.basename(device))
    assert m, device
    names = re.compile(rf"nvme{m[1]}(c\d+)?n{m[2]}")
    return sum(int(kit.read(p / "stat").split()[6]) for p in Path("/sys/block").iterdir()
               if names.fullmatch(p.name))


# ---------------------------------------------------------------------------- TCP

@pytest.fixture
def roomy_lab(lab: Lab) -> Iterator[Lab]:
    """A lab whose pool files (``files/``) have room for namespaces of a few GiB."""
    with kit.sparse_xfs(lab.root / "files", 7 << 30):
        yield lab


def test_tcp_attach_outage_reboot_detach(roomy_lab: Lab) -> None:
    lab = roomy_lab
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    target = target_yaml(lab, "tcp", "127.0.0.1", 21, file_pool(lab, "kv", 2, "3GiB"))
    attach = initiator_pool(lab, "kv", "tcp", "127.0.0.1", engines=KINDS)
    write_config(lab, target, attach)
    before = host_snapshot()
    mounts = [lab.root / "mnt/kv/lab-ns1", lab.root / "mnt/kv/lab-ns2"]

    lap = kit.Laps()
    first = lab.apply()
    lap("first apply (tcp, per-namespace, 5 engines)")
    assert_ok(first)
    done = kinds_done(first)
    assert done.count("nvme.connect") == 1 and done.count("mkfs.xfs") == 2, done
    assert done.count("mount") == 2 and "engine.render" in done, done
    assert all(os.path.ismount(m) for m in mounts)
    (ctrl,) = kit.controllers_for(nqn)
    assert (kit.read(ctrl / "ctrl_loss_tmo"), kit.read(ctrl / "reconnect_delay")) == ("off", "2")
    devices, fs_uuids = [], []
    for nsid in (1, 2):
        dev = kit.block_by_uuid(kit.exported_uuid(nqn, nsid))
        assert dev
        fs = blkid(dev)
        assert fs["TYPE"] == "xfs"
        assert fs["UUID"] == str(filesystem_uuid(lab.hostnqn, kit.exported_uuid(nqn, nsid)))
        devices.append(dev)
        fs_uuids.append(fs["UUID"])
    probes = json.loads((lab.state / "probes/kv.json").read_text())
    assert [p["path"] for p in probes] == [str(m) for m in mounts]
    assert all(p["odirect_ok"] and p["fallocate_ok"] and p["transport"] == "tcp"
               for p in probes), probes
    check_renders(lab, "kv", mounts, KINDS)

    lap("checks")
    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    lap("second apply")
    assert_ok(again)
    assert again.changed is False, [a for a in again.actions if a.status == "done"]
    # Converged: sysfs and the superblocks answer; only discovery asks the storage host
    # (this pool names no subsystem), and nothing else runs.
    assert [c[:2] for c in runner.calls] == [("nvme", "discover")], runner.calls

    # In-process (click's runner): a Python start costs tens of seconds in this VM.
    cli = CliRunner().invoke(main, ["-c", str(lab.config), "-o", "json", "engines", "render",
                                    "kv", "--engine", "lmcache"])
    assert cli.exit_code == 0, cli.output
    shown = json.loads(cli.stdout)
    assert shown["files"] == {
        "lmcache.yaml": (lab.state / "engines/kv/lmcache/lmcache.yaml").read_text()}
    assert shown["probes_from"] == "record" and shown["notes"]
    lap("kvagent engines render")

    # The target port goes away for 5 s while fio writes with crc32c checksums (32 MiB:
    # well within vllm's cap, 45% of a 3 GiB namespace split by the other 4 engines); with
    # fast_io_fail_tmo off, I/O waits for the path (test_cache_failfast.py: it fails fast).
    fio_file = mounts[0] / "vllm/fio.dat"
    fio = subprocess.Popen(
        ["fio", "--name=outage", f"--filename={fio_file}", "--size=32m", "--bs=256k",
         "--rw=write", "--ioengine=psync", "--direct=1", "--rate=6m", "--verify=crc32c",
         "--do_verify=1", "--verify_fatal=1", "--output-format=json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    link = kit.NVMET / "ports/21/subsystems" / nqn
    try:
        start = write_sectors(devices[0])
        kit.wait_for(lambda: write_sectors(devices[0]) - start >= 8 * MIB // 512, 120,
                     interval=0.1, what="fio to be writing")
        with StateWatcher([ctrl.name]) as watch:
            link.unlink()
            time.sleep(5)
            assert kit.read(ctrl / "state") == "connecting"
            relinked = lab.apply()  # the target pass links the port again
            assert_ok(relinked)
            assert kit.read(ctrl / "state") == "live"
        out, err = fio.communicate(timeout=600)
    finally:
        if fio.poll() is None:
            fio.kill()
            fio.wait()
    lap("fio with a 5 s port outage")
    assert fio.returncode == 0, err
    (job,) = json.loads(out[out.index("{"):])["jobs"]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] == 32 * MIB and job["read"]["io_bytes"] == 32 * MIB
    assert {"live", "connecting"} <= watch.seen[ctrl.name], watch.seen
    assert "(gone)" not in watch.seen[ctrl.name]
    assert [c.name for c in kit.controllers_for(nqn)] == [ctrl.name]
    assert not [a for a in relinked.actions if a.role == "initiator" and a.status == "done"]

    # A reboot, as far as a VM can show it: mounts and controllers gone behind kvagent's back.
    digest = write_file(mounts[1] / "mooncake/keep.bin", 4 * MIB)
    for m in mounts:
        kit.sh("umount", str(m))
    kit.sh("nvme", "disconnect-all")
    assert not kit.controllers_for(nqn) and not any(os.path.ismount(m) for m in mounts)
    lap("unmount + disconnect-all")
    rebooted = lab.apply()
    lap("apply after 'reboot'")
    assert_ok(rebooted)
    done = kinds_done(rebooted)
    assert "nvme.connect" in done and done.count("mount") == 2 and "mkfs.xfs" not in done, done
    for nsid, fs_uuid in zip((1, 2), fs_uuids, strict=True):
        assert blkid(kit.block_by_uuid(kit.exported_uuid(nqn, nsid)))["UUID"] == fs_uuid
    assert kit.digest_of(str(mounts[1] / "mooncake/keep.bin")) == digest
    assert fio_file.stat().st_size == 32 * MIB

    # Detach: the initiator pool leaves the config; the host is back where it started.
    write_config(lab, target)
    detached = lab.apply()
    lap("detach")
    assert_ok(detached)
    assert host_snapshot() == before
    assert not (lab.root / "mnt").exists(), "mount directories kvagent made are left"
    assert not (lab.state / "engines/kv").exists() and not (lab.state / "probes/kv.json").exists()
    assert json.loads((lab.state / "initiator.json").read_text())["pools"] == {}
    write_config(lab)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()


# --------------------------------------------------------------------------- RDMA

def test_rdma_striped_attach_and_detach(lab: Lab, rxe) -> None:
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    target = target_yaml(lab, "rdma", rxe.address, 22, file_pool(lab, "kv", 2, "200MiB"))
    attach = initiator_pool(lab, "kv", "rdma", rxe.address, layout="striped",
                            engines=("lmcache", "vllm"))
    write_config(lab, target, attach)
    before = host_snapshot()
    mount = lab.root / "mnt/kv"

    lap = kit.Laps()
    first = lab.apply()
    lap("first apply (rdma, striped)")
    assert_ok(first)
    done = kinds_done(first)
    assert done.count("lvm.striped") == 1 and done.count("mkfs.xfs") == 1, done
    assert os.path.ismount(mount)
    (ctrl,) = kit.controllers_for(nqn)
    assert kit.read(ctrl / "transport") == "rdma"
    lvs = json.loads(kit.sh("lvs", "--reportformat", "json", "-o",
                            "lv_name,vg_name,stripes,segtype,vg_tags,devices", "kvs_kv").stdout)
    (lv,) = lvs["report"][0]["lv"]
    assert (lv["lv_name"], lv["segtype"], lv["stripes"]) == ("data", "striped", "2"), lv
    assert {"kvagent", "kvagent_pool=kv", "kvagent_role=initiator"} <= set(
        lv["vg_tags"].split(","))
    devs = {kit.block_by_uuid(kit.exported_uuid(nqn, n)) for n in (1, 2)}
    assert {d.split("(")[0] for d in lv["devices"].split(",")} == devs
    assert blkid("/dev/kvs_kv/data")["TYPE"] == "xfs"
    probes = json.loads((lab.state / "probes/kv.json").read_text())
    assert [(p["path"], p["transport"], p["odirect_ok"]) for p in probes] == [
        (str(mount), "rdma", True)]
    check_renders(lab, "kv", [mount], ("lmcache", "vllm"))
    digest = write_file(mount / "lmcache/chunk.bin", 4 * MIB)

    lap("checks")
    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    lap("second apply")
    assert_ok(again)
    assert again.changed is False, [a for a in again.actions if a.status == "done"]
    # Converged: sysfs and the superblocks answer; only discovery asks the storage host
    # (this pool names no subsystem), and nothing else runs.
    assert [c[:2] for c in runner.calls] == [("nvme", "discover")], runner.calls
    assert kit.digest_of(str(mount / "lmcache/chunk.bin")) == digest

    write_config(lab, target)
    detached = lab.apply()
    lap("detach")
    assert_ok(detached)
    assert {"umount", "lvm.deactivate", "nvme.disconnect"} <= set(kinds_done(detached))
    assert host_snapshot() == before
    assert not any(p.name.startswith("kvs_kv") for p in Path("/dev/mapper").iterdir())
    write_config(lab)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()


# ------------------------------------------------------------ nothing lost, shared

def test_foreign_filesystem_and_shared_pool_are_never_formatted(lab: Lab) -> None:
    kv_nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    sh_nqn = subsystem_nqn(PREFIX, "lab", "sh", None)
    pools = file_pool(lab, "kv", 1, "300MiB") + file_pool(lab, "sh", 1, "16MiB", shared=True)
    target = target_yaml(lab, "tcp", "127.0.0.1", 23, pools)
    write_config(lab, target)
    assert_ok(lab.apply())
    before = host_snapshot()

    # Someone's ext4 with a file, written on the storage side into the exported backing.
    backing = lab.root / "files/kv/lab/ns1.img"
    content = lab.root / "someone"
    content.mkdir()
    (content / "notes.txt").write_text("not kvagent's\n")
    kit.sh("mkfs.ext4", "-q", "-F", "-d", str(content), str(backing), timeout=120)
    ext4_sum = kit.digest_of(str(backing))
    shared_backing = lab.root / "files/sh/shared/ns1.img"
    shared_sum = kit.digest_of(str(shared_backing))

    write_config(lab, target, initiator_pool(lab, "kv", "tcp", "127.0.0.1", engines=("vllm",))
                 + initiator_pool(lab, "sh", "tcp", "127.0.0.1"))
    refused = lab.apply()
    messages = {e.pool: e.message for e in refused.errors}
    assert set(messages) == {"kv", "sh"}, refused.errors
    assert "refusing to format" in messages["kv"] and "ext4" in messages["kv"]
    assert "shared subsystem" in messages["sh"]
    assert not kit.controllers_for(sh_nqn), "a refused shared pool was connected"
    assert not os.path.ismount(lab.root / "mnt/kv/lab-ns1")
    assert "mkfs.xfs" not in kinds_done(refused)
    dev = kit.block_by_uuid(kit.exported_uuid(kv_nqn, 1))
    assert dev and blkid(dev)["TYPE"] == "ext4"
    assert kit.digest_of(str(backing)) == ext4_sum

    # kv leaves the config: the controller the failed attach made is disconnected.
    # sh as a shared pool: connected, never formatted, nothing mounted.
    write_config(lab, target, initiator_pool(lab, "sh", "tcp", "127.0.0.1", shared=True))
    shared = lab.apply()
    assert_ok(shared)
    assert not kit.controllers_for(kv_nqn)
    assert len(kit.controllers_for(sh_nqn)) == 1
    sh_dev = kit.block_by_uuid(kit.exported_uuid(sh_nqn, 1))
    assert sh_dev and blkid(sh_dev) == {}
    assert not (lab.root / "mnt/sh").exists()
    assert {a.kind for a in shared.actions if a.pool == "sh"} == {"nvme.connect"}
    assert lab.apply().changed is False

    write_config(lab, target)
    assert_ok(lab.apply())
    assert host_snapshot() == before
    assert kit.digest_of(str(backing)) == ext4_sum
    assert kit.digest_of(str(shared_backing)) == shared_sum
    write_config(lab)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
