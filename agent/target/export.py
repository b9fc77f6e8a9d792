"""From pools to the desired nvmet tree: subsystems per host (or shared), namespaces, ports."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from nvmet.ids import namespace_nguid, namespace_uuid
from nvmet.model import Host, Namespace, Port, Subsystem

from ..config.model import Config, DeviceBacking, PortConfig, TargetPool
from ..config.types import IPAddress
from ..naming import subsystem_nqn
from .steps import Volume


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


def pool_hosts(pool: TargetPool) -> list[str | None]:
    """Host names that get a subsystem: each listed host, or [None] for one shared subsystem.

    An empty host list exports nothing (unless a shared pool explicitly allows any host);
    in a whole-device pool only the hosts that are given a device get a subsystem.
    """
    if pool.shared:
        return [None] if (pool.hosts or pool.allow_any_host) else []
    names = [h.name for h in pool.hosts]
    if isinstance(pool.backing, DeviceBacking):
        # A whole-device pool carves nothing: a host without a device gets no subsystem.
        with_devices = {d.host for d in pool.backing.devices}
        return [n for n in names if n in with_devices]
    return names


def pool_subsystem_nqns(cfg: Config, pool: TargetPool) -> dict[str | None, str]:
    """``{host name or None: subsystem NQN}`` for the pool."""
    return {host: subsystem_nqn(cfg.node.nqn_prefix, cfg.node.name, pool.name, host)
            for host in pool_hosts(pool)}


def export_pool(cfg: Config, pool: TargetPool, volumes: Iterable[Volume],
                live_nqns: frozenset[str]) -> PoolExport:
    """The subsystems of ``pool`` holding ``volumes``.

    Model and serial are set only when a subsystem is created (the kernel fixes
    them once a host has identified the controller): ``live_nqns`` says which exist.
    """
    nqns = pool_subsystem_nqns(cfg, pool)
    by_host: dict[str | None, list[Volume]] = {}
    for v in volumes:
        by_host.setdefault(v.host, []).append(v)
    subsystems = []
    for host, nqn in nqns.items():
        attrs = {"allow_any_host": pool.allow_any_host}
        if nqn not in live_nqns:
            attrs |= {"model": pool.model, "serial": serial_for(nqn)}
        allowed = ([h.nqn for h in pool.hosts] if host is None
                   else [h.nqn for h in pool.hosts if h.name == host])
        if pool.allow_any_host:
            allowed = []
        namespaces = [
            Namespace(nsid=v.nsid, device_path=v.path,
                      device_uuid=namespace_uuid(nqn, v.nsid),
                      device_nguid=namespace_nguid(nqn, v.nsid), enable=True,
                      buffered_io=v.buffered_io if v.size is not None else None)
            for v in sorted(by_host.get(host, []), key=lambda v: v.nsid)]
        subsystems.append(Subsystem(nqn=nqn, attrs=attrs, namespaces=namespaces,
                                    allowed_hosts=frozenset(allowed)))
    port_ids = tuple(p.id for p in cfg.target.ports if p.name in pool.ports) if cfg.target else ()
    return PoolExport(pool.name, tuple(subsystems), port_ids,
                      tuple(sorted({h.nqn for h in pool.hosts})) if subsystems else ())


def desired_port(port: PortConfig, subsystems: Iterable[str]) -> Port:
    """The nvmet port for a configured port, linking ``subsystems``."""
    params = {}
    if port.inline_data_size is not None:
        params["inline_data_size"] = port.inline_data_size
    return Port(id=port.id,
                addr={"trtype": port.transport, "adrfam": IPAddress(port.address).family,
                      "traddr": port.address, "trsvcid": str(port.service)},
                params=params, subsystems=frozenset(subsystems))


def desired_hosts(nqns: Iterable[str]) -> list[Host]:
    return [Host(nqn=n) for n in sorted(set(nqns))]
