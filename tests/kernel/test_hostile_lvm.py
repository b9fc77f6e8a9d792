"""LVM on the real kernel: nothing on disk makes kvagent take over what it did not write.

Issue 24, item 12: an apply killed between ``pvcreate`` and ``vgcreate`` (kvagent's
failpoint kills it right before ``vgcreate``) left devices labelled in no group, refused
for good. Now the intent record kvagent wrote first lets the next apply finish the group
and export it — while a device a person labelled by hand (no record) is still refused,
its bytes unchanged.

Item 10: kvagent's LV renamed and a foreign LV made under the old name, then nvmet emptied
(a reboot): the namespace is exported from the renamed LV with its identity, the foreign
LV never; a foreign LV with the name of a namespace to create fails the pool by name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.config import load_config
from agent.naming import subsystem_nqn
from agent.result import RunResult
from agent.target.backings.lvm_intent import intent_path, read_intent

from . import kit
from .crash import child_pass
from .pools import (
    DRIVES,
    MIB,
    Lab,
    assert_ok,
    drive_digest,
    remove_volume_group,
)
from .test_ownership import clear_nvmet

pytestmark = pytest.mark.kernel

PREFIX = "nqn.2026-11.io.kvagent"


def nqn(pool: str) -> str:
    return subsystem_nqn(PREFIX, "lab", pool, "lab")


def write(lab: Lab, *pools: tuple[str, str, str, int]) -> None:
    """A config of LVM pools ``(name, volume group, device or "", namespace count)``."""
    hosts = f'[{{name: lab, nqn: "{lab.hostnqn}"}}]'
    specs = ", ".join(
        f"{{name: {name}, ports: [p], hosts: {hosts}, namespaces: {{count: {count}, "
        f"size: 8MiB}}, backing: {{kind: lvm, volume_group: {vg}, "
        f"devices: [{dev}]}}}}" for name, vg, dev, count in pools)
    lab.write(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools: [{specs}]
""")


def namespaces(subsystem: str) -> dict[int, tuple[str, str]]:
    """nsid -> (device_path, device_uuid) as nvmet shows them now."""
    base = kit.NVMET / "subsystems" / subsystem / "namespaces"
    if not base.exists():
        return {}
    return {int(d.name): (kit.read(d / "device_path"), kit.read(d / "device_uuid"))
            for d in base.iterdir()}


def exported_paths() -> set[str]:
    return {kit.read(ns / "device_path")
            for ns in (kit.NVMET / "subsystems").glob("*/namespaces/*")}


def pvs() -> dict[str, tuple[str, str]]:
    """Every PV label LVM sees: real node -> (PV uuid, group)."""
    out = kit.sh("pvs", "--reportformat", "json", "-o", "pv_name,pv_uuid,vg_name",
                 timeout=120).stdout
    return {os.path.realpath(r["pv_name"]): (r["pv_uuid"], r["vg_name"])
            for rep in json.loads(out)["report"] for r in rep["pv"]}


def lv_tags(vg: str, lv: str) -> str:
    return kit.sh("lvs", "--noheadings", "-o", "lv_tags", f"{vg}/{lv}",
                  timeout=120).stdout.strip()


def fill(path: str) -> str:
    """Write 1 MiB of random bytes at the start of ``path``; their digest."""
    data = os.urandom(MIB)
    with open(path, "r+b") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return kit.digest(data)


def errors_of(result: RunResult, pool: str) -> list[str]:
    return [f"{e.message} {e.hint or ''}" for e in result.errors if e.pool == pool]


@pytest.fixture
def lab(tmp_path: Path):
    for d in DRIVES:
        kit.sh("blkdiscard", "-z", "-o", "0", "-l", str(4 * MIB), d, timeout=300)
    lab = Lab(tmp_path)
    yield lab
    clear_nvmet()  # first: nvmet holds the LVs open
    for vg in ("kvhostile", "kvrename"):
        remove_volume_group(vg)
    for d in DRIVES:
        kit.sh("pvremove", "-ff", "-y", d, check=False, timeout=120)
        kit.sh("blkdiscard", "-z", "-o", "0", "-l", str(4 * MIB), d, timeout=300)
    kit.force_clean()


def test_a_killed_vgcreate_is_finished_and_a_hand_made_label_still_refused(lab: Lab) -> None:
    # DRIVES[1]: an LVM label someone wrote by hand (no intent record of kvagent's).
    kit.sh("pvcreate", "-y", DRIVES[1], timeout=120)
    hand_made = drive_digest(DRIVES[1])
    write(lab, ("hv", "kvhostile", DRIVES[0], 1), ("hx", "kvother", DRIVES[1], 1))
    killed = child_pass(load_config(lab.config), "command.vgcreate=kill")
    assert killed.killed, killed
    # What the kill left: kvagent's labels in no group, and its intent record.
    intent = read_intent(lab.state, "kvhostile")
    assert intent is not None and intent.paths == (DRIVES[0],)
    node = os.path.realpath(DRIVES[0])
    assert pvs()[node] == (intent.pvs[0].pv_uuid, ""), pvs()
    assert "kvhostile" not in kit.sh("vgs", "--noheadings", "-o", "vg_name",
                                     timeout=120).stdout.split()

    result = lab.apply()
    assert errors_of(result, "hv") == [], result.errors
    assert pvs()[node] == (intent.pvs[0].pv_uuid, "kvhostile"), "the label kvagent wrote"
    assert "kvagent" in kit.sh("vgs", "--noheadings", "-o", "vg_tags", "kvhostile",
                               timeout=120).stdout
    assert not intent_path(lab.state, "kvhostile").exists()
    assert namespaces(nqn("hv"))[1][0] == "/dev/kvhostile/kv_hv_lab_1"
    assert kit.read(kit.NVMET / "subsystems" / nqn("hv") / "namespaces/1/enable") == "1"
    # The hand-made label: refused as before, with the way out; bytes unchanged, no group.
    (refused,) = errors_of(result, "hx")
    assert f"refusing to create volume group on {DRIVES[1]}" in refused, refused
    assert "LVM2_member signature" in refused and "never wipes data" in refused
    assert drive_digest(DRIVES[1]) == hand_made
    assert pvs()[os.path.realpath(DRIVES[1])][1] == ""
    assert nqn("hx") not in {p.name for p in (kit.NVMET / "subsystems").iterdir()}

    # Converged: nothing left to finish.
    again = lab.apply()
    assert errors_of(again, "hv") == [] and not [
        a for a in again.actions if a.status == "done" and a.pool == "hv"]


def test_a_renamed_lv_keeps_its_namespace_and_a_foreign_one_gets_none(lab: Lab) -> None:
    write(lab, ("hr", "kvrename", DRIVES[0], 1))
    assert_ok(lab.apply())
    ((path, uuid),) = namespaces(nqn("hr")).values()
    assert path == "/dev/kvrename/kv_hr_lab_1"
    ours = fill(path)

    # A reboot's empty nvmet; meanwhile kvagent's LV renamed and a foreign one in its name.
    clear_nvmet()
    kit.sh("lvrename", "kvrename", "kv_hr_lab_1", "moved", timeout=120)
    kit.sh("lvcreate", "-y", "-Wy", "-Zy", "-n", "kv_hr_lab_1", "-L", "8m", "kvrename",
           timeout=120)
    foreign = fill("/dev/kvrename/kv_hr_lab_1")
    assert_ok(lab.apply())
    assert namespaces(nqn("hr")) == {1: ("/dev/kvrename/moved", uuid)}
    assert "/dev/kvrename/kv_hr_lab_1" not in exported_paths()
    assert kit.digest_of("/dev/kvrename/moved", MIB) == ours
    assert kit.digest_of("/dev/kvrename/kv_hr_lab_1", MIB) == foreign
    assert lv_tags("kvrename", "kv_hr_lab_1") == ""

    # A foreign LV named like the namespace to create: the pool fails by name, as it was.
    kit.sh("lvcreate", "-y", "-Wy", "-Zy", "-n", "kv_hr_lab_2", "-L", "8m", "kvrename",
           timeout=120)
    second = fill("/dev/kvrename/kv_hr_lab_2")
    write(lab, ("hr", "kvrename", DRIVES[0], 2))
    result = lab.apply()
    (error,) = errors_of(result, "hr")
    assert "volume group kvrename already has an LV named kv_hr_lab_2" in error, error
    assert "lvrename kvrename kv_hr_lab_2" in error
    assert namespaces(nqn("hr")) == {1: ("/dev/kvrename/moved", uuid)}
    assert "/dev/kvrename/kv_hr_lab_2" not in exported_paths()
    assert kit.digest_of("/dev/kvrename/kv_hr_lab_2", MIB) == second
    assert lv_tags("kvrename", "kv_hr_lab_2") == ""
