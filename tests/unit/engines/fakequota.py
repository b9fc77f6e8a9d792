"""A kernel-like fake of xfs project quotas (agent.system.xfsquota.QuotaOps) over tmp dirs.

What the kernel tier shows on a real xfs (tests/kernel/test_cache_quota.py): a directory
put in a project with PROJINHERIT has everything below it in that project (tag_tree
sets the existing entries, inheritance the new ones), so a project's usage is the bytes
allocated by the regular files below its tagged directories on that filesystem; limits
are kept per (filesystem, project) and read back as written; a project with nothing
recorded reads as zero. Every call is logged, so tests can tell reads from writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from agent.system.xfsquota import Project, ProjectQuota, QuotaUnavailable

WRITES = ("tag", "set_limit")


class FakeQuota:
    def __init__(self) -> None:
        self.projects: dict[str, Project] = {}  # directory -> its project
        self.limits: dict[tuple[str, int], int] = {}
        self.calls: list[tuple[str, ...]] = []
        self.unreadable: OSError | QuotaUnavailable | None = None

    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in WRITES]

    def project(self, directory: str) -> Project:
        self.calls.append(("project", directory))
        if not os.path.isdir(directory):
            raise FileNotFoundError(directory)
        return self.projects.get(os.path.normpath(directory), Project(0, False))

    def tag(self, directory: str, projid: int, tick: Callable[[], None]) -> int:
        self.calls.append(("tag", directory, str(projid)))
        tick()
        self.projects[os.path.normpath(directory)] = Project(projid, True)
        return sum(len(files) + len(dirs) for _, dirs, files in os.walk(directory)) + 1

    def get(self, mount: str, projid: int) -> ProjectQuota:
        self.calls.append(("get", mount, str(projid)))
        if self.unreadable is not None:
            raise self.unreadable
        used = 0
        for directory, project in self.projects.items():
            if project.projid != projid or not Path(directory).is_relative_to(mount):
                continue
            for root, _, files in os.walk(directory):
                for name in files:
                    st = os.lstat(os.path.join(root, name))
                    if os.path.isfile(os.path.join(root, name)) and not os.path.islink(
                            os.path.join(root, name)):
                        used += st.st_blocks * 512
        return ProjectQuota(projid, used, self.limits.get((mount, projid), 0))

    def set_limit(self, mount: str, projid: int, hard_bytes: int) -> None:
        self.calls.append(("set_limit", mount, str(projid), str(hard_bytes)))
        self.limits[(mount, projid)] = hard_bytes
