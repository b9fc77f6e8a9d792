"""Backing drivers: where a pool's namespaces come from.

Each backing kind is one driver (:class:`~agent.target.backings.base.BackingDriver`)
registered here by the ``kind`` its config uses. Everything that depends on the kind
— planning volumes and steps, the layout of namespace ids, the device-use rule, the
pool's record, what ``pool destroy`` deletes — asks the driver; nothing else branches
on the kind. A new kind is its config dataclass (``agent/config/model.py``, one line in
``Backing``) plus one driver file and one line below.
"""

from __future__ import annotations

from ...config.model import TargetPool
from ...errors import KvagentError
from .base import BackingDriver
from .device import DeviceDriver
from .file import FileDriver
from .lvm import LvmDriver

DRIVERS: dict[str, BackingDriver] = {
    "lvm": LvmDriver(),
    "file": FileDriver(),
    "device": DeviceDriver(),
}


def driver_for(pool: TargetPool) -> BackingDriver:
    """The driver of ``pool``'s backing kind."""
    return driver_of_kind(pool.backing.kind)


def driver_of_kind(kind: str) -> BackingDriver:
    try:
        return DRIVERS[kind]
    except KeyError:
        raise KvagentError(f"no backing driver for kind {kind!r} (known: "
                           f"{', '.join(sorted(DRIVERS))})") from None
