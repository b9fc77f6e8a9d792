"""Which pool uses which block device: no device serves two pools.

Before kvagent puts an LVM label on a device or exports a whole device, the
device must not be used by another pool: listed in another pool's config
(a device pool, or an LVM pool creating a different volume group on it),
claimed by a device pool in kvagent's records, or exported by nvmet now.
Devices are compared by their real node, so a by-id link and the /dev/nvmeXnY
it points to are the same device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..records import DeviceClaim


@dataclass(frozen=True)
class DeviceUse:
    """One use of a device: by ``pool`` (None: not a kvagent pool) as ``role``.

    ``role`` is ``device`` (whole-device pool), ``vg:<name>`` (an LVM pool's
    volume group devices), ``claim`` (kvagent's record of an exported device) or
    ``export`` (in the live nvmet tree).
    """

    pool: str | None
    role: str
    what: str


@dataclass
class DeviceUsage:
    """Every known use of every device, keyed by the real device node."""

    uses: dict[str, list[DeviceUse]] = field(default_factory=dict)
    resolve: Callable[[str], str] = os.path.realpath

    def add(self, path: str, use: DeviceUse) -> None:
        real = self.resolve(path)
        if use not in self.uses.setdefault(real, []):
            self.uses[real].append(use)

    def conflicts(self, path: str, pool: str, role: str) -> list[str]:
        """Descriptions of uses of ``path`` that are not ``pool``'s own use as ``role``.

        Two LVM pools that list the same device for the same volume group share it.
        """
        real = self.resolve(path)
        return [use.what for use in self.uses.get(real, []) if not _compatible(use, pool, role)]


def _compatible(use: DeviceUse, pool: str, role: str) -> bool:
    if role == "device":
        # The pool's own listing, its own claim and its own live export.
        return use.pool == pool and use.role in ("device", "claim", "export")
    # An LVM pool creating volume group ``role``: only other listings of that same group.
    return use.role == role


def device_usage(listed: Iterable[tuple[str, DeviceUse]], claims: Mapping[str, DeviceClaim],
                 exported: Mapping[str, str], pool_of: Mapping[str, str | None], *,
                 resolve: Callable[[str], str] = os.path.realpath) -> DeviceUsage:
    """Collect the uses of devices: config listings, claims and live exports.

    ``listed`` is every ``(device path, use)`` the pools' backing drivers report;
    ``claims`` maps claimed device paths to claims (with ``pool``); ``exported``
    maps device paths to the NQN exporting them; ``pool_of`` maps those NQNs to the
    kvagent pool they belong to (None for subsystems kvagent does not own);
    ``resolve`` turns a path into the real device node (a seam for tests).
    """
    usage = DeviceUsage(resolve=resolve)
    for path, use in listed:
        usage.add(path, use)
    for path, claim in claims.items():
        owner = claim.pool
        usage.add(path, DeviceUse(owner, "claim",
                                  f"claimed by pool {owner} as {path} (kvagent exports it "
                                  "whole; kvagent pool destroy releases it)"))
    for path, nqn in exported.items():
        owner = pool_of.get(nqn)
        usage.add(path, DeviceUse(owner, "export", f"exported by nvmet subsystem {nqn}"))
    return usage
