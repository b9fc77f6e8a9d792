"""The watchdog supervisor: ``WATCHDOG=1`` while the agent makes progress, silence when not.

A thread of ``kvagent run`` that pings systemd every ``WatchdogSec/4`` as long as
:func:`agent.progress.wedged` says the work in flight is within its bounds: a step
(a command, a wait) until its bound plus :data:`~agent.progress.GRACE`, the time
between steps until :data:`~agent.progress.IDLE_BOUND`. Once wedged it stops pinging
(and logs why, once); systemd then kills and restarts the agent ``WatchdogSec`` later.
A long but bounded step (mkfs of a large pool, a 30 s device wait) is not a hang.
"""

from __future__ import annotations

import threading

from .. import progress
from ..log import get_logger
from .notify import Notifier

log = get_logger("health.watchdog")

#: Pings per ``WatchdogSec``: systemd tolerates a silent supervisor for 3/4 of it.
PINGS_PER_INTERVAL = 4


class WatchdogSupervisor:
    """Pings ``notifier`` while ``tracker`` makes progress (see the module doc)."""

    def __init__(self, notifier: Notifier, tracker: progress.Tracker | None = None,
                 period: float | None = None):
        self.notifier = notifier
        self.tracker = tracker or progress.tracker
        interval = notifier.watchdog_interval()
        self.period = period if period is not None else (
            interval / PINGS_PER_INTERVAL if interval else None)
        self.wedged: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool:
        """One decision: ping if the agent makes progress; True if it pinged."""
        why = self.tracker.wedged()
        if why is not None:
            if self.wedged is None:
                log.error("the agent is not making progress; no more watchdog pings "
                          "(systemd restarts it after WatchdogSec)", reason=why)
            self.wedged = why
            return False
        if self.wedged is not None:
            log.warning("the agent makes progress again; watchdog pings resume")
            self.wedged = None
        return self.notifier.watchdog()

    def start(self) -> WatchdogSupervisor:
        """Start the thread (nothing to do without a systemd watchdog)."""
        if self.period is None:
            return self
        self.tick()
        self._thread = threading.Thread(target=self._run, name="kvagent-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop pinging (the agent exits)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        assert self.period is not None
        while not self._stop.wait(self.period):
            try:
                self.tick()
            except Exception as exc:  # the supervisor must outlive a logging problem
                log.error("watchdog supervisor error", error=f"{type(exc).__name__}: {exc}")
