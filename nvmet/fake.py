"""An in-memory configfs that behaves like the kernel's nvmet tree (for fast unit tests).

It implements :class:`nvmet.configfs.ConfigFS` and the kernel's rules as observed on
Debian's 6.1 kernel (see DESIGN.md "Kernel facts" and the shared errno table in
``tests/unit/nvmet/errno_table.py``, which runs against this fake *and* the real kernel):

* mkdir creates the default attribute files and default groups with the kernel's
  defaults (random ``device_uuid`` and ``attr_serial``, ``ana_groups/1`` on ports,
  ``namespaces``/``allowed_hosts`` on subsystems); EEXIST, EINVAL for bad names
  (nsid 0, port ids that are not u16, the discovery NQN), EPERM where configfs has
  no group to make;
* rmdir: EBUSY while linked (subsystem from a port, host from allowed_hosts),
  ENOTEMPTY with user-created children, EPERM for default groups; never recursive;
* namespace device_* while enabled: EBUSY; buffered_io while enabled: EINVAL;
  enable needs an openable device (:meth:`FakeConfigFS.add_device`);
* any addr_*/param_* write on a port with a linked subsystem: EACCES;
* symlinks only from allowed_hosts to hosts and from ports/*/subsystems to
  subsystems (EINVAL for the wrong kind, EPERM elsewhere or outside configfs);
  linking the first subsystem enables the port: EADDRNOTAVAIL for a non-local
  address, EADDRINUSE for a busy one, ENODEV for rdma on an address without an
  RDMA device;
* a zero-length write is EFAULT, as configfs returns.

With ``check_order`` on, it also raises :class:`OrderingViolation` when a sequence
breaks kvagent's ordering rules that the kernel itself does not enforce: a delete
after a create in the same session, or configuring a subsystem after linking it into
a port in the same session (links come last).
"""

from __future__ import annotations

import copy
import errno as E
import ipaddress
import random
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .configfs import Entry
from .nqn import DISCOVERY_NQN
from .reader import PROBE_NQN

_WO = object()  # marker: write-only attribute (revalidate_size)
_RANDOM_UUID = object()
_RANDOM_SERIAL = object()

#: Attribute files and default values per object kind, as Debian's 6.1 kernel creates them.
KERNEL_6_1: dict[str, dict[str, Any]] = {
    "host": {},
    "subsystem": {
        "attr_allow_any_host": "0",
        "attr_cntlid_max": "65519",
        "attr_cntlid_min": "1",
        "attr_model": "Linux",
        "attr_pi_enable": "0",
        "attr_qid_max": "128",
        "attr_serial": _RANDOM_SERIAL,
        "attr_version": "1.3",
    },
    "namespace": {
        "ana_grpid": "1",
        "buffered_io": "0",
        "device_nguid": "00000000-0000-0000-0000-000000000000",
        "device_path": "(null)",
        "device_uuid": _RANDOM_UUID,
        "enable": "0",
        "revalidate_size": _WO,
    },
    "port": {
        "addr_adrfam": "",
        "addr_traddr": "",
        "addr_treq": "not specified",
        "addr_trsvcid": "",
        "addr_trtype": "",
        "param_inline_data_size": "-1",
        "param_pi_enable": "0",
    },
    "ana_group": {"ana_state": "inaccessible"},
    "referral": {
        "addr_adrfam": "",
        "addr_portid": "0",
        "addr_traddr": "",
        "addr_treq": "not specified",
        "addr_trsvcid": "",
        "addr_trtype": "",
        "enable": "0",
    },
}


def _copy(profile: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    # Not deepcopy: it would copy the sentinels (_WO...) into objects that are not them.
    return {kind: dict(files) for kind, files in profile.items()}


def _profile_6_12() -> dict[str, dict[str, Any]]:
    p = _copy(KERNEL_6_1)
    p["host"] = {"dhchap_key": "", "dhchap_ctrl_key": "", "dhchap_hash": "hmac(sha256)",
                 "dhchap_dhgroup": "null"}
    p["subsystem"].update({"attr_firmware": "6.12.117", "attr_ieee_oui": "0x000000"})
    p["port"].update({"addr_tsas": "", "param_max_queue_size": "-1"})
    p["root"] = {"discovery_nqn": "nqn.2014-08.org.nvmexpress.discovery"}
    # NVME_TARGET_PASSTHRU: every subsystem has a passthru group (kvagent never uses it).
    p["passthru"] = {"admin_timeout": "0", "clear_ids": "0", "device_path": "(null)",
                     "enable": "0", "io_timeout": "0"}
    return p


#: Debian 13's 6.12 (NVME_TARGET_AUTH, TLS): checked against the capture in
#: tests/unit/nvmet/fixtures/kernel-6.12/profile.json (and against the running kernel by
#: the kernel tier's 6.12 group).
KERNEL_6_12 = _profile_6_12()


def _newer_profile() -> dict[str, dict[str, Any]]:
    p = _copy(KERNEL_6_12)
    p["subsystem"].update({"attr_vendor_id": "0x0", "attr_subsys_vendor_id": "0x0"})
    p["namespace"]["resv_enable"] = "0"
    p["port"]["param_mdts"] = "-1"
    return p


#: Not a real kernel: 6.12 plus attributes of later ones (reservations, vendor ids, mdts),
#: for feature-detection tests.
KERNEL_NEWER = _newer_profile()

#: Values that differ per object (random serials and uuids) or per kernel build.
_VARYING = {("subsystem", "attr_serial"), ("subsystem", "attr_firmware"),
            ("namespace", "device_uuid")}


#: Object kinds whose attribute files a profile gives ("root": the nvmet root itself;
#: "passthru": a subsystem's passthru group, on kernels with NVME_TARGET_PASSTHRU).
PROFILE_KINDS = ("root", "host", "subsystem", "passthru", "namespace", "port", "ana_group",
                 "referral")


def profile_problems(profile: Mapping[str, Mapping[str, Any]],
                     captured: Mapping[str, Any]) -> list[str]:
    """How a fake profile differs from a real kernel's capture (``capture_profile.py`` in
    the kernel tier: per kind, each file's mode and value); [] when it matches."""
    out = []
    for kind in PROFILE_KINDS:
        files, real = profile.get(kind) or {}, captured.get(kind) or {}
        for name in sorted(set(files) ^ set(real)):
            where = "only in the fake" if name in files else "only in the kernel"
            out.append(f"{kind}: {name} {where}")
        for name in sorted(set(files) & set(real)):
            value, got = files[name], real[name]["value"]
            if value is _WO:
                if not isinstance(got, dict):
                    out.append(f"{kind} {name}: write-only in the fake, readable in the kernel")
            elif (kind, name) not in _VARYING and value != got:
                out.append(f"{kind} {name}: fake {value!r}, kernel {got!r}")
    return out


_DEFAULT_GROUPS = {
    "root": {"hosts": "hosts", "ports": "ports", "subsystems": "subsystems"},
    "subsystem": {"allowed_hosts": "allowed_hosts", "namespaces": "namespaces"},
    "port": {"ana_groups": "ana_groups", "referrals": "referrals", "subsystems": "port_links"},
}
_MAKES = {"hosts": "host", "subsystems": "subsystem", "namespaces": "namespace",
          "ports": "port", "referrals": "referral", "ana_groups": "ana_group"}
_LINK_DIRS = {"allowed_hosts": "host", "port_links": "subsystem"}
_ADRFAMS = {"ipv4", "ipv6", "ib", "fc", "loop"}
_TRTYPES = {"rdma", "fc", "tcp", "loop"}
_TREQS = {"not specified", "required", "not required"}
_ANA_STATES = {"optimized", "non-optimized", "inaccessible", "persistent-loss", "change"}
_MAX_ANAGRPS = 128
_NR_QUEUES = 128
_INLINE_DEFAULT = {"tcp": "16384", "rdma": "4096"}
_WILDCARDS = {"0.0.0.0", "::"}  # noqa: S104 (addresses compared, nothing bound)


class OrderingViolation(AssertionError):
    """An operation sequence broke an ordering rule (raised only with ``check_order``)."""


@dataclass
class _File:
    value: str
    readable: bool = True
    writable: bool = True


@dataclass
class _Link:
    target: tuple[str, ...]


@dataclass
class _Dir:
    kind: str
    default: bool = False
    children: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    """One mutating call the fake saw: ``op`` (write, mkdir, rmdir, symlink, unlink),
    ``path``, ``value`` (written value or link target) and ``errno`` (None = success)."""

    op: str
    path: str
    value: str | None = None
    errno: int | None = None
    changed: bool | None = None  # writes: did the stored value change?


def _err(code: int, path: str) -> OSError:
    import os

    return OSError(code, os.strerror(code), path)


def _kstrtobool(value: str) -> bool | None:
    s = value
    if not s:
        return None
    c = s[0].lower()
    if c in "y1t":
        return True
    if c in "n0f":
        return False
    if c == "o" and len(s) > 1:
        if s[1].lower() == "n":
            return True
        if s[1].lower() == "f":
            return False
    return None


def _kstrtoul(value: str, bits: int) -> int | None:
    """Linux kstrtou*(s, 0): decimal, 0x hex or 0 octal, one trailing newline allowed."""
    s = value[:-1] if value.endswith("\n") else value
    if s.startswith("+"):
        s = s[1:]
    if not s or s.startswith(("-", "+")):
        return None
    try:
        if s.lower().startswith("0x"):
            n = int(s[2:], 16)
        elif s.startswith("0") and len(s) > 1:
            n = int(s[1:], 8)
        else:
            if not s.isdigit():
                return None
            n = int(s)
    except ValueError:
        return None
    return n if n < (1 << bits) else None


def _kstrtoint(value: str) -> int | None:
    s = value.strip()
    neg = s.startswith("-")
    n = _kstrtoul(s[1:] if neg else s, 31)
    return None if n is None else (-n if neg else n)


def _sscanf_hu(value: str) -> int | None:
    m = re.match(r"^\s*([+-]?\d+)", value)
    return int(m.group(1)) % 65536 if m else None


def _sscanf_s(value: str) -> str | None:
    parts = value.split()
    return parts[0] if parts else None


def _printable(s: str) -> bool:
    return all(0x20 <= ord(c) <= 0x7E for c in s)


class FakeConfigFS:
    """In-memory nvmet configfs; see the module docstring for the rules it enforces.

    ``local_addresses``: addresses a port may listen on (EADDRNOTAVAIL otherwise);
    ``rdma_addresses``: the subset served by an RDMA device (ENODEV otherwise; loopback
    needs none); ``devices``: path -> ``block`` | ``file`` | ``file-nodirect`` | ``dir`` |
    ``char`` for namespace enable; ``profile``: attribute files per object kind.
    """

    def __init__(self, *, local_addresses: Iterable[str] = ("127.0.0.1", "::1"),
                 rdma_addresses: Iterable[str] = (),
                 devices: Mapping[str, str] | None = None,
                 profile: Mapping[str, Mapping[str, Any]] | None = None,
                 check_order: bool = False, seed: int | None = 0):
        self.local_addresses = set(local_addresses)
        self.rdma_addresses = set(rdma_addresses)
        self.devices: dict[str, str] = dict(devices or {})
        self.profile = {k: dict(v) for k, v in (profile or KERNEL_6_1).items()}
        self.check_order = check_order
        self.writes = 0
        self.reads = 0
        #: How many times each attribute file was read (path -> count).
        self.files_read: Counter[str] = Counter()
        self.ops: list[Op] = []
        self.occupied: set[tuple[str, str, str]] = set()
        self._bound: dict[tuple[str, ...], tuple[str, str, str]] = {}
        self._rng = random.Random(seed)  # noqa: S311 (test ids, not secrets)
        self._session_created = False
        self._session_exported: set[str] = set()
        self._probe_ports: set[str] = set()
        self._changed: bool | None = None
        self.root = _Dir("root", default=True)
        self._add_defaults(self.root, "root")

    # ------------------------------------------------------------ public helpers

    def add_device(self, path: str, kind: str = "block") -> None:
        """Make ``path`` openable by namespace enable (``kind`` as in the class doc)."""
        self.devices[path] = kind

    def occupy(self, traddr: str, trsvcid: str, trtype: str = "tcp") -> None:
        """Pretend another process listens on ``traddr:trsvcid`` (EADDRINUSE for ports)."""
        self.occupied.add((trtype, traddr, trsvcid))

    def start_session(self) -> None:
        """Forget the ordering state (call before applying a new plan) and clear ``ops``."""
        self._session_created = False
        self._session_exported = set()
        self._probe_ports = set()
        self.ops = []

    def clone(self) -> FakeConfigFS:
        """A deep copy (state, devices, addresses), with counters and ops reset."""
        twin = copy.deepcopy(self)
        twin.writes = 0
        twin.reads = 0
        twin.files_read = Counter()
        twin.ops = []
        return twin

    def poke(self, path: str, value: str) -> None:
        """Set an attribute's value without any kernel rule (building fixtures only)."""
        node = self._lookup(path)
        if not isinstance(node, _File):
            raise _err(E.ENOENT, path)
        node.value = value

    def is_enabled_port(self, port_id: str) -> bool:
        """True while the port has at least one subsystem linked (it listens)."""
        return bool(self._port_links(("ports", port_id)))

    # ------------------------------------------------------------ ConfigFS interface

    def read(self, path: str) -> str:
        self.reads += 1
        self.files_read[path] += 1
        node = self._lookup(path)
        if isinstance(node, (_Dir, _Link)):
            raise _err(E.EISDIR, path)
        if not node.readable:
            raise _err(E.EACCES, path)
        return node.value

    def write(self, path: str, value: str) -> None:
        self._mutate("write", path, value, self._write)

    def mkdir(self, path: str) -> None:
        self._mutate("mkdir", path, None, self._mkdir)

    def rmdir(self, path: str) -> None:
        self._mutate("rmdir", path, None, self._rmdir)

    def symlink(self, target: str, path: str) -> None:
        self._mutate("symlink", path, target, lambda p, t: self._symlink(t, p))

    def unlink(self, path: str) -> None:
        self._mutate("unlink", path, None, self._unlink)

    def list(self, path: str) -> list[Entry]:
        self.reads += 1
        node = self._lookup(path)
        if not isinstance(node, _Dir):
            raise _err(E.ENOTDIR, path)
        out = []
        for name, child in node.children.items():
            if isinstance(child, _Dir):
                out.append(Entry(name, "dir"))
            elif isinstance(child, _Link):
                out.append(Entry(name, "link"))
            else:
                out.append(Entry(name, "file", child.readable, child.writable))
        return sorted(out, key=lambda e: e.name)

    def exists(self, path: str) -> bool:
        try:
            self._lookup(path)
        except OSError:
            return False
        return True

    def is_link(self, path: str) -> bool:
        try:
            return isinstance(self._lookup(path), _Link)
        except OSError:
            return False

    def read_attrs(self, path: str, names: Iterable[str]) -> dict[str, str]:
        out = {}
        for name in names:
            full = f"{path}/{name}"
            try:
                out[name] = self.read(full)
            except FileNotFoundError:
                if not isinstance(self._lookup(path), _Dir):  # ENOENT when path is gone
                    raise _err(E.ENOTDIR, path) from None
        return out

    def read_each(self, path: str, children: Sequence[str],
                  names: Iterable[str]) -> list[dict[str, str]]:
        names = tuple(names)
        return [self.read_attrs(f"{path}/{c}", names) for c in children]

    def children(self, path: str) -> tuple[list[str], list[str], list[str]]:
        entries = self.list(path)
        return ([e.name for e in entries if e.kind == "dir"],
                [e.name for e in entries if e.kind == "link"],
                [e.name for e in entries if e.kind == "file"])

    def readlink(self, path: str) -> str:
        node = self._lookup(path)
        if not isinstance(node, _Link):
            raise _err(E.EINVAL, path)
        return "/".join(node.target)

    # ------------------------------------------------------------ internals

    def _mutate(self, op: str, path: str, value: str | None, fn: Any) -> None:
        self.writes += 1
        if self.check_order:
            self._check_order(op, path)
        self._changed: bool | None = None
        try:
            fn(path, value)
        except OSError as exc:
            self.ops.append(Op(op, path, value, exc.errno))
            raise
        self.ops.append(Op(op, path, value, changed=self._changed))
        if op in ("mkdir", "symlink") and not self._probing(path):
            self._session_created = True
        if op == "symlink":
            parts = self._parts(path)
            if len(parts) == 4 and parts[0] == "ports" and parts[2] == "subsystems":
                self._session_exported.add(self._parts(value or "")[-1])

    def _probing(self, path: str) -> bool:
        """Whether ``path`` is one of the nvmet library's throw-away feature-probe objects
        (nvmet.features): named PROBE_NQN, or a port with the highest free id."""
        parts = self._parts(path)
        if PROBE_NQN in path:
            return True
        if len(parts) >= 2 and parts[0] == "ports":
            if len(parts) == 2 and not self.exists(path):
                used = {int(e.name) for e in self.list("ports") if e.name.isdigit()}
                free = max(i for i in range(65535, 0, -1) if i not in used)
                if parts[1] == str(free):
                    self._probe_ports.add(parts[1])
            return parts[1] in self._probe_ports
        return False

    def _check_order(self, op: str, path: str) -> None:
        if self._probing(path):
            return  # the nvmet library's throw-away feature probe (nvmet.features)
        parts = self._parts(path)
        if op in ("rmdir", "unlink") and self._session_created:
            raise OrderingViolation(f"{op} {path} after a create in the same session: "
                                    "deletes must all come before creates")
        if (len(parts) >= 3 and parts[0] == "subsystems" and parts[1] in self._session_exported
                and parts[-1] != "revalidate_size"):
            raise OrderingViolation(f"{op} {path} configures subsystem {parts[1]} after it was "
                                    "linked into a port: port links must come last")

    @staticmethod
    def _parts(path: str) -> tuple[str, ...]:
        return tuple(p for p in path.split("/") if p)

    def _lookup(self, path: str) -> Any:
        parts = self._parts(path)
        if path.startswith("/") or ".." in parts:
            raise _err(E.EINVAL, path)
        node: Any = self.root
        for i, name in enumerate(parts):
            if isinstance(node, _Link):
                node = self._resolve(node)
            if not isinstance(node, _Dir):
                raise _err(E.ENOTDIR, path)
            if name not in node.children:
                raise _err(E.ENOENT, path)
            node = node.children[name]
            if isinstance(node, _Link) and i < len(parts) - 1:
                node = self._resolve(node)
        return node

    def _resolve(self, link: _Link) -> Any:
        return self._lookup("/".join(link.target))

    def _parent(self, path: str) -> tuple[_Dir, str]:
        parts = self._parts(path)
        if not parts:
            raise _err(E.EPERM, path)
        parent = self._lookup("/".join(parts[:-1]))
        if isinstance(parent, _Link):
            parent = self._resolve(parent)
        if not isinstance(parent, _Dir):
            raise _err(E.ENOTDIR, path)
        return parent, parts[-1]

    def _add_defaults(self, node: _Dir, kind: str) -> None:
        for name, value in self.profile.get(kind, {}).items():
            if value is _WO:
                node.children[name] = _File("", readable=False, writable=True)
            elif value is _RANDOM_UUID:
                node.children[name] = _File(str(uuid.UUID(int=self._rng.getrandbits(128),
                                                          version=4)))
            elif value is _RANDOM_SERIAL:
                node.children[name] = _File(f"{self._rng.getrandbits(80):020x}")
            else:
                node.children[name] = _File(str(value))
        groups = dict(_DEFAULT_GROUPS.get(kind, {}))
        if kind == "subsystem" and "passthru" in self.profile:
            groups["passthru"] = "passthru"
        for name, gkind in groups.items():
            group = _Dir(gkind, default=True)
            node.children[name] = group
            if gkind == "passthru":
                self._add_defaults(group, "passthru")
            if gkind == "ana_groups":
                grp = _Dir("ana_group", default=True)
                grp.children["ana_state"] = _File("optimized")
                group.children["1"] = grp

    # -- mkdir / rmdir

    def _mkdir(self, path: str, _value: Any) -> None:
        parent, name = self._parent(path)
        if name in parent.children:
            raise _err(E.EEXIST, path)
        kind = _MAKES.get(parent.kind)
        if kind is None:
            raise _err(E.EPERM, path)
        if kind == "subsystem" and name == DISCOVERY_NQN:
            raise _err(E.EINVAL, path)
        if kind == "namespace":
            nsid = _kstrtoul(name, 32)
            if nsid is None or nsid in (0, 0xFFFFFFFF):
                raise _err(E.EINVAL, path)
        if kind == "port" and _kstrtoul(name, 16) is None:
            raise _err(E.EINVAL, path)
        if kind == "ana_group":
            grpid = _kstrtoul(name, 32)
            if grpid is None or grpid <= 1 or grpid > _MAX_ANAGRPS:
                raise _err(E.EINVAL, path)
        node = _Dir(kind)
        self._add_defaults(node, kind)
        parent.children[name] = node

    def _links_to(self, target: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = []
        for sname, sub in self.root.children["subsystems"].children.items():
            for lname, link in sub.children["allowed_hosts"].children.items():
                if link.target == target:
                    found.append(("subsystems", sname, "allowed_hosts", lname))
        for pname, port in self.root.children["ports"].children.items():
            for lname, link in port.children["subsystems"].children.items():
                if link.target == target:
                    found.append(("ports", pname, "subsystems", lname))
        return found

    @staticmethod
    def _has_user_children(node: _Dir) -> bool:
        for child in node.children.values():
            if isinstance(child, _Link):
                return True
            if isinstance(child, _Dir) and (
                    not child.default or FakeConfigFS._has_user_children(child)):
                return True
        return False

    def _rmdir(self, path: str, _value: Any) -> None:
        parent, name = self._parent(path)
        node = parent.children.get(name)
        if node is None:
            raise _err(E.ENOENT, path)
        if not isinstance(node, _Dir):
            raise _err(E.ENOTDIR, path)
        if node.default:
            raise _err(E.EPERM, path)
        if self._links_to(self._parts(path)):
            raise _err(E.EBUSY, path)
        if self._has_user_children(node):
            raise _err(E.ENOTEMPTY, path)
        del parent.children[name]

    # -- symlink / unlink

    def _port_links(self, port: tuple[str, ...]) -> Iterable[str]:
        node = self._lookup("/".join(port))
        return list(node.children["subsystems"].children)

    def _symlink(self, target: str, path: str) -> None:
        parent, name = self._parent(path)
        if name in parent.children:
            raise _err(E.EEXIST, path)
        if parent.kind not in _LINK_DIRS:
            raise _err(E.EPERM, path)
        if target.startswith("/"):
            raise _err(E.EPERM, path)
        tparts = self._parts(target)
        try:
            tnode = self._lookup(target)
        except OSError as exc:
            raise _err(exc.errno or E.ENOENT, path) from None
        want = _LINK_DIRS[parent.kind]
        if not isinstance(tnode, _Dir) or tnode.kind != want:
            raise _err(E.EINVAL, path)
        if any(link.target == tparts for link in parent.children.values()):
            raise _err(E.EEXIST, path)
        parts = self._parts(path)
        owner = self._lookup("/".join(parts[:2]))
        if want == "host":
            if owner.children["attr_allow_any_host"].value == "1":
                raise _err(E.EINVAL, path)
        elif not parent.children:
            self._enable_port(tuple(parts[:2]), owner, path)
        parent.children[name] = _Link(tparts)

    def _enable_port(self, key: tuple[str, ...], port: _Dir, path: str) -> None:
        def val(n: str) -> str:
            return port.children[f"addr_{n}"].value

        trtype, adrfam, traddr, trsvcid = val("trtype"), val("adrfam"), val("traddr"), \
            val("trsvcid")
        if trtype not in _TRTYPES:
            raise _err(E.EINVAL, path)
        if trtype in ("loop", "fc"):
            return
        if adrfam not in ("ipv4", "ipv6"):
            raise _err(E.EINVAL, path)
        try:
            ip = ipaddress.ip_address(traddr)
        except ValueError:
            raise _err(E.EINVAL, path) from None
        if (ip.version == 4) != (adrfam == "ipv4") or _kstrtoul(trsvcid, 16) is None:
            raise _err(E.EINVAL, path)
        inline = port.children.get("param_inline_data_size")
        if inline is not None and inline.value.startswith("-"):
            inline.value = _INLINE_DEFAULT[trtype]
        if traddr not in _WILDCARDS and traddr not in self.local_addresses:
            raise _err(E.EADDRNOTAVAIL, path)
        if (trtype == "rdma" and not ip.is_loopback and traddr not in _WILDCARDS
                and traddr not in self.rdma_addresses):
            raise _err(E.ENODEV, path)
        me = (trtype, traddr, str(_kstrtoul(trsvcid, 16)))
        for other in [*self._bound.values(), *self.occupied]:
            same_port = other[0] == me[0] and other[2] == me[2]
            if same_port and (other[1] == me[1] or me[1] in _WILDCARDS
                              or other[1] in _WILDCARDS):
                raise _err(E.EADDRINUSE, path)
        self._bound[key] = me

    def _unlink(self, path: str, _value: Any) -> None:
        parent, name = self._parent(path)
        node = parent.children.get(name)
        if node is None:
            raise _err(E.ENOENT, path)
        if isinstance(node, _Dir):
            raise _err(E.EISDIR, path)
        if isinstance(node, _File):
            raise _err(E.EPERM, path)
        del parent.children[name]
        parts = self._parts(path)
        if parent.kind == "port_links" and not parent.children:
            self._bound.pop(tuple(parts[:2]), None)

    # -- write

    def _write(self, path: str, value: str) -> None:
        parent, name = self._parent(path)
        node = parent.children.get(name)
        if node is None:
            raise _err(E.ENOENT, path)
        if isinstance(node, (_Dir, _Link)):
            raise _err(E.EISDIR, path)
        if not node.writable:
            raise _err(E.EACCES, path)
        if value == "":
            raise _err(E.EFAULT, path)
        store = getattr(self, f"_store_{parent.kind}", None)
        new = store(parent, path, name, value) if store else value.rstrip("\n")
        self._changed = new is not None and new != node.value
        if new is not None:
            node.value = new

    def _store_host(self, host: _Dir, path: str, name: str, value: str) -> str | None:
        # As Debian 13's 6.12 does (tests/unit/nvmet/fixtures/kernel-6.12/): a secret is
        # stored as given once it starts with DHHC-1:<number>: (nothing else is checked);
        # an empty line (clearing) fails, dhchap_key with EIO, dhchap_ctrl_key with EINVAL.
        line = value.split("\n", 1)[0]
        if name in ("dhchap_key", "dhchap_ctrl_key"):
            if not re.match(r"DHHC-1:\d+:.", line):
                raise _err(E.EIO if name == "dhchap_key" else E.EINVAL, path)
            return line
        if name == "dhchap_hash":
            if line not in ("hmac(sha256)", "hmac(sha384)", "hmac(sha512)"):
                raise _err(E.EIO, path)
            return line
        if name == "dhchap_dhgroup":
            if line not in ("null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144",
                            "ffdhe8192"):
                raise _err(E.EIO, path)
            return line
        return line

    def _store_namespace(self, ns: _Dir, path: str, name: str, value: str) -> str | None:
        enabled = ns.children["enable"].value == "1"
        if name == "device_path":
            if enabled:
                raise _err(E.EBUSY, path)
            line = value.split("\n", 1)[0]
            if not line:
                raise _err(E.EINVAL, path)
            return line
        if name in ("device_uuid", "device_nguid"):
            if enabled:
                raise _err(E.EBUSY, path)
            text = value.strip()
            if name == "device_nguid":
                text = text.replace("-", "").replace(":", "")
            try:
                return str(uuid.UUID(text))
            except ValueError:
                raise _err(E.EINVAL, path) from None
        if name in ("buffered_io", "resv_enable"):
            flag = _kstrtobool(value)
            if flag is None or enabled:
                raise _err(E.EINVAL, path)
            return "1" if flag else "0"
        if name == "ana_grpid":
            grp = _kstrtoul(value.strip(), 32)
            if grp is None or not 1 <= grp <= _MAX_ANAGRPS:
                raise _err(E.EINVAL, path)
            return str(grp)
        if name == "enable":
            flag = _kstrtobool(value)
            if flag is None:
                raise _err(E.EINVAL, path)
            if flag and not enabled:
                self._open_device(ns, path)
            return "1" if flag else "0"
        if name == "revalidate_size":
            flag = _kstrtobool(value)
            if not flag or not enabled:
                raise _err(E.EINVAL, path)
            return None
        return value.rstrip("\n")

    def _open_device(self, ns: _Dir, path: str) -> None:
        dev = ns.children["device_path"].value
        if dev == "(null)":
            raise _err(E.EINVAL, path)
        kind = self.devices.get(dev)
        if kind is None:
            raise _err(E.ENOENT, path)
        if kind == "dir":
            raise _err(E.EISDIR, path)
        if kind == "char":
            raise _err(E.EINVAL, path)
        if kind == "file-nodirect" and ns.children["buffered_io"].value != "1":
            raise _err(E.EINVAL, path)

    def _store_subsystem(self, sub: _Dir, path: str, name: str, value: str) -> str | None:
        line = value.split("\n", 1)[0]
        if name in ("attr_allow_any_host", "attr_pi_enable"):
            flag = _kstrtobool(value)
            if flag is None:
                raise _err(E.EINVAL, path)
            if name == "attr_allow_any_host" and flag and sub.children["allowed_hosts"].children:
                raise _err(E.EINVAL, path)
            return "1" if flag else "0"
        if name == "attr_version":
            m = re.match(r"^\s*(-?\d+)\.(-?\d+)(?:\.(-?\d+))?", value)
            if not m:
                raise _err(E.EINVAL, path)
            major, minor, tertiary = (int(g) if g else 0 for g in m.groups())
            return f"{major}.{minor}.{tertiary}" if tertiary else f"{major}.{minor}"
        if name == "attr_serial":
            if not line or len(line) > 20 or not _printable(line):
                raise _err(E.EINVAL, path)
            return line.ljust(20)
        if name == "attr_model":
            if not line or len(line) > 40 or not _printable(line):
                raise _err(E.EINVAL, path)
            return line
        if name == "attr_qid_max":
            n = _sscanf_hu(value)
            if n is None or not 1 <= n <= _NR_QUEUES:
                raise _err(E.EINVAL, path)
            return str(n)
        if name in ("attr_cntlid_min", "attr_cntlid_max"):
            n = _sscanf_hu(value)
            lo = int(sub.children["attr_cntlid_min"].value)
            hi = int(sub.children["attr_cntlid_max"].value)
            if n is None or n == 0:
                raise _err(E.EINVAL, path)
            if (name == "attr_cntlid_min" and n > hi) or (name == "attr_cntlid_max" and n < lo):
                raise _err(E.EINVAL, path)
            return str(n)
        return line

    def _store_port(self, port: _Dir, path: str, name: str, value: str) -> str | None:
        parts = self._parts(path)
        if self.is_enabled_port(parts[1]):
            raise _err(E.EACCES, path)
        if "addr_tsas" in port.children:
            return self._store_port_security(port, path, name, value)
        return self._store_address(path, name, value)

    def _store_port_security(self, port: _Dir, path: str, name: str, value: str) -> str | None:
        """NVMe/TCP TLS (6.12): writing trtype resets tsas; tsas is TCP-only and sets
        treq (tls1.3: required unless set; none: not specified); treq 'not specified' is
        refused under TLS."""
        kids = port.children
        word = value.strip()
        if name == "addr_tsas":
            if kids["addr_trtype"].value != "tcp" or word not in ("none", "tls1.3"):
                raise _err(E.EINVAL, path)
            treq = kids["addr_treq"]
            if word == "none":
                treq.value = "not specified"
            elif treq.value == "not specified":
                treq.value = "required"
            return word
        if (name == "addr_treq" and kids["addr_tsas"].value == "tls1.3"
                and value.rstrip("\n") == "not specified"):
            raise _err(E.EINVAL, path)
        stored = self._store_address(path, name, value)
        if name == "addr_trtype":
            kids["addr_tsas"].value = "none" if stored == "tcp" else "reserved"
        return stored

    def _store_referral(self, ref: _Dir, path: str, name: str, value: str) -> str | None:
        if name == "enable":
            flag = _kstrtobool(value)
            if flag is None:
                raise _err(E.EINVAL, path)
            return "1" if flag else "0"
        if ref.children["enable"].value == "1":
            raise _err(E.EACCES, path)
        return self._store_address(path, name, value)

    @staticmethod
    def _store_address(path: str, name: str, value: str) -> str | None:
        word = value.strip()
        if name == "addr_adrfam":
            if word not in _ADRFAMS:
                raise _err(E.EINVAL, path)
            return word
        if name == "addr_trtype":
            if word not in _TRTYPES:
                raise _err(E.EINVAL, path)
            return word
        if name == "addr_treq":
            if value.rstrip("\n") not in _TREQS:
                raise _err(E.EINVAL, path)
            return value.rstrip("\n")
        if name in ("addr_traddr", "addr_trsvcid"):
            limit = 256 if name == "addr_traddr" else 32
            token = _sscanf_s(value)
            if len(value) > limit or token is None:
                raise _err(E.EINVAL, path)
            return token
        if name == "addr_portid":
            n = _kstrtoul(word, 16)
            if n is None:
                raise _err(E.EINVAL, path)
            return str(n)
        if name == "param_pi_enable":
            flag = _kstrtobool(value)
            if flag is None:
                raise _err(E.EINVAL, path)
            return "1" if flag else "0"
        if name.startswith("param_"):
            n = _kstrtoint(value)
            if n is None:
                raise _err(E.EINVAL, path)
            return str(n)
        return value.rstrip("\n")

    def _store_ana_group(self, grp: _Dir, path: str, name: str, value: str) -> str | None:
        if name == "ana_state":
            word = value.strip()
            if word not in _ANA_STATES:
                raise _err(E.EINVAL, path)
            return word
        return value.rstrip("\n")
