"""Engines' usage in health: from the project quotas where a pool's mounts have them (the
kernel's figure, O(1)), a bounded sample elsewhere, and what status and /metrics say."""

from __future__ import annotations

import os
from pathlib import Path

import jsonschema
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import parse_config
from agent.engines.cleaner import CleanRun, record_run
from agent.engines.quota import ensure_caps, mount_caps
from agent.health.collect import collect
from agent.health.metrics import build_registry
from agent.health.status import load_status_schema, render_status_text, to_status_json
from agent.state import write_json
from tests.unit.engines.fakequota import FakeQuota
from tests.unit.fakerunner import FakeRunner
from tests.unit.initiator.fakesysfs import FakeSysfs

NQN = "nqn.2026-11.io.kvagent:stor:kv:gpu"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
MIB = 1 << 20


class Gpu:
    """A GPU host with pool kv attached: two mounts (tmp dirs) named in a mountinfo."""

    def __init__(self, root: Path, *, quota_option: str = ",prjquota",
                 cleaner: bool = False, mount_options: list[str] | None = None):
        self.root = root
        self.mounts = [str(root / "mnt/kv/ns1"), str(root / "mnt/kv/ns2")]
        vllm = {"kind": "vllm", "owner": str(os.getuid()), "group": str(os.getgid())}
        if cleaner:  # the fs tier (cpu_cache): the disk backend refuses a cleaner
            vllm.update(cpu_cache="1GiB", cleaner={"enabled": True})
        self.cfg = parse_config(yaml.safe_dump({
            "version": 1,
            "node": {"name": "gpu", "state_dir": str(root / "state"),
                     "sysfs": str(root / "sys")},
            "initiator": {"pools": [{
                "name": "kv", "mount": str(root / "mnt/kv"),
                "mount_options": mount_options or ["noatime"],
                "target": {"transport": "tcp", "address": "10.0.0.1", "subsystem": NQN},
                "engines": [vllm, {"kind": "lmcache", "owner": str(os.getuid()),
                                   "group": str(os.getgid())}]}]}}))
        write_json(root / "state/initiator.json", {"schema": 2, "pools": {"kv": {
            "hostnqn": HOSTNQN, "layout": "per-namespace", "shared": False, "complete": True,
            "subsystems": [{"subsysnqn": NQN, "transport": "tcp", "traddr": "10.0.0.1",
                            "trsvcid": "4420"}],
            "devices": [], "mounts": self.mounts, "created_dirs": []}}})
        FakeSysfs(root / "sys").add_controller(1, subsysnqn=NQN, hostnqn=HOSTNQN)
        for m in self.mounts:
            for k in ("vllm", "lmcache"):
                os.makedirs(os.path.join(m, k))
        self.mountinfo = root / "mountinfo"
        self.mountinfo.write_text("".join(
            f"9{i} 21 259:{i} / {m} rw,noatime - xfs /dev/nvme1n{i} "
            f"rw,attr2,inode64{quota_option}\n" for i, m in enumerate(self.mounts, 1)))
        for i in range(1, len(self.mounts) + 1):  # the namespaces' block devices
            (root / "sys/dev/block" / f"259:{i}").mkdir(parents=True)
        self.quota = FakeQuota()

    def apply_caps(self, size: int = 1000 * MIB) -> None:
        pool = self.cfg.initiator.pools[0]
        ensure_caps(self.cfg.node.state_dir, "kv", self.mounts, pool.engines,
                    dict.fromkeys(self.mounts, size), self.quota, self.mountinfo)

    def collect(self):
        return collect(self.cfg, FakeRunner(), drives=False, quota=self.quota,
                       mountinfo=self.mountinfo)


def metrics(snap) -> dict[str, dict[tuple, float]]:
    text = generate_latest(build_registry(lambda: snap)).decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_usage_and_cap_are_the_quotas_figures(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    gpu.apply_caps()
    Path(gpu.mounts[0], "vllm/a.bin").write_bytes(b"a" * 3 * MIB)
    Path(gpu.mounts[1], "vllm/b.bin").write_bytes(b"b" * MIB)
    snap = gpu.collect()
    (pool,) = snap.pools
    assert (pool.state, pool.problems) == ("ok", ())
    vllm = next(e for e in pool.initiator.engines if e.kind == "vllm")
    kernel = sum(gpu.quota.get(m, 1002).used_bytes for m in gpu.mounts)
    limits = sum(gpu.quota.limits[(m, 1002)] for m in gpu.mounts)
    assert (vllm.used_bytes, vllm.cap_bytes) == (kernel, limits)
    assert (vllm.source, vllm.enforced, vllm.complete, vllm.at_cap) == ("quota", True, True,
                                                                         False)
    assert limits == 2 * mount_caps(1000 * MIB, gpu.cfg.initiator.pools[0].engines)["vllm"]
    m = metrics(snap)
    labels = (("engine", "vllm"), ("pool", "kv"))
    assert m["kvagent_engine_used_bytes"][labels] == kernel
    assert m["kvagent_engine_capacity_bytes"][labels] == limits
    assert m["kvagent_engine_cap_enforced"][labels] == 1
    assert m["kvagent_engine_usage_source"][(*labels[:1], ("pool", "kv"), ("source", "quota"))
                                            ] == 1
    assert m["kvagent_engine_usage_source"][(*labels[:1], ("pool", "kv"), ("source", "sample"))
                                            ] == 0
    jsonschema.validate(to_status_json(snap), load_status_schema())
    engine_json = to_status_json(snap)["pools"][0]["initiator"]["engines"][0]
    assert (engine_json["source"], engine_json["enforced"]) == ("quota", True)


def test_an_engine_at_its_hard_cap_is_flagged(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    gpu.apply_caps(size=10 * MIB)  # vllm: 4.5 MiB a mount, in 64 KiB: 4,653,056 bytes
    for m in gpu.mounts:
        cap = gpu.quota.limits[(m, 1002)]
        Path(m, "vllm/full.bin").write_bytes(b"f" * (cap - 4096))
    snap = gpu.collect()
    vllm = next(e for e in snap.pools[0].initiator.engines if e.kind == "vllm")
    assert vllm.at_cap and not vllm.over_cap
    assert metrics(snap)["kvagent_engine_at_cap"][(("engine", "vllm"), ("pool", "kv"))] == 1
    assert "AT CAP (ENOSPC)" in render_status_text(snap)


def test_mounted_without_prjquota_is_degraded_with_the_reason(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, quota_option="")
    Path(gpu.mounts[0], "vllm/a.bin").write_bytes(b"a" * MIB)
    snap = gpu.collect()
    (pool,) = snap.pools
    assert pool.state == "degraded"
    (problem,) = pool.problems
    assert "mounted without project quotas" in problem and "advisory" in problem
    assert "fuser -vm" in problem
    vllm = next(e for e in pool.initiator.engines if e.kind == "vllm")
    assert (vllm.source, vllm.enforced) == ("sample", False) and vllm.used_bytes >= MIB
    assert gpu.quota.calls == [], "no quotactl where the mount has no quotas"
    assert "advisory" in render_status_text(snap) and "sample" in render_status_text(snap)


def test_noquota_by_choice_is_not_a_problem(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, quota_option=",noquota", mount_options=["noatime", "noquota"])
    (pool,) = gpu.collect().pools
    assert (pool.state, pool.problems) == ("ok", ())
    assert {e.source for e in pool.initiator.engines} == {"sample"}


def test_a_cap_not_set_yet_is_reported(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)  # mounted with prjquota, but no apply has set the projects yet
    (pool,) = gpu.collect().pools
    assert pool.state == "degraded"
    assert any("engine vllm: cap not enforced" in p and "not in project 1002 yet" in p
               for p in pool.problems), pool.problems


def test_the_cleaners_runs_show_in_status_and_metrics(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, cleaner=True)
    gpu.apply_caps()
    record_run(gpu.cfg.node.state_dir, "kv", "vllm",
               CleanRun(gpu.mounts[0] + "/vllm", 100, 99, 80, 7, 7 * MIB), now=1_767_225_600.0)
    snap = gpu.collect()
    vllm = next(e for e in snap.pools[0].initiator.engines if e.kind == "vllm")
    assert vllm.cleaner is not None and vllm.cleaner.enabled
    assert (vllm.cleaner.runs, vllm.cleaner.deleted_files) == (1, 7)
    m = metrics(snap)
    labels = (("engine", "vllm"), ("pool", "kv"))
    assert m["kvagent_engine_cleaner_runs_total"][labels] == 1
    assert m["kvagent_engine_cleaner_deleted_bytes_total"][labels] == 7 * MIB
    assert m["kvagent_engine_cleaner_last_run_timestamp_seconds"][labels] == 1_767_225_600.0
    lmcache = next(e for e in snap.pools[0].initiator.engines if e.kind == "lmcache")
    assert lmcache.cleaner is None
    assert "kvagent_engine_cleaner_enabled" in m and \
        (("engine", "lmcache"), ("pool", "kv")) not in m["kvagent_engine_cleaner_enabled"]
    jsonschema.validate(to_status_json(snap), load_status_schema())
    assert "on, 1 run(s)" in render_status_text(snap)


def test_a_cleaner_without_quota_usage_is_idle_and_says_so(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path, quota_option="", cleaner=True)
    (pool,) = gpu.collect().pools
    assert any("its cleaner is idle" in p for p in pool.problems), pool.problems
