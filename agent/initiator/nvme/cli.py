"""nvme-cli as one object: :class:`NvmeCli` runs each command of :mod:`.discovery`,
:mod:`.controllers` and :mod:`.listing` through a :class:`~agent.system.run.Runner`,
with the kernel log, the time limits and the ``/dev/nvme-fabrics`` writer it was given
(what the initiator's steps get, and what tests replace); and ``nvme version``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ...system.run import Runner, default_runner
from . import controllers, discovery, listing
from .controllers import CONNECT_TIMEOUT
from .discovery import DiscoveryEntry
from .kmsg import KernelLog, KernelLogReader
from .listing import LIST_TIMEOUT
from .options import FabricsOptions, fabrics_write_command
from .output import NVME, NvmeCliError


@dataclass(frozen=True)
class NvmeCliVersion:
    """``nvme version``: nvme-cli and libnvme versions."""

    raw: str
    version: tuple[int, ...]
    libnvme: tuple[int, ...] | None

    @property
    def text(self) -> str:
        """The version as text (``2.3``)."""
        return ".".join(str(p) for p in self.version)


def parse_version(text: str) -> NvmeCliVersion:
    """Parse ``nvme version`` (``nvme version 2.3 (git 2.3)\\nlibnvme version 1.3 ...``)."""
    def numbers(label: str) -> tuple[int, ...] | None:
        m = re.search(rf"^{label} version\s+v?(\d+(?:\.\d+)*)", text, re.MULTILINE)
        return tuple(int(p) for p in m.group(1).split(".")) if m else None
    version = numbers("nvme")
    if version is None:
        raise NvmeCliError(f"cannot read the nvme-cli version from {text.strip()[:80]!r}")
    return NvmeCliVersion(raw=text.strip(), version=version, libnvme=numbers("libnvme"))


class NvmeCli:
    """nvme-cli commands kvagent needs, through a :class:`Runner`."""

    def __init__(self, runner: Runner | None = None, *, kernel_log: KernelLogReader | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, list_timeout: float = LIST_TIMEOUT,
                 fabrics_write: Callable[[str, float], str] | None = None):
        self.run = runner or default_runner()
        #: writes options to /dev/nvme-fabrics and returns its answer, within a time
        #: limit (a seam for tests; by default a command: :func:`fabrics_write_command`)
        self.fabrics_write = fabrics_write or (
            lambda options, timeout: fabrics_write_command(self.run, options, timeout))
        self.kernel_log: KernelLogReader = kernel_log if kernel_log is not None else KernelLog()
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout

    def version(self) -> NvmeCliVersion:
        """``nvme version``."""
        return parse_version(self.run([NVME, "version"], timeout=self.list_timeout).stdout)

    def discover(self, transport: str, traddr: str, trsvcid: str | int, *,
                 hostnqn: str | None = None, hostid: str | None = None,
                 host_traddr: str | None = None,
                 host_iface: str | None = None, tls: bool = False,
                 device: str | None = None) -> list[DiscoveryEntry]:
        """:func:`.discovery.discover` within the connect timeout."""
        return discovery.discover(self.run, self.kernel_log, transport, traddr, trsvcid,
                                  timeout=self.connect_timeout, hostnqn=hostnqn,
                                  hostid=hostid, host_traddr=host_traddr,
                                  host_iface=host_iface, tls=tls, device=device)

    def add_controller(self, transport: str, traddr: str, trsvcid: str | int, subsysnqn: str,
                       *, hostnqn: str, hostid: str | None = None,
                       host_iface: str | None = None, host_traddr: str | None = None,
                       options: FabricsOptions | None = None,
                       timeout: float | None = None, duplicate: bool = True) -> str:
        """:func:`.controllers.add_controller` through this object's ``fabrics_write``."""
        return controllers.add_controller(
            self.fabrics_write, self.kernel_log, transport, traddr, trsvcid, subsysnqn,
            hostnqn=hostnqn, hostid=hostid, host_iface=host_iface, host_traddr=host_traddr,
            options=options, timeout=timeout, connect_timeout=self.connect_timeout,
            duplicate=duplicate)

    def disconnect(self, *, device: str | None = None, nqn: str | None = None,
                   timeout: float | None = None) -> int | None:
        """:func:`.controllers.disconnect` within ``timeout`` (default: the list timeout)."""
        return controllers.disconnect(
            self.run, device=device, nqn=nqn,
            timeout=self.list_timeout if timeout is None else timeout)

    def list_ns(self, controller: str) -> list[int]:
        """Active namespace ids of a controller (Identify active NS list), e.g. ``nvme2``."""
        return listing.list_ns(self.run, controller, self.list_timeout)
