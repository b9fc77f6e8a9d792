"""Planning a pool's volumes namespace by namespace, for drivers that create them (LVM, file).

What is the same whichever storage holds the volumes lives here; a driver subclasses
:class:`VolumePlanner` with what differs: how it finds the storage it recorded for a
namespace (an LV's tags, the file manifest) and how it creates, records and grows it.

The rule both follow: a namespace with nothing recorded gets new storage and a fresh
identity, written into that record by the step that creates it; one with recorded
storage keeps the identity recorded there, or, when the storage is from before
identities were recorded, gets its legacy identity and a step that records it; storage
smaller than configured is grown. A namespace whose storage fails a check is refused
(:class:`Refused`): a plan error and no volume, while the other namespaces are still
planned, so that one pass reports every problem.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from ...config.model import TargetPool
from ..identity import legacy_ids
from .base import BackingPlan, PassContext, Step, Volume


class Refused(Exception):
    """One namespace's storage failed a check; the message is the plan error."""


class VolumePlanner(ABC):
    """The volumes of one pool in one pass, and the steps that make them."""

    def __init__(self, ctx: PassContext, pool: TargetPool, plan: BackingPlan) -> None:
        self.ctx = ctx
        self.pool = pool
        self.plan = plan

    def plan_volumes(self, layout: Mapping[str | None, tuple[int, ...]]) -> None:
        """A volume for each namespace of ``layout`` (host by host), or the plan error
        that refuses it."""
        for host, nsids in layout.items():
            for nsid in nsids:
                try:
                    self.plan.volumes.append(self.volume(host, nsid))
                except Refused as exc:
                    self.plan.errors.append(str(exc))

    @abstractmethod
    def volume(self, host: str | None, nsid: int) -> Volume:
        """The volume of one namespace, adding the steps that create, record or grow its
        storage; :class:`Refused` when that storage fails a check."""

    def step(self, kind: str, subject: str, detail: str, run: Callable[[], None],
             host: str | None, nsid: int, *, grown: str | None = None) -> None:
        """Add a step that makes the storage of namespace ``nsid`` of ``host``."""
        self.plan.steps.append(Step(kind, self.pool.name, subject, detail, run, grown=grown,
                                    volume=(host, nsid)))

    def identity(self, host: str | None, nsid: int, recorded: tuple[str | None, str | None],
                 kind: str, subject: str,
                 record: Callable[[str, str], Callable[[], None]]) -> tuple[str, str]:
        """The (uuid, nguid) recorded with a namespace's existing storage. Storage from
        before identities were recorded has none (or half of one): it gets its legacy
        identity and a ``kind`` step, ``record(uuid, nguid)``, that records it."""
        uuid, nguid = recorded
        if uuid and nguid:
            return uuid, nguid
        uuid, nguid = legacy_ids(self.ctx.nqn(self.pool.name, host), nsid)
        self.step(kind, subject, f"namespace identity {uuid}", record(uuid, nguid), host, nsid)
        return uuid, nguid
