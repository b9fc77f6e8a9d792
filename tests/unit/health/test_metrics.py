"""The Prometheus exposition, parsed back with prometheus-client's own parser."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from agent import __version__
from agent.health import metrics as metrics_mod
from agent.health.metrics import build_registry, render_metrics, write_textfile
from agent.health.snapshot import Snapshot
from tests.unit.fakerunner import FakeRunner
from tests.unit.health import samples

NAME_RE = re.compile(r"^kvagent_[a-z0-9_]+$")


def parse(snapshot: Snapshot | None) -> dict[str, object]:
    text = render_metrics(snapshot).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples_of(families: dict, name: str) -> dict[tuple, float]:
    """{sorted label items: value} of one family's samples (by sample name)."""
    out = {}
    for family in families.values():
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(families: dict, name: str, **labels: str) -> float:
    found = samples_of(families, name)
    key = tuple(sorted(labels.items()))
    assert key in found, f"{name}{labels} not exposed; have {sorted(found)}"
    return found[key]


def test_names_types_and_conventions() -> None:
    families = parse(samples.healthy())
    for name, family in families.items():
        assert NAME_RE.match(name), name
        if family.type == "counter":
            assert all(s.name == name + "_total" for s in family.samples), name
        else:
            assert not name.endswith("_total"), f"{name} is a {family.type} ending in _total"
        if name.endswith("_info"):
            assert family.type == "gauge" and all(s.value == 1 for s in family.samples), name
    types = {n: f.type for n, f in families.items()}
    assert types["kvagent_apply_runs"] == "counter"
    assert types["kvagent_config_reload_failures"] == "counter"
    assert types["kvagent_drive_media_errors"] == "counter"
    assert types["kvagent_drive_temperature_celsius"] == "gauge"
    assert types["kvagent_mount_free_bytes"] == "gauge"
    assert types["kvagent_pool_state"] == "gauge"


def test_values_and_labels_of_a_healthy_snapshot() -> None:
    f = parse(samples.healthy())
    assert value(f, "kvagent_build_info", version=__version__) == 1
    assert value(f, "kvagent_node_info", node="stor1") == 1
    assert value(f, "kvagent_loop_last_tick_timestamp_seconds") == samples.T0
    assert value(f, "kvagent_last_apply_timestamp_seconds") == samples.T0 - 5
    assert value(f, "kvagent_last_apply_success") == 1
    assert value(f, "kvagent_last_apply_changed_actions") == 3
    assert value(f, "kvagent_last_apply_duration_seconds") == 1.25
    assert value(f, "kvagent_apply_runs_total") == 12
    assert value(f, "kvagent_apply_failures_total") == 1
    assert value(f, "kvagent_config_reloads_total") == 2
    assert value(f, "kvagent_config_reload_failures_total") == 1
    assert value(f, "kvagent_config_last_reload_successful") == 1

    for role in ("target", "initiator"):
        assert value(f, "kvagent_pool_ready", role=role, pool="kv") == 1
        states = {k: v for k, v in samples_of(f, "kvagent_pool_state").items()
                  if ("role", role) in k}
        assert {dict(k)["state"]: v for k, v in states.items()} == {
            "ok": 1, "degraded": 0, "failed": 0}
    assert value(f, "kvagent_pool_info", role="initiator", pool="kv", mount="/srv/kv") == 1
    assert value(f, "kvagent_pool_info", role="target", pool="kv", mount="") == 1
    assert value(f, "kvagent_pool_probe_success", role="initiator", pool="kv",
                 probe="odirect") == 1
    assert value(f, "kvagent_pool_probe_success", role="initiator", pool="kv",
                 probe="fallocate") == 0
    # Numbers in the probe are shown by status, not invented into metric names.
    assert all(dict(k)["probe"] != "read_mib_s"
               for k in samples_of(f, "kvagent_pool_probe_success"))

    assert value(f, "kvagent_target_namespaces_enabled", pool="kv") == 4
    assert value(f, "kvagent_target_ports_linked", pool="kv") == 2
    # nvmet on 6.1 shows no connected hosts: no series, never a made-up 0.
    assert samples_of(f, "kvagent_target_hosts_connected") == {}

    assert value(f, "kvagent_mount_size_bytes", pool="kv", mount="/srv/kv") == 100 * samples.GIB
    assert value(f, "kvagent_mount_free_bytes", pool="kv", mount="/srv/kv") == 60 * samples.GIB
    assert value(f, "kvagent_engine_used_bytes", pool="kv", engine="lmcache") == 30 * samples.GIB
    assert value(f, "kvagent_engine_capacity_bytes", pool="kv", engine="vllm") == 45 * samples.GIB

    assert value(f, "kvagent_controller_info", controller="nvme1", pool="kv",
                 subsysnqn=samples.NQN, transport="tcp", traddr="10.0.0.1",
                 trsvcid="4420") == 1
    ctrl = {dict(k)["state"]: v for k, v in samples_of(f, "kvagent_controller_state").items()
            if ("controller", "nvme1") in k}
    assert ctrl["live"] == 1 and sum(ctrl.values()) == 1 and "connecting" in ctrl
    ana = {dict(k)["state"]: v for k, v in samples_of(f, "kvagent_path_ana_state").items()
           if ("path", "nvme1c1n1") in k}
    assert ana["optimized"] == 1 and sum(ana.values()) == 1

    assert value(f, "kvagent_drive_info", device="/dev/nvme0", model="QEMU NVMe Ctrl",
                 serial="KVTEST0", firmware="8.0.0") == 1
    assert value(f, "kvagent_drive_temperature_celsius", device="/dev/nvme0") == 49.85
    assert value(f, "kvagent_drive_percentage_used_ratio", device="/dev/nvme0") == 0.03
    assert value(f, "kvagent_drive_available_spare_ratio", device="/dev/nvme0") == 1.0
    assert value(f, "kvagent_drive_media_errors_total", device="/dev/nvme0") == 0
    assert value(f, "kvagent_drive_error_log_entries_total", device="/dev/nvme0") == 7


def test_degraded_snapshot_shows_connecting_and_not_ready() -> None:
    f = parse(samples.degraded())
    assert value(f, "kvagent_pool_ready", role="initiator", pool="kv") == 0
    assert value(f, "kvagent_pool_state", role="target", pool="kv", state="failed") == 1
    assert value(f, "kvagent_pool_state", role="target", pool="kv", state="ok") == 0
    assert value(f, "kvagent_controller_state", controller="nvme1", pool="kv",
                 state="connecting") == 1
    assert value(f, "kvagent_controller_state", controller="nvme1", pool="kv",
                 state="live") == 0
    assert value(f, "kvagent_last_apply_success") == 0
    assert value(f, "kvagent_config_last_reload_successful") == 0
    assert value(f, "kvagent_mount_mounted", pool="kv", mount="/srv/kv") == 0
    assert samples_of(f, "kvagent_mount_free_bytes") == {}  # not mounted: unknown
    assert value(f, "kvagent_drive_critical_warning", device="/dev/nvme0") == 5
    assert value(f, "kvagent_drive_percentage_used_ratio", device="/dev/nvme0") == 1.04
    assert value(f, "kvagent_drive_smart_log_readable", device="/dev/nvme1") == 0
    assert ("device", "/dev/nvme1") not in {
        k[0] for k in samples_of(f, "kvagent_drive_temperature_celsius")}


def test_unknown_kernel_state_is_its_own_series() -> None:
    snap = samples.healthy()
    odd = dataclasses.replace(snap.controllers[0], state="deleting (no IO)x")
    snap = dataclasses.replace(snap, controllers=(odd,))
    f = parse(snap)
    assert value(f, "kvagent_controller_state", controller="nvme1", pool="kv",
                 state="deleting (no IO)x") == 1


def test_no_snapshot_yet_exposes_build_info_only() -> None:
    f = parse(None)
    assert list(f) == ["kvagent_build_info"]


def test_empty_snapshot() -> None:
    f = parse(samples.empty())
    assert samples_of(f, "kvagent_pool_ready") == {}
    assert samples_of(f, "kvagent_last_apply_success") == {}  # no pass yet: absent, not 0
    assert value(f, "kvagent_apply_runs_total") == 0


def test_collector_reads_the_current_snapshot_at_each_scrape() -> None:
    from prometheus_client import generate_latest

    current: list[Snapshot | None] = [samples.healthy()]
    registry = build_registry(lambda: current[0])
    first = generate_latest(registry).decode()
    current[0] = samples.degraded()
    second = generate_latest(registry).decode()
    assert 'kvagent_node_info{node="stor1"} 1.0' in first
    assert 'kvagent_node_info{node="gpu1"} 1.0' in second


def test_collector_never_runs_commands(monkeypatch) -> None:
    """A scrape only reads the snapshot.

    The project's command seam is replaced by a FakeRunner with no responses (any
    command fails loudly), and subprocess itself is disabled as well.
    """
    from prometheus_client import generate_latest

    import agent.system.run as run_mod

    runner = FakeRunner()

    def forbidden(*a, **k):
        raise AssertionError(f"a scrape ran a command: {a}")

    monkeypatch.setattr(run_mod, "default_runner", lambda: runner)
    monkeypatch.setattr(run_mod.SubprocessRunner, "__call__",
                        lambda self, argv, **kw: runner(argv, **kw))
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(os, "system", forbidden)
    registry = build_registry(samples.degraded, process=True)
    text = generate_latest(registry).decode()
    assert "kvagent_pool_ready" in text and "process_resident_memory_bytes" in text
    assert runner.calls == []
    assert not hasattr(metrics_mod, "Runner")  # the module has no way to get a runner


def test_textfile_is_written_atomically(tmp_path) -> None:
    path = tmp_path / "kvagent.prom"
    path.write_text("old content\n")
    write_textfile(path, samples.healthy())
    text = path.read_text()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert "kvagent_pool_ready" in families
    assert "process_resident_memory_bytes" not in text  # the writer's own stats stay out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvagent.prom"]  # no temp left


def test_textfile_failure_leaves_old_file_and_no_temp(tmp_path, monkeypatch) -> None:
    path = tmp_path / "kvagent.prom"
    path.write_text("old content\n")
    from prometheus_client import exposition

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(exposition.os, "rename", boom)
    try:
        write_textfile(path, samples.healthy())
    except OSError:
        pass
    else:
        raise AssertionError("the rename failure was swallowed")
    assert path.read_text() == "old content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvagent.prom"]


def test_shut_down_mounts_and_recoveries() -> None:
    f = parse(samples.shut_down())
    assert value(f, "kvagent_initiator_mounts_shut_down", pool="kv") == 1
    assert value(f, "kvagent_initiator_fs_recoveries_total", pool="kv") == 3
    assert value(f, "kvagent_initiator_fs_last_recovery_timestamp_seconds",
                 pool="kv") == samples.T0 - 3600
    assert f["kvagent_initiator_fs_recoveries"].type == "counter"
    healthy = parse(samples.healthy())
    assert value(healthy, "kvagent_initiator_mounts_shut_down", pool="kv") == 0
    assert value(healthy, "kvagent_initiator_fs_recoveries_total", pool="kv") == 0
    # never recovered: no timestamp series (unknown, not 0)
    assert samples_of(healthy, "kvagent_initiator_fs_last_recovery_timestamp_seconds") == {}
