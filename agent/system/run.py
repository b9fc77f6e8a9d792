"""Running external commands: argv lists only, a timeout always, never a shell.

Everything kvagent runs (nvme, lvcreate, mkfs.xfs, blkid, fio, ...) goes
through a :class:`Runner`, so unit tests can replace it with a fake that
records argv and returns canned output.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import KvagentError
from ..log import get_logger

log = get_logger("run")

DEFAULT_TIMEOUT = 60.0


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
    """A command ran past its timeout and was killed."""

    def __init__(self, argv: Sequence[str], timeout: float):
        self.argv = tuple(argv)
        self.timeout = timeout
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
        started = time.monotonic()
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                                  input=input, env=full_env, check=False,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise CommandNotFound(args[0]) from None
        except subprocess.TimeoutExpired:
            log.warning("command timed out", argv=list(args), timeout=timeout)
            raise CommandTimeout(args, timeout) from None
        result = CommandResult(args, proc.returncode, proc.stdout, proc.stderr,
                               time.monotonic() - started)
        log.debug("ran", argv=list(args), rc=result.returncode,
                  seconds=round(result.duration, 3))
        if check and not result.ok:
            raise CommandError(result)
        return result


def default_runner() -> Runner:
    """The runner used outside tests."""
    return SubprocessRunner()
