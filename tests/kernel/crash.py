"""Helpers for crash tests: a pass in a child process killed after its k-th step.

A child is forked from the test process (kvagent is already imported: no start-up
cost per run), enables failpoints (``agent.failpoints``) and runs one apply. With
``kill-after=k`` it dies by SIGKILL right after its k-th side effect — a configfs
change, a command that changes something, a record write, a pool file step —
exactly as a kill -9 or an OOM kill would leave it.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

# Everything a pass imports, imported once here: a forked child then pays nothing for
# imports (under TCG, over the VM's 9p root, importing kvagent takes a minute).
import agent.engines.handoff
import agent.initiator.reconcile
import agent.target.reconcile  # noqa: F401
from agent import failpoints
from agent.config import Config
from agent.reconcile import run_pass


@dataclass(frozen=True)
class Outcome:
    """How a child pass ended, and the steps it took (from the failpoint log)."""

    killed: bool
    exit_code: int | None
    steps: tuple[str, ...]
    #: What the child said went wrong (a failed pass's errors or a traceback), for
    #: assertion messages: the guest's stderr is not in the CI log.
    errors: str = ""


def child_pass(config: Config, spec: str = "", timeout: int = 0) -> Outcome:
    """Run one apply of ``config`` in a forked child with failpoints ``spec``; wait.
    ``timeout``: seconds after which the child dies of SIGALRM, failing as wedged."""
    fd, log = tempfile.mkstemp(prefix="kvagent-steps-")
    os.close(fd)
    fd, said = tempfile.mkstemp(prefix="kvagent-errors-")
    os.close(fd)
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            signal.alarm(timeout)
            failpoints.configure(f"log={log};{spec}")
            result = run_pass(config, dry_run=False)
            code = 0 if result.ok else 1
            if not result.ok:
                Path(said).write_text(f"child pass errors: {result.errors}")
        except BaseException:
            Path(said).write_text(traceback.format_exc())
        finally:
            with open(said) as f:
                sys.stderr.write(f.read())
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    steps = tuple(line.split("\t", 1)[1] for line in Path(log).read_text().splitlines())
    errors = Path(said).read_text()
    os.unlink(log)
    os.unlink(said)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        assert sig != signal.SIGALRM, f"the pass is wedged (> {timeout}s): {steps[-3:]}"
        assert sig == signal.SIGKILL, f"child died of signal {sig}"
        return Outcome(True, None, steps, errors)
    return Outcome(False, os.WEXITSTATUS(status), steps, errors)


def ci_log(line: str) -> None:
    """A line the kernel-tier plugin copies into the CI log."""
    print(f"KVAGENT-CI-LOG: {line}", flush=True)
