"""The full read of the live nvmet tree, and feature detection, from any :class:`ConfigFS`.

The full read (:func:`read`) reads every attribute file, found by listing directories
(like nvmetcli's globbing), so attributes that newer kernels add are read without code
changes — for ``kvagent target show`` and nvmetcli export. It is live every time (nothing
is cached between reads). The planner's narrower read is :mod:`nvmet.specread`;
:func:`nvmet.read` (:mod:`nvmet.liveread`) picks one of the two.

A failed read raises :class:`~nvmet.errors.ReadError`; it never returns a partial or
empty tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress

from .configfs import ConfigFS, Entry, join
from .errors import ReadError
from .model import FrozenMap, Host, Namespace, Port, Referral, Subsystem, Tree
from .readbase import Features, check_available, decimal_name, prefixed, read_error

#: Where the planner looks for an attribute: object kind -> file-name list source.
KINDS = ("host", "subsystem", "namespace", "port", "referral", "ana_group")

#: Friendly names of optional kernel features, by the attribute file that reveals them.
FEATURE_NAMES: dict[str, str] = {
    "dhchap_key": "DH-HMAC-CHAP authentication (NVME_TARGET_AUTH)",
    "dhchap_ctrl_key": "DH-HMAC-CHAP authentication (NVME_TARGET_AUTH)",
    "dhchap_hash": "DH-HMAC-CHAP authentication (NVME_TARGET_AUTH)",
    "dhchap_dhgroup": "DH-HMAC-CHAP authentication (NVME_TARGET_AUTH)",
    "addr_tsas": "transport security (NVMe/TCP TLS, addr_tsas)",
    "resv_enable": "persistent reservations (resv_enable)",
    "attr_qid_max": "per-subsystem I/O queue limit (attr_qid_max)",
    "p2pmem": "PCI peer-to-peer memory (p2pmem)",
    "param_max_queue_size": "port queue size limit (param_max_queue_size)",
    "param_mdts": "port MDTS limit (param_mdts)",
}

#: Name used for the temporary objects of ``features(..., probe=True)`` (an .invalid domain).
PROBE_NQN = "nqn.2024-01.invalid.nvmet-feature-probe:probe"


@contextmanager
def _reading(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise read_error(path, exc) from exc


def _list(fs: ConfigFS, path: str) -> list[Entry]:
    with _reading(path):
        return fs.list(path)


def _files(fs: ConfigFS, path: str, entries: list[Entry]) -> dict[str, str]:
    out = {}
    for e in entries:
        if e.kind == "file" and e.readable:
            p = join(path, e.name)
            with _reading(p):
                out[e.name] = fs.read(p)
    return out


def read_namespace(fs: ConfigFS, path: str, nsid: int) -> Namespace:
    """One namespace directory."""
    return Namespace.from_files(nsid, _files(fs, path, _list(fs, path)))


def read_subsystem(fs: ConfigFS, nqn: str) -> Subsystem:
    """One subsystem with its namespaces and allowed hosts."""
    path = join("subsystems", nqn)
    entries = _list(fs, path)
    files = _files(fs, path, entries)
    attrs = {k[len("attr_"):]: v for k, v in files.items() if k.startswith("attr_")}
    namespaces = []
    ns_root = join(path, "namespaces")
    for e in _list(fs, ns_root):
        if e.kind == "dir":
            p = join(ns_root, e.name)
            nsid = decimal_name(e.name, "namespace", ns_root)
            namespaces.append(read_namespace(fs, p, nsid))
    hosts = [e.name for e in _list(fs, join(path, "allowed_hosts")) if e.kind == "link"]
    return Subsystem(nqn=nqn, attrs=attrs, namespaces=namespaces, allowed_hosts=frozenset(hosts))


def read_port(fs: ConfigFS, name: str) -> Port:
    """One port with its links, ANA groups and referrals."""
    path = join("ports", name)
    port_id = decimal_name(name, "port", "ports")
    files = _files(fs, path, _list(fs, path))
    links = [e.name for e in _list(fs, join(path, "subsystems")) if e.kind == "link"]
    groups: dict[int, str] = {}
    if fs.exists(join(path, "ana_groups")):
        for e in _list(fs, join(path, "ana_groups")):
            if e.kind == "dir":
                gpath = join(path, "ana_groups", e.name)
                gfiles = _files(fs, gpath, _list(fs, gpath))
                gid = decimal_name(e.name, "ANA group", join(path, "ana_groups"))
                groups[gid] = gfiles.get("ana_state", "")
    referrals = []
    if fs.exists(join(path, "referrals")):
        for e in _list(fs, join(path, "referrals")):
            if e.kind == "dir":
                rpath = join(path, "referrals", e.name)
                rfiles = _files(fs, rpath, _list(fs, rpath))
                enable = rfiles.get("enable")
                referrals.append(Referral(name=e.name, addr=prefixed(rfiles, "addr_"),
                                          enable=None if enable is None else enable == "1"))
    return Port(id=port_id, addr=prefixed(files, "addr_"), params=prefixed(files, "param_"),
                subsystems=frozenset(links), ana_groups=groups, referrals=referrals)


def read(fs: ConfigFS) -> Tree:
    """The live tree with every attribute file (the planner's read by spec: :func:`nvmet.read`).

    Raises NvmetUnavailable (no nvmet) or ReadError (any failure).
    """
    check_available(fs)
    hosts = []
    for e in _list(fs, "hosts"):
        if e.kind == "dir":
            p = join("hosts", e.name)
            hosts.append(Host(nqn=e.name, attrs=_files(fs, p, _list(fs, p))))
    subsystems = [read_subsystem(fs, e.name) for e in _list(fs, "subsystems") if e.kind == "dir"]
    ports = [read_port(fs, e.name) for e in _list(fs, "ports") if e.kind == "dir"]
    return Tree(hosts=hosts, subsystems=subsystems, ports=ports)


def _children(fs: ConfigFS, path: str) -> tuple[list[str], list[str], list[str]]:
    with _reading(path):
        return fs.children(path)


def _file_names(fs: ConfigFS, path: str) -> frozenset[str]:
    return frozenset(_children(fs, path)[2])


def _first_dir(fs: ConfigFS, path: str) -> str | None:
    dirs = _children(fs, path)[0]
    return join(path, min(dirs)) if dirs else None


def _inspect(fs: ConfigFS) -> dict[str, frozenset[str] | None]:
    """Attribute file names of the first object of each kind (listings only: every pass
    runs this, so it stats nothing and reads no attribute)."""
    found: dict[str, frozenset[str] | None] = dict.fromkeys(KINDS)
    host = _first_dir(fs, "hosts")
    if host:
        found["host"] = _file_names(fs, host)
    for name in sorted(_children(fs, "subsystems")[0]):
        sub = join("subsystems", name)
        found["subsystem"] = found["subsystem"] or _file_names(fs, sub)
        ns = _first_dir(fs, join(sub, "namespaces"))
        if ns:
            found["namespace"] = _file_names(fs, ns)
            break
    for name in sorted(_children(fs, "ports")[0]):
        port = join("ports", name)
        dirs, _, files = _children(fs, port)
        found["port"] = found["port"] or frozenset(files)
        grp = _first_dir(fs, join(port, "ana_groups")) if "ana_groups" in dirs else None
        if grp:
            found["ana_group"] = found["ana_group"] or _file_names(fs, grp)
        ref = _first_dir(fs, join(port, "referrals")) if "referrals" in dirs else None
        if ref:
            found["referral"] = _file_names(fs, ref)
    return found


def _free_port_id(fs: ConfigFS) -> str:
    used = {e.name for e in _list(fs, "ports")}
    for candidate in range(65535, 0, -1):
        if str(candidate) not in used:
            return str(candidate)
    raise ReadError("no free port id for the feature probe", path="ports")


def _probe(fs: ConfigFS, found: dict[str, frozenset[str] | None]) -> None:
    """Create throw-away objects for the kinds not seen yet, read their files, remove them."""
    made: list[str] = []
    try:
        if found["host"] is None:
            made.append(join("hosts", PROBE_NQN))
            fs.mkdir(made[-1])
            found["host"] = _file_names(fs, made[-1])
        if found["subsystem"] is None or found["namespace"] is None:
            sub = join("subsystems", PROBE_NQN)
            made.append(sub)
            fs.mkdir(sub)
            found["subsystem"] = _file_names(fs, sub)
            made.append(join(sub, "namespaces", "1"))
            fs.mkdir(made[-1])
            found["namespace"] = _file_names(fs, made[-1])
        if found["port"] is None or found["referral"] is None or found["ana_group"] is None:
            port = join("ports", _free_port_id(fs))
            made.append(port)
            fs.mkdir(port)
            found["port"] = found["port"] or _file_names(fs, port)
            if fs.exists(join(port, "ana_groups", "1")):
                found["ana_group"] = _file_names(fs, join(port, "ana_groups", "1"))
            if fs.exists(join(port, "referrals")):
                made.append(join(port, "referrals", "probe"))
                fs.mkdir(made[-1])
                found["referral"] = _file_names(fs, made[-1])
    except OSError as exc:
        raise ReadError(f"feature probe failed: {exc.strerror or exc}", errno=exc.errno,
                        op="probe") from exc
    finally:
        for path in reversed(made):
            with suppress(FileNotFoundError):
                fs.rmdir(path)


def features(fs: ConfigFS, *, kernel: str | None = None,
             probe: bool | frozenset[str] = False) -> Features:
    """Detect optional features from the attribute files of existing objects.

    Kinds without an existing object stay unknown (``None``) unless ``probe`` is set: then
    a temporary host, subsystem + namespace and port + referral (named :data:`PROBE_NQN`, a
    free port id) are created, inspected and removed (these writes are counted by ``fs``).
    ``probe`` may name the kinds to probe (``frozenset({"host"})``: only a host).
    ``kernel`` is only used in messages (e.g. ``platform.release()``).
    """
    check_available(fs)
    found = _inspect(fs)
    wanted = set(found) if probe is True else set(probe or ())
    if any(found[k] is None for k in wanted):
        skipped = {k: v for k, v in found.items() if k not in wanted}
        probed = {**found, **dict.fromkeys(skipped, frozenset())}
        _probe(fs, probed)
        found = {**probed, **skipped}
    return Features(kernel=kernel, files=FrozenMap(found))
