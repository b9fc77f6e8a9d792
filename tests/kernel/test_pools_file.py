"""A file-backed pool over NVMe/TCP on one VM: export, attach, converge, grow, detach, destroy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.naming import filesystem_uuid, subsystem_nqn

from . import kit
from .pools import Lab, StateWatcher, assert_ok, mount_tmpfs, umount_all_under, write_file

pytestmark = pytest.mark.kernel
MIB = 1 << 20


def config(lab: Lab, *, count: int, target: bool = True, initiator: bool = True) -> str:
    text = f"""
version: 1
node: {{name: lab, state_dir: {lab.state}, run_dir: {lab.root}/run}}
"""
    if target:
        text += f"""
target:
  ports: [{{name: lo, id: 11, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: {count}, size: 300MiB}}
      ports: [lo]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""
    if initiator:
        text += f"""
initiator:
  device_wait: 60s
  pools:
    - name: kv
      target: {{transport: tcp, address: 127.0.0.1, service: 4420}}
      mount: {lab.root}/mnt/kv
      engines: [{{kind: lmcache, capacity: 45%}}, {{kind: vllm, capacity: 45%, cpu_cache: 1GiB}}]
"""
    return text


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "1200m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()


def test_file_pool_lifecycle_over_tcp(lab: Lab) -> None:
    nqn = subsystem_nqn("nqn.2026-11.io.kvagent", "lab", "kv", "lab")
    lab.write(config(lab, count=2))

    plan = lab.apply(dry_run=True)
    assert plan.changed and not kit.controllers_for(nqn), "plan must not change anything"
    assert kit.nvmet_is_empty()

    first = lab.apply()
    assert_ok(first)
    mounts = [lab.root / "mnt/kv/lab-ns1", lab.root / "mnt/kv/lab-ns2"]
    assert all(os.path.ismount(m) for m in mounts)
    (ctrl,) = kit.controllers_for(nqn)
    for nsid in (1, 2):
        uuid = kit.exported_uuid(nqn, nsid)
        dev = kit.block_by_uuid(uuid)
        assert dev, f"no block device with the deterministic uuid of nsid {nsid}"
        blkid = kit.sh("blkid", "-p", "-o", "export", dev).stdout
        assert f"UUID={filesystem_uuid(lab.hostnqn, uuid)}" in blkid
    engines = lab.state / "engines/kv"
    assert (engines / "lmcache").is_dir() and (engines / "vllm").is_dir()
    assert (mounts[0] / "lmcache").is_dir()
    digest = write_file(mounts[0] / "lmcache/chunk.bin", 8 * MIB)

    # Converged: nothing to do, not one configfs write.
    again = lab.cli("-o", "json", "apply", check=True)
    report = json.loads(again.stdout)
    assert report["changed"] is False and report["configfs_writes"] == 0, report["actions"]

    # Grow the pool while mounted: the existing controller stays live throughout.
    lab.write(config(lab, count=3))
    with StateWatcher([ctrl.name]) as watch:
        grown = lab.apply()
    assert_ok(grown)
    assert watch.seen[ctrl.name] == {"live"}, watch.seen
    assert os.path.ismount(lab.root / "mnt/kv/lab-ns3")
    assert kit.digest_of(str(mounts[0] / "lmcache/chunk.bin")) == digest

    # Detach: unmount and disconnect what kvagent attached; the export stays.
    lab.write(config(lab, count=3, initiator=False))
    detached = lab.apply()
    assert_ok(detached)
    assert not any(os.path.ismount(m) for m in [*mounts, lab.root / "mnt/kv/lab-ns3"])
    assert not kit.controllers_for(nqn)
    assert (kit.NVMET / "subsystems" / nqn).is_dir()

    # Unexport: the pool leaves the config; its data stays until destroyed.
    lab.write(config(lab, count=3, target=False, initiator=False))
    unexported = lab.apply()
    assert_ok(unexported)
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    files = sorted((lab.root / "files/kv/lab").glob("ns*.img"))
    assert len(files) == 3
    listing = json.loads(lab.cli("-o", "json", "pool", "list", check=True).stdout)
    assert [(p["name"], p["exported"]) for p in listing["pools"]] == [("kv", False)]

    dry = lab.cli("pool", "destroy", "kv")
    assert dry.returncode == 2 and all(f.exists() for f in files)
    lab.cli("pool", "destroy", "kv", "--yes", check=True)
    assert not any(f.exists() for f in files)
