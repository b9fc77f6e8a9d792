"""Hard caps for engines: each engine directory is an xfs project whose hard limit is the
engine's share of that mount.

Every engine kind has a stable project id (:data:`PROJECT_IDS`, documented in
docs/configuration.md): ``<mount>/<kind>`` carries it with PROJINHERIT, so everything the
engine writes below is counted, and the filesystem refuses the engine's writes with
ENOSPC once it reaches its limit while the other engines keep writing. The limit on a
mount is :func:`mount_caps`: the engines' split of that mount's size (the same split as
:func:`~agent.engines.dirs.engine_capacities` makes of the pool), rounded down to 64 KiB.

:func:`ensure_caps` (every pass of the hand-off) reads each directory's project and each
limit (an ioctl and a quotactl: no command) and changes only what differs; an engine
directory is walked (its existing files put in the project) only the first time, which
is recorded in ``<state_dir>/quota/<pool>.json``. :func:`engine_usage` is what health
reads: O(1) usage from the quota, or a bounded sample of the tree where quotas are off.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .. import effects, failpoints, progress
from ..config.model import EngineConfig
from ..errors import KvagentError
from ..log import get_logger
from ..records import quota_path
from ..state import read_json, write_json
from ..system.mounts import MOUNTINFO, MountEntry, mounted_at
from ..system.xfsquota import (
    Project,
    QuotaMode,
    QuotaOps,
    QuotaUnavailable,
    project_quota_mode,
)
from .dirs import engine_capacities, engine_dir, usage_sample

log = get_logger("engines.quota")

#: The xfs project id of each engine kind's directory: 1000 + the kind's number. Stable:
#: changing one would leave an engine's existing files counted under the old id.
PROJECT_IDS: dict[str, int] = {
    "lmcache": 1001, "vllm": 1002, "dynamo": 1003, "sglang": 1004, "mooncake": 1005,
}
#: Limits are whole multiples of this (xfs keeps limits in filesystem blocks, up to 64 KiB):
#: a limit kvagent wrote reads back the same, so a converged pass rewrites nothing.
LIMIT_GRANULE = 64 * 1024
#: Bound of putting an existing engine directory into its project (one walk, the first
#: pass after an upgrade): an ioctl per entry, about 10 s per million entries.
TAG_BOUND = 900.0
UsageSource = Literal["quota", "sample"]


def project_id(kind: str) -> int:
    """The xfs project id of engine ``kind``'s directories."""
    return PROJECT_IDS[kind]


def mount_caps(mount_bytes: int, engines: Sequence[EngineConfig]) -> dict[str, int]:
    """Each engine's hard limit on one mount: its share of the mount's size (the split of
    :func:`engine_capacities`), rounded down to :data:`LIMIT_GRANULE`."""
    caps = engine_capacities(mount_bytes, engines)
    return {kind: cap // LIMIT_GRANULE * LIMIT_GRANULE for kind, cap in caps.items()}


@dataclass(frozen=True)
class CapChange:
    """One thing :func:`ensure_caps` changed (an action of the pass)."""

    kind: str  # engine.quota.project | engine.quota.limit
    subject: str
    detail: str
    engine: str


def mount_quota_mode(mount: str, mountinfo: Path = MOUNTINFO) -> QuotaMode:
    """Project quota mode of the filesystem mounted exactly at ``mount`` (off if none)."""
    entry = mounted_at(mount, mountinfo)
    return project_quota_mode(entry) if entry is not None else "off"


def ensure_caps(state_dir: Path | str, pool: str, mounts: Sequence[str],
                engines: Sequence[EngineConfig], sizes: dict[str, int | None],
                quota: QuotaOps, mountinfo: Path = MOUNTINFO) -> list[CapChange]:
    """Put every engine directory in its project and set its hard limit on each mount.

    Mounts without project quotas are skipped (their caps stay advisory: health says
    so); ``sizes`` maps a mount to its filesystem's size in bytes (the probe's), a mount
    of unknown size gets no limit. Changes only what differs from the kernel's answer.
    """
    record_file = quota_path(state_dir, pool)
    record = read_json(record_file, {})
    tagged: dict[str, int] = dict(record.get("tagged", {})) if isinstance(record, dict) else {}
    changes: list[CapChange] = []
    for mount in mounts:
        if mount_quota_mode(mount, mountinfo) == "off":
            continue
        size = sizes.get(mount)
        caps = mount_caps(size, engines) if size else {}
        for engine in engines:
            directory = engine_dir(mount, engine.kind)
            projid = project_id(engine.kind)
            if quota.project(directory) != Project(projid, True) or tagged.get(directory) != projid:
                with progress.step(f"putting {directory} in xfs project {projid}", TAG_BOUND):
                    n = quota.tag(directory, projid, progress.checkpoint)
                failpoints.step("quota.project", directory)
                tagged[directory] = projid
                write_json(record_file, {"tagged": dict(sorted(tagged.items()))})
                changes.append(CapChange("engine.quota.project", directory,
                                         f"xfs project {projid} ({n} entries set)", engine.kind))
            want = caps.get(engine.kind)
            if want is None:
                continue
            have = quota.get(mount, projid).hard_limit_bytes
            if have != want:
                quota.set_limit(mount, projid, want)
                failpoints.step("quota.limit", directory)
                changes.append(CapChange("engine.quota.limit", directory,
                                         f"hard limit {have} -> {want} bytes (project {projid})",
                                         engine.kind))
    return changes


def forget(state_dir: Path | str, pool: str) -> None:
    """Drop a detached pool's record of tagged directories."""
    effects.unlink(quota_path(state_dir, pool), missing_ok=True, kind="record.remove")


@dataclass(frozen=True)
class EngineQuotaUsage:
    """An engine's usage and cap on a pool, and where the figures come from.

    ``source`` is ``quota`` when every directory's usage came from its project quota
    (exact), ``sample`` when at least one was sampled by walking (a lower bound when
    ``complete`` is false). ``enforced``: every directory has a hard limit the kernel
    enforces; ``cap_bytes`` is then the sum of those limits, else the computed cap.
    """

    used_bytes: int
    cap_bytes: int
    source: UsageSource
    enforced: bool
    complete: bool
    reasons: tuple[str, ...] = ()
    #: False when the quotas could not be read for lack of privilege (not root): the
    #: caps may be enforced all the same.
    readable: bool = True


def _entry_mode(entry: MountEntry | None) -> QuotaMode:
    return project_quota_mode(entry) if entry is not None else "off"


def engine_usage(kind: str, mounts: Sequence[tuple[str, MountEntry | None]], cap_bytes: int,
                 quota: QuotaOps, sample_entries: int) -> EngineQuotaUsage:
    """Usage of engine ``kind`` over the pool's mounted ``mounts`` (mount, its mountinfo
    entry): one quotactl per mount where the directory is in its project on a filesystem
    with project quotas; otherwise a walk of at most ``sample_entries`` entries in all."""
    projid = project_id(kind)
    used = limit = 0
    enforced = True
    reasons: list[str] = []
    sampled: list[str] = []
    readable = True
    for mount, entry in mounts:
        directory = engine_dir(mount, kind)
        mode = _entry_mode(entry)
        if mode == "off":
            sampled.append(directory)
            enforced = False
            reasons.append(f"{mount} is mounted without project quotas")
            continue
        try:
            project = quota.project(directory)
            if project.projid != projid:
                raise QuotaUnavailable(f"{directory} is not in project {projid} yet (the next "
                                       "apply puts it there)")
            q = quota.get(mount, projid)
        except FileNotFoundError:
            enforced = False  # the engine has no directory on this mount (yet)
            continue
        except (KvagentError, OSError) as exc:
            sampled.append(directory)
            enforced = False
            reasons.append(getattr(exc, "message", None) or str(exc))
            readable = readable and getattr(exc, "errno", None) not in (errno.EPERM,
                                                                        errno.EACCES)
            continue
        used += q.used_bytes
        limit += q.hard_limit_bytes
        if mode != "enforced" or q.hard_limit_bytes == 0:
            enforced = False
    enforced = enforced and bool(mounts) and limit > 0
    complete = True
    if sampled:
        budget = max(1, sample_entries // len(sampled))
        for directory in sampled:
            try:
                n, _, done = usage_sample(directory, budget)
            except FileNotFoundError:
                continue
            used += n
            complete = complete and done
    return EngineQuotaUsage(used, limit if enforced else cap_bytes,
                            "sample" if sampled else "quota", enforced, complete,
                            tuple(reasons), readable)
