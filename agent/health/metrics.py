"""Prometheus metrics built from a :class:`~agent.health.snapshot.Snapshot`.

A custom collector over a dedicated ``CollectorRegistry`` (never the global
one) turns the snapshot the loop stored into metric families; it reads nothing
else and runs no command. The HTTP endpoint serves the same exposition built once
per pool, controller and drive (:mod:`agent.health.exposition`); the textfile and
the tests format it here.

Naming (Prometheus conventions): every name starts with ``kvagent_``; values
are in base units (bytes, seconds, degrees Celsius, ratios 0-1); ``_total``
only on counters; labels-only facts are ``_info`` gauges with value 1; states
are one-hot gauges with a ``state`` label (one series per possible state, 1
for the current one), so ``kvagent_controller_state{state="live"} == 0`` is a
plain alert expression. Quantities the kernel does not show are left out
(no series), never exported as 0.

NVMe reports wear and spare as percentages; they are exported as ratios
(``kvagent_drive_percentage_used_ratio`` = percent_used / 100, which can exceed
1 on a drive past its rated endurance), as node_exporter's nvme collector does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .. import __version__
from ..log import get_logger
from .snapshot import (
    ANA_STATES,
    CONTROLLER_STATES,
    POOL_STATES,
    USAGE_SOURCES,
    ControllerHealth,
    DriveHealth,
    EngineUsage,
    PoolHealth,
    Snapshot,
)

log = get_logger("health.metrics")

SnapshotSource = Callable[[], Snapshot | None]


def _states(known: Sequence[str], current: str) -> list[str]:
    """The one-hot label values: every known state, plus the current one if it is new."""
    return list(known) if current in known else [*known, current]


class _Families:
    """Gauge/counter families created on first use, yielded in creation order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        assert isinstance(family, GaugeMetricFamily)
        return family

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = CounterMetricFamily(name, doc, labels=list(labels))
        assert isinstance(family, CounterMetricFamily)
        return family

    def set(self, name: str, doc: str, labels: dict[str, str], value: float | None) -> None:
        """Add one gauge sample; ``None`` (unknown) adds the family but no sample."""
        family = self.gauge(name, doc, list(labels))
        if value is not None:
            family.add_metric(list(labels.values()), float(value))

    def count(self, name: str, doc: str, labels: dict[str, str], value: float | None) -> None:
        family = self.counter(name, doc, list(labels))
        if value is not None:
            family.add_metric(list(labels.values()), float(value))

    def one_hot(self, name: str, doc: str, labels: dict[str, str], known: Sequence[str],
                current: str) -> None:
        family = self.gauge(name, doc, [*labels, "state"])
        for state in _states(known, current):
            family.add_metric([*labels.values(), state], 1.0 if state == current else 0.0)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _engine_families(f: _Families, pool: str, e: EngineUsage) -> None:
    el = {"pool": pool, "engine": e.kind}
    f.set("kvagent_engine_used_bytes", "Bytes an engine holds under its directories on the "
          "pool (from their xfs project quotas, or a bounded sample: see "
          "kvagent_engine_usage_source).", el, e.used_bytes)
    f.set("kvagent_engine_capacity_bytes", "The cap kvagent gave the engine on the pool (the "
          "sum of its project quotas' hard limits where enforced).", el, e.cap_bytes)
    for source in _states(USAGE_SOURCES, e.source):
        f.set("kvagent_engine_usage_source", "Where kvagent_engine_used_bytes comes from, "
              "one-hot by source: quota (exact, O(1)) or sample (a walk; a lower bound past "
              "it).", {**el, "source": source}, int(source == e.source))
    f.set("kvagent_engine_cap_enforced", "1 if the engine's cap is a hard limit (xfs project "
          "quota: ENOSPC at it), 0 if advisory.", el, int(e.enforced))
    f.set("kvagent_engine_at_cap", "1 while an enforced cap has less than 1% left: the "
          "engine's next writes may fail with ENOSPC.", el, int(e.at_cap))
    c = e.cleaner
    if c is None:
        return
    f.set("kvagent_engine_cleaner_enabled", "1 if the engine's oldest-first cleaner is on.",
          el, int(c.enabled))
    f.count("kvagent_engine_cleaner_runs", "Runs of the engine's cleaner on the pool.",
            el, c.runs)
    f.count("kvagent_engine_cleaner_deleted_files", "Files the engine's cleaner deleted on "
            "the pool.", el, c.deleted_files)
    f.count("kvagent_engine_cleaner_deleted_bytes", "Bytes the files the engine's cleaner "
            "deleted on the pool held.", el, c.deleted_bytes)
    f.set("kvagent_engine_cleaner_last_run_timestamp_seconds", "When the engine's cleaner "
          "last deleted files on the pool (Unix time).", el, c.last_run)


def snapshot_families(snapshot: Snapshot | None) -> list[Metric]:
    """All metric families for ``snapshot`` (build info only when there is none yet)."""
    f = _Families()
    loop_families(f, snapshot)
    if snapshot is not None:
        for pool in snapshot.pools:
            pool_families(f, pool)
        for c in snapshot.controllers:
            controller_families(f, c)
        for d in snapshot.drives:
            drive_families(f, d)
    return list(f)


def loop_families(f: _Families, snapshot: Snapshot | None) -> None:
    """The agent's own series: build, node, loop tick, last apply, counters, config."""
    f.set("kvagent_build_info", "kvagent version (always 1).", {"version": __version__}, 1)
    if snapshot is None:
        return
    s = snapshot
    f.set("kvagent_node_info", "This host's node name (always 1).", {"node": s.node}, 1)
    f.set("kvagent_loop_last_tick_timestamp_seconds",
          "When the agent's loop last completed a tick (Unix time).", {}, s.taken_at)

    apply = s.last_apply
    f.set("kvagent_last_apply_timestamp_seconds", "When the last reconcile pass finished.",
          {}, None if apply is None else apply.finished_at)
    f.set("kvagent_last_apply_success", "1 if the last reconcile pass succeeded, else 0.",
          {}, None if apply is None else int(apply.ok))
    f.set("kvagent_last_apply_changed_actions", "Actions that changed something in the last pass.",
          {}, None if apply is None else apply.changed)
    f.set("kvagent_last_apply_failed_actions", "Actions that failed in the last pass.",
          {}, None if apply is None else apply.failed)
    f.set("kvagent_last_apply_duration_seconds", "How long the last reconcile pass took.",
          {}, None if apply is None else apply.duration_seconds)
    f.count("kvagent_apply_runs", "Reconcile passes run since the agent started.",
            {}, s.counters.apply_runs)
    f.count("kvagent_apply_failures", "Reconcile passes that failed since the agent started.",
            {}, s.counters.apply_failures)
    f.count("kvagent_apply_unexpected_errors", "Exceptions kvagent did not expect (bugs) in "
            "reconcile passes since the agent started: each failed its pool or its pass, "
            "the traceback is in the log.", {}, s.counters.unexpected_errors)
    f.count("kvagent_apply_busy", "Reconcile passes skipped because another process held "
            "the apply lock.", {}, s.counters.apply_busy)
    f.set("kvagent_apply_busy_passes", "Reconcile passes skipped in a row, now, because "
          "another process holds the apply lock (0 once a pass runs).",
          {}, s.counters.apply_busy_passes)
    f.count("kvagent_config_reloads", "Config reloads (SIGHUP) attempted.",
            {}, s.counters.config_reloads)
    f.count("kvagent_device_events", "udev events for NVMe controllers and namespaces the "
            "agent acted on.", {}, s.counters.device_events)
    f.count("kvagent_device_event_batches", "Batches of udev events (each one collect and, "
            "with initiator pools, one attach pass).", {}, s.counters.device_batches)
    drift = f.counter("kvagent_drift_detected", "Changes to kvagent's own objects made "
                      "behind its back that a collect saw (agent.health.drift), by role and "
                      "kind.", ["role", "kind"])
    for role, kind, n in s.counters.drift_detected:
        drift.add_metric([role, kind], float(n))
    f.count("kvagent_drift_heals", "Targeted passes run to heal drift.", {},
            s.counters.drift_heals)
    f.set("kvagent_drift_fights", "Objects of kvagent's that another writer keeps changing "
          "(healed 3 times lately): named in kvagent status.", {},
          sum(1 for d in s.drift if d.fighting))
    f.set("kvagent_stray_controllers", "Controllers to kvagent's subsystems that no pool of "
          "this host attaches (another tool connected them: kvagent status says which).",
          {}, len(s.strays))
    f.count("kvagent_config_reload_failures",
            "Config reloads refused (invalid new config; the old one keeps running).",
            {}, s.counters.config_reload_failures)
    f.set("kvagent_config_last_reload_successful",
          "0 while the last config reload was refused and the old config is running, else 1.",
          {}, 0 if s.config_error is not None else 1)
    f.set("kvagent_health_endpoint_listening",
          "1 while the health endpoint listens on health.listen, 0 while it cannot (the "
          "agent runs its passes without it and tries again every health.interval; after a "
          "reload to an address it cannot bind, the old address still serves).",
          {}, 0 if s.health_error is not None else 1)


def pool_families(f: _Families, pool: PoolHealth) -> None:
    """One pool's series."""
    pl = {"role": pool.role, "pool": pool.name}
    mount = pool.initiator.mount_path if pool.initiator else None
    f.set("kvagent_pool_info", "A configured pool (always 1).", {**pl, "mount": mount or ""}, 1)
    f.set("kvagent_pool_ready", "1 if the pool is ready for use, else 0.", pl, int(pool.ready))
    f.one_hot("kvagent_pool_state", "Pool state, one-hot: ok, degraded or failed.", pl,
              POOL_STATES, pool.state)
    f.set("kvagent_pool_problems", "Number of problems the pool has.", pl, len(pool.problems))
    for probe, value in sorted((pool.probe or {}).items()):
        if isinstance(value, bool):
            f.set("kvagent_pool_probe_success", "1 if the pool's last probe check passed.",
                  {**pl, "probe": probe}, int(value))
    if pool.target is not None:
        t, tl = pool.target, {"pool": pool.name}
        f.set("kvagent_target_subsystems_expected", "Subsystems the pool should export.",
              tl, t.subsystems_expected)
        f.set("kvagent_target_subsystems", "Subsystems of the pool present in nvmet.",
              tl, t.subsystems_present)
        f.set("kvagent_target_namespaces_expected", "Namespaces the pool should export.",
              tl, t.namespaces_expected)
        f.set("kvagent_target_namespaces", "Namespaces of the pool present in nvmet.",
              tl, t.namespaces_present)
        f.set("kvagent_target_namespaces_enabled", "Namespaces of the pool enabled in nvmet.",
              tl, t.namespaces_enabled)
        f.set("kvagent_target_ports_expected", "Ports the pool should be linked into.",
              tl, t.ports_expected)
        f.set("kvagent_target_ports_linked", "Ports the pool's subsystems are linked into.",
              tl, t.ports_linked)
        f.set("kvagent_target_hosts_connected",
              "Hosts connected, from the target's view (absent where the kernel does not "
              "show it).", tl, t.hosts_connected)
    if pool.initiator is not None:
        i, il = pool.initiator, {"pool": pool.name}
        f.set("kvagent_initiator_controllers_expected",
              "Controllers (target ports) the pool should be connected through.",
              il, i.controllers_expected)
        f.set("kvagent_initiator_controllers_live", "The pool's controllers in state live.",
              il, i.controllers_live)
        f.set("kvagent_initiator_namespaces_expected", "Namespaces the pool should have.",
              il, i.namespaces_expected)
        f.set("kvagent_initiator_namespaces_found", "The pool's namespaces with a block "
              "device on this host.", il, i.namespaces_found)
        f.set("kvagent_initiator_mounts_shut_down", "The pool's mounted filesystems that "
              "shut down after I/O errors (a storage outage): every call on them fails "
              "until kvagent mounts them again.", il, len(i.mounts_shut_down))
        f.count("kvagent_initiator_fs_recoveries", "Shut-down filesystems of the pool "
                "kvagent unmounted and mounted again (log recovery), from its records.",
                il, i.recoveries)
        f.set("kvagent_initiator_fs_last_recovery_timestamp_seconds", "When kvagent last "
              "mounted a shut-down filesystem of the pool again (absent: never).",
              il, i.last_recovery_at)
        if i.mount_path:
            ml = {"pool": pool.name, "mount": i.mount_path}
            f.set("kvagent_mount_mounted", "1 if the pool's filesystem is mounted, else 0.",
                  ml, int(i.mounted))
            f.set("kvagent_mount_size_bytes", "Size of the pool's mounted filesystem.",
                  ml, i.size_bytes if i.mounted else None)
            f.set("kvagent_mount_free_bytes", "Free space on the pool's mounted filesystem.",
                  ml, i.free_bytes if i.mounted else None)
        for e in i.engines:
            _engine_families(f, pool.name, e)


def controller_families(f: _Families, c: ControllerHealth) -> None:
    """One controller's series, with its paths'."""
    cl = {"controller": c.name, "pool": c.pool}
    f.set("kvagent_controller_info", "A fabrics controller of a pool (always 1).",
          {**cl, "subsysnqn": c.subsysnqn, "transport": c.transport, "traddr": c.traddr,
           "trsvcid": c.trsvcid}, 1)
    f.one_hot("kvagent_controller_state",
              "Kernel state of a fabrics controller, one-hot (live when healthy).",
              cl, CONTROLLER_STATES, c.state)
    for p in c.paths:
        f.one_hot("kvagent_path_ana_state",
                  "ANA state of a namespace through a controller, one-hot.",
                  {**cl, "path": p.path}, ANA_STATES, p.state)


def drive_families(f: _Families, d: DriveHealth) -> None:
    """One local drive's series."""
    dl = {"device": d.device}
    f.set("kvagent_drive_info", "A local NVMe drive (always 1).",
          {**dl, "model": d.model or "", "serial": d.serial or "",
           "firmware": d.firmware or ""}, 1)
    f.set("kvagent_drive_smart_log_readable", "1 if the drive's SMART log could be read.",
          dl, int(d.error is None))
    f.set("kvagent_drive_critical_warning", "SMART critical warning bitmap (0 = none).",
          dl, d.critical_warning)
    f.set("kvagent_drive_temperature_celsius", "Drive composite temperature.",
          dl, d.temperature_celsius)
    f.set("kvagent_drive_percentage_used_ratio",
          "Share of the drive's rated endurance used (percent used / 100; may exceed 1).",
          dl, None if d.percent_used is None else d.percent_used / 100)
    f.set("kvagent_drive_available_spare_ratio", "Remaining spare capacity (0-1).",
          dl, None if d.available_spare is None else d.available_spare / 100)
    f.set("kvagent_drive_available_spare_threshold_ratio",
          "Spare level below which the drive raises a critical warning (0-1).",
          dl, None if d.available_spare_threshold is None
          else d.available_spare_threshold / 100)
    f.count("kvagent_drive_media_errors", "Unrecovered data integrity errors (SMART).",
            dl, d.media_errors)
    f.count("kvagent_drive_error_log_entries", "Error information log entries (SMART).",
            dl, d.error_log_entries)


class SnapshotCollector(Collector):
    """Yields the metric families of whatever snapshot ``source()`` returns at scrape time."""

    def __init__(self, source: SnapshotSource):
        self._source = source

    def collect(self) -> Iterable[Metric]:
        return snapshot_families(self._source())

    def describe(self) -> Iterable[Metric]:
        # No pre-declared names: the series depend on the snapshot. Returning nothing keeps
        # registration from calling collect() (which would read the source early).
        return []


def build_registry(source: SnapshotSource, *, process: bool = False) -> CollectorRegistry:
    """A dedicated registry exposing ``source()``'s snapshot.

    ``process=True`` adds the standard ``process_*`` metrics (RSS, CPU, fds) of this
    process, for the HTTP endpoint; the textfile leaves them out (they would describe
    the writer, not a running exporter).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    if process:
        ProcessCollector(registry=registry)
    return registry


def render_metrics(snapshot: Snapshot | None) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    return generate_latest(build_registry(lambda: snapshot))


def write_textfile(path: str | Path, snapshot: Snapshot | None) -> None:
    """Write the snapshot's metrics for node_exporter's textfile collector, atomically.

    A temporary file in the same directory (not ending in ``.prom``, so node_exporter
    ignores it) is renamed over ``path``: node_exporter never reads a half-written
    file, and a failure leaves the old file and no temporary one. (prometheus-client's
    ``write_to_textfile`` does the same, but leaves its temporary file behind on a
    failure before 0.17; Debian 12 ships 0.16.) node_exporter only reads ``*.prom``.
    """
    target = Path(path)
    if target.suffix != ".prom":
        log.warning("node_exporter's textfile collector only reads *.prom files",
                    path=str(target))
    data = generate_latest(build_registry(lambda: snapshot))
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
