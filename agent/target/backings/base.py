"""What every backing driver gets and returns: volumes, steps, plans, the pass context.

A backing driver (LVM, file, whole device, ...) turns a pool's config into the
*volumes* that back its namespaces, each carrying the identity (uuid, nguid) that
was recorded with its storage when kvagent created it, and the *steps* that create,
grow or record that storage (run by apply only). See :mod:`agent.target.backings`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nvmet.model import Tree

from ...config.model import Config, TargetPool
from ...naming import subsystem_nqn
from ...records import PoolRecord, Storage, TargetRecords
from ...system.run import Runner
from ..usage import DeviceUsage, DeviceUse


@dataclass(frozen=True)
class Volume:
    """The backing of one namespace: where it is, how big, and the identity it carries.

    ``uuid``/``nguid`` come from the storage's own record (an LVM tag, the file
    manifest, the device claim); a volume that does not exist yet gets fresh ones,
    written into that record by the step that creates it.
    """

    pool: str
    host: str | None  # None for a shared pool
    nsid: int
    path: str
    size: int | None  # None: the whole device, whatever its size
    uuid: str
    nguid: str
    storage: Storage
    buffered_io: bool = False

    @property
    def key(self) -> tuple[str | None, int]:
        return (self.host, self.nsid)


@dataclass(frozen=True)
class Step:
    """One change to backing storage (create, grow or record a volume, claim a device).

    ``volume`` is the (host, nsid) whose storage the step makes: when that
    namespace is refused (its identity would move), the step is skipped. ``grown``
    names a volume path whose nvmet namespace is revalidated after the step.
    """

    kind: str
    pool: str
    subject: str
    detail: str
    run: Callable[[], None] = field(compare=False, repr=False)
    grown: str | None = None
    volume: tuple[str | None, int] | None = None


@dataclass(frozen=True)
class Withheld:
    """A namespace not to export (its storage failed a check); the pool is degraded."""

    host: str | None
    nsid: int
    reason: str


@dataclass
class BackingPlan:
    """What a pool's backing needs: its volumes, the steps to get there, problems found."""

    volumes: list[Volume] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    withheld: list[Withheld] = field(default_factory=list)


@dataclass
class PassContext:
    """Everything a driver may consult while planning one pool in one pass.

    ``cache`` lets a driver read something once per pass (``lvs``, ``vgs``) for all
    its pools; ``usage`` knows every device every pool, claim and live export uses.
    """

    cfg: Config
    runner: Runner
    records: TargetRecords
    live: Tree
    usage: DeviceUsage
    dry_run: bool = False
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return Path(self.cfg.node.state_dir)

    @property
    def sysfs(self) -> Path:
        return Path(self.cfg.node.sysfs)

    def nqn(self, pool: str, host: str | None) -> str:
        """The subsystem NQN of ``pool`` for ``host`` (None: the shared subsystem)."""
        return subsystem_nqn(self.cfg.node.nqn_prefix, self.cfg.node.name, pool, host)


@dataclass(frozen=True)
class Doomed:
    """One thing ``pool destroy`` would delete (or release), with the path nvmet would open."""

    kind: str  # logical_volume | file | device_claim
    path: str
    delete: Callable[[], None] = field(compare=False, repr=False)


def grantees(pool: TargetPool) -> list[str | None]:
    """Hosts that may get a subsystem: each listed host, or [None] for one shared subsystem.

    An empty host list exports nothing (unless a shared pool explicitly allows any
    host). A backing driver may narrow this down (a whole-device pool gives a
    subsystem only to hosts that have a device).
    """
    if pool.shared:
        return [None] if (pool.hosts or pool.allow_any_host) else []
    return [h.name for h in pool.hosts]


class BackingDriver(Protocol):
    """One backing kind. Registered in :data:`agent.target.backings.DRIVERS`."""

    kind: str

    def layout(self, pool: TargetPool,
               records: TargetRecords) -> Mapping[str | None, tuple[int, ...]]:
        """Namespace ids per host (None: the shared subsystem), without touching storage."""
        ...

    def plan(self, ctx: PassContext, pool: TargetPool) -> BackingPlan:
        """Volumes and steps for ``pool`` (reads storage, changes nothing)."""
        ...

    def record(self, pool: TargetPool) -> PoolRecord:
        """What kvagent records about the pool's backing when it is exported."""
        ...

    def devices(self, pool: TargetPool) -> list[tuple[str, DeviceUse]]:
        """The block devices the config gives this pool (for the one-device-one-pool rule)."""
        ...

    def where(self, record: PoolRecord) -> str:
        """A short description of where the pool's data lives (``pool list``)."""
        ...

    def doomed(self, ctx: PassContext, name: str, record: PoolRecord | None) -> list[Doomed]:
        """What ``pool destroy`` deletes: only what kvagent provably created for ``name``."""
        ...

    def block_devices(self, runner: Runner, paths: list[str]) -> dict[str, tuple[str, ...]]:
        """The devices behind each storage path of this kind (``pool list``): an LV's
        PVs, a file's filesystem's device, a whole device itself."""
        ...
