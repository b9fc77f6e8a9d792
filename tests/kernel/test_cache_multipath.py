"""Multipath on the real kernel: one pool exported over NVMe/RDMA (soft-RoCE) and NVMe/TCP.

The storage side says RDMA optimized, TCP non-optimized (``ana_state`` of each port: the
two lines docs/configuration.md shows). The GPU side attaches the pool through both ports:

- ``iopolicy: queue-depth`` on 6.1: the kernel refuses it (EINVAL); the pool's error names
  the kernel it needs, and the pool is attached anyway with the kernel's policy;
- ``iopolicy: round-robin``: written once, read back; one multipath head per namespace,
  each with two live paths whose ANA states the GPU side sees as configured; a second
  apply changes nothing and runs only discovery;
- fio writes (crc32c verified) while the RDMA port's link to the subsystem is removed:
  writes went over RDMA only (ANA), then over TCP, with no error; an apply links the
  port again and both paths are live again;
- the preference turned around (TCP optimized) on live paths: two configfs writes, the
  GPU host sees the new states, no controller reconnects;
- ``kvagent status`` (the collector) shows the iopolicy of each controller.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from agent.config import load_config
from agent.health.collect import collect
from agent.health.status import render_status_text, to_status_json
from agent.naming import subsystem_nqn
from agent.system.run import default_runner

from . import kit
from .pools import Lab, RecordingRunner, assert_ok, mount_tmpfs, umount_all_under

pytestmark = pytest.mark.kernel(group="cache", weight=0.6)
PREFIX = "nqn.2026-11.io.kvagent"
MIB = 1 << 20
TCP_PORT, RDMA_PORT = 42, 43



def config_text(lab: Lab, rdma: str, iopolicy: str, prefer: str = "rdma") -> str:
    rdma_state, tcp_state = (("optimized", "non-optimized") if prefer == "rdma"
                             else ("non-optimized", "optimized"))
    return f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports:
    - {{name: rdma, id: {RDMA_PORT}, transport: rdma, address: {rdma}, service: 4420,
       ana_state: {rdma_state}}}
    - {{name: tcp, id: {TCP_PORT}, transport: tcp, address: 127.0.0.1, service: 4420,
       ana_state: {tcp_state}}}
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files, buffered_io: true}}
      namespaces: {{count: 2, size: 300MiB}}
      ports: [rdma, tcp]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
initiator:
  device_wait: 60s
  pools:
    - name: kv
      targets: [{{transport: rdma, address: {rdma}}}, {{transport: tcp, address: 127.0.0.1}}]
      mount: {lab.root}/mnt/kv
      connect: {{ctrl_loss_tmo: forever, reconnect_delay: 2s}}
      iopolicy: {iopolicy}
"""


@pytest.fixture
def lab(tmp_path: Path):
    # Loopback NVMe/TCP with transparent huge pages 'always' trips a 6.1 kernel bug that
    # leaves I/O hanging (docs/operations.md, troubleshooting).
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    before = re.search(r"\[(\w+)\]", thp.read_text())
    kit.write(thp, "madvise")
    lab = Lab(tmp_path)
    mount_tmpfs(tmp_path / "files", "700m")
    yield lab
    umount_all_under(tmp_path)
    kit.force_clean()
    if before:
        kit.write(thp, before.group(1))


def subsystem_dir(nqn: str) -> Path:
    (found,) = [d for d in Path("/sys/class/nvme-subsystem").iterdir()
                if kit.read(d / "subsysnqn") == nqn]
    return found


def paths_by_transport(sub: Path) -> dict[str, dict[int, str]]:
    """{transport: {nsid: hidden path node}} of the subsystem's heads."""
    out: dict[str, dict[int, str]] = {}
    for node in Path("/sys/block").iterdir():
        m = re.fullmatch(rf"nvme{sub.name.removeprefix('nvme-subsys')}c(\d+)n(\d+)", node.name)
        if m:
            transport = kit.read(f"/sys/class/nvme/nvme{m[1]}/transport")
            out.setdefault(transport, {})[int(m[2])] = node.name
    return out


def written(node: str) -> int:
    """Sectors written through one path (stat field 7 of the hidden path node)."""
    return int(kit.read(f"/sys/block/{node}/stat").split()[6])


def states(nqn: str) -> dict[str, str]:
    return {kit.read(c / "transport"): kit.read(c / "state") for c in kit.controllers_for(nqn)}


def test_one_pool_over_rdma_and_tcp_with_ana_iopolicy_and_a_path_outage(lab: Lab,
                                                                       rxe) -> None:  # type: ignore[no-untyped-def]
    nqn = subsystem_nqn(PREFIX, "lab", "kv", "lab")
    mounts = [lab.root / "mnt/kv/lab-ns1", lab.root / "mnt/kv/lab-ns2"]
    lap = kit.Laps()

    # queue-depth: not on 6.1. The pool's error says so; the pool is attached anyway.
    lab.write(config_text(lab, rxe.address, "queue-depth"))
    refused = lab.apply()
    lap("first apply (iopolicy queue-depth)")
    messages = [e.message for e in refused.errors]
    assert len(messages) == 1 and refused.errors[0].pool == "kv", refused.errors
    assert "refused iopolicy 'queue-depth'" in messages[0] and "(EINVAL)" in messages[0]
    assert f"needs Linux 6.11 or later, and this host runs {os.uname().release}" in messages[0]
    print(f"[multipath] 6.1 on queue-depth: {messages[0]}")
    sub = subsystem_dir(nqn)
    assert kit.read(sub / "iopolicy") == "numa"
    assert all(os.path.ismount(m) for m in mounts)

    lab.write(config_text(lab, rxe.address, "round-robin"))
    set_rr = lab.apply()
    assert_ok(set_rr)
    assert [(a.kind, a.subject, a.detail) for a in set_rr.actions if a.status == "done"] == [
        ("iopolicy", sub.name, "numa -> round-robin")]
    assert kit.read(sub / "iopolicy") == "round-robin"
    lap("apply (iopolicy round-robin)")

    # One subsystem, both controllers in it and live, one head per namespace, two paths
    # each, the ANA states the storage side configured.
    assert states(nqn) == {"rdma": "live", "tcp": "live"}
    ctrls = sorted(e.name for e in sub.iterdir() if re.fullmatch(r"nvme\d+", e.name))
    assert len(ctrls) == 2
    heads = sorted(e.name for e in sub.iterdir() if re.fullmatch(r"nvme\d+n\d+", e.name))
    assert len(heads) == 2, heads
    paths = paths_by_transport(sub)
    assert sorted(paths) == ["rdma", "tcp"] and all(sorted(p) == [1, 2] for p in paths.values())
    ana = {t: {n: kit.read(f"/sys/block/{node}/ana_state") for n, node in p.items()}
           for t, p in paths.items()}
    assert ana == {"rdma": {1: "optimized", 2: "optimized"},
                   "tcp": {1: "non-optimized", 2: "non-optimized"}}, ana
    print(f"[multipath] heads {heads}, paths {paths}, ANA {ana}")

    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    assert_ok(again)
    assert not again.changed and again.configfs_writes == 0
    # Only discovery (one per target: the pool names no subsystem); no iopolicy write.
    assert [c[:2] for c in runner.calls] == [("nvme", "discover")] * 2, runner.calls
    lap("converged apply")

    # fio writes with crc32c through ns1's mount while the RDMA path goes away and comes back.
    rdma_node, tcp_node = paths["rdma"][1], paths["tcp"][1]
    fio_file = mounts[0] / "fio.dat"
    fio = subprocess.Popen(
        ["fio", "--name=failover", f"--filename={fio_file}", "--size=40m", "--bs=256k",
         "--rw=write", "--ioengine=psync", "--direct=1", "--rate=4m", "--verify=crc32c",
         "--do_verify=1", "--verify_fatal=1", "--output-format=json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    link = kit.NVMET / f"ports/{RDMA_PORT}/subsystems" / nqn
    try:
        start = (written(rdma_node), written(tcp_node))
        kit.wait_for(lambda: written(rdma_node) - start[0] >= 4 * MIB // 512, 120,
                     interval=0.1, what="fio writing over RDMA")
        over_tcp_before = written(tcp_node) - start[1]
        link.unlink()
        kit.wait_for(lambda: states(nqn)["rdma"] != "live", 60, interval=0.1,
                     what="the RDMA controller to lose its port")
        at_outage = written(tcp_node)
        kit.wait_for(lambda: written(tcp_node) - at_outage >= 4 * MIB // 512, 120,
                     interval=0.1, what="fio writing over TCP")
        lap("RDMA link removed, writes continue over TCP")
        assert fio.poll() is None, "fio ended during the outage"
        restored = lab.apply()  # the target pass links the port again
        assert_ok(restored)
        kit.wait_for(lambda: states(nqn) == {"rdma": "live", "tcp": "live"}, 60,
                     what="both paths live again")
        lap("apply: RDMA link restored")
        out, err = fio.communicate(timeout=600)
    finally:
        if fio.poll() is None:
            fio.kill()
            fio.wait()
    assert fio.returncode == 0, err
    (job,) = json.loads(out[out.index("{"):])["jobs"]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] == 40 * MIB and job["read"]["io_bytes"] == 40 * MIB
    # ANA at work: while both paths were live, round-robin used the optimized one only.
    assert over_tcp_before < MIB // 512, over_tcp_before
    print(f"[multipath] before the outage {over_tcp_before} sectors over TCP; fio "
          f"{job['write']['io_bytes'] // MIB} MiB written and verified, 0 errors")
    ana_after = {t: {n: kit.read(f"/sys/block/{node}/ana_state") for n, node in p.items()}
                 for t, p in paths_by_transport(sub).items()}
    assert ana_after == ana
    lap("fio finished")

    # The preference turned around on live paths: two configfs writes, the GPU host
    # follows (an ANA change event), nothing reconnects.
    before = {c.name: kit.read(c / "state") for c in kit.controllers_for(nqn)}
    lab.write(config_text(lab, rxe.address, "round-robin", prefer="tcp"))
    swapped = lab.apply()
    assert_ok(swapped)
    assert swapped.configfs_writes == 2, swapped.actions
    want = {"rdma": {1: "non-optimized", 2: "non-optimized"},
            "tcp": {1: "optimized", 2: "optimized"}}
    kit.wait_for(lambda: {t: {n: kit.read(f"/sys/block/{node}/ana_state")
                              for n, node in p.items()}
                          for t, p in paths_by_transport(sub).items()} == want, 30,
                 what="the GPU host to see the swapped ANA states")
    assert {c.name: kit.read(c / "state") for c in kit.controllers_for(nqn)} == before
    lap("ANA preference swapped on live paths")

    snap = collect(load_config(lab.config), default_runner(), drives=False)
    doc = to_status_json(snap)
    shown = {(c["transport"], c["state"], c["iopolicy"]) for c in doc["controllers"]
             if c["pool"] == "kv"}
    assert shown == {("rdma", "live", "round-robin"), ("tcp", "live", "round-robin")}, shown
    assert "round-robin" in render_status_text(snap)

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
