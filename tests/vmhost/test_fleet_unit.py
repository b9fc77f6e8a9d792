"""The unit as shipped, on separate machines: a storage machine and a GPU machine, each
Debian 12 booted with systemd, kvagent installed from its .deb and started by its unit
(``systemctl``, nothing else), joined by a private network (scripts/fleet).

The storage machine exports a pool from an LVM volume group on an emulated NVMe drive
over NVMe/TCP on the private network; the GPU machine attaches it (through
/dev/nvme-fabrics, under the unit's sandbox), makes xfs, mounts it and hands it off
with project-quota caps, which must be hard: one engine's writes end in ENOSPC at its
cap while another engine still writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .fleet import Fleet

#: Weight: its minutes under TCG (image build, two boots); long until the fleet's
#: groups fit scripts/test's time (issue 36).
pytestmark = [pytest.mark.vmhost(weight=12), pytest.mark.long]
MNT = "/var/lib/kvcache/kv"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("fleet")
    machines = Fleet(where, ["storage1", "gpu1"])
    try:
        took = machines.up()
        print(f"KVAGENT-CI-LOG: fleet: storage1 and gpu1 up in {took:.0f}s")
        yield machines
    finally:
        machines.down()


def storage_config(fleet: Fleet) -> str:
    return f"""version: 1
node: {{name: storage1, nqn_prefix: nqn.2026-11.io.kvagent}}
target:
  ports:
    - {{name: tcp0, id: 1, transport: tcp, address: {fleet.address("storage1")}, service: 4420}}
  pools:
    - name: kv
      backing:
        kind: lvm
        volume_group: vg_kv
        devices: [/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_STORAGE10]
      namespaces: {{count: 2, size: 1GiB}}
      ports: [tcp0]
      hosts: [{{name: gpu1, nqn: "{fleet.hostnqn("gpu1")}"}}]
health: {{listen: "127.0.0.1:9808", interval: 5s}}
"""


def gpu_config(fleet: Fleet) -> str:
    return f"""version: 1
node: {{name: gpu1, nqn_prefix: nqn.2026-11.io.kvagent}}
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: {fleet.address("storage1")}, service: 4420}}
      mount: {MNT}
      engines:
        - {{kind: lmcache, capacity: 40%}}
        - {{kind: sglang, capacity: 40%}}
health: {{listen: "127.0.0.1:9808", interval: 5s}}
"""


@pytest.mark.usefixtures("vm_slot")
def test_a_pool_crosses_the_network_under_the_shipped_unit(fleet: Fleet,
                                                           tmp_path: Path) -> None:
    for name in ("storage1", "gpu1"):
        assert fleet.sh(name, "systemctl is-enabled kvagent; systemctl is-active kvagent"
                        ).stdout.split() == ["enabled", "active"]
        main_pid = fleet.sh(name, "systemctl show -P MainPID kvagent").stdout.strip()
        assert main_pid != "0"
    fleet.configure("storage1", storage_config(fleet))
    fleet.wait_pools_ready("storage1")
    fleet.configure("gpu1", gpu_config(fleet))
    status = fleet.wait_pools_ready("gpu1")
    (pool,) = status["pools"]
    assert pool["role"] == "initiator" and pool["ready"]
    controllers = fleet.sh("gpu1", "cat /sys/class/nvme/nvme*/address 2>/dev/null").stdout
    assert f"traddr={fleet.address('storage1')}" in controllers, controllers
    mounts = fleet.sh("gpu1", f"findmnt -rn -t xfs -o TARGET | grep ^{MNT}/").stdout.split()
    assert mounts == [f"{MNT}/storage1-ns1", f"{MNT}/storage1-ns2"], mounts

    # The caps are hard under the unit's system-call filter: lmcache's writes end in
    # ENOSPC at its cap, sglang's beside it still land.
    ns1 = f"{MNT}/storage1-ns1"
    fill = fleet.sh("gpu1", f"dd if=/dev/zero of={ns1}/lmcache/fill bs=1M count=4000 "
                            "oflag=direct", check=False)
    assert fill.returncode != 0 and "No space left on device" in fill.stderr, fill.stderr
    cap = int(fleet.sh("gpu1", f"stat -c %s {ns1}/lmcache/fill").stdout)
    quota = fleet.sh("gpu1", f"xfs_quota -x -c 'report -p -b -N' {ns1}").stdout
    limits = {int(line.split()[3]) * 1024 for line in quota.splitlines()
              if line.startswith("#") and line.split()[3] != "0"}
    # (the file's own metadata blocks count against the same limit)
    assert any(limit - (2 << 20) <= cap <= limit for limit in limits), (cap, quota)
    fleet.sh("gpu1", f"dd if=/dev/zero of={ns1}/sglang/beside bs=1M count=8 oflag=direct")

    # Nothing the agent logged is a warning or worse (the journal's priorities).
    for name in ("storage1", "gpu1"):
        worse = fleet.sh(name, "journalctl -u kvagent -b -p warning -q --no-pager",
                         check=False).stdout
        assert worse.strip() == "", f"{name}: {worse}"


#: A stand-in engine: writes into its cache directory as soon as it starts.
ENGINE_UNIT = """[Unit]
Description=a stand-in engine that writes into its cache directory
Requires=kvagent-pool@kv.service
After=kvagent-pool@kv.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/dd if=/dev/zero of={path} bs=1M count=4 oflag=direct

[Install]
WantedBy=multi-user.target
"""


def monotonic_us(fleet: Fleet, name: str, unit: str, prop: str) -> int:
    return int(fleet.sh(name, f"systemctl show -P {prop} {unit}").stdout.strip() or 0)


@pytest.mark.usefixtures("vm_slot")
def test_an_engine_starts_after_its_pool_across_a_reboot(fleet: Fleet) -> None:
    """The gate kvagent-pool@kv.service: a stand-in engine unit that requires it starts
    only once the pool is mounted, capped and handed off after a reboot, and its first
    write lands on the pool, not on the root filesystem under the mount point."""
    fleet.wait_pools_ready("gpu1")
    target = f"{MNT}/storage1-ns1/sglang/engine.bin"
    fleet.sh("gpu1", "cat > /etc/systemd/system/engine.service && systemctl daemon-reload "
                     "&& systemctl enable engine.service",
             stdin=ENGINE_UNIT.format(path=target))
    boot = fleet.sh("gpu1", "cat /proc/sys/kernel/random/boot_id").stdout
    took = fleet.reboot("gpu1")
    assert fleet.sh("gpu1", "cat /proc/sys/kernel/random/boot_id").stdout != boot
    assert fleet.sh("gpu1", "systemctl is-active engine.service kvagent-pool@kv.service"
                    ).stdout.split() == ["active", "active"]
    gate_ready = monotonic_us(fleet, "gpu1", "kvagent-pool@kv.service",
                              "ActiveEnterTimestampMonotonic")
    engine_started = monotonic_us(fleet, "gpu1", "engine.service",
                                  "ExecMainStartTimestampMonotonic")
    agent_started = monotonic_us(fleet, "gpu1", "kvagent.service",
                                 "ExecMainStartTimestampMonotonic")
    assert 0 < agent_started < gate_ready <= engine_started, (
        agent_started, gate_ready, engine_started)
    print(f"KVAGENT-CI-LOG: fleet: gpu1 rebooted in {took:.0f}s; the pool's gate active "
          f"{(gate_ready - agent_started) / 1e6:.1f}s after the agent started, the engine "
          f"{(engine_started - gate_ready) / 1e6:.2f}s after the gate")
    where = fleet.sh("gpu1", f"findmnt -n -o SOURCE,FSTYPE -T {target}").stdout.split()
    assert where[1] == "xfs" and where[0].startswith("/dev/nvme"), where
    # Nothing under the mount point on the root filesystem (seen through a bind mount).
    below = fleet.sh("gpu1", f"mkdir -p /mnt/root && mount --bind / /mnt/root && "
                             f"find /mnt/root{MNT} -mindepth 2; umount /mnt/root").stdout
    assert below.strip() == "", below
