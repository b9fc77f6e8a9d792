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

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fleet import Fleet, lvm_storage_config, root_below

#: Weight: about 13 minutes under TCG beside the tier's other VMs on a 2-core machine
#: (the image built when out of date, two boots, a reboot, a watchdog restart); ranked
#: above every group with the tier's other fleet, so that the fleets (one after the
#: other, in the host's pytest process) start early and are not the tier's tail.
pytestmark = [pytest.mark.vmhost(weight=20)]
MNT = "/var/lib/kvcache/kv"
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"


@pytest.fixture(scope="module")
def fleet(fleet_slot: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("fleet")
    machines = Fleet(where, ["storage1", "gpu1"])
    try:
        took = machines.up()
        print(f"KVAGENT-CI-LOG: fleet: storage1 and gpu1 up in {took:.0f}s")
        yield machines
    finally:
        machines.down()


def storage_config(fleet: Fleet, more: str = "") -> str:
    return lvm_storage_config(fleet, "storage1", "gpu1", "nqn.2026-11.io.kvagent",
                              namespaces=2, more=more)


#: A second pool on storage1's second drive (more of storage_config's pools).
STORAGE_KV2 = """    - name: kv2
      backing:
        kind: lvm
        volume_group: vg_kv2
        devices: [/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_STORAGE11]
      namespaces: {count: 1, size: 1GiB}
      ports: [tcp0]
      hosts: [{name: gpu1, nqn: "%s"}]
"""
#: gpu1's side of it (more of gpu_config's pools).
GPU_KV2 = """    - name: kv2
      target: {transport: tcp, address: %s, service: 4420}
      mount: /var/lib/kvcache/kv2
      engines: [{kind: vllm, capacity: 80%%}]
"""


def gpu_config(fleet: Fleet, more: str = "") -> str:
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
{more}health: {{listen: "127.0.0.1:9808", interval: 5s}}
"""


def attach_kv(fleet: Fleet) -> dict:
    """storage1 exports pool kv, gpu1 attaches it (each test may run alone); gpu1's status."""
    fleet.configure("storage1", storage_config(fleet))
    fleet.wait_pools_ready("storage1")
    fleet.configure("gpu1", gpu_config(fleet))
    return fleet.wait_pools_ready("gpu1")


def test_a_pool_crosses_the_network_under_the_shipped_unit(fleet: Fleet,
                                                           tmp_path: Path) -> None:
    for name in ("storage1", "gpu1"):
        assert fleet.sh(name, "systemctl is-enabled kvagent; systemctl is-active kvagent"
                        ).stdout.split() == ["enabled", "active"]
        main_pid = fleet.sh(name, "systemctl show -P MainPID kvagent").stdout.strip()
        assert main_pid != "0"
    status = attach_kv(fleet)
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

    # /metrics and /readyz under the unit (the health endpoint on 127.0.0.1).
    metrics = fleet.sh("gpu1", "curl -sf http://127.0.0.1:9808/metrics").stdout
    assert re.search(r'^kvagent_pool_ready\{[^}]*pool="kv"[^}]*\} 1\.0$', metrics, re.M), \
        metrics[-2000:]
    assert "kvagent_stray_controllers 0.0" in metrics
    fleet.sh("storage1", "curl -sf http://127.0.0.1:9808/readyz")

    # Nothing the agent logged is a warning or worse (the journal's priorities).
    for name in ("storage1", "gpu1"):
        worse = fleet.sh(name, "journalctl -u kvagent -b -p warning -q --no-pager",
                         check=False).stdout
        assert worse.strip() == "", f"{name}: {worse}"
    # The sandbox as it is, not as it reads: the agent shares PID 1's mount namespace (its
    # mounts are the host's) but has a UTS namespace of its own (ProtectHostname=), under
    # a seccomp filter with no_new_privs. Everything above (devices, LVM, mkfs, mounts,
    # quotas, pyudev's ctypes) ran with ProtectClock= and MemoryDenyWriteExecute= on.
    for name in ("storage1", "gpu1"):
        pid = fleet.sh(name, "systemctl show -P MainPID kvagent").stdout.strip()
        ns = fleet.sh(name, f"readlink /proc/1/ns/mnt /proc/{pid}/ns/mnt /proc/1/ns/uts "
                            f"/proc/{pid}/ns/uts").stdout.split()
        assert ns[0] == ns[1] and ns[2] != ns[3], (name, ns)
        seccomp = fleet.sh(name, f"grep -E '^(Seccomp|NoNewPrivs):' /proc/{pid}/status"
                           ).stdout.split()
        assert seccomp == ["NoNewPrivs:", "1", "Seccomp:", "2"], (name, seccomp)
    score = fleet.sh("gpu1", "systemd-analyze security kvagent.service --no-pager | tail -1"
                     ).stdout.strip()
    print(f"KVAGENT-CI-LOG: fleet: the unit as shipped, systemd 252: {score}")
    assert re.search(r"level for kvagent\.service: [0-4]\.[0-9]|: 5\.[01] ", score), score


def test_the_watchdog_restarts_a_hung_agent_and_nothing_is_torn_down(fleet: Fleet) -> None:
    """A hung agent (SIGSTOP) stops its watchdog pings: systemd kills it after WatchdogSec
    and starts it again (Restart=on-failure); the mounts and controllers stay as they
    were throughout, and the new agent finds the pool ready with nothing to do."""
    attach_kv(fleet)
    assert fleet.sh("gpu1", "systemctl show -P WatchdogUSec kvagent").stdout.strip() == "1min"
    before = fleet.sh("gpu1", "findmnt -rn -t xfs -o TARGET,SOURCE; cat /sys/class/nvme/*/"
                              "subsysnqn").stdout
    pid = fleet.sh("gpu1", "systemctl show -P MainPID kvagent").stdout.strip()
    t0 = time.monotonic()
    fleet.sh("gpu1", f"kill -STOP {pid}")
    wait_until(lambda: fleet.sh("gpu1", "systemctl show -P MainPID kvagent").stdout.strip()
               not in (pid, "0"), fleet, "systemd restarted the hung agent", timeout=300)
    restarted = time.monotonic() - t0
    journal = fleet.sh("gpu1", "journalctl -u kvagent -b -q --no-pager -o cat").stdout
    assert "Watchdog timeout" in journal, journal[-3000:]
    status = fleet.wait_pools_ready("gpu1")
    assert all(p["ready"] for p in status["pools"])
    after = fleet.sh("gpu1", "findmnt -rn -t xfs -o TARGET,SOURCE; cat /sys/class/nvme/*/"
                             "subsysnqn").stdout
    assert after == before, (before, after)
    print(f"KVAGENT-CI-LOG: fleet: a hung agent (SIGSTOP) restarted by systemd's watchdog "
          f"{restarted:.0f}s later (WatchdogSec=1min); mounts and controllers untouched")


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


#: Long: test_fleet_faults.py's GPU machine power loss proves the same gate and seal
#: after a power cut (and in every run of scripts/test).
@pytest.mark.long
def test_an_engine_starts_after_its_pool_across_a_reboot(fleet: Fleet) -> None:
    """The gate kvagent-pool@kv.service: a stand-in engine unit that requires it starts
    only once the pool is mounted, capped and handed off after a reboot, and its first
    write lands on the pool, not on the root filesystem under the mount point."""
    attach_kv(fleet)
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
    # Nothing under the mount point on the root filesystem, and the directory there is
    # sealed: a write into it while unmounted fails.
    found, flags, refused = root_below(fleet, "gpu1", f"{MNT}/storage1-ns1")
    assert found == [], found
    assert "i" in flags.split()[0] and flags.endswith(f"{MNT}/storage1-ns1"), flags
    assert "Operation not permitted" in refused, refused


def controllers(fleet: Fleet, name: str) -> list[tuple[str, str, str]]:
    """(controller, subsystem NQN, state) of every NVMe-oF controller on machine ``name``."""
    out = fleet.sh(name, "for c in /sys/class/nvme/nvme*; do [ -e $c/transport ] && "
                         "[ \"$(cat $c/transport)\" != pcie ] && echo ${c##*/} "
                         "$(cat $c/subsysnqn) $(cat $c/state); done; true").stdout
    return sorted(tuple(line.split()) for line in out.splitlines() if line.strip())


def test_nvme_clis_autoconnect_rule_makes_no_second_controller(fleet: Fleet) -> None:
    """Issue 36, item 5: Debian's nvme-cli ships 70-nvmf-autoconnect.rules, which runs
    ``nvme connect-all`` through the very discovery controller kvagent keeps whenever its
    discovery-log-change AEN arrives. A pool exported while gpu1's agent waits for it:
    both react to the same AEN, and each of kvagent's subsystems still has exactly one
    controller, kvagent's discovery controller stays, and the pool is attached."""
    rule = "/lib/udev/rules.d/70-nvmf-autoconnect.rules"
    fleet.sh("gpu1", f"test -f {rule} && ! test -e /etc/udev/rules.d/70-nvmf-autoconnect"
                     ".rules")
    attach_kv(fleet)
    # gpu1 wants a second pool, kv2, that storage1 does not export yet.
    fleet.configure("gpu1", gpu_config(fleet, GPU_KV2 % fleet.address("storage1")))
    before = controllers(fleet, "gpu1")
    discovery = [c for c in before if c[1] == DISCOVERY_NQN]
    assert len(discovery) == 1 and discovery[0][2] == "live", before
    since = fleet.sh("gpu1", "date +%s").stdout.strip()
    fleet.configure("storage1", storage_config(fleet, STORAGE_KV2 % fleet.hostnqn("gpu1")))
    status = fleet.wait_pools_ready("gpu1")
    assert sorted(p["name"] for p in status["pools"]) == ["kv", "kv2"], status
    ran = fleet.sh("gpu1", f"journalctl -b --since @{since} -q --no-pager -o cat "
                           "-u 'nvmf-connect@*'", check=False).stdout
    assert "nvmf-connect" in ran or "connect-all" in ran, (
        "nvme-cli's rule did not run on the AEN: the test proves nothing", ran)
    after = controllers(fleet, "gpu1")
    per_subsystem: dict[str, int] = {}
    for _name, nqn, _state in after:
        per_subsystem[nqn] = per_subsystem.get(nqn, 0) + 1
    assert set(per_subsystem.values()) == {1}, after
    assert [c for c in after if c[1] == DISCOVERY_NQN] == discovery, (before, after)
    assert all(state == "live" for _n, _q, state in after), after
    made_by = "nvme-cli" if "already connected" in fleet.sh(
        "gpu1", f"journalctl -b --since @{since} -q --no-pager -o cat -u kvagent "
                "| grep kv2", check=False).stdout else "kvagent"
    print(f"KVAGENT-CI-LOG: fleet: nvme-cli's autoconnect rule ran on the AEN beside "
          f"kvagent; one controller per subsystem ({len(after)} in all); kv2's made by "
          f"{made_by}")

    # gpu1 lets kv2 go (storage1 still offers it); the rule connects it again at the
    # discovery controller's next reconnect (its "rediscover" event): a stray, which
    # kvagent's status names with what to do.
    fleet.configure("gpu1", gpu_config(fleet))
    wait_until(lambda: not any(c[1].endswith(":kv2:gpu1") for c in controllers(fleet, "gpu1")),
               fleet, "gpu1 detached kv2")
    fleet.sh("gpu1", f"echo 1 > /sys/class/nvme/{discovery[0][0]}/reset_controller")
    wait_until(lambda: any(c[1].endswith(":kv2:gpu1") for c in controllers(fleet, "gpu1")),
               fleet, "nvme-cli's rule connected kv2 again")
    status = wait_status(fleet, "gpu1", lambda s: s["stray_controllers"])
    (stray,) = status["stray_controllers"]
    assert stray["subsysnqn"].endswith(":kv2:gpu1") and status["exit_code"] == 1, status
    (line,) = [p for p in status["problems"] if stray["name"] in p]
    assert "autoconnect rule is active" in line and "ln -s /dev/null" in line, line
    # What the line says to do: mask the rule, disconnect the stray; then the discovery
    # controller's reconnects leave kv2 alone.
    fleet.sh("gpu1", "ln -s /dev/null /etc/udev/rules.d/70-nvmf-autoconnect.rules && "
                     f"udevadm control --reload && nvme disconnect -d {stray['name']}")
    try:
        wait_status(fleet, "gpu1", lambda s: s["exit_code"] == 0 and not s["stray_controllers"])
        fleet.sh("gpu1", f"echo 1 > /sys/class/nvme/{discovery[0][0]}/reset_controller")
        wait_until(lambda: controllers(fleet, "gpu1") == [
            c for c in after if not c[1].endswith(":kv2:gpu1")], fleet,
            "the discovery controller live again, kv2 not connected")
        time.sleep(5)  # (a connect-all would have run by now: udev runs at once)
        assert not any(c[1].endswith(":kv2:gpu1") for c in controllers(fleet, "gpu1"))
        assert fleet.status("gpu1")["exit_code"] == 0
    finally:
        fleet.sh("gpu1", "rm -f /etc/udev/rules.d/70-nvmf-autoconnect.rules && "
                         "udevadm control --reload")
        fleet.configure("storage1", storage_config(fleet))


def wait_until(check, fleet: Fleet, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(1)


def wait_status(fleet: Fleet, name: str, check, timeout: float = 300) -> dict:
    """Until ``check`` holds for the machine's ``kvagent -o json status``; that status."""
    deadline = time.monotonic() + timeout
    while True:
        done = fleet.sh(name, "kvagent -o json status", check=False)
        if done.stdout.strip():
            status = json.loads(done.stdout)
            if check(status):
                return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: status not as wanted after {timeout}s: "
                                 f"{done.stdout}{done.stderr}")
        time.sleep(2)
