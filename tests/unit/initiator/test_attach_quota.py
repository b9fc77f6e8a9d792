"""Hard caps in the attach pass and the engines' hand-off, over the fake GPU host
(attach_fakes) and a fake of the kernel's project quotas: mounts with prjquota, the
remount of a pool an older kvagent mounted without it, caps set once, the cleaner, and
Dynamo refused without GPUDirect Storage. The kernel tier proves the same on a real xfs
(tests/kernel/test_cache_quota.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agent.engines.handoff import forget, hand_off
from agent.initiator.reconcile import InitiatorPass
from agent.result import RunResult
from agent.system.gds import GdsReadiness
from agent.system.mounts import read_mounts
from agent.system.xfsquota import project_quota_mode
from tests.unit.engines.fakequota import FakeQuota

from .attach_fakes import PREFIX, Export, FakeHost

NQN = f"{PREFIX}:store1:kv:gpu0"
UID, GID = os.getuid(), os.getgid()
NO_GDS = GdsReadiness(None, None, None)
GDS = GdsReadiness("/sys/module/nvidia_fs", "/dev/nvidia-fs0", "/usr/lib/libcufile.so.0")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    h = FakeHost(tmp_path, exports=[Export(NQN, [1, 2])])
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) in h.mounts())
    h.quota = FakeQuota()  # type: ignore[attr-defined]
    h.gds = GDS  # type: ignore[attr-defined]
    return h


def pool_yaml(host: FakeHost,
              engines: tuple[str, ...] = ("kind: lmcache", "kind: vllm, cpu_cache: 1GiB"),
              options: str | None = None) -> str:
    eng = ", ".join(f"{{{e}, owner: '{UID}', group: '{GID}'}}" for e in engines)
    opts = f"\n      mount_options: [{options}]" if options is not None else ""
    return f"""
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1, subsystem: '{NQN}'}}
      mount: {host.root / 'mnt' / 'kv'}{opts}
      engines: [{eng}]
"""


def run(host: FakeHost, pools: str, *, dry_run: bool = False) -> RunResult:
    cfg = host.config(f"initiator:\n  device_wait: 5s\n  pools:\n{pools}")
    result = RunResult(dry_run=dry_run)
    initiator = InitiatorPass(cfg, host.runner, result, dry_run=dry_run, sysfs=host.sysfs,
                              cli=host.cli, seams=host.seams())
    for name in initiator.detach_removed():
        forget(cfg, name, result, dry_run=dry_run)
    for m in initiator.attach_configured():
        hand_off(cfg, m.pool, m.mounts, m.transport, m.remounted, result, probe=host.probe,
                 quotas=host.quota, gds=lambda: host.gds,  # type: ignore[attr-defined]
                 mountinfo=host.mountinfo)
    return result


def done(result: RunResult) -> list[tuple[str, str]]:
    return [(a.kind, a.subject) for a in result.actions if a.status == "done"]


def mounts(host: FakeHost) -> list[str]:
    return [str(host.root / "mnt/kv" / f"store1-ns{i}") for i in (1, 2)]


def quota_modes(host: FakeHost) -> dict[str, str]:
    return {e.mount_point: project_quota_mode(e) for e in read_mounts(host.mountinfo)
            if e.fstype == "xfs"}


# ------------------------------------------------------------------------ mounts
def test_pools_are_mounted_with_prjquota_and_every_engine_directory_capped(
        host: FakeHost) -> None:
    result = run(host, pool_yaml(host))
    assert result.ok, result.errors
    mount_calls = [c for c in host.runner.calls if c[0] == "mount"]
    assert all(c[c.index("-o") + 1] == "noatime,prjquota" for c in mount_calls), mount_calls
    assert quota_modes(host) == dict.fromkeys(mounts(host), "enforced")
    kinds = [k for k, _ in done(result)]
    assert kinds.count("engine.quota.project") == 4 and kinds.count("engine.quota.limit") == 4
    # 10**12-byte mounts (the fake probe), lmcache and vllm 45% each, 64 KiB granules.
    want = 45 * 10**12 // 100 // 65536 * 65536
    assert host.quota.limits == {(m, p): want for m in mounts(host) for p in (1001, 1002)}


def test_a_converged_pass_runs_no_command_and_writes_no_quota(host: FakeHost) -> None:
    for module in ("nvme_fabrics", "nvme_tcp"):
        (host.root / "sys/module" / module).mkdir(parents=True)
    assert run(host, pool_yaml(host)).ok
    calls, quota_calls = len(host.runner.calls), len(host.quota.calls)
    again = run(host, pool_yaml(host))
    assert again.ok and not again.changed, again.actions
    assert host.runner.calls[calls:] == []
    assert [c for c in host.quota.calls[quota_calls:] if c[0] in ("tag", "set_limit")] == []


def test_an_operator_choice_about_quotas_is_kept(host: FakeHost) -> None:
    result = run(host, pool_yaml(host, options="noatime, noquota"))
    assert result.ok, result.errors
    assert quota_modes(host) == dict.fromkeys(mounts(host), "off")
    assert not [k for k, _ in done(result) if k.startswith("engine.quota")]
    assert host.quota.calls == []


# ----------------------------------------------------------------- the upgrade
def mounted_by_an_older_kvagent(host: FakeHost) -> None:
    """The pool attached, then its mounts replaced by ones without project quotas."""
    assert run(host, pool_yaml(host)).ok
    lines = host.mountinfo.read_text().splitlines(keepends=True)
    host.mountinfo.write_text("".join(ln.replace(",prjquota", "") for ln in lines))
    assert quota_modes(host) == dict.fromkeys(mounts(host), "off")


def test_a_pool_mounted_without_prjquota_is_mounted_again_with_it(host: FakeHost) -> None:
    mounted_by_an_older_kvagent(host)
    (Path(mounts(host)[0]) / "vllm/kept.bin").write_bytes(b"k" * 4096)
    plan = run(host, pool_yaml(host), dry_run=True)
    assert [(a.kind, a.subject) for a in plan.actions if a.status == "planned"] == [
        ("mount", m) for m in mounts(host)]
    calls = len(host.runner.calls)
    result = run(host, pool_yaml(host))
    assert result.ok, result.errors
    assert [c[0] for c in host.runner.calls[calls:]] == ["umount", "mount"] * 2
    assert quota_modes(host) == dict.fromkeys(mounts(host), "enforced")
    assert (Path(mounts(host)[0]) / "vllm/kept.bin").read_bytes() == b"k" * 4096
    assert [k for k, _ in done(result)].count("mount") == 2
    assert host.probed[-2:] == mounts(host), "a remount is probed again"


def test_a_busy_pool_is_left_mounted_and_tried_again_next_pass(host: FakeHost) -> None:
    mounted_by_an_older_kvagent(host)
    host.busy.add(mounts(host)[0])
    result = run(host, pool_yaml(host))
    assert result.ok, result.errors  # not an error: the engines hold it, health reports it
    skipped = [a for a in result.actions if a.status == "skipped"]
    assert [(a.kind, a.subject) for a in skipped] == [("mount", mounts(host)[0])]
    assert "busy" in skipped[0].detail
    assert quota_modes(host) == {mounts(host)[0]: "off", mounts(host)[1]: "enforced"}
    host.busy.clear()
    again = run(host, pool_yaml(host))
    assert again.ok and quota_modes(host) == dict.fromkeys(mounts(host), "enforced")
    assert ("umount", mounts(host)[0]) in done(again)
    assert not [c for c in host.runner.calls if c[:2] == ("umount", "-l")], "never lazily"


# --------------------------------------------------------------------- cleaner
def test_the_cleaner_runs_only_when_turned_on(host: FakeHost) -> None:
    engines = ("kind: vllm, cpu_cache: 1GiB, cleaner: {enabled: true, high: 50%, low: 25%}",
               "kind: sglang")
    # Small filesystems (800,000 bytes): each engine's cap is 327,680 bytes (45%, in 64 KiB)
    # (too small for LMCache's 0.01 GiB unit: its render would be refused).
    probe = host.probe
    host.probe = lambda path, *a, **kw: dataclasses.replace(probe(path), total_bytes=800_000)
    assert run(host, pool_yaml(host, engines)).ok
    ns1 = Path(mounts(host)[0])
    assert host.quota.limits[(str(ns1), 1002)] == 327_680
    for i, name in enumerate(["old.bin", "mid.bin", "new.bin"]):
        (ns1 / "vllm" / name).write_bytes(b"v" * 65536)  # 3 x 64 KiB = 60% of the cap
        os.utime(ns1 / "vllm" / name, ns=(10**18 + i * 10**9,) * 2)
    for name in ("a.bin", "b.bin", "c.bin", "d.bin"):  # 80% of sglang's cap; cleaner off
        (ns1 / "sglang" / name).write_bytes(b"s" * 65536)
    result = run(host, pool_yaml(host, engines))
    assert result.ok, result.errors
    cleaned = [a for a in result.actions if a.kind == "engine.clean"]
    assert [a.subject for a in cleaned] == [str(ns1 / "vllm")]
    assert "deleted 2 oldest file(s)" in cleaned[0].detail
    assert sorted(p.name for p in (ns1 / "vllm").iterdir()) == ["new.bin"]
    assert len(list((ns1 / "sglang").iterdir())) == 4
    stats = (host.root / "state/cleaner/kv.json").read_text()
    assert '"runs": 1' in stats and '"files": 2' in stats


# ------------------------------------------------------------------------- GDS
def test_dynamo_without_gds_is_refused_alone_and_its_old_render_removed(
        host: FakeHost) -> None:
    engines = ("kind: dynamo", "kind: lmcache")
    assert run(host, pool_yaml(host, engines)).ok
    renders = host.root / "state/engines/kv"
    assert (renders / "dynamo/dynamo-kvbm-0.env").exists()
    host.gds = NO_GDS  # type: ignore[attr-defined]  # nvidia-fs gone (a kernel update...)
    result = run(host, pool_yaml(host, engines))
    (err,) = result.errors
    assert err.pool == "kv" and "GPUDirect Storage" in err.message
    assert "nvidia-fs kernel module is not loaded" in err.message
    assert ("engine.unrender", str(renders / "dynamo")) in done(result)
    assert not (renders / "dynamo").exists()
    assert (renders / "lmcache/lmcache.yaml").exists()


def test_dynamo_with_gds_trust_is_rendered_without_looking(host: FakeHost) -> None:
    host.gds = NO_GDS  # type: ignore[attr-defined]
    result = run(host, pool_yaml(host, ("kind: dynamo, gds: trust",)))
    assert result.ok, result.errors
    env = (host.root / "state/engines/kv/dynamo/dynamo-kvbm-0.env").read_text()
    assert "DYN_KVBM_DISK_CACHE_DIR" in env


def test_detach_forgets_the_quota_and_cleaner_records(host: FakeHost) -> None:
    engines = ("kind: vllm, cpu_cache: 1GiB, cleaner: {enabled: true}", "kind: lmcache")
    assert run(host, pool_yaml(host, engines)).ok
    record = host.root / "state/quota/kv.json"
    assert record.exists()
    (host.root / "state/cleaner").mkdir()
    (host.root / "state/cleaner/kv.json").write_text("{}")
    cfg = host.config("initiator:\n  pools: []\n")
    result = RunResult(dry_run=False)
    initiator = InitiatorPass(cfg, host.runner, result, sysfs=host.sysfs, cli=host.cli,
                              seams=host.seams())
    for name in initiator.detach_removed():
        forget(cfg, name, result)
    assert result.ok, result.errors
    assert not record.exists() and not (host.root / "state/cleaner/kv.json").exists()
