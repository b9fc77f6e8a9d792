"""Health reporting: the snapshot the loop maintains, and what reads it.

- :mod:`.snapshot`: frozen values (Snapshot, PoolHealth, ControllerHealth, DriveHealth, ...)
- :mod:`.status`: ``kvagent status`` JSON (schema in agent/schemas/) and text table
- :mod:`.metrics`: Prometheus exposition and node_exporter textfile from a snapshot
- :mod:`.server`: ``/metrics``, ``/healthz``, ``/readyz`` over a SnapshotStore
  (:mod:`.exposition`: the ``/metrics`` body, made once per snapshot, gzip once)
- :mod:`.statussock`: the agent's status socket, where ``kvagent status`` reads its
  last snapshot (:mod:`.statusclient`: the command's side)
- :mod:`.notify`: the systemd notify protocol
- :mod:`.smart`: local drives' smart-log, normalised across nvme-cli versions
"""

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
