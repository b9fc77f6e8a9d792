"""Find a pool's namespaces as block devices, by subsystem NQN and namespace id.

Each namespace is looked up by what the kernel says it is — the subsystem it belongs
to and its nsid — never guessed from device names (which change across reconnects
and boots). Its uuid is the identity the storage host bound to its storage; the
filesystem kvagent makes on it is derived from that uuid, so a namespace whose
storage changed is never taken for the old one. After a connect the block device
appears a moment later: sysfs is scanned, and a pyudev monitor (``block``
subsystem) wakes the wait up early; the wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from .. import progress
from ..errors import KvagentError
from ..log import get_logger
from .sysfs import NamespaceHead, Sysfs

log = get_logger("initiator.devices")
#: The system calls the udev monitor of :class:`UdevWaiter` makes (pyudev: libudev's
#: netlink socket, polled); the unit's SystemCallFilter must allow them
#: (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("socket", "bind", "setsockopt", "getsockname", "recvmsg", "poll")


class DeviceNotFound(KvagentError):
    """A namespace's block device did not appear in time."""

    def __init__(self, subsysnqn: str, missing: Sequence[int], timeout: float):
        self.subsysnqn = subsysnqn
        self.missing = tuple(missing)
        which = ", ".join(f"nsid {nsid}" for nsid in missing)
        super().__init__(
            f"no block device for {which} of {subsysnqn} after {timeout:g}s",
            "check that the storage host exports the namespace enabled (kvagent status "
            "there), and that the controller is live (nvme list-subsys)")


@dataclass(frozen=True)
class PathInfo:
    """One path to a namespace: the controller, its state and the path's ANA state."""

    name: str
    controller: str | None
    controller_state: str | None
    ana_state: str | None


@dataclass(frozen=True)
class NamespaceDevice:
    """A pool namespace found on this host."""

    subsysnqn: str
    nsid: int
    uuid: str
    device: str
    name: str
    size_bytes: int | None
    logical_block_size: int | None
    paths: tuple[PathInfo, ...]

    @property
    def live_paths(self) -> tuple[PathInfo, ...]:
        return tuple(p for p in self.paths if p.controller_state == "live")

    @classmethod
    def from_head(cls, subsysnqn: str, nsid: int, uuid: str, head: NamespaceHead
                  ) -> NamespaceDevice:
        return cls(subsysnqn=subsysnqn, nsid=nsid, uuid=uuid, device=head.device,
                   name=head.name, size_bytes=head.size_bytes,
                   logical_block_size=head.logical_block_size,
                   paths=tuple(PathInfo(p.name, p.controller, p.controller_state, p.ana_state)
                               for p in head.paths))


class Waiter(Protocol):
    """Blocks until something may have changed (or ``timeout`` seconds pass)."""

    def __enter__(self) -> Waiter: ...
    def __exit__(self, *exc: object) -> None: ...
    def wait(self, timeout: float) -> None: ...


class UdevWaiter:
    """Wakes up on block-device uevents (pyudev netlink monitor); sleeps when udev is absent."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep, poll: float = 0.5):
        self._sleep = sleep
        self._poll = poll
        self._monitor = None

    def __enter__(self) -> UdevWaiter:
        try:
            import pyudev

            monitor = pyudev.Monitor.from_netlink(pyudev.Context())
            monitor.filter_by("block")
            monitor.start()
            self._monitor = monitor
        except Exception as exc:  # no netlink here (not root, no udev): poll instead
            log.debug("no udev monitor, polling sysfs", error=str(exc))
            self._monitor = None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._monitor = None  # pyudev closes the socket when the monitor is collected

    def wait(self, timeout: float) -> None:
        if self._monitor is None:
            self._sleep(min(timeout, self._poll))
            return
        # One event is enough to rescan; poll again in case the event was not ours.
        self._monitor.poll(timeout=min(timeout, self._poll * 4))


def find_namespace(sysfs: Sysfs, subsysnqn: str, nsid: int) -> NamespaceDevice | None:
    """The block device of namespace ``nsid`` of ``subsysnqn`` now, or None."""
    head = sysfs.namespace_by_nsid(subsysnqn, nsid)
    if head is None or not head.uuid:
        return None
    return NamespaceDevice.from_head(subsysnqn, nsid, head.uuid.lower(), head)


def wait_for_namespaces(sysfs: Sysfs, subsysnqn: str, nsids: Sequence[int], *,
                        timeout: float = 30.0, waiter: Waiter | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        heads: Mapping[int, NamespaceHead] | None = None
                        ) -> list[NamespaceDevice]:
    """Wait (at most ``timeout`` s) until every namespace in ``nsids`` has a block device.

    ``heads``: the subsystem's namespaces as the caller just read them
    (:meth:`Sysfs.subsystem_namespaces`), used as the first look instead of reading
    them again. The udev monitor is only set up when that first look misses one (a
    converged pass finds everything and starts nothing). Returns them in ``nsids``
    order; raises :class:`DeviceNotFound` naming the missing nsids and the subsystem.
    """
    wanted = list(dict.fromkeys(nsids))
    found: dict[int, NamespaceDevice] = {}
    deadline = clock() + timeout

    def look(heads: Mapping[int, NamespaceHead]) -> bool:
        for nsid in wanted:
            head = heads.get(nsid)
            if nsid not in found and head is not None and head.uuid:
                found[nsid] = NamespaceDevice.from_head(subsysnqn, nsid, head.uuid.lower(),
                                                        head)
        return len(found) == len(wanted)

    if not look(sysfs.subsystem_namespaces(subsysnqn) if heads is None else heads):
        with waiter or UdevWaiter() as w:
            while True:
                progress.checkpoint()  # SIGTERM: stop waiting
                remaining = deadline - clock()
                if remaining <= 0:
                    missing = [n for n in wanted if n not in found]
                    raise DeviceNotFound(subsysnqn, missing, timeout)
                w.wait(remaining)
                if look(sysfs.subsystem_namespaces(subsysnqn)):
                    break
    log.debug("namespaces found", subsysnqn=subsysnqn,
              devices={n: d.device for n, d in found.items()})
    return [found[n] for n in nsids]
