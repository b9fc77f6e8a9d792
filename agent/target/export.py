"""From pools to the desired nvmet tree: subsystems per host (or shared), namespaces, ports."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nvmet.model import Host, Namespace, Port, Subsystem

from ..config.model import Config, PortConfig, TargetPool
from ..config.types import IPAddress
from .backings.base import Volume
from .desired import pool_nqn


@dataclass(frozen=True)
class PoolExport:
    """The nvmet objects one pool wants: subsystems (with namespaces) and their ports."""

    pool: str
    subsystems: tuple[Subsystem, ...]
    ports: tuple[int, ...]
    hosts: tuple[str, ...]


def serial_for(nqn: str) -> str:
    """A stable 20-character serial number (attr_serial) for a subsystem."""
    return hashlib.sha256(nqn.encode()).hexdigest()[:20]


def export_pool(cfg: Config, pool: TargetPool, hosts: Iterable[str | None],
                volumes: Iterable[Volume], fixed_nqns: frozenset[str],
                kept: Mapping[tuple[str | None, int], Namespace] | None = None) -> PoolExport:
    """The subsystems of ``pool`` for ``hosts`` (its layout), holding ``volumes``.

    Each namespace carries the identity recorded with its storage (``Volume.uuid``);
    ``kept`` are live namespaces to keep exactly as they are (a refused change). Model
    and serial are left alone on the subsystems in ``fixed_nqns``: the kernel fixes them
    once a host has identified the controller, which a subsystem linked into a port may
    have been. Any other (new, or left half-made by a killed pass) gets them.
    """
    by_host: dict[str | None, dict[int, Namespace]] = {}
    for v in volumes:
        by_host.setdefault(v.host, {})[v.nsid] = Namespace(
            nsid=v.nsid, device_path=v.path, device_uuid=v.uuid, device_nguid=v.nguid,
            enable=True, buffered_io=v.buffered_io if v.size is not None else None)
    for (host, nsid), ns in (kept or {}).items():
        by_host.setdefault(host, {})[nsid] = ns
    subsystems = []
    for host in hosts:
        nqn = pool_nqn(cfg, pool.name, host)
        attrs = {"allow_any_host": pool.allow_any_host}
        if nqn not in fixed_nqns:
            attrs |= {"model": pool.model, "serial": serial_for(nqn)}
        allowed = ([h.nqn for h in pool.hosts] if host is None
                   else [h.nqn for h in pool.hosts if h.name == host])
        if pool.allow_any_host:
            allowed = []
        namespaces = [ns for _, ns in sorted(by_host.get(host, {}).items())]
        subsystems.append(Subsystem(nqn=nqn, attrs=attrs, namespaces=namespaces,
                                    allowed_hosts=frozenset(allowed)))
    port_ids = tuple(p.id for p in cfg.target.ports if p.name in pool.ports) if cfg.target else ()
    return PoolExport(pool.name, tuple(subsystems), port_ids,
                      tuple(sorted({h.nqn for h in pool.hosts})) if subsystems else ())


def desired_port(port: PortConfig, subsystems: Iterable[str], tsas: bool = False) -> Port:
    """The nvmet port for a configured port, linking ``subsystems``. ``tsas``: the kernel
    has NVMe/TCP TLS (addr_tsas), so a TCP port without TLS says so too (TLS turned off
    is then written, not left as it was)."""
    params = {}
    if port.inline_data_size is not None:
        params["inline_data_size"] = port.inline_data_size
    addr = {"trtype": port.transport, "adrfam": IPAddress(port.address).family,
            "traddr": port.address, "trsvcid": str(port.service)}
    if port.tls == "required":
        addr |= {"tsas": "tls1.3", "treq": "required"}
    elif tsas and port.transport == "tcp":
        addr |= {"tsas": "none", "treq": "not specified"}
    # Every namespace kvagent exports is in ANA group 1 (nvmet's default ana_grpid): the
    # port's state there is what GPU hosts see for each path through this port.
    return Port(id=port.id, addr=addr, params=params, subsystems=frozenset(subsystems),
                ana_groups={1: port.ana_state})


def desired_hosts(nqns: Iterable[str],
                  attrs: Mapping[str, Mapping[str, str]] | None = None) -> list[Host]:
    """The nvmet hosts for ``nqns``, with their attributes (DH-HMAC-CHAP) from ``attrs``."""
    attrs = attrs or {}
    return [Host(nqn=n, attrs=dict(attrs.get(n, {}))) for n in sorted(set(nqns))]
