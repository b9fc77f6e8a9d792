"""Faults across machines under I/O: the agent restarted, killed, upgraded and downgraded
on a storage machine and on a GPU machine while the GPU machine writes and verifies.

kvagent is control plane only: the kernel's nvmet and nvme-tcp carry the I/O, so the
agent's own restart must change nothing a consumer sees. The machines are scripts/fleet's
(Debian 12, 6.1, kvagent from its .deb under its unit). storage1 exports an LVM pool over
NVMe/TCP on the private network, gpu1 attaches and mounts it, and fio writes into the
engine's directory there with crc32c verification of what it wrote, throughout. Then, on
each machine in turn: ``systemctl restart kvagent``, SIGKILL (systemd restarts it), an
``apt install`` of a newer .deb (built here with a bumped version) and a downgrade back.

What must hold, for every one of them:

- fio: no I/O error, no verify error, and data written throughout;
- gpu1's controllers never leave ``live`` (a watcher on gpu1 samples them every 0.5 s)
  and gpu1's kernel logs no error recovery, reconnect or timeout;
- storage1's nvmet configfs tree and gpu1's pool mounts (mount ids) and controllers are
  byte-identical before and after;
- the first pass of each new agent process changes nothing (its /metrics: one pass run,
  0 actions changed);
- ``/metrics`` answers on both machines throughout, except while that machine's own
  agent restarts (the watcher's failed scrapes all fall inside those windows);
- neither agent logs a warning or worse.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fleet import REPO, Fleet, build_newer_deb, lvm_storage_config

#: Weight: its minutes under TCG (two boots, eight agent restarts with two package
#: installs each way, fio throughout), ranked among the tier's fleets. Long for now
#: (KVAGENT_LONG=1): its 15-29 slot-minutes would take the whole run further past its
#: time goal, until the tier's work is cut.
pytestmark = [pytest.mark.vmhost(weight=15), pytest.mark.long]
STORAGE, GPU = "storage1", "gpu1"
MNT = "/var/lib/kvcache/kv"
METRICS = "http://127.0.0.1:9808/metrics"
#: The watcher each machine runs (a transient unit): every 0.5 s it scrapes /metrics and
#: reads the NVMe controllers' states, and logs each failed scrape and each change of a
#: controller's state, with the machine's clock.
WATCHER = r"""
import glob, sys, time, urllib.request
out = open(sys.argv[1], "a", buffering=1)
states = {}
while True:
    now = time.time()
    try:
        urllib.request.urlopen(sys.argv[2], timeout=2).read()
    except Exception as exc:
        out.write(f"{now:.2f} metrics-failed {type(exc).__name__}\n")
    for path in glob.glob("/sys/class/nvme/nvme*/state"):
        try:
            state = open(path).read().strip()
        except OSError:
            state = "gone"
        name = path.split("/")[-2]
        if states.get(name) != state:
            out.write(f"{now:.2f} ctrl {name} {state}\n")
            states[name] = state
    time.sleep(0.5)
"""
#: What gpu1's kernel says when a controller is in trouble.
TROUBLE = re.compile(r"error recovery|Reconnecting|resetting controller|timeout|"
                     r"failed to|keep-alive|I/O Cmd|Buffer I/O error|xfs.*(error|shut)",
                     re.IGNORECASE)


def storage_config(fleet: Fleet) -> str:
    return lvm_storage_config(fleet, STORAGE, GPU, "nqn.2026-12.io.kvagent.faults",
                              namespaces=1)


def gpu_config(fleet: Fleet) -> str:
    return f"""version: 1
node: {{name: {GPU}, nqn_prefix: nqn.2026-12.io.kvagent.faults}}
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: {fleet.address(STORAGE)}, service: 4420}}
      mount: {MNT}
      engines: [{{kind: lmcache, capacity: 80%}}]
health: {{listen: "127.0.0.1:9808", interval: 5s}}
"""


@pytest.fixture(scope="module")
def fleet(fleet_slot: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("fleet-faults")
    # (power cuts: the disks honour flushes, or a cut could lose what was fsync'd)
    machines = Fleet(where, [STORAGE, GPU], power_safe=True)
    try:
        took = machines.up()
        print(f"KVAGENT-CI-LOG: faults: {STORAGE} and {GPU} up in {took:.0f}s")
        machines.configure(STORAGE, storage_config(machines))
        machines.wait_pools_ready(STORAGE)
        machines.configure(GPU, gpu_config(machines))
        machines.wait_pools_ready(GPU)
        yield machines
    finally:
        machines.down()


def clock(fleet: Fleet, name: str) -> float:
    return float(fleet.sh(name, "date +%s.%N").stdout)


def nvmet_tree(fleet: Fleet) -> str:
    """storage1's nvmet configfs tree: every directory, link target and readable value."""
    return fleet.sh(STORAGE, r"""cd /sys/kernel/config/nvmet && find . | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"
  elif [ -f "$p" ]; then echo "$p = $(cat "$p" 2>&1 | tr '\n' ' ')"
  else echo "$p/"; fi
done""").stdout


def gpu_view(fleet: Fleet) -> str:
    """gpu1's pool mounts (mountinfo lines: mount ids, devices) and NVMe controllers."""
    return fleet.sh(GPU, f"""grep ' {MNT}' /proc/self/mountinfo
for c in /sys/class/nvme/nvme*; do
  echo "${{c##*/}} $(cat $c/transport) $(cat $c/subsysnqn) $(cat $c/address | tr -d ' ') \
$(cat $c/state)"
done""").stdout


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def agent_pid(fleet: Fleet, name: str) -> str:
    return fleet.sh(name, "systemctl show -P MainPID kvagent").stdout.strip()


def wait_new_agent(fleet: Fleet, name: str, old_pid: str, timeout: float = 600) -> tuple[
        str, str]:
    """Until a new agent process (not ``old_pid``) has run its first pass and is ready;
    (its pid, its first /metrics after that pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = agent_pid(fleet, name)
        if pid not in ("0", old_pid):
            done = fleet.sh(name, f"curl -sf {METRICS}", check=False)
            runs = metric(done.stdout, "kvagent_apply_runs_total") if done.returncode == 0 \
                else None
            if runs:
                fleet.sh(name, "curl -sf http://127.0.0.1:9808/readyz")
                return pid, done.stdout
        time.sleep(0.5)
    raise AssertionError(f"{name}: no new agent ready after {timeout}s")


def start_watcher(fleet: Fleet, name: str, unit: str, log: str) -> None:
    """:data:`WATCHER` on machine ``name`` as the transient unit ``unit``, logging to ``log``."""
    fleet.sh(name, "cat > /root/watch.py", stdin=WATCHER)
    fleet.sh(name, f"systemd-run -q --unit={unit} python3 /root/watch.py {log} {METRICS}")


def test_restart_kill_upgrade_and_downgrade_under_io_change_nothing(fleet: Fleet,
                                                                    tmp_path: Path) -> None:
    newer = build_newer_deb(tmp_path)
    older = REPO / "build/deb" / f"kvagent_{newer.old_version}_all.deb"
    assert older.exists(), older
    for name in (STORAGE, GPU):
        fleet.put(name, newer.deb, "/root/newer.deb")
        fleet.put(name, older, "/root/older.deb")
        start_watcher(fleet, name, "kv-watch", "/root/watch.log")
    since = {name: clock(fleet, name) for name in (STORAGE, GPU)}
    mount = fleet.sh(GPU, f"findmnt -rn -t xfs -o TARGET | grep ^{MNT}/").stdout.split()[0]
    fleet.sh(GPU, f"systemd-run -q --remain-after-exit --unit=kv-fio fio --name=verify "
                  f"--filename={mount}/lmcache/fio.dat --size=96m --bs=64k --rw=randwrite "
                  "--ioengine=psync --direct=1 --verify=crc32c --verify_backlog=32 "
                  "--verify_fatal=1 --time_based --runtime=7200 --rate=1m "
                  "--output-format=json --output=/root/fio.json")
    time.sleep(10)
    before = {STORAGE: nvmet_tree(fleet), GPU: gpu_view(fleet)}

    windows: dict[str, list[tuple[float, float]]] = {STORAGE: [], GPU: []}
    actions = {
        "restart": "systemctl restart kvagent",
        "SIGKILL": "systemctl kill -s KILL kvagent",
        "upgrade": "apt-get install -y -q /root/newer.deb",
        "downgrade": "apt-get install -y -q --allow-downgrades /root/older.deb",
    }
    for name in (STORAGE, GPU):
        for what, line in actions.items():
            old = agent_pid(fleet, name)
            start = clock(fleet, name)
            fleet.sh(name, f"DEBIAN_FRONTEND=noninteractive {line}")
            pid, first = wait_new_agent(fleet, name, old)
            end = clock(fleet, name)
            windows[name].append((start, end))
            runs = metric(first, "kvagent_apply_runs_total")
            changed = metric(first, "kvagent_last_apply_changed_actions")
            assert runs == 1 and changed == 0, (
                f"{name} {what}: the new agent's first pass changed {changed} action(s) "
                f"({runs} pass(es) seen)")
            after = nvmet_tree(fleet) if name == STORAGE else gpu_view(fleet)
            assert after == before[name], f"{name} {what}: changed:\n{before[name]}\n{after}"
            version = fleet.sh(name, "dpkg-query -W -f '${Version}' kvagent").stdout
            print(f"KVAGENT-CI-LOG: faults: {name} {what} (kvagent {version}, pid {old} -> "
                  f"{pid}): ready again in {end - start:.1f}s, first pass 0 changes, "
                  "nothing else changed")
        assert fleet.sh(GPU, "systemctl is-active kv-fio").stdout.strip() == "active"

    # fio stops (SIGINT: it writes its report) and reports no error, no verify error.
    other_state = {STORAGE: nvmet_tree(fleet), GPU: gpu_view(fleet)}
    assert other_state == before
    fleet.sh(GPU, "systemctl kill -s INT kv-fio; for i in $(seq 120); do "
                  "[ \"$(systemctl show -P SubState kv-fio)\" = exited ] && break; sleep 1; "
                  "done; systemctl show -P ExecMainStatus kv-fio")
    report = fleet.sh(GPU, "cat /root/fio.json").stdout
    job = json.loads(report[report.index("{"):])["jobs"][0]
    assert job["error"] == 0, job
    written = job["write"]["io_bytes"]
    assert written > 0, job["write"]
    worst = job["write"]["clat_ns"]["max"] / 1e9
    print(f"KVAGENT-CI-LOG: faults: fio wrote {written / 2**20:.0f} MiB and verified it "
          f"through all eight restarts, 0 errors; its slowest write took {worst:.2f}s")

    for name in (STORAGE, GPU):
        log = fleet.sh(name, "cat /root/watch.log").stdout.splitlines()
        failed = [float(line.split()[0]) for line in log if " metrics-failed " in line]
        outside = [t for t in failed if not any(a - 1 <= t <= b + 1 for a, b in windows[name])]
        assert not outside, f"{name}: /metrics failed outside a restart: {outside}\n{log}"
        states = [line for line in log if " ctrl " in line]
        if name == GPU:
            assert all(line.endswith(" live") for line in states), states
        trouble = [line for line in fleet.sh(
            name, f"journalctl -k -q --no-pager -o cat --since=@{since[name]:.0f}").stdout
            .splitlines() if TROUBLE.search(line)]
        assert not trouble, f"{name}: the kernel had trouble: {trouble}"
        # (the agent's own lines: systemd's about the SIGKILL it was sent are expected)
        worse = fleet.sh(name, "journalctl _SYSTEMD_UNIT=kvagent.service -b -p warning -q "
                               "--no-pager", check=False).stdout
        assert worse.strip() == "", f"{name}: {worse}"
        print(f"KVAGENT-CI-LOG: faults: {name}: /metrics failed {len(failed)} scrape(s), all "
              "inside its agent's own restarts; controllers live throughout")


#: An engine's writes on gpu1, as a transient unit: every 0.2 s one 4 KiB block (its
#: sequence number, repeated) written at its own offset and fsync'd; logged with the
#: machine's clock: ``ok SEQ`` for the first success after errors and every 25th,
#: ``err ERRNO after SEQ`` for the first error after successes (SEQ: the last block
#: fsync'd). On an error it closes the file and opens it again next time, as an engine
#: that gives a dead file up (an open file would keep a shut-down xfs from being mounted
#: again).
WRITER = r"""
import os, sys, time
path, out = sys.argv[1], open(sys.argv[2], "a", buffering=1)
fd, seq, failing, durable = None, 0, None, 0
while True:
    now = time.time()
    try:
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(fd, (b"%08d" % seq) * 512, seq * 4096)
        os.fsync(fd)
        durable = seq
        if failing is not False or seq % 25 == 0:
            out.write(f"{now:.2f} ok {seq}\n")
        failing = False
        seq += 1
    except OSError as exc:
        if not failing:
            out.write(f"{now:.2f} err {exc.errno} after {durable}\n")
        failing = True
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
            fd = None
    time.sleep(0.2)
"""


def start_writer(fleet: Fleet, name: str) -> tuple[str, str]:
    """:data:`WRITER` on gpu1 as unit kv-writer-NAME into the pool's lmcache directory;
    (its file, its log)."""
    mount = fleet.sh(GPU, f"findmnt -rn -t xfs -o TARGET | grep ^{MNT}/").stdout.split()[0]
    target, log = f"{mount}/lmcache/writer-{name}.dat", f"/root/writer-{name}.log"
    fleet.sh(GPU, "cat > /root/writer.py", stdin=WRITER)
    fleet.sh(GPU, f"systemd-run -q --unit=kv-writer-{name} python3 /root/writer.py {target} "
                  f"{log}")
    time.sleep(5)
    return target, log


def writer_log(fleet: Fleet, log: str) -> list[tuple[float, str, int]]:
    """The writer's log: (time, ``ok``, sequence number) or (time, ``err``, the last
    sequence number fsync'd before the error)."""
    return [(float(f[0]), f[1], int(f[-1])) for f in
            (line.split() for line in fleet.sh(GPU, f"cat {log}").stdout.splitlines())]


def wait_writes_again(fleet: Fleet, log: str, since: float,
                      timeout: float = 900) -> tuple[float, float, int]:
    """Until the writer writes again after its first error since ``since`` (gpu1's
    clock): (that error's time, the first write after it, the last block fsync'd before
    it)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = writer_log(fleet, log)
        errors = [(t, n) for t, w, n in rows if w == "err" and t >= since]
        resumed = [t for t, w, _ in rows if w == "ok" and errors and t > errors[0][0]]
        if resumed:
            return errors[0][0], resumed[0], errors[0][1]
        if time.monotonic() > deadline:
            raise AssertionError(f"the writer did not fail and write again: {rows}")
        time.sleep(2)


VERIFY = r"""
import sys
data = open(sys.argv[1], "rb").read()
for seq in range(int(sys.argv[2]) + 1):
    assert data[seq * 4096:(seq + 1) * 4096] == (b"%08d" % seq) * 512, f"block {seq}"
print(f"blocks 0-{sys.argv[2]} intact")
"""


def check_durable(fleet: Fleet, target: str, durable: int) -> None:
    """Every block up to ``durable`` (fsync'd) reads back as the writer wrote it."""
    fleet.sh(GPU, "cat > /root/verify.py", stdin=VERIFY)
    fleet.sh(GPU, f"python3 /root/verify.py {target} {durable}")


def cut(fleet: Fleet, seconds: float) -> tuple[float, float]:
    """Drop every frame between storage1 and gpu1, both ways, for ``seconds``; (cut, heal)
    on gpu1's clock."""
    before = clock(fleet, GPU)
    fleet.fleet_command("cut", STORAGE, GPU)
    cut_at = before + (clock(fleet, GPU) - before) / 2  # (no SSH to gpu1 is cut)
    time.sleep(seconds)
    healed_before = clock(fleet, GPU)
    fleet.fleet_command("heal", STORAGE, GPU)
    return cut_at, healed_before


def test_a_partition_shorter_than_fast_io_fail_rides_through_a_longer_one_fails_fast(
        fleet: Fleet) -> None:
    """gpu1 and storage1 cut apart (every frame dropped both ways; the switch, not a port
    removed): 2 s costs the writer nothing; 30 s fails its I/O fast (fast_io_fail_tmo,
    5 s, after the kernel notices), and when the network returns the controller
    reconnects and the agent mounts the pool again by itself (xfs log recovered): every
    block fsync'd before the outage reads back intact."""
    fleet.wait_pools_ready(GPU)
    start_watcher(fleet, GPU, "kv-watch-partition", "/root/watch-partition.log")
    target, log = start_writer(fleet, "partition")

    cut(fleet, 2)
    time.sleep(15)
    short = writer_log(fleet, log)
    assert not [row for row in short if row[1] == "err"], f"a 2 s partition surfaced: {short}"

    cut_at, healed_at = cut(fleet, 30)
    error_at, resumed_at, durable = wait_writes_again(fleet, log, cut_at)
    assert error_at < healed_at, f"I/O failed only after the network was back: {log}"
    status = fleet.wait_pools_ready(GPU, timeout=300)
    states = [line.split() for line in fleet.sh(GPU, "cat /root/watch-partition.log").stdout
              .splitlines() if " ctrl " in line]
    left_live = min((float(t) for t, _, _, state in states if state != "live"),
                    default=None)
    assert left_live is not None, f"no controller left live: {states}"
    (pool,) = status["pools"]
    print(f"KVAGENT-CI-LOG: faults: partition of 2s: 0 I/O errors; of 30s: a controller "
          f"left live {left_live - cut_at:.1f}s after the cut, the first I/O error after "
          f"{error_at - cut_at:.1f}s, writes back {resumed_at - healed_at:.1f}s after the "
          f"heal (xfs mounted again: {pool['initiator']['recoveries']['count']}x so far)")
    fleet.sh(GPU, "systemctl stop kv-writer-partition")
    check_durable(fleet, target, durable)


def boot_timeline(fleet: Fleet, name: str) -> str:
    """Seconds from the kernel's start to the network being up and to kvagent's READY."""
    def at(unit: str) -> float:
        return int(fleet.sh(name, f"systemctl show -P ActiveEnterTimestampMonotonic {unit}"
                            ).stdout.strip() or 0) / 1e6
    return (f"boot -> network-online {at('network-online.target'):.1f}s -> kvagent ready "
            f"{at('kvagent.service'):.1f}s")


def test_the_storage_machine_rebooted_or_powered_off_fails_io_fast_and_comes_back(
        fleet: Fleet) -> None:
    """storage1 rebooted cleanly, then its power cut (QEMU killed) and turned on again:
    gpu1's writes fail fast while it is away, storage1 exports again by itself at boot
    (from its records, the same nvmet tree), gpu1 reconnects and mounts again by itself,
    and every block fsync'd before each outage reads back intact."""
    fleet.wait_pools_ready(GPU)
    tree = nvmet_tree(fleet)
    target, log = start_writer(fleet, "storage")
    for how in ("reboot", "power loss"):
        start = clock(fleet, GPU)
        if how == "reboot":
            fleet.reboot(STORAGE)
        else:
            fleet.fleet_command("poweroff", STORAGE)
            time.sleep(5)
            fleet.fleet_command("poweron", STORAGE)
        back = clock(fleet, GPU)
        error_at, resumed_at, durable = wait_writes_again(fleet, log, start)
        assert error_at < back, f"{how}: I/O failed only once storage1 was back"
        fleet.wait_pools_ready(STORAGE)
        assert nvmet_tree(fleet) == tree, f"{how}: storage1 exports other objects"
        plan = json.loads(fleet.sh(STORAGE, "kvagent -o json plan").stdout)
        assert plan["actions"] == [], (how, plan)
        print(f"KVAGENT-CI-LOG: faults: storage1 {how}: gpu1's first I/O error "
              f"{error_at - start:.1f}s after it began, storage1 back (SSH) after "
              f"{back - start:.1f}s ({boot_timeline(fleet, STORAGE)}), gpu1 writes again "
              f"{resumed_at - start:.1f}s after it began")
        check_durable(fleet, target, durable)
    fleet.wait_pools_ready(GPU)
    fleet.sh(GPU, "systemctl stop kv-writer-storage")


ENGINE_UNIT = """[Unit]
Description=a stand-in engine that reads its cache back when it starts
Requires=kvagent-pool@kv.service
After=kvagent-pool@kv.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/python3 /root/verify.py {target} {durable}

[Install]
WantedBy=multi-user.target
"""


def test_the_gpu_machine_powered_off_has_its_pool_back_before_its_engine(
        fleet: Fleet) -> None:
    """gpu1's power cut while it writes, then turned on: at boot the pool is attached
    and mounted again (the same xfs, its log recovered) before the stand-in engine unit
    (behind kvagent-pool@kv.service) starts, and that engine reads back every block
    fsync'd before the cut."""
    fleet.wait_pools_ready(GPU)
    target, log = start_writer(fleet, "gpu")
    time.sleep(10)
    fs = fleet.sh(GPU, f"findmnt -n -o UUID -T {target}").stdout.strip()
    durable = max(n for _, w, n in writer_log(fleet, log) if w == "ok")
    fleet.sh(GPU, "cat > /root/verify.py", stdin=VERIFY)
    fleet.sh(GPU, "cat > /etc/systemd/system/engine.service && systemctl daemon-reload && "
                  "systemctl enable -q engine.service && sync",
             stdin=ENGINE_UNIT.format(target=target, durable=durable))
    started = time.monotonic()
    fleet.fleet_command("poweroff", GPU)
    time.sleep(3)
    fleet.fleet_command("poweron", GPU)
    took = time.monotonic() - started
    assert fleet.sh(GPU, "systemctl is-active engine.service").stdout.strip() == "active"
    assert "intact" in fleet.sh(GPU, "journalctl -u engine -b -q -o cat").stdout
    gate = int(fleet.sh(GPU, "systemctl show -P ActiveEnterTimestampMonotonic "
                             "kvagent-pool@kv.service").stdout)
    engine = int(fleet.sh(GPU, "systemctl show -P ExecMainStartTimestampMonotonic "
                               "engine.service").stdout)
    assert 0 < gate <= engine, (gate, engine)
    assert fleet.sh(GPU, f"findmnt -n -o UUID -T {target}").stdout.strip() == fs
    print(f"KVAGENT-CI-LOG: faults: gpu1 power loss: back in {took:.0f}s "
          f"({boot_timeline(fleet, GPU)}); the engine started "
          f"{(engine - gate) / 1e6:.2f}s after its pool's gate and read back blocks "
          f"0-{durable} intact")
    fleet.sh(GPU, "systemctl disable -q engine.service")
