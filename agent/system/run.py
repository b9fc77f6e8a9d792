"""Running external commands: argv lists only, a timeout always, never a shell.

Everything kvagent runs (nvme, lvcreate, mkfs.xfs, blkid, fio, ...) goes
through a :class:`Runner`, so unit tests can replace it with a fake that
records argv and returns canned output.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .. import failpoints, progress
from ..errors import KvagentError
from ..log import get_logger

log = get_logger("run")

DEFAULT_TIMEOUT = 60.0
#: After killing a command that ran past its timeout: how long to wait for it to go.
#: A process stuck in uninterruptible I/O (umount of a filesystem whose storage is gone)
#: cannot die; it is then left behind and reaped later, never waited for without limit.
KILL_GRACE = 5.0


#: Options whose value is a secret (DH-HMAC-CHAP, a TLS PSK): never logged or shown.
SECRET_OPTIONS = ("--dhchap-secret", "--dhchap-ctrl-secret", "--keydata")


def shown(args: Sequence[str]) -> list[str]:
    """``args`` as logs and messages may show them: secret option values replaced."""
    out: list[str] = []
    hide = False
    for arg in args:
        if hide:
            out.append("<secret>")
            hide = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_OPTIONS:
            out.append(f"{name}=<secret>" if eq else arg)
            hide = not eq
        else:
            out.append(arg)
    return out


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandError(KvagentError):
    """A command exited non-zero (when the caller asked for success)."""

    def __init__(self, result: CommandResult, hint: str | None = None):
        self.result = result
        detail = (result.stderr or result.stdout).strip().splitlines()
        last = detail[-1] if detail else "no output"
        super().__init__(f"{result.argv[0]} failed (exit {result.returncode}): {last}", hint)


class CommandTimeout(KvagentError):
    """A command ran past its timeout and was killed (or could not be, see ``stuck``)."""

    def __init__(self, argv: Sequence[str], timeout: float, stuck: bool = False):
        self.argv = tuple(argv)
        self.timeout = timeout
        self.stuck = stuck
        if stuck:
            super().__init__(
                f"{argv[0]} did not finish within {timeout:g}s and is stuck in the kernel "
                "(it did not exit when killed); kvagent left it behind",
                "a device or the storage network is hung (uninterruptible I/O); check "
                "dmesg and the controllers (nvme list-subsys)")
        else:
            super().__init__(f"{argv[0]} did not finish within {timeout:g}s and was killed",
                             "the device or network may be stuck; check dmesg")


class CommandNotFound(KvagentError):
    """The program is not installed."""

    def __init__(self, program: str):
        super().__init__(f"{program} is not installed or not on PATH",
                         "install it (see scripts/setup for the package list)")


class Runner(Protocol):
    """Something that runs argv lists."""

    def __call__(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                 check: bool = True, input: str | None = None,
                 env: Mapping[str, str] | None = None) -> CommandResult: ...


@dataclass
class SubprocessRunner:
    """The real runner: subprocess with a timeout, C locale, output captured."""

    default_env: dict[str, str] = field(default_factory=lambda: {"LC_ALL": "C"})

    def __call__(self, argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                 check: bool = True, input: str | None = None,
                 env: Mapping[str, str] | None = None) -> CommandResult:
        if isinstance(argv, str):
            raise TypeError("argv must be a list of arguments, not a shell string")
        args = tuple(str(a) for a in argv)
        full_env = {**os.environ, **self.default_env, **(env or {})}
        _reap_abandoned()
        with progress.step(f"command {os.path.basename(args[0])}", timeout + KILL_GRACE,
                           label=" ".join([os.path.basename(args[0]), *shown(args[1:])])):
            failpoints.point(f"command.{os.path.basename(args[0])}")
            started = time.monotonic()
            try:
                proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=full_env,
                                        stdin=subprocess.PIPE if input is not None
                                        else subprocess.DEVNULL)
            except FileNotFoundError:
                raise CommandNotFound(args[0]) from None
            stdout, stderr = _communicate(proc, args, input, timeout)
        result = CommandResult(args, proc.returncode, stdout, stderr,
                               time.monotonic() - started)
        if failpoints.changes_something(args):
            failpoints.step("command", " ".join(args[:4]))
        log.debug("ran", argv=shown(args), rc=result.returncode,
                  seconds=round(result.duration, 3))
        if check and not result.ok:
            raise CommandError(result)
        return result


def _communicate(proc: subprocess.Popen[str], args: tuple[str, ...], input: str | None,
                 timeout: float) -> tuple[str, str]:
    """``proc``'s output; kill it past ``timeout``, or at once when the agent is stopping.

    Looks at the stop flag every :data:`~agent.progress.STOP_POLL` s (SIGTERM interrupts
    the wait; the handler only sets the flag). A killed child is waited for at most
    :data:`KILL_GRACE` s, then left behind.
    """
    deadline = time.monotonic() + timeout
    pending = input
    while True:
        try:
            return proc.communicate(pending, timeout=min(progress.STOP_POLL,
                                                         max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pending = None  # communicate() keeps what it has sent; never send it twice
        stopping = progress.stop_requested()
        if not stopping and time.monotonic() < deadline:
            continue
        proc.kill()
        try:
            proc.communicate(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            log.error("command stuck after kill; leaving it behind", argv=shown(args),
                      pid=proc.pid, timeout=timeout)
            _abandon(proc)
            if stopping:
                raise progress.Stopping() from None
            raise CommandTimeout(args, timeout, stuck=True) from None
        if stopping:
            log.info("command killed: the agent is stopping", argv=shown(args))
            raise progress.Stopping()
        log.warning("command timed out", argv=shown(args), timeout=timeout)
        raise CommandTimeout(args, timeout) from None


#: Children that could not be reaped after a kill (stuck in the kernel), reaped later.
_ABANDONED: list[subprocess.Popen[str]] = []


def _abandon(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    _ABANDONED.append(proc)


def _reap_abandoned() -> None:
    _ABANDONED[:] = [p for p in _ABANDONED if p.poll() is None]


def abandoned_commands() -> list[tuple[int, tuple[str, ...]]]:
    """(pid, argv) of commands that were killed but are still stuck in the kernel."""
    _reap_abandoned()
    return [(p.pid, tuple(shown([str(a) for a in p.args]))) for p in _ABANDONED]  # type: ignore[union-attr]


def default_runner() -> Runner:
    """The runner used outside tests."""
    return SubprocessRunner()
