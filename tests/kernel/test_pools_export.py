"""File, LVM and whole-device pools on the real kernel, over NVMe/TCP and NVMe/RDMA.

One VM, one storage host that is also its own GPU host (raw nvme-cli with two host
identities): apply cold and converged (timed), per-host discovery and ACLs, I/O on every
namespace over both transports, growth while connected, a device another pool wants,
unexport, and pool destroy of only what kvagent owns.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agent.config import load_config
from agent.naming import subsystem_nqn
from agent.records import TargetRecords
from agent.system.run import SubprocessRunner
from agent.target.inventory import destroy_pool

from . import kit
from .pools import (
    DRIVES,
    MIB,
    Lab,
    StateWatcher,
    assert_converged,
    assert_ok,
    block_size_bytes,
    device_digest,
    digest_buffered,
    discovered,
    mount_tmpfs,
    namespace_device,
    nvme_connect,
    nvme_disconnect,
    remove_volume_group,
    timed_apply,
    umount_all_under,
    zero,
)

pytestmark = pytest.mark.kernel

PREFIX = "nqn.2026-11.io.kvagent"
VG = "kvtvg"
OTHER_ID = str(uuid.uuid4())
OTHER = f"nqn.2014-08.org.nvmexpress:uuid:{OTHER_ID}"
RDMA = "10.99.0.1"
IO = 1 * MIB


def nqn(pool: str, host: str) -> str:
    return subsystem_nqn(PREFIX, "lab", pool, host)


def config(lab: Lab, pools: list[str], *, fl: tuple[int, int] = (2, 16),
           lv: tuple[int, int] = (2, 16), thief: str | None = None) -> str:
    """The lab config with the named pools; (count, MiB) for the file and LVM pools."""
    hosts = (f'[{{name: lab, nqn: "{lab.hostnqn}"}}, {{name: other, nqn: "{OTHER}"}}]')
    blocks = {
        "fl": f"""
    - name: fl
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: {fl[0]}, size: {fl[1]}MiB}}
      ports: [tcp, roce]
      hosts: {hosts}""",
        "lv": f"""
    - name: lv
      backing: {{kind: lvm, volume_group: {VG}, devices: [{DRIVES[0]}]}}
      namespaces: {{count: {lv[0]}, size: {lv[1]}MiB}}
      ports: [tcp, roce]
      hosts: {hosts}""",
        "dv": f"""
    - name: dv
      backing: {{kind: device, devices: [{{path: {DRIVES[1]}, host: lab}}]}}
      ports: [tcp, roce]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]""",
    }
    text = f"""
version: 1
node: {{name: lab, state_dir: {lab.state}, run_dir: {lab.root}/run}}
"""
    if pools or thief:
        text += f"""
target:
  ports:
    - {{name: tcp, id: 21, transport: tcp, address: 127.0.0.1, service: 4420}}
    - {{name: roce, id: 22, transport: rdma, address: {RDMA}, service: 4420}}
  pools:{"".join(blocks[p] for p in pools)}
"""
    if thief:
        text += f"""
    - name: th
      backing: {{kind: lvm, volume_group: kvtvg2, devices: [{thief}]}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [tcp]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
"""
    return text


@pytest.fixture
def lab(tmp_path: Path, rxe):
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "256m")
    try:
        yield lab
    finally:
        kit.force_clean()
        umount_all_under(tmp_path)
        kit.sh("lvremove", "-ff", "-y", VG, check=False, timeout=120)
        remove_volume_group(VG, DRIVES[0])
        kit.sh("wipefs", "-a", DRIVES[0], check=False)
        zero(DRIVES[0], 512 * MIB)  # the LVs' data written by this test
        zero(DRIVES[1], 4 * MIB)  # the whole-device pool's data written by this test


def io_on(transport: str, address: str, lab: Lab, pools: dict[str, int]) -> dict[str, str]:
    """Connect this host to its subsystem of each pool; write+read 1 MiB on every namespace
    and find the same bytes on the backing. Returns {"pool/nsid": digest}."""
    backing = {"fl": lambda n: f"{lab.root}/files/fl/lab/ns{n}.img",
               "lv": lambda n: f"/dev/{VG}/kv_lv_lab_{n}",
               "dv": lambda n: DRIVES[1]}
    digests = {}
    for pool, count in pools.items():
        nvme_connect(transport, address, nqn(pool, "lab"))
        (ctrl,) = kit.controllers_for(nqn(pool, "lab"))
        assert kit.read(ctrl / "transport") == transport
        for nsid in range(1, count + 1):
            dev = namespace_device(nqn(pool, "lab"), nsid)
            digest = kit.odirect_roundtrip(dev, IO)
            where = backing[pool](nsid)
            on_backing = (digest_buffered(where, 0, IO) if pool == "fl"
                          else device_digest(where, (0, IO)))
            assert on_backing == digest, f"{pool} ns{nsid}: bytes not on {where}"
            digests[f"{pool}/{nsid}"] = digest
    return digests


def test_file_lvm_device_pools_over_tcp_and_rdma(lab: Lab) -> None:
    runner = SubprocessRunner()
    mine = {p: nqn(p, "lab") for p in ("fl", "lv", "dv")}
    theirs = {p: nqn(p, "other") for p in ("fl", "lv")}
    for drive in DRIVES:
        assert kit.sh("wipefs", "--no-act", drive).stdout.strip() == "", \
            f"{drive} must start blank in this VM"

    # -- cold and converged applies, one pool kind at a time (figures for the closing note)
    times = []
    for pools in (["fl"], ["fl", "lv"], ["fl", "lv", "dv"]):
        lab.write(config(lab, pools))
        cold, t_cold = timed_apply(lab)
        assert_ok(cold)
        assert cold.changed
        again, t_again = timed_apply(lab)
        assert_converged(again)
        times.append((pools[-1], t_cold, t_again, cold.configfs_writes))
    for pool, t_cold, t_again, writes in times:  # copied to the CI log by tests/vmplugin.py
        print(f"KVAGENT-CI-LOG: apply with pools up to {pool!r} (TCG VM): cold {t_cold:.2f}s "
              f"({writes} configfs writes), converged {t_again:.2f}s (0 writes)")
    assert {v.tag_value("kvagent_pool") for v in _owned(runner)} == {"lv"}
    assert TargetRecords.load(lab.state).claims[DRIVES[1]].pool == "dv"

    # -- each subsystem allows exactly its host; discovery shows each host only its own
    subs = {p.name for p in (kit.NVMET / "subsystems").iterdir()}
    assert subs == set(mine.values()) | set(theirs.values())
    for sub in mine.values():
        assert os.listdir(kit.NVMET / "subsystems" / sub / "allowed_hosts") == [lab.hostnqn]
    for sub in theirs.values():
        assert os.listdir(kit.NVMET / "subsystems" / sub / "allowed_hosts") == [OTHER]
    for transport, address in (("tcp", "127.0.0.1"), ("rdma", RDMA)):
        assert discovered(transport, address) == set(mine.values())
        assert discovered(transport, address, OTHER, OTHER_ID) == set(theirs.values())

    # -- a connect to the other host's subsystem is refused by the kernel, both ways
    for sub, ident in ((mine["lv"], (OTHER, OTHER_ID)), (theirs["lv"], (None, None))):
        refused = nvme_connect("tcp", "127.0.0.1", sub, *ident, check=False)
        assert refused.returncode != 0, refused.stdout
        assert not kit.controllers_for(sub)
        host = ident[0] or lab.hostnqn
        assert f"Connect for subsystem {sub} is not allowed, hostnqn: {host}" in \
            kit.sh("dmesg").stdout
    # ... and the other identity gets its own.
    nvme_connect("tcp", "127.0.0.1", theirs["lv"], OTHER, OTHER_ID)
    (ctrl,) = kit.controllers_for(theirs["lv"])
    assert kit.read(ctrl / "hostnqn") == OTHER
    for nsid in (1, 2):
        kit.odirect_roundtrip(namespace_device(theirs["lv"], nsid), IO)
    nvme_disconnect(theirs["lv"])

    # -- this host reads and writes every namespace over RDMA, then over TCP
    counts = {"fl": 2, "lv": 2, "dv": 1}
    io_on("rdma", RDMA, lab, counts)
    nvme_disconnect(*mine.values())
    digests = io_on("tcp", "127.0.0.1", lab, counts)

    # -- grow while connected: more namespaces and bigger LVs/files; controllers stay live
    ctrls = [kit.controllers_for(mine[p])[0].name for p in ("fl", "lv", "dv")]
    devices = {k: namespace_device(mine[k.split("/")[0]], int(k.split("/")[1]))
               for k in digests}
    lab.write(config(lab, ["fl", "lv", "dv"], fl=(3, 32), lv=(3, 32)))
    with StateWatcher(ctrls) as watch:
        grown, t_grow = timed_apply(lab)
    assert_ok(grown)
    print(f"  grow (+2 files, +2 LVs; 4 files and 4 LVs to 32 MiB): {t_grow:.2f}")
    kinds = [a.kind for a in grown.actions if a.status == "done"]
    assert kinds.count("lvm.lvextend") == 4 and kinds.count("lvm.lvcreate") == 2
    assert kinds.count("file.grow") == 4 and kinds.count("file.create") == 2
    assert all(seen == {"live"} for seen in watch.seen.values()), watch.seen
    assert [kit.controllers_for(mine[p])[0].name for p in ("fl", "lv", "dv")] == ctrls
    for key, digest in digests.items():
        assert kit.digest_of_range(devices[key], 0, IO) == digest, f"{key} changed"
    for pool in ("fl", "lv"):
        for nsid in range(1, counts[pool] + 1):
            kit.wait_for(lambda d=devices[f"{pool}/{nsid}"]: block_size_bytes(d) == 32 * MIB,
                         30, what=f"{pool} ns{nsid} to show its new size on the host")
        new = namespace_device(mine[pool], counts[pool] + 1)
        assert block_size_bytes(new) == 32 * MIB
        kit.odirect_roundtrip(new, IO)

    # -- another pool wants the exported device (by another name): refused; nothing moves
    real = os.path.realpath(DRIVES[1])
    lab.write(config(lab, ["fl", "lv", "dv"], fl=(3, 32), lv=(3, 32), thief=real))
    thief = lab.apply()
    assert [(e.pool, e.message.split(":")[0]) for e in thief.errors] == [("th", "pool th")]
    assert "claimed by pool dv" in thief.errors[0].message
    assert f"exported by nvmet subsystem {mine['dv']}" in thief.errors[0].message
    assert not thief.changed and thief.configfs_writes == 0
    assert "kvtvg2" not in kit.sh("vgs", "-o", "vg_name", "--noheadings").stdout
    assert kit.digest_of_range(devices["dv/1"], 0, IO) == digests["dv/1"]
    nvme_disconnect(*mine.values())

    # -- unexport everything: data stays; destroy deletes only what kvagent owns
    lab.write(config(lab, []))
    gone = lab.apply()
    assert_ok(gone)
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    kit.sh("lvcreate", "-y", "-n", "keep", "-L", "8m", VG, timeout=120)
    cfg = load_config(lab.config)
    plan = destroy_pool(cfg, "lv", runner, yes=False)
    assert len(plan["logical_volumes"]) == 6 and not plan["destroyed"]
    assert destroy_pool(cfg, "lv", runner, yes=True)["destroyed"]
    left = kit.sh("lvs", "--noheadings", "-o", "lv_name,lv_tags", VG).stdout.split()
    assert left == ["keep"], f"only the untagged LV may survive: {left}"
    before = device_digest(DRIVES[1], (0, 4 * MIB))
    released = destroy_pool(cfg, "dv", runner, yes=True)
    assert released["device_claims"] == [DRIVES[1]]
    assert DRIVES[1] not in TargetRecords.load(lab.state).claims
    assert device_digest(DRIVES[1], (0, 4 * MIB)) == before, "a released device was changed"
    assert device_digest(real, (0, IO)) == digests["dv/1"]
    files = destroy_pool(cfg, "fl", runner, yes=True)["files"]
    assert len(files) == 6 and not any(os.path.exists(f) for f in files)


def _owned(runner: SubprocessRunner) -> list:
    from agent.target.backings.lvm import list_owned_volumes

    return list_owned_volumes(runner)
