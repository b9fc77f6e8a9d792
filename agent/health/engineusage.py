"""Engines' usage and caps on a GPU pool, for health: from xfs project quotas where on.

Where a pool's filesystem accounts project quotas and an engine's directory is in its
project, its usage and cap are the kernel's figures (one ``quotactl`` per mount: the
same numbers ``xfs_quota -x -c 'report -p'`` prints); elsewhere the usage is a bounded
walk of the directory (:data:`USAGE_SAMPLE_ENTRIES` entries per engine per collect, a
lower bound past it) and the cap the computed one, advisory. The problems returned say
which, so an operator sees when caps are not enforced.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config.model import Config, InitiatorPool
from ..engines.cleaner import read_stats
from ..engines.dirs import engine_capacities, engine_dir
from ..engines.quota import engine_usage
from ..system.mounts import MountEntry
from ..system.xfsquota import QuotaOps, project_quota_mode, wanted_quota_mode, with_project_quota
from .snapshot import CleanerState, EngineUsage

#: At most this many entries are stat-ed per engine per collect where its usage cannot
#: come from quotas: beyond it, the engine's usage is a lower bound.
USAGE_SAMPLE_ENTRIES = 4096


def engine_usages(cfg: Config, pool: InitiatorPool, mounted: Sequence[tuple[str, MountEntry]],
                  size_bytes: int, quota: QuotaOps) -> tuple[list[EngineUsage], list[str]]:
    """Every engine of ``pool`` over its ``mounted`` mounts (mount point, mountinfo line)
    and the problems to report: caps not enforced, engines over or at their caps."""
    problems: list[str] = []
    wanted = wanted_quota_mode(with_project_quota(pool.mount_options))
    plain = [m for m, entry in mounted if project_quota_mode(entry) == "off"]
    if wanted != "off" and plain:
        problems.append(
            f"mounted without project quotas: {', '.join(plain)}: engine caps are "
            "advisory and usage is sampled until the engines release the mount "
            "(kvagent then mounts it again with prjquota; fuser -vm MOUNT lists who "
            "holds it)")
    if not pool.engines or not mounted:
        return [], problems
    caps = engine_capacities(size_bytes, pool.engines)
    stats = read_stats(cfg.node.state_dir, pool.name)
    out = []
    for e in pool.engines:
        dirs = [(m, entry) for m, entry in mounted if Path(engine_dir(m, e.kind)).is_dir()]
        got = engine_usage(e.kind, dirs, caps[e.kind], quota, USAGE_SAMPLE_ENTRIES)
        s = stats.get(e.kind)
        cleaner = None
        if e.cleaner.enabled or s is not None:
            cleaner = CleanerState(e.cleaner.enabled, s.runs if s else 0, s.files if s else 0,
                                   s.bytes if s else 0, s.last_run if s else None)
        usage = EngineUsage(e.kind, got.used_bytes, got.cap_bytes, pool.mount, got.source,
                            got.enforced, got.complete, cleaner)
        out.append(usage)
        if usage.over_cap:
            problems.append(f"engine {e.kind} uses {usage.used_bytes} bytes, over its cap "
                            f"{usage.cap_bytes} (advisory: not enforced here)")
        if e.cleaner.enabled and got.source != "quota":
            problems.append(f"engine {e.kind}: its cleaner is idle: it needs usage from "
                            "project quotas (" + "; ".join(got.reasons) + ")")
        elif wanted == "enforced" and not plain and not got.enforced and got.readable:
            problems.append(f"engine {e.kind}: cap not enforced: "
                            + ("; ".join(got.reasons) or "no hard limit set yet (run "
                                                          "kvagent apply)"))
    return out, problems
