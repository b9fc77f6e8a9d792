"""Every side effect of a GPU-side pass is a failpoint step; a converged pass takes none.

A cold attach with engines (mount points, sysfs attributes, engine directories with
their mode, rendered configs, records) logs a step of each kind it makes; the pass
after it logs no step at all and runs no command that changes anything: nothing is
rewritten because it is unchanged. (The fake runner does not count steps as the real
one does: its commands are counted with :func:`agent.failpoints.changes_something`.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent import failpoints
from agent.dhchap import generate, read_secret, write_secret
from tests.unit.engines.fakequota import FakeQuota

from .attach_fakes import Export, FakeHost, fabrics_host
from .test_attach_quota import GDS
from .test_attach_quota import pool_yaml as quota_pool
from .test_attach_quota import run as quota_run
from .test_attach_reconcile import NQN, pool_yaml, run

Steps = Callable[[], list[tuple[str, str]]]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = FakeHost(tmp_path, exports=[Export(NQN, [1, 2])])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    return h


@pytest.fixture
def steps(tmp_path: Path) -> Iterator[Steps]:
    """The steps logged since the last call, as (kind, subject)."""
    log = tmp_path / "steps.log"
    failpoints.configure(f"log={log}")

    def read() -> list[tuple[str, str]]:
        rows = [line.split("\t") for line in log.read_text().splitlines()] \
            if log.exists() else []
        log.unlink(missing_ok=True)
        return [(kind, subject) for _, kind, subject in rows]

    yield read
    failpoints.configure(None)


def changing_commands(host: FakeHost, since: int) -> list[tuple[str, ...]]:
    return [c for c in host.runner.calls[since:] if failpoints.changes_something(c)]


@pytest.mark.parametrize("layout", ["per-namespace", "striped"])
def test_a_cold_attach_is_steps_and_the_next_pass_takes_none(
        host: FakeHost, steps: Steps, layout: str) -> None:
    pools = pool_yaml(host, layout=layout) + "      iopolicy: round-robin\n"
    assert run(host, pools).ok
    cold = steps()
    kinds = {k for k, _ in cold}
    assert {"record", "dir.make", "dir.mode", "sysfs.write", "file.write"} <= kinds, kinds
    subjects = {s for k, s in cold if k == "sysfs.write"}
    assert any(s.endswith("/fast_io_fail_tmo") for s in subjects), subjects
    assert any(s.endswith("/iopolicy") for s in subjects), subjects
    mnt = str(host.root / "mnt")
    assert ("dir.make", mnt) in cold  # the mount point's parents, made by kvagent
    calls = len(host.runner.calls)
    again = run(host, pools)
    assert again.ok and not again.changed, again.actions
    assert steps() == []
    assert changing_commands(host, calls) == []


def test_engine_directories_put_back_are_the_only_steps(host: FakeHost, steps: Steps) -> None:
    """Drift is mended with one step per change: an engine directory's mode and owner
    changed by hand, a rendered config edited; the pass after that takes none."""
    pools = pool_yaml(host)
    assert run(host, pools).ok
    steps()
    engine_dir = host.root / "mnt/kv/store1-ns1/lmcache"
    engine_dir.chmod(0o755)
    config = host.root / "state/engines/kv/lmcache/lmcache.yaml"
    config.write_text("edited\n")
    assert run(host, pools).ok
    assert steps() == [("dir.mode", str(engine_dir)), ("file.write", str(config))]
    assert run(host, pools).ok
    assert steps() == []


def test_a_detach_removes_through_the_seam(host: FakeHost, steps: Steps) -> None:
    """Dropping the pool: its rendered configs and the mount points kvagent made go,
    each a step; a second pass without it takes none."""
    assert run(host, pool_yaml(host)).ok
    steps()
    assert run(host).ok
    gone = steps()
    kinds = [k for k, _ in gone]
    assert "tree.remove" in kinds and "dir.remove" in kinds and "record.remove" in kinds, gone
    assert ("dir.remove", str(host.root / "mnt")) in gone
    calls = len(host.runner.calls)
    assert run(host).ok
    assert steps() == []
    assert changing_commands(host, calls) == []


def test_a_secret_rotation_is_one_sysfs_step_naming_the_file_not_the_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: Steps) -> None:
    host = fabrics_host(tmp_path, monkeypatch, [Export(NQN, [1])])
    key = str(tmp_path / "host.key")
    write_secret(key, generate())
    pools = pool_yaml(host, subsystem=NQN).replace(
        "      engines:", f"      auth: {{key_file: {key}}}\n      engines:")
    assert run(host, pools).ok
    write_secret(key, generate(), replace=True)
    assert ("secret.write", key) in steps()
    assert run(host, pools).ok
    attr = host.root / "sys/class/nvme/nvme2/dhchap_secret"
    rotated = steps()
    assert rotated == [("sysfs.write", str(attr))]
    assert attr.read_text().strip() == read_secret(key).text  # written, never logged
    assert run(host, pools).ok
    assert steps() == []


def test_every_engine_with_quotas_and_a_cleaner_converges_to_no_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: Steps) -> None:
    """All engines (Dynamo with GPUDirect Storage), hard caps on prjquota mounts and a
    cleaner that is on: the cold pass's quota steps, then nothing."""
    h = FakeHost(tmp_path, exports=[Export(NQN, [1, 2])])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    h.quota = FakeQuota()  # type: ignore[attr-defined]
    h.gds = GDS  # type: ignore[attr-defined]
    engines = ("kind: vllm, cpu_cache: 1GiB, capacity: 20%, "
               "cleaner: {enabled: true, high: 50%, low: 25%}",
               "kind: lmcache, capacity: 20%", "kind: sglang, capacity: 15%",
               "kind: mooncake, capacity: 15%", "kind: dynamo, capacity: 15%")
    pools = quota_pool(h, engines)
    first = quota_run(h, pools)
    assert first.ok, first.errors
    cold = steps()
    kinds = {k for k, _ in cold}
    assert {"quota.project", "quota.limit", "dir.make", "file.write"} <= kinds, kinds
    rendered = {Path(s).parent.name for k, s in cold if k == "file.write"}
    assert rendered == {"vllm", "lmcache", "sglang", "mooncake", "dynamo"}, rendered
    again = quota_run(h, pools)
    assert again.ok and not again.changed, again.actions
    assert steps() == []


def test_mount_points_are_sealed_before_the_mount_and_unsealed_before_removal(
        host: FakeHost, steps: Steps) -> None:
    """Issue 36: while a pool is not mounted its mount point refuses writes (immutable):
    each is sealed once, before anything is mounted on it; a detach unseals it, then
    removes it."""
    assert run(host, pool_yaml(host)).ok
    mounts = sorted(host.mounts())
    assert mounts and host.sealed == set(mounts)
    cold = steps()
    for m in mounts:
        seal = cold.index(("dir.seal", m))
        assert ("dir.make", m) in cold[:seal], "sealed after it was made"
    assert run(host, pool_yaml(host)).ok
    assert steps() == [], "a sealed mount point is left alone"
    assert run(host).ok
    gone = steps()
    for m in mounts:
        assert gone.index(("dir.unseal", m)) < gone.index(("dir.remove", m)), gone
    assert host.sealed == set()


def test_a_mount_point_that_cannot_be_sealed_is_mounted_all_the_same(
        host: FakeHost, steps: Steps, monkeypatch: pytest.MonkeyPatch) -> None:
    """No CAP_LINUX_IMMUTABLE (an older unit), or a filesystem without the attribute:
    the mount goes ahead, the pass is ok."""
    def refuse(path: str, on: bool) -> None:
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(host, "_seal", refuse)
    result = run(host, pool_yaml(host))
    assert result.ok and host.mounts() and host.sealed == set()
    assert not [k for k, _ in steps() if k == "dir.seal"]
