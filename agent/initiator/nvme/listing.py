"""What this host has, as nvme-cli lists it: ``nvme list-subsys``, ``nvme list`` and a
controller's active namespaces (``nvme list-ns``).

- ``list-subsys``: 2.x prints a list of host objects ``[{"HostNQN", "HostID",
  "Subsystems": [{"Name", "NQN", ["IOPolicy", ...], "Paths": [...]}]}]``, one
  per host identity; 1.x printed ``{"Subsystems": [...]}``.
- ``list``: up to 2.10 a flat ``{"Devices": [{"NameSpace": 1, "DevicePath": ...}]}``;
  from 2.11 the nested host → subsystem → controller → namespace layout that
  2.3 printed only for ``list -v``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...fabrics import FabricsAddress
from ...system.run import Runner
from .output import NVME, extract_json, get, int_of, list_of, text_of

#: Seconds nvme-cli may take to list (or disconnect).
LIST_TIMEOUT = 30.0


@dataclass(frozen=True)
class SubsysPath:
    """A controller (path) of a subsystem as ``nvme list-subsys`` reports it."""

    name: str
    #: its ``Transport`` and ``Address`` (as sysfs shows them)
    address: FabricsAddress
    state: str | None
    ana_state: str | None = None


@dataclass(frozen=True)
class ListedSubsystem:
    """One subsystem of ``nvme list-subsys``, under the host identity it was listed for."""

    name: str | None
    nqn: str
    hostnqn: str | None
    hostid: str | None
    iopolicy: str | None
    paths: tuple[SubsysPath, ...]


@dataclass(frozen=True)
class ListedNamespace:
    """One namespace block device of ``nvme list``."""

    device: str
    nsid: int | None
    subsysnqn: str | None = None
    controller: str | None = None
    serial: str | None = None
    model: str | None = None
    firmware: str | None = None
    used_bytes: int | None = None
    physical_size: int | None = None
    sector_size: int | None = None


def _paths(items: Any) -> tuple[SubsysPath, ...]:
    out = []
    for p in list_of(items):
        name = text_of(get(p, "Name", "Controller"))
        if not name:
            continue
        out.append(SubsysPath(
            name=name, address=FabricsAddress.from_sysfs(text_of(get(p, "Transport")) or "",
                                                         text_of(get(p, "Address")) or ""),
            state=text_of(get(p, "State")), ana_state=text_of(get(p, "ANAState")),
        ))
    return tuple(out)


def _subsystems(items: Any, hostnqn: str | None, hostid: str | None) -> list[ListedSubsystem]:
    out: list[ListedSubsystem] = []
    for s in list_of(items):
        nqn = text_of(get(s, "NQN", "SubsystemNQN"))
        if nqn is None:
            # nvme-cli 1.x printed a subsystem's Paths as a separate object after it.
            paths = _paths(get(s, "Paths"))
            if out and paths:
                last = out[-1]
                out[-1] = ListedSubsystem(last.name, last.nqn, last.hostnqn, last.hostid,
                                          last.iopolicy, last.paths + paths)
            continue
        out.append(ListedSubsystem(
            name=text_of(get(s, "Name", "Subsystem")), nqn=nqn, hostnqn=hostnqn, hostid=hostid,
            iopolicy=text_of(get(s, "IOPolicy")), paths=_paths(get(s, "Paths")),
        ))
    return out


def parse_list_subsys(text: str) -> list[ListedSubsystem]:
    """Subsystems of ``nvme list-subsys -o json`` (2.x host list, or 1.x object)."""
    data = extract_json(text)
    hosts = data if isinstance(data, list) else [data]
    out: list[ListedSubsystem] = []
    for host in hosts:
        if not isinstance(host, Mapping):
            continue
        if get(host, "Subsystems") is None and get(host, "NQN") is not None:
            out += _subsystems([host], None, None)  # a bare subsystem object
            continue
        out += _subsystems(get(host, "Subsystems"), text_of(get(host, "HostNQN")),
                           text_of(get(host, "HostID")))
    return out


def _flat_namespace(d: Any) -> ListedNamespace | None:
    device = text_of(get(d, "DevicePath"))
    if not device:
        return None
    return ListedNamespace(
        device=device, nsid=int_of(get(d, "NameSpace", "Namespace", "NSID")),
        subsysnqn=text_of(get(d, "SubsystemNQN")), serial=text_of(get(d, "SerialNumber")),
        model=text_of(get(d, "ModelNumber")), firmware=text_of(get(d, "Firmware")),
        used_bytes=int_of(get(d, "UsedBytes")), physical_size=int_of(get(d, "PhysicalSize")),
        sector_size=int_of(get(d, "SectorSize")),
    )


def _nested_namespace(ns: Any, subsysnqn: str | None, ctrl: Any) -> ListedNamespace | None:
    name = text_of(get(ns, "NameSpace", "Namespace"))
    if not name or name.isdigit():
        return None
    return ListedNamespace(
        device=name if name.startswith("/") else f"/dev/{name}", nsid=int_of(get(ns, "NSID")),
        subsysnqn=subsysnqn, controller=text_of(get(ctrl, "Controller")) if ctrl else None,
        serial=text_of(get(ctrl, "SerialNumber")) if ctrl else None,
        model=text_of(get(ctrl, "ModelNumber")) if ctrl else None,
        firmware=text_of(get(ctrl, "Firmware")) if ctrl else None,
        used_bytes=int_of(get(ns, "UsedBytes")), physical_size=int_of(get(ns, "PhysicalSize")),
        sector_size=int_of(get(ns, "SectorSize")),
    )


def parse_list(text: str) -> list[ListedNamespace]:
    """Namespaces of ``nvme list -o json``: the flat (≤2.10) or nested (≥2.11, ``-v``) layout."""
    data = extract_json(text)
    out: list[ListedNamespace] = []
    seen: set[str] = set()

    def add(ns: ListedNamespace | None) -> None:
        if ns and ns.device not in seen:
            seen.add(ns.device)
            out.append(ns)

    for dev in list_of(get(data, "Devices")):
        if get(dev, "Subsystems") is None:
            add(_flat_namespace(dev))
            continue
        for sub in list_of(get(dev, "Subsystems")):
            nqn = text_of(get(sub, "SubsystemNQN", "NQN"))
            ctrls = list_of(get(sub, "Controllers"))
            for ctrl in ctrls:
                for ns in list_of(get(ctrl, "Namespaces")):
                    add(_nested_namespace(ns, nqn, ctrl))
            # Multipath heads are listed under the subsystem, not a controller.
            first = ctrls[0] if ctrls else None
            for ns in list_of(get(sub, "Namespaces")):
                add(_nested_namespace(ns, nqn, first))
    return out


def parse_list_ns(text: str) -> list[int]:
    """nsids from ``nvme list-ns`` text output (``[   0]:0x1`` per line) or its JSON form."""
    stripped = text.strip()
    if stripped.startswith("{"):
        data = json.loads(stripped)
        return sorted(int(e["nsid"]) for e in data.get("nsid_list", []))
    return sorted(int(m.group(1), 16) for m in re.finditer(r"\]\s*:\s*0x([0-9a-fA-F]+)", text))


def list_subsys(run: Runner, timeout: float = LIST_TIMEOUT) -> list[ListedSubsystem]:
    """``nvme list-subsys``: the subsystems this host has controllers of."""
    result = run([NVME, "list-subsys", "--output-format", "json"], timeout=timeout)
    return parse_list_subsys(result.stdout) if result.stdout.strip() else []


def list_devices(run: Runner, timeout: float = LIST_TIMEOUT) -> list[ListedNamespace]:
    """``nvme list`` (the namespaces' block devices)."""
    result = run([NVME, "list", "--output-format", "json"], timeout=timeout)
    return parse_list(result.stdout) if result.stdout.strip() else []


def list_ns(run: Runner, controller: str, timeout: float = LIST_TIMEOUT) -> list[int]:
    """Active namespace ids of a controller (Identify active NS list), e.g. ``nvme2``."""
    result = run([NVME, "list-ns", f"/dev/{controller}"], timeout=timeout)
    return parse_list_ns(result.stdout)
