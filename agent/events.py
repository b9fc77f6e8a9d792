"""What wakes ``kvagent run`` between its full passes: udev events, coalesced.

The kernel announces what matters to a GPU host as udev events: an NVMe controller
going live, resetting, reconnecting or away (subsystem ``nvme``, with ``NVME_EVENT`` or
``NVME_AEN`` on a change), and namespaces' block devices coming and going (subsystem
``block``, ``nvme*``). Each such event makes the agent collect at once (status and
metrics show a lost controller within the debounce) and, on a host with initiator
pools, run a targeted attach pass (:func:`agent.reconcile.run_pass` with
``attach_only``): connect, find, mount and hand off, never a detach, never the storage
side. Everything else on the host (loop, dm, sd devices; events of kvagent's own
mkfs/mount) is ignored or folded into the same batch.

A controller that loses its connection sends no event while it reconnects (the kernel
emits ``NVME_EVENT=connected`` when it is back, nothing when it drops), so
:class:`ControllerWatch` reads each controller's ``state`` in sysfs every
:data:`WATCH_PERIOD` seconds (one read per controller, of a file it keeps open; no
command) and puts a ``controller`` event on a change: a lost controller shows in status
and metrics within a second.

A storm is one batch: :class:`Batcher` waits until the events stop for
:data:`QUIET` seconds (:data:`FIRST_QUIET` after the first: a lone event is acted on at
once; at most :data:`LONGEST` after the first), so 256 events make one collect and one
pass. Netlink can drop events (its buffer overflows under a
storm): the full pass on ``health.full_interval`` bounds what a lost event can hide.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fabrics import DISCOVERY_NQN
from .log import get_logger

log = get_logger("events")

#: A batch ends once no event came for this long...
QUIET = 0.2
#: ...but after its first event only this long: a lone event (a namespace added) is acted
#: on at once, while the events of a storm follow each other closer than this and keep
#: the batch open for QUIET each.
FIRST_QUIET = 0.05
#: ...or this long after its first event, whatever comes.
LONGEST = 1.0


@dataclass(frozen=True)
class DeviceEvent:
    """A udev event kvagent acts on: what changed (``kind``) and its kernel name."""

    kind: str  # "controller" | "namespace" | "aen"
    action: str
    name: str


def classify(subsystem: str | None, action: str | None, sys_name: str | None,
             properties: Mapping[str, str]) -> DeviceEvent | None:
    """The event kvagent acts on for a udev event, or None for one it ignores.

    - ``nvme`` controllers (``nvme0``; not ``nvme-fabrics`` or ``nvme-subsystem``): any
      action; a ``change`` carrying ``NVME_AEN`` (an asynchronous event: a discovery log
      change, a namespace list change) is an ``aen``;
    - ``block`` devices named ``nvme*`` (namespaces and their partitions): add, remove,
      change; a change the kernel made for a new capacity (``RESIZE=1``) is a
      ``resize``, any other (udev's own after a program wrote the device, as kvagent's
      mkfs does; a ``change`` written to ``uevent``) stays a ``change``.
    """
    name, action = sys_name or "", action or ""
    if subsystem == "nvme" and name.startswith("nvme") and name[4:].isdigit():
        kind = "aen" if action == "change" and "NVME_AEN" in properties else "controller"
        return DeviceEvent(kind, action, name)
    if subsystem == "block" and name.startswith("nvme") and action in ("add", "remove",
                                                                        "change"):
        resize = action == "change" and properties.get("RESIZE") == "1"
        return DeviceEvent("namespace", "resize" if resize else action, name)
    return None


@dataclass
class Batch:
    """The events of one batch, for the log and the metrics."""

    events: list[DeviceEvent] = field(default_factory=list)
    dropped: int = 0
    #: What ended the batch when it was not a device event ("reload", "stop"...): the
    #: loop handles it next.
    next: Any = None

    @property
    def count(self) -> int:
        return len(self.events) + self.dropped

    @property
    def something_appeared(self) -> bool:
        """Whether an attach pass may find work: a namespace added or changed, a
        controller live again, an AEN; not when things only went away or a connection
        dropped (a collect shows that; the attach pass would only wait on a reconnecting
        controller). Events not kept count as appearing."""
        return self.dropped > 0 or any(_appeared(e) for e in self.events)

    @property
    def rediscover(self) -> bool:
        """Whether the storage hosts may offer new subsystems: an AEN (a discovery log
        change comes as one; events not kept count as one)."""
        return self.dropped > 0 or any(e.kind == "aen" for e in self.events)

    @property
    def something_went(self) -> bool:
        """Whether something went away: a controller removed or no longer live, a
        namespace removed (events not kept count as going)."""
        return self.dropped > 0 or any(_went(e) for e in self.events)

    def summary(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for e in self.events:
            kinds[e.kind] = kinds.get(e.kind, 0) + 1
        return kinds


def _appeared(event: DeviceEvent) -> bool:
    """Namespaces added or resized, an AEN, a controller live again. Not a controller's own
    add, change or remove: every ``nvme discover`` (the attach pass runs one per pool)
    makes and removes a discovery controller, whose events would start the next pass,
    for ever (found on the real kernel). Not a namespace's plain ``change``: udev makes
    one after every program that wrote the device (kvagent's own mkfs made each attach
    pass start another, a second after it, on the real kernel). A new data controller's
    namespaces bring their own block events."""
    if event.kind == "aen":
        return True
    if event.kind == "controller":
        return event.action == "state live"
    return event.action in ("add", "resize")


def _went(event: DeviceEvent) -> bool:
    if event.kind == "controller":
        return event.action == "remove" or (event.action.startswith("state ")
                                            and event.action != "state live")
    return event.kind == "namespace" and event.action == "remove"


#: How often :class:`ControllerWatch` reads the controllers' states.
WATCH_PERIOD = 0.5
#: Looks between two listings of ``class/nvme`` when no udev event asks for one (10 s).
RELIST_EVERY = 20

#: The udev monitor socket's receive buffer (systemd's own monitors ask 128 MiB): the
#: default (about 200 KiB) held 153 of a 256-event storm on the real kernel under TCG.
RECEIVE_BUFFER = 16 * 1024 * 1024
#: The system calls the udev monitor this module starts makes (pyudev: libudev's
#: netlink socket, read in pyudev's observer thread, which polls it and a pipe); the
#: unit's SystemCallFilter must allow them (tests/unit/health/test_systemd_syscalls.py).
SYSCALLS = ("socket", "bind", "setsockopt", "getsockopt", "getsockname", "recvmsg", "poll",
            "pipe2")
#: NETLINK_KOBJECT_UEVENT: the protocol of udev's monitor socket.
NETLINK_KOBJECT_UEVENT = 15


def grow_receive_buffer(monitor: Any, size: int = RECEIVE_BUFFER) -> int:
    """Ask for a ``size``-byte receive buffer on the udev monitor's socket; the size the
    kernel then reports (0: unknown).

    libudev asks with SO_RCVBUFFORCE, which needs CAP_NET_ADMIN; the shipped unit leaves
    that capability out, so there the buffer is asked with SO_RCVBUF, which the kernel
    caps at ``net.core.rmem_max`` (twice Debian's default buffer with its defaults; more
    where an operator raised rmem_max)."""
    try:
        monitor.set_receive_buffer_size(size)
    except Exception as exc:  # EPERM without CAP_NET_ADMIN
        forced = str(exc)
    else:
        forced = ""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT,
                         fileno=monitor.fileno())
    try:
        if forced:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    except OSError as exc:
        log.info("udev receive buffer left at its default", error=str(exc))
        return 0
    finally:
        sock.detach()  # (the monitor's socket: pyudev closes it)
    if forced:
        log.info("udev receive buffer capped by net.core.rmem_max (no CAP_NET_ADMIN)",
                 asked=size, got=got, error=forced)
    return got

#: At most this many events are kept per batch (the rest only counted).
BATCH_KEEP = 64


class Batcher:
    """Takes the device events that follow a first one off the loop's queue.

    Another item (``"reload"``, ``"stop"``...) ends the batch; it is the batch's
    ``next``, for the loop to handle before anything else.
    """

    def __init__(self, events: queue.SimpleQueue[Any], *,
                 clock: Callable[[], float] = time.monotonic,
                 quiet: float = QUIET, longest: float = LONGEST,
                 first_quiet: float = FIRST_QUIET):
        self.events = events
        self.clock = clock
        self.quiet, self.longest, self.first_quiet = quiet, longest, first_quiet

    def gather(self, first: DeviceEvent) -> Batch:
        """``first`` and the device events after it until the queue is quiet."""
        batch = Batch([first])
        started = self.clock()
        while True:
            now = self.clock()
            quiet = self.first_quiet if batch.count == 1 else self.quiet
            wait = min(quiet, started + self.longest - now)
            if wait <= 0:
                break
            try:
                item = self.events.get(timeout=wait)
            except queue.Empty:
                break
            if isinstance(item, DeviceEvent):
                if len(batch.events) < BATCH_KEEP:
                    batch.events.append(item)
                else:
                    batch.dropped += 1
                continue
            batch.next = item
            break
        return batch


class UdevFeed:
    """Puts a :class:`DeviceEvent` on the loop's queue for each udev event that matters
    (if pyudev and a udev netlink socket are there; else the full passes only), and calls
    ``on_controller`` (from its thread) when a controller is added or removed."""

    def __init__(self, events: queue.SimpleQueue[Any],
                 on_controller: Callable[[], None] | None = None):
        self.events = events
        self.on_controller = on_controller
        self._observer: Any = None

    def _on_device(self, device: Any) -> None:
        try:
            event = classify(device.subsystem, device.action, device.sys_name,
                             dict(device.properties))
        except Exception as exc:  # a device gone while read: nothing to act on
            log.debug("udev event not read", error=str(exc))
            return
        if event is None:
            return
        if (event.kind == "controller" and event.action in ("add", "remove")
                and self.on_controller is not None):
            self.on_controller()
        self.events.put(event)

    def start(self) -> None:
        try:
            import pyudev

            context = pyudev.Context()
            # The kernel's own uevents, not udev's re-broadcast after its rules ran: the
            # namespace's /dev node is there already (devtmpfs), and udevd's rules (its
            # blkid probe over the fabric among them) took 0.08-0.14 s more under TCG.
            # What kvagent reads of an event (its action, name, NVME_AEN) is the
            # kernel's; udev's filter applies to kernel messages in user space.
            monitor = pyudev.Monitor.from_netlink(context, source="kernel")
            grow_receive_buffer(monitor)  # (a storm overflows the default: lost events)
            monitor.filter_by("block")
            monitor.filter_by("nvme")
            self._observer = pyudev.MonitorObserver(monitor, callback=self._on_device,
                                                    name="kvagent-udev")
            self._observer.start()
        except Exception as exc:  # no udev: the full passes still run
            log.warning("udev monitor unavailable; relying on the full passes",
                        error=str(exc))
            self._observer = None

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.send_stop()




def _read(path: Path | str) -> str | None:
    try:
        with open(path) as f:
            return f.read(256).strip()
    except OSError:
        return None


def _controller_names(sysfs: Path | str) -> set[str]:
    try:
        return {n for n in os.listdir(f"{sysfs}/class/nvme")
                if n.startswith("nvme") and n[4:].isdigit()}
    except OSError:
        return set()


class ControllerWatch:
    """Puts a ``controller`` :class:`DeviceEvent` on the loop's queue when a controller's
    state changes (the kernel sends no event when a connection drops).

    A look costs one ``pread`` per controller: each controller's ``state`` file is opened
    once and kept open (sysfs answers a read at offset 0 afresh); its ``subsysnqn`` is
    read once, when it is first seen. A read that fails is a controller removed, perhaps
    its name taken by a new one since: the file is closed and the name looked at again as
    new. ``class/nvme`` is listed at the first look, at the next look after
    :meth:`relist` (the udev feed calls it when a controller is added or removed) and
    every :data:`RELIST_EVERY` looks (the bound on a lost udev event); listing it at
    every look was a third of an idle agent's watch.
    """

    def __init__(self, events: queue.SimpleQueue[Any], sysfs: Path, *,
                 period: float = WATCH_PERIOD):
        self.events, self.sysfs, self.period = events, sysfs, period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: controller name -> (its open state file, whether it is a discovery controller)
        self._open: dict[str, tuple[int, bool]] = {}
        self._listing_due = True  # set by any thread, cleared before the listing
        self._looks_since_listing = 0

    def relist(self) -> None:
        """List the controllers again at the next look (any thread)."""
        self._listing_due = True

    def states(self) -> dict[str, str]:
        """Each controller's state, discovery controllers left out."""
        self._looks_since_listing += 1
        if self._listing_due or self._looks_since_listing >= RELIST_EVERY:
            self._listing_due = False
            self._looks_since_listing = 0
            names = _controller_names(self.sysfs)
            for gone in set(self._open) - names:
                os.close(self._open.pop(gone)[0])
        else:
            names = set(self._open)
        states: dict[str, str] = {}
        for name in names:
            for _ in range(2):  # a second time: the name may be a new controller's now
                entry = self._open.get(name) or self._watch(name)
                if entry is None:
                    break
                fd, discovery = entry
                try:
                    state = os.pread(fd, 64, 0)
                except OSError:
                    os.close(self._open.pop(name)[0])
                    continue
                if not discovery:
                    states[name] = state.decode(errors="replace").strip()
                break
        return states

    def _watch(self, name: str) -> tuple[int, bool] | None:
        base = f"{self.sysfs}/class/nvme/{name}"
        try:
            fd = os.open(f"{base}/state", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # gone meanwhile: its remove event says so
        self._open[name] = (fd, _read(f"{base}/subsysnqn") == DISCOVERY_NQN)
        return self._open[name]

    def check(self, last: dict[str, str]) -> dict[str, str]:
        """One look: an event per controller whose state differs from ``last`` (a new
        or a gone controller has its own udev event)."""
        now = self.states()
        for name, state in sorted(now.items()):
            if name in last and last[name] != state:
                self.events.put(DeviceEvent("controller", f"state {state}", name))
        return now

    def close(self) -> None:
        """Close the controllers' state files."""
        while self._open:
            os.close(self._open.popitem()[1][0])

    def _run(self) -> None:
        try:
            last = self.states()
            while not self._stop.wait(self.period):
                last = self.check(last)
        finally:
            self.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvagent-ctrl-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
