"""Hard caps (agent.engines.quota): project ids, the cap per mount, ensure_caps over a fake
of the kernel's project quotas, and usage from the quota or a sample."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config.model import EngineCleaner, EngineConfig
from agent.config.types import AccountName, Percent
from agent.engines import KINDS
from agent.engines.dirs import engine_capacities
from agent.engines.quota import (
    LIMIT_GRANULE,
    PROJECT_IDS,
    engine_usage,
    ensure_caps,
    mount_caps,
    project_id,
)
from agent.system.mounts import read_mounts
from agent.system.xfsquota import Project, QuotaUnavailable

from .fakequota import FakeQuota

DOCS = Path(__file__).resolve().parents[3] / "docs"
GIB = 1 << 30


def engine(kind: str, capacity: float | None = None, cleaner: bool = False) -> EngineConfig:
    return EngineConfig(kind=kind, owner=AccountName(str(os.getuid())),  # type: ignore[arg-type]
                        group=AccountName(str(os.getgid())),
                        capacity=Percent(capacity) if capacity is not None else None,
                        cleaner=EngineCleaner(enabled=cleaner))


# ---------------------------------------------------------------- project ids
def test_every_engine_kind_has_its_own_documented_project_id() -> None:
    assert set(PROJECT_IDS) == set(KINDS)
    assert len(set(PROJECT_IDS.values())) == len(KINDS)
    assert 0 not in PROJECT_IDS.values(), "project 0 is every file's default"
    text = (DOCS / "configuration.md").read_text()
    for kind in KINDS:
        assert re.search(rf"\| `{kind}` \| {project_id(kind)} \|", text), \
            f"docs/configuration.md does not list {kind}'s project id {project_id(kind)}"


# ------------------------------------------------------------------ cap math
def test_each_mount_gets_the_engines_share_of_its_own_size() -> None:
    engines = [engine("lmcache", 50), engine("vllm"), engine("dynamo")]
    caps = mount_caps(1000 * GIB, engines)
    assert caps == {"lmcache": 500 * GIB, "vllm": 200 * GIB, "dynamo": 200 * GIB}


@given(st.integers(min_value=300 * 10**6, max_value=1 << 50),
       st.lists(st.one_of(st.none(), st.integers(min_value=1, max_value=17)), min_size=1,
                max_size=5))
def test_caps_per_mount_are_granular_and_never_above_the_split(size: int,
                                                               pcts: list) -> None:
    engines = [engine(k, p) for k, p in zip(KINDS, pcts, strict=False)]
    split = engine_capacities(size, engines)
    caps = mount_caps(size, engines)
    assert set(caps) == set(split)
    for kind, cap in caps.items():
        assert cap % LIMIT_GRANULE == 0
        assert split[kind] - LIMIT_GRANULE < cap <= split[kind]
    assert sum(caps.values()) <= size * 90 // 100


# --------------------------------------------------------------- ensure_caps
class Pool:
    """Two tmp 'mounts' with engine directories and a mountinfo naming them."""

    def __init__(self, root: Path, options: str = "rw,attr2,inode64,prjquota"):
        self.root = root
        self.mounts = [str(root / "ns1"), str(root / "ns2")]
        self.state = root / "state"
        self.mountinfo = root / "mountinfo"
        self.set_options(options)
        self.engines = [engine("lmcache", 30), engine("vllm")]
        for m in self.mounts:
            for e in self.engines:
                os.makedirs(os.path.join(m, e.kind))
        self.quota = FakeQuota()
        self.sizes: dict[str, int | None] = dict.fromkeys(self.mounts, 100 * GIB)

    def set_options(self, options: str) -> None:
        self.mountinfo.write_text("".join(
            f"9{i} 21 259:{i} / {m} rw,noatime - xfs /dev/nvme1n{i} {options}\n"
            for i, m in enumerate(self.mounts, 1)))

    def ensure(self):
        return ensure_caps(self.state, "kv", self.mounts, self.engines, self.sizes, self.quota,
                           self.mountinfo)


def test_first_pass_puts_each_directory_in_its_project_and_sets_its_limit(
        tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    Path(pool.mounts[0], "vllm", "old.bin").write_bytes(b"x" * 8192)  # existing data
    changes = pool.ensure()
    assert sorted((c.kind, c.subject) for c in changes) == sorted(
        [("engine.quota.project", f"{m}/{k}") for m in pool.mounts for k in ("lmcache", "vllm")]
        + [("engine.quota.limit", f"{m}/{k}") for m in pool.mounts for k in ("lmcache", "vllm")])
    for m in pool.mounts:
        assert pool.quota.projects[f"{m}/vllm"] == Project(1002, True)
        assert pool.quota.limits[(m, 1001)] == mount_caps(100 * GIB, pool.engines)["lmcache"]
        assert pool.quota.limits[(m, 1002)] == mount_caps(100 * GIB, pool.engines)["vllm"]
    # The file that was there before is counted in vllm's project.
    assert pool.quota.get(pool.mounts[0], 1002).used_bytes >= 8192


def test_a_converged_pass_changes_nothing_and_writes_nothing(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    pool.ensure()
    record = pool.state / "quota/kv.json"
    before = record.stat()
    calls = len(pool.quota.calls)
    assert pool.ensure() == []
    assert [c for c in pool.quota.calls[calls:] if c[0] in ("tag", "set_limit")] == []
    after = record.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_caps_follow_the_filesystem_size(tmp_path: Path) -> None:
    """After growth the probes give a new size: the limits are rewritten, only those."""
    pool = Pool(tmp_path)
    pool.ensure()
    pool.sizes[pool.mounts[1]] = 200 * GIB
    changes = pool.ensure()
    assert {(c.kind, c.subject) for c in changes} == {
        ("engine.quota.limit", f"{pool.mounts[1]}/lmcache"),
        ("engine.quota.limit", f"{pool.mounts[1]}/vllm")}
    assert pool.quota.limits[(pool.mounts[1], 1002)] == mount_caps(200 * GIB,
                                                                  pool.engines)["vllm"]


def test_a_directory_whose_project_was_changed_is_put_back(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    pool.ensure()
    pool.quota.projects[f"{pool.mounts[0]}/lmcache"] = Project(0, False)
    changes = pool.ensure()
    assert [(c.kind, c.subject) for c in changes] == [
        ("engine.quota.project", f"{pool.mounts[0]}/lmcache")]


def test_mounts_without_project_quotas_are_left_alone(tmp_path: Path) -> None:
    pool = Pool(tmp_path, options="rw,attr2,inode64,noquota")
    assert pool.ensure() == []
    assert pool.quota.calls == []


def test_a_mount_of_unknown_size_gets_a_project_but_no_limit(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    pool.sizes[pool.mounts[0]] = None
    changes = pool.ensure()
    assert not [c for c in changes if c.kind == "engine.quota.limit"
                and c.subject.startswith(pool.mounts[0] + "/")]
    assert (pool.mounts[0], 1001) not in pool.quota.limits


# ---------------------------------------------------------------- engine_usage
def entries(pool: Pool):
    return [(e.mount_point, e) for e in read_mounts(pool.mountinfo)]


def test_usage_and_cap_come_from_the_quota(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    pool.ensure()
    Path(pool.mounts[0], "vllm", "a.bin").write_bytes(b"a" * 40960)
    Path(pool.mounts[1], "vllm", "b.bin").write_bytes(b"b" * 4096)
    want = sum(pool.quota.get(m, 1002).used_bytes for m in pool.mounts)
    calls = len(pool.quota.calls)
    got = engine_usage("vllm", entries(pool), 1, pool.quota, 4096)
    assert (got.source, got.enforced, got.complete) == ("quota", True, True)
    assert got.used_bytes == want >= 40960 + 4096
    assert got.cap_bytes == 2 * mount_caps(100 * GIB, pool.engines)["vllm"]
    assert [c[0] for c in pool.quota.calls[calls:]] == ["project", "get"] * 2  # O(1) a mount


def test_without_project_quotas_usage_is_sampled_and_the_cap_advisory(tmp_path: Path) -> None:
    pool = Pool(tmp_path, options="rw,attr2,inode64")
    Path(pool.mounts[0], "vllm", "a.bin").write_bytes(b"a" * 40960)
    got = engine_usage("vllm", entries(pool), 12345, pool.quota, 4096)
    assert (got.source, got.enforced, got.cap_bytes) == ("sample", False, 12345)
    assert got.used_bytes >= 40960
    assert all("without project quotas" in r for r in got.reasons)
    assert pool.quota.calls == []


def test_a_directory_not_in_its_project_yet_is_sampled(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    got = engine_usage("vllm", entries(pool), 999, pool.quota, 4096)
    assert got.source == "sample" and not got.enforced
    assert any("not in project 1002 yet" in r for r in got.reasons)


def test_unreadable_quotas_without_privilege_are_not_called_unenforced(tmp_path: Path) -> None:
    pool = Pool(tmp_path)
    pool.ensure()
    pool.quota.unreadable = QuotaUnavailable("cannot read: needs root", errno=errno.EPERM)
    got = engine_usage("vllm", entries(pool), 999, pool.quota, 4096)
    assert got.source == "sample" and not got.readable
    pool.quota.unreadable = QuotaUnavailable("no quotactl_fd", errno=errno.ENOSYS)
    assert engine_usage("vllm", entries(pool), 999, pool.quota, 4096).readable


def test_the_sample_is_bounded_and_says_so(tmp_path: Path) -> None:
    pool = Pool(tmp_path, options="rw")
    for i in range(50):
        Path(pool.mounts[0], "vllm", f"{i}.bin").write_bytes(b"x")
    got = engine_usage("vllm", entries(pool), 999, pool.quota, 20)
    assert got.source == "sample" and got.complete is False


@pytest.mark.parametrize("kind", KINDS)
def test_project_id_is_stable(kind: str) -> None:
    # Changing an id strands the engine's existing files in the old project: pinned here.
    assert project_id(kind) == {"lmcache": 1001, "vllm": 1002, "dynamo": 1003,
                                "sglang": 1004, "mooncake": 1005}[kind]
