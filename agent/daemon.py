"""``kvagent run``: the long-running agent.

A full reconcile pass at start, then on ``health.full_interval`` (the bound on
noticing what has no events: a hand-made change in configfs, a dropped netlink event);
a collect on ``health.interval`` (of what has no events: mounts, usage, drives; the
topology, nvmet's objects, controllers and namespaces, is read afresh after every pass,
on every device event and at least every ``health.full_interval``:
:mod:`agent.health.collect`); a pass that failed is tried again after
``health.interval``. Between them, events drive the work (:mod:`agent.events`): udev
events for NVMe controllers and namespaces make a collect at once and, with initiator
pools, an attach pass over them (never a detach; a storm is one batch); a watch of the
controllers' states in sysfs does the same for a dropped connection. SIGHUP
re-reads the config (an invalid one keeps the old config running and is
reported) and runs a pass; SIGTERM/SIGINT stop the pass at its next step boundary
(the command in flight is killed; :mod:`agent.progress`) and the loop, and NEVER
tear anything down: exports, connections and mounts outlive the agent. systemd's
notify protocol: ``READY=1`` after the first pass, ``STATUS=``, ``WATCHDOG=1`` from
a supervisor thread while the agent makes progress (:mod:`agent.health.watchdog`),
``RELOADING=1``/``READY=1`` around reloads, ``STOPPING=1``.

An exception kvagent does not expect, in a pool or escaping a whole pass, fails that
pool or pass only: it is logged with its traceback, counted
(``kvagent_apply_unexpected_errors_total``) and the retry after ``health.interval``
tries again.

The agent records its pid and config file in ``node.run_dir``
(:mod:`agent.daemonfiles`) so that ``kvagent apply`` asks it to reload (an apply
request and SIGHUP) instead of applying beside it; the reload answers each
request with the result of the pass it ran. ``kvagent status`` reads the agent's
last snapshot on its status socket there (:mod:`agent.health.statussock`). Passes
skipped because another process holds the apply lock are counted, recorded for
``kvagent status`` and, after :data:`~agent.health.snapshot.BUSY_PASSES_DEGRADED` in a
row (or at once for a holder that is not kvagent's user), make the host degraded and
/readyz 503.
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import daemonfiles, progress
from .config import Config, ConfigError, load_config
from .errors import KvagentError
from .events import Batch, Batcher, ControllerWatch, DeviceEvent, UdevFeed
from .health import notify
from .health.collect import Topology, collect, read_topology, refresh_target
from .health.drift import Drift, DriftTracker, Facts, PoolKey
from .health.endpoint import Endpoint
from .health.metrics import write_textfile
from .health.server import HealthServer, SnapshotStore
from .health.snapshot import ApplyBusy, ApplySummary, LoopCounters, Snapshot, overall_state
from .health.statussock import StatusSocket
from .health.watchdog import WatchdogSupervisor
from .lock import Busy
from .log import get_logger
from .reconcile import run_pass
from .result import UNEXPECTED_HINT, RunResult
from .system.run import Runner, default_runner

log = get_logger("daemon")
#: How long a thread that wants the GIL waits for the one running (Python's default: 5 ms).
#: A pass is seconds of Python on a large host; an HTTP scrape needs the GIL back after
#: each of its system calls, so at 5 ms a /metrics scrape during a pass waited ~10x
#: longer than one between passes (measured with 64 pools).
SWITCH_INTERVAL = 0.0005
#: The first wait before a discovery port out of reach is tried again (s); it doubles
#: while the port stays out of reach, up to ``health.interval``.
DISCOVERY_RETRY = 2.0


class Schedule:
    """When the loop's timed work is due: the full pass, the collect, a retry."""

    def __init__(self, now: float, cfg: Config):
        self.full = now + cfg.health.full_interval
        self.collect = now + cfg.health.interval
        self.retry: float | None = None
        #: when to try again the discovery ports no controller could be connected to
        self.discovery: float | None = None

    def next_due(self) -> float:
        return min(t for t in (self.full, self.collect, self.retry, self.discovery)
                   if t is not None)

    def passed(self, now: float, cfg: Config, *, full: bool, ok: bool) -> None:
        """A pass ran (``full``: over everything): the next full pass and the collect move
        on; a failed pass is tried again after ``health.interval``."""
        if full:
            self.full = now + cfg.health.full_interval
        self.collect = now + cfg.health.interval
        if ok:
            self.retry = None if full else self.retry
        elif self.retry is None or full:
            # A failing attach pass does not push a due retry further away.
            self.retry = now + cfg.health.interval

    def due(self, now: float) -> bool:
        """Whether the full pass (or a retry) is due."""
        return now >= self.full or (self.retry is not None and now >= self.retry)

    def collected(self, now: float, cfg: Config) -> None:
        self.collect = now + cfg.health.interval

    def collect_by(self, when: float | None) -> None:
        """Collect no later than ``when`` (a drift held back by its back-off is due)."""
        if when is not None:
            self.collect = min(self.collect, when)


class Agent:
    """The loop's state: config, counters, the snapshot store and the HTTP server."""

    def __init__(self, config_path: str | None, cfg: Config, *, runner: Runner | None = None,
                 notifier: notify.Notifier | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config_path = config_path
        self.cfg = cfg
        self.runner = runner or default_runner()
        self.notifier = notifier or notify.Notifier()
        self.clock = clock
        self.store = SnapshotStore()
        # SimpleQueue: its put() is reentrant, so the signal handlers may put while the
        # loop's own get() is interrupted (queue.Queue's lock would deadlock there), and
        # kvagent apply sends SIGHUP whenever an operator applies.
        self.events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.counters = LoopCounters()
        self.config_error: str | None = None
        self.last_apply: ApplySummary | None = None
        #: The health endpoint: never stops the agent (reported and retried when it
        #: cannot listen).
        self.endpoint = Endpoint(self.store, clock=clock)
        #: Where kvagent status reads the last snapshot (None: not serving).
        self.status_socket: StatusSocket | None = None
        self.stopping = threading.Event()
        #: Set while passes are skipped because another process holds the apply lock.
        self.busy: ApplyBusy | None = None
        #: The run directory this agent registered in (moves when a reload changes it).
        self.run_dir = str(cfg.node.run_dir)
        #: What the last fresh collect read of the host (agent.health.collect.Topology) and
        #: when: the periodic collects in between reuse it.
        self.topology: Topology | None = None
        self.topology_at = 0.0
        #: When the local drives' smart-logs were last read: a collect after a pass or on
        #: a device event within health.interval of it keeps them (a command per drive).
        self.drives_at: float | None = None
        #: What the passes left of kvagent's own objects, and what drifted since.
        self.drift = DriftTracker(cfg.health.interval, cfg.health.full_interval)
        #: Drift the last collect found that is due to be healed (the loop's next step).
        self.heal_next: list[Drift] = []
        #: discovery ports no controller could be connected to at the last try, and the
        #: wait before the next (:meth:`_retry_discovery`)
        self.unreached: list[Any] = []
        self.discovery_wait = DISCOVERY_RETRY

    # ----------------------------------------------------------------- signals
    def install_signals(self) -> None:
        signal.signal(signal.SIGHUP, lambda *_: self.events.put("reload"))
        signal.signal(signal.SIGTERM, lambda *_: self._stop_requested())
        signal.signal(signal.SIGINT, lambda *_: self._stop_requested())

    def _stop_requested(self) -> None:
        """SIGTERM/SIGINT: the pass in flight stops at its next step boundary, then the loop."""
        progress.request_stop()
        self.events.put("stop")

    # ------------------------------------------------------------------- steps
    def reconcile(self, *, wait_for_lock: bool = False, rebind: tuple[str, ...] = (),
                  attach_only: tuple[str, ...] | None = None,
                  target_only: bool = False,
                  rediscover: bool = True) -> RunResult | KvagentError:
        """One apply pass (never raises) and a fresh snapshot; returns the pass's outcome.

        ``wait_for_lock`` and ``rebind`` come from ``kvagent apply`` requests (this pass
        only); ``attach_only`` makes it an attach pass over those initiator pools,
        ``target_only`` the storage side's pass alone; without ``rediscover`` an attach
        pass takes the subsystems its pools' records found. The snapshot after it is the
        drift baseline of the pools the pass covered.
        """
        started = time.time()
        covered: set[PoolKey] | None = None
        if attach_only is not None:
            covered = {("initiator", p) for p in attach_only}
        elif target_only:
            covered = {("target", p.name) for p in (self.cfg.target.pools
                                                     if self.cfg.target else ())}
        try:
            # A pool whose controllers are reconnecting fails at once: waiting for the
            # kernel held up every other pool, the collects and the heals for up to
            # initiator.device_wait (the pass is tried again every health.interval).
            result = run_pass(self.cfg, dry_run=False, runner=self.runner,
                              wait_for_lock=wait_for_lock, rebind=rebind,
                              attach_only=attach_only, target_only=target_only,
                              rediscover=rediscover, wait_reconnects=False)
        except progress.Stopping:
            log.warning("pass stopped at a step boundary: the agent is stopping; the next "
                        "start finishes it", seconds=round(time.time() - started, 1))
            return KvagentError("the agent stopped (SIGTERM) during this pass",
                                "exports, connections and mounts are left as they are; "
                                "the agent's next pass finishes the work")
        except Busy as exc:
            self._skipped(exc)
            self.collect()  # (nothing ran: no new baseline)
            return exc
        except (KvagentError, OSError) as exc:
            log.error("apply pass failed", error=str(exc))
            self._not_busy()
            self.counters = dataclasses.replace(
                self.counters, apply_runs=self.counters.apply_runs + 1,
                apply_failures=self.counters.apply_failures + 1)
            self.last_apply = ApplySummary(time.time(), False, 0, 1, time.time() - started)
            self.collect(after_pass=True, covered=covered)
            return exc if isinstance(exc, KvagentError) else KvagentError(str(exc))
        except Exception as exc:  # a bug escaping the pass: this pass fails, the loop goes on
            log.error("unexpected error in the apply pass", exc_info=exc)
            self._not_busy()
            message = f"unexpected error: {type(exc).__name__}: {exc}"
            self.counters = dataclasses.replace(
                self.counters, apply_runs=self.counters.apply_runs + 1,
                apply_failures=self.counters.apply_failures + 1,
                unexpected_errors=self.counters.unexpected_errors + 1)
            self.last_apply = ApplySummary(time.time(), False, 0, 1, time.time() - started,
                                           (("agent", None, message),), 1)
            self.collect(after_pass=True, covered=covered)
            return KvagentError(message, UNEXPECTED_HINT)
        self._not_busy()
        failed = sum(1 for a in result.actions if a.status == "failed") + len(result.errors)
        self.counters = dataclasses.replace(
            self.counters, apply_runs=self.counters.apply_runs + 1,
            apply_failures=self.counters.apply_failures + (0 if result.ok else 1),
            unexpected_errors=self.counters.unexpected_errors + result.unexpected_errors)
        self.last_apply = ApplySummary(
            result.finished_at or time.time(), result.ok,
            sum(1 for a in result.actions if a.status == "done"), failed,
            (result.finished_at or time.time()) - started,
            tuple((e.role, e.pool, e.message) for e in result.errors),
            result.unexpected_errors)
        for e in result.errors:
            log.warning("apply problem", role=e.role, pool=e.pool, error=e.message, hint=e.hint)
        self._keep_discovery_controllers()
        self.collect(after_pass=True, covered=covered)
        return result

    def _keep_discovery_controllers(self) -> bool:
        """A persistent discovery controller to each storage host port the initiator pools
        discover at (their seeds, and the ports their records found by referral), so a
        pool exported there comes as an AEN (never fails the loop; records that cannot
        be read leave the controllers as they are).

        A port no controller could be connected to (a storage host referred to before it
        is up, or down) is tried again after :data:`DISCOVERY_RETRY` s, doubling up to
        ``health.interval`` (:meth:`_retry_discovery`). Returns whether a controller was
        connected to a port that had been out of reach: it has not been read yet."""
        from .initiator.discovery_controllers import RECORD, DiscoveryControllers, wanted
        from .records import InitiatorRecords

        if self.cfg.initiator is None and not (Path(self.run_dir) / RECORD).exists():
            self.unreached = []
            return False
        try:
            from nvmet.ids import read_host_identity

            from .initiator.nvme.cli import NvmeCli
            from .initiator.sysfs import Sysfs

            ident = read_host_identity(self.cfg.node.nvme_dir)
            records = InitiatorRecords.load(self.cfg.node.state_dir) if self.cfg.initiator \
                else {}
            wants = (wanted(self.cfg, ident.hostnqn, ident.hostid, records)
                     if ident.hostnqn else [])
            keeper = DiscoveryControllers(self.run_dir, NvmeCli(self.runner),
                                          Sysfs(self.cfg.node.sysfs))
            for line in keeper.sync(wants):
                log.info("discovery controller", change=line)
        except Exception as exc:  # the passes still discover: only the AENs are missed
            log.warning("discovery controllers not kept", error=str(exc))
            return False
        back = [w.address for w in keeper.connected if w.address in self.unreached]
        self.unreached = [w.address for w in keeper.unreached]
        return bool(back)

    def _retry_discovery(self, schedule: Schedule) -> None:
        """The discovery ports out of reach, tried again: when one answers now, an attach
        pass reads it (a storage host that came up after it was referred to); while some
        stay out of reach, the next try backs off."""
        if self._keep_discovery_controllers():
            log.info("a discovery port out of reach answers now: attaching")
            pools = tuple(p.name for p in self.cfg.initiator.pools) if self.cfg.initiator \
                else ()
            outcome = self.reconcile(attach_only=pools, rediscover=True)
            schedule.passed(self.clock(), self.cfg, full=False, ok=_ok(outcome))
        self._schedule_discovery(schedule, backoff=True)

    def _schedule_discovery(self, schedule: Schedule, *, backoff: bool = False) -> None:
        if not self.unreached:
            schedule.discovery, self.discovery_wait = None, DISCOVERY_RETRY
            return
        if backoff:
            self.discovery_wait = min(self.discovery_wait * 2, self.cfg.health.interval)
        if schedule.discovery is None or backoff:
            schedule.discovery = self.clock() + self.discovery_wait

    def _skipped(self, exc: Busy) -> None:
        """A pass skipped: count it, log it (warning from the second in a row), record it."""
        passes = self.counters.apply_busy_passes + 1
        self.counters = dataclasses.replace(self.counters,
                                            apply_busy=self.counters.apply_busy + 1,
                                            apply_busy_passes=passes)
        since = self.busy.since if self.busy is not None and self.busy.since else time.time()
        self.busy = ApplyBusy(passes, exc.holder, since)
        foreign = exc.holder is not None and exc.holder.foreign
        emit = log.warning if passes > 1 or foreign else log.info
        emit("apply skipped: another process holds the apply lock", passes_in_a_row=passes,
             holder=exc.holder.describe() if exc.holder else None, detail=exc.message)
        try:
            daemonfiles.write_busy(self.run_dir, passes, since, exc.holder)
        except (KvagentError, OSError) as err:
            log.warning("cannot record the skipped pass for kvagent status", error=str(err))

    def _not_busy(self) -> None:
        if self.busy is None and not self.counters.apply_busy_passes:
            return
        self.busy = None
        self.counters = dataclasses.replace(self.counters, apply_busy_passes=0)
        daemonfiles.clear_busy(self.run_dir)

    def collect(self, *, fresh: bool = True, after_pass: bool = False,
                covered: set[PoolKey] | None = None) -> Snapshot:
        """Collect a snapshot, store it, write the textfile, report STATUS= to systemd;
        find drift (:mod:`agent.health.drift`) and leave what is due in ``heal_next``.

        ``fresh``: read the host's topology now (after a pass, on a device event); the
        periodic collect (not fresh) reuses the last one, read at most
        ``health.full_interval`` ago, and reads only what has no events (mounts, usage,
        drives) and the storage side (configfs has none: a change there is drift).
        ``after_pass``: a pass just ran over the pools ``covered`` (None: every pool), whose
        facts become the drift baseline; the others are compared with theirs."""
        self.endpoint.retry()  # (a health port that could not be bound: every interval)
        facts: Facts | None = None
        try:
            topology = self.topology
            if fresh or topology is None or (
                    self.clock() - self.topology_at >= self.cfg.health.full_interval):
                self.topology = None  # (a failed read is not reused)
                topology = read_topology(self.cfg)
                self.topology, self.topology_at = topology, self.clock()
            elif self.cfg.target is not None and self.cfg.target.pools:
                topology = self.topology = refresh_target(self.cfg, topology)
            previous = self.store.get()
            now = self.clock()
            keep = None if previous is None or self.drives_at is None or (
                now - self.drives_at >= self.cfg.health.interval) else previous.drives
            snap = collect(self.cfg, self.runner, last_apply=self.last_apply,
                           counters=self.counters, config_error=self.config_error,
                           topology=topology, drive_health=keep)
            if keep is None:
                self.drives_at = now
            facts = snap.facts
        except Exception as exc:  # the loop must survive a collector bug
            log.error("health collect failed", error=f"{type(exc).__name__}: {exc}")
            previous = self.store.get()
            snap = (previous.ticked(taken_at=time.time(), tick_at=self.clock())
                    if previous else Snapshot(time.time(), self.clock(), self.cfg.node.name,
                                              config_error=self.config_error,
                                              counters=self.counters))
        if facts is not None:
            self._find_drift(facts, covered if after_pass else set())
        snap = dataclasses.replace(snap, apply_busy=self.busy, counters=self.counters,
                                   health_error=self.endpoint.error, drift=self.drift.lately())
        self.store.set(snap)
        if self.server is not None:
            self.server.metrics.warm()  # scrapes then only add the head and the tail
        if self.cfg.health.textfile:
            try:
                write_textfile(self.cfg.health.textfile, snap)
            except OSError as exc:
                log.warning("cannot write the metrics textfile", path=self.cfg.health.textfile,
                            error=str(exc))
        not_ready = [p.name for p in snap.pools if not p.ready]
        self.notifier.status(f"{overall_state(snap)}; {len(snap.pools)} pool(s)"
                             + (f", not ready: {', '.join(not_ready)}" if not_ready else ""))
        return snap

    def reload(self) -> RunResult | KvagentError | None:
        """Re-read the config and run a pass; keep the old config when the new one is invalid
        (then no pass runs: None).

        Answers every pending ``kvagent apply`` request with the outcome: the pass's
        result, its error, or the config's problems.
        """
        self.notifier.reloading()
        requests = daemonfiles.take_requests(self.run_dir)
        answer_dir = self.run_dir
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            self.config_error = str(exc)
            self.counters = dataclasses.replace(
                self.counters, config_reloads=self.counters.config_reloads + 1,
                config_reload_failures=self.counters.config_reload_failures + 1)
            log.error("config reload refused; the old config keeps running", error=str(exc))
            self._answer(answer_dir, requests,
                         {"config_error": [str(p) for p in exc.problems]})
            self.collect()
            self.notifier.ready()
            return None
        old_listen = self.cfg.health.listen
        self.cfg = new
        self.topology = None  # (read for the old config)
        self.drift.interval = new.health.interval
        self.drift.full_interval = new.health.full_interval
        self.config_error = None
        self.counters = dataclasses.replace(self.counters,
                                            config_reloads=self.counters.config_reloads + 1)
        log.info("config reloaded", path=self.config_path,
                 requests=[r.id for r in requests] or None)
        if new.health.listen != old_listen:
            self._restart_server()
        if str(new.node.run_dir) != self.run_dir:
            self._move_run_dir(str(new.node.run_dir))
        outcome = self.reconcile(
            wait_for_lock=any(r.wait for r in requests),
            rebind=tuple(sorted({p for r in requests for p in r.rebind})))
        if isinstance(outcome, RunResult):
            payload: dict[str, Any] = {"result": outcome.to_json()}
        else:
            payload = {"error": {"message": outcome.message, "hint": outcome.hint,
                                 "exit_code": outcome.exit_code}}
        self._answer(answer_dir, requests, payload)
        self.notifier.ready()
        return outcome

    def _answer(self, run_dir: str, requests: list[daemonfiles.ApplyRequest],
                payload: dict[str, Any]) -> None:
        for request in requests:
            try:
                daemonfiles.publish_result(run_dir, request.id, payload)
            except (KvagentError, OSError) as exc:
                log.error("cannot answer an apply request", request=request.id,
                          error=str(exc))

    def _register(self) -> None:
        daemonfiles.clear_exchange(self.run_dir)
        daemonfiles.register_daemon(self.run_dir, self.config_path or "")

    def _move_run_dir(self, new: str) -> None:
        serving = self.status_socket is not None
        self._stop_status_socket()
        daemonfiles.unregister_daemon(self.run_dir)
        daemonfiles.clear_busy(self.run_dir)
        self.run_dir = new
        try:
            self._register()
        except (KvagentError, OSError) as exc:
            log.error("cannot record the agent in the new run directory; kvagent apply "
                      "will not find it", run_dir=new, error=str(exc))
            return
        if serving:
            self._start_status_socket()

    def _start_status_socket(self) -> None:
        """Serve kvagent status; without the socket it reads the host itself (logged)."""
        try:
            self.status_socket = StatusSocket(self.run_dir, self.store).start()
        except (KvagentError, OSError) as exc:
            self.status_socket = None
            log.error("cannot serve kvagent status on the status socket; kvagent status "
                      "reads the host itself", run_dir=self.run_dir,
                      error=getattr(exc, "message", None) or str(exc),
                      hint=getattr(exc, "hint", None))

    def _stop_status_socket(self) -> None:
        if self.status_socket is not None:
            self.status_socket.shutdown()
            self.status_socket = None

    @property
    def server(self) -> HealthServer | None:
        """The health server answering now (None: none could listen yet)."""
        return self.endpoint.server

    def _restart_server(self) -> None:
        """Serve on ``health.listen`` (at start, and on a reload that changed it): bound
        before the old address is closed; when it cannot be, reported and retried every
        ``health.interval`` while the passes go on (:mod:`agent.health.endpoint`)."""
        self.endpoint.want(self.cfg.health.listen, self.cfg.health.interval)

    # -------------------------------------------------------------------- loop
    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit code (0).

        Install the signal handlers first (:meth:`install_signals`): ``kvagent apply``
        sends SIGHUP as soon as the agent's record exists.
        """
        self._register()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self._restart_server()
        self._start_status_socket()
        watch = ControllerWatch(self.events, Path(self.cfg.node.sysfs))
        udev = UdevFeed(self.events, on_controller=watch.relist)
        udev.start()
        watch.start()
        progress.beat()
        supervisor = WatchdogSupervisor(self.notifier).start()
        try:
            self._loop()
        except progress.Stopping:
            pass  # SIGTERM during a collect or a reload: stop as between passes
        finally:
            supervisor.stop()
            self.notifier.stopping()
            udev.stop()
            watch.stop()
            self.endpoint.shutdown()
            self._stop_status_socket()
            daemonfiles.clear_busy(self.run_dir)
            daemonfiles.unregister_daemon(self.run_dir)
            log.info("agent stopped; exports, connections and mounts are left in place")
        return 0

    def _loop(self) -> None:
        """The first pass, then events and timers until a stop is requested."""
        if progress.stop_requested():
            return
        outcome = self.reconcile()
        self.notifier.ready()
        log.info("agent ready", pools=len(self.store.get().pools) if self.store.get() else 0)
        schedule = Schedule(self.clock(), self.cfg)
        schedule.passed(self.clock(), self.cfg, full=True, ok=_ok(outcome))
        self._schedule_discovery(schedule)
        batcher = Batcher(self.events, clock=self.clock)
        pending: Any = None  # what ended a batch of device events: handled next
        while True:
            progress.beat()  # the loop is alive (the watchdog supervisor reads it)
            # Wake often enough to beat within IDLE_BOUND and to keep /healthz fresh
            # (systemd's watchdog interval).
            timeout = min(max(0.0, schedule.next_due() - self.clock()),
                          progress.IDLE_BOUND / 3)
            wd = self.notifier.watchdog_interval()
            if wd:
                timeout = min(timeout, wd / 2)
            try:
                event = pending if pending is not None else self.events.get(timeout=timeout)
            except queue.Empty:
                event = "tick"
            pending = None
            if event == "stop" or progress.stop_requested():
                break
            now = self.clock()
            if event == "reload":
                reloaded = self.reload()
                if reloaded is not None:
                    schedule.passed(self.clock(), self.cfg, full=True, ok=_ok(reloaded))
            elif isinstance(event, DeviceEvent) and not schedule.due(now):
                batch = batcher.gather(event)
                pending = batch.next
                self._on_devices(batch, schedule)
            elif schedule.due(now):
                # Device events never hold the full pass (or a retry) back: it runs now and
                # covers them (a batch taken first makes it wait no longer than LONGEST).
                if isinstance(event, DeviceEvent):
                    pending = batcher.gather(event).next
                # Observe first, then heal: an outage the pass repairs (an unlinked
                # port, say) still shows in the snapshot while the pass runs.
                self.collect()
                outcome = self.reconcile()
                schedule.passed(self.clock(), self.cfg, full=True, ok=_ok(outcome))
            elif schedule.discovery is not None and now >= schedule.discovery:
                self._retry_discovery(schedule)
            elif now >= schedule.collect:
                self.collect(fresh=False)
                schedule.collected(self.clock(), self.cfg)
            else:  # woke up for the watchdog only: keep /healthz fresh
                snap = self.store.get()
                if snap is not None:
                    self.store.set(snap.ticked(taken_at=time.time(), tick_at=self.clock()))
            if self.heal_next and pending != "stop" and not progress.stop_requested():
                self._heal(schedule)
            schedule.collect_by(self.drift.next_heal())
            self._schedule_discovery(schedule)

    def _find_drift(self, facts: Facts, covered: set[PoolKey] | None) -> None:
        """Compare a collect's facts with the baseline the passes left; what is due goes to
        ``heal_next`` (a fresh baseline for what a pass just ``covered``: None, every pool)."""
        drifts = self.drift.passed(facts, covered)
        self.heal_next = self.drift.due(drifts, now=self.clock(), wall=time.time())
        self.counters = dataclasses.replace(
            self.counters, drift_detected=tuple(
                (role, kind, n) for (role, kind), n in sorted(self.drift.detected_total.items())))
        held = self.drift.held
        if held:
            log.warning("drift: kvagent's own objects keep changing behind its back; healing "
                        "again after a back-off", changes=[d.describe() for d in held],
                        pools=sorted({f"{d.role} {d.pool}" for d in held}))

    def _heal(self, schedule: Schedule) -> None:
        """A targeted pass for the drift found: the storage side's pass for a storage pool,
        an attach pass over the drifted GPU pools."""
        drifts, self.heal_next = self.heal_next, []
        self.drift.healing(drifts, now=self.clock())
        self.counters = dataclasses.replace(self.counters,
                                            drift_heals=self.counters.drift_heals + 1)
        self._publish_counters()  # the heal shows before the pass writes anything back
        log.warning("drift: kvagent's own objects changed behind its back; healing now",
                    changes=[d.describe() for d in drifts],
                    pools=sorted({f"{d.role} {d.pool}" for d in drifts}))
        if any(d.role == "target" for d in drifts):
            outcome = self.reconcile(target_only=True)
            schedule.passed(self.clock(), self.cfg, full=False, ok=_ok(outcome))
        pools = tuple(sorted({d.pool for d in drifts if d.role == "initiator"}))
        if pools:
            outcome = self.reconcile(attach_only=pools)
            schedule.passed(self.clock(), self.cfg, full=False, ok=_ok(outcome))

    def _publish_counters(self) -> None:
        """The snapshot served now carries the counters as they are (a pass's collect
        comes seconds later)."""
        snap = self.store.get()
        if snap is not None:
            self.store.set(dataclasses.replace(snap, counters=self.counters))

    def _on_devices(self, batch: Batch, schedule: Schedule) -> None:
        """A batch of device events: when something appeared, attach the initiator pools
        (a new namespace is mounted and handed off; the collect after the pass shows
        it); when something went away, collect first (a lost controller shows now)."""
        self.counters = dataclasses.replace(
            self.counters, device_events=self.counters.device_events + batch.count,
            device_batches=self.counters.device_batches + 1)
        self._publish_counters()  # the counters show the batch now, whatever follows
        log.info("device events", events=batch.count, kinds=batch.summary())
        if not (batch.something_appeared or batch.something_went):
            # udev's own change after a program wrote a device (kvagent's mkfs), a
            # controller's own change: nothing the topology shows moved (the periodic
            # collect reads on). Collecting here delayed the next namespace's attach.
            return
        pools = tuple(p.name for p in self.cfg.initiator.pools) if self.cfg.initiator else ()
        attach = bool(pools) and batch.something_appeared
        if not attach or batch.something_went:
            self.collect()
        if attach:
            # New subsystems come with a discovery AEN; a namespace added or a controller
            # back needs no discovery (a command, and the storage host asked, per pool).
            outcome = self.reconcile(attach_only=pools, rediscover=batch.rediscover)
            schedule.passed(self.clock(), self.cfg, full=False, ok=_ok(outcome))
        else:
            schedule.collected(self.clock(), self.cfg)


def _ok(outcome: RunResult | KvagentError) -> bool:
    return isinstance(outcome, RunResult) and outcome.ok
