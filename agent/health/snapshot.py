"""What the agent's loop knows about this host's health, as frozen values.

The loop (``kvagent run``) builds a :class:`Snapshot` after every pass and puts
it in a :class:`~agent.health.server.SnapshotStore`; ``/metrics``, ``/healthz``,
``/readyz``, the node_exporter textfile and ``kvagent status`` only ever read a
snapshot, so a scrape never runs a command.

Overall health: a pool is ``ok``, ``degraded`` or ``failed``; the host is
healthy when every pool is ``ok``, every drive is without problems, the last
apply succeeded, no config reload was refused, the apply lock is not stuck and no
drifted object is fought over (see :func:`overall_state`, :class:`ApplyBusy` and
:class:`DriftSubject`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..lockholder import LockHolder

PoolRole = Literal["target", "initiator"]
PoolState = Literal["ok", "degraded", "failed"]
ProbeValue = bool | int | float | str

#: Controller states the kernel shows in /sys/class/nvme/*/state.
CONTROLLER_STATES = ("new", "live", "resetting", "connecting", "deleting",
                     "deleting (no IO)", "dead")
#: ANA states the kernel shows in /sys/block/nvme*c*n*/ana_state.
ANA_STATES = ("optimized", "non-optimized", "inaccessible", "persistent-loss", "change")
POOL_STATES: tuple[PoolState, ...] = ("ok", "degraded", "failed")
#: After this many passes in a row skipped because another process holds the apply
#: lock, the host is degraded and /readyz fails (one or two are an operator's apply).
BUSY_PASSES_DEGRADED = 3
_SEVERITY = {"ok": 0, "degraded": 1, "failed": 2}
#: Heals of the same drifted subject within ``health.full_interval`` that make it a
#: fight with another writer (:mod:`agent.health.drift`): named in status, the host
#: degraded while it lasts.
FIGHT_HEALS = 3


#: Usage sources: the engine directories' xfs project quotas (exact, O(1)), or a bounded
#: walk of their trees where quotas are off (a lower bound past the sample).
USAGE_SOURCES = ("quota", "sample")
#: An engine with an enforced cap is "at its cap" (its next writes may get ENOSPC) once
#: less than this share of the cap is left.
AT_CAP_HEADROOM = 0.01


@dataclass(frozen=True)
class CleanerState:
    """An engine's oldest-first cleaner: on or off, and what it has deleted so far."""

    enabled: bool
    runs: int = 0
    deleted_files: int = 0
    deleted_bytes: int = 0
    last_run: float | None = None  # wall clock


@dataclass(frozen=True)
class EngineUsage:
    """How much of its cap an inference engine has filled on a pool's mount.

    ``source``: ``quota`` (the directories' xfs project quotas: exact) or ``sample``
    (a bounded walk; ``complete`` false when it stopped early: a lower bound).
    ``enforced``: the cap is a hard limit the kernel enforces (ENOSPC at it).
    """

    kind: str
    used_bytes: int
    cap_bytes: int
    directory: str | None = None
    source: str = "sample"
    enforced: bool = False
    complete: bool = True
    cleaner: CleanerState | None = None

    @property
    def over_cap(self) -> bool:
        return self.used_bytes > self.cap_bytes

    @property
    def at_cap(self) -> bool:
        """An enforced cap nearly reached: the engine's next writes may fail (ENOSPC)."""
        return self.enforced and self.cap_bytes > 0 and (
            self.cap_bytes - self.used_bytes < self.cap_bytes * AT_CAP_HEADROOM)


@dataclass(frozen=True)
class TargetSide:
    """A storage-host pool as the nvmet configfs tree shows it."""

    subsystems_expected: int
    subsystems_present: int
    namespaces_expected: int
    namespaces_present: int
    namespaces_enabled: int
    ports_expected: int
    ports_linked: int
    #: Hosts connected, from the target's view. ``None`` where the kernel does not
    #: show it: nvmet on 6.1 lists no connected hosts in configfs.
    hosts_connected: int | None = None


@dataclass(frozen=True)
class InitiatorSide:
    """A GPU-host pool: its controllers, devices, mount and engines.

    The controllers themselves (state, paths, ANA) are in
    :attr:`Snapshot.controllers`, each naming its pool.
    """

    controllers_expected: int
    controllers_live: int
    namespaces_expected: int
    namespaces_found: int
    mount_path: str | None = None
    mounted: bool = False
    size_bytes: int | None = None
    free_bytes: int | None = None
    engines: tuple[EngineUsage, ...] = ()
    #: Mounts whose xfs shut down (I/O errors in a storage outage): every call on them
    #: fails with EIO until kvagent mounts them again.
    mounts_shut_down: tuple[str, ...] = ()
    #: Times kvagent mounted a shut-down xfs of the pool again (from its records: kept
    #: across restarts), and when it last did (wall clock).
    recoveries: int = 0
    last_recovery_at: float | None = None


@dataclass(frozen=True)
class PoolHealth:
    """One pool on one role: its state, readiness and what is wrong with it."""

    role: PoolRole
    name: str
    state: PoolState
    ready: bool
    problems: tuple[str, ...] = ()
    target: TargetSide | None = None
    initiator: InitiatorSide | None = None
    #: Results of the last probe (e.g. ``{"odirect": True, "read_mib_s": 812.5}``);
    #: booleans are exported as metrics, everything is shown by ``kvagent status``.
    probe: Mapping[str, ProbeValue] | None = None

    def __post_init__(self) -> None:
        if self.state not in POOL_STATES:
            raise ValueError(f"pool {self.name!r}: state {self.state!r} is not one of "
                             f"{', '.join(POOL_STATES)}")
        if self.role not in ("target", "initiator"):
            raise ValueError(f"pool {self.name!r}: role {self.role!r} is not target or initiator")


@dataclass(frozen=True)
class PathAna:
    """The ANA state of one namespace through one controller (a multipath path)."""

    path: str  # hidden per-path block device, e.g. nvme0c1n1
    state: str  # one of ANA_STATES, or what the kernel wrote
    nsid: int | None = None


@dataclass(frozen=True)
class ControllerHealth:
    """A fabrics controller on the GPU host (one connection to one target port)."""

    name: str  # nvme3
    pool: str
    subsysnqn: str
    transport: str
    traddr: str
    trsvcid: str
    state: str  # one of CONTROLLER_STATES, or what the kernel wrote
    paths: tuple[PathAna, ...] = ()
    iopolicy: str | None = None  # of its subsystem (multipath I/O policy)


@dataclass(frozen=True)
class StrayController:
    """A controller to one of kvagent's subsystems that no pool of this host attaches
    (another tool connected it: :mod:`agent.initiator.autoconnect`)."""

    name: str
    subsysnqn: str
    traddr: str
    trsvcid: str
    state: str
    #: What made it, as far as the collect can tell, and how to stop that.
    cause: str

    def problem(self) -> str:
        return (f"controller {self.name}: connected to {self.subsysnqn} "
                f"({self.traddr}:{self.trsvcid}), which no pool of this host attaches; "
                f"{self.cause}, then: nvme disconnect -d {self.name}")


@dataclass(frozen=True)
class DriveHealth:
    """A local (PCIe) NVMe drive's SMART / health log, normalised across nvme-cli versions.

    ``error`` is set (and the numbers are ``None``) when the log could not be read:
    an unreadable drive is never reported healthy.
    """

    device: str  # /dev/nvme0
    model: str | None = None
    serial: str | None = None
    firmware: str | None = None
    critical_warning: int | None = None
    temperature_celsius: float | None = None
    percent_used: int | None = None  # may exceed 100 (NVMe allows up to 255)
    available_spare: int | None = None  # percent
    available_spare_threshold: int | None = None  # percent
    media_errors: int | None = None
    error_log_entries: int | None = None
    power_on_hours: int | None = None
    unsafe_shutdowns: int | None = None
    error: str | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """The critical-warning bits that are set, by name (NVMe base spec, SMART log)."""
        bits = self.critical_warning or 0
        return tuple(name for bit, name in CRITICAL_WARNING_BITS if bits & bit)

    @property
    def problems(self) -> tuple[str, ...]:
        """What an operator should look at; empty when the drive is healthy."""
        if self.error is not None:
            return (f"smart-log unreadable: {self.error}",)
        found = [f"critical warning: {w}" for w in self.warnings]
        known = sum(bit for bit, _ in CRITICAL_WARNING_BITS)
        if self.critical_warning and self.critical_warning & ~known:
            found.append(f"critical warning bits 0x{self.critical_warning & ~known:02x}")
        if self.percent_used is not None and self.percent_used >= 100:
            found.append(f"rated endurance used up ({self.percent_used}% used)")
        return tuple(found)

    @property
    def healthy(self) -> bool:
        return not self.problems


#: Critical Warning bits of the SMART / Health Information log (NVMe base spec).
CRITICAL_WARNING_BITS = (
    (0x01, "available spare below threshold"),
    (0x02, "temperature out of range"),
    (0x04, "reliability degraded"),
    (0x08, "media read-only"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region read-only"),
)


@dataclass(frozen=True)
class ApplySummary:
    """The outcome of the last reconcile pass."""

    finished_at: float  # wall clock, seconds since the epoch
    ok: bool
    changed: int = 0  # actions that changed something
    failed: int = 0  # actions that failed
    duration_seconds: float | None = None
    #: The pass's errors as (role, pool or None, message): a pool's errors degrade it.
    errors: tuple[tuple[str, str | None, str], ...] = ()
    #: How many of the errors were exceptions kvagent did not expect (bugs).
    unexpected: int = 0

    def pool_errors(self, role: str, pool: str) -> list[str]:
        return [m for r, p, m in self.errors if r == role and p == pool]


@dataclass(frozen=True)
class LoopCounters:
    """Monotonic counts the loop keeps since the process started."""

    apply_runs: int = 0
    apply_failures: int = 0
    config_reloads: int = 0
    config_reload_failures: int = 0
    #: Passes skipped because another process held the apply lock (monotonic).
    apply_busy: int = 0
    #: Passes skipped in a row, now (0 once a pass runs): a gauge, not a count.
    apply_busy_passes: int = 0
    #: Exceptions kvagent did not expect (bugs), in a pool or escaping a whole pass.
    unexpected_errors: int = 0
    #: udev events kvagent acted on (agent.events), and the batches they came in.
    device_events: int = 0
    device_batches: int = 0
    #: Drift kvagent saw by (role, kind) (agent.health.drift), and the targeted passes
    #: that healed it.
    drift_detected: tuple[tuple[str, str, int], ...] = ()
    drift_heals: int = 0


@dataclass(frozen=True)
class DriftSubject:
    """A subject that drifted lately: how often it was seen drifting and healed, and when
    kvagent may heal it next (``backoff_until``, monotonic; None: at once)."""

    role: str
    pool: str
    kind: str
    subject: str
    detected: int = 0
    heals: int = 0
    first_at: float = 0.0  # wall clock of its first drift
    last_at: float = 0.0  # wall clock of its last drift
    pending: bool = False  # drifted and not healed yet
    last_heal: float | None = None  # monotonic
    backoff_until: float | None = None  # monotonic

    @property
    def fighting(self) -> bool:
        """Healed :data:`FIGHT_HEALS` times lately: another writer keeps changing it."""
        return self.heals >= FIGHT_HEALS

    def describe(self) -> str:
        return f"{self.role} pool {self.pool}: {self.kind} {self.subject}"

    def problem(self) -> str:
        """One line for a fight: what keeps changing, how often kvagent healed it."""
        return (f"drift: {self.describe()} keeps changing behind kvagent's back (healed "
                f"{self.heals} times since its first drift; another tool writes it? "
                "kvagent heals it again after a back-off)")


@dataclass(frozen=True)
class ApplyBusy:
    """The apply lock held by someone else: the daemon's passes are skipped.

    ``passes`` counts the daemon's passes skipped in a row (0 when only a probe of
    the lock by ``kvagent status`` saw it). Stuck (degraded, /readyz 503) after
    :data:`BUSY_PASSES_DEGRADED` passes, or at once when the holder is not kvagent's
    user (a ``foreign`` holder, e.g. ``nobody``).
    """

    passes: int
    holder: LockHolder | None = None
    since: float | None = None  # wall clock of the first skipped pass

    @property
    def stuck(self) -> bool:
        return self.passes >= BUSY_PASSES_DEGRADED or (
            self.holder is not None and self.holder.foreign)

    def problem(self) -> str:
        """One line: how long, and who holds the lock."""
        who = (f"held by {self.holder.describe()}" if self.holder is not None
               else "held by an unknown process")
        if self.holder is not None and self.holder.foreign:
            who += " (not kvagent's user)"
        if self.passes:
            return f"apply: {self.passes} pass(es) in a row skipped: the apply lock is {who}"
        return f"apply: the apply lock is {who}"


@dataclass(frozen=True)
class Snapshot:
    """Everything the health endpoints show, taken at one loop tick."""

    taken_at: float  # wall clock (time.time()) of the tick
    tick_at: float  # time.monotonic() of the tick: /healthz compares against it
    node: str
    pools: tuple[PoolHealth, ...] = ()
    controllers: tuple[ControllerHealth, ...] = ()
    drives: tuple[DriveHealth, ...] = ()
    last_apply: ApplySummary | None = None
    #: Set when a SIGHUP reload was refused: the old config keeps running.
    config_error: str | None = None
    #: Set while the health endpoint cannot listen on ``health.listen`` (retried).
    health_error: str | None = None
    counters: LoopCounters = field(default_factory=LoopCounters)
    #: Set while another process holds the apply lock (see :class:`ApplyBusy`).
    apply_busy: ApplyBusy | None = None
    #: When its data was collected (wall clock, monotonic), once a tick re-stamped it;
    #: None: at ``taken_at`` / ``tick_at``.
    collected_at: float | None = None
    collected_tick: float | None = None
    #: The subjects that drifted lately (agent.health.drift), fights first.
    drift: tuple[DriftSubject, ...] = ()
    #: Controllers to kvagent's subsystems that no pool of this host attaches.
    strays: tuple[StrayController, ...] = ()
    #: What the collect saw of kvagent's own objects, per (role, pool): the drift
    #: tracker's input (agent.health.drift); not part of any output.
    facts: Mapping[tuple[str, str], frozenset[tuple[str, str, str]]] = field(
        default_factory=dict, compare=False, repr=False)

    def ticked(self, *, taken_at: float, tick_at: float) -> Snapshot:
        """The same snapshot re-stamped by a loop tick that collected nothing new."""
        return dataclasses.replace(self, taken_at=taken_at, tick_at=tick_at,
                                   collected_at=self.collect_time,
                                   collected_tick=self.collect_tick)

    @property
    def collect_time(self) -> float:
        """When the data was collected (wall clock), whatever ticks came since."""
        return self.taken_at if self.collected_at is None else self.collected_at

    @property
    def collect_tick(self) -> float:
        """When the data was collected (``time.monotonic()``)."""
        return self.tick_at if self.collected_tick is None else self.collected_tick

    def controllers_of(self, pool: str) -> tuple[ControllerHealth, ...]:
        return tuple(c for c in self.controllers if c.pool == pool)

    @property
    def pools_not_ready(self) -> tuple[PoolHealth, ...]:
        return tuple(p for p in self.pools if not p.ready)


def overall_state(snapshot: Snapshot) -> PoolState:
    """``ok``, ``degraded`` or ``failed`` for the whole host.

    The worst pool state wins; a drive with problems, a failed last apply, a
    refused config reload, a health endpoint that cannot listen, a stuck apply lock or a
    fight over a drifted object (:data:`FIGHT_HEALS`) make an otherwise ``ok`` host
    ``degraded``.
    """
    worst = max((_SEVERITY[p.state] for p in snapshot.pools), default=0)
    if worst == 0 and (
        any(not d.healthy for d in snapshot.drives)
        or (snapshot.last_apply is not None and not snapshot.last_apply.ok)
        or snapshot.config_error is not None
        or snapshot.health_error is not None
        or (snapshot.apply_busy is not None and snapshot.apply_busy.stuck)
        or any(d.fighting for d in snapshot.drift)
        or snapshot.strays
    ):
        worst = 1
    return POOL_STATES[worst]


def host_problems(snapshot: Snapshot) -> tuple[str, ...]:
    """Every problem on the host, one line each, prefixed with what it concerns."""
    lines: list[str] = []
    if snapshot.config_error is not None:
        lines.append(f"config: reload refused, old config still running: "
                     f"{snapshot.config_error}")
    if snapshot.health_error is not None:
        lines.append(f"health endpoint: {snapshot.health_error}")
    apply = snapshot.last_apply
    if apply is not None and not apply.ok:
        lines.append(f"apply: last pass failed ({apply.failed} action(s) failed)")
        if apply.unexpected:
            lines.append(f"apply: {apply.unexpected} unexpected error(s) in the last pass (a "
                         "kvagent bug: the traceback is in the agent's log; the next pass "
                         "retries)")
        # Errors of no pool listed below (the host's, or a pool the config dropped whose
        # detach failed): shown here, since no pool line carries them.
        listed = {(p.role, p.name) for p in snapshot.pools}
        lines.extend(f"apply: {role} pool {pool}: {message}" if pool else
                     f"apply: {role}: {message}"
                     for role, pool, message in apply.errors if (role, pool) not in listed)
    if snapshot.apply_busy is not None and snapshot.apply_busy.stuck:
        lines.append(snapshot.apply_busy.problem())
    lines.extend(d.problem() for d in snapshot.drift if d.fighting)
    lines.extend(c.problem() for c in snapshot.strays)
    for pool in snapshot.pools:
        lines.extend(f"{pool.role} pool {pool.name}: {p}" for p in pool.problems)
        if pool.state != "ok" and not pool.problems:
            lines.append(f"{pool.role} pool {pool.name}: {pool.state}")
    for drive in snapshot.drives:
        lines.extend(f"drive {drive.device}: {p}" for p in drive.problems)
    return tuple(lines)


def exit_code(snapshot: Snapshot) -> int:
    """0 when the host is healthy, 1 when anything is degraded or failed.

    (Exit 2, bad config, comes from the CLI's config loading, not from a snapshot.)
    """
    return 0 if overall_state(snapshot) == "ok" else 1
