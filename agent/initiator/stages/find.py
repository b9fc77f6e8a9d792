"""Stage 3, find: a pool's namespaces and their block devices, once a controller is live.

A subsystem's namespaces are what sysfs already shows when the pool was attached in full
before and every namespace recorded then is still there with the same identity;
otherwise ``nvme list-ns`` asks the controller (and sysfs adds what nvme-cli 2.3 left
out). Each namespace's block device is waited for (by subsystem and nsid; its uuid is
the storage's identity) and recorded (``PoolAttachment.devices``), with the directory
it is mounted on (:mod:`agent.initiator.mountnames`: by storage node and nsid).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ... import progress
from ...config.model import InitiatorPool
from ...errors import KvagentError
from ...records import AttachedDevice, PoolAttachment
from ..devices import NamespaceDevice, wait_for_namespaces
from ..mountnames import assign_mounts
from ..mounts import mounted_at
from ..sysfs import Controller, NamespaceHead
from .context import StageContext


def find_devices(ctx: StageContext, pool: InitiatorPool, connected: dict[str, list[Controller]],
                 record: PoolAttachment, old: PoolAttachment | None) -> list[NamespaceDevice]:
    """Each connected subsystem's namespaces, once a controller is live and their block
    devices are there (recorded, each with the directory it is mounted on)."""
    wait = ctx.cfg.initiator.device_wait if ctx.cfg.initiator else 30.0
    devices: list[NamespaceDevice] = []
    for nqn, controllers in connected.items():
        ctrl = _live_controller(ctx, nqn, controllers, wait)
        # list-ns, and what sysfs has already (nvme-cli 2.3 was seen leaving out a
        # namespace the kernel had added after the connect).
        heads: dict[int, NamespaceHead] = {}
        nsids = _known_nsids(ctx, nqn, old, heads) or sorted(
            {*ctx.cli.list_ns(ctrl.name), *ctx.sysfs.subsystem_namespaces(nqn)})
        if not nsids:
            raise KvagentError(f"{nqn} has no namespaces for this host",
                               "check the pool on the storage host (kvagent status there)")
        with progress.step(f"waiting for the namespaces of {nqn}", wait):
            found = wait_for_namespaces(ctx.sysfs, nqn, nsids, timeout=wait,
                                        heads=heads or None)
        record.devices += [AttachedDevice(d.subsysnqn, d.nsid, d.uuid, d.device)
                           for d in found]
        devices += found
    if not pool.shared and pool.layout == "per-namespace":
        mounts = assign_mounts(pool.mount, ctx.cfg.node.nqn_prefix, devices, old,
                               _mounted_on(ctx, old))
        record.devices = [dataclasses.replace(a, mount=m)
                          for a, m in zip(record.devices, mounts, strict=True)]
    ctx.checkpoint()
    return devices


def _known_nsids(ctx: StageContext, nqn: str, old: PoolAttachment | None,
                 seen: dict[int, NamespaceHead] | None = None) -> list[int]:
    """The namespaces of ``nqn`` from sysfs, when sysfs already answers: the pool was
    attached in full before and every namespace recorded then still has its block
    device with the same identity (``[]`` otherwise: ``nvme list-ns`` asks the
    controller). Namespaces the kernel added since are included. ``seen`` gets what
    sysfs showed (the first look of the wait for the namespaces that follows)."""
    if old is None or not old.complete:
        return []
    recorded = {d.nsid: d.uuid.lower() for d in old.devices if d.subsysnqn == nqn}
    if not recorded:
        return []
    heads = ctx.sysfs.subsystem_namespaces(nqn)
    if seen is not None:
        seen.update(heads)
    if any((heads[n].uuid or "").lower() != u if n in heads else True
           for n, u in recorded.items()):
        return []
    return sorted(heads)


def _live_controller(ctx: StageContext, nqn: str, controllers: list[Controller],
                     wait: float) -> Controller:
    """A live controller among ``controllers``, waiting up to ``wait`` s for a reconnect
    (not at all when every one is reconnecting and the pass does not wait for that)."""
    if not ctx.wait_reconnects and controllers and all(
            c.state == "connecting" for c in controllers):
        wait = 0.0
    with progress.step(f"waiting for a live controller of {nqn}", wait):
        return _wait_live(ctx, nqn, controllers, wait)


def _wait_live(ctx: StageContext, nqn: str, controllers: list[Controller],
               wait: float) -> Controller:
    deadline = ctx.seams.clock() + wait
    names = list(dict.fromkeys(c.name for c in controllers))
    current = controllers  # read from sysfs by the connect step just now
    while True:
        live = [c for c in current if c.state == "live"]
        if live:
            return live[0]
        if ctx.seams.clock() >= deadline:
            states = ", ".join(f"{c.name} {c.state} ({c.address.transport} "
                               f"{c.address.traddr})"
                               for c in current) or "gone"
            raise KvagentError(
                f"no live controller for {nqn} after {wait:g}s: {states}",
                "the storage host is unreachable or its port is down; the kernel keeps "
                "reconnecting (I/O waits meanwhile); apply again once it is back (the "
                "agent tries again every health.interval)")
        ctx.seams.sleep(0.2)
        current = [c for n in names if (c := ctx.sysfs.controller(n)) is not None]


def _mounted_on(ctx: StageContext,
                old: PoolAttachment | None) -> Callable[[NamespaceDevice], str | None]:
    """Which of the old record's mounts a device is mounted on now (for records from
    before devices named their mount)."""
    def find(d: NamespaceDevice) -> str | None:
        if old is None:
            return None
        try:
            number = ctx.seams.devnum(d.device)
        except OSError:
            return None
        for m in old.mounts:
            entry = mounted_at(m, ctx.seams.mountinfo)
            if entry is not None and entry.device == number:
                return m
        return None
    return find
