"""The planner's read: only the attribute files a :class:`~nvmet.readspec.ReadSpec` names.

Per attribute file it names: an open, a read and a close (a subsystem's namespaces are
read with one ``read_each``, relative to their directory); per directory of objects or
links one ``children`` listing (no stat per entry); nothing for the other files.
Everything is read live on every call. :func:`read_more` completes a tree read with a
narrower spec (the caller built its desired tree from it) with the files a wider
spec adds, reading only those.
"""

from __future__ import annotations

from dataclasses import replace

from .configfs import ConfigFS, join
from .model import Host, Namespace, Port, Referral, Subsystem, Tree
from .readbase import check_available, decimal_name, prefixed, read_error
from .readspec import ReadSpec


def _children(fs: ConfigFS, path: str) -> tuple[list[str], list[str], list[str]]:
    try:
        return fs.children(path)
    except OSError as exc:
        raise read_error(path, exc) from exc


def _attrs(fs: ConfigFS, path: str, names: frozenset[str]) -> dict[str, str]:
    if not names:
        return {}
    try:
        return fs.read_attrs(path, names)
    except OSError as exc:
        raise read_error(path, exc) from exc


def _each(fs: ConfigFS, path: str, children: list[str],
          names: frozenset[str]) -> list[dict[str, str]]:
    if not names:
        return [{} for _ in children]
    try:
        return fs.read_each(path, children, names)
    except OSError as exc:
        raise read_error(path, exc) from exc


def _subsystems(fs: ConfigFS, spec: ReadSpec) -> list[Subsystem]:
    nqns = _children(fs, "subsystems")[0]
    attrs = _each(fs, "subsystems", nqns, spec.subsystems)
    jobs, hosts = [], []
    for nqn in nqns:
        ns_root = f"subsystems/{nqn}/namespaces"
        jobs.append((ns_root, _children(fs, ns_root)[0]))
        hosts.append(_children(fs, f"subsystems/{nqn}/allowed_hosts")[1])
    files = [_each(fs, root, names, spec.namespaces) for root, names in jobs]
    from_files = Namespace.from_files
    out = []
    for nqn, sub_files, (ns_root, names), ns_files, allowed in zip(
            nqns, attrs, jobs, files, hosts, strict=True):
        nsids = [int(n) if n.isascii() and n.isdigit() and n[0] != "0" else
                 decimal_name(n, "namespace", ns_root) for n in names]
        out.append(Subsystem(nqn=nqn, attrs=prefixed(sub_files, "attr_"),
                             namespaces=[from_files(nsid, f)
                                         for nsid, f in zip(nsids, ns_files, strict=True)],
                             allowed_hosts=frozenset(allowed)))
    return out


def _referral(name: str, files: dict[str, str]) -> Referral:
    enable = files.get("enable")
    return Referral(name=name, addr=prefixed(files, "addr_"),
                    enable=None if enable is None else enable == "1")


def _port(fs: ConfigFS, name: str, spec: ReadSpec) -> Port:
    path = join("ports", name)
    port_id = decimal_name(name, "port", "ports")
    files = _attrs(fs, path, spec.ports)
    links = _children(fs, f"{path}/subsystems")[1]
    groups: dict[int, str] = {}
    if fs.exists(f"{path}/ana_groups"):
        for g in _children(fs, f"{path}/ana_groups")[0]:
            gpath = f"{path}/ana_groups/{g}"
            groups[decimal_name(g, "ANA group", f"{path}/ana_groups")] = _attrs(
                fs, gpath, spec.ana_groups).get("ana_state", "")
    referrals = []
    if fs.exists(f"{path}/referrals"):
        for r in _children(fs, f"{path}/referrals")[0]:
            referrals.append(_referral(r, _attrs(fs, f"{path}/referrals/{r}", spec.referrals)))
    return Port(id=port_id, addr=prefixed(files, "addr_"), params=prefixed(files, "param_"),
                subsystems=frozenset(links), ana_groups=groups, referrals=referrals)


def read_planned(fs: ConfigFS, spec: ReadSpec) -> Tree:
    """The live tree with only the attribute files ``spec`` names (see :func:`nvmet.read`)."""
    check_available(fs)
    hosts = [Host(nqn=n, attrs=_attrs(fs, join("hosts", n), spec.hosts))
             for n in _children(fs, "hosts")[0]]
    subsystems = _subsystems(fs, spec)
    ports = [_port(fs, n, spec) for n in _children(fs, "ports")[0]]
    return Tree(hosts=hosts, subsystems=subsystems, ports=ports)


def _more_namespace(fs: ConfigFS, path: str, ns: Namespace, names: frozenset[str]) -> Namespace:
    files = ns.files()
    files.update(_attrs(fs, path, names))
    return Namespace.from_files(ns.nsid, files)


def read_more(fs: ConfigFS, live: Tree, have: ReadSpec, want: ReadSpec) -> Tree:
    """``live`` (read with ``have``) completed with the files ``want`` adds.

    Only the added files are read, for the objects ``live`` holds; objects created since
    are not added (``live`` stays the earlier listing). An object gone since is a
    :class:`~nvmet.errors.ReadError`, like any failed read.
    """
    more = want - have
    if not more:
        return live
    hosts = [replace(h, attrs={**h.attrs, **_attrs(fs, join("hosts", n), more.hosts)})
             for n, h in live.hosts.items()]
    subsystems = []
    for nqn, sub in live.subsystems.items():
        path = join("subsystems", nqn)
        attrs = {**sub.attrs, **prefixed(_attrs(fs, path, more.subsystems), "attr_")}
        namespaces = [ns if not more.namespaces else
                      _more_namespace(fs, f"{path}/namespaces/{nsid}", ns, more.namespaces)
                      for nsid, ns in sub.namespaces.items()]
        subsystems.append(replace(sub, attrs=attrs, namespaces=namespaces))
    ports = []
    for pid, port in live.ports.items():
        path = join("ports", str(pid))
        files = _attrs(fs, path, more.ports)
        groups = port.ana_groups
        if groups is not None and more.ana_groups:
            groups = {g: _attrs(fs, f"{path}/ana_groups/{g}", more.ana_groups).get(
                "ana_state", state) for g, state in groups.items()}
        refs = port.referrals
        if refs is not None and more.referrals:
            refs = [_more_referral(fs, f"{path}/referrals/{n}", r, more.referrals)
                    for n, r in refs.items()]
        ports.append(replace(port, addr={**port.addr, **prefixed(files, "addr_")},
                             params={**port.params, **prefixed(files, "param_")},
                             ana_groups=groups, referrals=refs))
    return Tree(hosts=hosts, subsystems=subsystems, ports=ports)


def _more_referral(fs: ConfigFS, path: str, ref: Referral, names: frozenset[str]) -> Referral:
    files = {f"addr_{k}": v for k, v in ref.addr.items()}
    if ref.enable is not None:
        files["enable"] = "1" if ref.enable else "0"
    files.update(_attrs(fs, path, names))
    return _referral(ref.name, files)
