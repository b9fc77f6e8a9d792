"""Named failpoints and a step counter for crash tests, in the style of gofail and fail-rs.

Off unless enabled: with ``$KVAGENT_FAILPOINTS`` unset at start (and :func:`configure`
never called), :func:`step` and :func:`point` are functions that do nothing.

Test-only: ``$KVAGENT_FAILPOINTS`` is obeyed only where the test switch is on — the
root-owned regular file :data:`MARKER`, which only the test VM's boot script
(``scripts/vm``) creates, on ``/run`` (gone at the next boot). Elsewhere the variable is
ignored with a warning: a root process that inherits it (sudo, an Ansible environment)
can be neither killed nor rebooted by it, nor made to write where it says. Cutting the
power also refuses unless the switch is on *and* the machine is a virtual one.

Enabled, every side effect kvagent makes through its seams is a *step*: each configfs
change (:func:`wrap_configfs`), each command that changes something (the runner), each
record written (``agent.state.write_json``) and every other write of a pass, made
through :mod:`agent.effects`. A *point* is a named place in the code
(``command.lvcreate``, ``target.plan``, ...). The kinds of step (the subject is a path,
an argv's first words or a configfs path; never a secret):

``configfs.write``, ``configfs.mkdir``, ``configfs.rmdir``, ``configfs.symlink``,
``configfs.unlink``   a configfs change (:func:`wrap_configfs`)
``command``           a command that changes something (:func:`changes_something`), the
                      write to ``/dev/nvme-fabrics`` among them (a child command:
                      ``agent/initiator/nvme/fabrics_writer.py``)
``record``            a record written (``agent.state.write_json``, LVM intents)
``record.remove``     a record removed (a detached pool's probes, quota and cleaner
                      records; a destroyed pool's manifest; the schema-1 claims file)
``file.allocate``, ``file.rename``  a pool file preallocated, renamed into place
``quota.project``, ``quota.limit``  an engine directory's xfs project, its hard limit
``engine.clean``      a cleaner run (the cache files it deletes)
``sysfs.write``       a sysfs attribute written (controller timeouts and DH-HMAC-CHAP
                      secrets, a subsystem's iopolicy)
``file.write``        a file written whole, atomically (engine configs)
``file.create``       a file created only if absent (the host's NVMe identity)
``secret.write``      a secret file written 0600 (``kvagent keys generate``)
``file.remove``       a file removed (a pool file, a stale engine config)
``tree.remove``       a directory removed with its contents (engine configs)
``dir.make``, ``dir.owner``, ``dir.mode``, ``dir.remove``  a directory made, given its
                      owner or mode, removed (engine and mount-point directories, pool
                      directories)
``dir.seal``, ``dir.unseal``  a GPU pool's mount point made immutable while nothing is
                      mounted on it, made mutable again before its removal

A converged pass takes no step but the last-apply report (a ``record``): everything
above is written only where what is there differs.

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
import stat
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from . import progress

ENV = "KVAGENT_FAILPOINTS"
#: The test-only switch (see the module's docstring).
MARKER = "/run/kvagent-test-vm"
#: Where a power cut is asked of the kernel.
SYSRQ = "/proc/sysrq-trigger"

#: Programs whose runs never change anything (not steps).
READ_ONLY_PROGRAMS = frozenset({
    "blkid", "lvs", "vgs", "pvs", "lsblk", "findmnt", "smartctl", "udevadm", "modinfo",
    "uname", "fuser", "xfs_info", "fio", "cat", "true", "sh",
})
#: nvme-cli subcommands that only read (``get-log``: the discovery log's header, read to
#: acknowledge its AEN: agent/initiator/nvme/discovery.py).
READ_ONLY_NVME = frozenset({
    "list", "list-subsys", "list-ns", "discover", "id-ctrl", "id-ns", "smart-log",
    "version", "show-hostnqn", "gen-hostnqn", "ns-descs", "error-log", "get-log",
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


def test_switch_on() -> bool:
    """Whether :data:`MARKER` is there: a regular file (not a link), root's, not writable by
    group or others."""
    try:
        st = os.lstat(MARKER)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def in_virtual_machine(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU says it runs under a hypervisor (the ``hypervisor`` flag)."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " hypervisor" in line for line in f)
    except OSError:
        return False


def cut_power() -> None:
    """Reboot at once, without sync: what a power cut leaves. Refused (FailpointError)
    unless the test switch is on and this is a virtual machine."""
    if not (test_switch_on() and in_virtual_machine()):
        raise FailpointError(f"refusing to cut the power: only a test VM ({MARKER} and a "
                             "hypervisor) may be cut")
    with open(SYSRQ, "w") as f:
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
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "a") as f:
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


def configure_from_environment(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Obey ``$KVAGENT_FAILPOINTS`` where the test switch is on; else ignore it, with a
    warning on stderr (a log is not set up yet when this module is imported). Whether it
    was obeyed."""
    spec = env.get(ENV)
    if spec and not test_switch_on():
        sys.stderr.write(f"kvagent: ignoring ${ENV}: failpoints are for test VMs only "
                         f"({MARKER} is not there)\n")
        spec = None
    configure(spec)
    return bool(spec)


configure_from_environment()
