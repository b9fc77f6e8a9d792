"""The Ansible role as operators run it (issue 36, item 2): from this machine over SSH,
against four of scripts/fleet's machines (Debian 12 booted with systemd, kvagent from
its .deb and run by its unit, a private network of their own).

Two storage machines each export a pool ``kv`` (LVM on their first drive) over NVMe/TCP
on the private network to both GPU machines, which the role names by their host NQNs;
each GPU machine attaches ``kv`` from both storage machines, mounts its namespaces and
hands them off to two engines with capped shares. ``ansible/site.yml`` runs twice: the
second run changes nothing on any host. Then ``ansible/upgrade.yml`` rolls a newer
.deb (built here from a copy of the package's sources with a bumped version) out one
host at a time, each host's ``/readyz`` answering 200 before the next host's package is
touched (the controller's own clock, from a callback plugin, orders the events), the
pools staying attached and mounted throughout; a further run changes nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .fleet import Fleet, build_newer_deb

#: Weight: its minutes under TCG (four boots, four role runs over SSH).
#: Long: scripts/test runs it with KVAGENT_LONG=1.
pytestmark = [pytest.mark.vmhost(weight=45), pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
KEY = REPO / "build/fleet/ssh/id_ed25519"
STORAGE = ("storage1", "storage2")
GPUS = ("gpu1", "gpu2")
#: In the playbooks' host order (kv_storage:kv_gpu): the order of a serial rollout.
HOSTS = STORAGE + GPUS
MNT = "/var/lib/kvcache/kv"
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
#: Each storage machine's first drive is 4 GiB (1023 extents of 4 MiB once LVM's
#: label is on it): two namespaces for each of two GPU machines, 250 extents each.
NS_SIZE = "1000MiB"
INSTALL_TASK = "Install the kvagent package"
READY_TASK = "Wait until kvagent answers /readyz with 200"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+"
                   r"failed=(\d+)\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)")

#: A callback plugin: every task's start and result per host, on the controller's clock.
CALLBACK = '''
import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kvagent_times"
    CALLBACK_NEEDS_ENABLED = True

    def _log(self, event, host, task, result=None):
        line = {"t": time.time(), "event": event, "host": host.get_name(),
                "task": task.get_name()}
        if result is not None:
            line["changed"] = bool(result.get("changed"))
            if isinstance(result.get("status"), int):
                line["status"] = result["status"]
        with open(os.environ["KVAGENT_TIMES"], "a") as f:
            f.write(json.dumps(line) + "\\n")

    def v2_runner_on_start(self, host, task):
        self._log("start", host, task)

    def v2_runner_on_ok(self, result):
        self._log("ok", result._host, result._task, result._result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._log("failed", result._host, result._task, result._result)

    def v2_runner_on_skipped(self, result):
        self._log("skipped", result._host, result._task, result._result)
'''


# ----------------------------------------------------------------------- the fleet

@pytest.fixture(scope="module")
def fleet(fleet_slot: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    where = tmp_path_factory.mktemp("fleet")
    machines = Fleet(where, list(HOSTS))
    try:
        took = machines.up()
        print(f"KVAGENT-CI-LOG: fleet ansible: {', '.join(HOSTS)} up in {took:.0f}s")
        yield machines
    finally:
        machines.down()


def inventory(fleet: Fleet, deb: Path) -> dict:
    """The machines reached over SSH (their forwarded ports), the role's variables."""
    def storage(name: str) -> dict:
        return {
            "ansible_port": fleet.machines[name]["ssh_port"],
            "kvagent_target_ports": [{"name": "tcp0", "id": 1, "transport": "tcp",
                                      "address": fleet.address(name), "service": 4420}],
            "kvagent_target_pools": [{
                "name": "kv",
                "backing": {"kind": "lvm", "volume_group": "vg_kv",
                            "devices": [f"/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_{name.upper()}0"]},
                "namespaces": {"count": 2, "size": NS_SIZE},
                "ports": ["tcp0"],
                "hosts": list(GPUS),  # inventory names: the role puts in their host NQNs
            }],
        }

    return {"all": {
        "vars": {
            "ansible_host": "127.0.0.1",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(KEY),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                                       "-o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_pipelining": True,
            "kvagent_install_method": "deb",
            "kvagent_deb": str(deb),
            # No network on the machines: the image has the packages already.
            "kvagent_system_packages": [],
            "kvagent_health_interval": "5s",
        },
        "children": {
            "kv_storage": {"hosts": {name: storage(name) for name in STORAGE}},
            "kv_gpu": {
                "hosts": {name: {"ansible_port": fleet.machines[name]["ssh_port"]}
                          for name in GPUS},
                "vars": {
                    # Pool kv from both storage machines, derived by the role.
                    "kvagent_initiator_transports": ["tcp"],
                    "kvagent_initiator_pool_settings": {"kv": {"engines": [
                        {"kind": "lmcache", "capacity": "40%"},
                        {"kind": "sglang", "capacity": "40%"}]}},
                },
            },
        },
    }}


class Ansible:
    """ansible-playbook from this checkout's venv against the fleet, confined to ``where``."""

    def __init__(self, fleet: Fleet, where: Path):
        self.fleet = fleet
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        plugins = where / "callback_plugins"
        plugins.mkdir(exist_ok=True)
        (plugins / "kvagent_times.py").write_text(CALLBACK)
        # (ssh's control sockets: a short directory, a socket's path has ~100 bytes)
        self.control = Path(tempfile.mkdtemp(prefix="kvcp-"))
        self.runs = 0

    def close(self) -> None:
        shutil.rmtree(self.control, ignore_errors=True)

    def play(self, label: str, playbook: str, deb: Path,
             ) -> tuple[dict[str, dict[str, int]], list[dict]]:
        """Run ``playbook``; the PLAY RECAP per host and the callback's events."""
        self.runs += 1
        inv = self.where / f"inventory-{self.runs}.yml"
        inv.write_text(yaml.safe_dump(inventory(self.fleet, deb), sort_keys=False))
        times = self.where / f"times-{self.runs}.jsonl"
        times.unlink(missing_ok=True)
        env = {**os.environ,
               "ANSIBLE_HOME": str(self.where / "home"),
               "ANSIBLE_LOCAL_TEMP": str(self.where / "local"),
               "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_HOST_KEY_CHECKING": "False",
               "ANSIBLE_PIPELINING": "True",
               "ANSIBLE_FORKS": "4",
               "ANSIBLE_TIMEOUT": "60",
               "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control),
               "ANSIBLE_CALLBACK_PLUGINS": str(self.where / "callback_plugins"),
               "ANSIBLE_CALLBACKS_ENABLED": "kvagent_times",
               "KVAGENT_TIMES": str(times)}
        env.pop("ANSIBLE_CONFIG", None)
        started = time.monotonic()
        proc = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inv),
                               str(REPO / "ansible" / playbook)],
                              cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=5400, check=False)
        took = time.monotonic() - started
        log = self.fleet.where / f"ansible-{self.runs}-{label.replace(' ', '-')}.log"
        log.write_text(proc.stdout + proc.stderr)
        recap_text = proc.stdout[proc.stdout.rfind("PLAY RECAP"):]
        recap: dict[str, dict[str, int]] = {}
        for line in recap_text.splitlines():
            m = RECAP.match(line.strip())
            if m:
                recap[m.group(1)] = dict(zip(
                    ("ok", "changed", "unreachable", "failed", "skipped", "rescued",
                     "ignored"), map(int, m.groups()[1:]), strict=True))
                print(f"KVAGENT-CI-LOG: fleet ansible: {label}: {' '.join(line.split())}")
        print(f"KVAGENT-CI-LOG: fleet ansible: {label}: {playbook} took {took:.0f}s")
        assert sorted(recap) == sorted(HOSTS), (
            f"{label}: no PLAY RECAP for every host (log: {log})\n"
            + proc.stdout[-6000:] + proc.stderr[-2000:])
        events = [json.loads(line) for line in times.read_text().splitlines()] \
            if times.exists() else []
        return recap, events


@pytest.fixture(scope="module")
def ansible(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ansible]:
    runner = Ansible(fleet, tmp_path_factory.mktemp("ansible"))
    try:
        yield runner
    finally:
        runner.close()


def shipped_deb() -> Path:
    """The package scripts/build-deb made in this checkout (the machines' image has it)."""
    debs = sorted((REPO / "build/deb").glob("kvagent_*_all.deb"))
    assert len(debs) == 1, debs
    return debs[0]


# -------------------------------------------------------------------- what to check

def status_ready(fleet: Fleet, name: str) -> dict:
    """``kvagent -o json status`` once every pool of the machine's agent is ready."""
    status = fleet.wait_pools_ready(name, timeout=300)
    assert all(p["ready"] for p in status["pools"]), status
    return status


def nvmet_exports(fleet: Fleet, name: str) -> dict:
    """Per subsystem of a storage machine: its allowed host NQNs, enabled namespaces and
    the (trtype, traddr, trsvcid) of each port it is linked to."""
    out = fleet.sh(name, r"""cd /sys/kernel/config/nvmet
for s in subsystems/*; do
  n=${s##*/}
  for h in $s/allowed_hosts/*; do [ -e "$h" ] && echo "host $n ${h##*/}"; done
  for ns in $s/namespaces/*; do [ "$(cat $ns/enable)" = 1 ] && echo "ns $n ${ns##*/}"; done
done
for p in ports/*; do
  for s in $p/subsystems/*; do
    [ -e "$s" ] && echo "port ${s##*/}" $(cat $p/addr_trtype $p/addr_traddr $p/addr_trsvcid)
  done
done; true""").stdout
    found: dict[str, dict] = {}
    for line in out.splitlines():
        kind, nqn, *rest = line.split()
        sub = found.setdefault(nqn, {"hosts": [], "namespaces": [], "ports": []})
        sub[{"host": "hosts", "ns": "namespaces", "port": "ports"}[kind]].append(
            rest[0] if len(rest) == 1 else tuple(rest))
    return found


def gpu_state(fleet: Fleet, name: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(mounts under the pool's mount root: mount id, target, device number, source; the
    pools' NVMe/TCP controllers: name, subsystem NQN, address, state) of a GPU machine."""
    out = fleet.sh(name, f"""awk '$5 ~ "^{MNT}/" {{
  for (i = 7; i < NF; i++) if ($i == "-") src = $(i + 2); print "mount", $1, $5, $3, src
}}' /proc/self/mountinfo
for c in /sys/class/nvme/nvme*; do
  [ "$(cat $c/transport)" = tcp ] && [ "$(cat $c/subsysnqn)" != {DISCOVERY_NQN} ] && \
    echo "ctrl ${{c##*/}} $(cat $c/subsysnqn) $(cat $c/address | tr -d ' ') $(cat $c/state)"
done; true""").stdout
    mounts = sorted(tuple(line.split()[1:]) for line in out.splitlines()
                    if line.startswith("mount "))
    ctrls = sorted(tuple(line.split()[1:]) for line in out.splitlines()
                   if line.startswith("ctrl "))
    return mounts, ctrls


def engine_caps(fleet: Fleet, name: str) -> dict[str, list[int]]:
    """Per mount of the pool: the non-zero project-quota hard limits (KiB) on it."""
    out = fleet.sh(name, f"""for m in $(findmnt -rn -t xfs -o TARGET | grep '^{MNT}/'); do
  echo "== $m"; ls $m; xfs_quota -x -c 'report -p -b -N' $m
done""").stdout
    caps: dict[str, list[int]] = {}
    mount = ""
    for line in out.splitlines():
        if line.startswith("== "):
            mount = line[3:]
            caps[mount] = []
        elif line.startswith("#") and line.split()[3] != "0":
            caps[mount].append(int(line.split()[3]))
    return caps


def kvagent_unit(fleet: Fleet, name: str) -> dict[str, str]:
    out = fleet.sh(name, "systemctl show -p MainPID -p ExecMainStartTimestampMonotonic "
                         "-p ActiveEnterTimestamp -p ActiveState kvagent").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def installed_version(fleet: Fleet, name: str) -> str:
    return fleet.sh(name, "dpkg-query -W -f '${Version}' kvagent").stdout.strip()


def task(event: dict) -> str:
    """The task's name without its role's (``kvagent : ...``)."""
    return event["task"].rpartition(" : ")[2]


def check_one_host_at_a_time(events: list[dict]) -> None:
    """In inventory order, a host's package is installed only after the host before it
    answered /readyz with 200 (the callback's events, on the controller's clock)."""
    installs = [e for e in events if task(e).startswith(INSTALL_TASK)]
    started = {e["host"]: e["t"] for e in installs if e["event"] == "start"}
    assert [e["host"] for e in installs if e["event"] == "ok" and e["changed"]] == list(HOSTS), \
        installs
    ready = {e["host"]: e for e in events if task(e) == READY_TASK and e["event"] == "ok"}
    assert sorted(ready) == sorted(HOSTS), events
    assert all(ready[h].get("status") == 200 for h in HOSTS), ready
    for before, after in itertools.pairwise(HOSTS):
        assert started[before] < ready[before]["t"] < started[after], (
            f"{after}'s package went in before {before} was ready", started, ready)
    gaps = [started[after] - ready[before]["t"] for before, after in itertools.pairwise(HOSTS)]
    print(f"KVAGENT-CI-LOG: fleet ansible: rolling upgrade in order {', '.join(HOSTS)}; each "
          f"host's package {min(gaps):.1f}-{max(gaps):.1f}s after the previous host was ready")


# -------------------------------------------------------------------------- tests

def test_the_role_rolls_out_pools_across_four_machines_twice(fleet: Fleet,
                                                            ansible: Ansible) -> None:
    deb = shipped_deb()
    first, _ = ansible.play("first run", "site.yml", deb)
    for host, counts in first.items():
        assert counts["changed"] > 0 and counts["failed"] == 0, (host, counts)
        assert counts["unreachable"] == 0, (host, counts)
    second, _ = ansible.play("second run", "site.yml", deb)
    for host, counts in second.items():
        assert counts["changed"] == 0, (host, counts)
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
    check_pools(fleet)


def check_pools(fleet: Fleet) -> None:
    """Every pool ready; each storage machine exports to both GPU machines (by their NQNs),
    each GPU machine has pool kv from both storage machines, mounted and capped."""
    gpu_nqns = sorted(fleet.hostnqn(g) for g in GPUS)
    for name in STORAGE:
        status = status_ready(fleet, name)
        assert [(p["name"], p["role"]) for p in status["pools"]] == [("kv", "target")], status
        exports = nvmet_exports(fleet, name)
        # One subsystem per GPU machine, each admitting that machine alone by its NQN,
        # with two namespaces, on the storage machine's private address over TCP.
        assert sorted(h for sub in exports.values() for h in sub["hosts"]) == gpu_nqns, exports
        for nqn, sub in exports.items():
            assert len(sub["hosts"]) == 1 and len(sub["namespaces"]) == 2, (nqn, sub)
            assert sub["ports"] == [("tcp", fleet.address(name), "4420")], (nqn, sub)
    for name in GPUS:
        status = status_ready(fleet, name)
        assert [(p["name"], p["role"]) for p in status["pools"]] == [("kv", "initiator")], \
            status
        mounts, ctrls = gpu_state(fleet, name)
        assert [m[1] for m in mounts] == [f"{MNT}/{s}-ns{n}" for s in STORAGE for n in (1, 2)
                                          ], mounts
        assert all(m[3].startswith("/dev/nvme") for m in mounts), mounts
        addresses = sorted(c[2].split(",")[0] for c in ctrls)
        assert addresses == [f"traddr={fleet.address(s)}" for s in STORAGE], ctrls
        assert all(c[3] == "live" for c in ctrls), ctrls
        # Handed off: each engine's directory on every namespace, each capped.
        caps = engine_caps(fleet, name)
        assert sorted(caps) == [m[1] for m in mounts], caps
        for mount, limits in caps.items():
            assert len(limits) == 2, (mount, limits)
        listing = fleet.sh(name, f"ls {MNT}/storage1-ns1").stdout.split()
        assert {"lmcache", "sglang"} <= set(listing), listing


def test_a_rolling_upgrade_goes_one_host_at_a_time_gated_on_readyz(
        fleet: Fleet, ansible: Ansible, tmp_path: Path) -> None:
    newer_deb = build_newer_deb(tmp_path)
    new = newer_deb.deb
    for name in HOSTS:
        assert installed_version(fleet, name) == newer_deb.old_version
        status_ready(fleet, name)
    units_before = {name: kvagent_unit(fleet, name) for name in HOSTS}
    gpus_before = {name: gpu_state(fleet, name) for name in GPUS}

    recap, events = ansible.play("rolling upgrade", "upgrade.yml", new)
    for host, counts in recap.items():
        assert counts["changed"] > 0 and counts["failed"] == 0, (host, counts)
        assert counts["unreachable"] == 0, (host, counts)

    check_one_host_at_a_time(events)

    units_after = {name: kvagent_unit(fleet, name) for name in HOSTS}
    for name in HOSTS:
        assert installed_version(fleet, name) == newer_deb.version, name
        # The agent was restarted (a new process, started later by its own clock).
        before, after = units_before[name], units_after[name]
        assert after["ActiveState"] == "active", (name, after)
        assert after["MainPID"] != before["MainPID"], (name, before, after)
        assert int(after["ExecMainStartTimestampMonotonic"]) > int(
            before["ExecMainStartTimestampMonotonic"]), (name, before, after)
        status_ready(fleet, name)
    # Pools stayed up: the GPU machines' mounts are the very same mounts (mount ids) of
    # the same devices, through the same live controllers, as before the rollout.
    for name in GPUS:
        assert gpu_state(fleet, name) == gpus_before[name], (name, gpus_before[name])

    again, _ = ansible.play("after the upgrade", "upgrade.yml", new)
    for host, counts in again.items():
        assert counts["changed"] == 0, (host, counts)
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
    for name in HOSTS:
        assert kvagent_unit(fleet, name)["MainPID"] == units_after[name]["MainPID"], name

