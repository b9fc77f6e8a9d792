"""Stage 7, hand-off: what a pool this pass attached and mounted gives its engines.

The hand-off itself (probes, engine directories, caps, configs) is
:mod:`agent.engines.handoff`, run by :mod:`agent.reconcile` once every pool of the pass
is attached; this stage says what it gets (:class:`MountedPool`), and whether this pass
made or (re)mounted something, which makes the recorded probes stale.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config.model import InitiatorPool
from ...records import SubsystemPath
from .context import StageContext, Volume

#: What this pass did to a mount that makes the recorded probes (and the engines'
#: capacity caps, sized from them) stale: the engines' hand-off probes again.
REMOUNT_KINDS = frozenset({"mkfs.xfs", "mount", "lvm.striped", "xfs.grow", "xfs.recover"})


@dataclass(frozen=True)
class MountedPool:
    """A pool this pass attached and mounted: what the engines' hand-off needs."""

    pool: InitiatorPool
    mounts: tuple[str, ...]
    transport: str | None
    remounted: bool  # something was made or (re)mounted in this pass
    #: the mounts this pass made, (re)mounted, grew or recovered (None: it cannot tell
    #: which, e.g. a striped volume was made; then all of them are stale)
    fresh: frozenset[str] | None = None


def mounted_pool(ctx: StageContext, pool: InitiatorPool, volumes: list[Volume],
                 paths: list[SubsystemPath]) -> MountedPool | None:
    """What the engines' hand-off gets of ``pool``, mounted on ``volumes`` (None when
    planning: nothing is handed off)."""
    if ctx.dry_run:
        return None
    changed = [a.subject for a in ctx.result.actions
               if a.pool == pool.name and a.status == "done" and a.kind in REMOUNT_KINDS]
    owner = {s: v.mount for v in volumes for s in (v.mount, v.device)}
    fresh = (frozenset(owner[s] for s in changed)
             if all(s in owner for s in changed) else None)
    return MountedPool(pool, tuple(v.mount for v in volumes), paths[0].address.transport,
                       bool(changed), fresh)
