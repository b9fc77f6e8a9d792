"""nvmetcli's JSON (``/etc/nvmet/config.json``): export a Tree, import one into a desired Tree.

The shape follows nvmetcli's ``nvmet/nvme.py`` ``dump()``: a top-level object with
``hosts``, ``ports`` and ``subsystems`` lists; each object's attribute group as a
nested object of strings (``attr`` for subsystems, ``device``/``ana``/``resv`` for
namespaces, ``addr``/``param`` for ports, ``addr`` for referrals, ``ana`` for ANA
groups), ``enable`` as 0/1, ``nsid``/``portid``/``grpid`` as numbers.

Two additions nvmetcli ignores on restore: namespace ``buffered_io`` (nvmetcli does not
save it, and file-backed namespaces on tmpfs need it) and other namespace attribute files
without a group (``p2pmem``...), as top-level namespace keys. Passthru subsystems are not
supported. On import, hosts named in ``allowed_hosts`` but missing from ``hosts`` are
added (nvmetcli would fail to link them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import NvmetError
from .model import Host, Namespace, Port, Referral, Subsystem, Tree

DEFAULT_FILE = "/etc/nvmet/config.json"
_NS_KNOWN = {"device_path", "device_uuid", "device_nguid", "enable", "ana_grpid", "buffered_io"}


class FormatError(NvmetError, ValueError):
    """The nvmetcli JSON is not in the expected shape; the message names the JSON path."""


def _host(h: Host) -> dict[str, Any]:
    out: dict[str, Any] = {"nqn": h.nqn}
    dhchap = {k[len("dhchap_"):]: v for k, v in h.attrs.items() if k.startswith("dhchap_")}
    if dhchap:
        out["dhchap"] = dhchap
    return out


def _namespace(ns: Namespace) -> dict[str, Any]:
    device = {k: v for k, v in (("path", ns.device_path), ("uuid", ns.device_uuid),
                                ("nguid", ns.device_nguid)) if v is not None}
    out: dict[str, Any] = {"device": device, "nsid": ns.nsid,
                           "enable": 1 if ns.enable else 0}
    if ns.ana_grpid is not None:
        out["ana_grpid"] = ns.ana_grpid
        out["ana"] = {"grpid": str(ns.ana_grpid)}
    out["resv"] = {k[len("resv_"):]: v for k, v in ns.attrs.items() if k.startswith("resv_")}
    if ns.buffered_io is not None:
        out["buffered_io"] = 1 if ns.buffered_io else 0
    for k, v in ns.attrs.items():
        if not k.startswith("resv_"):
            out[k] = v
    return out


def _subsystem(s: Subsystem) -> dict[str, Any]:
    return {"nqn": s.nqn, "attr": dict(s.attrs),
            "namespaces": [_namespace(ns) for ns in s.namespaces.values()],
            "allowed_hosts": sorted(s.allowed_hosts)}


def _port(p: Port) -> dict[str, Any]:
    return {
        "portid": p.id,
        "addr": dict(p.addr),
        "param": dict(p.params),
        "subsystems": sorted(p.subsystems),
        "ana_groups": [{"grpid": g, "ana": {"state": st}}
                       for g, st in (p.ana_groups or {}).items()],
        "referrals": [{"name": r.name, "addr": dict(r.addr), "enable": 1 if r.enable else 0}
                      for r in (p.referrals or {}).values()],
    }


def to_nvmetcli(tree: Tree) -> dict[str, Any]:
    """``tree`` as nvmetcli's ``config.json`` object."""
    return {"hosts": [_host(h) for h in tree.hosts.values()],
            "ports": [_port(p) for p in tree.ports.values()],
            "subsystems": [_subsystem(s) for s in tree.subsystems.values()]}


def dumps(tree: Tree) -> str:
    """nvmetcli's file text (sorted keys, indent 2, trailing newline), as ``nvmetcli save``."""
    return json.dumps(to_nvmetcli(tree), sort_keys=True, indent=2) + "\n"


# ---------------------------------------------------------------------- import

def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FormatError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise FormatError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _need(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise FormatError(f"{where}: {key!r} is missing")
    return obj[key]


def _strings(value: Any, where: str) -> dict[str, str]:
    out = {}
    for k, v in _obj(value or {}, where).items():
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise FormatError(f"{where}.{k}: expected a string or number, got {v!r}")
        out[str(k)] = str(v)
    return out


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise FormatError(f"{where}: expected a number, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FormatError(f"{where}: expected a number, got {value!r}") from None


def _flag(value: Any, where: str) -> bool:
    if value in (0, 1, "0", "1", True, False):
        return value in (1, "1", True)
    raise FormatError(f"{where}: expected 0 or 1, got {value!r}")


def _ns_from(n: Any, where: str) -> Namespace:
    n = _obj(n, where)
    device = _strings(n.get("device"), f"{where}.device")
    grp = n.get("ana_grpid")
    if grp is None and isinstance(n.get("ana"), Mapping) and "grpid" in n["ana"]:
        grp = n["ana"]["grpid"]
    attrs = {f"resv_{k}": v for k, v in _strings(n.get("resv"), f"{where}.resv").items()}
    for k, v in n.items():
        if k in ("device", "nsid", "enable", "ana_grpid", "ana", "resv", "buffered_io"):
            continue
        if k in _NS_KNOWN or isinstance(v, (Mapping, list)):
            raise FormatError(f"{where}.{k}: unexpected key")
        attrs[k] = str(v)
    return Namespace(
        nsid=_int(_need(n, "nsid", where), f"{where}.nsid"),
        device_path=device.get("path"),
        device_uuid=device.get("uuid"),
        device_nguid=device.get("nguid"),
        enable=_flag(n["enable"], f"{where}.enable") if "enable" in n else None,
        ana_grpid=None if grp is None else _int(grp, f"{where}.ana_grpid"),
        buffered_io=_flag(n["buffered_io"], f"{where}.buffered_io") if "buffered_io" in n
        else None,
        attrs=attrs,
    )


def _host_from(raw: Any, where: str) -> Host:
    h = _obj(raw, where)
    dhchap = _strings(h.get("dhchap"), f"{where}.dhchap")
    return Host(str(_need(h, "nqn", where)), {f"dhchap_{k}": v for k, v in dhchap.items()})


def _subsystem_from(raw: Any, where: str) -> Subsystem:
    s = _obj(raw, where)
    if s.get("passthru"):
        raise FormatError(f"{where}: passthru subsystems are not supported")
    allowed = [str(x) for x in _list(s.get("allowed_hosts"), f"{where}.allowed_hosts")]
    namespaces = [_ns_from(n, f"{where}.namespaces[{j}]")
                  for j, n in enumerate(_list(s.get("namespaces"), f"{where}.namespaces"))]
    try:
        return Subsystem(str(_need(s, "nqn", where)),
                         attrs=_strings(s.get("attr"), f"{where}.attr"),
                         namespaces=namespaces, allowed_hosts=frozenset(allowed))
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}") from None


def _group_from(raw: Any, where: str) -> tuple[int, str]:
    g = _obj(raw, where)
    state = _strings(g.get("ana"), f"{where}.ana").get("state")
    if state is None:
        raise FormatError(f"{where}.ana: 'state' is missing")
    return _int(_need(g, "grpid", where), f"{where}.grpid"), state


def _referral_from(raw: Any, where: str) -> Referral:
    r = _obj(raw, where)
    return Referral(str(_need(r, "name", where)), addr=_strings(r.get("addr"), f"{where}.addr"),
                    enable=_flag(r["enable"], f"{where}.enable") if "enable" in r else None)


def _port_from(raw: Any, where: str) -> Port:
    p = _obj(raw, where)
    groups = dict(_group_from(g, f"{where}.ana_groups[{j}]")
                  for j, g in enumerate(_list(p.get("ana_groups"), f"{where}.ana_groups")))
    referrals = [_referral_from(r, f"{where}.referrals[{j}]")
                 for j, r in enumerate(_list(p.get("referrals"), f"{where}.referrals"))]
    return Port(
        id=_int(_need(p, "portid", where), f"{where}.portid"),
        addr=_strings(p.get("addr"), f"{where}.addr"),
        params=_strings(p.get("param"), f"{where}.param"),
        subsystems=frozenset(str(x) for x in _list(p.get("subsystems"), f"{where}.subsystems")),
        ana_groups=groups if "ana_groups" in p else None,
        referrals=referrals if "referrals" in p else None,
    )


def from_nvmetcli(data: Any) -> Tree:
    """A desired Tree from nvmetcli's ``config.json`` object (raises :class:`FormatError`)."""
    root = _obj(data, "(top level)")
    hosts = {h.nqn: h for h in (_host_from(raw, f"hosts[{i}]")
                                for i, raw in enumerate(_list(root.get("hosts"), "hosts")))}
    subsystems = [_subsystem_from(raw, f"subsystems[{i}]")
                  for i, raw in enumerate(_list(root.get("subsystems"), "subsystems"))]
    for sub in subsystems:
        for h in sorted(sub.allowed_hosts):
            hosts.setdefault(h, Host(h))
    ports = [_port_from(raw, f"ports[{i}]")
             for i, raw in enumerate(_list(root.get("ports"), "ports"))]
    try:
        return Tree(hosts=hosts, subsystems=subsystems, ports=ports)
    except ValueError as exc:
        raise FormatError(str(exc)) from None


def loads(text: str) -> Tree:
    """A desired Tree from nvmetcli's file text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"not valid JSON: {exc}") from None
    return from_nvmetcli(data)
