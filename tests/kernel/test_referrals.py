"""A pool that grows with the fleet (issue 38), on a real kernel: referrals between
storage hosts, and a GPU host that knows one of them.

Three storage hosts share this VM's nvmet, each a kvagent of its own (node names sa,
sb, sc; its own state and ports: 127.0.0.1:4420, :4421, :4422), each exporting pool kv
(one namespace). They list each other in ``target.peers``. The GPU host's agent
(``kvagent run``, full passes 10 minutes apart) has pool kv with sa as its only seed.

- sa is up and refers to sb, which is not up yet (a peer that is down is still
  referred): the GPU host attaches sa's namespace, and sb's absence detaches nothing.
- sb comes up: the GPU agent, which keeps trying the referred discovery port it could
  not reach, attaches sb's namespace by itself.
- sc joins: it exports first, then sa and sb are given it as a peer. Their new
  referrals make nvmet send discovery-log-change AENs, and the GPU agent attaches sc's
  namespace seconds later, with no change to its own config (the time from the peers'
  apply to the mount is printed, against a bare ``nvme connect`` + mkfs + mount of a
  namespace of the same size in the same run).
- Each subsystem has exactly one controller of this host (nothing duplicated).
- sb cut off (its port's packets dropped), then a full pass: nothing is unmounted or
  disconnected.
- sc drains: its peers mark it ``draining`` and stop referring to it; their
  referrals' removal sends AENs too, and the GPU agent acts on them without a full pass:
  an engine still uses sc's mount, so it stays and the pool's problem names the engine;
  once the engine is gone the next pass unmounts and disconnects it, keeping the others.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent.initiator.nvme.discovery import DISCOVERY_NQN

from . import kit
from .crash import ci_log
from .pools import DRIVES, Lab, umount_all_under
from .test_cli_daemon import metric
from .test_daemon import free_port
from .test_events import cli, discovery_controllers, gpu_agent, mounted_at

pytestmark = pytest.mark.kernel(group="lifecycle", weight=2)
PREFIX = "nqn.2026-11.io.kvagent"
#: storage node -> (nvmet port id, TCP service)
STORAGE = {"sa": (51, 4420), "sb": (52, 4421), "sc": (53, 4422)}
BARE_HOSTNQN = "nqn.2014-08.org.example:bare-baseline"
BARE_NQN = "nqn.2026-11.io.example:bare"


def storage_config(lab: Lab, node: str, peers: list[str],
                   draining: tuple[str, ...] = ()) -> Path:
    pid, service = STORAGE[node]
    peer_list = ", ".join(
        f"{{name: {p}, transport: tcp, address: 127.0.0.1, service: {STORAGE[p][1]}"
        f"{', draining: true' if p in draining else ''}}}"
        for p in peers)
    path = lab.root / f"{node}.yaml"
    path.write_text(f"""
version: 1
node: {{name: {node}, state_dir: {lab.root}/{node}/state, run_dir: {lab.root}/{node}/run}}
target:
  ports: [{{name: lo, id: {pid}, transport: tcp, address: 127.0.0.1, service: {service}}}]
  peers: [{peer_list}]
  pools:
    - name: kv
      backing: {{kind: file, directory: {lab.root}/files/{node}, buffered_io: true}}
      namespaces: {{count: 1, size: 320MiB}}
      ports: [lo]
      hosts: [{{name: lab, nqn: "{lab.hostnqn}"}}]
""")
    return path


def status(config: Path) -> str:
    """``kvagent -o json status``'s answer (the agent's last snapshot)."""
    return cli(config, "-o", "json", "status")[1]


def apply(path: Path) -> None:
    code, out, err = cli(path, "apply")
    assert code == 0, out + err


def referrals(pid: int) -> dict[str, tuple[str, str]]:
    d = kit.NVMET / "ports" / str(pid) / "referrals"
    return {r.name: (kit.read(r / "addr_trsvcid"), kit.read(r / "enable"))
            for r in sorted(d.iterdir())}


def mount_of(lab: Lab, node: str) -> Path:
    return lab.root / "mnt" / "kv" / f"{node}-ns1"


def data_controllers(hostnqn: str) -> dict[tuple[str, str], list[str]]:
    """This host NQN's I/O controllers by (subsystem, address). The address is the
    target's (``traddr``, ``trsvcid``): the kernel shows ``src_addr`` only while the
    controller is connected, so one reconnecting after a cut would read as another."""
    out: dict[tuple[str, str], list[str]] = {}
    for c in Path("/sys/class/nvme").glob("nvme*"):
        try:
            if kit.read(c / "transport") != "tcp" or kit.read(c / "hostnqn") != hostnqn:
                continue
            nqn, address = kit.read(c / "subsysnqn"), kit.read(c / "address")
        except OSError:
            continue
        addr = ",".join(f for f in address.split(",") if not f.startswith("src_addr="))
        if nqn != DISCOVERY_NQN:
            out.setdefault((nqn, addr), []).append(c.name)
    return out


def cut(service: int, on: bool) -> None:
    """Drop every packet to or from ``service`` on loopback (a silent path), or stop."""
    if not on:
        kit.sh("tc", "qdisc", "del", "dev", "lo", "root", check=False)
        return
    kit.modprobe("sch_prio", "cls_u32", "act_gact")
    kit.sh("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio")
    for field in ("dport", "sport"):
        kit.sh("tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "u32",
               "match", "ip", field, str(service), "0xffff", "action", "drop")


def bare_block() -> str | None:
    """The block device of the bare subsystem's namespace (its multipath head)."""
    for dev in Path("/sys/block").glob("nvme*n1"):
        try:
            if kit.read(dev / "device" / "subsysnqn") == BARE_NQN and \
                    Path(f"/dev/{dev.name}").exists() and "c" not in dev.name[4:]:
                return f"/dev/{dev.name}"
        except OSError:
            continue
    return None


def bare_attach(lab: Lab) -> float:
    """A namespace of the same size exported by hand, then ``nvme connect`` + mkfs.xfs +
    mount by hand, as another host: the floor the agent's join is compared with."""
    sub = kit.NVMET / "subsystems" / BARE_NQN
    image = lab.root / "files" / "bare.img"
    with open(image, "wb") as f:
        f.truncate(320 << 20)
    sub.mkdir()
    kit.write(sub / "attr_allow_any_host", "1")
    (sub / "namespaces" / "1").mkdir()
    kit.write(sub / "namespaces" / "1" / "device_path", str(image))
    kit.write(sub / "namespaces" / "1" / "buffered_io", "1")
    kit.write(sub / "namespaces" / "1" / "enable", "1")
    port = kit.NVMET / "ports" / str(STORAGE["sa"][0])
    (port / "subsystems" / BARE_NQN).symlink_to(sub)
    started = time.monotonic()
    kit.sh("nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n", BARE_NQN,
           "--hostnqn", BARE_HOSTNQN)
    block = kit.wait_for(lambda: bare_block(), 30, interval=0.05,
                         what="the bare namespace's block device")
    kit.sh("mkfs.xfs", "-q", "-f", block, timeout=120)
    target = lab.root / "bare"
    target.mkdir()
    kit.sh("mount", block, str(target))
    took = time.monotonic() - started
    kit.sh("umount", str(target))
    kit.sh("nvme", "disconnect", "-n", BARE_NQN)
    (port / "subsystems" / BARE_NQN).unlink()
    (sub / "namespaces" / "1").rmdir()
    sub.rmdir()
    return took


@pytest.fixture
def lab(tmp_path: Path):
    """The storage hosts' files on an ext4 over a test drive; wiped afterwards."""
    lab = Lab(tmp_path)
    (tmp_path / "files").mkdir()
    kit.sh("mkfs.ext4", "-q", "-F", DRIVES[1], timeout=120)
    kit.sh("mount", DRIVES[1], str(tmp_path / "files"))
    yield lab
    cut(0, False)
    umount_all_under(tmp_path / "mnt")
    kit.sh("nvme", "disconnect-all", check=False)
    kit.force_clean()
    umount_all_under(tmp_path)
    kit.sh("wipefs", "-a", "-q", DRIVES[1], check=False)


def test_a_storage_host_joins_through_referrals_and_a_lost_one_detaches_nothing(
        lab: Lab) -> None:
    apply(storage_config(lab, "sa", ["sa", "sb"]))
    assert referrals(51) == {"kvagent-sb": ("4421", "1")}  # not to itself; sb down

    port = free_port()
    gpu = lab.root / "gpu.yaml"
    gpu.write_text(f"""
version: 1
node: {{name: lab, state_dir: {lab.root}/gstate, run_dir: {lab.root}/grun}}
initiator:
  pools:
    - {{name: kv, target: {{transport: tcp, address: 127.0.0.1, service: 4420}},
       mount: {lab.root}/mnt/kv, connect: {{fast_io_fail_tmo: 2s, reconnect_delay: 1s}}}}
health: {{listen: "127.0.0.1:{port}", interval: 10m, full_interval: 10m}}
""")
    with gpu_agent(gpu, lab.root / "agent.log") as proc:
        kit.wait_for(lambda: mounted_at(mount_of(lab, "sa")), 240, interval=0.2,
                     what="sa's namespace mounted by the agent's first pass")
        assert not mounted_at(mount_of(lab, "sb"))

        # sb comes up: the referred port the agent could not reach answers now.
        apply(storage_config(lab, "sb", ["sa", "sb"]))
        up = time.monotonic()
        kit.wait_for(lambda: mounted_at(mount_of(lab, "sb")), 120, interval=0.1,
                     what="sb's namespace mounted once sb came up")
        late = time.monotonic() - up

        # sc joins: it exports, then its peers refer to it.
        everyone = ["sa", "sb", "sc"]
        apply(storage_config(lab, "sc", everyone))
        assert not mounted_at(mount_of(lab, "sc"))  # nobody refers to it yet
        started = time.monotonic()
        apply(storage_config(lab, "sa", everyone))
        apply(storage_config(lab, "sb", everyone))
        applied = time.monotonic() - started
        kit.wait_for(lambda: mounted_at(mount_of(lab, "sc")), 120, interval=0.05,
                     what="sc's namespace mounted after its peers referred to it")
        join = time.monotonic() - started
        assert referrals(51) == {"kvagent-sb": ("4421", "1"), "kvagent-sc": ("4422", "1")}
        assert referrals(53) == {"kvagent-sa": ("4420", "1"), "kvagent-sb": ("4421", "1")}

        # One controller per subsystem and address, three of them, whatever else ran.
        ctrls = data_controllers(lab.hostnqn)
        assert sorted(nqn for nqn, _ in ctrls) == [f"{PREFIX}:{n}:kv:lab" for n in everyone]
        assert all(len(names) == 1 for names in ctrls.values()), ctrls
        # A discovery controller of the agent's at each storage host (made after the pass).
        kit.wait_for(lambda: len([h for h in discovery_controllers().values()
                                  if h == lab.hostnqn]) == 3, 60, interval=0.2,
                     what="the agent's discovery controllers at the three storage hosts")

        # sb cut off: a silent path. Nothing is unmounted or disconnected.
        cut(STORAGE["sb"][1], True)
        runs = metric(port, "kvagent_apply_runs_total") or 0
        proc.send_signal(signal.SIGHUP)  # a full pass, which reads every discovery log
        kit.wait_for(lambda: (metric(port, "kvagent_apply_runs_total") or 0) > runs, 240,
                     interval=0.2, what="the agent's full pass with sb cut off")
        assert all(mounted_at(mount_of(lab, n)) for n in everyone)
        assert data_controllers(lab.hostnqn) == ctrls  # the same controllers, none made anew
        cut(0, False)

        # sc drains: its peers stop referring to it. Their referrals' removal makes
        # nvmet send discovery-log-change AENs; the GPU agent's attach pass finds sc no
        # longer referred. An engine (here a process whose working directory is on sc's
        # mount) still uses it: the mount stays, and the pool's problem names it.
        engine = subprocess.Popen(["sleep", "600"], cwd=mount_of(lab, "sc"))
        try:
            started = time.monotonic()
            apply(storage_config(lab, "sa", everyone, draining=("sc",)))
            apply(storage_config(lab, "sb", everyone, draining=("sc",)))
            assert referrals(51) == {"kvagent-sb": ("4421", "1")}
            kit.wait_for(lambda: f"sleep (pid {engine.pid}" in status(gpu), 120,
                         interval=0.1, what="the pool's problem naming the engine still "
                                            "using sc's mount")
            noticed = time.monotonic() - started
            assert "still use it" in status(gpu)
            assert mounted_at(mount_of(lab, "sc"))
        finally:
            engine.kill()
            engine.wait()
        # The engine gone, the next pass lets the mount go (the retry a failing pass
        # schedules comes after health.interval: here a full pass now).
        started = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        kit.wait_for(lambda: not mounted_at(mount_of(lab, "sc")), 240, interval=0.05,
                     what="sc's namespace let go once nothing used it")
        leave = time.monotonic() - started
        kit.wait_for(lambda: all(nqn != f"{PREFIX}:sc:kv:lab"
                                 for nqn, _ in data_controllers(lab.hostnqn)), 60,
                     interval=0.1, what="sc's subsystem disconnected")
        assert all(mounted_at(mount_of(lab, n)) for n in ("sa", "sb"))
        assert proc.poll() is None

    bare = bare_attach(lab)
    ci_log(f"referrals: sc joined, mounted on the GPU host {join:.1f}s after its peers' "
           f"applies began (the applies {applied:.1f}s of it); a bare connect + mkfs + "
           f"mount of the same size {bare:.1f}s (ratio {join / bare:.2f}); sb mounted "
           f"{late:.1f}s after it came up (the agent retrying the referred port); sc drained: "
           f"the engine still using it named {noticed:.1f}s after its peers' applies "
           f"began, the mount let go {leave:.1f}s after the engine stopped (a full pass)")
    # Teardown: the GPU side first, then each storage host unexports.
    umount_all_under(lab.root / "mnt")
    kit.sh("nvme", "disconnect-all", check=False)
    for node in STORAGE:
        path = lab.root / f"{node}.yaml"
        path.write_text(path.read_text().split("target:")[0])
        apply(path)
    assert not any((kit.NVMET / "ports" / str(pid)).exists() for pid, _ in STORAGE.values())
