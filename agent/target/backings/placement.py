"""Where a new LV goes among a volume group's physical volumes (pure: no LVM run here).

``spread`` puts each new LV on one PV, round-robin: the PV holding the fewest LVs of
the same pool and host, then of the same pool, then of the other spread pools, then
the first by name; only PVs with room for the whole LV count. The choice depends only
on which LVs exist where (and their sizes), never on the order they were made, so a
pass killed after some of its ``lvcreate`` makes the same choices for the rest when it
runs again. ``striped`` checks that enough PVs have room for one stripe each.

:class:`PvState` is mutable on purpose: planning a pool consumes the space and adds
the LVs it places, so the pools planned after it in the same pass see them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...config.units import format_size

#: Where LVM starts data on a new PV (its default data alignment): 1 MiB.
PE_START = 1 << 20

Owner = tuple[str | None, str | None]  # (pool, host) from an LV's kvagent tags


@dataclass
class PvState:
    """One physical volume of a group: its free bytes and whose LVs are on it."""

    name: str
    free: int
    owners: list[Owner] = field(default_factory=list)

    def count(self, pool: str, host: str | None = None, *, any_host: bool = False) -> int:
        return sum(1 for p, h in self.owners if p == pool and (any_host or h == host))

    @property
    def order(self) -> str:
        """The tie-break: the device node's name (LVM may show another alias of it)."""
        return os.path.realpath(self.name)


class PlacementError(Exception):
    """No placement satisfies the pool's rule; the message says which PVs and why."""


def _free_list(pvs: Sequence[PvState]) -> str:
    return ", ".join(f"{p.name} {format_size(p.free)} free" for p in
                     sorted(pvs, key=lambda p: p.order))


def new_pv_state(device: str, size: int, extent: int) -> PvState:
    """The state of a blank device that is about to become a PV of a new group: its size
    less LVM's default data start, in whole extents (an estimate: if LVM's own figure is
    smaller, lvcreate fails and the next pass plans from what ``pvs`` then says)."""
    return PvState(device, max(0, (size - PE_START) // extent * extent))


def choose_spread(pvs: Sequence[PvState], pool: str, host: str | None, size: int,
                  spread_pools: frozenset[str], subject: str) -> PvState:
    """The PV for a new LV of ``size`` bytes of ``pool`` for ``host`` (``spread``); the
    state is updated (free space taken, the LV added).

    Raises :class:`PlacementError` when no PV has room for the whole LV, or when the LV
    would share a PV with another of the host's LVs of this pool while a PV without one
    exists but lacks room (so the namespaces would not be on distinct drives).
    """
    usable = [p for p in pvs if p.free >= size]
    if not usable:
        raise PlacementError(
            f"placement spread keeps each namespace on one device, and no device of the "
            f"volume group has the {format_size(size)} that {subject} needs "
            f"({_free_list(pvs)})")
    others = spread_pools - {pool}

    def key(p: PvState) -> tuple[int, int, int, str]:
        return (p.count(pool, host), p.count(pool, any_host=True),
                sum(p.count(o, any_host=True) for o in others), p.order)

    best = min(usable, key=key)
    if best.count(pool, host) > 0:
        lacking = [p for p in pvs if p.count(pool, host) == 0 and p.free < size]
        if lacking:
            raise PlacementError(
                f"placement spread would put {subject} on {best.name} next to another "
                f"namespace of the same host, because the devices without one lack the "
                f"{format_size(size)} it needs ({_free_list(lacking)})")
    best.free -= size
    best.owners.append((pool, host))
    return best


def check_striped(pvs: Sequence[PvState], stripes: int, size: int, subject: str) -> None:
    """Room for an LV of ``size`` bytes in ``stripes`` stripes (one per PV); the space is
    taken from the PVs with the most free (as LVM's allocator would) in ``pvs``."""
    if len(pvs) < stripes:
        names = ", ".join(p.name for p in sorted(pvs, key=lambda p: p.order)) or "none"
        raise PlacementError(
            f"placement striped with {stripes} stripes needs {stripes} devices in the volume "
            f"group; it has {len(pvs)} ({names})")
    per_stripe = -(-size // stripes)
    roomy = sorted((p for p in pvs if p.free >= per_stripe), key=lambda p: (-p.free, p.order))
    if len(roomy) < stripes:
        short = [p for p in pvs if p.free < per_stripe]
        raise PlacementError(
            f"placement striped needs {format_size(per_stripe)} on each of {stripes} devices "
            f"for {subject}; only {len(roomy)} have it ({_free_list(short)})")
    for p in roomy[:stripes]:
        p.free -= per_stripe
