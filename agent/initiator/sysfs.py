"""Readers of the NVMe host side of sysfs: controllers, subsystems, namespaces.

Everything here reads under a ``sysfs`` root (default ``/sys``) so tests can
point it at a fake tree. Devices come and go while we read (a controller
being deleted, a namespace being removed): a reader that loses a race
returns None for that object, or leaves it out of a listing; it never
raises because something vanished.

Layout on Debian's 6.1 kernel with ``nvme_core multipath=Y`` (see
tests/unit/initiator/fixtures/sysfs-6.1/):

- ``/sys/class/nvme/nvme<C>``: a controller (``transport``, ``address``,
  ``state``, ``subsysnqn``, ``hostnqn``, ``hostid``, ``cntlid``,
  ``ctrl_loss_tmo`` ...); fabrics ones live under
  ``/sys/devices/virtual/nvme-fabrics/ctl/``.
- ``/sys/class/nvme-subsystem/nvme-subsys<S>``: ``subsysnqn``, ``iopolicy``,
  one symlink per controller and one directory per namespace head.
- ``/sys/block/nvme<S>n<N>``: the multipath head (the device to use), with
  ``uuid``, ``nguid`` (absent when zero), ``wwid``, ``nsid``, ``size`` (512-byte
  sectors), ``queue/logical_block_size``; its ``device`` links to the subsystem.
- ``/sys/block/nvme<S>c<C>n<N>``: the hidden per-path node, with
  ``ana_state``/``ana_grpid``; its ``device`` links to the controller.

A TCP controller's TLS state (kernels with ``CONFIG_NVME_TCP_TLS``): its ``tls_key``
attribute reads the serial of the PSK its TLS session negotiated (``%08x``), or nothing
between a connection's loss and the next handshake. From 6.12 on (Debian 13's kernel) the
attribute is there only for a controller connected with ``tls``; from 6.7 to 6.11 every
TCP controller has it (empty without TLS); without TLS support it is never there
(:func:`tls_state`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .. import effects
from ..fabrics import DISCOVERY_NQN, FabricsAddress

#: Controller states in which a controller is (or will soon be) usable.
USABLE_STATES = frozenset({"live", "connecting", "resetting"})
#: Every state the kernel reports (nvme_sysfs_show_state).
CONTROLLER_STATES = frozenset(
    {"new", "live", "resetting", "connecting", "deleting", "deleting (no IO)", "dead"}
)
#: Transports of fabrics controllers (the ones kvagent may connect or disconnect).
FABRICS_TRANSPORTS = frozenset({"tcp", "rdma", "fc", "loop"})

_CTRL_RE = re.compile(r"^nvme(\d+)$")
_HEAD_RE = re.compile(r"^nvme(\d+)n(\d+)$")
_PATH_RE = re.compile(r"^nvme(\d+)c(\d+)n(\d+)$")
_SUBSYS_RE = re.compile(r"^nvme-subsys(\d+)$")
T = TypeVar("T")
SECTOR = 512
#: The first kernel whose ``tls_key`` attribute is there only for a controller connected
#: with TLS (drivers/nvme/host/sysfs.c, "split off TLS sysfs attributes", 6.12).
TLS_KEY_ONLY_WITH_TLS = (6, 12)


def kernel_version(release: str) -> tuple[int, int]:
    """``(major, minor)`` of a kernel release text (``6.12.117+deb13-amd64``); ``(0, 0)``
    for a text that does not start with them."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def tls_state(transport: str, tls_key: str | None, exact: bool) -> bool | None:
    """Whether a controller was connected with TLS, from its ``tls_key`` attribute (None:
    not there). True: a PSK was negotiated (any kernel), or the attribute is there on a
    kernel that shows it only for TLS controllers (``exact``: 6.12 and later). False: not
    TCP, or no attribute. None: there but empty on 6.7-6.11, where every TCP controller
    has it: a TLS controller between handshakes and a plaintext one look the same."""
    if transport.strip().lower() != "tcp" or tls_key is None:
        return False
    if tls_key not in ("", "none"):
        return True
    return True if exact else None


def read_attr(path: Path | str) -> str | None:
    """Contents of one sysfs attribute, stripped; None if it vanished or cannot be read.

    One open, read and close (a sysfs attribute is at most a page, filled on the first
    read): every pass reads a dozen of them per namespace on a GPU host.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        # gone (ENOENT, ENOTDIR), ENODEV/ENXIO from a device being torn down, EACCES
        # on write-only files
        return None
    try:
        data = os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip()


def _read_int(path: Path | str) -> int | None:
    text = read_attr(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _link_name(path: Path | str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _shared(seen: dict[str, str | None] | None, path: str) -> str | None:
    """:func:`read_attr`, once per path for one caller's look (``seen``: None = always)."""
    if seen is None:
        return read_attr(path)
    if path not in seen:
        seen[path] = read_attr(path)
    return seen[path]


def _listdir(path: Path | str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


@dataclass(frozen=True)
class Controller:
    """One NVMe controller as sysfs shows it."""

    name: str
    #: its ``transport`` and ``address`` attributes
    address: FabricsAddress
    state: str
    subsysnqn: str
    hostnqn: str | None = None
    hostid: str | None = None
    cntlid: int | None = None
    ctrl_loss_tmo: str | None = None
    reconnect_delay: str | None = None
    fast_io_fail_tmo: str | None = None
    kato: str | None = None
    queue_count: int | None = None
    sqsize: int | None = None
    #: connected with NVMe/TCP TLS (:func:`tls_state`; None: sysfs cannot tell)
    tls: bool | None = False

    @property
    def is_fabrics(self) -> bool:
        return self.address.transport in FABRICS_TRANSPORTS

    @property
    def usable(self) -> bool:
        return self.state in USABLE_STATES

    @property
    def device(self) -> str:
        return f"/dev/{self.name}"

    def discovers_for(self, hostnqn: str, address: FabricsAddress) -> bool:
        """Whether this is a discovery controller of ``hostnqn`` at ``address`` (its log
        lists what that host may use there)."""
        return (self.subsysnqn == DISCOVERY_NQN and self.hostnqn == hostnqn
                and address.same_endpoint(self.address))


@dataclass(frozen=True)
class Subsystem:
    """One NVMe subsystem (``/sys/class/nvme-subsystem/nvme-subsys<S>``)."""

    name: str
    nqn: str
    iopolicy: str | None
    subsystype: str | None
    controllers: tuple[str, ...]
    heads: tuple[str, ...]


@dataclass(frozen=True)
class NamespacePath:
    """A hidden per-path node ``nvme<S>c<C>n<N>``: one controller's view of a namespace."""

    name: str
    controller: str | None
    controller_state: str | None
    ana_state: str | None
    ana_grpid: int | None


@dataclass(frozen=True)
class NamespaceHead:
    """A namespace's block device: the multipath head ``nvme<S>n<N>`` and its paths.

    Without native multipath the block device sits directly on a controller; then
    ``subsystem`` is None and ``paths`` holds that single controller.
    """

    name: str
    nsid: int | None
    uuid: str | None
    nguid: str | None
    wwid: str | None
    size_sectors: int | None
    logical_block_size: int | None
    subsystem: str | None
    subsysnqn: str | None
    paths: tuple[NamespacePath, ...]

    @property
    def device(self) -> str:
        return f"/dev/{self.name}"

    @property
    def size_bytes(self) -> int | None:
        return None if self.size_sectors is None else self.size_sectors * SECTOR


class _Owners:
    """The NQN each sysfs object of one kind (controllers, subsystems) showed when a
    reader last looked at it, and the reverse: which objects showed an NQN. A reader lists
    the objects once, then finds a subsystem's by the reverse (no listing per pool)."""

    def __init__(self) -> None:
        self.nqn: dict[str, str | None] = {}
        self._showing: dict[str | None, set[str]] = {}
        #: whether every object has been listed once (else :meth:`showing` knows too little)
        self.listed = False

    def set(self, name: str, nqn: str | None) -> None:
        if name in self.nqn:
            if self.nqn[name] == nqn:
                return
            self._showing[self.nqn[name]].discard(name)
        self.nqn[name] = nqn
        self._showing.setdefault(nqn, set()).add(name)

    def forget(self, name: str) -> None:
        if name in self.nqn:
            self._showing[self.nqn.pop(name)].discard(name)

    def showing(self, nqn: str) -> list[str]:
        """The objects that showed ``nqn``, in the kernel's order (by number)."""
        return sorted(self._showing.get(nqn, ()), key=_number)

    def relist(self, names: list[str], read: Callable[[str], str | None], *,
               every: bool) -> None:
        """``names`` are the objects now: the gone ones are forgotten, the new ones (with
        ``every``, all of them: a name may have been reused) have their NQN ``read``."""
        for gone in set(self.nqn).difference(names):
            self.forget(gone)
        for n in names:
            if every or n not in self.nqn:
                self.set(n, read(n))
        self.listed = True


def _number(name: str) -> int:
    """``nvme12`` / ``nvme-subsys12`` -> 12."""
    digits = name[len(name.rstrip("0123456789")):]
    return int(digits) if digits else -1


class Sysfs:
    """Reads NVMe controllers, subsystems and namespaces under a sysfs root."""

    def __init__(self, root: Path | str = "/sys", *, kernel: str | None = None):
        """``kernel``: the running kernel's release (default: ``uname -r``); it says how
        to read a controller's ``tls_key`` (:func:`tls_state`)."""
        self.root = Path(root)
        release = os.uname().release if kernel is None else kernel
        self.tls_key_exact = kernel_version(release) >= TLS_KEY_ONLY_WITH_TLS
        #: the subsystem NQN each controller showed when last looked at: which
        #: controllers :meth:`controllers` reads for a subsystem (each is then read live)
        self._ctrl_owners = _Owners()
        #: the same for subsystems (``nvme-subsys<S>``), for :meth:`subsystem_namespaces`
        self._subsystem_owners = _Owners()

    # -- controllers ----------------------------------------------------------
    def controller_names(self) -> list[str]:
        names = [n for n in _listdir(f"{self.root}/class/nvme") if _CTRL_RE.match(n)]
        return sorted(names, key=lambda n: int(n[4:]))

    def controller(self, name: str) -> Controller | None:
        """The controller ``name`` (``nvme3``), or None if it is gone or half torn down."""
        d = f"{self.root}/class/nvme/{name}"
        transport = read_attr(f"{d}/transport")
        address = read_attr(f"{d}/address")
        state = read_attr(f"{d}/state")
        subsysnqn = read_attr(f"{d}/subsysnqn")
        if transport is None or address is None or state is None or subsysnqn is None:
            return None
        return Controller(
            name=name, address=FabricsAddress.from_sysfs(transport, address), state=state,
            subsysnqn=subsysnqn, hostnqn=read_attr(f"{d}/hostnqn"),
            hostid=read_attr(f"{d}/hostid"), cntlid=_read_int(f"{d}/cntlid"),
            ctrl_loss_tmo=read_attr(f"{d}/ctrl_loss_tmo"),
            reconnect_delay=read_attr(f"{d}/reconnect_delay"),
            fast_io_fail_tmo=read_attr(f"{d}/fast_io_fail_tmo"), kato=read_attr(f"{d}/kato"),
            queue_count=_read_int(f"{d}/queue_count"), sqsize=_read_int(f"{d}/sqsize"),
            tls=tls_state(transport, read_attr(f"{d}/tls_key"), self.tls_key_exact),
        )

    def controller_inode(self, name: str) -> int | None:
        """The kernfs inode number of controller ``name``'s sysfs directory (None: gone):
        one controller's for as long as it lives, never a later one's in this boot.

        The controller's name (``nvme<instance>``) and its ``dev`` number come from IDAs
        that hand out the lowest free number, and ``cntlid`` is the target's to reuse; but
        kernfs numbers its nodes from a cyclic allocator (fs/kernfs/dir.c,
        ``idr_alloc_cyclic``/``xa_alloc_cyclic``; since 5.5 the inode number is the whole
        64-bit id with a generation above the cyclic 32 bits), so a controller that later
        takes the same name gets another directory with another inode number.
        tests/kernel/test_events.py proves it on the real kernel."""
        try:
            return os.stat(f"{self.root}/class/nvme/{name}").st_ino
        except OSError:
            return None

    def controllers(self, subsysnqn: str | None = None, *,
                    fresh: bool = False) -> list[Controller]:
        """Every controller that could be read completely (vanished ones are left out).

        With ``subsysnqn``, only that subsystem's: the controllers that showed it when this
        reader last looked at them are read in full, and kept when they still show it.
        The controllers are listed (and a new one's ``subsysnqn`` read) the first time
        this reader is asked, and again with ``fresh`` (every ``subsysnqn`` then read
        again: a name may have been reused): a GPU host has a controller per pool and
        every pool's attach looks for its own, so a pass lists them once, not per pool.
        A controller made since the listing is found with ``fresh``, or :meth:`learn`.
        """
        owners = self._ctrl_owners
        if subsysnqn is None:
            names = self.controller_names()
            for gone in set(owners.nqn).difference(names):
                owners.forget(gone)
        else:
            if fresh or not owners.listed:
                root = f"{self.root}/class/nvme"
                owners.relist(self.controller_names(),
                              lambda n: read_attr(f"{root}/{n}/subsysnqn"), every=fresh)
            names = owners.showing(subsysnqn)
        found = []
        for n in names:
            c = self.controller(n)
            if c is None:
                owners.forget(n)
                continue
            owners.set(n, c.subsysnqn)
            if subsysnqn is None or c.subsysnqn == subsysnqn:
                found.append(c)
        if subsysnqn is None:
            owners.listed = True
        return found

    def learn(self, name: str) -> None:
        """A controller just made (the kernel named it): :meth:`controllers` finds it
        without listing them all again."""
        self._ctrl_owners.set(name, read_attr(f"{self.root}/class/nvme/{name}/subsysnqn"))

    def controller_secret(self, name: str, attr: str) -> str | None:
        """A controller's DH-HMAC-CHAP secret (``dhchap_secret`` or ``dhchap_ctrl_secret``;
        root only), None when unset (``none``) or not there (a kernel without host auth)."""
        value = read_attr(self.root / "class/nvme" / name / attr)
        return None if value in (None, "", "none") else value

    def set_controller_secrets(self, name: str, secrets: list[tuple[str, str]]) -> None:
        """Give a controller new secrets (``(attribute, secret)`` in order); each write
        makes the kernel re-authenticate a live controller. The files are all opened
        before any is written, so that nothing is written if one cannot be opened.
        (:func:`agent.initiator.connect.refresh_controllers` never gives a live controller
        both: see there.)"""
        effects.sysfs_write_all([(self.root / "class/nvme" / name / attr, secret + "\n")
                                 for attr, secret in secrets], truncate=True)

    def set_controller_attr(self, name: str, attr: str, value: str) -> None:
        """Write one of a controller's tunable attributes (``fast_io_fail_tmo``,
        ``ctrl_loss_tmo``, ``reconnect_delay``: writable on 6.1; -1 turns a timeout off)."""
        effects.sysfs_write(self.root / "class/nvme" / name / attr, value + "\n",
                            truncate=True)

    # -- subsystems -----------------------------------------------------------
    def subsystem(self, name: str) -> Subsystem | None:
        d = self.root / "class/nvme-subsystem" / name
        nqn = read_attr(d / "subsysnqn")
        if nqn is None:
            return None
        entries = _listdir(d)
        return Subsystem(
            name=name, nqn=nqn, iopolicy=read_attr(d / "iopolicy"),
            subsystype=read_attr(d / "subsystype"),
            controllers=tuple(e for e in entries if _CTRL_RE.match(e)),
            heads=tuple(e for e in entries if _HEAD_RE.match(e)),
        )

    def subsystems(self) -> list[Subsystem]:
        names = [n for n in _listdir(self.root / "class/nvme-subsystem") if _SUBSYS_RE.match(n)]
        return [s for s in (self.subsystem(n) for n in names) if s]

    def subsystems_of(self, nqn: str) -> list[Subsystem]:
        """The subsystems (``nvme-subsys<S>``) of NQN ``nqn`` on this host, read now.

        Found among those that showed ``nqn`` when this reader last looked (as
        :meth:`subsystem_namespaces` does): one file of every other subsystem per reader,
        not per pool; when none shows it any more, every subsystem's NQN is read again.
        """
        found = self._by_nqn(nqn, lambda names: self._subsystems_showing(nqn, names) or None)
        return found or []

    def _by_nqn(self, nqn: str, look: Callable[[list[str]], T | None]) -> T | None:
        """``look`` at the subsystems (``nvme-subsys<S>`` names) that showed ``nqn`` when
        this reader last looked; when that finds nothing (None), at the subsystems listed
        now (a new one's NQN is read once), then with every subsystem's NQN read again."""
        owners = self._subsystem_owners
        found = look(owners.showing(nqn)) if owners.listed else None
        root = f"{self.root}/class/nvme-subsystem"
        for every in (False, True):
            if found is not None:
                break
            names = [n for n in _listdir(root) if _SUBSYS_RE.match(n)]
            owners.relist(names, lambda n: read_attr(f"{root}/{n}/subsysnqn"), every=every)
            found = look(owners.showing(nqn))
        return found

    def _subsystems_showing(self, nqn: str, names: list[str]) -> list[Subsystem]:
        out = []
        for n in names:
            sub = self.subsystem(n)
            self._subsystem_owners.set(n, sub.nqn if sub else None)
            if sub is not None and sub.nqn == nqn:
                out.append(sub)
        return out

    def set_iopolicy(self, subsystem: str, policy: str) -> None:
        """Write a subsystem's multipath I/O policy; the kernel's refusal (``OSError``,
        e.g. EINVAL for a policy it does not have) reaches the caller."""
        effects.sysfs_write(self.root / "class/nvme-subsystem" / subsystem / "iopolicy", policy)

    # -- namespaces -----------------------------------------------------------
    def namespace(self, name: str, block: dict[str, list[str]] | None = None, *,
                  seen: dict[str, str | None] | None = None, brief: bool = False,
                  parent: str | None = None) -> NamespaceHead | None:
        """The namespace block device ``name`` (``nvme2n1``) with its paths, or None.

        ``block``: the hidden path nodes of ``<sysfs>/block`` by head
        (:meth:`path_nodes`; listed here if not given: a caller looking at many heads
        lists them once). ``seen``: attributes of subsystems and controllers already read
        by this caller just now (by path; filled here): the heads of one subsystem share
        its NQN and their paths' controllers. ``brief``: leave out (None) what neither
        the attach nor health uses: ``nguid``, ``wwid``, the logical block size (the
        probes read it from the mounted filesystem) and the paths' ``ana_grpid``; a
        path's controller comes from its name (``nvme<S>c<C>n<N>``: ``nvme<C>``, as the
        kernel names it). ``parent``: the subsystem or controller directory the caller
        found the head in (its ``device`` link is not read then).
        """
        if not _HEAD_RE.match(name):
            return None
        root = str(self.root)
        d = f"{root}/block/{name}"
        uuid = read_attr(f"{d}/uuid")
        nsid = _read_int(f"{d}/nsid")
        if uuid is None and nsid is None:
            return None  # gone (or not a namespace)
        if parent is None:
            parent = _link_name(f"{d}/device")
        subsystem = parent if parent and _SUBSYS_RE.match(parent) else None
        subsysnqn = None
        if subsystem:
            subsysnqn = _shared(seen, f"{root}/class/nvme-subsystem/{subsystem}/subsysnqn")
            paths = self._paths_of(name, block, seen, brief)
        else:
            # No native multipath: the block device hangs off its controller directly.
            ctrl = parent if parent and _CTRL_RE.match(parent) else None
            if ctrl:
                subsysnqn = read_attr(f"{root}/class/nvme/{ctrl}/subsysnqn")
            paths = (NamespacePath(name=name, controller=ctrl, controller_state=(
                read_attr(f"{root}/class/nvme/{ctrl}/state") if ctrl else None),
                ana_state=read_attr(f"{d}/ana_state"),
                ana_grpid=None if brief else _read_int(f"{d}/ana_grpid")),)
        return NamespaceHead(
            name=name, nsid=nsid, uuid=uuid, nguid=None if brief else read_attr(f"{d}/nguid"),
            wwid=None if brief else read_attr(f"{d}/wwid"), size_sectors=_read_int(f"{d}/size"),
            logical_block_size=None if brief else _read_int(f"{d}/queue/logical_block_size"),
            subsystem=subsystem, subsysnqn=subsysnqn, paths=paths,
        )

    def path_nodes(self) -> dict[str, list[str]]:
        """The hidden per-path nodes in ``<sysfs>/block`` (``nvme2c3n1``), by the head
        they serve (``nvme2n1``): one listing for any number of heads."""
        out: dict[str, list[str]] = {}
        for entry in _listdir(self.root / "block"):
            pm = _PATH_RE.match(entry)
            if pm:
                out.setdefault(f"nvme{pm.group(1)}n{pm.group(3)}", []).append(entry)
        return out

    def _paths_of(self, head: str, block: dict[str, list[str]] | None = None,
                  seen: dict[str, str | None] | None = None,
                  brief: bool = False) -> tuple[NamespacePath, ...]:
        found = []
        root = str(self.root)
        for entry in (self.path_nodes() if block is None else block).get(head, ()):
            pm = _PATH_RE.match(entry)
            assert pm
            d = f"{root}/block/{entry}"
            ctrl = (None if brief else _link_name(f"{d}/device")) or f"nvme{pm.group(2)}"
            ana_state = read_attr(f"{d}/ana_state")
            if ana_state is None and not os.path.exists(d):
                continue  # the path went away while we looked
            found.append(NamespacePath(
                name=entry, controller=ctrl,
                controller_state=_shared(seen, f"{root}/class/nvme/{ctrl}/state"),
                ana_state=ana_state, ana_grpid=None if brief else _read_int(f"{d}/ana_grpid"),
            ))
        return tuple(found)

    def namespace_names(self) -> list[str]:
        return [n for n in _listdir(self.root / "block") if _HEAD_RE.match(n)]

    def namespaces(self) -> list[NamespaceHead]:
        """Every namespace block device (multipath heads; hidden path nodes are folded in)."""
        names, block = self.namespace_names(), self.path_nodes()
        return [h for h in (self.namespace(n, block) for n in names) if h]

    def subsystem_namespaces(self, subsysnqn: str) -> dict[int, NamespaceHead]:
        """The namespaces of subsystem ``subsysnqn`` on this host, by nsid.

        Looks only at that subsystem: its ``nvme-subsys`` directory (multipath heads) and
        its controllers' directories (the heads' hidden path nodes, and heads without
        native multipath). No walk of every block device, no listing of ``<sysfs>/block``.
        What the attach and health use of each is read (``brief``: :meth:`namespace`
        reads the rest). The subsystem is found among those that showed its NQN when this
        reader last looked (read again now); when none does, every subsystem's NQN is read
        again (a GPU host has one per pool: one file of each per pass, not per pool).
        """
        return self._by_nqn(subsysnqn,
                            lambda names: self._subsystem_heads(subsysnqn, names)) or {}

    def _subsystem_heads(self, subsysnqn: str,
                         names: list[str]) -> dict[int, NamespaceHead] | None:
        """The namespaces of the subsystems ``names`` that show ``subsysnqn`` (read now);
        None when none of them does."""
        out: dict[int, NamespaceHead] = {}
        root = f"{self.root}/class/nvme-subsystem"
        shown = False
        for sub in names:
            nqn = read_attr(f"{root}/{sub}/subsysnqn")
            self._subsystem_owners.set(sub, nqn)
            if nqn != subsysnqn:
                continue
            shown = True
            entries = _listdir(f"{root}/{sub}")
            # Multipath heads are children of the subsystem; heads without native
            # multipath, and the hidden path nodes nvme<S>c<C>n<N>, of their controller.
            heads = [(e, sub) for e in entries if _HEAD_RE.match(e)]
            paths: dict[str, list[str]] = {}
            for ctrl in (e for e in entries if _CTRL_RE.match(e)):
                for e in _listdir(f"{self.root}/class/nvme/{ctrl}"):
                    if _HEAD_RE.match(e):
                        heads.append((e, ctrl))
                    elif pm := _PATH_RE.match(e):
                        paths.setdefault(f"nvme{pm.group(1)}n{pm.group(3)}", []).append(e)
            seen: dict[str, str | None] = {f"{root}/{sub}/subsysnqn": subsysnqn}
            for name, parent in heads:
                head = self.namespace(name, paths, seen=seen, brief=True, parent=parent)
                if head is not None and head.nsid is not None and head.subsysnqn == subsysnqn:
                    out.setdefault(head.nsid, head)
        return out if shown else None

    def namespace_by_nsid(self, subsysnqn: str, nsid: int) -> NamespaceHead | None:
        """The namespace ``nsid`` of subsystem ``subsysnqn`` on this host, or None."""
        for name in self.namespace_names():
            if _read_int(self.root / "block" / name / "nsid") != nsid:
                continue
            head = self.namespace(name)
            if head is not None and head.nsid == nsid and head.subsysnqn == subsysnqn:
                return head
        return None

    def namespace_by_uuid(self, uuid: str) -> NamespaceHead | None:
        """The namespace whose ``uuid`` attribute equals ``uuid`` (case-insensitive)."""
        want = uuid.lower()
        for name in self.namespace_names():
            if (read_attr(self.root / "block" / name / "uuid") or "").lower() == want:
                head = self.namespace(name)
                if head is not None and (head.uuid or "").lower() == want:
                    return head
        return None
