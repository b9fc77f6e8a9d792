"""Spread on the real kernel: four bandwidth-capped drives, one LVM pool of four namespaces.

The drives are null_blk devices with a per-device bandwidth cap (configfs ``mbps``,
memory-backed): under TCG an emulated NVMe drive has no bandwidth of its own worth
measuring (docs/benchmarks.md, "Spread"). Two pools, one apply:

- ``four``: placement spread (the default) on a volume group of four capped drives;
- ``one``: placement linear on a volume group of one capped drive (the baseline: what a
  linear ``lvcreate`` does to a host's namespaces when they fit on one drive).

The apply is first killed after its third command (the group and two LVs made): the
next apply places the other two exactly where an uninterrupted pass would have, so each
namespace ends on its own PV (``lvs -o devices``). ``kvagent pool list -o json`` shows the
same devices. Then the GPU side reads every namespace of each pool at once over NVMe/TCP
(fio, O_DIRECT) and the aggregate read of the spread pool is compared with the one-drive
pool's, in the same run: the ratio is printed (``[spread] ratio``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config import load_config
from agent.naming import subsystem_nqn

from . import kit
from .crash import child_pass, ci_log
from .pools import (
    Lab,
    RecordingRunner,
    assert_ok,
    namespace_device,
    nvme_connect,
    nvme_disconnect,
    remove_volume_group,
)

pytestmark = pytest.mark.kernel(group="cache", weight=0.9)
PREFIX = "nqn.2026-11.io.kvagent"
#: Each drive's read cap: low enough that four of them stay below what NVMe/TCP over
#: loopback moves under TCG, so the drives, not the path, set the pace.
MBPS = 8
SPREAD = tuple(f"kvsp{i}" for i in range(4))
BASELINE = "kvone0"
LVM_CONF = Path("/etc/lvm/lvm.conf")



def capped_nullb(name: str, size_mb: int) -> str:
    """A memory-backed null_blk device reading and writing at most MBPS MiB/s."""
    d = kit.NULLB / name
    d.mkdir()
    for attr, value in (("size", size_mb), ("memory_backed", 1), ("blocksize", 512),
                        ("mbps", MBPS), ("power", 1)):
        kit.write(d / attr, str(value))
    return kit.wait_for(lambda: os.path.exists(f"/dev/{name}") and f"/dev/{name}", 10,
                        what=f"/dev/{name}")


@pytest.fixture
def drives():
    """Four capped drives for the spread group, one for the baseline; LVM told to accept
    null_blk devices (its device-type list does not know them: a test VM's setting)."""
    saved = LVM_CONF.read_text() if LVM_CONF.exists() else None
    LVM_CONF.parent.mkdir(parents=True, exist_ok=True)
    LVM_CONF.write_text((saved or "") + '\ndevices {\n  types = [ "nullb", 16 ]\n}\n')
    made = []
    try:
        for name, size in [*((n, 72) for n in SPREAD), (BASELINE, 160)]:
            made.append(name)
            capped_nullb(name, size)
        yield [f"/dev/{n}" for n in SPREAD], f"/dev/{BASELINE}"
    finally:
        remove_volume_group("kvfour", *(f"/dev/{n}" for n in SPREAD))
        remove_volume_group("kvone", f"/dev/{BASELINE}")
        for name in made:
            kit.remove_nullb(name)
        if saved is None:
            LVM_CONF.unlink(missing_ok=True)
        else:
            LVM_CONF.write_text(saved)


def config_text(lab: Lab, spread: list[str], baseline: str) -> str:
    hosts = f'[{{name: lab, nqn: "{lab.hostnqn}"}}]'
    return f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 41, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: four
      backing: {{kind: lvm, volume_group: kvfour, devices: [{", ".join(spread)}]}}
      namespaces: {{count: 4, size: 32MiB}}
      ports: [p]
      hosts: {hosts}
    - name: one
      backing: {{kind: lvm, volume_group: kvone, devices: [{baseline}], placement: linear}}
      namespaces: {{count: 4, size: 32MiB}}
      ports: [p]
      hosts: {hosts}
"""


def lv_devices(vg: str) -> dict[str, list[str]]:
    """Each LV of ``vg`` and the devices its segments use (``lvs -o devices``)."""
    out = kit.sh("lvs", "--reportformat", "json", "-o", "lv_name,devices", vg, timeout=120)
    found: dict[str, list[str]] = {}
    for row in json.loads(out.stdout)["report"][0]["lv"]:
        for part in row["devices"].split(","):
            dev = part.split("(")[0]
            if dev not in found.setdefault(row["lv_name"], []):
                found[row["lv_name"]].append(dev)
    return found


def aggregate_read(devices: list[str], seconds: int = 5) -> float:
    """Bytes per second fio reads from all ``devices`` at once (one job each, O_DIRECT)."""
    argv = ["fio", "--rw=read", "--bs=1M", "--direct=1", "--ioengine=libaio", "--iodepth=4",
            f"--runtime={seconds}", "--time_based", "--output-format=json"]
    for i, dev in enumerate(devices):
        argv += [f"--name=ns{i + 1}", f"--filename={dev}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"]
    assert len(jobs) == len(devices) and all(j["error"] == 0 for j in jobs), jobs
    return float(sum(j["read"]["bw_bytes"] for j in jobs))


@pytest.fixture
def lab(tmp_path: Path, drives):  # type: ignore[no-untyped-def]
    """Torn down before the drives: nothing may export their volumes when they go."""
    lab = Lab(tmp_path)
    yield lab
    kit.force_clean()


def test_spread_places_each_namespace_on_its_own_drive_and_reads_faster(lab: Lab,
                                                                       drives) -> None:  # type: ignore[no-untyped-def]
    spread, baseline = drives
    lab.write(config_text(lab, spread, baseline))
    cfg = load_config(lab.config)
    lap = kit.Laps()

    # Killed after the volume group (a pvcreate per drive, four; vgcreate) and two LVs of
    # pool four: the rest follows the same rule.
    killed = child_pass(cfg, "kill-after=command#7")
    assert killed.killed
    made = lv_devices("kvfour")
    assert sorted(made) == ["kv_four_lab_1", "kv_four_lab_2"], made
    lap("apply killed after its third command")
    first = lab.apply()
    assert_ok(first)
    lap("apply (recovery)")
    placed = lv_devices("kvfour")
    # ns i on the i-th drive (by name), as an uninterrupted pass places them: one PV each.
    assert placed == {f"kv_four_lab_{i + 1}": [dev] for i, dev in enumerate(spread)}, placed
    print(f"[spread] lvs -o devices kvfour: {placed}")
    one = lv_devices("kvone")
    assert one == {f"kv_one_lab_{i}": [baseline] for i in (1, 2, 3, 4)}, one

    # Converged: nothing to do, not even a question about PVs.
    runner = RecordingRunner()
    again = lab.apply(runner=runner)
    assert_ok(again)
    assert not again.changed and again.configfs_writes == 0
    assert [c[0] for c in runner.calls if c[0] in ("pvs", "lvcreate", "vgcreate")] == []
    lap("converged apply")

    shown = CliRunner().invoke(main, ["-c", str(lab.config), "-o", "json", "pool", "list"])
    assert shown.exit_code == 0, shown.output
    listed = {(p["name"], ns["nsid"]): ns["devices"] for p in json.loads(shown.stdout)["pools"]
              for ns in p["namespaces"]}
    assert listed == {**{("four", i + 1): [dev] for i, dev in enumerate(spread)},
                      **{("one", i): [baseline] for i in (1, 2, 3, 4)}}
    lap("pool list")

    nqns = {pool: subsystem_nqn(PREFIX, "lab", pool, "lab") for pool in ("four", "one")}
    for nqn in nqns.values():
        nvme_connect("tcp", "127.0.0.1", nqn)
    try:
        heads = {pool: [namespace_device(nqn, n) for n in (1, 2, 3, 4)]
                 for pool, nqn in nqns.items()}
        lap("connect")
        one_drive = aggregate_read(heads["one"])
        four_drives = aggregate_read(heads["four"])
        lap("fio: 4 namespaces on one drive, then on four")
    finally:
        nvme_disconnect(*nqns.values())
    ratio = four_drives / one_drive
    line = (f"[spread] aggregate read of 4 namespaces over NVMe/TCP, drives capped at "
            f"{MBPS} MiB/s: one drive {one_drive / 2**20:.1f} MiB/s, spread over four "
            f"{four_drives / 2**20:.1f} MiB/s, ratio {ratio:.2f}")
    print(line)
    ci_log(line)
    assert ratio > 1.5, line

    lab.write_empty(PREFIX)
    assert_ok(lab.apply())
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
