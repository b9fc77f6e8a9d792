"""What travels through one storage-host pass: one record per pool, and the pass's own.

:class:`PoolWork` is a pool's way through the stages of
:class:`agent.target.reconcile.TargetPass`: its backing plan, whether it failed (then it
keeps exactly its live nvmet objects: it degrades alone), and the namespaces refused
(kept as they are live). :class:`StoragePass` is what the stages share: the records and
the live tree read at the start, every pool's work, and the desired tree once built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import nvmet
from nvmet.model import Namespace, Tree

from ..config.model import TargetPool
from ..records import TargetRecords
from .backings.base import BackingPlan, PassContext, Volume

#: A namespace of a pool: (host, nsid); host None for the shared subsystem.
Key = tuple[str | None, int]


@dataclass
class PoolWork:
    """One pool in one storage pass."""

    pool: TargetPool
    plan: BackingPlan = field(default_factory=BackingPlan)
    #: Its backing, its auth or its TLS failed, or one of its steps did: nothing more is
    #: done for it, and it keeps exactly its live objects.
    failed: bool = False
    #: Namespaces refused (their identity would move, or their storage is exported
    #: twice), each with the live namespace kept in its place (None: none is live).
    refused: dict[Key, Namespace | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pool.name

    def skips(self, key: Key | None) -> bool:
        """Whether the namespace ``key`` is left as it is: refused, or withheld by its
        driver (its storage failed a check)."""
        return key in self.refused or any((w.host, w.nsid) == key for w in self.plan.withheld)

    def volumes(self) -> list[Volume]:
        """The volumes this pass exports and binds (none of a failed pool's)."""
        if self.failed:
            return []
        return [v for v in self.plan.volumes if not self.skips(v.key)]


@dataclass
class StoragePass:
    """What the stages of one storage pass share."""

    records: TargetRecords
    live: Tree
    feats: nvmet.Features | None
    #: What the first read of the live tree covered (None: nvmet is not loaded yet).
    have: nvmet.ReadSpec | None
    ctx: PassContext
    works: list[PoolWork]
    #: Per host NQN, the DH-HMAC-CHAP attributes to set.
    host_attrs: dict[str, dict[str, str]] = field(default_factory=dict)
    desired: Tree = field(default_factory=Tree)
    #: The configured ports the desired tree holds (kvagent's to create or keep).
    port_ids: set[int] = field(default_factory=set)
    #: What kvagent may change (its own subsystems, the ports and hosts it created), and
    #: the files the desired tree needs read: set when nvmet is planned.
    scope: nvmet.Scope | None = None
    spec: nvmet.ReadSpec | None = None

    @property
    def pools(self) -> list[TargetPool]:
        return [w.pool for w in self.works]

    def alive(self) -> list[PoolWork]:
        """The pools not failed so far."""
        return [w for w in self.works if not w.failed]

    def failed_names(self) -> set[str]:
        return {w.name for w in self.works if w.failed}
