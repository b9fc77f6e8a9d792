"""Nothing lost, on the real kernel: kvagent refuses devices that carry data or are in use.

Each signature kind (ext4, xfs, LVM PV, partition table, mounted) on a whole-device pool's
emulated NVMe drive (by-id path) and on an LVM pool's ``backing.devices`` (null_blk);
the error names the device, what was found and how to proceed; checksums prove the
bytes are unchanged, and nothing was created.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.records import TargetRecords

from . import kit
from .pools import DRIVES, Lab, device_digest, drive_digest

pytestmark = pytest.mark.kernel

#: LVM does not know null_blk's device type; the test's own pvcreate must be told.
NULLB_LVM = ["--config", 'devices { types = [ "nullb", 16 ] }']


def put(kind: str, dev: str, mnt: Path) -> str:
    """Write a ``kind`` signature on ``dev`` (mounting it read-only for ``mounted``);
    returns what the refusal must name."""
    if kind in ("ext4", "mounted"):
        kit.sh("mkfs.ext4", "-F", "-q", "-E", "nodiscard", "-L", "precious", dev, timeout=120)
    elif kind == "xfs":
        kit.sh("mkfs.xfs", "-f", "-q", "-K", dev, timeout=120)
    elif kind == "lvm":
        kit.sh("pvcreate", "-y", *NULLB_LVM, dev, timeout=120)
    elif kind in ("dos", "gpt"):
        # null_blk disks have no partition minors: the kernel cannot re-read their table.
        reread = [] if dev.startswith("/dev/disk/by-id/") else ["--no-reread"]
        kit.sh("sfdisk", "-q", *reread, dev, input=f"label: {kind}\n,16MiB\n", timeout=60)
        kit.sh("udevadm", "settle", check=False)
    if kind == "mounted":
        mnt.mkdir(parents=True, exist_ok=True)
        kit.sh("mount", "-o", "ro", dev, str(mnt))
        return f"mounted on {mnt}"
    return {"ext4": "ext4 signature", "xfs": "xfs signature", "lvm": "LVM2_member signature",
            "dos": "dos signature", "gpt": "gpt signature"}[kind]


def clear(dev: str, mnt: Path) -> None:
    """Undo what :func:`put` wrote (the test's own data; VM only)."""
    kit.sh("umount", str(mnt), check=False)
    kit.sh("pvremove", "-ff", "-y", *NULLB_LVM, dev, check=False, timeout=120)
    kit.sh("wipefs", "-a", dev, check=False)
    kit.sh("udevadm", "settle", check=False)


def config(lab: Lab, devices: dict[str, str], lvm: dict[str, str]) -> str:
    host = f'[{{name: lab, nqn: "{lab.hostnqn}"}}]'
    text = f"""
version: 1
node: {{name: lab, state_dir: {lab.state}, run_dir: {lab.root}/run}}
target:
  ports: [{{name: lo, id: 41, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:"""
    for name, path in devices.items():
        text += f"""
    - name: {name}
      backing: {{kind: device, devices: [{{path: {path}, host: lab}}]}}
      ports: [lo]
      hosts: {host}"""
    for name, path in lvm.items():
        text += f"""
    - name: {name}
      backing: {{kind: lvm, volume_group: kvref_{name}, devices: [{path}]}}
      namespaces: {{count: 1, size: 8MiB}}
      ports: [lo]
      hosts: {host}"""
    return text + "\n"


@pytest.fixture
def lab(tmp_path: Path, nullb):
    """The lab; torn down (mounts first) before the null_blk devices go."""
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        for i, drive in enumerate(DRIVES):
            clear(drive, tmp_path / f"mnt-d{i}")
        for mnt in tmp_path.glob("mnt-*"):
            kit.sh("umount", str(mnt), check=False)
        kit.force_clean()


def check_refused(lab: Lab, where: dict[str, tuple[str, tuple[str, ...], str]]) -> None:
    """Apply; every pool in ``where`` ({pool: (device, findings, digest)}) is refused with
    a message naming the device, the findings and the way out, and its bytes are unchanged."""
    result = lab.apply()
    messages = {e.pool: e.message + " " + (e.hint or "") for e in result.errors}
    assert set(messages) == set(where), result.errors
    for pool, (dev, findings, digest) in where.items():
        msg = messages[pool]
        assert f"pool {pool}: refusing to " in msg and dev in msg, msg
        assert all(f in msg for f in findings), (findings, msg)
        assert "never wipes data" in msg and "wipefs -a" in msg, msg
        small = not dev.startswith("/dev/disk/by-id/")
        now = device_digest(dev) if small else drive_digest(dev)
        assert now == digest, f"{dev} changed although kvagent refused it"
    # Nothing was carved, claimed or exported (the configured port itself may exist).
    assert not [a for a in result.actions if a.status == "done"
                and not a.subject.startswith("ports/")], result.actions
    vgs = kit.sh("vgs", "--noheadings", "-o", "vg_name", *NULLB_LVM).stdout.split()
    assert not [v for v in vgs if v.startswith("kvref_")], vgs
    assert not list((kit.NVMET / "subsystems").iterdir())
    assert not list((kit.NVMET / "hosts").iterdir())
    assert not TargetRecords.load(lab.state).claims


def test_foreign_data_is_refused_and_untouched(lab: Lab, nullb) -> None:
    root = lab.root
    # Round 1: every kind on null_blk devices for LVM pools; ext4 and xfs on the drives.
    lvm = {}
    where: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for kind in ("ext4", "xfs", "lvm", "dos", "mounted"):
        dev = nullb(300 if kind == "xfs" else 32)  # mkfs.xfs needs >= 300 MB
        finding = put(kind, dev, root / f"mnt-{kind}")
        lvm[f"l{kind}"] = dev
        where[f"l{kind}"] = (dev, (finding,), device_digest(dev))
    devices = {}
    for i, kind in enumerate(("ext4", "xfs")):
        finding = put(kind, DRIVES[i], root / f"mnt-d{i}")
        devices[f"d{kind}"] = DRIVES[i]
        where[f"d{kind}"] = (DRIVES[i], (finding,), drive_digest(DRIVES[i]))
    lab.write(config(lab, devices, lvm))
    check_refused(lab, where)
    kit.sh("umount", str(root / "mnt-mounted"))
    for dev in lvm.values():
        clear(dev, root / "unused")

    # Round 2: an LVM label and a partition table (with its partition) on the drives.
    for i in (0, 1):
        clear(DRIVES[i], root / f"mnt-d{i}")
    where = {"dlvm": (DRIVES[0], (put("lvm", DRIVES[0], root),), drive_digest(DRIVES[0]))}
    gpt = put("gpt", DRIVES[1], root)
    part = f"partitions: {Path(DRIVES[1]).resolve().name}p1"
    where["dgpt"] = (DRIVES[1], (gpt, part), drive_digest(DRIVES[1]))
    lab.write(config(lab, {p: w[0] for p, w in where.items()}, {}))
    check_refused(lab, where)

    # Round 3: a mounted filesystem on a drive.
    clear(DRIVES[0], root / "mnt-d0")
    finding = put("mounted", DRIVES[0], root / "mnt-d0")
    where = {"dmounted": (DRIVES[0], (finding,), drive_digest(DRIVES[0]))}
    lab.write(config(lab, {"dmounted": DRIVES[0]}, {}))
    check_refused(lab, where)
    assert kit.sh("findmnt", "-n", "-o", "SOURCE", str(root / "mnt-d0")).stdout.strip(), \
        "the refused device is still mounted"
