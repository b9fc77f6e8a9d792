"""Hand-built snapshots for the health tests: healthy, degraded and empty."""

from __future__ import annotations

from agent.health.snapshot import (
    ApplySummary,
    CleanerState,
    ControllerHealth,
    DriveHealth,
    EngineUsage,
    InitiatorSide,
    LoopCounters,
    PathAna,
    PoolHealth,
    Snapshot,
    TargetSide,
)

GIB = 1024**3
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
NQN = "nqn.2026-11.io.kvagent:stor1:kv:gpu1"


def target_pool(**kw: object) -> PoolHealth:
    args: dict[str, object] = {
        "role": "target", "name": "kv", "state": "ok", "ready": True,
        "target": TargetSide(subsystems_expected=2, subsystems_present=2, namespaces_expected=4,
                             namespaces_present=4, namespaces_enabled=4, ports_expected=2,
                             ports_linked=2, hosts_connected=None),
    }
    args.update(kw)
    return PoolHealth(**args)  # type: ignore[arg-type]


def initiator_pool(**kw: object) -> PoolHealth:
    args: dict[str, object] = {
        "role": "initiator", "name": "kv", "state": "ok", "ready": True,
        "initiator": InitiatorSide(
            controllers_expected=2, controllers_live=2, namespaces_expected=2,
            namespaces_found=2, mount_path="/srv/kv", mounted=True, size_bytes=100 * GIB,
            free_bytes=60 * GIB,
            engines=(EngineUsage("lmcache", 30 * GIB, 45 * GIB, "/srv/kv/lmcache", "quota",
                                 True),
                     EngineUsage("vllm", 10 * GIB, 45 * GIB, "/srv/kv/vllm", "quota", True,
                                 cleaner=CleanerState(True, 2, 1500, 3 * GIB, T0 - 60)))),
        "probe": {"odirect": True, "fallocate": False, "read_mib_s": 812.5},
    }
    args.update(kw)
    return PoolHealth(**args)  # type: ignore[arg-type]


def controllers(state1: str = "live") -> tuple[ControllerHealth, ...]:
    return (
        ControllerHealth("nvme1", "kv", NQN, "tcp", "10.0.0.1", "4420", state1,
                         (PathAna("nvme1c1n1", "optimized", 1),)),
        ControllerHealth("nvme2", "kv", NQN, "rdma", "10.0.1.1", "4420", "live",
                         (PathAna("nvme1c2n1", "optimized", 1),)),
    )


def drive(**kw: object) -> DriveHealth:
    args: dict[str, object] = {
        "device": "/dev/nvme0", "model": "QEMU NVMe Ctrl", "serial": "KVTEST0",
        "firmware": "8.0.0", "critical_warning": 0, "temperature_celsius": 49.85,
        "percent_used": 3, "available_spare": 100, "available_spare_threshold": 10,
        "media_errors": 0, "error_log_entries": 7, "power_on_hours": 1200,
        "unsafe_shutdowns": 2,
    }
    args.update(kw)
    return DriveHealth(**args)  # type: ignore[arg-type]


def healthy(tick_at: float = 1000.0) -> Snapshot:
    return Snapshot(
        taken_at=T0, tick_at=tick_at, node="stor1",
        pools=(target_pool(), initiator_pool()),
        controllers=controllers(),
        drives=(drive(),),
        last_apply=ApplySummary(finished_at=T0 - 5, ok=True, changed=3, failed=0,
                                duration_seconds=1.25),
        counters=LoopCounters(apply_runs=12, apply_failures=1, config_reloads=2,
                              config_reload_failures=1),
    )


def degraded(tick_at: float = 1000.0) -> Snapshot:
    """Controller nvme1 reconnecting, the initiator pool not ready, a drive warning."""
    pool = initiator_pool(
        state="degraded", ready=False,
        problems=("controller nvme1 is connecting",),
        initiator=InitiatorSide(controllers_expected=2, controllers_live=1,
                                namespaces_expected=2, namespaces_found=2,
                                mount_path="/srv/kv", mounted=False))
    return Snapshot(
        taken_at=T0, tick_at=tick_at, node="gpu1",
        pools=(target_pool(state="failed", ready=False, problems=("port 1 not linked",)), pool),
        controllers=controllers("connecting"),
        drives=(drive(critical_warning=0x05, percent_used=104, media_errors=3),
                DriveHealth(device="/dev/nvme1", error="nvme smart-log timed out")),
        last_apply=ApplySummary(finished_at=T0, ok=False, changed=0, failed=2),
        config_error="kvagent.yaml: target.ports[0].id: must be at least 1",
    )


def empty(tick_at: float = 1000.0) -> Snapshot:
    return Snapshot(taken_at=T0, tick_at=tick_at, node="lonely")


def shut_down(tick_at: float = 1000.0) -> Snapshot:
    """A storage outage on the GPU host: nvme1 reconnecting, one of the pool's two xfs
    shut down (I/O failed fast), one earlier recovery recorded."""
    pool = initiator_pool(
        state="degraded", ready=False,
        problems=("controller nvme1 (10.0.0.1:4420) is connecting",
                  "filesystem shut down after I/O errors (a storage outage): "
                  "/srv/kv/stor1-ns1; kvagent mounts it again once a controller of the pool "
                  "is live and nothing holds it"),
        initiator=InitiatorSide(
            controllers_expected=2, controllers_live=1, namespaces_expected=2,
            namespaces_found=2, mount_path="/srv/kv", mounted=True, size_bytes=100 * GIB,
            free_bytes=60 * GIB, mounts_shut_down=("/srv/kv/stor1-ns1",), recoveries=3,
            last_recovery_at=T0 - 3600))
    return Snapshot(taken_at=T0, tick_at=tick_at, node="gpu1", pools=(pool,),
                    controllers=controllers("connecting"))
