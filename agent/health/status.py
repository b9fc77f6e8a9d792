"""``kvagent status``: a snapshot as JSON (schema: agent/schemas/status.schema.json) or a table.

The table is rendered from the JSON, so a status the agent serves as JSON (its status
socket, :mod:`agent.health.statussock`) prints as the same table a live read would.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from .. import __version__
from ..lockholder import LockHolder
from ..text import table

if TYPE_CHECKING:  # (rendering a document the agent sent needs none of them)
    from .snapshot import (
        ApplyBusy,
        ControllerHealth,
        DriftSubject,
        DriveHealth,
        EngineUsage,
        PoolHealth,
        Snapshot,
    )

STATUS_FORMAT = 1
SCHEMA_RESOURCE = "status.schema.json"
#: Who collected what a status shows: the running agent (``kvagent run``), or the
#: command itself (a live read).
Source = Literal["agent", "live"]


def load_status_schema() -> dict[str, Any]:
    """The JSON Schema of :func:`to_status_json`'s output (shipped as package data)."""
    from importlib import resources

    text = (resources.files("agent") / "schemas" / SCHEMA_RESOURCE).read_text("utf-8")
    return json.loads(text)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _controller_json(c: ControllerHealth) -> dict[str, Any]:
    return {
        "name": c.name, "pool": c.pool, "subsysnqn": c.subsysnqn, "transport": c.transport,
        "traddr": c.traddr, "trsvcid": c.trsvcid, "state": c.state, "iopolicy": c.iopolicy,
        "paths": [{"path": p.path, "nsid": p.nsid, "ana_state": p.state} for p in c.paths],
    }


def _pool_json(pool: PoolHealth, snapshot: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": pool.role, "name": pool.name, "state": pool.state, "ready": pool.ready,
        "problems": list(pool.problems), "target": None, "initiator": None,
        "probe": dict(pool.probe) if pool.probe is not None else None,
    }
    if pool.target is not None:
        t = pool.target
        out["target"] = {
            "subsystems": {"expected": t.subsystems_expected, "present": t.subsystems_present},
            "namespaces": {"expected": t.namespaces_expected, "present": t.namespaces_present,
                           "enabled": t.namespaces_enabled},
            "ports": {"expected": t.ports_expected, "linked": t.ports_linked},
            "hosts_connected": t.hosts_connected,
        }
    if pool.initiator is not None:
        i = pool.initiator
        out["initiator"] = {
            "controllers": {"expected": i.controllers_expected, "live": i.controllers_live,
                            "names": [c.name for c in snapshot.controllers_of(pool.name)]},
            "namespaces": {"expected": i.namespaces_expected, "found": i.namespaces_found},
            "mount": {"path": i.mount_path, "mounted": i.mounted, "size_bytes": i.size_bytes,
                      "free_bytes": i.free_bytes, "shut_down": list(i.mounts_shut_down)},
            "recoveries": {"count": i.recoveries,
                           "last_at": None if i.last_recovery_at is None
                           else _iso(i.last_recovery_at)},
            "engines": [_engine_json(e) for e in i.engines],
        }
    return out


def _engine_json(e: EngineUsage) -> dict[str, Any]:
    c = e.cleaner
    return {
        "kind": e.kind, "directory": e.directory, "used_bytes": e.used_bytes,
        "cap_bytes": e.cap_bytes, "source": e.source, "enforced": e.enforced,
        "complete": e.complete, "over_cap": e.over_cap, "at_cap": e.at_cap,
        "cleaner": None if c is None else {
            "enabled": c.enabled, "runs": c.runs, "deleted_files": c.deleted_files,
            "deleted_bytes": c.deleted_bytes,
            "last_run": None if c.last_run is None else _iso(c.last_run)},
    }


def _drive_json(d: DriveHealth) -> dict[str, Any]:
    return {
        "device": d.device, "model": d.model, "serial": d.serial, "firmware": d.firmware,
        "critical_warning": d.critical_warning, "warnings": list(d.warnings),
        "temperature_celsius": d.temperature_celsius, "percent_used": d.percent_used,
        "available_spare": d.available_spare,
        "available_spare_threshold": d.available_spare_threshold,
        "media_errors": d.media_errors, "error_log_entries": d.error_log_entries,
        "power_on_hours": d.power_on_hours, "unsafe_shutdowns": d.unsafe_shutdowns,
        "error": d.error, "healthy": d.healthy, "problems": list(d.problems),
    }


def _busy_json(busy: ApplyBusy | None) -> dict[str, Any] | None:
    if busy is None:
        return None
    return {"passes": busy.passes, "stuck": busy.stuck,
            "since": None if busy.since is None else _iso(busy.since),
            "holder": None if busy.holder is None else busy.holder.to_json()}


def _drift_json(d: DriftSubject) -> dict[str, Any]:
    return {"role": d.role, "pool": d.pool, "kind": d.kind, "subject": d.subject,
            "detected": d.detected, "heals": d.heals, "fighting": d.fighting,
            "pending": d.pending, "first_at": _iso(d.first_at), "last_at": _iso(d.last_at)}


def to_status_json(snapshot: Snapshot, *, source: Source = "live", pid: int | None = None,
                   age_seconds: float = 0.0) -> dict[str, Any]:
    """The snapshot as plain JSON values, in the shape the status schema describes.

    ``source``, ``pid`` (default: this process) and ``age_seconds`` say who collected it
    and how long ago (``collected``)."""
    from .snapshot import exit_code, host_problems, overall_state

    apply = snapshot.last_apply
    return {
        "format": STATUS_FORMAT,
        "agent_version": __version__,
        "node": snapshot.node,
        "taken_at": _iso(snapshot.collect_time),
        "collected": {"source": source, "pid": os.getpid() if pid is None else pid,
                      "age_seconds": round(max(0.0, age_seconds), 3)},
        "state": overall_state(snapshot),
        "exit_code": exit_code(snapshot),
        "problems": list(host_problems(snapshot)),
        "config_error": snapshot.config_error,
        "health_endpoint_error": snapshot.health_error,
        "last_apply": None if apply is None else {
            "finished_at": _iso(apply.finished_at), "ok": apply.ok, "changed": apply.changed,
            "failed": apply.failed, "duration_seconds": apply.duration_seconds,
            "unexpected_errors": apply.unexpected,
        },
        "apply_busy": _busy_json(snapshot.apply_busy),
        "drift": [_drift_json(d) for d in snapshot.drift],
        "pools": [_pool_json(p, snapshot) for p in snapshot.pools],
        "controllers": [_controller_json(c) for c in snapshot.controllers],
        "stray_controllers": [{"name": c.name, "subsysnqn": c.subsysnqn, "traddr": c.traddr,
                               "trsvcid": c.trsvcid, "state": c.state}
                              for c in snapshot.strays],
        "drives": [_drive_json(d) for d in snapshot.drives],
        "counters": {
            "apply_runs": snapshot.counters.apply_runs,
            "apply_failures": snapshot.counters.apply_failures,
            "config_reloads": snapshot.counters.config_reloads,
            "config_reload_failures": snapshot.counters.config_reload_failures,
            "apply_busy": snapshot.counters.apply_busy,
            "apply_busy_passes": snapshot.counters.apply_busy_passes,
            "unexpected_errors": snapshot.counters.unexpected_errors,
            "drift_heals": snapshot.counters.drift_heals,
        },
    }


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover - the loop always returns


def _opt(value: object, suffix: str = "") -> str:
    return "-" if value is None else f"{value}{suffix}"


Doc = dict[str, Any]


def _pool_detail(pool: Doc) -> str:
    if pool["target"] is not None:
        t = pool["target"]
        hosts = "hosts n/a" if t["hosts_connected"] is None else f"hosts {t['hosts_connected']}"
        return (f"subsys {t['subsystems']['present']}/{t['subsystems']['expected']}  "
                f"ns {t['namespaces']['enabled']}/{t['namespaces']['expected']} enabled  "
                f"ports {t['ports']['linked']}/{t['ports']['expected']} linked  {hosts}")
    if pool["initiator"] is not None:
        i = pool["initiator"]
        m = i["mount"]
        mount = m["path"] or "-"
        if m["path"]:
            mount += "" if m["mounted"] else " (not mounted)"
        free = (f"  free {_bytes(m['free_bytes'])} of {_bytes(m['size_bytes'])}"
                if m["mounted"] else "")
        dead = f"  xfs SHUT DOWN on {len(m['shut_down'])}" if m["shut_down"] else ""
        count = i["recoveries"]["count"]
        recovered = f"  recovered {count}x" if count else ""
        return (f"ctrl {i['controllers']['live']}/{i['controllers']['expected']} live  "
                f"ns {i['namespaces']['found']}/{i['namespaces']['expected']}  "
                f"{mount}{free}{dead}{recovered}")
    return ""


def _engine_flag(e: Doc) -> str:
    if e["over_cap"]:
        return "OVER CAP"
    return "AT CAP (ENOSPC)" if e["at_cap"] else ""


def _cleaner_text(e: Doc) -> str:
    c = e["cleaner"]
    if c is None or (not c["enabled"] and not c["runs"]):
        return "off"
    state = "on" if c["enabled"] else "off"
    return (f"{state}, {c['runs']} run(s), {_bytes(c['deleted_bytes'])} deleted" if c["runs"]
            else state)


def render_status_text(snapshot: Snapshot) -> str:
    """A human-readable report of a snapshot (see :func:`render_status_doc`)."""
    return render_status_doc(to_status_json(snapshot))


def render_status_doc(doc: Doc) -> str:
    """A human-readable report of a status JSON document: pools, controllers, engines,
    drives, last apply, problems, and who collected it when the agent did."""
    out = [f"node {doc['node']}: {doc['state'].upper()}  (as of {doc['taken_at']})"]
    collected = doc.get("collected") or {}
    if collected.get("source") == "agent":
        out.append(f"collected {collected['age_seconds']:.1f} s ago by kvagent run "
                   f"(pid {collected['pid']})")
    pools = doc["pools"]
    if pools:
        rows = [[p["role"], p["name"], p["state"], "yes" if p["ready"] else "no",
                 _pool_detail(p)] for p in pools]
        out += ["", table(rows, ["ROLE", "POOL", "STATE", "READY", "DETAIL"])]
    else:
        out += ["", "no pools configured"]
    if doc["controllers"]:
        rows = [[c["name"], c["pool"], c["state"], c["transport"],
                 f"{c['traddr']}:{c['trsvcid']}", c["iopolicy"] or "-",
                 " ".join(f"{p['path']}={p['ana_state']}" for p in c["paths"]) or "-"]
                for c in doc["controllers"]]
        out += ["", table(rows, ["CONTROLLER", "POOL", "STATE", "TRANSPORT", "ADDRESS",
                                 "IOPOLICY", "ANA"])]
    engine_rows = [[p["name"], e["kind"], _bytes(e["used_bytes"]) + ("" if e["complete"]
                                                                     else "+"),
                    _bytes(e["cap_bytes"]), "hard" if e["enforced"] else "advisory",
                    e["source"], _cleaner_text(e), _engine_flag(e)]
                   for p in pools if p["initiator"] is not None
                   for e in p["initiator"]["engines"]]
    if engine_rows:
        out += ["", table(engine_rows, ["POOL", "ENGINE", "USED", "CAP", "CAP KIND", "USAGE",
                                        "CLEANER", ""])]
    probe_rows = [[p["name"], k, str(v)] for p in pools if p["probe"]
                  for k, v in sorted(p["probe"].items())]
    if probe_rows:
        out += ["", table(probe_rows, ["POOL", "PROBE", "RESULT"])]
    if doc["drives"]:
        rows = [[d["device"], d["model"] or "-",
                 "-" if d["temperature_celsius"] is None
                 else f"{d['temperature_celsius']:.0f}°C",
                 _opt(d["percent_used"], "%"), _opt(d["available_spare"], "%"),
                 _opt(d["media_errors"]),
                 "ok" if d["healthy"] else f"{len(d['problems'])} problem(s), see below"]
                for d in doc["drives"]]
        out += ["", table(rows, ["DRIVE", "MODEL", "TEMP", "USED", "SPARE", "MEDIA-ERR",
                                 "HEALTH"])]
    apply = doc["last_apply"]
    out.append("")
    if apply is None:
        out.append("last apply: none yet")
    else:
        verdict = "ok" if apply["ok"] else f"FAILED ({apply['failed']} failed)"
        out.append(f"last apply: {verdict}, {apply['changed']} changed, at "
                   f"{apply['finished_at']}")
    busy = doc["apply_busy"]
    if busy is not None:
        holder = (LockHolder.from_json(busy["holder"]).describe() if busy["holder"]
                  else "an unknown process")
        skipped = (f", {busy['passes']} pass(es) in a row skipped since {busy['since']}"
                   if busy["passes"] and busy["since"] is not None else "")
        out.append(f"apply lock: held by {holder}{skipped}")
    for d in doc.get("drift") or ():
        state = "FOUGHT OVER" if d["fighting"] else ("healing" if d["pending"] else "healed")
        out.append(f"drift: {d['role']} pool {d['pool']}: {d['kind']} {d['subject']} changed "
                   f"behind kvagent's back {d['detected']}x since {d['first_at']}, "
                   f"healed {d['heals']}x ({state})")
    problems = doc["problems"]
    if problems:
        out += ["", "problems:", *(f"  - {p}" for p in problems)]
    return "\n".join(out) + "\n"
