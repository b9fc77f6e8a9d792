"""Proof that the real-kernel tier drives real nvmet, nvme-tcp and nvme-rdma.

Raw configfs writes and nvme-cli here (no kvagent code): this checks the VM
and the kernel, so that later tests can trust the tier.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from . import kit

pytestmark = pytest.mark.kernel

NQN = "nqn.2026-11.io.kvagent.test:harness"


def export_and_roundtrip(transport: str, address: str, device: str) -> None:
    c = kit.NVMET
    hostnqn = kit.local_hostnqn()
    ns_uuid = str(uuid.uuid4())
    sub = c / "subsystems" / NQN
    port = c / "ports" / "7"
    host = c / "hosts" / hostnqn
    assert kit.nvmet_is_empty(), kit.nvmet_tree()
    try:
        sub.mkdir()
        (sub / "namespaces/1").mkdir()
        kit.write(sub / "namespaces/1/device_path", device)
        kit.write(sub / "namespaces/1/device_uuid", ns_uuid)
        kit.write(sub / "namespaces/1/enable", "1")
        host.mkdir()
        os.symlink(host, sub / "allowed_hosts" / hostnqn)
        port.mkdir()
        kit.write(port / "addr_trtype", transport)
        kit.write(port / "addr_adrfam", "ipv4")
        kit.write(port / "addr_traddr", address)
        kit.write(port / "addr_trsvcid", "4420")
        os.symlink(sub, port / "subsystems" / NQN)

        kit.sh("nvme", "connect", "-t", transport, "-a", address, "-s", "4420", "-n", NQN)
        dev = kit.wait_for(lambda: kit.block_by_uuid(ns_uuid), 30, what=f"uuid {ns_uuid}")
        assert kit.controllers_for(NQN), "no controller in /sys/class/nvme for the subsystem"
        ctrl = kit.controllers_for(NQN)[0]
        assert kit.read(ctrl / "transport") == transport
        assert kit.read(ctrl / "state") == "live"
        digest = kit.odirect_roundtrip(dev, 4 << 20, offset=1 << 20)
        # The same bytes are on the backing device, at the same offset.
        assert kit.digest_of_range(device, 1 << 20, 4 << 20) == digest
    finally:
        kit.sh("nvme", "disconnect", "-n", NQN, check=False)
        kit.wait_for(lambda: not kit.controllers_for(NQN), 30, what="controllers to go away")
        for link in (port / "subsystems" / NQN, sub / "allowed_hosts" / hostnqn):
            if link.is_symlink():
                link.unlink()
        for d in (port, sub / "namespaces/1", sub, host):
            if d.exists():
                if d.name == "1" and (d / "enable").exists():
                    kit.write(d / "enable", "0")
                d.rmdir()
    assert kit.nvmet_is_empty(), kit.nvmet_tree()


def test_nvme_tcp_loopback_roundtrip(nullb) -> None:
    export_and_roundtrip("tcp", "127.0.0.1", nullb(256))


def test_nvme_rdma_soft_roce_roundtrip(nullb, rxe) -> None:
    export_and_roundtrip("rdma", rxe.address, nullb(256))


def test_emulated_drives_are_present() -> None:
    ids = sorted(p.name for p in Path("/dev/disk/by-id").glob("nvme-QEMU_NVMe_Ctrl_KVTEST?"))
    assert ids == ["nvme-QEMU_NVMe_Ctrl_KVTEST0", "nvme-QEMU_NVMe_Ctrl_KVTEST1"]
