"""Persistent discovery controllers (agent.initiator.discovery_controllers): one per port
the pools discover at, made once, recorded, and only kvagent's own ever disconnected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import Config, load_config
from agent.fabrics import FabricsAddress
from agent.initiator.discovery_controllers import (
    KEEP_ALIVE,
    RECORD,
    DiscoveryControllers,
    wanted,
)
from agent.initiator.nvme.discovery import DISCOVERY_NQN
from agent.initiator.nvme.failures import TransientConnectError
from agent.initiator.sysfs import Sysfs
from agent.records import PoolAttachment
from agent.tlspsk import generate_psk

HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
OTHER = "nqn.2014-08.org.example:another-tool"
DATA_NQN = "nqn.2026-01.io.example:kv"
BOOT = "9f3c1a52-6a2e-4d0b-9a51-2f0e3c7d8b11"


def controller(sys: Path, name: str, nqn: str, traddr: str, hostnqn: str,
               state: str = "live") -> None:
    d = sys / "class/nvme" / name
    d.mkdir(parents=True)
    for attr, value in (("transport", "tcp"), ("address", f"traddr={traddr},trsvcid=4420"),
                        ("state", state), ("subsysnqn", nqn), ("hostnqn", hostnqn)):
        (d / attr).write_text(value + "\n")


class FakeCli:
    """add_controller makes the controller in the fake sysfs; disconnect removes it (into
    a graveyard beside the tree, keeping its inode number taken: the kernel never gives a
    later controller's sysfs directory the inode number of one gone)."""

    def __init__(self, sys: Path, fail: set[str] = frozenset()):  # type: ignore[assignment]
        self.sys, self.fail = sys, fail
        self.calls: list[tuple] = []

    def add_controller(self, transport, traddr, trsvcid, nqn, *, hostnqn, hostid,  # type: ignore[no-untyped-def]
                       host_iface, host_traddr, options):
        self.calls.append(("add", traddr, nqn, hostnqn, options.keep_alive_tmo,
                           options.ctrl_loss_tmo))
        if traddr in self.fail:
            raise TransientConnectError("connect refused", "")
        name = lowest_free(self.sys)
        controller(self.sys, name, nqn, traddr, hostnqn)
        return name

    def disconnect(self, *, device):  # type: ignore[no-untyped-def]
        self.calls.append(("disconnect", device))
        gone(self.sys, device)


def gone(sys: Path, name: str) -> None:
    """Controller ``name`` deleted: its directory leaves the tree, its inode stays taken."""
    graveyard = sys.parent / "gone"
    graveyard.mkdir(exist_ok=True)
    (sys / "class/nvme" / name).rename(graveyard / f"{name}.{len(list(graveyard.iterdir()))}")


def lowest_free(sys: Path) -> str:
    """The name the kernel gives the next controller: the lowest free ``nvme<N>``."""
    taken = {p.name for p in (sys / "class/nvme").iterdir()}
    return next(f"nvme{n}" for n in range(len(taken) + 1) if f"nvme{n}" not in taken)


def config(tmp: Path, *targets: str, tls: bool = False) -> object:
    pools = "".join(
        f"    - {{name: p{i}, target: {{transport: tcp, address: {t}}}, "
        f"mount: {tmp}/mnt/p{i}}}\n" for i, t in enumerate(targets))
    text = "version: 1\nnode: {name: gpu1}\n"
    if targets:
        text += "initiator:\n  pools:\n" + pools
    (tmp / "k.yaml").write_text(text)
    return load_config(tmp / "k.yaml")


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, Path, FakeCli, DiscoveryControllers]:
    sys, run = tmp_path / "sys", tmp_path / "run"
    (sys / "class/nvme").mkdir(parents=True)
    run.mkdir(mode=0o700)
    cli = FakeCli(sys)
    return sys, run, cli, DiscoveryControllers(run, cli, Sysfs(sys),  # type: ignore[arg-type]
                                               boot=BOOT)


def test_one_per_port_made_once_and_recorded(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    _sys, run, cli, keeper = host
    wants = wanted(config(tmp_path, "10.0.0.1", "10.0.0.1", "10.0.0.2"), HOSTNQN, None)
    assert len(wants) == 2  # two pools at one port share its controller
    done = keeper.sync(wants)
    assert len(done) == 2
    assert [c[:6] for c in cli.calls] == [
        ("add", "10.0.0.1", DISCOVERY_NQN, HOSTNQN, KEEP_ALIVE, -1),
        ("add", "10.0.0.2", DISCOVERY_NQN, HOSTNQN, KEEP_ALIVE, -1)]
    record = json.loads((run / RECORD).read_text())
    assert [c["name"] for c in record["controllers"]] == ["nvme0", "nvme1"]
    # Converged: nothing made, nothing written.
    before = (run / RECORD).stat().st_mtime_ns
    assert keeper.sync(wants) == [] and len(cli.calls) == 2
    assert (run / RECORD).stat().st_mtime_ns == before


def test_another_tools_controller_is_used_and_never_disconnected(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    sys, _run, cli, keeper = host
    controller(sys, "nvme0", DISCOVERY_NQN, "10.0.0.1", HOSTNQN)  # nvme-stas's, say
    controller(sys, "nvme1", DISCOVERY_NQN, "10.0.0.1", OTHER)  # another host NQN
    wants = wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None)
    assert keeper.sync(wants) == [] and cli.calls == []
    # No pool wants the port any more: still not kvagent's to disconnect.
    assert keeper.sync([]) == [] and cli.calls == []
    assert sorted(p.name for p in (sys / "class/nvme").iterdir()) == ["nvme0", "nvme1"]


def test_its_own_go_when_no_pool_wants_them(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    sys, run, _cli, keeper = host
    keeper.sync(wanted(config(tmp_path, "10.0.0.1", "10.0.0.2"), HOSTNQN, None))
    done = keeper.sync(wanted(config(tmp_path, "10.0.0.2"), HOSTNQN, None))
    assert done == ["disconnected nvme0 (tcp 10.0.0.1:4420)"]
    assert [p.name for p in (sys / "class/nvme").iterdir()] == ["nvme1"]
    assert [c["name"] for c in json.loads((run / RECORD).read_text())["controllers"]] \
        == ["nvme1"]


def test_a_reused_name_is_not_taken_for_kvagents(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    """The recorded controller went (a reboot, ctrl_loss_tmo); another's now has its name."""
    sys, run, cli, keeper = host
    keeper.sync(wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None))
    cli.disconnect(device="nvme0")
    controller(sys, "nvme0", DISCOVERY_NQN, "10.0.0.9", HOSTNQN)  # someone else's
    cli.calls.clear()
    keeper.sync([])
    assert cli.calls == [] and (sys / "class/nvme/nvme0").exists()
    assert json.loads((run / RECORD).read_text())["controllers"] == []


def test_an_unreachable_port_is_tried_again(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    _sys, _run, cli, keeper = host
    cli.fail = {"10.0.0.1"}
    wants = wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None)
    assert keeper.sync(wants) == []
    cli.fail = set()
    assert keeper.sync(wants) == ["connected nvme0 (tcp 10.0.0.1:4420)"]


def test_targets_named_by_subsystem_or_over_tls_want_none(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(f"""
version: 1
node: {{name: gpu1}}
initiator:
  pools:
    - {{name: a, target: {{transport: tcp, address: 10.0.0.1,
                         subsystem: "nqn.2026-01.io.example:a"}}, mount: {tmp_path}/a}}
""")
    assert wanted(load_config(tmp_path / "k.yaml"), HOSTNQN, None) == []
    assert wanted(config(tmp_path), HOSTNQN, None) == []


def test_a_recorded_name_that_is_not_a_controllers_is_dropped(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    """The record is read as hostile input: a name that is not ``nvme<N>`` never reaches a
    sysfs path or a disconnect."""
    sys, run, cli, keeper = host
    controller(sys, "nvme0", DISCOVERY_NQN, "10.0.0.1", HOSTNQN)
    entry = {"transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420", "hostnqn": HOSTNQN}
    (run / RECORD).write_text(json.dumps({"controllers": [
        {**entry, "name": "../../class/nvme/nvme0"}, {**entry, "name": "nvme0 "}]}))
    keeper.sync([])
    assert cli.calls == [] and (sys / "class/nvme/nvme0").exists()
    assert json.loads((run / RECORD).read_text())["controllers"] == []


def recorded(run: Path) -> list[dict]:
    return json.loads((run / RECORD).read_text())["controllers"]


def test_the_record_holds_the_controllers_sysfs_inode_and_the_boot(tmp_path: Path,
                                                                  host) -> None:  # type: ignore[no-untyped-def]
    sys, run, _cli, keeper = host
    keeper.sync(wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None))
    assert recorded(run) == [{
        "name": "nvme0", "transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420",
        "hostnqn": HOSTNQN, "sysfs_ino": (sys / "class/nvme/nvme0").stat().st_ino,
        "boot_id": BOOT}]


def test_another_discovery_controller_that_takes_a_freed_name_is_not_kvagents(
        tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    """F5 (issue 35): kvagent's discovery controller went (an admin's disconnect); another
    tool's, at the same port for the same host NQN, took its name. Name, address and host
    NQN all match the record, the sysfs directory's inode number does not: not kvagent's,
    never disconnected (before the fix it was, once no pool wanted the port)."""
    sys, run, cli, keeper = host
    keeper.sync(wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None))
    gone(sys, "nvme0")
    controller(sys, "nvme0", DISCOVERY_NQN, "10.0.0.1", HOSTNQN)  # nvme-stas's, say
    cli.calls.clear()
    assert keeper.sync([]) == [] and cli.calls == []
    assert (sys / "class/nvme/nvme0").exists()
    assert recorded(run) == []


def test_a_data_controller_is_never_taken_for_a_recorded_discovery_controller(
        tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    """An entry naming a data controller of the pool, at the recorded port for the recorded
    host NQN, whose inode number matches too (a record written by hand, or by a bug): it is
    not a discovery controller, so not kvagent's, and never disconnected under a pool that
    still wants its port (the other guard of issue 35's finding 5)."""
    sys, run, cli, keeper = host
    controller(sys, "nvme0", DATA_NQN, "10.0.0.1", HOSTNQN)
    ino = (sys / "class/nvme/nvme0").stat().st_ino
    (run / RECORD).write_text(json.dumps({"controllers": [{
        "name": "nvme0", "transport": "tcp", "traddr": "10.0.0.1", "trsvcid": "4420",
        "hostnqn": HOSTNQN, "sysfs_ino": ino, "boot_id": BOOT}]}))
    done = keeper.sync(wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None))
    assert ("disconnect", "nvme0") not in cli.calls
    assert (sys / "class/nvme/nvme0/subsysnqn").read_text().strip() == DATA_NQN
    assert done == ["connected nvme1 (tcp 10.0.0.1:4420)"]
    assert [e["name"] for e in recorded(run)] == ["nvme1"]


@pytest.mark.parametrize("change", ["no-inode", "inode-text", "another-boot"])
def test_an_entry_that_proves_nothing_is_dropped_and_its_controller_left(
        tmp_path: Path, host, change: str) -> None:  # type: ignore[no-untyped-def]
    """An entry an older kvagent wrote (no inode number) or one from another boot (a run
    directory that outlived a reboot: inode numbers start again) is not provably
    kvagent's: dropped from the record, its controller used as another tool's and never
    disconnected."""
    sys, run, cli, keeper = host
    keeper.sync(wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None))
    entry = recorded(run)[0]
    if change == "no-inode":
        del entry["sysfs_ino"], entry["boot_id"]
    elif change == "inode-text":
        entry["sysfs_ino"] = str(entry["sysfs_ino"])
    else:
        entry["boot_id"] = "00000000-0000-0000-0000-000000000000"
    (run / RECORD).write_text(json.dumps({"controllers": [entry]}))
    cli.calls.clear()
    wants = wanted(config(tmp_path, "10.0.0.1"), HOSTNQN, None)
    assert keeper.sync(wants) == [] and cli.calls == []  # used: no second one made
    assert recorded(run) == []
    assert keeper.sync([]) == [] and cli.calls == []
    assert (sys / "class/nvme/nvme0").exists()


# ------------------------------------------------------------ referred ports
def referred(*traddrs: str) -> dict[str, PoolAttachment]:
    """Pool p0's record, its last discovery having found ``traddrs`` by referral."""
    return {"p0": PoolAttachment(HOSTNQN, discovery=[
        FabricsAddress("tcp", t, "4420") for t in traddrs])}


def one_pool(tmp_path: Path, more: str) -> Config:
    """A GPU host with pool p0 seeded at 10.0.0.1 (``more``: the pool's further keys)."""
    (tmp_path / "k.yaml").write_text(f"""
version: 1
node: {{name: gpu1}}
initiator:
  pools:
    - {{name: p0, target: {{transport: tcp, address: 10.0.0.1}}, mount: {tmp_path}/p0,
       {more}}}
""")
    return load_config(tmp_path / "k.yaml")


def test_the_ports_a_pool_was_referred_to_are_wanted_with_its_host_side(
        tmp_path: Path) -> None:
    wants = wanted(one_pool(tmp_path, "connect: {host_iface: eth1}"), HOSTNQN, None,
                   referred("10.0.0.2", "10.0.0.1"))  # (the seed again: once)
    assert [(w.address.traddr, w.address.host_iface) for w in wants] == [
        ("10.0.0.1", "eth1"), ("10.0.0.2", "eth1")]


@pytest.mark.parametrize("pool", ["referrals: ignore", "tls: {key_file: PSK}"])
def test_referred_ports_of_a_pool_ignoring_referrals_or_over_tls_are_not_wanted(
        tmp_path: Path, pool: str) -> None:
    (tmp_path / "psk").write_text(generate_psk().text + "\n")
    (tmp_path / "psk").chmod(0o600)
    cfg = one_pool(tmp_path, pool.replace("PSK", str(tmp_path / "psk")))
    wants = wanted(cfg, HOSTNQN, None, referred("10.0.0.2"))
    assert "10.0.0.2" not in [w.address.traddr for w in wants]


def test_a_port_that_left_the_mesh_loses_kvagents_controller(tmp_path: Path, host) -> None:  # type: ignore[no-untyped-def]
    """A storage host the seeds referred to is wanted while the record lists it; once no
    seed refers to it (the record's next discovery lacks it) kvagent's own controller there
    goes, another tool's never."""
    sys, _run, cli, keeper = host
    cfg = config(tmp_path, "10.0.0.1")
    controller(sys, "nvme5", DISCOVERY_NQN, "10.0.0.3", HOSTNQN)  # another tool's
    done = keeper.sync(wanted(cfg, HOSTNQN, None, referred("10.0.0.2", "10.0.0.3")))
    assert done == ["connected nvme0 (tcp 10.0.0.1:4420)",
                    "connected nvme1 (tcp 10.0.0.2:4420)"]
    cli.calls.clear()
    done = keeper.sync(wanted(cfg, HOSTNQN, None, referred()))
    assert done == ["disconnected nvme1 (tcp 10.0.0.2:4420)"]
    assert cli.calls == [("disconnect", "nvme1")]
    assert sorted(p.name for p in (sys / "class/nvme").iterdir()) == ["nvme0", "nvme5"]
