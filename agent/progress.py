"""Progress of the work in flight, for the watchdog supervisor and for SIGTERM.

Every step kvagent takes is bounded: a command by its timeout (the runner), a wait by
its config (``initiator.device_wait``, ``target.address_wait``), the pure-Python work
between steps by :data:`IDLE_BOUND`. Code that starts a bounded step says so::

    with progress.step("command lvcreate", bound=timeout):
        ...

and the supervisor thread (:mod:`agent.health.watchdog`) reads :func:`wedged`: the
process makes progress while ``now < step start + bound + GRACE`` (inside a step) or
``now < last progress + IDLE_BOUND`` (between steps; the daemon's loop calls
:func:`beat` whenever it wakes up). Once wedged, the supervisor stops sending
``WATCHDOG=1`` and systemd restarts the agent.

Displays: a listener (:func:`set_listener`; ``kvagent apply``'s progress line on a
terminal) hears each step start and end. Code working for one pool says so around its
steps (``with progress.working_on(pool.name): ...``), so a display can name the pool;
a step may carry a ``label`` for displays (the runner's: the command line, secrets
hidden). Neither changes a bound.

SIGTERM: :func:`request_stop` (safe in a signal handler: it only sets a flag) makes
the next step boundary raise :class:`Stopping` — at the start of a step, in
:func:`sleep` and :func:`checkpoint`, and in the runner, which kills the command in
flight. ``Stopping`` is a BaseException: the per-pool ``except Exception`` handlers do
not catch it, so the pass ends there, as a kill at that point would (every step is
recoverable), and nothing is torn down.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: Slack added to a step's bound before the step counts as wedged: the runner's kill
#: grace (5 s) plus scheduling on a loaded host.
GRACE = 15.0
#: The longest the process may go without starting or ending a step (the daemon's loop
#: beats whenever it wakes, at least every IDLE_BOUND/3).
IDLE_BOUND = 30.0
#: The longest one read or probe of a pool's device may take (the xfs superblock read,
#: the engines' probe of a mount): I/O stuck on a fabrics device ends when the kernel
#: fails it (nvme_core.io_timeout, 30 s a try, then the controller's error recovery,
#: bounded by fast_io_fail_tmo and ctrl_loss_tmo). Between steps it would count against
#: IDLE_BOUND, and a slow device (soft-RoCE on 6.1 under emulation: 30 s I/O timeouts)
#: got a healthy agent killed by the watchdog.
DEVICE_IO_BOUND = 180.0
#: How often interruptible waits (:func:`sleep`, the runner) look at the stop flag.
STOP_POLL = 0.2
#: From the loop's end to the process's exit (the HTTP server's shutdown, the records).
EXIT_BOUND = 5.0


class Stopping(BaseException):
    """SIGTERM was received: the pass stops at this step boundary (not an error)."""


@dataclass(frozen=True)
class Step:
    """A bounded step in flight."""

    what: str
    started: float
    bound: float
    #: what the step is for (a pool), from :meth:`Tracker.working_on`; None: the host
    subject: str | None = None
    #: what a display shows of it (default: ``what``)
    label: str = ""

    @property
    def deadline(self) -> float:
        return self.started + self.bound + GRACE


#: Hears a step's ``"start"`` or ``"end"`` (:meth:`Tracker.set_listener`).
Listener = Callable[[str, Step], None]


class Tracker:
    """The steps in flight (innermost last), the last progress, the stop flag."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._steps: list[Step] = []
        self.last_progress = clock()
        #: Set (a plain assignment, signal-safe) by :meth:`request_stop`.
        self.stop_requested = False
        #: Hears every step start and end (:meth:`set_listener`).
        self.listener: Listener | None = None
        self._subjects: list[str] = []

    # ------------------------------------------------------------ progress
    @contextlib.contextmanager
    def step(self, what: str, bound: float, label: str = "") -> Iterator[Step]:
        """A step that takes at most ``bound`` s; raises :class:`Stopping` once stopped."""
        self.checkpoint()
        subject = self._subjects[-1] if self._subjects else None
        current = Step(what, self.clock(), max(0.0, bound), subject, label)
        with self._lock:
            self._steps.append(current)
        self._tell("start", current)
        try:
            yield current
        finally:
            with self._lock:
                if current in self._steps:
                    self._steps.remove(current)
                self.last_progress = self.clock()
            self._tell("end", current)

    @contextlib.contextmanager
    def working_on(self, subject: str) -> Iterator[None]:
        """The steps inside are for ``subject`` (a pool), for displays."""
        self._subjects.append(subject)
        try:
            yield
        finally:
            self._subjects.pop()

    def set_listener(self, listener: Listener | None) -> None:
        """Call ``listener(event, step)`` at each step's ``"start"`` and ``"end"`` (None:
        nobody). A listener that fails is ignored: a display never fails the work."""
        self.listener = listener

    def _tell(self, event: str, step: Step) -> None:
        listener = self.listener
        if listener is not None:
            with contextlib.suppress(Exception):
                listener(event, step)

    def beat(self) -> None:
        """Progress made between steps (the loop woke up, a pass ended)."""
        self.last_progress = self.clock()

    def current(self) -> Step | None:
        """The innermost step in flight, or None between steps."""
        with self._lock:
            return self._steps[-1] if self._steps else None

    def wedged(self, now: float | None = None) -> str | None:
        """Why the process is not making progress (None while it is)."""
        now = self.clock() if now is None else now
        step = self.current()
        if step is not None:
            if now < step.deadline:
                return None
            return (f"{step.what} has run {now - step.started:.0f}s, past its bound of "
                    f"{step.bound:g}s (+{GRACE:g}s grace)")
        idle = now - self.last_progress
        if idle < IDLE_BOUND:
            return None
        return f"no step started or ended for {idle:.0f}s (bound {IDLE_BOUND:g}s)"

    # ---------------------------------------------------------------- stop
    def request_stop(self) -> None:
        """Ask the work in flight to stop at the next step boundary (signal-safe)."""
        self.stop_requested = True

    def checkpoint(self) -> None:
        """A step boundary: raise :class:`Stopping` if a stop was requested."""
        if self.stop_requested:
            raise Stopping()

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` that ends early (raising :class:`Stopping`) once stopped."""
        self.checkpoint()
        end = time.monotonic() + max(0.0, seconds)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, STOP_POLL))
            self.checkpoint()


#: The process's tracker (one agent per process).
tracker = Tracker()


def step(what: str, bound: float, label: str = "") -> contextlib.AbstractContextManager[Step]:
    """:meth:`Tracker.step` of the process's tracker."""
    return tracker.step(what, bound, label)


def working_on(subject: str) -> contextlib.AbstractContextManager[None]:
    """:meth:`Tracker.working_on` of the process's tracker."""
    return tracker.working_on(subject)


def set_listener(listener: Listener | None) -> None:
    """:meth:`Tracker.set_listener` of the process's tracker."""
    tracker.set_listener(listener)


def beat() -> None:
    """:meth:`Tracker.beat` of the process's tracker."""
    tracker.beat()


def checkpoint() -> None:
    """:meth:`Tracker.checkpoint` of the process's tracker."""
    tracker.checkpoint()


def sleep(seconds: float) -> None:
    """:meth:`Tracker.sleep` of the process's tracker."""
    tracker.sleep(seconds)


def stop_requested() -> bool:
    """Whether SIGTERM asked this process to stop."""
    return tracker.stop_requested


def request_stop() -> None:
    """:meth:`Tracker.request_stop` of the process's tracker (signal-safe)."""
    tracker.request_stop()


def wedged(now: float | None = None) -> str | None:
    """:meth:`Tracker.wedged` of the process's tracker."""
    return tracker.wedged(now)
