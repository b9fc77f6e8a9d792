"""The guest side of the power-cut test (tests/kernel/test_powercut.py): one phase a boot.

Every boot of the test VM sees the same drive images: KVTEST0 carries the LVM pool,
KVTEST2 an ext4 filesystem with kvagent's state directory, its file pool and the
test's notes. Phases 1-3 arm a power cut (sysrq ``b``: an immediate reboot without
sync) at a point of an apply and never return; the phase after each recovers with a
plain apply — no manual step — and checks that the next apply changes nothing and
that data written to the pool's filesystems earlier reads back unchanged.

    python tests/kernel/powercut_guest.py PHASE
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE_DRIVE = "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVTEST2"
LVM_DRIVE = "/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_KVTEST0"
ROOT = Path("/var/lib/kvstate")  # (not below /tmp: a root kvagent refuses a config there)
CONFIG = ROOT / "kvagent.yaml"
NOTES = ROOT / "notes.json"
PREFIX = "nqn.2026-11.io.kvagent"


def log(line: str) -> None:
    print(f"KVAGENT-CI-LOG: power cut: {line}", flush=True)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def hostnqn() -> str:
    return Path("/etc/nvme/hostnqn").read_text().strip()


def write_config(with_file_pool: bool, lv_size: str = "320MiB") -> None:
    hosts = f'[{{name: lab, nqn: "{hostnqn()}"}}]'
    target = "{transport: tcp, address: 127.0.0.1, service: 4420}"
    file_pool = f"""
    - {{name: fl, ports: [p], hosts: {hosts}, namespaces: {{count: 2, size: 160MiB}},
       backing: {{kind: file, directory: {ROOT}/files}}}}""" if with_file_pool else ""
    file_attach = f"""
    - {{name: fl, target: {target}, mount: /tmp/kvmnt/fl, layout: striped,
       engines: [{{kind: vllm, cpu_cache: 1GiB}}]}}""" if with_file_pool else ""
    CONFIG.write_text(f"""
version: 1
node: {{name: lab, nqn_prefix: {PREFIX}, state_dir: {ROOT}/state, run_dir: /run/kvagent}}
target:
  ports: [{{name: p, id: 1, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - {{name: lv, ports: [p], hosts: {hosts}, namespaces: {{count: 1, size: {lv_size}}},
       backing: {{kind: lvm, volume_group: kvcut, devices: [{LVM_DRIVE}]}}}}{file_pool}
initiator:
  device_wait: 60s
  pools:
    - {{name: lv, target: {target}, mount: /tmp/kvmnt/lv, engines: [{{kind: lmcache}}]}}
    {file_attach}
""")


def apply(failpoints: str = "") -> dict:
    """One apply in this process (an interpreter start costs ~20 s under TCG), with the
    failpoints ``failpoints`` armed: an armed apply never returns (the power goes)."""
    from agent import failpoints as seam
    from agent.config import load_config
    from agent.reconcile import run_pass

    if failpoints:
        log(f"armed: {failpoints}")
        os.sync()
    seam.configure(failpoints or None)
    result = run_pass(load_config(CONFIG), dry_run=False).to_json()
    if failpoints:
        sys.exit(f"the armed apply returned instead of cutting the power: {result}")
    if not result["ok"]:
        sys.exit(f"apply after the power cut failed: {json.dumps(result['errors'], indent=1)}")
    return result


def recover() -> None:
    """A plain apply converges, and the one after it changes nothing."""
    first = apply()
    done = [f"{a['kind']} {a['subject']}" for a in first["actions"] if a["status"] == "done"]
    log(f"recovered with {len(done)} change(s): {', '.join(done[:12])}"
        + (" ..." if len(done) > 12 else ""))
    second = apply()
    changed = [a for a in second["actions"] if a["status"] == "done"]
    if changed or second["configfs_writes"]:
        sys.exit(f"not converged after recovery: {changed}")


def mount_state(fresh: bool = False) -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    if fresh:
        sh("mkfs.ext4", "-q", "-F", STATE_DRIVE)
    sh("mount", STATE_DRIVE, str(ROOT))


def keep(pool_mount: str) -> None:
    """Write data on a pool's filesystem and note its digest on the state drive."""
    data = os.urandom(4 << 20)
    path = Path(pool_mount) / "kept.bin"
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    notes = json.loads(NOTES.read_text()) if NOTES.exists() else {}
    notes[str(path)] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    NOTES.write_text(json.dumps(notes))
    os.sync()


def verify() -> None:
    notes = json.loads(NOTES.read_text()) if NOTES.exists() else {}
    for path, digest in notes.items():
        if hashlib.md5(Path(path).read_bytes(), usedforsecurity=False).hexdigest() != digest:
            sys.exit(f"{path} changed across a power cut")
    log(f"data verified: {', '.join(sorted(notes)) or 'none yet'}")


def main(phase: str) -> None:
    # Loopback NVMe/TCP with transparent huge pages 'always' trips a 6.1 kernel bug that
    # leaves I/O hanging (docs/operations.md, troubleshooting): what the lab does too.
    Path("/sys/kernel/mm/transparent_hugepage/enabled").write_text("madvise")
    if phase == "1":
        mount_state(fresh=True)
        write_config(with_file_pool=False)
        apply("command.lvcreate=cut-later(0.2)")  # the power goes during lvcreate
    mount_state()
    if phase == "2":
        log("after the cut during lvcreate: " + sh("lvs", "--noheadings", "-o",
                                                   "lv_name,vg_name", check=False).stdout.strip())
        recover()
        keep("/tmp/kvmnt/lv/lab-ns1")
        write_config(with_file_pool=True)
        apply("command.mkfs.xfs=cut-later(0.5)")  # the power goes while mkfs runs
    elif phase == "3":
        recover()
        verify()
        keep("/tmp/kvmnt/fl")
        write_config(with_file_pool=True, lv_size="352MiB")
        apply("cut-after=record#1")  # the power goes right after a record is written
    elif phase == "4":
        recover()
        verify()
    log(f"phase {phase} done")


if __name__ == "__main__":
    main(sys.argv[1])
