"""Named failpoints and a step counter for crash tests, in the style of gofail and fail-rs.

Off unless enabled: with ``$KVAGENT_FAILPOINTS`` unset at start (and :func:`configure`
never called), :func:`step` and :func:`point` are functions that do nothing.

Enabled, every side effect kvagent makes through its seams is a *step*: each configfs
change (:func:`wrap_configfs`), each command that changes something (the runner), each
record written (``agent.state.write_json``) and each pool file made or renamed. A
*point* is a named place in the code (``command.lvcreate``, ``target.plan``, ...).

The spec is a ``;``-separated list:

``kill-after=N``        SIGKILL this process right after its N-th step
``kill-after=KIND#N``   ... right after its N-th step of kind KIND (``record``, ...)
``cut-after=N``, ``cut-after=KIND#N``  cut the power instead (see below)
``log=PATH``            append ``N<TAB>kind<TAB>subject`` to PATH for every step
``NAME=sleep(S)``       sleep S seconds when point NAME is reached (a SIGTERM ends the
                        sleep as it would kill a long command: :func:`agent.progress.sleep`)
``NAME=raise``          raise :class:`FailpointError` (not a KvagentError) at point NAME
``NAME=raise-once``     ... only the first time point NAME is reached (the next pass recovers)
``NAME=kill``           SIGKILL this process at point NAME
``NAME=cut-later(S)``   cut the power S seconds after point NAME (while what follows runs)

Cutting the power is ``b`` on ``/proc/sysrq-trigger``: an immediate reboot without
syncing or unmounting — only for throwaway test VMs (the real-kernel tier).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from . import progress

ENV = "KVAGENT_FAILPOINTS"

#: Programs whose runs never change anything (not steps).
READ_ONLY_PROGRAMS = frozenset({
    "blkid", "lvs", "vgs", "pvs", "lsblk", "findmnt", "smartctl", "udevadm", "modinfo",
    "uname", "fuser", "xfs_info", "fio", "cat", "true", "sh",
})
#: nvme-cli subcommands that only read.
READ_ONLY_NVME = frozenset({
    "list", "list-subsys", "list-ns", "discover", "id-ctrl", "id-ns", "smart-log",
    "version", "show-hostnqn", "gen-hostnqn", "ns-descs", "error-log",
})


class FailpointError(RuntimeError):
    """Raised by a point set to ``raise``: an unexpected error, as a bug would raise."""


def changes_something(argv: Sequence[str]) -> bool:
    """Whether running ``argv`` is a side effect (a step)."""
    program = os.path.basename(str(argv[0])) if argv else ""
    if program in READ_ONLY_PROGRAMS:
        return False
    if program == "wipefs" and "--no-act" in argv:
        return False
    return not (program == "nvme" and len(argv) > 1 and argv[1] in READ_ONLY_NVME)


def _noop(*_args: Any) -> None:
    return None


step = _noop
point = _noop


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def cut_power() -> None:
    """Reboot at once, without sync: what a power cut leaves (test VMs only)."""
    with open("/proc/sysrq-trigger", "w") as f:
        f.write("b")
    time.sleep(60)  # the machine is gone before this returns


class _Trigger:
    """``N`` or ``KIND#N`` (the N-th step, or the N-th step of one kind) and what to do."""

    def __init__(self, value: str, act: Any):
        kind, _, n = value.rpartition("#")
        self.kind, self.n, self.act, self.seen = kind or None, int(n), act, 0

    def after(self, kind: str) -> None:
        if self.kind is None or kind == self.kind:
            self.seen += 1
            if self.seen >= self.n:
                self.act()


class _Active:
    def __init__(self, spec: str):
        self.count = 0
        self.log: str | None = None
        self.triggers: list[_Trigger] = []
        self.actions: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in spec.split(";"))):
            key, _, value = item.partition("=")
            if key == "kill-after":
                self.triggers.append(_Trigger(value, _kill))
            elif key == "cut-after":
                self.triggers.append(_Trigger(value, cut_power))
            elif key == "log":
                self.log = value
            else:
                self.actions[key] = value

    def step(self, kind: str, subject: str = "") -> None:
        self.count += 1
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{self.count}\t{kind}\t{subject}\n")
                f.flush()
                os.fsync(f.fileno())
        for trigger in self.triggers:
            trigger.after(kind)

    def point(self, name: str) -> None:
        action = self.actions.get(name)
        if action is None:
            return
        if action == "raise":
            raise FailpointError(f"failpoint {name}")
        if action == "raise-once":
            self.actions[name] = "off"
            raise FailpointError(f"failpoint {name} (once)")
        if action == "kill":
            _kill()
        m = re.fullmatch(r"(sleep|cut-later)\(([\d.]+)\)", action)
        if m and m.group(1) == "sleep":
            progress.sleep(float(m.group(2)))
        elif m:
            delay = float(m.group(2))
            threading.Thread(target=lambda: (time.sleep(delay), cut_power()),
                             daemon=True).start()


def configure(spec: str | None) -> None:
    """Enable failpoints with ``spec`` (None or empty: disable them)."""
    global step, point
    if not spec:
        step, point = _noop, _noop
        return
    active = _Active(spec)
    step, point = active.step, active.point


def wrap_configfs(fs: Any) -> Any:
    """``fs`` itself while failpoints are off; else a proxy counting each change as a step."""
    if step is _noop:
        return fs
    return _CountingConfigFS(fs)


class _CountingConfigFS:
    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("write", "mkdir", "rmdir", "symlink", "unlink"):
            return attr

        def counted(*args: Any) -> Any:
            out = attr(*args)
            step(f"configfs.{name}", str(args[-1] if name == "symlink" else args[0]))
            return out

        return counted


configure(os.environ.get(ENV))
