"""A fabrics address: where an NVMe-oF controller connects, and optionally from where.

:class:`FabricsAddress` is the one value kvagent uses wherever it meets such an address:
a pool's target in the config, a discovery log record, a controller's sysfs ``address``
attribute (and ``nvme list-subsys``'s copy of it), a subsystem path recorded in
``initiator.json``, and the connect step's target. It owns the normalisation (transport
lower case, IP addresses in canonical text: ``0:0::1`` is ``::1``, service the text of
an int: ``04420`` is ``4420``) and the comparison that tells whether a controller is the
one wanted (:meth:`FabricsAddress.same_endpoint`).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

#: The well-known NQN of discovery controllers.
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"


def canonical_traddr(traddr: str | None) -> str | None:
    """Canonical text of a transport address: IPv4/IPv6 compressed and lower case, brackets
    around an IPv6 address dropped. Other addresses (FC WWNs, PCI addresses, an IPv4
    address with leading zeros, which Python does not read) are lower-cased as given.
    Canonical text is its own canonical text."""
    return None if traddr is None else _canonical_traddr(traddr)


@functools.lru_cache(maxsize=4096)
def _canonical_traddr(traddr: str) -> str:
    """:func:`canonical_traddr` of a text, remembered: a host sees its few addresses in
    every controller it reads, every pass."""
    text = traddr.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(bare).compressed.lower()
    except ValueError:
        return text.lower()


def canonical_service(trsvcid: str | int | None) -> str | None:
    """Canonical text of a service id: a port number as the text of its int (``04420`` is
    ``4420``), anything else lower-cased as given."""
    if trsvcid is None:
        return None
    text = str(trsvcid).strip()
    return str(int(text)) if text.isascii() and text.isdigit() else text.lower()


class TargetPort(Protocol):
    """What the config says of a storage host's port (:class:`agent.config.model.TargetRef`)."""

    @property
    def transport(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def service(self) -> int: ...


@dataclass(frozen=True)
class FabricsAddress:
    """Transport, target address (``traddr``) and service (``trsvcid``) of an NVMe-oF
    port, and the host side a controller connects from (``host_iface``, ``host_traddr``:
    None where not chosen). Values are normalised on construction, so ``==`` compares
    endpoints and host sides; ``src_addr`` (the local address the kernel picked, shown in
    sysfs, kept as the kernel wrote it) is there for reports and never compared. A PCIe
    controller's address has only its transport.
    """

    transport: str
    traddr: str | None
    trsvcid: str | None
    host_iface: str | None = None
    host_traddr: str | None = None
    src_addr: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "transport", (self.transport or "").strip().lower())
        put(self, "traddr", canonical_traddr(self.traddr))
        put(self, "trsvcid", canonical_service(self.trsvcid))
        put(self, "host_iface", (self.host_iface or "").strip() or None)
        put(self, "host_traddr", canonical_traddr(self.host_traddr) or None)
        put(self, "src_addr", (self.src_addr or "").strip() or None)  # as the kernel wrote it

    # -- constructors ---------------------------------------------------------
    @classmethod
    def from_config(cls, port: TargetPort) -> FabricsAddress:
        """A pool's target port in the config (``transport``, ``address``, ``service``)."""
        return cls(port.transport, port.address, port.service)

    @classmethod
    def from_discovery(cls, record: Mapping[str, Any]) -> FabricsAddress:
        """A discovery log record (its ``trtype``, ``traddr``, ``trsvcid``; keys in lower
        case, as nvme-cli's JSON names them). A record without a service has ``""``."""
        def text(key: str) -> str | None:
            value = record.get(key)
            return None if value is None else str(value).strip()
        return cls(text("trtype") or "", text("traddr"), text("trsvcid") or "")

    @classmethod
    def from_sysfs(cls, transport: str, text: str) -> FabricsAddress:
        """A controller's ``transport`` and ``address`` attributes as sysfs shows them
        (``traddr=…,trsvcid=…[,host_traddr=…][,host_iface=…][,src_addr=…]``; key=value
        pairs separated by ``,``, or by spaces as very old kernels and nvme-cli 1.x wrote).
        A PCIe controller's address is a bare PCI address: it has no fabrics fields."""
        fields: dict[str, str] = {}
        for part in re.split(r"[,\s]+", text.strip()):
            key, sep, value = part.partition("=")
            if sep and key:
                fields[key.strip()] = value.strip()
        return cls(transport, fields.get("traddr"), fields.get("trsvcid"),
                   host_iface=fields.get("host_iface"), host_traddr=fields.get("host_traddr"),
                   src_addr=fields.get("src_addr"))

    def with_host(self, host_iface: str | None, host_traddr: str | None) -> FabricsAddress:
        """This endpoint, connected to from ``host_iface`` / ``host_traddr`` (None: any)."""
        return replace(self, host_iface=host_iface, host_traddr=host_traddr)

    # -- comparison -----------------------------------------------------------
    @property
    def endpoint(self) -> FabricsAddress:
        """The target side alone (transport, address, service): no host side, no src_addr."""
        return FabricsAddress(self.transport, self.traddr, self.trsvcid)

    def same_endpoint(self, found: FabricsAddress) -> bool:
        """Whether ``found`` (a controller's address) is this wanted one: the same transport,
        address and service; its host address and interface only where this one chooses
        them; ``src_addr`` never."""
        return (found.transport == self.transport and found.traddr == self.traddr
                and found.trsvcid == self.trsvcid
                and (self.host_traddr is None or found.host_traddr == self.host_traddr)
                and (self.host_iface is None or found.host_iface == self.host_iface))

    def describe(self) -> str:
        """``tcp 10.0.0.1:4420``: the endpoint, as logs and actions show it."""
        return f"{self.transport} {self.traddr}:{self.trsvcid}"
