"""Pure planning: ``plan(desired, live, scope) -> [Action]``. No I/O.

Order (DESIGN.md "Kernel facts"): deletes first, bottom-up (port links, ports,
allowed_hosts links, namespaces (disable, rmdir), subsystems, hosts); then creates and
changes top-down (hosts, subsystems + attributes, namespaces with their device
attributes then ``enable``, allowed_hosts links, ports + addresses, and the
port -> subsystem links last). A namespace whose device attributes change is disabled,
written and enabled again; a port whose address or parameters change while a subsystem
is linked is deleted and created again (the kernel refuses the write with EACCES).
Only attributes the desired tree mentions, and that differ, are written: converged
input gives an empty plan.

Ownership: the caller names a :class:`Scope`. Objects outside it are never deleted or
modified; desired objects outside it are an error (:class:`~nvmet.errors.OutOfScope`);
a change that would have to touch a foreign object raises
:class:`~nvmet.errors.ScopeConflict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .configfs import join
from .errors import FeatureMissing, OutOfScope, PlanError, ScopeConflict
from .model import (
    ADDR_ORDER,
    EMPTY,
    NS_DISABLED_ONLY,
    FrozenMap,
    Namespace,
    Port,
    Referral,
    Subsystem,
    Tree,
    ns_shape,
)
from .nqn import InvalidNQN, validate_nqn
from .readbase import Features
from .reader import FEATURE_NAMES

OPS = ("mkdir", "rmdir", "write", "symlink", "unlink")
MAX_NSID = 0xFFFFFFFE
MAX_ANA_GROUPS = 128
#: The state of ANA group 1 on a port nvmet just created (nvmet_ports_make).
DEFAULT_ANA_STATE = "optimized"


@dataclass(frozen=True)
class Action:
    """One configfs operation.

    ``path`` is relative to the nvmet root; ``value`` is the written value, or the link
    target (also relative to the root) for ``symlink``. ``key`` names what the action
    makes, changes or removes, and ``after`` the keys it needs: when an action fails the
    applier skips every later action whose key or ``after`` is (under) a failed key.
    ``missing_ok``: ENOENT counts as success (a disable before a delete).
    ``context`` carries facts for error hints (port address, device path).
    """

    op: str
    path: str
    value: str | None = None
    description: str = ""
    key: str = ""
    after: frozenset[str] = frozenset()
    missing_ok: bool = False
    context: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}")
        if not self.key:
            object.__setattr__(self, "key", self.path)
        object.__setattr__(self, "after", frozenset(self.after))
        object.__setattr__(self, "context", FrozenMap(self.context))

    def __str__(self) -> str:
        return self.description or f"{self.op} {self.path}" + (
            f" = {self.value!r}" if self.value is not None else "")


@dataclass(frozen=True)
class NameSet:
    """A set of names given as exact names and/or prefixes (or everything)."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    everything: bool = False

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return self.everything or name in self.names or name.startswith(self.prefixes)


@dataclass(frozen=True)
class Scope:
    """What the caller owns: subsystem NQNs, port ids (as strings) and host NQNs."""

    subsystems: NameSet = NameSet()
    ports: NameSet = NameSet()
    hosts: NameSet = NameSet()

    @classmethod
    def everything(cls) -> Scope:
        """Own the whole tree (tests, or a host where nothing else uses nvmet)."""
        return cls(NameSet(everything=True), NameSet(everything=True), NameSet(everything=True))

    @classmethod
    def owned(cls, *, subsystem_prefix: str | None = None, subsystems: Iterable[str] = (),
              port_ids: Iterable[int | str] = (), hosts: Iterable[str] = ()) -> Scope:
        """Subsystems named ``<subsystem_prefix>:...`` (and ``subsystems``), these port ids
        and these host NQNs."""
        prefixes: tuple[str, ...] = ()
        if subsystem_prefix:
            prefixes = (subsystem_prefix if subsystem_prefix.endswith(":")
                        else subsystem_prefix + ":",)
        return cls(NameSet(frozenset(subsystems), prefixes),
                   NameSet(frozenset(str(p) for p in port_ids)),
                   NameSet(frozenset(hosts)))

    def owns_subsystem(self, nqn: str) -> bool:
        return nqn in self.subsystems

    def owns_port(self, port_id: int) -> bool:
        return str(port_id) in self.ports

    def owns_host(self, nqn: str) -> bool:
        return nqn in self.hosts


def _ns_path(nqn: str, nsid: int) -> str:
    return join("subsystems", nqn, "namespaces", str(nsid))


class _Planner:
    def __init__(self, desired: Tree, live: Tree, scope: Scope, features: Features | None,
                 revalidate: Iterable[tuple[str, int]]):
        self.d, self.live, self.scope, self.features = desired, live, scope, features
        self.revalidate = list(revalidate)
        self.problems: list[str] = []
        self.conflicts: list[str] = []
        # phases
        self.unlink_ports: list[Action] = []
        self.rm_ports: list[Action] = []
        self.unlink_hosts: list[Action] = []
        self.rm_namespaces: list[Action] = []
        self.rm_subsystems: list[Action] = []
        self.rm_hosts: list[Action] = []
        self.mk_hosts: list[Action] = []
        self.mk_subsystems: list[Action] = []
        self.mk_namespaces: list[Action] = []
        self.link_hosts: list[Action] = []
        self.mk_ports: list[Action] = []
        self.link_ports: list[Action] = []
        self.final: list[Action] = []
        # facts
        self.recreated_ports: set[int] = set()
        self.port_write_keys: dict[int, set[str]] = {}
        self.enable_keys: dict[tuple[str, int], str] = {}
        self.ns_shapes: set[tuple[object, ...]] = set()

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        d, scope = self.d, self.scope
        for nqn, host in d.hosts.items():
            self._check_nqn("host", nqn)
            if not scope.owns_host(nqn):
                self.problems.append(f"host {nqn} is outside the scope this caller owns")
            self._need_features("host", host.attrs, join("hosts", nqn))
        for nqn, sub in d.subsystems.items():
            self._check_nqn("subsystem", nqn)
            if not scope.owns_subsystem(nqn):
                self.problems.append(f"subsystem {nqn} is outside the scope this caller owns")
            self._need_features("subsystem", {f"attr_{k}": v for k, v in sub.attrs.items()},
                                join("subsystems", nqn))
            for h in sorted(sub.allowed_hosts):
                if h not in d.hosts:
                    self.problems.append(f"subsystem {nqn} allows host {h}, which the desired "
                                         "tree does not declare in hosts")
            if sub.allowed_hosts and sub.attrs.get("allow_any_host") == "1":
                self.problems.append(f"subsystem {nqn} has allow_any_host=1 and allowed_hosts; "
                                     "the kernel refuses that combination")
            live_sub = self.live.subsystems.get(nqn)
            checked = self.ns_shapes
            for nsid, ns in sub.namespaces.items():
                if not 1 <= nsid <= MAX_NSID:
                    self.problems.append(f"subsystem {nqn}: nsid {nsid} is not in 1..{MAX_NSID}")
                shape = ns_shape(ns)  # the same for nearly every namespace
                if shape not in checked:
                    self._need_features("namespace", ns.files(), (nqn, nsid))
                    checked.add(shape)
                if ns.enable and ns.device_path is None and (
                        live_sub is None or nsid not in live_sub.namespaces):
                    self.problems.append(f"subsystem {nqn} namespace {nsid}: enable needs a "
                                         "device_path")
        for pid, port in d.ports.items():
            if not 0 <= pid <= 65535:
                self.problems.append(f"port id {pid} is not in 0..65535")
            if not scope.owns_port(pid):
                self.problems.append(f"port {pid} is outside the scope this caller owns")
            self._need_features("port", {**{f"addr_{k}": v for k, v in port.addr.items()},
                                         **{f"param_{k}": v for k, v in port.params.items()}},
                                join("ports", str(pid)))
            for nqn in sorted(port.subsystems):
                if nqn not in d.subsystems:
                    self.problems.append(f"port {pid} links subsystem {nqn}, which the desired "
                                         "tree does not declare")
            for grp in (port.ana_groups or {}):
                if not 1 <= grp <= MAX_ANA_GROUPS:
                    self.problems.append(f"port {pid}: ANA group {grp} is not in "
                                         f"1..{MAX_ANA_GROUPS}")
            for ref in (port.referrals or {}).values():
                self._need_features("referral", {f"addr_{k}": v for k, v in ref.addr.items()},
                                    join("ports", str(pid), "referrals", ref.name))
        if self.problems:
            out_of_scope = all("outside the scope" in p for p in self.problems)
            cls = OutOfScope if out_of_scope else PlanError
            raise cls("desired nvmet state is invalid: " + "; ".join(self.problems),
                      hint="fix the desired state; nothing was changed")

    def _check_nqn(self, what: str, nqn: str) -> None:
        try:
            validate_nqn(nqn)
        except InvalidNQN as exc:
            self.problems.append(f"{what} NQN {nqn!r} {exc}")

    def _need_features(self, kind: str, files: Mapping[str, str],
                       where: str | tuple[str, int]) -> None:
        """FeatureMissing for the first file of ``files`` this kernel lacks; ``where``: the
        object's path, or (subsystem NQN, nsid) for a namespace."""
        if self.features is None:
            return
        for name in sorted(files):
            if self.features.has(kind, name) is False:
                path = where if isinstance(where, str) else _ns_path(*where)
                raise FeatureMissing(FEATURE_NAMES.get(name, f"attribute {name}"), name, kind,
                                     self.features.kernel, path=path)

    # ------------------------------------------------------------------ deletes

    def plan_deletes(self) -> None:
        d, live, scope = self.d, self.live, self.scope
        # ports in scope: stale links, ports to delete or recreate
        for pid, lport in live.ports.items():
            if not scope.owns_port(pid):
                continue
            dport = d.ports.get(pid)
            owned_links = sorted(n for n in lport.subsystems if scope.owns_subsystem(n))
            foreign_links = sorted(n for n in lport.subsystems if not scope.owns_subsystem(n))
            remove = dport is None or (bool(lport.subsystems) and self._port_differs(dport,
                                                                                     lport))
            if remove and foreign_links:
                why = "is not desired" if dport is None else "must be re-created"
                self.conflicts.append(f"port {pid} {why} but links foreign subsystems "
                                      f"{foreign_links}")
                continue
            keep = set() if remove else set(dport.subsystems) if dport else set()
            link_keys = []
            for nqn in owned_links:
                if nqn not in keep:
                    a = self._unlink_port(pid, nqn, lport)
                    link_keys.append(a.key)
            if not remove:
                self._plan_port_children_deletes(pid, lport, dport)
                continue
            if dport is not None:
                self.recreated_ports.add(pid)
            child_keys = list(link_keys)
            for name in sorted(lport.referrals or {}):
                path = join("ports", str(pid), "referrals", name)
                self.rm_ports.append(Action("rmdir", path, description=f"remove referral "
                                            f"{name} of port {pid}"))
                child_keys.append(path)
            for grp in sorted(lport.ana_groups or {}):
                if grp != 1:
                    path = join("ports", str(pid), "ana_groups", str(grp))
                    self.rm_ports.append(Action("rmdir", path, description=f"remove ANA group "
                                                f"{grp} of port {pid}"))
                    child_keys.append(path)
            why = "re-create it with the new address" if dport else "not desired"
            self.rm_ports.append(Action("rmdir", join("ports", str(pid)),
                                        description=f"remove port {pid} ({why})",
                                        after=frozenset(child_keys)))
        # subsystems in scope
        for nqn, lsub in live.subsystems.items():
            if not scope.owns_subsystem(nqn):
                continue
            dsub = d.subsystems.get(nqn)
            foreign_ports = sorted(pid for pid, p in live.ports.items()
                                   if nqn in p.subsystems and not scope.owns_port(pid))
            if dsub is None and foreign_ports:
                self.conflicts.append(f"subsystem {nqn} is not desired but foreign ports "
                                      f"{foreign_ports} link it")
                continue
            after: set[str] = {
                join("ports", str(pid), "subsystems", nqn)
                for pid, p in live.ports.items() if nqn in p.subsystems}
            for host in sorted(lsub.allowed_hosts):
                if dsub is None or host not in dsub.allowed_hosts:
                    path = join("subsystems", nqn, "allowed_hosts", host)
                    self.unlink_hosts.append(Action(
                        "unlink", path, description=f"stop allowing host {host} on {nqn}"))
                    after.add(path)
            for nsid, lns in lsub.namespaces.items():
                if dsub is None or nsid not in dsub.namespaces:
                    after.add(self._delete_namespace(nqn, lns))
            if dsub is None:
                self.rm_subsystems.append(Action("rmdir", join("subsystems", nqn),
                                                 description=f"remove subsystem {nqn}",
                                                 after=frozenset(after)))
        # hosts in scope
        for nqn in live.hosts:
            if not scope.owns_host(nqn) or nqn in d.hosts:
                continue
            linked_by = sorted(s for s, sub in live.subsystems.items() if nqn in sub.allowed_hosts
                               and not scope.owns_subsystem(s))
            if linked_by:
                continue  # a foreign subsystem still allows it: leave the host alone
            after = frozenset(join("subsystems", s, "allowed_hosts", nqn)
                              for s, sub in live.subsystems.items() if nqn in sub.allowed_hosts)
            self.rm_hosts.append(Action("rmdir", join("hosts", nqn),
                                        description=f"remove host {nqn}", after=after))

    def _unlink_port(self, pid: int, nqn: str, lport: Port) -> Action:
        a = Action("unlink", join("ports", str(pid), "subsystems", nqn),
                   description=f"unlink subsystem {nqn} from port {pid} "
                               f"({_addr_text(lport.addr)})")
        self.unlink_ports.append(a)
        return a

    def _plan_port_children_deletes(self, pid: int, lport: Port, dport: Port | None) -> None:
        if dport is None:
            return
        if dport.referrals is not None:
            for name in sorted(lport.referrals or {}):
                if name not in dport.referrals:
                    self.rm_ports.append(Action(
                        "rmdir", join("ports", str(pid), "referrals", name),
                        description=f"remove referral {name} of port {pid}"))
        if dport.ana_groups is not None:
            for grp in sorted(lport.ana_groups or {}):
                if grp != 1 and grp not in dport.ana_groups:
                    self.rm_ports.append(Action(
                        "rmdir", join("ports", str(pid), "ana_groups", str(grp)),
                        description=f"remove ANA group {grp} of port {pid}"))

    def _delete_namespace(self, nqn: str, lns: Namespace) -> str:
        path = _ns_path(nqn, lns.nsid)
        after: frozenset[str] = frozenset()
        if lns.enable:
            disable = Action("write", join(path, "enable"), "0",
                             description=f"disable namespace {lns.nsid} of {nqn} (before "
                                         "removing it)", missing_ok=True)
            self.rm_namespaces.append(disable)
            after = frozenset({disable.key})
        self.rm_namespaces.append(Action("rmdir", path, description=f"remove namespace "
                                         f"{lns.nsid} of {nqn}", after=after))
        return path

    @staticmethod
    def _port_differs(dport: Port, lport: Port) -> bool:
        return any(lport.addr.get(k) != v for k, v in dport.addr.items()) or any(
            lport.params.get(k) != v for k, v in dport.params.items())

    # ------------------------------------------------------------------ creates

    def plan_creates(self) -> None:
        d, live = self.d, self.live
        for nqn, host in d.hosts.items():
            lhost = live.hosts.get(nqn)
            path = join("hosts", nqn)
            if lhost is None:
                self.mk_hosts.append(Action("mkdir", path, description=f"create host {nqn}"))
            for name, value in sorted(host.attrs.items()):
                if lhost is None or lhost.attrs.get(name) != value:
                    shown = "<secret>" if "key" in name else repr(value)
                    self.mk_hosts.append(Action("write", join(path, name), value,
                                                description=f"set host {nqn} {name} = {shown}"))
        for nqn, sub in d.subsystems.items():
            self._plan_subsystem(nqn, sub, live.subsystems.get(nqn))
        for pid, port in d.ports.items():
            lport = None if pid in self.recreated_ports else live.ports.get(pid)
            self._plan_port(pid, port, lport)
        for (nqn, nsid) in self.revalidate:
            sub = d.subsystems.get(nqn)
            ns = sub.namespaces.get(nsid) if sub else None
            if ns is None:
                raise PlanError(f"revalidate_size asked for namespace {nsid} of {nqn}, which the "
                                "desired tree does not have")
            lsub = live.subsystems.get(nqn)
            lns = lsub.namespaces.get(nsid) if lsub else None
            enabled = ns.enable if ns.enable is not None else bool(lns and lns.enable)
            if not enabled:
                continue
            key = self.enable_keys.get((nqn, nsid))
            self.final.append(Action(
                "write", join(_ns_path(nqn, nsid), "revalidate_size"), "1",
                description=f"revalidate the size of namespace {nsid} of {nqn}",
                after=frozenset({key} if key else ())))

    def _plan_subsystem(self, nqn: str, sub: Subsystem, lsub: Subsystem | None) -> None:
        path = join("subsystems", nqn)
        if lsub is None:
            self.mk_subsystems.append(Action("mkdir", path, description=f"create subsystem {nqn}"))
        live_attrs = lsub.attrs if lsub else {}
        wanted = dict(sub.attrs)
        if sub.allowed_hosts and "allow_any_host" not in wanted and \
                live_attrs.get("allow_any_host") == "1":
            wanted["allow_any_host"] = "0"  # allowed_hosts imply it (the kernel requires it)
        changes = {k: v for k, v in wanted.items() if lsub is None or live_attrs.get(k) != v}
        for name in _attr_order(changes, live_attrs):
            self.mk_subsystems.append(Action(
                "write", join(path, f"attr_{name}"), changes[name],
                description=f"set {nqn} attr_{name} = {changes[name]!r}"))
        for nsid, ns in sub.namespaces.items():
            lns = lsub.namespaces.get(nsid) if lsub else None
            self._plan_namespace(nqn, ns, lns)
        for host in sorted(sub.allowed_hosts):
            if lsub is None or host not in lsub.allowed_hosts:
                self.link_hosts.append(Action(
                    "symlink", join(path, "allowed_hosts", host), join("hosts", host),
                    description=f"allow host {host} on {nqn}",
                    after=frozenset({join("hosts", host), path,
                                     join(path, "attr_allow_any_host")})))

    def _plan_namespace(self, nqn: str, ns: Namespace, lns: Namespace | None) -> None:
        if lns is not None and _agrees(ns, lns):
            return  # the converged case, without building paths or dicts
        path = _ns_path(nqn, ns.nsid)
        label = f"namespace {ns.nsid} of {nqn}"
        wanted = {k: v for k, v in ns.files().items() if k != "enable"}
        live_files = lns.files() if lns else {}
        changes = {k: v for k, v in wanted.items() if lns is None or live_files.get(k) != v}
        live_enabled = bool(lns and lns.enable)
        final_enable = ns.enable if ns.enable is not None else live_enabled
        needs_disable = live_enabled and any(k in NS_DISABLED_ONLY for k in changes)
        ctx = {"device_path": ns.device_path or (lns.device_path if lns else None) or "?"}
        out = self.mk_namespaces
        if lns is None:
            out.append(Action("mkdir", path, description=f"create {label}"))
        after: set[str] = set()
        if needs_disable:
            what = ", ".join(sorted(k for k in changes if k in NS_DISABLED_ONLY))
            disable = Action("write", join(path, "enable"), "0",
                             description=f"disable {label} to change {what}")
            out.append(disable)
            after.add(disable.key)
        write_keys = set()
        for name in sorted(changes, key=_ns_order):
            a = Action("write", join(path, name), changes[name],
                       description=f"set {label} {name} = {changes[name]!r}",
                       after=frozenset(after) if name in NS_DISABLED_ONLY else frozenset())
            out.append(a)
            write_keys.add(a.key)
        enable_key = join(path, "enable")
        if final_enable and (needs_disable or not live_enabled):
            out.append(Action("write", enable_key, "1", description=f"enable {label}",
                              after=frozenset(write_keys | after), context=ctx))
            self.enable_keys[(nqn, ns.nsid)] = enable_key
        elif not final_enable and live_enabled and not needs_disable:
            out.append(Action("write", enable_key, "0", description=f"disable {label}"))

    def _plan_port(self, pid: int, port: Port, lport: Port | None) -> None:
        path = join("ports", str(pid))
        out = self.mk_ports
        keys = self.port_write_keys.setdefault(pid, set())
        if lport is None:
            out.append(Action("mkdir", path, description=f"create port {pid}"))
        live_addr = lport.addr if lport else {}
        live_params = lport.params if lport else {}
        for name in _addr_keys(port.addr):
            if lport is None or live_addr.get(name) != port.addr[name]:
                a = Action("write", join(path, f"addr_{name}"), port.addr[name],
                           description=f"set port {pid} addr_{name} = {port.addr[name]!r}")
                out.append(a)
                keys.add(a.key)
        for name in sorted(port.params):
            if lport is None or live_params.get(name) != port.params[name]:
                a = Action("write", join(path, f"param_{name}"), port.params[name],
                           description=f"set port {pid} param_{name} = {port.params[name]!r}")
                out.append(a)
                keys.add(a.key)
        if port.ana_groups is not None:
            # A new port comes with group 1 in the kernel's default state.
            live_groups = (lport.ana_groups or {}) if lport else {1: DEFAULT_ANA_STATE}
            for grp, state in port.ana_groups.items():
                gpath = join(path, "ana_groups", str(grp))
                if grp not in live_groups:
                    out.append(Action("mkdir", gpath, description=f"create ANA group {grp} on "
                                                                    f"port {pid}"))
                if live_groups.get(grp) != state:
                    out.append(Action("write", join(gpath, "ana_state"), state,
                                      description=f"set port {pid} ANA group {grp} state = "
                                                  f"{state!r}"))
        if port.referrals is not None:
            live_refs = (lport.referrals or {}) if lport else {}
            for name, ref in port.referrals.items():
                self._plan_referral(pid, ref, live_refs.get(name))
        live_links = lport.subsystems if lport else frozenset()
        ctx = {"trtype": port.addr.get("trtype") or live_addr.get("trtype", "?"),
               "traddr": port.addr.get("traddr") or live_addr.get("traddr", "?"),
               "trsvcid": port.addr.get("trsvcid") or live_addr.get("trsvcid", "?")}
        for nqn in sorted(port.subsystems):
            if nqn in live_links:
                continue
            self.link_ports.append(Action(
                "symlink", join(path, "subsystems", nqn), join("subsystems", nqn),
                description=f"export {nqn} on port {pid} "
                            f"({_addr_text({**live_addr, **port.addr})})",
                after=frozenset({path, join("subsystems", nqn), *keys}), context=ctx))

    def _plan_referral(self, pid: int, ref: Referral, lref: Referral | None) -> None:
        path = join("ports", str(pid), "referrals", ref.name)
        out = self.mk_ports
        if lref is None:
            out.append(Action("mkdir", path, description=f"create referral {ref.name} on port "
                                                         f"{pid}"))
        live_addr = lref.addr if lref else {}
        changes = [k for k in _addr_keys(ref.addr)
                   if lref is None or live_addr.get(k) != ref.addr[k]]
        live_enabled = bool(lref and lref.enable)
        final = ref.enable if ref.enable is not None else live_enabled
        after: set[str] = set()
        if changes and live_enabled:
            out.append(Action("write", join(path, "enable"), "0",
                              description=f"disable referral {ref.name} to change its address"))
            after.add(join(path, "enable"))
        for k in changes:
            out.append(Action("write", join(path, f"addr_{k}"), ref.addr[k],
                              description=f"set referral {ref.name} addr_{k} = {ref.addr[k]!r}",
                              after=frozenset(after)))
        if final and (not live_enabled or (changes and live_enabled)):
            out.append(Action("write", join(path, "enable"), "1",
                              description=f"enable referral {ref.name} on port {pid}"))
        elif not final and live_enabled:
            out.append(Action("write", join(path, "enable"), "0",
                              description=f"disable referral {ref.name} on port {pid}"))

    # ------------------------------------------------------------------ result

    def actions(self) -> list[Action]:
        if self.conflicts:
            raise ScopeConflict("converging would touch objects this caller does not own: "
                                + "; ".join(self.conflicts),
                                hint="remove the foreign links by hand, or widen the scope")
        return [*self.unlink_ports, *self.rm_ports, *self.unlink_hosts, *self.rm_namespaces,
                *self.rm_subsystems, *self.rm_hosts, *self.mk_hosts, *self.mk_subsystems,
                *self.mk_namespaces, *self.link_hosts, *self.mk_ports, *self.link_ports,
                *self.final]



def _agrees(ns: Namespace, lns: Namespace) -> bool:
    """Every attribute ``ns`` mentions has that value in ``lns`` (then the plan for the
    namespace is empty: nothing to write, enable as wanted)."""
    return ((ns.device_path is None or ns.device_path == lns.device_path)
            and (ns.device_uuid is None or ns.device_uuid == lns.device_uuid)
            and (ns.device_nguid is None or ns.device_nguid == lns.device_nguid)
            and (ns.enable is None or ns.enable == lns.enable)
            and (ns.ana_grpid is None or ns.ana_grpid == lns.ana_grpid)
            and (ns.buffered_io is None or ns.buffered_io == lns.buffered_io)
            and (ns.attrs is EMPTY or all(lns.attrs.get(k) == v for k, v in ns.attrs.items())))


def _addr_keys(addr: Mapping[str, str]) -> list[str]:
    ordered = [k for k in ADDR_ORDER if k in addr]
    return ordered + sorted(k for k in addr if k not in ADDR_ORDER)


def _addr_text(addr: Mapping[str, str]) -> str:
    return f"{addr.get('trtype', '?')} {addr.get('traddr', '?')}:{addr.get('trsvcid', '?')}"


_NS_FIRST = ("device_path", "device_uuid", "device_nguid", "buffered_io")


def _ns_order(name: str) -> tuple[int, str]:
    if name in _NS_FIRST:
        return (_NS_FIRST.index(name), name)
    return (len(_NS_FIRST) + (0 if name in NS_DISABLED_ONLY else 1), name)


def _attr_order(changes: Mapping[str, str], live: Mapping[str, str]) -> list[str]:
    """allow_any_host first; cntlid_min/max in the order that keeps min <= max."""
    names = sorted(changes, key=lambda n: (n != "allow_any_host", n))
    if "cntlid_min" in changes and "cntlid_max" in changes:
        try:
            new_min = int(changes["cntlid_min"])
            live_max = int(live.get("cntlid_max", "65519"))
        except ValueError:
            return names
        names.remove("cntlid_min")
        names.remove("cntlid_max")
        pair = ["cntlid_max", "cntlid_min"] if new_min > live_max else ["cntlid_min",
                                                                        "cntlid_max"]
        names[1 if names and names[0] == "allow_any_host" else 0:0] = pair
    return names


def plan(desired: Tree, live: Tree, scope: Scope, features: Features | None = None,
         revalidate: Iterable[tuple[str, int]] = ()) -> list[Action]:
    """The ordered actions that turn ``live`` into ``desired`` within ``scope``. Pure.

    ``features`` (from :func:`nvmet.reader.features`) makes a desired attribute this
    kernel lacks a :class:`~nvmet.errors.FeatureMissing` error. ``revalidate`` lists
    ``(subsystem nqn, nsid)`` whose backing device grew: their ``revalidate_size`` is
    written at the end. Raises :class:`~nvmet.errors.PlanError` (invalid desired state),
    :class:`~nvmet.errors.OutOfScope` or :class:`~nvmet.errors.ScopeConflict`.
    """
    p = _Planner(desired, live, scope, features, revalidate)
    p.validate()
    p.plan_deletes()
    p.plan_creates()
    return p.actions()


def revalidate_action(nqn: str, nsid: int) -> Action:
    """A single action that makes nvmet re-read the size of a grown backing device."""
    return Action("write", join(_ns_path(nqn, nsid), "revalidate_size"), "1",
                  description=f"revalidate the size of namespace {nsid} of {nqn}")
