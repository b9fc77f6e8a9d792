"""Random nvmet trees (hypothesis strategies) and checks shared by the unit and kernel tiers.

The universe is small on purpose (3 owned subsystems, 3 owned hosts, 3 owned ports,
a few devices and addresses) so that random desired/live pairs overlap a lot: the
interesting plans are the ones that change existing objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from nvmet.ids import namespace_nguid, namespace_uuid
from nvmet.model import Host, Namespace, Port, Referral, Subsystem, Tree
from nvmet.planner import Scope

OWN_PREFIX = "nqn.2026-11.io.kvagent.test"
OWN_SUBS = [f"{OWN_PREFIX}:node1:pool{i}" for i in range(3)]
OWN_HOSTS = [f"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000{i}"
             for i in range(1, 4)]
OWN_PORTS = [1, 2, 3]
FOREIGN_SUB = "nqn.2019-05.com.example:foreign0"
FOREIGN_HOST = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000ff"
FOREIGN_PORT = 10
OTHER_UUID = "0d4a1bc2-1111-4222-8333-444455556666"

SCOPE = Scope.owned(subsystem_prefix=OWN_PREFIX, port_ids=OWN_PORTS, hosts=OWN_HOSTS)


@dataclass(frozen=True)
class Universe:
    """Devices and addresses a backend offers to random trees."""

    block: Sequence[str]          # block devices (O_DIRECT)
    nodirect: Sequence[str]       # files that need buffered_io (tmpfs / overlay)
    addresses: Sequence[tuple[str, str, str]]  # (trtype, traddr, trsvcid) usable by ports
    foreign_addr: tuple[str, str, str]         # the foreign port's address


FAKE_UNIVERSE = Universe(
    block=["/dev/nullb0", "/dev/nullb1"],
    nodirect=["/tmp/kv/f0.img"],
    addresses=[("tcp", "127.0.0.1", "4420"), ("tcp", "127.0.0.1", "4421"),
               ("tcp", "10.0.0.1", "4420"), ("rdma", "10.0.0.1", "4420")],
    foreign_addr=("tcp", "127.0.0.1", "5000"),
)


@st.composite
def namespaces(draw: st.DrawFn, nqn: str, nsid: int, u: Universe) -> Namespace:
    path = draw(st.sampled_from([None, *u.block, *u.nodirect]))
    if path is None:
        enable, buffered = draw(st.sampled_from([None, False])), None
    elif path in u.nodirect:
        enable, buffered = draw(st.sampled_from([None, True, False])), True
    else:
        enable = draw(st.sampled_from([None, True, False]))
        buffered = draw(st.sampled_from([None, False, True]))
    return Namespace(
        nsid=nsid, device_path=path, enable=enable, buffered_io=buffered,
        device_uuid=draw(st.sampled_from([None, namespace_uuid(nqn, nsid), OTHER_UUID])),
        device_nguid=draw(st.sampled_from([None, namespace_nguid(nqn, nsid)])),
        ana_grpid=draw(st.sampled_from([None, 1, 2])),
    )


@st.composite
def subsystems(draw: st.DrawFn, nqn: str, hosts: Sequence[str], u: Universe) -> Subsystem:
    allowed = draw(st.frozensets(st.sampled_from(hosts), max_size=2)) if hosts else frozenset()
    attrs: dict[str, object] = {}
    for name, values in (("model", ["Linux", "kvagent"]), ("version", ["1.3", "1.4"]),
                         ("serial", ["kv0001", "abc"]), ("qid_max", [16, 128])):
        if draw(st.booleans()):
            attrs[name] = draw(st.sampled_from(values))
    aah = draw(st.sampled_from([None, False] if allowed else [None, False, True]))
    if aah is not None:
        attrs["allow_any_host"] = aah
    nsids = draw(st.frozensets(st.sampled_from([1, 2, 3, 9]), max_size=3))
    return Subsystem(nqn, attrs=attrs, allowed_hosts=allowed,
                     namespaces=[draw(namespaces(nqn, n, u)) for n in sorted(nsids)])


@st.composite
def ports(draw: st.DrawFn, pid: int, addr: tuple[str, str, str], subs: Sequence[str]) -> Port:
    trtype, traddr, trsvcid = addr
    params = draw(st.sampled_from([{}, {"inline_data_size": 8192}]))
    groups = draw(st.sampled_from([None, {1: "optimized", 2: "non-optimized"},
                                   {2: "inaccessible"}, {1: "non-optimized"}]))
    referrals = draw(st.sampled_from([
        None, [],
        [Referral("r1", addr={"trtype": "tcp", "adrfam": "ipv4", "traddr": "10.9.9.9",
                              "trsvcid": "4420"}, enable=True)],
        [Referral("r1", addr={"trtype": "tcp", "adrfam": "ipv4", "traddr": "10.9.9.8",
                              "trsvcid": "4420"}, enable=None)],
    ]))
    return Port(pid, addr={"trtype": trtype, "adrfam": "ipv4", "traddr": traddr,
                           "trsvcid": trsvcid},
                params=params, ana_groups=groups, referrals=referrals,
                subsystems=draw(st.frozensets(st.sampled_from(subs), max_size=2)) if subs
                else frozenset())


@st.composite
def trees(draw: st.DrawFn, u: Universe = FAKE_UNIVERSE) -> Tree:
    """A random tree of owned objects only (valid for the planner)."""
    hosts = sorted(draw(st.frozensets(st.sampled_from(OWN_HOSTS))))
    subs = sorted(draw(st.frozensets(st.sampled_from(OWN_SUBS))))
    port_ids = sorted(draw(st.frozensets(st.sampled_from(OWN_PORTS))))
    addrs = draw(st.permutations(list(u.addresses)))
    return Tree(
        hosts=[Host(h) for h in hosts],
        subsystems=[draw(subsystems(n, hosts, u)) for n in subs],
        ports=[draw(ports(p, addrs[i], subs)) for i, p in enumerate(port_ids)],
    )


def foreign_tree(u: Universe, with_own_host: bool) -> Tree:
    """Objects the caller does not own: a subsystem (allowing a foreign host and perhaps one
    of ours), a port exporting it."""
    allowed = {FOREIGN_HOST, OWN_HOSTS[0]} if with_own_host else {FOREIGN_HOST}
    trtype, traddr, trsvcid = u.foreign_addr
    return Tree(
        hosts=[Host(h) for h in sorted(allowed)],
        subsystems=[Subsystem(FOREIGN_SUB, attrs={"model": "foreign"},
                              namespaces=[Namespace(1, device_path=u.block[-1], enable=True)],
                              allowed_hosts=allowed)],
        ports=[Port(FOREIGN_PORT, addr={"trtype": trtype, "adrfam": "ipv4", "traddr": traddr,
                                        "trsvcid": trsvcid}, subsystems={FOREIGN_SUB})],
    )


def merge(a: Tree, b: Tree) -> Tree:
    """Union of two trees with disjoint subsystems and ports (hosts may repeat)."""
    return Tree(hosts={**a.hosts, **b.hosts}, subsystems={**a.subsystems, **b.subsystems},
                ports={**a.ports, **b.ports})


def foreign_part(tree: Tree, scope: Scope) -> Tree:
    """Everything in ``tree`` the scope does not own."""
    return Tree(hosts=[h for n, h in tree.hosts.items() if not scope.owns_host(n)],
                subsystems=[s for n, s in tree.subsystems.items()
                            if not scope.owns_subsystem(n)],
                ports=[p for i, p in tree.ports.items() if not scope.owns_port(i)])


def _sub_mapping(want: Mapping[str, str], have: Mapping[str, str], what: str) -> list[str]:
    return [f"{what} {k}: want {v!r}, have {have.get(k)!r}" for k, v in want.items()
            if have.get(k) != v]


def conforms(desired: Tree, live: Tree, scope: Scope) -> list[str]:
    """Where ``live`` differs from ``desired`` inside ``scope`` (empty = converged)."""
    out: list[str] = []
    foreign_links = {h for n, s in live.subsystems.items() if not scope.owns_subsystem(n)
                     for h in s.allowed_hosts}
    for nqn, h in desired.hosts.items():
        lh = live.hosts.get(nqn)
        if lh is None:
            out.append(f"host {nqn} missing")
        else:
            out += _sub_mapping(h.attrs, lh.attrs, f"host {nqn}")
    for nqn in live.hosts:
        if scope.owns_host(nqn) and nqn not in desired.hosts and nqn not in foreign_links:
            out.append(f"host {nqn} should be gone")
    for nqn, s in desired.subsystems.items():
        ls = live.subsystems.get(nqn)
        if ls is None:
            out.append(f"subsystem {nqn} missing")
            continue
        out += _sub_mapping(s.attrs, ls.attrs, f"subsystem {nqn}")
        if s.allowed_hosts and ls.attrs.get("allow_any_host") != "0":
            out.append(f"subsystem {nqn} has allowed hosts but allow_any_host != 0")
        if set(s.namespaces) != set(ls.namespaces):
            out.append(f"subsystem {nqn} namespaces {sorted(ls.namespaces)} != "
                       f"{sorted(s.namespaces)}")
        for nsid, ns in s.namespaces.items():
            if nsid in ls.namespaces:
                out += _sub_mapping(ns.files(), ls.namespaces[nsid].files(),
                                    f"{nqn} ns {nsid}")
        if s.allowed_hosts != ls.allowed_hosts:
            out.append(f"subsystem {nqn} allowed_hosts {sorted(ls.allowed_hosts)}")
    for nqn in live.subsystems:
        if scope.owns_subsystem(nqn) and nqn not in desired.subsystems:
            out.append(f"subsystem {nqn} should be gone")
    for pid, p in desired.ports.items():
        lp = live.ports.get(pid)
        if lp is None:
            out.append(f"port {pid} missing")
            continue
        out += _sub_mapping(p.addr, lp.addr, f"port {pid} addr")
        out += _sub_mapping(p.params, lp.params, f"port {pid} param")
        owned = {n for n in lp.subsystems if scope.owns_subsystem(n)}
        if owned != set(p.subsystems):
            out.append(f"port {pid} links {sorted(owned)} != {sorted(p.subsystems)}")
        if p.ana_groups is not None:
            lg = dict(lp.ana_groups or {})
            out += _sub_mapping({str(k): v for k, v in p.ana_groups.items()},
                                {str(k): v for k, v in lg.items()}, f"port {pid} ana")
            if set(lg) - {1} != set(p.ana_groups) - {1}:
                out.append(f"port {pid} ANA groups {sorted(lg)}")
        if p.referrals is not None:
            lr = dict(lp.referrals or {})
            if set(lr) != set(p.referrals):
                out.append(f"port {pid} referrals {sorted(lr)}")
            for name, r in p.referrals.items():
                if name in lr:
                    out += _sub_mapping(r.addr, lr[name].addr, f"referral {name}")
                    if r.enable is not None and lr[name].enable != r.enable:
                        out.append(f"referral {name} enable {lr[name].enable}")
    for pid in live.ports:
        if scope.owns_port(pid) and pid not in desired.ports:
            out.append(f"port {pid} should be gone")
    return out


def touches_foreign(paths: Sequence[str], scope: Scope) -> list[str]:
    """Paths of operations that touched an object outside ``scope``."""
    bad = []
    for path in paths:
        parts = path.split("/")
        if len(parts) < 2:
            continue
        kind, name = parts[0], parts[1]
        if (kind == "subsystems" and not scope.owns_subsystem(name)) or (
                kind == "ports" and not scope.owns_port(int(name))) or (
                kind == "hosts" and not scope.owns_host(name)):
            bad.append(path)
    return bad
