"""Persistent discovery controllers: how a GPU host hears at once that its storage host
exported a pool.

For each storage host port an initiator pool discovers its subsystems at (a target
without ``subsystem``, and each port its last discovery found by referral from one,
recorded in the pool's ``PoolAttachment.discovery``; not over TLS), the agent keeps one
discovery controller connected
(``nqn.2014-08.org.nvmexpress.discovery``, keep-alive :data:`KEEP_ALIVE` s, reconnecting
forever). When the discovery log that port shows this host changes (a subsystem linked
to the port, this host allowed), nvmet sends a discovery-log-change AEN on it; the kernel
turns it into a ``change`` uevent carrying ``NVME_AEN``, which :mod:`agent.events` takes
as an ``aen`` and the agent answers with an attach pass. That pass's discovery reads the
log through the same controller (:mod:`agent.initiator.stages.discover`), which is what
acknowledges the AEN: nvmet sends the next one on a controller only after such a read.
Without all this a pool exported after the GPU host's pass failed to find it waits for
the retry (``health.interval``).

Ownership is a record, not a guess: the controllers kvagent made are listed in
``<run_dir>/discovery.json``, and only those are ever disconnected, when no pool
discovers at their address any more (a storage host no seed refers to any more
included: a storage host added to the mesh later is heard of through the controllers
at the ports that refer to it, whose log changes). A controller another tool made (nvme-stas, an
admin's ``nvme discover -p``) is used as it is, never touched. A name is not an identity:
the kernel gives a freed ``nvme<N>`` to the next controller made, whoever makes it (after
an admin's ``nvme disconnect-all`` the pass's data controller, or another tool's
discovery controller, takes the name kvagent recorded). So each entry also records what
the kernel gives that controller alone: the inode number of its sysfs directory
(:meth:`~.sysfs.Sysfs.controller_inode`, never a later controller's in the same boot)
and the boot's id; a recorded controller is kvagent's only while both match, and it is a
discovery controller at the recorded address for the recorded host NQN. Anything else
(gone, another's, another boot, or an entry from a kvagent that recorded no inode) is
dropped from the record and never disconnected. The record lives in the run directory
because the controllers do not outlive a reboot either. A kill between a connect and
its record leaves a controller kvagent does not claim: it is used as another tool's
would be (a connection, not data: nothing is lost).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config.model import Config
from ..errors import KvagentError
from ..fabrics import DISCOVERY_NQN, FabricsAddress
from ..log import get_logger
from ..records import PoolAttachment
from ..state import read_json, write_json
from .nvme.cli import NvmeCli
from .nvme.options import FabricsOptions
from .sysfs import Controller, Sysfs

log = get_logger("initiator.discovery")

#: A recorded controller's name, checked before it goes into a sysfs path or a command.
CONTROLLER_NAME = re.compile(r"nvme\d+")

#: The record of the discovery controllers kvagent made, in the run directory.
RECORD = "discovery.json"
#: The kernel's random id of this boot (a controller's sysfs inode number is unique in one).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: Keep-alive of a persistent discovery controller (nvme-cli's for ``discover -p``):
#: nvmet drops a discovery controller that sends none within its own timeout (120 s).
KEEP_ALIVE = 30


@dataclass(frozen=True)
class Wanted:
    """A storage host's port some pool discovers at, as this host connects to it."""

    address: FabricsAddress  # with the pool's host_iface / host_traddr
    hostnqn: str
    hostid: str | None


def wanted(cfg: Config, hostnqn: str, hostid: str | None,
           records: Mapping[str, PoolAttachment] | None = None) -> list[Wanted]:
    """The ports the initiator pools discover at: each pool's seeds (its targets without
    ``subsystem``) and, for a pool following referrals, the ports its last discovery
    found by referral (``records``: the pools' :class:`~agent.records.PoolAttachment`,
    their ``discovery``). Not over TLS: a discovery controller over TLS needs the pool's
    PSK, which only the pass puts in the keyring."""
    found: dict[FabricsAddress, Wanted] = {}
    for pool in cfg.initiator.pools if cfg.initiator else ():
        if pool.tls is not None:
            continue
        ports = [FabricsAddress.from_config(t) for t in pool.targets if not t.subsystem]
        record = (records or {}).get(pool.name)
        if record is not None and pool.referrals == "follow":
            ports += record.discovery
        for port in ports:
            address = port.with_host(pool.connect.host_iface, pool.connect.host_traddr)
            found.setdefault(address, Wanted(address, hostnqn, hostid))
    return list(found.values())


def _serves(ctrl: Controller, want: Wanted) -> bool:
    return ctrl.discovers_for(want.hostnqn, want.address)


def boot_id(path: str = BOOT_ID) -> str | None:
    """This boot's random id (None when it cannot be read)."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Owned:
    """A discovery controller kvagent made, as sysfs shows it now, with the inode number
    of its sysfs directory."""

    ctrl: Controller
    sysfs_ino: int


def _entry(name: str, address: FabricsAddress, hostnqn: str | None, sysfs_ino: int,
           boot: str) -> dict[str, object]:
    return {"name": name, "transport": address.transport, "traddr": address.traddr,
            "trsvcid": address.trsvcid, "hostnqn": hostnqn, "sysfs_ino": sysfs_ino,
            "boot_id": boot}


def _identified(sysfs: Sysfs, name: str) -> Owned | None:
    """Controller ``name`` with the inode number of its sysfs directory, read before and
    after its attributes (the same both times: they are that controller's)."""
    ino = sysfs.controller_inode(name)
    ctrl = sysfs.controller(name)
    if ino is None or ctrl is None or sysfs.controller_inode(name) != ino:
        return None
    return Owned(ctrl, ino)


def _still_ours(entry: object, sysfs: Sysfs, boot: str | None) -> Owned | None:
    """The recorded controller, if it is still the one kvagent made: the same sysfs
    directory (inode number) in the same boot, a discovery controller at the recorded
    address for the recorded host NQN. A name is reused once its controller is gone; an
    entry without the inode number (an older kvagent's) proves nothing."""
    if not isinstance(entry, dict) or boot is None:
        return None
    name, ino = entry.get("name"), entry.get("sysfs_ino")
    if not (isinstance(name, str) and CONTROLLER_NAME.fullmatch(name)):
        return None
    if type(ino) is not int or entry.get("boot_id") != boot:
        return None
    found = _identified(sysfs, name)
    if found is None or found.sysfs_ino != ino:
        return None
    ctrl = found.ctrl
    if ctrl.subsysnqn != DISCOVERY_NQN:
        return None
    a = ctrl.address
    if (a.transport, a.traddr, a.trsvcid, ctrl.hostnqn) != (
            entry.get("transport"), entry.get("traddr"), entry.get("trsvcid"),
            entry.get("hostnqn")):
        return None
    return found


class DiscoveryControllers:
    """Keeps one discovery controller per wanted port (:func:`wanted`); :meth:`sync` after
    every pass."""

    def __init__(self, run_dir: Path | str, cli: NvmeCli, sysfs: Sysfs, *,
                 boot: str | None = None):
        """``boot``: this boot's id (default: the kernel's, :func:`boot_id`)."""
        self.record = Path(run_dir) / RECORD
        self.cli, self.sysfs = cli, sysfs
        self.boot = boot if boot is not None else boot_id()
        #: the wanted ports the last :meth:`sync` could not connect to (down, not up yet)
        self.unreached: list[Wanted] = []
        #: the wanted ports the last :meth:`sync` connected a controller to
        self.connected: list[Wanted] = []

    def _recorded(self) -> list[object]:
        data = read_json(self.record, {})
        entries = data.get("controllers", []) if isinstance(data, dict) else []
        return entries if isinstance(entries, list) else []

    def _entry(self, owned: Owned) -> dict[str, object]:
        c = owned.ctrl
        return _entry(c.name, c.address, c.hostnqn, owned.sysfs_ino, self.boot or "")

    def sync(self, wants: Iterable[Wanted]) -> list[str]:
        """Connect a discovery controller to each wanted port that has none (kvagent's or
        another tool's); disconnect kvagent's that no pool wants. Returns what it did, for
        the log. A port that cannot be reached now (:attr:`unreached`) is tried again at
        the next sync."""
        wants = list(wants)
        recorded = self._recorded()
        owned = [o for o in (_still_ours(e, self.sysfs, self.boot) for e in recorded)
                 if o is not None]
        present = [c for c in self.sysfs.controllers(DISCOVERY_NQN, fresh=True)
                   if c.usable or c.state in ("connecting", "resetting")]
        done: list[str] = []
        self.unreached, self.connected = [], []
        keep = [o for o in owned if any(_serves(o.ctrl, w) for w in wants)]
        entries = [self._entry(o) for o in keep]
        for o in owned:
            if o in keep:
                continue
            ctrl = o.ctrl
            try:
                self.cli.disconnect(device=ctrl.name)
                done.append(f"disconnected {ctrl.name} ({ctrl.address.describe()})")
            except KvagentError as exc:
                log.warning("discovery controller not disconnected", device=ctrl.name,
                            error=exc.message)
                entries.append(self._entry(o))
        for want in wants:
            if any(_serves(c, want) for c in present):
                continue
            a = want.address
            try:
                name = self.cli.add_controller(
                    a.transport, a.traddr or "", a.trsvcid or "", DISCOVERY_NQN,
                    hostnqn=want.hostnqn, hostid=want.hostid, host_iface=a.host_iface,
                    host_traddr=a.host_traddr,
                    options=FabricsOptions(ctrl_loss_tmo=-1, keep_alive_tmo=KEEP_ALIVE))
            except KvagentError as exc:
                log.info("no discovery controller now; the passes still discover",
                         target=a.describe(), error=exc.message)
                self.unreached.append(want)
                continue
            done.append(f"connected {name} ({a.describe()})")
            self.connected.append(want)
            made = _identified(self.sysfs, name)
            if made is None or not _serves(made.ctrl, want):
                continue  # gone already, or its name another's: not recorded, not claimed
            present.append(made.ctrl)
            if self.boot is not None:
                entries.append(self._entry(made))
        if entries != recorded:
            write_json(self.record, {"controllers": entries})
        return done
