"""``kvagent apply`` while the agent runs: ask the agent to reload and apply, report its pass.

Like ``multipath -r`` asking multipathd to reload, or ``systemctl reload``: two
appliers on one host would undo each other (the agent re-applies its own config
at its next pass), so when a live agent (``kvagent run``) runs with the same
config file, ``kvagent apply`` writes an apply request into ``node.run_dir``,
sends the agent SIGHUP, and waits for the result of the reload and pass that the
agent runs for it. With another config file it refuses (exit 2). The config is
validated here first, so a broken edit gets the usual config error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..config import Config
from ..daemonfiles import DaemonInfo, live_daemon, new_request, wait_result
from ..errors import KvagentError, UsageError
from ..rundir import RunDirError

if TYPE_CHECKING:
    from ..result import RunResult

#: How long ``kvagent apply`` waits for the agent's pass (its first pass may need long).
DELEGATE_TIMEOUT = 900.0
#: Seconds between "still waiting" lines on stderr.
PROGRESS_EVERY = 10.0


class AgentRefusedConfig(UsageError):
    """The agent found the config invalid when it re-read it for this apply (the file
    changed after it was checked here); it keeps running its previous config."""

    kind = "config"

    def __init__(self, problems: list[str], config_file: Path):
        super().__init__(f"the agent refused the config: {'; '.join(problems)}",
                         "the agent keeps running its previous config")
        #: as the agent wrote them: ``FILE:LINE: FIELD: what is wrong``
        self.problems = problems
        self.file = str(config_file)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name the same file (by inode when both exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def running_agent(cfg: Config) -> DaemonInfo | None:
    """The agent of this host (from ``node.run_dir``), or None when none runs."""
    try:
        return live_daemon(cfg.node.run_dir)
    except RunDirError:
        return None


def delegate_apply(cfg: Config, config_file: Path, *, wait: bool,
                   rebind: tuple[str, ...] = (),
                   timeout: float = DELEGATE_TIMEOUT) -> RunResult | None:
    """The agent's result for this apply, or None when no agent runs (apply locally).

    Raises :class:`UsageError` when the agent runs another config file.
    """
    agent = running_agent(cfg)
    if agent is None:
        return None
    if not same_file(agent.config, config_file):
        raise UsageError(
            f"the agent (kvagent run, pid {agent.pid}) runs with the config {agent.config}, "
            f"not {config_file}: applying {config_file} beside it would be undone at its "
            "next pass",
            f"edit {agent.config} and run 'kvagent -c {agent.config} apply' (or systemctl "
            "reload kvagent), or stop the agent first")
    request = new_request(cfg.node.run_dir, wait=wait, rebind=rebind)
    import signal

    try:
        os.kill(agent.pid, signal.SIGHUP)
    except ProcessLookupError:
        return None  # it has just exited: apply here
    click.echo(f"kvagent: the agent (pid {agent.pid}) runs with {agent.config}: asked it to "
               f"reload the config and apply (request {request}); waiting for its pass",
               err=True)
    next_line = [PROGRESS_EVERY]

    def progress(elapsed: float) -> None:
        if elapsed >= next_line[0]:
            click.echo(f"kvagent: still waiting for the agent's pass ({elapsed:.0f}s)",
                       err=True)
            next_line[0] += PROGRESS_EVERY

    answer = wait_result(cfg.node.run_dir, request, agent, timeout=timeout, progress=progress)
    if "config_error" in answer:  # the file changed again after it was checked here
        raise AgentRefusedConfig([str(p) for p in answer["config_error"]], config_file)
    if "error" in answer:
        error = answer["error"]
        exc = KvagentError(str(error.get("message")), error.get("hint"))
        exc.exit_code = int(error.get("exit_code") or 1)
        raise exc
    from ..result import RunResult

    return RunResult.from_json(answer["result"])
