"""The desired export of every pool: which subsystems, which namespace ids.

One function, :func:`pool_layout`, answers "which (subsystem NQN, nsid) does this
pool export?" for everybody: the export builds its nvmet tree from it, and health
compares the live tree with it. Nobody else works out namespace counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config.model import Config, TargetPool
from ..naming import subsystem_nqn
from ..records import TargetRecords
from .backings import driver_for
from .backings.base import grantees

__all__ = ["expected_namespaces", "grantees", "pool_layout", "pool_nqn"]


def pool_nqn(cfg: Config, pool: str, host: str | None) -> str:
    """The subsystem NQN of ``pool`` for ``host`` (None: the shared subsystem)."""
    return subsystem_nqn(cfg.node.nqn_prefix, cfg.node.name, pool, host)


def pool_layout(cfg: Config, pool: TargetPool,
                records: TargetRecords) -> dict[str, tuple[int, ...]]:
    """``{subsystem NQN: namespace ids}`` that ``pool`` exports when all is well."""
    per_host: Mapping[str | None, tuple[int, ...]] = driver_for(pool).layout(pool, records)
    return {pool_nqn(cfg, pool.name, host): nsids for host, nsids in per_host.items()}


def expected_namespaces(cfg: Config, pool: TargetPool, records: TargetRecords) -> int:
    """How many namespaces ``pool`` exports when all is well."""
    return sum(len(nsids) for nsids in pool_layout(cfg, pool, records).values())
