"""Health reporting: the snapshot the loop maintains, and what reads it.

- :mod:`.snapshot`: frozen values (Snapshot, PoolHealth, ControllerHealth, DriveHealth, ...)
- :mod:`.status`: ``kvagent status`` JSON (schema in agent/schemas/) and text table
- :mod:`.metrics`: Prometheus exposition and node_exporter textfile from a snapshot
- :mod:`.server`: ``/metrics``, ``/healthz``, ``/readyz`` over a SnapshotStore
  (:mod:`.exposition`: the ``/metrics`` body, made once per snapshot, gzip once;
  :mod:`.endpoint`: the server on ``health.listen``, retried when it cannot bind, moved
  new-before-old on a reload)
- :mod:`.statussock`: the agent's status socket, where ``kvagent status`` reads its
  last snapshot (:mod:`.statusclient`: the command's side)
- :mod:`.notify`: the systemd notify protocol
- :mod:`.smart`: local drives' smart-log, normalised across nvme-cli versions
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .snapshot import (
        ApplySummary,
        ControllerHealth,
        DriveHealth,
        EngineUsage,
        InitiatorSide,
        LoopCounters,
        PathAna,
        PoolHealth,
        Snapshot,
        TargetSide,
        exit_code,
        overall_state,
    )


def __getattr__(name: str) -> Any:
    """The snapshot's names, imported at first use (``kvagent status`` answered by the
    agent renders a document and needs none of them)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import snapshot

    value = getattr(snapshot, name)
    globals()[name] = value
    return value


__all__ = [
    "ApplySummary",
    "ControllerHealth",
    "DriveHealth",
    "EngineUsage",
    "InitiatorSide",
    "LoopCounters",
    "PathAna",
    "PoolHealth",
    "Snapshot",
    "TargetSide",
    "exit_code",
    "overall_state",
]
